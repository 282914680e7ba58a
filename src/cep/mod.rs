//! CEP patterns in text, in the spirit of SQL's `MATCH_RECOGNIZE`, over JSON
//! events.
//!
//! [`compile`] turns a pattern text into a [`CepProgram`], whose
//! [`pattern`](CepProgram::pattern) is a
//! [`Pattern`] of `serde_json::Value` for
//! [`EventStream::match_pattern`](highwater_operators::EventStream::match_pattern)
//! (the module documentation of [`highwater_operators::cep`] says how
//! patterns match). `highwater cep` runs one over JSON Lines.
//!
//! ```text
//! -- Failed logins, then a password reset, within a minute.
//! PATTERN (fail+ reset) WITHIN 60s
//! AFTER MATCH SKIP PAST LAST ROW
//! DEFINE fail AS kind = 'login_failed',
//!        reset AS kind = 'password_reset'
//! ```
//!
//! # The pattern
//! `PATTERN ( … )` lists the steps in order. Between two steps, the
//! contiguity:
//!
//! | text      | meaning                                                      | builder             |
//! |-----------|--------------------------------------------------------------|---------------------|
//! | `a b`     | relaxed: events that do not match `b` are skipped            | `followed_by`       |
//! | `a . b`   | strict: `b`'s first event is the very next event of the key  | `next`              |
//! | `a ~ b`   | non-deterministic: any events may be skipped, matching or not | `followed_by_any`   |
//! | `a !b`    | no event matching `b` between `a` and the next step (at the end: within the time bound) | `not_followed_by` |
//! | `a . !b`  | the event right after `a` does not match `b`                 | `not_next`          |
//!
//! A step may carry a quantifier, as in regular expressions: `a?` (optional),
//! `a+` (one or more), `a*` (zero or more), `a{3}` (exactly 3), `a{2,4}`
//! (2 to 4), `a{2,}` (2 or more). By default a repeated step tries every
//! choice between taking one more event and moving on (`Greed::Both`); a
//! trailing `?` makes it reluctant (`a+?`: as few as possible) and a trailing
//! `+` greedy (`a++`: as many as possible, like a possessive quantifier).
//! Between the events of a repeated step contiguity is relaxed; `CONSECUTIVE`
//! makes it strict (`a{3} CONSECUTIVE`) and `COMBINATIONS` non-deterministic
//! (`a+ COMBINATIONS`).
//!
//! `WITHIN 60s` bounds a match: each event lies less than the duration after
//! the match's first event. Units: `ms`, `s` (`sec`), `m` (`min`), `h`,
//! `d` (also spelled out: `seconds`, `minutes`…).
//!
//! `AFTER MATCH SKIP` says where matching resumes after a match: `PAST LAST
//! ROW` (matches do not overlap), `TO NEXT ROW` (not two matches from one
//! first event), `TO FIRST step`, `TO LAST step` (or `TO step`), or `NONE`:
//! every match is kept, which is the default (unlike SQL, whose default is
//! `PAST LAST ROW`).
//!
//! # Conditions
//! `DEFINE step AS condition, …` gives a step its condition on the event; a
//! step without one matches every event. Conditions are made of:
//! - fields of the event: `kind`, `user.country`, `items[0].price`
//!   (`"odd name"` in double quotes for names that are not identifiers or are
//!   keywords); a missing field is `null`;
//! - the events the partial match has taken: `first(step).field`,
//!   `last(step).field` (the first and last event of a step so far: within
//!   the step's own condition, the events it took before this one),
//!   `prev.field` (the last event taken, whatever its step) and
//!   `count(step)`; before the step has taken an event, they are `null`
//!   (`count` is 0);
//! - literals: `'strings'` (with `''` for a quote), numbers, `true`, `false`,
//!   `null`;
//! - arithmetic on numbers: `+ - * / %` and unary `-` (anything else, or a
//!   division by zero, is `null`);
//! - comparisons `= != <> < <= > >=`, `x IN (v, …)`, `x NOT IN (…)`,
//!   `x IS NULL`, `x IS NOT NULL`;
//! - `AND`, `OR`, `NOT` and parentheses.
//!
//! Only values of one type compare: numbers by value, strings by their
//! characters, booleans, arrays and objects for (in)equality. A comparison
//! of values of different types, or with `null`, is false, `!=` included:
//! test absence with `IS NULL`. `NOT` is plain negation (`NOT x = 1` is true
//! when `x` is missing). A field used as a condition holds when it is `true`.
//! Keywords are case-insensitive; names are not. `--` starts a comment.
//!
//! # Grammar
//! ```text
//! program    = clause { clause } ;            (* PATTERN once; the others at most once, in any order *)
//! clause     = pattern | within | skip | define ;
//! pattern    = "PATTERN" "(" element { [ "." | "~" ] element } ")" ;
//! element    = [ "!" ] name [ quantifier ] [ "CONSECUTIVE" | "COMBINATIONS" ] ;
//! quantifier = ( "?" | "+" | "*" | "{" int "}" | "{" int "," [ int ] "}" ) [ "?" | "+" ] ;
//! within     = "WITHIN" number unit ;
//! unit       = "ms" | "s" | "sec" | "m" | "min" | "h" | "d" | … ;
//! skip       = "AFTER" "MATCH" "SKIP"
//!              ( "PAST" "LAST" "ROW" | "TO" "NEXT" "ROW" | "TO" [ "FIRST" | "LAST" ] name | "NONE" ) ;
//! define     = "DEFINE" name "AS" expr { "," name "AS" expr } ;
//! expr       = and { "OR" and } ;
//! and        = not { "AND" not } ;
//! not        = "NOT" not | predicate ;
//! predicate  = sum [ cmp sum | [ "NOT" ] "IN" "(" sum { "," sum } ")" | "IS" [ "NOT" ] "NULL" ] ;
//! cmp        = "=" | "!=" | "<>" | "<" | "<=" | ">" | ">=" ;
//! sum        = product { ( "+" | "-" ) product } ;
//! product    = unary { ( "*" | "/" | "%" ) unary } ;
//! unary      = "-" unary | primary ;
//! primary    = string | number | "TRUE" | "FALSE" | "NULL" | "(" expr ")"
//!            | ( "FIRST" | "LAST" ) "(" name ")" tail | "PREV" tail | "COUNT" "(" name ")"
//!            | name tail ;
//! tail       = { "." name | "[" int "]" } ;
//! name       = identifier | '"' { character } '"' ;
//! ```
//!
//! # Errors
//! A text that does not parse, or does not make a valid pattern, gives a
//! [`CepError`] that says where (line and column) and what was expected:
//! `line 2, column 17: expected a step name after ',', found ')'`.
//!
//! # Examples
//! ```
//! use highwater::cep::compile;
//!
//! let program = compile(
//!     "PATTERN (small large) WITHIN 10m
//!      DEFINE small AS amount < 10,
//!             large AS amount > 500 AND country != first(small).country",
//! )
//! .unwrap();
//! assert_eq!(program.step_names(), vec!["small", "large"]);
//! assert_eq!(program.within(), Some(600_000));
//!
//! let err = compile("PATTERN (a b)\nDEFINE a AS x = 1,\n       c AS x = 2").unwrap_err();
//! assert_eq!(err.to_string(), "line 3, column 8: DEFINE names step 'c', which PATTERN does not have (its steps: a, b)");
//! ```

