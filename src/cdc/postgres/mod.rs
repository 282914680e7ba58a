//! PostgreSQL change data capture: logical decoding with the built-in
//! `pgoutput` plugin, polled over an ordinary connection.
//!
//! [`PostgresSource`] is a [`Source`](crate::source::Source) of [`Change`](crate::cdc::Change)s
//! with one partition. A background thread, owned by the partition's reader:
//!
//! 1. checks the server (`wal_level = logical`) and the tables (they exist,
//!    every column has a supported type, see [`types`], and each has a key:
//!    its primary key, its replica identity index, or with `REPLICA IDENTITY
//!    FULL` and no primary key the whole row), and creates the publication
//!    (or adds the missing tables to it);
//! 2. creates a persistent replication slot (dropping an existing one) over
//!    a replication connection (`replication=database`, spoken by the source
//!    itself: no TLS; trust, password, md5 or scram-sha-256 authentication;
//!    the user needs the `REPLICATION` attribute) that exports the slot's
//!    snapshot, and reads the tables in that snapshot as
//!    [`Op::Read`](crate::cdc::Op::Read) changes at the reading
//!    transaction's `now()`. The snapshot holds exactly the transactions
//!    that committed before the slot's consistent point and the stream
//!    exactly the others (the argument is in `snapshot.rs`). Opened with an
//!    offset (an LSN from [`PartitionReader::offset`](crate::source::PartitionReader::offset)),
//!    it instead resumes the existing slot after that LSN, without snapshot;
//!    offset 0 (reported while the snapshot is read) takes a new snapshot;
//! 3. polls `pg_logical_slot_peek_binary_changes` every
//!    [`poll_interval`](PostgresConfig::poll_interval), parses the pgoutput
//!    messages ([`pgoutput`]) and hands out whole transactions: all changes of
//!    one transaction carry the same event time and commit LSN and leave in
//!    one `read` call, however many there are. The event time is the commit
//!    time (ms since the epoch), raised to keep delivery order: it is the
//!    largest of the commit times so far and the snapshot's time, so event
//!    times never decrease and no change is older than the snapshot rows
//!    (commit timestamps are taken before a transaction becomes visible and
//!    follow a clock that may step back). Once handed out, the slot is
//!    advanced past them (`pg_replication_slot_advance`) so that the server
//!    can recycle its WAL, except in a checkpointed job (see Offsets);
//! 4. when a poll finds nothing more, the source has caught up and its
//!    watermark hint is the server's clock at that poll minus
//!    [`watermark_margin`](PostgresConfig::watermark_margin): a transaction
//!    takes its commit timestamp just before writing (and flushing) its
//!    commit record, so a transaction whose timestamp is before the poll may
//!    still be unreadable by it; the margin covers that gap (a commit that
//!    takes longer than the margin to flush arrives late);
//! 5. reconnects with exponential backoff when the server goes away: the
//!    slot is persistent, the stream resumes where the slot is and
//!    transactions already handed out (commit LSN at or below the last one)
//!    are skipped, so nothing is lost or repeated. A server unreachable for
//!    longer than [`reconnect_timeout`](PostgresConfig::reconnect_timeout)
//!    fails the source for good (never an end of input).
//!
//! Errors retrying cannot fix (bad configuration, a missing table, an
//! unsupported type, a table without key, a missing slot on resume) end the
//! partition with a [`SourceError`](crate::source::SourceError) that the
//! source operator records in
//! [`SourceMetrics::errors`](crate::source::SourceMetrics). Changes that
//! cannot be decoded (a value of a type added later by `ALTER TABLE`, an
//! unchanged TOAST value without `REPLICA IDENTITY FULL`, see `changes.rs`)
//! and `TRUNCATE`s go to the dead-letter output with the reason.
//!
//! Offsets: the offset is the end LSN of the last transaction handed out
//! (the consistent point right after the snapshot, 0 while the snapshot is
//! read: resuming from 0 takes a new snapshot, as the rows not yet read
//! would otherwise be lost).
//!
//! - **In a checkpointed job** the slot holds every change after the last
//!   committed checkpoint: each session of the reader reads from a cursor,
//!   a temporary copy of the slot (`pg_copy_logical_replication_slot`,
//!   PostgreSQL 12 or later; dropped when its session ends) advanced as
//!   changes are handed out, and the slot itself is advanced to a
//!   checkpoint's offset only once that checkpoint has committed (the
//!   source's commit step, [`Source::acknowledge`](crate::source::Source::acknowledge)).
//!   A recovery from the latest committed checkpoint therefore always
//!   finds its changes, and a process killed at any moment recovers
//!   exactly once. The server keeps the WAL since the last committed
//!   checkpoint (a checkpoint interval's worth, more while the job is
//!   down).
//! - **Without checkpoints** the slot is advanced as soon as changes are
//!   handed out, so only the latest offset can be resumed from.
//!
//! Opening with an offset that the slot has already confirmed past (its
//! `confirmed_flush_lsn` is greater) fails with an error naming both
//! positions rather than silently skipping what lies between; start
//! without offset to take a new snapshot then.
//!
//! Limitations: a connection lost during the initial snapshot ends the
//! partition (start again without offset for a new snapshot); event times
//! are monotone within one reader, and a reader resumed from an offset
//! starts from the commit times again; each poll decodes the WAL from the
//! slot's restart point, which a long-running transaction holds back.
//!
//! ```no_run
//! use std::sync::Arc;
//! use highwater::cdc::postgres::{PostgresConfig, PostgresSource};
//! use highwater::cdc::Change;
//! use highwater::source::{read, SourceMetrics, SourceOptions};
//! use timely::dataflow::operators::Inspect;
//!
//! let config = PostgresConfig::new(
//!     "host=127.0.0.1 port=5432 user=postgres dbname=shop",
//!     ["public.orders"],
//!     "highwater_orders",
//!     "highwater_orders",
//! );
//! let source = Arc::new(PostgresSource::new(config).expect("valid configuration"));
//! timely::execute_directly(move |worker| {
//!     worker.dataflow::<u64, _, _>(|scope| {
//!         let metrics = SourceMetrics::default();
//!         let streams = read(scope, source, |c: &Change| c.time, SourceOptions::default(), &metrics, None)
//!             .expect("source opens");
//!         streams.events.inner.inspect(|(change, time, _)| println!("{time}: {:?} {}", change.op, change.key));
//!     });
//! });
//! ```

