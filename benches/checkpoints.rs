//! Checkpoint costs: throughput with and without checkpoints, and the size,
//! write time and restart time of large state.
//!
//! 1. Throughput: Nexmark q5 and q7 on the generator, with a checkpoint every
//!    second (`--checkpoint-dir`, `--checkpoint-interval 1s`) against the same
//!    run without checkpoints (the baseline, measured in the same run), both
//!    with a blackhole sink and 4 generator partitions, run in interleaved
//!    pairs: the median of each, and the median of the pairs' ratios.
//! 2. State: a job counting events per key in a one-hour tumbling window over
//!    `--keys` keys (1 M and 10 M by default), run as a child process of this
//!    harness. Once a checkpoint holds every key the child is killed (SIGKILL)
//!    and started again with `--recover`; its source then sends the event that
//!    closes the window. Reported: the checkpoint's size, the time to write it
//!    (shard files, store, manifest; from the job's log), the longest pause
//!    of a worker taking its snapshot, and the time from the restart to the
//!    first output row (state loaded, sources rewound, window fired).
//!
//! ```text
//! cargo bench --bench checkpoints -- --events 30000000 --runs 3 --keys 1000000,10000000
//! cargo bench --bench checkpoints -- --only state --keys 1000000
//! ```
//!
//! Prints Markdown tables for BENCHMARKS.md.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{field, median};
use highwater::checkpoint::{latest_usable, CheckpointConfig, Checkpoints, LocalStore};
use highwater::dead_letter::DeadLetter;
use highwater::prelude::*;
use highwater::source::{Offset, PartitionReader, ReadStatus, SourceError};

