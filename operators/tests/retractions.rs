//! Updating streams: session, count and global windows fed random insertions
//! and retractions (on a stream that may carry them), against brute-force
//! references computed from the consolidated input; and the same operators on
//! an append-only stream handed a retraction anyway, which must not fail.
//!
//! Every update arrives at or before its event time (retractions after the
//! insertions they take back), so the order in which the operators see them
//! does not depend on scheduling, and each run is checkpointed at a random cut
//! and recovered on another number of workers: the recovered output must equal
//! the uninterrupted one, time by time.

use std::collections::BTreeMap;

use highwater_operators::checkpoint::memory::{check_recovery, Input, Output, Recovery};
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// (key, value).
type Rec = (u8, i64);

/// A window result (count and sum per window and key) or a late record.
type Out = Result<WindowResult<u8, (u64, i64)>, Rec>;

/// Records by (key, time, value) with their multiplicities.
type Multiset = BTreeMap<(u8, Timestamp, i64), i64>;

/// Window results by (key, window, (count, sum)) with their multiplicities.
type Results = BTreeMap<(u8, Window, (u64, i64)), i64>;

/// Late records with their multiplicities.
type Late = BTreeMap<Rec, i64>;

/// A reference global window: (count, sum), the trigger's count, the
/// window's start, whether it holds records, and its last firing.
type GlobalWindow = ((i64, i64), u64, Timestamp, bool, Option<(Window, (u64, i64))>);

