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
//!     let table = EventStream::new(upserts.to_stream(scope)).upsert().table;
//!     let clicks = EventStream::new(vec![(1u64, 10u64, 1i64), (2, 30, 1), (1, 55, 1), (2, 70, 1)].to_stream(scope));
//!     clicks.left_join_as_of(&table, |user| *user).results.inner.capture()
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

// The table type and its upsert operator are here; serving a table to
// queries, the as-of (temporal) joins and the differential joins each have
// their own file.
mod as_of;
mod join;
mod serve;

pub use as_of::AsOfJoined;
pub use join::{FullJoined, LeftJoined};
pub use serve::{AsOfError, ReadHold, TableRead, TableReader, Timeline};

use differential_dataflow::operators::arrange::{Arranged, TraceAgent};
use differential_dataflow::trace::implementations::ValSpine;
use differential_dataflow::VecCollection;
use smallvec::SmallVec;

use crate::key::{route, Data, Key};
use crate::late::{Counter, LateOutput};
use crate::state::{
    give_all, AnyKeyedState, KeyedState, OperatorState, Schema, Snapshot, StateError, StateTtl, Stateful, Timers,
    WithTtl,
};
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
    /// Keys forgotten because their last value expired (with a
    /// [state TTL](crate::state::StateTtl); zero without).
    pub expired: Counter,
}

/// The values of one key from each of its upserts' times on, in time order,
/// the time a compaction is scheduled for, and with a time-to-live the time
/// the key's expiry is checked at (`Timestamp::MAX`: none).
///
/// The two are timers of their own, so that an upsert, which brings the
/// compaction forward, leaves no superseded expiry timer behind: the expiry
/// timer is set once and, when it finds the key refreshed, set again at the
/// new expiry (one per key, not one per upsert within the TTL).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct History<V> {
    versions: SmallVec<[(Timestamp, Option<V>); 1]>,
    scheduled: Timestamp,
    expiring: Timestamp,
}

