//! The operator behind tumbling, sliding and function-assigned windows:
//! windows that do not merge, so each record updates its windows in place.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::rc::Rc;
use std::slice::IterMut;

use smallvec::SmallVec;
use timely::dataflow::operators::InputCapability;
use timely::scheduling::Activator;

use super::{skeleton, AssignWindows, Skeleton, Window, WindowResult, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::late::Counter;
use crate::state::{ActiveOutput, OperatorState, RestoredEntries, Schema, Snapshot};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Timestamp};

/// Results a window operator emits per activation when it fires windows it
/// releases at once (no allowed lateness). It is activated again for the rest,
/// so that a large window does not hold the worker (and the operators
/// downstream, a sink's first rows) until all of its results are out.
const FIRE_FUEL: usize = 100_000;

/// A bucket being fired: its windows' end, the time its results go out at,
/// and the slots left.
type Firing<K, Acc, O> = (Timestamp, Timestamp, <StateMap<(Timestamp, K), Slot<Acc, O>> as IntoIterator>::IntoIter);

/// Per window and key: the accumulator and what was last emitted for it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Slot<Acc, O> {
    acc: Acc,
    emitted: Option<O>,
    /// Changed since its window fired; a correction is due.
    dirty: bool,
}

/// The windows that end at the same time.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(
    serialize = "K: serde::Serialize, Acc: serde::Serialize, O: serde::Serialize",
    deserialize = "K: Key, Acc: serde::de::DeserializeOwned, O: serde::de::DeserializeOwned"
))]
struct Bucket<K, Acc, O> {
    /// The timely time the bucket's first results go out at: its last
    /// millisecond, or later if its first record arrived later than that.
    emit_at: Timestamp,
    slots: StateMap<(Timestamp, K), Slot<Acc, O>>,
}

/// The operator's state: every window not yet released, by end.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(
    serialize = "K: serde::Serialize, Acc: serde::Serialize, O: serde::Serialize",
    deserialize = "K: Key, Acc: serde::de::DeserializeOwned, O: serde::de::DeserializeOwned"
))]
struct State<K, Acc, O> {
    buckets: BTreeMap<Timestamp, Bucket<K, Acc, O>>,
    /// Windows ending at or before this watermark have fired.
    fired_upto: Timestamp,
    /// Fired windows changed by late records, awaiting their correction.
    dirty: Vec<(Timestamp, Timestamp, K)>,
}

impl<K, Acc, O> Default for State<K, Acc, O> {
    fn default() -> Self {
        State { buckets: BTreeMap::new(), fired_upto: 0, dirty: Vec::new() }
    }
}

impl<K: Key, Acc, O: Clone> State<K, Acc, O> {
    /// The slot of `window` and `key`, creating it; a window that has not
    /// fired yet promises output no later than the arrival of its records.
    fn slot(
        &mut self,
        window: Window,
        key: &K,
        arrived: Timestamp,
        hold: &mut Hold,
        cap: &InputCapability<Timestamp>,
        init: impl FnOnce() -> Acc,
    ) -> &mut Slot<Acc, O> {
        let fired = window.end <= self.fired_upto;
        let bucket = self
            .buckets
            .entry(window.end)
            .or_insert_with(|| Bucket { emit_at: Timestamp::MAX, slots: StateMap::default() });
        if !fired {
            let needed = (window.end - 1).max(arrived);
            if needed < bucket.emit_at {
                if bucket.emit_at != Timestamp::MAX {
                    hold.remove(bucket.emit_at);
                }
                bucket.emit_at = needed;
                hold.insert(needed, cap);
            }
        }
        let slot = bucket.slots.entry((window.start, key.clone())).or_insert_with(|| Slot {
            acc: init(),
            emitted: None,
            dirty: false,
        });
        if fired && !slot.dirty {
            slot.dirty = true;
            self.dirty.push((window.end, window.start, key.clone()));
        }
        slot
    }
}

impl<K, Acc, O> OperatorState for State<K, Acc, O>
where
    K: Key,
    Acc: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    O: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    const SCHEMA: Schema = Schema::new("window.aligned", 1);
    /// A window's end and start, a key, and its slot.
    type Entry = (Timestamp, Timestamp, K, Slot<Acc, O>);
    type Prepared = ();

    /// The state as checkpoint entries, one per window and key, routed by key.
    /// Taken when the watermark is at the cut and everything it completes
    /// has fired, so no correction is pending.
    /// Every window's slot per key (this state is not keyed: the watermark
    /// releases it).
    fn held(&self) -> (usize, u64) {
        let n = self.buckets.values().map(|b| b.slots.len()).sum();
        let slots = self.buckets.iter().flat_map(|(end, b)| b.slots.iter().map(move |(ks, slot)| (end, ks, slot)));
        (n, crate::state::sampled_size(n, slots))
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        debug_assert!(self.dirty.is_empty(), "corrections go out with the records that cause them");
        for (end, bucket) in self.buckets.iter() {
            out.reserve(bucket.slots.len());
            for ((start, key), slot) in bucket.slots.iter() {
                out.push(route(key), &(end, start, key, slot));
            }
        }
    }
}

