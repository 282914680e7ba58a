//! The keyed operators on both state backends: the same results whether
//! their state is a hash map or encoded bytes behind a write-back cache
//! ([`Backend::Encoded`], the access pattern of an on-disk store), and
//! checkpoints taken on one backend restore on the other.
//!
//! Each case runs an operator uninterrupted and checkpointed at a random
//! cut on one backend, recovers it on the other (on another number of
//! workers), and compares: the recovered output with the uninterrupted one,
//! and the uninterrupted outputs of both backends with each other.
//!
//! The whole operators suite also runs on the encoded backend in CI
//! (`HIGHWATER_STATE_BACKEND=encoded`, see scripts/test.sh); this file holds
//! what that run cannot: the two backends in one test, and a failing backend.

use highwater_operators::cep::Pattern;
use highwater_operators::checkpoint::memory::{check_recovery_across, Input, MemoryStore, Output};
use highwater_operators::join::between;
use highwater_operators::key::Data;
use highwater_operators::prelude::*;
use highwater_operators::state::{Backend, KeyedContext, KeyedProcess, Schema};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// (key, value).
type Rec = (u8, i64);

/// Insertions of 3 keys at event times in [0, 600), most on time (arriving
/// up to 80 ms before their time), one in ten later than the allowed
/// lateness (40 ms); a fifth taken back by a retraction that arrives later,
/// still on time. Nothing arrives after its time but within the lateness:
/// such a record takes a path that depends on how far an operator has got
/// (a correction, or a part of the first result), so its results' times
/// would depend on scheduling, whatever the backend (see
/// checkpoint_stateful.rs).
fn changelog() -> impl Strategy<Value = Vec<Input<Rec>>> {
    let update = (0u8..3, 0i64..6, 0u64..600, 0u64..80, 0u32..10);
    prop::collection::vec(update, 1..70).prop_map(|raw| {
        let mut out = Vec::new();
        for (k, v, time, skew, kind) in raw {
            let arrival = if kind == 0 { time + 41 + skew } else { time.saturating_sub(skew) };
            out.push(((k, v), time, 1, arrival));
            if kind <= 2 && arrival < time {
                out.push(((k, v), time, -1, arrival + (time - arrival) / 2));
            }
        }
        out
    })
}

/// Insertions only (for the operators that take no retractions by design).
fn insertions() -> impl Strategy<Value = Vec<Input<Rec>>> {
    changelog().prop_map(|c| c.into_iter().filter(|u| u.2 > 0).collect())
}

/// The operators under test, each as a dataflow from records to printable
/// results (late records included, where the operator has a late output).
#[derive(Clone, Copy, Debug)]
enum Op {
    Session,
    Count,
    Global,
    Interval,
    ByKey,
    Upsert,
    AsOf,
    Cep,
    Process,
}

const OPS: [Op; 9] =
    [Op::Session, Op::Count, Op::Global, Op::Interval, Op::ByKey, Op::Upsert, Op::AsOf, Op::Cep, Op::Process];

/// A running sum per key that reports every change, and once 50 ms of event
/// time pass without a record.
struct Totals;

impl KeyedProcess<u8, Rec> for Totals {
    type State = i64;
    type Output = String;
    const SCHEMA: Schema = Schema::new("test.totals", 1);

    fn on_record(&self, cx: &mut KeyedContext<'_, u8, i64, String>, record: Rec, time: Timestamp, diff: i64) {
        let total = cx.state_or_insert_with(|| 0);
        *total += record.1 * diff;
        let total = *total;
        cx.emit(format!("{} at {time}: {total}", record.0), time, 1);
        cx.schedule(time + 50);
    }

    fn on_timer(&self, cx: &mut KeyedContext<'_, u8, i64, String>, time: Timestamp) {
        cx.cancel(time);
        if cx.timers().iter().all(|t| *t <= time) {
            let quiet = format!("{} quiet at {time}: {:?}", cx.key(), cx.state());
            cx.emit(quiet, time, 1);
        }
    }
}