/// [`History`] in version 1 of the schema, without the expiry timer.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct HistoryV1<V> {
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

    /// The changelog that the versions in `range` stand for, with a
    /// time-to-live, each diff times `sign`, into `out`: each value from its
    /// version's time until the next version, or until it expires (`ttl`'s
    /// expiry time) if that comes first: then retracted there with
    /// [`Expiry::Retract`](crate::state::Expiry::Retract), never with
    /// [`Expiry::Silent`](crate::state::Expiry::Silent) (downstream keeps
    /// what it was told, and the next version does not retract it). A
    /// version's entries depend only on it and on its successor's time.
    fn changelog_of(
        &self,
        range: std::ops::Range<usize>,
        ttl: StateTtl,
        sign: Diff,
        out: &mut Vec<(V, Timestamp, Diff)>,
    ) where
        V: Clone,
    {
        for i in range {
            let (t, v) = &self.versions[i];
            let Some(v) = v else { continue };
            let expires = ttl.expires_at(*t);
            let end = match self.versions.get(i + 1).map(|(n, _)| *n) {
                Some(next) if next < expires => Some(next),
                _ if ttl.retracts() => Some(expires),
                _ => None,
            };
            out.push((v.clone(), *t, sign));
            if let Some(end) = end {
                out.push((v.clone(), end, -sign));
            }
        }
    }

    /// With a time-to-live: the time from which the whole history can be
    /// forgotten (its last version has expired for every record that can
    /// still arrive), if its last version is a value.
    fn expires_from(&self, ttl: StateTtl) -> Option<Timestamp> {
        match self.versions.last() {
            Some((t, Some(_))) => Some(ttl.expires_at(*t)),
            _ => None,
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
    /// that arrive after their time plus the allowed lateness (see
    /// [`WithLateness`](crate::WithLateness)) go to the late
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
    ///     EventStream::new(upserts.to_stream(scope)).upsert().table.changelog().inner.capture()
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
    pub fn upsert(&self) -> Upserted<'scope, K, V> {
        self.upsert_with(AllowedLateness::default_of(&self.scope()), StateTtl::of(&self.scope()))
    }

    fn upsert_with(&self, lateness: AllowedLateness, ttl: Option<StateTtl>) -> Upserted<'scope, K, V> {
        let ttl = crate::state::in_event_time(ttl, "Upsert");
        let stateful = Stateful::<Upserts<K, V>>::new("Upsert", &self.scope());
        let gated = stateful.keyed_input(self, |u: &Update<(K, Option<V>)>| route(&(u.0).0));
        let mut builder = stateful.builder(&self.scope());
        let mut input = builder.input(gated);
        let (mut log_out, log) = builder.output::<(K, V)>();
        let (mut late_out, late) = builder.output::<(K, Option<V>)>();
        let (count, expired) = (Counter::new(), Counter::new());
        crate::totals::Totals::count_in(&self.scope(), "Upsert.late", &count);
        if ttl.is_some() {
            crate::totals::Totals::count_in(&self.scope(), "Upsert.expired", &expired);
        }
        let mut op = UpsertOp {
            lateness,
            ttl,
            counter: count.clone(),
            expired: expired.clone(),
            due: Timers::default(),
            log: Vec::new(),
            changes: Vec::new(),
            late: Vec::new(),
        };

        builder.build(move |_caps, mut managed| {
            // Recovery: each key's history, and its compaction schedule. The
            // changelog up to the cut went out before it: nothing is owed.
            managed.restore(|Upserts(tables), _time, entries| {
                tables.reserve(entries.len());
                entries.for_each(|(k, mut history)| {
                    op.due.restore(history.scheduled, k.clone());
                    // The expiry timer follows from the history (an entry
                    // migrated from version 1 of the schema has none).
                    history.expiring = Timestamp::MAX;
                    op.schedule_expiry(&mut history, &k);
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
                    for batch in data {
                        if tables.prefetches() {
                            tables.prefetch(batch.iter().map(|((k, _), _, _)| k));
                        }
                        let mut updates = batch.drain(..);
                        loop {
                            let chunk = updates.as_slice();
                            if chunk.is_empty() {
                                break;
                            }
                            touch(tables, chunk[..chunk.len().min(TOUCH_AHEAD)].iter().map(|((k, _), _, _)| k));
                            for ((k, v), time, diff) in updates.by_ref().take(TOUCH_AHEAD) {
                                op.take(tables, k, v, time, diff, arrived);
                            }
                        }
                    }
                    give_all(&mut log, &cap, &mut op.log);
                    give_all(&mut late, &cap, &mut op.late);
                });
                let watermark = watermark_of(&frontiers[0]);
                op.compact(tables, watermark);
                managed.checkpoint(watermark, ());
            }
        });
        Upserted { table: Table { changelog: log }, late: LateOutput { stream: late, count }, expired }
    }
}

impl<'scope, K: Key, V: Data + PartialEq> crate::late::WithLateness<'scope, (K, Option<V>)> {
    /// Builds a table from upserts that arrive up to the allowed lateness
    /// after the watermark passed them; see [`EventStream::upsert`].
    pub fn upsert(&self) -> Upserted<'scope, K, V> {
        self.stream.upsert_with(self.lateness, StateTtl::of(&self.stream.scope()))
    }
}

