//! Tables: the current state of a keyed changelog, built from upserts, read
//! back as a changelog, served to queries by key, and joined.
//!
//! A [`Table`] is a changelog of `(key, value)` updates in which every key has
//! at most one value at every event time: an upsert of a new value retracts
//! the old one at the upsert's time, a delete retracts the value. Summing the
//! changelog's updates with times up to `T` gives the table *as of* `T`. The
//! changelog is what flows; [`Table::as_collection`] and [`Table::arrange`]
//! give the same table as a differential collection and arrangement, which is
//! what the table–table joins ([`Table::join`], [`Table::left_join`],
//! [`Table::full_join`]) are built on.
//!
//! Stream–table joins look the table up *as of each event's time*
//! ([`EventStream::join_as_of`], [`EventStream::left_join_as_of`]), or keep
//! every result up to date with the table ([`EventStream::join_updating`]).
//!
//! # Examples
//! ```
//! use highwater_operators::prelude::*;
//! use timely::dataflow::operators::ToStream;
//! use timely::dataflow::operators::capture::{Capture, Extract};
//!
//! let captured = timely::example(|scope| {
//!     // User 1 is "gold" from t=0, "silver" from t=50; user 2 joins at t=20 and leaves at t=60.
//!     let tier = |name: &str| Some(name.to_string());
//!     let upserts = vec![
//!         ((1u64, tier("gold")), 0u64, 1i64),
//!         ((2, tier("new")), 20, 1),
//!         ((1, tier("silver")), 50, 1),
//!         ((2, None), 60, 1),
//!     ];
//!     let table = EventStream::new(upserts.to_stream(scope)).upsert(0).table;
//!     let clicks = EventStream::new(vec![(1u64, 10u64, 1i64), (2, 30, 1), (1, 55, 1), (2, 70, 1)].to_stream(scope));
//!     clicks.left_join_as_of(&table, |user| *user, 0).results.inner.capture()
//! });
//! let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
//! out.sort();
//! let tier = |name: &str| Some(name.to_string());
//! assert_eq!(out, vec![
//!     ((1, tier("gold")), 10, 1),
//!     ((1, tier("silver")), 55, 1),
//!     ((2, None), 70, 1),
//!     ((2, tier("new")), 30, 1),
//! ]);
//! ```

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex, RwLock};

use differential_dataflow::operators::arrange::{Arranged, TraceAgent};
use differential_dataflow::trace::implementations::ValSpine;
use differential_dataflow::VecCollection;
use smallvec::SmallVec;

use crate::collection::from_collection;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::late::{Counter, LateOutput};
use crate::state::multiset::bump;
use crate::state::{OperatorState, RestoredEntries, Schema, Snapshot, Stateful};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp, END_OF_TIME};

/// A table: a changelog of `(key, value)` updates with at most one value per
/// key at any event time, partitioned over the workers by key.
///
/// Make one with [`EventStream::upsert`] (from upserts and deletes) or
/// [`Table::from_changelog`] (from a changelog that already is one).
#[derive(Debug)]
pub struct Table<'scope, K: 'static, V: 'static> {
    changelog: EventStream<'scope, (K, V)>,
}

impl<K: Key, V: Data> Clone for Table<'_, K, V> {
    fn clone(&self) -> Self {
        Table { changelog: EventStream::new(self.changelog.inner.clone()) }
    }
}

/// The outputs of [`EventStream::upsert`].
#[derive(Debug)]
pub struct Upserted<'scope, K: 'static, V: 'static> {
    /// The table.
    pub table: Table<'scope, K, V>,
    /// Upserts that came later than the allowed lateness.
    pub late: LateOutput<'scope, (K, Option<V>)>,
}

/// The values of one key from each of its upserts' times on, in time order,
/// and the time a compaction is scheduled for (`Timestamp::MAX`: none).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct History<V> {
    versions: SmallVec<[(Timestamp, Option<V>); 1]>,
    scheduled: Timestamp,
}

impl<V> History<V> {
    /// The time from which the first version can be forgotten: once no record
    /// can arrive before `time`, the versions before it are unreachable.
    fn compact_from(&self) -> Option<Timestamp> {
        match self.versions.as_slice() {
            [] => None,
            [(t, None), ..] => Some(*t),
            [_, (t, _), ..] => Some(*t),
            [_] => None,
        }
    }

    /// Forgets what no query at or after `horizon` can see; whether the
    /// history is now empty.
    fn compact(&mut self, horizon: Timestamp) -> bool {
        let keep_from = self.versions.partition_point(|(t, _)| *t <= horizon).saturating_sub(1);
        self.versions.drain(..keep_from);
        if matches!(self.versions.first(), Some((t, None)) if *t <= horizon) {
            self.versions.remove(0);
        }
        self.versions.is_empty()
    }
}

