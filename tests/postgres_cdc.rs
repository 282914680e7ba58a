//! The PostgreSQL CDC source against a real server (a throwaway cluster per
//! test run): snapshot + stream through the dataflow equal the server's
//! tables after every step, across a server restart, under concurrent
//! writes during the snapshot and with a commit still waiting for a
//! synchronous standby when the slot is created; event times follow
//! delivery order; offsets resume exactly or fail clearly; configuration
//! errors are clear; the replication connection authenticates with
//! passwords.

#[path = "common/postgres.rs"]
mod pg;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use highwater::cdc::postgres::lsn::format_lsn;
use highwater::cdc::postgres::{PostgresConfig, PostgresReader, PostgresSource};
use highwater::cdc::{Change, Op, Row, Value};
use highwater::dead_letter::DeadLetter;
use highwater::source::{read, PartitionReader, ReadStatus, Source, SourceMetrics, SourceOptions};
use highwater::Timestamp;
use highwater_operators::table::TableReader;
use pg::{drop_objects, PgCluster};
use timely::dataflow::operators::Inspect;

/// What the dataflow saw.
#[derive(Clone, Default)]
struct Seen {
    changes: Arc<Mutex<Vec<Change>>>,
    dead: Arc<Mutex<Vec<DeadLetter>>>,
    /// The tables as highwater maintains them (upserts by event time, served
    /// as of the watermark), keyed by table name and primary key.
    tables: TableReader<(Arc<str>, Row), Row>,
}

impl Seen {
    fn changes(&self) -> Vec<Change> {
        self.changes.lock().unwrap().clone()
    }
}

/// A running dataflow reading a PostgreSQL source.
struct Running {
    source: Arc<PostgresSource>,
    seen: Seen,
    metrics: SourceMetrics,
    handle: Option<JoinHandle<()>>,
}

impl Running {
    fn start(config: PostgresConfig) -> Running {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let source = Arc::new(PostgresSource::new(config).expect("valid configuration"));
        let seen = Seen::default();
        let metrics = SourceMetrics::default();
        let (s, m, src) = (seen.clone(), metrics.clone(), Arc::clone(&source));
        let handle = std::thread::spawn(move || {
            let guards = timely::execute(timely::Config::thread(), move |worker| {
                let (s, m, src) = (s.clone(), m.clone(), Arc::clone(&src));
                worker.dataflow::<Timestamp, _, _>(|scope| {
                    let options = SourceOptions { name: "pg".into(), batch_size: 100, ..Default::default() };
                    let streams = read(scope, src, |c: &Change| c.time, options, &m, None).expect("source opens");
                    let changes = Arc::clone(&s.changes);
                    streams.events.inspect(move |(c, _, _)| changes.lock().unwrap().push(c.clone()));
                    let dead = Arc::clone(&s.dead);
                    streams.dead_letters.inner.inspect(move |(d, _, _)| dead.lock().unwrap().push(d.clone()));
                    let upserts = streams.events.flat_map(|c| {
                        let names: Vec<&str> = c.key.columns.iter().map(|(n, _)| &**n).collect();
                        let upserts = c.upserts(|r| r.project(&names));
                        upserts
                            .into_iter()
                            .map(move |(key, row)| ((Arc::clone(&c.table), key), row))
                            .collect::<Vec<_>>()
                    });
                    upserts.upsert().table.serve(&s.tables);
                });
                // A source that fails stops the worker (its error is in the metrics).
                let _ = highwater::source::run_until_failed(worker, &[&m]);
            })
            .expect("timely starts");
            for result in guards.join() {
                result.expect("the worker");
            }
        });
        Running { source, seen, metrics, handle: Some(handle) }
    }