impl<'scope, K: Key, V: Data + PartialEq> WithTtl<'scope, (K, Option<V>)> {
    /// [`EventStream::upsert`] whose keys expire: a key's value set at event
    /// time `t` holds until its next upsert or until `t + ttl`, whichever
    /// comes first; a key whose last value has expired for every upsert that
    /// can still arrive is forgotten. With
    /// [`Expiry::Retract`](crate::state::Expiry::Retract) the changelog
    /// retracts an expired value at its expiry time (so the table holds
    /// only live values, on any layout); with
    /// [`Expiry::Silent`](crate::state::Expiry::Silent) it does not, and an
    /// upsert after the expiry does not retract it either (downstream keeps
    /// what it was told, as with Flink's state TTL).
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{Expiry, StateTtl};
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // Key 7 is set at 0 s and 5 s, key 8 at 1 s; values live 10 s.
    ///     let upserts = vec![((7u32, Some('a')), 0u64, 1i64), ((7, Some('b')), 5_000, 1), ((8, Some('x')), 1_000, 1)];
    ///     let ttl = StateTtl::event_time(10.secs()).expiry(Expiry::Retract);
    ///     EventStream::new(upserts.to_stream(scope)).state_ttl(ttl).upsert().table.changelog().inner.capture()
    /// });
    /// let mut net = std::collections::BTreeMap::new();
    /// for (kv, t, d) in captured.extract().into_iter().flat_map(|(_, d)| d) { *net.entry((t, kv)).or_insert(0) += d; }
    /// net.retain(|_, d| *d != 0);
    /// assert_eq!(net.into_iter().collect::<Vec<_>>(), vec![
    ///     ((0, (7, 'a')), 1), ((1_000, (8, 'x')), 1), ((5_000, (7, 'a')), -1), ((5_000, (7, 'b')), 1),
    ///     ((11_001, (8, 'x')), -1), ((15_001, (7, 'b')), -1),
    /// ]);
    /// ```
    pub fn upsert(&self) -> Upserted<'scope, K, V> {
        self.stream.upsert_with(AllowedLateness::default_of(&self.stream.scope()), Some(self.ttl))
    }
}

impl<'scope, K: Key, V: Data> Table<'scope, K, V> {
    /// A table from a changelog that already is one (at most one value per key
    /// at any time, e.g. the result of a differential `reduce`). The updates
    /// are moved to the workers that own their keys.
    pub fn from_changelog(changelog: &EventStream<'scope, (K, V)>) -> Self {
        Table { changelog: changelog.exchange(|(k, _)| k.clone()) }
    }

    /// A table from a differential collection that is one (at most one
    /// value per key at any time): the result of a `reduce`, or an
    /// arrangement's `as_collection`, to serve it or join it as a table.
    ///
    /// # Examples
    /// ```
    /// use differential_dataflow::operators::CountTotal;
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::table::{Table, TableReader};
    /// use timely::dataflow::operators::ToStream;
    ///
    /// let counts: TableReader<char, i64> = TableReader::new();
    /// let reader = counts.clone();
    /// timely::example(move |scope| {
    ///     let words = vec![('a', 1u64, 1i64), ('b', 2, 1), ('a', 3, 1)].to_stream(scope);
    ///     let counted = EventStream::new(words).as_collection().count_total_core::<i64>();
    ///     Table::from_collection(&counted).serve(&reader);
    /// });
    /// assert_eq!(counts.snapshot(), vec![('a', 2), ('b', 1)]);
    /// ```
    pub fn from_collection(collection: &VecCollection<'scope, Timestamp, (K, V), Diff>) -> Self {
        Self::from_changelog(&crate::collection::from_collection(collection))
    }

    /// The table as a changelog stream: `+(key, value)` when a value is set,
    /// `-(key, value)` when it is replaced or deleted, each at its event time.
    pub fn changelog(&self) -> EventStream<'scope, (K, V)> {
        self.changelog.clone()
    }
}

/// A window's result as a table row: its window and its value (the key of
/// the row is the result's key and the window's start).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct WindowRow<O> {
    /// The window's start (inclusive).
    pub start: Timestamp,
    /// Its end (exclusive).
    pub end: Timestamp,
    /// The aggregate.
    pub value: O,
}

impl<'scope, K: Key, O: Data> EventStream<'scope, crate::window::WindowResult<K, O>> {
    /// The window results as a table keyed by `(key, window start)`: each
    /// window's latest result (late corrections replace it), to serve as a
    /// view or join as a table.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::table::{TableReader, WindowRow};
    /// use timely::dataflow::operators::ToStream;
    ///
    /// let sums: TableReader<(char, Timestamp), WindowRow<i64>> = TableReader::new();
    /// let reader = sums.clone();
    /// timely::example(move |scope| {
    ///     let sales = vec![(('x', 5i64), 1_000u64, 1i64), (('x', 7), 2_000, 1), (('x', 1), 12_000, 1)];
    ///     EventStream::new(sales.to_stream(scope))
    ///         .window(Tumbling::of(10_000))
    ///         .key_by(|(k, _): &(char, i64)| *k)
    ///         .aggregate(Sum::of(|(_, v): &(char, i64)| *v))
    ///         .results
    ///         .as_table()
    ///         .serve(&reader);
    /// });
    /// let rows = sums.snapshot();
    /// assert_eq!(rows[0], (('x', 0), WindowRow { start: 0, end: 10_000, value: 12 }));
    /// assert_eq!(rows[1], (('x', 10_000), WindowRow { start: 10_000, end: 20_000, value: 1 }));
    /// ```
    pub fn as_table(&self) -> Table<'scope, (K, Timestamp), WindowRow<O>> {
        let rows = self
            .map(|r| ((r.key, r.window.start), WindowRow { start: r.window.start, end: r.window.end, value: r.value }));
        Table::from_changelog(&rows)
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
}

