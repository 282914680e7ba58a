//! Aggregations: what a window or a group computes from its records.
//!
//! An [`Aggregate`] folds records *with their diffs* into an accumulator, so
//! that retractions (late corrections, updating inputs) are handled exactly:
//! `count`, `sum`, `avg` and `distinct count` are invertible; `min`, `max`,
//! `max_by` and `top_k` keep the multiset of values they may need again. The
//! `append_only` variants keep only what an insert-only input can need (the
//! current best values), which is what a source-fed window wants; feeding them a
//! retraction is a bug in the program and panics with a message saying so.
//!
//! Accumulators are plain serde data, so operator state can be snapshotted.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::marker::PhantomData;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::key::{Data, StateMap};
use crate::state::multiset::{bump, bump_ordered};
use crate::time::Diff;

/// An aggregation over records of type `D`.
///
/// `update` is called with every record and its diff; `merge` combines the
/// accumulators of two session windows that merge; `output` reads the result,
/// `None` meaning "no result" (an empty group emits nothing).
///
/// # Examples
/// ```
/// use highwater_operators::aggregate::{Aggregate, Count, Max};
/// let agg = (Count, Max::of(|x: &u64| *x));
/// let mut acc = agg.init();
/// for x in [3u64, 9, 4] { agg.update(&mut acc, &x, 1); }
/// agg.update(&mut acc, &9, -1);
/// assert_eq!(agg.output(&acc), Some((2, 4)));
/// ```
pub trait Aggregate<D>: 'static {
    /// The state kept per window and key.
    type Acc: Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static;
    /// The result.
    type Output: Data;
    /// The accumulator of an empty group.
    fn init(&self) -> Self::Acc;
    /// Applies one record with its diff.
    fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff);
    /// Adds the records of `other` to `acc`: afterwards `acc` gives the
    /// result of updating it with every record `other` holds. Session windows
    /// merge with it, and two-phase aggregation merges the partial results of
    /// the workers with it, so it must be exact.
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// The result for the records in `acc`, or `None` if there is none.
    fn output(&self, acc: &Self::Acc) -> Option<Self::Output>;
    /// Whether a windowed aggregation on several workers should combine
    /// records on each worker before the exchange and [`merge`](Self::merge)
    /// the partial results ([`Phases::Auto`](crate::window::Phases::Auto)):
    /// true unless a partial result is no smaller than its records
    /// ([`Collect`]).
    fn two_phase(&self) -> bool {
        true
    }
}

/// The number of records.
#[derive(Clone, Copy, Debug, Default)]
pub struct Count;

impl<D> Aggregate<D> for Count {
    type Acc = i64;
    type Output = u64;
    fn init(&self) -> i64 {
        0
    }
    #[inline]
    fn update(&self, acc: &mut i64, _record: &D, diff: Diff) {
        *acc += diff;
    }
    fn merge(&self, acc: &mut i64, other: i64) {
        *acc += other;
    }
    fn output(&self, acc: &i64) -> Option<u64> {
        u64::try_from(*acc).ok().filter(|c| *c > 0)
    }
}

/// An exact decimal number (96-bit mantissa, up to 28 fractional digits),
/// for sums and averages of prices and amounts: `rust_decimal`'s `Decimal`.
pub use rust_decimal::Decimal;

/// A number that [`Sum`] and [`Avg`] take: `i64`, `u64`, `f64` or [`Decimal`].
///
/// Integer and decimal sums are exact under retractions (a record inserted
/// and taken back leaves the sum as it was); `f64` sums are compensated
/// (Neumaier), so rounding errors stay small, but a retraction need not undo
/// an insertion to the last bit.
pub trait Number: Data + Copy {
    /// The running sum.
    type Acc: Clone + Default + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static;
    /// The average's type: `f64` for `i64` and `f64`, [`Decimal`] for decimals.
    type Mean: Data;
    /// Adds `value` `diff` times to `acc`.
    fn add(acc: &mut Self::Acc, value: Self, diff: Diff);
    /// Adds the sum `other` to `acc`.
    fn merge(acc: &mut Self::Acc, other: Self::Acc);
    /// The sum.
    fn total(acc: &Self::Acc) -> Self;
    /// The sum divided by `count` (which is positive).
    fn mean(acc: &Self::Acc, count: i64) -> Self::Mean;
}

