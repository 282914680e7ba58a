//! Crash tests of checkpoints and exactly-once output, with real processes:
//! `highwater nexmark` runs as a child process, is killed with SIGKILL at
//! random moments or at deterministic kill points, and is restarted with
//! `--recover`; its committed output must end up byte for byte the output of
//! a run that was never interrupted, which itself must hold exactly the rows
//! of the query's plain CSV output (no checkpoints involved).
//!
//! `HIGHWATER_CRASH_KILLS` sets the number of random kills of the crash loop
//! (default 21, spread over q5, q8 and q11); `HIGHWATER_CRASH_SEED` replays a
//! run's kill times (the seed is printed).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "common/crash.rs"]
mod crash;
use crash::{committed_parts, events_file, plain_rows, seed, Rng, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");

/// Where a job's events come from.
#[derive(Clone)]
enum Input {
    Generator(u64),
    File(PathBuf),
}

/// A checkpointed job: query, input, checkpoint and output directories.
struct Job {
    query: &'static str,
    input: Input,
    checkpoints: PathBuf,
    output: PathBuf,
    interval: &'static str,
    /// Keyed state on RocksDB under this directory (default: memory).
    state: Option<PathBuf>,
    /// More arguments of the query.
    extra: Vec<String>,
}

impl Job {
    fn new(query: &'static str, input: &Input, dir: &Path, name: &str) -> Job {
        Job {
            query,
            input: input.clone(),
            checkpoints: dir.join(format!("{name}-checkpoints")),
            output: dir.join(format!("{name}-out")),
            interval: "150ms",
            state: None,
            extra: Vec::new(),
        }
    }

    fn command(&self, workers: usize) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", self.query]);
        match &self.input {
            Input::Generator(n) => cmd.args(["--events", &n.to_string()]),
            Input::File(path) => cmd.arg("--input").arg(path),
        };
        cmd.arg("--checkpoint-dir")
            .arg(&self.checkpoints)
            .args(["--checkpoint-interval", self.interval, "--recover", "--output-dir"])
            .arg(&self.output);
        if let Some(state) = &self.state {
            cmd.args(["--state-backend", "rocksdb", "--state-cache", "16MiB", "--state-dir"]).arg(state);
        }
        cmd.args(&self.extra);
        cmd.args(["--", "-w", &workers.to_string()]).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    }

    fn spawn(&self, workers: usize) -> Child {
        self.command(workers).spawn().expect("starting highwater")
    }

    /// Runs to completion (with `kill_at`, a `HIGHWATER_KILL_AT` kill point).
    fn run(&self, workers: usize, kill_at: Option<&str>) -> Output {
        let mut cmd = self.command(workers);
        if let Some(point) = kill_at {
            cmd.env("HIGHWATER_KILL_AT", point);
        }
        cmd.output().expect("running highwater")
    }

    fn run_ok(&self, workers: usize) {
        let out = self.run(workers, None);
        assert!(out.status.success(), "{} failed: {}", self.query, String::from_utf8_lossy(&out.stderr));
    }

    /// The committed output: every part's data rows, parts in name order.
    /// Each part starts with the header row; nothing is left pending.
    fn committed(&self) -> String {
        committed_parts(&self.output)
    }
}

/// The uninterrupted run's committed output, checked against the plain CSV
/// output, and how long the run took.
fn reference(query: &'static str, input: &Input, dir: &Path) -> (String, Duration) {
    let job = Job::new(query, input, dir, &format!("{query}-reference"));
    let started = Instant::now();
    job.run_ok(2);
    let took = started.elapsed();
    let rows = job.committed();
    let mut sorted = table_of(&job, &rows);
    sorted.sort();
    let plain = plain_rows(query, dir, |cmd| {
        cmd.args(["--partitions", "4"]);
        match input {
            Input::Generator(n) => cmd.args(["--events", &n.to_string()]),
            Input::File(path) => cmd.arg("--input").arg(path),
        };
    });
    assert_eq!(sorted, plain, "{query}: committed parts differ from the plain output");
    assert!(!sorted.is_empty(), "{query} produced no rows: a vacuous test");
    (rows, took)
}

