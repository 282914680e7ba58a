//! Joins of two event streams on a key: unwindowed, and by event-time interval.

use std::collections::VecDeque;
use std::rc::Rc;
use std::slice::IterMut;

use timely::dataflow::operators::{Capability, InputCapability};

use crate::aggregate::Collect;
use crate::hold::Hold;
use crate::key::{route, Data, Key};
use crate::late::{Counter, LateOutput};
use crate::state::{
    ActiveOutput, AnyKeyedState, Appendable, KeyedState, OperatorState, RestoredEntries, Schema, Snapshot, StateError,
    StateTtl, StateValue, Stateful, Timers,
};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Diff, Timestamp, END_OF_TIME};
use crate::window::{WindowResult, WindowSpec};

/// Which right-side event times a left record joins with.
///
/// `bounds(left, left_time)` gives the inclusive range `[lo, hi]` of right
/// event times; `lead` bounds how far `lo` may lie before the left record's own
/// time (`left_time - lo <= lead`), which is what lets the operator forget a
/// right record once the left watermark has passed it by `lead`.
pub struct Interval<F> {
    bounds: F,
    lead: u64,
}

impl<F> std::fmt::Debug for Interval<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interval").field("lead", &self.lead).finish_non_exhaustive()
    }
}

/// `right.time ∈ [left.time + lower, left.time + upper]`, e.g. a click within
/// ten minutes after its impression is `between(0, 10 min)`.
///
/// # Panics
/// If `lower > upper`.
pub fn between<L>(lower: i64, upper: i64) -> Interval<impl Fn(&L, Timestamp) -> (Timestamp, Timestamp)> {
    assert!(lower <= upper, "an interval join needs lower <= upper");
    let shift = move |t: Timestamp, by: i64| {
        if by >= 0 {
            t.saturating_add(by as u64)
        } else {
            t.saturating_sub(by.unsigned_abs())
        }
    };
    Interval { bounds: move |_: &L, t| (shift(t, lower), shift(t, upper)), lead: lower.min(0).unsigned_abs() }
}

/// Right times in a range computed from the left record, starting no earlier
/// than `lead` ms before the left record's time: e.g. the bids of an auction,
/// from its opening to its expiry, are `by_record(0, |a, t| (t, a.expires))`.
pub fn by_record<L, F: Fn(&L, Timestamp) -> (Timestamp, Timestamp)>(lead: u64, bounds: F) -> Interval<F> {
    Interval { bounds, lead }
}

/// The outputs of an interval join.
#[derive(Debug)]
pub struct IntervalJoined<'scope, O: 'static, L: 'static, R: 'static> {
    /// Matching pairs, at the later of the two event times.
    pub results: EventStream<'scope, O>,
    /// Left records that came later than the allowed lateness.
    pub late_left: LateOutput<'scope, L>,
    /// Right records that came later than the allowed lateness.
    pub late_right: LateOutput<'scope, R>,
}

/// The outputs of an unwindowed join whose records expire
/// ([`WithTtl::join`](crate::state::WithTtl::join)).
#[derive(Debug)]
pub struct TtlJoined<'scope, O: 'static, L: 'static, R: 'static> {
    /// Matching pairs, at the later of the two event times; retracted when
    /// the earlier record expires if expiry retracts.
    pub results: EventStream<'scope, O>,
    /// Left records that came behind the watermark (their partners may have
    /// expired already): they join nothing.
    pub late_left: LateOutput<'scope, L>,
    /// Right records that came behind the watermark.
    pub late_right: LateOutput<'scope, R>,
    /// The number of records (of both sides) that expired.
    pub expired: Counter,
}

/// A left record held by the join.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Left<L> {
    record: L,
    time: Timestamp,
    lo: Timestamp,
    hi: Timestamp,
    diff: Diff,
}

/// A checkpoint entry of a two-sided join: a key and what one side holds for it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Sided<K, A, B> {
    Left(K, A),
    Right(K, B),
}

/// An interval join's state: what each side holds, by key.
struct IntervalState<K, L, R> {
    lefts: KeyedState<K, Held<Left<L>>>,
    rights: KeyedState<K, Held<(R, Timestamp, Diff)>>,
}

impl<K, L: StateValue, R: StateValue> Default for IntervalState<K, L, R> {
    fn default() -> Self {
        IntervalState { lefts: KeyedState::appending(), rights: KeyedState::appending() }
    }
}

