//! Global windows: one window per key for all time, fired by a trigger.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{de::DeserializeOwned, Serialize};

use super::count::Pending;
use super::{consolidate, skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::state::{OperatorState, Schema, Snapshot};
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
    windows: StateMap<K, W>,
    waiting: Pending<(D, Diff)>,
}

impl<K, W, D> Default for GlobalState<K, W, D> {
    fn default() -> Self {
        GlobalState { windows: StateMap::default(), waiting: Pending::default() }
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

    /// Each key's window, its records waiting for the watermark, and the last period.
    fn snapshot(&self, (held_keys, last_period): (Vec<K>, u64), out: &mut Snapshot) {
        let mut held = self.waiting.by_key(held_keys);
        out.reserve(self.windows.len() + held.len());
        for (k, w) in self.windows.iter() {
            let records = held.remove(k).unwrap_or_default();
            out.push(route(k), &(k, Some(w), records, last_period));
        }
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
        agg: A,
    ) -> Windowed<'scope, K, A::Output, D>
    where
        D: Data,
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        aggregate(stream, name, key, self.trigger, lateness, agg)
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

fn aggregate<'scope, D, K, KF, T, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: KF,
    trigger: T,
    lateness: AllowedLateness,
    agg: A,
) -> Windowed<'scope, K, A::Output, D>
where
    D: Data + Ord,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    T: Trigger<D>,
    A: Aggregate<D>,
{
    let key = Rc::new(key);
    let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
        skeleton::<GlobalState<K, KeyWindowOf<D, T, A>, D>, _, _, _, _>(stream, name, &key);
    let counter = late_count;
    let activator = builder.activator();
    let period = trigger.processing_period();

    builder.build(move |initial_capabilities, mut managed| {
        let mut timers: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
        // Results go out on output 0, retractions no window holds on the late output 1.
        let mut hold = Hold::with_outputs(2);
        let mut processed_upto: Timestamp = 0;
        let mut last_period: u64 = period.map(|p| wall_clock_ms() / p * p).unwrap_or(0);
        // The processing-time firing at the end of input has happened.
        let mut flushed = false;
        // Recovery: each key's window with its trigger state and timer, its
        // records waiting for the watermark, and the last processing-time period.
        managed.restore(|GlobalState { windows, waiting }, time, entries| {
            processed_upto = time;
            // A final checkpoint is taken after the end-of-input firing.
            flushed = time == END_OF_TIME;
            let mut restored_period = None::<u64>;
            // Sized at once: entries come in the old map's hash order (see the aligned windows).
            windows.reserve(entries.len());
            entries.for_each(|(k, window, held, period)| {
                restored_period = restored_period.max(Some(period));
                for (t, record) in held {
                    waiting.restore(record, t, time, &mut hold, &initial_capabilities);
                }
                if let Some(w) = window {
                    if let Some(at) = w.timer {
                        timers.entry(at).or_default().push(k.clone());
                    }
                    windows.insert(k, w);
                }
            });
            if period.is_some() {
                last_period = restored_period.unwrap_or(last_period);
            }
            // Timers and processing-time firings emit under a capability held at
            // the watermark (the floor below): take it back at the cut.
            if time < END_OF_TIME && (!timers.is_empty() || period.is_some() && !windows.is_empty()) {
                hold.restore(time, &initial_capabilities);
                hold.remove(time);
            }
        });
        drop(initial_capabilities);
        let mut out = Vec::new();
        let mut touched: Vec<K> = Vec::new();

        let new_window = |agg: &A, time| KeyWindow {
            acc: agg.init(),
            trigger: T::State::default(),
            start: time,
            filled: false,
            changed: false,
            emitted: None,
            timer: None,
        };

        move |frontiers| {
            // While a background thread snapshots the windows and waiting records
            // (the timers stay: the windows carry them too), nothing is done.
            if !managed.home() {
                return;
            }
            let GlobalState { windows, waiting } = managed.get();
            let mut results = results_out.activate();
            let mut late = late_out.activate();

            // Adds a record to its key's window and runs the trigger.
            let add = |record: D,
                       time: Timestamp,
                       windows: &mut StateMap<K, KeyWindow<_, _, _>>,
                       timers: &mut BTreeMap<Timestamp, Vec<K>>,
                       out: &mut Vec<_>,
                       touched: &mut Vec<K>,
                       emit_time: Timestamp| {
                let k = key(&record);
                touched.push(k.clone());
                let w = windows.entry(k.clone()).or_insert_with(|| new_window(&agg, time));
                if !w.filled {
                    w.filled = true;
                    w.start = time;
                }
                w.changed = true;
                agg.update(&mut w.acc, &record, 1);
                let action = trigger.on_record(&mut w.trigger, &record, time);
                act::<K, D, T, A>(action, &k, w, Window::new(w.start, time + 1), emit_time, &agg, out);
                if let Some(at) = trigger.next_event_time(&w.trigger, time) {
                    if w.timer.is_none_or(|t| at < t) && at > processed_upto {
                        w.timer = Some(at);
                        timers.entry(at).or_default().push(k);
                    }
                }
            };

            // Takes a record out of its key's window (the trigger sees insertions
            // only); `false` if the key's window holds no records (none yet, or
            // none since it was purged) to take it from.
            let retract =
                |record: &D, diff: Diff, windows: &mut StateMap<K, KeyWindow<_, _, _>>, touched: &mut Vec<K>| {
                    let k = key(record);
                    let Some(w) = windows.get_mut(&k).filter(|w| w.filled) else { return false };
                    agg.update(&mut w.acc, record, diff);
                    w.changed = true;
                    touched.push(k);
                    true
                };

            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                for batch in data {
                    for (record, time, diff) in batch.drain(..) {
                        if diff <= 0 {
                            if diff == 0 {
                                continue;
                            }
                            if lateness.release_at(time.saturating_add(1)) <= arrived {
                                late.session(&cap).give((record, time, diff));
                                counter.add(1);
                            } else if time >= processed_upto {
                                waiting.insert((record, diff), time, arrived, &mut hold, &cap);
                            } else if !retract(&record, diff, windows, &mut touched) {
                                late.session(&cap).give((record, time, diff));
                                counter.add(1);
                            }
                            continue;
                        }
                        for _ in 0..diff {
                            if lateness.release_at(time.saturating_add(1)) <= arrived {
                                late.session(&cap).give((record.clone(), time, 1));
                                counter.add(1);
                            } else if time >= processed_upto {
                                waiting.insert((record.clone(), 1), time, arrived, &mut hold, &cap);
                            } else {
                                // Late but allowed: added now, out of order. Its window may
                                // fire later (a timer, the processing-time period), so keep a
                                // capability; the floor below holds it from then on.
                                hold.retain(&cap);
                                add(record.clone(), time, windows, &mut timers, &mut out, &mut touched, arrived);
                            }
                        }
                    }
                }
                if !out.is_empty() {
                    results.session(&cap).give_iterator(out.drain(..));
                }
            });

            let watermark = watermark_of(&frontiers[0]);
            if watermark > processed_upto {
                // Records and event-time timers in time order; a timer at `t`
                // fires before records at `t` are added.
                loop {
                    let next_record = waiting.first_time().filter(|t| *t < watermark);
                    let next_timer = timers.first_key_value().map(|(t, _)| *t).filter(|t| *t <= watermark);
                    match (next_record, next_timer) {
                        (_, Some(t)) if next_record.is_none_or(|r| t <= r) => {
                            let (t, due) = timers.pop_first().expect("checked above");
                            let emit = t.saturating_sub(1);
                            for k in due {
                                let Some(w) = windows.get_mut(&k) else {
                                    continue;
                                };
                                if w.timer != Some(t) {
                                    continue;
                                }
                                w.timer = None;
                                touched.push(k.clone());
                                let action = trigger.on_event_time(&mut w.trigger, t);
                                act::<K, D, T, A>(action, &k, w, Window::new(w.start, t), emit, &agg, &mut out);
                            }
                            if !out.is_empty() {
                                results.session(&hold.at_or_after(emit)).give_iterator(out.drain(..));
                            }
                        }
                        (Some(_), _) => {
                            let (time, mut records, emit_at) =
                                waiting.pop_before(watermark, &mut hold).expect("checked above");
                            // Ties in one millisecond in the records' own order, not arrival
                            // order; a retraction and an insertion of a record cancel out.
                            consolidate(&mut records);
                            for (record, net) in records {
                                if net < 0 {
                                    if !retract(&record, net, windows, &mut touched) {
                                        late.session(&hold.at_or_after_on(emit_at, 1)).give((record, time, net));
                                        counter.add(1);
                                    }
                                    continue;
                                }
                                for _ in 0..net {
                                    add(record.clone(), time, windows, &mut timers, &mut out, &mut touched, emit_at);
                                }
                            }
                            if !out.is_empty() {
                                results.session(&hold.at(emit_at)).give_iterator(out.drain(..));
                            }
                        }
                        _ => break,
                    }
                }
                processed_upto = watermark;
            }

            if let Some(period) = period {
                let now = wall_clock_ms();
                let this_period = now / period * period;
                let ended = watermark == END_OF_TIME;
                if this_period > last_period || (ended && !flushed) {
                    flushed = ended;
                    // At the end of input the watermark is the end of time: emit at the held time.
                    let emit = processed_upto
                        .min(hold.least().unwrap_or(processed_upto))
                        .min(hold.time().unwrap_or(END_OF_TIME));
                    let window = Window::new(last_period, this_period.max(last_period + 1));
                    for (k, w) in windows.iter_mut() {
                        let mut action = trigger.on_processing_time(&mut w.trigger, this_period);
                        // The input ends: what changed since the last firing goes out now.
                        if ended && w.changed && action == TriggerAction::Continue {
                            action = TriggerAction::Fire;
                        }
                        act::<K, D, T, A>(action, k, w, window, emit, &agg, &mut out);
                    }
                    if !out.is_empty() {
                        results.session(&hold.at_or_after(emit)).give_iterator(out.drain(..));
                    }
                    out.clear();
                    last_period = this_period;
                    // Every window may have been purged: look at all of them, once a period.
                    windows.retain(|_, w| w.filled || w.timer.is_some() || w.emitted.is_some());
                }
                if !ended {
                    activator.activate_after(std::time::Duration::from_millis(last_period + period - now));
                }
            }
            // Windows left empty (purged, no timer, nothing to retract) are forgotten.
            for k in touched.drain(..) {
                if windows.get(&k).is_some_and(|w| !(w.filled || w.timer.is_some() || w.emitted.is_some())) {
                    windows.remove(&k);
                }
            }
            // Processing-time firings may come at any moment: hold the watermark while windows exist.
            let floor = (period.is_some() && !windows.is_empty() || !timers.is_empty())
                .then_some(processed_upto)
                .filter(|t| *t < END_OF_TIME);
            hold.settle(floor);
            // The waiting records' keys are taken here (key functions need not be `Send`).
            managed.checkpoint_with(watermark, |st| (st.waiting.keys(|(d, _)| key(d)), last_period));
        }
    });

    windowed
}