/// Insertions of 3 keys at event times in [1, 400), each arriving up to 60 ms
/// before its time; a third of them taken back by a retraction that arrives
/// later (still on time); and a few retractions of records never inserted.
fn changelog() -> impl Strategy<Value = Vec<Input<Rec>>> {
    let update = (0u8..3, 0i64..4, 1u64..400, 0u64..60, 0u32..9, 0u64..60);
    prop::collection::vec(update, 1..80).prop_map(|raw| {
        let mut out = Vec::new();
        for (k, v, time, lead, kind, back) in raw {
            let arrival = time.saturating_sub(lead);
            match kind {
                // A retraction of a record nobody inserted (value 9 is never inserted).
                0 => out.push(((k, 9), time, -1, arrival)),
                1..=3 => {
                    out.push(((k, v), time, 1, arrival));
                    out.push(((k, v), time, -1, (arrival + back).min(time)));
                }
                _ => out.push(((k, v), time, 1, arrival)),
            }
        }
        out
    })
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

/// The input consolidated: every record with its time and net multiplicity
/// (positive only; the rest are retractions of records not inserted).
fn consolidated(input: &[Input<Rec>]) -> (Multiset, Late) {
    let mut net = Multiset::new();
    for ((k, v), t, d, _) in input {
        *net.entry((*k, *t, *v)).or_insert(0) += d;
    }
    let mut unmatched = BTreeMap::new();
    for ((k, _t, v), d) in net.iter().filter(|(_, d)| **d < 0) {
        *unmatched.entry((*k, *v)).or_insert(0) += d;
    }
    net.retain(|_, d| *d > 0);
    (net, unmatched)
}

/// The output consolidated over time.
fn untimed<O: Ord + Clone>(out: &Output<O>) -> BTreeMap<O, i64> {
    let mut table = BTreeMap::new();
    for ((record, _time), diff) in out {
        *table.entry(record.clone()).or_insert(0) += diff;
    }
    table.retain(|_, d| *d != 0);
    table
}

/// Splits an output into results and late records (each consolidated).
fn split(out: &BTreeMap<Out, i64>) -> (Results, Late) {
    let (mut results, mut late) = (BTreeMap::new(), BTreeMap::new());
    for (o, d) in out {
        match o {
            Ok(r) => *results.entry((r.key, r.window, r.value)).or_insert(0) += d,
            Err(rec) => *late.entry(*rec).or_insert(0) += d,
        }
    }
    (results, late)
}

/// Count and sum of every window of `windows` per key, with the late records,
/// over a stream that may carry retractions.
fn windowed<W>(input: &[Input<Rec>], cut: u64, (before, after): (usize, usize), windows: W) -> Recovery<Out>
where
    W: WindowSpec<Rec> + Copy + Send + Sync,
{
    check_recovery(input, cut, before, after, move |events| {
        let w = events.window(windows).key_by(|r: &Rec| r.0).aggregate((Count, Sum::of(|r: &Rec| r.1)));
        w.results.map(Ok).concat(&w.late.stream.map(Err))
    })
}

/// Sessions per key of the consolidated records: runs of times at most `gap` apart.
fn reference_sessions(input: &[Input<Rec>], gap: u64) -> Results {
    let (net, _) = consolidated(input);
    let mut out = BTreeMap::new();
    for key in 0u8..3 {
        let records: Vec<(Timestamp, i64, i64)> =
            net.iter().filter(|((k, _, _), _)| *k == key).map(|((_, t, v), d)| (*t, *v, *d)).collect();
        let mut i = 0;
        while i < records.len() {
            let (start, mut last) = (records[i].0, records[i].0);
            let (mut count, mut sum) = (0u64, 0i64);
            while i < records.len() && records[i].0 <= last + gap {
                last = records[i].0;
                count += records[i].2 as u64;
                sum += records[i].1 * records[i].2;
                i += 1;
            }
            *out.entry((key, Window::new(start, last + gap), (count, sum))).or_insert(0) += 1;
        }
    }
    out
}

/// Count windows (`size`, `slide`; `tumbling`) per key over the consolidated
/// records in (time, record) order.
fn reference_count(input: &[Input<Rec>], size: usize, slide: usize, tumbling: bool) -> Results {
    let (net, _) = consolidated(input);
    let mut out = BTreeMap::new();
    for key in 0u8..3 {
        let mut seq: Vec<(Timestamp, i64)> = Vec::new();
        for ((k, t, v), d) in &net {
            if *k == key {
                seq.extend(std::iter::repeat_n((*t, *v), *d as usize));
            }
        }
        for end in 0..seq.len() {
            if (end + 1) % slide != 0 || (tumbling && end + 1 < size) {
                continue;
            }
            let from = (end + 1).saturating_sub(size);
            let part = &seq[from..=end];
            let window =
                Window::new(part.iter().map(|r| r.0).min().unwrap(), part.iter().map(|r| r.0).max().unwrap() + 1);
            let value = (part.len() as u64, part.iter().map(|r| r.1).sum());
            *out.entry((key, window, value)).or_insert(0) += 1;
        }
    }
    out
}

/// A global window per key with a count trigger of `n` (purging or not): the
/// trigger counts insertions only, a retraction takes its record out.
fn reference_global(input: &[Input<Rec>], n: u64, purging: bool) -> Results {
    // Per millisecond and key, the consolidated updates in record order.
    let mut by_time: BTreeMap<(Timestamp, u8, i64), i64> = BTreeMap::new();
    for ((k, v), t, d, _) in input {
        *by_time.entry((*t, *k, *v)).or_insert(0) += d;
    }
    let mut out = BTreeMap::new();
    // Per key: (count, sum), trigger count, window start, whether filled, last firing.
    let mut windows: BTreeMap<u8, GlobalWindow> = BTreeMap::new();
    for ((t, k, v), d) in by_time {
        if d < 0 {
            // Taken out of a window holding records; otherwise late.
            if let Some(w) = windows.get_mut(&k).filter(|w| w.3) {
                w.0 .0 += d;
                w.0 .1 += v * d;
            }
            continue;
        }
        for _ in 0..d {
            let w = windows.entry(k).or_insert(((0, 0), 0, t, false, None));
            if !w.3 {
                w.3 = true;
                w.2 = t;
            }
            w.0 .0 += 1;
            w.0 .1 += v;
            w.1 += 1;
            if w.1 >= n {
                w.1 = 0;
                if let Some(old) = w.4.take() {
                    *out.entry((k, old.0, old.1)).or_insert(0) -= 1;
                }
                let window = Window::new(w.2, t + 1);
                if w.0 .0 > 0 {
                    let value = (w.0 .0 as u64, w.0 .1);
                    *out.entry((k, window, value)).or_insert(0) += 1;
                    w.4 = Some((window, value));
                }
                if purging {
                    w.0 = (0, 0);
                    w.3 = false;
                    w.4 = None;
                }
            }
        }
    }
    out.retain(|_, d| *d != 0);
    out
}

/// The retractions the input takes back without an insertion, as the late output holds them.
fn unmatched(input: &[Input<Rec>]) -> BTreeMap<Rec, i64> {
    consolidated(input).1
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn sessions_take_retractions(input in changelog(), gap in 1u64..40, cut in 1u64..400, w in workers()) {
        let run = windowed(&input, cut, w, Session::with_gap(gap));
        prop_assert_eq!(&run.recovered, &run.expected);
        let (results, late) = split(&untimed(&run.expected));
        prop_assert_eq!(results, reference_sessions(&input, gap));
        prop_assert_eq!(late, unmatched(&input));
    }

    #[test]
    fn count_windows_take_retractions(input in changelog(), size in 1usize..5, slide in 1usize..3, cut in 1u64..400, w in workers()) {
        let run = windowed(&input, cut, w, CountWindows::sliding(size as u64, slide as u64));
        prop_assert_eq!(&run.recovered, &run.expected);
        let (results, late) = split(&untimed(&run.expected));
        prop_assert_eq!(results, reference_count(&input, size, slide, false));
        prop_assert_eq!(late, unmatched(&input));
    }

    #[test]
    fn tumbling_count_windows_take_retractions(input in changelog(), size in 1usize..5, cut in 1u64..400, w in workers()) {
        let run = windowed(&input, cut, w, CountWindows::tumbling(size as u64));
        prop_assert_eq!(&run.recovered, &run.expected);
        let (results, _) = split(&untimed(&run.expected));
        prop_assert_eq!(results, reference_count(&input, size, size, true));
    }

    #[test]
    fn global_windows_take_retractions(input in changelog(), n in 1u64..4, purging: bool, cut in 1u64..400, w in workers()) {
        let run = if purging {
            windowed(&input, cut, w, GlobalWindows::with_trigger(CountTrigger(n).purging()))
        } else {
            windowed(&input, cut, w, GlobalWindows::with_trigger(CountTrigger(n)))
        };
        prop_assert_eq!(&run.recovered, &run.expected);
        let (results, _) = split(&untimed(&run.expected));
        prop_assert_eq!(results, reference_global(&input, n, purging));
    }
}

/// Sessions on an append-only stream keep no records: a retraction handed to
/// them anyway goes to the late output, and the worker goes on.
#[test]
fn a_retraction_on_an_append_only_stream_goes_to_the_late_output() {
    use timely::dataflow::operators::capture::{Capture, Extract};
    use timely::dataflow::operators::ToStream;
    let captured = timely::example(|scope| {
        let updates = vec![((1u8, 5i64), 10u64, 1i64), ((1, 5), 10, -1), ((1, 7), 20, 1)].to_stream(scope);
        let stream = EventStream::append_only(updates);
        assert!(stream.is_append_only() && stream.map(|r| r).is_append_only());
        let w = stream.window(Session::with_gap(100)).key_by(|r: &Rec| r.0).aggregate(Count);
        w.results.map(|r| Ok((r.window, r.value))).concat(&w.late.stream.map(Err)).inner.capture()
    });
    let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(o, _, d)| (o, d)).collect();
    out.sort();
    assert_eq!(out, vec![(Ok((Window::new(10, 120), 2)), 1), (Err((1, 5)), -1)]);
}
