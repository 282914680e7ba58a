//! Checkpoints and recovery: consistent cuts of a running dataflow, written
//! asynchronously, restored after a crash with exactly-once output.
//!
//! # How a checkpoint is taken
//! Every [`CheckpointConfig::interval`] of processing time a checkpoint
//! *cut* `(id, T)` is begun, with `T` above every timely time a source has
//! emitted at so far. Then, while data keeps flowing:
//! - each source notes, per partition, the offset and watermark at which its
//!   output time first reached `T`: everything it emitted below `T` came from
//!   before those offsets, everything after from beyond them;
//! - each stateful operator's input passes through a gate that holds back
//!   updates at or above `T`, so the operator's frontier stops at `T`: it
//!   fires what `T` completes and hands over its state as of `T` (see
//!   [`highwater_operators::checkpoint`]); the gate then opens. The state is
//!   moved to a background thread that serializes it and hands it back, so
//!   the worker runs its other operators meanwhile; the operator itself has
//!   nothing to do until its gate opens;
//! - a differential collection (`EventStream::as_collection`) is
//!   checkpointed where it enters differential dataflow: its accumulation as
//!   of `T`. On recovery it is replayed, and the arrangements downstream
//!   (joins, reductions, table–table joins) are rebuilt from it; what they
//!   derive below `T` was committed before and is dropped by the gates and
//!   the exactly-once sinks;
//! - each exactly-once sink sets aside its output below `T` as a part.
//!
//! Once every worker's operators, sources and sinks have handed in their
//! share, a background thread writes each worker's state into a file of
//! framed chunks (its *shard*, see [`shard`]), puts the shards into the [`CheckpointStore`],
//! pre-commits the sinks' parts, and writes the [`Manifest`] last (atomic
//! rename): only then does the checkpoint exist, and only then are the
//! sinks' parts committed (renamed into place). The last
//! [`CheckpointConfig::keep`] checkpoints are kept.
//!
//! # Recovery
//! [`Checkpoints::open`] with `recover` finds the newest checkpoint whose
//! manifest and shard files check out (sizes and CRC-32s), warning about and
//! skipping damaged ones; re-commits its sinks' parts (idempotent); and
//! hands each worker the state entries whose routing hash falls on it, so a
//! job may recover with a different number of workers. Sources resume at
//! the checkpoint's offsets and watermarks, operators at its time.
//!
//! # Several processes
//! A job spread over processes (timely's `-n`) checkpoints as one: process 0
//! coordinates the others over TCP ([`cluster`], [`Checkpoints::open_member`]),
//! every process writes its own workers' shards into the shared store, and
//! process 0 writes the manifest once every process has reported its part.
//! A checkpoint taken by any number of processes and workers recovers on any
//! other layout.
//!
//! # Limits
//! - A cut completes when the sources' watermarks pass its time: while every
//!   source is stalled (no records, no watermark progress) no new checkpoint
//!   completes. Nothing is lost meanwhile: recovery replays from the last one.
//! - A recovered run equals an uninterrupted one when lateness decisions do
//!   not depend on processing time (records late only with respect to their
//!   own partition's watermark), as in an uninterrupted run repeated. Rows of
//!   windows go out at their windows' last millisecond, so the committed
//!   output is the same bytes; rows of unwindowed joins and aggregations go
//!   out at the times their records travel at, which depend on how source
//!   partitions interleave (in uninterrupted runs too): the same rows, their
//!   order within a time may differ.
//! - The store must be shared by all the processes of a job (S3, or a
//!   directory they all see).

pub mod cluster;
mod coordinator;
pub(crate) mod kill;
pub mod manifest;
#[cfg(feature = "s3")]
pub mod s3;
pub mod shard;
pub mod stats;
pub mod store;

use std::time::Duration;

pub use cluster::Membership;
pub use coordinator::{
    check, latest_usable, probe, Checkpoints, DataflowProbe, SinkCommitter, SinkSubmission, SourceCommitter,
    WorkerStore,
};
pub use manifest::{
    DatabaseInfo, FileInfo, Manifest, PartitionState, ShardInfo, SinkPart, FORMAT_VERSION, OLDEST_READ_VERSION,
};
pub use stats::{CheckpointStats, Counts as CheckpointCounts, LastCheckpoint};
pub use store::{open_store, CheckpointStore, LocalStore};

/// How a job checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Where checkpoints go: a directory, or `s3://bucket/prefix`.
    pub location: String,
    /// Processing time between the starts of two checkpoints.
    pub interval: Duration,
    /// Complete checkpoints to keep (older ones are deleted); at least 1.
    pub keep: usize,
    /// Restore the latest complete checkpoint at start.
    pub recover: bool,
}