    /// Waits until the snapshot is read and the stream polled.
    fn wait_until_streaming(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.source.stats().polls == 0 {
            assert!(Instant::now() < deadline, "the source did not start streaming: {:?}", self.metrics.errors());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the source and waits for the dataflow to finish.
    fn finish(mut self) -> (Vec<Change>, Vec<DeadLetter>, SourceMetrics) {
        self.source.stop();
        if let Some(h) = self.handle.take() {
            h.join().expect("the dataflow thread");
        }
        (self.seen.changes(), self.seen.dead.lock().unwrap().clone(), self.metrics.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.source.stop();
    }
}

fn config(cluster: &PgCluster, tables: &[&str], name: &str) -> PostgresConfig {
    let mut config = PostgresConfig::new(cluster.url(), tables.iter().copied(), name, name);
    config.poll_interval = highwater::time::Millis(20);
    config
}

/// The table state the changes make, by key: the upserts of each change in
/// the order the dataflow delivered them (which must be commit order).
fn fold(changes: &[Change], table: &str) -> BTreeMap<Row, Row> {
    let mut state = BTreeMap::new();
    let mut last_lsn = 0;
    let qualified = if table.contains('.') { table.to_owned() } else { format!("public.{table}") };
    for c in changes.iter().filter(|c| *c.table == *qualified) {
        assert!(c.lsn >= last_lsn, "changes out of commit order: {} after {last_lsn}", c.lsn);
        last_lsn = c.lsn;
        let names: Vec<&str> = c.key.columns.iter().map(|(n, _)| &**n).collect();
        for (key, row) in c.upserts(|r| r.project(&names)) {
            match row {
                Some(row) => state.insert(key, row),
                None => state.remove(&key),
            };
        }
    }
    state
}

/// Event times never decrease in delivery order, and the snapshot rows come
/// first, so that no change is older than them.
fn assert_event_times_follow_delivery(changes: &[Change]) {
    for w in changes.windows(2) {
        assert!(w[0].time <= w[1].time, "event time went back in delivery order: {:?} then {:?}", w[0], w[1]);
        assert!(w[0].op == Op::Read || w[1].op != Op::Read, "a snapshot row after a streamed change: {:?}", w[1]);
    }
}

/// Waits until the folded changes equal `expected()`; panics after 15 s.
fn wait_for_state(
    running: &Running,
    table: &str,
    step: &str,
    mut expected: impl FnMut() -> BTreeMap<Row, Row>,
) -> Vec<Change> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let changes = running.seen.changes();
        let got = fold(&changes, table);
        let want = expected();
        let qualified = if table.contains('.') { table.to_owned() } else { format!("public.{table}") };
        let served: BTreeMap<Row, Row> = running
            .seen
            .tables
            .snapshot()
            .into_iter()
            .filter(|((t, _), _)| **t == *qualified)
            .map(|((_, k), v)| (k, v))
            .collect();
        if got == want && served == want {
            return changes;
        }
        let errors = running.metrics.errors();
        if Instant::now() > deadline || !errors.is_empty() {
            let show = |m: &BTreeMap<Row, Row>| {
                let text = format!("{} rows: {:?}", m.len(), m.values().collect::<Vec<_>>());
                text.chars().take(2_000).collect::<String>()
            };
            panic!(
                "{step}: the table state seen by highwater differs from the server's\n errors: {errors:?} records {} stats {:?}\n \
                 folded changes: {}\n highwater table (watermark {}): {}\n want: {}",
                running.metrics.records.get(),
                running.source.stats(),
                show(&got),
                running.seen.tables.watermark(),
                show(&served),
                show(&want)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `SELECT` of the typed test table, as rows keyed by `id`, mapped by hand
/// (independently of the source's text parsing).
fn server_rows(client: &mut postgres::Client, table: &str) -> BTreeMap<Row, Row> {
    let rows = client
        .query(
            &format!(
                "SELECT id, name, amount::text, ok, (extract(epoch FROM at) * 1000000)::int8, doc::text, raw, \
                 day - DATE '1970-01-01' FROM {table} ORDER BY id"
            ),
            &[],
        )
        .unwrap();
    rows.iter()
        .map(|r| {
            let id: i32 = r.get(0);
            let opt = |v: Option<Value>| v.unwrap_or(Value::Null);
            let row = Row::new(vec![
                ("id", Value::Int(i64::from(id))),
                ("name", opt(r.get::<_, Option<String>>(1).map(Value::Text))),
                ("amount", opt(r.get::<_, Option<String>>(2).map(Value::Numeric))),
                ("ok", opt(r.get::<_, Option<bool>>(3).map(Value::Bool))),
                ("at", opt(r.get::<_, Option<i64>>(4).map(Value::TimestampTz))),
                ("doc", opt(r.get::<_, Option<String>>(5).map(Value::Json))),
                ("raw", opt(r.get::<_, Option<Vec<u8>>>(6).map(Value::Bytes))),
                ("day", opt(r.get::<_, Option<i32>>(7).map(Value::Date))),
            ]);
            (Row::new(vec![("id", Value::Int(i64::from(id)))]), row)
        })
        .collect()
}

/// The changes that arrived after the first `from`.
fn since(changes: &[Change], from: usize) -> Vec<Change> {
    changes[from.min(changes.len())..].to_vec()
}

#[test]
fn snapshot_and_stream_equal_the_server_after_every_step() {
    let cluster = PgCluster::shared();
    let mut sql = cluster.client();
    let (table, name) = ("cdc_steps", "hw_steps");
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, name text, amount numeric(10,2), ok bool, at timestamptz, \
                               doc jsonb, raw bytea, day date);
         INSERT INTO {table} VALUES
             (1, 'one', 1.50, true, '2024-01-02 03:04:05.123456+00', '{{\"a\": 1}}', '\\x00ff', '2024-01-02'),
             (2, 'two', NULL, false, NULL, NULL, NULL, NULL),
             (3, 'three', -3.25, NULL, '1999-12-31 23:59:59+02', '[1, 2]', '', '1969-07-20');"
    ))
    .unwrap();
    let mut check = Sql { client: cluster.client(), table };

    let running = Running::start(config(&cluster, &[table], name));
    let changes = wait_for_state(&running, table, "snapshot", || check.rows());
    assert!(changes.iter().all(|c| c.op == Op::Read), "{changes:?}");
    assert_eq!(changes.len(), 3);

    let steps: &[(&str, String)] = &[
        ("a single insert", format!("INSERT INTO {table} VALUES (4, 'four', 4, true, now(), 'null', '\\x01', now())")),
        (
            "a multi-row transaction",
            format!(
                "BEGIN;
                 INSERT INTO {table} (id, name) VALUES (5, 'five'), (6, 'six');
                 UPDATE {table} SET name = 'ONE', amount = amount * 2 WHERE id = 1;
                 DELETE FROM {table} WHERE id = 3;
                 INSERT INTO {table} (id, name) VALUES (7, 'seven');
                 UPDATE {table} SET name = 'SEVEN' WHERE id = 7;
                 COMMIT;"
            ),
        ),
        ("a primary-key update", format!("UPDATE {table} SET id = 20 WHERE id = 2")),
        (
            "a key swap in one transaction",
            format!(
                "BEGIN; UPDATE {table} SET id = 100 WHERE id = 5; UPDATE {table} SET id = 5 WHERE id = 6; \
             UPDATE {table} SET id = 6 WHERE id = 100; COMMIT;"
            ),
        ),
        (
            "updates of several rows",
            format!("UPDATE {table} SET ok = NOT coalesce(ok, false), doc = '{{\"b\": [true]}}'"),
        ),
        ("a delete of several rows", format!("DELETE FROM {table} WHERE id IN (4, 20)")),
        ("NULLs", format!("UPDATE {table} SET name = NULL, at = NULL WHERE id = 1")),
    ];
    let mut seen = changes.len();
    for (step, statement) in steps {
        sql.batch_execute(statement).unwrap();
        let changes = wait_for_state(&running, table, step, || check.rows());
        let new = since(&changes, seen);
        seen = changes.len();
        // One transaction per step: all its changes share the commit time and LSN.
        assert!(!new.is_empty(), "{step}: no changes");
        assert!(new.iter().all(|c| c.lsn == new[0].lsn && c.time == new[0].time), "{step}: {new:?}");
        if *step == "a multi-row transaction" {
            let ops: Vec<Op> = new.iter().map(|c| c.op).collect();
            assert_eq!(ops, [Op::Insert, Op::Insert, Op::Update, Op::Delete, Op::Insert, Op::Update]);
        }
        if *step == "a primary-key update" {
            assert_eq!(new.len(), 1);
            assert_eq!(new[0].before.as_ref().and_then(|b| b.get("id")), Some(&Value::Int(2)), "{new:?}");
        }
    }
    assert_event_times_follow_delivery(&running.seen.changes());
    // Commit times are the server's, in ms.
    let last = running.seen.changes().last().cloned().unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(last.time <= now_ms && last.time + 60_000 > now_ms, "commit time {} vs now {now_ms}", last.time);
    let (_, dead, metrics) = running.finish();
    assert!(dead.is_empty(), "{dead:?}");
    assert!(metrics.errors().is_empty(), "{:?}", metrics.errors());
    drop_objects(&mut sql, name, name, &[table]);
}

/// A connection that reads the test table.
struct Sql {
    client: postgres::Client,
    table: &'static str,
}

impl Sql {
    fn rows(&mut self) -> BTreeMap<Row, Row> {
        server_rows(&mut self.client, self.table)
    }
}

/// `(id, v)` rows of a simple table `(id int8 PRIMARY KEY, v int8)`.
fn simple_rows(client: &mut postgres::Client, table: &str) -> BTreeMap<Row, Row> {
    client
        .query(&format!("SELECT id, v FROM {table}"), &[])
        .unwrap()
        .iter()
        .map(|r| {
            let (id, v): (i64, Option<i64>) = (r.get(0), r.get(1));
            (
                Row::new(vec![("id", Value::Int(id))]),
                Row::new(vec![("id", Value::Int(id)), ("v", v.map_or(Value::Null, Value::Int))]),
            )
        })
        .collect()
}

#[test]
fn a_server_restart_loses_and_repeats_nothing() {
    // A cluster of its own: it is stopped in the middle.
    let mut cluster = PgCluster::start();
    let (table, name) = ("cdc_restart", "hw_restart");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8); INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 100) g"
    ))
    .unwrap();
    let running = Running::start(config(&cluster, &[table], name));
    running.wait_until_streaming();
    let mut inserted = 0;
    let mut updated = 0;
    let mut next_id = 101;
    let mut write = |sql: &mut postgres::Client, n: usize, inserted: &mut usize, updated: &mut usize| {
        for _ in 0..n {
            sql.batch_execute(&format!(
                "BEGIN; INSERT INTO {table} VALUES ({next_id}, 0); UPDATE {table} SET v = v + 1 WHERE id = {}; COMMIT;",
                next_id % 100 + 1
            ))
            .unwrap();
            next_id += 1;
            *inserted += 1;
            *updated += 1;
        }
    };
    write(&mut sql, 50, &mut inserted, &mut updated);
    wait_for_state(&running, table, "before the restart", || simple_rows(&mut cluster.client(), table));
    // More changes right before the stop: some may be read only after the restart.
    write(&mut sql, 50, &mut inserted, &mut updated);
    drop(sql);
    cluster.stop();
    std::thread::sleep(Duration::from_millis(1_500));
    cluster.start_again();
    let mut sql = cluster.client();
    write(&mut sql, 50, &mut inserted, &mut updated);
    let changes = wait_for_state(&running, table, "after the restart", || simple_rows(&mut cluster.client(), table));
    // Nothing repeated: each write shows up exactly once.
    let count = |op: Op| changes.iter().filter(|c| c.op == op).count();
    assert_eq!(count(Op::Read), 100);
    assert_eq!(count(Op::Insert), inserted);
    assert_eq!(count(Op::Update), updated);
    let mut per_lsn: HashMap<u64, usize> = HashMap::new();
    for c in changes.iter().filter(|c| c.op != Op::Read) {
        *per_lsn.entry(c.lsn).or_default() += 1;
    }
    assert!(per_lsn.values().all(|&n| n == 2), "a transaction delivered twice or split: {per_lsn:?}");
    let reconnects = running.source.stats().reconnects;
    let (_, _, metrics) = running.finish();
    assert!(reconnects >= 1, "the source did not notice the restart");
    assert!(metrics.errors().is_empty(), "{:?}", metrics.errors());
    drop_objects(&mut sql, name, name, &[table]);
}

