//! User-defined stateful operators: a function of each key's records, its
//! state and its event-time timers ([`KeyedProcess`], like Flink's
//! `KeyedProcessFunction`), with checkpoints and recovery from the model.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::rc::Rc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use smallvec::SmallVec;

use super::{
    AnyKeyedState, Clock, KeyedState, OperatorState, Schema, Snapshot, StateError, StateTtl, Stateful, Timers, WithTtl,
};
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::Counter;
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

    /// The key's state expired (see [`WithTtl::process_keyed`]): called
    /// with [`Expiry::Retract`](super::Expiry::Retract) only, at `time`, the
    /// first event time at which the state is gone, so that the function can
    /// emit retractions of what the state stood for (they go out at `time`).
    /// The state is still there to read; it is forgotten afterwards, while
    /// the key's timers stay.
    fn on_expire(&self, ctx: &mut KeyedContext<'_, K, Self::State, Self::Output>, time: Timestamp) {
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
    /// Whether the state was read or written (for its time-to-live).
    read: Cell<bool>,
    wrote: bool,
}

impl<K, S, O> KeyedContext<'_, K, S, O> {
    /// The key.
    pub fn key(&self) -> &K {
        self.key
    }

    /// The key's state, if it has one.
    pub fn state(&self) -> Option<&S> {
        self.read.set(true);
        self.state.as_ref()
    }

    /// The key's state, to change in place (`None`: no state).
    pub fn state_mut(&mut self) -> &mut Option<S> {
        self.wrote = true;
        self.state
    }

    /// The key's state, created with `init` if it has none.
    pub fn state_or_insert_with(&mut self, init: impl FnOnce() -> S) -> &mut S {
        self.wrote = true;
        self.state.get_or_insert_with(init)
    }

    /// Forgets the key's state.
    pub fn clear_state(&mut self) {
        self.wrote = true;
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

    /// Whether this access restarts the state's time-to-live: a write, or a
    /// read when reads refresh.
    fn refreshes(&self, on_read: bool) -> bool {
        self.wrote || (on_read && self.read.get())
    }
}

/// What a key's entry keeps for its state's time-to-live: nothing (`()`,
/// which encodes to no bytes) without one.
trait Stamp: Serialize + DeserializeOwned + Default + Send + 'static {
    fn ttl(&mut self) -> Option<&mut TtlStamp>;
}

impl Stamp for () {
    fn ttl(&mut self) -> Option<&mut TtlStamp> {
        None
    }
}

/// A key's state's time-to-live.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
struct TtlStamp {
    /// When the state was last refreshed, in event time (`Timestamp::MAX`:
    /// the key has no state).
    written: Timestamp,
    /// When the key's expiry timer is due (`Timestamp::MAX`: none).
    timer: Timestamp,
}

impl Default for TtlStamp {
    fn default() -> Self {
        TtlStamp { written: Timestamp::MAX, timer: Timestamp::MAX }
    }
}

impl Stamp for TtlStamp {
    fn ttl(&mut self) -> Option<&mut TtlStamp> {
        Some(self)
    }
}

/// The outputs of a [`KeyedProcess`] whose state expires
/// ([`WithTtl::process_keyed`]).
#[derive(Debug)]
pub struct TtlProcessed<'scope, O: 'static> {
    /// What the function emitted (with [`Expiry::Retract`](super::Expiry::Retract),
    /// also from [`KeyedProcess::on_expire`]).
    pub results: EventStream<'scope, O>,
    /// Keys whose state expired.
    pub expired: Counter,
}

/// A key's state and timers in the operator, and its state's time-to-live.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(serialize = "S: Serialize, T: Serialize", deserialize = "S: DeserializeOwned, T: DeserializeOwned"))]
struct KeyEntry<S, T> {
    state: Option<S>,
    /// Its timers' times (at most a few).
    timers: SmallVec<[Timestamp; 2]>,
    stamp: T,
}

impl<S, T: Default> Default for KeyEntry<S, T> {
    fn default() -> Self {
        KeyEntry { state: None, timers: SmallVec::new(), stamp: T::default() }
    }
}

