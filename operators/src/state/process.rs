//! User-defined stateful operators: a function of each key's records, its
//! state and its event-time timers ([`KeyedProcess`], like Flink's
//! `KeyedProcessFunction`), with checkpoints and recovery from the model.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::rc::Rc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use smallvec::SmallVec;

use super::{AnyKeyedState, KeyedState, OperatorState, Schema, Snapshot, StateError, Stateful, Timers};
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, Diff, Timestamp};

/// A stateful function of a keyed stream: what it does with each record of
/// a key and when a timer of the key is due, given the key's state.
///
/// The operator that runs it ([`EventStream::process_keyed`]) exchanges the
/// records by key, keeps each key's [`State`](Self::State) and timers,
/// checkpoints them (under [`SCHEMA`](Self::SCHEMA)) and restores them on any
/// number of workers, and holds its output back so that what a timer emits
/// goes out at the timer's time.
///
/// - Records are handed over in order of arrival (not of event time), with
///   their event time and diff; what [`KeyedContext::emit`] emits then goes
///   out at the record's arrival (its timely time).
/// - A timer set at `t` ([`KeyedContext::schedule`]) is due once the
///   watermark passes `t`, that is once every record with an event time at
///   or before `t` has arrived (as Flink's event-time timers); what is
///   emitted then goes out at `t` (or at the arrival of the record that set
///   it, if that came later). A checkpoint cut at `t` therefore keeps the
///   timer, and the recovered job fires it.
/// - Timers and records are interleaved in time order: a record is handed
///   over once the watermark reaches its arrival, after every timer before
///   that arrival (and before the timers at it). What a key's function sees, and so what it
///   emits, does not depend on how the records and the watermark happened to
///   interleave on the way (on the number of workers, on where a checkpoint
///   cut fell): a recovered job emits what an uninterrupted one would.
/// - A key whose state is `None` and which has no timer is forgotten.
pub trait KeyedProcess<K, D>: 'static {
    /// A key's state.
    type State: Serialize + DeserializeOwned + Send + 'static;
    /// What the function emits.
    type Output: Data;
    /// The schema of the checkpointed state: bump the version when
    /// [`State`](Self::State)'s encoded form changes.
    const SCHEMA: Schema;
    /// Older versions of the schema that [`migrate`](Self::migrate) reads.
    const MIGRATES_FROM: &'static [u32] = &[];

    /// A record of the key arrived: `time` is its event time, `diff` its
    /// multiplicity change (negative for a retraction).
    fn on_record(
        &self,
        ctx: &mut KeyedContext<'_, K, Self::State, Self::Output>,
        record: D,
        time: Timestamp,
        diff: Diff,
    );

    /// The watermark passed `time`, at which the key has a timer.
    fn on_timer(&self, ctx: &mut KeyedContext<'_, K, Self::State, Self::Output>, time: Timestamp) {
        let _ = (ctx, time);
    }

    /// A key's state written under `version` of the schema (one of
    /// [`MIGRATES_FROM`](Self::MIGRATES_FROM)), as today's state.
    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::State, StateError> {
        let _ = bytes;
        Err(StateError::Schema { found: Schema { name: Self::SCHEMA.name.clone(), version }, expected: Self::SCHEMA })
    }
}

/// What a [`KeyedProcess`] sees of its key: the key, its state, its timers,
/// the watermark, and where to emit.
#[derive(Debug)]
pub struct KeyedContext<'a, K, S, O> {
    key: &'a K,
    state: &'a mut Option<S>,
    timers: &'a mut SmallVec<[Timestamp; 2]>,
    scheduled: &'a mut Vec<Timestamp>,
    out: &'a mut Vec<(O, Timestamp, Diff)>,
    watermark: Timestamp,
}

impl<K, S, O> KeyedContext<'_, K, S, O> {
    /// The key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// The key's state, if it has one.
    pub fn state(&self) -> Option<&S> {
        self.state.as_ref()
    }

    /// The key's state, to change in place (`None`: no state).
    pub fn state_mut(&mut self) -> &mut Option<S> {
        self.state
    }

    /// The key's state, created with `init` if it has none.
    pub fn state_or_insert_with(&mut self, init: impl FnOnce() -> S) -> &mut S {
        self.state.get_or_insert_with(init)
    }

    /// Forgets the key's state.
    pub fn clear_state(&mut self) {
        *self.state = None;
    }

    /// The operator's input watermark: every record with an event time before
    /// it has arrived (a record before it arrives late).
    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// Sets a timer of the key at `time` (once per time).
    pub fn schedule(&mut self, time: Timestamp) {
        if !self.timers.contains(&time) {
            self.timers.push(time);
            self.scheduled.push(time);
        }
    }

    /// Removes the key's timer at `time`, if set.
    pub fn cancel(&mut self, time: Timestamp) {
        self.timers.retain(|t| *t != time);
    }

    /// The key's timers.
    pub fn timers(&self) -> &[Timestamp] {
        self.timers
    }

    /// Emits `value` with event time `time` and multiplicity `diff`.
    pub fn emit(&mut self, value: O, time: Timestamp, diff: Diff) {
        self.out.push((value, time, diff));
    }
}