/// [`Number`] for an integer type: an exact `i128` sum (signed, so that
/// retractions net out; wide enough for any number of values a job sees),
/// saturated to the type's range when read.
macro_rules! integer_number {
    ($t:ty) => {
        impl Number for $t {
            type Acc = i128;
            type Mean = f64;
            fn add(acc: &mut i128, value: $t, diff: Diff) {
                *acc = acc.wrapping_add(i128::from(value) * i128::from(diff));
            }
            fn merge(acc: &mut i128, other: i128) {
                *acc = acc.wrapping_add(other);
            }
            /// The sum, saturated to the type's range (for `u64`, 0 while
            /// retractions exceed it).
            fn total(acc: &i128) -> $t {
                (*acc).clamp(i128::from(<$t>::MIN), i128::from(<$t>::MAX)) as $t
            }
            fn mean(acc: &i128, count: i64) -> f64 {
                *acc as f64 / count as f64
            }
        }
    };
}

integer_number!(i64);
// `Count`'s output.
integer_number!(u64);

/// A compensated `f64` sum (Neumaier): the sum and its running error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct FloatSum {
    sum: f64,
    compensation: f64,
}

impl FloatSum {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        self.sum = t;
    }
}

impl Number for f64 {
    type Acc = FloatSum;
    type Mean = f64;
    fn add(acc: &mut FloatSum, value: f64, diff: Diff) {
        acc.add(value * diff as f64);
    }
    fn merge(acc: &mut FloatSum, other: FloatSum) {
        acc.add(other.sum);
        acc.add(other.compensation);
    }
    fn total(acc: &FloatSum) -> f64 {
        acc.sum + acc.compensation
    }
    fn mean(acc: &FloatSum, count: i64) -> f64 {
        Self::total(acc) / count as f64
    }
}

impl Number for Decimal {
    /// Exact, saturating at `Decimal`'s range (±7.9·10²⁸) rather than panicking.
    type Acc = Decimal;
    type Mean = Decimal;
    fn add(acc: &mut Decimal, value: Decimal, diff: Diff) {
        *acc = acc.saturating_add(value.saturating_mul(Decimal::from(diff)));
    }
    fn merge(acc: &mut Decimal, other: Decimal) {
        *acc = acc.saturating_add(other);
    }
    fn total(acc: &Decimal) -> Decimal {
        *acc
    }
    fn mean(acc: &Decimal, count: i64) -> Decimal {
        acc.checked_div(Decimal::from(count)).unwrap_or_default()
    }
}

/// The sum of a numeric field: `i64`, `u64`, `f64` or [`Decimal`] (see [`Number`]).
///
/// ```
/// use highwater_operators::aggregate::{Aggregate, Decimal, Sum};
///
/// let prices = [Decimal::new(1999, 2), Decimal::new(1, 2)]; // 19.99 and 0.01
/// let sum = Sum::of(|p: &Decimal| *p);
/// let mut acc = Aggregate::<Decimal>::init(&sum);
/// for p in &prices {
///     sum.update(&mut acc, p, 1);
/// }
/// assert_eq!(sum.output(&acc), Some(Decimal::new(2000, 2)));
/// sum.update(&mut acc, &prices[1], -1); // a retraction
/// assert_eq!(sum.output(&acc), Some(Decimal::new(1999, 2)));
/// let floats = Sum::of(|x: &f64| *x);
/// let mut acc = Aggregate::<f64>::init(&floats);
/// for x in [0.1, 0.2, 0.3] {
///     floats.update(&mut acc, &x, 1);
/// }
/// assert_eq!(floats.output(&acc), Some(0.6));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Sum<F, V = i64>(F, PhantomData<fn() -> V>);

impl<F, V> Sum<F, V> {
    /// Sums `field(record)` over the records.
    pub fn of<D>(field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        Sum(field, PhantomData)
    }
}

