//! Kafka throughput against the test broker (`noida-db`, started here on a
//! free port), in one run, next to the raw rates of the same client library
//! (rdkafka 0.39, bundled librdkafka) against the same broker and topic:
//!
//! - raw produce: a plain `BaseProducer` (idempotent, `linger.ms` 5, as
//!   highwater's) sending the lines of a Nexmark JSON file round-robin to the
//!   topic's partitions, flushed;
//! - `highwater generate --kafka`: the generator producing the same events;
//! - raw consume: one `BaseConsumer` per partition on its own thread (the
//!   layout of highwater's source), `read_committed`, polling to the end
//!   offsets and touching every payload byte;
//! - `highwater nexmark -q q0 --kafka .. --to latest --discard` at 1 and 2
//!   workers (the source and q0's decode, nothing written);
//! - `highwater nexmark -q q0 --kafka .. --to latest --output-topic ..`
//!   at 2 workers: Kafka to Kafka, at least once without checkpoints, then
//!   with a checkpoint every second at least once and exactly once
//!   (`--exactly-once`: the cost of the transactions and of keeping each
//!   checkpoint's output in the store).
//!
//! Each measurement runs `--runs` times, interleaved; medians, and ratios
//! against the raw consume rate of the same run.
//!
//! ```text
//! cargo bench --bench kafka --features kafka -- --events 2000000 --partitions 4 --runs 3
//! ```
//!
//! Needs the broker (scripts/test.sh installs it).

mod common;
#[path = "../tests/common/kafka.rs"]
mod kafka;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{field, median};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

fn highwater(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_highwater")).args(args).output().expect("running highwater");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "highwater {args:?} failed: {stderr}");
    stderr.lines().rev().find(|l| l.starts_with("events=")).unwrap_or_default().to_owned()
}

