//! PostgreSQL CDC → table → PostgreSQL sink, checkpointed, killed with
//! SIGKILL at random moments and recovered (on 1 or 2 workers), against a
//! real, throwaway cluster, while a writer keeps changing the source table.
//!
//! The job (this test binary run again as a child, `child_job`) reads the
//! changes of `accounts(id, owner, balance)`, keeps the table keyed by `id`
//! (an upsert table), and writes with the exactly-once PostgreSQL sink:
//! - `totals(owner, n, total)`: count and sum of balances per owner;
//! - `ops(op, n)`: how many changes of each kind it has read (a change
//!   read twice or lost shows here, even where the upsert table would
//!   absorb it).
//!
//! Expected, independently of highwater: `totals` equals
//! `SELECT owner, count(*), sum(balance) FROM accounts GROUP BY owner` on
//! the source table at the end, and `ops` the writer's own tally of the
//! rows it inserted, updated and deleted (plus the snapshot's rows). This
//! holds only if the replication slot keeps every change after the last
//! committed checkpoint (the source's commit step): a slot advanced as
//! changes are handed out is past the checkpoint after a kill, and the
//! recovery fails.
//!
//! `HIGHWATER_CRASH_SEED` replays a run's kill times and changes.

#[path = "common/crash.rs"]
mod crash;
#[path = "common/postgres.rs"]
mod pg;

use std::collections::BTreeMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crash::{seed, Rng, Scratch};
use highwater::cdc::postgres::{PostgresConfig, PostgresSource};
use highwater::cdc::{Change, Row};
use highwater::checkpoint::{CheckpointConfig, Checkpoints};
use highwater::prelude::*;
use highwater::sink::{write_postgres, PostgresSinkConfig};
use highwater::source::run_until_failed;
use pg::PgCluster;

/// Rows of `accounts` before the job starts (read by its snapshot).
const INITIAL: i64 = 60;
/// Owners the rows are spread over.
const OWNERS: u64 = 7;

/// The job, when this binary runs as the child (`HW_CDC_CHILD` set):
/// `source-url|sink-url|checkpoint-dir|recover|workers[|records-a-second]`.
#[test]
#[ignore = "the child process of cdc_to_postgres_exactly_once_through_sigkills; runs only when that test starts it"]
fn child_job() {
    let Ok(spec) = std::env::var("HW_CDC_CHILD") else {
        panic!("child_job is started by cdc_to_postgres_exactly_once_through_sigkills (HW_CDC_CHILD is not set)");
    };
    let mut parts: Vec<&str> = spec.split('|').collect();
    // An optional sixth field: the source's rate limit (records a second).
    let rate: Option<f64> = if parts.len() == 6 { parts.pop().and_then(|r| r.parse().ok()) } else { None };
    let [source_url, sink_url, checkpoints, recover, workers] = parts[..] else { panic!("bad HW_CDC_CHILD {spec}") };
    let workers: usize = workers.parse().unwrap();
    let _ = tracing_subscriber::fmt().with_env_filter("highwater=debug").with_writer(std::io::stderr).try_init();
    let mut config = PostgresConfig::new(source_url, ["accounts"], "hw_eo", "hw_eo");
    config.poll_interval = highwater::time::Millis(20);
    let source = Arc::new(PostgresSource::new(config).unwrap());
    let mut ck_config = CheckpointConfig::new(checkpoints);
    ck_config.recover = recover == "true";
    ck_config.interval = Duration::from_millis(100);
    let ck = Checkpoints::open(ck_config, workers).unwrap();
    let mut timely_config = timely::Config::process(workers);
    ck.configure(&mut timely_config);
    let metrics = SourceMetrics::default();
    let (m, c, sink_url) = (metrics.clone(), ck.clone(), sink_url.to_owned());
    let guards = timely::execute(timely_config, move |worker| -> Result<(), String> {
        worker.dataflow(|scope| -> Result<(), String> {
            let options = SourceOptions { name: "pg".into(), batch_size: 50, rate_limit: rate, ..Default::default() };
            let changes = read(scope, Arc::clone(&source), |c: &Change| c.time, options, &m, None)
                .map_err(|e| e.to_string())?
                .events;
            let rows = changes.flat_map(|change| change.upserts(|before| before.project(&["id"])));
            let table = rows.upsert().table;
            let owner = |(_, row): &(Row, Row)| row.get("owner").and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            let balance = |(_, row): &(Row, Row)| row.get("balance").and_then(|v| v.as_i64()).unwrap_or(0);
            let totals = table.changelog().aggregate_by_key(owner, (Count, Sum::of(balance)));
            let sink = |table: &str, columns: &[&str], key: &str| PostgresSinkConfig {
                conninfo: sink_url.clone(),
                table: table.to_owned(),
                columns: columns.iter().map(|c| c.to_string()).collect(),
                key: vec![key.to_owned()],
            };
            let lines = totals.map(|(owner, (n, total))| format!("{owner},{n},{total}"));
            write_postgres(&lines, "totals", sink("totals", &["owner", "n", "total"], "owner"))
                .map_err(|e| e.to_string())?;
            let ops = changes.aggregate_by_key(|c: &Change| format!("{:?}", c.op), Count);
            let lines = ops.map(|(op, n)| format!("{op},{n}"));
            write_postgres(&lines, "ops", sink("ops", &["op", "n"], "op")).map_err(|e| e.to_string())?;
            Ok(())
        })?;
        c.built(worker).map_err(|e| e.to_string())?;
        run_until_failed(worker, &[&m]).map_err(|e| e.to_string())
    })
    .unwrap();
    for result in guards.join() {
        result.unwrap().unwrap();
    }
}

