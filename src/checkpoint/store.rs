//! Checkpoint stores: where checkpoints are kept once written (a local
//! directory, or S3-compatible object storage).
//!
//! A store holds, per checkpoint `id`, each worker's shard (a directory of
//! files, see [`shard`](super::shard)) and the manifest. The manifest is put last and
//! atomically: a checkpoint without one does not exist.
//!
//! Beside the checkpoints, a store holds *shared files*: immutable files
//! (the SST files of a state backend on disk) that several checkpoints
//! reference, put once by the first checkpoint that needs them and listed
//! in the manifest of every checkpoint that uses them
//! ([`Manifest::shared`](super::manifest::Manifest::shared)). A shared
//! file's name starts with the id of the checkpoint that put it
//! ([`shared_name`]), which is what garbage collection needs: a shared file
//! that no kept checkpoint references is deleted once a newer checkpoint is
//! complete ([`unreferenced_shared`]), including the files of a checkpoint
//! that never got its manifest (a crash between upload and manifest); the
//! files of checkpoints still being written are newer, and stay.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::manifest::FileInfo;
use super::{kill, CheckpointError};
use crate::operators::checkpoint::CheckpointId;

/// The name of a checkpoint's directory (or key prefix).
pub fn checkpoint_name(id: CheckpointId) -> String {
    format!("chk-{id:010}")
}

/// The id of a checkpoint directory's name.
pub fn parse_checkpoint_name(name: &str) -> Option<CheckpointId> {
    name.strip_prefix("chk-").and_then(|n| n.parse().ok())
}

/// The name of the shared file that checkpoint `id` puts for `file` (a
/// name unique to its state backend's files, such as
/// `<database identity>-<file number>.sst`).
pub fn shared_name(id: CheckpointId, file: &str) -> String {
    format!("{id:010}-{file}")
}

/// The id of the checkpoint that put the shared file `name`.
pub fn shared_file_checkpoint(name: &str) -> Option<CheckpointId> {
    name.split_once('-').and_then(|(id, _)| id.parse().ok())
}

/// The shared files of `present` that garbage collection deletes once
/// checkpoint `newest` is complete: those that no manifest in `kept`
/// references and that a checkpoint at or before `newest` put (the others
/// belong to checkpoints still being written). A name without a checkpoint
/// id is not the store's, and stays.
pub fn unreferenced_shared<'a>(
    present: &'a [String],
    kept: &[super::manifest::Manifest],
    newest: CheckpointId,
) -> Vec<&'a str> {
    let referenced: std::collections::HashSet<&str> =
        kept.iter().flat_map(|m| m.shared.iter().map(|f| f.name.as_str())).collect();
    present
        .iter()
        .filter(|name| !referenced.contains(name.as_str()))
        .filter(|name| shared_file_checkpoint(name).is_some_and(|id| id <= newest))
        .map(String::as_str)
        .collect()
}

/// Keeps the newest `keep` complete checkpoints up to `newest`; deletes the
/// rest and incomplete ones older than `newest`; then deletes the shared
/// files that no kept checkpoint references, of checkpoints up to `newest`
/// ([`unreferenced_shared`]).
pub fn collect_garbage(store: &dyn CheckpointStore, keep: usize, newest: CheckpointId) -> Result<(), CheckpointError> {
    let ids = store.list()?;
    let mut kept = Vec::new();
    for &id in ids.iter().rev() {
        if id > newest {
            // Being written: its manifest (and the shared files it lists) comes later.
            continue;
        }
        let manifest = store.get_manifest(id)?;
        if let (Some(bytes), true) = (manifest.as_ref(), kept.len() < keep) {
            // A kept checkpoint whose manifest does not read keeps nothing
            // shared alive: recovery would skip it too.
            match super::manifest::Manifest::from_bytes(bytes, &format!("checkpoint {id}")) {
                Ok(m) => kept.push(m),
                Err(e) => tracing::warn!(id, %e, "a kept checkpoint's manifest does not read"),
            }
        } else if id != newest {
            store.delete(id)?;
        }
    }
    let present = store.list_shared()?;
    for name in unreferenced_shared(&present, &kept, newest) {
        tracing::debug!(name, "deleting a shared file no kept checkpoint uses");
        store.delete_shared(name)?;
    }
    Ok(())
}

