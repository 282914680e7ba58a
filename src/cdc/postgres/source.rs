//! The source and its reader; the reading itself happens on a background
//! thread (`worker.rs`) that hands over whole transactions through a channel.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::changes::Transaction;
use super::PostgresConfig;
use crate::cdc::Change;
use crate::dead_letter::DeadLetter;
use crate::source::{Offset, PartitionReader, ReadStatus, Source, SourceError};
use crate::Timestamp;

/// What the background thread sends to the reader.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Rows of the initial snapshot (the offset stays 0: incomplete).
    Snapshot {
        /// The rows, as `Read` changes.
        changes: Vec<Change>,
        /// Rows that could not be decoded.
        dead: Vec<DeadLetter>,
    },
    /// The snapshot is complete (or was not wanted): the stream starts at
    /// the slot's consistent point `lsn`, the offset from now on.
    SnapshotDone {
        /// The slot's consistent point.
        lsn: u64,
    },
    /// A committed transaction (possibly without changes to the tables).
    Txn(Transaction),
    /// Everything committed before this time (server clock) was sent.
    CaughtUp(Timestamp),
    /// The partition ends with this error.
    Fatal(SourceError),
}

/// State shared by a reader and its background thread.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The reader was dropped, or the source stopped.
    pub(crate) stop: AtomicBool,
    /// The end LSN of the last transaction handed out: the slot may advance to it.
    pub(crate) handed_end: AtomicU64,
}

/// Counters of the background thread, for tuning: where the time goes.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) polls: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) transactions: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) changes: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) server_nanos: AtomicU64,
    pub(crate) decode_nanos: AtomicU64,
    pub(crate) handoff_nanos: AtomicU64,
}

/// What a [`PostgresSource`]'s background threads did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostgresStats {
    /// Peek calls made.
    pub polls: u64,
    /// pgoutput messages received.
    pub messages: u64,
    /// Transactions handed to the reader.
    pub transactions: u64,
    /// Transactions decoded again after a reconnection (or before the
    /// offset resumed from) and skipped because they were handed out before.
    pub skipped: u64,
    /// Row changes handed to the reader (snapshot rows included).
    pub changes: u64,
    /// Connections made after a failure.
    pub reconnects: u64,
    /// Time waiting for the server: in the peek call (decoding on the
    /// server, transfer) and the statements around it (advance, clock).
    pub server: Duration,
    /// Time parsing pgoutput messages into changes.
    pub decode: Duration,
    /// Time blocked handing transactions to a reader whose channel was full
    /// (the dataflow was behind).
    pub handoff: Duration,
}

/// A PostgreSQL table changelog source (one partition); see the
/// [module documentation](super).
pub struct PostgresSource {
    config: Arc<PostgresConfig>,
    stopped: Arc<AtomicBool>,
    stats: Arc<Stats>,
    /// The job takes checkpoints: the slot advances only when one commits
    /// ([`Source::acknowledge`]); readers read from a temporary copy of it.
    acknowledging: Arc<AtomicBool>,
    /// The connection that advances the slot when a checkpoint commits.
    acknowledger: Mutex<Option<postgres::Client>>,
}