impl<'scope, K: Key, V: Data + PartialEq> EventStream<'scope, (K, Option<V>)> {
    /// Builds a table from upserts: `(key, Some(value))` sets the key's value
    /// from the record's event time on, `(key, None)` deletes it.
    ///
    /// Upserts are applied in event-time order whatever order they arrive in
    /// (of two at the same time, the one that arrives later wins): an upsert
    /// older than one already applied changes the table only until the newer
    /// one, and the changelog says so with updates at both times. An upsert
    /// with a negative diff undoes an equal upsert at the same time. Upserts
    /// that arrive after their time plus `allowed_lateness` go to the late
    /// output. A key's history is kept only as far back as a record can still
    /// arrive, and a deleted key is forgotten, so the state is the table itself.
    ///
    /// With checkpoints on, a checkpoint holds each key's history; the
    /// changelog before the cut is not emitted again on recovery.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // The update at 30 arrives before the insert at 10.
    ///     let upserts = vec![((7u32, Some('b')), 30u64, 1i64), ((7, Some('a')), 10, 1), ((7, None), 40, 1)];
    ///     EventStream::new(upserts.to_stream(scope)).upsert(0).table.changelog().inner.capture()
    /// });
    /// let mut log: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// log.sort_by_key(|(kv, t, d)| (*t, *d, *kv));
    /// // Consolidated: 'a' from 10, 'b' from 30, nothing from 40.
    /// let mut net = std::collections::BTreeMap::new();
    /// for (kv, t, d) in log { *net.entry((t, kv)).or_insert(0) += d; }
    /// net.retain(|_, d| *d != 0);
    /// assert_eq!(net.into_iter().collect::<Vec<_>>(), vec![
    ///     ((10, (7, 'a')), 1), ((30, (7, 'a')), -1), ((30, (7, 'b')), 1), ((40, (7, 'b')), -1),
    /// ]);
    /// ```
    pub fn upsert(&self, allowed_lateness: u64) -> Upserted<'scope, K, V> {
        let lateness = AllowedLateness(allowed_lateness);
        let stateful = Stateful::<Upserts<K, V>>::new("Upsert", &self.scope());
        let gated = stateful.keyed_input(self, |u: &Update<(K, Option<V>)>| route(&(u.0).0));
        let mut builder = stateful.builder(&self.scope());
        let mut input = builder.input(gated);
        let (mut log_out, log) = builder.output::<(K, V)>();
        let (mut late_out, late) = builder.output::<(K, Option<V>)>();
        let count = Counter::new();
        let counter = count.clone();

        builder.build(move |_caps, mut managed| {
            let mut due: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
            // Recovery: each key's history, and its compaction schedule. The
            // changelog up to the cut went out before it: nothing is owed.
            managed.restore(|Upserts(tables), _time, entries| {
                tables.reserve(entries.len());
                entries.for_each(|(k, history)| {
                    if history.scheduled != Timestamp::MAX {
                        due.entry(history.scheduled).or_default().push(k.clone());
                    }
                    tables.insert(k, history);
                });
            });
            move |frontiers| {
                // While a background thread snapshots the histories, nothing is
                // done (the compaction schedule stays here).
                if !managed.home() {
                    return;
                }
                let Upserts(tables) = managed.get();
                let mut log = log_out.activate();
                let mut late = late_out.activate();
                input.for_each_stamp(|cap, data| {
                    let arrived = arrival_time(&cap);
                    let mut session = log.session(&cap);
                    for batch in data {
                        for ((k, v), time, diff) in batch.drain(..) {
                            if lateness.release_at(time.saturating_add(1)) <= arrived {
                                late.session(&cap).give(((k, v), time, diff));
                                counter.add(1);
                                continue;
                            }
                            if diff == 0 {
                                continue;
                            }
                            let history = if diff > 0 {
                                tables
                                    .entry(k.clone())
                                    .or_insert_with(|| History { versions: SmallVec::new(), scheduled: Timestamp::MAX })
                            } else {
                                // An undo of an upsert this key does not hold changes nothing.
                                match tables.get_mut(&k) {
                                    Some(history) => history,
                                    None => continue,
                                }
                            };
                            let versions = &mut history.versions;
                            let at = versions.partition_point(|(t, _)| *t <= time);
                            let exact = at > 0 && versions[at - 1].0 == time;
                            // The value on [time, next) before and after this upsert.
                            let (old, new, next) = if diff > 0 {
                                let old = if exact {
                                    std::mem::replace(&mut versions[at - 1].1, v.clone())
                                } else {
                                    let old = at.checked_sub(1).and_then(|i| versions[i].1.clone());
                                    versions.insert(at, (time, v.clone()));
                                    old
                                };
                                let next = versions.get(if exact { at } else { at + 1 }).map(|(t, _)| *t);
                                (old, v, next)
                            } else if exact && versions[at - 1].1 == v {
                                versions.remove(at - 1);
                                let before = (at >= 2).then(|| versions[at - 2].1.clone()).flatten();
                                (v, before, versions.get(at - 1).map(|(t, _)| *t))
                            } else {
                                continue;
                            };
                            if old != new {
                                let mut change = |value: Option<V>, t: Timestamp, d: Diff| {
                                    if let Some(value) = value {
                                        session.give(((k.clone(), value), t, d));
                                    }
                                };
                                change(old.clone(), time, -1);
                                change(new.clone(), time, 1);
                                if let Some(next) = next {
                                    change(new, next, -1);
                                    change(old, next, 1);
                                }
                            }
                            match history.compact_from() {
                                Some(from) if lateness.release_at(from.saturating_add(1)) < history.scheduled => {
                                    history.scheduled = lateness.release_at(from.saturating_add(1));
                                    due.entry(history.scheduled).or_default().push(k);
                                }
                                None if history.versions.is_empty() => {
                                    tables.remove(&k);
                                }
                                _ => {}
                            }
                        }
                    }
                });

                // Compaction: versions no record can reach any more.
                let watermark = watermark_of(&frontiers[0]);
                // A record at `watermark - lateness` is still accepted, and an undo
                // there needs the version before it: keep the latest one before.
                let horizon = watermark.saturating_sub(lateness.0).saturating_sub(1);
                while let Some(entry) = due.first_entry() {
                    if *entry.key() > watermark || watermark == END_OF_TIME {
                        break;
                    }
                    let (time, keys) = entry.remove_entry();
                    for k in keys {
                        let Some(history) = tables.get_mut(&k) else { continue };
                        if history.scheduled != time {
                            continue;
                        }
                        history.scheduled = Timestamp::MAX;
                        if history.compact(horizon) {
                            tables.remove(&k);
                        } else if let Some(from) = history.compact_from() {
                            history.scheduled = lateness.release_at(from.saturating_add(1)).max(time.saturating_add(1));
                            due.entry(history.scheduled).or_default().push(k);
                        }
                    }
                }
                managed.checkpoint(watermark, ());
            }
        });
        Upserted { table: Table { changelog: log }, late: LateOutput { stream: late, count } }
    }
}

