//! The text form of CEP patterns (`highwater::cep`) and `highwater cep`.
//!
//! - every construct of the language compiles to the pattern the builder
//!   makes (same steps, quantifiers, contiguity, greed, bound and skip);
//! - conditions evaluate as documented (types, nulls, references);
//! - bad texts give errors that say where and what was expected;
//! - text and builder patterns give identical matches and time-outs on
//!   random events;
//! - the examples in `examples/cep/` give their expected output at 1 and 2
//!   workers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use highwater::cep::{compile, CepError, Position};
use highwater_operators::cep::{AfterMatchSkip, Match, Pattern};
use highwater_operators::EventStream;
use serde_json::{json, Value};
use timely::dataflow::operators::capture::{Capture, Event};
use timely::dataflow::operators::ToStream;

type P = Pattern<Value>;

/// The text compiles to the same pattern structure as `built`.
#[track_caller]
fn same(text: &str, built: P) {
    let p = compile(text).unwrap_or_else(|e| panic!("{text}: {e}")).pattern();
    assert_eq!(format!("{p:?}"), format!("{built:?}"), "{text}");
}

fn begin(name: &str) -> P {
    Pattern::begin(name)
}

#[test]
fn contiguity_between_steps() {
    same("PATTERN (a b)", begin("a").followed_by("b"));
    same("PATTERN (a . b)", begin("a").next("b"));
    same("PATTERN (a.b)", begin("a").next("b"));
    same("PATTERN (a ~ b)", begin("a").followed_by_any("b"));
    same("PATTERN (a b . c ~ d)", begin("a").followed_by("b").next("c").followed_by_any("d"));
}

#[test]
fn negations() {
    same("PATTERN (a !b c)", begin("a").not_followed_by("b").followed_by("c"));
    same("PATTERN (a . !b c)", begin("a").not_next("b").followed_by("c"));
    same("PATTERN (a.!b.c)", begin("a").not_next("b").next("c"));
    same("PATTERN (a !b) WITHIN 5s", begin("a").not_followed_by("b").within(5_000));
}

#[test]
fn quantifiers() {
    same("PATTERN (a? b)", begin("a").optional().followed_by("b"));
    same("PATTERN (a+)", begin("a").one_or_more());
    same("PATTERN (a* b)", begin("a").one_or_more().optional().followed_by("b"));
    same("PATTERN (a{3})", begin("a").times(3));
    same("PATTERN (a{2,4})", begin("a").times_between(2, 4));
    same("PATTERN (a{2,})", begin("a").times_or_more(2));
    same("PATTERN (a{0,2} b)", begin("a").times_between(0, 2).followed_by("b"));
    same("PATTERN (a { 2 , 4 })", begin("a").times_between(2, 4));
}

#[test]
fn greed() {
    same("PATTERN (a+? b)", begin("a").one_or_more().reluctant().followed_by("b"));
    same("PATTERN (a++ b)", begin("a").one_or_more().greedy().followed_by("b"));
    same("PATTERN (a*? b)", begin("a").one_or_more().optional().reluctant().followed_by("b"));
    same("PATTERN (a{2,}+ b)", begin("a").times_or_more(2).greedy().followed_by("b"));
    same("PATTERN (a{1,3}? b)", begin("a").times_between(1, 3).reluctant().followed_by("b"));
    same("PATTERN (a?? b)", begin("a").optional().reluctant().followed_by("b"));
}

#[test]
fn inner_contiguity() {
    same("PATTERN (a{3} CONSECUTIVE)", begin("a").times(3).consecutive());
    same("PATTERN (a+ COMBINATIONS b)", begin("a").one_or_more().allow_combinations().followed_by("b"));
    same("PATTERN (a++ consecutive . b)", begin("a").one_or_more().greedy().consecutive().next("b"));
}

#[test]
fn within_units() {
    for (text, ms) in [
        ("250ms", 250),
        ("60s", 60_000),
        ("60 sec", 60_000),
        ("5m", 300_000),
        ("30min", 1_800_000),
        ("1h", 3_600_000),
        ("2 hours", 7_200_000),
        ("1d", 86_400_000),
        ("1.5s", 1_500),
    ] {
        same(&format!("PATTERN (a b) WITHIN {text}"), begin("a").followed_by("b").within(ms));
    }
}

