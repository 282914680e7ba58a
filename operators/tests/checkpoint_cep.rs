//! Pattern matching recovers from a checkpoint: each key's partial matches
//! (with the events they took), its `within` timer, its replay state (with an
//! allowed lateness), and the events waiting for the watermark. The committed
//! output of a run checkpointed at a random cut and recovered on another
//! number of workers equals an uninterrupted run's.

use std::collections::BTreeMap;

use highwater_operators::cep::{AfterMatchSkip, Match, Pattern};
use highwater_operators::checkpoint::memory::{check_recovery, Input, Output};
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// An event: its key, its kind ('a', 'b' or 'c') and an id.
type Ev = (u8, char, u16);

fn is(c: char) -> impl Fn(&Ev) -> bool + Send + Sync + 'static {
    move |e| e.1 == c
}

/// The patterns tried: a sequence with relaxed contiguity, a greedy loop with
/// a skip strategy, a trailing negation (matches complete at the end of their
/// time bound), and strict contiguity; all within a time bound.
fn pattern(which: u8) -> Pattern<Ev> {
    match which % 4 {
        0 => Pattern::begin("a").where_(is('a')).followed_by("b").where_(is('b')).followed_by("c").where_(is('c')),
        1 => Pattern::begin("a")
            .where_(is('a'))
            .one_or_more()
            .greedy()
            .followed_by("b")
            .where_(is('b'))
            .skip(AfterMatchSkip::SkipPastLastEvent),
        2 => Pattern::begin("a").where_(is('a')).not_followed_by("c").where_(is('c')),
        _ => Pattern::begin("a").where_(is('a')).next("b").where_(is('b')),
    }
    .within(150)
}

/// What the tests commit: matches, timed-out partial matches, late events.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
enum Found {
    Match(Match<u8, Ev>),
    Timeout(Match<u8, Ev>),
    Late(Ev),
}

fn matching<'s>(events: &EventStream<'s, Ev>, which: u8, lateness: u64) -> EventStream<'s, Found> {
    let found = if lateness == 0 {
        events.match_pattern(|e| e.0, pattern(which))
    } else {
        events.allowed_lateness(lateness).key_by(|e| e.0).pattern(pattern(which))
    }
    .expect("the patterns are valid");
    found
        .matches
        .map(Found::Match)
        .concat(&found.timeouts.map(Found::Timeout))
        .concat(&found.late.stream.map(Found::Late))
}

/// Random events of a few keys at event times in [0, 1000), arriving up to
/// 200 ms before or 300 ms after their time (some later than any lateness).
fn events() -> impl Strategy<Value = Vec<Input<Ev>>> {
    let kind = prop_oneof![Just('a'), Just('a'), Just('b'), Just('c')];
    prop::collection::vec((0u8..3, kind, 0u64..1000, 0u64..500), 1..80).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(id, (k, kind, time, skew))| ((k, kind, id as u16), time, 1, (time + skew).saturating_sub(200)))
            .collect()
    })
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

/// The output summed over times: what each record nets to.
fn net(output: &Output<Found>) -> BTreeMap<Found, i64> {
    let mut net = BTreeMap::new();
    for ((record, _time), diff) in output {
        *net.entry(record.clone()).or_insert(0) += diff;
    }
    net.retain(|_, d| *d != 0);
    net
}

/// The number of entries the matcher checkpointed.
fn entries(checkpoint: &highwater_operators::checkpoint::memory::MemoryCheckpoint) -> usize {
    checkpoint.entries_of("MatchPattern@")
}

#[test]
fn partial_matches_and_timers_span_the_cut() {
    let input: Vec<Input<Ev>> = vec![
        // Key 1: a sequence begun before the cut (400), completed after it.
        ((1, 'a', 0), 300, 1, 300),
        ((1, 'b', 1), 380, 1, 380),
        ((1, 'c', 2), 440, 1, 440),
        // Key 2: a partial match that times out after the cut.
        ((2, 'a', 3), 350, 1, 350),
        // Key 0: an event that arrives early and waits past the cut.
        ((0, 'a', 4), 700, 1, 200),
        ((0, 'b', 5), 720, 1, 720),
        ((0, 'c', 6), 730, 1, 730),
    ];
    // Each step takes one event, and is named by its kind.
    let matched = |ids: &[usize]| {
        let steps = ids.iter().map(|&i| (input[i].0 .1.to_string().into(), vec![input[i].0])).collect();
        Match { key: input[ids[0]].0 .0, steps }
    };
    for (before, after) in [(1, 2), (2, 1), (2, 2)] {
        let run = check_recovery(&input, 400, before, after, |events| matching(events, 0, 0));
        assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        // Key 1's and key 2's runs, and key 0's waiting event.
        assert!(entries(&run.checkpoint) >= 3, "{:?}", run.checkpoint);
        assert_eq!(run.expected.get(&(Found::Match(matched(&[0, 1, 2])), 440)), Some(&1), "{:?}", run.expected);
        assert_eq!(run.expected.get(&(Found::Match(matched(&[4, 5, 6])), 730)), Some(&1), "{:?}", run.expected);
        let timed_out = Match { key: 2, steps: vec![("a".into(), vec![input[3].0])] };
        assert_eq!(run.expected.get(&(Found::Timeout(timed_out), 499)), Some(&1), "{:?}", run.expected);
        assert_eq!(run.recovered, run.expected);
    }
}

#[test]
fn replay_state_spans_the_cut() {
    // With a lateness of 100: key 1's 'b' at 390 comes after the cut (400)
    // and replays the key's events, completing the sequence begun at 300.
    let input: Vec<Input<Ev>> = vec![
        ((1, 'a', 0), 300, 1, 300),
        ((1, 'c', 1), 395, 1, 395),
        ((1, 'b', 2), 390, 1, 460),
        ((1, 'c', 3), 420, 1, 470),
    ];
    for (before, after) in [(1, 2), (2, 1), (2, 2)] {
        let run = check_recovery(&input, 400, before, after, |events| matching(events, 0, 100));
        assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        assert!(entries(&run.checkpoint) >= 1, "{:?}", run.checkpoint);
        let expected = net(&run.expected);
        assert!(expected.keys().any(|f| matches!(f, Found::Match(m) if m.steps.len() == 3)), "{expected:?}");
        assert_eq!(net(&run.recovered), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn patterns_recover(
        input in events(),
        which in 0u8..4,
        cut in 1u64..1300,
        (before, after) in workers(),
    ) {
        let run = check_recovery(&input, cut, before, after, move |events| matching(events, which, 0));
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn patterns_with_lateness_recover(
        input in events(),
        which in 0u8..4,
        cut in 1u64..1300,
        (before, after) in workers(),
    ) {
        let run = check_recovery(&input, cut, before, after, move |events| matching(events, which, 100));
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(net(&run.recovered), net(&run.expected));
    }
}