/// Opens the source's reader directly and reads until it fails or `until` holds.
fn read_directly(
    config: PostgresConfig,
    mut until: impl FnMut(&[Change], &dyn PartitionReader<Record = Change>) -> bool,
) -> Result<Vec<Change>, String> {
    let source = PostgresSource::new(config).map_err(|e| e.to_string())?;
    let mut reader = source.open(0, None).map_err(|e| e.to_string())?;
    let mut changes = Vec::new();
    let mut dead = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match reader.read(1_000, &mut |c| changes.push(c), &mut dead) {
            Err(e) => return Err(e.to_string()),
            Ok(ReadStatus::End) => break,
            Ok(_) => {}
        }
        if until(&changes, &reader) {
            return Ok(changes);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the reader neither failed nor got there in time; changes: {changes:?}");
}

#[test]
fn configuration_errors_are_clear() {
    let cluster = PgCluster::shared();
    let mut sql = cluster.client();
    sql.batch_execute(
        "CREATE TABLE cdc_point (id int PRIMARY KEY, p point);
         CREATE TABLE cdc_nokey (id int, v text);
         CREATE TABLE cdc_array (id int PRIMARY KEY, tags text[]);",
    )
    .unwrap();

    // Through the dataflow: the source fails with the error, which the metrics keep.
    let (changes, _, metrics) = {
        let running = Running::start(config(&cluster, &["cdc_point"], "hw_point"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while running.metrics.errors().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        running.finish()
    };
    assert!(changes.is_empty());
    let errors = metrics.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("public.cdc_point") && errors[0].contains("column p") && errors[0].contains("type point"),
        "{}",
        errors[0]
    );

    let fail = |tables: &[&str], name: &str| read_directly(config(&cluster, tables, name), |_, _| false).unwrap_err();
    let e = fail(&["public.cdc_array"], "hw_array");
    assert!(e.contains("column tags has type text[]"), "{e}");
    let e = fail(&["cdc_nokey"], "hw_nokey");
    assert!(e.contains("public.cdc_nokey has no primary key") && e.contains("REPLICA IDENTITY FULL"), "{e}");
    let e = fail(&["cdc_missing"], "hw_missing");
    assert!(e.contains("table cdc_missing does not exist"), "{e}");
    // Resuming needs the slot.
    let source = PostgresSource::new(config(&cluster, &["cdc_nokey"], "hw_gone")).unwrap();
    let mut reader = source.open(0, Some(0x1234)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let e = loop {
        match reader.read(10, &mut |_| {}, &mut Vec::new()) {
            Err(e) => break e.to_string(),
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(status) => panic!("no error: {status:?}"),
        }
    };
    // The key check comes first for this table; with a good table the slot is missing.
    assert!(e.contains("cdc_nokey"), "{e}");
    sql.batch_execute("ALTER TABLE cdc_nokey REPLICA IDENTITY FULL").unwrap();
    let source = PostgresSource::new(config(&cluster, &["cdc_nokey"], "hw_gone")).unwrap();
    let mut reader = source.open(0, Some(0x1234)).unwrap();
    let e = loop {
        match reader.read(10, &mut |_| {}, &mut Vec::new()) {
            Err(e) => break e.to_string(),
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(status) => panic!("no error: {status:?}"),
        }
    };
    assert!(e.contains("replication slot hw_gone does not exist"), "{e}");
    // Checked without connecting.
    let mut bad = config(&cluster, &["cdc_nokey"], "Bad-Slot");
    assert!(PostgresSource::new(bad.clone()).unwrap_err().to_string().contains("slot name"));
    bad.slot = "ok".into();
    bad.tables.clear();
    assert!(PostgresSource::new(bad).unwrap_err().to_string().contains("no tables"));

    for name in ["hw_point", "hw_array", "hw_nokey", "hw_missing", "hw_gone"] {
        drop_objects(&mut sql, name, name, &[]);
    }
    sql.batch_execute("DROP TABLE cdc_point, cdc_nokey, cdc_array").unwrap();
}

#[test]
fn rows_written_during_the_snapshot_appear_exactly_once() {
    let cluster = PgCluster::shared();
    let (table, name) = ("cdc_concurrent", "hw_concurrent");
    let mut sql = cluster.client();
    // `v` counts the updates of a row: every image a change carries has a
    // higher `v` than the one before, unless a transaction arrives twice.
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8 NOT NULL);
         INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 20000) g;"
    ))
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, mut client) = (Arc::clone(&stop), cluster.client());
        std::thread::spawn(move || {
            let mut n = 0i64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let id = 20_000 + n;
                client
                    .batch_execute(&format!(
                        "BEGIN; INSERT INTO {table} VALUES ({id}, 0);
                         UPDATE {table} SET v = v + 1 WHERE id IN ({}, {}, {id} - 7);
                         DELETE FROM {table} WHERE id = {id} - 13 AND id % 5 = 0; COMMIT;",
                        n % 20_000 + 1,
                        (n * 7919) % 20_000 + 1
                    ))
                    .unwrap();
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let running = Running::start(config(&cluster, &[table], name));
    // Keep writing while the snapshot is read and for a while after.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running.seen.changes().iter().any(|c| c.op != Op::Read) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let writes = writer.join().unwrap();
    let changes =
        wait_for_state(&running, table, "after concurrent writes", || simple_rows(&mut cluster.client(), table));
    let skipped = running.source.stats().skipped;
    let (_, _, metrics) = running.finish();
    assert!(metrics.errors().is_empty(), "{:?}", metrics.errors());
    let streamed = changes.iter().filter(|c| c.op != Op::Read).count();
    assert!(streamed > 0 && writes > 10, "the test wrote {writes} transactions, streamed {streamed} changes");
    assert_event_times_follow_delivery(&changes);
    let snapshot_time = changes.iter().find(|c| c.op == Op::Read).map_or(0, |c| c.time);
    let at_snapshot_time = changes.iter().filter(|c| c.op != Op::Read && c.time == snapshot_time).count();
    // Each row is created once (snapshot or insert) and its images go strictly up.
    let mut last_v: HashMap<Row, i64> = HashMap::new();
    for c in &changes {
        let v = c.after.as_ref().and_then(|r| r.get("v")).and_then(Value::as_i64);
        match (c.op, v) {
            (Op::Read | Op::Insert, Some(v)) => {
                assert!(last_v.insert(c.key.clone(), v).is_none(), "row {} created twice", c.key);
            }
            (Op::Update, Some(v)) => {
                let before = last_v.insert(c.key.clone(), v);
                assert!(before.is_some_and(|b| b < v), "row {}: update to v={v} after v={before:?}", c.key);
            }
            (Op::Delete, _) => assert!(last_v.remove(&c.key).is_some(), "row {} deleted twice", c.key),
            other => panic!("unexpected change {other:?}: {c:?}"),
        }
    }
    eprintln!(
        "concurrent snapshot: {writes} writer transactions, {streamed} streamed changes \
         ({at_snapshot_time} at the snapshot's time), {skipped} transactions skipped after reconnecting"
    );
    drop_objects(&mut sql, name, name, &[table]);
}

#[test]
fn the_watermark_hint_follows_the_server_clock_when_caught_up() {
    let cluster = PgCluster::shared();
    let (table, name) = ("cdc_quiet", "hw_quiet");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8); INSERT INTO {table} VALUES (1, 1)"
    ))
    .unwrap();
    let mut config = config(&cluster, &[table], name);
    config.watermark_margin = highwater::time::Millis(500);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut hints = Vec::new();
    let changes = read_directly(config, |changes, reader| {
        if let Some(h) = reader.watermark_hint() {
            hints.push(h);
        }
        // Quiet table: the hint keeps moving past the start.
        !changes.is_empty() && hints.last().is_some_and(|&h| h > started)
    })
    .unwrap();
    assert_eq!(changes.len(), 1);
    assert!(hints.windows(2).all(|w| w[0] <= w[1]), "{hints:?}");
    drop_objects(&mut sql, name, name, &[table]);
}

