//! Latency, measured: how long after a source read a record the sink emitted
//! what it produced, and how long after the watermark passed a result's time
//! (a window's end) the sink emitted the result.
//!
//! A job measures its latency when it is asked to
//! ([`Job::measuring_latency`](crate::Job::measuring_latency), or
//! [`Latency::configure`] on a timely configuration). Then every source
//! keeps, per worker, a *clock*: the instants at which its records first
//! reached each event time, and at which its watermark (the capability its
//! batches go out at) passed each time. Every sink ([`crate::sink::write`],
//! and so every line, part-file and PostgreSQL sink) looks up, for each
//! update it has written, the update's event time on those clocks:
//!
//! - **read → sink**: now, less the instant a source of this process read a
//!   record at the update's event time. For an operator that keeps its
//!   input's event time (a filter, a map, a stream–table join: q1, q2, q3)
//!   this is the record's end-to-end latency. Each worker's clock holds the
//!   instant it first read each event time (times below the greatest it had
//!   read do not count); an update is measured from the worker that read a
//!   record at exactly its time, the latest of them if several did (else
//!   from the latest that first went past it). It is exact when each
//!   millisecond of event time holds records of one worker (Nexmark's
//!   generator at `--rate 1000` or less); otherwise a record read after
//!   another of its millisecond counts from the first one's read (longer),
//!   and one read by a worker ahead of another from the later one (shorter).
//! - **watermark → sink**: now, less the instant every source worker's
//!   watermark had passed the update's time. A window result goes out at its
//!   window's last millisecond (a session's at its end) and is due when the
//!   watermark passes it: this is the window-result latency. Updates emitted
//!   before the watermark passed them (a filter's output, with a watermark
//!   delay) have none.
//!
//! Both are recorded in HDR histograms (`hdrhistogram`, 3 significant
//! digits, nanoseconds) and summarised as p50, p99, p99.9 and the maximum
//! ([`LatencyReport`]). A process compares its sinks with its own sources'
//! clocks: in a job of several processes a sink's records may come from
//! another process's sources, whose clocks it does not see, so measure
//! latency on one process (any number of workers).
//!
//! To measure below saturation, pace the sources in processing time
//! ([`SourceOptions::rate_limit`](crate::source::SourceOptions::rate_limit);
//! `highwater nexmark --rate-limit N`): latency at full speed is mostly the
//! time records queue.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use highwater_operators::Timestamp;

/// The key under which a job's [`Latency`] sits in the timely worker
/// configuration.
const KEY: &str = "highwater::latency";

/// How many instants a worker's clock keeps per kind (the oldest go first):
/// sinks look up recent times, this bounds memory on an unbounded run.
const CLOCK_CAPACITY: usize = 1 << 18;

/// The longest latency a histogram holds exactly (longer ones count as this).
const HIGHEST_NS: u64 = 3_600_000_000_000;

/// One worker's clock: when its records first reached each event time, and
/// when its watermark passed each time (both in increasing time order).
#[derive(Debug, Default)]
struct Clock {
    read: VecDeque<(Timestamp, Instant)>,
    watermark: VecDeque<(Timestamp, Instant)>,
}

/// Appends `(time, at)` to `entries` if `time` is past the last one's.
fn push(entries: &mut VecDeque<(Timestamp, Instant)>, time: Timestamp, at: Instant) {
    if entries.back().is_none_or(|(last, _)| time > *last) {
        if entries.len() == CLOCK_CAPACITY {
            entries.pop_front();
        }
        entries.push_back((time, at));
    }
}

/// The instant of the first entry whose time is at least `time`, and
/// whether its time is `time` itself.
fn first_at_or_after(entries: &VecDeque<(Timestamp, Instant)>, time: Timestamp) -> Option<(Instant, bool)> {
    let i = entries.partition_point(|(t, _)| *t < time);
    entries.get(i).map(|(t, at)| (*at, *t == time))
}

