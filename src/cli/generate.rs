//! `highwater generate`: Nexmark events as JSON Lines.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

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
    #[arg(long, short)]
    output: Option<PathBuf>,
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
