//! State that always restores (issue 54).
//!
//! - Checkpoints written by the release before the self-describing state
//!   encoding (format 4, postcard; `tests/fixtures/checkpoint-format-4`,
//!   see its README) recover with today's build: the committed output of
//!   the recovered job equals an uninterrupted run's, on the memory backend
//!   and from RocksDB database files, on 1 and 3 workers.

#[path = "common/crash.rs"]
mod crash;

use std::path::{Path, PathBuf};
use std::process::Command;

use crash::{committed_parts, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");

/// The fixture `name` under `tests/fixtures/checkpoint-format-4`.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-format-4").join(name)
}

/// Copies the directory `from` to `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs `highwater nexmark` on `dir`'s checkpoints and output to the end;
/// returns its standard error.
fn run(dir: &Path, query: &str, events: u64, workers: usize, state: Option<&Path>) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--log",
        "highwater::checkpoint=info",
        "nexmark",
        "-q",
        query,
        "--events",
        &events.to_string(),
        "--rate-limit",
        "300000",
    ])
    .arg("--checkpoint-dir")
    .arg(dir.join("checkpoints"))
    .args(["--checkpoint-interval", "100ms", "--recover", "--output-dir"])
    .arg(dir.join("out"));
    if let Some(state) = state {
        cmd.args(["--state-backend", "rocksdb", "--state-dir"]).arg(state);
    }
    let out = cmd.args(["--", "-w", &workers.to_string()]).output().expect("running highwater");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{query} failed: {stderr}");
    stderr
}

/// Recovers the fixture `name` (a `query` over `events` events) on
/// `workers` workers and compares its committed output with an
/// uninterrupted run's.
fn recovers(name: &str, query: &str, events: u64, workers: usize, rocksdb: bool) {
    let scratch = Scratch::new("state-restores", &format!("{name}-{workers}"));
    let recovered = scratch.0.join("recovered");
    copy_dir(&fixture(name), &recovered);
    let before = committed_parts(&recovered.join("out"));
    let state = rocksdb.then(|| scratch.0.join("state"));
    let log = run(&recovered, query, events, workers, state.as_deref());
    assert!(log.contains("recovering from checkpoint"), "{name}: the job did not recover: {log}");
    // (A checkpoint begun after the one recovered from is a kill's leftover.)
    let warnings: Vec<&str> =
        log.lines().filter(|l| l.contains("WARN") && !l.contains("newer than the one recovered from")).collect();
    assert!(warnings.is_empty(), "{name}: warnings while recovering: {warnings:?}");

    let reference = scratch.0.join("reference");
    run(&reference, query, events, 2, None);
    let want = committed_parts(&reference.join("out"));
    let got = committed_parts(&recovered.join("out"));
    assert!(!want.is_empty(), "{name}: an empty reference makes a vacuous test");
    assert!(got.starts_with(&before), "{name}: the parts committed before the crash were changed");
    assert_eq!(got, want, "{name} recovered from a format-4 checkpoint differs from an uninterrupted run");
}

#[test]
fn format_4_checkpoints_of_windows_restore() {
    recovers("q5", "q5", 200_000, 1, false);
    recovers("q11", "q11", 200_000, 3, false);
}

#[test]
fn format_4_checkpoints_of_joins_and_collections_restore() {
    recovers("q8", "q8", 200_000, 3, false);
    recovers("q4", "q4", 60_000, 1, false);
}

#[test]
fn format_4_database_files_restore() {
    recovers("q11-rocksdb", "q11", 200_000, 2, true);
}

/// A state type whose `Deserialize` does not read what its `Serialize`
/// writes: a string written, a map asked for.
#[derive(Debug, Clone, PartialEq)]
struct Unreadable(String);

impl serde::Serialize for Unreadable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Unreadable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OnlyMaps;
        impl<'de> serde::de::Visitor<'de> for OnlyMaps {
            type Value = Unreadable;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Unreadable, A::Error> {
                Ok(Unreadable(String::new()))
            }
        }
        d.deserialize_any(OnlyMaps)
    }
}

/// Keeps the latest value per key in the state `S` made by `make`.
struct Latest<S>(fn(u64) -> S);

impl<S> highwater::operators::state::KeyedProcess<u8, (u8, u64)> for Latest<S>
where
    S: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    type State = S;
    type Output = (u8, u64);
    const SCHEMA: highwater::operators::state::Schema = highwater::operators::state::Schema::new("test.latest", 1);

    fn on_record(
        &self,
        ctx: &mut highwater::operators::state::KeyedContext<'_, u8, S, (u8, u64)>,
        (k, v): (u8, u64),
        time: highwater::Timestamp,
        _: i64,
    ) {
        *ctx.state_mut() = Some((self.0)(v));
        ctx.emit((k, v), time, 1);
    }
}

/// Runs 300 records through [`Latest`] on 2 workers with checkpoints in
/// `dir`; returns how the checkpoints finished.
fn run_latest<S>(dir: &Path, make: fn(u64) -> S) -> Result<bool, highwater::checkpoint::CheckpointError>
where
    S: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    use highwater::checkpoint::{CheckpointConfig, Checkpoints};
    use highwater::prelude::*;
    use std::sync::Arc;

    let mut config = CheckpointConfig::new(dir.display().to_string());
    config.interval = std::time::Duration::from_millis(20);
    let checkpoints = Checkpoints::open(config, 2).expect("opening the checkpoints");
    let ck = checkpoints.clone();
    let partitions: Vec<Vec<(u8, u64)>> =
        (0..2).map(|p| (0..150u64).map(|i| ((i % 5) as u8, i * 10 + p)).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    let mut timely_config = timely::Config::process(2);
    checkpoints.configure(&mut timely_config);
    let guards = timely::execute(timely_config, move |worker| {
        worker.dataflow::<highwater::Timestamp, _, _>(|scope| {
            let options = SourceOptions { idle_timeout: None, ..Default::default() };
            let events =
                read(scope, Arc::clone(&source), |e: &(u8, u64)| e.1, options, &SourceMetrics::default(), None)
                    .expect("reading")
                    .events;
            events.process_keyed("Latest", |e: &(u8, u64)| e.0, Latest(make));
        });
        ck.built(worker)
    })
    .expect("starting the workers");
    for built in guards.join() {
        built.expect("a worker panicked").expect("built");
    }
    checkpoints.finish()
}

#[test]
fn a_state_type_that_does_not_read_back_fails_the_first_checkpoint_naming_it() {
    let scratch = Scratch::new("state-restores", "unreadable");
    let error = run_latest(&scratch.0.join("bad"), |v| Unreadable(v.to_string()))
        .expect_err("a state that cannot be restored must not be checkpointed")
        .to_string();
    assert!(error.contains("Unreadable"), "names the type: {error}");
    assert!(error.contains("Latest"), "names the operator: {error}");
    assert!(error.contains("Deserialize does not read what its Serialize writes"), "says what to do: {error}");
    let written = std::fs::read_dir(scratch.0.join("bad"))
        .map(|d| d.flatten().filter(|e| e.path().join("MANIFEST").exists()).count())
        .unwrap_or(0);
    assert_eq!(written, 0, "no checkpoint of it was committed");

    // The same job over a `Decimal` and a `serde_json::Value` checkpoints.
    let decimal = run_latest(&scratch.0.join("decimal"), |v| rust_decimal::Decimal::new(v as i64, 2));
    assert!(decimal.is_ok(), "{decimal:?}");
    let json = run_latest(&scratch.0.join("json"), |v| serde_json::json!({"v": v, "tags": ["a", v % 3]}));
    assert!(json.is_ok(), "{json:?}");
}
