//! Complex event processing: patterns over the events of each key, matched in
//! event-time order.
//!
//! A [`Pattern`] is a sequence of named steps, each with a condition on the
//! event (and on the events matched so far), a quantifier (once, optional,
//! one or more, `times`), a contiguity (strict `next`, relaxed `followed_by`,
//! non-deterministic `followed_by_any`), negations (`not_next`,
//! `not_followed_by`), a time bound (`within`) and an after-match skip
//! strategy, as in FlinkCEP. [`EventStream::match_pattern`] applies it to a
//! keyed stream: events of a key wait until the watermark passes them and are
//! then matched in event-time order, whatever order they arrived in; a match
//! goes out at its last event's time. With an allowed lateness
//! (`events.allowed_lateness(d).key_by(..).pattern(..)`, see
//! [`WithLateness`](crate::WithLateness)), an event that comes after
//! the watermark passed it but within the lateness replays its key's recent
//! events, and the matches and time-outs that change are corrected (retracted,
//! and the new ones emitted); without, outputs are final and late events go to
//! the late output. Partial matches that can no
//! longer complete within the time bound go to the timed-out output (that is
//! how "no payment within 5 minutes" is written). A key's state is released
//! as soon as its last partial match has ended. With checkpoints on, a
//! checkpoint holds each key's partial matches (with the events they took),
//! its time-bound timer and its replay state, and the events still waiting
//! for the watermark.
//!
//! # Examples
//! ```
//! use highwater_operators::cep::{AfterMatchSkip, Pattern};
//! use highwater_operators::prelude::*;
//! use timely::dataflow::operators::ToStream;
//! use timely::dataflow::operators::capture::{Capture, Extract};
//!
//! // (user, what) events: two failed logins then a password reset, out of order.
//! let events = vec![
//!     ((7u32, 'F'), 1_000u64, 1i64),
//!     ((7, 'R'), 5_000, 1),
//!     ((7, 'F'), 2_000, 1),
//!     ((8, 'F'), 3_000, 1),
//! ];
//! let pattern = Pattern::<(u32, char)>::begin("fail")
//!     .where_(|e| e.1 == 'F')
//!     .one_or_more()
//!     .greedy()
//!     .followed_by("reset")
//!     .where_(|e| e.1 == 'R')
//!     .within(60.secs())
//!     // One match per burst: without it, {F, R} and the second {F, R} match too.
//!     .skip(AfterMatchSkip::SkipPastLastEvent);
//! let (matches, timeouts) = timely::example(move |scope| {
//!     let found = EventStream::new(events.to_stream(scope)).match_pattern(|e| e.0, pattern).unwrap();
//!     (found.matches.inner.capture(), found.timeouts.inner.capture())
//! });
//! let matches: Vec<_> = matches.extract().into_iter().flat_map(|(_, d)| d).map(|(m, t, _)| (m.key, m.events("fail").len(), t)).collect();
//! assert_eq!(matches, vec![(7, 2, 5_000)]);
//! let timeouts: Vec<_> = timeouts.extract().into_iter().flat_map(|(_, d)| d).map(|(m, _, _)| m.key).collect();
//! assert_eq!(timeouts, vec![8]);
//! ```

mod nfa;
mod pattern;

use std::rc::Rc;
use std::slice::IterMut;
use std::sync::Arc;

use timely::dataflow::operators::{Capability, InputCapability};

use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::{Counter, LateOutput};
use crate::state::pending::Pending;
use crate::state::{
    ActiveOutput, AnyKeyedState, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot, Stateful, Timers,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Timestamp};

pub use pattern::{AfterMatchSkip, Contiguity, Greed, Matched, Pattern, PatternError, Predicate, StepKind};

use nfa::{Found, KeyState, Matcher};

/// A match (or a timed-out partial match) of a pattern for one key: the
/// events taken by each step, in step order (steps that took none are left
/// out).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Match<K, E> {
    /// The key.
    pub key: K,
    /// Step names with their events, in event-time order.
    pub steps: Vec<(Arc<str>, Vec<E>)>,
}

