//! The sizes a job reports (issue 18, metrics): the bytes each file
//! partition consumed (`<source>/<i>.partition_bytes`,
//! `highwater_partition_read_bytes_total`) against the bytes of the lines
//! of its block, computed from the file; and an operator's state size
//! (`<operator>.state_bytes`, `highwater_state_bytes`) against bounds from
//! the data it holds, on the memory and RocksDB backends, at 1 and 2
//! workers.

#[path = "common/crash.rs"]
mod crash;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use highwater::operators::state::{Backend, RocksDbConfig};
use highwater::prelude::*;
use highwater::Job;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Rec {
    k: u32,
    time: u64,
    name: String,
}

const KEYS: u32 = 3_000;
const BLOCK: u64 = 16_384;

/// One line per key (a name of 40 to 119 bytes), and a line that does not
/// decode every 500 (a dead letter: its bytes are consumed too). Returns
/// the file's lines as written and each key's name.
fn write_input(path: &std::path::Path) -> (Vec<String>, BTreeMap<u32, String>) {
    let mut lines = Vec::new();
    let mut names = BTreeMap::new();
    for k in 0..KEYS {
        let name: String = (0..40 + (k * 7_919) % 80).map(|i| (b'a' + ((k + i) % 26) as u8) as char).collect();
        lines.push(serde_json::to_string(&Rec { k, time: u64::from(k) * 10, name: name.clone() }).unwrap());
        names.insert(k, name);
        if k % 500 == 250 {
            lines.push(format!("{{\"k\": \"not a number {k}\"}}"));
        }
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for line in &lines {
        writeln!(file, "{line}").unwrap();
    }
    file.flush().unwrap();
    (lines, names)
}

/// The bytes block `i` of the file consumes, from the line offsets: a
/// block's partition starts at its first byte (less one, to find the first
/// line that starts in it, unless it is the file's first) and reads every
/// line that starts before its end, up to that line's newline.
fn expected_bytes(lines: &[String], blocks: u64) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut at = 0u64;
    for line in lines {
        starts.push(at);
        at += line.len() as u64 + 1;
    }
    let size = at;
    let first_at_or_after = |offset: u64| starts.iter().copied().find(|s| *s >= offset).unwrap_or(size);
    (0..blocks)
        .map(|i| {
            let (start, end) = (i * BLOCK, ((i + 1) * BLOCK).min(size));
            first_at_or_after(end) - start.saturating_sub(1)
        })
        .collect()
}

fn run(path: &std::path::Path, workers: &str, backend: Option<Backend>) -> BTreeMap<String, u64> {
    let source = Arc::new(JsonLines::files_with_block_size(&[path], JsonDecoder::<Rec>::new(), BLOCK).unwrap());
    let mut job = Job::from_args(&["-w".into(), workers.into()]).unwrap();
    if let Some(backend) = backend {
        job = job.state_backend(backend);
    }
    let report = job
        .run(move |worker| {
            let source = Arc::clone(&source);
            worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
                let read = FromSource::new(source, |r: &Rec| r.time).build(scope)?;
                read.events.map(|r| (r.k, Some(r.name))).upsert();
                Ok(())
            })
        })
        .unwrap();
    report.totals
}

#[test]
fn partitions_count_their_bytes_and_operators_their_state() {
    let dir = crash::Scratch::new("sizes", "library");
    let path = dir.0.join("input.jsonl");
    let (lines, names) = write_input(&path);
    let size = std::fs::metadata(&path).unwrap().len();
    let blocks = size.div_ceil(BLOCK);
    let expected = expected_bytes(&lines, blocks);
    // The state's lower bound: each key's name and the key as encoded (the
    // state encoding: a tag, the length or a varint, the bytes); its upper
    // bound: that and 80 bytes of bookkeeping a key (a version's time, the
    // timers, and the names of the history's fields, written once an entry).
    let payload: u64 = names.iter().map(|(k, n)| n.len() as u64 + 2 + if *k < 128 { 2 } else { 3 }).sum();
    let (low, high) = (payload as f64 * 0.9, (payload + 80 * u64::from(KEYS)) as f64 * 1.1);

    for label in ["memory", "rocksdb"] {
        for workers in ["1", "2"] {
            let rocks = dir.0.join(format!("rocks-{workers}"));
            let backend = (label == "rocksdb").then(|| Backend::RocksDb(RocksDbConfig::new(&rocks)));
            let totals = run(&path, workers, backend);
            let what = format!("-w {workers}, {label}");
            let mut bytes = BTreeMap::new();
            for (name, value) in &totals {
                if let Some(path) = name.strip_suffix(".partition_bytes") {
                    let index: u64 = path.rsplit_once('/').unwrap().1.parse().unwrap();
                    bytes.insert(index, *value);
                }
            }
            assert_eq!(bytes.len() as u64, blocks, "{what}: a bytes gauge per block: {totals:?}");
            for (i, want) in expected.iter().enumerate() {
                assert_eq!(bytes[&(i as u64)], *want, "{what}: block {i}'s bytes");
            }
            let entries = totals.get("Upsert.state_entries").copied();
            assert_eq!(entries, Some(u64::from(KEYS)), "{what}: every key is held");
            let state = totals.get("Upsert.state_bytes").copied().unwrap_or(0) as f64;
            assert!(
                (low..=high).contains(&state),
                "{what}: the upsert table's state is estimated at {state} bytes, not within {low}..{high}"
            );
        }
    }
}