impl<D, V: Number, F: Fn(&D) -> V + 'static> Aggregate<D> for Sum<F, V> {
    /// (sum, number of records): the count tells an empty group from a zero sum.
    type Acc = (V::Acc, i64);
    type Output = V;
    fn init(&self) -> (V::Acc, i64) {
        (V::Acc::default(), 0)
    }
    #[inline]
    fn update(&self, acc: &mut (V::Acc, i64), record: &D, diff: Diff) {
        V::add(&mut acc.0, (self.0)(record), diff);
        acc.1 += diff;
    }
    fn merge(&self, acc: &mut (V::Acc, i64), other: (V::Acc, i64)) {
        V::merge(&mut acc.0, other.0);
        acc.1 += other.1;
    }
    fn output(&self, acc: &(V::Acc, i64)) -> Option<V> {
        (acc.1 > 0).then(|| V::total(&acc.0))
    }
}

/// The average of a numeric field, `SUM / COUNT`: in double precision for
/// `i64` and `f64` fields, exact for [`Decimal`] ones (see [`Number`]). It
/// keeps the accumulator of [`Sum`] (the sum and the number of records).
#[derive(Clone, Copy, Debug)]
pub struct Avg<F, V = i64>(Sum<F, V>);

impl<F, V> Avg<F, V> {
    /// Averages `field(record)` over the records.
    pub fn of<D>(field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        Avg(Sum::of(field))
    }
}

impl<D, V: Number, F: Fn(&D) -> V + 'static> Aggregate<D> for Avg<F, V> {
    type Acc = (V::Acc, i64);
    type Output = V::Mean;
    fn init(&self) -> (V::Acc, i64) {
        self.0.init()
    }
    #[inline]
    fn update(&self, acc: &mut (V::Acc, i64), record: &D, diff: Diff) {
        self.0.update(acc, record, diff);
    }
    fn merge(&self, acc: &mut (V::Acc, i64), other: (V::Acc, i64)) {
        Aggregate::<D>::merge(&self.0, acc, other);
    }
    fn output(&self, acc: &(V::Acc, i64)) -> Option<V::Mean> {
        (acc.1 > 0).then(|| V::mean(&acc.0, acc.1))
    }
}

fn merge_multisets<V: Ord>(acc: &mut BTreeMap<V, Diff>, other: BTreeMap<V, Diff>) {
    for (v, d) in other {
        bump_ordered(acc, v, d);
    }
}

/// Panics with the invariant an append-only aggregate relies on.
#[cold]
fn append_only_violated(what: &str) -> ! {
    panic!(
        "{what}::append_only received a retraction: its input must be insert-only (use {what}::of for updating inputs)"
    )
}

/// The state of [`Min`] and [`Max`]: the multiset of values when exact under
/// retractions, only the best value when append-only.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Extreme<V: Ord> {
    /// Every value with its multiplicity.
    Multiset(BTreeMap<V, Diff>),
    /// The best value so far (insert-only input).
    Best(Option<V>),
}

macro_rules! extremum {
    ($name:ident, $doc:literal, $is_max:expr) => {
        #[doc = $doc]
        ///
        /// `of` keeps the multiset of values (exact under retractions);
        /// `append_only` keeps only the current extremum.
        #[derive(Clone, Copy, Debug)]
        pub struct $name<F, V> {
            field: F,
            append_only: bool,
            _value: PhantomData<fn() -> V>,
        }

        impl<F, V> $name<F, V> {
            /// Over `field(record)`, exact under retractions.
            pub fn of<D>(field: F) -> Self
            where
                F: Fn(&D) -> V,
            {
                $name { field, append_only: false, _value: PhantomData }
            }
            /// Over `field(record)`, for insert-only inputs: constant state.
            pub fn append_only<D>(field: F) -> Self
            where
                F: Fn(&D) -> V,
            {
                $name { field, append_only: true, _value: PhantomData }
            }

            /// Whether `a` beats `b`.
            #[inline]
            fn better(a: &V, b: &V) -> bool
            where
                V: Ord,
            {
                if $is_max {
                    a > b
                } else {
                    a < b
                }
            }
        }

        impl<D, V, F> Aggregate<D> for $name<F, V>
        where
            V: Data + Ord,
            F: Fn(&D) -> V + 'static,
        {
            type Acc = Extreme<V>;
            type Output = V;
            fn init(&self) -> Self::Acc {
                if self.append_only {
                    Extreme::Best(None)
                } else {
                    Extreme::Multiset(BTreeMap::new())
                }
            }
            #[inline]
            fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
                let value = (self.field)(record);
                match acc {
                    Extreme::Best(best) => {
                        if diff < 0 {
                            append_only_violated(stringify!($name));
                        }
                        if best.as_ref().is_none_or(|b| Self::better(&value, b)) {
                            *best = Some(value);
                        }
                    }
                    Extreme::Multiset(values) => bump_ordered(values, value, diff),
                }
            }
            fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
                match (acc, other) {
                    (Extreme::Best(best), Extreme::Best(Some(v))) => {
                        if best.as_ref().is_none_or(|b| Self::better(&v, b)) {
                            *best = Some(v);
                        }
                    }
                    (Extreme::Multiset(values), Extreme::Multiset(more)) => merge_multisets(values, more),
                    (_, Extreme::Best(None)) => {}
                    (_, Extreme::Multiset(_)) | (Extreme::Multiset(_), _) => {
                        unreachable!("accumulators of one aggregate have one shape")
                    }
                }
            }
            fn output(&self, acc: &Self::Acc) -> Option<V> {
                match acc {
                    Extreme::Best(best) => best.clone(),
                    Extreme::Multiset(values) if $is_max => {
                        values.iter().rev().find(|(_, d)| **d > 0).map(|(v, _)| v.clone())
                    }
                    Extreme::Multiset(values) => values.iter().find(|(_, d)| **d > 0).map(|(v, _)| v.clone()),
                }
            }
        }
    };
}

