//! Updating aggregation: `GROUP BY key` over a changelog, without windows.

use std::collections::BTreeMap;
use std::rc::Rc;

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::late::Counter;
use crate::partial::{self, Combining, Slot};
use crate::state::{
    AnyKeyedState, KeyedState, OperatorState, Schema, Snapshot, StateError, StateTtl, Stateful, Timers, WithTtl,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, Diff, Timestamp};

/// Per key: the accumulator, whether it changed at the time being applied,
/// and the last time it changed (a [state TTL](StateTtl) expires the key
/// from there; [`FRESH`] for a key created by the time being applied).
///
/// The result last emitted is not kept: it is recomputed from the accumulator
/// before the key's first change at a time, which halves the state of keys
/// with large results.
type Entry<Acc> = (Acc, bool, Timestamp);

/// The last-changed time of a key that had no result before the time being
/// applied; in a checkpoint entry migrated from schema version 1, a time
/// not known (the recovery takes the checkpoint's cut).
const FRESH: Timestamp = Timestamp::MAX;

/// A key's checkpoint entry: its accumulator (if it has a result), its
/// input still waiting for the watermark as `(timely time, input, diff)`:
/// records, or in two phases `(key, partial result)`, and the time its
/// result last changed.
type KeyEntry<K, Acc, D> = (K, Option<Acc>, Vec<(Timestamp, D, Diff)>, Timestamp);

/// A checkpoint entry of schema version 1: without the last-changed time.
type KeyEntryV1<K, Acc, D> = (K, Option<Acc>, Vec<(Timestamp, D, Diff)>);

/// The operator's state: the table of accumulators, and the input `D`
/// (records, or partial results) waiting for the watermark, by timely time.
struct GroupState<K, Acc, D> {
    table: KeyedState<K, Entry<Acc>>,
    pending: BTreeMap<Timestamp, Vec<(K, D, Diff)>>,
}

impl<K, Acc, D> Default for GroupState<K, Acc, D> {
    fn default() -> Self {
        GroupState { table: KeyedState::default(), pending: BTreeMap::new() }
    }
}