mod catalog;
mod changes;
mod error;
pub mod lsn;
pub mod pgoutput;
mod replication;
mod snapshot;
mod source;
pub mod types;
mod worker;

use serde::{Deserialize, Serialize};

use crate::time::Millis;

pub use source::{PostgresReader, PostgresSource, PostgresStats};

/// The configuration of a [`PostgresSource`].
///
/// Deserializes from e.g. `{"url": "host=127.0.0.1 user=postgres dbname=x",
/// "tables": ["public.t"], "slot": "hw", "publication": "hw",
/// "poll_interval": "100ms"}`; the other fields have defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// The connection string: `host=… port=… user=… dbname=…` or a
    /// `postgresql://` URL (without TLS).
    pub url: String,
    /// The tables, schema-qualified or found on the search path.
    pub tables: Vec<String>,
    /// The logical replication slot (created if missing).
    pub slot: String,
    /// The publication (created if missing; missing tables are added).
    pub publication: String,
    /// How long to wait after a poll that found nothing more.
    #[serde(default = "defaults::poll_interval")]
    pub poll_interval: Millis,
    /// At most this many messages per poll (whole transactions are always
    /// read, so a poll may return more). Each poll decodes the WAL again
    /// from the slot's restart point, so large polls drain a backlog faster.
    /// Messages are decoded as they arrive, but each transaction is held in
    /// memory whole until its commit and handed out at once: a huge
    /// transaction takes memory in proportion to its changes, the price of
    /// handing out transactions atomically.
    #[serde(default = "defaults::max_changes_per_poll")]
    pub max_changes_per_poll: u32,
    /// Whether to read the tables' current rows first when starting without offset.
    #[serde(default = "defaults::snapshot")]
    pub snapshot: bool,
    /// Rows fetched at once by the snapshot.
    #[serde(default = "defaults::snapshot_batch")]
    pub snapshot_batch: u32,
    /// How far behind the server's clock the watermark hint stays when caught up.
    #[serde(default = "defaults::watermark_margin")]
    pub watermark_margin: Millis,
    /// The longest wait between reconnection attempts.
    #[serde(default = "defaults::max_backoff")]
    pub max_backoff: Millis,
    /// How long the server may stay unreachable: once reconnection attempts
    /// have failed for this long, the source fails for good with
    /// [`SourceError::Unavailable`](crate::source::SourceError::Unavailable)
    /// (the job fails; a recovery resumes from its last checkpoint).
    #[serde(default = "defaults::reconnect_timeout")]
    pub reconnect_timeout: Millis,
}

mod defaults {
    use crate::time::Millis;
    pub(super) fn poll_interval() -> Millis {
        Millis(100)
    }
    pub(super) fn max_changes_per_poll() -> u32 {
        100_000
    }
    pub(super) fn snapshot() -> bool {
        true
    }
    pub(super) fn snapshot_batch() -> u32 {
        10_000
    }
    pub(super) fn watermark_margin() -> Millis {
        Millis(1_000)
    }
    pub(super) fn max_backoff() -> Millis {
        Millis(5_000)
    }
    pub(super) fn reconnect_timeout() -> Millis {
        Millis(300_000)
    }
}

impl PostgresConfig {
    /// A configuration with the default settings.
    pub fn new<T: Into<String>>(
        url: impl Into<String>,
        tables: impl IntoIterator<Item = T>,
        slot: impl Into<String>,
        publication: impl Into<String>,
    ) -> Self {
        PostgresConfig {
            url: url.into(),
            tables: tables.into_iter().map(Into::into).collect(),
            slot: slot.into(),
            publication: publication.into(),
            poll_interval: defaults::poll_interval(),
            max_changes_per_poll: defaults::max_changes_per_poll(),
            snapshot: defaults::snapshot(),
            snapshot_batch: defaults::snapshot_batch(),
            watermark_margin: defaults::watermark_margin(),
            max_backoff: defaults::max_backoff(),
            reconnect_timeout: defaults::reconnect_timeout(),
        }
    }
}
