//! Checkpointing set up in one call ([`highwater::Job`]) on one process and
//! on two, and every misuse of the step-by-step API that stays possible
//! failing loudly: a clear error, never a hang, never lost output.

#[path = "../examples/checkpointed_job.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

#[path = "common/crash.rs"]
mod crash;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use highwater::checkpoint::{CheckpointConfig, Checkpoints};
use highwater::prelude::*;
use highwater::sink::{write_parts, PartFormat};
use highwater::{Job, JobError};

/// Runs `f` on a thread and waits for it at most `secs`: a misuse must end
/// with an error, not hang.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).expect("the job hangs")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_job_checkpoints_and_recovers_in_one_call() {
    let dir = crash::Scratch::new("setup", "one-call");
    assert!(within(120, {
        let dir = dir.0.clone();
        move || example::run(&dir, &args(&["-w", "2"])).unwrap()
    }));
    assert_eq!(example::committed(&dir.0).unwrap(), example::expected());
    // Run again on the same directory: the job had completed, nothing runs,
    // and nothing is committed twice.
    let again = within(120, {
        let dir = dir.0.clone();
        move || example::run(&dir, &args(&["-w", "3"])).unwrap()
    });
    assert!(again);
    assert_eq!(example::committed(&dir.0).unwrap(), example::expected());
}

#[test]
fn a_job_of_two_processes_chooses_its_coordinator_from_the_process_index() {
    let dir = crash::Scratch::new("setup", "two-processes");
    let hosts = dir.0.join("hosts");
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    writeln!(std::fs::File::create(&hosts).unwrap(), "127.0.0.1:{}\n127.0.0.1:{}", port(), port()).unwrap();
    let process = |p: &'static str| {
        let (dir, hosts) = (dir.0.clone(), hosts.display().to_string());
        std::thread::spawn(move || example::run(&dir, &args(&["-w", "2", "-n", "2", "-p", p, "-h", &hosts])))
    };
    let (p0, p1) = (process("0"), process("1"));
    let done = within(180, move || (p0.join().unwrap().unwrap(), p1.join().unwrap().unwrap()));
    assert_eq!(done, (true, true));
    assert_eq!(example::committed(&dir.0).unwrap(), example::expected());
}

/// A job over a few clicks, counted per user in 10 s windows, written to
/// part files in `dir/out`.
fn build_clicks(worker: &mut timely::worker::Worker, out: &Path) -> anyhow::Result<()> {
    worker.dataflow(|scope| {
        let clicks = vec![vec![(1u32, 1_000u64), (2, 2_500), (1, 12_000)], vec![(1, 3_000), (2, 15_000)]];
        let source = Arc::new(MemorySource::new(clicks));
        let events =
            read(scope, source, |c: &(u32, u64)| c.1, SourceOptions::default(), &SourceMetrics::default(), None)?;
        let counts = events.events.window(Tumbling::of(10.secs())).key_by(|c: &(u32, u64)| c.0).aggregate(Count);
        let lines = counts.results.map(|r| format!("{},{},{}", r.window.start, r.key, r.value));
        write_parts(&lines, "counts", out.to_owned(), None, PartFormat::Rows)?;
        Ok(())
    })
}

/// The rows committed in `dir`, sorted.
fn rows(dir: &Path) -> Vec<String> {
    let mut rows: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().is_file())
                .flat_map(|e| std::fs::read_to_string(e.path()).unwrap().lines().map(str::to_owned).collect::<Vec<_>>())
                .collect()
        })
        .unwrap_or_default();
    rows.sort();
    rows
}

const CLICK_ROWS: [&str; 4] = ["0,1,2", "0,2,1", "10000,1,1", "10000,2,1"];

