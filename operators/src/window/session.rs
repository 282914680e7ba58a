//! Session windows: per key, records closer than a gap form one session;
//! sessions merge as records arrive out of order.

use std::rc::Rc;

use super::{skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use timely::dataflow::operators::{Capability, InputCapability};

use crate::late::Counter;
use crate::state::{
    give_all, ActiveOutput, AnyKeyedState, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot, Timers,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, IntoMillis, Timestamp};

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
    pub fn with_gap(gap: impl IntoMillis) -> Self {
        Session { gap: gap.into_millis() }
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
struct Sessions<K, Acc, O, D>(KeyedState<K, KeyState<Acc, O, D>>);

impl<K, Acc, O, D> Default for Sessions<K, Acc, O, D> {
    fn default() -> Self {
        Sessions(KeyedState::default())
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

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.0);
    }

    /// Its keyed states hold all of it (splits for incremental checkpoints).
    fn split_prepared() -> Option<Self::Prepared> {
        Some(())
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.0.len());
        self.0.for_each(|k, state| out.push(route(k), &(k, state)));
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
        _phases: super::Phases,
        agg: A,
    ) -> Windowed<'scope, K, A::Output, D>
    where
        D: Data,
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        let gap = self.gap;
        let key = Rc::new(key);
        let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
            skeleton::<Sessions<K, A::Acc, A::Output, D>, _, _, _, _>(stream, name, &key);
        // On a stream that may carry retractions, sessions keep their records so
        // that a retraction can split them.
        let updating = !stream.is_append_only();

        builder.build(move |initial_capabilities, mut managed| {
            let mut op = SessionOp {
                key,
                agg,
                gap,
                lateness,
                updating,
                counter: late_count,
                timers: Timers::default(),
                hold: Hold::default(),
                fired_upto: 0,
                retired: Vec::new(),
                pieces: Vec::new(),
                firing: Vec::new(),
                corrections: Vec::new(),
                late: Vec::new(),
            };
            managed.restore(|Sessions(keys), time, entries| op.restore(keys, time, entries, &initial_capabilities));
            drop(initial_capabilities);

            move |frontiers| {
                if !managed.home() {
                    return;
                }
                let Sessions(keys) = managed.get();
                let mut results = results_out.activate();
                let mut late = late_out.activate();
                input.for_each_stamp(|cap, data| {
                    let arrived = arrival_time(&cap);
                    for batch in data {
                        for (record, time, diff) in batch.drain(..) {
                            op.take(keys, record, time, diff, arrived, &cap);
                        }
                    }
                    give_all(&mut results, &cap, &mut op.corrections);
                    give_all(&mut late, &cap, &mut op.late);
                });
                let watermark = watermark_of(&frontiers[0]);
                op.fire(keys, watermark, &mut results);
                managed.checkpoint(watermark, ());
            }
        });

        windowed
    }
}

/// The session operator's work on a worker, step by step: records in
/// ([`take`](Self::take): merging, or splitting for a retraction), and
/// sessions fired and forgotten as the watermark passes them
/// ([`fire`](Self::fire)).
struct SessionOp<K, KF, A: Aggregate<D>, D> {
    key: Rc<KF>,
    agg: A,
    gap: u64,
    lateness: AllowedLateness,
    updating: bool,
    counter: Counter,
    /// Keys by the time their next session completes or is released.
    timers: Timers<K>,
    hold: Hold,
    /// The watermark up to which sessions have fired.
    fired_upto: Timestamp,
    /// Scratch: the sessions a record merges, the pieces a retraction leaves.
    retired: Vec<SessOf<A, D>>,
    pieces: Vec<SessOf<A, D>>,
    /// Results due, with the time they go out at.
    firing: Vec<(Timestamp, ResultUpdate<K, A::Output>)>,
    /// Corrections and late records of the stamp being taken in.
    corrections: Vec<ResultUpdate<K, A::Output>>,
    late: Vec<Update<D>>,
}

/// A session of the operator's aggregate.
type SessOf<A, D> = Sess<<A as Aggregate<D>>::Acc, <A as Aggregate<D>>::Output, D>;

/// The sessions of one key of the operator's aggregate.
type KeyStateOf<A, D> = KeyState<<A as Aggregate<D>>::Acc, <A as Aggregate<D>>::Output, D>;

/// A session is complete once the watermark passes its (inclusive) end.
fn complete_at(w: &Window) -> Timestamp {
    w.end.saturating_add(1)
}

