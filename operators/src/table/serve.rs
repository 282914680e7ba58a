//! Serving a table to queries from outside the dataflow: [`Table::serve`]
//! keeps each worker's shard of the table's state (its rows ordered by key,
//! with the changes of a configured period of history, checkpointed by key),
//! which a [`TableReader`] reads by key, by key range, as of the current
//! watermark or as of any retained past time, and as a changelog between
//! two times (for subscriptions). Readers on one [`Timeline`] can read
//! several tables as of one time.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use parking_lot::RwLock;

use smallvec::SmallVec;

use super::Table;
use crate::key::{route, Data, Key};
use crate::state::multiset::bump;
use crate::state::{OperatorState, RestoredEntries, Schema, Snapshot, Stateful};
use crate::time::{watermark_of, Diff, Timestamp, END_OF_TIME};

impl<K: Key, V: Data + Ord> Table<'_, K, V> {
    /// Keeps the table's current state in `reader`, where the program can look
    /// keys up (see [`TableReader`]).
    ///
    /// With checkpoints on, each worker's part of the served state (the rows,
    /// the retained history and the changes not yet complete) is
    /// checkpointed by key, and restored on recovery: the table's changelog
    /// before the cut is not replayed. After a recovery the history reaches
    /// back to the checkpoint's time.
    ///
    /// The keys and values must be `Sync`, as queries read them from other
    /// threads (a checkpoint's snapshot too, which is taken in the background).
    pub fn serve(&self, reader: &TableReader<K, V>)
    where
        K: Sync,
        V: Sync,
    {
        let shard = Arc::new(Shard::default());
        let scope = self.changelog.scope();
        let index = scope.index();
        if let Ok(mut shards) = reader.shards.lock() {
            shards.insert(index, Arc::clone(&shard));
        }
        reader.timeline.post(reader.view, index, 0, |_| ());
        let reader = reader.clone();
        let stateful = Stateful::<Served<K, V>>::new("ServeTable", &scope);
        // The changelog is already on the workers that own its keys.
        let gated = stateful.local_input(&self.changelog);
        let mut builder = stateful.builder(&scope);
        let mut input = builder.input(gated);
        builder.build(move |_caps, mut managed| {
            *managed.get() = Served(Arc::clone(&shard));
            managed.restore(|served, time, entries| {
                served.0.restore(time, entries);
            });
            move |frontiers| {
                // While a snapshot is serialized in the background under read
                // locks of the shard's parts (queries read it meanwhile), the
                // operator waits.
                if !managed.home() {
                    return;
                }
                // Each change locks its key's part alone, for one insertion:
                // a read waits for at most that, and only if it wants the
                // same part. Readers see changes of the times not complete
                // yet, which a read as of a complete time leaves out.
                let horizon = shard.horizon();
                input.for_each_stamp(|_cap, data| {
                    for batch in data {
                        for ((k, v), time, diff) in batch.drain(..) {
                            shard.part(&k).write().insert(k, v, time, diff, horizon);
                        }
                    }
                });
                // Every change before the watermark is in: readers may read
                // up to it. The history before the timeline's least
                // watermark and its readers' holds, less the retention, is
                // folded into the rows (at the end of the input, the history
                // is kept as it is). The horizon moves with the watermark's
                // post, under the timeline's lock: a read that holds a time
                // after the post sees the new horizon.
                let watermark = watermark_of(&frontiers[0]);
                let bound = reader.timeline.post(reader.view, index, watermark, |bound| {
                    if bound < END_OF_TIME {
                        shard.horizon.fetch_max(bound.saturating_sub(reader.retain), Ordering::AcqRel);
                    }
                });
                if bound < END_OF_TIME {
                    shard.compact(WRITE_CHUNK);
                }
                // The shard stays readable by queries: the background thread
                // reads it under read locks, and the operator leaves it alone
                // until the snapshot is back.
                managed.checkpoint(watermark, ());
            }
        });
    }
}

