//! Patterns: named steps with predicates, quantifiers, contiguity and
//! negations, a time bound and an after-match skip strategy.

use std::fmt;
use std::sync::Arc;

use super::nfa::Node;
use crate::time::IntoMillis;

/// The events a partial match has taken so far, by step, for predicates that
/// look back (e.g. "a higher price than the first step's").
#[derive(Debug)]
pub struct Matched<'a, E> {
    pub(crate) names: &'a [Arc<str>],
    /// The newest taken event, linked to the older ones.
    pub(crate) last: Option<&'a Node<E>>,
}

impl<'a, E: 'a> Matched<'a, E> {
    fn step_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| &**n == name)
    }

    /// The taken events, newest first.
    fn newest_first(&self) -> impl Iterator<Item = &'a super::nfa::Taken<E>> + 'a {
        std::iter::successors(self.last, |n| n.prev.as_deref()).map(|n| &n.taken)
    }

    /// The events taken by step `name`, in event-time order (empty if none).
    pub fn get(&self, name: &str) -> impl Iterator<Item = &'a E> + 'a {
        let step = self.step_of(name);
        let mut events: Vec<&'a E> = self.newest_first().filter(|t| Some(t.step) == step).map(|t| &t.event).collect();
        events.reverse();
        events.into_iter()
    }

    /// The first event taken by step `name`.
    pub fn first(&self, name: &str) -> Option<&'a E> {
        let step = self.step_of(name)?;
        self.newest_first().filter(|t| t.step == step).last().map(|t| &t.event)
    }

    /// The last event taken by step `name`.
    pub fn last(&self, name: &str) -> Option<&'a E> {
        let step = self.step_of(name)?;
        self.newest_first().find(|t| t.step == step).map(|t| &t.event)
    }

    /// Every event taken so far, in order.
    pub fn events(&self) -> impl Iterator<Item = &'a E> + 'a {
        let mut events: Vec<&'a E> = self.newest_first().map(|t| &t.event).collect();
        events.reverse();
        events.into_iter()
    }
}

/// A step's condition on an event, given what the partial match has taken.
pub type Predicate<E> = Arc<dyn Fn(&E, &Matched<'_, E>) -> bool + Send + Sync>;

/// How the events of a match follow each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contiguity {
    /// The next event of the key must be the one taken (`next`, `consecutive`).
    Strict,
    /// Events that do not match are skipped; the first one that matches is
    /// taken (`followed_by`; Flink's "skip till next match").
    Relaxed,
    /// Any event may be skipped, matching or not (`followed_by_any`,
    /// `allow_combinations`; Flink's "skip till any match").
    NonDeterministic,
}

/// How a repeated step chooses between taking one more event and moving on,
/// when an event could do both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Greed {
    /// Both: every choice makes its own partial match (the default).
    Both,
    /// As many as possible: an event the step can take is never used to move
    /// on to the next step, nor skipped by a partial match waiting for it, so
    /// the next step follows a maximal run. A greedy step that can end the
    /// pattern (it is last, or only optional steps or a trailing
    /// `not_followed_by` follow) completes a match with each event it takes;
    /// a skip strategy such as `SkipPastLastEvent` keeps the longest.
    Greedy,
    /// As few as possible: once the step has its minimum, an event the next
    /// step can take is not taken by this one.
    Reluctant,
}

/// What a step is: one that takes events, or a negation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Takes events that satisfy its predicate.
    Take,
    /// The event right after the previous step must not satisfy the predicate.
    NotNext,
    /// No event between the previous step and the next may satisfy the
    /// predicate (at the end of a pattern: none within the time bound).
    NotFollowedBy,
}

/// One named step of a [`Pattern`].
#[derive(Clone)]
pub(crate) struct Step<E> {
    pub(crate) name: Arc<str>,
    pub(crate) kind: StepKind,
    pub(crate) predicate: Predicate<E>,
    pub(crate) min: u32,
    pub(crate) max: Option<u32>,
    pub(crate) greed: Greed,
    /// Between this step's first event and the previous step's last.
    pub(crate) entry: Contiguity,
    /// Between two events of this step.
    pub(crate) inner: Contiguity,
}

impl<E> fmt::Debug for Step<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("min", &self.min)
            .field("max", &self.max)
            .field("greed", &self.greed)
            .field("entry", &self.entry)
            .field("inner", &self.inner)
            .finish()
    }
}

