//! Latency measurement, paced sources and watermarks by processing time
//! (`highwater::latency`, `SourceOptions::rate_limit`,
//! `SourceOptions::watermark_interval`): a known delay in the sink shows in
//! both histograms, every update is measured against the right clock, a
//! paced source takes at least as long as its rate says, and a watermark
//! interval makes few, large steps of event time with the same results.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::latency::LatencyReport;
use highwater::prelude::*;
use highwater::sink::{write, Placement, Sink, SinkError};
use highwater::Timestamp;

/// A sink that sleeps `delay` in every write and keeps what it was given.
struct SlowSink {
    delay: Duration,
    got: Arc<Mutex<Vec<(u64, Timestamp, i64)>>>,
}

impl Sink for SlowSink {
    type Item = u64;

    fn write(&mut self, updates: &mut Vec<(u64, Timestamp, i64)>) -> Result<u64, SinkError> {
        std::thread::sleep(self.delay);
        let n = updates.len() as u64;
        self.got.lock().unwrap().append(updates);
        Ok(n)
    }
}

/// Records at times 0, 10, 20, … (ms) in two partitions, read at
/// `rate` a second, either as they are or as counts per 100 ms tumbling
/// window; the sink sleeps `delay` per write. Returns what the sink got,
/// the latency report, and how long the job ran.
fn run(
    records: u64,
    rate: f64,
    windowed: bool,
    delay: Duration,
) -> (Vec<(u64, Timestamp, i64)>, LatencyReport, Duration) {
    let partitions: Vec<Vec<u64>> =
        (0..2).map(|p| (0..records).filter(|i| i % 2 == p).map(|i| i * 10).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    let job = Job::new(timely::Config::process(2)).measuring_latency();
    let latency = job.latency().expect("measuring");
    let got: Arc<Mutex<Vec<(u64, Timestamp, i64)>>> = Arc::default();
    let sink_got = Arc::clone(&got);
    let started = Instant::now();
    job.run(move |worker| -> Result<(), String> {
        let source = Arc::clone(&source);
        let got = Arc::clone(&sink_got);
        worker.dataflow::<Timestamp, _, _>(move |scope| {
            let read = FromSource::new(source, |t: &u64| *t)
                .watermark(WatermarkStrategy::bounded(0))
                .batch_size(8)
                .never_idle()
                .rate_limit(rate)
                .build(scope)
                .map_err(|e| e.to_string())?;
            let out = if windowed {
                read.events.window(Tumbling::of(100)).aggregate(Count).results.map(|r| r.value)
            } else {
                read.events
            };
            write(&out, "Slow", Placement::Worker0, move |_, _| Ok(SlowSink { delay, got }));
            Ok::<_, String>(())
        })
    })
    .expect("the job runs");
    let elapsed = started.elapsed();
    let got = std::mem::take(&mut *got.lock().unwrap());
    (got, latency.report(), elapsed)
}

#[test]
fn a_paced_source_takes_as_long_as_its_rate_says() {
    // 600 records at 1 000 a second: at least 0.6 s however fast the machine.
    let (got, _, elapsed) = run(600, 1_000.0, false, Duration::ZERO);
    assert_eq!(got.len(), 600, "every record arrives");
    assert!(elapsed >= Duration::from_millis(590), "read in {elapsed:?}, faster than the pace allows");
}

#[test]
fn a_delay_in_the_sink_shows_in_the_latency_of_every_record() {
    let delay = Duration::from_millis(15);
    let (got, report, _) = run(300, 2_000.0, false, delay);
    assert_eq!(got.len(), 300);
    // Every record written was measured from its read, and the sink's own
    // sleep is part of every measurement.
    assert_eq!(report.since_read.count, 300, "{report}");
    assert!(report.since_read.p50 >= delay, "{report}");
    assert!(report.since_read.max >= delay, "{report}");
    // A record goes out at the watermark before its batch, so it is
    // measured from the watermark only if the sink wrote it after the
    // watermark passed its time (here, as the slow sink falls behind).
    assert!(report.since_watermark.count < 300, "{report}");
}

#[test]
fn window_results_are_measured_from_the_watermark_passing_their_end() {
    let delay = Duration::from_millis(15);
    // Times 0..4 990: 50 windows of 100 ms, 10 records each.
    let (got, report, _) = run(500, 5_000.0, true, delay);
    let mut counts: Vec<u64> = got.iter().map(|(c, _, _)| *c).collect();
    counts.sort();
    assert_eq!(counts, vec![10; 50], "one count per window");
    assert_eq!(report.since_watermark.count, 50, "every result measured from its window's end: {report}");
    assert!(report.since_watermark.p50 >= delay, "{report}");
    // Each result is also measured from the first record read at its time
    // (its window's last millisecond), which the watermark follows.
    assert!(report.since_read.count >= 49, "{report}");
}

#[test]
fn the_nexmark_command_prints_latency_percentiles() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q1", "--events", "20000", "--rate-limit", "40000", "--latency", "--discard"])
        .args(["--", "-w", "2"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // q1 keeps every bid (92 % of the events) at its event time.
    let line = stderr.lines().find(|l| l.starts_with("latency read → sink: n=")).unwrap_or_else(|| panic!("{stderr}"));
    let n: u64 = line["latency read → sink: n=".len()..].split(' ').next().unwrap().parse().unwrap();
    let rows: u64 = stderr
        .split("rows=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no rows= in {stderr}"));
    assert_eq!(n, rows, "every row measured: {stderr}");
    assert!(line.contains("p99="), "{line}");
    let err = std::process::Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q1", "--events", "10", "--rate-limit", "0"])
        .output()
        .expect("runs");
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("--rate-limit"), "a clear error");
}

