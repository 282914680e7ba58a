//! From pgoutput messages to [`Change`]s, one committed transaction at a time.
//!
//! Keys: the key columns come from the catalog (see `catalog.rs`): the
//! primary key, or the replica identity index, or for `REPLICA IDENTITY FULL`
//! without a primary key the whole row. An update that changes the key
//! carries the old key (`K` tuple, reduced to the replica identity columns)
//! or the old row (`O` tuple) as `before`, so that [`Change::upserts`]
//! deletes the old key.
//!
//! Unchanged TOAST values: an update that leaves a large (TOASTed) column
//! unchanged does not send it (`u`). With `REPLICA IDENTITY FULL` the old row
//! holds it and the new row is completed from there; otherwise the value is
//! unknown and the change goes to the dead-letter output with that reason
//! rather than being passed on with a wrong value. Tables with large values
//! that are updated should use `ALTER TABLE .. REPLICA IDENTITY FULL`.

use std::collections::HashMap;
use std::sync::Arc;

use super::pgoutput::{self, Message, OldKind, ProtocolError, TupleValue};
use super::types::PgType;
use crate::cdc::{Change, Op, Row, Value};
use crate::dead_letter::DeadLetter;
use crate::Timestamp;

/// µs from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A PostgreSQL timestamp (µs since 2000-01-01) as ms since the Unix epoch.
pub(crate) fn pg_time_to_ms(micros: i64) -> Timestamp {
    let ms = micros.saturating_add(PG_EPOCH_MICROS).div_euclid(1_000);
    u64::try_from(ms).unwrap_or(0)
}

/// A column of a published table, as the catalog has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ColumnInfo {
    /// The column name.
    pub(crate) name: Arc<str>,
    /// Its type.
    pub(crate) ty: PgType,
}

/// A published table, as the catalog has it at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableInfo {
    /// The schema.
    pub(crate) schema: String,
    /// The table name.
    pub(crate) table: String,
    /// `schema.table`, as changes name it.
    pub(crate) name: Arc<str>,
    /// The published columns (not generated), in order.
    pub(crate) columns: Vec<ColumnInfo>,
    /// The key columns.
    pub(crate) key: Vec<Arc<str>>,
}

impl TableInfo {
    /// The key of `row`, if it has the key columns.
    pub(crate) fn key_of(&self, row: &Row) -> Option<Row> {
        let names: Vec<&str> = self.key.iter().map(|k| &**k).collect();
        row.project(&names)
    }
}

/// One committed transaction, decoded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Transaction {
    /// Its 32-bit xid.
    pub(crate) xid: u32,
    /// The LSN of its commit record.
    pub(crate) commit_lsn: u64,
    /// The LSN past its commit record.
    pub(crate) end_lsn: u64,
    /// The commit time, ms since the epoch (raised by [`EventClock`] when
    /// handed out).
    pub(crate) time: Timestamp,
    /// Its changes to the configured tables, in order.
    pub(crate) changes: Vec<Change>,
    /// Its changes that could not be decoded.
    pub(crate) dead: Vec<DeadLetter>,
    /// The bytes of its pgoutput messages, Begin to Commit.
    pub(crate) bytes: u64,
}

/// Event times of the changes handed out, non-decreasing in delivery order.
///
/// A change's event time is its transaction's commit time, raised to the
/// largest event time handed out before it (starting at the snapshot's
/// time): `time = max(commit time, last time)`. Commit timestamps are taken
/// before a transaction becomes visible and follow the server's clock, so
/// they need not grow in commit (LSN) order, and a transaction the snapshot
/// did not see may have committed "before" the snapshot's `now()`; a table
/// that applies upserts in event-time order would then keep the older row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EventClock {
    last: Timestamp,
}

impl EventClock {
    /// A clock whose times start at `start`.
    pub(crate) fn starting_at(start: Timestamp) -> Self {
        EventClock { last: start }
    }

    /// The event time of a transaction that committed at `commit`; later
    /// calls never return less.
    pub(crate) fn stamp(&mut self, commit: Timestamp) -> Timestamp {
        self.last = self.last.max(commit);
        self.last
    }

    /// Gives `txn` and its changes their event time.
    pub(crate) fn stamp_transaction(&mut self, txn: &mut Transaction) {
        let time = self.stamp(txn.time);
        txn.time = time;
        for change in &mut txn.changes {
            change.time = time;
        }
    }
}

/// A column as the stream describes it: its name and type (or the type's OID
/// when not supported).
type StreamColumn = (Arc<str>, Result<PgType, u32>);

