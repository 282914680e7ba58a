//! Tables and every join type against naive references over the full history,
//! on random out-of-order input with updates and deletes, at 1 and 3 workers.
//!
//! Input records are `(side, key, value, time)`: side 0 is the left stream or
//! table, side 1 the right one; for tables a value of `None` deletes the key.
//! The references see the whole input at once: a table as of time `T` is, per
//! key, the value of its latest upsert at or before `T`; joins are nested
//! loops over those tables (or over the stream's records) at every time where
//! something changes. The dataflow's changelog, consolidated by `(row, time)`,
//! must equal the reference changelog: the same rows, retractions included, at
//! the same times.
//!
//! Upserts and interval joins are also checked with records arriving later
//! than the watermark (accepted within the allowed lateness, late output
//! beyond it). The other joins are checked on input whose disorder stays within
//! the watermark bound, where their result is a function of event time alone;
//! their lateness behaviour has hand-written tests below.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use highwater::sink::{collect, Collected};
use highwater::source::{read, MemorySource, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// (side, key, value, event time).
type Rec = (u8, u8, Option<u8>, u64);

/// A consolidated changelog: `(row, time) -> diff`.
type Log = BTreeMap<(String, u64), i64>;

#[derive(Clone, Debug)]
struct Case {
    partitions: Vec<Vec<Rec>>,
    bound: u64,
    lateness: u64,
    batch: usize,
}

/// Random partitions. With `exact`, no record is earlier than its partition's
/// watermark when read; otherwise some are, a few by far.
fn case(exact: bool) -> impl Strategy<Value = Case> {
    let record = (0u8..2, 0u8..4, prop::option::weighted(0.8, 0u8..5), 0u64..8, 0u64..100, prop::bool::weighted(0.1));
    let bound = (0u64..10).prop_map(|b| b * 5);
    let partitions = prop::collection::vec(prop::collection::vec(record, 0..40), 1..=3);
    (partitions, bound, prop::sample::select(vec![0u64, 0, 25, 200]), 1usize..5).prop_map(
        move |(raw, bound, lateness, batch)| {
            let mut seen = BTreeSet::new();
            let partitions = raw
                .into_iter()
                .map(|p| {
                    let mut clock = 0u64;
                    p.into_iter()
                        .filter_map(|(side, key, value, step, back, very_late)| {
                            clock += step * 5;
                            let back = if exact {
                                back % (bound / 5 + 1) * 5
                            } else if very_late {
                                back * 20
                            } else {
                                back % 6 * 5
                            };
                            let t = clock.saturating_sub(back);
                            // One upsert per key and time: ties between partitions have no order.
                            seen.insert((side, key, t)).then_some((side, key, value, t))
                        })
                        .collect()
                })
                .collect();
            Case { partitions, bound, lateness, batch }
        },
    )
}

/// Each record with the watermark it was read under (its partition's greatest
/// earlier time minus the bound, per batch), in reading order per partition.
fn arrivals(case: &Case) -> Vec<(Rec, u64)> {
    let mut out = Vec::new();
    for p in &case.partitions {
        let mut max_seen: Option<u64> = None;
        for batch in p.chunks(case.batch) {
            let watermark = max_seen.map_or(0, |m| m.saturating_sub(case.bound));
            out.extend(batch.iter().map(|r| (*r, watermark)));
            for r in batch {
                max_seen = Some(max_seen.map_or(r.3, |m| m.max(r.3)));
            }
        }
    }
    out
}

/// The records of `side` accepted with the case's lateness, and those rejected.
fn accepted(case: &Case, side: u8) -> (Vec<Rec>, Vec<Rec>) {
    arrivals(case)
        .into_iter()
        .filter(|(r, _)| r.0 == side)
        .partition::<Vec<_>, _>(|(r, watermark)| r.3 + 1 + case.lateness > *watermark)
        .into_vec_pair()
}

trait VecPair {
    fn into_vec_pair(self) -> (Vec<Rec>, Vec<Rec>);
}

impl VecPair for (Vec<(Rec, u64)>, Vec<(Rec, u64)>) {
    fn into_vec_pair(self) -> (Vec<Rec>, Vec<Rec>) {
        (self.0.into_iter().map(|(r, _)| r).collect(), self.1.into_iter().map(|(r, _)| r).collect())
    }
}

/// Runs `build` over the case; returns the results' changelog and the late records.
fn run<F>(case: &Case, workers: usize, build: F) -> (Log, BTreeMap<String, i64>)
where
    F: for<'s> Fn(
            &EventStream<'s, Rec>,
            &EventStream<'s, Rec>,
            u64,
        ) -> (EventStream<'s, String>, EventStream<'s, String>)
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
            let events = read(scope, source, |r: &Rec| r.3, options, &SourceMetrics::default(), None).unwrap().events;
            let (left, right) = (events.filter(|r| r.0 == 0), events.filter(|r| r.0 == 1));
            let (results, late) = build(&left, &right, lateness);
            let timed = results.flat_map_updates("Timed", |(row, t, d), out| out.push(((row, t), t, d)));
            collect(&timed, &r);
            collect(&late, &l);
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    (results.consolidated(), late.consolidated())
}