/// The rows of committed output: the data rows, or for an updating query's
/// changelog (a last column `diff`) the rows whose diffs sum to a positive
/// count, that many times.
fn table_of(job: &Job, rows: &str) -> Vec<String> {
    let header = std::fs::read_dir(&job.output)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "csv"))
        .map(|p| std::fs::read_to_string(p).unwrap().lines().next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    if !header.ends_with(",diff") {
        return rows.lines().map(str::to_owned).collect();
    }
    let mut table: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    for row in rows.lines() {
        let (line, diff) = row.rsplit_once(',').expect("a changelog row ends with its diff");
        *table.entry(line).or_insert(0) += diff.parse::<i64>().expect("a diff");
    }
    table.into_iter().flat_map(|(line, n)| std::iter::repeat_n(line.to_owned(), n.max(0) as usize)).collect()
}

/// Kills `kills` runs of `query` at random moments within `span` (an
/// uninterrupted run's duration), restarting each with `--recover` on the
/// next worker count of `workers`; whenever a job completes, its output must
/// equal `expected`, and a fresh job starts until all the kills are done.
fn crash_loop(
    query: &'static str,
    input: &Input,
    dir: &Path,
    (expected, span): &(String, Duration),
    kills: usize,
    (workers, ordered, state): (&[usize], bool, Option<&Path>),
    rng: &mut Rng,
) {
    let span = span.as_millis() as u64;
    let mut done = 0;
    let mut round = 0;
    let mut jobs = 0;
    while done < kills {
        jobs += 1;
        let mut job = Job::new(query, input, dir, &format!("{query}-crash-{jobs}"));
        job.state = state.map(Path::to_path_buf);
        loop {
            let w = workers[round % workers.len()];
            round += 1;
            let mut child = job.spawn(w);
            let started = Instant::now();
            if done < kills {
                let after = rng.millis(span / 10, span * 9 / 10 + 2);
                while started.elapsed() < after && child.try_wait().unwrap().is_none() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                    done += 1;
                    continue;
                }
            }
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{query} failed on recovery: {}", String::from_utf8_lossy(&out.stderr));
            break;
        }
        assert_same(query, &job.committed(), expected, done, ordered);
        let _ = std::fs::remove_dir_all(&job.checkpoints);
        let _ = std::fs::remove_dir_all(&job.output);
    }
    eprintln!("{query}: {done} kills over {jobs} jobs, {round} runs");
}

/// Asserts that a recovered job committed `expected`, saying where it does not.
/// With `ordered`, byte for byte; otherwise the same rows in any order.
fn assert_same(query: &str, got: &str, expected: &str, kills: usize, ordered: bool) {
    if got == expected {
        return;
    }
    let (g, e): (Vec<&str>, Vec<&str>) = (got.lines().collect(), expected.lines().collect());
    let at = g.iter().zip(&e).position(|(a, b)| a != b).unwrap_or(g.len().min(e.len()));
    let (mut gs, mut es) = (g.clone(), e.clone());
    gs.sort_unstable();
    es.sort_unstable();
    if !ordered && gs == es {
        return;
    }
    panic!(
        "{query}: output after {kills} kills differs from the uninterrupted run: {} rows vs {}, first difference at row {at}: {:?} vs {:?}; {}",
        g.len(),
        e.len(),
        g.get(at),
        e.get(at),
        if gs == es { "the same rows in another order" } else { "different rows" }
    );
}