impl<K: Key, L: Data, R: Data> OperatorState for IntervalState<K, L, R> {
    /// Version 2: the entries are version 1's, but the held lists are list
    /// states (on RocksDB, frames that appends add to), so database files
    /// of version 1 do not read as version 2's; entries migrate as they are.
    const SCHEMA: Schema = Schema::new("join.interval", 2);
    const MIGRATES_FROM: &'static [u32] = &[1];
    type Entry = Sided<K, Held<Left<L>>, Held<(R, Timestamp, Diff)>>;
    type Prepared = ();

    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        debug_assert_eq!(version, 1);
        crate::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: Schema::new("join.interval", 1), reason: e.to_string() })
    }

    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        each(&mut self.lefts);
        each(&mut self.rights);
    }

    /// Its keyed states hold all of it (splits for incremental checkpoints).
    fn split_prepared() -> Option<Self::Prepared> {
        Some(())
    }

    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.lefts.len() + self.rights.len());
        self.lefts.for_each(|k, held| out.push(route(k), &Sided::<_, _, ()>::Left(k, held)));
        self.rights.for_each(|k, held| out.push(route(k), &Sided::<_, (), _>::Right(k, held)));
    }
}

/// The records one side holds for a key, in arrival order, and the time a
/// release check is scheduled for them (`Timestamp::MAX`: none).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Held<T> {
    items: VecDeque<T>,
    scheduled: Timestamp,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held { items: VecDeque::new(), scheduled: Timestamp::MAX }
    }
}

/// A side's held records are a list state: an insertion that schedules
/// nothing is an append, which a store on disk writes without reading the
/// key's list.
impl<T: StateValue> Appendable for Held<T> {
    type Item = T;
    fn append(&mut self, item: T) {
        self.items.push_back(item);
    }
}

/// The held record a retraction of `record` at `time` cancels: one equal to
/// it at the same event time, or else the first equal one held.
///
/// Records are equal by their data: a changelog retracts a record at the time
/// of the change, not at the time it was inserted; but of equal records held
/// at several times, one at the retraction's own time is the one it takes back
/// (a stream that retracts at the insertion's time, as windows read it).
fn cancelled<'a, T: 'a>(
    items: impl Iterator<Item = &'a T> + Clone,
    equal: impl Fn(&T) -> bool,
    at_time: impl Fn(&T) -> bool,
) -> Option<usize> {
    items.clone().position(|e| equal(e) && at_time(e)).or_else(|| items.clone().position(equal))
}

/// What [`hold`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// It is held (an insertion, or a retraction with nothing to cancel).
    Appended,
    /// It cancelled a held record at this event time, which is gone.
    Cancelled(Timestamp),
    /// It took part of a held record's multiplicity back.
    Reduced,
}

/// Holds `item` for key `k`: insertions are appended; a retraction cancels
/// the held record [`cancelled`] names (or is held itself, to meet its
/// insertion later).
#[allow(clippy::too_many_arguments)]
fn hold<K: Key, T: StateValue>(
    side: &mut KeyedState<K, Held<T>>,
    due: &mut Timers<K>,
    k: K,
    item: T,
    release_at: Timestamp,
    cancels: impl Fn(&T, &T) -> bool,
    time_of: impl Fn(&T) -> Timestamp,
    diff_of: impl Fn(&mut T) -> &mut Diff,
) -> Holding {
    let mut item = item;
    if *diff_of(&mut item) > 0 && release_at == END_OF_TIME {
        // Nothing to cancel and nothing to schedule: an append.
        side.append(k, item);
        return Holding::Appended;
    }
    let held = side.get_or_insert_with(k.clone(), Held::default);
    if *diff_of(&mut item) < 0 {
        let time = time_of(&item);
        if let Some(pos) = cancelled(held.items.iter(), |e| cancels(e, &item), |e| time_of(e) == time) {
            let d = *diff_of(&mut item);
            let existing = &mut held.items[pos];
            *diff_of(existing) += d;
            if *diff_of(existing) != 0 {
                return Holding::Reduced;
            }
            let time = time_of(existing);
            held.items.remove(pos);
            if held.items.is_empty() {
                side.remove(&k);
            }
            return Holding::Cancelled(time);
        }
    }
    held.items.push_back(item);
    if release_at < END_OF_TIME {
        due.bring_forward(&mut held.scheduled, release_at, &k);
    }
    Holding::Appended
}

/// Forgets held records whose release time the watermark has passed.
///
/// Records are released from the front of each key's list, in arrival order:
/// a record behind one not yet released waits for it. Holding a record longer
/// than needed is safe (no record that can still arrive in time matches it),
/// and arrival order is close to release order, so this costs little memory
/// and no scanning.
fn release<K: Key, T: StateValue>(
    side: &mut KeyedState<K, Held<T>>,
    due: &mut Timers<K>,
    watermark: Timestamp,
    released: impl Fn(&T) -> Timestamp,
) {
    while let Some((time, keys)) = due.pop_due(watermark) {
        for k in keys {
            let Some(held) = side.get_mut(&k) else { continue };
            if held.scheduled != time {
                continue;
            }
            while held.items.front().is_some_and(|item| released(item) <= watermark) {
                held.items.pop_front();
            }
            match held.items.front().map(&released) {
                None => {
                    side.remove(&k);
                }
                Some(next) if next < END_OF_TIME => {
                    held.scheduled = next;
                    due.schedule(next, k);
                }
                Some(_) => held.scheduled = Timestamp::MAX,
            }
        }
    }
}

