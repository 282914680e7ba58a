//! Crash tests of checkpoints of a job spread over several timely processes
//! (`-n 2 -p 0|1 -h HOSTFILE`): process 0 coordinates the checkpoints (on
//! `--checkpoint-coordinator`, by default the port of process 0 in the
//! hostfile + 1000), every process writes its workers' shards into the shared
//! checkpoint directory, and process 0 writes the exactly-once part files.
//!
//! The processes are killed with SIGKILL (both at once, or one whose peer
//! then ends on its own: in timely, one process cannot go on without its
//! peers) and restarted with `--recover`, also on another layout (1 process ×
//! 2 workers); the committed output must end up byte for byte the output of an
//! uninterrupted single-process run, which itself must hold exactly the rows
//! of the query's plain CSV output (no checkpoints).
//!
//! `HIGHWATER_CLUSTER_KILLS` sets the number of random kills of the crash loop
//! (default 4, over q5 and q8); `HIGHWATER_CRASH_SEED` replays a run's kill
//! times (the seed is printed). The crash tests run one at a time (each starts
//! several processes on a small machine, and the kill times are relative to a
//! measured run). The processes log to files in the scratch directory; a
//! failure message holds the tails of their logs.

use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[path = "common/crash.rs"]
mod crash;
use crash::{committed_parts, events_file, plain_rows, seed, Rng, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");

/// Events in the input file: q5 runs for a few seconds on 2 processes.
const EVENTS: u64 = 2_500_000;
/// How long a run may take to complete before the test fails (a hung cluster
/// must fail the test, not hang CI).
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the first (or a newer) complete checkpoint may take to appear.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the survivor of a one-process kill may take to end on its own.
const SURVIVOR_WAIT: Duration = Duration::from_secs(10);
/// What the log of a run that restores a checkpoint says.
const RECOVERING: &str = "recovering from checkpoint";
/// What a run that restores the final checkpoint says instead of running.
const COMPLETED: &str = "the job has completed";

/// The tests start clusters of processes: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn kills() -> usize {
    std::env::var("HIGHWATER_CLUSTER_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(4)
}

/// Whether a port can be listened on right now.
fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Ports for a cluster of `processes`: each free, with its port + 1000 (the
/// default checkpoint coordinator of process 0) free too, and none handed
/// out before in this test process (the tests run in parallel: a port free
/// now may be another test's whose processes have not bound it yet; once,
/// two tests picked the same one and a process joined the other test's
/// cluster). Chosen below the ephemeral range, so that outgoing
/// connections do not take them meanwhile.
fn free_ports(processes: usize) -> Vec<u16> {
    static STATE: Mutex<(u64, Vec<u16>)> = Mutex::new((0, Vec::new()));
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.0 == 0 {
        state.0 = (std::process::id() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
            | 1;
    }
    let mut rng = Rng(state.0);
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < processes {
        let p = 20_000 + (rng.next() % 10_000) as u16;
        let taken = ports.iter().chain(state.1.iter()).any(|&q| [q, q + 1000].iter().any(|&t| t == p || t == p + 1000));
        if !taken && bindable(p) && bindable(p + 1000) {
            ports.push(p);
        }
    }
    state.0 = rng.0;
    state.1.extend_from_slice(&ports);
    ports
}

/// How a run is laid out: processes × workers (threads per process).
#[derive(Clone, Copy, Debug)]
struct Layout {
    processes: usize,
    workers: usize,
}

const TWO_PROCESSES: Layout = Layout { processes: 2, workers: 1 };
const ONE_PROCESS: Layout = Layout { processes: 1, workers: 2 };

/// A checkpointed job: query, input, checkpoint and output directories.
struct Job {
    query: &'static str,
    input: PathBuf,
    dir: PathBuf,
    name: String,
    checkpoints: PathBuf,
    output: PathBuf,
    interval: &'static str,
    /// Pass `--checkpoint-coordinator 127.0.0.1:PORT` (a free port) instead
    /// of relying on the default (process 0's port + 1000).
    explicit_coordinator: bool,
    /// Start process 1 before process 0 (the processes wait for each other).
    reverse_start: bool,
    /// Runs started so far (names their log files).
    runs: usize,
    /// Keyed state on RocksDB under this directory (default: memory).
    state: Option<PathBuf>,
}

impl Job {
    fn new(query: &'static str, input: &Path, dir: &Path, name: &str) -> Job {
        Job {
            query,
            input: input.to_owned(),
            dir: dir.to_owned(),
            name: name.to_owned(),
            checkpoints: dir.join(format!("{name}-checkpoints")),
            output: dir.join(format!("{name}-out")),
            interval: "300ms",
            explicit_coordinator: false,
            reverse_start: false,
            runs: 0,
            state: None,
        }
    }

    /// Starts every process of `layout` (with `--recover` if `recover`).
    fn start(&mut self, layout: Layout, recover: bool) -> Cluster {
        self.runs += 1;
        let run = self.runs;
        let ports = if layout.processes > 1 { free_ports(layout.processes + 1) } else { Vec::new() };
        let hosts = self.dir.join(format!("{}-hosts-{run}.txt", self.name));
        if layout.processes > 1 {
            let mut f = File::create(&hosts).unwrap();
            for port in &ports[..layout.processes] {
                writeln!(f, "127.0.0.1:{port}").unwrap();
            }
        }
        let mut procs = Vec::new();
        let order: Vec<usize> =
            if self.reverse_start { (0..layout.processes).rev().collect() } else { (0..layout.processes).collect() };
        for process in order {
            let log = self.dir.join(format!("{}-run{run}-p{process}.log", self.name));
            let mut cmd = Command::new(BIN);
            cmd.args(["--log", "highwater=info", "nexmark", "--query", self.query, "--input"])
                .arg(&self.input)
                .arg("--checkpoint-dir")
                .arg(&self.checkpoints)
                .args(["--checkpoint-interval", self.interval, "--output-dir"])
                .arg(&self.output);
            if recover {
                cmd.arg("--recover");
            }
            if let Some(state) = &self.state {
                cmd.args(["--state-backend", "rocksdb", "--state-cache", "16MiB", "--state-dir"]).arg(state);
            }
            if layout.processes > 1 && self.explicit_coordinator {
                // A free port that is not process 0's + 1000.
                cmd.arg("--checkpoint-coordinator").arg(format!("127.0.0.1:{}", ports[layout.processes]));
            }
            cmd.args(["--", "-w", &layout.workers.to_string()]);
            if layout.processes > 1 {
                cmd.args(["-n", &layout.processes.to_string(), "-p", &process.to_string(), "-h"]).arg(&hosts);
            }
            cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(File::create(&log).unwrap()));
            let child = cmd.spawn().expect("starting highwater");
            let label = format!("{} run {run} process {process}", self.name);
            procs.push(Proc { child, log, status: None, label, process });
        }
        procs.sort_by_key(|p: &Proc| p.process);
        Cluster { procs, started: Instant::now(), layout }
    }

    /// Runs `layout` to completion; every process must succeed.
    /// Returns how long it took, and the ended processes (their logs).
    fn run_ok(&mut self, layout: Layout, recover: bool) -> (Duration, Cluster) {
        let mut cluster = self.start(layout, recover);
        cluster.wait_success(RUN_TIMEOUT);
        (cluster.started.elapsed(), cluster)
    }

    /// The ids of the complete checkpoints (`chk-N/MANIFEST`), ascending.
    fn complete(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = std::fs::read_dir(&self.checkpoints)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().join("MANIFEST").is_file())
                    .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    fn newest(&self) -> Option<u64> {
        self.complete().last().copied()
    }

    /// What the checkpoint directory holds, for failure messages.
    fn listing(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(&self.checkpoints) else {
            return format!("{} does not exist", self.checkpoints.display());
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let inner: Vec<String> = std::fs::read_dir(&path)
                .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            out.push_str(&format!("  {} {:?}\n", path.display(), inner));
        }
        out
    }

    /// The committed output: every part's data rows, parts in name order.
    /// Each part starts with the header row; nothing is left pending.
    fn committed(&self) -> String {
        committed_parts(&self.output)
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.checkpoints);
        let _ = std::fs::remove_dir_all(&self.output);
    }
}

/// One process of a run, its log file (stderr), and its exit status once known.
struct Proc {
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
    label: String,
    process: usize,
}

/// The processes of one run. Dropping it (also while a failed test unwinds)
/// kills those still running.
struct Cluster {
    procs: Vec<Proc>,
    started: Instant,
    layout: Layout,
}

impl Cluster {
    /// Collects the exit statuses of the processes that have ended.
    fn poll(&mut self) {
        for p in &mut self.procs {
            if p.status.is_none() {
                p.status = p.child.try_wait().expect("waiting for highwater");
            }
        }
    }

    fn any_ended(&mut self) -> bool {
        self.poll();
        self.procs.iter().any(|p| p.status.is_some())
    }

    fn all_ended(&mut self) -> bool {
        self.poll();
        self.procs.iter().all(|p| p.status.is_some())
    }

    /// SIGKILLs every process still running (back to back: a cluster
    /// failure) and reaps them all.
    fn kill(&mut self) {
        self.poll();
        for p in &mut self.procs {
            if p.status.is_none() {
                let _ = p.child.kill();
            }
        }
        for p in &mut self.procs {
            if p.status.is_none() {
                p.status = Some(p.child.wait().expect("reaping highwater"));
            }
        }
    }

    /// SIGKILLs process `index` alone.
    fn kill_one(&mut self, index: usize) {
        let p = &mut self.procs[index];
        if p.status.is_none() {
            let _ = p.child.kill();
            p.status = Some(p.child.wait().expect("reaping highwater"));
        }
    }

    /// Waits for every process to end, at most `timeout` (then kills them all
    /// and fails the test).
    fn wait(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.all_ended() {
            if Instant::now() > deadline {
                self.kill();
                panic!("{:?} still running after {timeout:?}: killed\n{}", self.layout, self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for every process to end, and all must succeed.
    fn wait_success(&mut self, timeout: Duration) {
        self.wait(timeout);
        self.assert_success();
    }

    fn assert_success(&mut self) {
        self.poll();
        let failed: Vec<String> = self
            .procs
            .iter()
            .filter(|p| !p.status.is_some_and(|s| s.success()))
            .map(|p| format!("{} ({})", p.label, status(p.status)))
            .collect();
        assert!(failed.is_empty(), "failed: {}\n{}", failed.join(", "), self.logs());
    }

    /// Every process's log (stderr), labelled.
    fn logs(&self) -> String {
        let mut out = String::new();
        for p in &self.procs {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            out.push_str(&format!("--- {} ({}), stderr:\n{}\n", p.label, status(p.status), tail(&text, 4_000)));
        }
        out
    }

    /// Whether some process's log says it restored a checkpoint.
    fn recovered(&self) -> bool {
        self.procs.iter().any(|p| {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            text.contains(RECOVERING) || text.contains(COMPLETED)
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An exit status in words: `exit 1`, `signal 9`, `running`.
fn status(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "running".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit {code}"),
            (_, Some(signal)) => format!("signal {signal}"),
            _ => format!("{s:?}"),
        },
    }
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Waits until `job` holds a complete checkpoint newer than `than` (any if
/// `None`) while `cluster` runs; returns its id, or `None` if the cluster
/// ended first. Fails the test after [`CHECKPOINT_TIMEOUT`].
fn await_checkpoint(job: &Job, cluster: &mut Cluster, than: Option<u64>) -> Option<u64> {
    let deadline = Instant::now() + CHECKPOINT_TIMEOUT;
    loop {
        if let Some(id) = job.newest().filter(|&id| than.is_none_or(|than| id > than)) {
            return Some(id);
        }
        if cluster.any_ended() {
            return None;
        }
        if Instant::now() > deadline {
            cluster.kill();
            panic!(
                "no complete checkpoint newer than {than:?} after {CHECKPOINT_TIMEOUT:?}\n{}{}",
                job.listing(),
                cluster.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The committed output of an uninterrupted single-process run (1 process ×
/// 2 workers), checked against the plain CSV output of the query.
fn reference(query: &'static str, input: &Path, dir: &Path) -> String {
    let mut job = Job::new(query, input, dir, &format!("{query}-reference"));
    let (took, _) = job.run_ok(ONE_PROCESS, false);
    let rows = job.committed();
    let mut sorted: Vec<String> = rows.lines().map(str::to_owned).collect();
    sorted.sort();
    assert!(!sorted.is_empty(), "{query} produced no rows: a vacuous test");
    let plain = plain_rows(query, dir, |cmd| {
        cmd.arg("--input").arg(input);
    });
    assert_eq!(sorted, plain, "{query}: committed parts differ from the plain output");
    eprintln!("{query}: reference run (1 process × 2 workers) took {took:?}, {} rows", sorted.len());
    job.remove();
    rows
}

/// An uninterrupted run on 2 processes × 1 worker: its output must be the
/// reference; returns how long it took (the span of the random kill times).
fn uninterrupted_cluster(query: &'static str, input: &Path, dir: &Path, expected: &str) -> Duration {
    let mut job = Job::new(query, input, dir, &format!("{query}-uninterrupted"));
    let (took, _) = job.run_ok(TWO_PROCESSES, false);
    assert!(job.newest().is_some(), "{query}: the 2-process run wrote no checkpoint\n{}", job.listing());
    assert!(job.committed() == expected, "{query}: the uninterrupted 2-process run's output differs from 1 process's");
    eprintln!("{query}: uninterrupted run (2 processes × 1 worker) took {took:?}");
    job.remove();
    took
}

/// What a crash loop did.
#[derive(Debug, Default)]
struct Loop {
    kills: usize,
    /// Kills while a complete checkpoint existed.
    kills_after_checkpoint: usize,
    /// Kills of one process whose peer then ended on its own (failing,
    /// as it cannot go on without it) …
    survivors_ended: usize,
    /// … or was still running after [`SURVIVOR_WAIT`] and was killed too
    /// (timely waits forever for a peer that died while they connected).
    survivors_killed: usize,
    /// Restarts whose log says they restored a checkpoint.
    logged_recoveries: usize,
    jobs: usize,
    runs: usize,
}

/// Kills `kills` runs of `query` on 2 processes × 1 worker at random moments
/// within `span` (an uninterrupted run's duration), both processes at once,
/// restarting them with `--recover`; whenever a job completes, its output must
/// equal `expected`, and a fresh job starts until all the kills are done.
/// The last kill waits for a complete checkpoint if none was killed with one.
fn crash_loop(
    query: &'static str,
    input: &Path,
    dir: &Path,
    expected: &str,
    span: Duration,
    kills: usize,
    rng: &mut Rng,
) -> Loop {
    let span = span.as_millis() as u64;
    let mut stats = Loop::default();
    while stats.kills < kills {
        stats.jobs += 1;
        let mut job = Job::new(query, input, dir, &format!("{query}-crash-{}", stats.jobs));
        let mut recover = false;
        loop {
            let checkpoint_at_start = job.newest();
            job.reverse_start = rng.next() % 2 == 0;
            let mut cluster = job.start(TWO_PROCESSES, recover);
            stats.runs += 1;
            if stats.kills < kills {
                let after = rng.millis(span / 10, span * 9 / 10 + 2);
                // Every other kill takes both processes down at once; the
                // others one process, at random (whose peer must then end on
                // its own, or is killed too).
                let victim = (stats.kills % 2 == 1).then(|| (rng.next() % 2) as usize);
                let must_checkpoint = stats.kills + 1 == kills && stats.kills_after_checkpoint == 0;
                let before = job.newest();
                while cluster.started.elapsed() < after && !cluster.any_ended() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if must_checkpoint && !cluster.any_ended() {
                    // The last kill: make sure a checkpoint exists (and one
                    // taken by this run, to recover from a cluster's shards).
                    await_checkpoint(&job, &mut cluster, before);
                }
                if !cluster.any_ended() {
                    let checkpointed = job.newest();
                    let at = cluster.started.elapsed();
                    let what = match victim {
                        None => {
                            cluster.kill();
                            "both processes".to_owned()
                        }
                        Some(victim) => {
                            cluster.kill_one(victim);
                            let killed = Instant::now();
                            while !cluster.all_ended() && killed.elapsed() < SURVIVOR_WAIT {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            let survivor = if cluster.all_ended() {
                                stats.survivors_ended += 1;
                                let survivor = status(cluster.procs[1 - victim].status);
                                format!("ended on its own after {:?}, {survivor}", killed.elapsed())
                            } else {
                                cluster.kill();
                                stats.survivors_killed += 1;
                                let log = std::fs::read_to_string(&cluster.procs[1 - victim].log).unwrap_or_default();
                                let last = log.lines().last().unwrap_or_default().to_owned();
                                format!("still running after {SURVIVOR_WAIT:?}, killed; its last words: {last:?}")
                            };
                            format!("process {victim} (process {}: {survivor})", 1 - victim)
                        }
                    };
                    stats.kills += 1;
                    if checkpointed.is_some() {
                        stats.kills_after_checkpoint += 1;
                    }
                    eprintln!(
                        "{query}: job {} run {}: killed {what} after {at:?} (newest checkpoint {checkpointed:?})",
                        stats.jobs, job.runs
                    );
                    if recover && cluster.recovered() {
                        stats.logged_recoveries += 1;
                    }
                    recover = true;
                    continue;
                }
                // A process ended on its own before the kill: the job must be
                // completing (no process fails while its peer lives).
                cluster.poll();
                let failed: Vec<&str> = cluster
                    .procs
                    .iter()
                    .filter(|p| p.status.is_some_and(|s| !s.success()))
                    .map(|p| p.label.as_str())
                    .collect();
                assert!(failed.is_empty(), "{query}: {failed:?} failed while nothing was killed\n{}", cluster.logs());
            }
            cluster.wait_success(RUN_TIMEOUT);
            if recover && cluster.recovered() {
                stats.logged_recoveries += 1;
            }
            assert!(
                checkpoint_at_start.is_none() || cluster.recovered(),
                "{query}: a run started with checkpoint {checkpoint_at_start:?} complete and does not say {RECOVERING:?}\n{}",
                cluster.logs()
            );
            eprintln!(
                "{query}: job {} completed on run {} after {:?}",
                stats.jobs,
                job.runs,
                cluster.started.elapsed()
            );
            break;
        }
        assert!(
            job.committed() == expected,
            "{query}: output after {} kills (job {}) differs from the uninterrupted run",
            stats.kills,
            stats.jobs
        );
        job.remove();
    }
    eprintln!("{query}: {stats:?}");
    stats
}

#[test]
fn random_kills_of_a_two_process_job_leave_exactly_the_uninterrupted_output() {
    let _serial = serial();
    let scratch = Scratch::new("cluster", "loop");
    let mut rng = Rng(seed());
    let kills = kills();
    let input = events_file(&scratch.0, EVENTS);
    let started = Instant::now();
    let mut recovered_from_checkpoint = 0;
    let mut logged = 0;
    let q5_kills = kills.div_ceil(2);
    for (query, n) in [("q5", q5_kills), ("q8", kills - q5_kills)] {
        if n == 0 {
            continue;
        }
        let expected = reference(query, &input, &scratch.0);
        let span = uninterrupted_cluster(query, &input, &scratch.0, &expected);
        let stats = crash_loop(query, &input, &scratch.0, &expected, span, n, &mut rng);
        assert_eq!(stats.kills, n);
        recovered_from_checkpoint += stats.kills_after_checkpoint;
        logged += stats.logged_recoveries;
    }
    assert!(recovered_from_checkpoint > 0, "no kill happened after a complete checkpoint: nothing was recovered");
    assert!(logged > 0, "no restart's log says {RECOVERING:?} (run with --log highwater=info)");
    eprintln!("{kills} kills in {:?}", started.elapsed());
}

/// Incremental checkpoints across processes: q20 with its keyed state on
/// RocksDB on 2 processes × 1 worker, each process putting its own
/// databases' files, killed once a checkpoint is complete, then recovered on
/// 1 process × 3 workers (every worker reading its keys from both
/// processes' databases), commits the rows of an uninterrupted in-memory run.
#[test]
fn incremental_checkpoints_of_two_processes_recover_on_one() {
    let _serial = serial();
    let scratch = Scratch::new("cluster", "incremental");
    let input = events_file(&scratch.0, EVENTS);
    let sorted = |rows: &str| {
        let mut rows: Vec<String> = rows.lines().map(str::to_owned).collect();
        rows.sort_unstable();
        rows
    };
    let expected = sorted(&reference("q20", &input, &scratch.0));
    for attempt in 1..=3 {
        let mut job = Job::new("q20", &input, &scratch.0, &format!("q20-incremental-{attempt}"));
        job.interval = "100ms";
        job.state = Some(scratch.0.join("state"));
        let mut cluster = job.start(TWO_PROCESSES, false);
        let first = await_checkpoint(&job, &mut cluster, None);
        if first.is_none() || cluster.any_ended() {
            eprintln!("attempt {attempt}: 2 × 1 ended before it could be killed\n{}", cluster.logs());
            job.remove();
            continue;
        }
        cluster.kill();
        drop(cluster);
        let newest = job.newest().expect("a complete checkpoint");
        let manifest = std::fs::read_to_string(job.checkpoints.join(format!("chk-{newest:010}/MANIFEST"))).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(manifest.split_once('\n').unwrap().1).unwrap();
        let identities: std::collections::BTreeSet<&str> = manifest["shards"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["databases"].as_array().into_iter().flatten())
            .map(|d| d["identity"].as_str().unwrap())
            .collect();
        assert!(identities.len() >= 2, "checkpoint {newest} holds the databases of fewer than 2 workers: {manifest}");
        let (_, cluster) = job.run_ok(Layout { processes: 1, workers: 3 }, true);
        assert!(cluster.recovered(), "1 × 3 did not restore the 2-process checkpoint\n{}", cluster.logs());
        assert!(
            sorted(&job.committed()) == expected,
            "q20: output after 2 × 1 → 1 × 3 differs from the uninterrupted run"
        );
        job.remove();
        return;
    }
    panic!("in 3 attempts, the job always ended before it could be killed: use a larger input");
}

#[test]
fn a_cluster_checkpoint_recovers_on_one_process_and_back() {
    let _serial = serial();
    let scratch = Scratch::new("cluster", "rescale");
    let input = events_file(&scratch.0, EVENTS);
    let expected = reference("q5", &input, &scratch.0);
    let started = Instant::now();
    // The kills must land before the job's end: checkpoints every 100 ms,
    // and up to 3 attempts (a busy machine may reach the end first).
    let mut attempt = 0;
    let mut job = loop {
        attempt += 1;
        assert!(attempt <= 3, "in 3 attempts, the job always ended before it could be killed: use a larger input");
        let mut job = Job::new("q5", &input, &scratch.0, &format!("q5-rescale-{attempt}"));
        job.explicit_coordinator = true;
        job.interval = "100ms";

        // 2 processes × 1 worker until a checkpoint exists; kill both.
        let mut cluster = job.start(TWO_PROCESSES, false);
        let first = await_checkpoint(&job, &mut cluster, None);
        if first.is_none() || cluster.any_ended() {
            eprintln!("attempt {attempt}: 2 × 1 ended before it could be killed\n{}", cluster.logs());
            job.remove();
            continue;
        }
        cluster.kill();
        drop(cluster);
        let restored = job.newest().expect("a complete checkpoint");
        eprintln!("2 × 1: killed with checkpoint {restored} complete\n{}", job.listing());

        // 1 process × 2 workers from the cluster's checkpoint, killed once it
        // has taken a checkpoint of its own.
        let mut cluster = job.start(ONE_PROCESS, true);
        let newer = await_checkpoint(&job, &mut cluster, Some(restored));
        if newer.is_none() || cluster.any_ended() {
            cluster.wait_success(RUN_TIMEOUT);
            assert!(cluster.recovered(), "1 × 2 did not restore the 2-process checkpoint\n{}", cluster.logs());
            assert!(job.committed() == expected, "q5: output after 2 × 1 → 1 × 2 differs from the uninterrupted run");
            eprintln!("attempt {attempt}: 1 × 2 ended before it could be killed\n{}", cluster.logs());
            job.remove();
            continue;
        }
        cluster.kill();
        assert!(cluster.recovered(), "1 × 2 did not restore the 2-process checkpoint\n{}", cluster.logs());
        drop(cluster);
        let restored = job.newest().expect("a complete checkpoint");
        eprintln!("1 × 2: killed with checkpoint {restored} complete");
        break job;
    };
    job.interval = "300ms";

    // Back on 2 processes × 1 worker, to the end.
    let (took, cluster) = job.run_ok(TWO_PROCESSES, true);
    assert!(cluster.recovered(), "2 × 1 did not restore the 1-process checkpoint\n{}", cluster.logs());
    eprintln!("2 × 1: completed in {took:?}");
    assert!(job.committed() == expected, "q5: output after 2 × 1 → 1 × 2 → 2 × 1 differs from the uninterrupted run");
    drop(cluster);

    // Recovering the completed job runs nothing, on either process.
    let (took, cluster) = job.run_ok(TWO_PROCESSES, true);
    for p in &cluster.procs {
        let log = std::fs::read_to_string(&p.log).unwrap();
        assert!(log.contains(COMPLETED), "{} ran again after the final checkpoint\n{}", p.label, cluster.logs());
    }
    assert!(job.committed() == expected, "q5: recovering the completed job changed its output");
    eprintln!("2 × 1 after the end: nothing to do ({took:?})");
    eprintln!("2 × 1 → 1 × 2 → 2 × 1 in {:?}", started.elapsed());
}

/// Process 1 alone: it waits for the coordinator (process 0's port + 1000 by
/// default) for a bounded time (60 s), then fails naming the address, before
/// timely's own connection (which retries forever) and without writing any
/// checkpoint or output.
#[test]
fn a_follower_that_cannot_reach_the_coordinator_fails_with_a_clear_error() {
    // Mostly waiting: not serialized with the others.
    let scratch = Scratch::new("cluster", "follower");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/events.jsonl");
    let ports = free_ports(2);
    let hosts = scratch.0.join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", ports[0], ports[1])).unwrap();
    let (checkpoints, output) = (scratch.0.join("checkpoints"), scratch.0.join("out"));
    let log = scratch.0.join("p1.log");
    let child = Command::new(BIN)
        .args(["nexmark", "--query", "q5", "--input"])
        .arg(&input)
        .arg("--checkpoint-dir")
        .arg(&checkpoints)
        .arg("--output-dir")
        .arg(&output)
        .args(["--", "-w", "1", "-n", "2", "-p", "1", "-h"])
        .arg(&hosts)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut cluster = Cluster {
        procs: vec![Proc { child, log, status: None, label: "process 1 alone".into(), process: 1 }],
        started: Instant::now(),
        layout: TWO_PROCESSES,
    };
    cluster.wait(Duration::from_secs(150));
    let took = cluster.started.elapsed();
    let status = cluster.procs[0].status.unwrap();
    let stderr = std::fs::read_to_string(&cluster.procs[0].log).unwrap();
    assert!(!status.success(), "process 1 alone succeeded: {stderr}");
    assert_eq!(status.code(), Some(1), "an error exit, not a crash: {stderr}");
    let coordinator = format!("127.0.0.1:{}", ports[0] + 1000);
    assert!(
        stderr.contains("could not connect") && stderr.contains(&coordinator),
        "the error should say that {coordinator} could not be reached: {stderr}"
    );
    eprintln!("process 1 alone failed after {took:?}: {}", stderr.trim());
    let complete = std::fs::read_dir(&checkpoints)
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.path().join("MANIFEST").exists()).count())
        .unwrap_or(0);
    assert_eq!(complete, 0, "process 1 alone wrote a checkpoint");
    let parts = std::fs::read_dir(&output)
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "csv")).count())
        .unwrap_or(0);
    assert_eq!(parts, 0, "process 1 alone wrote output");
}

/// A process whose sources all end early (here: the only generator partition
/// is read by process 0's worker, process 1 has none) must not hold the
/// other processes back: its ended source follows the cuts, so checkpoints
/// complete while process 0 still reads, not only the final one.
#[test]
fn a_process_without_partitions_does_not_stall_the_cuts() {
    let _serial = serial();
    let scratch = Scratch::new("cluster", "idle-process");
    let events = "20000000";
    let ports = free_ports(2);
    let hosts = scratch.0.join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", ports[0], ports[1])).unwrap();
    let (checkpoints, output) = (scratch.0.join("checkpoints"), scratch.0.join("out"));
    let procs = (0..2)
        .map(|process| {
            let log = scratch.0.join(format!("p{process}.log"));
            let child = Command::new(BIN)
                .args(["nexmark", "--query", "q5", "--events", events, "--partitions", "1", "--checkpoint-dir"])
                .arg(&checkpoints)
                .args(["--checkpoint-interval", "200ms", "--output-dir"])
                .arg(&output)
                .args(["--", "-w", "1", "-n", "2", "-p", &process.to_string(), "-h"])
                .arg(&hosts)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(File::create(&log).unwrap()))
                .spawn()
                .unwrap();
            Proc { child, log, status: None, label: format!("process {process}"), process }
        })
        .collect();
    let mut cluster = Cluster { procs, started: Instant::now(), layout: TWO_PROCESSES };
    cluster.wait_success(RUN_TIMEOUT);
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&output)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    parts.sort();
    assert!(parts.len() >= 3, "only {} parts: the cuts waited for the end of the input", parts.len());
    let mut rows: Vec<String> = parts
        .iter()
        .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .collect();
    rows.sort();
    let plain =
        Command::new(BIN).args(["nexmark", "-q", "q5", "--events", events, "--partitions", "1"]).output().unwrap();
    assert!(plain.status.success());
    let mut expected: Vec<String> =
        String::from_utf8(plain.stdout).unwrap().lines().skip(1).map(str::to_owned).collect();
    expected.sort();
    assert_eq!(rows, expected, "the committed rows differ from the plain run's");
}