/// Where checkpoints are kept.
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Where, for messages.
    fn describe(&self) -> String;
    /// A local directory for building shards before they are put.
    fn staging(&self) -> PathBuf;
    /// The ids of the checkpoints present, complete or not, ascending.
    fn list(&self) -> Result<Vec<CheckpointId>, CheckpointError>;
    /// Puts the shard of `worker` for checkpoint `id`, built in the local
    /// directory `local` (which the store may take over); returns its files.
    fn put_shard(&self, id: CheckpointId, worker: usize, local: &Path) -> Result<Vec<FileInfo>, CheckpointError>;
    /// A local directory holding the shard of `worker` for checkpoint `id`,
    /// checked against `files` (sizes and checksums).
    fn get_shard(&self, id: CheckpointId, worker: usize, files: &[FileInfo]) -> Result<PathBuf, CheckpointError>;
    /// Puts the manifest of checkpoint `id`, atomically.
    fn put_manifest(&self, id: CheckpointId, bytes: &[u8]) -> Result<(), CheckpointError>;
    /// The manifest of checkpoint `id`, if it has one.
    fn get_manifest(&self, id: CheckpointId) -> Result<Option<Vec<u8>>, CheckpointError>;
    /// Deletes checkpoint `id`.
    fn delete(&self, id: CheckpointId) -> Result<(), CheckpointError>;
    /// Puts `bytes` as the pending part `name` of an exactly-once sink at
    /// checkpoint `id` (durable once this returns), kept with the checkpoint
    /// and deleted with it; returns its size and checksum.
    fn put_sink_part(&self, id: CheckpointId, name: &str, bytes: &[u8]) -> Result<FileInfo, CheckpointError>;
    /// The contents of a part put by [`put_sink_part`](Self::put_sink_part),
    /// checked against `info` (its name, size and checksum).
    fn get_sink_part(&self, id: CheckpointId, info: &FileInfo) -> Result<Vec<u8>, CheckpointError>;
    /// Puts the local file `local` as the shared file `name` ([`shared_name`];
    /// durable once this returns; `local` is left as it is); returns its
    /// size and checksum.
    fn put_shared(&self, name: &str, local: &Path) -> Result<FileInfo, CheckpointError>;
    /// Copies the shared file `info` into the local file `to`, checked
    /// against its size and checksum.
    fn get_shared(&self, info: &FileInfo, to: &Path) -> Result<(), CheckpointError>;
    /// The names of the shared files present.
    fn list_shared(&self) -> Result<Vec<String>, CheckpointError>;
    /// Deletes the shared file `name`; a missing one is no error.
    fn delete_shared(&self, name: &str) -> Result<(), CheckpointError>;
}

/// Checks a sink part's bytes against the size and checksum it was put with.
pub(crate) fn check_part(what: String, bytes: &[u8], info: &FileInfo) -> Result<(), CheckpointError> {
    let crc32 = crc32fast::hash(bytes);
    if bytes.len() as u64 != info.size || crc32 != info.crc32 {
        return Err(CheckpointError::Corrupt {
            what,
            reason: format!(
                "{} bytes with crc32 {crc32:08x}, the manifest says {} bytes with crc32 {:08x}",
                bytes.len(),
                info.size,
                info.crc32
            ),
        });
    }
    Ok(())
}