/// A fresh database of the cluster; its connection string.
fn database(cluster: &PgCluster, name: &str) -> String {
    let mut client = cluster.client();
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    client.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    format!("host=127.0.0.1 port={} user=postgres dbname={name}", cluster.port())
}

fn connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap()
}

/// Starts the job as a child process; its log goes to `log`.
fn start_job(spec: &str, log: &std::path::Path) -> Child {
    crash::start_child_job("HW_CDC_CHILD", spec, log)
}

/// The rows of a sink table, as text.
fn sink_rows(sink: &mut postgres::Client, query: &str) -> Vec<Vec<String>> {
    match sink.query(query, &[]) {
        Ok(rows) => rows.iter().map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect()).collect(),
        Err(_) => Vec::new(), // not created yet
    }
}

/// What the writer did: rows inserted, updated and deleted.
#[derive(Debug, Default)]
struct Tally {
    inserts: u64,
    updates: u64,
    deletes: u64,
}

/// Changes `accounts` in small transactions until `stop`: inserts, updates
/// (balances and owners) and deletes, by primary key, so each statement
/// changes exactly one row.
fn write(url: &str, mut rng: Rng, stop: &AtomicBool) -> Tally {
    let mut client = connect(url);
    let mut ids: Vec<i64> = (1..=INITIAL).collect();
    let mut next = INITIAL + 1;
    let mut tally = Tally::default();
    while !stop.load(Ordering::SeqCst) {
        let mut sql = String::from("BEGIN;");
        for _ in 0..1 + rng.next() % 3 {
            match rng.next() % 10 {
                0..=3 => {
                    let owner = rng.next() % OWNERS;
                    sql += &format!("INSERT INTO accounts VALUES ({next}, 'o{owner}', {});", rng.next() % 1000);
                    ids.push(next);
                    next += 1;
                    tally.inserts += 1;
                }
                4..=7 if !ids.is_empty() => {
                    let id = ids[(rng.next() % ids.len() as u64) as usize];
                    let owner = rng.next() % OWNERS;
                    sql += &format!(
                        "UPDATE accounts SET balance = balance + {}, owner = 'o{owner}' WHERE id = {id};",
                        rng.next() % 100
                    );
                    tally.updates += 1;
                }
                _ if ids.len() > 10 => {
                    let id = ids.swap_remove((rng.next() % ids.len() as u64) as usize);
                    sql += &format!("DELETE FROM accounts WHERE id = {id};");
                    tally.deletes += 1;
                }
                _ => {}
            }
        }
        sql += "COMMIT;";
        client.batch_execute(&sql).unwrap();
        std::thread::sleep(Duration::from_millis(3));
    }
    tally
}