impl<K, Acc, O> State<K, Acc, O>
where
    K: Key,
    Acc: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    O: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    /// Rebuilds the state checkpointed at `time` from this worker's `entries`:
    /// windows ending after `time` owe their results at their last millisecond
    /// (their records all arrived before `time`, so none was late for them).
    fn restore(
        &mut self,
        time: Timestamp,
        entries: &mut RestoredEntries<Self>,
        hold: &mut Hold,
        initial: &[timely::dataflow::operators::Capability<Timestamp>],
    ) {
        self.fired_upto = time;
        // Each bucket's map is sized before it is filled (an entry starts with
        // its window's end): entries come in the order of the old map's hashes,
        // and inserting them so into a growing map of the same hasher clusters.
        let mut sizes: BTreeMap<Timestamp, usize> = BTreeMap::new();
        entries.for_each_prefix(|end: Timestamp| {
            *sizes.entry(end).or_insert(0) += 1;
        });
        for (end, size) in sizes {
            let slots = StateMap::with_capacity_and_hasher(size, Default::default());
            self.buckets.entry(end).or_insert(Bucket { emit_at: Timestamp::MAX, slots });
            if end > time {
                self.buckets.get_mut(&end).expect("inserted").emit_at = end - 1;
                hold.restore(end - 1, initial);
            }
        }
        entries.for_each(|(end, start, key, slot)| {
            let bucket = self
                .buckets
                .entry(end)
                .or_insert_with(|| Bucket { emit_at: Timestamp::MAX, slots: StateMap::default() });
            bucket.slots.insert((start, key), slot);
        });
    }
}

pub(super) fn aggregate<'scope, D, K, KF, W, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: KF,
    windows: W,
    lateness: AllowedLateness,
    agg: A,
) -> Windowed<'scope, K, A::Output, D>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    W: AssignWindows<D>,
    A: Aggregate<D>,
{
    let key = Rc::new(key);
    let (Skeleton { builder, mut input, results: mut results_out, late: mut late_out, late_count }, windowed) =
        skeleton::<State<K, A::Acc, A::Output>, _, _, _, _>(stream, name, &key);
    let activator = builder.activator();

    builder.build(move |initial_capabilities, mut managed| {
        let mut op = AlignedOp {
            key,
            windows,
            agg,
            lateness,
            counter: late_count,
            activator,
            hold: Hold::default(),
            assigned: SmallVec::new(),
            firing: VecDeque::new(),
        };
        managed.restore(|state, time, entries| state.restore(time, entries, &mut op.hold, &initial_capabilities));
        drop(initial_capabilities);
        move |frontiers| {
            if !managed.home() {
                return;
            }
            let state = managed.get();
            let mut results = results_out.activate();
            let mut late = late_out.activate();
            input.for_each_stamp(|cap, data| op.take(state, &cap, data, &mut results, &mut late));
            let watermark = watermark_of(&frontiers[0]);
            op.fire(state, watermark, &mut results);
            if op.fire_released(&mut results) {
                managed.checkpoint(watermark, ());
            }
        }
    });

    windowed
}

/// The aligned-window operator's work on a worker, step by step: records
/// into their windows' slots ([`take`](Self::take), with the corrections of
/// windows that had fired), windows fired as the watermark completes them
/// ([`fire`](Self::fire)), and, without lateness, the released windows fired
/// over as many activations as the fuel asks ([`fire_released`](Self::fire_released)).
struct AlignedOp<K, KF, W, A: Aggregate<D>, D> {
    key: Rc<KF>,
    windows: W,
    agg: A,
    lateness: AllowedLateness,
    counter: Counter,
    activator: Activator,
    hold: Hold,
    /// Scratch: the windows of the record being taken in.
    assigned: SmallVec<[Window; 4]>,
    /// Windows being fired (without lateness): end, output time, slots left.
    firing: VecDeque<Firing<K, A::Acc, A::Output>>,
}

