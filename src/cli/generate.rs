//! `highwater generate`: Nexmark events as JSON Lines, to a file or a Kafka
//! topic.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::kafka::{create_topic, KafkaConfig, Producer};
use crate::nexmark::{write_event, Generator, GeneratorConfig, GeneratorSource};
use crate::source::{PartitionReader, ReadStatus, Source};
use crate::time::Millis;

/// Arguments of `highwater generate`.
#[derive(Debug, Args)]
pub(super) struct GenerateArgs {
    /// Number of events.
    #[arg(long, short)]
    events: u64,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Events per second of event time.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Out-of-orderness bound of the file (e.g. 2s).
    #[arg(long, default_value = "0ms")]
    max_out_of_order: Millis,
    /// Output file (default stdout).
    #[arg(long, short, conflicts_with = "kafka")]
    output: Option<PathBuf>,
    /// Produce the events to Kafka (`HOST:PORT[,HOST:PORT...]`) instead,
    /// one JSON event per record, to --topic.
    #[arg(long, value_name = "BROKERS", requires = "topic")]
    kafka: Option<String>,
    /// --kafka: the topic, created with --partitions partitions if missing.
    #[arg(long, requires = "kafka")]
    topic: Option<String>,
    /// --kafka: the events go round-robin to the topic's first P partitions
    /// (each partition in event-time order when --max-out-of-order is 0).
    #[arg(long, default_value_t = 1, value_name = "P", requires = "kafka")]
    partitions: i32,
}

pub(super) fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let generator = Generator::new(GeneratorConfig {
        events: Some(args.events),
        seed: args.seed,
        rate: args.rate,
        max_out_of_order_ms: args.max_out_of_order.0,
        partitions: 1,
        ..Default::default()
    })?;
    let source = GeneratorSource::new(std::sync::Arc::new(generator), 1);
    let mut reader = source.open(0, None)?;
    if let (Some(brokers), Some(topic)) = (&args.kafka, &args.topic) {
        return produce(&mut reader, brokers, topic, args.partitions);
    }
    let out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    let mut failed = None;
    loop {
        let status = reader.read(
            8192,
            &mut |event| {
                if failed.is_none() {
                    failed = write_event(&mut out, &event).err();
                }
            },
            &mut Vec::new(),
        )?;
        if let Some(e) = failed {
            return Err(e).context("writing events");
        }
        if status == ReadStatus::End {
            break;
        }
    }
    out.flush().context("writing events")?;
    Ok(())
}

/// Produces the events of `reader` to `topic`, round-robin over its first
/// `partitions` partitions, and waits until the broker has them all.
fn produce(
    reader: &mut impl PartitionReader<Record = crate::nexmark::Event>,
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    if partitions < 1 {
        anyhow::bail!("--partitions must be at least 1");
    }
    let config = KafkaConfig::new(brokers);
    create_topic(&config, topic, partitions)?;
    let producer = Producer::new(&config)?;
    let (mut n, mut line, mut failed) = (0u64, Vec::new(), None);
    loop {
        let status = reader.read(
            8192,
            &mut |event| {
                if failed.is_some() {
                    return;
                }
                line.clear();
                write_event(&mut line, &event).expect("writing to memory");
                line.pop();
                let partition = (n % partitions as u64) as i32;
                n += 1;
                failed = producer.send(topic, Some(partition), None, &line).err();
            },
            &mut Vec::new(),
        )?;
        if let Some(e) = failed {
            return Err(e).context("producing events");
        }
        if status == ReadStatus::End {
            break;
        }
    }
    producer.flush(std::time::Duration::from_secs(60)).context("producing events")?;
    tracing::info!("produced {n} events to {topic} ({partitions} partitions)");
    Ok(())
}
