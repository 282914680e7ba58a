//! The Kafka sink. At least once: each worker produces its share of a
//! stream's records with the idempotent producer, and flushes at every
//! checkpoint before handing in its share of it. Exactly once: each worker
//! hands in the records below each cut as its part of the checkpoint,
//! which `exactly_once.rs` produces in a Kafka transaction once the
//! checkpoint is written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::key::Data;
use highwater_operators::time::watermark_of;
use highwater_operators::{EventStream, Timestamp, Update};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use super::config::KafkaConfig;
use super::exactly_once::{PartWriter, TransactionalCommitter};
use super::produce::Producer;
use super::KafkaError;
use crate::checkpoint::{Checkpoints, SinkSubmission};
use crate::sink::at_least_once::AtLeastOnce;
pub use crate::sink::{Encode, EncodeError, JsonEncoder, RawEncoder, TextEncoder};
use crate::sink::{SinkError, SinkHandle};

/// How the sink writes a stream that has retractions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KafkaSinkMode {
    /// One Kafka record per inserted record, produced as it arrives. A
    /// retraction cannot be taken back: it is counted in
    /// [`SinkHandle::unapplied_retractions`]. Right for append-only results.
    #[default]
    Append,
    /// The changelog: once the watermark passes a stamp (the watermark the
    /// updates were made at), that stamp's updates are consolidated and
    /// produced in stamp order, each with a header `diff` (`1` for an
    /// insertion, `-1` for a retraction). Checkpoint cuts are taken by
    /// stamps too, so a recovery neither loses nor repeats an update.
    Changelog,
}

type KeyFn<T> = Box<dyn Fn(&T) -> Option<Vec<u8>>>;
type HeadersFn<T> = Box<dyn Fn(&T) -> Vec<(String, Vec<u8>)>>;

/// A Kafka sink: where records go and how they are encoded, keyed and
/// partitioned.
///
/// At least once: every record of the stream reaches the topic, through the
/// idempotent producer (librdkafka's retries never duplicate), but a job
/// that recovers from a checkpoint produces again what it had produced after
/// that checkpoint. With checkpoints, the sink flushes before each
/// checkpoint completes, so that nothing before a checkpoint is lost.
///
/// Exactly once ([`exactly_once`](Self::exactly_once)): Kafka transactions
/// committed with the job's checkpoints, for `read_committed` readers.
///
/// Records are partitioned by their key with librdkafka's partitioner
/// (`partitioner` in [`KafkaConfig::set`]; `consistent_random` by
/// default), round-robin when they have none.
///
/// ```no_run
/// use highwater::kafka::{KafkaConfig, KafkaSink, TextEncoder};
/// use highwater::prelude::*;
/// use timely::dataflow::operators::ToStream;
///
/// timely::execute_directly(|worker| {
///     worker.dataflow::<u64, _, _>(|scope| {
///         let alerts = EventStream::new(vec![("card 7 over limit".to_owned(), 1_000u64, 1i64)].to_stream(scope));
///         KafkaSink::new(KafkaConfig::new("127.0.0.1:9092"), "alerts", TextEncoder)
///             .key(|alert: &String| Some(alert.split(' ').nth(1).unwrap_or("").as_bytes().to_vec()))
///             .write(&alerts, "Alerts")
///             .expect("a producer");
///     });
/// });
/// ```
pub struct KafkaSink<T, E> {
    config: KafkaConfig,
    topic: String,
    encode: E,
    key: Option<KeyFn<T>>,
    headers: Option<HeadersFn<T>>,
    mode: KafkaSinkMode,
    flush_timeout: Duration,
    exactly_once: Option<ExactlyOnce>,
}

/// The settings of an exactly-once sink.
#[derive(Clone, Debug)]
struct ExactlyOnce {
    /// `transactional.id` = `{prefix}-{shard}`.
    prefix: String,
    progress_topic: Option<String>,
}