/// When the record at event time `time` was read: by the worker that read a
/// record at exactly that time (the latest of them if several did), else
/// the latest of those that first reached a later time.
fn read_at(clocks: &[std::sync::MutexGuard<'_, Clock>], time: Timestamp) -> Option<Instant> {
    let found = || clocks.iter().filter_map(|c| first_at_or_after(&c.read, time));
    found().filter(|(_, exact)| *exact).map(|(at, _)| at).max().or_else(|| found().map(|(at, _)| at).max())
}

/// The two histograms, in nanoseconds.
#[derive(Debug)]
struct Histograms {
    since_read: Histogram<u64>,
    since_watermark: Histogram<u64>,
}

impl Histograms {
    fn new() -> Self {
        let histogram = || Histogram::new_with_bounds(1, HIGHEST_NS, 3).expect("valid histogram bounds");
        Histograms { since_read: histogram(), since_watermark: histogram() }
    }
}

/// A process's latency measurement: its source workers' clocks and its
/// sinks' histograms (see the [module](self)). Cheap to clone: clones share.
#[derive(Clone, Debug)]
pub struct Latency {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The index of this process's first worker.
    first: usize,
    clocks: Vec<Mutex<Clock>>,
    histograms: Mutex<Histograms>,
}

impl Latency {
    /// Measures the latency of the computation `config` describes: its
    /// sources keep clocks and its sinks record histograms.
    /// [`Job::measuring_latency`](crate::Job::measuring_latency) does this
    /// itself; a program that calls `timely::execute` directly calls it on
    /// its configuration.
    pub fn configure(config: &mut timely::Config) -> Latency {
        let (process, threads) = match &config.communication {
            timely::CommunicationConfig::Thread => (0, 1),
            timely::CommunicationConfig::Process(n) | timely::CommunicationConfig::ProcessBinary(n) => (0, *n),
            timely::CommunicationConfig::Cluster { threads, process, .. } => (*process, *threads),
        };
        let threads = threads.max(1);
        let latency = Latency {
            inner: Arc::new(Inner {
                first: process * threads,
                clocks: (0..threads).map(|_| Mutex::new(Clock::default())).collect(),
                histograms: Mutex::new(Histograms::new()),
            }),
        };
        config.worker.set(KEY.to_owned(), latency.clone());
        latency
    }

    /// The measurement of the computation `scope` belongs to, if it measures.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Latency> {
        scope.worker().config().get::<Latency>(KEY).cloned()
    }

    fn clock(&self, worker: usize) -> Option<std::sync::MutexGuard<'_, Clock>> {
        let clock = self.inner.clocks.get(worker.checked_sub(self.inner.first)?)?;
        Some(clock.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A source on `worker` has just read records at these event times.
    pub(crate) fn read(&self, worker: usize, times: impl Iterator<Item = Timestamp>) {
        if let Some(mut clock) = self.clock(worker) {
            let now = Instant::now();
            times.for_each(|time| push(&mut clock.read, time, now));
        }
    }

    /// A source's watermark on `worker` has moved to `time`.
    pub(crate) fn watermark(&self, worker: usize, time: Timestamp) {
        if let Some(mut clock) = self.clock(worker) {
            push(&mut clock.watermark, time, Instant::now());
        }
    }

    /// A sink has just written updates at these event times.
    pub(crate) fn emitted(&self, times: &[Timestamp]) {
        if times.is_empty() {
            return;
        }
        let now = Instant::now();
        let clocks: Vec<_> = self.inner.clocks.iter().map(|c| c.lock().unwrap_or_else(|e| e.into_inner())).collect();
        let mut histograms = self.inner.histograms.lock().unwrap_or_else(|e| e.into_inner());
        let record = |h: &mut Histogram<u64>, at: Instant| {
            let ns = now.saturating_duration_since(at).as_nanos().min(u128::from(HIGHEST_NS)) as u64;
            h.saturating_record(ns.max(1));
        };
        for &time in times {
            if let Some(read) = read_at(&clocks, time) {
                record(&mut histograms.since_read, read);
            }
            // Due once every worker's watermark is past `time`.
            let due = clocks.iter().try_fold(None, |due: Option<Instant>, c| {
                first_at_or_after(&c.watermark, time.saturating_add(1)).map(|(at, _)| due.max(Some(at)))
            });
            if let Some(due) = due.flatten() {
                record(&mut histograms.since_watermark, due);
            }
        }
    }

    /// What has been measured so far.
    pub fn report(&self) -> LatencyReport {
        let histograms = self.inner.histograms.lock().unwrap_or_else(|e| e.into_inner());
        LatencyReport {
            since_read: Percentiles::of(&histograms.since_read),
            since_watermark: Percentiles::of(&histograms.since_watermark),
        }
    }
}

/// A latency distribution's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// How many updates were measured.
    pub count: u64,
    /// The median.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The 99.9th percentile.
    pub p999: Duration,
    /// The longest.
    pub max: Duration,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        let at = |q: f64| Duration::from_nanos(h.value_at_quantile(q));
        Percentiles { count: h.len(), p50: at(0.5), p99: at(0.99), p999: at(0.999), max: Duration::from_nanos(h.max()) }
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.count == 0 {
            return write!(f, "none measured");
        }
        let us = |d: Duration| d.as_nanos() as f64 / 1000.0;
        write!(
            f,
            "n={} p50={:.1}µs p99={:.1}µs p99.9={:.1}µs max={:.1}µs",
            self.count,
            us(self.p50),
            us(self.p99),
            us(self.p999),
            us(self.max)
        )
    }
}

