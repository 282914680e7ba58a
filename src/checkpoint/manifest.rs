//! The manifest: the file that makes a checkpoint exist, written last.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::CheckpointError;
use crate::operators::checkpoint::{CheckpointId, Schema, StateEncoding};
use crate::operators::{Timestamp, END_OF_TIME};
use crate::source::Offset;

/// The version of the checkpoint format this build writes and reads.
///
/// Version 5: operator state is in the self-describing state encoding
/// (`highwater_operators::checkpoint::codec`), in which every serde type
/// that round-trips restores (`Decimal`, `serde_json::Value`, untagged
/// enums, ...); versions 3 and 4 (postcard) are still read, their entries
/// and database files decoded as postcard ([`Manifest::state_encoding`]).
/// A build that reads only version 4 would misread the entries, so the
/// version changed.
///
/// Version 4: a shard may list database checkpoints
/// ([`ShardInfo::databases`], incremental checkpoints of the RocksDB state
/// backend), whose files are the store's shared files ([`Manifest::shared`]);
/// a build that reads only version 3 would miss that state, so the version
/// changed. Version 3 is still read (it has no database files).
///
/// Version 3: a worker's shard is one file of framed chunks
/// ([`shard`](super::shard)), no longer a RocksDB database. Version 2 added
/// postcard-encoded entries and every operator's state schema
/// ([`Manifest::schemas`]). Older versions are not read.
pub const FORMAT_VERSION: u32 = 5;

/// The oldest version this build reads.
pub const OLDEST_READ_VERSION: u32 = 3;

/// The first line of a manifest file, before its checksum.
pub(crate) const MAGIC: &str = "highwater-checkpoint-manifest";

/// Everything a recovery needs to know about a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the build that wrote it.
    pub format_version: u32,
    /// The checkpoint's number.
    pub id: CheckpointId,
    /// The logical time of the cut ([`END_OF_TIME`] for the final checkpoint).
    pub time: Timestamp,
    /// Identifies the dataflow (its checkpointed operators); a program with a
    /// different dataflow cannot recover from this checkpoint.
    pub fingerprint: String,
    /// Workers of the run that took it.
    pub workers: usize,
    /// Wall-clock time it was committed, ms since the epoch.
    pub created_unix_ms: u64,
    /// Every source's partitions at the cut, by source name.
    pub sources: BTreeMap<String, Vec<PartitionState>>,
    /// Every worker's shard of operator state.
    pub shards: Vec<ShardInfo>,
    /// Sink output pre-committed at this cut, made visible once this manifest exists.
    pub sinks: Vec<SinkPart>,
    /// The schema of every checkpointed operator's state, by operator name
    /// (none listed: the schemas are not known, and not checked).
    #[serde(default)]
    pub schemas: BTreeMap<String, Schema>,
    /// The shared files of the store this checkpoint uses (a state backend's
    /// files, put by this checkpoint or an earlier one; see
    /// [`store`](super::store)): garbage collection keeps every file a kept
    /// checkpoint lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<FileInfo>,
}

impl Manifest {
    /// Whether the checkpoint was taken when every source was exhausted.
    pub fn is_final(&self) -> bool {
        self.time == END_OF_TIME
    }

    /// How the values of its operator state are encoded: postcard before
    /// format 5, the self-describing state encoding since.
    pub fn state_encoding(&self) -> StateEncoding {
        if self.format_version < 5 {
            StateEncoding::Postcard
        } else {
            StateEncoding::Tagged
        }
    }

    /// The manifest as file contents: a header line with a CRC-32 of the JSON body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        let mut out = format!("{MAGIC} v{FORMAT_VERSION} crc32={:08x}\n", crc32fast::hash(&body)).into_bytes();
        out.extend_from_slice(&body);
        out
    }

    /// Parses and checks a manifest file written by [`Manifest::to_bytes`].
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Manifest, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt { what: what.to_owned(), reason };
        let newline = bytes.iter().position(|b| *b == b'\n').ok_or_else(|| corrupt("no header line".into()))?;
        let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| corrupt("header is not UTF-8".into()))?;
        let body = &bytes[newline + 1..];
        let mut words = header.split(' ');
        if words.next() != Some(MAGIC) {
            return Err(corrupt(format!("not a manifest (header {header:?})")));
        }
        let version = words.next().and_then(|v| v.strip_prefix('v')).and_then(|v| v.parse::<u32>().ok());
        if !version.is_some_and(|v| (OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&v)) {
            return Err(CheckpointError::Version { what: what.to_owned(), found: header.to_owned() });
        }
        let crc = words
            .next()
            .and_then(|c| c.strip_prefix("crc32="))
            .and_then(|c| u32::from_str_radix(c, 16).ok())
            .ok_or_else(|| corrupt("no checksum in the header".into()))?;
        let actual = crc32fast::hash(body);
        if actual != crc {
            return Err(corrupt(format!("checksum mismatch (header {crc:08x}, contents {actual:08x})")));
        }
        serde_json::from_slice(body).map_err(|e| corrupt(format!("unreadable body: {e}")))
    }

    /// Bytes of operator state over all shards and the database files they
    /// list (saturating: the sizes are read from the file, which only its
    /// checksum vouches for).
    pub fn state_bytes(&self) -> u64 {
        let shards = self.shards.iter().flat_map(|s| &s.files);
        shards.chain(&self.shared).fold(0, |sum, f| sum.saturating_add(f.size))
    }

    /// Bytes this checkpoint put into the store: its shards and the shared
    /// files it put (not those of earlier checkpoints it references): what an
    /// incremental checkpoint costs.
    pub fn bytes_written(&self) -> u64 {
        let shards = self.shards.iter().flat_map(|s| &s.files);
        let put = self.shared.iter().filter(|f| super::store::shared_file_checkpoint(&f.name) == Some(self.id));
        shards.chain(put).fold(0, |sum, f| sum.saturating_add(f.size))
    }
}

