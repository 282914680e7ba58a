//! Joins with a table maintained by differential dataflow: the table–table
//! joins ([`Table::join`], [`Table::left_join`], [`Table::full_join`]) and the
//! stream–table join whose results follow the table
//! ([`EventStream::join_updating`]).

use super::Table;
use crate::collection::from_collection;
use crate::key::{Data, Key};
use crate::stream::EventStream;
use crate::time::Diff;

/// A row of a left outer join: the left row, and the right row if one matches.
pub type LeftJoined<K, V, J, W> = ((K, V), Option<(J, W)>);

/// A row of a full outer join: either side may be missing, not both.
pub type FullJoined<K, V, J, W> = (Option<(K, V)>, Option<(J, W)>);

impl<'scope, D: Data> EventStream<'scope, D> {
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
    ///     let table = EventStream::new(prices.to_stream(scope)).upsert().table;
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
    /// With tables whose values expire with retractions
    /// ([`WithTtl::upsert`](crate::state::WithTtl::upsert) with
    /// [`Expiry::Retract`](crate::state::Expiry::Retract)), a row lives
    /// while both of its values do and the arrangements forget expired
    /// values as they compact: the join's state is bounded by the TTL.
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
    ///     let orders = EventStream::new(orders.to_stream(scope)).upsert().table;
    ///     let customers = EventStream::new(customers.to_stream(scope)).upsert().table;
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
    ///     let orders = EventStream::new(vec![((1u32, Some(10u32)), 5u64, 1i64)].to_stream(scope)).upsert().table;
    ///     let customers = EventStream::new(vec![((10u32, Some('a')), 8u64, 1i64)].to_stream(scope)).upsert().table;
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
    ///     let orders = EventStream::new(vec![((1u32, Some(10u32)), 5u64, 1i64)].to_stream(scope)).upsert().table;
    ///     // Customer 11 has no order.
    ///     let customers = vec![((10u32, Some('a')), 1u64, 1i64), ((11, Some('b')), 1, 1)];
    ///     let customers = EventStream::new(customers.to_stream(scope)).upsert().table;
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
