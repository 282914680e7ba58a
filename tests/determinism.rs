//! The same results on any layout: a job over files of many blocks, with
//! records late near the blocks' starts, gives the same window results, late
//! records, dead letters and late counts on 1, 2 and 3 workers in one process
//! and on two processes (`-n 2`), and the source's count of records late
//! where they were read is the one a model of each block's own watermark
//! gives.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use highwater::dead_letter::DeadLetter;
use highwater::source::{read, JsonDecoder, JsonLines, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::prelude::*;
use highwater_operators::Counter;
use proptest::prelude::*;
use timely::dataflow::operators::Inspect;

#[path = "common/crash.rs"]
mod crash;

/// A record of the test's own JSON Lines input.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Payment {
    k: u8,
    t: u64,
    v: i64,
}

/// What a run gives: window results (consolidated: a result fired and then
/// corrected by a record within the allowed lateness on one layout may fire
/// once, corrected, on another, as the watermark reaches the window at
/// another moment), late records and dead letters (each with its event time
/// and diff, sorted), and the counts of records late where they were read and
/// late at the window.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    results: Vec<(WindowResult<u8, i64>, Timestamp, Diff)>,
    late: Vec<(Payment, Timestamp, Diff)>,
    dead: Vec<(String, u64, String)>,
    late_read: u64,
    late_at_window: u64,
}

/// The options every run reads with: watermark 50 ms behind the greatest
/// time seen, `batch` lines per read, no idleness (which depends on timing).
fn options(batch: usize) -> SourceOptions {
    SourceOptions {
        watermark: WatermarkStrategy::bounded(50),
        idle_timeout: None,
        batch_size: batch,
        ..Default::default()
    }
}

/// Runs a tumbling 100 ms sum per key with 30 ms of allowed lateness over
/// `file` in blocks of `block` bytes, on `workers` workers.
fn run(file: &Path, block: u64, batch: usize, workers: usize) -> Outcome {
    let source = Arc::new(JsonLines::files_with_block_size(&[file], JsonDecoder::<Payment>::new(), block).unwrap());
    let metrics = SourceMetrics::default();
    let options = options(batch);
    let results = Arc::new(Mutex::new(Vec::new()));
    let late = Arc::new(Mutex::new(Vec::new()));
    let dead = Arc::new(Mutex::new(Vec::new()));
    let late_count = Arc::new(Mutex::new(Vec::<Counter>::new()));
    let (r, l, d, c, m) = (results.clone(), late.clone(), dead.clone(), late_count.clone(), metrics.clone());
    timely::execute(timely::Config::process(workers), move |worker| {
        let (r, l, d, c) = (r.clone(), l.clone(), d.clone(), c.clone());
        let (source, options, metrics) = (source.clone(), options.clone(), m.clone());
        worker.dataflow(|scope| {
            let streams = read(scope, source, |p: &Payment| p.t, options, &metrics, None).unwrap();
            let sums = streams
                .events
                .window(Tumbling::of(100))
                .key_by(|p: &Payment| p.k)
                .allowed_lateness(30)
                .aggregate(Sum::of(|p: &Payment| p.v));
            c.lock().unwrap().push(sums.late.count.clone());
            sums.results.inner.inspect(move |u| r.lock().unwrap().push(u.clone()));
            sums.late.stream.inner.inspect(move |u| l.lock().unwrap().push(u.clone()));
            streams.dead_letters.inner.inspect(move |(letter, _, _): &(DeadLetter, _, _)| {
                d.lock().unwrap().push((letter.origin.clone(), letter.offset, letter.reason.clone()))
            });
        });
    })
    .unwrap();
    let late_at_window = late_count.lock().unwrap().iter().map(Counter::get).sum();
    Outcome {
        results: consolidated(sorted(&results)),
        late: sorted(&late),
        dead: sorted(&dead),
        late_read: metrics.late.get(),
        late_at_window,
    }
}