impl<K, E> Match<K, E> {
    /// The events of step `name` (empty if it took none).
    pub fn events(&self, name: &str) -> &[E] {
        self.steps.iter().find(|(n, _)| &**n == name).map_or(&[], |(_, e)| e.as_slice())
    }
}

/// The outputs of [`EventStream::match_pattern`].
#[derive(Debug)]
pub struct Matches<'scope, K: 'static, E: 'static> {
    /// Complete matches, at their last event's time (for a pattern ending in
    /// `not_followed_by`: at the last millisecond of its time bound).
    pub matches: EventStream<'scope, Match<K, E>>,
    /// Partial matches that timed out, at the last millisecond of their time bound.
    pub timeouts: EventStream<'scope, Match<K, E>>,
    /// Events that arrived after the watermark had passed them by more than
    /// the allowed lateness, and retractions (patterns match insertions only).
    pub late: LateOutput<'scope, E>,
}

fn to_match<K, E: Clone>(key: K, names: &[Arc<str>], found: &Found<E>) -> Match<K, E> {
    let mut steps: Vec<(Arc<str>, Vec<E>)> = Vec::new();
    for t in found.taken.to_vec() {
        match steps.last_mut() {
            Some((n, events)) if Arc::ptr_eq(n, &names[t.step]) => events.push(t.event.clone()),
            _ => steps.push((Arc::clone(&names[t.step]), vec![t.event.clone()])),
        }
    }
    Match { key, steps }
}

/// A stream with a key function: what patterns are matched on (one matcher
/// per key). Made by [`EventStream::key_by`].
pub struct KeyedEvents<'scope, E: 'static, KF> {
    stream: EventStream<'scope, E>,
    key: KF,
    lateness: AllowedLateness,
}

impl<'scope, E: 'static, KF> KeyedEvents<'scope, E, KF> {
    pub(crate) fn into_parts(self) -> (EventStream<'scope, E>, KF, AllowedLateness) {
        (self.stream, self.key, self.lateness)
    }
}

impl<E: 'static, KF> std::fmt::Debug for KeyedEvents<'_, E, KF> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedEvents").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl<'scope, E: Data> EventStream<'scope, E> {
    /// The stream keyed by `key`: to match patterns per key
    /// (`events.key_by(|e| e.user).pattern(pattern)`), or to window per key
    /// (`events.key_by(|e| e.user).window(Tumbling::of(10.secs()))`, the
    /// same as `window(..).key_by(..)`).
    pub fn key_by<K: Key, KF: Fn(&E) -> K + 'static>(&self, key: KF) -> KeyedEvents<'scope, E, KF> {
        KeyedEvents { stream: self.clone(), key, lateness: AllowedLateness::default_of(&self.scope()) }
    }
}

impl<'scope, E: Data> crate::late::WithLateness<'scope, E> {
    /// The stream keyed by `key`, for a pattern or windows that accept
    /// records up to the allowed lateness; see [`EventStream::key_by`].
    pub fn key_by<K: Key, KF: Fn(&E) -> K + 'static>(&self, key: KF) -> KeyedEvents<'scope, E, KF> {
        KeyedEvents { stream: self.stream.clone(), key, lateness: self.lateness }
    }
}

/// Pattern matching on keyed streams.
///
/// ```
/// use highwater_operators::cep::{Pattern, PatternExt};
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// // (user, kind): a cart addition then a failed payment within 5 minutes.
/// let events = vec![((1u32, 'A'), 0u64, 1i64), ((1, 'F'), 60_000, 1), ((2, 'A'), 0, 1), ((2, 'F'), 400_000, 1)];
/// let pattern = Pattern::<(u32, char)>::begin("added")
///     .where_(|e| e.1 == 'A')
///     .followed_by("failed")
///     .where_(|e| e.1 == 'F')
///     .within(5.minutes());
/// let captured = timely::example(move |scope| {
///     let found = EventStream::new(events.to_stream(scope)).key_by(|e| e.0).pattern(pattern).unwrap();
///     found.matches.inner.capture()
/// });
/// let users: Vec<u32> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(m, _, _)| m.key).collect();
/// assert_eq!(users, vec![1]);
/// ```
pub trait PatternExt<'scope, E: 'static, K: 'static> {
    /// Matches `pattern` on each key's events; see [`EventStream::match_pattern`].
    ///
    /// # Errors
    /// If the pattern is invalid.
    fn pattern(self, pattern: Pattern<E>) -> Result<Matches<'scope, K, E>, PatternError>;
}