/// Opens the store at `location`: `s3://bucket/prefix` or a directory.
pub fn open_store(location: &str) -> Result<Box<dyn CheckpointStore>, CheckpointError> {
    if location.starts_with("s3://") {
        #[cfg(feature = "s3")]
        return Ok(Box::new(super::s3::S3Store::open(location)?));
        #[cfg(not(feature = "s3"))]
        return Err(CheckpointError::Config(format!(
            "{location}: this build of highwater has no S3 support (enable the `s3` feature of the highwater crate)"
        )));
    }
    Ok(Box::new(LocalStore::open(PathBuf::from(location))?))
}

/// Checkpoints in a local (or mounted) directory.
#[derive(Debug)]
pub struct LocalStore {
    dir: PathBuf,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Io { what, source }
}

/// Fsyncs a directory, so that renames and creations in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir.display().to_string()))
}

/// Size and CRC-32 of a file.
pub(crate) fn file_info(path: &Path) -> Result<FileInfo, CheckpointError> {
    let mut file = std::fs::File::open(path).map_err(io(path.display().to_string()))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io(path.display().to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(FileInfo { name, size, crc32: hasher.finalize() })
}

impl LocalStore {
    /// A store in `dir`, created if missing.
    pub fn open(dir: PathBuf) -> Result<Self, CheckpointError> {
        std::fs::create_dir_all(&dir).map_err(io(format!("creating checkpoint directory {}", dir.display())))?;
        Ok(LocalStore { dir })
    }

    fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.dir.join(checkpoint_name(id))
    }

    fn shared_dir(&self) -> PathBuf {
        self.dir.join("shared")
    }
}

/// Checks the local file `path` against `expected` (size and checksum).
fn check_file(path: &Path, expected: &FileInfo) -> Result<(), CheckpointError> {
    let what = path.display().to_string();
    let actual = file_info(path).map_err(|e| CheckpointError::Corrupt { what: what.clone(), reason: e.to_string() })?;
    if actual.size != expected.size || actual.crc32 != expected.crc32 {
        return Err(CheckpointError::Corrupt {
            what,
            reason: format!(
                "{} bytes with crc32 {:08x}, the manifest says {} bytes with crc32 {:08x}",
                actual.size, actual.crc32, expected.size, expected.crc32
            ),
        });
    }
    Ok(())
}

impl CheckpointStore for LocalStore {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn staging(&self) -> PathBuf {
        self.dir.join(".staging")
    }

    fn list(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(self.dir.display().to_string()))? {
            let entry = entry.map_err(io(self.dir.display().to_string()))?;
            if let Some(id) = parse_checkpoint_name(&entry.file_name().to_string_lossy()) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn put_shard(&self, id: CheckpointId, worker: usize, local: &Path) -> Result<Vec<FileInfo>, CheckpointError> {
        let target = self.checkpoint_dir(id).join(format!("shard-{worker}"));
        std::fs::create_dir_all(&target).map_err(io(target.display().to_string()))?;
        let mut files = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(local)
            .map_err(io(local.display().to_string()))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            let from = local.join(&name);
            let to = target.join(&name);
            // Same file system: a rename; the data is synced first.
            std::fs::File::open(&from).and_then(|f| f.sync_all()).map_err(io(from.display().to_string()))?;
            std::fs::rename(&from, &to).or_else(|_| std::fs::copy(&from, &to).map(|_| ())).map_err(io(format!(
                "putting {} into {}",
                from.display(),
                to.display()
            )))?;
            files.push(file_info(&to)?);
            kill::point("shard-write");
        }
        sync_dir(&target)?;
        let _ = std::fs::remove_dir_all(local);
        Ok(files)
    }

    fn get_shard(&self, id: CheckpointId, worker: usize, files: &[FileInfo]) -> Result<PathBuf, CheckpointError> {
        let dir = self.checkpoint_dir(id).join(format!("shard-{worker}"));
        for expected in files {
            check_file(&dir.join(&expected.name), expected)?;
        }
        Ok(dir)
    }