#[test]
fn checkpoints_without_configure_fail_at_built_saying_what_to_call() {
    let dir = crash::Scratch::new("setup", "no-configure");
    let checkpoints = Checkpoints::open(CheckpointConfig::new(dir.0.join("ck").display().to_string()), 1).unwrap();
    let (ck, out) = (checkpoints.clone(), dir.0.join("out"));
    let errors = within(60, move || {
        let guards = timely::execute(timely::Config::process(1), move |worker| {
            // The exactly-once sink refuses first: it needs the checkpoints.
            let built = build_clicks(worker, &out).map_err(|e| e.to_string());
            let declared = ck.built(worker).map_err(|e| e.to_string());
            (built, declared)
        })
        .unwrap();
        guards.join().into_iter().map(|r| r.unwrap()).collect::<Vec<_>>()
    });
    let (built, declared) = &errors[0];
    assert!(built.as_ref().unwrap_err().contains("Checkpoints::configure"), "{built:?}");
    assert!(declared.as_ref().unwrap_err().contains("Checkpoints::configure"), "{declared:?}");
    assert!(checkpoints.finish().is_err());
}

#[test]
fn checkpoints_never_declared_built_fail_the_job_instead_of_hanging() {
    let dir = crash::Scratch::new("setup", "no-built");
    let checkpoints = Checkpoints::open(CheckpointConfig::new(dir.0.join("ck").display().to_string()), 2).unwrap();
    let mut config = timely::Config::process(2);
    checkpoints.configure(&mut config);
    let out = dir.0.join("out");
    within(60, move || {
        timely::execute(config, move |worker| build_clicks(worker, &out).unwrap()).unwrap().join();
    });
    let error = checkpoints.finish().unwrap_err().to_string();
    assert!(error.contains("Checkpoints::built was not called"), "{error}");
}

#[test]
fn a_job_whose_dataflow_fails_to_build_stops_with_the_error() {
    let dir = crash::Scratch::new("setup", "build-error");
    let config = CheckpointConfig::new(dir.0.join("ck").display().to_string());
    let out = dir.0.join("out");
    let result = within(60, move || {
        Job::new(timely::Config::process(2)).checkpointed(config).run(move |worker| {
            if worker.index() == 1 {
                anyhow::bail!("no such input");
            }
            build_clicks(worker, &out)
        })
    });
    match result {
        Err(JobError::Worker { error, .. }) => assert!(error.contains("no such input"), "{error}"),
        other => panic!("expected the build error, got {other:?}"),
    }
}

/// Set in the child process of [`checkpoints_dropped_without_finish_still_commit_everything`].
const FORGET_FINISH: &str = "HIGHWATER_TEST_FORGET_FINISH";

/// In the child: a checkpointed run that never calls `finish`.
#[test]
fn forget_finish_child() {
    let Ok(dir) = std::env::var(FORGET_FINISH) else { return };
    let dir = Path::new(&dir).to_owned();
    let checkpoints = Checkpoints::open(CheckpointConfig::new(dir.join("ck").display().to_string()), 2).unwrap();
    let mut config = timely::Config::process(2);
    checkpoints.configure(&mut config);
    let ck = checkpoints.clone();
    let out = dir.join("out");
    timely::execute(config, move |worker| {
        build_clicks(worker, &out).unwrap();
        ck.built(worker).unwrap();
    })
    .unwrap()
    .join();
    // No checkpoints.finish(): the checkpoints are dropped here, and the
    // process exits at once.
}

#[test]
fn checkpoints_dropped_without_finish_still_commit_everything() {
    for run in 0..4 {
        let dir = crash::Scratch::new("setup", &format!("no-finish-{run}"));
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "forget_finish_child", "--nocapture", "--test-threads", "1"])
            .env(FORGET_FINISH, &dir.0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&child.stderr);
        assert!(child.status.success(), "run {run}: {:?}\n{stderr}", child.status);
        assert!(stderr.contains("without Checkpoints::finish()"), "run {run}: the omission is logged: {stderr}");
        assert_eq!(rows(&dir.0.join("out")), CLICK_ROWS, "run {run}");
    }
}