/// Updates summed per record and time, without those that cancel out.
fn consolidated<T: Ord>(updates: Vec<(T, Timestamp, Diff)>) -> Vec<(T, Timestamp, Diff)> {
    let mut sums = BTreeMap::new();
    for (record, time, diff) in updates {
        *sums.entry((record, time)).or_insert(0) += diff;
    }
    sums.into_iter().filter(|(_, diff)| *diff != 0).map(|((record, time), diff)| (record, time, diff)).collect()
}

/// The items `v` collected, sorted.
fn sorted<T: Ord>(v: &Mutex<Vec<T>>) -> Vec<T> {
    let mut v = std::mem::take(&mut *v.lock().unwrap());
    v.sort();
    v
}

/// The lines of a test file: a record per entry (or, for `None`, a line
/// that does not decode).
fn lines(entries: &[Option<Payment>]) -> Vec<String> {
    entries
        .iter()
        .map(|e| match e {
            Some(p) => serde_json::to_string(p).unwrap(),
            None => "{\"k\": oops}".to_owned(),
        })
        .collect()
}

/// The model: records late where they were read, block by block. A block
/// holds the lines that start in it; it is read one line at a time up to its
/// first record, then `batch` lines at a time, and each read is judged
/// against the block's own watermark before it (50 ms behind the greatest
/// time the block has shown, 0 before its first record).
fn model_late_read(lines: &[String], entries: &[Option<Payment>], block: u64, batch: usize) -> u64 {
    let mut by_block: BTreeMap<u64, Vec<&Option<Payment>>> = BTreeMap::new();
    let mut offset = 0u64;
    for (line, entry) in lines.iter().zip(entries) {
        by_block.entry(offset / block).or_default().push(entry);
        offset += line.len() as u64 + 1;
    }
    let mut late = 0;
    for block in by_block.values() {
        let mut max_seen: Option<u64> = None;
        let mut rest = &block[..];
        while !rest.is_empty() {
            let n = if max_seen.is_some() { batch.min(rest.len()) } else { 1 };
            let (read, after) = rest.split_at(n);
            rest = after;
            let watermark = max_seen.map_or(0, |m| m.saturating_sub(50));
            let times: Vec<u64> = read.iter().filter_map(|e| e.as_ref().map(|p| p.t)).collect();
            late += times.iter().filter(|t| **t < watermark).count() as u64;
            max_seen = times.iter().copied().chain(max_seen).max();
        }
    }
    late
}

