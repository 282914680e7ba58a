//! The async enrichment operator (`enrich_async`): throughput against a
//! service that answers in 1 ms at several capacities, the failure path
//! with the breaker open, and the operator's own cost per record.
//!
//! What it isolates (in process, no network): the "service" is a thread
//! that answers each request exactly `--latency-us` after it was made
//! (requests queue in order; the thread sleeps until the next one is due),
//! so that the bound `capacity / latency` is exact. Records are made in the
//! worker loop, 1 000 per timely time, at most 16 times ahead of the
//! output's frontier.
//!
//! - `capacity-N`: the calls wait for the service; bound = N / latency per
//!   worker.
//! - `breaker-open`: the service fails the first call, the breaker (1
//!   failure, open for an hour) opens, and every record after goes to the
//!   failure path without a call.
//! - `ready`: the call's future is ready at once (`async { Ok(x) }`), next
//!   to a `map` of the same records (the baseline, same run): the
//!   difference per record is the operator's overhead (spawning the future
//!   on the runtime, the completion's way back, the ordering, the output).
//!
//! ```text
//! cargo bench --bench enrich -- --runs 3 --workers 1
//! ```

mod common;

use common::median;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use highwater::enrich::{AsyncOptions, BreakerConfig, EnrichAsync};
use highwater::prelude::*;
use highwater::Timestamp;
use timely::dataflow::operators::{Input, Probe};
use timely::dataflow::ProbeHandle;

/// The allocator of the `highwater` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Options {
    runs: usize,
    workers: Vec<usize>,
    latency: Duration,
    only: Option<String>,
}

fn parse_args() -> Options {
    let mut o = Options { runs: 3, workers: vec![1], latency: Duration::from_millis(1), only: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--workers" => o.workers = value().split(',').map(|w| w.parse().expect("--workers 1,2")).collect(),
            "--latency-us" => o.latency = Duration::from_micros(value().parse().expect("--latency-us N")),
            "--only" => o.only = Some(value()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// A service that answers each request `latency` after it was made: one
/// thread, requests in the order they came (all wait the same).
#[derive(Clone)]
struct Service {
    requests: mpsc::Sender<(Instant, tokio::sync::oneshot::Sender<()>)>,
}

impl Service {
    fn start(latency: Duration) -> Service {
        let (tx, rx) = mpsc::channel::<(Instant, tokio::sync::oneshot::Sender<()>)>();
        std::thread::spawn(move || {
            while let Ok((made, answer)) = rx.recv() {
                let due = made + latency;
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let _ = answer.send(());
            }
        });
        Service { requests: tx }
    }

    async fn call(&self, x: u64) -> Result<u64, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.requests.send((Instant::now(), tx)).map_err(|e| e.to_string())?;
        rx.await.map_err(|e| e.to_string())?;
        Ok(x)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    Capacity(usize),
    BreakerOpen,
    Ready,
    Map,
}

/// Runs `records` per worker through the case on `workers` workers;
/// returns records per second per worker.
fn run(case: Case, workers: usize, records: u64, service: &Service) -> f64 {
    let service = service.clone();
    let started = Instant::now();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let service = service.clone();
        let probe = ProbeHandle::new();
        let mut input = worker.dataflow::<Timestamp, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<(u64, Timestamp, i64)>>();
            let events = EventStream::new(stream);
            let out = match case {
                Case::Map => events.map(|x| x + 1),
                Case::Ready => {
                    let options = AsyncOptions::new("Ready").capacity(1024);
                    events.enrich_async(options, |x: u64| async move { Ok::<_, String>(x + 1) }).results
                }
                Case::Capacity(capacity) => {
                    let options = AsyncOptions::new("Service").capacity(capacity);
                    events
                        .enrich_async(options, move |x: u64| {
                            let service = service.clone();
                            async move { service.call(x).await }
                        })
                        .results
                }
                Case::BreakerOpen => {
                    let config = BreakerConfig {
                        failures: 1,
                        window: Duration::from_secs(3600),
                        open_for: Duration::from_secs(3600),
                        probes: 1,
                        ..BreakerConfig::default()
                    };
                    let options = AsyncOptions::new("Down").capacity(64).breaker(config);
                    let enriched =
                        events.enrich_async(options, |_: u64| async move { Err::<u64, _>("down".to_owned()) });
                    enriched.failures.map(|f| f.record)
                }
            };
            out.inner.probe_with(&probe);
            input
        });
        let batch = 1_000u64;
        let mut time: Timestamp = 0;
        let mut sent = 0u64;
        while sent < records {
            let n = batch.min(records - sent);
            for i in 0..n {
                input.send((sent + i, time, 1));
            }
            sent += n;
            time += 1;
            input.advance_to(time);
            while probe.less_than(&time.saturating_sub(16)) {
                worker.step_or_park(Some(Duration::from_micros(200)));
            }
        }
        input.close();
        while !probe.done() {
            worker.step_or_park(Some(Duration::from_micros(200)));
        }
    })
    .expect("the computation starts");
    for r in guards.join() {
        r.expect("a worker ends");
    }
    records as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let o = parse_args();
    let service = Service::start(o.latency);
    let latency_s = o.latency.as_secs_f64();
    let mut cases: Vec<Case> = [1, 16, 64, 256].into_iter().map(Case::Capacity).collect();
    cases.extend([Case::BreakerOpen, Case::Map, Case::Ready]);
    println!("| case | workers | records/worker | records/s per worker (median of {}) | bound | of bound |", o.runs);
    println!("| --- | --- | --- | --- | --- | --- |");
    for &workers in &o.workers {
        let mut map_rate = None;
        for &case in &cases {
            let name = match case {
                Case::Capacity(c) => format!("capacity-{c}"),
                Case::BreakerOpen => "breaker-open".to_owned(),
                Case::Ready => "ready".to_owned(),
                Case::Map => "map".to_owned(),
            };
            if o.only.as_ref().is_some_and(|only| !name.starts_with(only.as_str())) {
                continue;
            }
            let (records, bound) = match case {
                Case::Capacity(c) => {
                    let bound = c as f64 / latency_s;
                    // About 2 s at the bound.
                    ((bound * 2.0) as u64, Some(bound))
                }
                Case::BreakerOpen => (5_000_000, None),
                Case::Ready | Case::Map => (2_000_000, None),
            };
            let rate = median((0..o.runs).map(|_| run(case, workers, records, &service)).collect());
            if case == Case::Map {
                map_rate = Some(rate);
            }
            let (bound_text, ratio) = match (case, bound, map_rate) {
                (Case::Capacity(_), Some(b), _) => (format!("{b:.0}"), format!("{:.2}", rate / b)),
                (Case::Ready, _, Some(m)) => {
                    ("map".to_owned(), format!("{:.3} µs overhead/record", (1.0 / rate - 1.0 / m) * 1e6))
                }
                _ => ("-".to_owned(), "-".to_owned()),
            };
            println!("| {name} | {workers} | {records} | {rate:.0} | {bound_text} | {ratio} |");
        }
    }
}
