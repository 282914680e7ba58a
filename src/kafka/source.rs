//! The Kafka source: one partition of the source per partition of its
//! topics, each read by its own consumer from an offset of its own.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message as _;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::config::{KafkaConfig, StartFrom, StopAt};
use crate::dead_letter::DeadLetter;
use crate::source::{Decode, DecodeError, Offset, PartitionReader, ReadStatus, Source, SourceError};

/// What a decoder sees of one Kafka record.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The record's timestamp (ms since the epoch), if it has one.
    pub timestamp: Option<u64>,
    /// The key, if any.
    pub key: Option<&'a [u8]>,
    /// The value; `None` for a tombstone.
    pub payload: Option<&'a [u8]>,
}

/// Turns Kafka records into typed ones.
///
/// Every [`Decode`] is one: it decodes the record's value (a tombstone, a
/// record without a value, as the JSON `null`, which is how Kafka Connect's
/// JSON converter writes them: Debezium's tombstones decode to nothing).
/// [`WithTimestamp`] adds the record's timestamp, for event time taken from
/// Kafka rather than from the payload.
pub trait MessageDecode: Send + Sync + 'static {
    /// The decoded record.
    type Record: highwater_operators::key::Data;
    /// Decodes one Kafka record into any number of records.
    fn decode_message(&self, message: &Message<'_>, out: &mut dyn FnMut(Self::Record)) -> Result<(), DecodeError>;
}

impl<D: Decode> MessageDecode for D
where
    D::Record: highwater_operators::key::Data,
{
    type Record = D::Record;
    fn decode_message(&self, message: &Message<'_>, out: &mut dyn FnMut(D::Record)) -> Result<(), DecodeError> {
        self.decode_into(message.payload.unwrap_or(b"null"), out)
    }
}

/// A record with the timestamp of the Kafka record it came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Stamped<T> {
    /// The Kafka record's timestamp, ms since the epoch.
    pub time: u64,
    /// The decoded value.
    pub value: T,
}

/// Decodes the value with `D` and keeps the Kafka record's timestamp
/// beside it (records without one are dead letters).
///
/// ```
/// use highwater::kafka::{Message, MessageDecode, Stamped, WithTimestamp};
/// use highwater::source::JsonDecoder;
/// let decode = WithTimestamp(JsonDecoder::<u32>::new());
/// let message = Message { topic: "t", partition: 0, offset: 7, timestamp: Some(1_000), key: None, payload: Some(b"5") };
/// let mut out = Vec::new();
/// decode.decode_message(&message, &mut |r| out.push(r)).unwrap();
/// assert_eq!(out, vec![Stamped { time: 1_000, value: 5 }]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct WithTimestamp<D>(pub D);

impl<D: Decode> MessageDecode for WithTimestamp<D>
where
    D::Record: highwater_operators::key::Data,
{
    type Record = Stamped<D::Record>;
    fn decode_message(&self, message: &Message<'_>, out: &mut dyn FnMut(Self::Record)) -> Result<(), DecodeError> {
        let time = message.timestamp.ok_or_else(|| DecodeError("the record has no timestamp".to_owned()))?;
        self.0.decode_into(message.payload.unwrap_or(b"null"), &mut |value| out(Stamped { time, value }))
    }
}