/// The upsert operator's work on a worker: each upsert applied to its key's
/// history with the changelog it makes ([`take`](Self::take)), and
/// histories compacted as the watermark passes the versions no record can
/// reach any more ([`compact`](Self::compact)).
struct UpsertOp<K, V> {
    lateness: AllowedLateness,
    /// Values expire ([`WithTtl::upsert`]).
    ttl: Option<StateTtl>,
    counter: Counter,
    /// Keys forgotten because their last value expired.
    expired: Counter,
    /// Keys by the time a compaction of their history is scheduled for.
    due: Timers<K>,
    /// The changelog and the late upserts of the stamp being taken in.
    log: Vec<Update<(K, V)>>,
    /// With a TTL, the changelog of the versions an upsert changes.
    changes: Vec<(V, Timestamp, Diff)>,
    late: Vec<Update<(K, Option<V>)>>,
}

impl<K: Key, V: Data + PartialEq> UpsertOp<K, V> {
    /// Applies the upsert `(k, v)` at `time` (an undo if `diff` < 0) that
    /// arrived at `arrived`: the key's value on `[time, next version)`
    /// changes, and the changelog says so.
    fn take(
        &mut self,
        tables: &mut KeyedState<K, History<V>>,
        k: K,
        v: Option<V>,
        time: Timestamp,
        diff: Diff,
        arrived: Timestamp,
    ) {
        if self.lateness.release_at(time.saturating_add(1)) <= arrived {
            self.late.push(((k, v), time, diff));
            self.counter.add(1);
            return;
        }
        if diff == 0 {
            return;
        }
        let history = if diff > 0 {
            tables.get_or_insert_with(k.clone(), || History {
                versions: SmallVec::new(),
                scheduled: Timestamp::MAX,
                expiring: Timestamp::MAX,
            })
        } else {
            // An undo of an upsert this key does not hold changes nothing.
            match tables.get_mut(&k) {
                Some(history) => history,
                None => return,
            }
        };
        // With a TTL, the changelog is the difference between what the
        // history stands for before and after the upsert: that of the
        // versions around the change (from the one before the version at or
        // before `time`, to the one after it; the entries of a version
        // depend only on it and on its successor's time).
        let at = history.versions.partition_point(|(t, _)| *t <= time);
        let lo = at.saturating_sub(2);
        let hi = (at + 1).min(history.versions.len());
        let len = history.versions.len();
        // The usual upsert comes after every version the key holds: its
        // changelog follows from the last version alone (below).
        let append = diff > 0 && at == len && history.versions.last().is_none_or(|(t, _)| *t < time);
        if let (Some(ttl), false) = (self.ttl, append) {
            self.changes.clear();
            history.changelog_of(lo..hi, ttl, -1, &mut self.changes);
        }
        let versions = &mut history.versions;
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
            return;
        };
        if let (Some(ttl), true) = (self.ttl, append) {
            self.append_changelog(history, &k, time, ttl);
        } else if let Some(ttl) = self.ttl {
            // The window holds as many versions more, or fewer, as the upsert added.
            let hi = (hi + history.versions.len()).saturating_sub(len).max(lo);
            history.changelog_of(lo..hi, ttl, 1, &mut self.changes);
            consolidate_changes(&mut self.changes);
            self.log.extend(self.changes.drain(..).map(|(v, t, d)| ((k.clone(), v), t, d)));
        } else if old != new {
            let log = &mut self.log;
            let mut change = |value: Option<V>, t: Timestamp, d: Diff| {
                if let Some(value) = value {
                    log.push(((k.clone(), value), t, d));
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
            Some(from) => {
                let at = self.lateness.release_at(from.saturating_add(1));
                self.due.bring_forward(&mut history.scheduled, at, &k);
            }
            None if history.versions.is_empty() => {
                tables.remove(&k);
                return;
            }
            None => {}
        }
        self.schedule_expiry(history, &k);
    }

    /// With a time-to-live, the changelog of an upsert at `time` appended
    /// after every other version of `history` (what
    /// [`History::changelog_of`] gives for the last two versions, less what
    /// it gave for the last one before): the previous value now ends at
    /// `time` unless it had expired before, and the new one starts there
    /// (and, with retractions, ends at its expiry).
    fn append_changelog(&mut self, history: &History<V>, k: &K, time: Timestamp, ttl: StateTtl) {
        let n = history.versions.len();
        let new = history.versions[n - 1].1.as_ref();
        let mut continues = false;
        if let Some((before, Some(old))) = n.checked_sub(2).map(|i| &history.versions[i]) {
            let expires = ttl.expires_at(*before);
            let end_before = ttl.retracts().then_some(expires);
            let end_after = if time < expires { Some(time) } else { end_before };
            if end_before != end_after {
                if let Some(end) = end_before {
                    self.log.push(((k.clone(), old.clone()), end, 1));
                }
                match end_after {
                    // The same value again: it goes on.
                    Some(end) if end == time && new == Some(old) => continues = true,
                    Some(end) => self.log.push(((k.clone(), old.clone()), end, -1)),
                    None => {}
                }
            }
        }
        if let Some(new) = new {
            if !continues {
                self.log.push(((k.clone(), new.clone()), time, 1));
            }
            if ttl.retracts() {
                self.log.push(((k.clone(), new.clone()), ttl.expires_at(time), -1));
            }
        }
    }

    /// With a time-to-live, makes sure key `k`'s expiry timer is due no later
    /// than the time from which its history can be forgotten (an earlier
    /// timer stays: when due, it finds the key refreshed and is set again).
    fn schedule_expiry(&mut self, history: &mut History<V>, k: &K) {
        let Some(ttl) = self.ttl else { return };
        if let Some(at) = history.expires_from(ttl).map(|e| self.lateness.release_at(e)).filter(|at| *at < END_OF_TIME)
        {
            if history.expiring == Timestamp::MAX || at < history.expiring {
                self.due.bring_forward(&mut history.expiring, at, k);
            }
        }
    }

    /// Compaction: forgets the versions no record can reach any more now
    /// that the watermark is at `watermark`.
    fn compact(&mut self, tables: &mut KeyedState<K, History<V>>, watermark: Timestamp) {
        // A record at `watermark - lateness` is still accepted, and an undo
        // there needs the version before it: keep the latest one before.
        let horizon = watermark.saturating_sub(self.lateness.0).saturating_sub(1);
        // At the end of input the histories are kept as they are (a final checkpoint holds them).
        if watermark == END_OF_TIME {
            return;
        }
        while let Some((time, keys)) = self.due.pop_due(watermark) {
            if tables.prefetches() {
                tables.prefetch(keys.iter());
            }
            for (i, k) in keys.iter().enumerate() {
                if i % TOUCH_AHEAD == 0 {
                    touch(tables, keys[i..].iter().take(TOUCH_AHEAD));
                }
                let Some(history) = tables.get_mut(k) else { continue };
                let (compacts, checks_expiry) = (history.scheduled == time, history.expiring == time);
                if !compacts && !checks_expiry {
                    continue;
                }
                if compacts {
                    history.scheduled = Timestamp::MAX;
                }
                if checks_expiry {
                    history.expiring = Timestamp::MAX;
                }
                // With a TTL: a key whose last value has expired for every
                // record that can still arrive is forgotten (what it stands
                // for no longer changes; its retraction, if any, went out
                // with the upsert that set it).
                let expires = self.ttl.and_then(|ttl| history.expires_from(ttl));
                if expires.is_some_and(|e| e <= horizon.saturating_add(1)) {
                    tables.remove(k);
                    self.expired.add(1);
                    continue;
                }
                if history.compact(horizon) {
                    tables.remove(k);
                    continue;
                }
                if history.scheduled == Timestamp::MAX {
                    let from = history.compact_from().map(|from| self.lateness.release_at(from.saturating_add(1)));
                    if let Some(next) = from.filter(|t| *t < END_OF_TIME) {
                        history.scheduled = next.max(time.saturating_add(1));
                        self.due.schedule(history.scheduled, k.clone());
                    }
                }
                // Not expired yet: due after the watermark.
                self.schedule_expiry(history, k);
            }
        }
    }
}

/// How many keys' histories are read ahead of their upserts
/// ([`touch`]).
const TOUCH_AHEAD: usize = 32;

/// Reads the histories of `keys` (in memory) so that the updates which
/// follow find them in the cache: the table is bound by memory latency (a
/// random key's hash slot and its version list are two cache misses), and
/// a short loop of independent lookups keeps many misses in flight where
/// an upsert's own work, longer, keeps about one.
fn touch<'a, K: Key + 'a, V: Data>(tables: &mut KeyedState<K, History<V>>, keys: impl Iterator<Item = &'a K>) {
    if tables.prefetches() {
        return;
    }
    for k in keys {
        if let Some(history) = tables.get(k) {
            // Its timers too: a hash slot may straddle two cache lines.
            std::hint::black_box((history.versions.last().map(|(t, _)| *t), history.scheduled, history.expiring));
        }
    }
}

/// A key's upserts in an upsert table's state.
struct Upserts<K, V>(KeyedState<K, History<V>>);

impl<K, V> Default for Upserts<K, V> {
    fn default() -> Self {
        Upserts(KeyedState::default())
    }
}

impl<K: Key, V: Data> OperatorState for Upserts<K, V> {
    /// Version 2: each history with its expiry timer.
    const SCHEMA: Schema = Schema::new("table.upsert", 2);
    const MIGRATES_FROM: &'static [u32] = &[1];
    /// A key and its history.
    type Entry = (K, History<V>);
    type Prepared = ();

    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        debug_assert_eq!(version, 1);
        let (k, v1): (K, HistoryV1<V>) = crate::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: Schema::new("table.upsert", 1), reason: e.to_string() })?;
        Ok((k, History { versions: v1.versions, scheduled: v1.scheduled, expiring: Timestamp::MAX }))
    }

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.0);
    }

    /// Its keyed states hold all of it (splits for incremental checkpoints).
    fn split_prepared() -> Option<Self::Prepared> {
        Some(())
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.0.len());
        self.0.for_each(|k, h| out.push(route(k), &(k, h)));
    }
}