impl<K, Acc, D> OperatorState for GroupState<K, Acc, D>
where
    K: Key,
    Acc: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    D: Data,
{
    /// One schema for records and partial results as input: a snapshot is
    /// taken with nothing waiting (its input is gated at the cut), so the
    /// entries of both read the same.
    const SCHEMA: Schema = Schema::new("aggregate_by_key", 2);
    /// Version 1 had no last-changed time: a recovery takes the cut's.
    const MIGRATES_FROM: &'static [u32] = &[1];
    type Entry = KeyEntry<K, Acc, D>;
    type Prepared = ();

    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        debug_assert_eq!(version, 1);
        let (k, acc, waiting): KeyEntryV1<K, Acc, D> = crate::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: Schema::new("aggregate_by_key", 1), reason: e.to_string() })?;
        Ok((k, acc, waiting, FRESH))
    }

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.table);
    }

    /// The updates waiting for the watermark.
    fn held(&self) -> (usize, u64) {
        let n = self.pending.values().map(Vec::len).sum();
        let updates = self.pending.iter().flat_map(|(t, updates)| updates.iter().map(move |u| (t, u)));
        (n, crate::state::sampled_size(n, updates))
    }

    /// Splits for incremental checkpoints: an entry per key of the table
    /// (with the key's waiting input, if any), and the waiting input of keys
    /// not in it on their own, which restore merges.
    fn split_prepared() -> Option<Self::Prepared> {
        Some(())
    }

    /// The state as checkpoint entries, one per key, routed by the key as the
    /// operator's exchange routes it. Taken when the watermark is at the cut and
    /// every time below it is applied: `pending` holds only input at or after the
    /// cut (none, with gated input), and no key is marked changed.
    fn snapshot(&self, (): (), out: &mut Snapshot) {
        let mut waiting: StateMap<&K, Vec<(Timestamp, &D, Diff)>> = StateMap::default();
        for (time, updates) in &self.pending {
            for (k, d, r) in updates {
                waiting.entry(k).or_default().push((*time, d, *r));
            }
        }
        out.reserve(self.table.len() + waiting.len());
        self.table.for_each(|k, (acc, changed, updated)| {
            debug_assert!(!changed, "a key is marked changed only while its time is applied");
            let held = waiting.remove(k).unwrap_or_default();
            out.push(route(k), &(k, Some(acc), held, updated));
        });
        for (k, held) in waiting {
            out.push(route(k), &(k, None::<&Acc>, held, FRESH));
        }
    }
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// Maintains `aggregate` per key over the whole changelog, as a table.
    ///
    /// The output is the changelog of that table: when the watermark passes a
    /// time at which a key's records changed, the key's previous result is
    /// retracted and its new one inserted, both at that time (a key whose
    /// result disappears only retracts). Updates are applied in time order, so
    /// the output at every time is the aggregate of the input up to it. State is
    /// kept per key for as long as the key has a result.
    ///
    /// The operator is checkpointable: a checkpoint holds each key's
    /// accumulator (the result to retract next is recomputed from it), and a
    /// recovery on any number of workers resumes from them.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let sales = vec![(('x', 5i64), 1u64, 1i64), (('x', 7), 2, 1), (('y', 1), 3, 1), (('x', 5), 4, -1)];
    ///     EventStream::new(sales.to_stream(scope))
    ///         .aggregate_by_key(|(k, _): &(char, i64)| *k, Sum::of(|(_, v): &(char, i64)| *v))
    ///         .inner.capture()
    /// });
    /// // The table after all updates: consolidate the changelog.
    /// let mut table = std::collections::BTreeMap::new();
    /// for ((k, v), _t, r) in captured.extract().into_iter().flat_map(|(_, d)| d) {
    ///     *table.entry((k, v)).or_insert(0) += r;
    /// }
    /// table.retain(|_, r| *r != 0);
    /// assert_eq!(table.into_iter().collect::<Vec<_>>(), vec![(('x', 7), 1), (('y', 1), 1)]);
    /// ```
    pub fn aggregate_by_key<K, KF, A>(&self, key: KF, aggregate: A) -> EventStream<'scope, (K, A::Output)>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        self.aggregate_by_key_named("AggregateByKey", key, aggregate)
    }

    /// [`aggregate_by_key`](Self::aggregate_by_key) with an operator name.
    ///
    /// With an aggregate that merges ([`Aggregate::two_phase`]), each worker
    /// first combines the updates of a stamp (one arrival time) per key, and
    /// the key's owner merges these partial results at their arrival time, as
    /// it would apply the updates: the same changelog, with a hot key's work
    /// spread over the workers (`GROUP BY day` over every bid).
    pub fn aggregate_by_key_named<K, KF, A>(&self, name: &str, key: KF, agg: A) -> EventStream<'scope, (K, A::Output)>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        if let Some(ttl) = StateTtl::of(&self.scope()) {
            return self.state_ttl(ttl).aggregate_by_key_named(name, key, agg).results;
        }
        self.aggregate_by_key_with(name, key, agg, None, Counter::new())
    }

    /// [`aggregate_by_key_named`](Self::aggregate_by_key_named), its keys
    /// expiring with `ttl` (counted in `expired`).
    fn aggregate_by_key_with<K, KF, A>(
        &self,
        name: &str,
        key: KF,
        agg: A,
        ttl: Option<StateTtl>,
        expired: Counter,
    ) -> EventStream<'scope, (K, A::Output)>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        let ttl = crate::state::in_event_time(ttl, name);
        let agg = Rc::new(agg);
        let expiring = Expiring { ttl, expired };
        // With a TTL records are applied at their event times, one by one:
        // partial results per stamp would mix times.
        if !agg.two_phase() || ttl.is_some() {
            let apply = Rc::clone(&agg);
            return group(self, name, key, agg, expiring, move |acc: &mut A::Acc, d: D, r| apply.update(acc, &d, r));
        }
        let key = Rc::new(key);
        let partials = combine_by_key(self, name, Rc::clone(&key), Rc::clone(&agg));
        let apply = Rc::clone(&agg);
        let owner = move |p: &Phase<D, K, A::Acc>| match p {
            Phase::Raw(d) => key(d),
            Phase::Partial(k, _) => k.clone(),
        };
        group(&partials, name, owner, agg, expiring, move |acc: &mut A::Acc, p, r| match p {
            Phase::Raw(d) => apply.update(acc, &d, r),
            Phase::Partial(_, partial) => apply.merge(acc, *partial),
        })
    }
}

/// The result of [`WithTtl::aggregate_by_key`]: the changelog of the
/// aggregate per key, and how many keys expired.
#[derive(Debug)]
pub struct TtlAggregated<'scope, K: 'static, O: 'static> {
    /// The changelog of the aggregate per live key.
    pub results: EventStream<'scope, (K, O)>,
    /// Keys forgotten because their time-to-live passed.
    pub expired: Counter,
}

