//! Global windows: one window per key for all time, fired by a trigger.

use std::marker::PhantomData;
use std::rc::Rc;
use std::slice::IterMut;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{de::DeserializeOwned, Serialize};
use timely::dataflow::operators::{Capability, InputCapability};
use timely::scheduling::Activator;

use super::{consolidate, skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::Counter;
use crate::state::pending::Pending;
use crate::state::{
    give_all, ActiveOutput, AnyKeyedState, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot, Timers,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp, END_OF_TIME};

/// What a trigger asks of its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerAction {
    /// Nothing.
    Continue,
    /// Emit the window's result; keep its contents (the next firing replaces
    /// this result: a retraction and the new value).
    Fire,
    /// Emit the result, then empty the window (the next firing is a new result).
    FireAndPurge,
    /// Empty the window without emitting.
    Purge,
}

/// Decides when a global window fires, from its records, event time and
/// processing time, like Flink's `Trigger`.
///
/// Records reach the trigger in event-time order (the operator waits for the
/// watermark to pass them; records with equal times in their own order), so
/// count- and event-time-based firings do not depend on arrival order.
pub trait Trigger<D>: 'static {
    /// Per-key trigger state, snapshotted with the window.
    type State: Clone + Default + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static;

    /// A record at `time` was added to the window.
    fn on_record(&self, state: &mut Self::State, record: &D, time: Timestamp) -> TriggerAction;

    /// The event time at which [`Trigger::on_event_time`] should next be
    /// called for this key, after a record at `time`.
    fn next_event_time(&self, _state: &Self::State, _time: Timestamp) -> Option<Timestamp> {
        None
    }

    /// The watermark passed a time asked for by [`Trigger::next_event_time`].
    fn on_event_time(&self, _state: &mut Self::State, _time: Timestamp) -> TriggerAction {
        TriggerAction::Continue
    }

    /// If the trigger acts on processing time: the period, in wall-clock ms.
    fn processing_period(&self) -> Option<u64> {
        None
    }

    /// Wall-clock time reached a multiple of the processing period.
    fn on_processing_time(&self, _state: &mut Self::State, _now: u64) -> TriggerAction {
        TriggerAction::Continue
    }
}

/// Fires every `n` records.
#[derive(Clone, Copy, Debug)]
pub struct CountTrigger(pub u64);

impl<D> Trigger<D> for CountTrigger {
    type State = u64;
    fn on_record(&self, seen: &mut u64, _record: &D, _time: Timestamp) -> TriggerAction {
        *seen += 1;
        if *seen >= self.0 {
            *seen = 0;
            TriggerAction::Fire
        } else {
            TriggerAction::Continue
        }
    }
}

/// Fires whenever the watermark passes a multiple of `period` (epoch-aligned)
/// after a record arrived.
#[derive(Clone, Copy, Debug)]
pub struct EventTimeTrigger(pub u64);

impl<D> Trigger<D> for EventTimeTrigger {
    type State = ();
    fn on_record(&self, _: &mut (), _record: &D, _time: Timestamp) -> TriggerAction {
        TriggerAction::Continue
    }
    fn next_event_time(&self, _: &(), time: Timestamp) -> Option<Timestamp> {
        Some((time / self.0 + 1).saturating_mul(self.0))
    }
    fn on_event_time(&self, _: &mut (), _time: Timestamp) -> TriggerAction {
        TriggerAction::Fire
    }
}

/// Fires every `period` ms of wall-clock time (aligned to the epoch) for keys
/// that received records since their last firing, and once more when the
/// input ends.
#[derive(Clone, Copy, Debug)]
pub struct ProcessingTimeTrigger(pub u64);

impl<D> Trigger<D> for ProcessingTimeTrigger {
    /// Records since the last firing.
    type State = bool;
    fn on_record(&self, fresh: &mut bool, _record: &D, _time: Timestamp) -> TriggerAction {
        *fresh = true;
        TriggerAction::Continue
    }
    fn processing_period(&self) -> Option<u64> {
        Some(self.0)
    }
    fn on_processing_time(&self, fresh: &mut bool, _now: u64) -> TriggerAction {
        if std::mem::take(fresh) {
            TriggerAction::Fire
        } else {
            TriggerAction::Continue
        }
    }
}

