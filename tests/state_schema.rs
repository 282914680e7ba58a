//! Versioned operator state through the real checkpoint runtime: a job's
//! checkpoint records each operator's state schema in its manifest; the same
//! job with a newer schema and no migration is refused when its dataflow is
//! built, with an error naming the operator, the checkpoint and both
//! versions; with a migration it restores.

use std::path::Path;
use std::sync::Arc;

use highwater::checkpoint::{latest_usable, CheckpointConfig, CheckpointError, Checkpoints, LocalStore};
use highwater::operators::state::{KeyedContext, KeyedProcess, Schema, StateError};
use highwater::prelude::*;

/// Version 1: a running count per key.
struct CountV1;

impl KeyedProcess<u8, (u8, u64)> for CountV1 {
    type State = u64;
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.count", 1);

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, u64, (u8, u64)>, (k, _): (u8, u64), time: Timestamp, _: i64) {
        let n = ctx.state_or_insert_with(|| 0);
        *n += 1;
        let n = *n;
        ctx.emit((k, n), time, 1);
    }
}

/// Version 2: the count and the latest time, migrating from v1 if `MIGRATES`.
struct CountV2<const MIGRATES: bool>;

impl<const MIGRATES: bool> KeyedProcess<u8, (u8, u64)> for CountV2<MIGRATES> {
    type State = (u64, Timestamp);
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.count", 2);
    const MIGRATES_FROM: &'static [u32] = if MIGRATES { &[1] } else { &[] };

    fn on_record(
        &self,
        ctx: &mut KeyedContext<'_, u8, (u64, Timestamp), (u8, u64)>,
        (k, _): (u8, u64),
        t: Timestamp,
        _: i64,
    ) {
        let (n, latest) = ctx.state_or_insert_with(|| (0, 0));
        *n += 1;
        *latest = (*latest).max(t);
        let n = *n;
        ctx.emit((k, n), t, 1);
    }

    fn migrate(_version: u32, bytes: &[u8]) -> Result<(u64, Timestamp), StateError> {
        let n: u64 = highwater::operators::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: Schema::new("test.count", 1), reason: e.to_string() })?;
        Ok((n, 0))
    }
}

/// Runs the job over 300 records on 2 workers with checkpoints in `dir`
/// (recovering from them if `recover`), counting with `process`; returns what
/// `built` said on each worker, and `finish`'s result.
fn run<P>(
    dir: &Path,
    recover: bool,
    process: fn() -> P,
) -> (Vec<Result<(), CheckpointError>>, Result<bool, CheckpointError>)
where
    P: KeyedProcess<u8, (u8, u64), Output = (u8, u64)>,
{
    let mut config = CheckpointConfig::new(dir.display().to_string());
    config.recover = recover;
    config.interval = std::time::Duration::from_millis(50);
    let checkpoints = Checkpoints::open(config, 2).expect("opening the checkpoints");
    let ck = checkpoints.clone();
    let partitions: Vec<Vec<(u8, u64)>> =
        (0..2).map(|p| (0..150u64).map(|i| ((i % 5) as u8, i * 10 + p)).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    let mut timely_config = timely::Config::process(2);
    checkpoints.configure(&mut timely_config);
    let guards = timely::execute(timely_config, move |worker| {
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let options = SourceOptions { idle_timeout: None, ..Default::default() };
            let events =
                read(scope, Arc::clone(&source), |e: &(u8, u64)| e.1, options, &SourceMetrics::default(), None)
                    .expect("reading")
                    .events;
            events.process_keyed("Count", |e: &(u8, u64)| e.0, process());
        });
        ck.built(worker)
    })
    .expect("starting the workers");
    let built = guards.join().into_iter().map(|r| r.expect("a worker panicked")).collect();
    (built, checkpoints.finish())
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("highwater-state-schema-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_checkpoint_of_schema_v1_is_refused_by_v2_without_a_migration() {
    let dir = scratch("refused");
    let (built, finished) = run(&dir, false, || CountV1);
    assert!(built.iter().all(Result::is_ok), "{built:?}");
    assert!(finished.expect("the first run checkpoints"), "the first run writes its final checkpoint");
    let (manifest, _) = latest_usable(&LocalStore::open(dir.clone()).unwrap()).unwrap().expect("a checkpoint");
    let recorded: Vec<String> = manifest.schemas.values().map(ToString::to_string).collect();
    assert_eq!(recorded, vec!["state schema test.count v1"], "the manifest records the schema");

    let (built, finished) = run(&dir, true, || CountV2::<false>);
    let error = built.iter().find_map(|r| r.as_ref().err()).expect("the v2 job is refused").to_string();
    assert!(error.contains("operator Count@"), "names the operator: {error}");
    assert!(error.contains(&format!("checkpoint {}", manifest.id)), "names the checkpoint: {error}");
    assert!(error.contains("state schema test.count v1") && error.contains("state schema test.count v2"), "{error}");
    assert!(finished.is_err(), "the refused job fails");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_of_schema_v1_restores_into_v2_with_a_migration() {
    let dir = scratch("migrated");
    let (built, finished) = run(&dir, false, || CountV1);
    assert!(built.iter().all(Result::is_ok) && finished.is_ok(), "{built:?}");
    let (built, finished) = run(&dir, true, || CountV2::<true>);
    assert!(built.iter().all(Result::is_ok), "{built:?}");
    assert!(finished.is_ok(), "{finished:?}");
    let (manifest, _) = latest_usable(&LocalStore::open(dir.clone()).unwrap()).unwrap().expect("a checkpoint");
    let recorded: Vec<String> = manifest.schemas.values().map(ToString::to_string).collect();
    assert_eq!(recorded, vec!["state schema test.count v2"], "checkpoints go on under the new schema");
    let _ = std::fs::remove_dir_all(&dir);
}