impl<'scope, K: Key, V: Data> Table<'scope, K, V> {
    /// A table from a changelog that already is one (at most one value per key
    /// at any time, e.g. the result of a differential `reduce`). The updates
    /// are moved to the workers that own their keys.
    pub fn from_changelog(changelog: &EventStream<'scope, (K, V)>) -> Self {
        Table { changelog: changelog.exchange(|(k, _)| k.clone()) }
    }

    /// The table as a changelog stream: `+(key, value)` when a value is set,
    /// `-(key, value)` when it is replaced or deleted, each at its event time.
    pub fn changelog(&self) -> EventStream<'scope, (K, V)> {
        self.changelog.clone()
    }
}

impl<'scope, K: Key, V: Data + Ord> Table<'scope, K, V> {
    /// The table as a differential collection (see
    /// [`EventStream::as_collection`] for its times).
    pub fn as_collection(&self) -> VecCollection<'scope, Timestamp, (K, V), Diff> {
        self.changelog.as_collection()
    }

    /// The table as a differential arrangement by key, shareable by any number
    /// of differential joins and reductions.
    pub fn arrange(&self) -> Arranged<'scope, TraceAgent<ValSpine<K, V, Timestamp, Diff>>> {
        self.as_collection().arrange_by_key_named("ArrangeTable")
    }

    /// Keeps the table's current state in `reader`, where the program can look
    /// keys up (see [`TableReader`]).
    ///
    /// With checkpoints on, each worker's part of the served state (the rows
    /// and the changes not yet applied) is checkpointed by key, and restored
    /// on recovery: the table's changelog before the cut is not replayed.
    ///
    /// The keys and values must be `Sync`, as queries read them from other
    /// threads (a checkpoint's snapshot too, which is taken in the background).
    pub fn serve(&self, reader: &TableReader<K, V>)
    where
        K: Sync,
        V: Sync,
    {
        let shard = Arc::new(RwLock::new(Shard { rows: StateMap::default(), pending: BTreeMap::new() }));
        let scope = self.changelog.scope();
        let index = scope.index();
        if let Ok(mut shards) = reader.shards.lock() {
            shards.insert(index, Arc::clone(&shard));
        }
        reader.post(index, 0);
        let reader = reader.clone();
        let stateful = Stateful::<Served<K, V>>::new("ServeTable", &scope);
        // The changelog is already on the workers that own its keys.
        let gated = stateful.local_input(&self.changelog);
        let mut builder = stateful.builder(&scope);
        let mut input = builder.input(gated);
        builder.build(move |_caps, mut managed| {
            *managed.get() = Served(Arc::clone(&shard));
            managed.restore(|served, _time, entries| {
                if let Ok(mut shard) = served.0.write() {
                    shard.restore(entries);
                }
            });
            move |frontiers| {
                // While a snapshot is serialized in the background under a read
                // lock of the shard (queries read it meanwhile), the operator waits.
                if !managed.home() {
                    return;
                }
                let Ok(mut guard) = shard.write() else { return };
                input.for_each_stamp(|_cap, data| {
                    for batch in data {
                        for (kv, time, diff) in batch.drain(..) {
                            guard.pending.entry(time).or_default().push((kv, diff));
                        }
                    }
                });
                // Changes are applied up to the least watermark of all shards, so
                // that the shards together always hold one state of the table.
                let watermark = watermark_of(&frontiers[0]);
                let applied = reader.post(index, watermark);
                while let Some(entry) = guard.pending.first_entry() {
                    if *entry.key() >= applied {
                        break;
                    }
                    for ((k, v), diff) in entry.remove() {
                        bump(guard.rows.entry(k.clone()).or_default(), &v, diff);
                        if guard.rows.get(&k).is_some_and(|values| values.is_empty()) {
                            guard.rows.remove(&k);
                        }
                    }
                }
                // The shard stays readable by queries: the background thread
                // reads it under a read lock (taken once this activation lets go
                // of the write lock), and the operator leaves it alone until the
                // snapshot is back.
                drop(guard);
                managed.checkpoint(watermark, ());
            }
        });
    }
}

/// A key's upserts in an upsert table's state.
struct Upserts<K, V>(StateMap<K, History<V>>);

impl<K, V> Default for Upserts<K, V> {
    fn default() -> Self {
        Upserts(StateMap::default())
    }
}

impl<K: Key, V: Data> OperatorState for Upserts<K, V> {
    const SCHEMA: Schema = Schema::new("table.upsert", 1);
    /// A key and its history.
    type Entry = (K, History<V>);
    type Prepared = ();

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.0.len());
        for (k, h) in self.0.iter() {
            out.push(route(k), &(k, h));
        }
    }
}

/// A served table's state: this worker's shard, shared with the readers.
struct Served<K, V>(Arc<RwLock<Shard<K, V>>>);

impl<K, V> Default for Served<K, V> {
    fn default() -> Self {
        Served(Arc::new(RwLock::new(Shard { rows: StateMap::default(), pending: BTreeMap::new() })))
    }
}

impl<K: Key + Sync, V: Data + Sync> OperatorState for Served<K, V> {
    const SCHEMA: Schema = Schema::new("table.serve", 1);
    type Entry = ServedKey<K, V>;
    type Prepared = ();