/// Turns every `Fire` of the inner trigger into `FireAndPurge`.
#[derive(Clone, Copy, Debug)]
pub struct Purging<T>(pub T);

fn purge(action: TriggerAction) -> TriggerAction {
    match action {
        TriggerAction::Fire => TriggerAction::FireAndPurge,
        other => other,
    }
}

impl<D, T: Trigger<D>> Trigger<D> for Purging<T> {
    type State = T::State;
    fn on_record(&self, state: &mut T::State, record: &D, time: Timestamp) -> TriggerAction {
        purge(self.0.on_record(state, record, time))
    }
    fn next_event_time(&self, state: &T::State, time: Timestamp) -> Option<Timestamp> {
        self.0.next_event_time(state, time)
    }
    fn on_event_time(&self, state: &mut T::State, time: Timestamp) -> TriggerAction {
        purge(self.0.on_event_time(state, time))
    }
    fn processing_period(&self) -> Option<u64> {
        self.0.processing_period()
    }
    fn on_processing_time(&self, state: &mut T::State, now: u64) -> TriggerAction {
        purge(self.0.on_processing_time(state, now))
    }
}

/// One window per key for all time, fired by a [`Trigger`].
///
/// A firing reports the window `[first record's time, firing time)`, in event
/// time for record and event-time firings, and in wall-clock milliseconds
/// (`[previous period, this period)`) for processing-time firings. Records
/// later than the watermark by more than the allowed lateness go to the late
/// output; later ones within it reach the trigger on arrival.
///
/// Global windows are checkpointable: a checkpoint holds each key's window
/// (accumulator, trigger state, event-time timer, whether records came since
/// the last firing, the result a next firing retracts), the records waiting
/// for the watermark, and the last processing-time period. Record and
/// event-time firings recover exactly; a processing-time trigger resumes its
/// state, and its first firing after a recovery reports the window from the
/// last period before the checkpoint to the current one (periods that ended
/// while the job was down fire once, late).
///
/// ```
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// let captured = timely::example(|scope| {
///     let xs = vec![(1u64, 10u64, 1i64), (2, 20, 1), (3, 30, 1), (4, 40, 1), (5, 50, 1)];
///     EventStream::new(xs.to_stream(scope))
///         .window(GlobalWindows::with_trigger(CountTrigger(2).purging()))
///         .aggregate(Sum::of(|x: &u64| *x as i64))
///         .results.inner.capture()
/// });
/// let sums: Vec<i64> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(r, _, _)| r.value).collect();
/// assert_eq!(sums, vec![3, 7]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GlobalWindows<T> {
    trigger: T,
}

impl<T> GlobalWindows<T> {
    /// Global windows fired by `trigger`.
    pub fn with_trigger(trigger: T) -> Self {
        GlobalWindows { trigger }
    }
}

macro_rules! purging {
    ($($ty:ident),*) => {$(
        impl $ty {
            /// The same trigger, emptying the window after each firing.
            pub fn purging(self) -> Purging<Self> {
                Purging(self)
            }
        }
    )*};
}
purging!(CountTrigger, EventTimeTrigger, ProcessingTimeTrigger);

/// A key's window.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyWindow<Acc, S, O> {
    acc: Acc,
    trigger: S,
    /// Event time of the first record since the last purge.
    start: Timestamp,
    /// Whether the window holds records since the last purge.
    filled: bool,
    /// Whether records came since the last firing.
    changed: bool,
    emitted: Option<(Window, O)>,
    /// The event-time timer set for this key, if any.
    timer: Option<Timestamp>,
}

type KeyWindowOf<D, T, A> = KeyWindow<<A as Aggregate<D>>::Acc, <T as Trigger<D>>::State, <A as Aggregate<D>>::Output>;

/// A key's checkpoint entry: its window (if any, with its trigger state and
/// event-time timer), its records waiting for the watermark as `(event time,
/// record)`, and the operator's last processing-time period (the start of the
/// next processing-time firing's window).
type KeyEntry<K, W, D> = (K, Option<W>, Vec<(Timestamp, (D, Diff))>, u64);

/// The operator's state: the keys' windows, and the records waiting for
/// the watermark.
struct GlobalState<K, W, D> {
    windows: KeyedState<K, W>,
    waiting: Pending<(D, Diff)>,
}

