//! Stateful operators recover from a checkpoint: `aggregate_by_key`, count
//! windows and global windows checkpoint their state at a cut and restore it
//! on another number of workers, and the committed output (before the cut
//! from the first run, from the cut on from the recovered one) equals an
//! uninterrupted run's, time by time.
//!
//! A record's timely time is the watermark it was read under. Window inputs
//! here are on time (read at or before their event time, out of order in event
//! time) or too late for the allowed lateness: both are handled the same
//! whatever the scheduling. A record later than its event time but within the
//! lateness takes a path that depends on how far the operator has got when it
//! arrives (waiting for the watermark, or a correction), so the times of the
//! results it changes are not deterministic even without a checkpoint; for
//! count windows such records are checked on the consolidated results.

use std::collections::BTreeMap;

use highwater_operators::checkpoint::memory::{check_recovery, check_recovery_announced_late, Input, Output, Recovery};
use highwater_operators::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// (key, value).
type Rec = (u8, i64);

/// A window result (count and sum per window and key) or a late record.
type Out = Result<WindowResult<u8, (u64, i64)>, Rec>;

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

/// A changelog `(record, event time, diff, arrival)`: arrivals in [0, 2000),
/// event times up to 300 before or after them, and retractions of earlier
/// insertions arriving a little later.
fn changelog() -> impl Strategy<Value = Vec<Input<Rec>>> {
    prop::collection::vec((0u8..5, -20i64..50, 0u64..2000, 0u64..600, any::<bool>(), 1u64..300), 1..100).prop_map(
        |raw| {
            let mut out = Vec::new();
            for (k, v, arrival, skew, retract, later) in raw {
                let time = (arrival + skew).saturating_sub(300);
                out.push(((k, v), time, 1, arrival));
                if retract {
                    out.push(((k, v), time + later, -1, arrival + later));
                }
            }
            out
        },
    )
}

/// Insertions of 3 keys at event times in [0, 2000) (multiples of 5, so that
/// they tie), out of order: each arrives up to 200 ms before its event time (on
/// time) or, one in ten, after its event time plus `lateness` (too late).
fn insertions(lateness: u64) -> impl Strategy<Value = Vec<Input<Rec>>> {
    let record = (0u8..3, 0i64..20, 0u64..400, 0u64..40, 0u32..10);
    prop::collection::vec(record, 1..100).prop_map(move |raw| {
        raw.into_iter()
            .map(|(k, v, t, skew, kind)| {
                let time = t * 5;
                let arrival = if kind == 0 { time + lateness + 1 + skew * 5 } else { time.saturating_sub(skew * 5) };
                ((k, v), time, 1, arrival)
            })
            .collect()
    })
}

/// Denser insertions of 2 keys at event times in [0, 1000), two in five of
/// them after their event time but within `lateness`, one in ten too late,
/// the others on time.
fn late_insertions(lateness: u64) -> impl Strategy<Value = Vec<Input<Rec>>> {
    let record = (0u8..2, 0i64..20, 0u64..200, 0u64..40, 0u32..10);
    prop::collection::vec(record, 1..120).prop_map(move |raw| {
        raw.into_iter()
            .map(|(k, v, t, skew, kind)| {
                let time = t * 5;
                let arrival = match kind {
                    0 => time + lateness + 1 + skew * 5,
                    1..=4 => time + 1 + skew * 5 % lateness,
                    _ => time.saturating_sub(skew * 5),
                };
                ((k, v), time, 1, arrival)
            })
            .collect()
    })
}

/// Count and sum of every window of `windows` per key, with the late records.
fn windowed<W>(
    input: &[Input<Rec>],
    cut: u64,
    (before, after): (usize, usize),
    lateness: u64,
    windows: W,
) -> Recovery<Out>
where
    W: WindowSpec<Rec> + Copy + Send + Sync,
{
    check_recovery(input, cut, before, after, move |events| {
        let w = events
            .window(windows)
            .key_by(|r: &Rec| r.0)
            .allowed_lateness(lateness)
            .aggregate((Count, Sum::of(|r: &Rec| r.1)));
        w.results.map(Ok).concat(&w.late.stream.map(Err))
    })
}

/// `aggregate_by_key` with several aggregates; the average as its bits (ordered).
fn grouped(input: &[Input<Rec>], cut: u64, (before, after): (usize, usize)) -> Recovery<(u8, u64, i64, i64, u64)> {
    check_recovery(input, cut, before, after, |events| {
        let aggregates = (Count, Sum::of(|r: &Rec| r.1), Max::of(|r: &Rec| r.1), Avg::of(|r: &Rec| r.1));
        events.aggregate_by_key(|r: &Rec| r.0, aggregates).map(|(k, (c, s, m, a))| (k, c, s, m, a.to_bits()))
    })
}