extremum!(Max, "The maximum of a field.", true);
extremum!(Min, "The minimum of a field.", false);

/// All records whose `field` is the maximum (every tie), in arrival order.
///
/// With a field that breaks every tie (e.g. `(price, Reverse(time), ...)`)
/// this is "the best record". `of` keeps every record (exact under
/// retractions); `append_only` keeps only the current best records.
#[derive(Clone, Copy, Debug)]
pub struct MaxBy<F, V> {
    field: F,
    append_only: bool,
    _value: PhantomData<fn() -> V>,
}

impl<F, V> MaxBy<F, V> {
    /// Records with the greatest `field(record)`, exact under retractions.
    pub fn of<D>(field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        MaxBy { field, append_only: false, _value: PhantomData }
    }
    /// Records with the greatest `field(record)`, for insert-only inputs.
    pub fn append_only<D>(field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        MaxBy { field, append_only: true, _value: PhantomData }
    }
}

/// The state of [`MaxBy`]: records by value with multiplicities when exact,
/// only the best value's records when append-only.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ArgMax<V: Ord, D> {
    /// Every record, grouped by value, with its multiplicity.
    Multiset(BTreeMap<V, Vec<(D, Diff)>>),
    /// The best value and its records (insert-only input).
    Best(Option<(V, Vec<D>)>),
}

impl<D, V, F> Aggregate<D> for MaxBy<F, V>
where
    D: Data + PartialEq,
    V: Data + Ord,
    F: Fn(&D) -> V + 'static,
{
    type Acc = ArgMax<V, D>;
    type Output = Vec<D>;
    fn init(&self) -> Self::Acc {
        if self.append_only {
            ArgMax::Best(None)
        } else {
            ArgMax::Multiset(BTreeMap::new())
        }
    }
    #[inline]
    fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
        let value = (self.field)(record);
        match acc {
            ArgMax::Best(best) => {
                if diff < 0 {
                    append_only_violated("MaxBy");
                }
                match best {
                    Some((v, records)) if value == *v => records.push(record.clone()),
                    Some((v, _)) if value < *v => {}
                    _ => *best = Some((value, vec![record.clone()])),
                }
            }
            ArgMax::Multiset(groups) => {
                let group = groups.entry(value.clone()).or_default();
                bump(group, record, diff);
                if group.is_empty() {
                    groups.remove(&value);
                }
            }
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        match other {
            ArgMax::Multiset(groups) => {
                for (_, group) in groups {
                    for (d, r) in group {
                        self.update(acc, &d, r);
                    }
                }
            }
            ArgMax::Best(Some((_, records))) => {
                for d in records {
                    self.update(acc, &d, 1);
                }
            }
            ArgMax::Best(None) => {}
        }
    }
    fn output(&self, acc: &Self::Acc) -> Option<Vec<D>> {
        match acc {
            ArgMax::Best(best) => best.as_ref().map(|(_, records)| records.clone()),
            // The best value with a record present (a retraction may precede its insertion).
            ArgMax::Multiset(groups) => groups.values().rev().find_map(|group| {
                let out: Vec<D> =
                    group.iter().flat_map(|(d, r)| std::iter::repeat_n(d.clone(), (*r).max(0) as usize)).collect();
                (!out.is_empty()).then_some(out)
            }),
        }
    }
}