impl<S, T> KeyEntry<S, T> {
    /// What the function sees of key `key` with this entry: timers it sets
    /// go to `scheduled`, what it emits to `out`.
    fn context<'a, K, O>(
        &'a mut self,
        key: &'a K,
        scheduled: &'a mut Vec<Timestamp>,
        out: &'a mut Vec<(O, Timestamp, Diff)>,
        watermark: Timestamp,
    ) -> KeyedContext<'a, K, S, O> {
        KeyedContext {
            key,
            state: &mut self.state,
            timers: &mut self.timers,
            scheduled,
            out,
            watermark,
            read: Cell::new(false),
            wrote: false,
        }
    }
}

/// The operator's state: every key's state and timers, and the timers by
/// time; with a time-to-live, each key's state's expiry (`T`).
struct ProcessState<K, D, P: KeyedProcess<K, D>, T> {
    keys: KeyedState<K, KeyEntry<P::State, T>>,
    /// Each timer with the time its output goes out at (its own, or the
    /// arrival of the record that set it if later).
    timers: Timers<(K, Timestamp)>,
    /// Keys whose state expires, at most one timer per key
    /// ([`TtlStamp::timer`]), brought forward when a state is set again.
    expiring: Timers<K>,
    _process: PhantomData<fn() -> (P, D)>,
}

impl<K, D, P: KeyedProcess<K, D>, T> Default for ProcessState<K, D, P, T> {
    fn default() -> Self {
        ProcessState {
            keys: KeyedState::default(),
            timers: Timers::default(),
            expiring: Timers::default(),
            _process: PhantomData,
        }
    }
}

