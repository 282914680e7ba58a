//! PostgreSQL CDC throughput: a pgbench-like load (each transaction updates
//! an account and inserts a history row: 2 changes) against a throwaway
//! cluster, read by `PostgresSource` through a dataflow that counts changes.
//!
//! Two phases:
//! - live: writer threads and the source run together; the figure is the
//!   end-to-end rate (the writers usually limit it) and the lag at the end;
//! - backlog: the source is stopped, the writers commit a backlog, then a
//!   new source resumes from the last offset and drains it: the source's own
//!   throughput, with where its time goes (waiting for the server's peek
//!   call, parsing pgoutput, handing over to a full channel = the dataflow).
//!
//! ```text
//! cargo bench --bench cdc -- --transactions 100000 --writers 2 [--max-changes-per-poll 100000]
//! ```
//!
//! Needs the PostgreSQL server binaries (scripts/test.sh installs them).

#[path = "../tests/common/postgres.rs"]
mod pg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use highwater::cdc::postgres::{PostgresConfig, PostgresSource, PostgresStats};
use highwater::cdc::Change;
use highwater::source::{read, SourceMetrics, SourceOptions};
use highwater::Timestamp;
use timely::dataflow::operators::Inspect;

struct Options {
    transactions: u64,
    writers: u64,
    accounts: u64,
    max_changes_per_poll: u32,
}

fn parse_args() -> Options {
    let mut o = Options { transactions: 20_000, writers: 2, accounts: 10_000, max_changes_per_poll: 100_000 };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{a} needs a number"));
        match a.as_str() {
            "--transactions" => o.transactions = value(),
            "--writers" => o.writers = value(),
            "--accounts" => o.accounts = value(),
            "--max-changes-per-poll" => o.max_changes_per_poll = value() as u32,
            "--bench" => {}
            other => panic!("unknown option {other}"),
        }
    }
    o
}