impl<'scope, L: Data + PartialEq> EventStream<'scope, L> {
    /// Inner equi-join of two changelogs, unwindowed: every pair of records
    /// with equal keys, whichever arrives first, at the later of their event
    /// times, with the product of their diffs. Both sides are kept for ever
    /// (use [`interval_join`](Self::interval_join) to bound the state).
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let people = EventStream::new(vec![((1u64, "ann".to_string()), 5u64, 1i64)].to_stream(scope));
    ///     // The auction arrives before its seller.
    ///     let auctions = EventStream::new(vec![((70u64, 1u64), 3u64, 1i64)].to_stream(scope));
    ///     people.join(&auctions, |p| p.0, |a| a.1, |p, a| (p.1.clone(), a.0)).inner.capture()
    /// });
    /// let out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// assert_eq!(out, vec![(("ann".to_string(), 70), 5, 1)]);
    /// ```
    pub fn join<K, R, KL, KR, O, F>(
        &self,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        output: F,
    ) -> EventStream<'scope, O>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        if let Some(ttl) = crate::state::StateTtl::of(&self.scope()) {
            let joined = self.state_ttl(ttl).join(other, key_left, key_right, output);
            let scope = self.scope();
            crate::totals::Totals::count_in(&scope, "Join.late", &joined.late_left.count);
            crate::totals::Totals::count_in(&scope, "Join.late", &joined.late_right.count);
            return joined.results;
        }
        let unbounded = Interval { bounds: |_: &L, _| (0, END_OF_TIME), lead: END_OF_TIME };
        self.interval_join_core("Join", other, key_left, key_right, unbounded, AllowedLateness(END_OF_TIME), output)
            .results
    }

    /// Joins each left record with the right records of the same key whose
    /// event time lies in the left record's [`Interval`].
    ///
    /// A left record is kept until the right watermark passes its interval's
    /// end plus the allowed lateness; a right record until the left watermark
    /// passes its time plus the interval's lead and the lateness. Records that
    /// arrive after their own time plus the allowed lateness go to the late
    /// outputs. Pairs go out when the second of the two arrives.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::join::between;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let impressions = EventStream::new(vec![(7u64, 1_000u64, 1i64)].to_stream(scope));
    ///     let clicks = EventStream::new(vec![(7u64, 2_000u64, 1i64), (7, 700_000, 1)].to_stream(scope));
    ///     impressions
    ///         .interval_join(&clicks, |i| *i, |c| *c, between(0, 10.minutes() as i64), |i, c| (*i, *c))
    ///         .results.inner.capture()
    /// });
    /// let out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// assert_eq!(out, vec![((7, 7), 2_000, 1)]);
    /// ```
    pub fn interval_join<K, R, KL, KR, B, O, F>(
        &self,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        interval: Interval<B>,
        output: F,
    ) -> IntervalJoined<'scope, O, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        B: Fn(&L, Timestamp) -> (Timestamp, Timestamp) + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        self.interval_join_core(
            "IntervalJoin",
            other,
            key_left,
            key_right,
            interval,
            AllowedLateness::default_of(&self.scope()),
            output,
        )
    }

    /// [`interval_join`](Self::interval_join) with an operator name.
    #[allow(clippy::too_many_arguments)]
    pub fn interval_join_core<K, R, KL, KR, B, O, F>(
        &self,
        name: &str,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        interval: Interval<B>,
        lateness: AllowedLateness,
        output: F,
    ) -> IntervalJoined<'scope, O, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        B: Fn(&L, Timestamp) -> (Timestamp, Timestamp) + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        let joined = self.join_core(name, other, key_left, key_right, interval, lateness, None, output);
        IntervalJoined { results: joined.results, late_left: joined.late_left, late_right: joined.late_right }
    }

    /// The join operator: an interval join, or an unwindowed one whose
    /// records expire (`ttl`).
    #[allow(clippy::too_many_arguments)]
    fn join_core<K, R, KL, KR, B, O, F>(
        &self,
        name: &str,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        interval: Interval<B>,
        lateness: AllowedLateness,
        ttl: Option<StateTtl>,
        output: F,
    ) -> TtlJoined<'scope, O, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        B: Fn(&L, Timestamp) -> (Timestamp, Timestamp) + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        let ttl = crate::state::in_event_time(ttl, name);
        let key_left = Rc::new(key_left);
        let key_right = Rc::new(key_right);
        let (kl, kr) = (Rc::clone(&key_left), Rc::clone(&key_right));
        let stateful = Stateful::<IntervalState<K, L, R>>::new(name, &self.scope());
        let left_in = stateful.keyed_input(self, move |u: &Update<L>| route(&kl(&u.0)));
        let right_in = stateful.keyed_input(other, move |u: &Update<R>| route(&kr(&u.0)));
        let mut builder = stateful.builder(&self.scope());
        let mut input_left = builder.input(left_in);
        let mut input_right = builder.input(right_in);
        let (mut results_out, results) = builder.output::<O>();
        let (mut late_left_out, late_left) = builder.output::<L>();
        let (mut late_right_out, late_right) = builder.output::<R>();
        let (count_left, count_right, expired) = (Counter::new(), Counter::new(), Counter::new());
        crate::totals::Totals::count_in(&self.scope(), &format!("{name}.late"), &count_left);
        crate::totals::Totals::count_in(&self.scope(), &format!("{name}.late"), &count_right);
        if ttl.is_some() {
            crate::totals::Totals::count_in(&self.scope(), &format!("{name}.expired"), &expired);
        }
        let mut op = IntervalOp {
            key_left,
            key_right,
            interval,
            lateness,
            output,
            counter_left: count_left.clone(),
            counter_right: count_right.clone(),
            left_due: Timers::default(),
            right_due: Timers::default(),
            ttl: ttl.map(|ttl| Expiring { ttl, expired: expired.clone(), hold: Hold::default() }),
        };

        builder.build(move |initial_capabilities, mut managed| {
            managed.restore(|state, _time, entries| op.restore(state, entries, &initial_capabilities));
            drop(initial_capabilities);
            move |frontiers| {
                // Both sides are away while a background thread snapshots them.
                if !managed.home() {
                    return;
                }
                let state = managed.get();
                let mut results = results_out.activate();
                let mut late_l = late_left_out.activate();
                let mut late_r = late_right_out.activate();
                input_left.for_each_stamp(|cap, data| op.take_left(state, &cap, data, &mut results, &mut late_l));
                input_right.for_each_stamp(|cap, data| op.take_right(state, &cap, data, &mut results, &mut late_r));
                let (left_watermark, right_watermark) = (watermark_of(&frontiers[0]), watermark_of(&frontiers[1]));
                if op.ttl.is_some() {
                    op.expire(state, left_watermark.min(right_watermark), &mut results);
                } else {
                    op.release(state, left_watermark, right_watermark);
                }
                managed.checkpoint(left_watermark.min(right_watermark), ());
            }
        });

        TtlJoined {
            results,
            late_left: LateOutput { stream: late_left, count: count_left },
            late_right: LateOutput { stream: late_right, count: count_right },
            expired,
        }
    }
}