    /// The shard as checkpoint entries, one per key, routed by key, read
    /// under a read lock (queries read the shard meanwhile).
    fn snapshot(&self, (): (), out: &mut Snapshot) {
        let shard = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut by_key: StateMap<&K, (Values<V>, Changes<V>)> = StateMap::default();
        for (k, values) in shard.rows.iter() {
            by_key.entry(k).or_default().0 = values.clone();
        }
        for (time, changes) in shard.pending.iter() {
            for ((k, v), diff) in changes {
                by_key.entry(k).or_default().1.push((*time, v.clone(), *diff));
            }
        }
        out.reserve(by_key.len());
        for (k, (values, pending)) in by_key {
            out.push(route(k), &(k, values, pending));
        }
    }
}

/// A table row with its diff, waiting to be served.
type Row<K, V> = ((K, V), Diff);

/// The served shards of a table, by worker index.
type Shards<K, V> = Arc<Mutex<BTreeMap<usize, Arc<RwLock<Shard<K, V>>>>>>;

/// A row of a left outer join: the left row, and the right row if one matches.
pub type LeftJoined<K, V, J, W> = ((K, V), Option<(J, W)>);

/// A row of a full outer join: either side may be missing, not both.
pub type FullJoined<K, V, J, W> = (Option<(K, V)>, Option<(J, W)>);

/// One worker's part of a served table: the rows as of some time at or
/// before the shards' least watermark, and the changes after it.
#[derive(Debug)]
struct Shard<K, V> {
    rows: StateMap<K, SmallVec<[(V, Diff); 1]>>,
    pending: BTreeMap<Timestamp, Vec<Row<K, V>>>,
}

/// A key's values with their counts (one positive count, in a table).
type Values<V> = SmallVec<[(V, Diff); 1]>;

/// A served key's changes not yet applied, by time.
type Changes<V> = Vec<(Timestamp, V, Diff)>;

/// A served key in a checkpoint: its applied values and its pending changes.
type ServedKey<K, V> = (K, Values<V>, Changes<V>);

impl<K: Key + Sync, V: Data + Sync> Shard<K, V> {
    /// Adds this worker's restored keys.
    fn restore(&mut self, entries: &mut RestoredEntries<Served<K, V>>) {
        entries.for_each(|(k, values, pending)| {
            for (time, v, diff) in pending {
                self.pending.entry(time).or_default().push(((k.clone(), v), diff));
            }
            if !values.is_empty() {
                self.rows.insert(k, values);
            }
        });
    }
}

/// The tables' state as the dataflow maintains it, readable from outside the
/// dataflow by key: the read side of a materialized view.
///
/// Make one before `timely::execute`, hand a clone to every worker, and call
/// [`Table::serve`] in each. Queries see the table as of its watermark, the
/// least over the serving workers (every change before it applied, none
/// after), so an answer — a single key or a whole snapshot — is a state the
/// table really had. Within one process, each worker holds the keys it owns
/// and [`get`](TableReader::get) asks them all; across processes, each
/// process serves its own workers' keys.
///
/// ```
/// use highwater_operators::prelude::*;
/// use highwater_operators::table::TableReader;
/// use highwater_operators::END_OF_TIME;
/// use timely::dataflow::operators::ToStream;
///
/// let reader = TableReader::new();
/// let served = reader.clone();
/// timely::example(move |scope| {
///     // (user, Some(score)) upserts
///     let upserts = vec![((1u32, Some(3)), 1u64, 1i64), ((2, Some(5)), 2, 1), ((1, Some(4)), 3, 1)];
///     EventStream::new(upserts.to_stream(scope)).upsert(0).table.serve(&served);
/// });
/// assert_eq!(reader.get(&1), Some(4));
/// assert_eq!(reader.get(&3), None);
/// assert_eq!(reader.snapshot(), vec![(1, 4), (2, 5)]);
/// assert_eq!(reader.watermark(), END_OF_TIME);
/// ```
#[derive(Debug)]
pub struct TableReader<K, V> {
    shards: Shards<K, V>,
    /// Each serving worker's watermark.
    watermarks: Arc<Mutex<BTreeMap<usize, Timestamp>>>,
}

impl<K, V> Clone for TableReader<K, V> {
    fn clone(&self) -> Self {
        TableReader { shards: Arc::clone(&self.shards), watermarks: Arc::clone(&self.watermarks) }
    }
}

impl<K, V> Default for TableReader<K, V> {
    fn default() -> Self {
        TableReader { shards: Arc::default(), watermarks: Arc::default() }
    }
}

impl<K, V> TableReader<K, V> {
    /// Records worker `index`'s watermark; returns the least over the workers.
    fn post(&self, index: usize, watermark: Timestamp) -> Timestamp {
        let Ok(mut marks) = self.watermarks.lock() else { return 0 };
        marks.insert(index, watermark);
        marks.values().copied().min().unwrap_or(0)
    }
}

