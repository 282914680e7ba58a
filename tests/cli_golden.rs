//! Golden results of the `highwater nexmark` command on a small fixture.
//!
//! `tests/golden/events.jsonl` holds 1000 generated events (20 s of event
//! time); `events-ooo.jsonl` the same events up to 2 s out of order. Each
//! `qN.csv` is the query's canonical CSV with its rows sorted: a change in a
//! query's output shows as a diff here. Both files and 1 or 2 workers must
//! give the golden result.

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

/// Runs `highwater` with `args`; returns (success, stdout, stderr).
fn highwater(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_highwater")).args(args).output().expect("running highwater");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Header first, then the rows sorted.
fn canonical(csv: &str) -> String {
    let mut lines = csv.lines();
    let header = lines.next().unwrap_or_default().to_owned();
    let mut rows: Vec<&str> = lines.collect();
    rows.sort();
    std::iter::once(header.as_str()).chain(rows).map(|l| format!("{l}\n")).collect()
}

fn check(query: &str) {
    let want = std::fs::read_to_string(golden(&format!("{query}.csv"))).unwrap();
    for file in ["events.jsonl", "events-ooo.jsonl"] {
        for workers in ["1", "2"] {
            let input = golden(file);
            let (ok, stdout, stderr) =
                highwater(&["nexmark", "--query", query, "--input", input.to_str().unwrap(), "--", "-w", workers]);
            assert!(ok, "{query} on {file} failed: {stderr}");
            assert_eq!(canonical(&stdout), want, "{query} on {file} at {workers} workers differs from its golden file");
            assert!(stderr.contains("events=1000 "), "summary line missing: {stderr}");
        }
    }
}

macro_rules! golden_tests {
    ($($q:ident),*) => {$( #[test] fn $q() { check(stringify!($q)) } )*};
}

golden_tests!(q3, q4, q5, q7, q8, q9, q11, q15, q18, q19);

#[test]
fn generated_events_equal_the_fixture() {
    let (ok, stdout, stderr) = highwater(&["generate", "--events", "1000", "--rate", "50"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, std::fs::read_to_string(golden("events.jsonl")).unwrap());
}

#[test]
fn stdin_input_gives_the_same_result() {
    let input = std::fs::read(golden("events-ooo.jsonl")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q5", "--input", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(canonical(&String::from_utf8(out.stdout).unwrap()), std::fs::read_to_string(golden("q5.csv")).unwrap());
}

#[test]
fn q10_writes_partitioned_files() {
    let dir = std::env::temp_dir().join(format!("highwater-q10-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let input = golden("events.jsonl");
    let (ok, _, stderr) = highwater(&[
        "nexmark",
        "--query",
        "q10",
        "--input",
        input.to_str().unwrap(),
        "--output",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    // 2024-01-01T00:00:03Z .. 00:00:23Z: one partition.
    let part = std::fs::read_to_string(dir.join("dt=2024-01-01/hm=00/part-0.csv")).unwrap();
    let mut lines = part.lines();
    assert_eq!(lines.next(), Some("auction,bidder,price,dateTime,extra"));
    assert_eq!(lines.count(), 920, "every bid of the fixture");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_are_reported() {
    let (ok, _, stderr) = highwater(&["nexmark", "--query", "q99", "--events", "10"]);
    assert!(!ok && stderr.contains("unknown query"), "{stderr}");
    let (ok, _, stderr) = highwater(&["nexmark", "--query", "q1", "--events", "10", "--watermark-delay", "soon"]);
    assert!(!ok && stderr.contains("invalid duration"), "{stderr}");
    let (ok, _, stderr) = highwater(&["nexmark", "--query", "q1", "--input", "/nonexistent/events.jsonl"]);
    assert!(!ok && stderr.contains("/nonexistent/events.jsonl"), "{stderr}");
    let (ok, _, stderr) = highwater(&["nexmark", "--query", "q1", "--events", "10", "--", "-w", "zero"]);
    assert!(!ok && stderr.contains("-w needs a number"), "{stderr}");
}

#[test]
fn late_records_are_counted_not_lost() {
    // A watermark with no delay makes the out-of-order fixture's stragglers late.
    let input = golden("events-ooo.jsonl");
    let (ok, stdout, stderr) = highwater(&[
        "nexmark",
        "--query",
        "q7",
        "--input",
        input.to_str().unwrap(),
        "--watermark-delay",
        "0ms",
        "--batch-size",
        "10",
    ]);
    assert!(ok, "{stderr}");
    let late: u64 = stderr.split("late=").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().parse().unwrap();
    assert!(late > 0, "stragglers should be late: {stderr}");
    assert!(stdout.lines().count() > 1);
    // With enough lateness allowed, the result is the golden one again.
    let (ok, stdout, stderr) = highwater(&[
        "nexmark",
        "--query",
        "q7",
        "--input",
        input.to_str().unwrap(),
        "--watermark-delay",
        "0ms",
        "--batch-size",
        "10",
        "--allowed-lateness",
        "3s",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(" late=0 "), "{stderr}");
    assert_eq!(canonical(&stdout), std::fs::read_to_string(golden("q7.csv")).unwrap());
}
