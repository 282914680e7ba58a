//! Errors are never the end of input: a file truncated while it is read
//! fails its partition with an error (instead of ending it early), the job
//! stops without a final checkpoint or sink commit, and a recovery resumes
//! from the last good checkpoint to the same committed output as a run that
//! never failed.

#[path = "common/crash.rs"]
mod crash;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crash::Scratch;
use highwater::checkpoint::{latest_usable, CheckpointConfig, Checkpoints, LocalStore};
use highwater::prelude::*;
use highwater::sink::{write_parts, PartFormat};
use highwater::source::{run_until_failed, Decode, DecodeError, PartitionReader, ReadStatus, Source};

/// A record of the input file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Rec {
    k: u64,
    t: u64,
    pad: String,
}

const LINES: u64 = 140_000;

/// About 8 MB of JSON Lines: `LINES` records of 20 keys, event times 0, 10, 20, …
fn write_input(path: &Path) -> Vec<u8> {
    let mut text = String::new();
    for i in 0..LINES {
        text.push_str(&format!("{{\"k\":{},\"t\":{},\"pad\":\"{:030}\"}}\n", i % 20, i * 10, i));
    }
    std::fs::write(path, &text).unwrap();
    text.into_bytes()
}

#[test]
fn a_file_truncated_while_read_is_an_error_not_its_end() {
    let scratch = Scratch::new("source-failures", "reader");
    let path = scratch.0.join("in.jsonl");
    let bytes = write_input(&path);
    let source = JsonLines::files_with_block_size(&[&path], JsonDecoder::<Rec>::new(), 1 << 40).unwrap();
    let mut reader = source.open(0, None).unwrap();
    let (mut records, mut dead) = (0u64, Vec::new());
    assert_eq!(reader.read(100, &mut |_| records += 1, &mut dead).unwrap(), ReadStatus::Data);
    // A third of the file is left: the reader has buffered a chunk (128 KiB) of it.
    std::fs::File::options().write(true).open(&path).unwrap().set_len(bytes.len() as u64 / 3).unwrap();
    let error = loop {
        match reader.read(4096, &mut |_| records += 1, &mut dead) {
            Ok(ReadStatus::End) => panic!("the truncated file ended the partition after {records} records"),
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(!error.is_retryable());
    let message = error.to_string();
    assert!(message.contains("in.jsonl") && message.contains("truncated"), "{message}");
    let kept = bytes[..bytes.len() / 3].iter().filter(|b| **b == b'\n').count() as u64;
    assert!(records <= kept, "no records past the truncation: {records} read, {kept} lines were left");
    assert!(dead.is_empty());
}

/// JSON decoding that truncates the input file to a third once it has
/// decoded `after` records: the file is cut short under a running job.
struct TruncatingDecoder {
    inner: JsonDecoder<Rec>,
    path: PathBuf,
    after: u64,
    seen: AtomicU64,
}

impl Decode for TruncatingDecoder {
    type Record = Rec;
    fn decode(&self, bytes: &[u8]) -> Result<Rec, DecodeError> {
        if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.after {
            let len = std::fs::metadata(&self.path).unwrap().len();
            std::fs::File::options().write(true).open(&self.path).unwrap().set_len(len / 3).unwrap();
        }
        self.inner.decode(bytes)
    }
}

/// Sums per key in 10 s windows of `source`, into exactly-once part files in
/// `out`, checkpointing into `checkpoints`; returns what the workers and
/// `finish` said.
fn job<S>(source: S, checkpoints: &Path, out: &Path, recover: bool) -> (Result<(), String>, Result<bool, String>)
where
    S: Source<Record = Rec>,
{
    let mut config = CheckpointConfig::new(checkpoints.display().to_string());
    config.recover = recover;
    config.interval = std::time::Duration::from_millis(30);
    let ck = Checkpoints::open(config, 2).unwrap();
    let (c, out, source) = (ck.clone(), out.to_path_buf(), Arc::new(source));
    let metrics = SourceMetrics::default();
    let m = metrics.clone();
    let mut timely_config = timely::Config::process(2);
    ck.configure(&mut timely_config);
    let guards = timely::execute(timely_config, move |worker| -> Result<(), String> {
        worker.dataflow(|scope| -> Result<(), String> {
            let options = SourceOptions { batch_size: 256, idle_timeout: None, ..Default::default() };
            let events =
                read(scope, Arc::clone(&source), |r: &Rec| r.t, options, &m, None).map_err(|e| e.to_string())?.events;
            let sums = events.window(Tumbling::of(10.secs())).key_by(|r: &Rec| r.k).aggregate(Count);
            let lines = sums.results.map(|r| format!("{},{},{}", r.window.start, r.key, r.value));
            write_parts(&lines, "sums", out.clone(), None, PartFormat::Rows).map_err(|e| e.to_string())?;
            Ok(())
        })?;
        c.built(worker).map_err(|e| e.to_string())?;
        run_until_failed(worker, &[&m]).map_err(|e| e.to_string())
    })
    .unwrap();
    let workers: Result<Vec<()>, String> = guards.join().into_iter().map(|r| r.expect("no worker panics")).collect();
    (workers.map(|_| ()), ck.finish().map_err(|e| e.to_string()))
}

/// The committed rows of the part files in `out`, sorted.
fn committed(out: &Path) -> Vec<String> {
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        if entry.path().is_file() && entry.file_name().to_string_lossy().starts_with("part-") {
            rows.extend(std::fs::read_to_string(entry.path()).unwrap().lines().map(str::to_owned));
        }
    }
    rows.sort();
    rows
}

#[test]
fn a_job_whose_input_is_truncated_fails_without_committing_and_recovers() {
    let scratch = Scratch::new("source-failures", "job");
    let input = scratch.0.join("in.jsonl");
    let bytes = write_input(&input);
    let block = 2 << 20;

    // The reference: a run that never fails.
    let (reference_out, reference_ck) = (scratch.0.join("ref-out"), scratch.0.join("ref-ck"));
    let source = JsonLines::files_with_block_size(&[&input], JsonDecoder::<Rec>::new(), block).unwrap();
    let (workers, finished) = job(source, &reference_ck, &reference_out, false);
    assert_eq!((workers, finished), (Ok(()), Ok(true)));
    let expected = committed(&reference_out);
    assert_eq!(expected.len() as u64, 20 * LINES / 1000, "a count per key and 10 s window");

    // The file is truncated under the job: it fails, with the file's error.
    let (out, ck) = (scratch.0.join("out"), scratch.0.join("ck"));
    let decoder =
        TruncatingDecoder { inner: JsonDecoder::new(), path: input.clone(), after: 20_000, seen: AtomicU64::new(0) };
    let source = JsonLines::files_with_block_size(&[&input], decoder, block).unwrap();
    let (workers, finished) = job(source, &ck, &out, false);
    let error = workers.expect_err("the job fails");
    assert!(error.contains("in.jsonl") && error.contains("truncated"), "{error}");
    let finished = finished.expect_err("checkpointing fails with the source");
    assert!(finished.contains("truncated"), "{finished}");
    // No final checkpoint, and nothing committed past the last good one.
    let latest = latest_usable(&LocalStore::open(ck.clone()).unwrap()).unwrap();
    assert!(latest.as_ref().is_none_or(|(m, _)| !m.is_final()), "no final checkpoint after a failure");
    let partial = committed(&out);
    assert!(partial.len() < expected.len(), "the failed run did not commit everything");
    assert!(partial.iter().all(|row| expected.binary_search(row).is_ok()), "what it committed is right");

    // The file back in place, the job recovers from the last good checkpoint.
    std::fs::write(&input, &bytes).unwrap();
    let source = JsonLines::files_with_block_size(&[&input], JsonDecoder::<Rec>::new(), block).unwrap();
    let (workers, finished) = job(source, &ck, &out, true);
    assert_eq!((workers, finished), (Ok(()), Ok(true)));
    assert_eq!(committed(&out), expected, "exactly the output of a run that never failed");
}