/// How many keys a served table's operator folds into their values under
/// one lock of a part (a read of that part waits for at most that).
const WRITE_CHUNK: usize = 32;

/// How many parts, each under its own lock, a worker's shard of a served
/// table is in.
const PARTS: usize = 64;

/// A served table's state: this worker's shard, shared with the readers.
struct Served<K, V>(Arc<Shard<K, V>>);

impl<K, V> Default for Served<K, V> {
    fn default() -> Self {
        Served(Arc::new(Shard::default()))
    }
}

impl<K: Key + Sync, V: Data + Sync> OperatorState for Served<K, V> {
    /// A key's values as of the shard's history horizon and its changes
    /// after it (version 1 held the values as of the readers' watermark and
    /// the changes after it: the same shape and meaning, with no history).
    const SCHEMA: Schema = Schema::new("table.serve", 1);
    type Entry = ServedKey<K, V>;
    type Prepared = ();

    /// The shard's keys (the table's rows with their history), and their
    /// size from a sample.
    fn held(&self) -> (usize, u64) {
        let parts = self.0.read_all();
        let rows = parts.iter().map(|p| p.rows.len()).sum();
        let all = parts.iter().flat_map(|p| p.rows.iter());
        (rows, crate::state::sampled_size(rows, all.map(|(k, row)| (k, &row.values, &row.changes))))
    }

    /// The shard as checkpoint entries, one per key, routed by key, read
    /// under read locks (queries read the shard meanwhile).
    fn snapshot(&self, (): (), out: &mut Snapshot) {
        let parts = self.0.read_all();
        out.reserve(parts.iter().map(|p| p.rows.len()).sum());
        for (k, row) in parts.iter().flat_map(|p| p.rows.iter()) {
            out.push(route(k), &(k, &row.values, &row.changes));
        }
    }
}

/// A key's values with their counts (one positive count, in a table).
type Values<V> = SmallVec<[(V, Diff); 1]>;

/// A served key's changes not folded into its values, in time order.
type Changes<V> = Vec<(Timestamp, V, Diff)>;

/// A served key in a checkpoint: its folded values and its changes after.
type ServedKey<K, V> = (K, Values<V>, Changes<V>);

/// The served shards of a table, by worker index.
type Shards<K, V> = Arc<Mutex<BTreeMap<usize, Arc<Shard<K, V>>>>>;

/// One key of a shard: its values with every change before the shard's
/// horizon folded in, and its changes from the horizon on, in time order.
#[derive(Debug)]
struct Row<V> {
    values: Values<V>,
    changes: Changes<V>,
}

impl<V> Default for Row<V> {
    fn default() -> Self {
        Row { values: SmallVec::new(), changes: Vec::new() }
    }
}

impl<V: Data + PartialEq> Row<V> {
    /// The key's value with every change before `upto`.
    fn value_before(&self, upto: Timestamp) -> Option<V> {
        let mut values = self.values.clone();
        for (_, v, diff) in self.changes.iter().take_while(|(t, _, _)| *t < upto) {
            bump(&mut values, v, *diff);
        }
        values.into_iter().find(|(_, d)| *d > 0).map(|(v, _)| v)
    }

    /// Folds the changes before `horizon` into the values; how many.
    fn fold(&mut self, horizon: Timestamp) -> usize {
        let n = self.changes.partition_point(|(t, _, _)| *t < horizon);
        for (_, v, diff) in self.changes.drain(..n) {
            bump(&mut self.values, &v, diff);
        }
        n
    }

    fn is_empty(&self) -> bool {
        self.values.is_empty() && self.changes.is_empty()
    }
}

