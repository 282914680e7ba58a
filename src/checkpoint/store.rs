//! Checkpoint stores: where checkpoints are kept once written (a local
//! directory, or S3-compatible object storage).
//!
//! A store holds, per checkpoint `id`, each worker's shard (a directory of
//! files, see [`shard`](super::shard)) and the manifest. The manifest is put last and
//! atomically: a checkpoint without one does not exist.

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
            let path = dir.join(&expected.name);
            let what = path.display().to_string();
            let actual =
                file_info(&path).map_err(|e| CheckpointError::Corrupt { what: what.clone(), reason: e.to_string() })?;
            if actual.size != expected.size || actual.crc32 != expected.crc32 {
                return Err(CheckpointError::Corrupt {
                    what,
                    reason: format!(
                        "{} bytes with crc32 {:08x}, the manifest says {} bytes with crc32 {:08x}",
                        actual.size, actual.crc32, expected.size, expected.crc32
                    ),
                });
            }
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
