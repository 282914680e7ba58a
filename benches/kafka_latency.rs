//! End-to-end latency of Kafka → highwater → Kafka at a fixed input rate,
//! against the test broker (`noida-db`, started here on a free port).
//!
//! A producer thread sends Nexmark events (from `highwater generate`) to a
//! topic of 4 partitions at `--rate` events per second for `--seconds`,
//! each event's `dateTime` rewritten to the wall clock when it is sent. The
//! job, `highwater nexmark -q q0 --kafka .. --output-topic ..` on 2 workers
//! (live: `--to never`, a watermark delay of 100 ms), writes the bids back; a `read_committed` consumer
//! of the output takes, for every row, the time it read the row minus the
//! row's `dateTime`: the latency from the producer's send to a reader's
//! poll, broker both ways included. Modes:
//!
//! - at least once, no checkpoints;
//! - at least once, a checkpoint every second;
//! - exactly once, a checkpoint every second (a row becomes visible when
//!   the transaction of the checkpoint that covers it commits).
//!
//! The first 2 s of each run (the job's start) and its last 2 s are left
//! out; p50, p99 and the maximum of the rest, how many rows came (all bids,
//! or the run says so), and when the last row was read after the input
//! ended (exactly once: the rows since the last checkpoint are committed
//! once the partitions go idle, after the idle timeout of 5 s).
//!
//! ```text
//! cargo bench --bench kafka_latency --features kafka -- --rate 20000 --seconds 20
//! ```
//!
//! `--only alo|alo-ckpt|eo` runs one mode; `--job-log DIR` keeps each job's
//! stderr in `DIR/<mode>.log` with highwater's debug events (checkpoint
//! phases and their durations).
//!
//! Needs the broker (scripts/test.sh installs it).

#[path = "../tests/common/kafka.rs"]
mod kafka;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");
const PARTITIONS: i32 = 4;
/// The start of a run left out of the percentiles.
const WARM_UP_MS: u64 = 2_000;
/// The last rows of a run, left out of the percentiles: once the input
/// stops, exactly once commits them after the idle timeout (the `tail`
/// column).
const COOL_DOWN_MS: u64 = 2_000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as u64
}

fn highwater(args: &[&str]) {
    let out = Command::new(BIN).args(args).output().expect("running highwater");
    assert!(out.status.success(), "highwater {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `line` with every `"dateTime":N` set to `ms`.
fn stamped(line: &str, ms: u64) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("\"dateTime\":") {
        let (head, tail) = rest.split_at(at + "\"dateTime\":".len());
        out.push_str(head);
        out.push_str(&ms.to_string());
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// Sends `lines` to `topic` at `rate` per second, round-robin over its
/// partitions, for as long as the lines last; returns how many bids went.
fn produce_at_rate(brokers: &str, topic: &str, lines: &[String], rate: u64) -> u64 {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    let start = Instant::now();
    let mut bids = 0;
    for (i, line) in lines.iter().enumerate() {
        // The i-th event is due at i / rate seconds.
        let due = Duration::from_micros(i as u64 * 1_000_000 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            producer.poll(wait);
        }
        let event = stamped(line, now_ms());
        bids += u64::from(event.contains("\"bid\":"));
        let record = BaseRecord::<(), str>::to(topic).payload(&event).partition(i as i32 % PARTITIONS);
        kafka::send_queued(&producer, record);
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    bids
}

/// Reads `topic` (`read_committed`) until `stop`; every row's latency (ms)
/// with its `dateTime`.
fn consume_latencies(brokers: &str, topic: &str, stop: Arc<AtomicBool>, out: Arc<Mutex<Vec<(u64, u64)>>>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "latency-bench")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "5")
        .set("receive.message.max.bytes", "2147483647")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                let read = now_ms();
                // q0's row: auction,bidder,price,channel,url,dateTime,extra.
                let time = m
                    .payload()
                    .and_then(|p| std::str::from_utf8(p).ok())
                    .and_then(|row| row.split(',').nth(5)?.parse::<u64>().ok());
                if let Some(time) = time {
                    out.lock().expect("latencies").push((time, read.saturating_sub(time)));
                }
            }
            Some(Err(e)) => eprintln!("consuming: {e}"),
            None => {}
        }
    }
}

/// The p-th percentile (0..=100) of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p / 100.0).round() as usize]
}