impl<K: Key, V: Data + PartialEq> TableReader<K, V> {
    /// A reader no table serves yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn shards(&self) -> Vec<Arc<RwLock<Shard<K, V>>>> {
        self.shards.lock().map(|s| s.values().cloned().collect()).unwrap_or_default()
    }

    /// The value of `key`, if the table has one.
    pub fn get(&self, key: &K) -> Option<V> {
        let as_of = self.watermark();
        self.shards().iter().find_map(|shard| {
            let shard = shard.read().ok()?;
            let mut values = shard.rows.get(key).cloned().unwrap_or_default();
            for changes in shard.pending.range(..as_of).map(|(_, c)| c) {
                for ((_, v), diff) in changes.iter().filter(|((k, _), _)| k == key) {
                    bump(&mut values, v, *diff);
                }
            }
            values.into_iter().find(|(_, d)| *d > 0).map(|(v, _)| v)
        })
    }

    /// Every row, sorted by key.
    pub fn snapshot(&self) -> Vec<(K, V)> {
        let as_of = self.watermark();
        let mut rows: Vec<(K, V)> = Vec::new();
        for shard in self.shards() {
            let Ok(shard) = shard.read() else { continue };
            let mut table = shard.rows.clone();
            for changes in shard.pending.range(..as_of).map(|(_, c)| c) {
                for ((k, v), diff) in changes {
                    bump(table.entry(k.clone()).or_default(), v, *diff);
                }
            }
            for (k, values) in table {
                if let Some((v, _)) = values.into_iter().find(|(_, d)| *d > 0) {
                    rows.push((k, v));
                }
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// How many keys have a value.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The watermark the answers are as of: the least over the serving
    /// workers ([`END_OF_TIME`] once the table's input is complete; 0 before
    /// any worker serves).
    pub fn watermark(&self) -> Timestamp {
        self.watermarks.lock().ok().and_then(|m| m.values().copied().min()).unwrap_or(0)
    }
}

/// The versions of one key's value that a temporal join can still be asked
/// for: everything up to the horizon summed in `base`, later changes by time.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Versioned<V> {
    base: SmallVec<[(V, Diff); 1]>,
    changes: Vec<(Timestamp, V, Diff)>,
}

impl<V: PartialEq + Clone> Versioned<V> {
    /// The value as of `time`: the one whose updates up to `time` sum to a
    /// positive count.
    fn as_of(&self, time: Timestamp) -> Option<&V> {
        if self.changes.is_empty() || self.changes[0].0 > time {
            return self.base.iter().find(|(_, d)| *d > 0).map(|(v, _)| v);
        }
        let mut counts: SmallVec<[(&V, Diff); 4]> = self.base.iter().map(|(v, d)| (v, *d)).collect();
        for (_, v, d) in self.changes.iter().take_while(|(t, _, _)| *t <= time) {
            match counts.iter_mut().find(|(x, _)| *x == v) {
                Some(c) => c.1 += d,
                None => counts.push((v, *d)),
            }
        }
        counts.into_iter().rev().find(|(_, d)| *d > 0).map(|(v, _)| v)
    }

    /// Sums the changes up to `horizon` into the base; whether nothing is left.
    fn compact(&mut self, horizon: Timestamp) -> bool {
        let n = self.changes.partition_point(|(t, _, _)| *t <= horizon);
        for (_, v, d) in self.changes.drain(..n) {
            bump(&mut self.base, &v, d);
        }
        self.base.is_empty() && self.changes.is_empty()
    }
}

/// What a checkpoint of an as-of join serializes: the table's versions by
/// key, and the events waiting for the table's watermark, with their diffs.
/// An as-of join's state: the table's versions by key, and the events
/// waiting for the table's watermark.
struct AsOfState<K, V, D> {
    versions: StateMap<K, Versioned<V>>,
    waiting: Pending<(D, Diff)>,
}

impl<K, V, D> Default for AsOfState<K, V, D> {
    fn default() -> Self {
        AsOfState { versions: StateMap::default(), waiting: Pending::default() }
    }
}

impl<K: Key, V: Data, D: Data> OperatorState for AsOfState<K, V, D> {
    const SCHEMA: Schema = Schema::new("table.as_of", 1);
    type Entry = AsOfEntry<K, Versioned<V>, D>;
    /// The waiting events' routes, in the order they wait (the key function
    /// stays on the worker: it need not be `Send`).
    type Prepared = Vec<u64>;

    fn snapshot(&self, routes: Vec<u64>, out: &mut Snapshot) {
        out.reserve(self.versions.len() + routes.len());
        for (k, versioned) in self.versions.iter() {
            out.push(route(k), &AsOfEntry::<_, _, ()>::Versions(k, versioned));
        }
        for ((t, (record, diff), emit_at), route) in self.waiting.iter().zip(routes) {
            out.push(route, &AsOfEntry::<(), (), _>::Waiting(t, record, *diff, emit_at));
        }
    }
}

/// A checkpoint entry of an as-of join: a key's table versions, or an event
/// waiting for the table's watermark (its time, the event, its diff and the
/// time its result goes out at).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum AsOfEntry<K, W, D> {
    Versions(K, W),
    Waiting(Timestamp, D, Diff, Timestamp),
}

/// Records waiting until the watermark passes their event time, taken in
/// event-time order, which can also be listed for a checkpoint and refilled
/// on recovery (used by the as-of joins and by pattern matching).
///
/// Each record's results go out at its own time, or at its arrival if that is
/// later, whichever records share its event time: so a record's output time
/// does not depend on what else was waiting when it came.
#[derive(Debug)]
pub(crate) struct Pending<D> {
    /// By event time and emission time, the records in arrival order.
    by_time: BTreeMap<(Timestamp, Timestamp), Vec<D>>,
}

impl<D> Default for Pending<D> {
    fn default() -> Self {
        Pending { by_time: BTreeMap::new() }
    }
}

impl<D> Pending<D> {
    /// Adds `record` at `time`; it arrived at timely time `arrived`.
    pub(crate) fn insert(
        &mut self,
        record: D,
        time: Timestamp,
        arrived: Timestamp,
        hold: &mut Hold,
        cap: &timely::dataflow::operators::InputCapability<Timestamp>,
    ) {
        let emit_at = time.max(arrived);
        let records = self.by_time.entry((time, emit_at)).or_default();
        if records.is_empty() {
            hold.insert(emit_at, cap);
        }
        records.push(record);
    }

