//! Producing records to Kafka, and creating topics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};

use super::config::KafkaConfig;
use super::KafkaError;

/// librdkafka settings of highwater's producers (the user's properties go
/// over them): the idempotent producer, so that librdkafka's retries never
/// write a record twice or out of order.
const PRODUCER_DEFAULTS: &[(&str, &str)] = &[("enable.idempotence", "true"), ("linger.ms", "5")];

/// Collects the outcome of deliveries (librdkafka reports them from
/// `poll`).
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    delivered: AtomicU64,
    failed: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, m)) => {
                use rdkafka::message::Message as _;
                let mut failed = self.failed.lock().expect("delivery lock");
                failed.get_or_insert_with(|| format!("{}/{}: {e}", m.topic(), m.partition()));
            }
        }
    }
}

/// A producer that writes records and waits for their delivery: the
/// idempotent producer, so that a retried send never writes twice.
///
/// Delivery failures (after librdkafka's own retries) are errors of the
/// next [`send`](Self::send) or [`flush`](Self::flush): nothing fails
/// silently.
pub struct Producer {
    inner: BaseProducer<Deliveries>,
    brokers: String,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("brokers", &self.brokers).finish()
    }
}

impl Producer {
    /// A producer to the cluster of `config`.
    pub fn new(config: &KafkaConfig) -> Result<Self, KafkaError> {
        let inner = config
            .client(PRODUCER_DEFAULTS)
            .create_with_context(Deliveries::default())
            .map_err(|e| KafkaError::client(&config.brokers, "creating a producer", e))?;
        Ok(Producer { inner, brokers: config.brokers.clone() })
    }

    fn check(&self) -> Result<(), KafkaError> {
        match self.inner.context().failed.lock().expect("delivery lock").take() {
            Some(reason) => Err(KafkaError::Delivery(reason)),
            None => Ok(()),
        }
    }

    /// Sends one record to `topic` (to `partition`, or where the
    /// partitioner puts its key), waiting while librdkafka's queue is full.
    pub fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        payload: &[u8],
    ) -> Result<(), KafkaError> {
        self.send_with(topic, partition, key, payload, &[])
    }

    /// [`send`](Self::send), with headers.
    pub fn send_with(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: &[(String, Vec<u8>)],
    ) -> Result<(), KafkaError> {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(payload);
        if !headers.is_empty() {
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (name, value) in headers {
                owned = owned.insert(Header { key: name, value: Some(value) });
            }
            record = record.headers(owned);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        loop {
            match self.inner.send(record) {
                Ok(()) => break,
                Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.inner.poll(Duration::from_millis(10));
                    self.check()?;
                }
                Err((e, _)) => return Err(KafkaError::client(&self.brokers, &format!("producing to {topic}"), e)),
            }
        }
        self.inner.poll(Duration::ZERO);
        self.check()
    }

    /// A transactional producer with `transactional_id`: its
    /// `init_transactions` fences every older producer with the same id and
    /// aborts the transaction such a producer left open.
    pub fn transactional(config: &KafkaConfig, transactional_id: &str, timeout: Duration) -> Result<Self, KafkaError> {
        let what = format!("creating the transactional producer {transactional_id}");
        let inner: BaseProducer<Deliveries> = config
            .client(PRODUCER_DEFAULTS)
            .set("transactional.id", transactional_id)
            .create_with_context(Deliveries::default())
            .map_err(|e| KafkaError::client(&config.brokers, &what, e))?;
        inner.init_transactions(timeout).map_err(|e| {
            KafkaError::client(&config.brokers, &format!("initializing transactions of {transactional_id}"), e)
        })?;
        Ok(Producer { inner, brokers: config.brokers.clone() })
    }

    /// Begins a transaction (a transactional producer's).
    pub fn begin(&self) -> Result<(), KafkaError> {
        self.inner.begin_transaction().map_err(|e| KafkaError::client(&self.brokers, "beginning a transaction", e))
    }

    /// Commits the open transaction, after delivering its records.
    pub fn commit(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner
            .commit_transaction(timeout)
            .map_err(|e| KafkaError::client(&self.brokers, "committing a transaction", e))?;
        self.check()
    }

    /// Aborts the open transaction.
    pub fn abort(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner
            .abort_transaction(timeout)
            .map_err(|e| KafkaError::client(&self.brokers, "aborting a transaction", e))
    }

    /// How many records the broker has acknowledged so far.
    pub fn delivered(&self) -> u64 {
        self.inner.context().delivered.load(Ordering::Relaxed)
    }

    /// Waits until every record sent is delivered (or `timeout` passes).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner.flush(timeout).map_err(|e| KafkaError::client(&self.brokers, "flushing", e))?;
        self.check()
    }
}

/// Creates `topic` with `partitions` partitions (replication factor 1),
/// unless it exists; then checks that it has at least that many.
pub fn create_topic(config: &KafkaConfig, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let what = format!("creating topic {topic}");
    let admin: AdminClient<DefaultClientContext> =
        config.client(&[]).create().map_err(|e| KafkaError::client(&config.brokers, &what, e))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(config.timeout));
    let results = futures::executor::block_on(admin.create_topics([&new], &options))
        .map_err(|e| KafkaError::client(&config.brokers, &what, e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::Admin(format!("{what}: {code}"))),
        }
    }
    // The topic's metadata reaches every broker shortly after.
    let consumer: BaseConsumer =
        config.client(&[]).create().map_err(|e| KafkaError::client(&config.brokers, &what, e))?;
    let deadline = Instant::now() + config.timeout;
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), config.timeout)
            .map_err(|e| KafkaError::client(&config.brokers, &what, e))?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len() as i32);
        if found >= partitions {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(KafkaError::Admin(format!("{what}: it has {found} partitions, not {partitions}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
