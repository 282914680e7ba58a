//! What a job's checkpoints did in this process, for the metrics and the
//! status page: how many were written or failed, and the latest one's
//! duration, size and completion time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The latest checkpoint written.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LastCheckpoint {
    /// Its id.
    pub id: u64,
    /// Its event time (the cut).
    pub time: u64,
    /// From the cut's start to its manifest, in seconds.
    pub duration_seconds: f64,
    /// The state it holds, in bytes.
    pub state_bytes: u64,
    /// What it wrote (incremental: only what was new), in bytes.
    pub bytes_written: u64,
    /// When its manifest was written, in milliseconds since the epoch.
    pub completed_unix_ms: u64,
}

/// Counts of a job's checkpoints in this process (the one that writes the
/// manifests: the first): cheap to clone, shared with the writer.
#[derive(Debug, Clone, Default)]
pub struct CheckpointStats(Arc<Mutex<Counts>>);

/// What [`CheckpointStats::read`] gives.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    /// Checkpoints written.
    pub completed: u64,
    /// Checkpoints that failed (a failure stops the job).
    pub failed: u64,
    /// Bytes written by every checkpoint.
    pub bytes_written: u64,
    /// The latest one written.
    pub last: Option<LastCheckpoint>,
}

impl CheckpointStats {
    /// The counts so far.
    pub fn read(&self) -> Counts {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Time since the latest checkpoint was written, if one was.
    pub fn age(&self) -> Option<Duration> {
        let last = self.read().last?;
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok()?;
        Some(now.saturating_sub(Duration::from_millis(last.completed_unix_ms)))
    }

    pub(crate) fn written(&self, last: LastCheckpoint) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.completed += 1;
        counts.bytes_written += last.bytes_written;
        counts.last = Some(last);
    }

    pub(crate) fn failed(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).failed += 1;
    }
}
