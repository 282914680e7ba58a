//! Temporal (as-of) stream–table joins: each event joined with the table's
//! value for its key as of the event's time ([`EventStream::join_as_of`],
//! [`EventStream::left_join_as_of`]), from the table's versions kept as far
//! back as an event can still ask for them.

use std::rc::Rc;
use std::slice::IterMut;

use smallvec::SmallVec;
use timely::dataflow::operators::{Capability, InputCapability};

use super::Table;
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::{Counter, LateOutput};
use crate::state::multiset::bump;
use crate::state::pending::Pending;
use crate::state::{
    ActiveOutput, AnyKeyedState, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot, Stateful, Timers,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp, END_OF_TIME};

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
    versions: KeyedState<K, Versioned<V>>,
    waiting: Pending<(D, Diff)>,
}

impl<K, V, D> Default for AsOfState<K, V, D> {
    fn default() -> Self {
        AsOfState { versions: KeyedState::default(), waiting: Pending::default() }
    }
}

impl<K: Key, V: Data, D: Data> OperatorState for AsOfState<K, V, D> {
    const SCHEMA: Schema = Schema::new("table.as_of", 1);
    type Entry = AsOfEntry<K, Versioned<V>, D>;
    /// The waiting events' routes, in the order they wait (the key function
    /// stays on the worker: it need not be `Send`).
    type Prepared = Vec<u64>;

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.versions);
    }

    /// The records waiting for the watermark.
    fn held(&self) -> (usize, u64) {
        self.waiting.held()
    }

    fn snapshot(&self, routes: Vec<u64>, out: &mut Snapshot) {
        out.reserve(self.versions.len() + routes.len());
        self.versions.for_each(|k, versioned| out.push(route(k), &AsOfEntry::<_, _, ()>::Versions(k, versioned)));
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

/// The outputs of a temporal (as-of) stream–table join.
#[derive(Debug)]
pub struct AsOfJoined<'scope, O: 'static, D: 'static> {
    /// Each event with the table's value for its key as of the event's time.
    pub results: EventStream<'scope, O>,
    /// Events that came later than the allowed lateness.
    pub late: LateOutput<'scope, D>,
}

impl<'scope, D: Data> crate::late::WithLateness<'scope, D> {
    /// [`EventStream::join_as_of`] for events that arrive up to the allowed
    /// lateness after the watermark passed them.
    pub fn join_as_of<K, V, KF>(&self, table: &Table<'scope, K, V>, key: KF) -> AsOfJoined<'scope, (D, V), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.stream.as_of_core("JoinAsOf", table, key, self.lateness, |d, v| v.map(|v| (d, v.clone())))
    }