mod event;
pub(crate) mod expr;
mod lexer;
pub(crate) mod parser;

use std::sync::Arc;

use highwater_operators::cep::{AfterMatchSkip, Contiguity, Greed, Pattern, PatternError};
use serde_json::Value;

pub use event::{KeyedEvent, KeyedEventDecoder};
pub use expr::{FieldPath, Segment};
pub use lexer::Position;

use expr::{Expr, MatchedHistory};
use parser::{Element, Link, Skip};

/// A pattern text that could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CepError {
    /// The text does not follow the grammar.
    #[error("line {}, column {}: {message}", at.line, at.column)]
    Syntax {
        /// Where.
        at: Position,
        /// What was expected, and what was found.
        message: String,
    },
    /// The text parses, but does not make a valid pattern (an unknown or
    /// duplicate step, a misplaced negation…).
    #[error("line {}, column {}: {message}", at.line, at.column)]
    Invalid {
        /// Where.
        at: Position,
        /// What is wrong.
        message: String,
    },
    /// The pattern built from the text failed [`Pattern::validate`].
    #[error("invalid pattern: {0}")]
    Pattern(#[from] PatternError),
}

impl CepError {
    pub(crate) fn syntax(at: Position, message: String) -> Self {
        CepError::Syntax { at, message }
    }