/// `(key, Some(value))` upserts of a side's records.
fn upserts<'s>(s: &EventStream<'s, Rec>) -> EventStream<'s, (u8, Option<u8>)> {
    s.map(|(_, k, v, _)| (k, v))
}

/// A table's versions per key: `(time, value)` in time order.
type Versions = BTreeMap<u8, Vec<(u64, Option<u8>)>>;

fn versions(records: &[Rec]) -> Versions {
    let mut out: Versions = BTreeMap::new();
    for r in records {
        out.entry(r.1).or_default().push((r.3, r.2));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

fn as_of(versions: &Versions, key: u8, time: u64) -> Option<u8> {
    versions.get(&key)?.iter().take_while(|(t, _)| *t <= time).last().and_then(|(_, v)| *v)
}

/// The changelog of a function of time that changes only at `times`:
/// `state(T)` minus `state(previous T)`, at every `T`.
fn changelog_of(times: BTreeSet<u64>, state: impl Fn(u64) -> BTreeMap<String, i64>) -> Log {
    let mut log = Log::new();
    let mut previous: BTreeMap<String, i64> = BTreeMap::new();
    for t in times {
        let now = state(t);
        let rows: BTreeSet<&String> = now.keys().chain(previous.keys()).collect();
        for row in rows {
            let d = now.get(row).copied().unwrap_or(0) - previous.get(row).copied().unwrap_or(0);
            if d != 0 {
                log.insert((row.clone(), t), d);
            }
        }
        previous = now;
    }
    log
}

fn times(versions: &[&Versions]) -> BTreeSet<u64> {
    versions.iter().flat_map(|v| v.values().flatten().map(|(t, _)| *t)).collect()
}

fn bag(rows: impl IntoIterator<Item = String>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r).or_insert(0) += 1;
    }
    out
}

fn show<'s, T: highwater_operators::key::Data>(s: &EventStream<'s, T>) -> EventStream<'s, String> {
    s.map(|x| format!("{x:?}"))
}

fn nothing<'s>(s: &EventStream<'s, Rec>) -> EventStream<'s, String> {
    s.filter(|_| false).map(|_| String::new())
}

/// The table–table join condition: the left row's value is a key of the right.
fn fk(v: u8) -> u8 {
    v % 4
}

fn check_upsert(case: &Case, workers: usize) {
    let (records, late) = accepted(case, 0);
    let table = versions(&records);
    let want = changelog_of(times(&[&table]), |t| {
        bag(table.keys().filter_map(|k| as_of(&table, *k, t).map(|v| format!("{:?}", (*k, v)))))
    });
    let got = run(case, workers, |left, _right, lateness| {
        let upserted = upserts(left).allowed_lateness(lateness).upsert();
        (show(&upserted.table.changelog()), show(&upserted.late.stream.map(|(k, v)| (k, v))))
    });
    let late_want = bag(late.iter().map(|r| format!("{:?}", (r.1, r.2))));
    assert_eq!(got.0, want, "upsert changelog at {workers} workers");
    assert_eq!(got.1, late_want, "late upserts at {workers} workers");
}

/// Both tables from an exact case.
fn tables(case: &Case) -> (Versions, Versions) {
    let all: Vec<Rec> = case.partitions.iter().flatten().copied().collect();
    let left: Vec<Rec> = all.iter().filter(|r| r.0 == 0).copied().collect();
    let right: Vec<Rec> = all.iter().filter(|r| r.0 == 1).copied().collect();
    (versions(&left), versions(&right))
}

#[derive(Clone, Copy, Debug)]
enum TableJoin {
    Inner,
    Left,
    Full,
}