/// A key's state and timers in the operator.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(serialize = "S: Serialize", deserialize = "S: DeserializeOwned"))]
struct KeyEntry<S> {
    state: Option<S>,
    /// Its timers' times (at most a few).
    timers: SmallVec<[Timestamp; 2]>,
}

impl<S> Default for KeyEntry<S> {
    fn default() -> Self {
        KeyEntry { state: None, timers: SmallVec::new() }
    }
}

impl<S> KeyEntry<S> {
    /// What the function sees of key `key` with this entry: timers it sets
    /// go to `scheduled`, what it emits to `out`.
    fn context<'a, K, O>(
        &'a mut self,
        key: &'a K,
        scheduled: &'a mut Vec<Timestamp>,
        out: &'a mut Vec<(O, Timestamp, Diff)>,
        watermark: Timestamp,
    ) -> KeyedContext<'a, K, S, O> {
        KeyedContext { key, state: &mut self.state, timers: &mut self.timers, scheduled, out, watermark }
    }
}

/// The operator's state: every key's state and timers, and the timers by time.
struct ProcessState<K, D, P: KeyedProcess<K, D>> {
    keys: KeyedState<K, KeyEntry<P::State>>,
    /// Each timer with the time its output goes out at (its own, or the
    /// arrival of the record that set it if later).
    timers: Timers<(K, Timestamp)>,
    _process: PhantomData<fn() -> (P, D)>,
}

impl<K, D, P: KeyedProcess<K, D>> Default for ProcessState<K, D, P> {
    fn default() -> Self {
        ProcessState { keys: KeyedState::default(), timers: Timers::default(), _process: PhantomData }
    }
}