/// The number of distinct values of a field.
#[derive(Clone, Copy, Debug)]
pub struct DistinctCount<F, V> {
    field: F,
    _value: PhantomData<fn() -> V>,
}

impl<F, V> DistinctCount<F, V> {
    /// Counts distinct `field(record)`; records where it is `None` are skipped.
    ///
    /// ```
    /// use highwater_operators::aggregate::{Aggregate, DistinctCount};
    /// let agg = DistinctCount::of(|x: &u32| (*x < 10).then_some(*x));
    /// let mut acc = agg.init();
    /// for x in [1u32, 1, 2, 30] { agg.update(&mut acc, &x, 1); }
    /// assert_eq!(agg.output(&acc), Some(2));
    /// ```
    pub fn of<D>(field: F) -> Self
    where
        F: Fn(&D) -> Option<V>,
    {
        DistinctCount { field, _value: PhantomData }
    }
}

impl<F, V: Hash + Eq> DistinctCount<F, V> {
    /// Adds `diff` to the multiplicity of `value`, counting the values
    /// that become present or absent.
    #[inline]
    fn bump(acc: &mut (StateMap<V, Diff>, u64, i64), value: V, diff: Diff) {
        let before = match acc.0.entry(value) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let before = *e.get();
                *e.get_mut() += diff;
                if *e.get() == 0 {
                    e.remove();
                }
                before
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if diff != 0 {
                    e.insert(diff);
                }
                0
            }
        };
        let after = before + diff;
        match (before > 0, after > 0) {
            (false, true) => acc.1 += 1,
            (true, false) => acc.1 -= 1,
            _ => {}
        }
    }
}

impl<D, V, F> Aggregate<D> for DistinctCount<F, V>
where
    V: Data + Hash + Eq,
    F: Fn(&D) -> Option<V> + 'static,
{
    /// Multiplicity of each value, the number of values with a positive one
    /// (so that the output costs nothing), and the number of records seen (so
    /// that an all-skipped group still reports 0 rather than nothing).
    type Acc = (StateMap<V, Diff>, u64, i64);
    type Output = u64;
    fn init(&self) -> Self::Acc {
        (StateMap::default(), 0, 0)
    }
    #[inline]
    fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
        acc.2 += diff;
        if let Some(value) = (self.field)(record) {
            Self::bump(acc, value, diff);
        }
    }
    /// In the time of `other`'s values, not of `acc`'s: partial results
    /// merge into a large accumulator one stamp after another.
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.2 += other.2;
        for (v, d) in other.0 {
            Self::bump(acc, v, d);
        }
    }
    fn output(&self, acc: &Self::Acc) -> Option<u64> {
        (acc.2 > 0).then_some(acc.1)
    }
}

/// The `k` greatest values of a field, greatest first, with repetitions.
#[derive(Clone, Copy, Debug)]
pub struct TopK<F, V> {
    k: usize,
    field: F,
    append_only: bool,
    _value: PhantomData<fn() -> V>,
}

impl<F, V> TopK<F, V> {
    /// The `k` greatest `field(record)`, exact under retractions.
    pub fn of<D>(k: usize, field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        TopK { k, field, append_only: false, _value: PhantomData }
    }
    /// The `k` greatest `field(record)` of an insert-only input: keeps `k` values.
    pub fn append_only<D>(k: usize, field: F) -> Self
    where
        F: Fn(&D) -> V,
    {
        TopK { k, field, append_only: true, _value: PhantomData }
    }

    fn trim(&self, acc: &mut BTreeMap<V, Diff>)
    where
        V: Ord,
    {
        if !self.append_only {
            return;
        }
        let mut total: i64 = acc.values().sum();
        while total > self.k as i64 {
            let mut first = acc.first_entry().expect("a non-empty multiset has a first entry");
            let excess = (total - self.k as i64).min(*first.get());
            *first.get_mut() -= excess;
            total -= excess;
            if *first.get() == 0 {
                first.remove();
            }
        }
    }
}