/// The distinct times batches of records went out at, and the counts of
/// 100 ms tumbling windows, for 600 records (times 0, 10, …) in two
/// partitions read one at a time at 1 000 a second, with or without a
/// watermark interval.
fn steps(interval: Option<u64>) -> (usize, Vec<u64>) {
    let partitions: Vec<Vec<u64>> = (0..2).map(|p| (0..600).filter(|i| i % 2 == p).map(|i| i * 10).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    let times: Arc<Mutex<std::collections::BTreeSet<(usize, Timestamp)>>> = Arc::default();
    let counts = highwater::sink::Collected::<u64>::default();
    let (t, c) = (Arc::clone(&times), counts.clone());
    Job::new(timely::Config::process(2))
        .run(move |worker| -> Result<(), String> {
            let (source, times, counts) = (Arc::clone(&source), Arc::clone(&t), c.clone());
            let index = worker.index();
            worker.dataflow::<Timestamp, _, _>(move |scope| {
                let mut read = FromSource::new(source, |t: &u64| *t)
                    .watermark(WatermarkStrategy::Monotonous)
                    .batch_size(1)
                    .never_idle()
                    .rate_limit(1_000.0);
                if let Some(ms) = interval {
                    read = read.watermark_interval(ms);
                }
                let read = read.build(scope).map_err(|e| e.to_string())?;
                use timely::dataflow::channels::pact::Pipeline;
                use timely::dataflow::operators::generic::Operator;
                read.events.inner.clone().sink(Pipeline, "Times", move |(input, _)| {
                    input.for_each_stamp(|cap, _| {
                        times.lock().unwrap().insert((index, *cap.least().expect("a stamp")));
                    });
                });
                let windows = read.events.window(Tumbling::of(100)).aggregate(Count);
                highwater::sink::collect(&windows.results.map(|r| r.value), &counts);
                Ok::<_, String>(())
            })
        })
        .expect("the job runs");
    let distinct = times.lock().unwrap().len();
    let mut values = counts.rows();
    values.sort();
    (distinct, values)
}

#[test]
fn a_watermark_interval_makes_few_steps_of_event_time_with_the_same_results() {
    let (per_batch, per_batch_counts) = steps(None);
    let (per_interval, per_interval_counts) = steps(Some(100));
    assert_eq!(per_batch_counts, vec![10; 60], "one count of 10 per 100 ms window");
    assert_eq!(per_interval_counts, per_batch_counts, "the same results");
    // 0.6 s of reading, a step per 100 ms per worker: a dozen or so; after
    // every record: hundreds.
    assert!(per_batch >= 300, "{per_batch} steps after every record");
    assert!(per_interval <= 30, "{per_interval} steps with a 100 ms interval");
}

#[test]
fn a_rate_limit_that_is_not_a_positive_number_is_refused() {
    for rate in [0.0, -5.0, f64::NAN, f64::INFINITY] {
        let error = timely::execute_directly(move |worker| {
            worker.dataflow::<Timestamp, _, _>(|scope| {
                let source = Arc::new(MemorySource::new(vec![vec![1u64]]));
                FromSource::new(source, |t: &u64| *t).rate_limit(rate).build(scope).err().map(|e| e.to_string())
            })
        });
        let error = error.unwrap_or_else(|| panic!("rate {rate} accepted"));
        assert!(error.contains("rate limit"), "{error}");
    }
}