/// One source partition at a cut: where to resume and the watermark it had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The partition's index in its source.
    pub partition: usize,
    /// The offset to resume after (`None`: from the beginning).
    pub offset: Option<Offset>,
    /// The greatest event time the partition had read before the cut.
    pub max_seen: Option<Timestamp>,
    /// The floor its watermark had been raised to by the source's hints.
    pub floor: Timestamp,
    /// Whether the partition was exhausted.
    pub done: bool,
}

/// One worker's shard of operator state: its files (see [`shard`](super::shard)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// The worker that wrote it.
    pub worker: usize,
    /// State entries in it.
    pub entries: u64,
    /// Its files, with sizes and checksums.
    pub files: Vec<FileInfo>,
    /// The database checkpoints of its operators whose keyed states are in
    /// a database (the RocksDB state backend): an incremental checkpoint
    /// holds those states as the database's files, not as entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<DatabaseInfo>,
}

/// An operator's database checkpoint on one worker: its files, kept as the
/// store's shared files (see [`Manifest::shared`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatabaseInfo {
    /// The operator (as in [`Manifest::schemas`]).
    pub operator: String,
    /// The database's identity (RocksDB's `IDENTITY`).
    pub identity: String,
    /// Its files: the name in the database's directory, and the shared
    /// file of the store that holds it.
    pub files: BTreeMap<String, FileInfo>,
}

/// A file of a checkpoint, as the store must give it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Its name within the shard.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// CRC-32 of its contents.
    pub crc32: u32,
}

/// A sink's output for one checkpoint: made durable but invisible before the
/// manifest is written (pre-committed, as `pending`), made visible after it
/// (committed, as `committed`) by the sink's [`SinkCommitter`](super::SinkCommitter).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkPart {
    /// The sink's name.
    pub sink: String,
    /// The kind of sink, e.g. `files` or `postgres`.
    pub kind: String,
    /// Where it commits (an output directory, a table).
    pub target: String,
    /// The pre-committed part (empty if the sink had no output at this checkpoint).
    pub pending: String,
    /// The committed part.
    pub committed: String,
    /// Rows in the part.
    pub rows: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            schemas: BTreeMap::new(),
            id: 7,
            time: 12_000,
            fingerprint: "abc".into(),
            workers: 2,
            created_unix_ms: 1,
            sources: BTreeMap::from([(
                "Nexmark".into(),
                vec![PartitionState { partition: 0, offset: Some(10), max_seen: Some(5), floor: 0, done: false }],
            )]),
            shards: vec![ShardInfo { worker: 0, entries: 3, files: vec![], databases: vec![] }],
            sinks: vec![],
            shared: vec![],
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let m = manifest();
        let bytes = m.to_bytes();
        assert_eq!(Manifest::from_bytes(&bytes, "m").unwrap(), m);
        // Every single flipped byte of the body is caught.
        let body_start = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
        for i in body_start..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert!(Manifest::from_bytes(&bad, "m").is_err(), "flip at {i} went unnoticed");
        }
        assert!(Manifest::from_bytes(&bytes[..bytes.len() / 2], "m").is_err());
        assert!(Manifest::from_bytes(b"", "m").is_err());
    }

    // Found by fuzzing (tests/fuzz/manifest): the sum overflowed.
    #[test]
    fn state_bytes_saturate() {
        let mut m = manifest();
        let file = |size| FileInfo { name: "f".into(), size, crc32: 0 };
        m.shards = vec![
            ShardInfo { worker: 0, entries: 0, files: vec![file(u64::MAX), file(1)], databases: vec![] },
            ShardInfo { worker: 1, entries: 0, files: vec![file(2)], databases: vec![] },
        ];
        assert_eq!(m.state_bytes(), u64::MAX);
        m.shards[0].files[0].size = 5;
        assert_eq!(m.state_bytes(), 8);
    }
}