/// Where matching resumes after a match is emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterMatchSkip {
    /// Every match is kept (the default).
    NoSkip,
    /// Partial matches that started at or before the match's last event are
    /// discarded: matches do not overlap.
    SkipPastLastEvent,
    /// Partial matches that started with the match's first event are discarded.
    SkipToNext,
    /// Partial matches that started before the first event of this step of the
    /// match are discarded.
    SkipToFirst(String),
    /// Partial matches that started before the last event of this step of the
    /// match are discarded.
    SkipToLast(String),
}

/// An invalid pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternError(pub String);

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PatternError {}

/// A pattern over the events of a key: a sequence of named steps, matched in
/// event-time order.
///
/// Built with [`Pattern::begin`] and the step methods, in the style of
/// FlinkCEP:
///
/// ```
/// use highwater_operators::cep::Pattern;
/// use highwater_operators::DurationExt;
///
/// #[derive(Clone, Debug, PartialEq)]
/// enum Kind { LoginFailed, PasswordReset }
///
/// let pattern = Pattern::<Kind>::begin("fail")
///     .where_(|e| *e == Kind::LoginFailed)
///     .one_or_more()
///     .followed_by("reset")
///     .where_(|e| *e == Kind::PasswordReset)
///     .within(60.secs());
/// assert_eq!(pattern.step_names(), vec!["fail", "reset"]);
/// ```
#[derive(Clone)]
pub struct Pattern<E> {
    pub(crate) steps: Vec<Step<E>>,
    pub(crate) within: Option<u64>,
    pub(crate) skip: AfterMatchSkip,
}

impl<E> fmt::Debug for Pattern<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pattern")
            .field("steps", &self.steps)
            .field("within", &self.within)
            .field("skip", &self.skip)
            .finish()
    }
}

