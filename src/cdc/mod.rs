//! Change data capture: changelogs of database tables as streams, and from
//! there as tables.
//!
//! A CDC source produces [`Change`]s: one row inserted, updated or deleted
//! (or read by the initial snapshot), at the commit time of its transaction,
//! with the row's primary key. [`Change::upserts`] turns a change into the
//! upserts of a table keyed by primary key (an update that changes the key is
//! a delete of the old key and an upsert of the new one), which is what
//! [`EventStream::upsert`](highwater_operators::EventStream) consumes to
//! build a table.
//!
//! Sources: the Debezium JSON format ([`debezium`]) from files or topics, and
//! PostgreSQL logical decoding ([`postgres`]).

pub mod debezium;
#[cfg(feature = "postgres")]
pub mod postgres;
mod value;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use highwater_operators::Timestamp;

pub use value::{Float, Row, Value};

/// What happened to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Read by the initial snapshot (Debezium `r`).
    Read,
    /// Inserted (Debezium `c`).
    Insert,
    /// Updated (Debezium `u`).
    Update,
    /// Deleted (Debezium `d`).
    Delete,
}

/// One row changed by a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Change {
    /// The table, as `schema.table` (or `db.table`).
    pub table: Arc<str>,
    /// What happened.
    pub op: Op,
    /// The row's primary key: the key of `after`, or of `before` for a delete.
    pub key: Row,
    /// The row before the change: for updates and deletes, as much as the
    /// source knows (the full row, or at least the old key when it changed).
    pub before: Option<Row>,
    /// The row after the change (inserts, snapshot reads, updates).
    pub after: Option<Row>,
    /// The commit time of the transaction, ms since the epoch: the event time.
    pub time: Timestamp,
    /// The position of the transaction's commit in the source's log (a
    /// PostgreSQL LSN), or 0 if unknown: all changes of one transaction share it.
    pub lsn: u64,
}

impl Change {
    /// The upserts this change makes to a table keyed by primary key: `(key,
    /// Some(row))` sets a row, `(key, None)` deletes it. An update whose key
    /// changed deletes the old key first; `old_key` extracts the key from the
    /// `before` image.
    ///
    /// ```
    /// use highwater::cdc::{Change, Op, Row, Value};
    /// let row = |id: i64, v: &str| Row::new(vec![("id", Value::Int(id)), ("v", Value::Text(v.into()))]);
    /// let key = |id: i64| Row::new(vec![("id", Value::Int(id))]);
    /// let moved = Change {
    ///     table: "public.t".into(), op: Op::Update, key: key(2),
    ///     before: Some(row(1, "a")), after: Some(row(2, "a")), time: 5, lsn: 0,
    /// };
    /// let upserts = moved.upserts(|r| r.project(&["id"]));
    /// assert_eq!(upserts, vec![(key(1), None), (key(2), Some(row(2, "a")))]);
    /// ```
    pub fn upserts(&self, old_key: impl Fn(&Row) -> Option<Row>) -> Vec<(Row, Option<Row>)> {
        match self.op {
            Op::Delete => vec![(self.key.clone(), None)],
            Op::Read | Op::Insert => vec![(self.key.clone(), self.after.clone())],
            Op::Update => {
                let mut out = Vec::with_capacity(2);
                if let Some(old) = self.before.as_ref().and_then(old_key) {
                    if old != self.key {
                        out.push((old, None));
                    }
                }
                out.push((self.key.clone(), self.after.clone()));
                out
            }
        }
    }
}
