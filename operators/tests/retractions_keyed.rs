//! Updating streams into the keyed operators that retractions.rs does not
//! cover: aligned windows, `aggregate_by_key` and interval joins fed random
//! insertions and later retractions of some of them, against brute-force
//! references computed from the consolidated input, each run checkpointed at
//! a random cut and recovered on another number of workers; and CEP, which
//! matches insertions only: every retraction goes to its late output and the
//! matches are those of the insertions alone.
//!
//! Every update arrives at or before its event time (retractions after the
//! insertions they take back), so nothing is late and the operators' output
//! does not depend on scheduling.

use std::collections::BTreeMap;

use highwater_operators::cep::Pattern;
use highwater_operators::checkpoint::memory::{check_recovery, Input, Output};
use highwater_operators::join::between;
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// (key, value).
type Rec = (u8, i64);

/// Insertions of 3 keys at event times in [1, 400), each arriving up to 60 ms
/// before its time; a third of them taken back by a retraction that arrives
/// later (still on time).
fn changelog() -> impl Strategy<Value = Vec<Input<Rec>>> {
    let update = (0u8..3, 0i64..4, 1u64..400, 0u64..60, 0u32..3, 0u64..60);
    prop::collection::vec(update, 1..80).prop_map(|raw| {
        let mut out = Vec::new();
        for (k, v, time, lead, kind, back) in raw {
            let arrival = time.saturating_sub(lead);
            out.push(((k, v), time, 1, arrival));
            if kind == 0 {
                out.push(((k, v), time, -1, (arrival + back).min(time)));
            }
        }
        out
    })
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

/// The input consolidated: (key, time, value) with net multiplicity > 0.
fn consolidated(input: &[Input<Rec>]) -> BTreeMap<(u8, Timestamp, i64), i64> {
    let mut net = BTreeMap::new();
    for ((k, v), t, d, _) in input {
        *net.entry((*k, *t, *v)).or_insert(0) += d;
    }
    net.retain(|_, d| *d != 0);
    net
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

/// Count and sum per key and 50 ms tumbling window.
fn reference_tumbling(input: &[Input<Rec>]) -> BTreeMap<(u8, Window, (u64, i64)), i64> {
    let mut windows: BTreeMap<(u8, Window), (i64, i64)> = BTreeMap::new();
    for ((k, t, v), m) in consolidated(input) {
        let start = t / 50 * 50;
        let w = windows.entry((k, Window::new(start, start + 50))).or_default();
        w.0 += m;
        w.1 += v * m;
    }
    windows.into_iter().filter(|(_, (n, _))| *n > 0).map(|((k, w), (n, s))| ((k, w, (n as u64, s)), 1)).collect()
}

/// Sum per key over all time.
fn reference_sums(input: &[Input<Rec>]) -> BTreeMap<(u8, i64), i64> {
    let mut sums: BTreeMap<u8, (i64, i64)> = BTreeMap::new();
    for ((k, _t, v), m) in consolidated(input) {
        let s = sums.entry(k).or_default();
        s.0 += m;
        s.1 += v * m;
    }
    sums.into_iter().filter(|(_, (n, _))| *n > 0).map(|(k, (_, s))| ((k, s), 1)).collect()
}

/// Pairs of a left record (even value) and a right one (odd value) of the
/// same key whose right time lies in [left time, left time + 20].
fn reference_join(input: &[Input<Rec>]) -> BTreeMap<(u8, i64, i64), i64> {
    let net = consolidated(input);
    let mut pairs = BTreeMap::new();
    for ((kl, tl, vl), ml) in net.iter().filter(|((_, _, v), _)| v % 2 == 0) {
        for ((kr, tr, vr), mr) in net.iter().filter(|((_, _, v), _)| v % 2 == 1) {
            if kl == kr && *tr >= *tl && *tr <= tl + 20 {
                *pairs.entry((*kl, *vl, *vr)).or_insert(0) += ml * mr;
            }
        }
    }
    pairs.retain(|_, d| *d != 0);
    pairs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn aligned_windows_take_retractions(input in changelog(), cut in 1u64..400, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            let w = events.window(Tumbling::of(50)).key_by(|r: &Rec| r.0).aggregate((Count, Sum::of(|r: &Rec| r.1)));
            w.results.map(|r| (r.key, r.window, r.value))
        });
        prop_assert_eq!(&run.recovered, &run.expected);
        prop_assert_eq!(untimed(&run.expected), reference_tumbling(&input));
    }

    #[test]
    fn aggregate_by_key_takes_retractions(input in changelog(), cut in 1u64..400, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            events.aggregate_by_key(|r: &Rec| r.0, Sum::of(|r: &Rec| r.1))
        });
        prop_assert_eq!(&run.recovered, &run.expected);
        prop_assert_eq!(untimed(&run.expected), reference_sums(&input));
    }

    #[test]
    fn interval_joins_take_retractions(input in changelog(), cut in 1u64..400, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            let left = events.filter(|r: &Rec| r.1 % 2 == 0);
            let right = events.filter(|r: &Rec| r.1 % 2 == 1);
            left.interval_join(&right, |l: &Rec| l.0, |r: &Rec| r.0, between(0, 20), |l, r| (l.0, l.1, r.1)).results
        });
        prop_assert_eq!(&run.recovered, &run.expected);
        prop_assert_eq!(untimed(&run.expected), reference_join(&input));
    }

    #[test]
    fn cep_sends_retractions_to_its_late_output(input in changelog(), cut in 1u64..400, (before, after) in workers()) {
        // An even value followed by an odd one of the same key within 30 ms.
        let pattern = || {
            Pattern::begin("even").where_(|r: &Rec| r.1 % 2 == 0).followed_by("odd").where_(|r: &Rec| r.1 % 2 == 1).within(30)
        };
        let run = check_recovery(&input, cut, before, after, move |events| {
            let m = events.match_pattern(|r: &Rec| r.0, pattern()).expect("a valid pattern");
            let matches = m.matches.map(|m| Ok(format!("{m:?}")));
            matches.concat(&m.late.stream.map(Err))
        });
        prop_assert_eq!(&run.recovered, &run.expected);
        let insertions: Vec<Input<Rec>> = input.iter().filter(|u| u.2 > 0).cloned().collect();
        let alone = check_recovery(&insertions, cut, before, after, move |events| {
            let m = events.match_pattern(|r: &Rec| r.0, pattern()).expect("a valid pattern");
            m.matches.map(|m| Ok::<String, Rec>(format!("{m:?}")))
        });
        let (mut matches, mut late) = (BTreeMap::new(), BTreeMap::new());
        for (o, d) in untimed(&run.expected) {
            match o {
                Ok(m) => *matches.entry(m).or_insert(0) += d,
                Err(r) => *late.entry(r).or_insert(0) += d,
            }
        }
        let alone: BTreeMap<String, i64> =
            untimed(&alone.expected).into_iter().map(|(o, d)| (o.expect("matches only"), d)).collect();
        prop_assert_eq!(matches, alone, "retractions do not change the matches");
        let mut retracted = BTreeMap::new();
        for (r, _, d, _) in input.iter().filter(|u| u.2 < 0) {
            *retracted.entry(*r).or_insert(0) += d;
        }
        prop_assert_eq!(late, retracted, "every retraction is on the late output");
    }
}
