//! Nexmark throughput and memory: runs the `highwater` binary on every query.
//!
//! What it isolates: the whole query (source, operators, exchange between
//! workers) with a blackhole sink (`--discard`: rows are counted, not
//! formatted), against a baseline measured in the same run: the source alone
//! (`--source-only`: generate or parse the events and count them). Each
//! figure is the median of `--runs` runs; peak RSS is the largest seen.
//!
//! ```text
//! cargo bench --bench nexmark -- --events 10000000 --runs 3 --workers 1,2
//! cargo bench --bench nexmark -- --file events.jsonl --runs 3 --workers 1,2
//! cargo bench --bench nexmark -- --memory 400000000 --queries q5,q7
//! ```
//!
//! Prints Markdown tables for BENCHMARKS.md.

mod common;

use common::{field, median, run_query};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Options {
    events: u64,
    file: Option<String>,
    runs: usize,
    workers: Vec<usize>,
    queries: Vec<String>,
    memory: Option<u64>,
}

fn parse_args() -> Options {
    let mut o = Options {
        events: 10_000_000,
        file: None,
        runs: 3,
        workers: vec![1, 2],
        queries: (0..=22).map(|q| format!("q{q}")).collect(),
        memory: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--events" => o.events = value().parse().expect("--events N"),
            "--file" => o.file = Some(value()),
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--workers" => o.workers = value().split(',').map(|w| w.parse().expect("--workers 1,2")).collect(),
            "--queries" => o.queries = value().split(',').map(str::to_owned).collect(),
            "--memory" => o.memory = Some(value().parse().expect("--memory EVENTS")),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

fn throughput(o: &Options) {
    let (input, label): (Vec<String>, String) = match &o.file {
        Some(path) => (vec!["--input".into(), path.clone()], format!("file {path}")),
        None => (vec!["--events".into(), o.events.to_string()], format!("generator, {} events", o.events)),
    };
    println!("### {label}, median of {} runs\n", o.runs);
    print!("| query |");
    for w in &o.workers {
        print!(" {w} worker ev/s | ratio to source | peak RSS MiB |");
    }
    println!();
    print!("|---|");
    for _ in &o.workers {
        print!("---:|---:|---:|");
    }
    println!();
    let mut baseline = Vec::new();
    for &w in &o.workers {
        let rates: Vec<f64> = (0..o.runs).map(|_| run_query("q0", &input, w, true).0).collect();
        baseline.push(median(rates));
    }
    print!("| source only |");
    for b in &baseline {
        print!(" {:.2} M | 1.00 | |", b / 1e6);
    }
    println!();
    for q in &o.queries {
        print!("| {q} |");
        for (i, &w) in o.workers.iter().enumerate() {
            let results: Vec<(f64, f64)> = (0..o.runs).map(|_| run_query(q, &input, w, false)).collect();
            let rate = median(results.iter().map(|r| r.0).collect());
            let rss = results.iter().map(|r| r.1).fold(0.0, f64::max);
            print!(" {:.2} M | {:.2} | {rss:.0} |", rate / 1e6, rate / baseline[i]);
        }
        println!();
    }
    println!();
}

/// Resident set size of a process in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn memory(o: &Options, events: u64) {
    println!("### Memory over {events} generated events (RSS sampled every 5 s)\n");
    for q in &o.queries {
        for &w in &o.workers {
            let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
                .args([
                    "nexmark",
                    "--query",
                    q,
                    "--discard",
                    "--events",
                    &events.to_string(),
                    "--",
                    "-w",
                    &w.to_string(),
                ])
                .stderr(Stdio::piped())
                .spawn()
                .expect("running highwater");
            let started = Instant::now();
            let mut samples = Vec::new();
            while child.try_wait().expect("waiting").is_none() {
                std::thread::sleep(Duration::from_millis(250));
                if started.elapsed().as_secs_f64() >= 5.0 * (samples.len() + 1) as f64 {
                    if let Some(rss) = rss_mib(child.id()) {
                        samples.push((started.elapsed().as_secs(), rss));
                    }
                }
            }
            let out = child.wait_with_output().expect("waiting");
            let summary = String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default().to_owned();
            let after_minute: Vec<f64> = samples.iter().filter(|(t, _)| *t >= 60).map(|s| s.1).collect();
            let at_minute = samples.iter().filter(|(t, _)| *t <= 60).map(|s| s.1).fold(0.0, f64::max);
            println!(
                "- {q}, {w} worker(s): {:.0} s, {:.2} M ev/s; RSS MiB at 5 s intervals: {}; max in the first minute {at_minute:.0}, max after it {:.0}",
                field(&summary, "seconds"),
                field(&summary, "events/s") / 1e6,
                samples.iter().map(|s| format!("{:.0}", s.1)).collect::<Vec<_>>().join(" "),
                after_minute.iter().copied().fold(0.0, f64::max),
            );
        }
    }
    println!();
}

fn main() {
    let o = parse_args();
    match o.memory {
        Some(events) => memory(&o, events),
        None => throughput(&o),
    }
}
