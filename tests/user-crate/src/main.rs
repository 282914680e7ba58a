//! A user's program on highwater with default features off: payments from a
//! JSON Lines file, summed per user in 10 s tumbling windows (with allowed
//! lateness), a CEP rule (two large payments by one user within 30 s), and
//! checkpoints to a directory with exactly-once output, all through
//! [`highwater::Job`].
//!
//! ```sh
//! cargo run --manifest-path tests/user-crate/Cargo.toml -- /tmp/payments -w 2
//! ```
//!
//! The first argument is a scratch directory (input, checkpoints, output);
//! the rest are timely's `-w -n -p -h`. The program checks its committed
//! output against sums and alerts computed directly from the payments and
//! exits non-zero if they differ.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use highwater::checkpoint::CheckpointConfig;
use highwater::operators::cep::{Pattern, PatternExt};
use highwater::prelude::*;
use highwater::sink::{write_parts, PartFormat};
use highwater::Job;

/// A payment, as a line of the input file.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Payment {
    user: u32,
    cents: i64,
    time: u64,
}

/// 20 000 payments over ~200 s, a few seconds out of order.
fn payments() -> Vec<Payment> {
    (0..20_000u64)
        .map(|i| {
            let jitter = (i * 7919) % 3_000;
            let time = (i * 10 + 3_000).saturating_sub(jitter);
            let cents = if i % 97 == 0 || i % 101 == 0 { 50_000 } else { (i % 500) as i64 + 1 };
            Payment { user: ((i * 31) % 17) as u32, cents, time }
        })
        .collect()
}

/// `window_start,user,sum` rows, computed directly.
fn expected_sums() -> BTreeSet<String> {
    let mut sums: BTreeMap<(u64, u32), i64> = BTreeMap::new();
    for p in payments() {
        *sums.entry((p.time / 10_000 * 10_000, p.user)).or_insert(0) += p.cents;
    }
    sums.into_iter().map(|((start, user), sum)| format!("sum,{start},{user},{sum}")).collect()
}

/// `alert,user,first_time,second_time` rows, computed directly: each large
/// payment with the user's next large payment, if that is within 30 s.
fn expected_alerts() -> BTreeSet<String> {
    let mut large: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for p in payments().into_iter().filter(|p| p.cents >= 10_000) {
        large.entry(p.user).or_default().push(p.time);
    }
    let mut rows = BTreeSet::new();
    for (user, mut times) in large {
        times.sort_unstable();
        for pair in times.windows(2) {
            if pair[1] - pair[0] <= 30_000 {
                rows.insert(format!("alert,{user},{},{}", pair[0], pair[1]));
            }
        }
    }
    rows
}

fn run(dir: &Path, timely_args: &[String]) -> anyhow::Result<()> {
    let input = dir.join("payments.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input)?);
    for p in payments() {
        serde_json::to_writer(&mut file, &p)?;
        writeln!(file)?;
    }
    file.flush()?;
    drop(file);
    let source = Arc::new(JsonLines::files(&[&input], JsonDecoder::<Payment>::new())?);
    let out = dir.join("out");
    let checkpoints = CheckpointConfig::new(dir.join("checkpoints").display().to_string()).recovering();
    Job::from_args(timely_args)?.checkpointed(checkpoints).run(move |worker| {
        let source = Arc::clone(&source);
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let options = SourceOptions { watermark: WatermarkStrategy::bounded(3.secs()), ..Default::default() };
            let paid = read(scope, source, |p: &Payment| p.time, options, &SourceMetrics::default(), None)?;
            let sums = paid
                .events
                .window(Tumbling::of(10.secs()))
                .allowed_lateness(5.secs())
                .key_by(|p: &Payment| p.user)
                .aggregate(Sum::of(|p: &Payment| p.cents));
            let large = Pattern::<Payment>::begin("first")
                .where_(|p| p.cents >= 10_000)
                .next("second")
                .where_(|p| p.cents >= 10_000)
                .within(30.secs());
            let only_large = paid.events.filter(|p| p.cents >= 10_000);
            let alerts = only_large.key_by(|p: &Payment| p.user).pattern(large)?;
            let sums = sums.results.map(|r| format!("sum,{},{},{}", r.window.start, r.key, r.value));
            let alerts = alerts.matches.map(|m| {
                let time = |step| m.steps.iter().find(|(name, _)| &**name == step).map_or(0, |(_, e)| e[0].time);
                format!("alert,{},{},{}", m.key, time("first"), time("second"))
            });
            write_parts(&sums.concat(&alerts), "results", out.clone(), None, PartFormat::Rows)?;
            Ok(())
        })
    })?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, timely_args) = args.split_first().context("usage: payments-alerts DIR [-w N]")?;
    let dir = Path::new(dir);
    std::fs::create_dir_all(dir)?;
    run(dir, timely_args)?;
    let mut sums = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    for part in std::fs::read_dir(dir.join("out"))?.flatten().filter(|e| e.path().is_file()) {
        for line in std::fs::read_to_string(part.path())?.lines() {
            let set = if line.starts_with("sum,") { &mut sums } else { &mut alerts };
            anyhow::ensure!(set.insert(line.to_owned()), "row committed twice: {line}");
        }
    }
    anyhow::ensure!(sums == expected_sums(), "window sums differ from the direct computation");
    anyhow::ensure!(alerts == expected_alerts(), "alerts differ: {alerts:?} against {:?}", expected_alerts());
    anyhow::ensure!(!alerts.is_empty(), "no alerts: the input should raise some");
    println!("ok: {} window sums and {} alerts, each as computed directly", sums.len(), alerts.len());
    Ok(())
}