fn kills() -> usize {
    std::env::var("HIGHWATER_CRASH_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(21)
}

#[test]
fn random_kills_of_q5_q8_and_sessions_leave_exactly_the_uninterrupted_output() {
    let scratch = Scratch::new("crash", "loop");
    let mut rng = Rng(seed());
    let kills = kills();
    let each = kills.div_ceil(3);
    // q5 (sliding and tumbling windows) from a file, at a steady 2 workers.
    let file = Input::File(events_file(&scratch.0, 1_000_000));
    let expected = reference("q5", &file, &scratch.0);
    crash_loop("q5", &file, &scratch.0, &expected, each, (&[2], true, None), &mut rng);
    // q8 (two tumbling windows and an interval join) from the generator, rescaled 2 → 1 → 2 …
    let generated = Input::Generator(20_000_000);
    let expected = reference("q8", &generated, &scratch.0);
    crash_loop("q8", &generated, &scratch.0, &expected, each, (&[2, 1], true, None), &mut rng);
    // q11 (session windows), rescaled 1 → 2 → 1 …
    let expected = reference("q11", &generated, &scratch.0);
    crash_loop("q11", &generated, &scratch.0, &expected, kills - 2 * each, (&[1, 2], true, None), &mut rng);
}

/// Runs `job` on `workers` workers until it kills itself at `point`.
#[cfg(feature = "fault-injection")]
fn killed_at(point: &str, job: &Job, workers: usize) {
    use std::os::unix::process::ExitStatusExt;
    let out = job.run(workers, Some(point));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(9), "the kill point {point} was not reached: {stderr}");
}

#[cfg(feature = "fault-injection")]
#[test]
fn kills_while_writing_a_shard_the_manifest_or_committing_recover() {
    let scratch = Scratch::new("crash", "points");
    let input = Input::Generator(6_000_000);
    let (expected, _) = reference("q5", &input, &scratch.0);
    for point in ["shard-write:8", "manifest-write:2", "sink-commit:2"] {
        let mut job = Job::new("q5", &input, &scratch.0, &point.replace(':', "-"));
        job.interval = "40ms";
        killed_at(point, &job, 2);
        if point.starts_with("sink-commit") {
            // The manifest is there, the part is not yet renamed into place.
            let pending = std::fs::read_dir(job.output.join(".pending")).unwrap().count();
            assert_eq!(pending, 1, "the killed commit should leave its part pending");
        }
        if point.starts_with("manifest-write") {
            let incomplete = std::fs::read_dir(&job.checkpoints)
                .unwrap()
                .filter_map(|e| e.ok())
                .any(|e| e.path().join("MANIFEST.tmp").exists() && !e.path().join("MANIFEST").exists());
            assert!(incomplete, "a half-written manifest should be left behind");
        }
        job.run_ok(2);
        assert_eq!(job.committed(), expected, "after a kill at {point}");
    }
    // The final checkpoint (the only one, with a long interval): its manifest
    // is written, its part not yet committed; the restart has nothing to run
    // but must commit the part.
    let mut job = Job::new("q5", &input, &scratch.0, "final-commit");
    job.interval = "1h";
    killed_at("sink-commit:1", &job, 2);
    assert_eq!(std::fs::read_dir(job.output.join(".pending")).unwrap().count(), 1);
    let out = job.run(2, None);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the job has completed"));
    assert_eq!(job.committed(), expected, "after a kill while committing the final checkpoint");
}

#[test]
fn recovery_rescales_from_one_worker_to_two_and_back() {
    let scratch = Scratch::new("crash", "rescale");
    let input = Input::Generator(8_000_000);
    for query in ["q5", "q11"] {
        let (expected, _) = reference(query, &input, &scratch.0);
        let job = Job::new(query, &input, &scratch.0, &format!("{query}-rescale"));
        killed_at("sink-commit:3", &job, 1);
        killed_at("sink-commit:3", &job, 2);
        job.run_ok(1);
        assert_eq!(job.committed(), expected, "{query} rescaled 1 → 2 → 1");
    }
}

