//! Count windows: windows of the last N records of a key, in event-time order.

use std::collections::VecDeque;
use std::rc::Rc;

use timely::dataflow::operators::{Capability, InputCapability};

use super::{consolidate, skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::Counter;
use crate::state::pending::Pending;
use crate::state::{
    give_all, ActiveOutput, AnyKeyedState, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp};

/// Windows of a number of records per key, counted in event-time order.
///
/// Records of a key are taken in event-time order once the watermark passes
/// them (ties in one millisecond by the records' own order, so the result does
/// not depend on arrival order). `sliding(size, slide)` fires every `slide`
/// records over the last `size` of them (fewer at the start), as Flink's
/// `countWindow(size, slide)`; `tumbling(size)` fires on every complete group
/// of `size`, as `countWindow(size)`. A result's window spans the first to the
/// last record's time, and its event time is the last record's.
///
/// A late record within the allowed lateness is put in its place, and every
/// window it shifts is retracted and emitted again; the state for this keeps
/// the records of the last `allowed lateness` ms plus `size` more.
///
/// A retraction takes its record out of the key's sequence, and every window
/// it shifts is retracted and emitted again (a retraction and an insertion of
/// the same record in one millisecond cancel out before the windows see them).
/// A retraction of a record the key does not hold (any more: beyond the
/// allowed lateness) goes to the late output.
///
/// Count windows are checkpointable: a checkpoint holds, per key, those
/// records with the position of the first and the windows emitted over them
/// (what a late record retracts), and the records still waiting for the
/// watermark, which a recovery emits at their event times.
///
/// ```
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// let captured = timely::example(|scope| {
///     let prices = vec![(10u64, 1_000u64, 1i64), (20, 2_000, 1), (60, 3_000, 1)];
///     EventStream::new(prices.to_stream(scope))
///         .window(CountWindows::sliding(2, 1))
///         .aggregate(Sum::of(|p: &u64| *p as i64))
///         .results.inner.capture()
/// });
/// let out: Vec<i64> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(r, _, _)| r.value).collect();
/// assert_eq!(out, vec![10, 30, 80]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountWindows {
    size: u64,
    slide: u64,
    tumbling: bool,
}

impl CountWindows {
    /// Every complete group of `size` records.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn tumbling(size: u64) -> Self {
        assert!(size > 0, "a count window holds at least one record");
        CountWindows { size, slide: size, tumbling: true }
    }
    /// Every `slide` records, the last `size` records ("the last N events").
    ///
    /// # Panics
    /// If `size` or `slide` is zero.
    pub fn sliding(size: u64, slide: u64) -> Self {
        assert!(size > 0 && slide > 0, "count windows need a positive size and slide");
        CountWindows { size, slide, tumbling: false }
    }

    /// Whether a window ends at the record with absolute index `i`, and where it starts.
    fn window_ending_at(&self, i: u64) -> Option<u64> {
        if (i + 1) % self.slide != 0 {
            return None;
        }
        if self.tumbling {
            Some(i + 1 - self.size)
        } else {
            Some((i + 1).saturating_sub(self.size))
        }
    }
}

/// The processed records of a key and the windows emitted over them.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyState<D, O> {
    /// Processed records in order; `history[0]` has absolute index `base`.
    history: VecDeque<(Timestamp, D)>,
    base: u64,
    /// Emitted windows: (absolute index of the last record, window, value).
    emitted: VecDeque<(u64, Window, O)>,
    /// Changed since the last trim.
    touched: bool,
}

impl<D, O> KeyState<D, O> {
    fn new() -> Self {
        KeyState { history: VecDeque::new(), base: 0, emitted: VecDeque::new(), touched: false }
    }
}

/// A key's checkpoint entry: its processed records and emitted windows (if
/// any), and its updates waiting for the watermark, as `(event time, (record,
/// diff))`.
type KeyEntry<K, D, O> = (K, Option<KeyState<D, O>>, Vec<(Timestamp, (D, Diff))>);

