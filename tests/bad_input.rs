//! Bad input: every malformed line becomes a dead letter with its reason, the
//! job does not stop, and the good lines give exactly their own result.

use std::path::Path;
use std::process::Command;

use highwater::dead_letter::DeadLetter;
use highwater::nexmark::NexmarkDecoder;
use highwater::source::{JsonLines, PartitionReader, ReadStatus, Source};

const GOOD_BID: &str = r#"{"event_type":2,"bid":{"auction":1000,"bidder":1001,"price":5000,"channel":"Google","url":"https://www.nexmark.com/a/b/c/item.htm?query=1","dateTime":1704067203500,"extra":"xyz"}}"#;

/// The good bid with two bytes that are not UTF-8 in its `extra` string.
fn non_utf8_bid() -> Vec<u8> {
    let at = GOOD_BID.find("xyz").unwrap();
    [&GOOD_BID.as_bytes()[..at], b"x\xff\xfe", &GOOD_BID.as_bytes()[at + 1..]].concat()
}

/// (line, the reason's telling part)
fn bad_lines() -> Vec<(Vec<u8>, &'static str)> {
    vec![
        (GOOD_BID.as_bytes()[..60].to_vec(), "EOF while parsing"),
        (GOOD_BID.replace("\"price\":5000", "\"price\":\"5000\"").into_bytes(), "invalid type: string \"5000\", expected i64"),
        (GOOD_BID.replace(",\"extra\":\"xyz\"", "").into_bytes(), "missing field `extra`"),
        (GOOD_BID.replace("xyz", "x\u{1}y").into_bytes(), "control character"),
        (non_utf8_bid(), "invalid unicode"),
        (GOOD_BID.replace("\"event_type\":2", "\"event_type\":7").into_bytes(), "event_type 7 is not"),
        (GOOD_BID.replace("\"event_type\":2", "\"event_type\":0").into_bytes(), "needs exactly the key \"person\""),
        (GOOD_BID.replace("\"dateTime\":1704067203500", "\"dateTime\":-5").into_bytes(), "invalid value: integer `-5`"),
        (GOOD_BID.replace("\"extra\":\"xyz\"", "\"extra\":\"xyz\",\"color\":1").into_bytes(), "unknown field `color`"),
        (br#"{"event_type":1,"auction":{"id":1,"itemName":"a","description":"b","initialBid":1,"reserve":2,"dateTime":100,"expires":100,"seller":1,"category":10,"extra":""}}"#.to_vec(), "expires 100 is not after dateTime 100"),
        (b"not json at all".to_vec(), "expected"),
        (b"[]".to_vec(), "invalid length 0"),
    ]
}

/// The fixture's good lines with the bad ones spread between them, and an empty line.
fn mixed_file(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let good = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/events.jsonl")).unwrap();
    let mut mixed = Vec::new();
    let bad = bad_lines();
    for (i, line) in good.split(|b| *b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        mixed.extend_from_slice(line);
        mixed.push(b'\n');
        if i % 80 == 0 && i / 80 < bad.len() {
            mixed.extend_from_slice(&bad[i / 80].0);
            mixed.push(b'\n');
        }
        if i == 500 {
            mixed.push(b'\n');
        }
    }
    let path = dir.join("mixed.jsonl");
    std::fs::write(&path, mixed).unwrap();
    (path, Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/events.jsonl"))
}

#[test]
fn every_bad_line_is_a_dead_letter_with_its_reason() {
    let dir = std::env::temp_dir().join(format!("highwater-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mixed, _) = mixed_file(&dir);
    // Small blocks: bad lines also land at block boundaries.
    let source = JsonLines::files_with_block_size(&[&mixed], NexmarkDecoder, 4096).unwrap();
    let mut events = Vec::new();
    let mut dead: Vec<DeadLetter> = Vec::new();
    for p in 0..source.partitions().unwrap().len() {
        let mut reader = source.open(p, None).unwrap();
        while reader.read(100, &mut |e| events.push(e), &mut dead).unwrap() != ReadStatus::End {}
    }
    assert_eq!(events.len(), 1000, "every good line is read once");
    let bad = bad_lines();
    assert_eq!(dead.len(), bad.len(), "{dead:#?}");
    for (letter, (line, reason)) in dead.iter().zip(&bad) {
        assert!(letter.reason.contains(reason), "reason {:?} should mention {reason:?}", letter.reason);
        assert_eq!(letter.raw, String::from_utf8_lossy(line));
        assert!(letter.origin.ends_with("mixed.jsonl"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cli_writes_dead_letters_and_the_good_result() {
    let dir = std::env::temp_dir().join(format!("highwater-bad-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mixed, good) = mixed_file(&dir);
    let dead_path = dir.join("dead.jsonl");
    let run = |input: &Path, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_highwater"))
            .args(["nexmark", "--query", "q4", "--input", input.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (want, _) = run(&good, &[]);
    let (got, stderr) = run(&mixed, &["--dead-letters", dead_path.to_str().unwrap(), "--", "-w", "2"]);
    assert_eq!(got, want, "the bad lines change nothing");
    assert!(stderr.contains(&format!("dead_letters={}", bad_lines().len())), "{stderr}");
    let letters: Vec<DeadLetter> =
        std::fs::read_to_string(&dead_path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(letters.len(), bad_lines().len());
    assert!(letters.iter().any(|d| d.reason.contains("missing field `extra`")));
    std::fs::remove_dir_all(&dir).unwrap();
}
