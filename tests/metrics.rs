//! Prometheus metrics of a running job (`--metrics-addr`, issue 18): a
//! `highwater nexmark` job on an unbounded generator at `-w 2` with a state
//! TTL is scraped twice over HTTP with a real client; the output parses with
//! a Prometheus text-format parser, the counters move, the watermark
//! advances and its lag behind the wall clock is what the generator's
//! event times make it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/prometheus.rs"]
mod prometheus;

use prometheus::{scrape, value};

#[test]
fn a_running_job_serves_its_metrics() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q20", "--events", "100000000000", "--discard", "--state-ttl", "2s"])
        .args(["--metrics-addr", "127.0.0.1:0", "--", "-w", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The address it chose, from its stderr.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the job ended before serving its metrics");
        if let Some(rest) = line.trim().strip_prefix("metrics at ") {
            break rest.to_owned();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    std::thread::sleep(Duration::from_secs(2));
    let first = scrape(&url, None);
    let at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let second = scrape(&url, None);
    let elapsed = at.elapsed().as_secs_f64();
    child.kill().unwrap();
    child.wait().unwrap();

    let records = |s| value(s, "highwater_source_records_total", Some(("source", "Nexmark"))).expect("records");
    let (r1, r2) = (records(&first), records(&second));
    assert!(r1 > 0.0 && r2 > r1, "the source's records move: {r1} then {r2}");
    let expired = |s| value(s, "highwater_state_expired_total", Some(("operator", "Join"))).expect("expired");
    assert!(expired(&second) > expired(&first), "the join's records expire");
    let watermark = |s| value(s, "highwater_watermark_seconds", None).expect("watermark");
    assert!(watermark(&second) > watermark(&first), "the watermark advances");
    // The generator's event times start at 2024-01-01 and run faster than
    // the wall clock: the lag is the wall clock minus the watermark, now.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let lag = value(&second, "highwater_watermark_lag_seconds", None).expect("lag");
    let expected = now - watermark(&second);
    assert!((lag - expected).abs() < elapsed + 5.0, "lag {lag} s, wall clock minus watermark {expected} s");
    assert!(value(&second, "highwater_in_flight_records", None).is_some_and(|n| n >= 0.0));
    // The join's state: keys held, bounded by its time-to-live.
    let entries = value(&second, "highwater_state_entries", Some(("operator", "Join"))).expect("the join's state");
    assert!(entries > 0.0 && entries < r2, "the join holds {entries} keys of {r2} records read");
    assert!(value(&second, "highwater_source_dead_letters_total", Some(("source", "Nexmark"))) == Some(0.0));
}
