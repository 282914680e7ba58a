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

/// Steps `worker` until its dataflows have completed, or until a source of
/// `metrics` has failed for good (see [`read`]): then the worker's dataflows
/// are dropped (nothing downstream sees an end of input that did not happen)
/// and the sources' errors are returned.
pub fn run_until_failed(worker: &mut timely::worker::Worker, metrics: &[&SourceMetrics]) -> Result<(), SourceFailed> {
    let failed = || metrics.iter().any(|m| m.has_failed());
    while !failed() && worker.step_or_park(Some(Duration::from_millis(50))) {}
    if failed() {
        for dataflow in worker.installed_dataflows() {
            worker.drop_dataflow(dataflow);
        }
        let errors: Vec<String> = metrics.iter().flat_map(|m| m.errors()).collect();
        return Err(SourceFailed(errors.join("; ")));
    }
    Ok(())
}

/// A source failed for good (see [`read`]), with its errors.
#[derive(Debug, thiserror::Error)]
#[error("source failed: {0}")]
pub struct SourceFailed(pub String);