impl<'scope, E: Data + Sync, K: Key, KF: Fn(&E) -> K + 'static> PatternExt<'scope, E, K>
    for KeyedEvents<'scope, E, KF>
{
    fn pattern(self, pattern: Pattern<E>) -> Result<Matches<'scope, K, E>, PatternError> {
        self.stream.match_pattern_core(self.key, pattern, self.lateness)
    }
}

/// A key's matcher state and the expiry time its timer is set for.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(
    serialize = "K: serde::Serialize, E: serde::Serialize",
    deserialize = "K: serde::de::DeserializeOwned, E: serde::de::DeserializeOwned"
))]
struct Keyed<K, E> {
    state: KeyState<E>,
    timer: Timestamp,
    /// With an allowed lateness: what a late event replays.
    replay: Replay<K, E>,
}

impl<K, E> Keyed<K, E> {
    fn new() -> Self {
        Keyed { state: KeyState::default(), timer: Timestamp::MAX, replay: Replay::default() }
    }

    /// Whether the key holds nothing a later event or a late one needs.
    fn is_idle(&self) -> bool {
        self.state.is_idle() && self.replay.history.is_empty() && self.replay.base.is_idle()
    }
}

/// A key's matcher state before the events a late one may still precede,
/// those events, and the outputs they made (which a replay may change).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(
    serialize = "K: serde::Serialize, E: serde::Serialize",
    deserialize = "K: serde::de::DeserializeOwned, E: serde::de::DeserializeOwned"
))]
struct Replay<K, E> {
    base: KeyState<E>,
    history: Vec<(Timestamp, E)>,
    emitted: Vec<(Match<K, E>, Timestamp, bool)>,
    /// The watermark the next trim is scheduled at (`Timestamp::MAX`: none).
    trim_at: Timestamp,
}

impl<K, E> Default for Replay<K, E> {
    fn default() -> Self {
        Replay { base: KeyState::default(), history: Vec::new(), emitted: Vec::new(), trim_at: Timestamp::MAX }
    }
}

impl<K, E> Replay<K, E> {
    /// When the key's replay state next needs a trim, with `allowed`
    /// lateness: once its oldest event, or its base's next expiry, is
    /// beyond the lateness horizon.
    fn next_trim(&self, allowed: u64, within: Option<u64>) -> Option<Timestamp> {
        let from = match self.history.first() {
            Some((t, _)) => *t,
            None => self.base.next_expiry(within)?,
        };
        Some(from.saturating_add(allowed).saturating_add(1))
    }
}

/// Schedules the key's next trim if it is earlier than the one set.
fn schedule_trim<K: Key, E>(
    trims: &mut Timers<K>,
    k: &K,
    replay: &mut Replay<K, E>,
    allowed: u64,
    within: Option<u64>,
) {
    if let Some(at) = replay.next_trim(allowed, within) {
        trims.bring_forward(&mut replay.trim_at, at, k);
    }
}

/// A checkpoint entry of a pattern matcher: a key's state (its runs, its
/// timer, its replay state), or an event waiting for the watermark (its time,
/// key and event, and the time its results go out at).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum CepEntry<K, S, E> {
    Key(K, S),
    Waiting(Timestamp, K, E, Timestamp),
}

/// A pattern operator's state on a worker: every key's, and the events waiting for the watermark.
struct CepState<K, E> {
    keys: KeyedState<K, Keyed<K, E>>,
    waiting: Pending<(K, E)>,
}

impl<K, E> Default for CepState<K, E> {
    fn default() -> Self {
        CepState { keys: KeyedState::default(), waiting: Pending::default() }
    }
}