#[test]
fn skip_strategies() {
    let base = || begin("a").one_or_more().followed_by("b");
    same("PATTERN (a+ b)", base().skip(AfterMatchSkip::NoSkip));
    same("PATTERN (a+ b) AFTER MATCH SKIP NONE", base().skip(AfterMatchSkip::NoSkip));
    same("PATTERN (a+ b) AFTER MATCH SKIP PAST LAST ROW", base().skip(AfterMatchSkip::SkipPastLastEvent));
    same("PATTERN (a+ b) AFTER MATCH SKIP TO NEXT ROW", base().skip(AfterMatchSkip::SkipToNext));
    same("PATTERN (a+ b) AFTER MATCH SKIP TO FIRST a", base().skip(AfterMatchSkip::SkipToFirst("a".into())));
    same("PATTERN (a+ b) AFTER MATCH SKIP TO LAST a", base().skip(AfterMatchSkip::SkipToLast("a".into())));
    same("PATTERN (a+ b) AFTER MATCH SKIP TO b", base().skip(AfterMatchSkip::SkipToLast("b".into())));
    // A step may be called like a keyword.
    same(
        "PATTERN (next+ last) AFTER MATCH SKIP TO FIRST last",
        begin("next").one_or_more().followed_by("last").skip(AfterMatchSkip::SkipToFirst("last".into())),
    );
}

#[test]
fn clauses_in_any_order_keywords_in_any_case_comments_and_quoted_names() {
    let built = begin("fail").one_or_more().followed_by("reset").within(60_000).skip(AfterMatchSkip::SkipPastLastEvent);
    same(
        "-- a comment\nDEFINE fail AS kind = 'f' -- another\nafter match skip past last row\nwithin 60s pattern (fail+ reset)",
        built.clone(),
    );
    same("PATTERN (\"fail\"+ \"reset\") WITHIN 1m AFTER MATCH SKIP PAST LAST ROW", built);
    same("PATTERN (\"two words\" \"CONSECUTIVE\")", begin("two words").followed_by("CONSECUTIVE"));
}

/// `holds` of a one-step pattern `a` defined by `condition`.
#[track_caller]
fn holds(condition: &str, event: Value) -> bool {
    let program =
        compile(&format!("PATTERN (a) DEFINE a AS {condition}")).unwrap_or_else(|e| panic!("{condition}: {e}"));
    program.holds("a", &event, &[]).unwrap()
}

#[test]
fn comparisons_and_literals() {
    let e = json!({"kind": "view", "n": 3, "x": 2.5, "ok": true, "none": null, "q": "it's"});
    assert!(holds("kind = 'view'", e.clone()));
    assert!(!holds("kind = 'View'", e.clone()));
    assert!(holds("kind != 'buy' AND kind <> 'sell'", e.clone()));
    assert!(holds("n = 3 AND n = 3.0 AND n >= 3 AND n <= 3 AND n > 2 AND n < 4", e.clone()));
    assert!(holds("x > 2.4 AND x < 2.6 AND x > -1 AND x = 25e-1", e.clone()));
    assert!(holds("kind > 'abc' AND kind < 'w'", e.clone()));
    assert!(holds("ok", e.clone()));
    assert!(holds("ok = true AND NOT ok = false", e.clone()));
    assert!(holds("q = 'it''s'", e.clone()));
    assert!(holds("TRUE", e.clone()));
    assert!(!holds("false", e.clone()));
    assert!(!holds("kind", e.clone()), "a string field is not a condition that holds");
}

#[test]
fn different_types_and_nulls_compare_false() {
    let e = json!({"n": 3, "s": "3", "none": null});
    assert!(!holds("n = '3'", e.clone()));
    assert!(!holds("n != '3'", e.clone()));
    assert!(!holds("s > 2", e.clone()));
    assert!(!holds("missing = 1", e.clone()));
    assert!(!holds("missing != 1", e.clone()));
    assert!(!holds("none = null", e.clone()));
    assert!(holds("none IS NULL AND missing IS NULL AND n IS NOT NULL", e.clone()));
    assert!(holds("NOT missing = 1", e.clone()));
    assert!(!holds("missing.deeper.still = 1", e.clone()));
    assert!(holds("missing.deeper IS NULL", e));
}

#[test]
fn paths() {
    let e = json!({"user": {"country": "FR", "tags": ["a", "b"]}, "in": 1, "odd key": {"x": 5}});
    assert!(holds("user.country = 'FR'", e.clone()));
    assert!(holds("user.tags[1] = 'b'", e.clone()));
    assert!(holds("user.tags[2] IS NULL", e.clone()));
    assert!(holds("\"in\" = 1", e.clone()));
    assert!(holds("\"odd key\".x = 5", e.clone()));
    assert!(holds("user.tags = user.tags", e.clone()));
    assert!(!holds("user.tags < user.tags", e));
}