/// One worker's part of a served table: its keys in [`PARTS`] parts by
/// their hash, each under its own lock, so that the operator's writes and
/// the readers' reads meet only when they want the same part at once.
#[derive(Debug)]
struct Shard<K, V> {
    parts: Box<[RwLock<Part<K, V>>]>,
    /// Every change before it is folded into the values, or is being (the
    /// parts are folded up to it after it moves): a read as of an earlier
    /// time is refused. Set under the timeline's lock.
    horizon: AtomicU64,
}

impl<K, V> Default for Shard<K, V> {
    fn default() -> Self {
        Shard { parts: (0..PARTS).map(|_| RwLock::new(Part::default())).collect(), horizon: AtomicU64::new(0) }
    }
}

impl<K, V> Shard<K, V> {
    /// Read locks on every part at once.
    fn read_all(&self) -> Vec<parking_lot::RwLockReadGuard<'_, Part<K, V>>> {
        self.parts.iter().map(|p| p.read()).collect()
    }

    /// The time reads may be as of from on.
    fn horizon(&self) -> Timestamp {
        self.horizon.load(Ordering::Acquire)
    }
}

impl<K: Key, V: Data + PartialEq> Shard<K, V> {
    /// The part that holds `key` (by bits of its hash that do not pick the
    /// worker).
    fn part(&self, key: &K) -> &RwLock<Part<K, V>> {
        &self.parts[(route(key) >> 40) as usize % PARTS]
    }

    /// Folds every change before the horizon into the values, part by part
    /// and `budget` keys under each lock.
    fn compact(&self, budget: usize) {
        let horizon = self.horizon();
        for part in self.parts.iter() {
            while !part.write().compact_some(horizon, budget) {}
        }
    }
}

impl<K: Key + Sync, V: Data + Sync + PartialEq> Shard<K, V> {
    /// Adds this worker's restored keys; the history starts at the
    /// checkpoint's time.
    fn restore(&self, time: Timestamp, entries: &mut RestoredEntries<Served<K, V>>) {
        self.horizon.fetch_max(time, Ordering::AcqRel);
        let horizon = self.horizon();
        entries.for_each(|(k, values, changes)| self.part(&k).write().restore_key(k, values, changes, horizon));
    }
}

/// A part of a worker's shard of a served table.
#[derive(Debug)]
struct Part<K, V> {
    /// The keys in order (range scans), each with its history.
    rows: BTreeMap<K, Row<V>>,
    /// The keys with changes at each time (compaction and changelogs; a key
    /// once per time).
    by_time: BTreeMap<Timestamp, Vec<K>>,
}

impl<K, V> Default for Part<K, V> {
    fn default() -> Self {
        Part { rows: BTreeMap::new(), by_time: BTreeMap::new() }
    }
}

impl<K: Key, V: Data + PartialEq> Part<K, V> {
    /// Adds the change `(k, v, diff)` at `time`, folded into the values if
    /// it is before the shard's `horizon`.
    fn insert(&mut self, k: K, v: V, time: Timestamp, diff: Diff, horizon: Timestamp) {
        if diff == 0 {
            return;
        }
        let row = self.rows.entry(k.clone()).or_default();
        if time < horizon {
            // Before the horizon (a restored shard's late change): folded.
            bump(&mut row.values, &v, diff);
            return;
        }
        let at = row.changes.partition_point(|(t, _, _)| *t <= time);
        let new_time = at == 0 || row.changes[at - 1].0 != time;
        row.changes.insert(at, (time, v, diff));
        if new_time {
            self.by_time.entry(time).or_default().push(k);
        }
    }

    /// Folds every change before `horizon` into the values, and forgets
    /// keys with nothing left.
    #[cfg(test)]
    fn compact(&mut self, horizon: Timestamp) {
        while !self.compact_some(horizon, usize::MAX) {}
    }