// The allocator of the `highwater` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Partitions of the state job's source.
const PARTITIONS: usize = 4;
/// Keys per millisecond of event time, per partition.
const KEYS_PER_MS: u64 = 8;
/// The window of the state job (one hour).
const HOUR: u64 = 3_600_000;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let first = args.next();
    if first.as_deref() == Some("--state-job") {
        let keys: u64 = args.next().and_then(|k| k.parse().ok()).expect("--state-job KEYS DIR MODE");
        let dir = PathBuf::from(args.next().expect("DIR"));
        let finish = args.next().as_deref() == Some("finish");
        state_job(keys, &dir, finish);
        return;
    }
    let (mut events, mut runs, mut keys) = (30_000_000u64, 3usize, vec![1_000_000u64, 10_000_000]);
    let mut only: Option<String> = None;
    let mut rest: Vec<String> = first.into_iter().chain(args).collect();
    rest.reverse();
    while let Some(a) = rest.pop() {
        let value = rest.pop().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--events" => events = value.parse().expect("--events N"),
            "--runs" => runs = value.parse().expect("--runs N"),
            "--keys" => keys = value.split(',').map(|k| k.parse().expect("--keys N,M")).collect(),
            "--only" => only = Some(value),
            other => panic!("unknown argument {other}"),
        }
    }
    if only.as_deref() != Some("state") {
        throughput(events, runs);
    }
    if only.as_deref() != Some("throughput") {
        state(&keys);
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("highwater-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One Nexmark run; events/s.
fn nexmark(query: &str, events: u64, workers: usize, checkpoints: bool) -> f64 {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_highwater"));
    cmd.args(["nexmark", "--query", query, "--discard", "--partitions", "4", "--events", &events.to_string()]);
    let dir = scratch("throughput");
    if checkpoints {
        cmd.arg("--checkpoint-dir").arg(&dir).args(["--checkpoint-interval", "1s"]);
    }
    let out = cmd.args(["--", "-w", &workers.to_string()]).output().expect("running highwater");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{query}: {stderr}");
    field(stderr.lines().last().unwrap_or_default(), "events/s")
}

fn throughput(events: u64, runs: usize) {
    println!("### Throughput with a checkpoint every second, generator, {events} events, median of {runs} runs\n");
    println!("| query | workers | without ev/s | with ev/s | ratio of medians | median ratio of pairs (range) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for query in ["q5", "q7"] {
        for workers in [1, 2] {
            let (mut without, mut with, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            // Interleaved in pairs, so that both runs of a pair see the same
            // machine (its speed drifts over seconds to minutes).
            for _ in 0..runs {
                let (a, b) = (nexmark(query, events, workers, false), nexmark(query, events, workers, true));
                without.push(a);
                with.push(b);
                ratios.push(b / a);
            }
            let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let high = ratios.iter().copied().fold(0.0, f64::max);
            let (a, b, r) = (median(without), median(with), median(ratios));
            println!(
                "| {query} | {workers} | {:.2} M | {:.2} M | {:.3} | {r:.3} ({low:.2}–{high:.2}) |",
                a / 1e6,
                b / 1e6,
                b / a
            );
        }
    }
    println!();
}

/// The state job's source: partition `p` sends keys `p, p + P, …` once each,
/// eight per millisecond of event time, then (with `finish`) the event at one
/// hour and five seconds that closes the window. Without `finish` it idles,
/// its watermark moving on with the wall clock (a checkpoint completes when
/// event time passes its cut) but staying inside the window.
#[derive(Debug)]
struct Keys {
    keys: u64,
    finish: bool,
}

#[derive(Debug)]
struct KeysReader {
    partition: u64,
    next: u64,
    keys: u64,
    finish: bool,
    opened: Instant,
}

impl Source for Keys {
    type Record = (u64, u64);
    type Reader = KeysReader;
    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok((0..PARTITIONS).map(|p| format!("keys-{p}")).collect())
    }
    fn open(&self, index: usize, from: Option<Offset>) -> Result<KeysReader, SourceError> {
        Ok(KeysReader {
            partition: index as u64,
            next: from.unwrap_or(0),
            keys: self.keys,
            finish: self.finish,
            opened: Instant::now(),
        })
    }
}

impl PartitionReader for KeysReader {
    type Record = (u64, u64);
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut((u64, u64)),
        _dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        let mine = (self.keys - self.partition).div_ceil(PARTITIONS as u64);
        let mut taken = 0;
        while taken < max && self.next < mine {
            out((self.partition + self.next * PARTITIONS as u64, self.next / KEYS_PER_MS));
            self.next += 1;
            taken += 1;
        }
        if taken > 0 {
            return Ok(ReadStatus::Data);
        }
        if !self.finish {
            return Ok(ReadStatus::Idle);
        }
        if self.next == mine {
            out((u64::MAX, HOUR + 5_000));
            self.next += 1;
            return Ok(ReadStatus::Data);
        }
        Ok(ReadStatus::End)
    }
    fn offset(&self) -> Offset {
        self.next
    }
    fn watermark_hint(&self) -> Option<Timestamp> {
        let mine = (self.keys - self.partition).div_ceil(PARTITIONS as u64);
        (!self.finish && self.next >= mine)
            .then(|| (mine / KEYS_PER_MS + self.opened.elapsed().as_millis() as u64 * 10).min(HOUR - 1))
    }
}

/// The child process: counts per key in a one-hour window, checkpointing
/// every second into `dir`, recovering from it; prints output rows.
fn state_job(keys: u64, dir: &Path, finish: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,highwater::checkpoint=debug")
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
    let mut config = CheckpointConfig::new(dir.display().to_string());
    config.recover = true;
    let checkpoints = Checkpoints::open(config, 2).expect("opening the checkpoints");
    let ck = checkpoints.clone();
    let mut timely_config = timely::Config::process(2);
    checkpoints.configure(&mut timely_config);
    timely::execute(timely_config, move |worker| {
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let options = SourceOptions {
                idle_timeout: None,
                watermark: WatermarkStrategy::bounded(4_000),
                ..Default::default()
            };
            let source = Arc::new(Keys { keys, finish });
            let events = read(scope, source, |e: &(u64, u64)| e.1, options, &SourceMetrics::default(), None)
                .expect("reading")
                .events;
            let counts = events.window(Tumbling::of(HOUR)).key_by(|e: &(u64, u64)| e.0).aggregate(Count);
            let lines = counts.results.map(|r| format!("{},{}", r.key, r.value));
            write_lines(&lines, None, LineTarget::Stdout, SinkMode::Append);
        });
        ck.built(worker).expect("checkpointable");
    })
    .expect("starting the workers");
    checkpoints.finish().expect("checkpoints");
}

