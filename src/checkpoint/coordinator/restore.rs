//! Choosing the checkpoint to recover from, checking it, and loading its state.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::operators::checkpoint::{CheckpointId, Restored, Schema};

use super::super::manifest::Manifest;
use super::super::store::CheckpointStore;
use super::super::{shard, CheckpointConfig, CheckpointError};

/// Chunks of state entries by operator.
pub(super) type EntriesByOperator = HashMap<String, Vec<Arc<Vec<u8>>>>;

/// What a recovery restores.
#[derive(Debug)]
pub(super) struct RestoredState {
    pub(super) manifest: Manifest,
    /// Chunks of entries by operator, read in place by every worker's instance.
    entries: EntriesByOperator,
    /// The database checkpoints by operator (one directory per worker of
    /// the run that took them), fetched from the store.
    databases: HashMap<String, Vec<PathBuf>>,
    /// Where they were fetched to; removed once every worker has restored
    /// ([`release_databases`](Self::release_databases)), or when this goes.
    fetched: Mutex<Option<FetchedDir>>,
}

/// A local directory of fetched database files, removed when dropped.
#[derive(Debug)]
struct FetchedDir(PathBuf);

impl Drop for FetchedDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.0.display(), "cannot remove restored database files: {e}");
            }
        }
    }
}

impl RestoredState {
    /// Loads the state of the checkpoint of `manifest` from `store`.
    pub(super) fn load(store: &dyn CheckpointStore, manifest: Manifest) -> Result<Self, CheckpointError> {
        let loading = Instant::now();
        let entries = load_entries(store, &manifest)?;
        let count: u64 = entries.values().flatten().map(|c| shard::chunk_entries(c)).sum();
        let (databases, fetched) = fetch_databases(store, &manifest)?;
        tracing::info!(
            entries = count,
            databases = databases.values().map(Vec::len).sum::<usize>(),
            elapsed = ?loading.elapsed(),
            "checkpoint state loaded"
        );
        Ok(RestoredState { manifest, entries, databases, fetched: Mutex::new(fetched) })
    }

    /// The database checkpoints restored for `operator` (see
    /// [`StateStore::restored_databases`](crate::operators::checkpoint::StateStore::restored_databases)).
    pub(super) fn databases_of(&self, operator: &str) -> Vec<PathBuf> {
        self.databases.get(operator).cloned().unwrap_or_default()
    }

