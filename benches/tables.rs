//! Tables and joins: stream–table enrichment against a large table, and
//! table–table join maintenance under updates.
//!
//! What it isolates (in process, no I/O): records are made in the worker loop
//! and sent into the dataflow in batches of 10 000 with the watermark at the
//! batch's time, at most 8 batches ahead of the output's frontier.
//!
//! - `enrich`: a table of `--keys` keys is loaded first (not timed); then
//!   `--events` events with uniformly random keys are joined with it as of
//!   their event time ([`join_as_of`]). Baseline in the same run: the same
//!   events exchanged by key and mapped, without the join.
//! - `table-join`: orders (`--keys`, each referencing one of `keys / 10`
//!   customers) joined with customers on the customer key, both loaded first;
//!   then `--updates` upserts (half to customers, each changing ~10 result
//!   rows; half moving an order to another customer) are timed until their
//!   results are out. Baseline: the same upserts into the two tables, without
//!   the join.
//! - `upsert-ttl`: `--updates` upserts to random keys of `--keys` into an
//!   upsert table with a state time-to-live of 24 h of event time (silent:
//!   nothing expires within the run, so the figure is the cost of the TTL's
//!   bookkeeping). Baseline: the same upserts into the table without a TTL.
//!
//! Each figure is the median of `--runs` runs.
//!
//! ```text
//! cargo bench --bench tables -- --keys 1000000 --events 10000000 --updates 2000000 --runs 3 --workers 1,2
//! cargo bench --bench tables -- --keys 1000000 --updates 10000000 --runs 5 --workers 1,2 --only upsert-ttl
//! ```

mod common;

use common::{median, Rng};

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use highwater_operators::prelude::*;
use highwater_operators::state::StateTtl;
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
    updates: u64,
    runs: usize,
    workers: Vec<usize>,
    /// Only the benchmark of this name (`enrich`, `table-join`, `upsert-ttl`).
    only: Option<String>,
}