impl CheckpointConfig {
    /// Checkpoints in `location` every second, keeping 3, without recovery:
    /// a directory (a `Path`, `PathBuf` or string) or an `s3://bucket/prefix`
    /// URL.
    ///
    /// ```
    /// use highwater::checkpoint::CheckpointConfig;
    /// let dir = std::env::temp_dir().join("checkpoints");
    /// assert_eq!(CheckpointConfig::new(&dir).location, dir.display().to_string());
    /// assert_eq!(CheckpointConfig::new("s3://bucket/job").location, "s3://bucket/job");
    /// ```
    pub fn new(location: impl AsRef<std::path::Path>) -> Self {
        let location = location.as_ref().to_string_lossy().into_owned();
        CheckpointConfig { location, interval: Duration::from_secs(1), keep: 3, recover: false }
    }

    /// Resumes from the latest complete checkpoint at start, if there is one.
    pub fn recovering(mut self) -> Self {
        self.recover = true;
        self
    }

    /// A checkpoint every `interval` of processing time (a `Duration`, or
    /// milliseconds: see [`IntoMillis`](crate::time::IntoMillis)).
    pub fn every(mut self, interval: impl crate::time::IntoMillis) -> Self {
        self.interval = Duration::from_millis(interval.into_millis());
        self
    }

    /// Keeps the latest `keep` complete checkpoints.
    pub fn keeping(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }
}

/// What can go wrong with checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing a file.
    #[error("{what}: {source}")]
    Io {
        /// The file or directory.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A request to the object store (S3) failed.
    #[error("{what}: {source}")]
    ObjectStore {
        /// What was done, naming the bucket or key (`s3://bucket/key`).
        what: String,
        /// The object store's error (an `object_store::Error`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A checkpoint file is damaged or incomplete.
    #[error("{what} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Written by an incompatible version.
    #[error("{what} has an unsupported format ({found}); this build reads formats v{OLDEST_READ_VERSION} to v{FORMAT_VERSION}")]
    Version {
        /// The file.
        what: String,
        /// Its header.
        found: String,
    },
    /// Checkpoints are present, and the configuration does not recover from
    /// them ([`CheckpointConfig::recovering`]): they would be overwritten.
    #[error(
        "{location} already holds checkpoints: recover from them (CheckpointConfig::recovering), or use an empty \
         location"
    )]
    NotEmpty {
        /// The store.
        location: String,
    },
    /// The checkpoints present cannot be used.
    #[error("no usable checkpoint in {location}: {reasons}")]
    NoUsable {
        /// The store.
        location: String,
        /// Why each checkpoint was rejected.
        reasons: String,
    },
    /// The checkpoint was taken by a different dataflow.
    #[error(
        "checkpoint {id} was taken by a different dataflow (fingerprint {found}, this program's is {expected}); \
         start afresh (not recovering) in an empty checkpoint directory"
    )]
    Fingerprint {
        /// The checkpoint.
        id: u64,
        /// Its fingerprint.
        found: String,
        /// This program's.
        expected: String,
    },
    /// The dataflow has stateful operators that cannot be checkpointed.
    #[error("these operators cannot be checkpointed yet: {0}")]
    Unsupported(String),
    /// A setting is wrong.
    #[error("checkpoint configuration: {0}")]
    Config(String),
    /// Writing a checkpoint failed earlier in the run.
    #[error("checkpointing failed: {0}")]
    Failed(String),
    /// An event the checkpointing's current phase does not allow: a message
    /// from another process out of turn (processes of different builds, or
    /// a bug), or a report of this process's workers that does not fit
    /// where the checkpointing stands. It fails the job's checkpointing.
    #[error("checkpoint protocol: {event}, but {state}")]
    Protocol {
        /// What happened, e.g. `process 1 sent that its workers are built`.
        event: String,
        /// Where the checkpointing stood, e.g. `checkpoint 3 is being written`.
        state: String,
    },
    /// A part of the dataflow that needs the job's checkpoints (an
    /// exactly-once sink) was built in a computation configured without
    /// them; the message names the call that configures them on the API in
    /// use (`Job::checkpointed`, or `Checkpoints::configure` with
    /// `timely::execute`).
    #[error(
        "{what} needs the job's checkpoints, but {}",
        if *job {
            "the Job has none: call .checkpointed(CheckpointConfig::new(dir)) on the Job before Job::run"
        } else {
            "the timely computation was not configured with any: call Checkpoints::configure on its \
             timely::Config before timely::execute (or run the dataflow with highwater::Job and \
             Job::checkpointed)"
        }
    )]
    NotConfigured {
        /// What needs them, e.g. `the exactly-once sink counts`.
        what: String,
        /// Whether the dataflow runs in a [`Job`](crate::Job).
        job: bool,
    },
    /// An exactly-once sink could not pre-commit, commit or abort its output
    /// (e.g. its database refused a statement or could not be reached).
    #[error("sink {sink}: {reason}")]
    Sink {
        /// The sink, as its committer knows it (e.g. `Output:nexmark_q5`).
        sink: String,
        /// What failed, with the sink's own error message.
        reason: String,
    },
}