impl<'scope, D: Data> WithTtl<'scope, D> {
    /// [`EventStream::aggregate_by_key`] whose keys expire, in event time:
    /// records are applied in the order of their event times (each once the
    /// watermark passes it; a late one at its arrival), a key whose latest
    /// record is at event time `u` is forgotten once the watermark passes
    /// `u + ttl`, and a record after that starts it afresh (from the
    /// aggregate's initial accumulator). What expires, and so every result,
    /// is the same on any layout and after recovery. The changelog is at
    /// the records' event times. With
    /// [`Expiry::Retract`](crate::state::Expiry::Retract) the key's result is
    /// retracted at its expiry time (`u + ttl + 1`), so that the changelog
    /// holds only live keys, on any layout; with
    /// [`Expiry::Silent`](crate::state::Expiry::Silent) it is not, and the
    /// next result of the key does not retract it either (downstream keeps
    /// what it was told, as with Flink's state TTL on a `GROUP BY`).
    ///
    /// Distinct counts, top-k and every other [`Aggregate`] expire the same
    /// way: what expires is the key's whole accumulator.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{Expiry, StateTtl};
    /// use highwater_operators::Update;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    /// use timely::dataflow::operators::Input;
    ///
    /// let captured = timely::execute_directly(|worker| {
    ///     let (mut clicks, captured) = worker.dataflow(|scope| {
    ///         let (input, clicks) = scope.new_input::<Vec<Update<char>>>();
    ///         let ttl = StateTtl::event_time(10.secs()).expiry(Expiry::Retract);
    ///         let counts = EventStream::new(clicks).state_ttl(ttl).aggregate_by_key(|c: &char| *c, Count);
    ///         (input, counts.results.inner.capture())
    ///     });
    ///     // Clicks of 'x' at 0 s and 4 s, then at 20 s; of 'y' at 1 s, each
    ///     // at the watermark of its event time.
    ///     for (c, t) in [('x', 0u64), ('y', 1_000), ('x', 4_000), ('x', 20_000)] {
    ///         clicks.advance_to(t);
    ///         clicks.send((c, t, 1));
    ///     }
    ///     captured
    /// });
    /// let mut changes: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// changes.sort_by_key(|(kv, t, d)| (*t, *d, *kv));
    /// assert_eq!(changes, vec![
    ///     (('x', 1), 0, 1), (('y', 1), 1_000, 1), (('x', 1), 4_000, -1), (('x', 2), 4_000, 1),
    ///     // 'y' expires at 11.001 s, 'x' (last changed at 4 s) at 14.001 s.
    ///     (('y', 1), 11_001, -1), (('x', 2), 14_001, -1), (('x', 1), 20_000, 1),
    ///     // At the end of the input everything expires.
    ///     (('x', 1), 30_001, -1),
    /// ]);
    /// ```
    pub fn aggregate_by_key<K, KF, A>(&self, key: KF, aggregate: A) -> TtlAggregated<'scope, K, A::Output>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        self.aggregate_by_key_named("AggregateByKey", key, aggregate)
    }

    /// [`aggregate_by_key`](Self::aggregate_by_key) with an operator name.
    pub fn aggregate_by_key_named<K, KF, A>(&self, name: &str, key: KF, agg: A) -> TtlAggregated<'scope, K, A::Output>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        let expired = Counter::new();
        crate::totals::Totals::count_in(&self.stream.scope(), &format!("{name}.expired"), &expired);
        let results = self.stream.aggregate_by_key_with(name, key, agg, Some(self.ttl), expired.clone());
        TtlAggregated { results, expired }
    }
}

/// A grouping operator's time-to-live, if it has one, and its count of
/// expired keys.
struct Expiring {
    ttl: Option<StateTtl>,
    expired: Counter,
}

/// What the first phase of `aggregate_by_key` sends to a key's owner.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
enum Phase<D, K, Acc> {
    /// An update as it is: its key's only one in its stamp, or from a stamp
    /// that was not combined.
    Raw(D),
    /// The updates of one stamp and key, combined (sent with diff 1); boxed,
    /// so that an update sent as it is takes no more room than its record.
    Partial(K, Box<Acc>),
}