impl<K, KF, W, A, D> AlignedOp<K, KF, W, A, D>
where
    K: Key,
    KF: Fn(&D) -> K,
    W: AssignWindows<D>,
    A: Aggregate<D>,
    D: Data,
{
    /// Takes in the records of one stamp: each into the slots of its windows
    /// that are not released yet (late if none), then the corrections of
    /// windows that had fired, at the arrival time.
    fn take(
        &mut self,
        state: &mut State<K, A::Acc, A::Output>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<D>>>,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
        late: &mut ActiveOutput<'_, D>,
    ) {
        let arrived = arrival_time(cap);
        let mut late_session = late.session(cap);
        for batch in data {
            for (record, time, diff) in batch.drain(..) {
                self.assigned.clear();
                self.windows.assign(&record, time, &mut self.assigned);
                let k = (self.key)(&record);
                let mut taken = false;
                for window in self.assigned.iter() {
                    if self.lateness.release_at(window.end) <= arrived {
                        continue;
                    }
                    taken = true;
                    let slot = state.slot(*window, &k, arrived, &mut self.hold, cap, || self.agg.init());
                    self.agg.update(&mut slot.acc, &record, diff);
                }
                if !taken {
                    late_session.give((record, time, diff));
                    self.counter.add(1);
                }
            }
        }
        drop(late_session);
        // Corrections of windows that had fired go out at the arrival time.
        if !state.dirty.is_empty() {
            let mut session = results.session(cap);
            for (end, start, k) in state.dirty.drain(..) {
                let slot = state
                    .buckets
                    .get_mut(&end)
                    .and_then(|b| b.slots.get_mut(&(start, k.clone())))
                    .expect("a dirty window is released only after its correction");
                slot.dirty = false;
                let window = Window::new(start, end);
                if let Some(old) = slot.emitted.take() {
                    session.give((WindowResult { window, key: k.clone(), value: old }, end - 1, -1));
                }
                if let Some(new) = self.agg.output(&slot.acc) {
                    slot.emitted = Some(new.clone());
                    session.give((WindowResult { window, key: k, value: new }, end - 1, 1));
                }
            }
        }
    }

    /// Fires the windows the watermark completes: without lateness they are
    /// released as they fire (queued for [`fire_released`](Self::fire_released));
    /// with lateness they fire in place and are released once no record can
    /// still reach them.
    fn fire(
        &mut self,
        state: &mut State<K, A::Acc, A::Output>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>,
    ) {
        if watermark <= state.fired_upto {
            return;
        }
        let range = (Bound::Excluded(state.fired_upto), Bound::Included(watermark));
        if self.lateness.0 == 0 {
            let ends: Vec<Timestamp> = state.buckets.range(range).map(|(end, _)| *end).collect();
            for end in ends {
                let bucket = state.buckets.remove(&end).expect("listed above");
                self.firing.push_back((end, bucket.emit_at, bucket.slots.into_iter()));
            }
            state.fired_upto = watermark;
            return;
        }
        for (&end, bucket) in state.buckets.range_mut(range) {
            let cap = self.hold.at(bucket.emit_at);
            let mut session = results.session(&cap);
            for ((start, k), slot) in bucket.slots.iter_mut() {
                if let Some(value) = self.agg.output(&slot.acc) {
                    // Remembered: a record within the lateness corrects it.
                    slot.emitted = Some(value.clone());
                    let window = Window::new(*start, end);
                    session.give((WindowResult { window, key: k.clone(), value }, end - 1, 1));
                }
            }
            self.hold.remove(bucket.emit_at);
        }
        state.fired_upto = watermark;
        self.hold.settle(None);
        // Released once no record can still reach the window.
        while let Some(entry) = state.buckets.first_entry() {
            if self.lateness.release_at(*entry.key()) > watermark {
                break;
            }
            entry.remove();
        }
    }

    /// Fires the released windows' slots, [`FIRE_FUEL`] of them per
    /// activation (asking for another while some are left); whether all
    /// have gone out.
    fn fire_released(&mut self, results: &mut ActiveOutput<'_, WindowResult<K, A::Output>>) -> bool {
        let mut fuel = FIRE_FUEL;
        while let Some((end, emit_at, slots)) = self.firing.front_mut() {
            let cap = self.hold.at(*emit_at);
            let mut session = results.session(&cap);
            while fuel > 0 {
                let Some(((start, k), slot)) = slots.next() else { break };
                fuel -= 1;
                if let Some(value) = self.agg.output(&slot.acc) {
                    let window = Window::new(start, *end);
                    session.give((WindowResult { window, key: k, value }, *end - 1, 1));
                }
            }
            if slots.len() > 0 {
                self.activator.activate();
                break;
            }
            self.hold.remove(*emit_at);
            self.firing.pop_front();
        }
        self.hold.settle(None);
        self.firing.is_empty()
    }
}