#[test]
fn arithmetic() {
    let e = json!({"a": 7, "b": 2, "s": "x"});
    assert!(holds("a + b = 9 AND a - b = 5 AND a * b = 14 AND a / b = 3.5 AND a % b = 1", e.clone()));
    assert!(holds("a + b * 2 = 11 AND (a + b) * 2 = 18", e.clone()));
    assert!(holds("-a = -7 AND - -a = 7 AND a - -1 = 8", e.clone()));
    assert!(holds("(a / 0) IS NULL", e.clone()));
    assert!(holds("(s + 1) IS NULL", e.clone()));
    assert!(!holds("s + 1 = 1", e));
}

#[test]
fn in_lists_and_logic() {
    let e = json!({"kind": "b", "n": 2});
    assert!(holds("kind IN ('a', 'b')", e.clone()));
    assert!(!holds("kind IN ('a', 'c')", e.clone()));
    assert!(holds("kind NOT IN ('a', 'c')", e.clone()));
    assert!(holds("n IN (1, 2, 3)", e.clone()));
    assert!(!holds("n IN ('2')", e.clone()));
    assert!(holds("n IN (1 + 1)", e.clone()));
    // AND binds tighter than OR; NOT tighter than AND.
    assert!(holds("kind = 'x' AND n = 1 OR n = 2", e.clone()));
    assert!(!holds("kind = 'x' AND (n = 1 OR n = 2)", e.clone()));
    assert!(holds("NOT kind = 'x' AND n = 2", e.clone()));
    assert!(!holds("NOT (kind = 'b' AND n = 2)", e.clone()));
    assert!(holds("not kind = 'a' and not (n > 5 or n < 0)", e));
}

#[test]
fn references_to_taken_events() {
    let program = compile(
        "PATTERN (a+ b c) DEFINE
           a AS count(a) = 0 OR amount > last(a).amount,
           b AS amount > first(a).amount * 2 AND country != last(a).country,
           c AS prev.amount = 100 AND count(a) = 2",
    )
    .unwrap();
    assert_eq!(program.holds("a", &json!({"amount": 5}), &[]), Some(true));
    let taken = [("a", json!({"amount": 5, "country": "US"}))];
    assert_eq!(program.holds("a", &json!({"amount": 6}), &taken), Some(true));
    assert_eq!(program.holds("a", &json!({"amount": 4}), &taken), Some(false));
    let taken = [("a", json!({"amount": 5, "country": "US"})), ("a", json!({"amount": 8, "country": "DE"}))];
    assert_eq!(program.holds("b", &json!({"amount": 11, "country": "US"}), &taken), Some(true));
    assert_eq!(program.holds("b", &json!({"amount": 11, "country": "DE"}), &taken), Some(false));
    assert_eq!(program.holds("b", &json!({"amount": 9, "country": "US"}), &taken), Some(false));
    let mut all = taken.to_vec();
    all.push(("b", json!({"amount": 100})));
    assert_eq!(program.holds("c", &json!({}), &all), Some(true));
    assert_eq!(program.holds("c", &json!({}), &taken), Some(false), "prev is the last a");
    // A step without DEFINE takes every event.
    let program = compile("PATTERN (a b) DEFINE a AS x = 1").unwrap();
    assert_eq!(program.holds("b", &json!("anything"), &[]), Some(true));
}