    fn put_manifest(&self, id: CheckpointId, bytes: &[u8]) -> Result<(), CheckpointError> {
        let dir = self.checkpoint_dir(id);
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        let tmp = dir.join("MANIFEST.tmp");
        let path = dir.join("MANIFEST");
        let mut file = std::fs::File::create(&tmp).map_err(io(tmp.display().to_string()))?;
        // A kill here leaves a half-written temporary file and no manifest.
        let half = bytes.len() / 2;
        file.write_all(&bytes[..half]).map_err(io(tmp.display().to_string()))?;
        file.flush().map_err(io(tmp.display().to_string()))?;
        kill::point("manifest-write");
        file.write_all(&bytes[half..]).and_then(|_| file.sync_all()).map_err(io(tmp.display().to_string()))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(io(path.display().to_string()))?;
        sync_dir(&dir)?;
        // The checkpoint's directory itself, in the store's.
        sync_dir(&self.dir)
    }

    fn put_sink_part(&self, id: CheckpointId, name: &str, bytes: &[u8]) -> Result<FileInfo, CheckpointError> {
        let dir = self.checkpoint_dir(id).join("sinks");
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        let tmp = dir.join(format!("{name}.tmp"));
        let path = dir.join(name);
        let mut file = std::fs::File::create(&tmp).map_err(io(tmp.display().to_string()))?;
        file.write_all(bytes).and_then(|_| file.sync_all()).map_err(io(tmp.display().to_string()))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(io(path.display().to_string()))?;
        sync_dir(&dir)?;
        Ok(FileInfo { name: name.to_owned(), size: bytes.len() as u64, crc32: crc32fast::hash(bytes) })
    }

    fn get_sink_part(&self, id: CheckpointId, info: &FileInfo) -> Result<Vec<u8>, CheckpointError> {
        let path = self.checkpoint_dir(id).join("sinks").join(&info.name);
        let what = path.display().to_string();
        let bytes =
            std::fs::read(&path).map_err(|e| CheckpointError::Corrupt { what: what.clone(), reason: e.to_string() })?;
        check_part(what, &bytes, info)?;
        Ok(bytes)
    }