/// Damages the newest checkpoint of `job` with `damage`, recovers, and checks
/// that the previous one was used (with a warning) and the output is right.
#[test]
fn damaged_checkpoints_fall_back_to_the_previous_one() {
    let scratch = Scratch::new("crash", "corrupt");
    let input = Input::Generator(6_000_000);
    let (expected, _) = reference("q5", &input, &scratch.0);
    type Damage = fn(&Path);
    let truncate: Damage = |chk| {
        let state = shard_file(chk, "/state");
        let len = std::fs::metadata(&state).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&state).unwrap().set_len(len / 2).unwrap();
    };
    let flip: Damage = |chk| {
        let state = shard_file(chk, "/state");
        let mut bytes = std::fs::read(&state).unwrap();
        let i = bytes.len() / 3;
        bytes[i] ^= 0x40;
        std::fs::write(&state, bytes).unwrap();
    };
    let no_manifest: Damage = |chk| std::fs::remove_file(chk.join("MANIFEST")).unwrap();
    let bad_manifest: Damage = |chk| {
        let path = chk.join("MANIFEST");
        let mut bytes = std::fs::read(&path).unwrap();
        let i = bytes.len() - 10;
        bytes[i] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
    };
    for (name, damage) in
        [("truncated", truncate), ("flipped", flip), ("no-manifest", no_manifest), ("bad-manifest", bad_manifest)]
    {
        let mut job = Job::new("q5", &input, &scratch.0, name);
        // Checkpoints often enough to reach the fourth however fast the run is.
        job.interval = "40ms";
        killed_at("sink-commit:4", &job, 2);
        let newest = newest_checkpoint(&job.checkpoints);
        damage(&newest);
        let verify = Command::new(BIN).args(["checkpoints", "verify"]).arg(&job.checkpoints).output().unwrap();
        let report = String::from_utf8_lossy(&verify.stdout);
        assert!(verify.status.success(), "an older checkpoint is still usable: {report}");
        assert!(!report.contains(&format!("{}: complete", newest.file_name().unwrap().to_string_lossy())), "{report}");
        let out = job.run(2, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        if name != "no-manifest" {
            assert!(stderr.contains("skipping a damaged checkpoint"), "{name}: no warning in {stderr}");
        }
        assert_eq!(job.committed(), expected, "after a {name} checkpoint");
    }
    // Nothing usable left: a clear error, not a fresh start.
    let job = Job::new("q5", &input, &scratch.0, "all-bad");
    killed_at("sink-commit:2", &job, 2);
    for entry in std::fs::read_dir(&job.checkpoints).unwrap() {
        let path = entry.unwrap().path();
        if path.join("MANIFEST").exists() {
            let state = shard_file(&path, "/state");
            std::fs::write(&state, b"garbage").unwrap();
        }
    }
    let out = job.run(2, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no usable checkpoint"), "{stderr}");
}

fn newest_checkpoint(dir: &Path) -> PathBuf {
    let mut complete: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("MANIFEST").exists()).collect();
    complete.sort();
    assert!(complete.len() >= 2, "need an older checkpoint to fall back to, have {complete:?}");
    complete.pop().unwrap()
}

fn shard_file(checkpoint: &Path, suffix: &str) -> PathBuf {
    let shard = checkpoint.join("shard-0");
    std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .unwrap_or_else(|| panic!("no {suffix} file in {}", shard.display()))
}

/// Every other query (aggregations by key, count and global windows, joins,
/// top-k) killed once at a random moment and recovered on another number of
/// workers: the committed output equals the uninterrupted run's.
#[test]
fn every_query_recovers_from_a_kill() {
    let scratch = Scratch::new("crash", "queries");
    let mut rng = Rng(seed());
    let generated = Input::Generator(1_000_000);
    let windowed = ["q7", "q13", "q14"];
    for query in [
        "q0", "q1", "q2", "q3", "q4", "q6", "q7", "q9", "q13", "q14", "q15", "q16", "q17", "q18", "q19", "q20", "q21",
        "q22",
    ] {
        let expected = reference(query, &generated, &scratch.0);
        // Rows go out at their timely times: for windows their last
        // millisecond, the same in every run; for unwindowed joins and
        // aggregations the times their records travel at, which depend on how
        // the source's partitions interleave (in uninterrupted runs too). So
        // rows are compared in order for windowed queries only.
        let ordered = windowed.contains(&query);
        crash_loop(query, &generated, &scratch.0, &expected, 1, (&[2, 1], ordered, None), &mut rng);
    }
}

