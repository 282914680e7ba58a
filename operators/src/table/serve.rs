//! Serving a table to queries from outside the dataflow: [`Table::serve`]
//! keeps each worker's shard of the table's state (its rows and the changes
//! not yet applied, checkpointed by key), which a [`TableReader`] reads by key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use smallvec::SmallVec;

use super::Table;
use crate::key::{route, Data, Key, StateMap};
use crate::state::multiset::bump;
use crate::state::{OperatorState, RestoredEntries, Schema, Snapshot, Stateful};
use crate::time::{watermark_of, Diff, Timestamp};

impl<K: Key, V: Data + Ord> Table<'_, K, V> {
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
///     EventStream::new(upserts.to_stream(scope)).upsert().table.serve(&served);
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
    /// workers ([`END_OF_TIME`](crate::END_OF_TIME) once the table's input
    /// is complete; 0 before any worker serves).
    pub fn watermark(&self) -> Timestamp {
        self.watermarks.lock().ok().and_then(|m| m.values().copied().min()).unwrap_or(0)
    }
}
