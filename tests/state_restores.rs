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
    // A job killed before its first commit has an empty output directory,
    // which git does not keep.
    std::fs::create_dir_all(recovered.join("out")).unwrap();
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

/// Runs this test binary again as process `process` of a two-process job
/// (`child_job` below), with `kind` its records; returns the child.
fn start_process(kind: &str, process: usize, hosts: &Path, log: &Path) -> std::process::Child {
    crash::start_child_job("STATE_RESTORES_CHILD", &format!("{kind};{process};{}", hosts.display()), log)
}

/// Free loopback ports for two processes.
fn two_ports() -> [u16; 2] {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    [a.local_addr().unwrap().port(), b.local_addr().unwrap().port()]
}

/// Waits for `child` at most `secs` seconds (then kills it); its exit status.
fn wait(child: &mut std::process::Child, secs: u64) -> Option<std::process::ExitStatus> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Runs the two-process job with records of `kind` (`cents`: `i64`,
/// `decimal`: `Decimal`); returns each process's exit status and log.
fn two_processes(kind: &str) -> Vec<(Option<std::process::ExitStatus>, String)> {
    let scratch = Scratch::new("state-restores", &format!("exchange-{kind}"));
    let [a, b] = two_ports();
    let hosts = scratch.0.join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{a}\n127.0.0.1:{b}\n")).unwrap();
    let logs = [scratch.0.join("p0.log"), scratch.0.join("p1.log")];
    let mut children: Vec<_> = (0..2).map(|p| start_process(kind, p, &hosts, &logs[p])).collect();
    let statuses: Vec<_> = children.iter_mut().map(|c| wait(c, 60)).collect();
    statuses.into_iter().zip(&logs).map(|(s, log)| (s, std::fs::read_to_string(log).unwrap_or_default())).collect()
}

#[test]
fn records_bincode_cannot_read_are_refused_across_processes_naming_the_type() {
    let mut windows = 0;
    for (status, log) in two_processes("cents") {
        assert!(status.is_some_and(|s| s.success()), "i64 records cross processes: {log}");
        let n = log.lines().find_map(|l| l.strip_prefix("windows summed: ")).expect("the child's count");
        windows += n.trim().parse::<usize>().unwrap();
    }
    assert_eq!(windows, 40, "4 windows of 10 keys, each once over the processes");
    let runs = two_processes("decimal");
    for (status, log) in &runs {
        assert!(!status.is_some_and(|s| s.success()), "a job exchanging Decimal records must not run: {log}");
    }
    let refused = runs
        .iter()
        .find(|(_, log)| log.contains("cannot be sent to another process"))
        .unwrap_or_else(|| panic!("no process said why: {runs:?}"));
    assert!(
        refused.1.contains("Decimal") && refused.1.contains("-n 1"),
        "names the type and what to do: {}",
        refused.1
    );
}

/// A process of the two-process job of [`two_processes`]: 40 records per
/// worker over 10 keys, summed per key in 1 s windows, each record's amount
/// an `i64` (`cents`) or a `Decimal`.
#[test]
#[ignore = "run by the tests above as a child process"]
fn child_job() {
    use highwater::prelude::*;
    use std::sync::Arc;

    let spec = std::env::var("STATE_RESTORES_CHILD").expect("the child's spec");
    let mut parts = spec.splitn(3, ';');
    let (kind, process, hosts) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let args: Vec<String> = ["child", "--", "-w", "1", "-n", "2", "-p", process, "-h", hosts].map(String::from).into();
    let job = highwater::Job::from_args(&args).expect("the layout");
    let windows = Collected::default();
    let sink = windows.clone();
    let kind = kind.to_owned();
    let report = job.run(move |worker| {
        let (kind, sink) = (kind.clone(), sink.clone());
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let partitions: Vec<Vec<(u32, i64, u64)>> = (0..2u64)
                .map(|p| (0..40u64).map(|i| ((i % 10) as u32, (i * 7 + p) as i64, i * 100 + p)).collect())
                .collect();
            let options = SourceOptions::default();
            if kind == "decimal" {
                let partitions = partitions
                    .into_iter()
                    .map(|p| p.into_iter().map(|(k, c, t)| (k, rust_decimal::Decimal::new(c, 2), t)).collect())
                    .collect();
                let source = Arc::new(MemorySource::new(partitions));
                let events = read(
                    scope,
                    source,
                    |r: &(u32, rust_decimal::Decimal, u64)| r.2,
                    options,
                    &SourceMetrics::default(),
                    None,
                )?;
                let sums = events
                    .events
                    .key_by(|r: &(u32, rust_decimal::Decimal, u64)| r.0)
                    .window(Tumbling::of(1000))
                    .aggregate(Sum::of(|r: &(u32, rust_decimal::Decimal, u64)| r.1));
                collect(&sums.results.map(|r| r.key), &sink);
            } else {
                let source = Arc::new(MemorySource::new(partitions));
                let events = read(scope, source, |r: &(u32, i64, u64)| r.2, options, &SourceMetrics::default(), None)?;
                let sums = events
                    .events
                    .key_by(|r: &(u32, i64, u64)| r.0)
                    .window(Tumbling::of(1000))
                    .aggregate(Sum::of(|r: &(u32, i64, u64)| r.1));
                collect(&sums.results.map(|r| r.key), &sink);
            }
            Ok(())
        })
    });
    match report {
        Ok(_) => eprintln!("windows summed: {}", windows.rows().len()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// Runs the child job `kind` (see [`recovery_child`]) in `dir` on
/// `workers` workers, with `HIGHWATER_KILL_AT=kill` if given; its exit
/// status and log.
fn recovery_run(kind: &str, dir: &Path, workers: usize, kill: Option<&str>) -> (std::process::ExitStatus, String) {
    let log = dir.join(format!("log-{}", kill.unwrap_or("end").replace(':', "-")));
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["recovery_child", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("STATE_RESTORES_RECOVERY", format!("{kind};{workers};{}", dir.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(kill) = kill {
        cmd.env("HIGHWATER_KILL_AT", kill);
    }
    let status = cmd.status().unwrap();
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// Killed (SIGKILL, at a kill point) mid-run and started again on
/// `workers_after` workers, the job `kind` commits exactly an uninterrupted
/// run's rows.
fn survives_a_kill(kind: &str, kill: &str, workers_after: usize) {
    let scratch = Scratch::new("state-restores", &format!("kill-{kind}-{workers_after}"));
    let reference = scratch.0.join("reference");
    let (status, log) = recovery_run(kind, &reference, 2, None);
    assert!(status.success(), "{kind}: {log}");
    let want = crash::committed_lines(&reference.join("out"));
    assert!(want.len() > 10, "{kind}: a vacuous reference: {want:?}");

    let killed = scratch.0.join("killed");
    let (status, log) = recovery_run(kind, &killed, 2, Some(kill));
    assert!(!status.success(), "{kind} was not killed at {kill}: {log}");
    let (status, log) = recovery_run(kind, &killed, workers_after, None);
    assert!(status.success(), "{kind} does not recover: {log}");
    assert!(log.contains("recovered from Some("), "{kind} started afresh: {log}");
    let mut got = crash::committed_lines(&killed.join("out"));
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(got, want, "{kind} recovered on {workers_after} workers differs from an uninterrupted run");
}

#[test]
fn a_windowed_decimal_sum_recovers_from_sigkill() {
    survives_a_kill("sum-decimal", "shard-write:5", 1);
}

#[test]
fn a_pattern_over_json_values_recovers_from_sigkill() {
    survives_a_kill("cep-json", "shard-write:5", 3);
}

#[test]
fn session_windows_over_a_struct_with_a_decimal_recover_from_sigkill() {
    survives_a_kill("session-decimal", "shard-write:5", 2);
}

/// An order: a user, a price, an event time.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Order {
    user: u32,
    price: rust_decimal::Decimal,
    at: u64,
}

/// A child job of [`survives_a_kill`]: 4 partitions of 1500 orders (event
/// times 0..15 s), read at 10 000 a second, checkpointed every 40 ms,
/// rows committed as part files under `DIR/out`.
#[test]
#[ignore = "run by the tests above as a child process"]
fn recovery_child() {
    use highwater::checkpoint::CheckpointConfig;
    use highwater::prelude::*;
    use highwater::sink::{write_parts, PartFormat};
    use std::sync::Arc;

    let spec = std::env::var("STATE_RESTORES_RECOVERY").expect("the child's spec");
    let mut parts = spec.splitn(3, ';');
    let (kind, workers, dir) = (parts.next().unwrap().to_owned(), parts.next().unwrap(), parts.next().unwrap());
    let dir = PathBuf::from(dir);
    let out = dir.join("out");
    let partitions: Vec<Vec<Order>> = (0..4u64)
        .map(|p| {
            (0..1500u64)
                .map(|i| Order {
                    user: ((i * 7 + p) % 13) as u32,
                    price: rust_decimal::Decimal::new(((i * 31 + p * 17) % 10_000) as i64 + 1, 2),
                    at: i * 10 + p,
                })
                .collect()
        })
        .collect();
    let source = Arc::new(MemorySource::new(partitions));
    let checkpoints = CheckpointConfig::new(dir.join("checkpoints")).every(40).recovering();
    let job = highwater::Job::new(timely::Config::process(workers.parse().unwrap())).checkpointed(checkpoints);
    let report = job.run(move |worker| {
        let (source, out, kind) = (Arc::clone(&source), out.clone(), kind.clone());
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let events = FromSource::new(source, |o: &Order| o.at).rate_limit(10_000.0).build(scope)?.events;
            let rows = match kind.as_str() {
                "sum-decimal" => events
                    .key_by(|o: &Order| o.user)
                    .window(Tumbling::of(1_000))
                    .aggregate(Sum::of(|o: &Order| o.price))
                    .results
                    .map(|r| format!("{},{},{}", r.window.start, r.key, r.value)),
                "session-decimal" => events
                    .key_by(|o: &Order| o.user)
                    .window(Session::with_gap(30))
                    .aggregate(Sum::of(|o: &Order| o.price))
                    .results
                    .map(|r| format!("{},{},{},{}", r.window.start, r.window.end, r.key, r.value)),
                _ => {
                    let json =
                        events.map(|o| serde_json::json!({"user": o.user, "price": o.price.to_string(), "at": o.at}));
                    let cheap = |v: &serde_json::Value| v["price"].as_str().is_some_and(|p| p.len() <= 4);
                    let pattern = Pattern::begin("cheap")
                        .where_(move |v: &serde_json::Value| cheap(v))
                        .next("dear")
                        .where_(move |v: &serde_json::Value| !cheap(v));
                    json.key_by(|v: &serde_json::Value| v["user"].as_u64().unwrap_or(0))
                        .pattern(pattern)?
                        .matches
                        .map(|m| format!("{},{}", m.key, serde_json::to_string(&m.steps).unwrap()))
                }
            };
            write_parts(&rows, "rows", out.clone(), None, PartFormat::Rows)?;
            Ok(())
        })
    });
    match report {
        Ok(report) => eprintln!("recovered from {:?}", report.recovered_from),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