struct RelationState {
    /// The configured table, or `None` for other tables of the publication.
    table: Option<Arc<TableInfo>>,
    columns: Vec<StreamColumn>,
    key_flags: Vec<bool>,
}

/// Parses a value of column `column` from its text (`None` for NULL).
pub(crate) fn decode_value(column: &StreamColumn, text: Option<&[u8]>) -> Result<Value, String> {
    let Some(bytes) = text else { return Ok(Value::Null) };
    let ty = column.1.map_err(|oid| format!("column {:?} has a type (OID {oid}) that is not supported", column.0))?;
    let text = std::str::from_utf8(bytes).map_err(|_| format!("column {:?}: value is not UTF-8", column.0))?;
    ty.parse(text).map_err(|e| format!("column {:?}: {e}", column.0))
}

/// A decoded tuple: `None` marks an unchanged TOAST value.
type Decoded = Vec<(Arc<str>, Option<Value>)>;

fn decode_tuple(columns: &[StreamColumn], tuple: &[TupleValue<'_>]) -> Result<Decoded, String> {
    if columns.len() != tuple.len() {
        return Err(format!("tuple has {} columns, the relation {}", tuple.len(), columns.len()));
    }
    columns
        .iter()
        .zip(tuple)
        .map(|(column, value)| {
            let value = match value {
                TupleValue::Null => Some(Value::Null),
                TupleValue::Unchanged => None,
                TupleValue::Text(bytes) => Some(decode_value(column, Some(bytes))?),
                TupleValue::Binary(_) => return Err(format!("column {:?}: binary value not requested", column.0)),
            };
            Ok((Arc::clone(&column.0), value))
        })
        .collect()
}

fn complete(decoded: Decoded) -> Result<Row, Vec<Arc<str>>> {
    let missing: Vec<Arc<str>> = decoded.iter().filter(|(_, v)| v.is_none()).map(|(n, _)| Arc::clone(n)).collect();
    if !missing.is_empty() {
        return Err(missing);
    }
    Ok(Row { columns: decoded.into_iter().map(|(n, v)| (n, v.unwrap_or(Value::Null))).collect() })
}

/// The decoder of one stream: remembers relations across calls and builds
/// transactions.
pub(crate) struct Decoder {
    tables: HashMap<(String, String), Arc<TableInfo>>,
    relations: HashMap<u32, RelationState>,
    current: Option<Transaction>,
    origin: String,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("tables", &self.tables.len()).field("origin", &self.origin).finish()
    }
}

impl Decoder {
    /// A decoder for changes to `tables`; dead letters name `origin`.
    pub(crate) fn new(tables: &[TableInfo], origin: impl Into<String>) -> Self {
        let mut decoder =
            Decoder { tables: HashMap::new(), relations: HashMap::new(), current: None, origin: origin.into() };
        decoder.set_tables(tables);
        decoder
    }

    /// Replaces the table descriptions (after the catalog was read again).
    pub(crate) fn set_tables(&mut self, tables: &[TableInfo]) {
        self.tables = tables.iter().map(|t| ((t.schema.clone(), t.table.clone()), Arc::new(t.clone()))).collect();
        self.relations.clear();
    }

    /// Forgets a transaction in progress (its messages will come again).
    pub(crate) fn reset(&mut self) {
        self.current = None;
    }