    /// [`compact`](Self::compact) in steps of about `budget` keys: whether
    /// it is done. The shard's horizon has moved first, so that a read that
    /// comes in between two steps and is as of a time before it is told so;
    /// a read as of a time at or after it gives the same answer whether a
    /// key's changes before it are folded yet or not.
    fn compact_some(&mut self, horizon: Timestamp, budget: usize) -> bool {
        let mut folded = 0usize;
        // A time's keys are folded a budget at a time too (one time may
        // hold a whole batch's keys, each a lookup among all the rows).
        while let Some(mut entry) = self.by_time.first_entry() {
            if *entry.key() >= horizon {
                return true;
            }
            while let Some(k) = entry.get_mut().pop() {
                if folded >= budget {
                    entry.get_mut().push(k);
                    return false;
                }
                folded += 1;
                let Some(row) = self.rows.get_mut(&k) else { continue };
                row.fold(horizon);
                if row.is_empty() {
                    self.rows.remove(&k);
                }
            }
            entry.remove();
        }
        true
    }
}

impl<K: Key, V: Data + PartialEq> Part<K, V> {
    /// Adds a restored key: its folded values and its changes after (those
    /// before `horizon` folded).
    fn restore_key(&mut self, k: K, values: Values<V>, changes: Changes<V>, horizon: Timestamp) {
        let row = self.rows.entry(k.clone()).or_default();
        for (v, diff) in values {
            bump(&mut row.values, &v, diff);
        }
        for (t, v, diff) in changes {
            if t < horizon {
                bump(&mut row.values, &v, diff);
            } else {
                let at = row.changes.partition_point(|(c, _, _)| *c <= t);
                if at == 0 || row.changes[at - 1].0 != t {
                    self.by_time.entry(t).or_default().push(k.clone());
                }
                row.changes.insert(at, (t, v, diff));
            }
        }
        if row.is_empty() {
            self.rows.remove(&k);
        }
    }
}

/// Readers of several tables that read them as of one time.
///
/// Each served table posts its workers' watermarks here, and every table on
/// the timeline keeps its history from the least of them (less its
/// retention), so a read of several tables as of that time finds all of
/// them able to answer. A [`ReadHold`] keeps every table's history from its
/// time while a read or a subscription is under way.
///
/// ```
/// use highwater_operators::table::{TableReader, Timeline};
/// let timeline = Timeline::new();
/// let balances: TableReader<u32, i64> = TableReader::on(&timeline);
/// let names: TableReader<u32, String> = TableReader::on(&timeline);
/// // ... serve both from one dataflow, then read them at one time:
/// let hold = timeline.hold_current();
/// assert_eq!(balances.read(&hold).unwrap().get(&7), None);
/// assert_eq!(names.read(&hold).unwrap().get(&7), None);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    inner: Arc<Mutex<TimelineState>>,
}

#[derive(Debug, Default)]
struct TimelineState {
    /// Each serving worker's watermark, by view and worker.
    marks: BTreeMap<(u64, usize), Timestamp>,
    /// The times held by reads, with their counts.
    holds: BTreeMap<Timestamp, usize>,
    next_view: u64,
}

impl TimelineState {
    fn least_mark(&self) -> Timestamp {
        self.marks.values().copied().min().unwrap_or(0)
    }

    /// The watermark of `view`: the least over its serving workers.
    fn mark_of(&self, view: u64) -> Timestamp {
        self.marks.range((view, 0)..=(view, usize::MAX)).map(|(_, t)| *t).min().unwrap_or(0)
    }

    fn bound(&self) -> Timestamp {
        let held = self.holds.keys().next().copied().unwrap_or(END_OF_TIME);
        self.least_mark().min(held)
    }
}