#[test]
fn unchanged_toast_values_without_full_identity_are_dead_letters() {
    let cluster = PgCluster::shared();
    let (table, name) = ("cdc_toast", "hw_toast");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8, big text);
         ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL;"
    ))
    .unwrap();
    let running = Running::start(config(&cluster, &[table], name));
    running.wait_until_streaming();
    // Large enough to be stored out of line; then an update that leaves it alone.
    sql.batch_execute(&format!(
        "INSERT INTO {table} VALUES (1, 0, repeat('x', 100000)); UPDATE {table} SET v = 1 WHERE id = 1;
         ALTER TABLE {table} REPLICA IDENTITY FULL; UPDATE {table} SET v = 2 WHERE id = 1;"
    ))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while running.seen.changes().len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let (changes, dead, _) = running.finish();
    let ops: Vec<(Op, Option<i64>, usize)> = changes
        .iter()
        .map(|c| {
            let after = c.after.as_ref();
            let big = after.and_then(|r| r.get("big")).and_then(Value::as_str).map_or(0, str::len);
            (c.op, after.and_then(|r| r.get("v")).and_then(Value::as_i64), big)
        })
        .collect();
    // The insert, and the update under FULL completed from the old row.
    assert_eq!(ops, vec![(Op::Insert, Some(0), 100_000), (Op::Update, Some(2), 100_000)]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].reason.contains("REPLICA IDENTITY FULL") && dead[0].reason.contains("big"), "{}", dead[0].reason);
    drop_objects(&mut sql, name, name, &[table]);
}