impl<K: Key, D: 'static, P: KeyedProcess<K, D>> OperatorState for ProcessState<K, D, P> {
    const SCHEMA: Schema = P::SCHEMA;
    const MIGRATES_FROM: &'static [u32] = P::MIGRATES_FROM;
    /// (key, its timers, its state encoded on its own, so that a migration
    /// reads the user's state alone).
    type Entry = (K, SmallVec<[Timestamp; 2]>, Option<Vec<u8>>);
    type Prepared = ();

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.keys);
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.keys.len());
        let mut failed = None;
        self.keys.for_each(|k, entry| {
            let state = match entry.state.as_ref().map(crate::checkpoint::encode).transpose() {
                Ok(state) => state,
                Err(e) => {
                    failed.get_or_insert(e);
                    None
                }
            };
            out.push(route(k), &(k, &entry.timers, state));
        });
        if let Some(e) = failed {
            out.fail(e);
        }
    }

    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        let (k, timers, state): Self::Entry = crate::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: P::SCHEMA, reason: e.to_string() })?;
        let state = match state {
            Some(bytes) => Some(P::migrate(version, &bytes)?),
            None => None,
        };
        let state = state
            .map(|s| crate::checkpoint::encode(&s))
            .transpose()
            .map_err(|e| StateError::Encode { schema: P::SCHEMA, reason: e.to_string() })?;
        Ok((k, timers, state))
    }
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// Runs `process` over the stream keyed by `key`: a stateful operator
    /// written as its own logic only (see [`KeyedProcess`]); its state is
    /// checkpointed and restored like every built-in operator's.
    ///
    /// # Examples
    /// Flags a sensor's reading more than 10 above its previous one, and a
    /// sensor silent for 5 s of event time:
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{KeyedContext, KeyedProcess, Schema};
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// struct Jumps;
    /// impl KeyedProcess<char, (char, i64)> for Jumps {
    ///     type State = (i64, Timestamp); // last reading, its time
    ///     type Output = String;
    ///     const SCHEMA: Schema = Schema::new("doc.jumps", 1);
    ///     fn on_record(&self, ctx: &mut KeyedContext<'_, char, (i64, Timestamp), String>, (s, v): (char, i64), t: Timestamp, _d: i64) {
    ///         if let Some((last, _)) = ctx.state() {
    ///             if v > last + 10 {
    ///                 ctx.emit(format!("{s} jumped to {v}"), t, 1);
    ///             }
    ///         }
    ///         *ctx.state_mut() = Some((v, t));
    ///         ctx.schedule(t + 5_000);
    ///     }
    ///     fn on_timer(&self, ctx: &mut KeyedContext<'_, char, (i64, Timestamp), String>, at: Timestamp) {
    ///         if ctx.state().is_some_and(|(_, t)| t + 5_000 == at) {
    ///             ctx.emit(format!("{} silent since {}", ctx.key(), at - 5_000), at, 1);
    ///         }
    ///     }
    /// }
    ///
    /// let captured = timely::example(|scope| {
    ///     let readings = vec![(('a', 1i64), 1_000u64, 1i64), (('a', 20), 2_000, 1), (('b', 5), 9_000, 1)];
    ///     EventStream::new(readings.to_stream(scope)).process_keyed("Jumps", |r: &(char, i64)| r.0, Jumps).inner.capture()
    /// });
    /// let out: Vec<String> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(s, _, _)| s).collect();
    /// assert_eq!(out, vec!["a jumped to 20", "a silent since 2000", "b silent since 9000"]);
    /// ```
    pub fn process_keyed<K, KF, P>(&self, name: &str, key: KF, process: P) -> EventStream<'scope, P::Output>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        P: KeyedProcess<K, D>,
    {
        let key = Rc::new(key);
        let key_route = Rc::clone(&key);
        let stateful = Stateful::<ProcessState<K, D, P>>::new(name, &self.scope());
        let gated = stateful.keyed_input(self, move |u: &Update<D>| route(&key_route(&u.0)));
        let mut op = stateful.builder(&self.scope());
        let mut input = op.input(gated);
        let (mut output, stream) = op.output::<P::Output>();
        op.build(move |initial, mut state| {
            let mut hold = Hold::default();
            state.restore(|st, _time, entries| {
                let mut failed = None;
                entries.for_each(|(k, timers, bytes)| {
                    let user = match bytes.map(|b| crate::checkpoint::decode::<P::State>(&b)).transpose() {
                        Ok(user) => user,
                        Err(e) => {
                            failed.get_or_insert(StateError::Decode { schema: P::SCHEMA, reason: e.to_string() });
                            return;
                        }
                    };
                    for t in timers.iter() {
                        hold.restore(*t, &initial);
                        st.timers.schedule(*t, (k.clone(), *t));
                    }
                    st.keys.insert(k, KeyEntry { state: user, timers });
                });
                if let Some(e) = failed {
                    entries.fail(e);
                }
            });
            drop(initial);
            let mut out: Vec<(P::Output, Timestamp, Diff)> = Vec::new();
            let mut scheduled: Vec<Timestamp> = Vec::new();
            // Records by arrival, each time promised in the hold: handed over
            // once the watermark reaches their arrival, after every timer
            // before it (see `KeyedProcess`).
            let mut arrived: BTreeMap<Timestamp, Vec<Update<D>>> = BTreeMap::new();
            move |frontiers| {
                if !state.home() {
                    return;
                }
                let st = state.get();
                let watermark = watermark_of(&frontiers[0]);
                let mut output = output.activate();
                input.for_each_stamp(|cap, data| {
                    let at = arrival_time(&cap);
                    let records = arrived.entry(at).or_insert_with(|| {
                        hold.insert(at, &cap);
                        Vec::new()
                    });
                    for batch in data {
                        records.append(batch);
                    }
                });
                // Timers and records in time order, the records that arrive at a
                // timer's time before it.
                loop {
                    let records_at = arrived.first_key_value().map(|(t, _)| *t).filter(|t| *t <= watermark);
                    let timers_at = st.timers.next().filter(|t| *t < watermark);
                    match (timers_at, records_at) {
                        (Some(t), r) if r.is_none_or(|r| t < r) => {
                            let (t, due) = st.timers.pop_due(t).expect("a timer is due at its time");
                            for (k, emit_at) in due {
                                hold.remove(emit_at);
                                let Some(mut entry) = st.keys.remove(&k) else { continue };
                                // A cancelled timer (or one set again) is not due.
                                if let Some(i) = entry.timers.iter().position(|x| *x == t) {
                                    entry.timers.remove(i);
                                    process.on_timer(&mut entry.context(&k, &mut scheduled, &mut out, watermark), t);
                                    for later in scheduled.drain(..) {
                                        // Set from a timer: at or after its time.
                                        let emit_at = later.max(emit_at);
                                        hold.promise(emit_at);
                                        st.timers.schedule(later, (k.clone(), emit_at));
                                    }
                                    if !out.is_empty() {
                                        output.session(&hold.at(emit_at)).give_iterator(out.drain(..));
                                    }
                                }
                                if entry.state.is_some() || !entry.timers.is_empty() {
                                    st.keys.insert(k, entry);
                                }
                            }
                        }
                        (_, Some(at)) => {
                            let records = arrived.remove(&at).expect("records wait at their arrival");
                            for (record, time, diff) in records {
                                let k = key(&record);
                                let mut entry = st.keys.remove(&k).unwrap_or_default();
                                process.on_record(
                                    &mut entry.context(&k, &mut scheduled, &mut out, watermark),
                                    record,
                                    time,
                                    diff,
                                );
                                for t in scheduled.drain(..) {
                                    let emit_at = t.max(at);
                                    hold.promise(emit_at);
                                    st.timers.schedule(t, (k.clone(), emit_at));
                                }
                                if entry.state.is_some() || !entry.timers.is_empty() {
                                    st.keys.insert(k, entry);
                                }
                            }
                            if !out.is_empty() {
                                output.session(&hold.at(at)).give_iterator(out.drain(..));
                            }
                            hold.remove(at);
                        }
                        _ => break,
                    }
                }
                // A cut is taken at a watermark the gate holds: every record
                // before it has arrived and was handed over.
                debug_assert!(!state.due(watermark) || arrived.is_empty(), "records wait across a cut");
                hold.settle(None);
                state.checkpoint(watermark, ());
            }
        });
        stream
    }
}
