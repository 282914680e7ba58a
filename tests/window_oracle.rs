//! Windows and aggregations against a naive reference, on random out-of-order
//! input with random lateness, at 1 and 3 workers.
//!
//! The reference sorts and groups the whole input: it computes each record's
//! watermark at the time it was read (its partition's greatest earlier event
//! time minus the bound, per batch), decides from that alone whether the record
//! is too late, and aggregates what is left per window from scratch. The
//! dataflow must produce the same final results (its changelog consolidated)
//! and the same late records.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use highwater::sink::{collect, Collected};
use highwater::source::{read, MemorySource, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// (key, value, event time).
type Rec = (u8, i64, u64);

/// Input: partitions of records, the watermark bound, the allowed lateness and the read batch size.
#[derive(Clone, Debug)]
struct Case {
    partitions: Vec<Vec<Rec>>,
    bound: u64,
    lateness: u64,
    batch: usize,
}

fn case(max_partitions: usize) -> impl Strategy<Value = Case> {
    let record = (0u8..4, 0i64..50, 0u64..400, 0u64..100, prop::bool::weighted(0.1));
    let partition = prop::collection::vec(record, 0..60).prop_map(|raw| {
        // Mostly increasing times, some a little out of order, a few very late;
        // multiples of 5 so that times often fall exactly on window and lateness bounds.
        let mut clock = 0u64;
        raw.into_iter()
            .map(|(k, v, step, back, very_late)| {
                clock += step % 8 * 5;
                let t = if very_late { clock.saturating_sub(back * 20) } else { clock.saturating_sub(back % 6 * 5) };
                (k, v, t)
            })
            .collect::<Vec<_>>()
    });
    let bound = (0u64..12).prop_map(|b| b * 5);
    (
        prop::collection::vec(partition, 1..=max_partitions),
        bound,
        prop::sample::select(vec![0u64, 0, 25, 200]),
        1usize..5,
    )
        .prop_map(|(partitions, bound, lateness, batch)| Case { partitions, bound, lateness, batch })
}

/// Each record with the watermark it was read under.
fn arrivals(case: &Case) -> Vec<(Rec, u64)> {
    let mut out = Vec::new();
    for p in &case.partitions {
        let mut max_seen: Option<u64> = None;
        for batch in p.chunks(case.batch) {
            let watermark = max_seen.map_or(0, |m| m.saturating_sub(case.bound));
            for r in batch {
                out.push((*r, watermark));
            }
            for r in batch {
                max_seen = Some(max_seen.map_or(r.2, |m| m.max(r.2)));
            }
        }
    }
    out
}

/// Runs `build` over the case's partitions; returns the consolidated results
/// (as debug strings) and late records.
fn run<F>(case: &Case, workers: usize, build: F) -> (BTreeMap<String, i64>, BTreeMap<Rec, i64>)
where
    F: for<'s> Fn(&EventStream<'s, Rec>, u64) -> (EventStream<'s, String>, EventStream<'s, Rec>)
        + Send
        + Sync
        + 'static,
{
    let source = Arc::new(MemorySource::new(case.partitions.clone()));
    let results = Collected::default();
    let late = Collected::default();
    let (r, l) = (results.clone(), late.clone());
    let (bound, lateness, batch) = (case.bound, case.lateness, case.batch);
    let build = Arc::new(build);
    timely::execute(timely::Config::process(workers), move |worker| {
        let (source, build) = (Arc::clone(&source), Arc::clone(&build));
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let options = SourceOptions {
                watermark: WatermarkStrategy::bounded(bound),
                idle_timeout: None,
                batch_size: batch,
                ..Default::default()
            };
            let streams = read(scope, source, |r: &Rec| r.2, options, &SourceMetrics::default(), None).unwrap();
            let (results, late) = build(&streams.events, lateness);
            collect(&results, &r);
            collect(&late, &l);
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    (results.consolidated(), late.consolidated())
}

/// Aggregations checked against direct computations over the values.
#[derive(Clone, Copy, Debug)]
enum Agg {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Distinct,
    Top3,
    MaxBy,
    Fold,
}

const AGGS: [Agg; 9] =
    [Agg::Count, Agg::Sum, Agg::Min, Agg::Max, Agg::Avg, Agg::Distinct, Agg::Top3, Agg::MaxBy, Agg::Fold];

/// The reference value of an aggregation over the values of a window.
fn reference(agg: Agg, values: &[i64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort();
    match agg {
        Agg::Count => format!("{}", values.len()),
        Agg::Sum => format!("{}", values.iter().sum::<i64>()),
        Agg::Min => format!("{}", sorted[0]),
        Agg::Max => format!("{}", sorted[sorted.len() - 1]),
        Agg::Avg => format!("{:?}", values.iter().sum::<i64>() as f64 / values.len() as f64),
        Agg::Distinct => format!("{}", sorted.iter().collect::<BTreeSet<_>>().len()),
        Agg::Top3 => format!("{:?}", sorted.iter().rev().take(3).collect::<Vec<_>>()),
        Agg::MaxBy => format!("{}", sorted.iter().filter(|v| **v == sorted[sorted.len() - 1]).count()),
        Agg::Fold => format!("{}", values.iter().map(|v| v * v).sum::<i64>()),
    }
}

/// Runs the windows `W` with aggregation `agg`, formatting results like the reference.
fn windowed<'s, W: WindowSpec<Rec> + Clone>(
    stream: &EventStream<'s, Rec>,
    windows: W,
    lateness: u64,
    agg: Agg,
) -> (EventStream<'s, String>, EventStream<'s, Rec>) {
    let w = stream.window(windows).key_by(|r: &Rec| r.0).allowed_lateness(lateness);
    fn fmt<'s, O, F>(out: Windowed<'s, u8, O, Rec>, f: F) -> (EventStream<'s, String>, EventStream<'s, Rec>)
    where
        O: highwater_operators::key::Data,
        F: Fn(&O) -> String + 'static,
    {
        let results =
            out.results.map(move |r| format!("{}|{}|{}|{}", r.window.start, r.window.end, r.key, f(&r.value)));
        (results, out.late.stream)
    }
    match agg {
        Agg::Count => fmt(w.aggregate(Count), |v| format!("{v}")),
        Agg::Sum => fmt(w.aggregate(Sum::of(|r: &Rec| r.1)), |v| format!("{v}")),
        Agg::Min => fmt(w.aggregate(Min::append_only(|r: &Rec| r.1)), |v| format!("{v}")),
        Agg::Max => fmt(w.aggregate(Max::of(|r: &Rec| r.1)), |v| format!("{v}")),
        Agg::Avg => fmt(w.aggregate(Avg::of(|r: &Rec| r.1)), |v| format!("{v:?}")),
        Agg::Distinct => fmt(w.aggregate(DistinctCount::of(|r: &Rec| Some(r.1))), |v| format!("{v}")),
        Agg::Top3 => {
            fmt(w.aggregate(TopK::append_only(3, |r: &Rec| r.1)), |v| format!("{:?}", v.iter().collect::<Vec<_>>()))
        }
        Agg::MaxBy => fmt(w.aggregate(MaxBy::append_only(|r: &Rec| r.1)), |v: &Vec<Rec>| format!("{}", v.len())),
        Agg::Fold => fmt(
            w.aggregate(Fold::new(
                0i64,
                |acc: &mut i64, r: &Rec, d| *acc += r.1 * r.1 * d,
                |acc: &mut i64, o| *acc += o,
            )),
            |v| format!("{v}"),
        ),
    }
}

/// Reference results of non-merging windows: a record counts in each of its
/// windows that the watermark it was read under had not passed by the lateness.
fn reference_aligned(
    case: &Case,
    agg: Agg,
    assign: impl Fn(u64) -> Vec<(u64, u64)>,
) -> (BTreeMap<String, i64>, BTreeMap<Rec, i64>) {
    let mut groups: BTreeMap<(u64, u64, u8), Vec<i64>> = BTreeMap::new();
    let mut late: BTreeMap<Rec, i64> = BTreeMap::new();
    for (r, watermark) in arrivals(case) {
        let mut taken = false;
        for (start, end) in assign(r.2) {
            if end + case.lateness > watermark {
                taken = true;
                groups.entry((start, end, r.0)).or_default().push(r.1);
            }
        }
        if !taken {
            *late.entry(r).or_default() += 1;
        }
    }
    let results = groups
        .into_iter()
        .map(|((s, e, k), values)| (format!("{s}|{e}|{k}|{}", reference(agg, &values)), 1))
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_insert(0) += v;
            m
        });
    (results, late)
}