    /// Adds a restored `record` at `time`, whose result goes out at `emit_at`,
    /// minting the hold's capabilities from the operator's `initial` ones.
    pub(crate) fn restore(
        &mut self,
        record: D,
        time: Timestamp,
        emit_at: Timestamp,
        hold: &mut Hold,
        initial: &[timely::dataflow::operators::Capability<Timestamp>],
    ) {
        let records = self.by_time.entry((time, emit_at)).or_default();
        if records.is_empty() {
            hold.restore(emit_at, initial);
        }
        records.push(record);
    }

    /// The earliest waiting records with an event time below `watermark`
    /// and the same emission time, with these times; the hold's promise for
    /// them is withdrawn (the caller emits under [`Hold::at`] before settling).
    pub(crate) fn pop_before(
        &mut self,
        watermark: Timestamp,
        hold: &mut Hold,
    ) -> Option<(Timestamp, Vec<D>, Timestamp)> {
        let entry = self.by_time.first_entry()?;
        if entry.key().0 >= watermark {
            return None;
        }
        let ((time, emit_at), records) = entry.remove_entry();
        hold.remove(emit_at);
        Some((time, records, emit_at))
    }

    /// The earliest waiting event time.
    pub(crate) fn first_time(&self) -> Option<Timestamp> {
        self.by_time.first_key_value().map(|((t, _), _)| *t)
    }

    /// Every waiting record with its event time and emission time, in
    /// event-time order (arrival order within a time).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Timestamp, &D, Timestamp)> + '_ {
        self.by_time.iter().flat_map(|((t, emit_at), records)| records.iter().map(move |r| (*t, r, *emit_at)))
    }
}

