//! A PostgreSQL server stopped for good under the CDC source (a real,
//! throwaway cluster): the source retries, then fails the job with the
//! server's error once it has been unreachable for its `reconnect_timeout`;
//! the job stops without a final checkpoint or sink commit; with the server
//! back, a recovery resumes from the last good checkpoint and the committed
//! output holds every change exactly once.

#[path = "common/crash.rs"]
mod crash;
#[path = "common/postgres.rs"]
mod pg;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crash::Scratch;
use highwater::cdc::postgres::{PostgresConfig, PostgresSource};
use highwater::cdc::{Change, Op};
use highwater::checkpoint::{latest_usable, CheckpointConfig, Checkpoints, LocalStore};
use highwater::prelude::*;
use highwater::sink::{write_parts, PartFormat};
use highwater::source::run_until_failed;
use pg::PgCluster;

const TABLE: &str = "cdc_gone";

/// A running job: CDC changes of `TABLE` as lines `op key lsn` into
/// exactly-once part files, checkpointed every 50 ms.
struct Job {
    source: Arc<PostgresSource>,
    handle: std::thread::JoinHandle<(Result<(), String>, Result<bool, String>)>,
}

impl Job {
    fn start(cluster: &PgCluster, checkpoints: &Path, out: &Path, recover: bool) -> Job {
        let mut config = PostgresConfig::new(cluster.url(), [TABLE], "hw_gone", "hw_gone");
        config.poll_interval = highwater::time::Millis(20);
        config.max_backoff = highwater::time::Millis(200);
        config.reconnect_timeout = highwater::time::Millis(2_000);
        let source = Arc::new(PostgresSource::new(config).expect("valid configuration"));
        let mut ck_config = CheckpointConfig::new(checkpoints.display().to_string());
        ck_config.recover = recover;
        ck_config.interval = Duration::from_millis(50);
        let ck = Checkpoints::open(ck_config, 1).expect("opening the checkpoints");
        let (src, out) = (Arc::clone(&source), out.to_path_buf());
        let handle = std::thread::spawn(move || {
            let mut timely_config = timely::Config::thread();
            ck.configure(&mut timely_config);
            let metrics = SourceMetrics::default();
            let (m, c) = (metrics.clone(), ck.clone());
            let guards = timely::execute(timely_config, move |worker| -> Result<(), String> {
                worker.dataflow(|scope| -> Result<(), String> {
                    let options = SourceOptions { name: "pg".into(), batch_size: 50, ..Default::default() };
                    let changes = read(scope, Arc::clone(&src), |c: &Change| c.time, options, &m, None)
                        .map_err(|e| e.to_string())?
                        .events;
                    let lines = changes.map(|c| format!("{:?} {:?} {}", c.op, c.key, c.lsn));
                    write_parts(&lines, "changes", out.clone(), None, PartFormat::Rows).map_err(|e| e.to_string())?;
                    Ok(())
                })?;
                c.built(worker).map_err(|e| e.to_string())?;
                run_until_failed(worker, &[&m]).map_err(|e| e.to_string())
            })
            .expect("timely starts");
            let workers: Result<Vec<()>, String> =
                guards.join().into_iter().map(|r| r.expect("no worker panics")).collect();
            (workers.map(|_| ()), ck.finish().map_err(|e| e.to_string()))
        });
        Job { source, handle }
    }
}

/// The committed lines of the part files in `out`, in commit order.
fn committed(out: &Path) -> Vec<String> {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(out)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    parts.sort();
    parts
        .iter()
        .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// Waits until at least `n` lines are committed in `out`.
fn wait_committed(out: &Path, n: usize, what: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = committed(out);
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "{what}: {} of {n} lines committed", lines.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Inserts `ids` as rows, one transaction each.
fn insert(cluster: &PgCluster, ids: std::ops::Range<i64>) {
    let mut sql = cluster.client();
    for id in ids {
        sql.batch_execute(&format!("INSERT INTO {TABLE} VALUES ({id}, {id})")).unwrap();
    }
}

#[test]
fn a_server_stopped_for_good_fails_the_job_which_recovers_from_its_last_checkpoint() {
    let scratch = Scratch::new("cdc-failures", "stopped");
    let (ck, out) = (scratch.0.join("ck"), scratch.0.join("out"));
    let mut cluster = PgCluster::start();
    cluster
        .client()
        .batch_execute(&format!(
            "CREATE TABLE {TABLE} (id int8 PRIMARY KEY, v int8); \
             INSERT INTO {TABLE} SELECT g, g FROM generate_series(1, 100) g"
        ))
        .unwrap();

    // The snapshot and 50 inserts are committed; then the server stops for good.
    let job = Job::start(&cluster, &ck, &out, false);
    wait_committed(&out, 100, "the snapshot");
    insert(&cluster, 101..151);
    wait_committed(&out, 150, "the inserts before the stop");
    cluster.stop();
    let started = Instant::now();
    let (workers, finished) = job.handle.join().expect("the job thread");
    let error = workers.expect_err("the job fails when the server is gone for good");
    assert!(error.contains("unavailable") && error.contains("could not be reached"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(30), "the source gave up after {:?}", started.elapsed());
    let finished = finished.expect_err("checkpointing fails with the source");
    assert!(finished.contains("unavailable"), "{finished}");
    let latest = latest_usable(&LocalStore::open(ck.clone()).unwrap()).unwrap();
    assert!(latest.as_ref().is_some_and(|(m, _)| !m.is_final()), "a checkpoint, but no final one, after a failure");
    drop(job.source);

    // The server back with more changes: the job recovers from its last
    // checkpoint and commits every change exactly once.
    cluster.start_again();
    insert(&cluster, 151..201);
    let job = Job::start(&cluster, &ck, &out, true);
    wait_committed(&out, 200, "after the recovery");
    job.source.stop();
    let (workers, finished) = job.handle.join().expect("the job thread");
    assert_eq!((workers, finished), (Ok(()), Ok(true)));
    let lines = committed(&out);
    let mut unique = lines.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), lines.len(), "a change committed twice");
    let count = |op: Op| lines.iter().filter(|l| l.starts_with(&format!("{op:?} "))).count();
    assert_eq!((count(Op::Read), count(Op::Insert), lines.len()), (100, 100, 200), "every change once");
}
