//! A job-wide state time-to-live (`Job::state_ttl`, issue 35): the
//! operators whose state no watermark releases and that are given no TTL
//! of their own (the unwindowed join, upsert tables, aggregations by key,
//! user keyed processes) take the job's, on two workers: their results are
//! those of the same operators given the TTL explicitly (each tested
//! against a model in highwater-operators' `state_ttl` tests), differ from
//! the results without one, and what expired is counted in the job's
//! totals under each operator's name.

use std::collections::BTreeMap;
use std::sync::Arc;

use highwater::operators::state::{Expiry, KeyedContext, KeyedProcess, Schema, StateTtl};
use highwater::prelude::*;
use highwater::source::MemorySource;
use highwater::{Job, Timestamp};

/// `(side, key, value, event time)`.
type Rec = (u8, u8, u8, u64);

const TTL: u64 = 500;

/// Two partitions of records 5 ms apart in event time; key `k` is quiet
/// one 2 s stretch in three, so that its state expires and starts afresh.
fn partitions() -> Vec<Vec<Rec>> {
    let mut parts = vec![Vec::new(), Vec::new()];
    for i in 0..4_000u64 {
        let time = i * 5;
        let key = (i * 7_919 % 13) as u8;
        if (time / 2_000 + u64::from(key)) % 3 == 0 {
            continue;
        }
        parts[(i % 2) as usize].push(((i % 3 == 0) as u8, key, (i % 5) as u8, time));
    }
    parts
}

/// Sums per key, each write retracting the previous sum; an expiry retracts
/// the sum.
struct Sums;

impl KeyedProcess<u8, Rec> for Sums {
    type State = u64;
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.job_sums", 1);

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, u64, (u8, u64)>, r: Rec, t: Timestamp, _d: i64) {
        let before = ctx.state().copied();
        if let Some(sum) = before {
            ctx.emit((r.1, sum), t, -1);
        }
        let after = before.unwrap_or(0) + u64::from(r.2);
        *ctx.state_mut() = Some(after);
        ctx.emit((r.1, after), t, 1);
    }

    fn on_expire(&self, ctx: &mut KeyedContext<'_, u8, u64, (u8, u64)>, at: Timestamp) {
        let (k, sum) = (*ctx.key(), *ctx.state().expect("an expiring key has a state"));
        ctx.emit((k, sum), at, -1);
    }
}

/// A result row of any of the four operators, tagged by operator.
type Row = (u8, u8, u64, u64);

/// The operators' tags in a [`Row`].
const OPERATORS: [(&str, u8); 4] = [("count", 0), ("sums", 1), ("table", 2), ("join", 3)];

/// Each operator's consolidated results (`(operator, key, value, time)`),
/// with and without an explicit TTL, and the job's totals.
struct Outcome {
    default: BTreeMap<Row, i64>,
    explicit: BTreeMap<Row, i64>,
    totals: BTreeMap<String, u64>,
}

fn run(job_ttl: Option<StateTtl>) -> Outcome {
    let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
    let source = Arc::new(MemorySource::new(partitions()));
    let (default, explicit) = (Collected::<Row>::default(), Collected::<Row>::default());
    let (default_sink, explicit_sink) = (default.clone(), explicit.clone());
    let mut job = Job::new(timely::Config::process(2));
    if let Some(job_ttl) = job_ttl {
        job = job.state_ttl(job_ttl);
    }
    let report = job
        .run(move |worker| -> Result<(), String> {
            let (source, default, explicit) = (Arc::clone(&source), default_sink.clone(), explicit_sink.clone());
            worker.dataflow::<Timestamp, _, _>(move |scope| {
                let read = FromSource::new(source, |r: &Rec| r.3).build(scope).map_err(|e| e.to_string())?;
                let events = read.events;
                let left = events.filter(|r: &Rec| r.0 == 0);
                let right = events.filter(|r: &Rec| r.0 == 1);
                let upserts = events.map(|r: Rec| (r.1, Some(r.2)));
                let tag = |name: u8| move |(k, v): (u8, u64)| (name, k, v, 0u64);
                // Without a TTL of their own: the job's, if it has one.
                let rows = events
                    .aggregate_by_key(|r: &Rec| r.1, Count)
                    .map(tag(0))
                    .concat(&events.process_keyed("Sums", |r: &Rec| r.1, Sums).map(tag(1)))
                    .concat(&upserts.upsert().table.changelog().map(|(k, v): (u8, u8)| (2, k, u64::from(v), 0)))
                    .concat(&left.join(&right, |l| l.1, |r| r.1, |l, r| (3, l.1, l.3 * 100_000 + r.3, 0)));
                collect(&rows, &default);
                // The same operators with the TTL given explicitly.
                let rows = events
                    .state_ttl(ttl)
                    .aggregate_by_key_named("ExplicitCount", |r: &Rec| r.1, Count)
                    .results
                    .map(tag(0))
                    .concat(
                        &events.state_ttl(ttl).process_keyed("ExplicitSums", |r: &Rec| r.1, Sums).results.map(tag(1)),
                    )
                    .concat(
                        &upserts
                            .state_ttl(ttl)
                            .upsert()
                            .table
                            .changelog()
                            .map(|(k, v): (u8, u8)| (2, k, u64::from(v), 0)),
                    )
                    .concat(
                        &left
                            .state_ttl(ttl)
                            .join(&right, |l| l.1, |r| r.1, |l, r| (3, l.1, l.3 * 100_000 + r.3, 0))
                            .results,
                    );
                collect(&rows, &explicit);
                Ok::<_, String>(())
            })
        })
        .expect("the job runs");
    let by_time = |c: &Collected<Row>| {
        let mut out = BTreeMap::new();
        for ((name, k, v, _), t, d) in c.updates() {
            *out.entry((name, k, v, t)).or_insert(0) += d;
        }
        out.retain(|_, d| *d != 0);
        out
    };
    Outcome { default: by_time(&default), explicit: by_time(&explicit), totals: report.totals }
}

#[test]
fn operators_without_a_ttl_of_their_own_take_the_jobs() {
    let ttl = StateTtl::event_time(TTL).expiry(Expiry::Retract);
    let with = run(Some(ttl));
    for (name, tag) in OPERATORS {
        let of = |m: &BTreeMap<Row, i64>| m.keys().filter(|r| r.0 == tag).count();
        assert!(of(&with.explicit) > 0, "{name}: no results");
        assert_eq!(of(&with.default), of(&with.explicit), "{name}");
    }
    assert_eq!(with.default, with.explicit);
    // Expired entries, counted per operator; the tables are both "Upsert".
    let total = |name: &str| with.totals.get(name).copied().unwrap_or(0);
    assert!(total("ExplicitCount.expired") > 0, "{:?}", with.totals);
    assert_eq!(total("AggregateByKey.expired"), total("ExplicitCount.expired"), "{:?}", with.totals);
    assert!(total("Sums.expired") > 0, "{:?}", with.totals);
    assert_eq!(total("Sums.expired"), total("ExplicitSums.expired"), "{:?}", with.totals);
    // A table forgets a key in its compaction, as the watermark advances in
    // steps that depend on the run: counted, but not a fixed number.
    assert!(with.totals.contains_key("Upsert.expired"), "{:?}", with.totals);
    assert!(total("Join.expired") > 0, "{:?}", with.totals);

    // Without the job's TTL the same operators keep everything.
    let without = run(None);
    assert_eq!(without.explicit, with.explicit);
    assert_ne!(without.default, with.default);
    assert_eq!(without.totals.get("AggregateByKey.expired"), None, "{:?}", without.totals);
}
