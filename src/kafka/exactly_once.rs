//! The exactly-once Kafka sink's side of a checkpoint: its pending records
//! as bytes (a part), kept in the checkpoint store, and the committer that
//! produces each part in one Kafka transaction together with a progress
//! record.
//!
//! How a part travels (see [`SinkCommitter`]):
//! 1. at a cut, each worker of the sink hands in the records it holds below
//!    the cut's time, encoded ([`PartWriter`]), as its *shard*'s part;
//! 2. `prepare` (in the worker's process, before the manifest is written)
//!    puts the part into the checkpoint store: durable, not yet visible;
//! 3. `commit` (in the first process, after the manifest) produces the part
//!    with the shard's transactional producer (`transactional.id` =
//!    `{prefix}-{shard}`, stable across runs: the broker keeps a bounded set
//!    of ids), in one transaction with a progress record (key the
//!    transactional id, value the checkpoint id) to the progress topic, and
//!    commits it;
//! 4. a process killed anywhere in between: the recovered job commits the
//!    restored checkpoint's parts again. The shard's new producer fences the
//!    old one and aborts its open transaction (`init_transactions`), then
//!    reads the shard's last committed checkpoint from the progress topic
//!    (`read_committed`): a part committed before is skipped, any other is
//!    produced again from the store's copy. A `read_committed` reader of the
//!    output topic sees every record exactly once, in checkpoint order per
//!    shard.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use highwater_operators::checkpoint::CheckpointId;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::config::KafkaConfig;
use super::produce::{create_topic, Producer};
use super::KafkaError;
use crate::checkpoint::{CheckpointError, CheckpointStore, FileInfo, SinkCommitter, SinkPart};

/// The first bytes of a part.
const MAGIC: &[u8; 4] = b"HWK1";
/// The kind of the sink's parts in manifests.
pub(crate) const KIND: &str = "kafka-exactly-once";
/// Progress records read back at most (the shard's last one is among the
/// latest: at most two checkpoints' worth of shards commit after it).
const PROGRESS_WINDOW: i64 = 100_000;

/// The records of one shard below a cut, encoded: `HWK1`, the shard (u32),
/// then per record the key (i32 length, -1 for none), the value (u32
/// length), the header count (u16) and each header's name (u16 length)
/// and value (u32 length); little-endian.
#[derive(Debug, Default)]
pub(crate) struct PartWriter {
    bytes: Vec<u8>,
    rows: u64,
}

impl PartWriter {
    /// Appends a record.
    pub(crate) fn push(&mut self, key: Option<&[u8]>, value: &[u8], headers: &[(String, Vec<u8>)]) {
        let b = &mut self.bytes;
        match key {
            Some(k) => {
                b.extend_from_slice(&(k.len() as i32).to_le_bytes());
                b.extend_from_slice(k);
            }
            None => b.extend_from_slice(&(-1i32).to_le_bytes()),
        }
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
        b.extend_from_slice(&(headers.len() as u16).to_le_bytes());
        for (name, value) in headers {
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&(value.len() as u32).to_le_bytes());
            b.extend_from_slice(value);
        }
        self.rows += 1;
    }

    /// Records appended so far.
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends another writer's records.
    pub(crate) fn append(&mut self, other: PartWriter) {
        self.bytes.extend_from_slice(&other.bytes);
        self.rows += other.rows;
    }

    /// The part of `shard`: its bytes and record count.
    pub(crate) fn finish(self, shard: u32) -> (Vec<u8>, u64) {
        let mut out = Vec::with_capacity(8 + self.bytes.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&shard.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        (out, self.rows)
    }
}

/// One record of a part.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PartRecord<'a> {
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: &'a [u8],
    pub(crate) headers: Vec<(&'a str, &'a [u8])>,
}

/// Reads `n` bytes at `at`.
fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = at.checked_add(n).filter(|&e| e <= bytes.len()).ok_or_else(|| format!("truncated at byte {at}"))?;
    let out = &bytes[*at..end];
    *at = end;
    Ok(out)
}