/// A dataflow reading the source on its own thread; counts changes and
/// remembers the last offset (commit LSN).
struct Pipeline {
    source: Arc<PostgresSource>,
    seen: Arc<AtomicU64>,
    last_lsn: Arc<AtomicU64>,
    busy: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Pipeline {
    fn start(config: PostgresConfig, from: Option<u64>) -> Pipeline {
        let source = Arc::new(PostgresSource::new(config).expect("configuration"));
        let (seen, last_lsn, busy) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (src, s, l, b) = (Arc::clone(&source), Arc::clone(&seen), Arc::clone(&last_lsn), Arc::clone(&busy));
        let thread = std::thread::spawn(move || {
            timely::execute_directly(move |worker| {
                worker.dataflow::<Timestamp, _, _>(|scope| {
                    let options = SourceOptions {
                        start_offsets: from.map(|o| vec![(0, o)]).unwrap_or_default(),
                        ..Default::default()
                    };
                    let streams = read(scope, src, |c: &Change| c.time, options, &SourceMetrics::default(), None)
                        .expect("source opens");
                    streams.events.inner.inspect_core(move |event| {
                        let Ok((_, batch)) = event else { return };
                        let started = Instant::now();
                        for (change, _, _) in batch {
                            std::hint::black_box(change);
                            l.store(change.lsn, Ordering::Relaxed);
                        }
                        s.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        b.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    });
                });
            })
        });
        Pipeline { source, seen, last_lsn, busy, thread }
    }

    fn wait_for(&self, changes: u64, timeout: Duration) -> Duration {
        let started = Instant::now();
        while self.seen.load(Ordering::Relaxed) < changes {
            assert!(
                started.elapsed() < timeout,
                "only {} of {changes} changes arrived",
                self.seen.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        started.elapsed()
    }

    fn stop(self) -> (u64, PostgresStats) {
        self.source.stop();
        let stats = self.source.stats();
        self.thread.join().expect("dataflow thread");
        (self.last_lsn.load(Ordering::Relaxed), stats)
    }
}

/// Runs `transactions` pgbench-like transactions on `writers` connections;
/// returns the elapsed time.
fn write(cluster: &pg::PgCluster, o: &Options, offset: u64) -> Duration {
    let started = Instant::now();
    let threads: Vec<_> = (0..o.writers)
        .map(|w| {
            let mut client = cluster.client();
            let (n, accounts) = (o.transactions / o.writers, o.accounts);
            std::thread::spawn(move || {
                let update = client.prepare("UPDATE accounts SET balance = balance + $1 WHERE aid = $2").unwrap();
                let insert = client.prepare("INSERT INTO history (aid, delta, at) VALUES ($1, $2, now())").unwrap();
                for i in 0..n {
                    let aid = ((offset + i * o_stride(w)) % accounts + 1) as i64;
                    let delta = (i % 1000) as i64 - 500;
                    let mut txn = client.transaction().unwrap();
                    txn.execute(&update, &[&delta, &aid]).unwrap();
                    txn.execute(&insert, &[&aid, &delta]).unwrap();
                    txn.commit().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    started.elapsed()
}

fn o_stride(writer: u64) -> u64 {
    7_919 + writer * 104_729
}

fn report(what: &str, changes: u64, elapsed: Duration, stats: &PostgresStats, busy: Duration) {
    let rate = changes as f64 / elapsed.as_secs_f64();
    println!("{what}: {changes} changes in {:.2} s = {rate:.0} changes/s", elapsed.as_secs_f64());
    println!(
        "  source thread: server (peek call and statements around it) {:.2} s, pgoutput parsing {:.2} s, \
         blocked on a full channel {:.2} s; {} polls, {} messages; dataflow sink {:.2} s",
        stats.server.as_secs_f64(),
        stats.decode.as_secs_f64(),
        stats.handoff.as_secs_f64(),
        stats.polls,
        stats.messages,
        busy.as_secs_f64()
    );
}

fn main() {
    let o = parse_args();
    let cluster = pg::PgCluster::start();
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE accounts (aid int8 PRIMARY KEY, balance int8 NOT NULL, filler char(84));
         INSERT INTO accounts SELECT g, 0, '' FROM generate_series(1, {}) g;
         CREATE TABLE history (id bigserial PRIMARY KEY, aid int8, delta int8, at timestamptz);",
        o.accounts
    ))
    .unwrap();
    let mut config = PostgresConfig::new(cluster.url(), ["accounts", "history"], "bench", "bench");
    config.poll_interval = highwater::time::Millis(10);
    config.max_changes_per_poll = o.max_changes_per_poll;
    let changes = o.transactions / o.writers * o.writers * 2;
    println!(
        "PostgreSQL CDC bench: {} transactions (UPDATE + INSERT) on {} writer connections, {} accounts",
        o.transactions, o.writers, o.accounts
    );

    // Snapshot of the accounts.
    let started = Instant::now();
    let live = Pipeline::start(config.clone(), None);
    let snapshot = live.wait_for(o.accounts, Duration::from_secs(120));
    println!("snapshot: {} rows in {:.2} s", o.accounts, snapshot.as_secs_f64().max(started.elapsed().as_secs_f64()));

    // Live: writers and source together.
    let before = live.source.stats();
    let started = Instant::now();
    let writing = write(&cluster, &o, 0);
    live.wait_for(o.accounts + changes, Duration::from_secs(600));
    let elapsed = started.elapsed();
    let busy = Duration::from_nanos(live.busy.load(Ordering::Relaxed));
    let (offset, after) = live.stop();
    let stats = delta(&after, &before);
    println!(
        "live: writers committed {} transactions in {:.2} s ({:.0} tx/s); the source was done {:.0} ms after them",
        o.transactions,
        writing.as_secs_f64(),
        o.transactions as f64 / writing.as_secs_f64(),
        (elapsed - writing).as_secs_f64() * 1e3
    );
    report("live end-to-end", changes, elapsed, &stats, busy);

    // Backlog: written while no source runs, then drained.
    write(&cluster, &o, 1);
    let started = Instant::now();
    let backlog = Pipeline::start(config, Some(offset));
    backlog.wait_for(changes, Duration::from_secs(600));
    let elapsed = started.elapsed();
    let busy = Duration::from_nanos(backlog.busy.load(Ordering::Relaxed));
    let (_, stats) = backlog.stop();
    report("backlog drain", changes, elapsed, &stats, busy);

    sql.batch_execute("SELECT pg_drop_replication_slot('bench')").ok();
}

fn delta(after: &PostgresStats, before: &PostgresStats) -> PostgresStats {
    PostgresStats {
        polls: after.polls - before.polls,
        messages: after.messages - before.messages,
        transactions: after.transactions - before.transactions,
        skipped: after.skipped - before.skipped,
        changes: after.changes - before.changes,
        reconnects: after.reconnects - before.reconnects,
        server: after.server.saturating_sub(before.server),
        decode: after.decode.saturating_sub(before.decode),
        handoff: after.handoff.saturating_sub(before.handoff),
    }
}