fn main() {
    let (mut rate, mut seconds) = (20_000u64, 20u64);
    // `--only eo|alo|alo-ckpt` runs one mode; `--job-log DIR` keeps each
    // job's stderr there, with the checkpoints' debug events (for profiling).
    let (mut only, mut job_log) = (None::<String>, None::<std::path::PathBuf>);
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--rate" => rate = value.parse().expect("--rate EVENTS_PER_SECOND"),
            "--seconds" => seconds = value.parse().expect("--seconds S"),
            "--only" => only = Some(value),
            "--job-log" => job_log = Some(value.into()),
            other => panic!("unknown option {other}"),
        }
    }
    let broker = kafka::KafkaBroker::start();
    let brokers = broker.brokers();
    let dir = std::env::temp_dir().join(format!("highwater-kafka-latency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench folder");
    let file = dir.join("events.jsonl");
    let events = rate * seconds;
    highwater(&["generate", "--events", &events.to_string(), "-o", file.to_str().expect("utf-8 path")]);
    let lines: Vec<String> = std::fs::read_to_string(&file)
        .expect("events file")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();

    println!(
        "| mode ({rate} events/s for {seconds} s, q0, -w 2) | rows read | p50 ms | p99 ms | max ms | last row after the input ended, ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (name, short, checkpoints, exactly_once) in [
        ("at least once, no checkpoints", "alo", false, false),
        ("at least once, checkpoint every 1 s", "alo-ckpt", true, false),
        ("exactly once, checkpoint every 1 s", "eo", true, true),
    ] {
        if only.as_deref().is_some_and(|o| o != short) {
            continue;
        }
        let tag = format!("{}-{}", u8::from(checkpoints), u8::from(exactly_once));
        let (input, output) = (format!("in-{tag}"), format!("out-{tag}"));
        for topic in [&input, &output] {
            highwater(&["generate", "--events", "0", "--kafka", &brokers, "--topic", topic, "--partitions", "4"]);
        }
        let ck = dir.join(format!("ck-{tag}"));
        let mut job = Command::new(BIN);
        let stderr = match job_log.as_ref() {
            Some(dir) => {
                job.args(["--log", "highwater=debug"]);
                Stdio::from(std::fs::File::create(dir.join(format!("{short}.log"))).expect("job log"))
            }
            None => Stdio::null(),
        };
        job.args(["nexmark", "-q", "q0", "--kafka", &brokers, "--topic", &input, "--output-topic", &output]);
        // Each partition is in event-time order.
        job.args(["--watermark-delay", "100ms"]);
        if checkpoints {
            job.args(["--checkpoint-interval", "1s", "--checkpoint-dir"]).arg(&ck);
        }
        if exactly_once {
            job.arg("--exactly-once");
        }
        let mut job = job.args(["--", "-w", "2"]).stdout(Stdio::null()).stderr(stderr).spawn().expect("job");
        let stop = Arc::new(AtomicBool::new(false));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (brokers, output, stop, latencies) =
                (brokers.clone(), output.clone(), Arc::clone(&stop), Arc::clone(&latencies));
            std::thread::spawn(move || consume_latencies(&brokers, &output, stop, latencies))
        };
        // The job's start (its sources find their partitions).
        std::thread::sleep(Duration::from_secs(2));
        let started = now_ms();
        let bids = produce_at_rate(&brokers, &input, &lines, rate);
        let ended = now_ms();
        // Until every bid came, or 30 s after the last one was sent.
        let deadline = Instant::now() + Duration::from_secs(30);
        while (latencies.lock().expect("latencies").len() as u64) < bids && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::SeqCst);
        reader.join().expect("reader");
        let _ = job.kill();
        let _ = job.wait();
        let rows = latencies.lock().expect("latencies").clone();
        let steady = started + WARM_UP_MS..ended.saturating_sub(COOL_DOWN_MS);
        let mut kept: Vec<u64> = rows.iter().filter(|(t, _)| steady.contains(t)).map(|(_, l)| *l).collect();
        kept.sort_unstable();
        let last = rows
            .iter()
            .map(|(t, l)| t + l)
            .max()
            .map_or("-".to_owned(), |read| format!("{}", read.saturating_sub(ended)));
        if kept.is_empty() {
            println!("| {name} | {} of {bids} | - | - | - | {last} |", rows.len());
            continue;
        }
        println!(
            "| {name} | {} of {bids} | {} | {} | {} | {last} |",
            rows.len(),
            percentile(&kept, 50.0),
            percentile(&kept, 99.0),
            kept[kept.len() - 1]
        );
        let _ = std::fs::remove_dir_all(&ck);
    }
}
