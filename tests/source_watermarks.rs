//! Source watermarks: the minimum over partitions, with idle partitions left out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::dead_letter::DeadLetter;
use highwater::source::{read, Offset, PartitionReader, ReadStatus, Source, SourceError, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::prelude::*;
use timely::dataflow::operators::Inspect;

/// Partition 0 has records at 0..20 s; partition 1 stays silent for `silence`, then ends.
struct Lopsided {
    silence: Duration,
    started: Instant,
}

enum Reader {
    Busy(std::vec::IntoIter<u64>),
    Silent(Instant, Duration),
}

impl PartitionReader for Reader {
    type Record = u64;
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(u64),
        _: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        match self {
            Reader::Busy(times) => {
                times.by_ref().take(max).for_each(out);
                Ok(if times.len() == 0 { ReadStatus::End } else { ReadStatus::Data })
            }
            Reader::Silent(started, silence) => {
                Ok(if started.elapsed() >= *silence { ReadStatus::End } else { ReadStatus::Idle })
            }
        }
    }
    fn offset(&self) -> Offset {
        0
    }
}

impl Source for Lopsided {
    type Record = u64;
    type Reader = Reader;
    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(vec!["busy".into(), "silent".into()])
    }
    fn open(&self, index: usize, _from: Option<Offset>) -> Result<Reader, SourceError> {
        Ok(match index {
            0 => Reader::Busy((0..20_000).step_by(100).collect::<Vec<u64>>().into_iter()),
            _ => Reader::Silent(self.started, self.silence),
        })
    }
}

/// A source of one partition that has nothing for `silence`, then ends.
struct Quiet {
    silence: Duration,
    started: Instant,
}

impl Source for Quiet {
    type Record = u64;
    type Reader = Reader;
    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(vec!["quiet".into()])
    }
    fn open(&self, _index: usize, _from: Option<Offset>) -> Result<Reader, SourceError> {
        Ok(Reader::Silent(self.started, self.silence))
    }
}