/// Sends every line of `file` to `topic`, round-robin over its partitions;
/// events/s.
fn raw_produce(brokers: &str, topic: &str, partitions: i32, file: &std::path::Path) -> f64 {
    let lines: Vec<Vec<u8>> = BufReader::new(std::fs::File::open(file).expect("events file"))
        .split(b'\n')
        .map(|l| l.expect("reading events"))
        .filter(|l| !l.is_empty())
        .collect();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let start = Instant::now();
    for (i, line) in lines.iter().enumerate() {
        let record = BaseRecord::<(), [u8]>::to(topic).payload(line).partition(i as i32 % partitions);
        kafka::send_queued(&producer, record);
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    lines.len() as f64 / start.elapsed().as_secs_f64()
}

/// Reads every partition of `topic` to its end offset, a consumer and a
/// thread per partition; events/s.
fn raw_consume(brokers: &str, topic: &str, partitions: i32) -> f64 {
    let start = Instant::now();
    let threads: Vec<_> = (0..partitions)
        .map(|p| {
            let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
            std::thread::spawn(move || {
                let consumer: BaseConsumer = ClientConfig::new()
                    .set("bootstrap.servers", &brokers)
                    .set("group.id", "raw-bench")
                    .set("enable.auto.commit", "false")
                    .set("isolation.level", "read_committed")
                    .set("fetch.wait.max.ms", "10")
                    .set("receive.message.max.bytes", "2147483647")
                    .create()
                    .expect("consumer");
                let (_, high) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(10)).expect("watermarks");
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, p, Offset::Beginning).expect("partition");
                consumer.assign(&tpl).expect("assign");
                let (mut count, mut bytes) = (0u64, 0u64);
                loop {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => {
                            count += 1;
                            bytes += m.payload().map_or(0, |b| b.iter().map(|&x| x as u64).sum::<u64>() & 1);
                            if m.offset() + 1 >= high {
                                break;
                            }
                        }
                        Some(Err(e)) => panic!("consuming: {e}"),
                        None => {}
                    }
                }
                (count, bytes)
            })
        })
        .collect();
    let count: u64 = threads.into_iter().map(|t| t.join().expect("consumer thread").0).sum();
    count as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let (mut events, mut partitions, mut runs) = (2_000_000u64, 4i32, 3usize);
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--events" => events = value.parse().expect("--events N"),
            "--partitions" => partitions = value.parse().expect("--partitions P"),
            "--runs" => runs = value.parse().expect("--runs R"),
            other => panic!("unknown option {other}"),
        }
    }
    let broker = kafka::KafkaBroker::start();
    let brokers = broker.brokers();
    let dir = std::env::temp_dir().join(format!("highwater-kafka-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench folder");
    let file = dir.join("events.jsonl");
    let file_name = file.to_str().expect("utf-8 path");
    highwater(&["generate", "--events", &events.to_string(), "-o", file_name]);
    let (n, p) = (events.to_string(), partitions.to_string());

    let mut rows: Vec<(&str, Vec<f64>)> = [
        "raw produce (BaseProducer)",
        "highwater generate --kafka",
        "raw consume (BaseConsumer per partition)",
        "q0 from Kafka, -w 1",
        "q0 from Kafka, -w 2",
        "q0 Kafka to Kafka, -w 2, at least once",
        "q0 Kafka to Kafka, -w 2, at least once, checkpoint every 1 s",
        "q0 Kafka to Kafka, -w 2, exactly once, checkpoint every 1 s",
    ]
    .into_iter()
    .map(|name| (name, Vec::new()))
    .collect();
    for run in 0..runs {
        let raw_topic = format!("raw{run}");
        let topic = format!("ev{run}");
        // The raw producer writes to a topic created by `generate` with no events.
        highwater(&["generate", "--events", "0", "--kafka", &brokers, "--topic", &raw_topic, "--partitions", &p]);
        rows[0].1.push(raw_produce(&brokers, &raw_topic, partitions, &file));
        let start = Instant::now();
        highwater(&["generate", "--events", &n, "--kafka", &brokers, "--topic", &topic, "--partitions", &p]);
        rows[1].1.push(events as f64 / start.elapsed().as_secs_f64());
        rows[2].1.push(raw_consume(&brokers, &topic, partitions));
        // q0 from the topic, with `extra` options, on `workers` workers;
        // its events per second.
        let q0 = |extra: &[&str], workers: &str| {
            let mut args = vec!["nexmark", "-q", "q0", "--kafka", &brokers, "--topic", &topic, "--to", "latest"];
            args.extend_from_slice(extra);
            args.extend(["--", "-w", workers]);
            field(&highwater(&args), "events/s")
        };
        for (row, workers) in [(3, "1"), (4, "2")] {
            rows[row].1.push(q0(&["--discard"], workers));
        }
        rows[5].1.push(q0(&["--output-topic", &format!("out{run}")], "2"));
        for (row, exactly_once) in [(6, false), (7, true)] {
            let checkpoints = dir.join(format!("ck-{run}-{exactly_once}"));
            let output = format!("out{run}-{exactly_once}");
            let mut extra = vec!["--output-topic", &output, "--checkpoint-interval", "1s", "--checkpoint-dir"];
            extra.push(checkpoints.to_str().expect("utf-8 path"));
            if exactly_once {
                extra.push("--exactly-once");
            }
            rows[row].1.push(q0(&extra, "2"));
            let _ = std::fs::remove_dir_all(&checkpoints);
        }
        eprintln!("run {run} done");
    }
    let raw_consume = median(rows[2].1.clone());
    println!("| measurement | events/s (median of {runs}) | runs | ratio to raw consume |");
    println!("| --- | --- | --- | --- |");
    for (name, xs) in rows {
        let m = median(xs.clone());
        let all: Vec<String> = xs.iter().map(|x| format!("{:.0}", x / 1e3)).collect();
        println!("| {name} | {:.0} K | {} K | {:.2} |", m / 1e3, all.join(", "), m / raw_consume);
    }
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