/// Size in bytes of the files under `dir`.
fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| if e.path().is_dir() { du(&e.path()) } else { e.metadata().map_or(0, |m| m.len()) })
                .sum()
        })
        .unwrap_or(0)
}

fn state(keys: &[u64]) {
    println!("### Large state: counts of N keys in a one-hour window, 2 workers\n");
    println!("| keys | checkpoint size | entries | write time | worker pause | restart to first output | rows |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let me = std::env::current_exe().expect("this harness");
    for &n in keys {
        let dir = scratch(&format!("state-{n}"));
        // Run until a checkpoint holds every key, then kill.
        let mut child = Command::new(&me)
            .args(["--state-job", &n.to_string()])
            .arg(&dir)
            .arg("hold")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the state job");
        let stderr = child.stderr.take().expect("piped");
        let log = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
        let started = Instant::now();
        let manifest = loop {
            std::thread::sleep(Duration::from_millis(200));
            assert!(started.elapsed() < Duration::from_secs(600), "no checkpoint with {n} keys");
            let Ok(store) = LocalStore::open(dir.clone()) else { continue };
            if let Ok(Some((m, _))) = latest_usable(&store) {
                if m.shards.iter().map(|s| s.entries).sum::<u64>() == n {
                    break m;
                }
            }
        };
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        let log = log.join().expect("log reader");
        let committed = log
            .iter()
            .filter(|l| l.contains("checkpoint committed") && l.contains(&format!("id={}", manifest.id)))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("write=")).map(str::to_owned))
            .unwrap_or_else(|| "?".into());
        let pause = log
            .iter()
            .filter(|l| l.contains("snapshot taken"))
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("pause=")).map(str::to_owned))
            .max_by(|a, b| parse_duration_ms(a).total_cmp(&parse_duration_ms(b)))
            .unwrap_or_else(|| "?".into());
        let size = du(&dir.join(format!("chk-{:010}", manifest.id)));
        // Restart: the window closes; time to the first row.
        let restarted = Instant::now();
        let mut child = Command::new(&me)
            .args(["--state-job", &n.to_string()])
            .arg(&dir)
            .arg("finish")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("restarting the state job");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        lines.next().expect("a first row").expect("readable");
        let first = restarted.elapsed();
        let rows = 1 + lines.count();
        assert!(child.wait().expect("finished").success());
        println!(
            "| {n} | {:.1} MiB | {} | {committed} | {pause} | {:.2} s | {rows} |",
            size as f64 / (1 << 20) as f64,
            manifest.shards.iter().map(|s| s.entries).sum::<u64>(),
            first.as_secs_f64()
        );
        assert_eq!(rows as u64, n + 1, "one count per key, and the closing event's");
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!();
}

/// Milliseconds of a `Duration`'s debug form (`12.3ms`, `1.2s`, `800µs`).
fn parse_duration_ms(d: &str) -> f64 {
    let d = d.trim_end_matches(|c: char| c.is_whitespace());
    if let Some(v) = d.strip_suffix("ms") {
        v.parse().unwrap_or(0.0)
    } else if let Some(v) = d.strip_suffix("µs") {
        v.parse::<f64>().unwrap_or(0.0) / 1000.0
    } else if let Some(v) = d.strip_suffix("ns") {
        v.parse::<f64>().unwrap_or(0.0) / 1e6
    } else if let Some(v) = d.strip_suffix('s') {
        v.parse::<f64>().unwrap_or(0.0) * 1000.0
    } else {
        0.0
    }
}
