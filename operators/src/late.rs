//! The late side output: records that arrived after their allowed lateness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::stream::EventStream;

/// A shared counter, readable from outside the dataflow (for progress lines
/// and summaries) while the workers update it.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Counter::default()
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Records an operator could not take into account because they arrived after
/// the watermark had passed their window's end plus the allowed lateness.
///
/// They are never silently dropped: `stream` carries them unchanged (with
/// their own event time and diff, at the timely time they arrived), and
/// `count` counts them on this worker.
#[derive(Debug)]
pub struct LateOutput<'scope, D: 'static> {
    /// The late records.
    pub stream: EventStream<'scope, D>,
    /// How many late records this worker has seen.
    pub count: Counter,
}