/// Per stamp (one arrival time, so one time the group operator applies
/// together), the updates combined per key, at the stamp's time; or, while
/// combining does not pay ([`Combining`]), the updates as they are.
fn combine_by_key<'scope, D, K, KF, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: Rc<KF>,
    agg: Rc<A>,
) -> EventStream<'scope, Phase<D, K, A::Acc>>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    A: Aggregate<D>,
{
    let inner = stream.inner.clone().unary(Pipeline, &format!("{name}Partials"), move |_cap, _info| {
        let mut groups: StateMap<K, Slot<D, A::Acc>> = StateMap::default();
        let mut combining = Combining::default();
        let mut out: Vec<Update<Phase<D, K, A::Acc>>> = Vec::new();
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                if !combining.now() {
                    for batch in data {
                        out.extend(batch.drain(..).map(|(d, t, r)| (Phase::Raw(d), t, r)));
                    }
                } else {
                    let mut records = 0;
                    for batch in data {
                        records += batch.len();
                        for (d, t, r) in batch.drain(..) {
                            partial::add(groups.entry(key(&d)), &*agg, d, t, r);
                        }
                    }
                    let time = arrival_time(&cap);
                    combining.flush(
                        records,
                        &mut groups,
                        &mut out,
                        |d, t, r| (Phase::Raw(d), t, r),
                        |k, acc| (Phase::Partial(k, Box::new(acc)), time, 1),
                    );
                }
                if !out.is_empty() {
                    output.session(&cap).give_container(&mut out);
                    out.clear();
                }
            });
        }
    });
    EventStream::new(inner)
}