    pub(crate) fn invalid(at: Position, message: String) -> Self {
        CepError::Invalid { at, message }
    }

    /// Where the error is, if it is in the text.
    pub fn position(&self) -> Option<Position> {
        match self {
            CepError::Syntax { at, .. } | CepError::Invalid { at, .. } => Some(*at),
            CepError::Pattern(_) => None,
        }
    }
}

/// A compiled pattern text: the steps with their conditions, the time bound
/// and the skip strategy, ready to build [`Pattern`]s.
///
/// ```
/// use highwater::cep::compile;
/// use highwater_operators::cep::AfterMatchSkip;
///
/// let program = compile("PATTERN (view{3} !purchase) WITHIN 30m AFTER MATCH SKIP PAST LAST ROW
///                        DEFINE view AS kind = 'view', purchase AS kind = 'purchase'").unwrap();
/// assert_eq!(program.skip(), &AfterMatchSkip::SkipPastLastEvent);
/// let pattern = program.pattern();
/// assert_eq!(pattern.step_names(), vec!["view", "purchase"]);
/// assert!(pattern.validate().is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct CepProgram {
    steps: Vec<Element>,
    conditions: Vec<Option<Arc<Expr>>>,
    within: Option<u64>,
    skip: AfterMatchSkip,
}