/// Reads `reader` with at most `max` changes per call until `until(changes,
/// offset)` holds (`Ok`) or the reader fails (`Err` with the message).
fn read_until(
    reader: &mut PostgresReader,
    max: usize,
    mut until: impl FnMut(&[Change], u64) -> bool,
) -> Result<Vec<Change>, String> {
    let mut changes = Vec::new();
    let mut dead = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match reader.read(max, &mut |c| changes.push(c), &mut dead) {
            Err(e) => return Err(e.to_string()),
            Ok(ReadStatus::End) => break,
            Ok(_) => {}
        }
        if until(&changes, reader.offset()) {
            return Ok(changes);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the reader neither failed nor got there in time; changes: {changes:?}");
}

fn id_of(change: &Change) -> Option<i64> {
    change.key.get("id").and_then(Value::as_i64)
}

#[test]
fn offsets_resume_exactly_or_fail_clearly() {
    let cluster = PgCluster::shared();
    let (table, name) = ("cdc_offsets", "hw_offsets");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8); INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 50) g"
    ))
    .unwrap();
    let mut config = config(&cluster, &[table], name);
    config.snapshot_batch = 10;
    let source = PostgresSource::new(config).unwrap();

    // While the snapshot is read the offset is 0 ("snapshot incomplete"):
    // resuming from it takes a new snapshot instead of skipping rows.
    let mut reader = source.open(0, None).unwrap();
    let mut during_snapshot = Vec::new();
    let snapshot = read_until(&mut reader, 10, |changes, offset| {
        if changes.len() < 50 {
            during_snapshot.push(offset);
        }
        changes.len() == 50 && offset > 0
    })
    .unwrap();
    assert!(snapshot.iter().all(|c| c.op == Op::Read));
    assert!(!during_snapshot.is_empty() && during_snapshot.iter().all(|&o| o == 0), "{during_snapshot:?}");
    let consistent = reader.offset();

    // After each transaction: its end, past the consistent point.
    sql.batch_execute(&format!("INSERT INTO {table} VALUES (51, 1)")).unwrap();
    read_until(&mut reader, 100, |changes, _| changes.len() == 1).unwrap();
    let first = reader.offset();
    sql.batch_execute(&format!("INSERT INTO {table} VALUES (52, 1)")).unwrap();
    read_until(&mut reader, 100, |changes, _| changes.len() == 1).unwrap();
    let second = reader.offset();
    assert!(consistent < first && first < second, "{consistent:X} {first:X} {second:X}");
    // The slot is advanced to what was handed out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let confirmed = |sql: &mut postgres::Client| -> String {
        sql.query_one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", &[&name])
            .unwrap()
            .get(0)
    };
    while confirmed(&mut sql) != format_lsn(second) {
        assert!(Instant::now() < deadline, "the slot stays at {}, not {}", confirmed(&mut sql), format_lsn(second));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(reader);

    // An older offset: the slot cannot replay 52, so resuming fails clearly.
    let mut reader = source.open(0, Some(first)).unwrap();
    let e = read_until(&mut reader, 100, |_, _| false).unwrap_err();
    assert!(
        e.contains(&format!(
            "replication slot {name} is already at {}, past the offset {}",
            format_lsn(second),
            format_lsn(first)
        )),
        "{e}"
    );
    drop(reader);

    // The latest offset resumes exactly: nothing repeated, nothing lost.
    let mut reader = source.open(0, Some(second)).unwrap();
    sql.batch_execute(&format!("INSERT INTO {table} VALUES (53, 1)")).unwrap();
    let resumed = read_until(&mut reader, 100, |changes, _| changes.iter().any(|c| id_of(c) == Some(53))).unwrap();
    let ids: Vec<(Op, Option<i64>)> = resumed.iter().map(|c| (c.op, id_of(c))).collect();
    assert_eq!(ids, vec![(Op::Insert, Some(53))]);
    drop(reader);

    // Offset 0 (an interrupted snapshot): a new snapshot of all rows.
    let mut reader = source.open(0, Some(0)).unwrap();
    let again = read_until(&mut reader, 1_000, |changes, offset| changes.len() >= 53 && offset > 0).unwrap();
    assert!(again.len() == 53 && again.iter().all(|c| c.op == Op::Read), "{} changes", again.len());
    drop(reader);
    drop_objects(&mut sql, name, name, &[table]);
}

