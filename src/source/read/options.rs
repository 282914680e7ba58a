//! How a source is read: [`SourceOptions`] and the [`RetryPolicy`] for errors
//! that may go away.

use std::time::Duration;

use super::{MaxDrift, WatermarkBoard};
use crate::source::Offset;
use crate::time::WatermarkStrategy;

/// How a source is read.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Operator name, also used in logs.
    pub name: String,
    /// Per-partition watermark strategy.
    pub watermark: WatermarkStrategy,
    /// A partition with no records for this long stops holding the watermark.
    pub idle_timeout: Option<Duration>,
    /// Records per read call (for partitions that take turns, once a
    /// partition has read its first record; see [`read`](crate::source::read())). The partition's watermark
    /// advances between calls, and a call's records go out at the watermark
    /// before it: a file small enough for one call shows no late records;
    /// `1` judges every record against the ones before it.
    pub batch_size: usize,
    /// Advance each partition's watermark by processing time instead: at
    /// most once per this interval (as Flink's `autoWatermarkInterval`), and
    /// not after every batch. Batches in between go out at the same
    /// watermark, so fewer, larger steps of event time reach the operators
    /// (less work per record for windows that fire per step), at the cost of
    /// up to one interval of latency; which records are late then depends
    /// on timing. `None` (the default): after every batch, deterministic.
    pub watermark_interval: Option<Duration>,
    /// Flow control: the source pauses while more than this many records
    /// per worker of its process are in flight between the workers (sent
    /// into an exchange and not yet taken by the operator they go to), so
    /// that a slow sink or operator slows the sources down and memory stays
    /// bounded. Records an operator holds as state do not count: a window
    /// waiting for the watermark never stops its sources. Counted in a
    /// [`Job`](crate::Job) (or with `highwater::operators::flow::InFlight::configure`);
    /// otherwise against the probe given to [`read`](crate::source::read()).
    pub max_in_flight: usize,
    /// Watermark alignment: a partition whose watermark is more than this
    /// far ahead of the combined watermark of its alignment group (the
    /// least watermark of the group's active partitions on every worker and
    /// process) stops reading until the combined watermark comes within it,
    /// so that operators waiting for event time hold a bounded amount of
    /// state. Idle and ended partitions are left out, and the partition at
    /// the minimum always reads: no deadlock. The default,
    /// [`MaxDrift::Job`], takes the job's setting (10 s unless
    /// [`Job::max_drift`](crate::Job::max_drift) says otherwise; see
    /// [`DEFAULT_MAX_DRIFT`](super::DEFAULT_MAX_DRIFT)). Which records are
    /// read when changes; which time they go out at does not, so neither do
    /// results. A partition that never becomes idle
    /// (`idle_timeout: None`) and gets no records holds the others back.
    pub max_drift: MaxDrift,
    /// The alignment group (as Flink's `withWatermarkAlignment(group, ..)`):
    /// sources of one group are aligned with each other. `None` (the
    /// default): the job's group, which every source is in unless it names
    /// another.
    pub alignment_group: Option<String>,
    /// Offsets to start partitions from (by partition index), e.g. on recovery.
    pub start_offsets: Vec<(usize, Offset)>,
    /// Where the workers of a process post their watermarks, so that a worker
    /// whose partitions are all idle follows the others instead of holding the
    /// watermark back. Shared by cloning: make the options once, outside
    /// `timely::execute`. Across processes nothing is shared: a process whose
    /// partitions are all idle holds the watermark at the highest it reached
    /// until they resume or end.
    pub board: WatermarkBoard,
    /// How errors that may go away (timeouts, interruptions) are retried
    /// before the source fails.
    pub retry: RetryPolicy,
    /// Paces the source in processing time: at most this many records a
    /// second over all its partitions (each worker reads its partitions'
    /// share), e.g. to measure latency below saturation
    /// ([`crate::latency`]). `None` (the default) reads as fast as the
    /// dataflow takes records. Batches then hold what was due when they
    /// were read, so which records are late depends on timing, as for a
    /// live source (see [`read`](crate::source::read())'s determinism).
    pub rate_limit: Option<f64>,
}

/// How a source retries a partition's read after an error that may go away
/// ([`SourceError::is_retryable`](crate::source::SourceError::is_retryable)):
/// after `initial_backoff`, then twice as long each time up to `max_backoff`,
/// at most `attempts` times in a row; then the source fails, as on any other
/// error.
///
/// ```
/// use std::time::Duration;
/// let retry = highwater::source::RetryPolicy::default();
/// assert_eq!(retry.backoff(1), Duration::from_millis(100));
/// assert_eq!(retry.backoff(3), Duration::from_millis(400));
/// assert_eq!(retry.backoff(30), Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries in a row before the source fails.
    pub attempts: u32,
    /// The wait before the first retry.
    pub initial_backoff: Duration,
    /// The longest wait between two retries.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 retries, from 100 ms up to 10 s apart (about 40 s in all).
    fn default() -> Self {
        RetryPolicy { attempts: 10, initial_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self.initial_backoff.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        doubled.min(self.max_backoff)
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            name: "Source".to_owned(),
            watermark: WatermarkStrategy::default(),
            idle_timeout: Some(Duration::from_secs(5)),
            batch_size: 4096,
            watermark_interval: None,
            max_in_flight: 100_000,
            start_offsets: Vec::new(),
            board: WatermarkBoard::default(),
            retry: RetryPolicy::default(),
            rate_limit: None,
            max_drift: MaxDrift::Job,
            alignment_group: None,
        }
    }
}