/// Compiles a pattern text (see the [module documentation](self) for the
/// language).
///
/// # Errors
/// If the text does not parse or does not make a valid pattern; the error
/// says where and why.
///
/// # Examples
/// ```
/// use highwater::cep::compile;
///
/// assert!(compile("PATTERN (fail+ reset) WITHIN 60s DEFINE fail AS kind = 'login_failed'").is_ok());
/// let err = compile("PATTERN (fail+ reset) WITHIN 60").unwrap_err();
/// assert_eq!(err.to_string(), "line 1, column 32: expected a unit (ms, s, m, min, h or d) after 60, found the end of the text");
/// ```
pub fn compile(text: &str) -> Result<CepProgram, CepError> {
    let program = parser::parse(text)?;
    let Some((steps, pattern_at)) = program.pattern else {
        return Err(CepError::invalid(
            Position { line: 1, column: 1 },
            "the text has no PATTERN clause (e.g. PATTERN (a b))".into(),
        ));
    };
    let within = program.within.map(|(ms, _)| ms);
    let invalid = |at: Position, message: String| Err(CepError::invalid(at, message));
    let names = || steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
    let index_of = |name: &str| steps.iter().position(|s| s.name == name);

    for (i, s) in steps.iter().enumerate() {
        if let Some(first) = steps[..i].iter().find(|o| o.name == s.name) {
            return invalid(
                s.at,
                format!(
                    "step '{}' appears twice in PATTERN (first at line {}, column {})",
                    s.name, first.at.line, first.at.column
                ),
            );
        }
        let repeated = s.quantifier.as_ref().is_some_and(|q| q.max != Some(1));
        if let Some((_, at)) = s.inner {
            if !repeated {
                return invalid(
                    at,
                    format!(
                        "CONSECUTIVE and COMBINATIONS apply to a repeated step (such as {}+ or {}{{3}})",
                        s.name, s.name
                    ),
                );
            }
        }
        if !s.negated {
            continue;
        }
        if i == 0 {
            return invalid(s.at, format!("a pattern cannot begin with a negation ('!{}')", s.name));
        }
        if let Some(q) = &s.quantifier {
            return invalid(q.at, format!("a negation ('!{}') cannot be quantified", s.name));
        }
        if s.link == Link::Any {
            return invalid(
                s.link_at,
                format!(
                    "'~' cannot come before a negation: write '!{0}' (not followed by) or '. !{0}' (not next)",
                    s.name
                ),
            );
        }
        // Trailing: no step after it must take an event.
        if !steps[i + 1..].iter().any(|o| !o.negated && o.quantifier.as_ref().is_none_or(|q| q.min > 0)) {
            if s.link == Link::Strict {
                return invalid(
                    s.link_at,
                    format!("a strict negation ('. !{}') must be followed by a step that takes an event", s.name),
                );
            }
            if within.is_none() {
                return invalid(
                    s.at,
                    format!(
                        "a pattern that ends with a negation ('!{}') needs WITHIN: how long must it not happen?",
                        s.name
                    ),
                );
            }
        }
    }
    if !steps.iter().any(|s| !s.negated && s.quantifier.as_ref().is_none_or(|q| q.min > 0)) {
        return invalid(
            pattern_at,
            "every step of PATTERN is optional or a negation: a match must take an event".into(),
        );
    }

    let mut conditions: Vec<Option<Arc<Expr>>> = vec![None; steps.len()];
    for d in program.defines {
        let Some(i) = index_of(&d.name) else {
            return invalid(
                d.at,
                format!("DEFINE names step '{}', which PATTERN does not have (its steps: {})", d.name, names()),
            );
        };
        if conditions[i].is_some() {
            return invalid(d.at, format!("step '{}' is defined twice", d.name));
        }
        for (r, at) in &d.refs {
            match index_of(r) {
                None => return invalid(*at, format!("step '{r}' is not in PATTERN (its steps: {})", names())),
                Some(k) if steps[k].negated => {
                    return invalid(*at, format!("step '{r}' is a negation: it never takes events to refer to"))
                }
                Some(k) if k > i => {
                    return invalid(
                        *at,
                        format!(
                            "step '{r}' comes after '{}': it has taken no events when '{}' is tested",
                            d.name, d.name
                        ),
                    )
                }
                Some(_) => {}
            }
        }
        conditions[i] = Some(Arc::new(d.expr));
    }

    let skip = match program.skip.map(|(s, _)| s) {
        None | Some(Skip::None) => AfterMatchSkip::NoSkip,
        Some(Skip::PastLastRow) => AfterMatchSkip::SkipPastLastEvent,
        Some(Skip::ToNextRow) => AfterMatchSkip::SkipToNext,
        Some(Skip::ToFirst(name, at) | Skip::ToLast(name, at)) if index_of(&name).is_none_or(|k| steps[k].negated) => {
            let what = if index_of(&name).is_some() { "is a negation" } else { "is not in PATTERN" };
            return invalid(at, format!("AFTER MATCH SKIP names step '{name}', which {what} (its steps: {})", names()));
        }
        Some(Skip::ToFirst(name, _)) => AfterMatchSkip::SkipToFirst(name),
        Some(Skip::ToLast(name, _)) => AfterMatchSkip::SkipToLast(name),
    };
    let program = CepProgram { steps, conditions, within, skip };
    program.pattern().validate()?;
    Ok(program)
}

impl CepProgram {
    /// The pattern over JSON values.
    pub fn pattern(&self) -> Pattern<Value> {
        self.pattern_with(|v: &Value| v)
    }