    /// [`EventStream::left_join_as_of`] for events that arrive up to the
    /// allowed lateness after the watermark passed them.
    pub fn left_join_as_of<K, V, KF>(
        &self,
        table: &Table<'scope, K, V>,
        key: KF,
    ) -> AsOfJoined<'scope, (D, Option<V>), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.stream.as_of_core("LeftJoinAsOf", table, key, self.lateness, |d, v| Some((d, v.cloned())))
    }
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
    /// the table). Events that arrive after their time plus the allowed lateness
    /// go to the late output (see [`WithLateness`](crate::WithLateness)). The table's versions are kept only as far back
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
    ///     let rates = EventStream::new(rates.to_stream(scope)).upsert().table;
    ///     // Payments (currency, amount) at t=50 and t=150; currency 2 has no rate.
    ///     let payments = vec![((1u8, 7u32), 50u64, 1i64), ((1, 7), 150, 1), ((2, 5), 60, 1)];
    ///     let payments = EventStream::new(payments.to_stream(scope));
    ///     payments.join_as_of(&rates, |p| p.0).results.map(|((_, amount), rate)| amount * rate).inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort();
    /// assert_eq!(out, vec![(70, 50, 1), (84, 150, 1)]);
    /// ```
    pub fn join_as_of<K, V, KF>(&self, table: &Table<'scope, K, V>, key: KF) -> AsOfJoined<'scope, (D, V), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.as_of_core("JoinAsOf", table, key, AllowedLateness::default_of(&self.scope()), |d, v| {
            v.map(|v| (d, v.clone()))
        })
    }

    /// [`join_as_of`](Self::join_as_of), keeping events without a value (with
    /// `None`). See the [module example](crate::table).
    pub fn left_join_as_of<K, V, KF>(
        &self,
        table: &Table<'scope, K, V>,
        key: KF,
    ) -> AsOfJoined<'scope, (D, Option<V>), D>
    where
        K: Key,
        V: Data + PartialEq,
        KF: Fn(&D) -> K + 'static,
    {
        self.as_of_core("LeftJoinAsOf", table, key, AllowedLateness::default_of(&self.scope()), |d, v| {
            Some((d, v.cloned()))
        })
    }

    pub(crate) fn as_of_core<K, V, KF, O, F>(
        &self,
        name: &str,
        table: &Table<'scope, K, V>,
        key: KF,
        lateness: AllowedLateness,
        output: F,
    ) -> AsOfJoined<'scope, O, D>
    where
        K: Key,
        V: Data + PartialEq,
        O: Data,
        KF: Fn(&D) -> K + 'static,
        F: Fn(D, Option<&V>) -> Option<O> + 'static,
    {
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
        crate::totals::Totals::count_in(&self.scope(), &format!("{name}.late"), &count);
        let mut join = AsOfJoin {
            key,
            output,
            lateness,
            counter: count.clone(),
            due: Timers::default(),
            hold: Hold::default(),
            horizon: 0,
        };

        builder.build(move |initial_capabilities, mut managed| {
            managed.restore(|state, time, entries| join.restore(state, time, entries, &initial_capabilities));
            drop(initial_capabilities);
            move |frontiers| {
                // While a background thread snapshots the versions and waiting
                // events, nothing is done (the compaction schedule stays here).
                if !managed.home() {
                    return;
                }
                let state = managed.get();
                let mut results = results_out.activate();
                let mut late = late_out.activate();
                table_in.for_each_stamp(|_cap, data| join.take_table(&mut state.versions, data));
                let table_watermark = watermark_of(&frontiers[0]);
                stream_in.for_each_stamp(|cap, data| {
                    join.take_events(state, &cap, data, table_watermark, &mut results, &mut late);
                });
                join.emit_waiting(state, table_watermark, &mut results);
                let stream_watermark = watermark_of(&frontiers[1]);
                join.compact(state, stream_watermark);
                // The key function stays here (it need not be `Send`): the waiting
                // events are routed now, the rest is serialized in the background.
                managed.checkpoint_with(table_watermark.min(stream_watermark), |st| join.routes(&st.waiting));
            }
        });
        AsOfJoined { results, late: LateOutput { stream: late, count } }
    }
}

/// An as-of join operator's own part, besides its checkpointed
/// [`AsOfState`]: its functions, its compaction schedule and the hold on its
/// output. Each activation takes the table's changes
/// ([`take_table`](Self::take_table)) and the events
/// ([`take_events`](Self::take_events)), emits the waiting events the table's
/// watermark has passed ([`emit_waiting`](Self::emit_waiting)) and forgets
/// the versions no event can ask for any more ([`compact`](Self::compact)).
struct AsOfJoin<K, KF, F> {
    key: Rc<KF>,
    output: F,
    lateness: AllowedLateness,
    counter: Counter,
    /// The keys with changes after the horizon, by the changes' times.
    due: Timers<K>,
    hold: Hold,
    /// Changes up to the horizon are summed in the versions' bases. A
    /// restored worker starts from 0: its keys' changes are kept by
    /// time, which answers every query a base would.
    horizon: Timestamp,
}

impl<K: Key, KF, F> AsOfJoin<K, KF, F> {
    /// Restores the state checkpointed at `time` from this worker's entries:
    /// each key's versions, with their changes scheduled for compaction, and
    /// the waiting events, under capabilities minted from the `initial` ones.
    fn restore<V: Data, D: Data>(
        &mut self,
        AsOfState { versions, waiting }: &mut AsOfState<K, V, D>,
        time: Timestamp,
        entries: &mut RestoredEntries<AsOfState<K, V, D>>,
        initial: &[Capability<Timestamp>],
    ) {
        entries.for_each(|entry| match entry {
            AsOfEntry::Versions(k, versioned) => {
                for (t, _, _) in versioned.changes.iter() {
                    self.due.schedule(*t, k.clone());
                }
                versions.insert(k, versioned);
            }
            // Waiting events are at or after the cut: they owe their results there.
            AsOfEntry::Waiting(t, record, diff, emit_at) => {
                waiting.restore((record, diff), t, emit_at.max(time), &mut self.hold, initial);
            }
        });
    }

    /// Takes in the table's changes of one stamp: a change up to the horizon
    /// is summed in its key's base, a later one is kept by time until the
    /// horizon passes it.
    fn take_table<V: Data + PartialEq>(
        &mut self,
        versions: &mut KeyedState<K, Versioned<V>>,
        data: IterMut<'_, Vec<Update<(K, V)>>>,
    ) {
        for batch in data {
            if self.horizon == END_OF_TIME {
                // No event will ask any more.
                batch.clear();
            }
            for ((k, v), time, diff) in batch.drain(..) {
                let entry =
                    versions.get_or_insert_with(k.clone(), || Versioned { base: SmallVec::new(), changes: Vec::new() });
                if time <= self.horizon {
                    bump(&mut entry.base, &v, diff);
                    if entry.base.is_empty() && entry.changes.is_empty() {
                        versions.remove(&k);
                    }
                } else {
                    let at = entry.changes.partition_point(|(t, _, _)| *t <= time);
                    entry.changes.insert(at, (time, v, diff));
                    self.due.schedule(time, k);
                }
            }
        }
    }

