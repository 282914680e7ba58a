//! `highwater checkpoints list|inspect|verify LOCATION`: what a checkpoint
//! directory (or `s3://` prefix) holds.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::checkpoint::{check, open_store, CheckpointStore, Manifest};
use crate::operators::END_OF_TIME;

/// Arguments of `highwater checkpoints`.
#[derive(Debug, Args)]
pub(super) struct CheckpointsArgs {
    #[command(subcommand)]
    command: CheckpointsCommand,
}

#[derive(Debug, Subcommand)]
enum CheckpointsCommand {
    /// One line per checkpoint: id, status, time, workers, state size.
    List {
        /// The checkpoint directory or `s3://bucket/prefix`.
        location: String,
    },
    /// A checkpoint's manifest in full: offsets, shards, sink parts.
    Inspect {
        /// The checkpoint directory or `s3://bucket/prefix`.
        location: String,
        /// The checkpoint (default: the newest complete one).
        #[arg(long)]
        id: Option<u64>,
    },
    /// Checks every checkpoint's manifest and shard files (sizes, CRC-32s);
    /// fails if none is usable.
    Verify {
        /// The checkpoint directory or `s3://bucket/prefix`.
        location: String,
    },
}

fn time(t: u64) -> String {
    if t == END_OF_TIME {
        "end (final)".to_owned()
    } else {
        t.to_string()
    }
}

fn status(store: &dyn CheckpointStore, id: u64) -> (Option<Manifest>, String) {
    match check(store, id) {
        Ok(m) => (Some(m), "complete".to_owned()),
        Err(e) => {
            let missing = matches!(store.get_manifest(id), Ok(None));
            (None, if missing { "incomplete (no manifest)".to_owned() } else { format!("corrupt: {e}") })
        }
    }
}

pub(super) fn run(args: CheckpointsArgs) -> anyhow::Result<()> {
    match args.command {
        CheckpointsCommand::List { location } => {
            let store = open_store(&location).with_context(|| format!("opening {location}"))?;
            println!(
                "{:>10}  {:<12} {:>20}  {:>7}  {:>12}  {:>9}  status",
                "id", "kind", "time", "workers", "state_bytes", "sink_rows"
            );
            for id in store.list()? {
                match status(&*store, id) {
                    (Some(m), s) => println!(
                        "{:>10}  {:<12} {:>20}  {:>7}  {:>12}  {:>9}  {s}",
                        m.id,
                        if m.is_final() { "final" } else { "periodic" },
                        time(m.time),
                        m.workers,
                        m.state_bytes(),
                        m.sinks.iter().map(|p| p.rows).sum::<u64>()
                    ),
                    (None, s) => {
                        println!("{id:>10}  {:<12} {:>20}  {:>7}  {:>12}  {:>9}  {s}", "-", "-", "-", "-", "-")
                    }
                }
            }
            Ok(())
        }
        CheckpointsCommand::Inspect { location, id } => {
            let store = open_store(&location).with_context(|| format!("opening {location}"))?;
            let id = match id {
                Some(id) => id,
                None => match crate::checkpoint::latest_usable(&*store)? {
                    Some((m, _)) => m.id,
                    None => bail!("{location} holds no checkpoint"),
                },
            };
            let (manifest, state) = status(&*store, id);
            println!("checkpoint {id}: {state}");
            let Some(m) = manifest else { return Ok(()) };
            println!("time: {}", time(m.time));
            println!("format: v{}  fingerprint: {}  workers: {}", m.format_version, m.fingerprint, m.workers);
            println!("committed at: {} ms since the epoch", m.created_unix_ms);
            for (source, partitions) in &m.sources {
                println!("source {source}:");
                for p in partitions {
                    println!(
                        "  partition {:>3}: offset {:<14} max event time {:<15} floor {:<15} {}",
                        p.partition,
                        p.offset.map_or("start".to_owned(), |o| o.to_string()),
                        p.max_seen.map_or("-".to_owned(), |t| t.to_string()),
                        p.floor,
                        if p.done { "done" } else { "" }
                    );
                }
            }
            for shard in &m.shards {
                let bytes = shard.files.iter().fold(0u64, |sum, f| sum.saturating_add(f.size));
                println!("shard of worker {}: {} entries, {} bytes", shard.worker, shard.entries, bytes);
                for f in &shard.files {
                    println!("  {:<24} {:>12} bytes  crc32 {:08x}", f.name, f.size, f.crc32);
                }
            }
            for part in &m.sinks {
                println!(
                    "sink {} ({}): {} rows -> {}",
                    part.sink,
                    part.kind,
                    part.rows,
                    if part.pending.is_empty() {
                        "(no part)".to_owned()
                    } else {
                        format!("{} in {}", part.committed, part.target)
                    }
                );
            }
            Ok(())
        }
        CheckpointsCommand::Verify { location } => {
            let store = open_store(&location).with_context(|| format!("opening {location}"))?;
            let ids = store.list()?;
            let mut usable = None;
            for &id in &ids {
                let (m, s) = status(&*store, id);
                println!("checkpoint {id}: {s}");
                if m.is_some() {
                    usable = Some(id);
                }
            }
            match usable {
                Some(id) => {
                    println!("recovery would use checkpoint {id}");
                    Ok(())
                }
                None if ids.is_empty() => bail!("{location} holds no checkpoint"),
                None => bail!("no usable checkpoint in {location}"),
            }
        }
    }
}