impl Timeline {
    /// A timeline with no tables.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TimelineState> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn new_view(&self) -> u64 {
        let mut state = self.state();
        state.next_view += 1;
        state.next_view
    }

    /// Records worker `index`'s watermark for `view`; returns the time
    /// before which no read can come any more (the least watermark and
    /// hold), after passing it to `then` under the timeline's lock (no hold
    /// is taken meanwhile).
    fn post(&self, view: u64, index: usize, watermark: Timestamp, then: impl FnOnce(Timestamp)) -> Timestamp {
        let mut state = self.state();
        state.marks.insert((view, index), watermark);
        let bound = state.bound();
        then(bound);
        bound
    }

    /// The watermark of `view`: the least over its serving workers (0
    /// before any serves).
    fn watermark_of(&self, view: u64) -> Timestamp {
        self.state().mark_of(view)
    }

    /// The least watermark of every table served on the timeline: every
    /// table can be read as of the time just before it.
    pub fn watermark(&self) -> Timestamp {
        self.state().least_mark()
    }

    /// Holds every table's history from the timeline's watermark while
    /// the hold lives: reads through it see every change before it.
    pub fn hold_current(&self) -> ReadHold {
        let mut state = self.state();
        let upto = state.least_mark();
        *state.holds.entry(upto).or_default() += 1;
        ReadHold { timeline: self.clone(), upto }
    }

    /// A hold at `view`'s watermark, taken under the same lock as the
    /// watermark is read: no post moves a horizon past it in between.
    fn hold_view_current(&self, view: u64) -> ReadHold {
        let mut state = self.state();
        let upto = state.mark_of(view);
        *state.holds.entry(upto).or_default() += 1;
        ReadHold { timeline: self.clone(), upto }
    }

    /// Holds every table's history from `upto` while the hold lives: reads
    /// through it see every change before `upto`, none after. A table
    /// whose history already starts after `upto`, or whose watermark has
    /// not reached it, refuses to be read through it ([`TableReader::read`]).
    pub fn hold(&self, upto: Timestamp) -> ReadHold {
        let mut state = self.state();
        *state.holds.entry(upto).or_default() += 1;
        ReadHold { timeline: self.clone(), upto }
    }
}

/// A time at which the tables of a [`Timeline`] keep their history while
/// it lives ([`Timeline::hold`]): reads through it see every change before
/// [`upto`](Self::upto) and none after.
#[derive(Debug)]
pub struct ReadHold {
    timeline: Timeline,
    upto: Timestamp,
}

impl ReadHold {
    /// Reads through this hold see the changes before this time.
    pub fn upto(&self) -> Timestamp {
        self.upto
    }

    /// The event time whose state reads through this hold see (every change
    /// at or before it): `upto - 1`, none if `upto` is 0.
    pub fn as_of(&self) -> Option<Timestamp> {
        self.upto.checked_sub(1)
    }

    /// Moves the hold on to `upto` (a subscription that has sent every
    /// change before it); never back.
    pub fn advance(&mut self, upto: Timestamp) {
        if upto <= self.upto {
            return;
        }
        let mut state = self.timeline.state();
        release(&mut state.holds, self.upto);
        *state.holds.entry(upto).or_default() += 1;
        self.upto = upto;
    }
}

impl Clone for ReadHold {
    fn clone(&self) -> Self {
        self.timeline.hold(self.upto)
    }
}

impl Drop for ReadHold {
    fn drop(&mut self) {
        release(&mut self.timeline.state().holds, self.upto);
    }
}

fn release(holds: &mut BTreeMap<Timestamp, usize>, upto: Timestamp) {
    if let Some(n) = holds.get_mut(&upto) {
        *n -= 1;
        if *n == 0 {
            holds.remove(&upto);
        }
    }
}

/// Why a table cannot be read as of a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsOfError {
    /// The time is before the table's history.
    #[error("the state as of {as_of} is no longer kept: the history starts at {earliest}")]
    BeforeHistory {
        /// The time asked for.
        as_of: Timestamp,
        /// The earliest time the table can be read as of.
        earliest: Timestamp,
    },
    /// The time is not complete yet: changes at it may still come.
    #[error("the state as of {as_of} is not complete yet: the watermark is at {watermark}")]
    NotComplete {
        /// The time asked for.
        as_of: Timestamp,
        /// The table's watermark.
        watermark: Timestamp,
    },
}