#[track_caller]
fn error(text: &str) -> String {
    match compile(text) {
        Ok(p) => panic!("{text:?} compiled: {p:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn syntax_errors_say_where_and_what_was_expected() {
    let cases = [
        ("PATTERN (a b", "line 1, column 13: expected a step name, '.', '~', '!' or ')' after 'b', found the end of the text"),
        ("PATTERN (a, b)", "line 1, column 11: expected a step name, '.', '~', '!' or ')' after 'a', found ','"),
        (
            "PATTERN (fail reset)\nDEFINE fail AS kind = 'login_failed', )",
            "line 2, column 39: expected a step name after ',', found ')'",
        ),
        ("PATTERN ()", "line 1, column 10: expected a step name after '(', found ')'"),
        ("PATTERN a b", "line 1, column 9: expected '(' after 'PATTERN', found 'a'"),
        (
            "PATTERN (a b) WITHIN 60",
            "line 1, column 24: expected a unit (ms, s, m, min, h or d) after 60, found the end of the text",
        ),
        (
            "PATTERN (a b) WITHIN 60 parsecs",
            "line 1, column 25: expected a unit (ms, s, m, min, h or d) after 60, found 'parsecs'",
        ),
        ("PATTERN (a b) WITHIN soon", "line 1, column 22: expected a duration such as 60s, 5m or 250ms after 'WITHIN', found 'soon'"),
        ("PATTERN (a{2,x})", "line 1, column 14: expected a whole number or '}' after ',', found 'x'"),
        ("PATTERN (a{2.5})", "line 1, column 12: expected a whole number after '{', found 2.5"),
        (
            "PATTERN (a b)\nDEFINE a AS x = 1\n       b AS x = 2",
            "line 3, column 8: expected ',' between two definitions after 1, found 'b'",
        ),
        ("PATTERN (a) DEFINE a AS x = = 1", "line 1, column 29: expected a value (a field, a literal, first(step).field, last(step).field, prev.field, count(step) or '(') after '=', found '='"),
        ("PATTERN (a) DEFINE a AS 1 < x < 3", "line 1, column 31: comparisons cannot be chained: join them with AND (found '<')"),
        ("PATTERN (a) DEFINE a AS kind IN 'x'", "line 1, column 33: expected '(' after 'IN', found the string 'x'"),
        ("PATTERN (a) DEFINE a AS kind = 'x", "line 1, column 32: this string is not closed: expected ' before the end of the text"),
        ("PATTERN (a) DEFINE a AS (x = 1", "line 1, column 31: expected ')' after 1, found the end of the text"),
        ("PATTERN (a) DEFINE a AS x IS 1", "line 1, column 30: expected NULL after 'IS', found 1"),
        ("PATTERN (a) $", "line 1, column 13: unexpected character '$'"),
        ("PATTERN (a) AFTER MATCH SKIP TO", "line 1, column 32: expected NEXT ROW, FIRST step, LAST step or a step name after 'TO', found the end of the text"),
        ("PATTERN (a) AFTER SKIP", "line 1, column 19: expected MATCH after 'AFTER', found 'SKIP'"),
        ("PATTERN (a) FROM events", "line 1, column 13: expected a clause (PATTERN, WITHIN, AFTER MATCH SKIP, DEFINE) after ')', found 'FROM'"),
        ("PATTERN (a (b c))", "line 1, column 12: groups are not supported in PATTERN: expected a step name, found '('"),
        ("PATTERN (a CONSECUTIVE)", "line 1, column 12: CONSECUTIVE and COMBINATIONS apply to a repeated step (such as a+ or a{3})"),
    ];
    for (text, want) in cases {
        assert_eq!(error(text), want, "{text:?}");
    }
    assert!(matches!(compile("PATTERN (a b"), Err(CepError::Syntax { at: Position { line: 1, column: 13 }, .. })));
}

#[test]
fn invalid_patterns_say_where_and_why() {
    let cases = [
        ("WITHIN 5s", "line 1, column 1: the text has no PATTERN clause (e.g. PATTERN (a b))"),
        ("PATTERN (a b)\nPATTERN (c)", "line 2, column 1: PATTERN is given twice"),
        ("PATTERN (a b a)", "line 1, column 14: step 'a' appears twice in PATTERN (first at line 1, column 10)"),
        (
            "PATTERN (a b)\nDEFINE a AS x = 1,\n       c AS x = 2",
            "line 3, column 8: DEFINE names step 'c', which PATTERN does not have (its steps: a, b)",
        ),
        ("PATTERN (a b) DEFINE a AS x = 1, a AS x = 2", "line 1, column 34: step 'a' is defined twice"),
        ("PATTERN (a{2,1} b)", "line 1, column 11: the maximum count 1 is less than the minimum 2"),
        ("PATTERN (a{0} b)", "line 1, column 11: a step must take at least one event: {0} never matches"),
        ("PATTERN (!a b)", "line 1, column 11: a pattern cannot begin with a negation ('!a')"),
        ("PATTERN (a !b+ c) WITHIN 1m", "line 1, column 14: a negation ('!b') cannot be quantified"),
        ("PATTERN (a ~ !b c)", "line 1, column 12: '~' cannot come before a negation: write '!b' (not followed by) or '. !b' (not next)"),
        ("PATTERN (a !b)", "line 1, column 13: a pattern that ends with a negation ('!b') needs WITHIN: how long must it not happen?"),
        ("PATTERN (a !b c?)", "line 1, column 13: a pattern that ends with a negation ('!b') needs WITHIN: how long must it not happen?"),
        ("PATTERN (a . !b) WITHIN 1m", "line 1, column 12: a strict negation ('. !b') must be followed by a step that takes an event"),
        ("PATTERN (a? b*)", "line 1, column 1: every step of PATTERN is optional or a negation: a match must take an event"),
        ("PATTERN (a b) AFTER MATCH SKIP TO FIRST c", "line 1, column 41: AFTER MATCH SKIP names step 'c', which is not in PATTERN (its steps: a, b)"),
        ("PATTERN (a !b c) WITHIN 1m AFTER MATCH SKIP TO LAST b", "line 1, column 53: AFTER MATCH SKIP names step 'b', which is a negation (its steps: a, b, c)"),
        ("PATTERN (a b) DEFINE a AS first(b).x = 1", "line 1, column 33: step 'b' comes after 'a': it has taken no events when 'a' is tested"),
        ("PATTERN (a b) DEFINE b AS last(z).x = 1", "line 1, column 32: step 'z' is not in PATTERN (its steps: a, b)"),
        ("PATTERN (a !n b) DEFINE b AS count(n) = 0", "line 1, column 36: step 'n' is a negation: it never takes events to refer to"),
        ("PATTERN (a) DEFINE a AS amount + 1", "line 1, column 25: the condition of step 'a' is arithmetic: expected something true or false (a comparison, IN, IS NULL, AND, OR, NOT)"),
        ("PATTERN (a) DEFINE a AS x = 1 AND 5", "line 1, column 35: AND needs conditions on both sides, found a number"),
        ("PATTERN (a b) WITHIN 0s", "line 1, column 22: WITHIN 0s is not a positive whole number of milliseconds"),
    ];
    for (text, want) in cases {
        assert_eq!(error(text), want, "{text:?}");
    }
}

// ---- text and builder give the same matches ----

/// A small deterministic random generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random events of 3 users: kinds a, b, c; an amount; a country; times
/// within 20 s (with ties), listed out of order.
fn random_events(seed: u64, n: usize) -> Vec<(Value, u64, i64)> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut events: Vec<(Value, u64, i64)> = (0..n)
        .map(|i| {
            let time = rng.below(20) * 1_000;
            let kind = ["a", "b", "c"][rng.below(3) as usize];
            let country = ["US", "FR"][rng.below(2) as usize];
            let event = json!({
                "id": i,
                "user": format!("u{}", rng.below(3)),
                "kind": kind,
                "amount": rng.below(100),
                "country": country,
                "time": time,
            });
            (event, time, 1)
        })
        .collect();
    // Keep the arrival order random, but the order of ties stable (sorted by id)
    // so that both runs see the same sequence per key.
    events.sort_by_key(|(e, t, _)| (*t, e["id"].as_u64()));
    for i in (1..events.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        events.swap(i, j);
    }
    events
}

type Found = (Vec<(String, u64)>, Vec<(String, u64)>);

/// What `capture` delivers: batches of matches with their times.
type Captured = std::sync::mpsc::Receiver<Event<u64, Vec<(Match<String, Value>, u64, i64)>>>;

/// Runs `pattern` over `events` keyed by user: (matches, time-outs), each as
/// (JSON of the match, time), sorted.
fn run(pattern: P, events: Vec<(Value, u64, i64)>) -> Found {
    let (matches, timeouts) = timely::example(move |scope| {
        let found = EventStream::new(events.to_stream(scope))
            .match_pattern(|e: &Value| e["user"].as_str().unwrap_or("").to_owned(), pattern)
            .expect("a valid pattern");
        (found.matches.inner.capture(), found.timeouts.inner.capture())
    });
    let flat = |events: Captured| {
        let mut out: Vec<(String, u64)> = events
            .try_iter()
            .flat_map(|e| match e {
                Event::Messages(_, d) => d,
                Event::Progress(_) => Vec::new(),
            })
            .map(|(m, t, _)| (serde_json::to_string(&(&m.key, &m.steps)).unwrap(), t))
            .collect();
        out.sort();
        out
    };
    (flat(matches), flat(timeouts))
}

fn kind(k: &'static str) -> impl Fn(&Value) -> bool + Send + Sync + 'static {
    move |e| e["kind"] == k
}

fn amount(e: &Value) -> f64 {
    e["amount"].as_f64().unwrap_or(f64::NAN)
}

#[track_caller]
fn equivalent(text: &str, built: impl Fn() -> P) {
    let program = compile(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let mut matched = 0;
    for seed in 1..=6 {
        let events = random_events(seed, 60);
        let from_text = run(program.pattern(), events.clone());
        let from_builder = run(built(), events);
        assert_eq!(from_text, from_builder, "{text} (seed {seed})");
        matched += from_text.0.len();
    }
    assert!(matched > 0, "{text}: no matches at all, the comparison says little");
}

/// `DEFINE x AS kind = 'x', …` for the steps named by the letters of `steps`.
fn kinds(steps: &str) -> String {
    let defs: Vec<String> = steps.chars().map(|c| format!("{c} AS kind = '{c}'")).collect();
    format!("DEFINE {}", defs.join(", "))
}

#[test]
fn same_matches_contiguity() {
    equivalent(&format!("PATTERN (a b) WITHIN 5s {}", kinds("ab")), || {
        begin("a").where_(kind("a")).followed_by("b").where_(kind("b")).within(5_000)
    });
    equivalent(&format!("PATTERN (a . b) {}", kinds("ab")), || {
        begin("a").where_(kind("a")).next("b").where_(kind("b"))
    });
    equivalent(&format!("PATTERN (a ~ b c) WITHIN 4s {}", kinds("abc")), || {
        begin("a")
            .where_(kind("a"))
            .followed_by_any("b")
            .where_(kind("b"))
            .followed_by("c")
            .where_(kind("c"))
            .within(4_000)
    });
}

#[test]
fn same_matches_quantifiers_and_greed() {
    equivalent(&format!("PATTERN (a+ b) WITHIN 6s {}", kinds("ab")), || {
        begin("a").where_(kind("a")).one_or_more().followed_by("b").where_(kind("b")).within(6_000)
    });
    equivalent(&format!("PATTERN (a{{2,3}}? b) WITHIN 8s {}", kinds("ab")), || {
        begin("a").where_(kind("a")).times_between(2, 3).reluctant().followed_by("b").where_(kind("b")).within(8_000)
    });
    equivalent(&format!("PATTERN (a++ b) WITHIN 8s {}", kinds("ab")), || {
        begin("a").where_(kind("a")).one_or_more().greedy().followed_by("b").where_(kind("b")).within(8_000)
    });
    equivalent(&format!("PATTERN (c a* b) WITHIN 8s {}", kinds("abc")), || {
        begin("c")
            .where_(kind("c"))
            .followed_by("a")
            .where_(kind("a"))
            .one_or_more()
            .optional()
            .followed_by("b")
            .where_(kind("b"))
            .within(8_000)
    });
    equivalent(&format!("PATTERN (a{{2}} CONSECUTIVE b? c) WITHIN 10s {}", kinds("abc")), || {
        begin("a")
            .where_(kind("a"))
            .times(2)
            .consecutive()
            .followed_by("b")
            .where_(kind("b"))
            .optional()
            .followed_by("c")
            .where_(kind("c"))
            .within(10_000)
    });
    equivalent(&format!("PATTERN (a{{2,}} COMBINATIONS b) WITHIN 5s {}", kinds("ab")), || {
        begin("a")
            .where_(kind("a"))
            .times_or_more(2)
            .allow_combinations()
            .followed_by("b")
            .where_(kind("b"))
            .within(5_000)
    });
}

#[test]
fn same_matches_negations() {
    equivalent(&format!("PATTERN (a !c b) WITHIN 5s {}", kinds("abc")), || {
        begin("a")
            .where_(kind("a"))
            .not_followed_by("c")
            .where_(kind("c"))
            .followed_by("b")
            .where_(kind("b"))
            .within(5_000)
    });
    equivalent(&format!("PATTERN (a . !c b) WITHIN 5s {}", kinds("abc")), || {
        begin("a").where_(kind("a")).not_next("c").where_(kind("c")).followed_by("b").where_(kind("b")).within(5_000)
    });
    equivalent(&format!("PATTERN (a b !c) WITHIN 4s {}", kinds("abc")), || {
        begin("a")
            .where_(kind("a"))
            .followed_by("b")
            .where_(kind("b"))
            .not_followed_by("c")
            .where_(kind("c"))
            .within(4_000)
    });
}

#[test]
fn same_matches_skip_strategies() {
    let base = || begin("a").where_(kind("a")).one_or_more().followed_by("b").where_(kind("b")).within(6_000);
    for (clause, skip) in [
        ("PAST LAST ROW", AfterMatchSkip::SkipPastLastEvent),
        ("TO NEXT ROW", AfterMatchSkip::SkipToNext),
        ("TO FIRST a", AfterMatchSkip::SkipToFirst("a".into())),
        ("TO LAST a", AfterMatchSkip::SkipToLast("a".into())),
    ] {
        equivalent(&format!("PATTERN (a+ b) WITHIN 6s AFTER MATCH SKIP {clause} {}", kinds("ab")), || {
            base().skip(skip.clone())
        });
    }
}

#[test]
fn same_matches_conditions_with_references() {
    equivalent(
        "PATTERN (small large) WITHIN 10s
         DEFINE small AS amount < 30, large AS amount > 60 AND country != first(small).country",
        || {
            begin("small")
                .where_(|e| amount(e) < 30.0)
                .followed_by("large")
                .where_matched(|e, m| {
                    amount(e) > 60.0 && m.first("small").is_some_and(|s| s["country"] != e["country"])
                })
                .within(10_000)
        },
    );
    equivalent(
        "PATTERN (up{2,} down) WITHIN 10s
         DEFINE up AS count(up) = 0 OR amount > last(up).amount,
                down AS amount * 2 < prev.amount AND kind IN ('a', 'b')",
        || {
            begin("up")
                .where_matched(|e, m| m.last("up").is_none_or(|l| amount(e) > amount(l)))
                .times_or_more(2)
                .followed_by("down")
                .where_matched(|e, m| {
                    m.events().last().is_some_and(|p| amount(e) * 2.0 < amount(p))
                        && (e["kind"] == "a" || e["kind"] == "b")
                })
                .within(10_000)
        },
    );
}

// ---- golden tests of `highwater cep` on the examples ----

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cep").join(name)
}

/// Runs `highwater` with `args`; returns (success, stdout, stderr).
fn highwater(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_highwater")).args(args).output().expect("running highwater");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn golden(name: &str, extra: &[&str], summary: &str) {
    let want = std::fs::read_to_string(example(&format!("{name}.expected.jsonl"))).unwrap();
    let (pattern, input) = (example(&format!("{name}.cep")), example(&format!("{name}.jsonl")));
    for workers in ["1", "2"] {
        let mut args = vec!["cep", "--pattern", pattern.to_str().unwrap(), "--input", input.to_str().unwrap()];
        args.extend(extra);
        args.extend(["--", "-w", workers]);
        let (ok, stdout, stderr) = highwater(&args);
        assert!(ok, "{name} at {workers} workers failed: {stderr}");
        assert_eq!(stdout, want, "{name} at {workers} workers differs from {name}.expected.jsonl");
        assert!(stderr.contains(summary), "{name}: summary {summary:?} missing from {stderr:?}");
    }
}

#[test]
fn golden_login_reset() {
    golden("login_reset", &["--key", "user"], "events=13 matches=3 timeouts=1 late=0 dead_letters=0");
}

#[test]
fn golden_cart_payment() {
    golden(
        "cart_payment",
        &["--key", "customer.id", "--time-field", "ts"],
        "events=9 matches=2 timeouts=2 late=0 dead_letters=0",
    );
}

#[test]
fn golden_cart_abandonment() {
    golden("cart_abandonment", &["--key", "user"], "events=18 matches=2 timeouts=7 late=0 dead_letters=0");
}

#[test]
fn golden_fraud() {
    golden("fraud", &["--key", "card"], "events=10 matches=2 timeouts=2 late=0 dead_letters=0");
}

fn temp(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("highwater-cep-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn timeouts_are_printed_on_request() {
    let (pattern, input) = (example("cart_abandonment.cep"), example("cart_abandonment.jsonl"));
    for workers in ["1", "2"] {
        let (ok, stdout, stderr) = highwater(&[
            "cep",
            "--pattern",
            pattern.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--key",
            "user",
            "--timeouts",
            "--",
            "-w",
            workers,
        ]);
        assert!(ok, "{stderr}");
        let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 9);
        assert_eq!(lines.iter().filter(|l| l["timed_out"] == true).count(), 7);
        let matches: Vec<&Value> = lines.iter().filter(|l| l.get("timed_out").is_none()).collect();
        assert_eq!(matches.iter().map(|m| m["key"].as_str().unwrap()).collect::<Vec<_>>(), vec!["u1", "u5"]);
        // u3 viewed twice and bought: a timed-out partial match of two views.
        assert!(lines.iter().any(|l| l["key"] == "u3" && l["match"]["view"].as_array().map(Vec::len) == Some(2)));
    }
}

#[test]
fn stdin_and_output_file() {
    let input = std::fs::read(example("fraud.jsonl")).unwrap();
    let out = std::env::temp_dir().join(format!("highwater-cep-{}-fraud-out.jsonl", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["cep", "--pattern", example("fraud.cep").to_str().unwrap(), "--input", "-", "--key", "card"])
        .args(["--output", out.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
    let result = child.wait_with_output().unwrap();
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    assert!(result.stdout.is_empty());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(example("fraud.expected.jsonl")).unwrap()
    );
    let _ = std::fs::remove_file(out);
}

#[test]
fn bad_events_are_dead_letters_with_reasons() {
    let input = temp(
        "bad.jsonl",
        concat!(
            "{\"user\":\"u1\",\"time\":1000,\"kind\":\"login_failed\"}\n",
            "{\"time\":2000,\"kind\":\"login_failed\"}\n",
            "{\"user\":{\"id\":1},\"time\":2000}\n",
            "{\"user\":\"u1\",\"time\":\"yesterday\"}\n",
            "{\"user\":\"u1\",\"time\":-5}\n",
            "{\"user\":\"u1\",\"kind\":\"password_reset\"}\n",
            "not json at all\n",
            "\n",
            "{\"user\":\"u1\",\"time\":3000,\"kind\":\"password_reset\"}\n",
        ),
    );
    let pattern = example("login_reset.cep");
    let (ok, stdout, stderr) = highwater(&[
        "cep",
        "--pattern",
        pattern.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--key",
        "user",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    for reason in [
        "no key: field user is missing or null",
        "invalid key: field user is an object; expected a string, a number or a boolean",
        "invalid event time: field time is a string; expected whole milliseconds since the epoch",
        "invalid event time: field time is not a whole number ≥ 0; expected whole milliseconds since the epoch",
        "no event time: field time is missing or null",
        "invalid JSON: expected ident at line 1 column 2",
    ] {
        assert!(stderr.contains(reason), "{reason:?} missing from {stderr}");
    }
    assert!(stderr.contains("events=2 matches=1 timeouts=0 late=0 dead_letters=6"), "{stderr}");
    let _ = std::fs::remove_file(input);
}

#[test]
fn late_events_are_counted() {
    // A file is read 4096 lines at a time and the watermark advances between
    // reads: the event at 1 s, read after 4096 events at 100 s, is late.
    let mut text = String::new();
    for _ in 0..4096 {
        text.push_str("{\"user\":\"filler\",\"time\":100000,\"kind\":\"noise\"}\n");
    }
    text.push_str("{\"user\":\"u1\",\"time\":1000,\"kind\":\"login_failed\"}\n");
    let input = temp("late.jsonl", &text);
    let pattern = example("login_reset.cep");
    let (ok, stdout, stderr) = highwater(&[
        "cep",
        "--pattern",
        pattern.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--key",
        "user",
        "--timeouts",
        "--watermark-delay",
        "1s",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("events=4097 matches=0 timeouts=0 late=1 dead_letters=0"), "{stderr}");
    let _ = std::fs::remove_file(input);
}

#[test]
fn a_bad_pattern_file_is_reported_with_its_position() {
    let pattern = temp("bad.cep", "PATTERN (fail+ reset)\nDEFINE fail AS kind = 'login_failed', )\n");
    let input = example("login_reset.jsonl");
    let (ok, stdout, stderr) = highwater(&[
        "cep",
        "--pattern",
        pattern.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--key",
        "user",
    ]);
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(stderr.contains("line 2, column 39: expected a step name after ',', found ')'"), "{stderr}");
    let _ = std::fs::remove_file(pattern);
    let (ok, _, stderr) = highwater(&["cep", "--pattern", "/nonexistent.cep", "--input", "-", "--key", "user"]);
    assert!(!ok);
    assert!(stderr.contains("reading the pattern file /nonexistent.cep"), "{stderr}");
    let (ok, _, stderr) = highwater(&[
        "cep",
        "--pattern",
        example("fraud.cep").to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--key",
        "user.",
    ]);
    assert!(!ok);
    assert!(stderr.contains("in --key \"user.\""), "{stderr}");
}