    /// Feeds one message; returns the transaction it completes, if any.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<Transaction>, ProtocolError> {
        let message = pgoutput::parse(bytes)?;
        if let Some(txn) = self.current.as_mut() {
            txn.bytes += bytes.len() as u64;
        }
        match message {
            Message::Begin(begin) => {
                if self.current.is_some() {
                    tracing::warn!("pgoutput: Begin inside a transaction; the partial transaction is dropped");
                }
                self.current = Some(Transaction {
                    xid: begin.xid,
                    commit_lsn: begin.final_lsn,
                    end_lsn: 0,
                    time: pg_time_to_ms(begin.commit_time),
                    changes: Vec::new(),
                    dead: Vec::new(),
                    bytes: bytes.len() as u64,
                });
            }
            Message::Commit(commit) => {
                let mut txn = self
                    .current
                    .take()
                    .ok_or(ProtocolError::Unexpected { context: "a Commit without Begin", found: 'C' })?;
                txn.end_lsn = commit.end_lsn;
                txn.commit_lsn = commit.commit_lsn;
                return Ok(Some(txn));
            }
            Message::Relation(r) => {
                let table = self.tables.get(&(r.namespace.clone(), r.name.clone())).cloned();
                let columns = r
                    .columns
                    .iter()
                    .map(|c| (Arc::from(c.name.as_str()), PgType::from_oid(c.type_oid).ok_or(c.type_oid)));
                let key_flags = r.columns.iter().map(|c| c.key).collect();
                self.relations.insert(r.id, RelationState { table, columns: columns.collect(), key_flags });
            }
            Message::Origin { .. } | Message::Type { .. } | Message::Message { .. } => {}
            Message::Insert { relation, new } => self.row_change(bytes, relation, Op::Insert, None, Some(&new)),
            Message::Update { relation, old, new } => {
                self.row_change(bytes, relation, Op::Update, old.as_ref().map(|(k, t)| (*k, &t[..])), Some(&new))
            }
            Message::Delete { relation, old } => {
                self.row_change(bytes, relation, Op::Delete, Some((old.0, &old.1[..])), None)
            }
            Message::Truncate { relations, .. } => {
                let Some(txn) = self.current.as_mut() else {
                    return Err(ProtocolError::Unexpected { context: "a change outside a transaction", found: 'T' });
                };
                for id in relations {
                    let Some(table) = self.relations.get(&id).and_then(|r| r.table.as_ref()) else { continue };
                    let reason = format!(
                        "TRUNCATE of {} is not supported: the rows it removed are not sent as deletes; \
                         take a new snapshot (restart the source without an offset)",
                        table.name
                    );
                    tracing::error!("{reason}");
                    txn.dead.push(DeadLetter::new(
                        format!("{}/{}", self.origin, table.name),
                        txn.commit_lsn,
                        reason,
                        format!("TRUNCATE {}", table.name).as_bytes(),
                    ));
                }
            }
        }
        Ok(None)
    }

    fn row_change(
        &mut self,
        bytes: &[u8],
        relation: u32,
        op: Op,
        old: Option<(OldKind, &[TupleValue<'_>])>,
        new: Option<&[TupleValue<'_>]>,
    ) {
        let Some(txn) = self.current.as_mut() else {
            tracing::error!("pgoutput: a change outside a transaction is ignored");
            return;
        };
        let (origin, lsn) = (&self.origin, txn.commit_lsn);
        let dead =
            |table: &str, reason: String, raw: &[u8]| DeadLetter::new(format!("{origin}/{table}"), lsn, reason, raw);
        let Some(rel) = self.relations.get(&relation) else {
            let reason = format!("change to relation {relation} before its Relation message");
            txn.dead.push(dead("?", reason, bytes));
            return;
        };
        let Some(table) = rel.table.as_ref() else { return };
        match decode_change(table, rel, op, old, new) {
            Ok(mut change) => {
                change.time = txn.time;
                change.lsn = txn.commit_lsn;
                txn.changes.push(change);
            }
            Err((reason, raw)) => {
                tracing::warn!(table = %table.name, "change sent to the dead letters: {reason}");
                let raw = raw.unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned());
                txn.dead.push(dead(&table.name, reason, raw.as_bytes()));
            }
        }
    }
}

/// Decodes one row change; an error has the reason and, if known, a readable
/// form of the change.
fn decode_change(
    table: &TableInfo,
    rel: &RelationState,
    op: Op,
    old: Option<(OldKind, &[TupleValue<'_>])>,
    new: Option<&[TupleValue<'_>]>,
) -> Result<Change, (String, Option<String>)> {
    let plain = |reason: String| (reason, None);
    let before = match old {
        None => None,
        Some((kind, tuple)) => {
            let decoded = decode_tuple(&rel.columns, tuple).map_err(plain)?;
            let decoded = match kind {
                OldKind::Full => decoded,
                // Only the replica identity columns are set in a key tuple.
                OldKind::Key => decoded.into_iter().zip(&rel.key_flags).filter(|(_, k)| **k).map(|(c, _)| c).collect(),
            };
            let row = complete(decoded).map_err(|missing| {
                plain(format!("old row of {} lacks columns {missing:?} (unchanged TOAST values)", table.name))
            })?;
            Some((kind, row))
        }
    };
    let after = match new {
        None => None,
        Some(tuple) => {
            let mut decoded = decode_tuple(&rel.columns, tuple).map_err(plain)?;
            if let Some((OldKind::Full, old)) = &before {
                for (name, value) in decoded.iter_mut().filter(|(_, v)| v.is_none()) {
                    *value = old.get(name).cloned();
                }
            }
            match complete(decoded.clone()) {
                Ok(row) => Some(row),
                Err(missing) => {
                    let known = Row { columns: decoded.into_iter().filter_map(|(n, v)| v.map(|v| (n, v))).collect() };
                    let reason = format!(
                        "{op:?} of {}: unchanged TOAST values of columns {missing:?} were not sent by the server; \
                         set ALTER TABLE {} REPLICA IDENTITY FULL so that they are",
                        table.name, table.name
                    );
                    return Err((reason, Some(known.to_string())));
                }
            }
        }
    };
    let before = before.map(|(_, row)| row);
    let key = match (&after, &before) {
        (Some(row), _) | (None, Some(row)) => table.key_of(row),
        (None, None) => None,
    }
    .ok_or_else(|| plain(format!("{op:?} of {}: the key columns {:?} are missing", table.name, table.key)))?;
    Ok(Change { table: Arc::clone(&table.name), op, key, before, after, time: 0, lsn: 0 })
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::build::{begin, commit, relation, Msg};
    use super::*;

    fn table(key: &[&str]) -> TableInfo {
        TableInfo {
            schema: "public".into(),
            table: "t".into(),
            name: "public.t".into(),
            columns: vec![
                ColumnInfo { name: "id".into(), ty: PgType::Int },
                ColumnInfo { name: "v".into(), ty: PgType::Text },
            ],
            key: key.iter().map(|k| Arc::from(*k)).collect(),
        }
    }

    fn row(id: i64, v: &str) -> Row {
        Row::new(vec![("id", Value::Int(id)), ("v", Value::Text(v.into()))])
    }

    fn key(id: i64) -> Row {
        Row::new(vec![("id", Value::Int(id))])
    }

    /// Feeds messages; returns the completed transactions.
    fn run(decoder: &mut Decoder, messages: &[Vec<u8>]) -> Vec<Transaction> {
        messages.iter().filter_map(|m| decoder.feed(m).unwrap()).collect()
    }

    #[test]
    fn event_times_never_go_back() {
        let mut clock = EventClock::starting_at(1_000);
        assert_eq!([900, 1_000, 1_500, 1_200, 2_000].map(|t| clock.stamp(t)), [1_000, 1_000, 1_500, 1_500, 2_000]);
        let mut txn = Transaction { time: 1_700, ..Transaction::default() };
        txn.changes.push(Change {
            table: "public.t".into(),
            op: Op::Insert,
            key: key(1),
            before: None,
            after: None,
            time: 1_700,
            lsn: 1,
        });
        clock.stamp_transaction(&mut txn);
        assert_eq!((txn.time, txn.changes[0].time), (2_000, 2_000));
    }

    #[test]
    fn times_convert_from_the_postgres_epoch() {
        assert_eq!(pg_time_to_ms(0), 946_684_800_000);
        assert_eq!(pg_time_to_ms(1_999), 946_684_800_001);
        assert_eq!(pg_time_to_ms(-PG_EPOCH_MICROS - 5_000), 0);
    }

    #[test]
    fn a_transaction_of_inserts_updates_and_deletes() {
        let mut d = Decoder::new(&[table(&["id"])], "pg");
        let rel = relation(7, "t", b'd', &[("id", 20, true), ("v", 25, false)]);
        let other = relation(8, "other", b'd', &[("id", 20, true)]);
        let messages = [
            begin(0x100, 1_000_000, 42),
            rel,
            other,
            Msg::new(b'I').u32(7).u8(b'N').tuple(&[Some("1"), Some("a")]).0,
            Msg::new(b'I').u32(8).u8(b'N').tuple(&[Some("1")]).0,
            Msg::new(b'U').u32(7).u8(b'N').tuple(&[Some("1"), Some("b")]).0,
            // The key changes: the old key comes as a K tuple.
            Msg::new(b'U').u32(7).u8(b'K').tuple(&[Some("1"), None]).u8(b'N').tuple(&[Some("2"), Some("b")]).0,
            Msg::new(b'D').u32(7).u8(b'K').tuple(&[Some("2"), None]).0,
            commit(0x100, 0x180, 1_000_000),
        ];
        let txns = run(&mut d, &messages);
        assert_eq!(txns.len(), 1);
        let t = &txns[0];
        // Its bytes: every message from Begin to Commit.
        assert_eq!(t.bytes, messages.iter().map(|m| m.len() as u64).sum::<u64>());
        assert_eq!((t.xid, t.commit_lsn, t.end_lsn, t.time), (42, 0x100, 0x180, 946_684_801_000));
        assert!(t.dead.is_empty());
        let c = &t.changes;
        assert_eq!(c.len(), 4, "{c:?}");
        assert!(c.iter().all(|c| c.time == t.time && c.lsn == 0x100 && &*c.table == "public.t"));
        assert_eq!((c[0].op, &c[0].key, &c[0].before, &c[0].after), (Op::Insert, &key(1), &None, &Some(row(1, "a"))));
        assert_eq!((c[1].op, &c[1].key, &c[1].before, &c[1].after), (Op::Update, &key(1), &None, &Some(row(1, "b"))));
        assert_eq!((c[2].op, &c[2].key, &c[2].before), (Op::Update, &key(2), &Some(key(1))));
        assert_eq!(c[2].upserts(|r| r.project(&["id"])), vec![(key(1), None), (key(2), Some(row(2, "b")))]);
        assert_eq!((c[3].op, &c[3].key, &c[3].before, &c[3].after), (Op::Delete, &key(2), &Some(key(2)), &None));
    }

    #[test]
    fn unchanged_toast_values_are_filled_from_the_old_row_or_dead_lettered() {
        let mut d = Decoder::new(&[table(&["id"])], "pg");
        let rel = relation(7, "t", b'd', &[("id", 20, true), ("v", 25, false)]);
        let full = relation(7, "t", b'f', &[("id", 20, true), ("v", 25, true)]);
        let toast = Msg::new(b'U').u32(7).u8(b'N').tuple(&[Some("1"), Some("\u{0}u")]).0;
        let with_old = Msg::new(b'U')
            .u32(7)
            .u8(b'O')
            .tuple(&[Some("1"), Some("big")])
            .u8(b'N')
            .tuple(&[Some("1"), Some("\u{0}u")])
            .0;
        let txns = run(&mut d, &[begin(1, 0, 1), rel, toast, full, with_old, commit(1, 2, 0)]);
        let t = &txns[0];
        assert_eq!(t.changes.len(), 1);
        assert_eq!(t.changes[0].after, Some(row(1, "big")));
        assert_eq!(t.changes[0].before, Some(row(1, "big")));
        assert_eq!(t.dead.len(), 1);
        assert!(t.dead[0].reason.contains("REPLICA IDENTITY FULL"), "{}", t.dead[0].reason);
        assert_eq!(t.dead[0].raw, r#"{"id":1}"#);
        assert_eq!(t.dead[0].origin, "pg/public.t");
    }

    #[test]
    fn bad_values_and_truncates_become_dead_letters() {
        let mut d = Decoder::new(&[table(&["id"])], "pg");
        let rel = relation(7, "t", b'd', &[("id", 20, true), ("v", 600, false)]);
        let txns = run(
            &mut d,
            &[
                begin(1, 0, 1),
                rel.clone(),
                Msg::new(b'I').u32(7).u8(b'N').tuple(&[Some("x"), None]).0,
                Msg::new(b'I').u32(7).u8(b'N').tuple(&[Some("1"), Some("(1,2)")]).0,
                Msg::new(b'I').u32(7).u8(b'N').tuple(&[Some("2"), None]).0,
                Msg::new(b'I').u32(9).u8(b'N').tuple(&[Some("2")]).0,
                Msg::new(b'T').u32(1).u8(0).u32(7).0,
                commit(1, 2, 0),
            ],
        );
        let t = &txns[0];
        assert_eq!(t.changes.len(), 1);
        let reasons: Vec<&str> = t.dead.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        assert!(reasons[0].contains("\"x\""), "{}", reasons[0]);
        assert!(reasons[1].contains("OID 600"), "{}", reasons[1]);
        assert!(reasons[2].contains("relation 9"), "{}", reasons[2]);
        assert!(reasons[3].contains("TRUNCATE"), "{}", reasons[3]);
    }

    #[test]
    fn protocol_errors_are_reported() {
        let mut d = Decoder::new(&[table(&["id"])], "pg");
        assert!(d.feed(&commit(1, 2, 0)).is_err());
        assert!(d.feed(b"B\x00").is_err());
        // A Begin again drops the partial transaction (e.g. after a reconnect).
        let txns = run(&mut d, &[begin(1, 0, 1), begin(3, 0, 2), commit(3, 4, 0)]);
        assert_eq!(txns.iter().map(|t| t.xid).collect::<Vec<_>>(), vec![2]);
    }
}