/// The operator's state: the keys' records and windows, and the records
/// waiting for the watermark.
struct CountState<K, D, O> {
    keys: KeyedState<K, KeyState<D, O>>,
    waiting: Pending<(D, Diff)>,
}

impl<K, D, O> Default for CountState<K, D, O> {
    fn default() -> Self {
        CountState { keys: KeyedState::default(), waiting: Pending::default() }
    }
}

impl<K: Key, D: Data, O: Data> OperatorState for CountState<K, D, O> {
    const SCHEMA: Schema = Schema::new("window.count", 1);
    type Entry = KeyEntry<K, D, O>;
    /// The waiting records' keys, in the order they wait (key functions stay
    /// on the worker: they need not be `Send`).
    type Prepared = Vec<K>;

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.keys);
    }

    /// The records waiting for the watermark.
    fn held(&self) -> (usize, u64) {
        self.waiting.held()
    }

    /// Each key's records and emitted windows, and its records waiting for
    /// the watermark.
    fn snapshot(&self, held_keys: Vec<K>, out: &mut Snapshot) {
        let mut held = self.waiting.by_key(held_keys);
        out.reserve(self.keys.len() + held.len());
        self.keys.for_each(|k, state| {
            let records = held.remove(k).unwrap_or_default();
            out.push(route(k), &(k, Some(state), records));
        });
        for (k, records) in held {
            out.push(route(&k), &(&k, None::<&KeyState<D, O>>, records));
        }
    }
}

impl<D: Data + Ord> WindowSpec<D> for CountWindows {
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
        let spec = self;
        let key = Rc::new(key);
        let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
            skeleton::<CountState<K, D, A::Output>, _, _, _, _>(stream, name, &key);

        builder.build(move |initial_capabilities, mut managed| {
            let mut op = CountOp {
                key,
                agg,
                spec,
                lateness,
                counter: late_count,
                // Results go out on output 0, unmatched retractions on the late output 1.
                hold: Hold::with_outputs(2),
                processed_upto: 0,
                touched: Vec::new(),
                out: Vec::new(),
                emitted: Vec::new(),
                late: Vec::new(),
            };
            managed.restore(|st, time, entries| op.restore(st, time, entries, &initial_capabilities));
            drop(initial_capabilities);

            move |frontiers| {
                if !managed.home() {
                    return;
                }
                let state = managed.get();
                let mut results = results_out.activate();
                let mut late = late_out.activate();
                input.for_each_stamp(|cap, data| {
                    let arrived = arrival_time(&cap);
                    for batch in data {
                        for (record, time, diff) in batch.drain(..) {
                            op.take(state, record, time, diff, arrived, &cap);
                        }
                    }
                    give_all(&mut results, &cap, &mut op.out);
                    give_all(&mut late, &cap, &mut op.late);
                });
                let watermark = watermark_of(&frontiers[0]);
                op.advance(state, watermark, &mut results, &mut late);
                let key = &op.key;
                managed.checkpoint_with(watermark, |st| st.waiting.keys(|(d, _)| key(d)));
            }
        });

        windowed
    }
}

/// Puts `count` copies of `record` at `time` in their place among a key's
/// processed records (a negative `count` takes them out), retracting every
/// window they shift and emitting it again (into `out`); returns how many
/// copies a retraction found no record to take.
#[allow(clippy::too_many_arguments)]
fn shift<K: Key, D: Data + Ord, A: Aggregate<D>>(
    state: &mut KeyState<D, A::Output>,
    record: &D,
    time: Timestamp,
    count: Diff,
    agg: &A,
    k: &K,
    spec: CountWindows,
    out: &mut Vec<Update<WindowResult<K, A::Output>>>,
    emitted: &mut Vec<(u64, Window, A::Output)>,
) -> Diff {
    for done in 0..count.abs() {
        // An insertion goes after its equals, a retraction takes the first of them.
        let pos = state.history.partition_point(|(t, d)| match (*t, d).cmp(&(time, record)) {
            std::cmp::Ordering::Equal => count > 0,
            less_or_greater => less_or_greater.is_lt(),
        });
        if count < 0 && state.history.get(pos).is_none_or(|(t, d)| *t != time || d != record) {
            return -count - done;
        }
        let abs = state.base + pos as u64;
        while state.emitted.back().is_some_and(|(last, _, _)| *last >= abs) {
            let (_, window, value) = state.emitted.pop_back().expect("checked non-empty");
            out.push((WindowResult { window, key: k.clone(), value }, window.end - 1, -1));
        }
        if count > 0 {
            state.history.insert(pos, (time, record.clone()));
        } else {
            state.history.remove(pos);
        }
        let end = state.base + state.history.len() as u64;
        evaluate(spec, state, abs, end, agg, k, out, emitted);
        state.emitted.extend(emitted.drain(..));
    }
    0
}

