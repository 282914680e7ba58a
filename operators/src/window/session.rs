//! Session windows: per key, records closer than a gap form one session;
//! sessions merge as records arrive out of order.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::checkpoint::{decode, encode, Entry};
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Timestamp};

/// Gap-based session windows.
///
/// A session of a key is a maximal run of records in which each record is at
/// most `gap` ms after the previous one. Its window is `[first, last + gap]`:
/// `start` is the first record's time and `end` is the last record's time plus
/// the gap. A record at exactly `end` still joins (two records `gap` apart are
/// one session, `gap + 1` apart are two), so a session is complete, and its
/// result emitted with event time `end`, when the watermark passes `end`.
///
/// Sessions take insertions only (a retraction could split a session).
/// A record whose own time the watermark had passed by more than the allowed
/// lateness goes to the late output; a later one merges into its sessions
/// (retracting their results) as if it had come on time. A session's state is
/// kept until the watermark passes its end plus the allowed lateness.
///
/// ```
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// let captured = timely::example(|scope| {
///     // Arrival order differs from event-time order: 20 s bridges 11 s and 30 s.
///     let clicks = vec![('u', 1_000u64, 1i64), ('u', 11_000, 1), ('u', 30_000, 1), ('u', 20_000, 1)];
///     EventStream::new(clicks.to_stream(scope))
///         .window(Session::with_gap(10.secs()))
///         .key_by(|user: &char| *user)
///         .aggregate(Count)
///         .results.inner.capture()
/// });
/// let out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d)
///     .map(|(r, _, diff)| (r.window.start, r.window.end, r.value, diff)).collect();
/// assert_eq!(out, vec![(1_000, 40_000, 4, 1)]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    gap: u64,
}

impl Session {
    /// Sessions that close after `gap` ms without a record.
    pub fn with_gap(gap: u64) -> Self {
        Session { gap }
    }
}

/// A window result with its time and diff.
type ResultUpdate<K, O> = Update<WindowResult<K, O>>;

/// One session of one key.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Sess<Acc, O> {
    window: Window,
    acc: Acc,
    /// What was emitted for this session (and under which window), if anything.
    emitted: Option<(Window, O)>,
    /// The timely time the result goes out at, while not fired.
    emit_at: Timestamp,
    fired: bool,
}

/// The sessions of one key, sorted by start, and the next time a timer is set for.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyState<Acc, O> {
    sessions: Vec<Sess<Acc, O>>,
    timer: Timestamp,
}

impl<D> WindowSpec<D> for Session {
    fn aggregate_core<'scope, K, KF, A>(
        self,
        stream: &EventStream<'scope, D>,
        name: &str,
        key: KF,
        lateness: AllowedLateness,
        agg: A,
    ) -> Windowed<'scope, K, A::Output, D>
    where
        D: Data,
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        aggregate(stream, name, key, self.gap, lateness, agg)
    }
}