/// The outputs of a temporal (as-of) stream–table join.
#[derive(Debug)]
pub struct AsOfJoined<'scope, O: 'static, D: 'static> {
    /// Each event with the table's value for its key as of the event's time.
    pub results: EventStream<'scope, O>,
    /// Events that came later than the allowed lateness.
    pub late: LateOutput<'scope, D>,
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// Enriches each event with the table's value for its key *as of the
    /// event's time* (an event-time temporal join, as in Flink's `FOR
    /// SYSTEM_TIME AS OF`); events without a value are dropped.
    ///
    /// An event waits until the table's watermark passes its time, so that
    /// every table change up to it has arrived, whatever the order in which
    /// table and stream records arrive; its result goes out at its time, or at
    /// its arrival if that is later. Results are final: a table change that
    /// arrives later (within its own lateness) affects only events joined after
    /// it (use [`join_updating`](Self::join_updating) for results that follow
    /// the table). Events that arrive after their time plus `allowed_lateness`
    /// go to the late output. The table's versions are kept only as far back
    /// as an event can still arrive. With checkpoints on, a checkpoint holds
    /// the table's versions by key and the events still waiting.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // Exchange rates of currency 1: 10 from t=0, 12 from t=100.
    ///     let rates = vec![((1u8, Some(10u32)), 0u64, 1i64), ((1, Some(12)), 100, 1)];
    ///     let rates = EventStream::new(rates.to_stream(scope)).upsert(0).table;
    ///     // Payments (currency, amount) at t=50 and t=150; currency 2 has no rate.
    ///     let payments = vec![((1u8, 7u32), 50u64, 1i64), ((1, 7), 150, 1), ((2, 5), 60, 1)];
    ///     let payments = EventStream::new(payments.to_stream(scope));
    ///     payments.join_as_of(&rates, |p| p.0, 0).results.map(|((_, amount), rate)| amount * rate).inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort();
    /// assert_eq!(out, vec![(70, 50, 1), (84, 150, 1)]);
    /// ```
    pub fn join_as_of<K, V, KF>(
        &self,
        table: &Table<'scope, K, V>,
        key: KF,
        allowed_lateness: u64,
    ) -> AsOfJoined<'scope, (D, V), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.as_of_core("JoinAsOf", table, key, allowed_lateness, |d, v| v.map(|v| (d, v.clone())))
    }

    /// [`join_as_of`](Self::join_as_of), keeping events without a value (with
    /// `None`). See the [module example](crate::table).
    pub fn left_join_as_of<K, V, KF>(
        &self,
        table: &Table<'scope, K, V>,
        key: KF,
        allowed_lateness: u64,
    ) -> AsOfJoined<'scope, (D, Option<V>), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.as_of_core("LeftJoinAsOf", table, key, allowed_lateness, |d, v| Some((d, v.cloned())))
    }

    fn as_of_core<K, V, KF, O, F>(
        &self,
        name: &str,
        table: &Table<'scope, K, V>,
        key: KF,
        allowed_lateness: u64,
        output: F,
    ) -> AsOfJoined<'scope, O, D>
    where
        K: Key,
        V: Data + PartialEq,
        O: Data,
        KF: Fn(&D) -> K + 'static,
        F: Fn(D, Option<&V>) -> Option<O> + 'static,
    {
        let lateness = AllowedLateness(allowed_lateness);
        let key = Rc::new(key);
        let route_key = Rc::clone(&key);
        let stateful = Stateful::<AsOfState<K, V, D>>::new(name, &self.scope());
        let table_log = stateful.keyed_input(&table.changelog, |u: &Update<(K, V)>| route(&(u.0).0));
        let stream = stateful.keyed_input(self, move |u: &Update<D>| route(&route_key(&u.0)));
        let mut builder = stateful.builder(&self.scope());
        let mut table_in = builder.input(table_log);
        let mut stream_in = builder.input(stream);
        let (mut results_out, results) = builder.output::<O>();
        let (mut late_out, late) = builder.output::<D>();
        let count = Counter::new();
        let counter = count.clone();

        builder.build(move |initial_capabilities, mut managed| {
            let mut due: BTreeMap<Timestamp, Vec<K>> = BTreeMap::new();
            let mut hold = Hold::default();
            // Changes up to the horizon are summed in the versions' bases. A
            // restored worker starts from 0: its keys' changes are kept by
            // time, which answers every query a base would.
            let mut horizon: Timestamp = 0;
            managed.restore(|AsOfState { versions, waiting }, time, entries| {
                entries.for_each(|entry| match entry {
                    AsOfEntry::Versions(k, versioned) => {
                        for (t, _, _) in versioned.changes.iter() {
                            due.entry(*t).or_default().push(k.clone());
                        }
                        versions.insert(k, versioned);
                    }
                    // Waiting events are at or after the cut: they owe their results there.
                    AsOfEntry::Waiting(t, record, diff, emit_at) => {
                        waiting.restore((record, diff), t, emit_at.max(time), &mut hold, &initial_capabilities);
                    }
                });
            });
            drop(initial_capabilities);
            move |frontiers| {
                // While a background thread snapshots the versions and waiting
                // events, nothing is done (the compaction schedule stays here).
                if !managed.home() {
                    return;
                }
                let AsOfState { versions, waiting } = managed.get();
                let mut results = results_out.activate();
                let mut late = late_out.activate();
                table_in.for_each_stamp(|_cap, data| {
                    for batch in data {
                        if horizon == END_OF_TIME {
                            // No event will ask any more.
                            batch.clear();
                        }
                        for ((k, v), time, diff) in batch.drain(..) {
                            let entry = versions
                                .entry(k.clone())
                                .or_insert_with(|| Versioned { base: SmallVec::new(), changes: Vec::new() });
                            if time <= horizon {
                                bump(&mut entry.base, &v, diff);
                                if entry.base.is_empty() && entry.changes.is_empty() {
                                    versions.remove(&k);
                                }
                            } else {
                                let at = entry.changes.partition_point(|(t, _, _)| *t <= time);
                                entry.changes.insert(at, (time, v, diff));
                                due.entry(time).or_default().push(k);
                            }
                        }
                    }
                });
                let table_watermark = watermark_of(&frontiers[0]);

                stream_in.for_each_stamp(|cap, data| {
                    let arrived = arrival_time(&cap);
                    let mut session = results.session(&cap);
                    for batch in data {
                        for (record, time, diff) in batch.drain(..) {
                            if lateness.release_at(time.saturating_add(1)) <= arrived {
                                late.session(&cap).give((record, time, diff));
                                counter.add(1);
                            } else if time < table_watermark && time < arrived {
                                // Joined at once, at its arrival. An event ahead of its arrival
                                // goes out at its own time, as if it had waited: its result's
                                // timely time does not depend on how far the table had got.
                                let value = versions.get(&key(&record)).and_then(|v| v.as_of(time));
                                if let Some(out) = output(record, value) {
                                    session.give((out, time, diff));
                                }
                            } else {
                                waiting.insert((record, diff), time, arrived, &mut hold, &cap);
                            }
                        }
                    }
                });

                while let Some((time, records, emit_at)) = waiting.pop_before(table_watermark, &mut hold) {
                    let cap = hold.at(emit_at);
                    let mut session = results.session(&cap);
                    for (record, diff) in records {
                        let value = versions.get(&key(&record)).and_then(|v| v.as_of(time));
                        if let Some(out) = output(record, value) {
                            session.give((out, time, diff));
                        }
                    }
                }
                hold.settle(None);

                // Versions before the earliest time an event can still ask for.
                let stream_watermark = watermark_of(&frontiers[1]);
                let reachable = stream_watermark.saturating_sub(lateness.0);
                let next = waiting.first_time().map_or(reachable, |t| t.min(reachable));
                if stream_watermark == END_OF_TIME && waiting.first_time().is_none() {
                    // The events are done: the table's versions serve nobody.
                    horizon = END_OF_TIME;
                    *versions = StateMap::default();
                    due.clear();
                } else if next > horizon {
                    horizon = next.saturating_sub(1);
                    while let Some(entry) = due.first_entry() {
                        if *entry.key() > horizon {
                            break;
                        }
                        for k in entry.remove() {
                            if versions.get_mut(&k).is_some_and(|v| v.compact(horizon)) {
                                versions.remove(&k);
                            }
                        }
                    }
                }
                // The key function stays here (it need not be `Send`): the waiting
                // events are routed now, the rest is serialized in the background.
                managed.checkpoint_with(table_watermark.min(stream_watermark), |st| {
                    st.waiting.iter().map(|(_, (record, _), _)| route(&key(record))).collect()
                });
            }
        });
        AsOfJoined { results, late: LateOutput { stream: late, count } }
    }

    /// Joins each event with the table's *current* value for its key, keeping
    /// the results up to date: when the table's value changes, the results of
    /// every earlier event with that key are retracted and re-emitted with the
    /// new value (a differential join of the events with the table, as in
    /// Materialize or a Flink regular join). Every event is kept for ever.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // The price of product 7 is 3 from t=0 and 4 from t=20; an order comes at t=10.
    ///     let prices = vec![((7u32, Some(3)), 0u64, 1i64), ((7, Some(4)), 20, 1)];
    ///     let table = EventStream::new(prices.to_stream(scope)).upsert(0).table;
    ///     let orders = EventStream::new(vec![(7u32, 10u64, 1i64)].to_stream(scope));
    ///     orders.join_updating(&table, |product| *product).inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort_by_key(|(d, t, r)| (*t, *r, *d));
    /// assert_eq!(out, vec![((7, 3), 10, 1), ((7, 3), 20, -1), ((7, 4), 20, 1)]);
    /// ```
    pub fn join_updating<K, V, KF>(&self, table: &Table<'scope, K, V>, key: KF) -> EventStream<'scope, (D, V)>
    where
        D: Ord,
        K: Key,
        V: Data + Ord,
        KF: Fn(&D) -> K + 'static,
    {
        let keyed = self.map(move |d| (key(&d), d)).as_collection();
        let joined = keyed.join_map(table.as_collection(), |_k, d, v| (d.clone(), v.clone()));
        from_collection(&joined)
    }
}