/// The tables' state as the dataflow maintains it, readable from outside the
/// dataflow by key: the read side of a materialized view.
///
/// Make one before `timely::execute`, hand a clone to every worker, and call
/// [`Table::serve`] in each. Queries see the table as of its watermark, the
/// least over the serving workers (every change before it applied, none
/// after), so an answer — a single key, a key range or a whole snapshot — is
/// a state the table really had. With a retention
/// ([`retain`](Self::retain)) the reader also answers as of any time in the
/// retained period ([`get_as_of`](Self::get_as_of)), exactly, and gives the
/// changes between two times ([`changes`](Self::changes)). Within one
/// process, each worker holds the keys it owns and the reader asks them
/// all; across processes, each process serves its own workers' keys.
///
/// ```
/// use highwater_operators::prelude::*;
/// use highwater_operators::table::TableReader;
/// use highwater_operators::END_OF_TIME;
/// use timely::dataflow::operators::ToStream;
///
/// let reader = TableReader::new().retain(1.hours());
/// let served = reader.clone();
/// timely::example(move |scope| {
///     // (user, Some(score)) upserts
///     let upserts = vec![((1u32, Some(3)), 1u64, 1i64), ((2, Some(5)), 2, 1), ((1, Some(4)), 3, 1)];
///     EventStream::new(upserts.to_stream(scope)).upsert().table.serve(&served);
/// });
/// assert_eq!(reader.get(&1), Some(4));
/// assert_eq!(reader.get(&3), None);
/// assert_eq!(reader.snapshot(), vec![(1, 4), (2, 5)]);
/// assert_eq!(reader.range(2.., 10), vec![(2, 5)]);
/// assert_eq!(reader.watermark(), END_OF_TIME);
/// // As of event time 2, user 1's score was still 3.
/// assert_eq!(reader.get_as_of(&1, 2), Ok(Some(3)));
/// ```
#[derive(Debug)]
pub struct TableReader<K, V> {
    shards: Shards<K, V>,
    timeline: Timeline,
    view: u64,
    /// How much history (event-time milliseconds) is kept behind the
    /// timeline's watermark.
    retain: Timestamp,
}

impl<K, V> Clone for TableReader<K, V> {
    fn clone(&self) -> Self {
        TableReader {
            shards: Arc::clone(&self.shards),
            timeline: self.timeline.clone(),
            view: self.view,
            retain: self.retain,
        }
    }
}

impl<K, V> Default for TableReader<K, V> {
    fn default() -> Self {
        Self::on(&Timeline::new())
    }
}

impl<K, V> TableReader<K, V> {
    /// A reader on `timeline`, which it can be read at one time with the
    /// timeline's other tables.
    pub fn on(timeline: &Timeline) -> Self {
        TableReader { shards: Arc::default(), timeline: timeline.clone(), view: timeline.new_view(), retain: 0 }
    }

    /// Keeps `period` (event-time milliseconds) of history behind the
    /// timeline's watermark: the reader answers as of any time from the
    /// watermark less `period` on. Set before the table is served.
    pub fn retain(mut self, period: Timestamp) -> Self {
        self.retain = period;
        self
    }

    /// The timeline the reader is on.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The watermark the answers are as of: the least over the serving
    /// workers ([`END_OF_TIME`] once the table's input is complete; 0
    /// before any worker serves).
    pub fn watermark(&self) -> Timestamp {
        self.timeline.watermark_of(self.view)
    }
}

impl<K: Key, V: Data + PartialEq> TableReader<K, V> {
    /// A reader no table serves yet, on a timeline of its own.
    pub fn new() -> Self {
        Self::default()
    }

    fn shards(&self) -> Vec<Arc<Shard<K, V>>> {
        self.shards.lock().map(|s| s.values().cloned().collect()).unwrap_or_default()
    }