/// A source over the partitions of Kafka topics.
///
/// A topic that starts with `^` is a pattern (a regular expression, as in
/// librdkafka and Kafka's own clients) matched against the whole name of
/// every topic of the cluster when the source starts (`^payments-.*`);
/// topics created later are read after a restart.
///
/// Each partition of each topic is a partition of the source (named
/// `topic/partition`), spread over the workers of every process like any
/// other source's, with its own watermark; an empty partition goes idle and
/// does not hold the others back. The source's offset for a partition is
/// the Kafka offset of the next record, kept in highwater's checkpoints: a
/// recovered job rewinds every partition to its checkpoint's offset, and
/// [`StartFrom`] only says where to begin without one.
///
/// Records are read `read_committed` (records of aborted or still open
/// transactions are never seen; `isolation.level` overrides it). Each
/// partition has its own consumer, assigned that one partition (no group
/// membership, no rebalances: the job decides who reads what), whose
/// prefetch is bounded (`queued.max.messages.kbytes`, 4 MiB by default): a
/// partition the job does not read, because of flow control or alignment,
/// stops fetching instead of buffering.
///
/// Records that fail to decode become dead letters (origin
/// `kafka:topic/partition`, the Kafka offset).
///
/// In a checkpointed job the consumer group's offsets are committed to
/// Kafka once a checkpoint that covers them has committed (the source's
/// commit step, [`Source::acknowledge`]), never earlier; without
/// checkpoints they are never committed.
///
/// ```no_run
/// use highwater::kafka::{KafkaConfig, KafkaSource, StopAt};
/// use highwater::prelude::*;
/// # #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
/// # struct Click { user: String, time: u64 }
/// let source = KafkaSource::new(KafkaConfig::new("127.0.0.1:9092"), ["clicks"], JsonDecoder::<Click>::new())
///     .stop_at(StopAt::Latest);
/// # let _ = source;
/// ```
pub struct KafkaSource<M> {
    config: KafkaConfig,
    topics: Vec<String>,
    start: StartFrom,
    stop: StopAt,
    decode: Arc<M>,
    partitions: OnceLock<Vec<(String, i32)>>,
    /// The consumer that commits the group's offsets (the commit step).
    committer: Mutex<Option<BaseConsumer>>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

/// librdkafka settings of a source's consumers (the user's properties go
/// over them).
const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("isolation.level", "read_committed"),
    ("enable.partition.eof", "true"),
    ("auto.offset.reset", "earliest"),
    ("queued.max.messages.kbytes", "4096"),
    ("fetch.wait.max.ms", "10"),
    // The largest response librdkafka accepts. Brokers that do not honour
    // the fetch size limits (the test broker answers a fetch with the whole
    // partition from the offset on) would otherwise fail every fetch of a
    // partition larger than the default 100 MB, and the source would
    // retry forever.
    ("receive.message.max.bytes", "2147483647"),
];

