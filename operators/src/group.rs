//! Updating aggregation: `GROUP BY key` over a changelog, without windows.

use std::collections::BTreeMap;
use std::rc::Rc;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;

use crate::aggregate::Aggregate;
use crate::hold::Hold;
use crate::key::{route, Data, Key, StateMap};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, Timestamp};

/// Per key: the accumulator, and whether it changed at the time being applied.
///
/// The result last emitted is not kept: it is recomputed from the accumulator
/// before the key's first change at a time, which halves the state of keys
/// with large results.
type Entry<Acc> = (Acc, bool);

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
    pub fn aggregate_by_key_named<K, KF, A>(&self, name: &str, key: KF, agg: A) -> EventStream<'scope, (K, A::Output)>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        let key = Rc::new(key);
        let key_route = Rc::clone(&key);
        let pact = Exchange::new(move |u: &Update<D>| route(&key_route(&u.0)));
        crate::checkpoint::unsupported(name);
        let inner = self.inner.clone().unary_frontier(pact, name, move |_cap, _info| {
            let mut table: StateMap<K, Entry<A::Acc>> = StateMap::default();
            // Input waiting for the watermark, by timely time.
            let mut pending: BTreeMap<Timestamp, Vec<(K, D, i64)>> = BTreeMap::new();
            let mut hold = Hold::default();
            // Keys changed at the time being applied, with their result before it.
            let mut dirty: Vec<(K, Option<A::Output>)> = Vec::new();
            move |(input, frontier), output| {
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
                let watermark = watermark_of(frontier);
                while let Some(entry) = pending.first_entry() {
                    if *entry.key() >= watermark {
                        break;
                    }
                    let (time, updates) = entry.remove_entry();
                    for (k, d, r) in updates {
                        let (acc, changed) = table.entry(k.clone()).or_insert_with(|| (agg.init(), false));
                        if !*changed {
                            *changed = true;
                            dirty.push((k, agg.output(acc)));
                        }
                        agg.update(acc, &d, r);
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
            }
        });
        EventStream::new(inner)
    }
}