fn le<const N: usize>(bytes: &[u8], at: &mut usize) -> Result<[u8; N], String> {
    Ok(take(bytes, at, N)?.try_into().expect("N bytes"))
}

/// The shard of a part.
pub(crate) fn part_shard(bytes: &[u8]) -> Result<u32, String> {
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("not a Kafka sink part (bad magic)".to_owned());
    }
    Ok(u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")))
}

/// The records of a part.
pub(crate) fn part_records(bytes: &[u8]) -> Result<Vec<PartRecord<'_>>, String> {
    part_shard(bytes)?;
    let mut at = 8;
    let mut records = Vec::new();
    while at < bytes.len() {
        let key_len = i32::from_le_bytes(le(bytes, &mut at)?);
        let key = if key_len < 0 { None } else { Some(take(bytes, &mut at, key_len as usize)?) };
        let value_len = u32::from_le_bytes(le(bytes, &mut at)?) as usize;
        let value = take(bytes, &mut at, value_len)?;
        let count = u16::from_le_bytes(le(bytes, &mut at)?);
        let mut headers = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let name_len = u16::from_le_bytes(le(bytes, &mut at)?) as usize;
            let name = std::str::from_utf8(take(bytes, &mut at, name_len)?).map_err(|e| e.to_string())?;
            let value_len = u32::from_le_bytes(le(bytes, &mut at)?) as usize;
            headers.push((name, take(bytes, &mut at, value_len)?));
        }
        records.push(PartRecord { key, value, headers });
    }
    Ok(records)
}

/// Where a prepared part is: the manifest's `pending` field, as JSON.
#[derive(Debug, Serialize, Deserialize)]
struct Pending {
    shard: u32,
    file: FileInfo,
}

/// A shard's transactional producer and what it knows it has committed.
struct Shard {
    producer: Producer,
    committed: CheckpointId,
}

