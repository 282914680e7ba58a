//! The writer thread: writes this process's part of every collected
//! checkpoint (its workers' shards into the store, its sinks' parts
//! pre-committed); the coordinator also writes the manifests, in order, once
//! every process's part is in, commits the sinks and collects garbage.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::operators::checkpoint::{BackendFiles, CheckpointId, Cut, Entry};

use super::super::cluster::{Message, ProcessPart};
use super::super::manifest::{DatabaseInfo, FileInfo, Manifest, PartitionState, ShardInfo, FORMAT_VERSION};
use super::super::store::{shared_name, CheckpointStore};
use super::super::{kill, shard, CheckpointError};
use super::phase::{Collecting, DatabaseCheckpoint, Effect};
use super::{lock, Inner};

/// How long a process waits, when it finishes, for the checkpoints begun to be written.
const FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// Work for the writer thread.
#[derive(Debug)]
pub(super) enum Work {
    /// This process's workers' shares of a cut.
    Local(Collecting),
    /// Another process's part of a checkpoint (coordinator).
    Remote { process: usize, id: CheckpointId, part: ProcessPart },
}

/// Parts by checkpoint, with its cut and the start of its writing once this
/// process's part is written (coordinator).
type Parts = BTreeMap<CheckpointId, (Option<(Cut, Instant)>, BTreeMap<usize, ProcessPart>)>;