#[test]
fn cdc_to_postgres_exactly_once_through_sigkills() {
    let scratch = Scratch::new("cdc-eo", "sigkill");
    let cluster = PgCluster::start();
    let source_url = database(&cluster, "cdc_source");
    let sink_url = database(&cluster, "cdc_sink");
    connect(&source_url)
        .batch_execute(&format!(
            "CREATE TABLE accounts (id int8 PRIMARY KEY, owner text NOT NULL, balance int8 NOT NULL); \
             INSERT INTO accounts SELECT g, 'o' || (g % {OWNERS}), g * 10 FROM generate_series(1, {INITIAL}) g"
        ))
        .unwrap();
    let checkpoints = scratch.0.join("checkpoints");
    let seed = seed();
    let mut rng = Rng(seed);
    let spec = |recover: bool, workers: usize| {
        format!("{source_url}|{sink_url}|{}|{recover}|{workers}", checkpoints.display())
    };
    let mut sink = connect(&sink_url);
    let read_count = |sink: &mut postgres::Client| {
        sink_rows(sink, "SELECT op, n FROM ops WHERE op = 'Read'").first().map(|r| r[1].clone())
    };

    // The first run: its snapshot committed before any kill (a kill during
    // the snapshot starts the next run with a new one).
    let mut run = 0;
    let log = |run: usize| scratch.0.join(format!("job-{run}.log"));
    let mut job = start_job(&spec(false, 2), &log(run));
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_count(&mut sink) != Some(INITIAL.to_string()) {
        assert!(
            Instant::now() < deadline,
            "the snapshot was not committed: {}",
            std::fs::read_to_string(log(run)).unwrap()
        );
        assert!(job.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(log(run)).unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (url, stop, rng) = (source_url.clone(), Arc::clone(&stop), Rng(rng.next() | 1));
        std::thread::spawn(move || write(&url, rng, &stop))
    };
    let kills = 8;
    for _ in 0..kills {
        std::thread::sleep(rng.millis(150, 1_200));
        assert!(job.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(log(run)).unwrap());
        job.kill().unwrap(); // SIGKILL
        job.wait().unwrap();
        run += 1;
        job = start_job(&spec(true, 1 + run % 2), &log(run));
    }
    stop.store(true, Ordering::SeqCst);
    let tally = writer.join().unwrap();
    assert!(tally.inserts > 50 && tally.updates > 50 && tally.deletes > 10, "too few changes: {tally:?}");

    // Independent expectations: the source table itself, the writer's tally.
    let expected_totals: Vec<Vec<String>> = connect(&source_url)
        .query("SELECT owner, count(*)::text, sum(balance)::text FROM accounts GROUP BY owner ORDER BY owner", &[])
        .unwrap()
        .iter()
        .map(|r| (0..3).map(|i| r.get::<_, String>(i)).collect())
        .collect();
    let expected_ops: BTreeMap<String, String> =
        [("Delete", tally.deletes), ("Insert", tally.inserts), ("Read", INITIAL as u64), ("Update", tally.updates)]
            .into_iter()
            .map(|(op, n)| (op.to_owned(), n.to_string()))
            .collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let totals = sink_rows(&mut sink, "SELECT owner, n, total FROM totals ORDER BY owner");
        let ops: BTreeMap<String, String> =
            sink_rows(&mut sink, "SELECT op, n FROM ops").into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
        if totals == expected_totals && ops == expected_ops {
            break;
        }
        if Instant::now() > deadline || job.try_wait().unwrap().is_some() {
            let _ = job.kill();
            panic!(
                "after {kills} kills the sink holds\n{totals:?}\n{ops:?}\nexpected\n{expected_totals:?}\n{expected_ops:?}\n\
                 (HIGHWATER_CRASH_SEED={seed}); the last run's log:\n{}",
                std::fs::read_to_string(log(run)).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    job.kill().unwrap();
    job.wait().unwrap();
}

/// Rows of `accounts` in the snapshot test: at 5 000 records a second the
/// snapshot takes about 4 s, many checkpoint intervals.
const BIG: i64 = 20_000;

/// The job killed while it reads its initial snapshot, twice, the table
/// changed (rows deleted, balances updated) while it was down: no
/// checkpoint holds part of a snapshot (the source is not resumable inside
/// one, so no cut passes and the sink commits nothing), each run takes the
/// snapshot afresh, and the sink ends with the table as it is and one
/// `Read` per row of the last snapshot. Before, a checkpoint taken inside
/// the snapshot kept its first rows at offset 0; the recovery's new
/// snapshot read them again, and kept rows deleted in between.
#[test]
fn cdc_killed_inside_its_initial_snapshot_reads_the_table_once() {
    let scratch = Scratch::new("cdc-eo", "snapshot-kill");
    let cluster = PgCluster::start();
    let source_url = database(&cluster, "snap_source");
    let sink_url = database(&cluster, "snap_sink");
    let mut source = connect(&source_url);
    source
        .batch_execute(&format!(
            "CREATE TABLE accounts (id int8 PRIMARY KEY, owner text NOT NULL, balance int8 NOT NULL); \
             INSERT INTO accounts SELECT g, 'o' || (g % {OWNERS}), g * 10 FROM generate_series(1, {BIG}) g"
        ))
        .unwrap();
    let checkpoints = scratch.0.join("checkpoints");
    let spec = |recover: bool| format!("{source_url}|{sink_url}|{}|{recover}|2|5000", checkpoints.display());
    let log = |run: usize| scratch.0.join(format!("snapshot-{run}.log"));
    let mut sink = connect(&sink_url);
    for run in 0..2 {
        // A transaction open while the job starts holds the slot's creation
        // (and so the snapshot) back for 600 ms: the first checkpoint begins
        // before the snapshot's first rows go out.
        let mut blocker = connect(&source_url);
        blocker.batch_execute(&format!("BEGIN; INSERT INTO accounts VALUES ({}, 'o1', 5)", 1_000_000 + run)).unwrap();
        let blocked = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            blocker.batch_execute("COMMIT").unwrap();
        });
        let mut job = start_job(&spec(run > 0), &log(run));
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1_500) {
            let ops = sink_rows(&mut sink, "SELECT op, n FROM ops");
            assert!(
                ops.is_empty(),
                "run {run}: the sink committed {ops:?} inside the snapshot; log:\n{}",
                std::fs::read_to_string(log(run)).unwrap()
            );
            assert!(job.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(log(run)).unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
        job.kill().unwrap(); // SIGKILL, inside the snapshot
        job.wait().unwrap();
        blocked.join().unwrap();
        source
            .batch_execute(&format!(
                "DELETE FROM accounts WHERE id % 50 = {run}; UPDATE accounts SET balance = balance + 7 WHERE id % 30 = {run}"
            ))
            .unwrap();
    }
    let expected_totals: Vec<Vec<String>> = source
        .query("SELECT owner, count(*)::text, sum(balance)::text FROM accounts GROUP BY owner ORDER BY owner", &[])
        .unwrap()
        .iter()
        .map(|r| (0..3).map(|i| r.get::<_, String>(i)).collect())
        .collect();
    let rows: i64 = source.query_one("SELECT count(*) FROM accounts", &[]).unwrap().get(0);
    let expected_ops = vec![vec!["Read".to_owned(), rows.to_string()]];
    let run = 2;
    let mut job = start_job(&spec(true), &log(run));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let totals = sink_rows(&mut sink, "SELECT owner, n, total FROM totals ORDER BY owner");
        let ops = sink_rows(&mut sink, "SELECT op, n FROM ops ORDER BY op");
        if totals == expected_totals && ops == expected_ops {
            break;
        }
        if Instant::now() > deadline || job.try_wait().unwrap().is_some() {
            let _ = job.kill();
            panic!(
                "the sink holds\n{totals:?}\n{ops:?}\nexpected\n{expected_totals:?}\n{expected_ops:?}\nthe last run's log:\n{}",
                std::fs::read_to_string(log(run)).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    job.kill().unwrap();
    job.wait().unwrap();
}