/// Commits an exactly-once Kafka sink's parts (see the module
/// documentation).
pub(crate) struct TransactionalCommitter {
    pub(crate) sink: String,
    pub(crate) config: KafkaConfig,
    pub(crate) topic: String,
    pub(crate) progress_topic: String,
    /// `transactional.id` = `{prefix}-{shard}`.
    pub(crate) prefix: String,
    pub(crate) store: Arc<dyn CheckpointStore>,
    /// Only the first process commits (it writes the manifests).
    pub(crate) commits: bool,
    pub(crate) timeout: Duration,
    shards: Mutex<BTreeMap<u32, Shard>>,
    /// Parts this process prepared, until committed (the store's copy
    /// serves the other processes' parts and recoveries).
    prepared: Mutex<BTreeMap<(CheckpointId, u32), Vec<u8>>>,
    /// The checkpoint the job recovered from (0: none), as
    /// [`abort_after`](SinkCommitter::abort_after) says.
    restored: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TransactionalCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalCommitter")
            .field("sink", &self.sink)
            .field("topic", &self.topic)
            .field("progress_topic", &self.progress_topic)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A file name from a sink's name.
fn file_name(sink: &str, shard: u32) -> String {
    let clean: String = sink.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("kafka-{clean}-{shard}")
}

/// The checkpoint a part was prepared for (`checkpoint ID`).
fn part_checkpoint(part: &SinkPart) -> Option<CheckpointId> {
    part.committed.strip_prefix("checkpoint ")?.parse().ok()
}

impl TransactionalCommitter {
    /// A committer; creates the progress topic if it is missing.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        sink: &str,
        config: KafkaConfig,
        topic: &str,
        progress_topic: &str,
        prefix: &str,
        store: Arc<dyn CheckpointStore>,
        commits: bool,
        timeout: Duration,
    ) -> Result<Self, KafkaError> {
        if commits {
            create_topic(&config, progress_topic, 1)?;
        }
        Ok(TransactionalCommitter {
            sink: sink.to_owned(),
            config,
            topic: topic.to_owned(),
            progress_topic: progress_topic.to_owned(),
            prefix: prefix.to_owned(),
            store,
            commits,
            timeout,
            shards: Mutex::new(BTreeMap::new()),
            prepared: Mutex::new(BTreeMap::new()),
            restored: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Sink { sink: self.sink.clone(), reason: format!("{what}: {e}") }
    }

    fn transactional_id(&self, shard: u32) -> String {
        format!("{}-{shard}", self.prefix)
    }

    /// Reads the progress topic's records from the last
    /// [`PROGRESS_WINDOW`] up to its high watermark, handing each key and
    /// value to `each`. `read_committed` sees the committed records, up to
    /// the first open transaction: it is read after every transaction the
    /// topic names has been fenced, when the end is the high watermark. An
    /// end not reached within the timeout is an error, never a guess (a
    /// stale answer would produce a part again).
    fn read_progress(&self, committed: bool, mut each: impl FnMut(&[u8], &[u8])) -> Result<(), KafkaError> {
        let what = format!("reading {}", self.progress_topic);
        let fail = |e| KafkaError::client(&self.config.brokers, &what, e);
        let isolation = if committed { "read_committed" } else { "read_uncommitted" };
        let consumer: BaseConsumer = self
            .config
            .client(&[
                ("isolation.level", isolation),
                ("enable.auto.commit", "false"),
                ("receive.message.max.bytes", "2147483647"),
            ])
            .set("group.id", &self.config.group)
            .create()
            .map_err(fail)?;
        let (low, high) = consumer.fetch_watermarks(&self.progress_topic, 0, self.config.timeout).map_err(fail)?;
        if high <= low {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.progress_topic, 0, KafkaOffset::Offset(low.max(high - PROGRESS_WINDOW)))
            .map_err(fail)?;
        consumer.assign(&tpl).map_err(fail)?;
        tracing::debug!(topic = %self.progress_topic, isolation, low, high, "reading the progress topic");
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    if let (Some(key), Some(value)) = (m.key(), m.payload()) {
                        each(key, value);
                    }
                    if m.offset() + 1 >= high {
                        tracing::debug!(topic = %self.progress_topic, isolation, "progress topic read");
                        return Ok(());
                    }
                }
                Some(Err(e)) => return Err(fail(e)),
                None => {
                    // The last records may be transaction markers, which a
                    // reader never sees: the position moves past them.
                    let position = consumer.position().ok().and_then(|p| {
                        match p.find_partition(&self.progress_topic, 0)?.offset() {
                            KafkaOffset::Offset(o) => Some(o),
                            _ => None,
                        }
                    });
                    if position.is_some_and(|p| p >= high) {
                        tracing::debug!(topic = %self.progress_topic, isolation, ?position, "progress topic read");
                        return Ok(());
                    }
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(KafkaError::Timeout {
                    what: format!(
                        "{what} ({isolation}) up to offset {high} (a transaction of a producer outside this job \
                         is open?)"
                    ),
                    after: self.timeout,
                });
            }
        }
    }

    /// The shards the progress topic names (its keys `{prefix}-{shard}`,
    /// committed or not).
    fn named_shards(&self) -> Result<Vec<u32>, KafkaError> {
        let mut shards = std::collections::BTreeSet::new();
        let prefix = format!("{}-", self.prefix);
        self.read_progress(false, |key, _| {
            let shard = std::str::from_utf8(key).ok().and_then(|k| k.strip_prefix(&prefix)?.parse::<u32>().ok());
            shards.extend(shard);
        })?;
        Ok(shards.into_iter().collect())
    }