    /// Removes the fetched database files: every worker has restored its
    /// operators from them.
    pub(super) fn release_databases(&self) {
        drop(self.fetched.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// Why `operator`, registered with `schema` (migrating from the
    /// versions `migrates_from`), cannot restore its state from this
    /// checkpoint, if it cannot: the checkpoint holds it in another schema.
    pub(super) fn refuses(&self, operator: &str, schema: &Schema, migrates_from: &[u32]) -> Option<String> {
        let found = self.manifest.schemas.get(operator)?;
        if found == schema || (found.name == schema.name && migrates_from.contains(&found.version)) {
            return None;
        }
        Some(format!(
            "operator {operator}: checkpoint {} holds its state as {found}, this program's is {schema}, with \
             no migration from v{}; start afresh (not recovering) in an empty checkpoint directory, or add a \
             migration (OperatorState::MIGRATES_FROM, KeyedProcess::MIGRATES_FROM)",
            self.manifest.id, found.version
        ))
    }

    /// What `operator` on `worker` (of `peers` in the job) restores.
    pub(super) fn of(&self, operator: &str, worker: usize, peers: usize) -> Restored {
        let chunks = self.entries.get(operator).cloned().unwrap_or_default();
        let schema = self.manifest.schemas.get(operator).cloned();
        Restored::new(chunks, worker, peers).with_schema(schema).with_encoding(self.manifest.state_encoding())
    }
}

/// The newest checkpoint of `store` that checks out, with the reasons the
/// newer ones do not. `Ok(None)` if the store holds no complete checkpoint
/// (one without a manifest was never completed, so does not count); an error
/// if it holds complete ones but every one of them is damaged.
pub fn latest_usable(store: &dyn CheckpointStore) -> Result<Option<(Manifest, Vec<String>)>, CheckpointError> {
    let ids = store.list()?;
    let mut rejected = Vec::new();
    let checking = Instant::now();
    for &id in ids.iter().rev() {
        if store.get_manifest(id)?.is_none() {
            // Never completed: it does not exist (and is not damage).
            continue;
        }
        match check(store, id) {
            // Not damage: a store that cannot be read now must not make the
            // job fall back to an older checkpoint.
            Err(
                e @ (CheckpointError::Io { .. } | CheckpointError::Config(_) | CheckpointError::ObjectStore { .. }),
            ) => return Err(e),
            Ok(manifest) => {
                tracing::debug!(id, elapsed = ?checking.elapsed(), "checkpoint verified");
                return Ok(Some((manifest, rejected)));
            }
            Err(e) => rejected.push(format!("checkpoint {id}: {e}")),
        }
    }
    if rejected.is_empty() {
        Ok(None)
    } else {
        Err(CheckpointError::NoUsable { location: store.describe(), reasons: rejected.join("; ") })
    }
}

/// Checks checkpoint `id` of `store`: its manifest and every shard file.
pub fn check(store: &dyn CheckpointStore, id: CheckpointId) -> Result<Manifest, CheckpointError> {
    let what = format!("{}/{}/MANIFEST", store.describe(), super::super::store::checkpoint_name(id));
    let bytes = store.get_manifest(id)?.ok_or_else(|| CheckpointError::Corrupt {
        what: what.clone(),
        reason: "missing (the checkpoint was not completed)".into(),
    })?;
    let manifest = Manifest::from_bytes(&bytes, &what)?;
    if manifest.id != id {
        return Err(CheckpointError::Corrupt { what, reason: format!("names checkpoint {}", manifest.id) });
    }
    for shard in &manifest.shards {
        store.get_shard(id, shard.worker, &shard.files)?;
    }
    check_shared(store, &manifest)?;
    Ok(manifest)
}

/// Checks that the shared files `manifest` references are in the store and
/// that its database checkpoints list only those (their sizes and checksums
/// are checked as they are fetched).
fn check_shared(store: &dyn CheckpointStore, manifest: &Manifest) -> Result<(), CheckpointError> {
    let listed: HashSet<&str> = manifest.shared.iter().map(|f| f.name.as_str()).collect();
    let corrupt = |reason: String| CheckpointError::Corrupt {
        what: format!("{}/{}", store.describe(), super::super::store::checkpoint_name(manifest.id)),
        reason,
    };
    for database in manifest.shards.iter().flat_map(|s| &s.databases) {
        if let Some(file) = database.files.values().find(|f| !listed.contains(f.name.as_str())) {
            return Err(corrupt(format!(
                "the database of {} lists {}, not a shared file",
                database.operator, file.name
            )));
        }
    }
    if manifest.shared.is_empty() {
        return Ok(());
    }
    let present: HashSet<String> = store.list_shared()?.into_iter().collect();
    if let Some(missing) = manifest.shared.iter().find(|f| !present.contains(&f.name)) {
        return Err(corrupt(format!("the shared file {} is missing", missing.name)));
    }
    Ok(())
}

/// Removes the directories of fetched database files (`.highwater-restore-<pid>-…`
/// or `highwater-restore-<pid>-…`) in `dir` whose process is gone: killed
/// before every worker had restored (Linux; elsewhere nothing is removed).
fn sweep_fetched(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.trim_start_matches('.').strip_prefix("highwater-restore-"))
        else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            tracing::info!(dir = %entry.path().display(), "removing database files fetched by a process that is gone");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Fetches the database checkpoints of `manifest` from the store into a
/// local directory beside the store's staging directory (a hard link per
/// file where the store is on the same file system): one directory per
/// operator and worker, by operator.
#[allow(clippy::type_complexity)]
fn fetch_databases(
    store: &dyn CheckpointStore,
    manifest: &Manifest,
) -> Result<(HashMap<String, Vec<PathBuf>>, Option<FetchedDir>), CheckpointError> {
    let mut databases: HashMap<String, Vec<PathBuf>> = HashMap::new();
    if manifest.shards.iter().all(|s| s.databases.is_empty()) {
        return Ok((databases, None));
    }
    let staging = store.staging();
    let name = format!("restore-{}-{}", std::process::id(), manifest.id);
    let root = match staging.parent() {
        Some(parent) => parent.join(format!(".highwater-{name}")),
        None => std::env::temp_dir().join(format!("highwater-{name}")),
    };
    if let Some(parent) = root.parent() {
        sweep_fetched(parent);
    }
    let _ = std::fs::remove_dir_all(&root);
    let fetched = FetchedDir(root.clone());
    let io = |path: &Path| {
        let what = path.display().to_string();
        move |source| CheckpointError::Io { what, source }
    };
    let started = Instant::now();
    let mut bytes = 0u64;
    for shard in &manifest.shards {
        for (n, database) in shard.databases.iter().enumerate() {
            let dir = root.join(format!("w{}-{n}", shard.worker));
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            for (local, info) in &database.files {
                if local.contains('/') || local.starts_with('.') {
                    return Err(CheckpointError::Corrupt {
                        what: format!("checkpoint {}", manifest.id),
                        reason: format!("a database file named {local:?}"),
                    });
                }
                store.get_shared(info, &dir.join(local))?;
                bytes += info.size;
            }
            databases.entry(database.operator.clone()).or_default().push(dir);
        }
    }
    tracing::info!(bytes, elapsed = ?started.elapsed(), dir = %root.display(), "database files fetched");
    Ok((databases, Some(fetched)))
}

/// The newest usable checkpoint to recover from (with `config.recover`), or
/// none; without `recover` the store must hold no checkpoint.
pub(super) fn choose_checkpoint(
    config: &CheckpointConfig,
    store: &dyn CheckpointStore,
) -> Result<Option<Manifest>, CheckpointError> {
    if !config.recover {
        if !store.list()?.is_empty() {
            return Err(CheckpointError::NotEmpty { location: store.describe() });
        }
        return Ok(None);
    }
    match latest_usable(store)? {
        Some((manifest, rejected)) => {
            for reason in &rejected {
                tracing::warn!("skipping a damaged checkpoint: {reason}");
            }
            tracing::info!(id = manifest.id, time = manifest.time, "recovering from checkpoint");
            Ok(Some(manifest))
        }
        None => {
            tracing::info!(location = %store.describe(), "no checkpoint to recover from: starting afresh");
            Ok(None)
        }
    }
}

/// Reads every shard of `manifest` (one thread each): every operator's chunks
/// of entries, which each worker's operators read in place, keeping those
/// whose routing hash falls on them (see
/// [`Restored`]).
fn load_entries(store: &dyn CheckpointStore, manifest: &Manifest) -> Result<EntriesByOperator, CheckpointError> {
    let shards: Vec<Result<EntriesByOperator, CheckpointError>> = std::thread::scope(|scope| {
        let readers: Vec<_> = manifest
            .shards
            .iter()
            .map(|shard_info| {
                scope.spawn(move || {
                    let mut out = EntriesByOperator::new();
                    let dir = store.get_shard(manifest.id, shard_info.worker, &shard_info.files)?;
                    shard::read(&dir, |operator, chunk| {
                        out.entry(operator.to_owned()).or_default().push(Arc::new(chunk));
                    })?;
                    Ok(out)
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut out = EntriesByOperator::new();
    for shard in shards {
        for (operator, chunks) in shard? {
            out.entry(operator).or_default().extend(chunks);
        }
    }
    Ok(out)
}