impl<D, V, F> Aggregate<D> for TopK<F, V>
where
    V: Data + Ord,
    F: Fn(&D) -> V + 'static,
{
    /// Multiset of values (at most `k` of them when append-only).
    type Acc = BTreeMap<V, Diff>;
    type Output = Vec<V>;
    fn init(&self) -> Self::Acc {
        BTreeMap::new()
    }
    #[inline]
    fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
        if self.append_only && diff < 0 {
            append_only_violated("TopK");
        }
        let value = (self.field)(record);
        if self.append_only && acc.len() >= self.k {
            if let Some((least, _)) = acc.first_key_value() {
                if value < *least {
                    return;
                }
            }
        }
        bump_ordered(acc, value, diff);
        self.trim(acc);
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        merge_multisets(acc, other);
        self.trim(acc);
    }
    fn output(&self, acc: &Self::Acc) -> Option<Vec<V>> {
        let mut out = Vec::with_capacity(self.k);
        for (v, d) in acc.iter().rev() {
            for _ in 0..(*d).max(0) {
                if out.len() == self.k {
                    return Some(out);
                }
                out.push(v.clone());
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// Every record of the group, each as often as its multiplicity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Collect;

impl<D: Data + PartialEq> Aggregate<D> for Collect {
    /// Records with their multiplicities, in arrival order.
    type Acc = Vec<(D, Diff)>;
    type Output = Vec<D>;
    fn init(&self) -> Self::Acc {
        Vec::new()
    }
    fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
        bump(acc, record, diff);
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        for (d, r) in other {
            self.update(acc, &d, r);
        }
    }
    fn output(&self, acc: &Self::Acc) -> Option<Vec<D>> {
        let out: Vec<D> = acc.iter().flat_map(|(d, r)| std::iter::repeat_n(d.clone(), (*r).max(0) as usize)).collect();
        (!out.is_empty()).then_some(out)
    }
    /// No: its partial result holds every record.
    fn two_phase(&self) -> bool {
        false
    }
}

/// A user-defined aggregation: an initial state, a step that applies a record
/// with its diff (a retraction has `diff < 0`), and a merge of two states
/// (for sessions that merge, and for two-phase aggregation on several
/// workers: see [`Aggregate::merge`]).
///
/// ```
/// use highwater_operators::aggregate::{Aggregate, Fold};
/// // The longest word, keeping it simple: insert-only.
/// let longest = Fold::new(
///     String::new(),
///     |acc: &mut String, w: &&str, _diff| if w.len() > acc.len() { *acc = w.to_string() },
///     |acc: &mut String, other: String| if other.len() > acc.len() { *acc = other },
/// );
/// let mut acc = longest.init();
/// for w in ["a", "abc", "ab"] { longest.update(&mut acc, &w, 1); }
/// assert_eq!(longest.output(&acc).as_deref(), Some("abc"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Fold<A, S, M> {
    init: A,
    step: S,
    merge: M,
}

impl<A, S, M> Fold<A, S, M> {
    /// A fold from `init` with `step(acc, record, diff)` and `merge(acc, other)`.
    pub fn new<D>(init: A, step: S, merge: M) -> Self
    where
        S: Fn(&mut A, &D, Diff),
        M: Fn(&mut A, A),
    {
        Fold { init, step, merge }
    }
}

impl<D, A, S, M> Aggregate<D> for Fold<A, S, M>
where
    A: Data,
    S: Fn(&mut A, &D, Diff) + 'static,
    M: Fn(&mut A, A) + 'static,
{
    /// The folded state and the net number of records.
    type Acc = (A, i64);
    type Output = A;
    fn init(&self) -> (A, i64) {
        (self.init.clone(), 0)
    }
    fn update(&self, acc: &mut (A, i64), record: &D, diff: Diff) {
        (self.step)(&mut acc.0, record, diff);
        acc.1 += diff;
    }
    fn merge(&self, acc: &mut (A, i64), other: (A, i64)) {
        (self.merge)(&mut acc.0, other.0);
        acc.1 += other.1;
    }
    fn output(&self, acc: &(A, i64)) -> Option<A> {
        (acc.1 > 0).then(|| acc.0.clone())
    }
}

macro_rules! tuple_aggregate {
    ($($name:ident $idx:tt),+) => {
        /// Several aggregations of the same records at once; a result exists
        /// when every part has one.
        impl<D, $($name: Aggregate<D>),+> Aggregate<D> for ($($name,)+) {
            type Acc = ($($name::Acc,)+);
            type Output = ($($name::Output,)+);
            fn init(&self) -> Self::Acc {
                ($(self.$idx.init(),)+)
            }
            #[inline]
            fn update(&self, acc: &mut Self::Acc, record: &D, diff: Diff) {
                $(self.$idx.update(&mut acc.$idx, record, diff);)+
            }
            fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
                $(self.$idx.merge(&mut acc.$idx, other.$idx);)+
            }
            fn output(&self, acc: &Self::Acc) -> Option<Self::Output> {
                Some(($(self.$idx.output(&acc.$idx)?,)+))
            }
            fn two_phase(&self) -> bool {
                $(self.$idx.two_phase())&&+
            }
        }
    };
}

