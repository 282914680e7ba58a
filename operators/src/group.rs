//! Updating aggregation: `GROUP BY key` over a changelog, without windows.

use std::collections::BTreeMap;
use std::rc::Rc;

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::partial::{self, Combining, Slot};
use crate::state::{AnyKeyedState, KeyedState, OperatorState, Schema, Snapshot, Stateful};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, Diff, Timestamp};

/// Per key: the accumulator, and whether it changed at the time being applied.
///
/// The result last emitted is not kept: it is recomputed from the accumulator
/// before the key's first change at a time, which halves the state of keys
/// with large results.
type Entry<Acc> = (Acc, bool);

/// A key's checkpoint entry: its accumulator (if it has a result), and its
/// input still waiting for the watermark as `(timely time, input, diff)`:
/// records, or in two phases `(key, partial result)`.
type KeyEntry<K, Acc, D> = (K, Option<Acc>, Vec<(Timestamp, D, Diff)>);

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
    const SCHEMA: Schema = Schema::new("aggregate_by_key", 1);
    type Entry = KeyEntry<K, Acc, D>;
    type Prepared = ();

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.table);
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
        self.table.for_each(|k, (acc, changed)| {
            debug_assert!(!changed, "a key is marked changed only while its time is applied");
            let held = waiting.remove(k).unwrap_or_default();
            out.push(route(k), &(k, Some(acc), held));
        });
        for (k, held) in waiting {
            out.push(route(k), &(k, None::<&Acc>, held));
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
        let agg = Rc::new(agg);
        if !agg.two_phase() {
            let apply = Rc::clone(&agg);
            return group(self, name, key, agg, move |acc: &mut A::Acc, d: D, r| apply.update(acc, &d, r));
        }
        let key = Rc::new(key);
        let partials = combine_by_key(self, name, Rc::clone(&key), Rc::clone(&agg));
        let apply = Rc::clone(&agg);
        let owner = move |p: &Phase<D, K, A::Acc>| match p {
            Phase::Raw(d) => key(d),
            Phase::Partial(k, _) => k.clone(),
        };
        group(&partials, name, owner, agg, move |acc: &mut A::Acc, p, r| match p {
            Phase::Raw(d) => apply.update(acc, &d, r),
            Phase::Partial(_, partial) => apply.merge(acc, *partial),
        })
    }
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
        // Recovery: each key's accumulator, and its input still waiting
        // for the watermark (which owes output at its time).
        managed.restore(|GroupState { table, pending }, _time, entries| {
            table.reserve(entries.len());
            entries.for_each(|(k, acc, waiting)| {
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
                    table.insert(k, (acc, false));
                }
            });
        });
        drop(initial_capabilities);
        // Keys changed at the time being applied, with their result before it.
        let mut dirty: Vec<(K, Option<A::Output>)> = Vec::new();
        move |frontiers| {
            if !managed.home() {
                return;
            }
            let GroupState { table, pending } = managed.get();
            let mut output = output.activate();
            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                let batch = pending.entry(arrived).or_insert_with(|| {
                    hold.insert(arrived, &cap);
                    Vec::new()
                });
                for updates in data {
                    batch.extend(updates.drain(..).map(|(d, _t, r)| (key(&d), d, r)));
                }
            });
            let watermark = watermark_of(&frontiers[0]);
            while let Some(entry) = pending.first_entry() {
                if *entry.key() >= watermark {
                    break;
                }
                let (time, updates) = entry.remove_entry();
                // One read of the batch's keys on a backend on disk.
                table.prefetch(updates.iter().map(|(k, _, _)| k));
                for (k, d, r) in updates {
                    let (acc, changed) = table.get_or_insert_with(k.clone(), || (agg.init(), false));
                    if !*changed {
                        *changed = true;
                        dirty.push((k, agg.output(acc)));
                    }
                    apply(acc, d, r);
                }
                let cap = hold.at(time);
                let mut session = output.session(&cap);
                for (k, old) in dirty.drain(..) {
                    let Some((acc, changed)) = table.get_mut(&k) else {
                        continue;
                    };
                    *changed = false;
                    let new = agg.output(acc);
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