impl<E: 'static> Pattern<E> {
    /// A pattern whose first step is `name` (matching every event until
    /// [`where_`](Self::where_) says otherwise).
    pub fn begin(name: &str) -> Self {
        Pattern {
            steps: vec![Self::step(name, StepKind::Take, Contiguity::Relaxed)],
            within: None,
            skip: AfterMatchSkip::NoSkip,
        }
    }

    fn step(name: &str, kind: StepKind, entry: Contiguity) -> Step<E> {
        Step {
            name: name.into(),
            kind,
            predicate: Arc::new(|_, _| true),
            min: 1,
            max: Some(1),
            greed: Greed::Both,
            entry,
            inner: Contiguity::Relaxed,
        }
    }

    fn last(&mut self) -> &mut Step<E> {
        self.steps.last_mut().expect("a pattern has a step")
    }

    fn then(mut self, name: &str, kind: StepKind, entry: Contiguity) -> Self {
        self.steps.push(Self::step(name, kind, entry));
        self
    }

    /// The current step's condition on the event alone. Several conditions
    /// on one step must all hold.
    pub fn where_(self, predicate: impl Fn(&E) -> bool + Send + Sync + 'static) -> Self {
        self.where_matched(move |e, _| predicate(e))
    }

    /// The current step's condition on the event and on the events the
    /// partial match has taken so far.
    pub fn where_matched(mut self, predicate: impl Fn(&E, &Matched<'_, E>) -> bool + Send + Sync + 'static) -> Self {
        let step = self.last();
        let before = Arc::clone(&step.predicate);
        step.predicate = Arc::new(move |e, m| before(e, m) && predicate(e, m));
        self
    }

    /// The current step's condition, replacing any given before.
    pub fn predicate(mut self, predicate: Predicate<E>) -> Self {
        self.last().predicate = predicate;
        self
    }

    /// A next step, with relaxed contiguity: events that do not match it are skipped.
    pub fn followed_by(self, name: &str) -> Self {
        self.then(name, StepKind::Take, Contiguity::Relaxed)
    }

    /// A next step, with strict contiguity: its first event must directly
    /// follow the previous step's last.
    pub fn next(self, name: &str) -> Self {
        self.then(name, StepKind::Take, Contiguity::Strict)
    }

    /// A next step, with non-deterministic relaxed contiguity: any events may
    /// lie in between, matching or not.
    pub fn followed_by_any(self, name: &str) -> Self {
        self.then(name, StepKind::Take, Contiguity::NonDeterministic)
    }

    /// A negation: the event right after the previous step must not satisfy
    /// this step's condition.
    pub fn not_next(self, name: &str) -> Self {
        self.then(name, StepKind::NotNext, Contiguity::Strict)
    }

    /// A negation: no event between the previous step and the next may
    /// satisfy this step's condition; at the end of the pattern, none within
    /// the pattern's time bound.
    pub fn not_followed_by(self, name: &str) -> Self {
        self.then(name, StepKind::NotFollowedBy, Contiguity::Relaxed)
    }

    /// The current step is optional (zero or its count of events).
    pub fn optional(mut self) -> Self {
        self.last().min = 0;
        self
    }

    /// The current step takes one or more events.
    pub fn one_or_more(self) -> Self {
        self.times_or_more(1)
    }

    /// The current step takes exactly `n` events.
    pub fn times(self, n: u32) -> Self {
        self.times_between(n, n)
    }

    /// The current step takes from `min` to `max` events.
    pub fn times_between(mut self, min: u32, max: u32) -> Self {
        let step = self.last();
        step.min = min;
        step.max = Some(max);
        self
    }

    /// The current step takes `n` or more events.
    pub fn times_or_more(mut self, n: u32) -> Self {
        let step = self.last();
        step.min = n;
        step.max = None;
        self
    }

    /// The current (repeated) step takes as many events as it can.
    pub fn greedy(mut self) -> Self {
        self.last().greed = Greed::Greedy;
        self
    }

    /// The current (repeated) step takes as few events as it can.
    pub fn reluctant(mut self) -> Self {
        self.last().greed = Greed::Reluctant;
        self
    }

    /// The events of the current (repeated) step directly follow each other.
    pub fn consecutive(mut self) -> Self {
        self.last().inner = Contiguity::Strict;
        self
    }

    /// The events of the current (repeated) step may skip matching events
    /// (every combination is a partial match).
    pub fn allow_combinations(mut self) -> Self {
        self.last().inner = Contiguity::NonDeterministic;
        self
    }

    /// Every event of a match lies less than `bound` after its first event
    /// (event time); partial matches that cannot complete in time time out.
    pub fn within(mut self, bound: impl IntoMillis) -> Self {
        self.within = Some(bound.into_millis());
        self
    }

    /// The after-match skip strategy.
    pub fn skip(mut self, skip: AfterMatchSkip) -> Self {
        self.skip = skip;
        self
    }

    /// The names of the steps, in order.
    pub fn step_names(&self) -> Vec<&str> {
        self.steps.iter().map(|s| &*s.name).collect()
    }

    /// The time bound, if any.
    pub fn time_bound(&self) -> Option<u64> {
        self.within
    }

    /// The after-match skip strategy.
    pub fn skip_strategy(&self) -> &AfterMatchSkip {
        &self.skip
    }

    /// Checks the pattern: unique step names, quantifiers in range, negations
    /// neither first nor quantified, a `not_next` always followed by a step that
    /// must take an event, a trailing `not_followed_by` (no step that must take
    /// an event after it) only with `within`, skip targets that exist, and at
    /// least one step that must take an event.
    pub fn validate(&self) -> Result<(), PatternError> {
        let err = |m: String| Err(PatternError(m));
        for (i, s) in self.steps.iter().enumerate() {
            if self.steps[..i].iter().any(|o| o.name == s.name) {
                return err(format!("step name `{}` is used twice", s.name));
            }
            if s.max.is_some_and(|m| m < s.min.max(1)) {
                return err(format!("step `{}`: the maximum count must be at least the minimum and 1", s.name));
            }
            if s.kind != StepKind::Take {
                if i == 0 {
                    return err(format!("step `{}`: a pattern cannot begin with a negation", s.name));
                }
                if (s.min, s.max) != (1, Some(1)) || s.greed != Greed::Both {
                    return err(format!("step `{}`: a negation cannot be quantified", s.name));
                }
                let required_after = self.steps[i + 1..].iter().any(|o| o.kind == StepKind::Take && o.min > 0);
                if !required_after {
                    if s.kind == StepKind::NotNext {
                        return err(format!(
                            "step `{}`: not_next must be followed by a step that takes an event (a pattern cannot end with it)",
                            s.name
                        ));
                    }
                    if self.within.is_none() {
                        return err(format!(
                            "step `{}`: a pattern that ends with not_followed_by needs within",
                            s.name
                        ));
                    }
                }
            }
        }
        if !self.steps.iter().any(|s| s.kind == StepKind::Take && s.min > 0) {
            return err("a pattern needs a step that takes at least one event".into());
        }
        let target = match &self.skip {
            AfterMatchSkip::SkipToFirst(n) | AfterMatchSkip::SkipToLast(n) => Some(n),
            _ => None,
        };
        if let Some(n) = target {
            if !self.steps.iter().any(|s| *s.name == **n && s.kind == StepKind::Take) {
                return err(format!("the skip strategy names step `{n}`, which the pattern does not have"));
            }
        }
        if self.within == Some(0) {
            return err("within must be longer than 0 ms".into());
        }
        Ok(())
    }
}