/// The RocksDB state backend under kills: q20 (an unbounded join), q19
/// (top-k) and q18 (last value per key) with their keyed state in RocksDB,
/// killed with SIGKILL at random moments and at a kill point, recovered on
/// another number of workers, commit exactly the uninterrupted in-memory
/// run's rows; the databases of the killed processes are removed by the
/// processes after them, and the last one removes its own.
#[test]
fn the_rocksdb_backend_recovers_from_kills_onto_other_worker_counts() {
    let scratch = Scratch::new("crash", "rocksdb");
    let state = scratch.0.join("state");
    let mut rng = Rng(seed());
    let generated = Input::Generator(1_500_000);
    for query in ["q20", "q19", "q18"] {
        let expected = reference(query, &generated, &scratch.0);
        crash_loop(query, &generated, &scratch.0, &expected, 2, (&[2, 1, 3], false, Some(&state)), &mut rng);
        #[cfg(feature = "fault-injection")]
        {
            let mut job = Job::new(query, &generated, &scratch.0, &format!("{query}-rocksdb-point"));
            job.state = Some(state.clone());
            killed_at("sink-commit:3", &job, 3);
            job.run_ok(1);
            assert_same(query, &job.committed(), &expected.0, 1, false);
            // Killed between putting a checkpoint's database files and its
            // manifest: the recovery skips that checkpoint, and garbage
            // collection deletes its files.
            let mut job = Job::new(query, &generated, &scratch.0, &format!("{query}-rocksdb-put"));
            job.state = Some(state.clone());
            killed_at("database-put:3", &job, 2);
            let orphans = unreferenced_shared_files(&job.checkpoints);
            assert!(!orphans.is_empty(), "{query}: the killed checkpoint left no database files: not incremental?");
            job.run_ok(3);
            assert_same(query, &job.committed(), &expected.0, 1, false);
            let left = unreferenced_shared_files(&job.checkpoints);
            assert!(left.is_empty(), "{query}: shared files no kept checkpoint references: {left:?}");
            assert!(!shared_files(&job.checkpoints).is_empty(), "{query}: no database files in the checkpoints");
            let fetched: Vec<_> = std::fs::read_dir(&job.checkpoints)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.contains("highwater-restore-"))
                .collect();
            assert!(fetched.is_empty(), "{query}: fetched database files left behind: {fetched:?}");
        }
        let left: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{query}: state directories left behind: {left:?}");
    }
}

/// Incremental checkpoints: q20 (an unbounded join whose state only grows)
/// on the RocksDB backend, a checkpoint every 200 ms, every checkpoint
/// kept. Each one puts into the store only the database files its
/// predecessor did not have (what changed, rewritten by RocksDB's
/// compactions included), so the bytes put over the run are well below the
/// sum of the checkpoints' sizes, which is what a full checkpoint each
/// time would write.
#[test]
fn incremental_checkpoints_put_what_changed_not_the_whole_state() {
    let scratch = Scratch::new("crash", "incremental");
    let mut job = Job::new("q20", &Input::Generator(3_000_000), &scratch.0, "q20-incremental");
    job.state = Some(scratch.0.join("state"));
    job.interval = "200ms";
    job.extra = vec!["--checkpoints-kept".into(), "1000".into()];
    job.run_ok(2);
    let mut checkpoints = Vec::new();
    for entry in std::fs::read_dir(&job.checkpoints).unwrap() {
        let Ok(text) = std::fs::read_to_string(entry.unwrap().path().join("MANIFEST")) else { continue };
        let manifest: serde_json::Value = serde_json::from_str(text.split_once('\n').unwrap().1).unwrap();
        let id = manifest["id"].as_u64().unwrap();
        let size = |f: &serde_json::Value| f["size"].as_u64().unwrap();
        let shards: u64 =
            manifest["shards"].as_array().unwrap().iter().flat_map(|s| s["files"].as_array().unwrap()).map(size).sum();
        let shared = manifest["shared"].as_array().cloned().unwrap_or_default();
        let put_here = |f: &&serde_json::Value| f["name"].as_str().unwrap().starts_with(&format!("{id:010}-"));
        let total = shards + shared.iter().map(size).sum::<u64>();
        let written = shards + shared.iter().filter(put_here).map(size).sum::<u64>();
        assert!(!shared.is_empty(), "checkpoint {id} holds no database files: {text}");
        checkpoints.push((id, total, written));
    }
    checkpoints.sort_unstable();
    eprintln!("checkpoints (id, bytes, bytes put): {checkpoints:?}");
    assert!(checkpoints.len() >= 5, "too few checkpoints to measure: {checkpoints:?}");
    let (_, first_total, first_written) = checkpoints[0];
    assert_eq!(first_total, first_written, "the first checkpoint puts everything");
    // The state grows; a compaction may shrink the files a little (larger
    // files compress better), never by much.
    assert!(checkpoints.windows(2).all(|w| w[1].1 * 10 >= w[0].1 * 9), "the state grows: {checkpoints:?}");
    assert!(checkpoints.last().unwrap().1 > 2 * first_total, "the state grows: {checkpoints:?}");
    let total: u64 = checkpoints.iter().map(|c| c.1).sum();
    let written: u64 = checkpoints.iter().map(|c| c.2).sum();
    assert!(written * 2 < total, "{written} bytes put for checkpoints of {total} bytes in all: not incremental");
    let final_state = checkpoints.last().unwrap().1;
    assert!(written >= final_state, "the files of the last checkpoint were all put once");
}