/// Records not too late by their own time (sessions, count and global windows).
fn accepted(case: &Case) -> (Vec<Rec>, BTreeMap<Rec, i64>) {
    let mut keep = Vec::new();
    let mut late = BTreeMap::new();
    for (r, watermark) in arrivals(case) {
        if r.2 + 1 + case.lateness > watermark {
            keep.push(r);
        } else {
            *late.entry(r).or_default() += 1;
        }
    }
    (keep, late)
}

fn reference_sessions(case: &Case, agg: Agg, gap: u64) -> (BTreeMap<String, i64>, BTreeMap<Rec, i64>) {
    let (records, late) = accepted(case);
    let mut per_key: BTreeMap<u8, Vec<(u64, i64)>> = BTreeMap::new();
    for r in records {
        per_key.entry(r.0).or_default().push((r.2, r.1));
    }
    let mut results = BTreeMap::new();
    for (k, mut recs) in per_key {
        recs.sort();
        let mut session: Vec<(u64, i64)> = Vec::new();
        let mut flush = |s: &Vec<(u64, i64)>| {
            let values: Vec<i64> = s.iter().map(|x| x.1).collect();
            let key = format!("{}|{}|{k}|{}", s[0].0, s[s.len() - 1].0 + gap, reference(agg, &values));
            *results.entry(key).or_insert(0) += 1;
        };
        for r in recs {
            if session.last().is_some_and(|last| r.0 > last.0 + gap) {
                flush(&session);
                session.clear();
            }
            session.push(r);
        }
        if !session.is_empty() {
            flush(&session);
        }
    }
    (results, late)
}