impl<K, KF, A, D> SessionOp<K, KF, A, D>
where
    K: Key,
    KF: Fn(&D) -> K,
    A: Aggregate<D>,
    D: Data,
{
    /// Recovery: each key's sessions, its timer, and the results its open
    /// sessions owe.
    fn restore(
        &mut self,
        keys: &mut KeyedState<K, KeyStateOf<A, D>>,
        time: Timestamp,
        entries: &mut RestoredEntries<Sessions<K, A::Acc, A::Output, D>>,
        initial: &[Capability<Timestamp>],
    ) {
        self.fired_upto = time;
        // Sized at once: entries come in the old map's hash order (see the aligned windows).
        keys.reserve(entries.len());
        entries.for_each(|(k, state)| {
            for session in state.sessions.iter().filter(|s| !s.fired) {
                self.hold.restore(session.emit_at, initial);
            }
            self.timers.restore(state.timer, k.clone());
            keys.insert(k, state);
        });
    }

    /// Takes in one update that arrived at `arrived` (under `cap`).
    fn take(
        &mut self,
        keys: &mut KeyedState<K, KeyStateOf<A, D>>,
        record: D,
        time: Timestamp,
        diff: Diff,
        arrived: Timestamp,
        cap: &InputCapability<Timestamp>,
    ) {
        let k = (self.key)(&record);
        let state = keys.get_or_insert_with(k.clone(), || KeyState { sessions: Vec::new(), timer: Timestamp::MAX });
        // Too late by its own time: then every session it could touch may be
        // gone. A retraction on a stream declared append-only cannot be
        // applied (its sessions keep no records), nor one of a record that
        // no session holds.
        let late_by_time = self.lateness.release_at(time.saturating_add(1)) <= arrived;
        let holder = (diff < 0 && self.updating).then(|| holding(&state.sessions, &record, time, diff)).flatten();
        if late_by_time || (diff < 0 && holder.is_none()) || diff == 0 {
            if state.sessions.is_empty() {
                keys.remove(&k);
            }
            if diff != 0 {
                self.late.push((record, time, diff));
                self.counter.add(1);
            }
            return;
        }
        match holder {
            Some(i) => self.retract(state, &k, i, &record, time, diff, arrived, cap),
            None => self.insert(state, &k, record, time, diff, arrived, cap),
        }
        if state.sessions.is_empty() {
            keys.remove(&k);
        }
    }

    /// A retraction of a record session `i` holds: the session loses it, and
    /// splits where a gap wider than `gap` opens.
    #[allow(clippy::too_many_arguments)]
    fn retract(
        &mut self,
        state: &mut KeyStateOf<A, D>,
        k: &K,
        i: usize,
        record: &D,
        time: Timestamp,
        diff: Diff,
        arrived: Timestamp,
        cap: &InputCapability<Timestamp>,
    ) {
        let mut old = state.sessions.remove(i);
        let mut records = old.records.take().map(|held| *held).unwrap_or_default();
        if let Some(j) = records.iter().position(|(t, d, m)| *t == time && *m >= -diff && same(d, record)) {
            records[j].2 += diff;
            if records[j].2 == 0 {
                records.remove(j);
            }
        }
        self.retire(k, &mut old);
        records.sort_by_key(|r| r.0);
        let mut rest = records.into_iter().peekable();
        while let Some(first) = rest.next() {
            let mut window = Window::new(first.0, first.0.saturating_add(self.gap));
            let mut acc = self.agg.init();
            self.agg.update(&mut acc, &first.1, first.2);
            let mut held = vec![first];
            while let Some(next) = rest.next_if(|r| r.0 <= window.end) {
                window.end = window.end.max(next.0.saturating_add(self.gap));
                self.agg.update(&mut acc, &next.1, next.2);
                held.push(next);
            }
            let fired = complete_at(&window) <= self.fired_upto;
            let records = Some(Box::new(held));
            self.pieces.push(Sess { window, acc, emitted: None, emit_at: Timestamp::MAX, fired, records });
        }
        let mut pieces = std::mem::take(&mut self.pieces);
        for (n, piece) in pieces.drain(..).enumerate() {
            let piece = self.place(state, k, piece, arrived, cap);
            state.sessions.insert(i + n, piece);
        }
        self.pieces = pieces;
    }

    /// An insertion: the record's proto-window `[time, time + gap]` merges
    /// every session it touches into one.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        state: &mut KeyStateOf<A, D>,
        k: &K,
        record: D,
        time: Timestamp,
        diff: Diff,
        arrived: Timestamp,
        cap: &InputCapability<Timestamp>,
    ) {
        let mut merged = Window::new(time, time.saturating_add(self.gap));
        let first = state.sessions.partition_point(|s| s.window.end < merged.start);
        let mut last = first;
        while last < state.sessions.len() && state.sessions[last].window.start <= merged.end {
            merged.start = merged.start.min(state.sessions[last].window.start);
            merged.end = merged.end.max(state.sessions[last].window.end);
            last += 1;
        }
        let mut acc = self.agg.init();
        self.agg.update(&mut acc, &record, diff);
        let mut records = Vec::new();
        let mut retired = std::mem::take(&mut self.retired);
        retired.extend(state.sessions.drain(first..last));
        for mut old in retired.drain(..) {
            self.retire(k, &mut old);
            if let Some(mut held) = old.records.take() {
                records.append(&mut held);
            }
            self.agg.merge(&mut acc, old.acc);
        }
        self.retired = retired;
        if self.updating {
            records.push((time, record, diff));
        }
        let fired = complete_at(&merged) <= self.fired_upto;
        let records = (!records.is_empty()).then(|| Box::new(records));
        let session = Sess { window: merged, acc, emitted: None, emit_at: Timestamp::MAX, fired, records };
        let session = self.place(state, k, session, arrived, cap);
        state.sessions.insert(first, session);
    }

    /// A session merged into another or split: its result is retracted, and
    /// if it had not fired, its promise withdrawn.
    fn retire(&mut self, k: &K, old: &mut SessOf<A, D>) {
        if let Some((window, value)) = old.emitted.take() {
            self.corrections.push((WindowResult { window, key: k.clone(), value }, window.end, -1));
        }
        if !old.fired {
            self.hold.remove(old.emit_at);
        }
    }

    /// A new session (merged, or a piece of a split one): complete already,
    /// its (corrected) result goes out now; otherwise its result is owed at
    /// its end. Its key's timer is brought forward to when it completes or
    /// is released.
    fn place(
        &mut self,
        state: &mut KeyStateOf<A, D>,
        k: &K,
        mut session: SessOf<A, D>,
        arrived: Timestamp,
        cap: &InputCapability<Timestamp>,
    ) -> SessOf<A, D> {
        let window = session.window;
        let next = if session.fired {
            if let Some(value) = self.agg.output(&session.acc) {
                session.emitted = Some((window, value.clone()));
                self.corrections.push((WindowResult { window, key: k.clone(), value }, window.end, 1));
            }
            self.lateness.release_at(complete_at(&window))
        } else {
            session.emit_at = window.end.max(arrived);
            self.hold.insert(session.emit_at, cap);
            complete_at(&window)
        };
        self.timers.bring_forward(&mut state.timer, next, k);
        session
    }

    /// Fires the sessions the watermark completes and forgets those it
    /// releases (past their end plus the allowed lateness).
    fn fire(
        &mut self,
        keys: &mut KeyedState<K, KeyStateOf<A, D>>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
    ) {
        if watermark <= self.fired_upto {
            return;
        }
        self.fired_upto = watermark;
        let lateness = self.lateness;
        while let Some((time, due)) = self.timers.pop_due(watermark) {
            for k in due {
                let Some(state) = keys.get_mut(&k) else {
                    continue;
                };
                if state.timer != time {
                    continue; // superseded by an earlier timer for the same key
                }
                for session in state.sessions.iter_mut() {
                    if !session.fired && complete_at(&session.window) <= watermark {
                        session.fired = true;
                        self.hold.remove(session.emit_at);
                        if let Some(value) = self.agg.output(&session.acc) {
                            // Without lateness no record reaches a fired session.
                            if lateness.0 > 0 {
                                session.emitted = Some((session.window, value.clone()));
                            }
                            let result = WindowResult { window: session.window, key: k.clone(), value };
                            self.firing.push((session.emit_at, (result, session.window.end, 1)));
                        }
                    }
                }
                state.sessions.retain(|s| lateness.release_at(complete_at(&s.window)) > watermark);
                let next = state
                    .sessions
                    .iter()
                    .map(|s| if s.fired { lateness.release_at(complete_at(&s.window)) } else { complete_at(&s.window) })
                    .min()
                    .unwrap_or(Timestamp::MAX);
                if state.sessions.is_empty() {
                    keys.remove(&k);
                } else {
                    state.timer = next;
                    self.timers.schedule(next, k);
                }
            }
        }
        // One output session per emission time, not per result.
        self.firing.sort_by_key(|(at, _)| *at);
        let mut due = self.firing.drain(..).peekable();
        while let Some((at, first)) = due.next() {
            let cap = self.hold.at(at);
            let mut session = results.session(&cap);
            session.give(first);
            while let Some((_, update)) = due.next_if(|(t, _)| *t == at) {
                session.give(update);
            }
        }
        drop(due);
        self.hold.settle(None);
    }
}

/// The session of `sessions` that holds `record` at `time` with a
/// multiplicity a retraction of `diff` can take back, if any.
fn holding<Acc, O, D: serde::Serialize>(
    sessions: &[Sess<Acc, O, D>],
    record: &D,
    time: Timestamp,
    diff: Diff,
) -> Option<usize> {
    sessions.iter().position(|s| {
        s.records.iter().flat_map(|r| r.iter()).any(|(t, d, m)| *t == time && *m >= -diff && same(d, record))
    })
}