fn parse_args() -> Options {
    let mut o =
        Options { keys: 1_000_000, events: 10_000_000, updates: 2_000_000, runs: 3, workers: vec![1, 2], only: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--keys" => o.keys = value().parse().expect("--keys N"),
            "--events" => o.events = value().parse().expect("--events N"),
            "--updates" => o.updates = value().parse().expect("--updates N"),
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--workers" => o.workers = value().split(',').map(|w| w.parse().expect("--workers 1,2")).collect(),
            "--only" => o.only = Some(value()),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

const BATCH: u64 = 10_000;
const AHEAD: u64 = 8;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Enrich,
    EnrichBaseline,
    TableJoin,
    TableJoinBaseline,
    UpsertTtl,
    UpsertBaseline,
}

/// Runs one mode; returns the timed records per second (all workers) and the
/// number of output updates (to check that the work was done).
fn run(mode: Mode, o: &Options, workers: usize) -> (f64, u64) {
    let outputs = Arc::new(AtomicU64::new(0));
    let elapsed = Arc::new(AtomicU64::new(0));
    let (keys, events, updates) = (o.keys, o.events, o.updates);
    let (out, el) = (Arc::clone(&outputs), Arc::clone(&elapsed));
    timely::execute(timely::Config::process(workers), move |worker| {
        let (index, peers) = (worker.index() as u64, worker.peers() as u64);
        let probe = ProbeHandle::new();
        let count = Rc::new(Cell::new(0u64));
        let counted = Rc::clone(&count);
        let (mut left_in, mut right_in) = worker.dataflow::<u64, _, _>(|scope| {
            let (left_in, left) = scope.new_input::<Vec<Update<(u64, Option<u64>)>>>();
            let (right_in, right) = scope.new_input::<Vec<Update<(u64, Option<u64>)>>>();
            let (left, right) = (EventStream::new(left), EventStream::new(right));
            let counter = move |n: usize| counted.set(counted.get() + n as u64);
            match mode {
                Mode::Enrich => {
                    let table = right.upsert().table;
                    let events = left.map(|(k, _)| k);
                    let joined = events.join_as_of(&table, |k| *k).results;
                    joined
                        .inner
                        .inspect_core(move |e| {
                            if let Ok((_, b)) = e {
                                counter(b.len())
                            }
                        })
                        .probe_with(&probe);
                }
                Mode::EnrichBaseline => {
                    let table = right.upsert().table;
                    table.changelog().probe_with(&probe);
                    let events = left.map(|(k, _)| k).exchange(|k| *k).map(|k| (k, k));
                    events
                        .inner
                        .inspect_core(move |e| {
                            if let Ok((_, b)) = e {
                                counter(b.len())
                            }
                        })
                        .probe_with(&probe);
                }
                Mode::UpsertTtl | Mode::UpsertBaseline => {
                    let table = if mode == Mode::UpsertTtl {
                        right.state_ttl(StateTtl::event_time(24.hours())).upsert().table
                    } else {
                        right.upsert().table
                    };
                    table
                        .changelog()
                        .inner
                        .inspect_core(move |e| {
                            if let Ok((_, b)) = e {
                                counter(b.len())
                            }
                        })
                        .probe_with(&probe);
                }
                Mode::TableJoin | Mode::TableJoinBaseline => {
                    let orders = left.upsert().table;
                    let customers = right.upsert().table;
                    if mode == Mode::TableJoin {
                        let joined = orders.join(&customers, |_order, customer| *customer);
                        joined
                            .inner
                            .inspect_core(move |e| {
                                if let Ok((_, b)) = e {
                                    counter(b.len())
                                }
                            })
                            .probe_with(&probe);
                    } else {
                        let both = orders.changelog().concat(&customers.changelog());
                        both.inner
                            .inspect_core(move |e| {
                                if let Ok((_, b)) = e {
                                    counter(b.len())
                                }
                            })
                            .probe_with(&probe);
                    }
                }
            }
            (left_in, right_in)
        });
        let customers = (keys / 10).max(1);
        // Load the tables at time 0 (this worker's share of the keys).
        match mode {
            Mode::Enrich | Mode::EnrichBaseline => {
                for k in (index..keys).step_by(peers as usize) {
                    right_in.send(((k, Some(k * 7)), 0, 1));
                }
            }
            Mode::UpsertTtl | Mode::UpsertBaseline => {}
            Mode::TableJoin | Mode::TableJoinBaseline => {
                for k in (index..keys).step_by(peers as usize) {
                    left_in.send(((k, Some(k % customers)), 0, 1));
                }
                for c in (index..customers).step_by(peers as usize) {
                    right_in.send(((c, Some(c)), 0, 1));
                }
            }
        }
        left_in.advance_to(1);
        right_in.advance_to(1);
        while probe.less_than(&1) {
            worker.step();
        }
        count.set(0);

        let start = Instant::now();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (index + 1));
        let total = if matches!(mode, Mode::Enrich | Mode::EnrichBaseline) { events } else { updates } / peers;
        let mut sent = 0;
        let mut batch = 1u64;
        while sent < total {
            let n = BATCH.min(total - sent);
            for _ in 0..n {
                let r = rng.next();
                match mode {
                    Mode::Enrich | Mode::EnrichBaseline => left_in.send(((r % keys, None), batch, 1)),
                    Mode::UpsertTtl | Mode::UpsertBaseline => right_in.send(((r % keys, Some(r >> 32)), batch, 1)),
                    _ if r & 1 == 0 => right_in.send((((r >> 1) % customers, Some(r >> 32)), batch, 1)),
                    _ => left_in.send((((r >> 1) % keys, Some((r >> 32) % customers)), batch, 1)),
                }
            }
            sent += n;
            batch += 1;
            left_in.advance_to(batch);
            right_in.advance_to(batch);
            while probe.less_than(&batch.saturating_sub(AHEAD)) {
                worker.step();
            }
        }
        drop((left_in, right_in));
        while worker.step() {}
        let secs = start.elapsed().as_secs_f64();
        el.fetch_max((secs * 1e6) as u64, Ordering::Relaxed);
        out.fetch_add(count.get(), Ordering::Relaxed);
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .for_each(|r| r.expect("worker succeeds"));
    let total = if matches!(mode, Mode::Enrich | Mode::EnrichBaseline) { events } else { updates };
    let secs = elapsed.load(Ordering::Relaxed) as f64 / 1e6;
    (total as f64 / secs, outputs.load(Ordering::Relaxed))
}

fn main() {
    let o = parse_args();
    println!("| benchmark | workers | records/s (median of {}) | baseline records/s | ratio | outputs |", o.runs);
    println!("| --- | --- | --- | --- | --- | --- |");
    for &workers in &o.workers {
        for (name, mode, baseline) in [
            ("enrich (as-of join, table of --keys)", Mode::Enrich, Mode::EnrichBaseline),
            ("table–table join updates", Mode::TableJoin, Mode::TableJoinBaseline),
            ("upsert table with a 24 h TTL", Mode::UpsertTtl, Mode::UpsertBaseline),
        ] {
            let short = match mode {
                Mode::Enrich => "enrich",
                Mode::TableJoin => "table-join",
                _ => "upsert-ttl",
            };
            if o.only.as_deref().is_some_and(|only| only != short) {
                continue;
            }
            let (mut rates, mut bases, mut outs) = (Vec::new(), Vec::new(), 0);
            for _ in 0..o.runs {
                let (r, n) = run(mode, &o, workers);
                rates.push(r);
                outs = n;
                bases.push(run(baseline, &o, workers).0);
            }
            let (rate, base) = (median(rates), median(bases));
            println!(
                "| {name} | {workers} | {:.2} M | {:.2} M | {:.2} | {outs} |",
                rate / 1e6,
                base / 1e6,
                rate / base
            );
        }
    }
}