/// The windows ending at absolute indexes `from..to`, computed from the
/// key's records: results into `out`, and with their values into `emitted`.
#[allow(clippy::too_many_arguments)]
fn evaluate<K: Key, D, A: Aggregate<D>>(
    spec: CountWindows,
    state: &KeyState<D, A::Output>,
    from: u64,
    to: u64,
    agg: &A,
    k: &K,
    out: &mut Vec<Update<WindowResult<K, A::Output>>>,
    emitted: &mut Vec<(u64, Window, A::Output)>,
) {
    for i in from..to {
        let Some(first) = spec.window_ending_at(i) else {
            continue;
        };
        let first = first.max(state.base);
        let mut acc = agg.init();
        let records = state.history.range((first - state.base) as usize..=(i - state.base) as usize);
        let mut window = Window::new(Timestamp::MAX, 0);
        for (t, d) in records {
            agg.update(&mut acc, d, 1);
            window.start = window.start.min(*t);
            window.end = window.end.max(t + 1);
        }
        if let Some(value) = agg.output(&acc) {
            out.push((WindowResult { window, key: k.clone(), value: value.clone() }, window.end - 1, 1));
            emitted.push((i, window, value));
        }
    }
}

/// The count-window operator's work on a worker, step by step: records in
/// ([`take`](Self::take): waiting for the watermark, or, late but allowed,
/// put in place), and the watermark's advance ([`advance`](Self::advance):
/// the waiting records processed in event-time order, histories trimmed).
struct CountOp<K, KF, A: Aggregate<D>, D> {
    key: Rc<KF>,
    agg: A,
    spec: CountWindows,
    lateness: AllowedLateness,
    counter: Counter,
    hold: Hold,
    /// The watermark up to which waiting records have been processed.
    processed_upto: Timestamp,
    /// Keys changed since they were last trimmed.
    touched: Vec<K>,
    /// Results of the step being taken, and scratch for `evaluate`.
    out: Vec<Update<WindowResult<K, A::Output>>>,
    emitted: Vec<(u64, Window, A::Output)>,
    /// Late records of the stamp being taken in.
    late: Vec<Update<D>>,
}