fn check_table_join(case: &Case, kind: TableJoin, workers: usize) {
    let (l, r) = tables(case);
    let want = changelog_of(times(&[&l, &r]), |t| {
        let lrows: Vec<(u8, u8)> = l.keys().filter_map(|k| as_of(&l, *k, t).map(|v| (*k, v))).collect();
        let rrows: Vec<(u8, u8)> = r.keys().filter_map(|k| as_of(&r, *k, t).map(|v| (*k, v))).collect();
        let mut rows = Vec::new();
        for lr in &lrows {
            let matches: Vec<&(u8, u8)> = rrows.iter().filter(|rr| rr.0 == fk(lr.1)).collect();
            for rr in &matches {
                rows.push(match kind {
                    TableJoin::Inner => format!("({lr:?}, {rr:?})"),
                    TableJoin::Left => format!("({lr:?}, Some({rr:?}))"),
                    TableJoin::Full => format!("(Some({lr:?}), Some({rr:?}))"),
                });
            }
            if matches.is_empty() {
                match kind {
                    TableJoin::Inner => {}
                    TableJoin::Left => rows.push(format!("({lr:?}, None)")),
                    TableJoin::Full => rows.push(format!("(Some({lr:?}), None)")),
                }
            }
        }
        if let TableJoin::Full = kind {
            for rr in &rrows {
                if !lrows.iter().any(|lr| fk(lr.1) == rr.0) {
                    rows.push(format!("(None, Some({rr:?}))"));
                }
            }
        }
        bag(rows)
    });
    let got = run(case, workers, move |left, right, lateness| {
        let l = upserts(left).allowed_lateness(lateness).upsert().table;
        let r = upserts(right).allowed_lateness(lateness).upsert().table;
        let out = match kind {
            TableJoin::Inner => show(&l.join(&r, |_, v| fk(*v))),
            TableJoin::Left => show(&l.left_join(&r, |_, v| fk(*v))),
            TableJoin::Full => show(&l.full_join(&r, |_, v| fk(*v))),
        };
        (out, nothing(left))
    });
    assert_eq!(got.0, want, "{kind:?} table join at {workers} workers");
}

fn check_as_of(case: &Case, left_join: bool, workers: usize) {
    let (_, table) = tables(case);
    let mut rows = Log::new();
    for r in case.partitions.iter().flatten().filter(|r| r.0 == 0) {
        let value = as_of(&table, r.1, r.3);
        let row = if left_join {
            format!("({r:?}, {value:?})")
        } else if let Some(v) = value {
            format!("({r:?}, {v:?})")
        } else {
            continue;
        };
        *rows.entry((row, r.3)).or_insert(0) += 1;
    }
    let got = run(case, workers, move |left, right, lateness| {
        let table = upserts(right).allowed_lateness(lateness).upsert().table;
        let out = if left_join {
            show(&left.allowed_lateness(lateness).left_join_as_of(&table, |r| r.1).results)
        } else {
            show(&left.allowed_lateness(lateness).join_as_of(&table, |r| r.1).results)
        };
        (out, nothing(left))
    });
    assert_eq!(got.0, rows, "as-of join (left: {left_join}) at {workers} workers");
}

fn check_updating(case: &Case, workers: usize) {
    let (_, table) = tables(case);
    let events: Vec<Rec> = case.partitions.iter().flatten().filter(|r| r.0 == 0).copied().collect();
    let mut all_times = times(&[&table]);
    all_times.extend(events.iter().map(|r| r.3));
    let want = changelog_of(all_times, |t| {
        bag(events.iter().filter(|e| e.3 <= t).filter_map(|e| as_of(&table, e.1, t).map(|v| format!("({e:?}, {v:?})"))))
    });
    let got = run(case, workers, move |left, right, lateness| {
        let table = upserts(right).allowed_lateness(lateness).upsert().table;
        (show(&left.join_updating(&table, |r| r.1)), nothing(left))
    });
    assert_eq!(got.0, want, "updating join at {workers} workers");
}

fn check_interval(case: &Case, workers: usize) {
    let (lefts, late_l) = accepted(case, 0);
    let (rights, late_r) = accepted(case, 1);
    let mut want = Log::new();
    for l in &lefts {
        for r in rights.iter().filter(|r| r.1 == l.1 && l.3 <= r.3 + 10 && r.3 <= l.3 + 20) {
            *want.entry((format!("({l:?}, {r:?})"), l.3.max(r.3))).or_insert(0) += 1;
        }
    }
    let late_want = bag(late_l.iter().chain(&late_r).map(|r| format!("{r:?}")));
    let got = run(case, workers, |left, right, lateness| {
        let joined =
            left.allowed_lateness(lateness).interval_join(right, |l| l.1, |r| r.1, between(-10, 20), |l, r| (*l, *r));
        (show(&joined.results), show(&joined.late_left.stream).concat(&show(&joined.late_right.stream)))
    });
    assert_eq!(got.0, want, "interval join at {workers} workers");
    assert_eq!(got.1, late_want, "late records of the interval join at {workers} workers");
}

