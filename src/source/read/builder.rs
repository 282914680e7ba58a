//! [`FromSource`]: a source read into a dataflow, configured step by step.

use std::sync::Arc;

use timely::dataflow::{ProbeHandle, Scope};

use super::{read, MaxDrift, RetryPolicy, SourceMetrics, SourceOptions, SourceStreams};
use crate::source::{Offset, Source, SourceError};
use crate::time::{IntoMillis, WatermarkStrategy};
use crate::Timestamp;

/// A source read into a dataflow, configured step by step and built in a
/// worker's scope: the builder of [`read`](super::read()) (which takes every
/// setting at once). Every setting has the default of [`SourceOptions`].
///
/// ```
/// use std::sync::Arc;
///
/// use highwater::prelude::*;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// // (user, event time in ms) in two partitions; a record 3 s behind the
/// // greatest time seen is on time.
/// let clicks = Arc::new(MemorySource::new(vec![vec![(1u32, 1_000u64), (2, 9_000)], vec![(1, 6_500)]]));
/// let captured = timely::example(move |scope| {
///     let read = FromSource::new(clicks, |c: &(u32, u64)| c.1)
///         .named("clicks")
///         .watermark(WatermarkStrategy::bounded(3.secs()))
///         .batch_size(1) // the watermark advances after every record
///         .build(scope)
///         .unwrap();
///     read.events.inner.capture()
/// });
/// let mut times: Vec<u64> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(c, _, _)| c.1).collect();
/// times.sort();
/// assert_eq!(times, [1_000, 6_500, 9_000]);
/// ```
#[derive(Debug)]
pub struct FromSource<S, TF> {
    source: Arc<S>,
    time_of: TF,
    options: SourceOptions,
    metrics: SourceMetrics,
    probe: Option<ProbeHandle<Timestamp>>,
}

impl<S: Source, TF: Fn(&S::Record) -> Timestamp + 'static> FromSource<S, TF> {
    /// Reads `source`, whose records' event time is `time_of(record)`.
    pub fn new(source: Arc<S>, time_of: TF) -> Self {
        FromSource {
            source,
            time_of,
            options: SourceOptions::default(),
            metrics: SourceMetrics::default(),
            probe: None,
        }
    }

    /// Every setting at once (the fields of [`SourceOptions`]).
    pub fn options(mut self, options: SourceOptions) -> Self {
        self.options = options;
        self
    }

    /// Names the source: in logs, metrics and checkpoints (where a source's
    /// offsets are kept under its name, so name each source of a job apart).
    pub fn named(mut self, name: &str) -> Self {
        self.options.name = name.to_owned();
        self
    }

    /// How each partition's watermark follows the event times it reads
    /// (default: 4 s behind the greatest).
    pub fn watermark(mut self, strategy: WatermarkStrategy) -> Self {
        self.options.watermark = strategy;
        self
    }

    /// A partition with no records for this long stops holding the
    /// watermark back (default 5 s).
    pub fn idle_timeout(mut self, timeout: impl IntoMillis) -> Self {
        self.options.idle_timeout = Some(std::time::Duration::from_millis(timeout.into_millis()));
        self
    }

    /// Partitions hold the watermark back however long they go without
    /// records.
    pub fn never_idle(mut self) -> Self {
        self.options.idle_timeout = None;
        self
    }

    /// Records per read, and so between two advances of a partition's
    /// watermark (default 4096; `1` judges every record against the ones
    /// before it). See [`SourceOptions::batch_size`].
    pub fn batch_size(mut self, records: usize) -> Self {
        self.options.batch_size = records.max(1);
        self
    }

    /// Paces the source in processing time: at most `records_per_second`
    /// over all its partitions. See [`SourceOptions::rate_limit`].
    pub fn rate_limit(mut self, records_per_second: f64) -> Self {
        self.options.rate_limit = Some(records_per_second);
        self
    }

    /// Advances the watermark at most once per `interval` of processing
    /// time instead of after every batch. See
    /// [`SourceOptions::watermark_interval`].
    pub fn watermark_interval(mut self, interval: impl IntoMillis) -> Self {
        self.options.watermark_interval = Some(std::time::Duration::from_millis(interval.into_millis()));
        self
    }

    /// Watermark alignment: a partition more than `drift` of event time
    /// ahead of the combined watermark of its group waits until the others
    /// catch up (default: the job's, 10 s). See [`SourceOptions::max_drift`].
    pub fn max_drift(mut self, drift: impl IntoMillis) -> Self {
        self.options.max_drift = MaxDrift::Of(std::time::Duration::from_millis(drift.into_millis()));
        self
    }

    /// Turns watermark alignment off for this source: its partitions read
    /// as fast as flow control lets them, however far ahead in event time.
    pub fn unaligned(mut self) -> Self {
        self.options.max_drift = MaxDrift::Off;
        self
    }

    /// Aligns this source with the sources of `group` only (default: every
    /// source of the job). See [`SourceOptions::alignment_group`].
    pub fn alignment_group(mut self, group: &str) -> Self {
        self.options.alignment_group = Some(group.to_owned());
        self
    }

    /// How errors that may go away are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = policy;
        self
    }

    /// Starts partitions at these offsets (by partition index); a restored
    /// checkpoint's offsets take precedence.
    pub fn start_at(mut self, offsets: Vec<(usize, Offset)>) -> Self {
        self.options.start_offsets = offsets;
        self
    }

    /// Counts into `metrics` (share one, made outside the workers, to count
    /// over all of a process's workers).
    pub fn metrics(mut self, metrics: &SourceMetrics) -> Self {
        self.metrics = metrics.clone();
        self
    }

    /// Flow control with `max_in_flight` records per worker (see
    /// [`SourceOptions::max_in_flight`]), and `probe`, the probe of the
    /// dataflow's outputs: with checkpoints, it bounds what the source reads
    /// ahead of a pending cut; in a computation whose records in flight are
    /// not counted (not run as a [`Job`](crate::Job)), the source pauses
    /// while its records have not passed it.
    pub fn paced_by(mut self, probe: &ProbeHandle<Timestamp>, max_in_flight: usize) -> Self {
        self.probe = Some(probe.clone());
        self.options.max_in_flight = max_in_flight;
        self
    }

    /// Reads the source in `scope`: its records and its dead letters.
    ///
    /// # Errors
    /// If the source cannot list its partitions, or a restored checkpoint
    /// does not fit it.
    pub fn build<'scope>(
        self,
        scope: Scope<'scope, Timestamp>,
    ) -> Result<SourceStreams<'scope, S::Record>, SourceError> {
        read(scope, self.source, self.time_of, self.options, &self.metrics, self.probe)
    }
}
