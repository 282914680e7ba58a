//! Where a job keeps its operators' keyed state: `--state-backend`,
//! `--state-dir`, `--state-cache`.

use std::path::PathBuf;

use highwater_operators::state::{parse_size, Backend, RocksDbConfig};

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
}

fn parse_cache(text: &str) -> Result<usize, String> {
    parse_size(text).map_err(|e| e.to_string())
}

impl StateArgs {
    /// The backend these options choose.
    pub(super) fn backend(&self) -> anyhow::Result<Backend> {
        match self.state_backend.as_str() {
            "rocksdb" => {
                let dir = self.state_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("highwater-state"));
                Ok(Backend::RocksDb(RocksDbConfig::new(dir).cache(self.state_cache)))
            }
            _ if self.state_dir.is_some() => anyhow::bail!("--state-dir is for --state-backend rocksdb"),
            _ => Ok(Backend::Memory),
        }
    }
}