/// The interval join's work on a worker, step by step: each side's records
/// matched against what the other side holds and held themselves
/// ([`take_left`](Self::take_left), [`take_right`](Self::take_right)), and
/// what the other side's watermark releases forgotten ([`release`](Self::release)).
struct IntervalOp<K, KL, KR, B, F> {
    key_left: Rc<KL>,
    key_right: Rc<KR>,
    interval: Interval<B>,
    lateness: AllowedLateness,
    output: F,
    counter_left: Counter,
    counter_right: Counter,
    /// Keys by the time a release check is scheduled for their held records.
    left_due: Timers<K>,
    right_due: Timers<K>,
    /// With a state time-to-live: what expiry does and what it owes.
    ttl: Option<Expiring>,
}

/// The expiry of an unwindowed join's records ([`EventStream::state_ttl`]).
struct Expiring {
    ttl: StateTtl,
    /// Records that expired.
    expired: Counter,
    /// With [`Expiry::Retract`](crate::state::Expiry::Retract): the
    /// retractions owed, one promise per held record at the time it expires.
    hold: Hold,
}

impl Expiring {
    /// Owes the retractions of a record held at `time` (retracting mode).
    fn owe(&mut self, time: Timestamp, cap: &InputCapability<Timestamp>) {
        if self.ttl.retracts() {
            self.hold.insert(self.ttl.expires_at(time), cap);
        }
    }

    /// No longer owes them: the record was cancelled by a retraction.
    fn forgive(&mut self, time: Timestamp) {
        if self.ttl.retracts() {
            self.hold.remove(self.ttl.expires_at(time));
        }
    }
}