fn recovers<O: Ord + std::fmt::Debug>(run: &Recovery<O>) -> Result<(), TestCaseError> {
    prop_assert!(run.unsupported.is_empty(), "unsupported: {:?}", run.unsupported);
    prop_assert_eq!(&run.recovered, &run.expected);
    Ok(())
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

/// The number of checkpoint entries of the operators whose name starts with `name`.
fn entries<O: Ord>(run: &Recovery<O>, name: &str) -> usize {
    run.checkpoint.entries_of(name)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn aggregate_by_key_recovers(input in changelog(), cut in 1u64..2200, workers in workers()) {
        recovers(&grouped(&input, cut, workers))?;
    }

    #[test]
    fn extremes_and_top_k_by_key_recover(input in changelog(), cut in 1u64..2200, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            let aggregates = (Min::of(|r: &Rec| r.1), TopK::of(2, |r: &Rec| r.1), DistinctCount::of(|r: &Rec| Some(r.1)));
            events.aggregate_by_key(|r: &Rec| r.0, aggregates)
        });
        recovers(&run)?;
    }

    #[test]
    fn tumbling_count_windows_recover(
        input in insertions(50),
        cut in 1u64..2200,
        workers in workers(),
        size in 1u64..5,
        lateness in prop::sample::select(vec![0u64, 50]),
    ) {
        recovers(&windowed(&input, cut, workers, lateness, CountWindows::tumbling(size)))?;
    }

    #[test]
    fn sliding_count_windows_recover(
        input in insertions(50),
        cut in 1u64..2200,
        workers in workers(),
        (size, slide) in (1u64..6, 1u64..4),
        lateness in prop::sample::select(vec![0u64, 50]),
    ) {
        recovers(&windowed(&input, cut, workers, lateness, CountWindows::sliding(size, slide)))?;
    }

    /// Records within the lateness shift emitted windows (retracted and
    /// emitted again): the consolidated results recover.
    #[test]
    fn count_window_corrections_recover(
        input in late_insertions(60),
        cut in 1u64..1100,
        workers in workers(),
        (size, slide) in (1u64..6, 1u64..4),
        tumbling in any::<bool>(),
    ) {
        let spec = if tumbling { CountWindows::tumbling(size) } else { CountWindows::sliding(size, slide) };
        let run = windowed(&input, cut, workers, 60, spec);
        prop_assert!(run.unsupported.is_empty(), "unsupported: {:?}", run.unsupported);
        prop_assert_eq!(untimed(&run.recovered), untimed(&run.expected));
    }

    #[test]
    fn global_windows_with_count_triggers_recover(
        input in insertions(30),
        cut in 1u64..2200,
        workers in workers(),
        n in 1u64..5,
        purging in any::<bool>(),
        lateness in prop::sample::select(vec![0u64, 30]),
    ) {
        let run = if purging {
            windowed(&input, cut, workers, lateness, GlobalWindows::with_trigger(CountTrigger(n).purging()))
        } else {
            windowed(&input, cut, workers, lateness, GlobalWindows::with_trigger(CountTrigger(n)))
        };
        recovers(&run)?;
    }

    #[test]
    fn global_windows_with_event_time_triggers_recover(
        input in insertions(30),
        cut in 1u64..2200,
        workers in workers(),
        period in prop::sample::select(vec![7u64, 100, 450]),
        purging in any::<bool>(),
        lateness in prop::sample::select(vec![0u64, 30]),
    ) {
        let run = if purging {
            windowed(&input, cut, workers, lateness, GlobalWindows::with_trigger(EventTimeTrigger(period).purging()))
        } else {
            windowed(&input, cut, workers, lateness, GlobalWindows::with_trigger(EventTimeTrigger(period)))
        };
        recovers(&run)?;
    }

    /// A processing-time trigger whose period does not end during the test
    /// fires once, at the end of input: what it fires (each key's sum since
    /// its first record) needs the windows and their "records since the last
    /// firing" flags from before the cut. When it fires is wall-clock
    /// dependent, so results are compared consolidated.
    #[test]
    fn processing_time_trigger_state_recovers(
        input in late_insertions(30),
        cut in 1u64..1100,
        workers in workers(),
    ) {
        let run = windowed(&input, cut, workers, 30, GlobalWindows::with_trigger(ProcessingTimeTrigger(YEARS)));
        prop_assert!(run.unsupported.is_empty(), "unsupported: {:?}", run.unsupported);
        prop_assert_eq!(untimed(&run.recovered), untimed(&run.expected));
    }
}

/// A processing-time period longer than the wall clock's ms since the epoch:
/// no period ends during the test.
const YEARS: u64 = 10_000_000_000_000;

/// Input before the cut at 1000 (one record arriving before it for a time
/// after it), and after it.
fn around_the_cut() -> Vec<Input<Rec>> {
    vec![
        ((1, 10), 100, 1, 100),
        ((2, 20), 200, 1, 150),
        ((1, 5), 300, 1, 300),
        ((3, 7), 1200, 1, 900),
        ((1, 1), 1100, 1, 1100),
        ((2, 2), 1500, 1, 1500),
    ]
}