    fn put_shared(&self, name: &str, local: &Path) -> Result<FileInfo, CheckpointError> {
        let dir = self.shared_dir();
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        // A hard link when the file is on the same file system (its
        // contents never change: RocksDB's files are immutable), else a copy.
        if std::fs::hard_link(local, &tmp).is_err() {
            std::fs::copy(local, &tmp).map_err(io(format!("copying {} to {}", local.display(), tmp.display())))?;
        }
        std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io(tmp.display().to_string()))?;
        std::fs::rename(&tmp, &path).map_err(io(path.display().to_string()))?;
        sync_dir(&dir)?;
        let mut info = file_info(&path)?;
        info.name = name.to_owned();
        Ok(info)
    }

    fn get_shared(&self, info: &FileInfo, to: &Path) -> Result<(), CheckpointError> {
        let path = self.shared_dir().join(&info.name);
        check_file(&path, info)?;
        if std::fs::hard_link(&path, to).is_err() {
            std::fs::copy(&path, to).map_err(io(format!("copying {} to {}", path.display(), to.display())))?;
        }
        Ok(())
    }

    fn list_shared(&self) -> Result<Vec<String>, CheckpointError> {
        let dir = self.shared_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::Io { what: dir.display().to_string(), source: e }),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry.map_err(io(dir.display().to_string()))?.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".tmp") {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn delete_shared(&self, name: &str) -> Result<(), CheckpointError> {
        let path = self.shared_dir().join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::Io { what: path.display().to_string(), source: e }),
        }
    }

    fn get_manifest(&self, id: CheckpointId) -> Result<Option<Vec<u8>>, CheckpointError> {
        let path = self.checkpoint_dir(id).join("MANIFEST");
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CheckpointError::Io { what: path.display().to_string(), source: e }),
        }
    }

    fn delete(&self, id: CheckpointId) -> Result<(), CheckpointError> {
        let dir = self.checkpoint_dir(id);
        // The manifest goes first: a half-deleted checkpoint is an incomplete one.
        let _ = std::fs::remove_file(dir.join("MANIFEST"));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::Io { what: dir.display().to_string(), source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::manifest::{Manifest, FORMAT_VERSION};

    fn manifest(id: CheckpointId, shared: &[FileInfo]) -> Vec<u8> {
        Manifest {
            format_version: FORMAT_VERSION,
            id,
            time: id * 1000,
            fingerprint: "f".into(),
            workers: 1,
            created_unix_ms: 0,
            sources: Default::default(),
            shards: vec![],
            sinks: vec![],
            schemas: Default::default(),
            shared: shared.to_vec(),
        }
        .to_bytes()
    }

    /// Shared files survive while a kept checkpoint lists them; the files of
    /// checkpoints dropped, and of one that never got its manifest, go; the
    /// files of a checkpoint still being written stay.
    #[test]
    fn shared_files_are_kept_while_a_kept_checkpoint_references_them() {
        let dir = std::env::temp_dir().join(format!("highwater-shared-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = LocalStore::open(dir.clone()).unwrap();
        let local = dir.join("local.sst");
        let put = |id: CheckpointId, file: &str| {
            std::fs::write(&local, format!("{id} {file}")).unwrap();
            let info = store.put_shared(&shared_name(id, file), &local).unwrap();
            std::fs::remove_file(&local).unwrap();
            info
        };
        // Checkpoint 1 puts a and b; 2 adds c (b compacted away); 3 puts d
        // and is killed before its manifest; 4 adds e; 5 is being written.
        let (a, b) = (put(1, "a.sst"), put(1, "b.sst"));
        let c = put(2, "c.sst");
        let d = put(3, "d.sst");
        let e = put(4, "e.sst");
        let f = put(5, "f.sst");
        store.put_manifest(1, &manifest(1, &[a.clone(), b.clone()])).unwrap();
        store.put_manifest(2, &manifest(2, &[a.clone(), c.clone()])).unwrap();
        store.put_manifest(4, &manifest(4, &[c.clone(), e.clone()])).unwrap();
        std::fs::create_dir_all(dir.join(checkpoint_name(3))).unwrap();
        std::fs::create_dir_all(dir.join(checkpoint_name(5))).unwrap();
        assert_eq!(store.list_shared().unwrap().len(), 6);
        // Keeping two: 2 and 4 (with a, c, e), and 5's f, being written.
        collect_garbage(&store, 2, 4).unwrap();
        assert_eq!(store.list().unwrap(), [2, 4, 5]);
        let names: Vec<String> = [&a, &c, &e, &f].iter().map(|i| i.name.clone()).collect();
        assert_eq!(store.list_shared().unwrap(), names);
        assert!(!store.list_shared().unwrap().contains(&d.name), "the orphan of the killed checkpoint 3 is deleted");
        // Read back, checked.
        let to = dir.join("back.sst");
        store.get_shared(&c, &to).unwrap();
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "2 c.sst");
        let mut wrong = c.clone();
        wrong.crc32 ^= 1;
        assert!(matches!(store.get_shared(&wrong, &dir.join("x")), Err(CheckpointError::Corrupt { .. })));
        assert!(matches!(store.get_shared(&b, &dir.join("y")), Err(CheckpointError::Corrupt { .. })));
        // Keeping one: 4; a goes.
        collect_garbage(&store, 1, 4).unwrap();
        let names: Vec<String> = [&c, &e, &f].iter().map(|i| i.name.clone()).collect();
        assert_eq!(store.list_shared().unwrap(), names);
        store.delete_shared(&c.name).unwrap();
        store.delete_shared(&c.name).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shared_names_carry_the_checkpoint_that_put_them() {
        let name = shared_name(42, "0a1b-000012.sst");
        assert_eq!(name, "0000000042-0a1b-000012.sst");
        assert_eq!(shared_file_checkpoint(&name), Some(42));
        assert_eq!(shared_file_checkpoint("README"), None);
    }
}
