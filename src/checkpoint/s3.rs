//! Checkpoints in S3-compatible object storage (`s3://bucket/prefix`).
//!
//! The layout under the prefix mirrors [`LocalStore`](super::LocalStore)'s:
//! `chk-{id:010}/shard-{worker}/{file}` for the files of each worker's shard
//! and `chk-{id:010}/MANIFEST`, put last with a single (atomic) PUT.
//!
//! The connection is configured from the environment as usual for AWS:
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` (default `us-east-1`) and, for S3-compatible servers,
//! `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`); an `http://` endpoint is allowed.
//! Requests use path-style addressing (`endpoint/bucket/key`).
//!
//! [`object_store`] is asynchronous: the store owns a small current-thread
//! tokio runtime and blocks on it, so callers stay synchronous.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::manifest::FileInfo;
use super::store::{checkpoint_name, file_info, parse_checkpoint_name, CheckpointStore};
use super::{kill, CheckpointError};
use crate::operators::checkpoint::CheckpointId;

/// Files up to this size are put with one PUT; larger ones in parts.
const SINGLE_PUT_MAX: u64 = 32 << 20;
/// The size of the parts of a multipart upload (S3 wants at least 5 MiB).
const PART_SIZE: usize = 8 << 20;
/// Parts of one file uploaded at once.
const PART_CONCURRENCY: usize = 4;
/// The prefix of the staging directories' names, in the temporary directory.
const STAGING_PREFIX: &str = "highwater-s3-staging-";
/// How long a dead process's staging directory is left alone.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Checkpoints in an S3 bucket (or an S3-compatible server), under a prefix.
#[derive(Debug)]
pub struct S3Store {
    bucket: String,
    prefix: ObjectPath,
    client: AmazonS3,
    runtime: tokio::runtime::Runtime,
    staging: PathBuf,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Io { what, source }
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// Splits `s3://bucket/prefix` into the bucket and the prefix (without
/// leading or trailing slashes; empty for the bucket's root).
fn parse_location(location: &str) -> Result<(String, String), CheckpointError> {
    let rest = location.strip_prefix("s3://").ok_or_else(|| {
        CheckpointError::Config(format!("checkpoint location {location:?}: expected s3://bucket/prefix"))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(CheckpointError::Config(format!("checkpoint location {location:?}: the bucket name is missing")));
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

/// Removes the staging directories of S3 stores whose process is gone
/// (killed before it could clean up) and that were last changed over an
/// hour ago (a process in another PID namespace sharing the directory may
/// look gone; a live store changes its directory at every checkpoint).
fn remove_stale_staging(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else { return };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STAGING_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid <= 0 || pid as u32 == std::process::id() {
            continue;
        }
        // SAFETY: signal 0 sends nothing; it only asks whether `pid` exists.
        let gone =
            unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let idle = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if gone && idle {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl S3Store {
    /// The store at `location` (`s3://bucket/prefix`), configured from the
    /// environment. Nothing is requested from the server yet.
    pub fn open(location: &str) -> Result<Self, CheckpointError> {
        let (bucket, prefix) = parse_location(location)?;
        let prefix = ObjectPath::parse(&prefix).map_err(|e| {
            CheckpointError::Config(format!("checkpoint location {location:?}: invalid key prefix: {e}"))
        })?;
        let mut builder =
            AmazonS3Builder::from_env().with_bucket_name(&bucket).with_virtual_hosted_style_request(false);
        let endpoint = [AmazonS3ConfigKey::S3Endpoint, AmazonS3ConfigKey::Endpoint]
            .iter()
            .find_map(|key| builder.get_config_value(key))
            .unwrap_or_default();
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
        let client = builder.build().map_err(|source| CheckpointError::ObjectStore {
            what: format!("configuring the S3 client for bucket {bucket:?}"),
            source: source.into(),
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io(format!("starting the I/O runtime of the S3 store s3://{bucket}")))?;
        static STORES: AtomicU64 = AtomicU64::new(0);
        let temp = std::env::temp_dir();
        remove_stale_staging(&temp);
        let staging =
            temp.join(format!("{STAGING_PREFIX}{}-{}", std::process::id(), STORES.fetch_add(1, Ordering::Relaxed)));
        Ok(S3Store { bucket, prefix, client, runtime, staging })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    fn checkpoint_prefix(&self, id: CheckpointId) -> ObjectPath {
        self.prefix.clone().join(checkpoint_name(id))
    }

    fn shard_key(&self, id: CheckpointId, worker: usize, file: &str) -> ObjectPath {
        self.checkpoint_prefix(id).join(format!("shard-{worker}")).join(file)
    }

    fn shared_key(&self, name: &str) -> ObjectPath {
        self.prefix.clone().join("shared").join(name)
    }

    fn manifest_key(&self, id: CheckpointId) -> ObjectPath {
        self.checkpoint_prefix(id).join("MANIFEST")
    }

    /// `s3://bucket/key`, for messages.
    fn url(&self, key: &ObjectPath) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    fn error(
        &self,
        what: impl std::fmt::Display,
        key: &ObjectPath,
    ) -> impl FnOnce(object_store::Error) -> CheckpointError {
        let what = format!("{what} {}", self.url(key));
        move |source| CheckpointError::ObjectStore { what, source: source.into() }
    }

    /// Uploads the local file `from` to `key`.
    fn upload(&self, from: &Path, key: &ObjectPath) -> Result<(), CheckpointError> {
        let size = std::fs::metadata(from).map_err(io(from.display().to_string()))?.len();
        if size <= SINGLE_PUT_MAX {
            let bytes = std::fs::read(from).map_err(io(from.display().to_string()))?;
            self.runtime
                .block_on(self.client.put(key, PutPayload::from(bytes)))
                .map_err(self.error("uploading to", key))?;
            return Ok(());
        }
        let mut file = std::fs::File::open(from).map_err(io(from.display().to_string()))?;
        self.runtime.block_on(async {
            let upload = self.client.put_multipart(key).await.map_err(self.error("starting an upload to", key))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            let mut buf = vec![0u8; PART_SIZE];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(CheckpointError::Io { what: from.display().to_string(), source: e });
                    }
                };
                if n == 0 {
                    break;
                }
                if let Err(e) = writer.wait_for_capacity(PART_CONCURRENCY).await {
                    let _ = writer.abort().await;
                    return Err(self.error("uploading to", key)(e));
                }
                writer.write(&buf[..n]);
            }
            writer.finish().await.map_err(self.error("uploading to", key))?;
            Ok(())
        })
    }

    /// Downloads `key` into the local file `to`; returns its size and CRC-32.
    fn download(&self, key: &ObjectPath, to: &Path) -> Result<FileInfo, CheckpointError> {
        let mut file = std::fs::File::create(to).map_err(io(to.display().to_string()))?;
        let mut hasher = crc32fast::Hasher::new();
        let mut size = 0u64;
        self.runtime.block_on(async {
            let result = self.client.get(key).await.map_err(self.error("downloading", key))?;
            let mut stream = result.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(self.error("downloading", key))?;
                hasher.update(&chunk);
                size += chunk.len() as u64;
                file.write_all(&chunk).map_err(io(to.display().to_string()))?;
            }
            Ok::<_, CheckpointError>(())
        })?;
        file.flush().map_err(io(to.display().to_string()))?;
        let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(FileInfo { name, size, crc32: hasher.finalize() })
    }

    /// Every key under `prefix`.
    fn keys_under(&self, prefix: &ObjectPath) -> Result<Vec<ObjectPath>, CheckpointError> {
        self.runtime.block_on(async {
            let mut keys = Vec::new();
            let mut stream = self.client.list(Some(prefix));
            while let Some(meta) = stream.next().await {
                keys.push(meta.map_err(self.error("listing", prefix))?.location);
            }
            Ok(keys)
        })
    }

    /// Deletes `key`; a missing object is no error.
    fn delete_key(&self, key: &ObjectPath) -> Result<(), CheckpointError> {
        match self.runtime.block_on(self.client.delete(key)) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.error("deleting", key)(e)),
        }
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

impl CheckpointStore for S3Store {
    fn describe(&self) -> String {
        self.url(&self.prefix).trim_end_matches('/').to_owned()
    }

    fn staging(&self) -> PathBuf {
        self.staging.clone()
    }

    fn list(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
        let listing = self
            .runtime
            .block_on(self.client.list_with_delimiter(Some(&self.prefix)))
            .map_err(self.error("listing", &self.prefix))?;
        let mut ids: Vec<_> =
            listing.common_prefixes.iter().filter_map(|p| p.filename().and_then(parse_checkpoint_name)).collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    fn put_shard(&self, id: CheckpointId, worker: usize, local: &Path) -> Result<Vec<FileInfo>, CheckpointError> {
        let mut names: Vec<_> = std::fs::read_dir(local)
            .map_err(io(local.display().to_string()))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut files = Vec::new();
        for name in names {
            let from = local.join(&name);
            let info = file_info(&from)?;
            self.upload(&from, &self.shard_key(id, worker, &name))?;
            files.push(info);
            kill::point("shard-write");
        }
        let _ = std::fs::remove_dir_all(local);
        Ok(files)
    }

    fn get_shard(&self, id: CheckpointId, worker: usize, files: &[FileInfo]) -> Result<PathBuf, CheckpointError> {
        let dir = self.staging.join("fetched").join(checkpoint_name(id)).join(format!("shard-{worker}"));
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        for expected in files {
            let path = dir.join(&expected.name);
            // Fetched (and checked) before: a checkpoint's files never change.
            if file_info(&path).is_ok_and(|a| a.size == expected.size && a.crc32 == expected.crc32) {
                continue;
            }
            let key = self.shard_key(id, worker, &expected.name);
            let actual = self.download(&key, &path).map_err(|e| match e {
                CheckpointError::ObjectStore { source, .. }
                    if source.downcast_ref::<object_store::Error>().is_some_and(is_not_found) =>
                {
                    CheckpointError::Corrupt { what: self.url(&key), reason: "missing".into() }
                }
                e => e,
            })?;
            if actual.size != expected.size || actual.crc32 != expected.crc32 {
                let _ = std::fs::remove_file(&path);
                return Err(CheckpointError::Corrupt {
                    what: self.url(&key),
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
        let key = self.manifest_key(id);
        // A kill here leaves the shards without a manifest: no checkpoint.
        kill::point("manifest-write");
        self.runtime
            .block_on(self.client.put(&key, PutPayload::from(bytes.to_vec())))
            .map_err(self.error("uploading", &key))?;
        Ok(())
    }

    fn get_manifest(&self, id: CheckpointId) -> Result<Option<Vec<u8>>, CheckpointError> {
        let key = self.manifest_key(id);
        let result = self.runtime.block_on(async {
            let result = self.client.get(&key).await?;
            result.bytes().await
        });
        match result {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.error("downloading", &key)(e)),
        }
    }

    fn put_sink_part(&self, id: CheckpointId, name: &str, bytes: &[u8]) -> Result<FileInfo, CheckpointError> {
        let key = self.checkpoint_prefix(id).join("sinks").join(name);
        self.runtime
            .block_on(self.client.put(&key, PutPayload::from(bytes.to_vec())))
            .map_err(self.error("uploading to", &key))?;
        Ok(FileInfo { name: name.to_owned(), size: bytes.len() as u64, crc32: crc32fast::hash(bytes) })
    }

    fn get_sink_part(&self, id: CheckpointId, info: &FileInfo) -> Result<Vec<u8>, CheckpointError> {
        let key = self.checkpoint_prefix(id).join("sinks").join(info.name.as_str());
        let bytes = self.runtime.block_on(async {
            let result = self.client.get(&key).await.map_err(self.error("downloading", &key))?;
            result.bytes().await.map_err(self.error("downloading", &key))
        })?;
        super::store::check_part(self.url(&key), &bytes, info)?;
        Ok(bytes.to_vec())
    }

    fn put_shared(&self, name: &str, local: &Path) -> Result<FileInfo, CheckpointError> {
        let mut info = file_info(local)?;
        self.upload(local, &self.shared_key(name))?;
        info.name = name.to_owned();
        Ok(info)
    }

    fn get_shared(&self, info: &FileInfo, to: &Path) -> Result<(), CheckpointError> {
        let key = self.shared_key(&info.name);
        let actual = self.download(&key, to).map_err(|e| match e {
            CheckpointError::ObjectStore { source, .. }
                if source.downcast_ref::<object_store::Error>().is_some_and(is_not_found) =>
            {
                CheckpointError::Corrupt { what: self.url(&key), reason: "missing".into() }
            }
            e => e,
        })?;
        if actual.size != info.size || actual.crc32 != info.crc32 {
            let _ = std::fs::remove_file(to);
            return Err(CheckpointError::Corrupt {
                what: self.url(&key),
                reason: format!(
                    "{} bytes with crc32 {:08x}, the manifest says {} bytes with crc32 {:08x}",
                    actual.size, actual.crc32, info.size, info.crc32
                ),
            });
        }
        Ok(())
    }

    fn list_shared(&self) -> Result<Vec<String>, CheckpointError> {
        let prefix = self.prefix.clone().join("shared");
        let mut names: Vec<String> =
            self.keys_under(&prefix)?.iter().filter_map(|k| k.filename().map(str::to_owned)).collect();
        names.sort();
        Ok(names)
    }

    fn delete_shared(&self, name: &str) -> Result<(), CheckpointError> {
        self.delete_key(&self.shared_key(name))
    }

    fn delete(&self, id: CheckpointId) -> Result<(), CheckpointError> {
        // The manifest goes first: a half-deleted checkpoint is an incomplete one.
        self.delete_key(&self.manifest_key(id))?;
        for key in self.keys_under(&self.checkpoint_prefix(id))? {
            self.delete_key(&key)?;
        }
        let _ = std::fs::remove_dir_all(self.staging.join("fetched").join(checkpoint_name(id)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_split_into_bucket_and_prefix() {
        assert_eq!(parse_location("s3://b/job").unwrap(), ("b".into(), "job".into()));
        assert_eq!(parse_location("s3://b/a/b/").unwrap(), ("b".into(), "a/b".into()));
        assert_eq!(parse_location("s3://b").unwrap(), ("b".into(), String::new()));
        assert_eq!(parse_location("s3://b/").unwrap(), ("b".into(), String::new()));
        assert!(matches!(parse_location("s3:///job"), Err(CheckpointError::Config(_))));
        assert!(matches!(parse_location("/tmp/x"), Err(CheckpointError::Config(_))));
    }
}
