//! Card-testing fraud over Kafka, exactly once: payments from a Kafka topic
//! → a CEP rule per card (a small payment, then a large one from another
//! country within 10 minutes) → alerts to another Kafka topic, written in
//! Kafka transactions committed with the job's checkpoints.
//!
//! Against any Kafka broker with transactions, e.g. the test broker
//! (`pip install noida-db==0.2.3`, then
//! `"$(python3 -c 'import noida_db,os;print(os.path.dirname(noida_db.__file__))')/noida-db" start --data-dir /tmp/kafka --only kafka --kafka-port 9092`):
//!
//! ```text
//! cargo run --release --features kafka --example kafka_fraud -- 127.0.0.1:9092 /tmp/fraud-checkpoints
//! ```
//!
//! It creates the topics `payments` (2 partitions) and `fraud-alerts` if
//! they are missing, and fills an empty `payments` with the sample payments
//! of `examples/cep/fraud.jsonl` (keyed by card). It then reads `payments`
//! up to its current end (`StopAt::Latest`; drop that for a job that runs
//! for ever), and prints the alerts it committed. Run it again with
//! `--recover` after killing it: the alerts topic, read `read_committed`
//! (`isolation.level=read_committed`), holds each alert once.
//!
//! Each alert is a JSON object: the card, the two payments' amounts and
//! countries, and the time of the large one.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use highwater::checkpoint::CheckpointConfig;
use highwater::kafka::{create_topic, KafkaConfig, KafkaSink, KafkaSource, Producer, StopAt, TextEncoder};
use highwater::prelude::*;
use highwater::Job;
use serde_json::{json, Value};

/// The rule, in highwater's pattern language (as in `examples/cep/fraud.cep`).
const RULE: &str = "
PATTERN (small large) WITHIN 10m
AFTER MATCH SKIP PAST LAST ROW
DEFINE small AS amount < 10,
       large AS amount > 500 AND country != first(small).country
";

/// Sample payments, one JSON object per line.
const SAMPLE: &str = include_str!("cep/fraud.jsonl");

fn main() -> anyhow::Result<()> {
    let usage = "usage: kafka_fraud BROKERS CHECKPOINT_DIR [--recover] [-- TIMELY_ARGS]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let brokers = args.first().context(usage)?;
    let checkpoint_dir = args.get(1).context(usage)?;
    let recover = args.iter().any(|a| a == "--recover");
    let timely_args: Vec<String> = args.iter().skip_while(|a| *a != "--").skip(1).cloned().collect();
    let alerts = run(brokers, checkpoint_dir, recover, &timely_args)?;
    for alert in &alerts {
        println!("{alert}");
    }
    eprintln!("{} alerts committed to fraud-alerts", alerts.len());
    Ok(())
}

/// Runs the job against `brokers` with checkpoints in `checkpoint_dir`;
/// returns the alerts this run found, sorted.
pub fn run(brokers: &str, checkpoint_dir: &str, recover: bool, timely_args: &[String]) -> anyhow::Result<Vec<String>> {
    let config = KafkaConfig::new(brokers);
    create_topic(&config, "payments", 2)?;
    create_topic(&config, "fraud-alerts", 2)?;
    fill_if_empty(&config)?;

    let program = Arc::new(highwater::cep::compile(RULE)?);
    let mut checkpoints = CheckpointConfig::new(checkpoint_dir).every(Duration::from_millis(500));
    if recover {
        checkpoints = checkpoints.recovering();
    }
    let source =
        Arc::new(KafkaSource::new(config.clone(), ["payments"], JsonDecoder::<Value>::new()).stop_at(StopAt::Latest));
    let alerts = Collected::default();
    let into = alerts.clone();
    Job::from_args(timely_args)?.checkpointed(checkpoints).run(move |worker| {
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let payments = FromSource::new(Arc::clone(&source), |p: &Value| p["time"].as_u64().unwrap_or(0))
                .watermark(WatermarkStrategy::bounded(5.secs()))
                .build(scope)?;
            let found = payments
                .events
                .match_pattern(|p: &Value| p["card"].as_str().unwrap_or("").to_owned(), program.pattern())?;
            let alerts = found.matches.map(|m| {
                let (small, large) = (&m.events("small")[0], &m.events("large")[0]);
                json!({
                    "card": m.key,
                    "small": small["amount"], "small_country": small["country"],
                    "large": large["amount"], "large_country": large["country"],
                    "time": large["time"],
                })
                .to_string()
            });
            collect(&alerts, &into);
            KafkaSink::new(config.clone(), "fraud-alerts", TextEncoder)
                .key(|alert: &String| {
                    let card = serde_json::from_str::<Value>(alert).ok()?["card"].as_str()?.to_owned();
                    Some(card.into_bytes())
                })
                .exactly_once("kafka-fraud")
                .write(&alerts, "Alerts")?;
            Ok(())
        })
    })?;
    let mut rows: Vec<String> = alerts.rows();
    rows.sort();
    Ok(rows)
}

/// Produces the sample payments to `payments` if it holds nothing yet.
fn fill_if_empty(config: &KafkaConfig) -> anyhow::Result<()> {
    let empty =
        Arc::new(KafkaSource::new(config.clone(), ["payments"], JsonDecoder::<Value>::new()).stop_at(StopAt::Latest));
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = Arc::clone(&seen);
    Job::new(timely::Config::thread()).run(move |worker| {
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let read = FromSource::new(Arc::clone(&empty), |_: &Value| 0).build(scope)?;
            let counter = Arc::clone(&counter);
            read.events.inspect(move |_| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
            Ok(())
        })
    })?;
    if seen.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return Ok(());
    }
    let producer = Producer::new(config)?;
    for line in SAMPLE.lines().filter(|l| !l.trim().is_empty()) {
        let payment: Value = serde_json::from_str(line)?;
        let card = payment["card"].as_str().unwrap_or("").as_bytes().to_vec();
        producer.send("payments", None, Some(&card), line.as_bytes())?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}