impl std::fmt::Debug for PostgresSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSource")
            .field("slot", &self.config.slot)
            .field("tables", &self.config.tables)
            .field("acknowledging", &self.acknowledging.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PostgresSource {
    /// A source with `config`; checks the configuration without connecting
    /// (the server is checked by the reader's thread).
    pub fn new(config: PostgresConfig) -> Result<Self, SourceError> {
        let bad = |m: String| Err(SourceError::Config(format!("postgres source: {m}")));
        if let Err(e) = postgres::Config::from_str(&config.url) {
            return bad(format!("invalid connection string: {e}"));
        }
        if config.tables.is_empty() {
            return bad("no tables".into());
        }
        if config.tables.iter().any(|t| t.trim().is_empty()) {
            return bad("an empty table name".into());
        }
        let valid_slot = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !valid_slot(&config.slot) {
            return bad(format!("slot name {:?}: use 1 to 63 lower-case letters, digits and _", config.slot));
        }
        if config.publication.is_empty() || config.publication.len() > 63 {
            return bad(format!("publication name {:?}: 1 to 63 characters", config.publication));
        }
        if config.max_changes_per_poll == 0 || config.max_changes_per_poll > i32::MAX as u32 {
            return bad("max_changes_per_poll must be positive".into());
        }
        if config.snapshot_batch == 0 {
            return bad("snapshot_batch must be positive".into());
        }
        Ok(PostgresSource {
            config: Arc::new(config),
            stopped: Arc::default(),
            stats: Arc::default(),
            acknowledging: Arc::default(),
            acknowledger: Mutex::new(None),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// Ends the stream: readers return [`ReadStatus::End`] at their next read
    /// and their threads stop. The slot stays: a later run resumes from an
    /// offset or starts anew.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// What the background threads did so far.
    pub fn stats(&self) -> PostgresStats {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PostgresStats {
            polls: get(&s.polls),
            messages: get(&s.messages),
            transactions: get(&s.transactions),
            skipped: get(&s.skipped),
            changes: get(&s.changes),
            reconnects: get(&s.reconnects),
            server: Duration::from_nanos(get(&s.server_nanos)),
            decode: Duration::from_nanos(get(&s.decode_nanos)),
            handoff: Duration::from_nanos(get(&s.handoff_nanos)),
        }
    }
}

impl Source for PostgresSource {
    type Record = Change;
    type Reader = PostgresReader;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(vec![format!("postgres:{}", self.config.slot)])
    }

    /// In a checkpointed job the slot must keep every change after the
    /// last committed checkpoint: readers then read from a temporary copy
    /// of the slot (a cursor, advanced as changes are handed out, dropped
    /// with its session) and the slot itself advances only in
    /// [`acknowledge`](Source::acknowledge). Needs PostgreSQL 12 or later.
    fn acknowledge_on_commit(&self) {
        self.acknowledging.store(true, Ordering::SeqCst);
    }

    /// Advances the replication slot to the offset of a committed
    /// checkpoint: the server may then recycle the WAL before it, and a
    /// recovery from that checkpoint (or a later one) finds every change
    /// after it still in the slot.
    fn acknowledge(&self, offsets: &[(usize, Offset)]) -> Result<(), SourceError> {
        let Some(&(_, lsn)) = offsets.iter().find(|(p, _)| *p == 0) else { return Ok(()) };
        if lsn == 0 {
            // Taken during the initial snapshot: nothing to confirm yet.
            return Ok(());
        }
        let mut connection = self.acknowledger.lock().unwrap_or_else(|p| p.into_inner());
        let result = super::worker::advance_slot(&self.config, &mut connection, lsn);
        if result.is_err() {
            *connection = None;
        }
        result.map_err(|e| match e {
            super::error::Failure::Fatal(e) => e,
            super::error::Failure::Retry(reason) => {
                SourceError::Unavailable { what: format!("postgres source (slot {})", self.config.slot), reason }
            }
        })
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<PostgresReader, SourceError> {
        if index != 0 {
            return Err(SourceError::Config(format!("postgres source: no partition {index}")));
        }
        let (tx, rx) = mpsc::sync_channel(256);
        let shared = Arc::new(Shared::default());
        let worker = super::worker::Worker::new(
            Arc::clone(&self.config),
            Arc::clone(&shared),
            Arc::clone(&self.stats),
            tx,
            from,
            self.acknowledging.load(Ordering::SeqCst),
        );
        std::thread::Builder::new()
            .name(format!("highwater-pg-{}", self.config.slot))
            .spawn(move || worker.run())
            .map_err(|source| SourceError::Io { what: "spawning the postgres reader thread".into(), source })?;
        Ok(PostgresReader {
            rx,
            shared,
            source_stopped: Arc::clone(&self.stopped),
            offset: from.unwrap_or(0),
            resumable: from.is_some_and(|o| o > 0),
            hint: None,
            pending: None,
            bytes: 0,
        })
    }
}

/// Reads the changes of a [`PostgresSource`]; its background thread stops
/// when it is dropped.
#[derive(Debug)]
pub struct PostgresReader {
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    source_stopped: Arc<AtomicBool>,
    offset: u64,
    /// Past the initial snapshot (or resumed from an offset): see
    /// [`PartitionReader::resumable`].
    resumable: bool,
    hint: Option<Timestamp>,
    pending: Option<SourceError>,
    /// The bytes of the transactions handed out.
    bytes: u64,
}

impl Drop for PostgresReader {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

impl PartitionReader for PostgresReader {
    type Record = Change;

    /// Hands out whole transactions until `max` changes are reached: a
    /// transaction is never split, so one call may return more than `max`.
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(Change),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.source_stopped.load(Ordering::SeqCst) {
            self.shared.stop.store(true, Ordering::SeqCst);
            return Ok(ReadStatus::End);
        }
        let (mut taken, mut any) = (0usize, false);
        while taken < max {
            match self.rx.try_recv() {
                Ok(Msg::Snapshot { changes, dead: bad }) => {
                    any |= !changes.is_empty() || !bad.is_empty();
                    taken += changes.len();
                    changes.into_iter().for_each(&mut *out);
                    dead.extend(bad);
                    self.offset = 0;
                }
                Ok(Msg::SnapshotDone { lsn }) => {
                    self.offset = lsn;
                    self.resumable = true;
                }
                Ok(Msg::Txn(txn)) => {
                    any |= !txn.changes.is_empty() || !txn.dead.is_empty();
                    taken += txn.changes.len();
                    self.bytes += txn.bytes;
                    txn.changes.into_iter().for_each(&mut *out);
                    dead.extend(txn.dead);
                    self.offset = txn.end_lsn;
                    self.shared.handed_end.fetch_max(txn.end_lsn, Ordering::SeqCst);
                }
                Ok(Msg::CaughtUp(bound)) => self.hint = Some(self.hint.map_or(bound, |h| h.max(bound))),
                Ok(Msg::Fatal(e)) => {
                    if any {
                        self.pending = Some(e);
                        break;
                    }
                    return Err(e);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if any {
                        break;
                    }
                    return Err(SourceError::Config("postgres source: the reader thread ended".into()));
                }
            }
        }
        Ok(if any { ReadStatus::Data } else { ReadStatus::Idle })
    }

    /// The end LSN of the last transaction handed out: every transaction
    /// committing before it was handed out. After the snapshot and before
    /// any transaction: the slot's consistent point. While the snapshot is
    /// being read: 0, "snapshot incomplete", from which
    /// [`open`](Source::open) takes a new snapshot (as without offset).
    ///
    /// Without checkpoints the slot is advanced to the offset as soon as
    /// the transactions are handed out, so only the latest offset can be
    /// resumed from: opening with an older one fails with an error (the
    /// slot has confirmed past it and cannot replay what lies between),
    /// never silently loses data. In a checkpointed job the slot advances
    /// only to the offsets of committed checkpoints
    /// ([`Source::acknowledge`]), so a recovery from the latest committed
    /// checkpoint always finds its changes.
    fn offset(&self) -> Offset {
        self.offset
    }

    /// The bytes of the pgoutput messages of the transactions handed out
    /// (the snapshot, read with a query, is not counted).
    fn bytes_read(&self) -> Option<u64> {
        Some(self.bytes)
    }

    /// When the last poll found nothing more: the server's clock at that
    /// poll minus the configured margin.
    fn watermark_hint(&self) -> Option<Timestamp> {
        self.hint
    }

    /// Not while the initial snapshot is read (the offset is 0 then, and a
    /// restart takes a new snapshot): no checkpoint holds part of a
    /// snapshot, whose rows a new snapshot would give again (and whose
    /// rows deleted meanwhile it would not retract).
    fn resumable(&self) -> bool {
        self.resumable
    }
}