fn build<'s>(op: Op, events: &EventStream<'s, Rec>) -> EventStream<'s, String> {
    fn show<'s, T: Data>(s: &EventStream<'s, T>) -> EventStream<'s, String> {
        s.map(|x| format!("{x:?}"))
    }
    fn windowed<'s, W: WindowSpec<Rec>>(events: &EventStream<'s, Rec>, spec: W) -> EventStream<'s, String> {
        let w =
            events.window(spec).key_by(|r: &Rec| r.0).allowed_lateness(40).aggregate((Count, Sum::of(|r: &Rec| r.1)));
        show(&w.results).concat(&show(&w.late.stream))
    }
    match op {
        Op::Session => windowed(events, Session::with_gap(30)),
        Op::Count => windowed(events, CountWindows::sliding(3, 2)),
        Op::Global => windowed(events, GlobalWindows::with_trigger(CountTrigger(2).purging())),
        Op::Interval => {
            let left = events.filter(|r: &Rec| r.1 % 2 == 0);
            let right = events.filter(|r: &Rec| r.1 % 2 == 1);
            let joined = left.allowed_lateness(40).interval_join(
                &right,
                |l: &Rec| l.0,
                |r: &Rec| r.0,
                between(-10, 20),
                |l, r| (l.0, l.1, r.1),
            );
            show(&joined.results).concat(&show(&joined.late_left.stream)).concat(&show(&joined.late_right.stream))
        }
        Op::ByKey => {
            show(&events.aggregate_by_key(|r: &Rec| r.0, (Sum::of(|r: &Rec| r.1), TopK::of(2, |r: &Rec| r.1))))
        }
        Op::Upsert => {
            let upserted = events.map(|(k, v)| (k, (v != 0).then_some(v))).allowed_lateness(40).upsert();
            show(&upserted.table.changelog()).concat(&show(&upserted.late.stream))
        }
        Op::AsOf => {
            let table =
                events.filter(|r: &Rec| r.1 % 2 == 0).map(|(k, v)| (k, Some(v))).allowed_lateness(40).upsert().table;
            let joined = events.filter(|r: &Rec| r.1 % 2 == 1).allowed_lateness(40).left_join_as_of(&table, |e| e.0);
            show(&joined.results).concat(&show(&joined.late.stream))
        }
        Op::Cep => {
            let pattern = Pattern::begin("a")
                .where_(|r: &Rec| r.1 % 2 == 0)
                .one_or_more()
                .followed_by("b")
                .where_(|r: &Rec| r.1 % 2 == 1)
                .within(60);
            let found = events.match_pattern(|r| r.0, pattern).expect("the pattern is valid");
            show(&found.matches).concat(&show(&found.timeouts)).concat(&show(&found.late.stream))
        }
        Op::Process => events.process_keyed("Totals", |r: &Rec| r.0, Totals),
    }
}

/// `op` over `input`: from `from` to `to` at `cut`; returns the uninterrupted output.
fn across(
    op: Op,
    input: &[Input<Rec>],
    cut: u64,
    workers: (usize, usize),
    backends: (Backend, Backend),
) -> Result<Output<String>, TestCaseError> {
    let run = check_recovery_across(input, cut, workers, backends.clone(), move |events| build(op, events));
    prop_assert!(run.failures.is_empty(), "{op:?} {backends:?}: {:?}", run.failures);
    prop_assert!(run.unsupported.is_empty(), "{op:?}: {:?}", run.unsupported);
    prop_assert_eq!(&run.recovered, &run.expected, "{:?} recovered {:?}", op, backends);
    Ok(run.expected)
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn operators_give_the_same_results_on_both_backends_and_recover_across_them(
        changes in changelog(),
        inserts in insertions(),
        cut in 1u64..600,
        workers in workers(),
    ) {
        for op in OPS {
            // CEP and the as-of join's events take insertions (a retraction is late to them).
            let input = if matches!(op, Op::Cep | Op::Process) { &inserts } else { &changes };
            let memory = across(op, input, cut, workers, (Backend::Memory, Backend::Encoded))?;
            let encoded = across(op, input, cut, workers, (Backend::Encoded, Backend::Memory))?;
            prop_assert_eq!(&memory, &encoded, "{:?}: memory and encoded differ", op);
            #[cfg(feature = "rocksdb")]
            {
                // Checkpointed on RocksDB, recovered in memory, and back.
                let on_rocksdb = across(op, input, cut, workers, (rocksdb(), Backend::Memory))?;
                prop_assert_eq!(&memory, &on_rocksdb, "{:?}: memory and rocksdb differ", op);
                let back = across(op, input, cut, workers, (Backend::Memory, rocksdb()))?;
                prop_assert_eq!(&memory, &back, "{:?}: memory and rocksdb differ", op);
            }
        }
    }
}

