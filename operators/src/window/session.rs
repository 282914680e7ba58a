//! Session windows: per key, records closer than a gap form one session;
//! sessions merge as records arrive out of order.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::state::{OperatorState, Schema, Snapshot};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp};

/// Gap-based session windows.
///
/// A session of a key is a maximal run of records in which each record is at
/// most `gap` ms after the previous one. Its window is `[first, last + gap]`:
/// `start` is the first record's time and `end` is the last record's time plus
/// the gap. A record at exactly `end` still joins (two records `gap` apart are
/// one session, `gap + 1` apart are two), so a session is complete, and its
/// result emitted with event time `end`, when the watermark passes `end`.
///
/// Sessions take retractions too. A retraction removes its record from the
/// session that holds it, which may shrink or split in two where a gap wider
/// than `gap` opens: its result is retracted and the pieces' results emitted
/// (at once, for pieces already complete). For this the sessions of a stream
/// that may carry retractions keep their records; those of an append-only
/// stream ([`EventStream::is_append_only`], e.g. a source's records) keep only
/// their accumulators, and a retraction on such a stream, or of a record no
/// session holds, goes to the late output.
///
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
struct Sess<Acc, O, D> {
    window: Window,
    acc: Acc,
    /// What was emitted for this session (and under which window), if anything.
    emitted: Option<(Window, O)>,
    /// The timely time the result goes out at, while not fired.
    emit_at: Timestamp,
    fired: bool,
    /// On a stream that may carry retractions: the session's records with
    /// their multiplicities, from which a retraction splits it (empty on an
    /// append-only stream). Boxed, so that a session of an append-only
    /// stream is no larger for it.
    #[allow(clippy::box_collection)] // one pointer, not a Vec's three words, in every session
    records: Option<Box<Vec<(Timestamp, D, Diff)>>>,
}

/// The sessions of one key, sorted by start, and the next time a timer is set for.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyState<Acc, O, D> {
    sessions: Vec<Sess<Acc, O, D>>,
    timer: Timestamp,
}

/// The operator's state: every key's sessions.
struct Sessions<K, Acc, O, D>(StateMap<K, KeyState<Acc, O, D>>);

impl<K, Acc, O, D> Default for Sessions<K, Acc, O, D> {
    fn default() -> Self {
        Sessions(StateMap::default())
    }
}

impl<K, Acc, O, D> OperatorState for Sessions<K, Acc, O, D>
where
    K: Key,
    Acc: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    O: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    D: Data,
{
    const SCHEMA: Schema = Schema::new("window.session", 1);
    /// A key and its sessions.
    type Entry = (K, KeyState<Acc, O, D>);
    type Prepared = ();

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.0.len());
        for (k, state) in self.0.iter() {
            out.push(route(k), &(k, state));
        }
    }
}