impl<K, KL, KR, B, F> IntervalOp<K, KL, KR, B, F>
where
    K: Key,
{
    /// Recovery: the records each side holds, when they are due for
    /// release, and (expiring with retractions) the retractions owed.
    fn restore<L: Data, R: Data>(
        &mut self,
        IntervalState { lefts, rights }: &mut IntervalState<K, L, R>,
        entries: &mut RestoredEntries<IntervalState<K, L, R>>,
        initial: &[Capability<Timestamp>],
    ) {
        // Sized at once: entries come in the old maps' hash order.
        let n = entries.len();
        lefts.reserve(n);
        rights.reserve(n);
        let mut owed = self.ttl.as_mut().filter(|e| e.ttl.retracts());
        entries.for_each(|entry| match entry {
            Sided::Left(k, held) => {
                if let Some(e) = owed.as_mut() {
                    held.items.iter().for_each(|l| e.hold.restore(e.ttl.expires_at(l.time), initial));
                }
                self.left_due.restore(held.scheduled, k.clone());
                lefts.insert(k, held);
            }
            Sided::Right(k, held) => {
                if let Some(e) = owed.as_mut() {
                    held.items.iter().for_each(|r| e.hold.restore(e.ttl.expires_at(r.1), initial));
                }
                self.right_due.restore(held.scheduled, k.clone());
                rights.insert(k, held);
            }
        });
    }

    /// Whether holding the records of `batch` reads nothing of their own
    /// side: the join is unbounded (nothing is released or expires, so
    /// nothing is scheduled) and every record is an insertion ([`hold`]
    /// appends them).
    fn appends_only<D>(&self, batch: &[Update<D>]) -> bool {
        self.ttl.is_none()
            && self.interval.lead == END_OF_TIME
            && self.lateness.release_at(0) == END_OF_TIME
            && batch.iter().all(|(_, _, diff)| *diff > 0)
    }

    /// When a right record at `t` is released: once no left record it can
    /// match can still arrive.
    fn right_release(&self, t: Timestamp) -> Timestamp {
        self.lateness.release_at(t.saturating_add(self.interval.lead).saturating_add(1))
    }

    /// Takes in the left records of one stamp: each is matched against the
    /// right records its key holds within its bounds, and held.
    fn take_left<L, R, O>(
        &mut self,
        IntervalState { lefts, rights }: &mut IntervalState<K, L, R>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<L>>>,
        results: &mut ActiveOutput<'_, O>,
        late: &mut ActiveOutput<'_, L>,
    ) where
        L: Data + PartialEq,
        R: Data,
        O: Data,
        KL: Fn(&L) -> K,
        B: Fn(&L, Timestamp) -> (Timestamp, Timestamp),
        F: Fn(&L, &R) -> O,
    {
        let arrived = arrival_time(cap);
        let mut session = results.session(cap);
        for batch in data {
            if lefts.prefetches() {
                let keys: Vec<K> = batch.iter().map(|(record, _, _)| (self.key_left)(record)).collect();
                if !(lefts.appends_blindly() && self.appends_only(batch)) {
                    lefts.prefetch(&keys);
                }
                rights.prefetch(&keys);
            }
            for (record, time, diff) in batch.drain(..) {
                if self.lateness.release_at(time.saturating_add(1)) <= arrived {
                    late.session(cap).give((record, time, diff));
                    self.counter_left.add(1);
                    continue;
                }
                let k = (self.key_left)(&record);
                // A retraction takes back the pairs its insertion made: it
                // matches as the held record it cancels.
                let held_as = (diff < 0)
                    .then(|| lefts.get(&k))
                    .flatten()
                    .and_then(|h| {
                        let equal = |l: &Left<L>| l.record == record && l.diff > 0;
                        cancelled(h.items.iter(), equal, |l| l.time == time).map(|i| &h.items[i])
                    })
                    .map(|l| (l.time, l.lo, l.hi));
                let (time, lo, hi) = held_as.unwrap_or_else(|| {
                    let (lo, hi) = (self.interval.bounds)(&record, time);
                    (time, lo, hi)
                });
                if let Some(held) = rights.get(&k) {
                    for (r, rt, rd) in held.items.iter() {
                        if lo <= *rt && *rt <= hi {
                            session.give(((self.output)(&record, r), time.max(*rt), diff * rd));
                        }
                    }
                }
                let release_at = self.lateness.release_at(hi.saturating_add(1));
                let left = Left { record, time, lo, hi, diff };
                let same = |a: &Left<L>, b: &Left<L>| a.record == b.record;
                let held = hold(lefts, &mut self.left_due, k, left, release_at, same, |e| e.time, |e| &mut e.diff);
                if let Some(e) = self.ttl.as_mut() {
                    match held {
                        Holding::Appended => e.owe(time, cap),
                        Holding::Cancelled(at) => e.forgive(at),
                        Holding::Reduced => {}
                    }
                }
            }
        }
    }

    /// Takes in the right records of one stamp: each is matched against the
    /// left records its key holds whose bounds take it, and held.
    fn take_right<L, R, O>(
        &mut self,
        IntervalState { lefts, rights }: &mut IntervalState<K, L, R>,
        cap: &InputCapability<Timestamp>,
        data: IterMut<'_, Vec<Update<R>>>,
        results: &mut ActiveOutput<'_, O>,
        late: &mut ActiveOutput<'_, R>,
    ) where
        L: Data,
        R: Data + PartialEq,
        O: Data,
        KR: Fn(&R) -> K,
        F: Fn(&L, &R) -> O,
    {
        let arrived = arrival_time(cap);
        let mut session = results.session(cap);
        for batch in data {
            if rights.prefetches() {
                let keys: Vec<K> = batch.iter().map(|(record, _, _)| (self.key_right)(record)).collect();
                lefts.prefetch(&keys);
                if !(rights.appends_blindly() && self.appends_only(batch)) {
                    rights.prefetch(&keys);
                }
            }
            for (record, time, diff) in batch.drain(..) {
                if self.lateness.release_at(time.saturating_add(1)) <= arrived {
                    late.session(cap).give((record, time, diff));
                    self.counter_right.add(1);
                    continue;
                }
                let k = (self.key_right)(&record);
                // A retraction matches as the held record it cancels.
                let time = (diff < 0)
                    .then(|| rights.get(&k))
                    .flatten()
                    .and_then(|h| {
                        let equal = |r: &(R, Timestamp, Diff)| r.0 == record && r.2 > 0;
                        cancelled(h.items.iter(), equal, |r| r.1 == time).map(|i| &h.items[i])
                    })
                    .map_or(time, |r| r.1);
                if let Some(held) = lefts.get(&k) {
                    for l in held.items.iter() {
                        if l.lo <= time && time <= l.hi {
                            session.give(((self.output)(&l.record, &record), time.max(l.time), l.diff * diff));
                        }
                    }
                }
                let release_at = self.right_release(time);
                let right = (record, time, diff);
                let same = |a: &(R, Timestamp, Diff), b: &(R, Timestamp, Diff)| a.0 == b.0;
                let held = hold(rights, &mut self.right_due, k, right, release_at, same, |e| e.1, |e| &mut e.2);
                if let Some(e) = self.ttl.as_mut() {
                    match held {
                        Holding::Appended => e.owe(time, cap),
                        Holding::Cancelled(at) => e.forgive(at),
                        Holding::Reduced => {}
                    }
                }
            }
        }
    }

    /// Forgets the held records the other side's watermark has released;
    /// everything once both inputs have ended.
    fn release<L: Data, R: Data>(
        &mut self,
        IntervalState { lefts, rights }: &mut IntervalState<K, L, R>,
        left_watermark: Timestamp,
        right_watermark: Timestamp,
    ) {
        let lateness = self.lateness;
        release(lefts, &mut self.left_due, right_watermark, |l| lateness.release_at(l.hi.saturating_add(1)));
        let lead = self.interval.lead;
        release(rights, &mut self.right_due, left_watermark, |r| {
            lateness.release_at(r.1.saturating_add(lead).saturating_add(1))
        });
        if left_watermark == END_OF_TIME && right_watermark == END_OF_TIME {
            lefts.clear();
            rights.clear();
        }
    }

    /// Expiry of an unwindowed join's records ([`StateTtl`]): forgets every
    /// held record whose time-to-live the watermark (of both inputs) has
    /// passed and, retracting, retracts the pairs it made.
    ///
    /// A pair lives from the later of its two records' times until the
    /// earlier one expires; its retraction is emitted by that one, at its
    /// expiry time, while the other is still held: records are expired
    /// strictly in the order of their expiry times (the left side first at
    /// equal times, taking the pairs of equal times), not from the front of
    /// a key's list.
    fn expire<L: Data, R: Data, O: Data>(
        &mut self,
        IntervalState { lefts, rights }: &mut IntervalState<K, L, R>,
        watermark: Timestamp,
        results: &mut ActiveOutput<'_, O>,
    ) where
        F: Fn(&L, &R) -> O,
    {
        let Some(expiring) = self.ttl.as_mut() else { return };
        let ttl = expiring.ttl;
        if watermark == END_OF_TIME && !ttl.retracts() {
            // Both inputs have ended: everything expires, silently, at once.
            let mut held = 0;
            lefts.for_each(|_, h| held += h.items.len());
            rights.for_each(|_, h| held += h.items.len());
            expiring.expired.add(held as u64);
            lefts.clear();
            rights.clear();
            self.left_due.clear();
            self.right_due.clear();
            return;
        }
        // A record expiring at `at` is forgotten once the watermark has
        // passed `at`, not when it reaches it: a checkpoint at watermark
        // `at` holds the record, and the retractions at `at` come after
        // that cut (they are emitted again after a recovery from it).
        let watermark = if watermark == END_OF_TIME { END_OF_TIME } else { watermark.saturating_sub(1) };
        let mut retractions: Vec<(Timestamp, Update<O>)> = Vec::new();
        loop {
            let left_first = match (self.left_due.next(), self.right_due.next()) {
                (Some(l), Some(r)) if l.min(r) <= watermark => l <= r,
                (Some(l), None) if l <= watermark => true,
                (None, Some(r)) if r <= watermark => false,
                _ => break,
            };
            if left_first {
                let Some((time, keys)) = self.left_due.pop_due(watermark) else { break };
                for k in keys {
                    let Some(held) = lefts.get_mut(&k) else { continue };
                    if held.scheduled != time {
                        continue;
                    }
                    let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                        std::mem::take(&mut held.items).into_iter().partition(|l| ttl.expires_at(l.time) <= time);
                    held.items = kept;
                    expiring.expired.add(gone.len() as u64);
                    if ttl.retracts() {
                        let partners = rights.get(&k);
                        for l in &gone {
                            let at = ttl.expires_at(l.time);
                            expiring.hold.remove(at);
                            for (r, rt, rd) in partners.iter().flat_map(|h| h.items.iter()) {
                                if *rt >= l.time && l.lo <= *rt && *rt <= l.hi {
                                    retractions.push((at, ((self.output)(&l.record, r), at, -(l.diff * rd))));
                                }
                            }
                        }
                    }
                    let Some(held) = lefts.get_mut(&k) else { continue };
                    match held.items.iter().map(|l| ttl.expires_at(l.time)).min() {
                        None => {
                            lefts.remove(&k);
                        }
                        Some(next) => {
                            held.scheduled = next;
                            self.left_due.schedule(next, k);
                        }
                    }
                }
            } else {
                let Some((time, keys)) = self.right_due.pop_due(watermark) else { break };
                for k in keys {
                    let Some(held) = rights.get_mut(&k) else { continue };
                    if held.scheduled != time {
                        continue;
                    }
                    let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                        std::mem::take(&mut held.items).into_iter().partition(|r| ttl.expires_at(r.1) <= time);
                    held.items = kept;
                    expiring.expired.add(gone.len() as u64);
                    if ttl.retracts() {
                        let partners = lefts.get(&k);
                        for (r, rt, rd) in &gone {
                            let at = ttl.expires_at(*rt);
                            expiring.hold.remove(at);
                            for l in partners.iter().flat_map(|h| h.items.iter()) {
                                if l.time > *rt && l.lo <= *rt && *rt <= l.hi {
                                    retractions.push((at, ((self.output)(&l.record, r), at, -(l.diff * rd))));
                                }
                            }
                        }
                    }
                    let Some(held) = rights.get_mut(&k) else { continue };
                    match held.items.iter().map(|r| ttl.expires_at(r.1)).min() {
                        None => {
                            rights.remove(&k);
                        }
                        Some(next) => {
                            held.scheduled = next;
                            self.right_due.schedule(next, k);
                        }
                    }
                }
            }
        }
        if watermark == END_OF_TIME {
            lefts.clear();
            rights.clear();
        }
        // One output session per retraction time.
        retractions.sort_by_key(|(at, _)| *at);
        let mut due = retractions.into_iter().peekable();
        while let Some((at, first)) = due.next() {
            let cap = expiring.hold.at_or_after(at);
            let mut session = results.session(&cap);
            session.give(first);
            while let Some((_, update)) = due.next_if(|(t, _)| *t == at) {
                session.give(update);
            }
        }
        expiring.hold.settle(None);
    }
}