/// The writer thread, until the work ends (alone) or every checkpoint begun
/// is written (across processes).
pub(super) fn write_loop(inner: &Inner, work: mpsc::Receiver<Work>) {
    let mut parts = Parts::new();
    // The SST files this process put (or reused) for its last checkpoint,
    // by `<database identity>-<file name>`: the next one reuses them.
    let mut uploaded = Uploaded::new();
    let process = inner.membership.as_ref().map_or(0, |m| m.process);
    let mut stopping: Option<Instant> = None;
    loop {
        let next = match work.recv_timeout(Duration::from_millis(50)) {
            Ok(next) => Some(next),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => None,
        };
        if lock(&inner.state).phase.is_failed() {
            // After a failure no later checkpoint may be committed: its
            // sinks' parts would follow a gap.
            if inner.stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        match next {
            Some(Work::Local(c)) => {
                let (id, cut, started) = (c.cut.id, c.cut, c.begun);
                match write_part(inner, c, &mut uploaded) {
                    Ok(part) if inner.layout.leads => {
                        let entry = parts.entry(id).or_default();
                        entry.0 = Some((cut, started));
                        entry.1.insert(process, part);
                    }
                    Ok(part) => {
                        let mut state = lock(&inner.state);
                        let _ = inner.step(&mut state, |phase, job| {
                            job.effects.push(Effect::Send(Message::ProcessDone { id, part }));
                            Ok(phase)
                        });
                    }
                    Err(e) => {
                        tracing::error!("checkpoint {id} failed: {e}");
                        inner.fail(&mut lock(&inner.state), format!("checkpoint {id}: {e}"));
                    }
                }
            }
            Some(Work::Remote { process, id, .. })
                if parts.get(&id).is_some_and(|(_, by)| by.contains_key(&process)) =>
            {
                let error = format!("process {process} reported its part of checkpoint {id} twice");
                inner.fail(&mut lock(&inner.state), error);
                continue;
            }
            Some(Work::Remote { process, id, part }) => {
                parts.entry(id).or_default().1.insert(process, part);
            }
            None => {}
        }
        // The coordinator writes the manifests of complete checkpoints, in order.
        while let Some(entry) = parts.first_entry() {
            let (cut, by_process) = entry.get();
            let Some((cut, started)) = *cut else { break };
            if by_process.len() < inner.layout.processes {
                break;
            }
            let (_, by_process) = entry.remove();
            let result = write_manifest(inner, cut, started, by_process.into_values().collect());
            let mut state = lock(&inner.state);
            match result {
                Ok(manifest) => {
                    inner.stats().written(crate::checkpoint::LastCheckpoint {
                        id: manifest.id,
                        time: manifest.time,
                        duration_seconds: started.elapsed().as_secs_f64(),
                        state_bytes: manifest.state_bytes(),
                        bytes_written: manifest.bytes_written(),
                        completed_unix_ms: manifest.created_unix_ms,
                    });
                    let is_final = manifest.is_final();
                    let _ = inner.step(&mut state, |phase, job| phase.written(cut.id, is_final, job));
                }
                Err(e) => {
                    tracing::error!("checkpoint {} failed: {e}", cut.id);
                    inner.stats().failed();
                    inner.fail(&mut state, format!("checkpoint {}: {e}", cut.id));
                }
            }
        }
        if inner.stop.load(Ordering::Relaxed) && inner.membership.is_some() {
            // Across processes: until every checkpoint begun is written.
            let mut state = lock(&inner.state);
            if state.phase.in_flight() == 0 || state.phase.is_failed() {
                break;
            }
            let since = *stopping.get_or_insert_with(Instant::now);
            if since.elapsed() > FINISH_TIMEOUT {
                inner.fail(&mut state, format!("checkpoints begun were not written within {FINISH_TIMEOUT:?}"));
                break;
            }
        }
    }
}

/// SST files put into the store, by `<database identity>-<file name>`.
type Uploaded = HashMap<String, FileInfo>;

/// Writes this process's part of a collected checkpoint: its workers'
/// shards and database files (put into the store) and its sinks' prepared
/// parts. `uploaded` holds the SST files of this process's previous
/// checkpoint, which is complete (a cut begins only once the one before is
/// written), so that they are referenced, not put again; it is replaced by
/// this checkpoint's.
fn write_part(inner: &Inner, mut c: Collecting, uploaded: &mut Uploaded) -> Result<ProcessPart, CheckpointError> {
    let id = c.cut.id;
    let store = &*inner.store;
    let staging = store.staging();
    std::fs::create_dir_all(&staging)
        .map_err(|source| CheckpointError::Io { what: staging.display().to_string(), source })?;
    type Operators = Vec<(String, Vec<Entry>)>;
    let mut by_worker: BTreeMap<usize, (Operators, Vec<(String, DatabaseCheckpoint)>)> = BTreeMap::new();
    for (worker, name, entries, files) in std::mem::take(&mut c.operators) {
        let (operators, databases) = by_worker.entry(worker).or_default();
        if let Some(files) = files {
            databases.push((name.clone(), files));
        }
        operators.push((name, entries));
    }
    let mut shards = Vec::new();
    let mut now_uploaded = Uploaded::new();
    let mut put_bytes = 0u64;
    for (worker, (mut operators, databases)) in by_worker {
        operators.sort_by(|a, b| a.0.cmp(&b.0));
        let local = staging.join(format!("chk-{id}-shard-{worker}"));
        let entries = shard::write(&local, &operators)?;
        let files = store.put_shard(id, worker, &local)?;
        let mut infos = Vec::new();
        for (operator, database) in databases {
            let (info, put) = put_database(store, id, operator, &database.0, uploaded, &mut now_uploaded)?;
            put_bytes += put;
            infos.push(info);
            // The directory goes with `database`.
        }
        infos.sort_by(|a, b| a.operator.cmp(&b.operator));
        shards.push(ShardInfo { worker, entries, files, databases: infos });
    }
    if !now_uploaded.is_empty() || !uploaded.is_empty() {
        tracing::debug!(id, put_bytes, files = now_uploaded.len(), "database files put into the store");
        kill::point("database-put");
    }
    *uploaded = now_uploaded;
    let mut sinks = Vec::new();
    for (_, submission) in c.sinks {
        let part = submission.part.as_ref().map(|(bytes, rows)| (bytes.as_slice(), *rows));
        let committer = lock(&inner.state).job.registry.committer(&submission.sink)?;
        let mut prepared = committer.prepare(id, part)?;
        prepared.sink = submission.sink;
        sinks.push(prepared);
    }
    Ok(ProcessPart { shards, sources: c.sources, sinks })
}

/// Puts the files of `operator`'s database checkpoint `files` into the
/// store as shared files of checkpoint `id`: an SST file that `before` holds
/// (put by the previous checkpoint, with the same size) is referenced
/// again; the others are put. Records the SST files in `now`; returns the
/// database's entry of the shard and the bytes put.
fn put_database(
    store: &dyn CheckpointStore,
    id: CheckpointId,
    operator: String,
    files: &BackendFiles,
    before: &Uploaded,
    now: &mut Uploaded,
) -> Result<(DatabaseInfo, u64), CheckpointError> {
    let mut out = BTreeMap::new();
    let mut put = 0;
    for (name, size) in &files.files {
        let key = format!("{}-{name}", files.identity);
        let info = match before.get(&key).filter(|f| BackendFiles::is_shared(name) && f.size == *size) {
            Some(info) => info.clone(),
            None => {
                let info = store.put_shared(&shared_name(id, &key), &files.dir.join(name))?;
                put += info.size;
                info
            }
        };
        if BackendFiles::is_shared(name) {
            now.insert(key, info.clone());
        }
        out.insert(name.clone(), info);
    }
    Ok((DatabaseInfo { operator, identity: files.identity.clone(), files: out }, put))
}

/// Completes checkpoint `cut` from every process's part, begun at `started`:
/// writes the manifest, commits the sinks, collects garbage.
fn write_manifest(
    inner: &Inner,
    cut: Cut,
    started: Instant,
    parts: Vec<ProcessPart>,
) -> Result<Manifest, CheckpointError> {
    let id = cut.id;
    let store = &*inner.store;
    let mut shards = Vec::new();
    let mut sinks = Vec::new();
    let mut sources: BTreeMap<String, Vec<PartitionState>> = BTreeMap::new();
    for part in parts {
        shards.extend(part.shards);
        sinks.extend(part.sinks);
        for (source, partitions) in part.sources {
            sources.entry(source).or_default().extend(partitions);
        }
    }
    shards.sort_by_key(|s| s.worker);
    let mut shared: Vec<FileInfo> =
        shards.iter().flat_map(|s| &s.databases).flat_map(|d| d.files.values().cloned()).collect();
    shared.sort_by(|a, b| a.name.cmp(&b.name));
    shared.dedup_by(|a, b| a.name == b.name);
    for partitions in sources.values_mut() {
        partitions.sort_by_key(|p| p.partition);
    }
    let (fingerprint, schemas) = {
        let state = lock(&inner.state);
        (state.job.registry.fingerprint(inner.first_worker), state.job.registry.schemas.clone())
    };
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        id,
        time: cut.time,
        fingerprint,
        workers: inner.peers,
        created_unix_ms: now_ms(),
        sources,
        shards,
        sinks,
        schemas,
        shared,
    };
    store.put_manifest(id, &manifest.to_bytes())?;
    kill::point("sink-commit");
    for part in &manifest.sinks {
        let committer = lock(&inner.state).job.registry.committer(&part.sink)?;
        committer.commit(part)?;
    }
    tracing::info!(
        id,
        time = manifest.time,
        bytes = manifest.state_bytes(),
        written = manifest.bytes_written(),
        write = ?started.elapsed(),
        "checkpoint committed"
    );
    super::super::store::collect_garbage(store, inner.config.keep, id)?;
    Ok(manifest)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