#[derive(Clone, Copy, Debug)]
enum Windows {
    Tumbling,
    Sliding,
    Session,
}

fn check_window_join(case: &Case, windows: Windows, workers: usize) {
    let all: Vec<Rec> = case.partitions.iter().flatten().copied().collect();
    let mut want = Log::new();
    // Results go out at a window's last millisecond: `end - 1` for time
    // windows, `end` for sessions (a record at exactly `end` still joins one).
    let last = |end: u64| if let Windows::Session = windows { end } else { end - 1 };
    let mut pairs_in = |start: u64, end: u64, members: &[Rec]| {
        for l in members.iter().filter(|r| r.0 == 0) {
            for r in members.iter().filter(|r| r.0 == 1) {
                *want.entry((format!("({start}, {end}, {}, ({l:?}, {r:?}))", l.1), last(end))).or_insert(0) += 1;
            }
        }
    };
    for key in 0..4u8 {
        let mut recs: Vec<Rec> = all.iter().filter(|r| r.1 == key).copied().collect();
        recs.sort_by_key(|r| r.3);
        match windows {
            Windows::Tumbling | Windows::Sliding => {
                let (size, slide) = if let Windows::Tumbling = windows { (50, 50) } else { (60, 20) };
                let starts: BTreeSet<u64> = recs
                    .iter()
                    .flat_map(|r| (0..=r.3 / slide).map(move |i| i * slide).filter(move |s| r.3 < s + size))
                    .collect();
                for s in starts {
                    let members: Vec<Rec> = recs.iter().filter(|r| s <= r.3 && r.3 < s + size).copied().collect();
                    pairs_in(s, s + size, &members);
                }
            }
            Windows::Session => {
                let gap = 15;
                let mut session: Vec<Rec> = Vec::new();
                for r in recs {
                    if session.last().is_some_and(|last| r.3 > last.3 + gap) {
                        pairs_in(session[0].3, session[session.len() - 1].3 + gap, &session);
                        session.clear();
                    }
                    session.push(r);
                }
                if !session.is_empty() {
                    pairs_in(session[0].3, session[session.len() - 1].3 + gap, &session);
                }
            }
        }
    }
    let got = run(case, workers, move |left, right, lateness| {
        let out = match windows {
            Windows::Tumbling => {
                left.allowed_lateness(lateness).window_join(right, Tumbling::of(50), |l| l.1, |r| r.1).results
            }
            Windows::Sliding => {
                left.allowed_lateness(lateness).window_join(right, Sliding::of(60, 20), |l| l.1, |r| r.1).results
            }
            Windows::Session => {
                left.allowed_lateness(lateness).window_join(right, Session::with_gap(15), |l| l.1, |r| r.1).results
            }
        };
        let rows = out.map(|w| format!("({}, {}, {}, {:?})", w.window.start, w.window.end, w.key, w.value));
        (rows, nothing(left))
    });
    assert_eq!(got.0, want, "{windows:?} window join at {workers} workers");
}

fn cases() -> ProptestConfig {
    ProptestConfig { cases: 24, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn upserts_match_reference(case in case(false)) {
        check_upsert(&case, 1);
        check_upsert(&case, 3);
    }

    #[test]
    fn table_joins_match_reference(case in case(true), kind in prop::sample::select(vec![TableJoin::Inner, TableJoin::Left, TableJoin::Full])) {
        check_table_join(&case, kind, 1);
        check_table_join(&case, kind, 3);
    }

    #[test]
    fn as_of_joins_match_reference(case in case(true), left_join in any::<bool>()) {
        check_as_of(&case, left_join, 1);
        check_as_of(&case, left_join, 3);
    }

    #[test]
    fn updating_join_matches_reference(case in case(true)) {
        check_updating(&case, 1);
        check_updating(&case, 3);
    }

    #[test]
    fn interval_join_matches_reference(case in case(false)) {
        check_interval(&case, 1);
        check_interval(&case, 3);
    }

    #[test]
    fn window_joins_match_reference(case in case(true), windows in prop::sample::select(vec![Windows::Tumbling, Windows::Sliding, Windows::Session])) {
        check_window_join(&case, windows, 1);
        check_window_join(&case, windows, 3);
    }
}