impl<M> std::fmt::Debug for KafkaSource<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("brokers", &self.config.brokers)
            .field("topics", &self.topics)
            .field("start", &self.start)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl<M: MessageDecode> KafkaSource<M> {
    /// A source over every partition of `topics`, decoded by `decode`,
    /// from the earliest offsets, never ending.
    pub fn new<S: Into<String>>(config: KafkaConfig, topics: impl IntoIterator<Item = S>, decode: M) -> Self {
        KafkaSource {
            config,
            topics: topics.into_iter().map(Into::into).collect(),
            start: StartFrom::Earliest,
            stop: StopAt::Never,
            decode: Arc::new(decode),
            partitions: OnceLock::new(),
            committer: Mutex::new(None),
            stopped: Arc::default(),
        }
    }

    /// Ends the stream: every reader returns [`ReadStatus::End`] at its
    /// next read (a live job ends, its windows fire, its final checkpoint
    /// is taken).
    pub fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Where to start a partition without a checkpoint's offset.
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Where to stop.
    pub fn stop_at(mut self, stop: StopAt) -> Self {
        self.stop = stop;
        self
    }

    /// The consumer of one partition (or, without one, for metadata).
    fn consumer(&self) -> Result<BaseConsumer, SourceError> {
        self.config
            .client(CONSUMER_DEFAULTS)
            .set("group.id", &self.config.group)
            .create()
            .map_err(|e| SourceError::Config(format!("kafka consumer for {}: {e}", self.config.brokers)))
    }

    fn unavailable(&self, what: &str, e: ClientError) -> SourceError {
        SourceError::Unavailable { what: format!("kafka {} ({what})", self.config.brokers), reason: e.to_string() }
    }

    /// The topics' partitions, from the cluster's metadata (once).
    fn topic_partitions(&self) -> Result<&[(String, i32)], SourceError> {
        if let Some(p) = self.partitions.get() {
            return Ok(p);
        }
        if self.topics.is_empty() {
            return Err(SourceError::Config("a kafka source needs at least one topic".to_owned()));
        }
        let consumer = self.consumer()?;
        let mut topics: Vec<String> = Vec::new();
        for topic in &self.topics {
            if !topic.starts_with('^') {
                topics.push(topic.clone());
                continue;
            }
            // A pattern: every topic of the cluster it matches, whole.
            let pattern = regex::Regex::new(&format!("^(?:{})$", &topic[1..]))
                .map_err(|e| SourceError::Config(format!("kafka topic pattern {topic}: {e}")))?;
            let metadata = consumer
                .fetch_metadata(None, self.config.timeout)
                .map_err(|e| self.unavailable("the cluster's topics", e))?;
            let mut matched: Vec<String> = metadata
                .topics()
                .iter()
                .map(|t| t.name().to_owned())
                .filter(|name| !name.starts_with("__") && pattern.is_match(name))
                .collect();
            if matched.is_empty() {
                return Err(SourceError::Config(format!("kafka topic pattern {topic} matches no topic")));
            }
            matched.sort();
            topics.extend(matched);
        }
        topics.dedup();
        let mut all = Vec::new();
        for topic in &topics {
            let metadata = consumer
                .fetch_metadata(Some(topic.as_str()), self.config.timeout)
                .map_err(|e| self.unavailable(&format!("metadata of topic {topic}"), e))?;
            let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
                return Err(SourceError::Config(format!("kafka topic {topic} does not exist")));
            };
            if let Some(e) = t.error() {
                return Err(SourceError::Config(format!("kafka topic {topic}: {e:?}")));
            }
            if t.partitions().is_empty() {
                return Err(SourceError::Config(format!("kafka topic {topic} has no partitions")));
            }
            let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            ids.sort_unstable();
            all.extend(ids.into_iter().map(|p| (topic.clone(), p)));
        }
        Ok(self.partitions.get_or_init(|| all))
    }

    /// The offset to start partition `partition` of `topic` at, without a
    /// checkpoint's.
    /// `(low, high)` are the partition's first and end offsets.
    fn start_offset(
        &self,
        consumer: &BaseConsumer,
        topic: &str,
        partition: i32,
        (low, high): (i64, i64),
    ) -> Result<i64, SourceError> {
        let timeout = self.config.timeout;
        Ok(match self.start {
            StartFrom::Earliest => low,
            StartFrom::Latest => high,
            StartFrom::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(topic, partition, KafkaOffset::Offset(ms as i64))
                    .map_err(|e| self.unavailable("offsets for a time", e))?;
                let found = consumer
                    .offsets_for_times(tpl, timeout)
                    .map_err(|e| self.unavailable(&format!("offsets of {topic}/{partition} for time {ms}"), e))?;
                match found.find_partition(topic, partition).map(|p| p.offset()) {
                    Some(KafkaOffset::Offset(o)) => o,
                    _ => high,
                }
            }
            StartFrom::Group => {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(topic, partition);
                let committed = consumer
                    .committed_offsets(tpl, timeout)
                    .map_err(|e| self.unavailable(&format!("group {}'s offsets", self.config.group), e))?;
                match committed.find_partition(topic, partition).map(|p| p.offset()) {
                    Some(KafkaOffset::Offset(o)) => o.max(low),
                    _ => low,
                }
            }
        })
    }
}

