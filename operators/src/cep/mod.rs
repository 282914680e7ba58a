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
//! goes out at its last event's time, final. Partial matches that can no
//! longer complete within the time bound go to the timed-out output (that is
//! how "no payment within 5 minutes" is written). A key's state is released
//! as soon as its last partial match has ended.
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

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;

use crate::hold::{Hold, Waiting};
use crate::key::{route, Data, Key, StateMap};
use crate::late::{Counter, LateOutput};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, Timestamp};

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
    /// Events that arrived after the watermark had passed them, and
    /// retractions (patterns match insertions only).
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

/// A key's matcher state and the expiry time its timer is set for.
#[derive(Debug)]
struct Keyed<E> {
    state: KeyState<E>,
    timer: Timestamp,
}

impl<'scope, E: Data> EventStream<'scope, E> {
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
        pattern.validate()?;
        let matcher = Matcher::new(pattern);
        let key = Rc::new(key);
        let route_key = Rc::clone(&key);
        let pact = Exchange::new(move |u: &Update<E>| route(&route_key(&u.0)));
        let mut builder = OperatorBuilder::new("MatchPattern".to_owned(), self.scope());
        let mut input = builder.new_input(self.inner.clone(), pact);
        let (matches_out, matches) = builder.new_output();
        let (timeouts_out, timeouts) = builder.new_output();
        let (late_out, late) = builder.new_output();
        let mut matches_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<Match<K, E>>>>>::from(matches_out);
        let mut timeouts_out =
            OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<Match<K, E>>>>>::from(timeouts_out);
        let mut late_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<E>>>>::from(late_out);
        let count = Counter::new();
        let counter = count.clone();
        let within = matcher.within();

        builder.build(move |_caps| {
            let mut keys: StateMap<K, Keyed<E>> = StateMap::default();
            let mut waiting: Waiting<(K, E)> = Waiting::default();
            let mut timers: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
            let mut hold = Hold::default();
            let mut found_matches: Vec<Found<E>> = Vec::new();
            let mut expired: Vec<(Match<K, E>, Timestamp, bool)> = Vec::new();

            move |frontiers| {
                let mut matches = matches_out.activate();
                let mut timeouts = timeouts_out.activate();
                let mut late = late_out.activate();
                input.for_each_stamp(|cap, data| {
                    let arrived = arrival_time(&cap);
                    for batch in data {
                        for (event, time, diff) in batch.drain(..) {
                            if time < arrived || diff <= 0 {
                                late.session(&cap).give((event, time, diff));
                                counter.add(1);
                                continue;
                            }
                            for _ in 0..diff {
                                waiting.insert((key(&event), event.clone()), time, arrived, &mut hold, &cap);
                            }
                        }
                    }
                });

                let watermark = watermark_of(&frontiers[0]);
                let names = matcher.names().to_vec();
                while let Some((time, records, emit_at)) = waiting.pop_before(watermark, &mut hold) {
                    // The records' promise is withdrawn but not yet settled: still emit under it.
                    hold.promise(emit_at);
                    expire(&matcher, &names, time, &mut keys, &mut timers, &mut hold, &mut expired);
                    for (m, t, timed_out) in expired.drain(..) {
                        let out = if timed_out { &mut timeouts } else { &mut matches };
                        out.session(&hold.at(t)).give((m, t, 1));
                    }
                    for (k, event) in records {
                        let keyed = keys
                            .entry(k.clone())
                            .or_insert_with(|| Keyed { state: KeyState::default(), timer: Timestamp::MAX });
                        matcher.advance(&mut keyed.state, event, time, &mut found_matches);
                        for f in found_matches.drain(..) {
                            matches.session(&hold.at(emit_at)).give((to_match(k.clone(), &names, &f), f.time, 1));
                        }
                        // A timer already set is early enough: new runs start later.
                        let next = if keyed.timer == Timestamp::MAX { keyed.state.next_expiry(within) } else { None };
                        match next {
                            Some(next) => {
                                keyed.timer = next;
                                hold.promise(next - 1);
                                timers.entry(next).or_default().push(k);
                            }
                            None if keyed.timer == Timestamp::MAX && keyed.state.is_idle() => {
                                keys.remove(&k);
                            }
                            None => {}
                        }
                    }
                    hold.remove(emit_at);
                }
                expire(&matcher, &names, watermark, &mut keys, &mut timers, &mut hold, &mut expired);
                for (m, t, timed_out) in expired.drain(..) {
                    let out = if timed_out { &mut timeouts } else { &mut matches };
                    out.session(&hold.at(t)).give((m, t, 1));
                }
                hold.settle(None);
            }
        });
        Ok(Matches {
            matches: EventStream::new(matches),
            timeouts: EventStream::new(timeouts),
            late: LateOutput { stream: EventStream::new(late), count },
        })
    }
}

/// Expires the timers due by `until` (no event before it is still to come):
/// the keys' pending matches and timed-out partial matches go to `out`
/// (`true`: timed out), to be emitted before the hold settles.
#[allow(clippy::too_many_arguments)]
fn expire<K: Key, E: Data>(
    matcher: &Matcher<E>,
    names: &[Arc<str>],
    until: Timestamp,
    keys: &mut StateMap<K, Keyed<E>>,
    timers: &mut BTreeMap<Timestamp, Vec<K>>,
    hold: &mut Hold,
    out: &mut Vec<(Match<K, E>, Timestamp, bool)>,
) {
    let (mut found_matches, mut found_timeouts) = (Vec::new(), Vec::new());
    while let Some(entry) = timers.first_entry() {
        if *entry.key() > until {
            break;
        }
        let (at, due) = entry.remove_entry();
        for k in due {
            if let Some(keyed) = keys.get_mut(&k) {
                if keyed.timer == at {
                    matcher.expire(&mut keyed.state, at, &mut found_matches, &mut found_timeouts);
                    out.extend(found_matches.drain(..).map(|f| (to_match(k.clone(), names, &f), f.time, false)));
                    out.extend(found_timeouts.drain(..).map(|f| (to_match(k.clone(), names, &f), f.time, true)));
                    keyed.timer = Timestamp::MAX;
                    if let Some(next) = keyed.state.next_expiry(matcher.within()) {
                        keyed.timer = next;
                        hold.promise(next - 1);
                        timers.entry(next).or_default().push(k.clone());
                    } else if keyed.state.is_idle() {
                        keys.remove(&k);
                    }
                }
            }
            hold.remove(at - 1);
        }
    }
}