#[test]
fn aggregate_by_key_checkpoints_its_keys() {
    let mut input = around_the_cut();
    input.push(((1, 10), 400, -1, 400));
    let run = grouped(&input, 1000, (1, 2));
    assert_eq!(entries(&run, "AggregateByKey"), 3, "{:?}", run.checkpoint.entries.keys().collect::<Vec<_>>());
    assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    assert_eq!(run.recovered, run.expected);
    // Key 1 after its retraction (5) and the record after the cut (5 + 1).
    assert_eq!(run.recovered.get(&((1, 2, 6, 5, 3f64.to_bits()), 1100)), Some(&1));
}

#[test]
fn count_windows_checkpoint_records_and_waiting_ones() {
    let run = windowed(&around_the_cut(), 1000, (2, 1), 0, CountWindows::sliding(2, 1));
    // Keys 1 and 2 with processed records, key 3 with a record waiting for the watermark.
    assert_eq!(entries(&run, "Window"), 3);
    assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    assert_eq!(run.recovered, run.expected);
    // The window of key 1's second and third records, the third after the cut.
    let window = WindowResult { window: Window::new(300, 1101), key: 1, value: (2, 6) };
    assert_eq!(run.recovered.get(&(Ok(window), 1100)), Some(&1));
    let waiting = WindowResult { window: Window::new(1200, 1201), key: 3, value: (1, 7) };
    assert_eq!(run.recovered.get(&(Ok(waiting), 1200)), Some(&1));
}

#[test]
fn global_windows_checkpoint_timers_and_emitted_results() {
    let run = windowed(&around_the_cut(), 1000, (1, 2), 0, GlobalWindows::with_trigger(EventTimeTrigger(1000)));
    assert_eq!(entries(&run, "Window"), 3);
    assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    assert_eq!(run.recovered, run.expected);
    // Key 1 fired at 1000 (before the cut) with 15; at 2000 its result is replaced.
    let first = WindowResult { window: Window::new(100, 1000), key: 1, value: (2, 15) };
    let second = WindowResult { window: Window::new(100, 2000), key: 1, value: (3, 16) };
    assert_eq!(run.recovered.get(&(Ok(first.clone()), 999)), Some(&1));
    assert_eq!(run.recovered.get(&(Ok(first), 1999)), Some(&-1));
    assert_eq!(run.recovered.get(&(Ok(second), 1999)), Some(&1));
}

#[test]
fn processing_time_windows_checkpoint_their_pending_firing() {
    let run = windowed(&around_the_cut(), 1000, (2, 2), 0, GlobalWindows::with_trigger(ProcessingTimeTrigger(YEARS)));
    assert_eq!(entries(&run, "Window"), 3);
    assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    let sums: Vec<(u8, (u64, i64))> = untimed(&run.recovered)
        .into_iter()
        .filter_map(|(out, diff)| out.ok().map(|r| (r.key, r.value)).filter(|_| diff == 1))
        .collect();
    assert_eq!(sums, vec![(1, (3, 16)), (2, (2, 22)), (3, (1, 7))]);
    assert_eq!(untimed(&run.recovered), untimed(&run.expected));
}

#[test]
fn count_windows_checkpoint_what_a_late_record_retracts() {
    // Key 1's windows up to 950 are emitted before the cut at 1000; the record
    // at 920 arrives after it, within the lateness, and shifts them.
    let input = vec![((1, 1), 900, 1, 900), ((1, 2), 950, 1, 950), ((1, 4), 920, 1, 1010)];
    let run = windowed(&input, 1000, (1, 2), 100, CountWindows::sliding(2, 1));
    assert_eq!(entries(&run, "Window"), 1);
    assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    // Whether the late record waits or corrects depends on how far the
    // uninterrupted run had got when it came: compare consolidated results.
    let results: Vec<_> =
        untimed(&run.recovered).into_iter().map(|(r, d)| (r.map(|r| (r.window, r.value)), d)).collect();
    assert_eq!(
        results,
        vec![
            (Ok((Window::new(900, 901), (1, 1))), 1),
            (Ok((Window::new(900, 921), (2, 5))), 1),
            (Ok((Window::new(920, 951), (2, 6))), 1),
        ]
    );
    assert_eq!(untimed(&run.recovered), untimed(&run.expected));
}

/// Across processes a cut reaches the others late: the process that begins it
/// may send updates past it before the others hear of it. They must hold those
/// back (their gates see the processes choosing a cut) or their snapshots
/// would hold updates the rewound sources send again.
#[test]
fn a_cut_announced_late_holds_back_what_other_workers_sent_past_it() {
    // Every key on every worker, on time, before and well after the cut.
    let input: Vec<Input<Rec>> =
        (0..400u64).map(|i| (((i % 7) as u8, (i % 11) as i64), i * 5, 1, (i * 5).saturating_sub(3))).collect();
    for cut in [500, 1003, 1500] {
        let run = check_recovery_announced_late(&input, cut, 2, 2, |events| {
            events.aggregate_by_key(|r: &Rec| r.0, (Count, Sum::of(|r: &Rec| r.1)))
        });
        assert!(run.unsupported.is_empty(), "unsupported: {:?}", run.unsupported);
        assert!(entries(&run, "AggregateByKey") > 0, "cut {cut}: an empty checkpoint tests nothing");
        assert_eq!(run.recovered, run.expected, "cut {cut}");
    }
}