impl<K: Key, E: Data + Sync> OperatorState for CepState<K, E> {
    const SCHEMA: Schema = Schema::new("cep.match_pattern", 1);
    type Entry = CepEntry<K, Keyed<K, E>, E>;
    type Prepared = ();

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.keys);
    }

    /// The records waiting for the watermark.
    fn held(&self) -> (usize, u64) {
        self.waiting.held()
    }

    /// Every key's state, and the waiting events. A key's partial matches
    /// share the events they took through `Arc` links (`nfa::Node`): the
    /// background thread reads them while the operator leaves them alone.
    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.keys.len());
        self.keys.for_each(|k, keyed| out.push(route(k), &CepEntry::<_, _, ()>::Key(k, keyed)));
        for (t, (k, event), emit_at) in self.waiting.iter() {
            out.push(route(k), &CepEntry::<_, (), _>::Waiting(t, k, event, emit_at));
        }
    }
}

/// How outputs are compared when a replay corrects them.
type SameOutput<K, E> = Rc<dyn Fn(&Match<K, E>, &Match<K, E>) -> bool>;

/// Events are `Sync` besides [`Data`]: a checkpoint serializes a key's partial
/// matches on a background thread, and they share the events they took through
/// `Arc` links.
impl<'scope, E: Data + Sync> EventStream<'scope, E> {
    /// Matches `pattern` against the events of each key (see the [module
    /// documentation](crate::cep)).
    ///
    /// # Errors
    /// If the pattern is invalid ([`Pattern::validate`]).
    pub fn match_pattern<K, KF>(&self, key: KF, pattern: Pattern<E>) -> Result<Matches<'scope, K, E>, PatternError>
    where
        K: Key,
        KF: Fn(&E) -> K + 'static,
    {
        self.match_pattern_core(key, pattern, AllowedLateness::default_of(&self.scope()))
    }

    fn match_pattern_core<K, KF>(
        &self,
        key: KF,
        pattern: Pattern<E>,
        lateness: AllowedLateness,
    ) -> Result<Matches<'scope, K, E>, PatternError>
    where
        K: Key,
        KF: Fn(&E) -> K + 'static,
    {
        // Outputs are compared by their encoding, so events need no `PartialEq`.
        let same: SameOutput<K, E> = Rc::new(|a, b| {
            crate::checkpoint::encode(a).ok().is_some_and(|a| crate::checkpoint::encode(b).ok() == Some(a))
        });
        let lateness = (lateness.0 > 0).then_some((lateness.0, same));
        pattern.validate()?;
        let matcher = Matcher::new(pattern);
        let key = Rc::new(key);
        let route_key = Rc::clone(&key);
        let stateful = Stateful::<CepState<K, E>>::new("MatchPattern", &self.scope());
        let gated = stateful.keyed_input(self, move |u: &Update<E>| route(&route_key(&u.0)));
        let mut builder = stateful.builder(&self.scope());
        let mut input = builder.input(gated);
        let (mut matches_out, matches) = builder.output::<Match<K, E>>();
        let (mut timeouts_out, timeouts) = builder.output::<Match<K, E>>();
        let (mut late_out, late) = builder.output::<E>();
        let count = Counter::new();
        crate::totals::Totals::count_in(&self.scope(), "MatchPattern.late", &count);
        let mut op = PatternOperator {
            names: matcher.names().to_vec(),
            within: matcher.within(),
            allowed: lateness.as_ref().map_or(0, |(l, _)| *l),
            matcher,
            key,
            lateness,
            counter: count.clone(),
            trims: Timers::default(),
            processed: 0,
            timers: Timers::default(),
            // Matches go out on output 0, time-outs on output 1.
            hold: Hold::with_outputs(2),
            found_matches: Vec::new(),
            expired: Vec::new(),
        };

        builder.build(move |initial_capabilities, mut managed| {
            managed.restore(|state, time, entries| op.restore(state, time, entries, &initial_capabilities));
            drop(initial_capabilities);

            move |frontiers| {
                // The keys and waiting events are away while a background thread snapshots them.
                if !managed.home() {
                    return;
                }
                let CepState { keys, waiting } = managed.get();
                let mut out = Outputs {
                    matches: matches_out.activate(),
                    timeouts: timeouts_out.activate(),
                    late: late_out.activate(),
                };
                input.for_each_stamp(|cap, data| op.take_events(keys, waiting, &cap, data, &mut out));
                let watermark = watermark_of(&frontiers[0]);
                op.match_waiting(keys, waiting, watermark, &mut out);
                op.fire_timers(keys, watermark, &mut out);
                op.processed = op.processed.max(watermark);
                op.trim_replays(keys, watermark);
                op.hold.settle(None);
                // A key's partial matches share the events they took through
                // `Arc` links (`nfa::Node`): the background thread reads them while
                // the operator leaves them alone.
                managed.checkpoint(watermark, ());
            }
        });
        Ok(Matches { matches, timeouts, late: LateOutput { stream: late, count } })
    }
}

