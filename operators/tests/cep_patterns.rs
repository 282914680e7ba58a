//! Every quantifier, contiguity mode, negation and skip strategy on small
//! hand-made inputs, with the expected matches worked out from the pattern's
//! definition (and, for looping contiguity, FlinkCEP's documented examples).

use highwater_operators::cep::{AfterMatchSkip, Pattern};
use highwater_operators::prelude::*;
use timely::dataflow::operators::capture::{Capture, Extract};
use timely::dataflow::operators::ToStream;

/// An event: a label (its kind is the first character) and a value.
type Ev = (String, u32);

fn kind(e: &Ev) -> char {
    e.0.chars().next().unwrap_or(' ')
}

fn is(c: char) -> impl Fn(&Ev) -> bool + Send + Sync + 'static {
    move |e| kind(e) == c
}

/// Runs `pattern` over `labels` (one key, times 0, 10, 20, ... unless given
/// as `label@time`); returns the matches (labels joined by spaces, sorted) and
/// the timed-out partial matches with their times.
fn run(pattern: Pattern<Ev>, labels: &str) -> (Vec<String>, Vec<(String, u64)>) {
    let events: Vec<((String, u32), u64, i64)> = labels
        .split_whitespace()
        .enumerate()
        .map(|(i, l)| {
            let (label, time) = match l.split_once('@') {
                Some((label, t)) => (label, t.parse().unwrap()),
                None => (l, i as u64 * 10),
            };
            let value = label.trim_start_matches(|c: char| c.is_alphabetic()).parse().unwrap_or(0);
            ((label.to_owned(), value), time, 1)
        })
        .collect();
    let (matches, timeouts) = timely::example(move |scope| {
        let out = EventStream::new(events.to_stream(scope)).match_pattern(|_| 0u8, pattern).unwrap();
        (out.matches.inner.capture(), out.timeouts.inner.capture())
    });
    let show = |m: &highwater_operators::cep::Match<u8, Ev>| {
        m.steps.iter().flat_map(|(_, es)| es.iter().map(|e| e.0.clone())).collect::<Vec<_>>().join(" ")
    };
    let mut found: Vec<String> = matches.extract().into_iter().flat_map(|(_, d)| d).map(|(m, _, _)| show(&m)).collect();
    found.sort();
    let mut timed_out: Vec<(String, u64)> =
        timeouts.extract().into_iter().flat_map(|(_, d)| d).map(|(m, t, _)| (show(&m), t)).collect();
    timed_out.sort();
    (found, timed_out)
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// FlinkCEP's looping example: `c` followed by `a+` followed by `b`, on `C D A1 A2 A3 D A4 B`.
fn c_a_b() -> Pattern<Ev> {
    Pattern::begin("c").where_(is('c')).followed_by("a").where_(is('a')).one_or_more()
}

const FLINK_INPUT: &str = "c d a1 a2 a3 d a4 b";

#[test]
fn relaxed_looping_takes_every_next_matching_event() {
    let (m, _) = run(c_a_b().followed_by("b").where_(is('b')), FLINK_INPUT);
    assert_eq!(m, sorted(&["c a1 b", "c a1 a2 b", "c a1 a2 a3 b", "c a1 a2 a3 a4 b"]));
}

#[test]
fn consecutive_looping_stops_at_the_first_other_event() {
    let (m, _) = run(c_a_b().consecutive().followed_by("b").where_(is('b')), FLINK_INPUT);
    assert_eq!(m, sorted(&["c a1 b", "c a1 a2 b", "c a1 a2 a3 b"]));
}

#[test]
fn combinations_skip_matching_events_too() {
    let (m, _) = run(c_a_b().allow_combinations().followed_by("b").where_(is('b')), FLINK_INPUT);
    assert_eq!(
        m,
        sorted(&[
            "c a1 b",
            "c a1 a2 b",
            "c a1 a3 b",
            "c a1 a4 b",
            "c a1 a2 a3 b",
            "c a1 a2 a4 b",
            "c a1 a3 a4 b",
            "c a1 a2 a3 a4 b"
        ])
    );
}

#[test]
fn contiguity_between_steps() {
    let a = || Pattern::begin("a").where_(is('a'));
    assert_eq!(run(a().next("b").where_(is('b')), "a c b1 b2").0, Vec::<String>::new());
    assert_eq!(run(a().followed_by("b").where_(is('b')), "a c b1 b2").0, sorted(&["a b1"]));
    assert_eq!(run(a().followed_by_any("b").where_(is('b')), "a c b1 b2").0, sorted(&["a b1", "a b2"]));
    assert_eq!(run(a().next("b").where_(is('b')), "a b1 b2").0, sorted(&["a b1"]));
}

#[test]
fn optional_steps_may_be_left_out() {
    let p = || {
        Pattern::begin("a").where_(is('a')).followed_by("b").where_(is('b')).optional().followed_by("c").where_(is('c'))
    };
    assert_eq!(run(p(), "a c").0, sorted(&["a c"]));
    assert_eq!(run(p(), "a b c").0, sorted(&["a b c", "a c"]));
}

#[test]
fn times_and_ranges() {
    let a = || Pattern::begin("a").where_(is('a'));
    assert_eq!(run(a().times(2), "a1 a2 a3").0, sorted(&["a1 a2", "a2 a3"]));
    assert_eq!(run(a().times_between(2, 3), "a1 a2 a3").0, sorted(&["a1 a2", "a1 a2 a3", "a2 a3"]));
    assert_eq!(run(a().times_or_more(2), "a1 x a2 a3").0, sorted(&["a1 a2", "a1 a2 a3", "a2 a3"]));
    // Zero or more (optional one_or_more) between two steps.
    let p = Pattern::begin("s").where_(is('s')).followed_by("a").where_(is('a')).one_or_more().optional();
    let p = p.followed_by("e").where_(is('e'));
    assert_eq!(run(p, "s a1 e").0, sorted(&["s a1 e", "s e"]));
}

/// `a+` takes values below 10, `b` values of 5 or more: 6 could be either.
fn overlapping() -> Pattern<Ev> {
    Pattern::begin("a").where_(|e: &Ev| e.1 < 10).one_or_more()
}

#[test]
fn greedy_and_reluctant_loops() {
    let b = |p: Pattern<Ev>| p.followed_by("b").where_(|e: &Ev| e.1 >= 5);
    assert_eq!(run(b(overlapping()), "v1 v6 v12").0, sorted(&["v1 v6", "v1 v6 v12", "v6 v12"]));
    assert_eq!(run(b(overlapping().greedy()), "v1 v6 v12").0, sorted(&["v1 v6 v12", "v6 v12"]));
    assert_eq!(run(b(overlapping().reluctant()), "v1 v6 v12").0, sorted(&["v1 v6", "v6 v12"]));
}

#[test]
fn negations_between_steps() {
    let not_next =
        || Pattern::begin("a").where_(is('a')).not_next("b").where_(is('b')).followed_by("c").where_(is('c'));
    assert_eq!(run(not_next(), "a b c").0, Vec::<String>::new());
    assert_eq!(run(not_next(), "a x b c").0, sorted(&["a c"]));
    let not_between =
        || Pattern::begin("a").where_(is('a')).not_followed_by("b").where_(is('b')).followed_by("c").where_(is('c'));
    assert_eq!(run(not_between(), "a x b c").0, Vec::<String>::new());
    assert_eq!(run(not_between(), "a x c").0, sorted(&["a c"]));
}

#[test]
fn a_trailing_negation_waits_for_the_time_bound() {
    let p = || Pattern::begin("a").where_(is('a')).not_followed_by("b").where_(is('b')).within(10);
    assert_eq!(run(p(), "a@0 b@5").0, Vec::<String>::new());
    assert_eq!(run(p(), "a@0 x@5").0, sorted(&["a"]));
    assert_eq!(run(p(), "a@0 b@15").0, sorted(&["a"]));
}

#[test]
fn partial_matches_time_out_at_the_end_of_their_bound() {
    let p = || Pattern::begin("a").where_(is('a')).followed_by("b").where_(is('b')).within(10);
    let (m, t) = run(p(), "a@0 b@15");
    assert!(m.is_empty());
    assert_eq!(t, vec![("a".to_owned(), 9)]);
    let (m, t) = run(p(), "a@0 b@9");
    assert_eq!(m, sorted(&["a b"]));
    assert!(t.is_empty());
}

#[test]
fn skip_strategies() {
    let p = |skip| Pattern::begin("x").where_(is('x')).one_or_more().followed_by("y").where_(is('y')).skip(skip);
    let input = "x1 x2 y";
    assert_eq!(run(p(AfterMatchSkip::NoSkip), input).0, sorted(&["x1 x2 y", "x1 y", "x2 y"]));
    assert_eq!(run(p(AfterMatchSkip::SkipPastLastEvent), input).0, sorted(&["x1 x2 y"]));
    assert_eq!(run(p(AfterMatchSkip::SkipToNext), input).0, sorted(&["x1 x2 y", "x2 y"]));
    assert_eq!(run(p(AfterMatchSkip::SkipToFirst("x".into())), input).0, sorted(&["x1 x2 y", "x1 y", "x2 y"]));
    assert_eq!(run(p(AfterMatchSkip::SkipToLast("x".into())), input).0, sorted(&["x1 x2 y", "x2 y"]));
}

#[test]
fn conditions_can_look_at_earlier_steps() {
    // A small amount, then a larger one than it: s3 l7 matches, s3 l2 does not.
    let p = Pattern::begin("small")
        .where_(|e: &Ev| kind(e) == 's' && e.1 < 5)
        .followed_by_any("large")
        .where_matched(|e: &Ev, m| m.first("small").is_some_and(|s| e.1 > s.1));
    assert_eq!(run(p, "s3 l2 l7").0, sorted(&["s3 l7"]));
}

#[test]
fn events_are_matched_in_event_time_order_whatever_the_arrival_order() {
    let p = Pattern::begin("a").where_(is('a')).next("b").where_(is('b'));
    // b arrives first but happens after a.
    assert_eq!(run(p, "b@20 a@10").0, sorted(&["a b"]));
}

#[test]
fn invalid_patterns_are_refused() {
    let e = |p: Pattern<Ev>| p.validate().unwrap_err().0;
    assert!(e(Pattern::begin("a").not_next("b")).contains("not_next must be followed"));
    assert!(e(Pattern::begin("a").not_followed_by("b")).contains("needs within"));
    assert!(e(Pattern::begin("a").followed_by("a")).contains("used twice"));
    assert!(e(Pattern::begin("a").optional()).contains("at least one event"));
    assert!(e(Pattern::begin("a").skip(AfterMatchSkip::SkipToFirst("z".into()))).contains("`z`"));
    assert!(e(Pattern::begin("a").times_between(3, 2)).contains("maximum"));
}

/// A found match or time-out (its events' labels), its time and its net diff.
type Net = (String, u64, i64);

/// What a capture of match updates yields.
type Captured = std::sync::mpsc::Receiver<
    timely::dataflow::operators::capture::Event<
        u64,
        Vec<highwater_operators::Update<highwater_operators::cep::Match<u8, Ev>>>,
    >,
>;

/// Drives `pattern` (allowed lateness `lateness`) by hand: `Some((label, time))`
/// sends an event, `None` advances the watermark to the next number in `marks`.
fn run_by_hand(
    pattern: Pattern<Ev>,
    lateness: u64,
    steps: Vec<(Option<(&'static str, u64)>, u64)>,
) -> (Vec<Net>, Vec<Net>) {
    use highwater_operators::Update;
    use timely::dataflow::operators::Input;
    let (matches, timeouts) = timely::execute_directly(move |worker| {
        let (mut input, captured) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<Update<Ev>>>();
            let out = EventStream::new(stream).allowed_lateness(lateness).key_by(|_| 0u8).pattern(pattern).unwrap();
            (input, (out.matches.inner.capture(), out.timeouts.inner.capture()))
        });
        for (event, watermark) in steps {
            if let Some((label, time)) = event {
                input.send(((label.to_owned(), 0), time, 1));
            }
            input.advance_to(watermark);
            worker.step();
        }
        drop(input);
        while worker.step() {}
        captured
    });
    let show = |c: Captured| {
        let mut net = std::collections::BTreeMap::new();
        for (m, t, d) in c.extract().into_iter().flat_map(|(_, b)| b) {
            let label = m.steps.iter().flat_map(|(_, es)| es.iter().map(|e| e.0.clone())).collect::<Vec<_>>().join(" ");
            *net.entry((label, t)).or_insert(0i64) += d;
        }
        net.into_iter().filter(|(_, d)| *d != 0).map(|((l, t), d)| (l, t, d)).collect::<Vec<_>>()
    };
    (show(matches), show(timeouts))
}

#[test]
fn a_late_event_corrects_a_match_after_its_key_went_quiet() {
    // A@0 matches `a not_followed_by n within 5` at 4; the late N@3 (within the lateness of 10) retracts it.
    let p = Pattern::begin("a").where_(is('a')).not_followed_by("n").where_(is('n')).within(5);
    let (m, _) = run_by_hand(p.clone(), 10, vec![(Some(("a", 0)), 1), (None, 12)]);
    assert_eq!(m, vec![("a".to_owned(), 4, 1)]);
    let (m, _) = run_by_hand(p, 10, vec![(Some(("a", 0)), 1), (None, 12), (Some(("n", 3)), 12), (None, 20)]);
    assert!(m.is_empty(), "{m:?}");
}

#[test]
fn a_late_event_turns_a_time_out_into_a_match() {
    let p = Pattern::begin("a").where_(is('a')).followed_by("b").where_(is('b')).within(5);
    let (m, t) = run_by_hand(p, 10, vec![(Some(("a", 0)), 1), (None, 12), (Some(("b", 4)), 12), (None, 20)]);
    assert_eq!(m, vec![("a b".to_owned(), 4, 1)]);
    assert!(t.is_empty(), "the time-out of a is retracted: {t:?}");
}

#[test]
fn a_very_long_partial_match_is_freed_without_overflowing_the_stack() {
    let p = Pattern::begin("s")
        .where_(is('s'))
        .next("a")
        .where_(is('a'))
        .one_or_more()
        .consecutive()
        .greedy()
        .next("b")
        .where_(is('b'));
    let input = std::iter::once("s@0".to_owned())
        .chain((1..=200_000).map(|i| format!("a@{i}")))
        .chain(std::iter::once("x@300000".to_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let (m, _) = run(p, &input);
    assert!(m.is_empty());
}
