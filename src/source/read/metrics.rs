//! What a source reports while it runs ([`SourceMetrics`]), and running the
//! workers until a source fails for good ([`run_until_failed`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use highwater_operators::Counter;

#[cfg(doc)]
use super::read;

/// Counters of a source, shared by all workers of the process.
#[derive(Clone, Debug, Default)]
pub struct SourceMetrics {
    /// Records read and decoded.
    pub records: Counter,
    /// Records that failed to decode.
    pub dead_letters: Counter,
    /// Records that were late when read (below their partition's watermark).
    pub late: Counter,
    /// Microseconds the source spent paused because too many records were
    /// in flight between the workers (downstream was slower than the
    /// source): see [`SourceOptions::max_in_flight`](crate::source::SourceOptions::max_in_flight).
    pub throttled_us: Counter,
    /// Microseconds the source's workers spent with a partition paused for
    /// watermark alignment (it ran more than the drift ahead of the
    /// combined watermark): see [`SourceOptions::max_drift`](crate::source::SourceOptions::max_drift).
    pub aligned_us: Counter,
    /// How many times flow control held a partition back long enough that
    /// its reader was told to pause ([`PartitionReader::pause`](crate::source::PartitionReader::pause):
    /// a Kafka partition stops fetching).
    pub pauses: Counter,
    /// The greatest event time read so far.
    pub max_event_time: Arc<AtomicU64>,
    /// Errors a partition failed with (the source then holds its watermark
    /// and reads no more: see [`read`]).
    pub errors: Arc<Mutex<Vec<String>>>,
    /// Whether a partition has failed for good.
    pub failed: Arc<std::sync::atomic::AtomicBool>,
}

impl SourceMetrics {
    /// Errors recorded so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether a partition has failed for good (see [`read`]).
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records that a partition failed for good with `error`.
    pub(super) fn fail(&self, error: String) {
        if let Ok(mut errors) = self.errors.lock() {
            errors.push(error);
        }
        self.failed.store(true, Ordering::Release);
    }
}

/// Something whose failure stops a job's workers ([`run_until_failed`]):
/// a source's [`SourceMetrics`] (a partition failed for good) or the job's
/// [`Checkpoints`](crate::checkpoint::Checkpoints) (a checkpoint could not be
/// written, e.g. the store refuses writes: the job stops rather than run on
/// without checkpoints, as Flink's default of no tolerable checkpoint failure).
pub trait Failing {
    /// The failure, if there was one.
    fn failure(&self) -> Option<String>;
}

impl Failing for SourceMetrics {
    fn failure(&self) -> Option<String> {
        self.has_failed().then(|| format!("source failed: {}", self.errors().join("; ")))
    }
}

impl Failing for crate::checkpoint::Checkpoints {
    fn failure(&self) -> Option<String> {
        self.error().map(|e| format!("checkpointing failed: {e}"))
    }
}

/// Steps `worker` until its dataflows have completed, or until one of
/// `watched` has failed (a source for good, see [`read`], or the job's
/// checkpoints): then the worker's dataflows are dropped (nothing downstream
/// sees an end of input that did not happen) and the failures are returned.
pub fn run_until_failed(worker: &mut timely::worker::Worker, watched: &[&dyn Failing]) -> Result<(), JobFailed> {
    run_with_board(worker, watched, None)
}

/// [`run_until_failed`], reporting flow-control receipts to the other
/// processes on `board` meanwhile (the board's own dataflow does not count:
/// the job has completed when only it is left; it is closed then).
pub(crate) fn run_with_board(
    worker: &mut timely::worker::Worker,
    watched: &[&dyn Failing],
    mut board: Option<crate::board::Board>,
) -> Result<(), JobFailed> {
    let failures = || watched.iter().filter_map(|w| w.failure()).collect::<Vec<_>>();
    let mut failed = Vec::new();
    // With a board, a parked worker still wakes up to report.
    let park = Duration::from_millis(if board.is_some() { 2 } else { 50 });
    while failed.is_empty() {
        if let Some(board) = board.as_mut() {
            board.tick();
        }
        let more = worker.step_or_park(Some(park));
        failed = failures();
        let done = match board.as_ref() {
            Some(board) => worker.installed_dataflows().iter().all(|d| *d == board.dataflow),
            None => !more,
        };
        if done {
            break;
        }
    }
    if failed.is_empty() {
        if let Some(board) = board.take() {
            board.close(worker);
        }
    }
    if failed.is_empty() {
        // The dataflows completed; a failure in their last steps still counts.
        failed = failures();
    }
    if !failed.is_empty() {
        for dataflow in worker.installed_dataflows() {
            worker.drop_dataflow(dataflow);
        }
        return Err(JobFailed(failed.join("; ")));
    }
    Ok(())
}

/// A job stopped by a failure (see [`run_until_failed`]), with what failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JobFailed(pub String);