    /// Readies the producer of `shard`, and first of every other shard the
    /// progress topic names that has none yet: each new producer fences its
    /// transactional id and aborts the transaction a killed process left
    /// open (a shard a recovery on fewer workers does not run included:
    /// its open transaction would hide every later commit from
    /// `read_committed` readers). Then reads each shard's last committed
    /// checkpoint.
    fn ready(&self, shards: &mut BTreeMap<u32, Shard>, shard: u32) -> Result<(), CheckpointError> {
        let mut wanted = self.named_shards().map_err(|e| self.error("reading the progress topic", e))?;
        wanted.push(shard);
        let mut fresh = BTreeMap::new();
        for s in wanted {
            if shards.contains_key(&s) || fresh.contains_key(&s) {
                continue;
            }
            let id = self.transactional_id(s);
            let producer = Producer::transactional(&self.config, &id, self.timeout)
                .map_err(|e| self.error("starting a transactional producer", e))?;
            fresh.insert(s, producer);
        }
        let mut committed: BTreeMap<Vec<u8>, CheckpointId> = BTreeMap::new();
        self.read_progress(true, |key, value| {
            if let Some(id) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                committed.insert(key.to_vec(), id);
            }
        })
        .map_err(|e| self.error("reading the progress topic", e))?;
        for (s, producer) in fresh {
            let id = self.transactional_id(s);
            let committed = committed.get(id.as_bytes()).copied().unwrap_or(0);
            tracing::debug!(sink = %self.sink, transactional_id = id, committed, "transactional producer ready");
            let restored = self.restored.load(std::sync::atomic::Ordering::SeqCst);
            if committed > restored {
                // Checkpoint ids are never taken again (see the coordinator's
                // `next_id`), so nothing is skipped; but Kafka cannot take the
                // committed records back.
                tracing::warn!(
                    sink = %self.sink,
                    topic = %self.topic,
                    committed,
                    restored,
                    "checkpoint {committed}'s output was committed to the topic, but the job recovered from \
                     checkpoint {restored} (the newer one is damaged or gone): the input between them is processed \
                     again, and its rows are in the topic twice"
                );
            }
            shards.insert(s, Shard { producer, committed });
        }
        Ok(())
    }

    /// Produces `bytes` (a part of checkpoint `id`) and the progress record
    /// in one transaction of `shard`, unless the shard committed it before.
    fn produce(
        &self,
        shards: &mut BTreeMap<u32, Shard>,
        id: CheckpointId,
        shard: u32,
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
        let transactional_id = self.transactional_id(shard);
        if !shards.contains_key(&shard) {
            self.ready(shards, shard)?;
        }
        let state = shards.get_mut(&shard).expect("readied");
        if state.committed >= id {
            tracing::debug!(sink = %self.sink, transactional_id, id, "part committed before");
            return Ok(());
        }
        let records = part_records(bytes).map_err(|e| CheckpointError::Corrupt {
            what: format!("sink {} part {id}/{shard}", self.sink),
            reason: e,
        })?;
        let result = (|| {
            state.producer.begin()?;
            for r in &records {
                let headers: Vec<(String, Vec<u8>)> =
                    r.headers.iter().map(|(n, v)| ((*n).to_owned(), v.to_vec())).collect();
                state.producer.send_with(&self.topic, None, r.key, r.value, &headers)?;
            }
            state.producer.send(
                &self.progress_topic,
                Some(0),
                Some(transactional_id.as_bytes()),
                id.to_string().as_bytes(),
            )?;
            crate::checkpoint::kill::point("kafka-transaction");
            state.producer.commit(self.timeout)
        })();
        match result {
            Ok(()) => {
                state.committed = id;
                tracing::debug!(sink = %self.sink, transactional_id, id, records = records.len(), "part committed");
                Ok(())
            }
            Err(e) => {
                let _ = state.producer.abort(self.timeout);
                // A new producer (fencing this one) for the next attempt.
                shards.remove(&shard);
                Err(self.error(&format!("committing checkpoint {id}'s part of shard {shard}"), e))
            }
        }
    }
}