impl<M: MessageDecode> Source for KafkaSource<M> {
    type Record = M::Record;
    type Reader = KafkaReader<M>;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(self.topic_partitions()?.iter().map(|(t, p)| format!("{t}/{p}")).collect())
    }

    /// Commits the consumer group's offsets for the partitions a committed
    /// checkpoint covers (Flink's `notifyCheckpointComplete`): the group's
    /// lag shows what the job has made durable, never more.
    fn acknowledge(&self, offsets: &[(usize, Offset)]) -> Result<(), SourceError> {
        let partitions = self.topic_partitions()?;
        let mut tpl = TopicPartitionList::new();
        for (index, offset) in offsets {
            let Some((topic, partition)) = partitions.get(*index) else { continue };
            tpl.add_partition_offset(topic, *partition, KafkaOffset::Offset(*offset as i64))
                .map_err(|e| self.unavailable("committing offsets", e))?;
        }
        let mut committer = self.committer.lock().unwrap_or_else(|p| p.into_inner());
        if committer.is_none() {
            *committer = Some(self.consumer()?);
        }
        let consumer = committer.as_ref().expect("created above");
        consumer
            .commit(&tpl, CommitMode::Sync)
            .map_err(|e| self.unavailable(&format!("committing group {}'s offsets", self.config.group), e))
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<KafkaReader<M>, SourceError> {
        let (topic, partition) = self
            .topic_partitions()?
            .get(index)
            .cloned()
            .ok_or_else(|| SourceError::Config(format!("kafka source has no partition {index}")))?;
        let consumer = self.consumer()?;
        // The partition's first and end offsets, when a start or the stop needs them.
        let bounds = if from.is_none() || self.stop == StopAt::Latest {
            Some(
                consumer
                    .fetch_watermarks(&topic, partition, self.config.timeout)
                    .map_err(|e| self.unavailable(&format!("offsets of {topic}/{partition}"), e))?,
            )
        } else {
            None
        };
        let next = match (from, bounds) {
            (Some(o), _) => o as i64,
            (None, Some(bounds)) => self.start_offset(&consumer, &topic, partition, bounds)?,
            (None, None) => unreachable!("fetched above when there is no offset"),
        };
        let end = match (self.stop, bounds) {
            (StopAt::Latest, Some((_, high))) => Some(high),
            _ => None,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, KafkaOffset::Offset(next))
            .map_err(|e| self.unavailable("assignment", e))?;
        consumer.assign(&tpl).map_err(|e| self.unavailable(&format!("assigning {topic}/{partition}"), e))?;
        tracing::debug!(topic, partition, next, ?end, "kafka partition opened");
        Ok(KafkaReader {
            origin: format!("kafka:{topic}/{partition}"),
            c_topic: std::ffi::CString::new(topic.as_str())
                .map_err(|e| SourceError::Config(format!("topic {topic:?}: {e}")))?,
            consumer,
            decode: Arc::clone(&self.decode),
            topic,
            partition,
            next,
            end,
            last_error: None,
            stopped: Arc::clone(&self.stopped),
            bytes: 0,
        })
    }
}

/// Reads one Kafka partition (see [`KafkaSource`]).
pub struct KafkaReader<M> {
    consumer: BaseConsumer,
    decode: Arc<M>,
    topic: String,
    /// The topic, for librdkafka's C interface.
    c_topic: std::ffi::CString,
    partition: i32,
    origin: String,
    /// The offset of the next record.
    next: i64,
    /// Where a bounded source stops.
    end: Option<i64>,
    /// When an error was last logged (client errors repeat while a broker
    /// is down; librdkafka retries by itself).
    last_error: Option<Instant>,
    /// The source was stopped.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    /// Key and payload bytes of the records read.
    bytes: u64,
}

impl<M> std::fmt::Debug for KafkaReader<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaReader").field("partition", &self.origin).field("next", &self.next).finish()
    }
}

impl<M> KafkaReader<M> {
    fn ended(&self) -> bool {
        self.end.is_some_and(|end| self.next >= end)
    }