/// A job's latency (see the [module](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyReport {
    /// From the instant a source read a record to the instant a sink emitted
    /// an update at its event time.
    pub since_read: Percentiles,
    /// From the instant the watermark passed an update's time (a window
    /// result's: its window's end) to the instant a sink emitted it.
    pub since_watermark: Percentiles,
}

impl std::fmt::Display for LatencyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "latency read → sink: {}", self.since_read)?;
        write!(f, "latency watermark → sink: {}", self.since_watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_answers_with_the_first_instant_at_or_after_a_time() {
        let t0 = Instant::now();
        let mut entries = VecDeque::new();
        push(&mut entries, 10, t0);
        push(&mut entries, 5, t0 + Duration::from_millis(1)); // behind: ignored
        push(&mut entries, 20, t0 + Duration::from_millis(2));
        assert_eq!(first_at_or_after(&entries, 0), Some((t0, false)));
        assert_eq!(first_at_or_after(&entries, 10), Some((t0, true)));
        assert_eq!(first_at_or_after(&entries, 11), Some((t0 + Duration::from_millis(2), false)));
        assert_eq!(first_at_or_after(&entries, 21), None);
    }

    #[test]
    fn a_record_is_measured_from_the_worker_that_read_its_time() {
        let mut config = timely::Config::process(2);
        let latency = Latency::configure(&mut config);
        let first = Instant::now();
        latency.read(0, [100].into_iter());
        std::thread::sleep(Duration::from_millis(30));
        latency.read(1, [101].into_iter()); // later, but past 100: not the reader of 100
        latency.emitted(&[100]);
        let report = latency.report();
        assert!(report.since_read.max >= Duration::from_millis(30), "from worker 0's read: {report}");
        // The histograms keep 3 significant digits: a value reads back as
        // the top of its bucket, up to 0.1 % above what was recorded (a CI
        // run read 30 097.4 µs back for a measurement shorter than that).
        let elapsed = first.elapsed();
        assert!(report.since_read.max <= elapsed + elapsed / 500, "{report}");
    }

    #[test]
    fn updates_are_measured_against_the_latest_worker_and_the_last_watermark() {
        let mut config = timely::Config::process(2);
        let latency = Latency::configure(&mut config);
        latency.read(0, [100].into_iter());
        latency.watermark(0, 200);
        std::thread::sleep(Duration::from_millis(30));
        let before_second_read = Instant::now();
        latency.read(1, [100].into_iter());
        std::thread::sleep(Duration::from_millis(30));
        // Worker 1's watermark has not passed 150: not due yet.
        latency.emitted(&[100, 150]);
        let since_second_read = before_second_read.elapsed();
        let report = latency.report();
        assert_eq!(report.since_read.count, 1, "time 150 was read by no worker");
        assert!(report.since_read.max >= Duration::from_millis(30), "{report}");
        // Measured from worker 1's read (the later one), not worker 0's.
        assert!(report.since_read.max <= since_second_read + Duration::from_micros(100), "{report}");
        assert_eq!(report.since_watermark.count, 0, "{report}");
        latency.watermark(1, 300);
        latency.emitted(&[150]);
        assert_eq!(latency.report().since_watermark.count, 1);
    }
}