    /// The earliest time the table can be read as of (its history's start;
    /// 0 when it reaches back to the beginning).
    pub fn earliest(&self) -> Timestamp {
        let horizon = self.shards().iter().map(|s| s.horizon()).max().unwrap_or(0);
        horizon.saturating_sub(1)
    }

    /// How many keys the shards hold (with a value now, or a change in the
    /// retained history): the size of the view, without reading it.
    pub fn keys_held(&self) -> usize {
        self.shards().iter().flat_map(|s| s.parts.iter()).map(|p| p.read().rows.len()).sum()
    }

    /// A read of the table through `hold`: as of its time, which must be
    /// within the table's history and complete.
    ///
    /// # Errors
    /// [`AsOfError`] if the table cannot answer as of the hold's time.
    pub fn read<'a>(&'a self, hold: &'a ReadHold) -> Result<TableRead<'a, K, V>, AsOfError> {
        let upto = hold.upto;
        let as_of = upto.saturating_sub(1);
        let watermark = self.watermark();
        if upto > watermark {
            return Err(AsOfError::NotComplete { as_of, watermark });
        }
        let shards = self.shards();
        // The history starts where the shard that kept the least of it
        // starts ([`earliest`](Self::earliest)): the error names that time.
        let horizon = shards.iter().map(|s| s.horizon()).max().unwrap_or(0);
        if horizon > upto {
            return Err(AsOfError::BeforeHistory { as_of, earliest: horizon - 1 });
        }
        Ok(TableRead { shards, upto, _hold: hold })
    }

    /// A hold at this table's watermark.
    pub fn hold_current(&self) -> ReadHold {
        // The table's watermark is at or after the timeline's, where every
        // table's history is kept: holding it keeps the history from there.
        self.timeline.hold_view_current(self.view)
    }

    /// The value of `key`, if the table has one.
    pub fn get(&self, key: &K) -> Option<V> {
        let hold = self.hold_current();
        self.read(&hold).ok()?.get(key)
    }

    /// The value `key` had as of event time `as_of` (every change at or
    /// before it).
    ///
    /// # Errors
    /// [`AsOfError`] if `as_of` is before the retained history or not
    /// complete yet.
    pub fn get_as_of(&self, key: &K, as_of: Timestamp) -> Result<Option<V>, AsOfError> {
        let hold = self.timeline.hold(as_of.saturating_add(1));
        Ok(self.read(&hold)?.get(key))
    }

    /// Every row, sorted by key.
    pub fn snapshot(&self) -> Vec<(K, V)> {
        self.range(.., usize::MAX)
    }

    /// Every row as of event time `as_of`, sorted by key.
    ///
    /// # Errors
    /// As [`get_as_of`](Self::get_as_of).
    pub fn snapshot_as_of(&self, as_of: Timestamp) -> Result<Vec<(K, V)>, AsOfError> {
        let hold = self.timeline.hold(as_of.saturating_add(1));
        Ok(self.read(&hold)?.range(.., usize::MAX))
    }

    /// The first `limit` rows whose keys are in `range`, sorted by key.
    pub fn range(&self, range: impl RangeBounds<K>, limit: usize) -> Vec<(K, V)> {
        let hold = self.hold_current();
        self.read(&hold).map(|read| read.range(range, limit)).unwrap_or_default()
    }

    /// The table's changes at times in `from..upto`, in time order (of one
    /// time, by key): `(key, value, time, diff)`.
    ///
    /// # Errors
    /// As [`get_as_of`](Self::get_as_of), for `from` and `upto`.
    pub fn changes(&self, from: Timestamp, upto: Timestamp) -> Result<Vec<(K, V, Timestamp, Diff)>, AsOfError> {
        let start = self.timeline.hold(from);
        self.read(&start)?;
        let end = self.timeline.hold(upto);
        Ok(self.read(&end)?.changes_since(from))
    }

