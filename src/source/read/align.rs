//! Watermark alignment: a source partition whose watermark runs more than a
//! drift ahead of the job's combined watermark stops reading until the
//! combined watermark comes within the drift (as Flink's
//! `withWatermarkAlignment`, FLIP-182/217, but on by default).
//!
//! Why: what an operator holds while it waits for event time (window
//! contents, join sides) is state, not records in flight, so flow control
//! never pauses a source for it. Without alignment, a partition read faster
//! than the others (its worker has less of the operators' work, a Kafka
//! partition with a higher rate, a consumer that fell behind on another
//! partition) runs ahead in event time, and the windows downstream hold
//! every record between its watermark and the job's: memory grows without
//! bound. With alignment they hold at most about `max_drift` of event time
//! more than the watermark delay asks.
//!
//! The combined watermark is the least watermark of the active partitions
//! (not idle, not ended) of every source of the group (by default, every
//! source of the job) on every worker of every process: the workers of a
//! process post their partitions on an [`Alignment`] kept in the timely
//! configuration, and a [`Job`](crate::Job) of several processes exchanges
//! each process's summary every few milliseconds. A value from another
//! process may be a little old; watermarks only grow, so an old value is
//! lower and pauses more, never less. The partition that holds the minimum is
//! never paused, so the job cannot deadlock; partitions that take turns
//! (file blocks) give their turn to one that may read.
//!
//! Alignment changes only when records are read, never their order within
//! a partition nor the time they go out at: results are the same with it
//! and without it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater_operators::{Counter, Timestamp};

/// The drift the sources of a job may run ahead of its combined watermark by
/// default: 10 s of event time.
///
/// Memory: a partition read ahead of the others makes the operators
/// downstream hold up to this much more event time of its records (at
/// Nexmark's 10 000 events a second of event time, 100 000 events: tens of
/// MiB at most, on any number of workers, where unaligned runs grew by
/// hundreds of MiB a minute). Throughput: a read batch spans well under
/// this (4 096 Nexmark events span 0.4 s), and so does a file block of the
/// default size (8 MiB, about 3 s), so partitions read side by side without
/// waiting for each other in the common case. Flink's documentation uses 20 s
/// in its example; half of it keeps the state of the 10 s Nexmark windows
/// within about two windows' worth.
pub const DEFAULT_MAX_DRIFT: Duration = Duration::from_secs(10);

/// How far a source's partitions may run ahead of the combined watermark of
/// their alignment group ([`SourceOptions::max_drift`](super::SourceOptions::max_drift)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MaxDrift {
    /// The job's setting ([`Job::max_drift`](crate::Job::max_drift)), which
    /// is [`DEFAULT_MAX_DRIFT`] unless the job says otherwise.
    #[default]
    Job,
    /// At most this much event time ahead.
    Of(Duration),
    /// Not aligned: the partitions read as fast as flow control lets them.
    Off,
}

/// The key under which a process's [`Alignment`] sits in the timely worker
/// configuration.
const KEY: &str = "highwater::source::alignment";

/// The group every source is in unless its options name another.
pub(crate) const JOB_GROUP: &str = "job";

/// The least and greatest watermark of some active partitions.
pub type Span = (Timestamp, Timestamp);

/// A process's watermark alignment: the watermarks its workers' source
/// partitions stand at, by alignment group, and what the other processes of
/// the job last reported of theirs. Shared by the process's workers through
/// the timely configuration ([`configure`](Self::configure)); a
/// [`Job`](crate::Job) does this itself.
#[derive(Clone, Debug)]
pub struct Alignment(Arc<Mutex<Groups>>);

#[derive(Debug)]
struct Groups {
    /// The job's drift, for sources that take the job's.
    max_drift: Option<Duration>,
    groups: BTreeMap<String, Group>,
    /// The other processes of the job not yet heard from: until each has
    /// reported, its partitions may stand anywhere, so partitions read only
    /// within the drift of the start of event time.
    awaiting: std::collections::BTreeSet<usize>,
}

