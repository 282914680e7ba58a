//! The `highwater` command line.
//!
//! ```text
//! highwater nexmark --query q5 --events 10000000 -- -w 2
//! highwater nexmark --query q7 --input events.jsonl --output q7.csv
//! highwater demo --events 20000000
//! highwater generate --events 5000000 --output events.jsonl
//! highwater checkpoints list /tmp/q5-checkpoints
//! highwater cep --pattern rules.cep --input events.jsonl --key user --timeouts -- -w 2
//! ```
//!
//! Timely's own arguments (`-w` threads, `-n` processes, `-p` process index,
//! `-h` host file) follow `--`.

mod cep;
mod checkpoints;
mod demo;
mod generate;
mod nexmark;
mod progress;
mod state;

use clap::{Parser, Subcommand};

/// Event-stream processing on timely dataflow: Nexmark, CEP, the demo, tools.
#[derive(Debug, Parser)]
#[command(name = "highwater", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `highwater=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a Nexmark query on a file or the built-in generator; CSV out.
    Nexmark(Box<nexmark::NexmarkArgs>),
    /// Runs the demo job (generator → windows → join) with live output.
    Demo(demo::DemoArgs),
    /// Writes Nexmark events as JSON Lines.
    Generate(generate::GenerateArgs),
    /// Matches a CEP pattern (PATTERN … DEFINE …) against JSON Lines events; matches out as JSON Lines.
    Cep(cep::CepArgs),
    /// What a checkpoint directory holds: list, inspect, verify.
    Checkpoints(checkpoints::CheckpointsArgs),
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let result = match cli.command {
        Command::Nexmark(args) => nexmark::run(*args),
        Command::Demo(args) => demo::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Cep(args) => cep::run(args),
        Command::Checkpoints(args) => checkpoints::run(args),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            if let Some(hint) = hint(&e) {
                eprintln!("hint: {hint}");
            }
            1
        }
    }
}

/// What to do about an error, in the command's terms: the library's errors
/// name its API (`CheckpointConfig::recovering`), the command's user needs
/// its flags.
fn hint(error: &anyhow::Error) -> Option<&'static str> {
    use crate::checkpoint::CheckpointError;
    let checkpoint = error.chain().find_map(|e| {
        e.downcast_ref::<CheckpointError>().or_else(|| {
            e.downcast_ref::<crate::JobError>().and_then(|j| match j {
                crate::JobError::Checkpoint(c) => Some(c),
                _ => None,
            })
        })
    });
    match checkpoint {
        Some(CheckpointError::NotEmpty { .. }) => {
            Some("pass --recover to resume from those checkpoints, or give an empty --checkpoint-dir")
        }
        Some(CheckpointError::Fingerprint { .. }) => {
            Some("this --checkpoint-dir belongs to another job: give this one an empty directory of its own")
        }
        _ if format!("{error:#}").contains("start afresh (not recovering)") => {
            Some("run without --recover, with an empty --checkpoint-dir, or add a migration to the operator")
        }
        _ => None,
    }
}

/// Joins the workers, turning their errors and panics into one error.
fn join_workers<T: Send + 'static>(
    guards: timely::communication::WorkerGuards<anyhow::Result<T>>,
) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::new();
    for result in guards.join() {
        match result {
            Ok(Ok(value)) => out.push(value),
            Ok(Err(e)) => return Err(e),
            Err(panic) => anyhow::bail!("a worker failed: {panic}"),
        }
    }
    Ok(out)
}