/// A pattern operator's outputs during an activation.
struct Outputs<'a, K: 'static, E: 'static> {
    matches: ActiveOutput<'a, Match<K, E>>,
    timeouts: ActiveOutput<'a, Match<K, E>>,
    late: ActiveOutput<'a, E>,
}

impl<'a, K: 'static, E: 'static> Outputs<'a, K, E> {
    /// The time-outs' output if `timed_out`, else the matches'.
    fn of(&mut self, timed_out: bool) -> &mut ActiveOutput<'a, Match<K, E>> {
        if timed_out {
            &mut self.timeouts
        } else {
            &mut self.matches
        }
    }
}

/// A pattern operator's own part, besides its checkpointed [`CepState`]: the
/// matcher, the key function, the keys' expiry timers and replay trims, and
/// the hold on its outputs. Each activation takes the events in
/// ([`take_events`](Self::take_events)), matches the waiting ones the
/// watermark has passed ([`match_waiting`](Self::match_waiting)), fires the
/// timers due ([`fire_timers`](Self::fire_timers)) and trims the keys' replay
/// state ([`trim_replays`](Self::trim_replays)).
struct PatternOperator<K, E, KF> {
    matcher: Matcher<E>,
    /// The matcher's step names.
    names: Vec<Arc<str>>,
    /// The pattern's time bound.
    within: Option<u64>,
    key: Rc<KF>,
    /// With an allowed lateness: the lateness, and how outputs are compared
    /// when a replay corrects them.
    lateness: Option<(u64, SameOutput<K, E>)>,
    /// The allowed lateness (0: none).
    allowed: u64,
    counter: Counter,
    /// Keys whose oldest replayable event leaves the lateness horizon, by watermark.
    trims: Timers<K>,
    /// The watermark up to which events have been matched.
    processed: Timestamp,
    /// Expiry timers: the keys due, each with the time its output promise is held at.
    timers: Timers<(K, Timestamp)>,
    hold: Hold,
    found_matches: Vec<Found<E>>,
    expired: Vec<(Match<K, E>, Timestamp, bool)>,
}

impl<K: Key, E: Data + Sync, KF: Fn(&E) -> K> PatternOperator<K, E, KF> {
    /// Recovery: every key's state, with its timer and trim re-armed, and
    /// the events waiting for the watermark. Everything before the cut
    /// (`time`) has been matched, and what is owed is at or after it.
    fn restore(
        &mut self,
        CepState { keys, waiting }: &mut CepState<K, E>,
        time: Timestamp,
        entries: &mut RestoredEntries<CepState<K, E>>,
        initial: &[Capability<Timestamp>],
    ) {
        self.processed = time;
        keys.reserve(entries.len());
        entries.for_each(|entry| match entry {
            CepEntry::Key(k, keyed) => {
                if keyed.timer != Timestamp::MAX {
                    let promise = (keyed.timer - 1).max(time);
                    self.hold.restore(promise, initial);
                    self.timers.schedule(keyed.timer, (k.clone(), promise));
                }
                self.trims.restore(keyed.replay.trim_at, k.clone());
                keys.insert(k, keyed);
            }
            CepEntry::Waiting(t, k, event, emit_at) => {
                waiting.restore((k, event), t, emit_at.max(time), &mut self.hold, initial);
            }
        });
    }