impl<'scope, K: Key, V: Data + Ord> Table<'scope, K, V> {
    /// Inner join with a table on a key computed from this table's rows (a
    /// foreign key into `other`, or the same key), incrementally maintained by
    /// differential dataflow: a change on either side yields exactly the
    /// retractions and insertions of the affected result rows.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // order -> customer, customer -> name
    ///     let orders = vec![((1u32, Some(10u32)), 5u64, 1i64), ((2, Some(11)), 6, 1)];
    ///     let customers = vec![((10u32, Some('a')), 1u64, 1i64), ((10, Some('b')), 8, 1)];
    ///     let orders = EventStream::new(orders.to_stream(scope)).upsert(0).table;
    ///     let customers = EventStream::new(customers.to_stream(scope)).upsert(0).table;
    ///     orders.join(&customers, |_order, customer| *customer).inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort_by_key(|(d, t, r)| (*t, *r, *d));
    /// assert_eq!(out, vec![
    ///     (((1, 10), (10, 'a')), 5, 1),
    ///     (((1, 10), (10, 'a')), 8, -1),
    ///     (((1, 10), (10, 'b')), 8, 1),
    /// ]);
    /// ```
    pub fn join<J, W, F>(&self, other: &Table<'scope, J, W>, on: F) -> EventStream<'scope, ((K, V), (J, W))>
    where
        J: Key,
        W: Data + Ord,
        F: Fn(&K, &V) -> J + 'static,
    {
        let left = self.as_collection().map(move |(k, v)| (on(&k, &v), (k, v)));
        let joined = left.join_map(other.as_collection(), |j, kv, w| (kv.clone(), (j.clone(), w.clone())));
        from_collection(&joined)
    }

    /// Left outer join: [`join`](Self::join), plus every row of this table
    /// that matches no row of `other`, with `None`.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // Order 1 belongs to customer 10, who appears at t=8.
    ///     let orders = EventStream::new(vec![((1u32, Some(10u32)), 5u64, 1i64)].to_stream(scope)).upsert(0).table;
    ///     let customers = EventStream::new(vec![((10u32, Some('a')), 8u64, 1i64)].to_stream(scope)).upsert(0).table;
    ///     orders.left_join(&customers, |_, customer| *customer).inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort_by_key(|(_, t, r)| (*t, *r));
    /// assert_eq!(out, vec![
    ///     (((1, 10), None), 5, 1),
    ///     (((1, 10), None), 8, -1),
    ///     (((1, 10), Some((10, 'a'))), 8, 1),
    /// ]);
    /// ```
    pub fn left_join<J, W, F>(&self, other: &Table<'scope, J, W>, on: F) -> EventStream<'scope, LeftJoined<K, V, J, W>>
    where
        J: Key,
        W: Data + Ord,
        F: Fn(&K, &V) -> J + 'static,
    {
        let left = self.as_collection().map(move |(k, v)| (on(&k, &v), (k, v)));
        let right = other.as_collection();
        let matched = left.clone().join_map(right.clone(), |j, kv, w| (kv.clone(), Some((j.clone(), w.clone()))));
        let unmatched = left.antijoin(right.map(|(j, _)| j)).map(|(_, kv)| (kv, None));
        from_collection(&matched.concat(unmatched))
    }

    /// Full outer join: [`left_join`](Self::left_join), plus every row of
    /// `other` that no row of this table matches, with `None` on the left.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let orders = EventStream::new(vec![((1u32, Some(10u32)), 5u64, 1i64)].to_stream(scope)).upsert(0).table;
    ///     // Customer 11 has no order.
    ///     let customers = vec![((10u32, Some('a')), 1u64, 1i64), ((11, Some('b')), 1, 1)];
    ///     let customers = EventStream::new(customers.to_stream(scope)).upsert(0).table;
    ///     orders.full_join(&customers, |_, customer| *customer).inner.capture()
    /// });
    /// let mut net = std::collections::BTreeMap::new();
    /// for (row, _t, r) in captured.extract().into_iter().flat_map(|(_, d)| d) {
    ///     *net.entry(row).or_insert(0) += r;
    /// }
    /// net.retain(|_, r| *r != 0);
    /// assert_eq!(net.into_keys().collect::<Vec<_>>(), vec![
    ///     (None, Some((11, 'b'))),
    ///     (Some((1, 10)), Some((10, 'a'))),
    /// ]);
    /// ```
    pub fn full_join<J, W, F>(&self, other: &Table<'scope, J, W>, on: F) -> EventStream<'scope, FullJoined<K, V, J, W>>
    where
        J: Key,
        W: Data + Ord,
        F: Fn(&K, &V) -> J + 'static,
    {
        let left = self.as_collection().map(move |(k, v)| (on(&k, &v), (k, v)));
        let right = other.as_collection();
        let matched = left.clone().join_map(right.clone(), |j, kv, w| (Some(kv.clone()), Some((j.clone(), w.clone()))));
        let referenced = left.clone().map(|(j, _)| j).distinct_core::<Diff>();
        let left_only = left.antijoin(right.clone().map(|(j, _)| j)).map(|(_, kv)| (Some(kv), None));
        let right_only = right.antijoin(referenced).map(|jw| (None, Some(jw)));
        from_collection(&matched.concat(left_only).concat(right_only))
    }
}