/// Sums equal `(value, time)` changes and drops those that cancel.
fn consolidate_changes<V: PartialEq>(changes: &mut Vec<(V, Timestamp, Diff)>) {
    // A handful of entries: each folded into the first equal one before it.
    let mut kept = 0;
    for i in 0..changes.len() {
        match (0..kept).find(|&j| changes[j].1 == changes[i].1 && changes[j].0 == changes[i].0) {
            Some(j) => changes[j].2 += changes[i].2,
            None => {
                changes.swap(kept, i);
                kept += 1;
            }
        }
    }
    changes.truncate(kept);
    changes.retain(|(_, _, d)| *d != 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    type State = Upserts<u32, char>;

    /// A version 1 entry (no expiry timer) reads as one whose expiry timer
    /// is set on restore; a broken one is a decode error, not a panic.
    #[test]
    fn version_1_entries_migrate() {
        let versions: SmallVec<[(Timestamp, Option<char>); 1]> =
            [(10, Some('a')), (20, Some('b'))].into_iter().collect();
        let v1 = (7u32, HistoryV1 { versions: versions.clone(), scheduled: 21 });
        let bytes = crate::checkpoint::encode(&v1).unwrap();
        let (k, history) = State::migrate(1, &bytes).unwrap();
        assert_eq!((k, history.versions, history.scheduled, history.expiring), (7, versions, 21, Timestamp::MAX));
        assert!(matches!(State::migrate(1, &bytes[..3]), Err(StateError::Decode { .. })));
    }
}