impl<K, W, D> Default for GlobalState<K, W, D> {
    fn default() -> Self {
        GlobalState { windows: KeyedState::default(), waiting: Pending::default() }
    }
}

impl<K, W, D> OperatorState for GlobalState<K, W, D>
where
    K: Key,
    W: Serialize + DeserializeOwned + Send + 'static,
    D: Data,
{
    const SCHEMA: Schema = Schema::new("window.global", 1);
    type Entry = KeyEntry<K, W, D>;
    /// The waiting records' keys in the order they wait (key functions stay
    /// on the worker), and the last processing-time period.
    type Prepared = (Vec<K>, u64);

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.windows);
    }

    /// The records waiting for the watermark.
    fn held(&self) -> (usize, u64) {
        self.waiting.held()
    }

    /// Each key's window, its records waiting for the watermark, and the last period.
    fn snapshot(&self, (held_keys, last_period): (Vec<K>, u64), out: &mut Snapshot) {
        let mut held = self.waiting.by_key(held_keys);
        out.reserve(self.windows.len() + held.len());
        self.windows.for_each(|k, w| {
            let records = held.remove(k).unwrap_or_default();
            out.push(route(k), &(k, Some(w), records, last_period));
        });
        for (k, records) in held {
            out.push(route(&k), &(&k, None::<&W>, records, last_period));
        }
    }
}

impl<D: Data + Ord, T: Trigger<D>> WindowSpec<D> for GlobalWindows<T> {
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
        let trigger = self.trigger;
        let key = Rc::new(key);
        let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
            skeleton::<GlobalState<K, KeyWindowOf<D, T, A>, D>, _, _, _, _>(stream, name, &key);
        let activator = builder.activator();
        let period = trigger.processing_period();

        builder.build(move |initial_capabilities, mut managed| {
            let mut op = GlobalOperator {
                key,
                trigger,
                agg,
                lateness,
                counter: late_count,
                period,
                activator,
                timers: Timers::default(),
                // Results go out on output 0, retractions no window holds on the late output 1.
                hold: Hold::with_outputs(2),
                processed_upto: 0,
                last_period: period.map(|p| wall_clock_ms() / p * p).unwrap_or(0),
                flushed: false,
                out: Vec::new(),
                touched: Vec::new(),
                _records: PhantomData,
            };
            managed.restore(|state, time, entries| op.restore(state, time, entries, &initial_capabilities));
            drop(initial_capabilities);

            move |frontiers| {
                // While a background thread snapshots the windows and waiting records
                // (the timers stay: the windows carry them too), nothing is done.
                if !managed.home() {
                    return;
                }
                let state = managed.get();
                let mut results = results_out.activate();
                let mut late = late_out.activate();
                input.for_each_stamp(|cap, data| op.take_input(state, &cap, data, &mut results, &mut late));
                let watermark = watermark_of(&frontiers[0]);
                op.advance(state, watermark, &mut results, &mut late);
                op.fire_processing_time(&mut state.windows, watermark, &mut results);
                op.forget_empty(&mut state.windows);
                op.settle(&state.windows);
                // The waiting records' keys are taken here (key functions need not be `Send`).
                managed.checkpoint_with(watermark, |st| (st.waiting.keys(|(d, _)| (op.key)(d)), op.last_period));
            }
        });

        windowed
    }
}

fn wall_clock_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[allow(clippy::too_many_arguments)]
fn act<K: Key, D, T: Trigger<D>, A: Aggregate<D>>(
    action: TriggerAction,
    k: &K,
    w: &mut KeyWindow<A::Acc, T::State, A::Output>,
    window: Window,
    time: Timestamp,
    agg: &A,
    out: &mut Vec<Update<WindowResult<K, A::Output>>>,
) {
    let (fire, purge) = match action {
        TriggerAction::Continue => return,
        TriggerAction::Fire => (true, false),
        TriggerAction::FireAndPurge => (true, true),
        TriggerAction::Purge => (false, true),
    };
    if fire {
        w.changed = false;
        if let Some((old_window, old)) = w.emitted.take() {
            out.push((WindowResult { window: old_window, key: k.clone(), value: old }, time, -1));
        }
        if let Some(value) = agg.output(&w.acc) {
            out.push((WindowResult { window, key: k.clone(), value: value.clone() }, time, 1));
            w.emitted = Some((window, value));
        }
    }
    if purge {
        w.acc = agg.init();
        w.filled = false;
        // A purged window's result stands: the next firing is a new window.
        w.emitted = None;
    }
}