impl<T, E> std::fmt::Debug for KafkaSink<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("topic", &self.topic).field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl<T: Data, E: Encode<T>> KafkaSink<T, E> {
    /// A sink to `topic`, its values encoded by `encode`, without keys.
    pub fn new(config: KafkaConfig, topic: impl Into<String>, encode: E) -> Self {
        KafkaSink {
            config,
            topic: topic.into(),
            encode,
            key: None,
            headers: None,
            mode: KafkaSinkMode::Append,
            flush_timeout: Duration::from_secs(60),
            exactly_once: None,
        }
    }

    /// Exactly once, in a checkpointed job: the records below each
    /// checkpoint's cut are produced in Kafka transactions committed only
    /// after the checkpoint's manifest is written, one per sink shard (a
    /// worker) with the stable `transactional.id` `{prefix}-{shard}`, each
    /// with a progress record to the progress topic
    /// ([`progress_topic`](Self::progress_topic)). A `read_committed`
    /// consumer of the topic sees every record exactly once, whenever the
    /// job is killed and recovered. The prefix names the job and the sink
    /// (e.g. `fraud-alerts`): two running jobs must not share it.
    ///
    /// Records become visible when their checkpoint commits (latency: up to
    /// the checkpoint interval, plus the commit). Between a checkpoint's
    /// cut and its commit they are held in the checkpoint store (the part
    /// that a recovery produces again if the commit did not happen), so
    /// the store holds up to a checkpoint interval of output per
    /// checkpoint kept. [`write`](Self::write) fails without checkpoints.
    pub fn exactly_once(mut self, transactional_id_prefix: impl Into<String>) -> Self {
        self.exactly_once = Some(ExactlyOnce { prefix: transactional_id_prefix.into(), progress_topic: None });
        self
    }

    /// The topic of an exactly-once sink's progress records (created with
    /// one partition if missing; `{topic}-highwater-progress` by default).
    pub fn progress_topic(mut self, topic: impl Into<String>) -> Self {
        if let Some(eo) = self.exactly_once.as_mut() {
            eo.progress_topic = Some(topic.into());
        }
        self
    }

    /// Each record's key (which picks its partition).
    pub fn key(mut self, key: impl Fn(&T) -> Option<Vec<u8>> + 'static) -> Self {
        self.key = Some(Box::new(key));
        self
    }

    /// Each record's headers.
    pub fn headers(mut self, headers: impl Fn(&T) -> Vec<(String, Vec<u8>)> + 'static) -> Self {
        self.headers = Some(Box::new(headers));
        self
    }

    /// How retractions are written.
    pub fn mode(mut self, mode: KafkaSinkMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a flush (at a checkpoint, at the end) may wait for the
    /// broker before the sink fails (60 s by default).
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = timeout;
        self
    }