    /// The pattern over any event type that holds a JSON value, which `view`
    /// returns (e.g. `|e: &KeyedEvent| &e.value`).
    pub fn pattern_with<E, V>(&self, view: V) -> Pattern<E>
    where
        E: 'static,
        V: Fn(&E) -> &Value + Clone + Send + Sync + 'static,
    {
        let mut pattern: Option<Pattern<E>> = None;
        for (s, condition) in self.steps.iter().zip(&self.conditions) {
            let name = s.name.as_str();
            let mut p = match pattern {
                None => Pattern::begin(name),
                Some(p) => match (s.link, s.negated) {
                    (Link::Relaxed, false) => p.followed_by(name),
                    (Link::Strict, false) => p.next(name),
                    (Link::Any, false) => p.followed_by_any(name),
                    (Link::Strict, true) => p.not_next(name),
                    // `compile` rejects `~ !b`.
                    (Link::Relaxed | Link::Any, true) => p.not_followed_by(name),
                },
            };
            if let Some(expr) = condition {
                let (expr, view) = (Arc::clone(expr), view.clone());
                p = p.where_matched(move |e, m| expr.test(view(e), &MatchedHistory { matched: m, view: &view }));
            }
            if let Some(q) = &s.quantifier {
                p = match (q.min, q.max) {
                    (0, Some(1)) => p.optional(),
                    (1, None) => p.one_or_more(),
                    (0, None) => p.one_or_more().optional(),
                    (n, Some(m)) if n == m => p.times(n),
                    (n, Some(m)) => p.times_between(n, m),
                    (n, None) => p.times_or_more(n),
                };
                p = match q.greed {
                    Greed::Both => p,
                    Greed::Greedy => p.greedy(),
                    Greed::Reluctant => p.reluctant(),
                };
            }
            p = match s.inner {
                Some((Contiguity::Strict, _)) => p.consecutive(),
                Some((Contiguity::NonDeterministic, _)) => p.allow_combinations(),
                _ => p,
            };
            pattern = Some(p);
        }
        let mut p = pattern.expect("compile checks that PATTERN has a step");
        if let Some(ms) = self.within {
            p = p.within(ms);
        }
        p.skip(self.skip.clone())
    }

    /// Whether `event` satisfies the condition of `step`, given the events
    /// the partial match has taken before it, as (step, event) pairs in
    /// order; `None` if the pattern has no such step. A step without DEFINE
    /// holds for every event. For trying conditions out, and for tests.
    ///
    /// ```
    /// use highwater::cep::compile;
    /// use serde_json::json;
    ///
    /// let program = compile("PATTERN (small large) DEFINE small AS amount < 10,
    ///                        large AS amount > 500 AND country != first(small).country").unwrap();
    /// let small = json!({"amount": 2.5, "country": "US"});
    /// assert_eq!(program.holds("small", &small, &[]), Some(true));
    /// let taken = [("small", small)];
    /// assert_eq!(program.holds("large", &json!({"amount": 900, "country": "FR"}), &taken), Some(true));
    /// assert_eq!(program.holds("large", &json!({"amount": 900, "country": "US"}), &taken), Some(false));
    /// assert_eq!(program.holds("large", &json!({"amount": 900}), &taken), Some(false));
    /// assert_eq!(program.holds("medium", &json!({}), &[]), None);
    /// ```
    pub fn holds(&self, step: &str, event: &Value, taken: &[(&str, Value)]) -> Option<bool> {
        let i = self.steps.iter().position(|s| s.name == step)?;
        Some(self.conditions[i].as_ref().is_none_or(|expr| expr.test(event, &taken)))
    }

    /// The step names, in order.
    pub fn step_names(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.name.as_str()).collect()
    }

    /// The time bound (WITHIN), in milliseconds.
    pub fn within(&self) -> Option<u64> {
        self.within
    }

    /// The skip strategy (AFTER MATCH SKIP).
    pub fn skip(&self) -> &AfterMatchSkip {
        &self.skip
    }
}