impl<K: Key, D: 'static, P: KeyedProcess<K, D>, T: Stamp> OperatorState for ProcessState<K, D, P, T> {
    const SCHEMA: Schema = P::SCHEMA;
    const MIGRATES_FROM: &'static [u32] = P::MIGRATES_FROM;
    /// (key, its timers, its state encoded on its own, so that a migration
    /// reads the user's state alone, and its expiry: `()`, no bytes, without
    /// a time-to-live, so that a checkpoint of an operator without one reads
    /// as before; with one, the checkpoints of one setting do not restore
    /// into the other, as in Flink).
    type Entry = (K, SmallVec<[Timestamp; 2]>, Option<Vec<u8>>, T);
    type Prepared = ();

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.keys);
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.keys.len());
        let mut failed = None;
        let mut checked = 0usize;
        self.keys.for_each(|k, entry| {
            let state = match entry.state.as_ref().map(crate::checkpoint::encode).transpose() {
                Ok(state) => state,
                Err(e) => {
                    failed.get_or_insert(StateError::Encode { schema: P::SCHEMA, reason: e.to_string() });
                    None
                }
            };
            // The user's state is bytes inside the entry: a sample of it
            // must read back as its type (see `reads_back`).
            if let Some(bytes) = state.as_deref().filter(|_| checked < 8 || checked % 1024 == 0) {
                if let Err(e) = crate::checkpoint::decode::<P::State>(bytes) {
                    failed.get_or_insert(StateError::ReadBack {
                        schema: P::SCHEMA,
                        type_name: std::any::type_name::<P::State>().to_owned(),
                        reason: e.to_string(),
                    });
                }
            }
            checked += 1;
            out.push(route(k), &(k, &entry.timers, state, &entry.stamp));
        });
        if let Some(e) = failed {
            out.fail_with(e);
        }
    }

    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        let (k, timers, state, stamp): Self::Entry = crate::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: P::SCHEMA, reason: e.to_string() })?;
        let state = match state {
            Some(bytes) => Some(P::migrate(version, &bytes)?),
            None => None,
        };
        // Decoded next by the restore, in the encoding it reads.
        let state = state
            .map(|s| crate::checkpoint::encode_restoring(&s))
            .transpose()
            .map_err(|e| StateError::Encode { schema: P::SCHEMA, reason: e.to_string() })?;
        Ok((k, timers, state, stamp))
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
        if let Some(ttl) = StateTtl::of(&self.scope()) {
            return self.state_ttl(ttl).process_keyed(name, key, process).results;
        }
        self.process_keyed_core::<K, KF, P, ()>(name, key, process, None, Counter::new())
    }

    /// [`process_keyed`](Self::process_keyed) with or without a
    /// time-to-live (`T` is [`TtlStamp`] with one, `()` without).
    fn process_keyed_core<K, KF, P, T>(
        &self,
        name: &str,
        key: KF,
        process: P,
        ttl: Option<StateTtl>,
        expired: Counter,
    ) -> EventStream<'scope, P::Output>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        P: KeyedProcess<K, D>,
        T: Stamp,
    {
        let key = Rc::new(key);
        let key_route = Rc::clone(&key);
        let stateful = Stateful::<ProcessState<K, D, P, T>>::new(name, &self.scope());
        let gated = stateful.keyed_input(self, move |u: &Update<D>| route(&key_route(&u.0)));
        let mut op = stateful.builder(&self.scope());
        let mut input = op.input(gated);
        let (mut output, stream) = op.output::<P::Output>();
        op.build(move |initial, mut state| {
            let mut hold = Hold::default();
            state.restore(|st, _time, entries| {
                let mut failed = None;
                entries.for_each(|(k, timers, bytes, mut stamp)| {
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
                    if let (Some(ttl), Some(stamp)) = (ttl, stamp.ttl()) {
                        stamp.timer = Timestamp::MAX;
                        if user.is_some() && stamp.written != Timestamp::MAX {
                            let due = ttl.expires_at(stamp.written);
                            st.expiring.bring_forward(&mut stamp.timer, due, &k);
                            if ttl.retracts() {
                                hold.restore(due, &initial);
                            }
                        }
                    }
                    st.keys.insert(k, KeyEntry { state: user, timers, stamp });
                });
                if let Some(e) = failed {
                    entries.fail(e);
                }
            });
            drop(initial);
            let mut out: Vec<(P::Output, Timestamp, Diff)> = Vec::new();
            let mut scheduled: Vec<Timestamp> = Vec::new();
            // What `on_expire` emits for a state found expired by a record.
            let mut retracted: Vec<(P::Output, Timestamp, Diff)> = Vec::new();
            // Records by arrival, each time promised in the hold: handed over
            // once the watermark reaches their arrival, after every timer
            // before it (see `KeyedProcess`).
            let mut arrived: BTreeMap<Timestamp, Vec<Update<D>>> = BTreeMap::new();
            let on_read = ttl.is_some_and(|t| t.refreshes_on_read());
            // On the wall clock, expiry is checked when a key is touched and
            // at every activation (the event-time order below is not its).
            let wall = ttl.filter(|t| t.clock() == Clock::ProcessingTime);
            move |frontiers| {
                if !state.home() {
                    return;
                }
                let st = state.get();
                let now = wall.map(|_| wall_clock_ms());
                if let (Some(ttl), Some(now)) = (wall, now) {
                    while let Some((e, due)) = st.expiring.pop_due(now) {
                        for k in due {
                            let Some(mut entry) = st.keys.remove(&k) else { continue };
                            let stamp = entry.stamp.ttl().expect("a time-to-live keeps stamps");
                            if stamp.timer == e {
                                stamp.timer = Timestamp::MAX;
                                if entry.state.is_some() && stamp.written != Timestamp::MAX {
                                    let expires = ttl.expires_at(stamp.written);
                                    if expires > now {
                                        st.expiring.bring_forward(&mut stamp.timer, expires, &k);
                                    } else {
                                        stamp.written = Timestamp::MAX;
                                        entry.state = None;
                                        expired.add(1);
                                    }
                                }
                            }
                            if entry.state.is_some() || !entry.timers.is_empty() {
                                st.keys.insert(k, entry);
                            }
                        }
                    }
                }
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
                // Key `k`'s state expired at `x` (event time): forgotten; with
                // retractions, what `on_expire` emits (into `buffer`) goes out
                // at `x`, the timers it sets at or after it, and the hold's
                // promise at `x` is kept.
                macro_rules! expire_at {
                    ($entry:expr, $k:expr, $x:expr, $buffer:expr) => {{
                        let x = $x;
                        $entry.stamp.ttl().expect("a time-to-live keeps stamps").written = Timestamp::MAX;
                        if ttl.is_some_and(|t| t.retracts()) {
                            let mut ctx = $entry.context($k, &mut scheduled, &mut $buffer, watermark);
                            process.on_expire(&mut ctx, x);
                            for later in scheduled.drain(..) {
                                let emit_at = later.max(x);
                                hold.promise(emit_at);
                                st.timers.schedule(later, ($k.clone(), emit_at));
                            }
                            if !$buffer.is_empty() {
                                output.session(&hold.at(x)).give_iterator($buffer.drain(..));
                            }
                            hold.remove(x);
                        }
                        $entry.state = None;
                        expired.add(1);
                    }};
                }
                // Expiries, records and timers in time order: a state that
                // expires at `e` (the watermark passed its refresh plus the
                // time-to-live) is gone for the records that arrive at `e` and
                // for the timers at `e`; the records that arrive at a timer's
                // time come before it.
                loop {
                    // An expiry at `e` once the watermark has passed it (a cut at
                    // `e` holds the state; the retraction at `e` comes after it);
                    // a record that arrives at `e` before that finds the state
                    // expired (below).
                    let expiry_at = st.expiring.next().filter(|e| wall.is_none() && *e < watermark);
                    let records_at = arrived.first_key_value().map(|(t, _)| *t).filter(|t| *t <= watermark);
                    let timers_at = st.timers.next().filter(|t| *t < watermark);
                    let next = [(expiry_at, 0), (records_at, 1), (timers_at, 2)]
                        .into_iter()
                        .filter_map(|(t, rank)| t.map(|t| (t, rank)))
                        .min();
                    match next {
                        Some((e, 0)) => {
                            let ttl = ttl.expect("only a state with a time-to-live expires");
                            let (e, due) = st.expiring.pop_due(e).expect("an expiry is due at its time");
                            for k in due {
                                let Some(mut entry) = st.keys.remove(&k) else { continue };
                                let stamp = entry.stamp.ttl().expect("a time-to-live keeps stamps");
                                // Superseded by a timer brought forward.
                                if stamp.timer == e {
                                    stamp.timer = Timestamp::MAX;
                                    if entry.state.is_some() && stamp.written != Timestamp::MAX {
                                        let expires = ttl.expires_at(stamp.written);
                                        if expires > e {
                                            // Refreshed since: due later.
                                            st.expiring.bring_forward(&mut stamp.timer, expires, &k);
                                        } else {
                                            expire_at!(entry, &k, e, out);
                                        }
                                    }
                                }
                                if entry.state.is_some() || !entry.timers.is_empty() {
                                    st.keys.insert(k, entry);
                                }
                            }
                        }
                        Some((t, 2)) => {
                            let (t, due) = st.timers.pop_due(t).expect("a timer is due at its time");
                            for (k, emit_at) in due {
                                hold.remove(emit_at);
                                let Some(mut entry) = st.keys.remove(&k) else { continue };
                                // A cancelled timer (or one set again) is not due.
                                if let Some(i) = entry.timers.iter().position(|x| *x == t) {
                                    entry.timers.remove(i);
                                    expire_on_the_wall_clock(&mut entry, wall.zip(now), &expired);
                                    let mut ctx = entry.context(&k, &mut scheduled, &mut out, watermark);
                                    process.on_timer(&mut ctx, t);
                                    let refreshed = ctx.refreshes(on_read);
                                    for later in scheduled.drain(..) {
                                        // Set from a timer: at or after its time.
                                        let emit_at = later.max(emit_at);
                                        hold.promise(emit_at);
                                        st.timers.schedule(later, (k.clone(), emit_at));
                                    }
                                    if !out.is_empty() {
                                        output.session(&hold.at(emit_at)).give_iterator(out.drain(..));
                                    }
                                    if let Some(ttl) = ttl {
                                        stamp_after(
                                            &mut entry,
                                            &k,
                                            refreshed,
                                            now.unwrap_or(emit_at),
                                            ttl,
                                            &mut st.expiring,
                                            &mut hold,
                                        );
                                    }
                                }
                                if entry.state.is_some() || !entry.timers.is_empty() {
                                    st.keys.insert(k, entry);
                                }
                            }
                        }
                        Some((at, _)) => {
                            let records = arrived.remove(&at).expect("records wait at their arrival");
                            for (record, time, diff) in records {
                                let k = key(&record);
                                let mut entry = st.keys.remove(&k).unwrap_or_default();
                                expire_on_the_wall_clock(&mut entry, wall.zip(now), &expired);
                                if let Some(ttl) = ttl.filter(|_| wall.is_none()) {
                                    // Expired at or before this record's arrival, while the
                                    // watermark is at that expiry.
                                    let stamp = entry.stamp.ttl().expect("a time-to-live keeps stamps");
                                    let expires = ttl.expires_at(stamp.written);
                                    if entry.state.is_some() && stamp.written != Timestamp::MAX && expires <= at {
                                        expire_at!(entry, &k, expires, retracted);
                                    }
                                }
                                let mut ctx = entry.context(&k, &mut scheduled, &mut out, watermark);
                                process.on_record(&mut ctx, record, time, diff);
                                let refreshed = ctx.refreshes(on_read);
                                for t in scheduled.drain(..) {
                                    let emit_at = t.max(at);
                                    hold.promise(emit_at);
                                    st.timers.schedule(t, (k.clone(), emit_at));
                                }
                                if let Some(ttl) = ttl {
                                    // A late record refreshes at its arrival.
                                    stamp_after(
                                        &mut entry,
                                        &k,
                                        refreshed,
                                        now.unwrap_or(time.max(at)),
                                        ttl,
                                        &mut st.expiring,
                                        &mut hold,
                                    );
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
                        None => break,
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

/// The wall clock, in milliseconds since the epoch.
fn wall_clock_ms() -> Timestamp {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as Timestamp)
}

/// With a processing-time TTL (and the wall clock's `now`): forgets the
/// entry's state if it expired, before the function sees the key.
fn expire_on_the_wall_clock<S, T: Stamp>(
    entry: &mut KeyEntry<S, T>,
    wall: Option<(StateTtl, Timestamp)>,
    expired: &Counter,
) {
    let Some((ttl, now)) = wall else { return };
    let stamp = entry.stamp.ttl().expect("a time-to-live keeps stamps");
    if entry.state.is_some() && stamp.written != Timestamp::MAX && ttl.expires_at(stamp.written) <= now {
        entry.state = None;
        stamp.written = Timestamp::MAX;
        expired.add(1);
    }
}

/// After the function saw key `k` at `time` (a record's event time, or its
/// arrival if later; a timer's output time): the state's expiry follows
/// from whether it was refreshed, and its promise in the hold (with
/// retractions, the output owed at the expiry) moves with it.
fn stamp_after<K: Clone, S, T: Stamp>(
    entry: &mut KeyEntry<S, T>,
    k: &K,
    refreshed: bool,
    time: Timestamp,
    ttl: StateTtl,
    expiring: &mut Timers<K>,
    hold: &mut Hold,
) {
    let stamp = entry.stamp.ttl().expect("a time-to-live keeps stamps");
    let before = stamp.written;
    if entry.state.is_none() {
        stamp.written = Timestamp::MAX;
    } else if refreshed || before == Timestamp::MAX {
        stamp.written = if before == Timestamp::MAX { time } else { before.max(time) };
    }
    if stamp.written == before {
        return;
    }
    if ttl.retracts() {
        if before != Timestamp::MAX {
            hold.remove(ttl.expires_at(before));
        }
        if stamp.written != Timestamp::MAX {
            hold.promise(ttl.expires_at(stamp.written));
        }
    }
    if stamp.written != Timestamp::MAX {
        expiring.bring_forward(&mut stamp.timer, ttl.expires_at(stamp.written), k);
    }
}

impl<'scope, D: Data> WithTtl<'scope, D> {
    /// [`EventStream::process_keyed`] whose keys' state expires, in event
    /// time: a key's state last refreshed at event time `u` (written, or
    /// also read with [`Refresh::OnReadAndWrite`](super::Refresh::OnReadAndWrite);
    /// a record refreshes at its event time, or at its arrival if it came
    /// late, a timer at its time) is forgotten once the watermark passes
    /// `u + ttl`: records that arrive from then on, and timers from
    /// `u + ttl + 1` on, see no state. The key's timers stay. With
    /// [`Expiry::Retract`](super::Expiry::Retract) the function's
    /// [`on_expire`](KeyedProcess::on_expire) is called first, at
    /// `u + ttl + 1`, to retract what the state stood for. What expires is
    /// the same on any layout and after recovery; the expiry is part of the
    /// checkpoint, so a checkpoint taken with a time-to-live restores only
    /// into an operator with one (and one taken without, only without).
    ///
    /// # Examples
    /// A running total per account that retracts its last value when the
    /// account has been quiet for 10 s of event time:
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{Expiry, KeyedContext, KeyedProcess, Schema, StateTtl};
    /// use highwater_operators::Update;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    /// use timely::dataflow::operators::Input;
    ///
    /// struct Total;
    /// impl KeyedProcess<char, (char, i64)> for Total {
    ///     type State = i64;
    ///     type Output = (char, i64);
    ///     const SCHEMA: Schema = Schema::new("doc.total", 1);
    ///     fn on_record(&self, ctx: &mut KeyedContext<'_, char, i64, (char, i64)>, (a, v): (char, i64), t: Timestamp, _d: i64) {
    ///         let before = ctx.state().copied();
    ///         if let Some(before) = before {
    ///             ctx.emit((a, before), t, -1);
    ///         }
    ///         *ctx.state_mut() = Some(before.unwrap_or(0) + v);
    ///         ctx.emit((a, before.unwrap_or(0) + v), t, 1);
    ///     }
    ///     fn on_expire(&self, ctx: &mut KeyedContext<'_, char, i64, (char, i64)>, at: Timestamp) {
    ///         let (a, total) = (*ctx.key(), *ctx.state().unwrap());
    ///         ctx.emit((a, total), at, -1);
    ///     }
    /// }
    ///
    /// let captured = timely::execute_directly(|worker| {
    ///     let (mut deposits, captured) = worker.dataflow(|scope| {
    ///         let (input, deposits) = scope.new_input::<Vec<Update<(char, i64)>>>();
    ///         let ttl = StateTtl::event_time(10.secs()).expiry(Expiry::Retract);
    ///         let totals = EventStream::new(deposits).state_ttl(ttl).process_keyed("Total", |d: &(char, i64)| d.0, Total);
    ///         (input, totals.results.inner.capture())
    ///     });
    ///     // Each deposit at the watermark of its event time.
    ///     for (v, t) in [(5i64, 1_000u64), (7, 3_000), (2, 20_000)] {
    ///         deposits.advance_to(t);
    ///         deposits.send((('a', v), t, 1));
    ///     }
    ///     captured
    /// });
    /// let mut net = std::collections::BTreeMap::new();
    /// for (row, t, d) in captured.extract().into_iter().flat_map(|(_, d)| d) { *net.entry((t, row)).or_insert(0) += d; }
    /// net.retain(|_, d| *d != 0);
    /// // 12 from 3 s until the account expires at 13.001 s; then 2 afresh,
    /// // which expires at 30.001 s (the watermark passes it at the end).
    /// assert_eq!(net.into_iter().collect::<Vec<_>>(), vec![
    ///     ((1_000, ('a', 5)), 1), ((3_000, ('a', 5)), -1), ((3_000, ('a', 12)), 1),
    ///     ((13_001, ('a', 12)), -1), ((20_000, ('a', 2)), 1), ((30_001, ('a', 2)), -1),
    /// ]);
    /// ```
    pub fn process_keyed<K, KF, P>(&self, name: &str, key: KF, process: P) -> TtlProcessed<'scope, P::Output>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        P: KeyedProcess<K, D>,
    {
        let expired = Counter::new();
        crate::totals::Totals::count_in(&self.stream.scope(), &format!("{name}.expired"), &expired);
        let results =
            self.stream.process_keyed_core::<K, KF, P, TtlStamp>(name, key, process, Some(self.ttl), expired.clone());
        TtlProcessed { results, expired }
    }
}