fn reference_count(
    case: &Case,
    agg: Agg,
    size: usize,
    slide: usize,
    tumbling: bool,
) -> (BTreeMap<String, i64>, BTreeMap<Rec, i64>) {
    let (records, late) = accepted(case);
    let mut per_key: BTreeMap<u8, Vec<Rec>> = BTreeMap::new();
    for r in records {
        per_key.entry(r.0).or_default().push(r);
    }
    let mut results = BTreeMap::new();
    for (k, mut recs) in per_key {
        // Event-time order; ties by the record itself.
        recs.sort_by_key(|r| (r.2, *r));
        for i in 0..recs.len() {
            if (i + 1) % slide != 0 || (tumbling && i + 1 < size) {
                continue;
            }
            let window = &recs[(i + 1).saturating_sub(size)..=i];
            let values: Vec<i64> = window.iter().map(|r| r.1).collect();
            let (start, end) =
                (window.iter().map(|r| r.2).min().unwrap(), window.iter().map(|r| r.2).max().unwrap() + 1);
            *results.entry(format!("{start}|{end}|{k}|{}", reference(agg, &values))).or_insert(0) += 1;
        }
    }
    (results, late)
}

fn tumbling(t: u64) -> Vec<(u64, u64)> {
    let s = t / 50 * 50;
    vec![(s, s + 50)]
}

fn sliding(t: u64) -> Vec<(u64, u64)> {
    // size 60, slide 20
    (0..=t / 20).map(|k| (k * 20, k * 20 + 60)).filter(|(s, e)| *s <= t && t < *e).collect()
}

fn check_aligned(case: &Case, agg: Agg, workers: usize, slide: bool) {
    let want = if slide { reference_aligned(case, agg, sliding) } else { reference_aligned(case, agg, tumbling) };
    let got = if slide {
        run(case, workers, move |s, l| windowed(s, Sliding::of(60, 20), l, agg))
    } else {
        run(case, workers, move |s, l| windowed(s, Tumbling::of(50), l, agg))
    };
    assert_eq!(got, want, "{agg:?} over {} windows at {workers} workers", if slide { "sliding" } else { "tumbling" });
}

fn cases() -> ProptestConfig {
    ProptestConfig { cases: 24, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn tumbling_matches_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec())) {
        check_aligned(&case, agg, 1, false);
        check_aligned(&case, agg, 3, false);
    }

    #[test]
    fn sliding_matches_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec())) {
        check_aligned(&case, agg, 1, true);
        check_aligned(&case, agg, 3, true);
    }

    #[test]
    fn sessions_match_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec()), gap in 1u64..40) {
        let want = reference_sessions(&case, agg, gap);
        for workers in [1, 3] {
            let got = run(&case, workers, move |s, l| windowed(s, Session::with_gap(gap), l, agg));
            prop_assert_eq!(&got, &want, "sessions (gap {}) {:?} at {} workers", gap, agg, workers);
        }
    }

    #[test]
    fn sliding_count_windows_match_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec()), size in 1usize..5, slide in 1usize..3) {
        let want = reference_count(&case, agg, size, slide, false);
        for workers in [1, 3] {
            let got = run(&case, workers, move |s, l| windowed(s, CountWindows::sliding(size as u64, slide as u64), l, agg));
            prop_assert_eq!(&got, &want, "count windows ({}, {}) {:?} at {} workers", size, slide, agg, workers);
        }
    }

    #[test]
    fn tumbling_count_windows_match_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec()), size in 1usize..5) {
        let want = reference_count(&case, agg, size, size, true);
        for workers in [1, 3] {
            let got = run(&case, workers, move |s, l| windowed(s, CountWindows::tumbling(size as u64), l, agg));
            prop_assert_eq!(&got, &want, "tumbling count windows ({}) {:?} at {} workers", size, agg, workers);
        }
    }

    /// A purging count trigger on a global window is a tumbling count window.
    #[test]
    fn global_count_trigger_matches_reference(case in case(3), agg in prop::sample::select(AGGS.to_vec()), size in 1usize..5) {
        let case = Case { lateness: 0, ..case };
        let (count_results, late) = reference_count(&case, agg, size, size, true);
        // The global window reports [first record, triggering record + 1).
        for workers in [1, 3] {
            let got = run(&case, workers, move |s, l| {
                windowed(s, GlobalWindows::with_trigger(CountTrigger(size as u64).purging()), l, agg)
            });
            prop_assert_eq!(&got, &(count_results.clone(), late.clone()), "global count trigger ({}) {:?} at {} workers", size, agg, workers);
        }
    }
}

