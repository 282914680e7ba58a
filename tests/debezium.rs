//! The Debezium decoder on change events written after Debezium's documented
//! PostgreSQL connector format (snapshot reads, creates, updates with and
//! without a before image, deletes followed by tombstones, a primary-key change,
//! a multi-row transaction, typed decimals, dates and timestamps, events with
//! and without a schema): golden decoded changes, the table they build through
//! the dataflow, and malformed events as dead letters.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use highwater::cdc::debezium::DebeziumDecoder;
use highwater::cdc::{Change, Row, Value};
use highwater::sink::{collect, Collected};
use highwater::source::{read, Decode, JsonLines, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::table::TableReader;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/debezium").join(name)
}

fn describe(c: &Change) -> String {
    let image = |r: &Option<Row>| r.as_ref().map_or("-".to_owned(), |r| r.to_json().to_string());
    format!(
        "{:?} {} key={} t={} lsn={} before={} after={}",
        c.op,
        c.table,
        c.key.to_json(),
        c.time,
        c.lsn,
        image(&c.before),
        image(&c.after)
    )
}

#[test]
fn decoded_changes_match_the_golden_file() {
    let decoder = DebeziumDecoder::new(["id"]);
    let mut got = String::new();
    for line in std::fs::read_to_string(fixture("customers.jsonl")).unwrap().lines() {
        decoder.decode_into(line.as_bytes(), &mut |c| got.push_str(&(describe(&c) + "\n"))).unwrap();
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/debezium_customers.txt");
    if std::env::var_os("HIGHWATER_BLESS").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    assert_eq!(got, std::fs::read_to_string(golden).unwrap());
}

#[test]
fn typed_columns_follow_the_schema() {
    let decoder = DebeziumDecoder::new(["id"]);
    let first = std::fs::read_to_string(fixture("customers.jsonl")).unwrap();
    let change = decoder.decode(first.lines().next().unwrap().as_bytes()).unwrap();
    let after = change.after.unwrap();
    assert_eq!(after.get("balance"), Some(&Value::Numeric("1250.50".into())));
    assert_eq!(after.get("birth_date"), Some(&Value::Date(-3650)));
    assert_eq!(after.get("updated_at"), Some(&Value::Timestamp(1_700_000_000_000_000)));
    assert_eq!(after.get("id"), Some(&Value::Int(1001)));
    let second = decoder.decode(first.lines().nth(1).unwrap().as_bytes()).unwrap();
    assert_eq!(second.after.unwrap().get("balance"), Some(&Value::Numeric("-20.00".into())));
}

/// Runs the file through the dataflow into a served table (1 or 2 workers).
fn table_of(file: &Path, workers: usize) -> (Vec<(Row, Row)>, Vec<String>) {
    let source = Arc::new(JsonLines::files(&[file], DebeziumDecoder::new(["id"])).unwrap());
    let reader = TableReader::new();
    let dead = Collected::default();
    let (served, d) = (reader.clone(), dead.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let (source, served, d) = (Arc::clone(&source), served.clone(), d.clone());
        worker.dataflow::<u64, _, _>(move |scope| {
            let options = SourceOptions { watermark: WatermarkStrategy::Monotonous, ..Default::default() };
            let streams = read(scope, source, |c: &Change| c.time, options, &SourceMetrics::default(), None).unwrap();
            let upserts = streams.events.flat_map(|c| c.upserts(|row| row.project(&["id"])));
            upserts.upsert().table.serve(&served);
            collect(&streams.dead_letters.map(|d| d.reason), &d);
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    (reader.snapshot(), dead.rows())
}

#[test]
fn the_changelog_builds_the_table() {
    let id = |i: i64| Row::new(vec![("id", Value::Int(i))]);
    let expected: Vec<(Row, String, String)> = vec![
        (id(1001), "Sally".into(), "sally@acme.com".into()),
        (id(1002), "George".into(), "george@foobar.com".into()),
        (id(1005), "Anne".into(), "annek@noanswer.org".into()),
        (id(1007), "Cy".into(), "cy@x.org".into()),
        (id(1008), "Bo".into(), "bo@x.org".into()),
    ];
    for workers in [1, 2] {
        let (table, dead) = table_of(&fixture("customers.jsonl"), workers);
        assert!(dead.is_empty(), "{dead:?}");
        let got: Vec<(Row, String, String)> = table
            .into_iter()
            .map(|(k, row)| {
                let text = |c: &str| row.get(c).and_then(Value::as_str).unwrap_or_default().to_owned();
                (k, text("first_name"), text("email"))
            })
            .collect();
        assert_eq!(got, expected, "at {workers} workers");
    }
}

#[test]
fn malformed_events_become_dead_letters_with_their_reason() {
    let (table, mut dead) = table_of(&fixture("malformed.jsonl"), 1);
    assert!(table.is_empty());
    dead.sort();
    let mut want = vec![
        "unknown `op` \"x\"; expected c, u, d or r",
        "key column `id` missing from `after`",
        "a delete (`op` d) needs `before`",
        "missing `source.ts_ms` (the commit time, used as event time)",
        "`op` t (truncate) is not a row change",
        "EOF while parsing an object",
        "a Debezium event is a JSON object (or null for a tombstone)",
        "column `id`: expected an integer (int32), found \"seven\"",
        "column `balance`: bad base64",
        "`after` must be an object or null",
    ];
    want.sort();
    assert_eq!(dead.len(), want.len(), "{dead:#?}");
    for w in want {
        assert!(dead.iter().any(|d| d.starts_with(w)), "no dead letter says {w:?}: {dead:#?}");
    }
}
