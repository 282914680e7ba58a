//! Where a job keeps its operators' keyed state and for how long:
//! `--state-backend`, `--state-dir`, `--state-cache`, `--state-write-buffer`,
//! `--state-ttl`, `--state-ttl-expiry`.

use std::path::PathBuf;

use highwater_operators::state::{parse_size, Backend, Expiry, RocksDbConfig, StateTtl};

use crate::time::Millis;

/// The state backend options of a job's command.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct StateArgs {
    /// Where operators keep their keyed state (tables, joins, top-k and
    /// last-value aggregations, session and count windows, CEP partial
    /// matches): `memory` (fastest), or `rocksdb` on local disk, for state
    /// larger than memory.
    #[arg(long, default_value = "memory", value_parser = ["memory", "rocksdb"])]
    state_backend: String,
    /// With `--state-backend rocksdb`: the directory of the working
    /// databases (one per operator and worker, removed at the end; default
    /// `highwater-state` in the temporary directory).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// With `--state-backend rocksdb`: the block cache shared by the
    /// process's databases (e.g. 256MiB, 1GiB).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_cache)]
    state_cache: usize,
    /// With `--state-backend rocksdb`: the write buffer (memtable) of each
    /// operator's database, at most three per database (e.g. 64MiB: fewer,
    /// larger flushes and less compaction, for more memory).
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = parse_cache)]
    state_write_buffer: usize,
    /// A time-to-live, in event time, for the state no watermark releases
    /// (the unwindowed joins of q3 and q20, the aggregations by key of
    /// q15-q19): a record is seen by the other side, a key by its next
    /// record, up to the event time plus the TTL, and forgotten once the
    /// watermark passes that (e.g. 10min). Without it such state is kept
    /// for ever.
    #[arg(long, value_name = "DURATION")]
    state_ttl: Option<Millis>,
    /// What expiry does: `silent` (results stand, as Flink's state TTL) or
    /// `retract` (the results an expired record took part in are retracted
    /// at its expiry time: the output becomes a changelog of live results).
    #[arg(long, default_value = "silent", value_parser = ["silent", "retract"], requires = "state_ttl")]
    state_ttl_expiry: String,
}

fn parse_cache(text: &str) -> Result<usize, String> {
    parse_size(text).map_err(|e| e.to_string())
}

impl StateArgs {
    /// The time-to-live these options give, if any.
    pub(super) fn ttl(&self) -> Option<StateTtl> {
        let expiry = if self.state_ttl_expiry == "retract" { Expiry::Retract } else { Expiry::Silent };
        self.state_ttl.map(|ttl| StateTtl::event_time(ttl.0).expiry(expiry))
    }

    /// The backend these options choose.
    pub(super) fn backend(&self) -> anyhow::Result<Backend> {
        match self.state_backend.as_str() {
            "rocksdb" => {
                let dir = self.state_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("highwater-state"));
                Ok(Backend::RocksDb(
                    RocksDbConfig::new(dir).cache(self.state_cache).write_buffer(self.state_write_buffer),
                ))
            }
            _ if self.state_dir.is_some() => anyhow::bail!("--state-dir is for --state-backend rocksdb"),
            _ => Ok(Backend::Memory),
        }
    }
}