#[derive(Debug, Default)]
struct Group {
    /// By (source, worker): the span of its active partitions, `None` while
    /// all rest (idle or ended).
    local: BTreeMap<(String, usize), Option<Span>>,
    /// By process: what it last reported (`None`: no active partition).
    remote: BTreeMap<usize, Option<Span>>,
}

impl Group {
    fn local_span(&self) -> Option<Span> {
        merge(self.local.values().copied())
    }

    fn combined(&self) -> Option<Span> {
        merge(self.local.values().chain(self.remote.values()).copied())
    }
}

fn merge(spans: impl Iterator<Item = Option<Span>>) -> Option<Span> {
    spans.flatten().reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

impl Default for Alignment {
    fn default() -> Self {
        Alignment(Arc::new(Mutex::new(Groups {
            max_drift: Some(DEFAULT_MAX_DRIFT),
            groups: BTreeMap::new(),
            awaiting: Default::default(),
        })))
    }
}

impl Alignment {
    /// Aligns the sources of the computation `config` describes across all
    /// the workers of this process (without it, a source aligns only the
    /// partitions of its own workers: see [`SourceOptions::board`](super::SourceOptions::board)).
    /// [`Job`](crate::Job) does this itself.
    pub fn configure(config: &mut timely::Config) -> Alignment {
        let alignment = Alignment::default();
        config.worker.set(KEY.to_owned(), alignment.clone());
        alignment
    }

    /// The alignment of the computation `scope` belongs to, if configured.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Alignment> {
        scope.worker().config().get::<Alignment>(KEY).cloned()
    }

    /// This is process `process` of `processes`: the others' partitions
    /// count once they report ([`learn`](Self::learn)); until then, this
    /// process's partitions wait at the drift above time 0.
    pub(crate) fn expect_processes(&self, process: usize, processes: usize) {
        self.lock().awaiting = (0..processes).filter(|p| *p != process).collect();
    }

    /// Sets the drift of the sources that take the job's ([`MaxDrift::Job`]);
    /// `None` turns their alignment off.
    pub fn set_max_drift(&self, drift: Option<Duration>) {
        self.lock().max_drift = drift;
    }

    /// The drift of the sources that take the job's.
    pub fn max_drift(&self) -> Option<Duration> {
        self.lock().max_drift
    }

    /// The current drift of `group`: how far its most advanced active
    /// partition is ahead of its combined watermark (ms); `None` if no
    /// partition is active.
    pub fn drift(&self, group: &str) -> Option<u64> {
        let groups = self.lock();
        groups.groups.get(group)?.combined().map(|(lo, hi)| hi.saturating_sub(lo))
    }

    /// The greatest current drift of any group (ms), for a progress line.
    pub fn greatest_drift(&self) -> Option<u64> {
        let groups = self.lock();
        groups.groups.values().filter_map(|g| g.combined().map(|(lo, hi)| hi.saturating_sub(lo))).max()
    }

    /// Every source of this process with the span of its active partitions
    /// over all of its workers (`None`: all rest): the earliest is the
    /// source's watermark, for metrics and the status page.
    pub fn sources(&self) -> Vec<(String, Option<Span>)> {
        let groups = self.lock();
        let mut sources: BTreeMap<String, Option<Span>> = BTreeMap::new();
        for group in groups.groups.values() {
            for ((source, _), span) in &group.local {
                let merged = sources.entry(source.clone()).or_default();
                *merged = merge([*merged, *span].into_iter());
            }
        }
        sources.into_iter().collect()
    }

    /// Posts the `span` of the active partitions of `source` on `worker` in
    /// `group` (`None`: all rest) and returns the group's combined watermark
    /// (`None`: no partition is active anywhere, as far as this process
    /// knows).
    pub(crate) fn post(&self, group: &str, source: &str, worker: usize, span: Option<Span>) -> Option<Timestamp> {
        let mut groups = self.lock();
        let awaiting = !groups.awaiting.is_empty();
        let group = match groups.groups.get_mut(group) {
            Some(g) => g,
            None => groups.groups.entry(group.to_owned()).or_default(),
        };
        match group.local.get_mut(&(source.to_owned(), worker)) {
            Some(posted) => *posted = span,
            None => {
                group.local.insert((source.to_owned(), worker), span);
            }
        }
        if awaiting {
            return Some(0);
        }
        group.combined().map(|(lo, _)| lo)
    }

    /// What this process reports to the others: by group, the span of its
    /// active partitions.
    pub(crate) fn summary(&self) -> Vec<(String, Option<Span>)> {
        let groups = self.lock();
        groups.groups.iter().map(|(name, g)| (name.clone(), g.local_span())).collect()
    }

    /// Process `process` reports the spans of its active partitions (a
    /// group it does not name has none there).
    pub(crate) fn learn(&self, process: usize, summary: &[(String, Option<Span>)]) {
        let mut groups = self.lock();
        groups.awaiting.remove(&process);
        for (name, _) in summary {
            groups.groups.entry(name.clone()).or_default();
        }
        for (name, group) in groups.groups.iter_mut() {
            let span = summary.iter().find(|(n, _)| n == name).and_then(|(_, span)| *span);
            group.remote.insert(process, span);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One worker's part in a source's alignment: where it posts its
/// partitions, which it pauses, and for how long.
pub(super) struct Aligner {
    /// The process's alignment and the group, if configured (else the
    /// source's own board aligns this process's workers of the source).
    alignment: Option<(Alignment, String)>,
    /// The drift in ms, or `None` if the source is not aligned.
    drift: Option<u64>,
    /// Since when a partition of this worker has been paused.
    paused_since: Option<Instant>,
    /// Microseconds spent with a partition paused.
    aligned: Counter,
    /// What the last [`limit`](Self::limit) learnt from the [`Alignment`]:
    /// the group's combined watermark (`None`: no partition of the group is
    /// active anywhere). `None` without an alignment or before the first.
    combined: Option<Option<Timestamp>>,
}

impl Aligner {
    pub(super) fn new(
        alignment: Option<Alignment>,
        group: Option<&str>,
        max_drift: MaxDrift,
        aligned: Counter,
    ) -> Self {
        let drift = match max_drift {
            MaxDrift::Off => None,
            MaxDrift::Of(d) => Some(d),
            MaxDrift::Job => alignment.as_ref().map_or(Some(DEFAULT_MAX_DRIFT), Alignment::max_drift),
        };
        let group = group.unwrap_or(JOB_GROUP).to_owned();
        Aligner {
            alignment: alignment.map(|a| (a, group)),
            drift: drift.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
            paused_since: None,
            aligned,
            combined: None,
        }
    }

    /// Whether alignment is on.
    pub(super) fn enabled(&self) -> bool {
        self.drift.is_some()
    }

    /// Posts this worker's active partitions of `source` and returns the
    /// watermark above which a partition is paused: the combined watermark
    /// plus the drift (`None`: nothing is paused). `board_min` gives the
    /// least watermark of the source's active partitions on this process's
    /// workers, used when no [`Alignment`] is configured.
    pub(super) fn limit(
        &mut self,
        source: &str,
        worker: usize,
        span: Option<Span>,
        board_min: impl FnOnce() -> Option<Timestamp>,
    ) -> Option<Timestamp> {
        let combined = match self.alignment.as_ref() {
            Some((alignment, group)) => {
                let combined = alignment.post(group, source, worker, span);
                self.combined = Some(combined);
                combined
            }
            None => board_min(),
        };
        Some(combined?.saturating_add(self.drift?))
    }

    /// The combined watermark of the group's active partitions on every
    /// worker and process, as last posted: `Some(None)` if none is active
    /// anywhere, `None` if unknown (no [`Alignment`], or alignment off).
    pub(super) fn combined(&self) -> Option<Option<Timestamp>> {
        self.combined
    }

    /// Notes whether a partition of this worker is paused now (for the time
    /// spent paused).
    pub(super) fn paused(&mut self, any: bool, now: Instant) {
        match (any, self.paused_since) {
            (true, None) => self.paused_since = Some(now),
            (false, Some(since)) => {
                self.aligned.add(now.duration_since(since).as_micros() as u64);
                self.paused_since = None;
            }
            _ => {}
        }
    }
}

impl Drop for Aligner {
    fn drop(&mut self) {
        self.paused(false, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_combined_watermark_is_the_least_active_one_of_every_worker_and_process() {
        let a = Alignment::default();
        assert_eq!(a.post("job", "s", 0, Some((10, 50))), Some(10));
        assert_eq!(a.post("job", "s", 1, Some((30, 90))), Some(10));
        assert_eq!(a.drift("job"), Some(80));
        // Worker 0's partitions all rest: left out.
        assert_eq!(a.post("job", "s", 0, None), Some(30));
        // Another source of the group, and another group.
        assert_eq!(a.post("job", "t", 0, Some((20, 20))), Some(20));
        assert_eq!(a.post("other", "u", 0, Some((5, 5))), Some(5));
        assert_eq!(a.summary(), vec![("job".to_owned(), Some((20, 90))), ("other".to_owned(), Some((5, 5)))]);
        // Another process reports a lower one; then its partitions rest.
        a.learn(1, &[("job".to_owned(), Some((12, 40)))]);
        assert_eq!(a.post("job", "s", 1, Some((31, 90))), Some(12));
        a.learn(1, &[("job".to_owned(), None)]);
        assert_eq!(a.post("job", "s", 1, Some((31, 90))), Some(20));
        assert_eq!(a.greatest_drift(), Some(70));
        // Nothing active anywhere: no combined watermark, nothing paused.
        a.post("job", "s", 1, None);
        assert_eq!(a.post("job", "t", 0, None), None);
    }

    #[test]
    fn partitions_wait_near_time_zero_until_every_process_has_reported() {
        let a = Alignment::default();
        a.expect_processes(0, 3);
        assert_eq!(a.post("job", "s", 0, Some((50, 50))), Some(0));
        a.learn(1, &[("job".to_owned(), Some((70, 80)))]);
        assert_eq!(a.post("job", "s", 0, Some((50, 50))), Some(0));
        // Process 2 has no partition of the group.
        a.learn(2, &[]);
        assert_eq!(a.post("job", "s", 0, Some((60, 60))), Some(60));
        assert_eq!(a.drift("job"), Some(20));
    }

    #[test]
    fn the_limit_is_the_combined_watermark_plus_the_drift() {
        let a = Alignment::default();
        let mut aligner = Aligner::new(Some(a.clone()), None, MaxDrift::Of(Duration::from_secs(1)), Counter::default());
        assert_eq!(aligner.combined(), None);
        assert_eq!(aligner.limit("s", 0, Some((5_000, 9_000)), || None), Some(6_000));
        assert_eq!(aligner.combined(), Some(Some(5_000)));
        let mut off = Aligner::new(Some(a.clone()), None, MaxDrift::Off, Counter::default());
        assert_eq!(off.limit("s", 1, Some((1_000, 2_000)), || None), None);
        // The job's drift, and a job that turns it off.
        let mut job = Aligner::new(Some(a.clone()), None, MaxDrift::Job, Counter::default());
        assert_eq!(job.limit("s", 2, Some((1_000, 1_000)), || None), Some(11_000));
        a.set_max_drift(None);
        assert!(!Aligner::new(Some(a), None, MaxDrift::Job, Counter::default()).enabled());
        // Without an alignment: the board's minimum.
        let mut alone = Aligner::new(None, None, MaxDrift::Job, Counter::default());
        assert_eq!(alone.limit("s", 0, Some((7, 8)), || Some(3)), Some(3 + 10_000));
        assert_eq!(alone.combined(), None);
    }

    #[test]
    fn time_paused_is_counted() {
        let counter = Counter::default();
        let mut aligner = Aligner::new(None, None, MaxDrift::Job, counter.clone());
        let t0 = Instant::now();
        aligner.paused(true, t0);
        aligner.paused(true, t0 + Duration::from_millis(5));
        aligner.paused(false, t0 + Duration::from_millis(7));
        assert_eq!(counter.get(), 7_000);
    }
}
