//! Sources: where events come from, split into partitions, each with its own
//! offsets and watermark.
//!
//! A [`Source`] lists its partitions and opens a [`PartitionReader`] on each,
//! optionally from an offset. The source operator ([`read`]) spreads the
//! partitions over the workers (partition `i` goes to worker `i % peers`),
//! decodes records, stamps them with event time, tracks a watermark per
//! partition (combined by minimum, idle partitions left out) and holds its
//! capability at that watermark. Records that fail to decode go to the
//! dead-letter stream.
//!
//! Connectors implement [`Source`]; the embedded ones are JSON-Lines files and
//! stdin ([`JsonLines`]), in-memory partitions ([`MemorySource`]) and the
//! Nexmark generator ([`crate::nexmark::Generator`]).

mod decode;
mod deserializer;
mod file;
pub(crate) mod intern;
mod memory;
mod read;
pub(crate) mod scan;
pub(crate) use read::run_with_board;

pub use decode::{Decode, DecodeError, JsonDecoder, RawDecoder, TextDecoder};
pub use file::{JsonLines, JsonLinesReader, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_RECORD_SIZE};
pub use memory::MemorySource;
pub use read::{
    read, run_until_failed, Alignment, Failing, FromSource, JobFailed, MaxDrift, RetryPolicy, SourceMetrics,
    SourceOptions, SourceStreams, Span, WatermarkBoard, DEFAULT_MAX_DRIFT,
};

use crate::dead_letter::DeadLetter;

/// A position in a partition (a byte offset, an event index, a broker offset):
/// reading again from it yields the records after it.
pub type Offset = u64;

/// What a read call found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStatus {
    /// Records (or dead letters) were read; more may follow at once.
    Data,
    /// Nothing right now; more may come later (live sources). A partition
    /// that says so for the source's idle timeout is idle: it stops holding
    /// the watermark back.
    Idle,
    /// Nothing right now, but the partition is known to hold more records
    /// than were read (a broker reported a higher end offset): it is slow,
    /// not idle, and keeps holding the watermark back however long it
    /// takes, so that its records are not late when they come.
    Behind,
    /// The partition is exhausted (bounded sources).
    End,
}

/// An error reading a source: what failed, on which input, and whether
/// retrying can help.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// An I/O error on a named input.
    #[error("reading {what}: {source}")]
    Io {
        /// The input, e.g. a file path.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The source is configured wrongly; retrying will not help.
    #[error("invalid source configuration: {0}")]
    Config(String),
    /// A service the source reads from stayed unreachable after retries
    /// (e.g. a database server stopped for good); retrying the call will not help.
    #[error("{what} unavailable: {reason}")]
    Unavailable {
        /// The service, e.g. `postgres source (slot s)`.
        what: String,
        /// For how long, and the last error.
        reason: String,
    },
}

impl SourceError {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SourceError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            SourceError::Config(_) | SourceError::Unavailable { .. } => false,
        }
    }
}

/// A partitioned source of records.
///
/// Shared by all workers of a process (`Sync`); each worker opens the
/// partitions assigned to it.
pub trait Source: Send + Sync + 'static {
    /// The decoded record.
    type Record: highwater_operators::key::Data;
    /// The reader of one partition.
    type Reader: PartitionReader<Record = Self::Record>;

    /// The partitions, by name; their order is stable across runs.
    fn partitions(&self) -> Result<Vec<String>, SourceError>;

    /// Opens partition `index`, after `from` if given.
    fn open(&self, index: usize, from: Option<Offset>) -> Result<Self::Reader, SourceError>;

    /// How many partitions one worker reads at the same time; the others
    /// wait, started (read up to their first record, see [`read`]). File
    /// blocks are read one after another (1): the watermark then follows the
    /// block being read, and the windows over the earlier blocks fire and are
    /// forgotten while the later ones wait. Live partitions are read together.
    fn concurrent_partitions(&self) -> usize {
        usize::MAX
    }

    /// The commit step: a checkpoint that covers the records before
    /// `offsets` (partition index, offset) has committed (its manifest is
    /// written, its sinks committed), so no recovery reads them again, and
    /// the source may acknowledge them upstream (Kafka commits its consumer
    /// group's offsets, so that lag tools see real progress). Never called
    /// earlier, nor without checkpoints; called in checkpoint order, in the
    /// process whose workers read those partitions (a failure is logged and
    /// the next checkpoint acknowledges again). By default nothing is
    /// acknowledged.
    fn acknowledge(&self, offsets: &[(usize, Offset)]) -> Result<(), SourceError> {
        let _ = offsets;
        Ok(())
    }

    /// The job takes checkpoints: called before any partition of this
    /// process is opened (once per worker that reads the source). From now
    /// on the source must keep upstream whatever a recovery from a
    /// checkpoint could read again, and release it only in
    /// [`acknowledge`](Self::acknowledge) (the PostgreSQL source then
    /// advances its replication slot only there, instead of as soon as it
    /// hands changes out). By default nothing changes.
    fn acknowledge_on_commit(&self) {}
}

/// Reads one partition.
pub trait PartitionReader: 'static {
    /// The decoded record.
    type Record;
    /// Reads up to `max` records, handing each to `out` (undecodable ones go
    /// to `dead`).
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(Self::Record),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError>;
    /// The offset after the last record returned.
    fn offset(&self) -> Offset;
    /// A lower bound on the event times of records still to come, if the
    /// partition knows one: a live source that has caught up (e.g. with a
    /// database's log at its current time) advances its watermark with it even
    /// when no record arrives, and the partition does not count as idle.
    fn watermark_hint(&self) -> Option<highwater_operators::Timestamp> {
        None
    }
    /// The bytes of input the partition has consumed since it was opened
    /// (what its records were decoded from: a file's lines, Kafka keys and
    /// payloads, MQTT topics and payloads, PostgreSQL's pgoutput messages),
    /// if the reader counts them: the partition's `partition_bytes` gauge
    /// and `highwater_partition_read_bytes_total`.
    fn bytes_read(&self) -> Option<u64> {
        None
    }
    /// The partition will not be read for a while (it waits, started, for
    /// its turn: see [`Source::concurrent_partitions`]): a reader may release
    /// what it buffers, to read it again when its turn comes.
    fn set_aside(&mut self) {}
    /// Flow control holds the partition back (no credit, or it runs ahead
    /// of the job's watermark) and has for a while: a reader of a remote log
    /// may stop fetching and drop what it prefetched (Kafka pauses the
    /// partition), so that a partition held back buffers nothing. Called
    /// once; [`resume`](Self::resume) comes before the next read.
    fn pause(&mut self) {}
    /// The partition is read again after [`pause`](Self::pause).
    fn resume(&mut self) {}
    /// Whether a recovery could resume from the partition's
    /// [`offset`](Self::offset) now. A database source reading its initial
    /// snapshot cannot (a restart takes the snapshot anew): while it says
    /// no, its partition keeps its watermark where it was, so that every
    /// batch of the snapshot goes out at the time of the first and no
    /// checkpoint falls inside it; it is never idle; and it reads only with
    /// flow-control credit.
    fn resumable(&self) -> bool {
        true
    }
}
