//! The initial snapshot and how the stream is joined to it exactly.
//!
//! The source creates its replication slot over a replication connection
//! (`replication.rs`) with `CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT`. The
//! server builds the slot's starting snapshot from the WAL it decodes: when
//! the slot reaches its consistent point C, the snapshot builder knows which
//! transactions committed before C (it decoded their commit records, or saw
//! that they ended before it started) and which did not, and it exports
//! exactly that set as an MVCC snapshot. The stream of the slot holds exactly
//! the transactions that commit at or after C. A transaction committing
//! before C is therefore visible to the exported snapshot, and one
//! committing at or after C is not, whatever its backend is doing when the
//! snapshot is used: a transaction whose commit record lies before C but
//! that has not yet left the process array (waiting for a synchronous
//! standby, or for its own flush to return) counts as committed in the
//! exported snapshot, although a snapshot taken with `pg_current_snapshot()`
//! at that moment would not see it. This is the mechanism PostgreSQL's own
//! logical replication uses for the initial copy of a table.
//!
//! The source then reads the tables in a `REPEATABLE READ, READ ONLY`
//! transaction that starts with `SET TRANSACTION SNAPSHOT '<exported name>'`
//! while the replication connection is still open (an exported snapshot can
//! be imported only while the exporting session lives and runs no other
//! command; once imported, the importing transaction keeps it, so the
//! replication connection is closed right after). Each transaction is thus
//! in the snapshot or in the stream, never in both and never in neither:
//! nothing is lost, nothing applied twice, and no transaction needs to be
//! filtered out of the stream.
//!
//! Event times: snapshot rows carry the reading transaction's `now()`, and a
//! streamed change its transaction's commit time raised to the largest event
//! time handed out before it (see [`EventClock`](super::changes::EventClock)).
//! A transaction committing just after C may have a commit timestamp below
//! the snapshot's `now()` (PostgreSQL takes the timestamp before the commit
//! record is written, and the clock may step back); raising keeps every
//! change at or after the snapshot rows and the delivery order, so that a
//! table that applies upserts in event-time order ends with the newest row.

/// The statement that makes the current transaction use the exported
/// snapshot `name`; `None` if the name is not one the server exports
/// (hexadecimal digits and dashes, e.g. `00000003-0000001B-1`).
pub(crate) fn set_transaction_snapshot(name: &str) -> Option<String> {
    let valid = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    valid.then(|| format!("SET TRANSACTION SNAPSHOT '{name}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_checked() {
        assert_eq!(
            set_transaction_snapshot("00000003-0000001B-1").as_deref(),
            Some("SET TRANSACTION SNAPSHOT '00000003-0000001B-1'")
        );
        assert_eq!(set_transaction_snapshot(""), None);
        assert_eq!(set_transaction_snapshot("x'; DROP TABLE t; --"), None);
    }
}