#[test]
fn a_commit_waiting_for_a_synchronous_standby_during_slot_creation_is_not_lost() {
    // A cluster of its own: synchronous replication is switched on.
    let cluster = PgCluster::start();
    let (table, name) = ("cdc_syncrep", "hw_syncrep");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8); INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 10) g;
         CREATE PUBLICATION {name} FOR TABLE {table};"
    ))
    .unwrap();
    // Commits wait for a standby that never comes, unless a session says otherwise.
    sql.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'").unwrap();
    sql.batch_execute("ALTER SYSTEM SET synchronous_commit = 'local'").unwrap();
    sql.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut sql = cluster.client();
    let count = |sql: &mut postgres::Client, query: &str| -> i64 { sql.query_one(query, &[]).unwrap().get(0) };

    // How the slot gets consistent (PostgreSQL's snapshot builder): it logs
    // the running transactions (R1) and waits for a later such record (R2)
    // showing them all ended; if R2 lists transactions still running, it
    // waits for a record (R3) showing those ended too, and counts the
    // transactions that started after R2 and committed before R3 as
    // committed by decoding their commit records, whether or not they have
    // left the process array. The consistent point is R3.
    //
    // A transaction holding an xid is in R1 ...
    let mut holder = cluster.client();
    holder.batch_execute("BEGIN; SELECT pg_current_xact_id();").unwrap();
    let running = Running::start(config(&cluster, &[table], name));
    let creating =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE_REPLICATION_SLOT%' AND state = 'active'";
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&mut sql, creating) == 0 {
        assert!(Instant::now() < deadline, "the slot is not being created: {:?}", running.metrics.errors());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // ... a second one starts and the first ends; a checkpoint logs R2.
    let mut holder2 = cluster.client();
    holder2.batch_execute("BEGIN; SELECT pg_current_xact_id();").unwrap();
    holder.batch_execute("COMMIT").unwrap();
    sql.batch_execute("CHECKPOINT").unwrap();
    // T writes its commit record and waits for the standby: committed in the
    // WAL, still in progress for every other session.
    let committer = {
        let mut client = cluster.client();
        std::thread::spawn(move || {
            client
                .batch_execute(&format!(
                    "SET synchronous_commit = on; BEGIN; UPDATE {table} SET v = 1 WHERE id = 1; COMMIT;"
                ))
                .map_err(|e| e.to_string())
        })
    };
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
    while count(&mut sql, waiting) == 0 {
        assert!(Instant::now() < deadline, "the commit does not wait for the standby");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The second ends; checkpoints (R3) until the slot is consistent (T's
    // commit record lies before that point) and the snapshot is read.
    holder2.batch_execute("COMMIT").unwrap();
    while running.seen.changes().len() < 10 {
        assert!(Instant::now() < deadline, "no snapshot: {:?} {:?}", running.metrics.errors(), running.source.stats());
        sql.batch_execute("CHECKPOINT").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    // Another session still does not see T, but the slot's snapshot does.
    assert_eq!(count(&mut sql, &format!("SELECT v FROM {table} WHERE id = 1")), 0);
    let changes = running.seen.changes();
    let row1: Vec<&Change> = changes.iter().filter(|c| id_of(c) == Some(1)).collect();
    assert_eq!(row1.len(), 1, "{row1:?}");
    assert_eq!(row1[0].after.as_ref().and_then(|r| r.get("v")).and_then(Value::as_i64), Some(1), "{row1:?}");
    // Release T; its change is not streamed again.
    sql.batch_execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").unwrap();
    committer.join().unwrap().unwrap();
    sql.batch_execute("ALTER SYSTEM RESET synchronous_standby_names").unwrap();
    sql.batch_execute("SELECT pg_reload_conf()").unwrap();
    sql.batch_execute(&format!("SET synchronous_commit = local; UPDATE {table} SET v = 2 WHERE id = 2")).unwrap();
    let changes =
        wait_for_state(&running, table, "after the standby wait", || simple_rows(&mut cluster.client(), table));
    let row1 = changes.iter().filter(|c| id_of(c) == Some(1)).count();
    assert_eq!(row1, 1, "{changes:?}");
    assert_event_times_follow_delivery(&changes);
    let (_, _, metrics) = running.finish();
    assert!(metrics.errors().is_empty(), "{:?}", metrics.errors());
}

#[test]
fn the_replication_connection_authenticates_with_passwords() {
    let cluster = PgCluster::shared();
    let (table, publication) = ("cdc_auth", "hw_auth");
    let mut sql = cluster.client();
    sql.batch_execute(&format!(
        "CREATE TABLE {table} (id int8 PRIMARY KEY, v int8); INSERT INTO {table} VALUES (1, 1);
         CREATE PUBLICATION {publication} FOR TABLE {table};
         CREATE ROLE hw_scram LOGIN REPLICATION PASSWORD 'scram-Secret1';
         CREATE ROLE hw_saslprep LOGIN REPLICATION PASSWORD 'scram-\u{fb01}\u{2163}';
         SET password_encryption = 'md5';
         CREATE ROLE hw_md5 LOGIN REPLICATION PASSWORD 'md5-Secret2';
         CREATE ROLE hw_plain LOGIN REPLICATION PASSWORD 'plain-Secret3';
         GRANT SELECT ON {table} TO hw_scram, hw_saslprep, hw_md5, hw_plain;"
    ))
    .unwrap();
    // The server applies SASLprep (NFKC: the ligature U+FB01 is "fi", the
    // Roman numeral U+2163 "IV") to a SCRAM password before hashing it: the
    // client must too, and then the raw and the prepared password both work.
    let users = [
        ("hw_scram", "scram-Secret1", "scram-sha-256"),
        ("hw_saslprep", "scram-\u{fb01}\u{2163}", "scram-sha-256"),
        ("hw_saslprep", "scram-fiIV", "scram-sha-256"),
        ("hw_md5", "md5-Secret2", "md5"),
        ("hw_plain", "plain-Secret3", "password"),
    ];
    for (user, _, method) in users {
        cluster.require_password(user, method);
    }
    std::thread::sleep(Duration::from_millis(300));
    for (user, password, method) in users {
        let mut config = config(&cluster, &[table], user);
        config.url = cluster.url_as(user, password);
        config.publication = publication.into();
        let changes = read_directly(config, |changes, reader| !changes.is_empty() && reader.offset() > 0)
            .unwrap_or_else(|e| panic!("{method} ({user}, {password}): {e}"));
        assert_eq!(changes.len(), 1, "{method} ({user}, {password})");
        // The replication connection created the slot (the next login of
        // the same user replaces it).
        let slots: i64 =
            sql.query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", &[&user]).unwrap().get(0);
        assert_eq!(slots, 1, "{method} ({user})");
    }
    // A wrong password fails clearly rather than hanging or retrying forever.
    for (user, method) in [("hw_scram", "scram-sha-256"), ("hw_md5", "md5"), ("hw_plain", "password")] {
        let mut config = config(&cluster, &[table], "hw_auth_wrong");
        config.url = cluster.url_as(user, "wrong");
        config.publication = publication.into();
        let e = read_directly(config, |_, _| false).unwrap_err();
        assert!(e.contains("password authentication failed"), "{method}: {e}");
    }
    for (user, _, _) in users {
        drop_objects(&mut sql, user, publication, &[]);
    }
    drop_objects(&mut sql, "hw_auth_none", publication, &[table]);
    for user in ["hw_scram", "hw_saslprep", "hw_md5", "hw_plain"] {
        sql.batch_execute(&format!("DROP OWNED BY {user}; DROP ROLE {user}")).unwrap();
    }
}