    /// Takes in the events of one stamp (`cap`): an event the watermark has
    /// not passed waits for it; a late one within the allowed lateness
    /// replays its key; later ones, and retractions, go to the late output.
    fn take_events(
        &mut self,
        keys: &mut KeyedState<K, Keyed<K, E>>,
        waiting: &mut Pending<(K, E)>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<E>>>,
        out: &mut Outputs<'_, K, E>,
    ) {
        let arrived = arrival_time(cap);
        for batch in data {
            for (event, time, diff) in batch.drain(..) {
                // An event at the end of time could never be passed by the watermark.
                let never = time == Timestamp::MAX;
                if time.saturating_add(1).saturating_add(self.allowed) <= arrived || diff <= 0 || never {
                    out.late.session(cap).give((event, time, diff));
                    self.counter.add(1);
                    continue;
                }
                for _ in 0..diff {
                    let k = (self.key)(&event);
                    if time >= self.processed {
                        waiting.insert((k, event.clone()), time, arrived, &mut self.hold, cap);
                        continue;
                    }
                    self.replay_late(keys, k, &event, time, cap, out);
                }
            }
        }
    }

    /// A late event within the allowed lateness: replays its key's events
    /// with it and corrects the outputs that change (at its arrival, `cap`).
    fn replay_late(
        &mut self,
        keys: &mut KeyedState<K, Keyed<K, E>>,
        k: K,
        event: &E,
        time: Timestamp,
        cap: &InputCapability<Timestamp>,
        out: &mut Outputs<'_, K, E>,
    ) {
        let Some((_, same)) = self.lateness.as_ref() else { return };
        let arrived = arrival_time(cap);
        let keyed = keys.get_or_insert_with(k.clone(), Keyed::new);
        let outputs = replay(&self.matcher, &self.names, &k, keyed, time, event.clone(), self.processed);
        let old = std::mem::replace(&mut keyed.replay.emitted, outputs);
        correct(old, &keyed.replay.emitted, same, cap, out);
        if let Some(next) = keyed.state.next_expiry(self.within) {
            if next < keyed.timer {
                keyed.timer = next;
                let promise = (next - 1).max(arrived);
                self.hold.insert(promise, cap);
                self.timers.schedule(next, (k.clone(), promise));
            }
        }
        schedule_trim(&mut self.trims, &k, &mut keyed.replay, self.allowed, self.within);
    }

    /// Matches the waiting events the watermark has passed, in event-time
    /// order: at each event time, the timers due by it fire first.
    fn match_waiting(
        &mut self,
        keys: &mut KeyedState<K, Keyed<K, E>>,
        waiting: &mut Pending<(K, E)>,
        watermark: Timestamp,
        out: &mut Outputs<'_, K, E>,
    ) {
        while let Some((time, records, emit_at)) = waiting.pop_before(watermark, &mut self.hold) {
            // The records' promise is withdrawn but not yet settled: still emit under it.
            self.hold.promise(emit_at);
            self.fire_timers(keys, time, out);
            for (k, event) in records {
                self.advance(keys, k, event, time, emit_at, out);
            }
            self.hold.remove(emit_at);
        }
    }

    /// Advances key `k`'s matcher by `event` (at `time`, its results going
    /// out at `emit_at`): emits the matches it completes, sets the key's
    /// timer, and forgets the key if it holds nothing any more.
    fn advance(
        &mut self,
        keys: &mut KeyedState<K, Keyed<K, E>>,
        k: K,
        event: E,
        time: Timestamp,
        emit_at: Timestamp,
        out: &mut Outputs<'_, K, E>,
    ) {
        let keyed = keys.get_or_insert_with(k.clone(), Keyed::new);
        if self.allowed > 0 {
            keyed.replay.history.push((time, event.clone()));
            schedule_trim(&mut self.trims, &k, &mut keyed.replay, self.allowed, self.within);
        }
        self.matcher.advance(&mut keyed.state, event, time, &mut self.found_matches);
        for f in self.found_matches.drain(..) {
            let m = to_match(k.clone(), &self.names, &f);
            if self.allowed > 0 {
                keyed.replay.emitted.push((m.clone(), f.time, false));
            }
            out.matches.session(&self.hold.at(emit_at)).give((m, f.time, 1));
        }
        // A timer already set is early enough: new runs start later.
        let next = if keyed.timer == Timestamp::MAX { keyed.state.next_expiry(self.within) } else { None };
        match next {
            Some(next) => {
                keyed.timer = next;
                // Not before the capability the event came with.
                let promise = (next - 1).max(emit_at);
                self.hold.promise(promise);
                self.timers.schedule(next, (k, promise));
            }
            None if keyed.timer == Timestamp::MAX && keyed.is_idle() => {
                keys.remove(&k);
            }
            None => {}
        }
    }