/// A record of one side of a [window join](EventStream::window_join).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Side<A, B> {
    /// A record of the left stream.
    Left(A),
    /// A record of the right stream.
    Right(B),
}

/// The outputs of a window join.
#[derive(Debug)]
pub struct WindowJoined<'scope, K: 'static, L: 'static, R: 'static> {
    /// Every pair of a left and a right record with the same key in the same
    /// window, at the window's last millisecond; late corrections as
    /// retractions and insertions.
    pub results: EventStream<'scope, WindowResult<K, (L, R)>>,
    /// Records that came after their window's allowed lateness.
    pub late: LateOutput<'scope, Side<L, R>>,
}

impl<'scope, L: Data + PartialEq> EventStream<'scope, L> {
    /// Joins the records of two streams that have the same key and fall in
    /// the same window (tumbling, sliding or session, as in Flink's window
    /// join): each pair is emitted once per window they share when the
    /// watermark passes the window's end. Sessions are formed by the records
    /// of both streams together. Late records within `allowed_lateness`
    /// correct the window's pairs; later ones go to the late output.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // (ad, what) at event times: a view at 1 s and one at 12 s, a click at 4 s.
    ///     let views = EventStream::new(vec![((1u32, 'v'), 1_000u64, 1i64), ((1, 'w'), 12_000, 1)].to_stream(scope));
    ///     let clicks = EventStream::new(vec![((1u32, 'c'), 4_000u64, 1i64)].to_stream(scope));
    ///     views.window_join(&clicks, Tumbling::of(10.secs()), |v| v.0, |c| c.0).results.inner.capture()
    /// });
    /// let out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d)
    ///     .map(|(r, t, d)| (r.window.start, r.value.0 .1, r.value.1 .1, t, d)).collect();
    /// assert_eq!(out, vec![(0, 'v', 'c', 9_999, 1)]);
    /// ```
    pub fn window_join<K, R, W, KL, KR>(
        &self,
        other: &EventStream<'scope, R>,
        windows: W,
        key_left: KL,
        key_right: KR,
    ) -> WindowJoined<'scope, K, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        W: WindowSpec<Side<L, R>>,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
    {
        self.window_join_with(other, windows, key_left, key_right, AllowedLateness::default_of(&self.scope()))
    }