/// Exact aggregations over an updating stream (every record whose value is a
/// multiple of 3 is retracted again, at the same time), in `phases`.
fn updating<'s, W: WindowSpec<Rec>>(
    stream: &EventStream<'s, Rec>,
    windows: W,
    lateness: u64,
    phases: Phases,
) -> (EventStream<'s, String>, EventStream<'s, Rec>) {
    let updates = stream.concat(&stream.filter(|r: &Rec| r.1 % 3 == 0).negate());
    let v = |r: &Rec| r.1;
    let agg = (
        (Count, Sum::of(v), Avg::of(v)),
        (Max::of(v), DistinctCount::of(|r: &Rec| Some(r.1)), TopK::of(3, v)),
        MaxBy::of(|r: &Rec| r.1 / 10),
    );
    let out = updates.window(windows).key_by(|r: &Rec| r.0).allowed_lateness(lateness).phases(phases).aggregate(agg);
    let results = out.results.map(|r| {
        let (a, b, mut best) = r.value;
        best.sort();
        format!("{}|{}|{}|{a:?}|{b:?}|{best:?}", r.window.start, r.window.end, r.key)
    });
    (results, out.late.stream)
}

/// [`updating`] over tumbling (`kind` 0), sliding (1) or record-chosen windows.
fn updating_kind<'s>(
    s: &EventStream<'s, Rec>,
    lateness: u64,
    kind: u8,
    phases: Phases,
) -> (EventStream<'s, String>, EventStream<'s, Rec>) {
    match kind {
        0 => updating(s, Tumbling::of(50), lateness, phases),
        1 => updating(s, Sliding::of(60, 20), lateness, phases),
        _ => updating(s, windows_by(by_key), lateness, phases),
    }
}

/// Windows of a record's own choosing: 40 ms aligned, longer for greater keys.
fn by_key(r: &Rec, t: u64) -> Window {
    Window::new(t - t % 40, t - t % 40 + 40 + u64::from(r.0) * 10)
}

proptest! {
    #![proptest_config(cases())]

    /// Two-phase aggregation (partial results per worker, merged by the
    /// key's owner) gives what one phase gives, retractions included.
    #[test]
    fn two_phase_equals_one_phase_on_updating_input(case in case(3), kind in 0u8..3) {
        let want = run(&case, 3, move |s, l| updating_kind(s, l, kind, Phases::One));
        for workers in [1, 3] {
            let got = run(&case, workers, move |s, l| updating_kind(s, l, kind, Phases::Auto));
            prop_assert_eq!(&got, &want, "windows {} in two phases at {} workers", kind, workers);
        }
    }
}

/// An event-time trigger firing every 50 ms on an accumulating global window:
/// each firing reports everything so far, replacing the previous firing, so
/// the final result is one row per key over all its accepted records.
#[test]
fn global_event_time_trigger_accumulates() {
    let mut runner = proptest::test_runner::TestRunner::new(cases());
    runner
        .run(&case(3), |case| {
            let case = Case { lateness: 0, ..case };
            let (records, late) = accepted(&case);
            let mut per_key: BTreeMap<u8, Vec<Rec>> = BTreeMap::new();
            for r in records {
                per_key.entry(r.0).or_default().push(r);
            }
            let want: BTreeMap<String, i64> = per_key
                .into_iter()
                .map(|(k, recs)| {
                    let first = recs.iter().map(|r| r.2).min().unwrap();
                    let last = recs.iter().map(|r| r.2).max().unwrap();
                    let sum: i64 = recs.iter().map(|r| r.1).sum();
                    (format!("{first}|{}|{k}|{sum}", (last / 50 + 1) * 50), 1)
                })
                .collect();
            for workers in [1, 3] {
                let got = run(&case, workers, |s, l| {
                    windowed(s, GlobalWindows::with_trigger(EventTimeTrigger(50)), l, Agg::Sum)
                });
                prop_assert_eq!(&got, &(want.clone(), late.clone()), "at {} workers", workers);
            }
            Ok(())
        })
        .unwrap();
}