/// The grouping operator over inputs `I` (records, or partial results):
/// `apply` folds one into a key's accumulator.
fn group<'scope, D, I, K, KI, A, F>(
    stream: &EventStream<'scope, I>,
    name: &str,
    key: KI,
    agg: Rc<A>,
    Expiring { ttl, expired }: Expiring,
    apply: F,
) -> EventStream<'scope, (K, A::Output)>
where
    I: Data,
    K: Key,
    KI: Fn(&I) -> K + 'static,
    A: Aggregate<D>,
    F: Fn(&mut A::Acc, I, Diff) + 'static,
{
    let key_route = Rc::new(key);
    let key = Rc::clone(&key_route);
    let stateful = Stateful::<GroupState<K, A::Acc, I>>::new(name, &stream.scope());
    let gated = stateful.keyed_input(stream, move |u: &Update<I>| route(&key_route(&u.0)));
    let mut builder = stateful.builder(&stream.scope());
    let mut input = builder.input(gated);
    let (mut output, results) = builder.output::<(K, A::Output)>();
    builder.build(move |initial_capabilities, mut managed| {
        let mut hold = Hold::default();
        // With a TTL: every key with a result has a timer at or before its
        // expiry (one, or a few after it was forgotten and set again; a
        // timer due before the expiry moves to it), and, retracting, a
        // promise of output at its expiry.
        let mut due: Timers<K> = Timers::default();
        // Recovery: each key's accumulator, and its input still waiting
        // for the watermark (which owes output at its time).
        managed.restore(|GroupState { table, pending }, cut, entries| {
            table.reserve(entries.len());
            entries.for_each(|(k, acc, waiting, updated)| {
                for (time, d, r) in waiting {
                    pending
                        .entry(time)
                        .or_insert_with(|| {
                            hold.restore(time, &initial_capabilities);
                            Vec::new()
                        })
                        .push((k.clone(), d, r));
                }
                if let Some(acc) = acc {
                    let updated = if updated == FRESH { cut } else { updated };
                    if let Some(ttl) = ttl {
                        let at = ttl.expires_at(updated);
                        due.schedule(at, k.clone());
                        if ttl.retracts() {
                            hold.restore(at, &initial_capabilities);
                        }
                    }
                    table.insert(k, (acc, false, updated));
                }
            });
        });
        drop(initial_capabilities);
        // Keys changed at the time being applied, with their result before it.
        let mut dirty: Vec<(K, Option<A::Output>)> = Vec::new();
        let mut retractions: Vec<Update<(K, A::Output)>> = Vec::new();
        move |frontiers| {
            if !managed.home() {
                return;
            }
            let GroupState { table, pending } = managed.get();
            let mut output = output.activate();
            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                if ttl.is_some() {
                    // In event time: a record waits for the watermark to pass
                    // its own time (a late one, its arrival's), so that every
                    // key sees its records in event-time order on any layout.
                    for updates in data {
                        for (d, t, r) in updates.drain(..) {
                            let time = t.max(arrived);
                            let batch = pending.entry(time).or_insert_with(|| {
                                hold.insert(time, &cap);
                                Vec::new()
                            });
                            batch.push((key(&d), d, r));
                        }
                    }
                    return;
                }
                let batch = pending.entry(arrived).or_insert_with(|| {
                    hold.insert(arrived, &cap);
                    Vec::new()
                });
                for updates in data {
                    batch.extend(updates.drain(..).map(|(d, _t, r)| (key(&d), d, r)));
                }
            });
            let watermark = watermark_of(&frontiers[0]);
            // The times below the watermark in order, the expiries at a time
            // before the records at it (a record at a key's expiry time
            // finds it gone).
            loop {
                let applying = pending.first_key_value().map(|(t, _)| *t).filter(|t| *t < watermark);
                let expiring = due.next().filter(|t| *t < watermark && applying.is_none_or(|a| *t <= a));
                if let (Some(time), Some(ttl)) = (expiring, ttl) {
                    let Some((_, mut keys)) = due.pop_due(time) else { break };
                    keys.sort();
                    keys.dedup();
                    table.prefetch(keys.iter());
                    let mut promised = 0;
                    for k in keys {
                        let Some((acc, _, updated)) = table.get(&k) else { continue };
                        let at = ttl.expires_at(*updated);
                        if at > time {
                            // Changed since the timer was set.
                            due.schedule(at, k);
                            continue;
                        }
                        if ttl.retracts() {
                            if let Some(old) = agg.output(acc) {
                                retractions.push(((k.clone(), old), time, -1));
                            }
                            promised += 1;
                        }
                        table.remove(&k);
                        expired.add(1);
                    }
                    if !retractions.is_empty() {
                        // Under the promise at `time`, held until now.
                        output.session(&hold.at(time)).give_container(&mut retractions);
                        retractions.clear();
                    }
                    // Each key that expired promised output at its expiry.
                    for _ in 0..promised {
                        hold.remove(time);
                    }
                    continue;
                }
                let Some(time) = applying else { break };
                let Some((time, updates)) = pending.remove_entry(&time) else { break };
                // One read of the batch's keys on a backend on disk.
                table.prefetch(updates.iter().map(|(k, _, _)| k));
                for (k, d, r) in updates {
                    let (acc, changed, _) = table.get_or_insert_with(k.clone(), || (agg.init(), false, FRESH));
                    if !*changed {
                        *changed = true;
                        dirty.push((k, agg.output(acc)));
                    }
                    apply(acc, d, r);
                }
                let cap = hold.at(time);
                let mut session = output.session(&cap);
                for (k, old) in dirty.drain(..) {
                    let Some((acc, changed, updated)) = table.get_mut(&k) else {
                        continue;
                    };
                    *changed = false;
                    let new = agg.output(acc);
                    let before = std::mem::replace(updated, time);
                    if let Some(ttl) = ttl {
                        if before == FRESH && new.is_some() {
                            due.schedule(ttl.expires_at(time), k.clone());
                        }
                        if ttl.retracts() {
                            if before != FRESH {
                                hold.remove(ttl.expires_at(before));
                            }
                            if new.is_some() {
                                hold.promise(ttl.expires_at(time));
                            }
                        }
                    }
                    if new.is_none() {
                        table.remove(&k);
                    }
                    if let Some(old) = old {
                        session.give(((k.clone(), old), time, -1));
                    }
                    if let Some(new) = new {
                        session.give(((k, new), time, 1));
                    }
                }
                hold.remove(time);
            }
            hold.settle(None);
            managed.checkpoint(watermark, ());
        }
    });
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    type State = GroupState<char, i64, (char, i64)>;

    /// A version 1 entry (no last-changed time) reads as one changed at
    /// the recovery's cut; a broken one is a decode error, not a panic.
    #[test]
    fn version_1_entries_migrate() {
        let v1: KeyEntryV1<char, i64, (char, i64)> = ('x', Some(7), vec![(30, ('x', 2), 1)]);
        let bytes = crate::checkpoint::encode(&v1).unwrap();
        let entry = State::migrate(1, &bytes).unwrap();
        assert_eq!(entry, ('x', Some(7), vec![(30, ('x', 2), 1)], FRESH));
        assert!(matches!(State::migrate(1, &bytes[..2]), Err(StateError::Decode { .. })));
    }
}