impl<K, KF, A, D> CountOp<K, KF, A, D>
where
    K: Key,
    KF: Fn(&D) -> K,
    A: Aggregate<D>,
    D: Data + Ord,
{
    /// Recovery: each key's records and emitted windows, and its records
    /// waiting for the watermark (which owe their results at their time).
    fn restore(
        &mut self,
        st: &mut CountState<K, D, A::Output>,
        time: Timestamp,
        entries: &mut RestoredEntries<CountState<K, D, A::Output>>,
        initial: &[Capability<Timestamp>],
    ) {
        self.processed_upto = time;
        // Sized at once: entries come in the old map's hash order (see the aligned windows).
        st.keys.reserve(entries.len());
        entries.for_each(|(k, state, held)| {
            for (t, record) in held {
                st.waiting.restore(record, t, t.max(time), &mut self.hold, initial);
            }
            if let Some(state) = state {
                if state.touched {
                    self.touched.push(k.clone());
                }
                st.keys.insert(k, state);
            }
        });
    }

    /// Takes in one update that arrived at `arrived` (under `cap`).
    fn take(
        &mut self,
        CountState { keys, waiting }: &mut CountState<K, D, A::Output>,
        record: D,
        time: Timestamp,
        diff: Diff,
        arrived: Timestamp,
        cap: &InputCapability<Timestamp>,
    ) {
        // Too late by its own time: judged first, so that the outcome
        // does not depend on how far this operator has got.
        if self.lateness.release_at(time.saturating_add(1)) <= arrived {
            self.late.push((record, time, diff));
            self.counter.add(1);
            return;
        }
        if diff == 0 {
            return;
        }
        if time >= self.processed_upto {
            waiting.insert((record, diff), time, arrived, &mut self.hold, cap);
            return;
        }
        // Late but allowed: insert in place (or take out), re-emit every
        // shifted window.
        let k = (self.key)(&record);
        let state = keys.get_or_insert_with(k.clone(), KeyState::new);
        if !std::mem::replace(&mut state.touched, true) {
            self.touched.push(k.clone());
        }
        let left = shift(state, &record, time, diff, &self.agg, &k, self.spec, &mut self.out, &mut self.emitted);
        if left > 0 {
            // More retracted than the window holds (or trimmed): not applied.
            self.late.push((record, time, -left));
            self.counter.add(1);
        }
    }

    /// The watermark reached `watermark`: the records waiting below it are
    /// processed in event-time order, and the keys that changed trimmed.
    fn advance(
        &mut self,
        CountState { keys, waiting }: &mut CountState<K, D, A::Output>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
        late: &mut ActiveOutput<'_, D>,
    ) {
        if watermark <= self.processed_upto {
            return;
        }
        self.processed_upto = watermark;
        let (spec, agg) = (self.spec, &self.agg);
        while let Some((time, mut records, emit_at)) = waiting.pop_time_before(watermark, &mut self.hold) {
            // Ties in one millisecond in the records' own order, not arrival order.
            consolidate(&mut records);
            for (record, net) in records {
                if net < 0 {
                    // A retraction of a record no window holds (its insertion came
                    // later, or never): the history has nothing at this time yet.
                    late.session(&self.hold.at_or_after_on(emit_at, 1)).give((record, time, net));
                    self.counter.add(1);
                    continue;
                }
                let k = (self.key)(&record);
                let state = keys.get_or_insert_with(k.clone(), KeyState::new);
                if !std::mem::replace(&mut state.touched, true) {
                    self.touched.push(k.clone());
                }
                for _ in 0..net {
                    state.history.push_back((time, record.clone()));
                    let end = state.base + state.history.len() as u64;
                    evaluate(spec, state, end - 1, end, agg, &k, &mut self.out, &mut self.emitted);
                    state.emitted.extend(self.emitted.drain(..));
                }
            }
            if !self.out.is_empty() {
                results.session(&self.hold.at(emit_at)).give_iterator(self.out.drain(..));
            }
        }
        // Keep the records a late record could still shift, plus a window's
        // worth before them. Only keys that changed need trimming: the others
        // were trimmed when they last changed and hold at most that much.
        let horizon = watermark.saturating_sub(self.lateness.0);
        for k in self.touched.drain(..) {
            let Some(state) = keys.get_mut(&k) else { continue };
            state.touched = false;
            let recent = state.base + state.history.partition_point(|(t, _)| *t < horizon) as u64;
            let keep_from =
                if spec.tumbling { recent - recent % spec.size } else { recent.saturating_sub(spec.size - 1) }
                    .max(state.base);
            state.history.drain(..(keep_from - state.base) as usize);
            state.base = keep_from;
            while state.emitted.front().is_some_and(|(last, _, _)| *last < recent) {
                state.emitted.pop_front();
            }
            // An empty key is forgotten only where the count restarts at 0.
            if state.history.is_empty() && state.base % spec.slide == 0 {
                keys.remove(&k);
            }
        }
        self.hold.settle(None);
    }
}