/// The RocksDB backend, under the temporary directory, with a small cache.
#[cfg(feature = "rocksdb")]
fn rocksdb() -> Backend {
    use highwater_operators::state::RocksDbConfig;
    Backend::RocksDb(RocksDbConfig::new(std::env::temp_dir().join("highwater-state-tests")).cache(16 << 20))
}

/// A state whose encoding fails for large values.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
struct Fragile(i64);

impl serde::Serialize for Fragile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 > 100 {
            return Err(serde::ser::Error::custom(format!("{} is too large to encode", self.0)));
        }
        s.serialize_i64(self.0)
    }
}

/// Sums per key into a [`Fragile`] state.
struct FragileSums;

impl KeyedProcess<u8, Rec> for FragileSums {
    type State = Fragile;
    type Output = i64;
    const SCHEMA: Schema = Schema::new("test.fragile", 1);

    fn on_record(&self, cx: &mut KeyedContext<'_, u8, Fragile, i64>, record: Rec, time: Timestamp, _diff: i64) {
        let total = cx.state_or_insert_with(|| Fragile(0));
        total.0 += record.1;
        let total = total.0;
        cx.emit(total, time, 1);
    }
}

/// Runs [`FragileSums`] on `backend` (if `None`, the environment's) with checkpoints, over values that
/// pass the encoder's limit; returns the output and the failures the
/// checkpoint runtime was told of.
fn fragile(backend: Option<Backend>) -> (Vec<i64>, Vec<String>) {
    let store = MemoryStore::new(1, None);
    let mut config = timely::Config::thread();
    store.configure(&mut config);
    if let Some(backend) = backend {
        backend.configure(&mut config.worker);
    }
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&out);
    timely::execute(config, move |worker| {
        use timely::dataflow::operators::{Inspect, ToStream};
        let sink = std::sync::Arc::clone(&sink);
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let records: Vec<(Rec, Timestamp, i64)> = (0..6u64).map(|i| ((1u8, 30i64), i * 10, 1)).collect();
            EventStream::new(records.to_stream(scope))
                .process_keyed("Fragile", |r: &Rec| r.0, FragileSums)
                .inner
                .inspect(move |(total, _t, _d)| sink.lock().expect("unpoisoned").push(*total));
        });
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .for_each(|r| r.expect("the worker finishes"));
    let totals = out.lock().expect("unpoisoned").clone();
    (totals, store.failures())
}

#[test]
fn a_state_that_does_not_encode_on_the_backend_fails_the_checkpointing_naming_the_operator() {
    // In memory nothing is encoded until a checkpoint is taken: no failure.
    let (totals, failures) = fragile(Some(Backend::Memory));
    assert_eq!(totals, vec![30, 60, 90, 120, 150, 180]);
    assert!(failures.is_empty(), "{failures:?}");
    // The encoded backend writes the state back after every activation: the
    // first total past 100 does not encode. Nothing is lost: the value stays
    // in the cache, the output is the same, and the job's checkpointing fails
    // once, naming the operator and its schema.
    let (totals, failures) = fragile(Some(Backend::Encoded));
    assert_eq!(totals, vec![30, 60, 90, 120, 150, 180]);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("Fragile"), "{failures:?}");
    assert!(failures[0].contains("the state backend of state schema test.fragile v1 failed"), "{failures:?}");
    assert!(failures[0].contains("does not encode"), "{failures:?}");
    // RocksDB likewise.
    #[cfg(feature = "rocksdb")]
    {
        let (totals, failures) = fragile(Some(rocksdb()));
        assert_eq!(totals, vec![30, 60, 90, 120, 150, 180]);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("the state backend of state schema test.fragile v1 failed"), "{failures:?}");
        assert!(failures[0].contains("does not encode"), "{failures:?}");
    }
}

