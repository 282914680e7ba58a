//! State time-to-live of the unwindowed join and of upsert tables, against
//! naive models with expiry. The join: a naive model with
//! expiry: random out-of-order records of both sides (insertions, and
//! retractions of some of them), a checkpoint at a random cut and a recovery
//! onto another number of workers, both expiry modes. The model: records
//! that arrive behind the watermark are late and join nothing; every other
//! left and right record of a key whose event times are at most the
//! time-to-live apart make a pair at the later time, retracted (when expiry
//! retracts) at the time the earlier one expires. The table: each key's
//! value at every event time (the latest upsert at or before it, unless
//! older than the TTL) with retractions; silently, each value retracted
//! only by an upsert that comes within its TTL. The aggregation by key:
//! each key's count over its records, applied at their (timely) times, the
//! key forgotten once the watermark passes its last change plus the TTL
//! (its result retracted then, when expiry retracts) and started afresh by
//! the next record. A user's keyed process: each key's state in order of
//! arrival, gone before the first record that arrives after its last
//! refresh plus the TTL, refreshed by writes (and reads, if asked); and on
//! the wall clock, with real pauses. A table–table join of two expiring
//! tables: a row while both values are live.

use std::collections::{BTreeMap, BTreeSet};

use highwater_operators::checkpoint::memory::{check_recovery, Input, Output};
use highwater_operators::prelude::*;
use highwater_operators::state::{Expiry, KeyedContext, KeyedProcess, Refresh, Schema, StateTtl};
use proptest::prelude::*;
use timely::dataflow::operators::vec::Map;

/// A record of either side: `(left?, key, id, event time)`; the id makes
/// every record distinct.
type Rec = (bool, u8, u16, u64);
/// A pair, as the join emits it: `(left id, right id)`, with the pair's
/// event time.
type Pair = ((u16, u16), u64);

const TTL: u64 = 120;

/// An output summed over the (timely) times each record travelled at:
/// records carry their event time in them.
fn net<R: Ord + Clone>(output: &Output<R>) -> BTreeMap<R, i64> {
    let mut out = BTreeMap::new();
    for ((row, _), diff) in output {
        *out.entry(row.clone()).or_default() += diff;
    }
    out.retain(|_, d| *d != 0);
    out
}

/// An output as it is, by record and timely time, zeros left out.
fn by_time_of<O: Ord + Clone>(output: &Output<O>) -> BTreeMap<(O, u64), i64> {
    let mut out = output.clone();
    out.retain(|_, d| *d != 0);
    out
}

/// Runs `build` uninterrupted and checkpointed at `cut` (on `before`
/// workers, recovered onto `after`): both outputs, read by `read`, are the
/// model's `want`.
fn recovers_as<D, O, B, R>(
    input: &[Input<D>],
    cut: u64,
    (before, after): (usize, usize),
    build: B,
    read: fn(&Output<O>) -> R,
    want: R,
) -> Result<(), TestCaseError>
where
    D: highwater_operators::key::Data + Send + Sync,
    O: highwater_operators::key::Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
    R: PartialEq + std::fmt::Debug,
{
    let run = check_recovery(input, cut, before, after, build);
    prop_assert!(run.failures.is_empty(), "{:?}", run.failures);
    prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
    prop_assert_eq!(read(&run.expected), want, "uninterrupted");
    prop_assert_eq!(read(&run.recovered), read(&run.expected), "recovered");
    Ok(())
}

/// Random records of both sides: arrival times in [0, 2000), event times up
/// to 300 before or after the arrival (those behind it are late), some
/// retracted a little later at their own event time.
fn records() -> impl Strategy<Value = Vec<Input<Rec>>> {
    prop::collection::vec((any::<bool>(), 0u8..4, 0u64..2000, 0u64..600, prop::bool::weighted(0.2)), 1..120).prop_map(
        |raw| {
            let mut out = Vec::new();
            for (id, (left, key, arrival, skew, retract)) in raw.into_iter().enumerate() {
                let time = (arrival + skew).saturating_sub(300);
                let rec = (left, key, id as u16, time);
                out.push((rec, time, 1, arrival));
                if retract {
                    out.push((rec, time, -1, arrival + 30));
                }
            }
            out.sort_by_key(|u| u.3);
            out
        },
    )
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 3)), Just((3, 1)), Just((3, 3)), Just((1, 1))]
}

