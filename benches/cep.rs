//! CEP throughput and memory: the login-failure pattern and the fraud rule
//! over many keys.
//!
//! What it isolates (in process, no I/O): events are made in the worker loop
//! with uniformly random keys among `--keys`, and sent in batches of 10 000
//! with the watermark at the batch's time (event time advances `--ms-per-batch`
//! per batch), at most 8 batches ahead of the output's frontier. Baseline in the
//! same run: the same events exchanged by key and mapped, without matching.
//!
//! - `login`: `fail+ (greedy) followed_by reset within 60 s`, skip past last
//!   event; events are 15 % failed logins, 80 % successful ones, 5 % resets.
//! - `fraud`: `small followed_by_any large within 10 min` where `small` is an
//!   amount under 10 and `large` over 500 from another country than the small
//!   one; amounts and countries random.
//!
//! Memory: resident set size sampled after every 10 % of the events; the
//! figure per key is (RSS at the end − RSS of the baseline) / keys.
//!
//! ```text
//! cargo bench --bench cep -- --keys 1000000 --events 10000000 --runs 3 --workers 1,2
//! ```

mod common;

use common::{median, Rng};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use highwater_operators::cep::{AfterMatchSkip, Pattern};
use highwater_operators::prelude::*;
use highwater_operators::Update;
use timely::dataflow::operators::core::Inspect;
use timely::dataflow::operators::{Input, Probe};
use timely::dataflow::ProbeHandle;

/// The allocator of the `highwater` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Options {
    keys: u64,
    events: u64,
    ms_per_batch: u64,
    runs: usize,
    workers: Vec<usize>,
}

fn parse_args() -> Options {
    let mut o = Options { keys: 1_000_000, events: 10_000_000, ms_per_batch: 100, runs: 3, workers: vec![1, 2] };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--keys" => o.keys = value().parse().expect("--keys N"),
            "--events" => o.events = value().parse().expect("--events N"),
            "--ms-per-batch" => o.ms_per_batch = value().parse().expect("--ms-per-batch N"),
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--workers" => o.workers = value().split(',').map(|w| w.parse().expect("--workers 1,2")).collect(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// A login or payment event: (user, kind, amount, country).
type Ev = (u64, u8, u32, u8);

const FAIL: u8 = 0;
const RESET: u8 = 2;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Login,
    Fraud,
    Baseline,
}

fn login() -> Pattern<Ev> {
    Pattern::begin("fail")
        .where_(|e: &Ev| e.1 == FAIL)
        .one_or_more()
        .greedy()
        .followed_by("reset")
        .where_(|e: &Ev| e.1 == RESET)
        .within(60_000)
        .skip(AfterMatchSkip::SkipPastLastEvent)
}

fn fraud() -> Pattern<Ev> {
    Pattern::begin("small")
        .where_(|e: &Ev| e.2 < 10)
        .followed_by_any("large")
        .where_matched(|e: &Ev, m| e.2 > 500 && m.first("small").is_some_and(|s| s.3 != e.3))
        .within(600_000)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs one mode; returns events/s, matches, and RSS samples (MiB).
fn run(mode: Mode, o: &Options, workers: usize) -> (f64, u64, Vec<f64>) {
    let outputs = Arc::new(AtomicU64::new(0));
    let elapsed = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (keys, events, ms) = (o.keys, o.events, o.ms_per_batch);
    let (out, el, rss) = (Arc::clone(&outputs), Arc::clone(&elapsed), Arc::clone(&samples));
    timely::execute(timely::Config::process(workers), move |worker| {
        let (index, peers) = (worker.index() as u64, worker.peers() as u64);
        let probe = ProbeHandle::new();
        let out = Arc::clone(&out);
        let mut input = worker.dataflow::<u64, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<Update<Ev>>>();
            let events = EventStream::new(stream);
            let counted = Arc::clone(&out);
            let count = move |n: usize| {
                counted.fetch_add(n as u64, Ordering::Relaxed);
            };
            let result = match mode {
                Mode::Login => events.match_pattern(|e| e.0, login()).expect("valid").matches.map(|m| m.key),
                Mode::Fraud => events.match_pattern(|e| e.0, fraud()).expect("valid").matches.map(|m| m.key),
                Mode::Baseline => events.exchange(|e| e.0).map(|e| e.0),
            };
            result
                .inner
                .inspect_core(move |e| {
                    if let Ok((_, b)) = e {
                        count(b.len())
                    }
                })
                .probe_with(&probe);
            input
        });
        let start = Instant::now();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (index + 1));
        let total = events / peers;
        let (mut sent, mut batch) = (0u64, 1u64);
        let tenth = (total / 10).max(1);
        while sent < total {
            let n = 10_000.min(total - sent);
            let time = batch * ms;
            for _ in 0..n {
                let r = rng.next();
                let kind = match r % 100 {
                    0..15 => FAIL,
                    15..95 => 1,
                    _ => RESET,
                };
                let amount = ((r >> 8) % 1000) as u32;
                input.send((((r >> 20) % keys, kind, amount, ((r >> 40) % 4) as u8), time, 1));
            }
            if (sent / tenth) != ((sent + n) / tenth) && index == 0 {
                if let Ok(mut s) = rss.lock() {
                    s.push(rss_mib());
                }
            }
            sent += n;
            batch += 1;
            input.advance_to(batch * ms);
            while probe.less_than(&(batch.saturating_sub(8) * ms)) {
                worker.step();
            }
        }
        drop(input);
        while worker.step() {}
        el.fetch_max((start.elapsed().as_secs_f64() * 1e6) as u64, Ordering::Relaxed);
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .for_each(|r| r.expect("worker succeeds"));
    let secs = elapsed.load(Ordering::Relaxed) as f64 / 1e6;
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    (events as f64 / secs, outputs.load(Ordering::Relaxed), samples)
}

fn main() {
    let o = parse_args();
    println!(
        "| pattern | workers | events/s (median of {}) | baseline events/s | ratio | matches | RSS at each 10 % (MiB) | baseline RSS (MiB) |",
        o.runs
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &workers in &o.workers {
        for (name, mode) in [("login failures", Mode::Login), ("fraud rule", Mode::Fraud)] {
            let (mut rates, mut bases, mut matches, mut samples, mut base_rss) = (vec![], vec![], 0, vec![], 0.0);
            for _ in 0..o.runs {
                let (r, n, s) = run(mode, &o, workers);
                rates.push(r);
                matches = n;
                samples = s;
                let (b, _, bs) = run(Mode::Baseline, &o, workers);
                bases.push(b);
                base_rss = bs.last().copied().unwrap_or(0.0);
            }
            let (rate, base) = (median(rates), median(bases));
            let rss: Vec<String> = samples.iter().map(|m| format!("{m:.0}")).collect();
            println!(
                "| {name} | {workers} | {:.2} M | {:.2} M | {:.2} | {matches} | {} | {base_rss:.0} |",
                rate / 1e6,
                base / 1e6,
                rate / base,
                rss.join(", ")
            );
        }
    }
}