    /// Fires the expiry timers due by `until` and emits the matches and
    /// time-outs they yield.
    fn fire_timers(&mut self, keys: &mut KeyedState<K, Keyed<K, E>>, until: Timestamp, out: &mut Outputs<'_, K, E>) {
        let record = self.allowed > 0;
        expire(&self.matcher, &self.names, until, keys, &mut self.timers, &mut self.hold, &mut self.expired, record);
        for (m, t, timed_out) in self.expired.drain(..) {
            let port = usize::from(timed_out);
            out.of(timed_out).session(&self.hold.at_or_after_on(t, port)).give((m, t, 1));
        }
    }

    /// Trims the replay state of the keys whose trim the watermark has
    /// reached, and forgets the keys left with nothing.
    fn trim_replays(&mut self, keys: &mut KeyedState<K, Keyed<K, E>>, watermark: Timestamp) {
        // Events before the lateness horizon can no longer be preceded by a late one.
        let horizon = watermark.saturating_sub(self.allowed);
        while let Some((at, due)) = self.trims.pop_due(watermark) {
            for k in due {
                let Some(keyed) = keys.get_mut(&k) else { continue };
                if keyed.replay.trim_at != at {
                    continue;
                }
                keyed.replay.trim_at = Timestamp::MAX;
                trim(&self.matcher, &mut keyed.replay, horizon);
                schedule_trim(&mut self.trims, &k, &mut keyed.replay, self.allowed, self.within);
                if keyed.is_idle() && keyed.timer == Timestamp::MAX {
                    keys.remove(&k);
                }
            }
        }
    }
}

/// Emits what a replay changed between a key's `old` and `new` outputs, at
/// the late event's arrival (`cap`): a retraction of each old output that no
/// new one is the same as, then an insertion of each new output that no old
/// one is.
fn correct<K: Key, E: Data>(
    old: Vec<(Match<K, E>, Timestamp, bool)>,
    new: &[(Match<K, E>, Timestamp, bool)],
    same: &SameOutput<K, E>,
    cap: &InputCapability<Timestamp>,
    out: &mut Outputs<'_, K, E>,
) {
    let mut retracted = vec![false; old.len()];
    let mut kept = vec![false; new.len()];
    for (i, o) in old.iter().enumerate() {
        if let Some(j) =
            (0..new.len()).find(|&j| !kept[j] && new[j].1 == o.1 && new[j].2 == o.2 && same(&new[j].0, &o.0))
        {
            kept[j] = true;
        } else {
            retracted[i] = true;
        }
    }
    for (i, (m, t, timed_out)) in old.into_iter().enumerate() {
        if retracted[i] {
            out.of(timed_out).session(cap).give((m, t, -1));
        }
    }
    for (j, (m, t, timed_out)) in new.iter().enumerate() {
        if !kept[j] {
            out.of(*timed_out).session(cap).give((m.clone(), *t, 1));
        }
    }
}