fn aggregate<'scope, D, K, KF, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: KF,
    gap: u64,
    lateness: AllowedLateness,
    agg: A,
) -> Windowed<'scope, K, A::Output, D>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    A: Aggregate<D>,
{
    let key = Rc::new(key);
    let (
        Skeleton { builder, checkpointer, mut input, results: mut results_out, late: mut late_out, late_count },
        windowed,
    ) = skeleton(stream, name, &key, true);
    let counter = late_count;
    // A session is complete once the watermark passes its (inclusive) end.
    let complete_at = |w: &Window| w.end.saturating_add(1);

    builder.build(move |initial_capabilities| {
        let mut keys: StateMap<K, KeyState<A::Acc, A::Output>> = StateMap::default();
        let mut timers: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
        let mut hold = Hold::default();
        let mut fired_upto: Timestamp = 0;
        // Recovery: each key's sessions, its timer, and the results its open sessions owe.
        if let Some((time, entries)) = checkpointer.as_ref().and_then(|c| c.restored()) {
            fired_upto = time;
            // Sized at once: entries come in the old map's hash order (see the aligned windows).
            keys.reserve(entries.len());
            entries.for_each(|_, bytes| {
                let (k, state): (K, KeyState<A::Acc, A::Output>) = decode(bytes);
                for session in state.sessions.iter().filter(|s| !s.fired) {
                    hold.restore(session.emit_at, &initial_capabilities);
                }
                if state.timer != Timestamp::MAX {
                    timers.entry(state.timer).or_default().push(k.clone());
                }
                keys.insert(k, state);
            });
        }
        drop(initial_capabilities);
        let mut retired: Vec<Sess<A::Acc, A::Output>> = Vec::new();
        let mut firing: Vec<(Timestamp, ResultUpdate<K, A::Output>)> = Vec::new();
        // The sessions while a background thread serializes them for a checkpoint.
        let mut away = None;

        move |frontiers| {
            if checkpointer.as_ref().is_some_and(|c| !c.home(&mut away, |back| keys = back)) {
                return;
            }
            let mut results = results_out.activate();
            let mut late = late_out.activate();

            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                let mut late_session = late.session(&cap);
                let mut corrections = results.session(&cap);
                for batch in data {
                    for (record, time, diff) in batch.drain(..) {
                        // A retraction could split a session in two; merging cannot undo that.
                        assert!(diff > 0, "session windows take insertions only (got diff {diff})");
                        let k = key(&record);
                        let state = keys
                            .entry(k.clone())
                            .or_insert_with(|| KeyState { sessions: Vec::new(), timer: Timestamp::MAX });
                        // Sessions the record's proto-window [time, time + gap] touches.
                        let mut merged = Window::new(time, time.saturating_add(gap));
                        let first = state.sessions.partition_point(|s| s.window.end < merged.start);
                        let mut last = first;
                        while last < state.sessions.len() && state.sessions[last].window.start <= merged.end {
                            merged.start = merged.start.min(state.sessions[last].window.start);
                            merged.end = merged.end.max(state.sessions[last].window.end);
                            last += 1;
                        }
                        // Too late by its own time: then every session it could touch may be gone.
                        if lateness.release_at(time.saturating_add(1)) <= arrived {
                            if state.sessions.is_empty() {
                                keys.remove(&k);
                            }
                            late_session.give((record, time, diff));
                            counter.add(1);
                            continue;
                        }
                        let mut acc = agg.init();
                        agg.update(&mut acc, &record, diff);
                        retired.extend(state.sessions.drain(first..last));
                        for old in retired.drain(..) {
                            agg.merge(&mut acc, old.acc);
                            if let Some((window, value)) = old.emitted {
                                corrections.give((WindowResult { window, key: k.clone(), value }, window.end, -1));
                            }
                            if !old.fired {
                                hold.remove(old.emit_at);
                            }
                        }
                        let fired = complete_at(&merged) <= fired_upto;
                        let mut session = Sess { window: merged, acc, emitted: None, emit_at: Timestamp::MAX, fired };
                        if fired {
                            // Complete already: its (corrected) result goes out now.
                            if let Some(value) = agg.output(&session.acc) {
                                session.emitted = Some((merged, value.clone()));
                                corrections.give((
                                    WindowResult { window: merged, key: k.clone(), value },
                                    merged.end,
                                    1,
                                ));
                            }
                        } else {
                            let needed = merged.end.max(arrived);
                            session.emit_at = needed;
                            hold.insert(needed, &cap);
                        }
                        let next = if fired { lateness.release_at(complete_at(&merged)) } else { complete_at(&merged) };
                        state.sessions.insert(first, session);
                        if next < state.timer {
                            state.timer = next;
                            timers.entry(next).or_default().push(k);
                        }
                    }
                }
            });

            let watermark = watermark_of(&frontiers[0]);
            if watermark > fired_upto {
                fired_upto = watermark;
                while let Some(entry) = timers.first_entry() {
                    if *entry.key() > watermark {
                        break;
                    }
                    let (time, due) = entry.remove_entry();
                    for k in due {
                        let Some(state) = keys.get_mut(&k) else {
                            continue;
                        };
                        if state.timer != time {
                            continue; // superseded by an earlier timer for the same key
                        }
                        let mut next = Timestamp::MAX;
                        for session in state.sessions.iter_mut() {
                            if !session.fired && complete_at(&session.window) <= watermark {
                                session.fired = true;
                                hold.remove(session.emit_at);
                                if let Some(value) = agg.output(&session.acc) {
                                    // Without lateness no record reaches a fired session.
                                    if lateness.0 > 0 {
                                        session.emitted = Some((session.window, value.clone()));
                                    }
                                    let result = WindowResult { window: session.window, key: k.clone(), value };
                                    firing.push((session.emit_at, (result, session.window.end, 1)));
                                }
                            }
                        }
                        state.sessions.retain(|s| lateness.release_at(complete_at(&s.window)) > watermark);
                        for session in state.sessions.iter() {
                            let due = if session.fired {
                                lateness.release_at(complete_at(&session.window))
                            } else {
                                complete_at(&session.window)
                            };
                            next = next.min(due);
                        }
                        if state.sessions.is_empty() {
                            keys.remove(&k);
                        } else {
                            state.timer = next;
                            timers.entry(next).or_default().push(k);
                        }
                    }
                }
                // One output session per emission time, not per result.
                firing.sort_by_key(|(at, _)| *at);
                let mut due = firing.drain(..).peekable();
                while let Some((at, first)) = due.next() {
                    let cap = hold.at(at);
                    let mut session = results.session(&cap);
                    session.give(first);
                    while let Some((_, update)) = due.next_if(|(t, _)| *t == at) {
                        session.give(update);
                    }
                }
                drop(due);
                hold.settle(None);
            }
            if let Some(c) = checkpointer.as_ref() {
                let entries = |keys: &StateMap<K, KeyState<A::Acc, A::Output>>| -> Vec<Entry> {
                    keys.iter().map(|(k, state)| (route(k), encode(&(k, state)))).collect()
                };
                if let Some(cut) = c.due(watermark) {
                    away = Some(c.snapshot_away(cut, std::mem::take(&mut keys), entries));
                }
            }
        }
    });

    windowed
}