tuple_aggregate!(A 0, B 1);
tuple_aggregate!(A 0, B 1, C 2);
tuple_aggregate!(A 0, B 1, C 2, E 3);
tuple_aggregate!(A 0, B 1, C 2, E 3, G 4);

#[cfg(test)]
mod tests {
    use super::*;

    fn run<A: Aggregate<u64>>(agg: &A, updates: &[(u64, Diff)]) -> Option<A::Output> {
        let mut acc = agg.init();
        for (v, d) in updates {
            agg.update(&mut acc, v, *d);
        }
        agg.output(&acc)
    }

    #[test]
    fn max_and_min_are_exact_under_retraction() {
        let ups = [(5, 1), (9, 1), (7, 1), (9, -1)];
        assert_eq!(run(&Max::of(|x: &u64| *x), &ups), Some(7));
        assert_eq!(run(&Min::of(|x: &u64| *x), &ups), Some(5));
        assert_eq!(run(&Max::of(|x: &u64| *x), &[(1, 1), (1, -1)]), None);
    }

    #[test]
    fn append_only_extrema_keep_one_value() {
        let agg = Max::append_only(|x: &u64| *x);
        let mut acc = agg.init();
        for x in [3, 8, 2, 8] {
            agg.update(&mut acc, &x, 1);
        }
        assert!(matches!(acc, Extreme::Best(Some(8))));
        assert_eq!(agg.output(&acc), Some(8));
    }

    #[test]
    #[should_panic(expected = "must be insert-only")]
    fn append_only_rejects_retractions() {
        run(&Max::append_only(|x: &u64| *x), &[(3, 1), (3, -1)]);
    }

    #[test]
    fn max_by_reports_all_ties() {
        let agg = MaxBy::of(|x: &u64| *x / 10);
        assert_eq!(run(&agg, &[(11, 1), (25, 1), (21, 1), (3, 1)]), Some(vec![25, 21]));
        let agg = MaxBy::append_only(|x: &u64| *x / 10);
        assert_eq!(run(&agg, &[(11, 1), (25, 1), (21, 1), (3, 1)]), Some(vec![25, 21]));
    }

    #[test]
    fn max_by_skips_values_only_retracted() {
        // The retraction of 9 comes before its insertion: 5 is the maximum present.
        let agg = MaxBy::of(|x: &u64| *x);
        assert_eq!(run(&agg, &[(5, 1), (9, -1)]), Some(vec![5]));
        assert_eq!(run(&agg, &[(5, 1), (9, -1), (9, 1)]), Some(vec![5]));
    }

    #[test]
    fn top_k_keeps_repetitions() {
        let ups = [(1, 1), (5, 2), (3, 1), (4, 1)];
        assert_eq!(run(&TopK::of(3, |x: &u64| *x), &ups), Some(vec![5, 5, 4]));
        assert_eq!(run(&TopK::append_only(3, |x: &u64| *x), &ups), Some(vec![5, 5, 4]));
    }

    #[test]
    fn sums_of_u64_are_exact_and_net_out() {
        assert_eq!(
            run(&Sum::of(|x: &u64| *x), &[(u64::MAX, 1), (u64::MAX, 1), (u64::MAX, -1), (7, 1)]),
            Some(u64::MAX)
        );
        assert_eq!(run(&Sum::of(|x: &u64| *x), &[(3, 2), (3, -1), (4, 1)]), Some(7));
        assert_eq!(run(&Avg::of(|x: &u64| *x), &[(1, 1), (2, 1)]), Some(1.5));
    }