/// Records mostly in time order, some far behind (up to `disorder` ms),
/// and a few lines that do not decode.
fn entries() -> impl Strategy<Value = Vec<Option<Payment>>> {
    (prop::collection::vec((0u8..4, 0u64..10, 0u64..400, -5i64..20, 0u8..40), 100..400)).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (k, step, behind, v, kind))| {
                let on_time = i as u64 * 7 + step;
                match kind {
                    0 => None,
                    1..=8 => Some(Payment { k, t: on_time.saturating_sub(behind), v }),
                    _ => Some(Payment { k, t: on_time, v }),
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_same_outcome_on_any_number_of_workers(entries in entries(), block in 200u64..1200, batch in 2usize..12) {
        let dir = crash::Scratch::new("determinism", "workers");
        let file = dir.0.join("payments.jsonl");
        let lines = lines(&entries);
        std::fs::write(&file, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        let one = run(&file, block, batch, 1);
        prop_assert_eq!(one.late_read, model_late_read(&lines, &entries, block, batch));
        prop_assert_eq!(one.dead.len(), entries.iter().filter(|e| e.is_none()).count());
        for workers in [2, 3] {
            let other = run(&file, block, batch, workers);
            prop_assert_eq!(&one, &other, "1 worker against {}", workers);
        }
    }
}

/// The summary line's counts (`late=` and `late_read=`) of a `highwater` run's stderr.
fn counts(stderr: &str) -> (u64, u64) {
    let field = |name: &str| {
        stderr.split_whitespace().filter_map(|w| w.strip_prefix(name)).map(|n| n.parse::<u64>().unwrap()).sum::<u64>()
    };
    (field("late="), field("late_read="))
}

/// Rows sorted (their order follows arrival), header first.
fn canonical(csv: &str) -> Vec<String> {
    let mut lines: Vec<String> = csv.lines().map(str::to_owned).collect();
    if lines.len() > 1 {
        lines[1..].sort();
    }
    lines
}

/// `highwater nexmark` on a generated file of many blocks, late records at
/// their starts: the rows and the late counts agree on 1, 2 and 3 workers and
/// on two processes of two workers.
#[test]
fn the_cli_gives_the_same_rows_and_late_counts_on_any_layout() {
    let dir = crash::Scratch::new("determinism", "cli");
    let file = dir.0.join("events.jsonl");
    let generate = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["generate", "--events", "60000", "--rate", "500", "--max-out-of-order", "6s", "--output"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(generate.status.success(), "{}", String::from_utf8_lossy(&generate.stderr));
    // About 60 blocks of 256 KiB, read 64 records at a time; a watermark 1 s
    // behind, so that records 6 s out of order are late.
    let args = |query: &str| {
        let mut args: Vec<String> =
            ["nexmark", "--query", query, "--block-size", "262144", "--batch-size", "64", "--watermark-delay", "1s"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(["--input".to_owned(), file.to_str().unwrap().to_owned()]);
        args
    };
    for query in ["q5", "q7"] {
        let run = |workers: &str| {
            let out = Command::new(env!("CARGO_BIN_EXE_highwater"))
                .args(args(query))
                .args(["--", "-w", workers])
                .output()
                .unwrap();
            assert!(out.status.success(), "{query} -w {workers}: {}", String::from_utf8_lossy(&out.stderr));
            (canonical(&String::from_utf8(out.stdout).unwrap()), counts(&String::from_utf8_lossy(&out.stderr)))
        };
        let (rows, late) = run("1");
        assert!(rows.len() > 5, "{query}: {} rows", rows.len());
        assert!(late.1 > 0, "{query}: records late where read ({late:?})");
        for workers in ["2", "3"] {
            assert_eq!(run(workers), (rows.clone(), late), "{query}: -w 1 against -w {workers}");
        }
        // Two processes of two workers: process 0 writes the rows, each
        // reports the counts of the whole job (summed over the processes).
        let hosts = dir.0.join(format!("hosts-{query}.txt"));
        let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut f = std::fs::File::create(&hosts).unwrap();
        writeln!(f, "127.0.0.1:{}\n127.0.0.1:{}", port(), port()).unwrap();
        let spawn = |process: &str| {
            Command::new(env!("CARGO_BIN_EXE_highwater"))
                .args(args(query))
                .args(["--", "-w", "2", "-n", "2", "-p", process, "-h", hosts.to_str().unwrap()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (p0, p1) = (spawn("0"), spawn("1"));
        let (o0, o1) = (p0.wait_with_output().unwrap(), p1.wait_with_output().unwrap());
        assert!(o0.status.success(), "process 0: {}", String::from_utf8_lossy(&o0.stderr));
        assert!(o1.status.success(), "process 1: {}", String::from_utf8_lossy(&o1.stderr));
        assert_eq!(canonical(&String::from_utf8(o0.stdout).unwrap()), rows, "{query}: -w 1 against -n 2");
        let (c0, c1) = (counts(&String::from_utf8_lossy(&o0.stderr)), counts(&String::from_utf8_lossy(&o1.stderr)));
        assert_eq!(c0, late, "{query}: late counts of -w 1 against -n 2 (process 0)");
        assert_eq!(c1, late, "{query}: late counts of -w 1 against -n 2 (process 1)");
    }
}
