//! Flow control on several workers: a sink that stalls stops the sources
//! (memory stays bounded, the time throttled is reported), the job resumes
//! when the sink does and loses or duplicates nothing; and a job that waits
//! for event time with a tiny in-flight bound does not deadlock, since what
//! an operator holds as state is not in flight.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::prelude::*;

/// An order-independent digest of lines: their count and the wrapping sum
/// of their CRC-32s.
fn digest(lines: impl Iterator<Item = String>) -> (u64, u32) {
    lines.fold((0, 0u32), |(n, sum), line| (n + 1, sum.wrapping_add(crc32fast::hash(line.as_bytes()))))
}

fn summary_value(stderr: &str, key: &str) -> u64 {
    stderr
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {stderr}"))
}

#[test]
fn a_stalled_sink_stops_the_sources_on_two_workers_and_loses_nothing() {
    let events = "4000000";
    let q0 = |stall: Option<Duration>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
            // Flow control alone: with alignment, the partition of the worker
            // that is not blocked on the sink would stop at the drift first
            // (`tests/alignment.rs` covers that).
            .args(["nexmark", "--query", "q0", "--events", events, "--max-drift", "off", "--", "-w", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).unwrap();
            text
        });
        let mut reader = BufReader::new(stdout);
        // The sink stalls: nothing is read until the pipe's buffer is full and
        // the worker writing the output blocks, for `stall`.
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let started = Instant::now();
        if let Some(stall) = stall {
            std::thread::sleep(stall);
        }
        let rows = digest(reader.lines().map(Result::unwrap));
        let status = child.wait().unwrap();
        let stderr = errors.join().unwrap();
        assert!(status.success(), "{stderr}");
        (header, rows, stderr, started.elapsed())
    };
    let (header, expected, free, _) = q0(None);
    let (stalled_header, rows, stderr, _) = q0(Some(Duration::from_secs(4)));
    assert_eq!(stalled_header, header);
    assert_eq!(rows, expected, "every row once, stalled or not");
    assert_eq!(summary_value(&stderr, "rows"), expected.0);
    // While the sink stalled the sources waited, instead of reading the
    // whole input into the exchange towards the sink's worker (hundreds of
    // MiB before flow control counted records in flight).
    let throttled = summary_value(&stderr, "throttled_ms");
    assert!(throttled >= 1_000, "throttled {throttled} ms while the sink stalled 4 s: {stderr}");
    let rss = summary_value(&stderr, "peak_rss_mib");
    let free_rss = summary_value(&free, "peak_rss_mib");
    assert!(rss < 150, "peak RSS {rss} MiB with a stalled sink ({free_rss} MiB without): {stderr}");
}

#[test]
fn a_stalled_sink_stops_the_sources_of_another_process() {
    let dir = std::env::temp_dir().join(format!("highwater-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = dir.join("hosts");
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", port(), port())).unwrap();
    let spawn = |process: &str| {
        Command::new(env!("CARGO_BIN_EXE_highwater"))
            .args(["nexmark", "--query", "q0", "--events", "4000000", "--max-drift", "off"])
            .args(["--", "-w", "1", "-n", "2", "-p", process, "-h"])
            .arg(&hosts)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut p0, mut p1) = (spawn("0"), spawn("1"));
    let stderr_of = |child: &mut std::process::Child| {
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).unwrap();
            text
        })
    };
    let (e0, e1) = (stderr_of(&mut p0), stderr_of(&mut p1));
    let out1 = p1.stdout.take().unwrap();
    let drained = std::thread::spawn(move || BufReader::new(out1).lines().count());
    // Process 0 runs the sink (worker 0): it stalls 4 s while process 1's
    // source sends it rows over the network.
    std::thread::sleep(Duration::from_secs(4));
    let rows = digest(BufReader::new(p0.stdout.take().unwrap()).lines().map(Result::unwrap).skip(1));
    assert!(p0.wait().unwrap().success() && p1.wait().unwrap().success());
    let (e0, e1) = (e0.join().unwrap(), e1.join().unwrap());
    assert_eq!(drained.join().unwrap(), 0, "process 1 writes no rows");
    assert_eq!(rows.0, summary_value(&e0, "rows"), "{e0}");
    assert_eq!(summary_value(&e1, "rows"), rows.0, "the summary counts the whole job: {e1}");
    // Process 1's source waited for process 0 to take its records.
    let throttled = summary_value(&e1, "throttled_ms");
    assert!(throttled >= 1_000, "process 1 throttled {throttled} ms: {e1}");
    for (process, stderr) in [(0, &e0), (1, &e1)] {
        let rss = summary_value(stderr, "peak_rss_mib");
        assert!(rss < 150, "process {process}: peak RSS {rss} MiB: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A session window whose sessions never close before the input ends, on
/// two workers, with a bound of 4 records in flight per worker: its input
/// becomes its state, which does not count, so the sources read on.
#[test]
fn waiting_for_event_time_with_a_tiny_bound_does_not_deadlock() {
    // Two partitions of one key each, a record every second: one session each.
    let partitions: Vec<Vec<(u32, u64)>> = (0..4).map(|p| (0..20_000u64).map(|i| (p, i * 1_000)).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    let found = Arc::new(Mutex::new(Vec::new()));
    let into = Arc::clone(&found);
    let started = Instant::now();
    Job::from_args(&["-w".into(), "2".into()])
        .unwrap()
        .run(move |worker| {
            let (source, into) = (Arc::clone(&source), Arc::clone(&into));
            worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
                let options = SourceOptions { max_in_flight: 4, batch_size: 16, ..Default::default() };
                let read = FromSource::new(source, |r: &(u32, u64)| r.1).options(options).build(scope)?;
                let sessions =
                    read.events.key_by(|r: &(u32, u64)| r.0).window(Session::with_gap(10.minutes())).aggregate(Count);
                sessions.results.inspect(move |(r, _, d)| into.lock().unwrap().push((r.key, r.value, *d)));
                Ok(())
            })
        })
        .unwrap();
    let mut found = std::mem::take(&mut *found.lock().unwrap());
    found.sort();
    assert_eq!(found, (0..4).map(|k| (k, 20_000, 1)).collect::<Vec<_>>());
    // Not a timer's work: the old flow control read on after 200 ms without progress.
    assert!(started.elapsed() < Duration::from_secs(60));
}