impl SinkCommitter for TransactionalCommitter {
    fn prepare(&self, id: CheckpointId, part: Option<(&[u8], u64)>) -> Result<SinkPart, CheckpointError> {
        let mut out = SinkPart {
            sink: String::new(),
            kind: KIND.to_owned(),
            target: self.topic.clone(),
            pending: String::new(),
            committed: format!("checkpoint {id}"),
            rows: 0,
        };
        let Some((bytes, rows)) = part else { return Ok(out) };
        let shard = part_shard(bytes)
            .map_err(|e| CheckpointError::Corrupt { what: format!("sink {} part {id}", self.sink), reason: e })?;
        let file = self.store.put_sink_part(id, &file_name(&self.sink, shard), bytes)?;
        if self.commits {
            self.prepared.lock().unwrap_or_else(|p| p.into_inner()).insert((id, shard), bytes.to_vec());
        }
        out.pending = serde_json::to_string(&Pending { shard, file }).expect("plain data");
        out.rows = rows;
        Ok(out)
    }

    fn commit(&self, part: &SinkPart) -> Result<(), CheckpointError> {
        if !self.commits {
            return Ok(());
        }
        let Some(id) = part_checkpoint(part) else {
            return Err(self.error("committing", format!("part {:?} does not name its checkpoint", part.committed)));
        };
        if part.kind != KIND || part.target != self.topic {
            return Err(self.error(
                &format!("committing checkpoint {id}"),
                format!(
                    "the checkpoint's output went to a {} sink ({}), this sink writes exactly once to topic {}: \
                     recover with the same output, or start afresh",
                    part.kind, part.target, self.topic
                ),
            ));
        }
        if part.pending.is_empty() {
            return Ok(());
        }
        let pending: Pending = serde_json::from_str(&part.pending).map_err(|e| CheckpointError::Corrupt {
            what: format!("sink {} part {id}", self.sink),
            reason: e.to_string(),
        })?;
        let kept = self.prepared.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id, pending.shard));
        let bytes = match kept {
            Some(bytes) => bytes,
            None => self.store.get_sink_part(id, &pending.file)?,
        };
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        self.produce(&mut shards, id, pending.shard, &bytes)
    }

    /// Nothing to undo: a transaction left open by a killed process is
    /// aborted by the shard's next producer, and parts of newer
    /// checkpoints are only ever produced after their manifest. (Output of
    /// a newer checkpoint that was committed and then damaged stays in the
    /// topic: Kafka cannot take records back; the first commit warns.)
    fn abort_after(&self, id: CheckpointId) -> Result<(), CheckpointError> {
        self.restored.store(id, std::sync::atomic::Ordering::SeqCst);
        self.prepared.lock().unwrap_or_else(|p| p.into_inner()).retain(|(part, _), _| *part <= id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_truncation_is_an_error() {
        let mut w = PartWriter::default();
        w.push(Some(b"k1"), b"v1", &[("diff".to_owned(), b"1".to_vec())]);
        w.push(None, b"", &[]);
        let mut other = PartWriter::default();
        other.push(Some(b""), b"v3", &[]);
        w.append(other);
        assert_eq!(w.rows(), 3);
        let (bytes, rows) = w.finish(7);
        assert_eq!((rows, part_shard(&bytes)), (3, Ok(7)));
        let records = part_records(&bytes).unwrap();
        assert_eq!(
            records,
            vec![
                PartRecord { key: Some(b"k1"), value: b"v1", headers: vec![("diff", b"1".as_slice())] },
                PartRecord { key: None, value: b"", headers: vec![] },
                PartRecord { key: Some(b""), value: b"v3", headers: vec![] },
            ]
        );
        for cut in 0..bytes.len() {
            // Every strict prefix fails cleanly, except those ending on a record boundary.
            let _ = part_records(&bytes[..cut]);
        }
        assert!(part_records(&bytes[..bytes.len() - 1]).unwrap_err().contains("truncated"));
        assert!(part_shard(b"nope").is_err());
    }
}