    fn window_join_with<K, R, W, KL, KR>(
        &self,
        other: &EventStream<'scope, R>,
        windows: W,
        key_left: KL,
        key_right: KR,
        lateness: AllowedLateness,
    ) -> WindowJoined<'scope, K, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        W: WindowSpec<Side<L, R>>,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
    {
        let both = self.map(Side::Left).concat(&other.map(Side::Right));
        let key = move |s: &Side<L, R>| match s {
            Side::Left(l) => key_left(l),
            Side::Right(r) => key_right(r),
        };
        let windowed =
            both.window(windows).key_by(key).allowed_lateness(lateness.0).named("WindowJoin").aggregate(Collect);
        let results = windowed.results.flat_map_updates("WindowJoinPairs", |(result, time, diff), out| {
            let (lefts, rights): (Vec<_>, Vec<_>) = result.value.iter().partition(|s| matches!(s, Side::Left(_)));
            for l in &lefts {
                let Side::Left(l) = l else { continue };
                for r in &rights {
                    let Side::Right(r) = r else { continue };
                    let value = (l.clone(), r.clone());
                    out.push((WindowResult { window: result.window, key: result.key.clone(), value }, time, diff));
                }
            }
        });
        WindowJoined { results, late: windowed.late }
    }
}

impl<'scope, L: Data + PartialEq> crate::late::WithLateness<'scope, L> {
    /// [`EventStream::interval_join`] for records of either side that arrive
    /// up to the allowed lateness after the watermark passed them.
    pub fn interval_join<K, R, KL, KR, B, O, F>(
        &self,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        interval: Interval<B>,
        output: F,
    ) -> IntervalJoined<'scope, O, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        B: Fn(&L, Timestamp) -> (Timestamp, Timestamp) + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        self.stream.interval_join_core("IntervalJoin", other, key_left, key_right, interval, self.lateness, output)
    }

    /// [`EventStream::window_join`] for records of either side that arrive
    /// up to the allowed lateness after their window's end.
    pub fn window_join<K, R, W, KL, KR>(
        &self,
        other: &EventStream<'scope, R>,
        windows: W,
        key_left: KL,
        key_right: KR,
    ) -> WindowJoined<'scope, K, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        W: WindowSpec<Side<L, R>>,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
    {
        self.stream.window_join_with(other, windows, key_left, key_right, self.lateness)
    }
}