/// The join's pairs under `ttl`, with their event times.
fn model(input: &[Input<Rec>], ttl: StateTtl) -> BTreeMap<Pair, i64> {
    let mut held: BTreeMap<Rec, i64> = BTreeMap::new();
    for (rec, time, diff, arrival) in input {
        // Late: behind the watermark when it arrives.
        if time >= arrival {
            *held.entry(*rec).or_default() += diff;
        }
    }
    held.retain(|_, d| *d != 0);
    let mut out = BTreeMap::new();
    for (l, dl) in held.iter().filter(|(r, _)| r.0) {
        for (r, dr) in held.iter().filter(|(r, _)| !r.0) {
            if l.1 != r.1 || l.3.abs_diff(r.3) > ttl.millis() {
                continue;
            }
            *out.entry(((l.2, r.2), l.3.max(r.3))).or_default() += dl * dr;
            if ttl.retracts() {
                *out.entry(((l.2, r.2), ttl.expires_at(l.3.min(r.3)))).or_default() -= dl * dr;
            }
        }
    }
    out.retain(|_, d| *d != 0);
    out
}

fn joined(expiry: Expiry) -> impl for<'s> Fn(&EventStream<'s, Rec>) -> EventStream<'s, Pair> + Send + Sync + 'static {
    move |records| {
        let lefts = records.filter(|r: &Rec| r.0);
        let rights = records.filter(|r: &Rec| !r.0);
        let ttl = StateTtl::event_time(TTL).expiry(expiry);
        let pairs = lefts.state_ttl(ttl).join(&rights, |l| l.1, |r| r.1, |l, r| (l.2, r.2)).results;
        // The event time into the record, so that it can be compared.
        EventStream::new(pairs.inner.map(|(pair, time, diff)| ((pair, time), time, diff)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn expiring_silently_joins_what_is_within_the_ttl(input in records(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL);
        recovers_as(&input, cut, (before, after), joined(Expiry::Silent), net, model(&input, ttl))?;
    }

    #[test]
    fn expiring_with_retractions_retracts_every_pair(input in records(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        recovers_as(&input, cut, (before, after), joined(Expiry::Retract), net, model(&input, ttl))?;
    }
}

/// Expired records leave the state: after the watermark passes every
/// record's time plus the time-to-live, the checkpoint holds nothing of the
/// join, and the counter counts every held record.
#[test]
fn expired_records_leave_the_checkpoint() {
    // Lefts and rights of one key every 10 ms over 2 s, in order.
    let input: Vec<Input<Rec>> = (0..200u64).map(|i| ((i % 2 == 0, 1, i as u16, i * 10), i * 10, 1, i * 10)).collect();
    // Cut late: everything but the last TTL's records has expired by then.
    let run = check_recovery(&input, 1_900, 1, 1, joined(Expiry::Silent));
    let held = run.checkpoint.entries_of("Join");
    assert!(held > 0, "the records within the TTL of the cut are held");
    // A record is held by its key's list: one entry per side at most.
    assert!(held <= 2, "expired records are forgotten: {held} entries");
    let pairs = net(&run.expected).len();
    let model = model(&input, StateTtl::event_time(TTL)).len();
    assert_eq!(pairs, model);
}

/// An upsert: `(key, value or delete)`.
type Up = (u8, Option<u8>);
/// A change of the table: `(key, value)` with its event time.
type Row = ((u8, u8), u64);

/// Random upserts and deletes of three keys, at most one per key and event
/// time, arriving out of order (those behind the watermark are late), some
/// undone a little later.
fn upserts() -> impl Strategy<Value = Vec<Input<Up>>> {
    prop::collection::vec(
        (0u8..3, prop::option::weighted(0.8, 0u8..4), 0u64..2000, 0u64..600, prop::bool::weighted(0.15)),
        1..80,
    )
    .prop_map(|raw| {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (key, value, arrival, skew, undo) in raw {
            let time = (arrival + skew).saturating_sub(300);
            if !seen.insert((key, time)) {
                continue;
            }
            out.push(((key, value), time, 1, arrival));
            if undo {
                out.push(((key, value), time, -1, arrival + 30));
            }
        }
        out.sort_by_key(|u| u.3);
        out
    })
}

/// The table's changelog under `ttl`, consolidated, by event time.
fn table_model(input: &[Input<Up>], ttl: StateTtl) -> BTreeMap<Row, i64> {
    let mut held: BTreeMap<(u8, u64), (Option<u8>, i64)> = BTreeMap::new();
    for ((key, value), time, diff, arrival) in input {
        if time >= arrival {
            held.entry((*key, *time)).or_insert((*value, 0)).1 += diff;
        }
    }
    let mut out: BTreeMap<Row, i64> = BTreeMap::new();
    for key in 0..3u8 {
        let versions: Vec<(u64, Option<u8>)> =
            held.iter().filter(|((k, _), (_, n))| *k == key && *n > 0).map(|((_, t), (v, _))| (*t, *v)).collect();
        if ttl.retracts() {
            // The value at every event time, and its changes.
            let value_at = |at: u64| {
                let (t, v) = versions.iter().rev().find(|(t, _)| *t <= at)?;
                v.filter(|_| at <= t + ttl.millis())
            };
            let last = versions.last().map_or(0, |(t, _)| t + ttl.millis() + 2);
            let mut before = None;
            for at in 0..=last {
                let now = value_at(at);
                if now != before {
                    if let Some(v) = before {
                        *out.entry(((key, v), at)).or_default() -= 1;
                    }
                    if let Some(v) = now {
                        *out.entry(((key, v), at)).or_default() += 1;
                    }
                }
                before = now;
            }
        } else {
            // Each value from its time on, retracted only by an upsert
            // within its TTL.
            for (i, (t, v)) in versions.iter().enumerate() {
                let Some(v) = v else { continue };
                *out.entry(((key, *v), *t)).or_default() += 1;
                if let Some((next, _)) = versions.get(i + 1).filter(|(n, _)| *n <= t + ttl.millis()) {
                    *out.entry(((key, *v), *next)).or_default() -= 1;
                }
            }
        }
    }
    out.retain(|_, d| *d != 0);
    out
}

fn table(expiry: Expiry) -> impl for<'s> Fn(&EventStream<'s, Up>) -> EventStream<'s, Row> + Send + Sync + 'static {
    move |upserts| {
        let ttl = StateTtl::event_time(TTL).expiry(expiry);
        let changelog = upserts.state_ttl(ttl).upsert().table.changelog();
        EventStream::new(changelog.inner.map(|(row, time, diff)| ((row, time), time, diff)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn tables_expiring_silently_keep_what_they_said(input in upserts(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL);
        recovers_as(&input, cut, (before, after), table(Expiry::Silent), net, table_model(&input, ttl))?;
    }

    #[test]
    fn tables_expiring_with_retractions_hold_only_live_values(input in upserts(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        recovers_as(&input, cut, (before, after), table(Expiry::Retract), net, table_model(&input, ttl))?;
    }
}

/// Keys whose last value expired leave the table's state.
#[test]
fn expired_keys_leave_the_checkpoint() {
    // 200 keys set once each, 10 ms apart, in order.
    let input: Vec<Input<Up>> = (0..200u64).map(|i| (((i % 250) as u8, Some(1)), i * 10, 1, i * 10)).collect();
    let run = check_recovery(&input, 1_900, 1, 1, table(Expiry::Silent));
    let held = run.checkpoint.entries_of("Upsert");
    // Those set within the TTL before the cut (and its watermark) remain.
    assert!(held > 0 && held <= 14, "expired keys are forgotten: {held} held");
}

/// A record to count: `(key, id)`.
type Click = (u8, u16);

/// Random records of three keys arriving in [0, 2000), their event times
/// up to 300 after their arrival (or before: late), some retracted a little
/// later.
fn clicks() -> impl Strategy<Value = Vec<Input<Click>>> {
    prop::collection::vec((0u8..3, 0u64..2000, 0u64..400, prop::bool::weighted(0.2)), 1..100).prop_map(|raw| {
        let mut out = Vec::new();
        for (id, (key, arrival, skew, retract)) in raw.into_iter().enumerate() {
            let time = (arrival + skew).saturating_sub(100);
            out.push(((key, id as u16), time, 1, arrival));
            if retract {
                out.push(((key, id as u16), time, -1, arrival + 40));
            }
        }
        out.sort_by_key(|u| u.3);
        out
    })
}

/// The changelog of the count per key under `ttl`, by (timely) time: each
/// record applied at its event time, or its arrival if that is later.
fn count_model(input: &[Input<Click>], ttl: StateTtl) -> BTreeMap<((u8, u64), u64), i64> {
    let mut out: BTreeMap<((u8, u64), u64), i64> = BTreeMap::new();
    for key in 0..3u8 {
        let mut batches: BTreeMap<u64, i64> = BTreeMap::new();
        for ((k, _), time, diff, arrival) in input {
            if *k == key {
                *batches.entry(*time.max(arrival)).or_default() += diff;
            }
        }
        // The key's count (positive: a key without a result is forgotten)
        // and the time it last changed.
        let mut held: Option<(i64, u64)> = None;
        let mut change = |count: i64, at: u64, diff: i64| {
            if count > 0 {
                *out.entry(((key, count as u64), at)).or_default() += diff;
            }
        };
        for (time, diff) in batches {
            if let Some((count, changed)) = held {
                let expires = ttl.expires_at(changed);
                if expires <= time {
                    if ttl.retracts() {
                        change(count, expires, -1);
                    }
                    held = None;
                }
            }
            let before = held.map_or(0, |(c, _)| c);
            let after = before + diff;
            change(before, time, -1);
            change(after, time, 1);
            held = (after > 0).then_some((after, time));
        }
        if let (Some((count, changed)), true) = (held, ttl.retracts()) {
            change(count, ttl.expires_at(changed), -1);
        }
    }
    out.retain(|_, d| *d != 0);
    out
}

fn counted(
    expiry: Expiry,
) -> impl for<'s> Fn(&EventStream<'s, Click>) -> EventStream<'s, (u8, u64)> + Send + Sync + 'static {
    move |clicks| {
        let ttl = StateTtl::event_time(TTL).expiry(expiry);
        clicks.state_ttl(ttl).aggregate_by_key(|c: &Click| c.0, Count).results
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn counts_expiring_silently_start_afresh(input in clicks(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL);
        recovers_as(&input, cut, (before, after), counted(Expiry::Silent), by_time_of, count_model(&input, ttl))?;
    }

    #[test]
    fn counts_expiring_with_retractions_hold_only_live_keys(input in clicks(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        recovers_as(&input, cut, (before, after), counted(Expiry::Retract), by_time_of, count_model(&input, ttl))?;
    }
}

/// Keys of a top-k whose records all expired leave the checkpoint: only
/// those changed within the TTL before the cut remain.
#[test]
fn expired_top_k_keys_leave_the_checkpoint() {
    // 200 keys with one record each, 10 ms apart, in order.
    let input: Vec<Input<Click>> =
        (0..200u16).map(|i| (((i % 250) as u8, i), u64::from(i) * 10, 1, u64::from(i) * 10)).collect();
    let run = check_recovery(&input, 1_900, 1, 2, |clicks: &EventStream<'_, Click>| {
        let ttl = StateTtl::event_time(TTL);
        let top = clicks.state_ttl(ttl).aggregate_by_key_named(
            "TopIds",
            |c: &Click| c.0,
            TopK::append_only(3, |c: &Click| c.1),
        );
        top.results.map(|(k, ids): (u8, Vec<u16>)| (k, ids.len() as u64))
    });
    let held = run.checkpoint.entries_of("TopIds");
    // Changed within 120 ms before the cut at 1.9 s: at most 13 keys.
    assert!(held > 0 && held <= 13, "expired keys are forgotten: {held} held");
    assert_eq!(run.recovered, run.expected);
}

/// A record of the stream–table join: an upsert of the table, or an event
/// to enrich: `(upsert?, key, value, id)`.
type Mixed = (bool, u8, u8, u16);

/// Random upserts of three keys (at most one per key and event time) and
/// events, arriving out of order (those behind the watermark are late).
fn mixed() -> impl Strategy<Value = Vec<Input<Mixed>>> {
    prop::collection::vec((prop::bool::weighted(0.4), 0u8..3, 0u8..4, 0u64..2000, 0u64..600), 1..100).prop_map(|raw| {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (id, (upsert, key, value, arrival, skew)) in raw.into_iter().enumerate() {
            let time = (arrival + skew).saturating_sub(300);
            if upsert && !seen.insert((key, time)) {
                continue;
            }
            out.push(((upsert, key, value, id as u16), time, 1, arrival));
        }
        out.sort_by_key(|u| u.3);
        out
    })
}

/// Each event that is not late with its key's live value as of its time.
fn enriched_model(input: &[Input<Mixed>], ttl: StateTtl) -> BTreeMap<Pair, i64> {
    let versions = |key: u8| -> Vec<(u64, u8)> {
        let mut v: Vec<(u64, u8)> = input
            .iter()
            .filter(|((upsert, k, _, _), time, _, arrival)| *upsert && *k == key && time >= arrival)
            .map(|((_, _, value, _), time, _, _)| (*time, *value))
            .collect();
        v.sort();
        v
    };
    let mut out = BTreeMap::new();
    for ((upsert, key, _, id), time, _, arrival) in input {
        if *upsert || time < arrival {
            continue;
        }
        let live = versions(*key).into_iter().rev().find(|(t, _)| t <= time).filter(|(t, _)| *time <= t + ttl.millis());
        if let Some((_, value)) = live {
            *out.entry(((*id, u16::from(value)), *time)).or_default() += 1;
        }
    }
    out
}

fn enriched(
    expiry: Expiry,
) -> impl for<'s> Fn(&EventStream<'s, Mixed>) -> EventStream<'s, Pair> + Send + Sync + 'static {
    move |records| {
        let ttl = StateTtl::event_time(TTL).expiry(expiry);
        let upserts = records.flat_map(|r: Mixed| r.0.then_some((r.1, Some(r.2))));
        let events = records.filter(|r: &Mixed| !r.0);
        let table = upserts.state_ttl(ttl).upsert().table;
        let joined = events.join_as_of(&table, |e: &Mixed| e.1).results;
        EventStream::new(joined.inner.map(|((e, value), time, diff)| (((e.3, u16::from(value)), time), time, diff)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// A stream–table join on a table whose values expire with
    /// retractions: an event joins its key's value only while it is live.
    #[test]
    fn stream_table_joins_see_only_live_values(input in mixed(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        recovers_as(&input, cut, (before, after), enriched(Expiry::Retract), net, enriched_model(&input, ttl))?;
    }
}

/// With a retracting TTL on the table, the join's own copy of the table
/// forgets the expired keys too; silently, it keeps them.
#[test]
fn stream_table_joins_forget_expired_keys_with_retractions() {
    // 200 keys set once each, 10 ms apart, in order; no events.
    let input: Vec<Input<Mixed>> =
        (0..200u16).map(|i| ((true, (i % 250) as u8, 1, i), u64::from(i) * 10, 1, u64::from(i) * 10)).collect();
    let held = |expiry| check_recovery(&input, 1_900, 1, 1, enriched(expiry)).checkpoint.entries_of("JoinAsOf");
    let (retracting, silent) = (held(Expiry::Retract), held(Expiry::Silent));
    assert!(retracting > 0 && retracting <= 14, "expired keys are forgotten: {retracting} held");
    assert!(silent >= 150, "silently expired values stay in the join: {silent} held");
}

/// A record of a user's keyed process: `(key, value, id)`; a value of 0
/// reads the key's sum, any other adds to it.
type Deposit = (u8, u8, u16);
/// What the process emits: `(key, sum, read?)`.
type Sum = (u8, i64, bool);

/// Random deposits and reads of three keys at distinct arrivals in
/// [0, 2000), their event times up to 300 after their arrival (or before:
/// late).
fn deposits() -> impl Strategy<Value = Vec<Input<Deposit>>> {
    prop::collection::vec((0u8..3, 0u8..4, 0u64..2000, 0u64..400), 1..100).prop_map(|mut raw| {
        raw.sort_by_key(|r| r.2);
        raw.into_iter()
            .enumerate()
            .map(|(id, (key, value, arrival, skew))| {
                let arrival = arrival + id as u64;
                ((key, value, id as u16), (arrival + skew).saturating_sub(100), 1, arrival)
            })
            .collect()
    })
}

/// Sums per key; a read emits the sum it sees, a write retracts the old sum
/// and emits the new one, and an expiry retracts the sum.
struct Sums;

impl KeyedProcess<u8, Deposit> for Sums {
    type State = i64;
    type Output = Sum;
    const SCHEMA: Schema = Schema::new("test.sums", 1);

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, i64, Sum>, (k, v, _): Deposit, t: Timestamp, d: Diff) {
        let before = ctx.state().copied();
        if v == 0 {
            if let Some(sum) = before {
                ctx.emit((k, sum, true), t, 1);
            }
            return;
        }
        if let Some(sum) = before {
            ctx.emit((k, sum, false), t, -1);
        }
        let after = before.unwrap_or(0) + i64::from(v) * d;
        *ctx.state_mut() = Some(after);
        ctx.emit((k, after, false), t, 1);
    }

    fn on_expire(&self, ctx: &mut KeyedContext<'_, u8, i64, Sum>, at: Timestamp) {
        let (k, sum) = (*ctx.key(), *ctx.state().expect("an expiring key has a state"));
        ctx.emit((k, sum, false), at, -1);
    }
}

/// The model: each key's records in order of arrival; before a record at
/// arrival `a`, a state refreshed last at `u` with `u + ttl < a` is gone
/// (retracted at `u + ttl + 1` when expiry retracts); a record refreshes at
/// its event time or its arrival, whichever is later; at the end every
/// state expires. Outputs at their timely times.
fn sums_model(input: &[Input<Deposit>], ttl: StateTtl) -> BTreeMap<(Sum, u64), i64> {
    let mut out: BTreeMap<(Sum, u64), i64> = BTreeMap::new();
    let mut held: BTreeMap<u8, (i64, u64)> = BTreeMap::new();
    let expire = |out: &mut BTreeMap<(Sum, u64), i64>, k: u8, (sum, u): (i64, u64)| {
        if ttl.retracts() {
            *out.entry(((k, sum, false), ttl.expires_at(u))).or_default() -= 1;
        }
    };
    for ((k, v, _), time, diff, arrival) in input {
        if let Some(state) = held.get(k).copied() {
            if ttl.expires_at(state.1) <= *arrival {
                expire(&mut out, *k, state);
                held.remove(k);
            }
        }
        let refresh = (*time).max(*arrival);
        match (held.get_mut(k), *v) {
            (Some((sum, u)), 0) => {
                *out.entry(((*k, *sum, true), *arrival)).or_default() += 1;
                if ttl.refreshes_on_read() {
                    *u = (*u).max(refresh);
                }
            }
            (None, 0) => {}
            (state, v) => {
                let before = state.as_ref().map(|s| s.0);
                if let Some(sum) = before {
                    *out.entry(((*k, sum, false), *arrival)).or_default() -= 1;
                }
                let after = before.unwrap_or(0) + i64::from(v) * diff;
                *out.entry(((*k, after, false), *arrival)).or_default() += 1;
                let u = state.map_or(refresh, |s| s.1.max(refresh));
                held.insert(*k, (after, u));
            }
        }
    }
    for (k, state) in held {
        expire(&mut out, k, state);
    }
    out.retain(|_, d| *d != 0);
    out
}

fn summed(ttl: StateTtl) -> impl for<'s> Fn(&EventStream<'s, Deposit>) -> EventStream<'s, Sum> + Send + Sync + 'static {
    move |deposits| deposits.state_ttl(ttl).process_keyed("Sums", |d: &Deposit| d.0, Sums).results
}

fn ttls() -> impl Strategy<Value = StateTtl> {
    (any::<bool>(), any::<bool>()).prop_map(|(retract, on_read)| {
        StateTtl::event_time(TTL).expiry(if retract { Expiry::Retract } else { Expiry::Silent }).refresh(if on_read {
            Refresh::OnReadAndWrite
        } else {
            Refresh::OnWrite
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A user's keyed process whose state expires, in both expiry modes and
    /// both refresh modes, recovered onto another number of workers.
    #[test]
    fn keyed_process_states_expire_as_the_model_says(input in deposits(), ttl in ttls(), cut in 1u64..2200, (before, after) in workers()) {
        recovers_as(&input, cut, (before, after), summed(ttl), by_time_of, sums_model(&input, ttl))?;
    }
}

/// Keys whose state expired leave the checkpoint; a read refreshes a key
/// only when reads refresh.
#[test]
fn expired_keyed_process_states_leave_the_checkpoint() {
    // 200 keys written once each, 10 ms apart; key 150 (written at 1.5 s)
    // read 5 ms after every write from then on.
    let mut input: Vec<Input<Deposit>> =
        (0..200u16).map(|i| (((i % 200) as u8, 1, i), u64::from(i) * 10, 1, u64::from(i) * 10)).collect();
    input.extend((150..190u16).map(|i| ((150u8, 0, 1000 + i), u64::from(i) * 10 + 5, 1, u64::from(i) * 10 + 5)));
    input.sort_by_key(|u| u.3);
    let held = |ttl: StateTtl| {
        let run = check_recovery(&input, 1_900, 1, 2, summed(ttl));
        assert_eq!(run.recovered, run.expected);
        assert_eq!(by_time_of(&run.expected), sums_model(&input, ttl));
        run.checkpoint.entries_of("Sums")
    };
    let on_write = held(StateTtl::event_time(TTL));
    // Written within 120 ms before the cut at 1.9 s: at most 13 keys.
    assert!(on_write > 0 && on_write <= 13, "expired keys are forgotten: {on_write} held");
    // Read until 1.895 s: key 150 is held too.
    assert_eq!(held(StateTtl::event_time(TTL).refresh(Refresh::OnReadAndWrite)), on_write + 1);
}

/// An upsert of one of two tables: `(left?, key, value or delete)`.
type SideUp = (bool, u8, Option<u8>);
/// A joined row: `(key, left value, right value)`, with its event time.
type JoinedRow = ((u8, u8, u8), u64);

/// Random upserts of both tables, as [`upserts`] makes them for one.
fn side_upserts() -> impl Strategy<Value = Vec<Input<SideUp>>> {
    (upserts(), upserts()).prop_map(|(left, right)| {
        let mut out: Vec<Input<SideUp>> = left
            .into_iter()
            .map(|((k, v), t, d, a)| ((true, k, v), t, d, a))
            .chain(right.into_iter().map(|((k, v), t, d, a)| ((false, k, v), t, d, a)))
            .collect();
        out.sort_by_key(|u| u.3);
        out
    })
}

/// The join of the two tables on their key, each value live from its
/// upsert until the key's next upsert or until it expires: a row from when
/// both values are live until either is not.
fn joined_tables_model(input: &[Input<SideUp>], ttl: StateTtl) -> BTreeMap<JoinedRow, i64> {
    let side = |left: bool| -> Vec<Input<Up>> {
        input.iter().filter(|u| u.0 .0 == left).map(|((_, k, v), t, d, a)| ((*k, *v), *t, *d, *a)).collect()
    };
    // Each table's value of each key at every event time, from its changelog.
    let values = |log: BTreeMap<Row, i64>| {
        let mut changes: BTreeMap<(u8, u64), Vec<(u8, i64)>> = BTreeMap::new();
        for (((k, v), t), d) in log {
            changes.entry((k, t)).or_default().push((v, d));
        }
        changes
    };
    let (left, right) = (values(table_model(&side(true), ttl)), values(table_model(&side(false), ttl)));
    let mut out: BTreeMap<JoinedRow, i64> = BTreeMap::new();
    for key in 0..3u8 {
        let (mut l, mut r): (BTreeMap<u8, i64>, BTreeMap<u8, i64>) = (BTreeMap::new(), BTreeMap::new());
        let mut before: Vec<(u8, u8)> = Vec::new();
        let last = left.keys().chain(right.keys()).filter(|(k, _)| *k == key).map(|(_, t)| *t).max().unwrap_or(0);
        for at in 0..=last {
            for (held, log) in [(&mut l, &left), (&mut r, &right)] {
                for (v, d) in log.get(&(key, at)).into_iter().flatten() {
                    *held.entry(*v).or_default() += d;
                }
                held.retain(|_, n| *n != 0);
            }
            let now: Vec<(u8, u8)> = l.keys().flat_map(|lv| r.keys().map(move |rv| (*lv, *rv))).collect();
            for (lv, rv) in &before {
                *out.entry(((key, *lv, *rv), at)).or_default() -= 1;
            }
            for (lv, rv) in &now {
                *out.entry(((key, *lv, *rv), at)).or_default() += 1;
            }
            before = now;
        }
    }
    out.retain(|_, d| *d != 0);
    out
}

fn joined_tables() -> impl for<'s> Fn(&EventStream<'s, SideUp>) -> EventStream<'s, JoinedRow> + Send + Sync + 'static {
    |upserts| {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        let table = |left: bool| {
            upserts.filter(move |u: &SideUp| u.0 == left).map(|(_, k, v): SideUp| (k, v)).state_ttl(ttl).upsert().table
        };
        let joined = table(true).join(&table(false), |k, _| *k);
        EventStream::new(joined.inner.map(|(((k, lv), (_, rv)), time, diff)| (((k, lv, rv), time), time, diff)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// A table–table join of two tables whose values expire with
    /// retractions holds a row only while both values are live, and its
    /// results are retracted when either expires.
    #[test]
    fn table_joins_of_expiring_tables_hold_only_live_rows(input in side_upserts(), cut in 1u64..2200, (before, after) in workers()) {
        let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
        recovers_as(&input, cut, (before, after), joined_tables(), net, joined_tables_model(&input, ttl))?;
    }
}

/// A processing-time TTL (Flink's) on a keyed process: a state untouched
/// for longer than the TTL of wall-clock time is gone when its key comes
/// back; reads keep it alive only when reads refresh. Real sleeps, with a
/// wide margin: the TTL is 2 s, reads 0.5 s apart (kept), a key untouched
/// for 3 s (gone).
#[test]
fn keyed_process_states_expire_on_the_wall_clock() {
    use std::time::Duration;
    use timely::dataflow::operators::{Input, Inspect, Probe};
    use timely::dataflow::ProbeHandle;

    let run = |refresh: Refresh| {
        timely::execute_directly(move |worker| {
            let probe = ProbeHandle::new();
            let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::<(Sum, i64)>::new()));
            let sink = seen.clone();
            let (mut input, expired) = worker.dataflow::<u64, _, _>(|scope| {
                let (input, deposits) = scope.new_input::<Vec<highwater_operators::Update<Deposit>>>();
                let ttl = StateTtl::processing_time(2.secs()).refresh(refresh);
                let sums = EventStream::new(deposits).state_ttl(ttl).process_keyed("Sums", |d: &Deposit| d.0, Sums);
                sums.results
                    .inner
                    .inspect(move |(row, _t, d): &(Sum, u64, i64)| sink.borrow_mut().push((*row, *d)))
                    .probe_with(&probe);
                (input, sums.expired)
            });
            let mut time = 0;
            let mut send = |input: &mut timely::dataflow::InputHandle<u64, _>, key: u8, value: u8| {
                time += 1;
                input.send(((key, value, time as u16), time, 1));
                input.advance_to(time + 1);
                while probe.less_than(&(time + 1)) {
                    worker.step();
                }
            };
            send(&mut input, 0, 5);
            send(&mut input, 0, 7);
            send(&mut input, 1, 1);
            // Key 1 read every 0.5 s for 2.5 s; key 0 left alone.
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(500));
                send(&mut input, 1, 0);
            }
            std::thread::sleep(Duration::from_millis(500));
            send(&mut input, 0, 2);
            send(&mut input, 1, 1);
            drop(input);
            while worker.step() {}
            let seen = seen.borrow().clone();
            (seen, expired.get())
        })
    };
    // Each key's sum after its last write.
    let last = |seen: &[(Sum, i64)], key: u8| {
        seen.iter().rev().find(|((k, _, read), d)| *k == key && !read && *d > 0).map(|((_, s, _), _)| *s)
    };
    let (seen, expired) = run(Refresh::OnWrite);
    assert_eq!(last(&seen, 0), Some(2), "key 0 expired after 3 s untouched: {seen:?}");
    assert_eq!(last(&seen, 1), Some(1), "reads do not refresh: {seen:?}");
    assert_eq!(expired, 2);
    // The reads saw the state until it expired.
    assert!(seen.iter().any(|((k, s, read), _)| *k == 1 && *s == 1 && *read), "{seen:?}");
    let (seen, expired) = run(Refresh::OnReadAndWrite);
    assert_eq!(last(&seen, 0), Some(2), "{seen:?}");
    assert_eq!(last(&seen, 1), Some(2), "reads refresh: {seen:?}");
    assert_eq!(expired, 1);
    // Silent: nothing is retracted by the expiry itself.
    assert_eq!(seen.iter().filter(|((k, s, _), d)| *k == 0 && *s == 12 && *d < 0).count(), 0, "{seen:?}");
}