/// The shared files (database files of incremental checkpoints) in a
/// checkpoint directory.
fn shared_files(checkpoints: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(checkpoints.join("shared")) else { return Vec::new() };
    entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// The shared files that no complete checkpoint's manifest lists.
fn unreferenced_shared_files(checkpoints: &Path) -> Vec<String> {
    let mut referenced = std::collections::HashSet::new();
    for entry in std::fs::read_dir(checkpoints).unwrap() {
        let Ok(text) = std::fs::read_to_string(entry.unwrap().path().join("MANIFEST")) else { continue };
        let body = text.split_once('\n').expect("a manifest header").1;
        let manifest: serde_json::Value = serde_json::from_str(body).expect("a manifest's JSON");
        for file in manifest["shared"].as_array().into_iter().flatten() {
            referenced.insert(file["name"].as_str().unwrap().to_owned());
        }
    }
    shared_files(checkpoints).into_iter().filter(|name| !referenced.contains(name)).collect()
}

/// q12 counts in processing-time windows: its output depends on the clock,
/// but its state recovers, and the job runs to its end after a kill.
#[test]
fn processing_time_windows_recover() {
    let scratch = Scratch::new("crash", "q12");
    let job = Job::new("q12", &Input::Generator(3_000_000), &scratch.0, "q12");
    killed_at("sink-commit:3", &job, 2);
    let out = job.run(1, None);
    assert!(out.status.success(), "q12 failed on recovery: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("cannot be checkpointed"), "{stderr}");
    assert!(!job.committed().is_empty(), "q12 committed no rows");
}

#[test]
fn jobs_that_cannot_be_checkpointed_or_restored_are_refused_at_start() {
    let scratch = Scratch::new("crash", "refused");
    let run = |args: &[&str]| {
        let started = Instant::now();
        let out = Command::new(BIN).args(args).stdin(Stdio::null()).output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30), "{args:?} took {:?}", started.elapsed());
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let dir = scratch.0.join("checkpoints").display().to_string();
    // stdin cannot be rewound.
    let err = run(&["nexmark", "-q", "q5", "--input", "-", "--checkpoint-dir", &dir, "--discard"]);
    assert!(err.contains("stdin cannot be rewound"), "{err}");
    // A checkpoint of q5 does not restore q7.
    let job = Job::new("q5", &Input::Generator(6_000_000), &scratch.0, "q5");
    killed_at("sink-commit:2", &job, 2);
    let checkpoints = job.checkpoints.display().to_string();
    let err =
        run(&["nexmark", "-q", "q7", "--events", "100000", "--checkpoint-dir", &checkpoints, "--recover", "--discard"]);
    assert!(err.contains("different dataflow"), "{err}");
    // Nor does starting without --recover reuse it.
    let err = run(&["nexmark", "-q", "q5", "--events", "100000", "--checkpoint-dir", &checkpoints, "--discard"]);
    assert!(err.contains("already holds checkpoints"), "{err}");
}