impl<'scope, L: Data + PartialEq> crate::state::WithTtl<'scope, L> {
    /// [`EventStream::join`] whose held records expire: a record at event
    /// time `t` is seen by the other side's records up to `t + ttl` and
    /// forgotten once both watermarks pass `t + ttl`, so two records join
    /// when their times are at most the time-to-live apart, on any layout.
    /// With [`Expiry::Retract`](crate::state::Expiry::Retract) every pair is
    /// retracted when the earlier of its two records expires, at that time.
    /// Records that come behind the watermark (whose partners may already
    /// be gone) go to the late outputs.
    ///
    /// # Examples
    /// ```
    /// use highwater_operators::prelude::*;
    /// use highwater_operators::state::{Expiry, StateTtl};
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     // An auction at 1 s; bids on it at 5 s and at 90 s.
    ///     let auctions = EventStream::new(vec![(7u64, 1_000u64, 1i64)].to_stream(scope));
    ///     let bids = EventStream::new(vec![((7u64, 'a'), 5_000u64, 1i64), ((7, 'b'), 90_000, 1)].to_stream(scope));
    ///     let ttl = StateTtl::event_time(60.secs()).expiry(Expiry::Retract);
    ///     bids.state_ttl(ttl).join(&auctions, |b| b.0, |a| *a, |b, _| b.1).results.inner.capture()
    /// });
    /// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// out.sort();
    /// // The bid at 90 s comes after the auction expired; the pair made at
    /// // 5 s is retracted when the auction expires, at 61.001 s.
    /// assert_eq!(out, vec![('a', 5_000, 1), ('a', 61_001, -1)]);
    /// ```
    pub fn join<K, R, KL, KR, O, F>(
        &self,
        other: &EventStream<'scope, R>,
        key_left: KL,
        key_right: KR,
        output: F,
    ) -> TtlJoined<'scope, O, L, R>
    where
        K: Key,
        R: Data + PartialEq,
        O: Data,
        KL: Fn(&L) -> K + 'static,
        KR: Fn(&R) -> K + 'static,
        F: Fn(&L, &R) -> O + 'static,
    {
        let ttl = self.ttl;
        let span = ttl.millis();
        let interval = Interval {
            bounds: move |_: &L, t: Timestamp| (t.saturating_sub(span), t.saturating_add(span)),
            lead: span,
        };
        self.stream.join_core("Join", other, key_left, key_right, interval, AllowedLateness::ZERO, Some(ttl), output)
    }
}
