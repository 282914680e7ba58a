//! The exactly-once PostgreSQL sink against a real server (a throwaway
//! cluster): `highwater nexmark --output-postgres` runs as a child process,
//! is killed at deterministic kill points (between the sink's pre-commit and
//! the manifest; between the manifest and the sink's commit) or with SIGKILL
//! at random moments, and is restarted with `--recover`; the table must end
//! up holding exactly the rows of the query's plain CSV output, with nothing
//! left staged and the progress at the final checkpoint. The committer is
//! also driven directly: pre-commits are invisible, commits replay as
//! no-ops, retractions delete by key, recovery discards newer parts.
//!
//! `HIGHWATER_CRASH_SEED` replays a run's kill times (the seed is printed).

#[path = "common/postgres.rs"]
mod pg;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use highwater::checkpoint::SinkCommitter;
use highwater::sink::{parse_csv_line, PostgresCommitter, PostgresSinkConfig, PostgresSinkError};
use pg::PgCluster;

#[path = "common/crash.rs"]
mod crash;
use crash::{seed, Rng, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");
const EVENTS: &str = "6000000";
const COLUMNS: &str = "window_start, window_end, auction, num";

/// The crash tests run one at a time (each runs the job several times).
static HEAVY: Mutex<()> = Mutex::new(());

/// A fresh database of the cluster; its connection string.
fn database(cluster: &PgCluster, name: &str) -> String {
    let mut client = cluster.client();
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    client.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    format!("host=127.0.0.1 port={} user=postgres dbname={name}", cluster.port())
}

fn connect(conninfo: &str) -> postgres::Client {
    postgres::Client::connect(conninfo, postgres::NoTls).unwrap()
}

/// q5's rows from the plain CSV output (no checkpoints), parsed, sorted; computed once.
fn expected_rows() -> &'static Vec<Vec<String>> {
    static ROWS: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    ROWS.get_or_init(|| {
        let scratch = Scratch::new("pgsink", "plain");
        let csv = scratch.0.join("q5.csv");
        let out = Command::new(BIN)
            .args(["nexmark", "-q", "q5", "--events", EVENTS, "--partitions", "4", "--output"])
            .arg(&csv)
            .args(["--", "-w", "2"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(&csv).unwrap();
        let mut rows: Vec<Vec<String>> = text.lines().skip(1).map(|l| parse_csv_line(l).unwrap()).collect();
        rows.sort();
        assert!(rows.len() > 100, "q5 produced {} rows: a vacuous test", rows.len());
        rows
    })
}

/// A checkpointed q5 job writing into table `q5` of its own database.
struct Job {
    conninfo: String,
    checkpoints: PathBuf,
    interval: &'static str,
}

impl Job {
    fn new(cluster: &PgCluster, scratch: &Path, name: &str) -> Job {
        Job {
            conninfo: database(cluster, name),
            checkpoints: scratch.join(format!("{name}-checkpoints")),
            interval: "150ms",
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q5", "--events", EVENTS, "--checkpoint-dir"])
            .arg(&self.checkpoints)
            .args(["--checkpoint-interval", self.interval, "--recover", "--output-postgres", &self.conninfo])
            .args(["--output-table", "q5", "--output-key", "window_start,window_end,auction", "--", "-w", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, kill_at: Option<&str>) -> Output {
        let mut cmd = self.command();
        if let Some(point) = kill_at {
            cmd.env("HIGHWATER_KILL_AT", point);
        }
        cmd.output().expect("running highwater")
    }

    fn run_ok(&self) {
        let out = self.run(None);
        assert!(out.status.success(), "the job failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    #[cfg(feature = "fault-injection")]
    fn killed_at(&self, point: &str) {
        use std::os::unix::process::ExitStatusExt;
        let out = self.run(Some(point));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(9), "the kill point {point} was not reached: {stderr}");
    }

    /// The table's rows, sorted.
    fn rows(&self) -> Vec<Vec<String>> {
        let mut client = connect(&self.conninfo);
        let rows = client.query(&format!("SELECT {COLUMNS} FROM q5 ORDER BY {COLUMNS}"), &[]).unwrap();
        let mut rows: Vec<Vec<String>> = rows.iter().map(|r| (0..4).map(|i| r.get::<_, String>(i)).collect()).collect();
        rows.sort();
        rows
    }

    /// The checkpoints of the sink's staged parts.
    fn staged(&self) -> Vec<i64> {
        let mut client = connect(&self.conninfo);
        let rows = client
            .query("SELECT checkpoint FROM highwater_sink_pending WHERE sink = 'Output:q5' ORDER BY 1", &[])
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// The sink's progress rows: `(sink, checkpoint)`.
    fn progress(&self) -> Vec<(String, i64)> {
        let mut client = connect(&self.conninfo);
        let rows = client.query("SELECT sink, checkpoint FROM highwater_sink_progress", &[]).unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    /// Complete checkpoints, from `highwater checkpoints list`: (id, final?).
    fn checkpoints(&self) -> Vec<(i64, bool)> {
        let out = Command::new(BIN).args(["checkpoints", "list"]).arg(&self.checkpoints).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter(|line| line.ends_with("complete"))
            .map(|line| {
                let mut words = line.split_whitespace();
                (words.next().unwrap().parse().unwrap(), words.next() == Some("final"))
            })
            .collect()
    }

    /// After a kill: what the table shows is some checkpoint's output, no
    /// more than the newest complete checkpoint's, and a subset of the result.
    fn check_interrupted(&self) {
        let newest = self.checkpoints().last().map_or(0, |c| c.0);
        let progress = self.progress();
        assert!(progress.len() <= 1, "{progress:?}");
        let done = progress.first().map_or(0, |p| p.1);
        assert!(done <= newest, "progress {done} beyond the newest complete checkpoint {newest}");
        let expected = expected_rows();
        for row in self.rows() {
            assert!(expected.binary_search(&row).is_ok(), "row {row:?} is not in the result");
        }
        for staged in self.staged() {
            assert!(staged > done, "checkpoint {staged} is staged but the progress is at {done}");
        }
    }

    /// After completion: exactly the plain output's rows, nothing staged,
    /// the progress at the final checkpoint.
    fn check_complete(&self, case: &str) {
        let rows = self.rows();
        let expected = expected_rows();
        if &rows != expected {
            let missing = expected.iter().filter(|r| rows.binary_search(r).is_err()).count();
            let extra = rows.iter().filter(|r| expected.binary_search(r).is_err()).count();
            panic!("{case}: the table differs from the plain output: {missing} rows missing, {extra} extra");
        }
        assert_eq!(self.staged(), Vec::<i64>::new(), "{case}: parts left staged");
        let checkpoints = self.checkpoints();
        let (last, is_final) = *checkpoints.last().expect("checkpoints");
        assert!(is_final, "{case}: the newest checkpoint is not the final one: {checkpoints:?}");
        assert_eq!(self.progress(), [("Output:q5".to_owned(), last)], "{case}: progress");
    }
}

#[cfg(feature = "fault-injection")]
#[test]
fn kill_between_pre_commit_and_manifest_then_recover() {
    let cluster = PgCluster::shared();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("pgsink", "manifest");
    let job = Job::new(&cluster, &scratch.0, "case_manifest");
    job.killed_at("manifest-write:2");
    // Checkpoint 1 is committed; checkpoint 2's part (if it had rows) is
    // staged, invisible, and has no manifest.
    assert_eq!(job.progress(), [("Output:q5".to_owned(), 1)]);
    assert!(job.staged().iter().all(|&c| c == 2), "{:?}", job.staged());
    assert_eq!(job.checkpoints().last().map(|c| c.0), Some(1));
    job.check_interrupted();
    job.run_ok();
    job.check_complete("killed writing manifest 2");
}

#[cfg(feature = "fault-injection")]
#[test]
fn kill_between_manifest_and_commit_then_recover() {
    let cluster = PgCluster::shared();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("pgsink", "commit");
    let job = Job::new(&cluster, &scratch.0, "case_commit");
    job.killed_at("sink-commit:2");
    // Checkpoint 2 exists (its manifest is written), its part is not yet applied.
    assert_eq!(job.progress(), [("Output:q5".to_owned(), 1)]);
    assert!(job.staged().iter().all(|&c| c == 2), "{:?}", job.staged());
    assert_eq!(job.checkpoints().last().map(|c| c.0), Some(2));
    job.check_interrupted();
    job.run_ok();
    job.check_complete("killed before committing checkpoint 2");
}

/// Three SIGKILLs at random moments (300–1500 ms after a start), each run
/// restarted with `--recover`; a job that completes before its kill is
/// checked and followed by a fresh one (its own database) until all the
/// kills are done.
#[test]
fn random_kills_then_recover() {
    const KILLS: usize = 3;
    let cluster = PgCluster::shared();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("pgsink", "random");
    let mut rng = Rng(seed());
    let mut kills = 0;
    let mut jobs = 0;
    while kills < KILLS {
        jobs += 1;
        let job = Job::new(&cluster, &scratch.0, &format!("case_random_{jobs}"));
        loop {
            let mut child = job.command().spawn().expect("starting highwater");
            if kills < KILLS {
                let after = rng.millis(300, 1500);
                let started = Instant::now();
                while started.elapsed() < after && child.try_wait().unwrap().is_none() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                    kills += 1;
                    eprintln!("job {jobs}: killed after {after:?}");
                    job.check_interrupted();
                    continue;
                }
            }
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "the job failed: {}", String::from_utf8_lossy(&out.stderr));
            break;
        }
        job.check_complete(&format!("job {jobs}, after {kills} kills in all"));
    }
    eprintln!("{kills} kills over {jobs} jobs");
}

/// With one checkpoint only, the final one, killed between its manifest and
/// the sink's commit: the restart finds the job complete and runs no
/// worker, but still commits the final part.
#[cfg(feature = "fault-injection")]
#[test]
fn kill_before_committing_the_final_checkpoint_then_recover() {
    let cluster = PgCluster::shared();
    let _heavy = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("pgsink", "final");
    let mut job = Job::new(&cluster, &scratch.0, "case_final");
    job.interval = "1h";
    job.killed_at("sink-commit:1");
    assert_eq!(job.checkpoints(), [(1, true)]);
    assert_eq!(job.progress(), []);
    assert_eq!(job.staged(), [1]);
    assert_eq!(job.rows(), Vec::<Vec<String>>::new());
    let out = job.run(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("nothing to do"), "{stderr}");
    job.check_complete("killed before committing the final checkpoint");
}

/// Drives a committer directly, as the checkpoint writer and a recovery do.
#[test]
fn the_committer_stages_commits_once_and_discards_newer_parts() {
    let cluster = PgCluster::shared();
    let conninfo = database(&cluster, "case_committer");
    let config = PostgresSinkConfig {
        conninfo: conninfo.clone(),
        table: "kv".into(),
        columns: vec!["k".into(), "v".into()],
        key: vec!["k".into()],
    };
    let committer = PostgresCommitter::connect("T", &config).unwrap();
    committer.abort_after(0).unwrap();
    let mut client = connect(&conninfo);
    let mut table = move || -> (Vec<(String, String)>, Vec<i64>, Vec<i64>) {
        let rows = client.query("SELECT k, v FROM kv ORDER BY k", &[]).unwrap();
        let staged = client.query("SELECT checkpoint FROM highwater_sink_pending ORDER BY 1", &[]).unwrap();
        let progress = client.query("SELECT checkpoint FROM highwater_sink_progress", &[]).unwrap();
        (
            rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
            staged.iter().map(|r| r.get(0)).collect(),
            progress.iter().map(|r| r.get(0)).collect(),
        )
    };
    let kv = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    let part = |rows: &[(&str, &str, i64)]| {
        let rows: Vec<(Vec<String>, i64)> =
            rows.iter().map(|(k, v, d)| (vec![k.to_string(), v.to_string()], *d)).collect();
        (postcard::to_allocvec(&rows).unwrap(), rows.len() as u64)
    };

    // Pre-committed: staged, invisible.
    let (bytes, n) = part(&[("x", "1", 1), ("y", "2", 1), ("q,\"uoted\"", "ü", 1)]);
    let p1 = committer.prepare(1, Some((&bytes, n))).unwrap();
    assert_eq!(
        (p1.kind.as_str(), p1.target.as_str(), p1.committed.as_str(), p1.rows),
        ("postgres", "kv", "checkpoint 1", 3)
    );
    assert_eq!(table(), (vec![], vec![1], vec![]));
    committer.commit(&p1).unwrap();
    let after_1 = kv(&[("q,\"uoted\"", "ü"), ("x", "1"), ("y", "2")]);
    assert_eq!(table(), (after_1.clone(), vec![], vec![1]));
    // A replayed commit does nothing.
    committer.commit(&p1).unwrap();
    assert_eq!(table(), (after_1.clone(), vec![], vec![1]));

    // Retractions delete by key; of two rows with one key the last is upserted.
    let (bytes, n) = part(&[("x", "1", -1), ("y", "2", -1), ("y", "3", 1), ("z", "0", 1), ("z", "9", 1)]);
    let p2 = committer.prepare(2, Some((&bytes, n))).unwrap();
    committer.commit(&p2).unwrap();
    let after_2 = kv(&[("q,\"uoted\"", "ü"), ("y", "3"), ("z", "9")]);
    assert_eq!(table(), (after_2.clone(), vec![], vec![2]));
    // A checkpoint without output still advances the progress.
    let p3 = committer.prepare(3, None).unwrap();
    assert_eq!((p3.pending.as_str(), p3.rows), ("", 0));
    committer.commit(&p3).unwrap();
    assert_eq!(table(), (after_2.clone(), vec![], vec![3]));

    // Recovery from checkpoint 1 (2 and 3 damaged): the progress goes back,
    // and the replay applies checkpoint 2 again, to the same effect.
    committer.abort_after(1).unwrap();
    assert_eq!(table(), (after_2.clone(), vec![], vec![1]));
    let p2 = committer.prepare(2, Some((&bytes, n))).unwrap();
    committer.commit(&p2).unwrap();
    assert_eq!(table(), (after_2.clone(), vec![], vec![2]));

    // A part staged for a checkpoint that never got its manifest is discarded.
    let (bytes, n) = part(&[("w", "never", 1)]);
    committer.prepare(3, Some((&bytes, n))).unwrap();
    assert_eq!(table(), (after_2.clone(), vec![3], vec![2]));
    committer.abort_after(2).unwrap();
    assert_eq!(table(), (after_2.clone(), vec![], vec![2]));

    // Errors, not panics: another table's part, a part without a checkpoint,
    // a part whose staged rows are gone.
    let mut other = p2.clone();
    other.target = "elsewhere".into();
    assert!(committer.commit(&other).unwrap_err().to_string().contains("elsewhere"));
    let mut files = p2.clone();
    files.kind = "files".into();
    assert!(committer.commit(&files).unwrap_err().to_string().contains("files sink"));
    let mut nameless = p2.clone();
    nameless.committed = "part-7".into();
    assert!(committer.commit(&nameless).is_err());
    let mut lost = p2.clone();
    lost.committed = "checkpoint 9".into();
    let e = committer.commit(&lost).unwrap_err().to_string();
    assert!(e.contains("not staged"), "{e}");
}

/// A table created beforehand with typed columns: values are cast from
/// text. One without a unique constraint on the key is refused at start.
#[test]
fn existing_tables_with_typed_columns_or_without_the_key() {
    let cluster = PgCluster::shared();
    let conninfo = database(&cluster, "case_existing");
    let mut client = connect(&conninfo);
    client
        .batch_execute(
            "CREATE TABLE typed (id bigint PRIMARY KEY, name varchar(20), at timestamptz);\
             CREATE TABLE keyless (id text, name text)",
        )
        .unwrap();
    let config = |table: &str, columns: &[&str]| PostgresSinkConfig {
        conninfo: conninfo.clone(),
        table: table.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        key: vec!["id".into()],
    };
    let committer = PostgresCommitter::connect("T", &config("typed", &["id", "name", "at"])).unwrap();
    let rows = vec![(vec!["42".to_string(), "forty-two".to_string(), "2024-01-01 00:00:00+00".to_string()], 1i64)];
    let part = committer.prepare(1, Some((&postcard::to_allocvec(&rows).unwrap(), 1))).unwrap();
    committer.commit(&part).unwrap();
    let row = client.query_one("SELECT id, name FROM typed", &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, String>(1)), (42, "forty-two".to_owned()));

    let e = PostgresCommitter::connect("T", &config("keyless", &["id", "name"])).unwrap_err().to_string();
    assert!(e.contains("ON CONFLICT"), "{e}");
    let e = PostgresCommitter::connect("T", &config("typed", &["id", "missing"])).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
    match PostgresCommitter::connect("T", &config("typed", &["name"])).unwrap_err() {
        PostgresSinkError::KeyNotInColumns { name, .. } => assert_eq!(name, "id"),
        e => panic!("{e}"),
    }
}

/// Bad settings fail fast with a message naming them (the workers never start).
#[test]
fn bad_settings_fail_clearly() {
    let scratch = Scratch::new("pgsink", "settings");
    let run = |extra: &[&str], conninfo: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q5", "--events", "100000", "--checkpoint-dir"])
            .arg(scratch.0.join(format!("ck-{}", extra.join("-"))))
            .args(["--output-postgres", conninfo])
            .args(extra)
            .args(["--", "-w", "2"]);
        let started = Instant::now();
        let out = cmd.output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let no_server = "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=5";
    let e = run(&["--output-key", "nope"], no_server);
    assert!(e.contains("`key`") && e.contains("nope"), "{e}");
    let e = run(&["--output-table", "bad name"], no_server);
    assert!(e.contains("`table`"), "{e}");
    let e = run(&[], no_server);
    assert!(e.contains("connecting"), "{e}");
    let out = Command::new(BIN)
        .args(["nexmark", "-q", "q5", "--events", "1000", "--output-postgres", no_server])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--checkpoint-dir"));
    let out = Command::new(BIN)
        .args(["nexmark", "-q", "q5", "--events", "1000", "--checkpoint-dir", "x", "--output-postgres", no_server])
        .args(["--output-dir", "y"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}