impl<Acc, S: Default, O> KeyWindow<Acc, S, O> {
    /// An empty window whose accumulator is `acc`, starting at `start`.
    fn new(acc: Acc, start: Timestamp) -> Self {
        KeyWindow { acc, trigger: S::default(), start, filled: false, changed: false, emitted: None, timer: None }
    }
}

/// A global window operator's own part, besides its checkpointed
/// [`GlobalState`]: its functions, the keys' event-time timers, the hold on
/// its outputs and its processing-time clock. Each activation takes the
/// records in ([`take_input`](Self::take_input)), advances to the watermark
/// ([`advance`](Self::advance): waiting records and event-time timers in time
/// order), fires the processing-time trigger when a period ends
/// ([`fire_processing_time`](Self::fire_processing_time)), forgets the windows
/// left empty and settles the hold.
struct GlobalOperator<K, D, KF, T, A: Aggregate<D>> {
    key: Rc<KF>,
    trigger: T,
    agg: A,
    lateness: AllowedLateness,
    counter: Counter,
    /// The trigger's processing-time period, if it has one.
    period: Option<u64>,
    /// Wakes the operator up at the end of a processing-time period.
    activator: Activator,
    /// The keys whose window has an event-time timer, by time.
    timers: Timers<K>,
    hold: Hold,
    /// The watermark up to which waiting records and timers have been taken.
    processed_upto: Timestamp,
    /// The start of the current processing-time period.
    last_period: u64,
    /// The processing-time firing at the end of input has happened.
    flushed: bool,
    /// Results to emit under the capability of the step that made them.
    out: Vec<Update<WindowResult<K, A::Output>>>,
    /// Keys whose windows changed in this activation (and may now be empty).
    touched: Vec<K>,
    _records: PhantomData<fn(&D)>,
}