    /// Writes `stream` to the topic, on every worker (each produces the
    /// records it has). With checkpoints, each worker's share is flushed
    /// before it hands in its share of a checkpoint.
    ///
    /// # Errors
    /// If the producer cannot be created, or the checkpoints refuse the sink.
    pub fn write(self, stream: &EventStream<'_, T>, name: &str) -> Result<SinkHandle, KafkaError> {
        // Exactly once, the committer produces (in transactions).
        let producer = if self.exactly_once.is_some() { None } else { Some(Producer::new(&self.config)?) };
        let worker = stream.scope().index();
        let checkpoints = Checkpoints::of(&stream.scope());
        match (checkpoints.as_ref(), self.exactly_once.as_ref()) {
            (Some(c), None) => c
                .register_sink(
                    name,
                    worker,
                    Arc::new(AtLeastOnce { kind: "kafka-at-least-once", target: self.topic.clone() }),
                )
                .map_err(|e| KafkaError::Admin(format!("sink {name}: {e}")))?,
            (Some(c), Some(eo)) => {
                let progress =
                    eo.progress_topic.clone().unwrap_or_else(|| format!("{}-highwater-progress", self.topic));
                c.register_shared_sink(name, worker, || {
                    let committer = TransactionalCommitter::new(
                        name,
                        self.config.clone(),
                        &self.topic,
                        &progress,
                        &eo.prefix,
                        c.store(),
                        c.is_first_process(),
                        self.flush_timeout,
                    )
                    .map_err(|e| e.to_string())?;
                    Ok(Arc::new(committer))
                })
                .map_err(|e| KafkaError::Admin(format!("sink {name}: {e}")))?;
            }
            (None, Some(_)) => {
                let needs = crate::checkpoint::CheckpointError::NotConfigured {
                    what: format!("sink {name}: exactly once"),
                    job: crate::job::in_job(stream.scope().worker().config()),
                };
                return Err(KafkaError::Admin(format!("{needs}; or write at least once")));
            }
            (None, None) => {}
        }
        let exactly_once = self.exactly_once.is_some();
        let handle = SinkHandle::default();
        let mut state = SinkState {
            sink: self,
            producer,
            name: name.to_owned(),
            handle: handle.clone(),
            pending: BTreeMap::new(),
            buffer: Vec::new(),
            failed: false,
            parts: exactly_once.then(BTreeMap::new),
        };
        let mut done: Option<CheckpointId> = None;
        let mut finished = false;
        // After a recovery from a cut at `T`, what travels below `T` is the
        // replay of restored state, produced before the crash.
        let replayed_below = checkpoints.as_ref().and_then(|c| c.restored_time()).unwrap_or(0);
        stream.inner.clone().sink(Pipeline, name, move |(input, frontier)| {
            input.for_each_stamp(|at, data| {
                let time = *at.least().expect("highwater messages travel under a capability");
                for batch in data {
                    if time < replayed_below {
                        batch.clear();
                        continue;
                    }
                    if let Err(e) = state.take(batch, time) {
                        state.fail(e);
                    }
                    batch.clear();
                }
            });
            let watermark = watermark_of(frontier);
            if let Err(e) = state.release(watermark) {
                state.fail(e);
            }
            if let Some(c) = checkpoints.as_ref() {
                while let Some(cut) = c.cut_after(done).filter(|cut| cut.time <= watermark) {
                    let part = match state.parts.as_mut() {
                        // Exactly once: the records below the cut are the part.
                        Some(parts) => {
                            let later = parts.split_off(&cut.time);
                            let mut due = PartWriter::default();
                            for (_, records) in std::mem::replace(parts, later) {
                                due.append(records);
                            }
                            (due.rows() > 0).then(|| due.finish(worker as u32))
                        }
                        // At least once: everything below the cut was
                        // produced; make it durable before the checkpoint
                        // that covers it completes.
                        None => {
                            if let Err(e) = state.flush() {
                                state.fail(e);
                            }
                            None
                        }
                    };
                    c.submit_sink(worker, cut, SinkSubmission { sink: state.name.clone(), part });
                    done = Some(cut.id);
                }
            }
            if frontier.is_empty() && !std::mem::replace(&mut finished, true) {
                if let Err(e) = state.flush() {
                    state.fail(e);
                }
            }
        });
        Ok(handle)
    }
}

/// The sink of one worker.
struct SinkState<T, E> {
    sink: KafkaSink<T, E>,
    /// At least once: the worker's producer.
    producer: Option<Producer>,
    name: String,
    handle: SinkHandle,
    /// Changelog mode: updates by the stamp they travel at, until the
    /// watermark passes it.
    pending: BTreeMap<Timestamp, Vec<(T, i64)>>,
    buffer: Vec<u8>,
    failed: bool,
    /// Exactly once: the encoded records by time, until a cut takes them.
    parts: Option<BTreeMap<Timestamp, PartWriter>>,
}