/// Expires the timers due by `until` (no event before it is still to come):
/// the keys' pending matches and timed-out partial matches go to `out`
/// (`true`: timed out), to be emitted before the hold settles.
#[allow(clippy::too_many_arguments)]
fn expire<K: Key, E: Data + Sync>(
    matcher: &Matcher<E>,
    names: &[Arc<str>],
    until: Timestamp,
    keys: &mut KeyedState<K, Keyed<K, E>>,
    timers: &mut Timers<(K, Timestamp)>,
    hold: &mut Hold,
    out: &mut Vec<(Match<K, E>, Timestamp, bool)>,
    record: bool,
) {
    let (mut found_matches, mut found_timeouts) = (Vec::new(), Vec::new());
    while let Some((at, due)) = timers.pop_due(until) {
        for (k, promise) in due {
            if let Some(keyed) = keys.get_mut(&k) {
                if keyed.timer == at {
                    matcher.expire(&mut keyed.state, at, &mut found_matches, &mut found_timeouts);
                    let from = out.len();
                    out.extend(found_matches.drain(..).map(|f| (to_match(k.clone(), names, &f), f.time, false)));
                    out.extend(found_timeouts.drain(..).map(|f| (to_match(k.clone(), names, &f), f.time, true)));
                    if record {
                        keyed.replay.emitted.extend(out[from..].iter().cloned());
                    }
                    keyed.timer = Timestamp::MAX;
                    if let Some(next) = keyed.state.next_expiry(matcher.within()) {
                        keyed.timer = next;
                        // Scheduled while this timer's promise is held: at or after it.
                        let at_least = (next - 1).max(promise);
                        hold.promise(at_least);
                        timers.schedule(next, (k.clone(), at_least));
                    } else if keyed.is_idle() {
                        keys.remove(&k);
                    }
                }
            }
            hold.remove(promise);
        }
    }
}

/// Replays a key's events since its replay base with `event` (at `time`)
/// inserted in event-time order, and expires up to `processed`: the key's new
/// state, and the outputs the events since the base make.
fn replay<K: Key, E: Data>(
    matcher: &Matcher<E>,
    names: &[Arc<str>],
    key: &K,
    keyed: &mut Keyed<K, E>,
    time: Timestamp,
    event: E,
    processed: Timestamp,
) -> Vec<(Match<K, E>, Timestamp, bool)> {
    let history = &mut keyed.replay.history;
    let at = history.partition_point(|(t, _)| *t <= time);
    history.insert(at, (time, event));
    let mut state = keyed.replay.base.clone();
    let (mut found, mut timed_out) = (Vec::new(), Vec::new());
    let mut outputs = Vec::new();
    let mut collect = |found: &mut Vec<Found<E>>, timed_out: &mut Vec<Found<E>>| {
        outputs.extend(found.drain(..).map(|f| (to_match(key.clone(), names, &f), f.time, false)));
        outputs.extend(timed_out.drain(..).map(|f| (to_match(key.clone(), names, &f), f.time, true)));
    };
    for (t, e) in history.iter() {
        expire_all(matcher, &mut state, *t, &mut found, &mut timed_out);
        matcher.advance(&mut state, e.clone(), *t, &mut found);
        collect(&mut found, &mut timed_out);
    }
    expire_all(matcher, &mut state, processed, &mut found, &mut timed_out);
    collect(&mut found, &mut timed_out);
    keyed.state = state;
    outputs
}

/// Expires every run of `state` due by `until`, in expiry order.
fn expire_all<E: Clone>(
    matcher: &Matcher<E>,
    state: &mut KeyState<E>,
    until: Timestamp,
    found: &mut Vec<Found<E>>,
    timed_out: &mut Vec<Found<E>>,
) {
    while let Some(next) = state.next_expiry(matcher.within()) {
        if next > until {
            break;
        }
        matcher.expire(state, next, found, timed_out);
    }
}

/// Moves a key's events before `horizon` into its replay base: no late event
/// can precede them any more, and their outputs are final.
fn trim<K, E: Clone>(matcher: &Matcher<E>, replay: &mut Replay<K, E>, horizon: Timestamp) {
    let n = replay.history.partition_point(|(t, _)| *t < horizon);
    let (mut found, mut timed_out) = (Vec::new(), Vec::new());
    for (t, e) in replay.history.drain(..n) {
        expire_all(matcher, &mut replay.base, t, &mut found, &mut timed_out);
        matcher.advance(&mut replay.base, e, t, &mut found);
    }
    expire_all(matcher, &mut replay.base, horizon, &mut found, &mut timed_out);
    replay.emitted.retain(|(_, t, _)| *t >= horizon);
}
