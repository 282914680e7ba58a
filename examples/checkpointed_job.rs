//! A checkpointed job in one call ([`highwater::Job`]), on any number of
//! workers and processes: payments summed per user in 1 s windows, written
//! exactly once into part files that commit with each checkpoint.
//!
//! ```sh
//! cargo run --release --example checkpointed_job -- /tmp/payments -w 2
//! # the same job on two processes of two workers:
//! printf 'localhost:2101\nlocalhost:2102\n' > hosts
//! cargo run --release --example checkpointed_job -- /tmp/payments -w 2 -n 2 -p 0 -h hosts &
//! cargo run --release --example checkpointed_job -- /tmp/payments -w 2 -n 2 -p 1 -h hosts
//! ```
//!
//! The first argument is the job's directory (checkpoints in `checkpoints/`,
//! output in `out/`); the rest are timely's `-w -n -p -h`. Run it again with
//! the same directory after killing it: it resumes from its latest
//! checkpoint (`recovering`), and the committed output is that of a run that
//! never stopped. Process 0 checks the committed rows against sums computed
//! directly from the payments, and prints how many there are.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use highwater::checkpoint::CheckpointConfig;
use highwater::prelude::*;
use highwater::sink::{write_parts, PartFormat};
use highwater::Job;

/// A payment: who paid how much, when (ms).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Payment {
    /// The payer.
    pub user: u32,
    /// The amount, in cents.
    pub cents: i64,
    /// Event time (ms).
    pub time: u64,
}

/// The job's input: 4 partitions of payments, each a little out of order.
pub fn payments() -> Vec<Vec<Payment>> {
    (0..4u64)
        .map(|p| {
            (0..5_000u64)
                .map(|i| {
                    let time = i * 3 + p + if i % 7 == 0 { 0 } else { 40 };
                    Payment { user: ((i * 13 + p) % 10) as u32, cents: (i % 50) as i64 + 1, time }
                })
                .collect()
        })
        .collect()
}

/// The rows the job commits, computed directly: `window_start,user,sum`,
/// sorted as text.
pub fn expected() -> Vec<String> {
    let mut sums: BTreeMap<(u64, u32), i64> = BTreeMap::new();
    for p in payments().into_iter().flatten() {
        *sums.entry((p.time / 1_000 * 1_000, p.user)).or_insert(0) += p.cents;
    }
    let mut rows: Vec<String> = sums.into_iter().map(|((start, user), sum)| format!("{start},{user},{sum}")).collect();
    rows.sort();
    rows
}

/// The rows committed in `dir/out`, sorted (header rows left out).
pub fn committed(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut rows = Vec::new();
    for part in std::fs::read_dir(dir.join("out"))?.flatten().filter(|e| e.path().is_file()) {
        let text = std::fs::read_to_string(part.path())?;
        rows.extend(text.lines().skip(1).map(str::to_owned));
    }
    rows.sort();
    Ok(rows)
}

/// Runs the job in `dir` on the layout `timely_args` describe; returns
/// whether this run (or an earlier one) wrote the final checkpoint.
pub fn run(dir: &Path, timely_args: &[String]) -> anyhow::Result<bool> {
    let checkpoints =
        CheckpointConfig::new(dir.join("checkpoints")).every(std::time::Duration::from_millis(100)).recovering();
    let out = dir.join("out");
    let report = Job::from_args(timely_args)?.checkpointed(checkpoints).run(move |worker| {
        worker.dataflow(|scope| -> anyhow::Result<()> {
            // Slow enough (64 payments per read) that checkpoints are taken during the run.
            let options = SourceOptions { batch_size: 64, ..Default::default() };
            let source = Arc::new(MemorySource::new(payments()));
            let paid = read(scope, source, |p: &Payment| p.time, options, &SourceMetrics::default(), None)?;
            let sums = paid
                .events
                .window(Tumbling::of(1.secs()))
                .key_by(|p: &Payment| p.user)
                .aggregate(Sum::of(|p: &Payment| p.cents));
            let lines = sums.results.map(|r| format!("{},{},{}", r.window.start, r.key, r.value));
            write_parts(&lines, "sums", out.clone(), Some("window_start,user,sum".into()), PartFormat::Rows)?;
            Ok(())
        })
    })?;
    Ok(report.final_checkpoint)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, timely_args) = args.split_first().context("usage: checkpointed_job DIR [-w N] [-n N -p I -h HOSTS]")?;
    let dir = Path::new(dir);
    let finished = run(dir, timely_args)?;
    anyhow::ensure!(finished, "the job ended without its final checkpoint");
    let config = highwater::cluster::config_from_args(timely_args)?;
    let process_zero =
        !matches!(config.communication, timely::CommunicationConfig::Cluster { process, .. } if process > 0);
    if process_zero {
        let rows = committed(dir)?;
        anyhow::ensure!(rows == expected(), "the committed rows differ from the sums of the payments");
        println!("ok: {} committed rows, each the sum of its window's payments", rows.len());
    }
    Ok(())
}