    /// `record`, at `time`, joined with its key's value as of `time`.
    fn join<V, D, O>(&self, versions: &mut KeyedState<K, Versioned<V>>, record: D, time: Timestamp) -> Option<O>
    where
        V: Data + PartialEq,
        KF: Fn(&D) -> K,
        F: Fn(D, Option<&V>) -> Option<O>,
    {
        let value = versions.get(&(self.key)(&record)).and_then(|v| v.as_of(time));
        (self.output)(record, value)
    }

    /// Takes in the events of one stamp (`cap`), once the table's changes
    /// before `table_watermark` are in: late events go to the late output,
    /// the ones the table's watermark has passed are joined at once, the
    /// others wait for it.
    fn take_events<V, D, O>(
        &mut self,
        AsOfState { versions, waiting }: &mut AsOfState<K, V, D>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<D>>>,
        table_watermark: Timestamp,
        results: &mut ActiveOutput<'_, O>,
        late: &mut ActiveOutput<'_, D>,
    ) where
        V: Data + PartialEq,
        D: Data,
        O: Data,
        KF: Fn(&D) -> K,
        F: Fn(D, Option<&V>) -> Option<O>,
    {
        let arrived = arrival_time(cap);
        let mut session = results.session(cap);
        for batch in data {
            for (record, time, diff) in batch.drain(..) {
                if self.lateness.release_at(time.saturating_add(1)) <= arrived {
                    late.session(cap).give((record, time, diff));
                    self.counter.add(1);
                } else if time < table_watermark && time < arrived {
                    // Joined at once, at its arrival. An event ahead of its arrival
                    // goes out at its own time, as if it had waited: its result's
                    // timely time does not depend on how far the table had got.
                    if let Some(out) = self.join(versions, record, time) {
                        session.give((out, time, diff));
                    }
                } else {
                    waiting.insert((record, diff), time, arrived, &mut self.hold, cap);
                }
            }
        }
    }

    /// Joins and emits the waiting events the table's watermark has passed,
    /// in event-time order, each at its emission time; then settles the hold.
    fn emit_waiting<V, D, O>(
        &mut self,
        AsOfState { versions, waiting }: &mut AsOfState<K, V, D>,
        table_watermark: Timestamp,
        results: &mut ActiveOutput<'_, O>,
    ) where
        V: Data + PartialEq,
        O: Data,
        KF: Fn(&D) -> K,
        F: Fn(D, Option<&V>) -> Option<O>,
    {
        while let Some((time, records, emit_at)) = waiting.pop_before(table_watermark, &mut self.hold) {
            let cap = self.hold.at(emit_at);
            let mut session = results.session(&cap);
            for (record, diff) in records {
                if let Some(out) = self.join(versions, record, time) {
                    session.give((out, time, diff));
                }
            }
        }
        self.hold.settle(None);
    }

    /// Forgets the versions before the earliest time an event can still ask
    /// for, now that the stream's watermark is `stream_watermark`.
    fn compact<V: Data + PartialEq, D>(
        &mut self,
        AsOfState { versions, waiting }: &mut AsOfState<K, V, D>,
        stream_watermark: Timestamp,
    ) {
        let reachable = stream_watermark.saturating_sub(self.lateness.0);
        let next = waiting.first_time().map_or(reachable, |t| t.min(reachable));
        if stream_watermark == END_OF_TIME && waiting.first_time().is_none() {
            // The events are done: the table's versions serve nobody.
            self.horizon = END_OF_TIME;
            versions.clear();
            self.due.clear();
        } else if next > self.horizon {
            self.horizon = next.saturating_sub(1);
            while let Some((_, due)) = self.due.pop_due(self.horizon) {
                for k in due {
                    if versions.get_mut(&k).is_some_and(|v| v.compact(self.horizon)) {
                        versions.remove(&k);
                    }
                }
            }
        }
    }

    /// The waiting events' routes, in the order they wait: what a snapshot
    /// needs of the key function, which stays on the worker.
    fn routes<D>(&self, waiting: &Pending<(D, Diff)>) -> Vec<u64>
    where
        KF: Fn(&D) -> K,
    {
        waiting.iter().map(|(_, (record, _), _)| route(&(self.key)(record))).collect()
    }
}