impl<T: Data, E: Encode<T>> SinkState<T, E> {
    fn error(&self, e: impl std::fmt::Display) -> SinkError {
        SinkError::Io {
            what: format!("kafka topic {} (sink {})", self.sink.topic, self.name),
            source: std::io::Error::other(e.to_string()),
        }
    }

    fn fail(&mut self, e: SinkError) {
        if !std::mem::replace(&mut self.failed, true) {
            self.handle.fail(e);
        }
    }

    /// Takes the updates of a batch that travels at `stamp` (the
    /// watermark they were made at, which checkpoint cuts are taken by).
    fn take(&mut self, batch: &mut Vec<Update<T>>, stamp: Timestamp) -> Result<(), SinkError> {
        if self.failed {
            return Ok(());
        }
        match self.sink.mode {
            KafkaSinkMode::Append => {
                for (record, _, diff) in batch.drain(..) {
                    if diff < 0 {
                        self.handle.unapplied_retractions.add(diff.unsigned_abs());
                    }
                    for _ in 0..diff.max(0) {
                        self.produce(&record, stamp)?;
                    }
                }
            }
            KafkaSinkMode::Changelog => {
                for (record, _, diff) in batch.drain(..) {
                    self.pending.entry(stamp).or_default().push((record, diff));
                }
            }
        }
        Ok(())
    }

    /// Changelog mode: produces the updates of the times the watermark passed.
    fn release(&mut self, watermark: Timestamp) -> Result<(), SinkError> {
        if self.failed {
            return Ok(());
        }
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() >= watermark {
                break;
            }
            let time = *entry.key();
            let updates = entry.remove();
            // Records are consolidated by their encoding (`T` need not be `Ord`).
            let mut consolidated: BTreeMap<Vec<u8>, (T, i64)> = BTreeMap::new();
            for (record, diff) in updates {
                let mut bytes = Vec::new();
                self.sink.encode.encode(&record, &mut bytes).map_err(|e| self.error(e))?;
                consolidated.entry(bytes).or_insert((record, 0)).1 += diff;
            }
            for (bytes, (record, diff)) in consolidated {
                if diff != 0 {
                    self.send(&record, &bytes, Some(diff), time)?;
                }
            }
        }
        Ok(())
    }

    fn produce(&mut self, record: &T, time: Timestamp) -> Result<(), SinkError> {
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        let sent = match self.sink.encode.encode(record, &mut buffer) {
            Ok(()) => self.send(record, &buffer, None, time),
            Err(e) => Err(self.error(e)),
        };
        self.buffer = buffer;
        sent
    }

    /// Sends `record` of `time`, encoded as `value` (`diff` copies of it,
    /// with a `diff` header, in changelog mode); exactly once, it is kept
    /// for the part of the checkpoint whose cut passes `time`.
    fn send(&mut self, record: &T, value: &[u8], diff: Option<i64>, time: Timestamp) -> Result<(), SinkError> {
        let key = self.sink.key.as_ref().and_then(|k| k(record));
        let mut headers = self.sink.headers.as_ref().map(|h| h(record)).unwrap_or_default();
        if let Some(diff) = diff {
            headers.push(("diff".to_owned(), diff.signum().to_string().into_bytes()));
        }
        let copies = diff.map_or(1, i64::unsigned_abs);
        if let Some(parts) = self.parts.as_mut() {
            let part = parts.entry(time).or_default();
            for _ in 0..copies {
                part.push(key.as_deref(), value, &headers);
            }
            self.handle.lines.add(copies);
            return Ok(());
        }
        for _ in 0..copies {
            self.producer
                .as_ref()
                .expect("a producer when not exactly once")
                .send_with(&self.sink.topic, None, key.as_deref(), value, &headers)
                .map_err(|e| self.error(e))?;
            self.handle.lines.add(1);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        if self.failed {
            return Ok(());
        }
        match self.producer.as_ref() {
            Some(producer) => producer.flush(self.sink.flush_timeout).map_err(|e| self.error(e)),
            None => Ok(()),
        }
    }
}
