//! Lines longer than the largest record (`JsonLines::max_record_size`,
//! `--max-record-size`): each becomes one dead letter with its offset and
//! length, the good lines around them give the right results, and a 300 MB
//! line is read in bounded memory (the summary's peak RSS), once.

#[path = "common/crash.rs"]
mod crash;

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};

use highwater::prelude::*;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Rec {
    k: u32,
    time: u64,
}

/// Writes `lines` (a line is given as its bytes, or as a length of junk)
/// into `path`; returns each line's offset.
fn write_file(path: &std::path::Path, lines: &[Result<String, usize>]) -> Vec<u64> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut offsets = Vec::new();
    let mut at = 0u64;
    let junk = vec![b'x'; 1 << 20];
    for line in lines {
        offsets.push(at);
        match line {
            Ok(text) => {
                file.write_all(text.as_bytes()).unwrap();
                at += text.len() as u64;
            }
            Err(len) => {
                let mut left = *len;
                while left > 0 {
                    let n = left.min(junk.len());
                    file.write_all(&junk[..n]).unwrap();
                    left -= n;
                }
                at += *len as u64;
            }
        }
        file.write_all(b"\n").unwrap();
        at += 1;
    }
    file.flush().unwrap();
    offsets
}

#[test]
fn over_long_lines_become_dead_letters_and_the_others_records() {
    let dir = crash::Scratch::new("long-lines", "library");
    let path = dir.0.join("input.jsonl");
    let limit = 64 << 10;
    // A line exactly at the limit (padded JSON) is a record; one byte more is not.
    let at_limit = |k: u32| {
        let head = format!("{{\"k\":{k},\"time\":{},\"pad\":\"", k * 10);
        let pad = "y".repeat(limit - head.len() - 2);
        format!("{head}{pad}\"}}")
    };
    let mut lines: Vec<Result<String, usize>> = Vec::new();
    let mut long = Vec::new();
    for k in 0..200u32 {
        lines.push(Ok(if k % 50 == 7 { at_limit(k) } else { format!("{{\"k\":{k},\"time\":{}}}", k * 10) }));
        if k % 9 == 4 {
            long.push(lines.len());
            // From one byte over the limit to several blocks' worth.
            lines.push(Err(limit + 1 + (k as usize % 5) * 300_000));
        }
    }
    let offsets = write_file(&path, &lines);
    // Small blocks: long lines span many of them.
    let source = Arc::new(
        JsonLines::files_with_block_size(&[&path], JsonDecoder::<Rec>::new(), 100_000).unwrap().max_record_size(limit),
    );
    for workers in ["1", "3"] {
        let found = Arc::new(Mutex::new((Vec::new(), Vec::new())));
        let (source, into) = (Arc::clone(&source), Arc::clone(&found));
        Job::from_args(&["-w".into(), workers.into()])
            .unwrap()
            .run(move |worker| {
                let (source, into) = (Arc::clone(&source), Arc::clone(&into));
                worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
                    let read = FromSource::new(source, |r: &Rec| r.time).build(scope)?;
                    let records = Arc::clone(&into);
                    read.events.inspect(move |(r, _, _)| records.lock().unwrap().0.push(r.k));
                    read.dead_letters.inspect(move |(d, _, _)| {
                        into.lock().unwrap().1.push((d.offset, d.reason.clone(), d.raw.len()))
                    });
                    Ok(())
                })
            })
            .unwrap();
        let (mut records, mut dead) = std::mem::take(&mut *found.lock().unwrap());
        records.sort_unstable();
        dead.sort();
        assert_eq!(records, (0..200).collect::<Vec<u32>>(), "-w {workers}: every good line, once");
        assert_eq!(dead.len(), long.len(), "-w {workers}: one dead letter per long line");
        for ((offset, reason, raw), &i) in dead.iter().zip(&long) {
            let Err(len) = lines[i] else { unreachable!() };
            assert_eq!(*offset, offsets[i], "-w {workers}");
            assert!(reason.contains(&format!("a line of {len} bytes")), "{reason}");
            assert_eq!(*raw, highwater::dead_letter::MAX_RAW_BYTES, "the raw bytes are cut");
        }
    }
}

#[test]
fn a_300_mb_line_is_one_dead_letter_in_bounded_memory() {
    let dir = crash::Scratch::new("long-lines", "cli");
    let events = dir.0.join("events.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["generate", "--events", "2000", "--output"])
        .arg(&events)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&events).unwrap();
    let mut lines: Vec<Result<String, usize>> = text.lines().map(|l| Ok(l.to_owned())).collect();
    lines.insert(1_000, Err(300 << 20));
    for i in 0..20 {
        lines.insert(100 + i * 50, Err(5 << 20));
    }
    let input = dir.0.join("input.jsonl");
    let offsets = write_file(&input, &lines);
    let dead = dir.0.join("dead.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q0", "--discard", "--input"])
        .arg(&input)
        .arg("--dead-letters")
        .arg(&dead)
        .args(["--", "-w", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("events=2000 "), "{stderr}");
    assert!(stderr.contains("dead_letters=21 "), "{stderr}");
    let rss: u64 = stderr
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("peak_rss_mib="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak_rss_mib in {stderr}"));
    // The old reader held the whole line (574 MiB for 300 MB): now at most
    // the limit (4 MiB) and one read per worker besides the job itself.
    assert!(rss < 150, "peak RSS {rss} MiB");
    let mut expected: Vec<u64> = lines.iter().zip(&offsets).filter(|(l, _)| l.is_err()).map(|(_, o)| *o).collect();
    expected.sort_unstable();
    let mut found: Vec<u64> = std::fs::read_to_string(&dead)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["offset"].as_u64().unwrap())
        .collect();
    found.sort_unstable();
    assert_eq!(found, expected);
}