/// A RocksDB backend whose directory cannot be made fails the job's
/// checkpointing with the reason, naming the operator's schema; the
/// operator still works, in memory.
#[cfg(feature = "rocksdb")]
#[test]
fn a_rocksdb_backend_that_does_not_open_fails_the_checkpointing() {
    use highwater_operators::state::RocksDbConfig;
    let file = std::env::temp_dir().join(format!("highwater-state-not-a-dir-{}", std::process::id()));
    std::fs::write(&file, b"x").expect("writes");
    let (totals, failures) = fragile(Some(Backend::RocksDb(RocksDbConfig::new(file.join("state")))));
    let _ = std::fs::remove_file(&file);
    assert_eq!(totals, vec![30, 60, 90, 120, 150, 180]);
    assert!(!failures.is_empty());
    assert!(failures[0].contains("cannot make the state directory"), "{failures:?}");
    assert!(failures[0].contains("test.fragile"), "{failures:?}");
}

#[test]
fn a_keyed_process_fires_timers_before_records_that_arrive_after_them_whatever_the_cut() {
    // Key 0's record at 68 sets a timer at 118; its record at 236 arrives at
    // 230, after the timer's time. The timer fires first (the key is quiet:
    // its only timer), whether the watermark passes 118 long before the
    // second record comes (a checkpoint cut at 151 holds it there) or in the
    // same activation (uninterrupted): the same output either way.
    let input = vec![((0u8, 4i64), 236, 1, 230), ((0, 4), 68, 1, 0), ((2, 3), 375, 1, 385)];
    for workers in [(1, 1), (2, 2), (1, 2)] {
        let run =
            highwater_operators::checkpoint::memory::check_recovery(&input, 151, workers.0, workers.1, |events| {
                events.process_keyed("Totals", |r: &Rec| r.0, Totals)
            });
        let expected: Output<String> = [
            (("0 at 68: 4".to_owned(), 0), 1),
            (("0 quiet at 118: Some(4)".to_owned(), 118), 1),
            (("0 at 236: 8".to_owned(), 230), 1),
            (("0 quiet at 286: Some(8)".to_owned(), 286), 1),
            (("2 at 375: 3".to_owned(), 385), 1),
            (("2 quiet at 425: Some(3)".to_owned(), 425), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(run.expected, expected, "{workers:?}");
        assert_eq!(run.recovered, expected, "{workers:?}");
    }
}

#[test]
fn the_environment_chooses_the_backend_of_a_computation_configured_without_one() {
    // What CI's second run of this suite relies on: with
    // HIGHWATER_STATE_BACKEND=encoded every operator's state is encoded.
    // HIGHWATER_STATE_BACKEND=rocksdb, on RocksDB.
    let name = std::env::var(highwater_operators::state::BACKEND_ENV).unwrap_or_default();
    let (totals, failures) = fragile(None);
    assert_eq!(totals, vec![30, 60, 90, 120, 150, 180]);
    let on_bytes = name == "encoded" || (cfg!(feature = "rocksdb") && name == "rocksdb");
    assert_eq!(failures.len(), usize::from(on_bytes), "{failures:?}");
    let config = timely::WorkerConfig::default();
    let expected = if on_bytes { name.as_str() } else { "memory" };
    assert_eq!(Backend::of_config(&config).name(), expected);
}

#[test]
fn a_keyed_process_timer_at_the_cut_fires_in_the_recovered_job() {
    // The record at 400 (arriving at 355) sets a timer at 450, the time of
    // the cut: the watermark stops at 450 for the cut, which a timer at 450
    // is not due at (it waits for the watermark to pass it), so the
    // checkpoint keeps it and the recovered job fires it, at 450.
    let input = vec![((0u8, 0i64), 400, 1, 355)];
    for workers in [(1, 1), (1, 2), (2, 1)] {
        let run =
            highwater_operators::checkpoint::memory::check_recovery(&input, 450, workers.0, workers.1, |events| {
                events.process_keyed("Totals", |r: &Rec| r.0, Totals)
            });
        let expected: Output<String> =
            [(("0 at 400: 0".to_owned(), 355), 1), (("0 quiet at 450: Some(0)".to_owned(), 450), 1)]
                .into_iter()
                .collect();
        assert_eq!(run.expected, expected, "{workers:?}");
        assert_eq!(run.recovered, expected, "{workers:?}");
    }
}
