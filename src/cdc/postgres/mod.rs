//! PostgreSQL change data capture: logical decoding with the built-in
//! `pgoutput` plugin, over an ordinary connection.
//!
//! [`PostgresSource`] is a [`Source`](crate::source::Source) of [`Change`](crate::cdc::Change)s
//! with one partition. A background thread, owned by the partition's reader:
//!
//! 1. checks the server (`wal_level = logical`) and the tables (they exist,
//!    every column has a supported type, see [`types`], and each has a key:
//!    its primary key, its replica identity index, or with `REPLICA IDENTITY
//!    FULL` and no primary key the whole row), and creates the publication
//!    (or adds the missing tables to it);
//! 2. creates a persistent replication slot (dropping an existing one) and
//!    reads the tables in a `REPEATABLE READ` snapshot as [`Op::Read`](crate::cdc::Op::Read)
//!    changes at the snapshot's `now()`; the stream then skips the
//!    transactions that snapshot already saw, which makes the two exactly
//!    consistent (the argument is in `snapshot.rs`). Opened with an offset
//!    (an LSN from [`PartitionReader::offset`](crate::source::PartitionReader::offset)),
//!    it instead resumes the existing slot after that LSN, without snapshot;
//! 3. polls `pg_logical_slot_peek_binary_changes` every
//!    [`poll_interval`](PostgresConfig::poll_interval), parses the pgoutput
//!    messages ([`pgoutput`]) and hands out whole transactions: all changes of
//!    one transaction carry its commit time (ms since the epoch) and commit
//!    LSN and leave in one `read` call, however many there are. Once handed
//!    out, the slot is advanced past them (`pg_replication_slot_advance`) so
//!    that the server can recycle its WAL;
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
//!    are skipped, so nothing is lost or repeated.
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
//! Limitations: the slot is advanced as soon as changes are handed out, so a
//! restart from an older offset cannot replay what lies before the slot; a
//! connection lost during the initial snapshot ends the partition (start
//! again without offset for a new snapshot); offsets taken during the
//! snapshot are the slot's consistent point, and resuming from there may
//! repeat transactions the snapshot already contained (harmless for the
//! upserts of a table); each poll decodes the WAL from the slot's restart
//! point, which a long-running transaction holds back.
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
    /// from the slot's restart point, so large polls drain a backlog faster
    /// (the rows are streamed, not held in memory).
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
        }
    }
}