    /// The consumer's position: the offset it fetches next (past control
    /// records of transactions, which carry offsets but no record).
    fn position(&self) -> Option<i64> {
        let position = self.consumer.position().ok()?;
        match position.find_partition(&self.topic, self.partition)?.offset() {
            KafkaOffset::Offset(o) => Some(o),
            _ => None,
        }
    }

    /// The partition's end offset as the broker last reported it (in a
    /// fetch response; no request is made), if any was.
    fn cached_high_watermark(&self) -> Option<i64> {
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer lives as long as `self.consumer`; the
        // topic is a NUL-terminated string that outlives the call; `low`
        // and `high` are valid for writes. librdkafka only reads its cache.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                self.c_topic.as_ptr(),
                self.partition,
                &mut low,
                &mut high,
            )
        };
        (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
    }

    /// Whether the partition is known to hold records not yet read: a
    /// bounded read before its end, or a live one whose fetch position lies
    /// below the end offset the broker last reported (the position, not the
    /// next record's offset: a transaction's commit marker takes an offset
    /// but is no record).
    fn behind(&self) -> bool {
        if let Some(end) = self.end {
            return self.next < end;
        }
        match (self.cached_high_watermark(), self.position()) {
            (Some(high), Some(position)) => position < high,
            _ => false,
        }
    }

    /// The one partition this reader's consumer is assigned.
    fn assignment(&self) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, self.partition);
        list
    }

    fn log_error(&mut self, e: &ClientError) {
        if self.last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
            tracing::warn!("{}: {e} (retrying)", self.origin);
            self.last_error = Some(Instant::now());
        }
    }
}

impl<M: MessageDecode> PartitionReader for KafkaReader<M> {
    type Record = M::Record;

    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(M::Record),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        if self.ended() || self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(ReadStatus::End);
        }
        let mut read = 0;
        while read < max {
            match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => {
                    let offset = m.offset();
                    if offset < self.next {
                        continue;
                    }
                    self.bytes += (m.key_len() + m.payload_len()) as u64;
                    let message = Message {
                        topic: &self.topic,
                        partition: self.partition,
                        offset,
                        timestamp: m.timestamp().to_millis().and_then(|t| u64::try_from(t).ok()),
                        key: m.key(),
                        payload: m.payload(),
                    };
                    if let Err(e) = self.decode.decode_message(&message, out) {
                        dead.push(DeadLetter::new(&self.origin, offset as u64, e.0, m.payload().unwrap_or_default()));
                    }
                    self.next = offset + 1;
                    read += 1;
                    if self.ended() {
                        break;
                    }
                }
                Some(Err(ClientError::PartitionEOF(_))) => {
                    // At the end of what the partition has now: the position
                    // may be past the last record (a transaction's commit
                    // marker takes an offset).
                    if let Some(p) = self.position() {
                        if self.end.is_some_and(|end| p >= end) {
                            self.next = self.next.max(p);
                        }
                    }
                    break;
                }
                Some(Err(e)) => {
                    self.log_error(&e);
                    break;
                }
            }
        }
        Ok(if read > 0 {
            ReadStatus::Data
        } else if self.ended() {
            ReadStatus::End
        } else if self.behind() {
            ReadStatus::Behind
        } else {
            ReadStatus::Idle
        })
    }

    fn offset(&self) -> Offset {
        self.next as Offset
    }

    fn bytes_read(&self) -> Option<u64> {
        Some(self.bytes)
    }

    /// Pauses fetching: librdkafka drops the records it prefetched and, on
    /// [`resume`](Self::resume), fetches again from the record after the last
    /// one read, so a partition held back by flow control holds nothing.
    fn pause(&mut self) {
        if let Err(e) = self.consumer.pause(&self.assignment()) {
            tracing::warn!("{}: pausing: {e}", self.origin);
        }
    }

    fn resume(&mut self) {
        if let Err(e) = self.consumer.resume(&self.assignment()) {
            tracing::warn!("{}: resuming: {e}", self.origin);
        }
    }
}