/// Runs a 1 s tumbling count over the lopsided source; returns when each
/// window result arrived, relative to the start.
fn arrivals(idle_timeout: Option<Duration>, workers: usize) -> Vec<(u64, Duration)> {
    let started = Instant::now();
    let source = Arc::new(Lopsided { silence: Duration::from_millis(1500), started });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    // Made once: the workers share its watermark board.
    let options =
        SourceOptions { watermark: WatermarkStrategy::bounded(0), idle_timeout, batch_size: 10, ..Default::default() };
    timely::execute(timely::Config::process(workers), move |worker| {
        let (source, seen, options) = (Arc::clone(&source), Arc::clone(&s), options.clone());
        worker.dataflow(|scope| {
            let times = read(scope, source, |t: &u64| *t, options, &SourceMetrics::default(), None).unwrap();
            let counts = times.events.window(Tumbling::of(1_000)).aggregate(Count);
            counts
                .results
                .inner
                .inspect(move |(r, _, _)| seen.lock().unwrap().push((r.window.start, started.elapsed())));
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    seen
}

fn idle_partition_stops_holding_the_watermark(workers: usize) {
    let with_idleness = arrivals(Some(Duration::from_millis(100)), workers);
    assert_eq!(with_idleness.len(), 20, "one count per second of data");
    // The busy partition's windows fire while the other partition is still silent.
    let early = with_idleness.iter().filter(|(_, at)| *at < Duration::from_millis(1400)).count();
    assert!(early >= 19, "windows should fire during the silence: {with_idleness:?}");

    let without = arrivals(None, workers);
    assert_eq!(without.len(), 20);
    // A silent partition that is never idle holds every window until it ends.
    assert!(without.iter().all(|(_, at)| *at >= Duration::from_millis(1500)), "{without:?}");
}

#[test]
fn idle_partition_stops_holding_the_watermark_1w() {
    idle_partition_stops_holding_the_watermark(1)
}

#[test]
fn idle_partition_stops_holding_the_watermark_2w() {
    idle_partition_stops_holding_the_watermark(2)
}

/// Two sources, one of them quiet (its only partition idle) while the
/// other reads 20 s of event time over about 1 s: the quiet source follows
/// the other (through the job's watermark alignment), so the windows over
/// both fire as the busy one reads, not when the quiet one ends (DESIGN,
/// "Time": an idle partition stops holding the watermark back).
fn an_idle_source_follows_the_others(workers: usize) {
    let started = Instant::now();
    let busy = Arc::new(Lopsided { silence: Duration::ZERO, started });
    let quiet = Arc::new(Quiet { silence: Duration::from_millis(3000), started });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let mut config = timely::Config::process(workers);
    highwater::source::Alignment::configure(&mut config);
    let options = |name: &str, idle: Option<Duration>, rate: Option<f64>| SourceOptions {
        name: name.into(),
        watermark: WatermarkStrategy::bounded(0),
        idle_timeout: idle,
        batch_size: 10,
        rate_limit: rate,
        ..Default::default()
    };
    // `busy` reads its 200 records over about 1 s (its second partition ends at once).
    let (busy_options, quiet_options) =
        (options("busy", None, Some(200.0)), options("quiet", Some(Duration::from_millis(100)), None));
    timely::execute(config, move |worker| {
        let (busy, quiet, seen) = (Arc::clone(&busy), Arc::clone(&quiet), Arc::clone(&s));
        let (busy_options, quiet_options) = (busy_options.clone(), quiet_options.clone());
        worker.dataflow(|scope| {
            let metrics = SourceMetrics::default();
            let a = read(scope, busy, |t: &u64| *t, busy_options, &metrics, None).unwrap();
            let b = read(scope, quiet, |t: &u64| *t, quiet_options, &metrics, None).unwrap();
            let counts = a.events.concat(&b.events).window(Tumbling::of(1_000)).aggregate(Count);
            counts
                .results
                .inner
                .inspect(move |(r, _, _)| seen.lock().unwrap().push((r.window.start, started.elapsed())));
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20, "one count per second of the busy source: {seen:?}");
    let early = seen.iter().filter(|(_, at)| *at < Duration::from_millis(2500)).count();
    assert!(early >= 19, "windows should fire while the quiet source is idle: {seen:?}");
}

#[test]
fn an_idle_source_follows_the_others_1w() {
    an_idle_source_follows_the_others(1);
}

#[test]
fn an_idle_source_follows_the_others_2w() {
    an_idle_source_follows_the_others(2);
}

/// A third worker with no partition at all must not hold the idle one back.
#[test]
fn idle_partition_stops_holding_the_watermark_3w() {
    idle_partition_stops_holding_the_watermark(3)
}

/// Partition 0 has records at 0..10 s at once; partition 1 has the same
/// records, but its reader has nothing for `wait` first and says
/// `waiting` meanwhile.
struct Slow {
    wait: Duration,
    waiting: ReadStatus,
    started: Instant,
}

struct SlowReader {
    times: std::vec::IntoIter<u64>,
    until: Option<(Instant, ReadStatus)>,
}

impl PartitionReader for SlowReader {
    type Record = u64;
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(u64),
        _: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        if let Some((until, waiting)) = self.until {
            if Instant::now() < until {
                return Ok(waiting);
            }
        }
        self.times.by_ref().take(max).for_each(out);
        Ok(if self.times.len() == 0 { ReadStatus::End } else { ReadStatus::Data })
    }
    fn offset(&self) -> Offset {
        0
    }
}

impl Source for Slow {
    type Record = u64;
    type Reader = SlowReader;
    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(vec!["quick".into(), "slow".into()])
    }
    fn open(&self, index: usize, _from: Option<Offset>) -> Result<SlowReader, SourceError> {
        let times = (0..10_000).step_by(100).collect::<Vec<u64>>().into_iter();
        Ok(SlowReader { times, until: (index == 1).then(|| (self.started + self.wait, self.waiting)) })
    }
}

/// The records of a 1 s tumbling count over [`Slow`] that came late, and
/// the final count of each window.
fn slow_partition_counts(waiting: ReadStatus, workers: usize) -> (u64, BTreeMap<u64, i64>) {
    let source = Arc::new(Slow { wait: Duration::from_millis(600), waiting, started: Instant::now() });
    let counts = Arc::new(Mutex::new(BTreeMap::new()));
    let late = Arc::new(Mutex::new(0));
    let (c, l) = (Arc::clone(&counts), Arc::clone(&late));
    // An idle timeout far below the slow partition's wait.
    let options = SourceOptions {
        watermark: WatermarkStrategy::bounded(0),
        idle_timeout: Some(Duration::from_millis(50)),
        batch_size: 10,
        ..Default::default()
    };
    timely::execute(timely::Config::process(workers), move |worker| {
        let (source, counts, late, options) = (Arc::clone(&source), Arc::clone(&c), Arc::clone(&l), options.clone());
        worker.dataflow(|scope| {
            let times = read(scope, source, |t: &u64| *t, options, &SourceMetrics::default(), None).unwrap();
            let windowed = times.events.window(Tumbling::of(1_000)).aggregate(Count);
            windowed.results.inner.inspect(move |(r, _, diff)| {
                *counts.lock().unwrap().entry(r.window.start).or_insert(0) += r.value as i64 * *diff;
            });
            windowed.late.stream.inner.inspect(move |_| *late.lock().unwrap() += 1);
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    let late = *late.lock().unwrap();
    let counts = counts.lock().unwrap().clone();
    (late, counts)
}

/// A partition whose reader knows it has records it has not read yet
/// (`Behind`: a Kafka partition whose end offset lies past its position,
/// under a slow broker) is not idle however long it waits: every one of
/// its records counts in its window. The same wait said as `Idle` makes
/// the partition idle, the watermark passes its records, and they are late
/// (which shows that the test can fail).
#[test]
fn a_partition_behind_its_end_holds_the_watermark_however_long_it_waits() {
    let full: BTreeMap<u64, i64> = (0..10).map(|w| (w * 1_000, 20)).collect();
    for workers in [1, 2] {
        let (late, counts) = slow_partition_counts(ReadStatus::Behind, workers);
        assert_eq!((late, &counts), (0, &full), "{workers} workers");
        let (late, counts) = slow_partition_counts(ReadStatus::Idle, workers);
        assert!(late > 0 && counts != full, "idle: {late} late, {counts:?}");
    }
}