    #[test]
    fn avg_is_sum_over_count() {
        assert_eq!(run(&Avg::of(|x: &u64| *x as i64), &[(1, 1), (2, 1), (4, 1)]), Some(7.0 / 3.0));
    }

    /// Partial results merged against one accumulator over every update.
    mod two_phase {
        use super::super::*;
        use proptest::prelude::*;

        /// Updates `(value, diff, partial)`: insertions, then retractions of
        /// some of them (when `retract`), shuffled, each to one of three
        /// partial results (a partial may see a retraction without its insertion).
        fn changelog(retract: bool) -> impl Strategy<Value = Vec<(u64, Diff, usize)>> {
            prop::collection::vec((0u64..12, any::<bool>(), 0usize..3, 0usize..3), 0..40)
                .prop_map(move |raw| {
                    let mut out: Vec<(u64, Diff, usize)> = raw.iter().map(|(v, _, p, _)| (*v, 1, *p)).collect();
                    if retract {
                        out.extend(raw.iter().filter(|(_, r, _, _)| *r).map(|(v, _, _, q)| (*v, -1, *q)));
                    }
                    out
                })
                .prop_shuffle()
        }

        fn check<A: Aggregate<u64>>(
            agg: &A,
            updates: &[(u64, Diff, usize)],
            norm: impl Fn(A::Output) -> String,
        ) -> Result<(), TestCaseError> {
            let mut one = agg.init();
            let mut parts = vec![agg.init(), agg.init(), agg.init()];
            for (v, d, p) in updates {
                agg.update(&mut one, v, *d);
                agg.update(&mut parts[*p], v, *d);
            }
            let mut merged = parts.remove(0);
            for part in parts {
                agg.merge(&mut merged, part);
            }
            prop_assert_eq!(agg.output(&merged).map(&norm), agg.output(&one).map(&norm));
            Ok(())
        }

        fn show<T: std::fmt::Debug>(v: T) -> String {
            format!("{v:?}")
        }

        fn sorted<T: std::fmt::Debug + Ord>(mut v: Vec<T>) -> String {
            v.sort();
            format!("{v:?}")
        }

        proptest! {
            #[test]
            fn exact_aggregates_merge_under_retractions(updates in changelog(true)) {
                let x = |v: &u64| *v as i64;
                check(&Count, &updates, show)?;
                check(&Sum::of(x), &updates, show)?;
                // Equal as numbers; the scale of a decimal sum depends on the order of additions.
                check(&Sum::of(|v: &u64| Decimal::new(*v as i64, 1)), &updates, |d| d.normalize().to_string())?;
                check(&Sum::of(|v: &u64| *v as f64), &updates, show)?;
                check(&Avg::of(x), &updates, show)?;
                check(&Min::of(x), &updates, show)?;
                check(&Max::of(x), &updates, show)?;
                check(&MaxBy::of(|v: &u64| *v / 3), &updates, sorted)?;
                check(&DistinctCount::of(|v: &u64| (*v % 5 != 0).then_some(*v)), &updates, show)?;
                check(&TopK::of(3, x), &updates, show)?;
                check(&Collect, &updates, sorted)?;
                check(&Fold::new(0i64, |a: &mut i64, v: &u64, d| *a += (*v as i64) * d, |a: &mut i64, o| *a += o), &updates, show)?;
                check(&(Count, Max::of(x), Avg::of(x)), &updates, show)?;
            }

            #[test]
            fn append_only_aggregates_merge(updates in changelog(false)) {
                let x = |v: &u64| *v as i64;
                check(&Min::append_only(x), &updates, show)?;
                check(&Max::append_only(x), &updates, show)?;
                check(&MaxBy::append_only(|v: &u64| *v / 3), &updates, sorted)?;
                check(&TopK::append_only(3, x), &updates, show)?;
            }
        }
    }

    #[test]
    fn merge_equals_union() {
        let agg = (Count, Sum::of(|x: &u64| *x as i64), DistinctCount::of(|x: &u64| Some(*x)));
        let mut a = agg.init();
        let mut b = agg.init();
        agg.update(&mut a, &1, 1);
        agg.update(&mut b, &1, 1);
        agg.update(&mut b, &2, 1);
        agg.merge(&mut a, b);
        assert_eq!(agg.output(&a), Some((3, 4, 2)));
    }
}