impl<K, D, KF, T, A> GlobalOperator<K, D, KF, T, A>
where
    K: Key,
    D: Data + Ord,
    KF: Fn(&D) -> K,
    T: Trigger<D>,
    A: Aggregate<D>,
{
    /// Recovery: each key's window with its trigger state and timer, its
    /// records waiting for the watermark, and the last processing-time
    /// period, as checkpointed at `time`.
    fn restore(
        &mut self,
        GlobalState { windows, waiting }: &mut GlobalState<K, KeyWindowOf<D, T, A>, D>,
        time: Timestamp,
        entries: &mut RestoredEntries<GlobalState<K, KeyWindowOf<D, T, A>, D>>,
        initial: &[Capability<Timestamp>],
    ) {
        self.processed_upto = time;
        // A final checkpoint is taken after the end-of-input firing.
        self.flushed = time == END_OF_TIME;
        let mut restored_period = None::<u64>;
        // Sized at once: entries come in the old map's hash order (see the aligned windows).
        windows.reserve(entries.len());
        entries.for_each(|(k, window, held, period)| {
            restored_period = restored_period.max(Some(period));
            for (t, record) in held {
                waiting.restore(record, t, t.max(time), &mut self.hold, initial);
            }
            if let Some(w) = window {
                if let Some(at) = w.timer {
                    self.timers.schedule(at, k.clone());
                }
                windows.insert(k, w);
            }
        });
        if self.period.is_some() {
            self.last_period = restored_period.unwrap_or(self.last_period);
        }
        // Timers and processing-time firings emit under a capability held at
        // the watermark (the floor below): take it back at the cut.
        if time < END_OF_TIME && (!self.timers.is_empty() || self.period.is_some() && !windows.is_empty()) {
            self.hold.restore(time, initial);
            self.hold.remove(time);
        }
    }

    /// Adds a record to its key's window and runs the trigger; what fires
    /// goes out at `emit_time`.
    fn add(
        &mut self,
        windows: &mut KeyedState<K, KeyWindowOf<D, T, A>>,
        record: D,
        time: Timestamp,
        emit_time: Timestamp,
    ) {
        let k = (self.key)(&record);
        self.touched.push(k.clone());
        let w = windows.get_or_insert_with(k.clone(), || KeyWindow::new(self.agg.init(), time));
        if !w.filled {
            w.filled = true;
            w.start = time;
        }
        w.changed = true;
        self.agg.update(&mut w.acc, &record, 1);
        let action = self.trigger.on_record(&mut w.trigger, &record, time);
        act::<K, D, T, A>(action, &k, w, Window::new(w.start, time + 1), emit_time, &self.agg, &mut self.out);
        if let Some(at) = self.trigger.next_event_time(&w.trigger, time) {
            if w.timer.is_none_or(|t| at < t) && at > self.processed_upto {
                w.timer = Some(at);
                self.timers.schedule(at, k);
            }
        }
    }

    /// Takes a record out of its key's window (the trigger sees insertions
    /// only); `false` if the key's window holds no records (none yet, or
    /// none since it was purged) to take it from.
    fn retract(&mut self, windows: &mut KeyedState<K, KeyWindowOf<D, T, A>>, record: &D, diff: Diff) -> bool {
        let k = (self.key)(record);
        let Some(w) = windows.get_mut(&k).filter(|w| w.filled) else { return false };
        self.agg.update(&mut w.acc, record, diff);
        w.changed = true;
        self.touched.push(k);
        true
    }

    /// Takes in the records of one stamp (`cap`): a record the watermark has
    /// not passed waits for it; a later one within the allowed lateness is
    /// added (or retracted) at once; later ones go to the late output.
    fn take_input(
        &mut self,
        GlobalState { windows, waiting }: &mut GlobalState<K, KeyWindowOf<D, T, A>, D>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<D>>>,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
        late: &mut ActiveOutput<'_, D>,
    ) {
        let arrived = arrival_time(cap);
        for batch in data {
            for (record, time, diff) in batch.drain(..) {
                if diff <= 0 {
                    if diff == 0 {
                        continue;
                    }
                    if self.lateness.release_at(time.saturating_add(1)) <= arrived {
                        late.session(cap).give((record, time, diff));
                        self.counter.add(1);
                    } else if time >= self.processed_upto {
                        waiting.insert((record, diff), time, arrived, &mut self.hold, cap);
                    } else if !self.retract(windows, &record, diff) {
                        late.session(cap).give((record, time, diff));
                        self.counter.add(1);
                    }
                    continue;
                }
                for _ in 0..diff {
                    if self.lateness.release_at(time.saturating_add(1)) <= arrived {
                        late.session(cap).give((record.clone(), time, 1));
                        self.counter.add(1);
                    } else if time >= self.processed_upto {
                        waiting.insert((record.clone(), 1), time, arrived, &mut self.hold, cap);
                    } else {
                        // Late but allowed: added now, out of order. Its window may
                        // fire later (a timer, the processing-time period), so keep a
                        // capability; the floor below holds it from then on.
                        self.hold.retain(cap);
                        self.add(windows, record.clone(), time, arrived);
                    }
                }
            }
        }
        give_all(results, cap, &mut self.out);
    }

    /// Takes the waiting records and event-time timers the watermark has
    /// passed, in time order; a timer at `t` fires before records at `t` are
    /// added.
    fn advance(
        &mut self,
        state: &mut GlobalState<K, KeyWindowOf<D, T, A>, D>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
        late: &mut ActiveOutput<'_, D>,
    ) {
        if watermark <= self.processed_upto {
            return;
        }
        loop {
            let next_record = state.waiting.first_time().filter(|t| *t < watermark);
            let next_timer = self.timers.next().filter(|t| *t <= watermark);
            match (next_record, next_timer) {
                (_, Some(t)) if next_record.is_none_or(|r| t <= r) => {
                    self.fire_event_time(&mut state.windows, results);
                }
                (Some(_), _) => self.add_waiting(state, watermark, results, late),
                _ => break,
            }
        }
        self.processed_upto = watermark;
    }

    /// Fires the earliest event-time timers (all at one time).
    fn fire_event_time(
        &mut self,
        windows: &mut KeyedState<K, KeyWindowOf<D, T, A>>,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
    ) {
        let (t, due) = self.timers.pop_due(END_OF_TIME).expect("checked above");
        let emit = t.saturating_sub(1);
        for k in due {
            let Some(w) = windows.get_mut(&k) else {
                continue;
            };
            if w.timer != Some(t) {
                continue;
            }
            w.timer = None;
            self.touched.push(k.clone());
            let action = self.trigger.on_event_time(&mut w.trigger, t);
            act::<K, D, T, A>(action, &k, w, Window::new(w.start, t), emit, &self.agg, &mut self.out);
        }
        if !self.out.is_empty() {
            results.session(&self.hold.at_or_after(emit)).give_iterator(self.out.drain(..));
        }
    }

    /// Adds (or retracts) the earliest waiting records below `watermark`
    /// (all at one time).
    fn add_waiting(
        &mut self,
        GlobalState { windows, waiting }: &mut GlobalState<K, KeyWindowOf<D, T, A>, D>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
        late: &mut ActiveOutput<'_, D>,
    ) {
        let (time, mut records, emit_at) = waiting.pop_time_before(watermark, &mut self.hold).expect("checked above");
        // Ties in one millisecond in the records' own order, not arrival
        // order; a retraction and an insertion of a record cancel out.
        consolidate(&mut records);
        for (record, net) in records {
            if net < 0 {
                if !self.retract(windows, &record, net) {
                    late.session(&self.hold.at_or_after_on(emit_at, 1)).give((record, time, net));
                    self.counter.add(1);
                }
                continue;
            }
            for _ in 0..net {
                self.add(windows, record.clone(), time, emit_at);
            }
        }
        if !self.out.is_empty() {
            results.session(&self.hold.at(emit_at)).give_iterator(self.out.drain(..));
        }
    }

    /// With a processing-time trigger: fires every window once a period has
    /// ended (or the input has), and asks to be woken up at the end of the
    /// next one.
    fn fire_processing_time(
        &mut self,
        windows: &mut KeyedState<K, KeyWindowOf<D, T, A>>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
    ) {
        let Some(period) = self.period else { return };
        let now = wall_clock_ms();
        let this_period = now / period * period;
        let ended = watermark == END_OF_TIME;
        if this_period > self.last_period || (ended && !self.flushed) {
            self.flushed = ended;
            // At the end of input the watermark is the end of time: emit at the held time.
            let emit = self
                .processed_upto
                .min(self.hold.least().unwrap_or(self.processed_upto))
                .min(self.hold.time().unwrap_or(END_OF_TIME));
            let window = Window::new(self.last_period, this_period.max(self.last_period + 1));
            windows.for_each_mut(|k, w| {
                let mut action = self.trigger.on_processing_time(&mut w.trigger, this_period);
                // The input ends: what changed since the last firing goes out now.
                if ended && w.changed && action == TriggerAction::Continue {
                    action = TriggerAction::Fire;
                }
                act::<K, D, T, A>(action, k, w, window, emit, &self.agg, &mut self.out);
            });
            if !self.out.is_empty() {
                results.session(&self.hold.at_or_after(emit)).give_iterator(self.out.drain(..));
            }
            self.out.clear();
            self.last_period = this_period;
            // Every window may have been purged: look at all of them, once a period.
            windows.retain(|_, w| w.filled || w.timer.is_some() || w.emitted.is_some());
        }
        if !ended {
            self.activator.activate_after(std::time::Duration::from_millis(self.last_period + period - now));
        }
    }

    /// Forgets the windows this activation left empty (purged, no timer,
    /// nothing to retract).
    fn forget_empty(&mut self, windows: &mut KeyedState<K, KeyWindowOf<D, T, A>>) {
        for k in self.touched.drain(..) {
            if windows.get(&k).is_some_and(|w| !(w.filled || w.timer.is_some() || w.emitted.is_some())) {
                windows.remove(&k);
            }
        }
    }

    /// Settles the hold: processing-time firings may come at any moment, so
    /// the watermark is held while windows exist (and while timers are set).
    fn settle(&mut self, windows: &KeyedState<K, KeyWindowOf<D, T, A>>) {
        let floor = (self.period.is_some() && !windows.is_empty() || !self.timers.is_empty())
            .then_some(self.processed_upto)
            .filter(|t| *t < END_OF_TIME);
        self.hold.settle(floor);
    }
}