/// Whether two records are equal, by their encodings (records of windows
/// need not be `PartialEq`; a retraction matches the record it takes back).
fn same<D: serde::Serialize>(a: &D, b: &D) -> bool {
    match (crate::checkpoint::encode(a), crate::checkpoint::encode(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
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
    let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
        skeleton::<Sessions<K, A::Acc, A::Output, D>, _, _, _, _>(stream, name, &key);
    // On a stream that may carry retractions, sessions keep their records so
    // that a retraction can split them.
    let updating = !stream.is_append_only();
    let counter = late_count;
    // A session is complete once the watermark passes its (inclusive) end.
    let complete_at = |w: &Window| w.end.saturating_add(1);

    builder.build(move |initial_capabilities, mut managed| {
        let mut timers: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
        let mut hold = Hold::default();
        let mut fired_upto: Timestamp = 0;
        // Recovery: each key's sessions, its timer, and the results its open sessions owe.
        managed.restore(|Sessions(keys), time, entries| {
            fired_upto = time;
            // Sized at once: entries come in the old map's hash order (see the aligned windows).
            keys.reserve(entries.len());
            entries.for_each(|(k, state)| {
                for session in state.sessions.iter().filter(|s| !s.fired) {
                    hold.restore(session.emit_at, &initial_capabilities);
                }
                if state.timer != Timestamp::MAX {
                    timers.entry(state.timer).or_default().push(k.clone());
                }
                keys.insert(k, state);
            });
        });
        drop(initial_capabilities);
        let mut retired: Vec<Sess<A::Acc, A::Output, D>> = Vec::new();
        let mut pieces: Vec<Sess<A::Acc, A::Output, D>> = Vec::new();
        let mut firing: Vec<(Timestamp, ResultUpdate<K, A::Output>)> = Vec::new();

        move |frontiers| {
            if !managed.home() {
                return;
            }
            let Sessions(keys) = managed.get();
            let mut results = results_out.activate();
            let mut late = late_out.activate();

            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                let mut late_session = late.session(&cap);
                let mut corrections = results.session(&cap);
                for batch in data {
                    for (record, time, diff) in batch.drain(..) {
                        let k = key(&record);
                        let state = keys
                            .entry(k.clone())
                            .or_insert_with(|| KeyState { sessions: Vec::new(), timer: Timestamp::MAX });
                        // Too late by its own time: then every session it could touch may be
                        // gone. A retraction on a stream declared append-only cannot be
                        // applied (its sessions keep no records), nor one of a record that
                        // no session holds.
                        let late_by_time = lateness.release_at(time.saturating_add(1)) <= arrived;
                        let unmatched = diff < 0
                            && (!updating
                                || !state.sessions.iter().any(|s| {
                                    s.records
                                        .iter()
                                        .flat_map(|r| r.iter())
                                        .any(|(t, d, m)| *t == time && *m >= -diff && same(d, &record))
                                }));
                        if late_by_time || unmatched || diff == 0 {
                            if state.sessions.is_empty() {
                                keys.remove(&k);
                            }
                            if diff != 0 {
                                late_session.give((record, time, diff));
                                counter.add(1);
                            }
                            continue;
                        }
                        if diff < 0 {
                            // A retraction: the session holding the record loses it, and
                            // splits where a gap wider than `gap` opens.
                            let i = state
                                .sessions
                                .iter()
                                .position(|s| {
                                    s.records
                                        .iter()
                                        .flat_map(|r| r.iter())
                                        .any(|(t, d, m)| *t == time && *m >= -diff && same(d, &record))
                                })
                                .expect("matched above");
                            let mut old = state.sessions.remove(i);
                            let held = old.records.as_mut().expect("matched above");
                            let j = held
                                .iter()
                                .position(|(t, d, m)| *t == time && *m >= -diff && same(d, &record))
                                .expect("matched above");
                            held[j].2 += diff;
                            if held[j].2 == 0 {
                                held.remove(j);
                            }
                            if let Some((window, value)) = old.emitted.take() {
                                corrections.give((WindowResult { window, key: k.clone(), value }, window.end, -1));
                            }
                            if !old.fired {
                                hold.remove(old.emit_at);
                            }
                            let mut records = old.records.take().map(|held| *held).unwrap_or_default();
                            records.sort_by_key(|r| r.0);
                            let mut rest = records.into_iter().peekable();
                            while let Some(first) = rest.next() {
                                let mut window = Window::new(first.0, first.0.saturating_add(gap));
                                let mut acc = agg.init();
                                agg.update(&mut acc, &first.1, first.2);
                                let mut held = vec![first];
                                while let Some(next) = rest.next_if(|r| r.0 <= window.end) {
                                    window.end = window.end.max(next.0.saturating_add(gap));
                                    agg.update(&mut acc, &next.1, next.2);
                                    held.push(next);
                                }
                                let piece = Sess {
                                    window,
                                    acc,
                                    emitted: None,
                                    emit_at: Timestamp::MAX,
                                    fired: complete_at(&window) <= fired_upto,
                                    records: Some(Box::new(held)),
                                };
                                pieces.push(piece);
                            }
                            for (n, mut piece) in pieces.drain(..).enumerate() {
                                let window = piece.window;
                                if piece.fired {
                                    if let Some(value) = agg.output(&piece.acc) {
                                        piece.emitted = Some((window, value.clone()));
                                        corrections.give((
                                            WindowResult { window, key: k.clone(), value },
                                            window.end,
                                            1,
                                        ));
                                    }
                                } else {
                                    piece.emit_at = window.end.max(arrived);
                                    hold.insert(piece.emit_at, &cap);
                                }
                                let next = if piece.fired {
                                    lateness.release_at(complete_at(&window))
                                } else {
                                    complete_at(&window)
                                };
                                if next < state.timer {
                                    state.timer = next;
                                    timers.entry(next).or_default().push(k.clone());
                                }
                                state.sessions.insert(i + n, piece);
                            }
                            if state.sessions.is_empty() {
                                keys.remove(&k);
                            }
                            continue;
                        }
                        // Sessions the record's proto-window [time, time + gap] touches.
                        let mut merged = Window::new(time, time.saturating_add(gap));
                        let first = state.sessions.partition_point(|s| s.window.end < merged.start);
                        let mut last = first;
                        while last < state.sessions.len() && state.sessions[last].window.start <= merged.end {
                            merged.start = merged.start.min(state.sessions[last].window.start);
                            merged.end = merged.end.max(state.sessions[last].window.end);
                            last += 1;
                        }
                        let mut acc = agg.init();
                        agg.update(&mut acc, &record, diff);
                        let mut records = Vec::new();
                        retired.extend(state.sessions.drain(first..last));
                        for mut old in retired.drain(..) {
                            agg.merge(&mut acc, old.acc);
                            if let Some(mut held) = old.records.take() {
                                records.append(&mut held);
                            }
                            if let Some((window, value)) = old.emitted {
                                corrections.give((WindowResult { window, key: k.clone(), value }, window.end, -1));
                            }
                            if !old.fired {
                                hold.remove(old.emit_at);
                            }
                        }
                        if updating {
                            records.push((time, record, diff));
                        }
                        let fired = complete_at(&merged) <= fired_upto;
                        let records = (!records.is_empty()).then(|| Box::new(records));
                        let mut session =
                            Sess { window: merged, acc, emitted: None, emit_at: Timestamp::MAX, fired, records };
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
            managed.checkpoint(watermark, ());
        }
    });

    windowed
}