    /// How many keys have a value.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A read of a served table as of one time ([`TableReader::read`]).
#[derive(Debug)]
pub struct TableRead<'a, K, V> {
    shards: Vec<Arc<Shard<K, V>>>,
    upto: Timestamp,
    _hold: &'a ReadHold,
}

impl<K: Key, V: Data + PartialEq> TableRead<'_, K, V> {
    /// The value of `key`, if the table had one.
    pub fn get(&self, key: &K) -> Option<V> {
        self.shards.iter().find_map(|shard| shard.part(key).read().rows.get(key)?.value_before(self.upto))
    }

    /// The first `limit` rows whose keys are in `range`, sorted by key.
    pub fn range(&self, range: impl RangeBounds<K>, limit: usize) -> Vec<(K, V)> {
        let bounds = (cloned(range.start_bound()), cloned(range.end_bound()));
        if is_empty_range(&bounds) {
            return Vec::new();
        }
        // Each part's first `limit` rows in the range, merged.
        let mut rows = Vec::new();
        for part in self.shards.iter().flat_map(|s| s.parts.iter()) {
            let part = part.read();
            let found = part
                .rows
                .range::<K, _>((bounds.0.as_ref(), bounds.1.as_ref()))
                .filter_map(|(k, row)| Some((k.clone(), row.value_before(self.upto)?)))
                .take(limit);
            rows.extend(found);
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.truncate(limit);
        rows
    }

    /// The changes at times from `from` to the read's time, in time order
    /// (of one time, by key).
    fn changes_since(&self, from: Timestamp) -> Vec<(K, V, Timestamp, Diff)> {
        let mut out = Vec::new();
        for part in self.shards.iter().flat_map(|s| s.parts.iter()) {
            let part = part.read();
            for (time, keys) in part.by_time.range(from..self.upto) {
                for k in keys {
                    let Some(row) = part.rows.get(k) else { continue };
                    let at = row.changes.partition_point(|(t, _, _)| *t < *time);
                    for (t, v, diff) in row.changes[at..].iter().take_while(|(t, _, _)| t == time) {
                        out.push((k.clone(), v.clone(), *t, *diff));
                    }
                }
            }
        }
        out.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        out
    }
}

/// Whether no key is in `bounds` (a start after the end, which a
/// `BTreeMap` range would panic on).
fn is_empty_range<K: Ord>(bounds: &(Bound<K>, Bound<K>)) -> bool {
    match bounds {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b)) | (Bound::Excluded(a), Bound::Included(b)) => {
            a >= b
        }
        _ => false,
    }
}

fn cloned<K: Clone>(bound: Bound<&K>) -> Bound<K> {
    match bound {
        Bound::Included(k) => Bound::Included(k.clone()),
        Bound::Excluded(k) => Bound::Excluded(k.clone()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard keeps the changes from its horizon on and answers before
    /// any time after it as the sum of the changes before.
    #[test]
    fn shards_fold_history_before_the_horizon() {
        let mut shard: Part<u8, char> = Part::default();
        shard.insert(1, 'a', 10, 1, 0);
        shard.insert(1, 'a', 20, -1, 0);
        shard.insert(1, 'b', 20, 1, 0);
        shard.insert(2, 'x', 15, 1, 0);
        shard.insert(2, 'x', 30, -1, 0);
        let value = |s: &Part<u8, char>, k: u8, upto| s.rows.get(&k).and_then(|r| r.value_before(upto));
        assert_eq!((value(&shard, 1, 20), value(&shard, 1, 21)), (Some('a'), Some('b')));
        shard.compact(21);
        assert_eq!(shard.rows[&1].changes.len(), 0);
        assert_eq!((value(&shard, 1, 21), value(&shard, 2, 30), value(&shard, 2, 31)), (Some('b'), Some('x'), None));
        shard.compact(31);
        assert!(!shard.rows.contains_key(&2));
        assert!(shard.by_time.is_empty());
    }
}
