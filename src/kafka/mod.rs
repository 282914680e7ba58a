//! Kafka (feature `kafka`): a source over topics' partitions with offsets in
//! highwater's checkpoints, an at-least-once sink, a producer, and topic
//! creation.
//!
//! The source ([`KafkaSource`]) is a [`Source`](crate::source::Source) like
//! the others: one partition per Kafka partition, a watermark each, offsets
//! rewound on recovery. It reads `read_committed`. [`StopAt::Latest`] makes
//! it bounded (it reads up to the end offsets it finds when it opens each
//! partition, then ends), so that a job over Kafka can run to completion.
//!
//! rdkafka builds the bundled librdkafka from source: see the `kafka`
//! feature in Cargo.toml for why.

mod config;
mod dead_letters;
mod exactly_once;
mod produce;
mod sink;
mod source;

pub use config::{KafkaConfig, StartFrom, StopAt, DEFAULT_GROUP};
pub use dead_letters::{dead_letter_headers, write_dead_letters};
pub use produce::{create_topic, Producer};
pub use sink::{Encode, EncodeError, JsonEncoder, KafkaSink, KafkaSinkMode, RawEncoder, TextEncoder};
pub use source::{KafkaReader, KafkaSource, Message, MessageDecode, Stamped, WithTimestamp};

/// An error talking to Kafka outside a source (which reports
/// [`SourceError`](crate::source::SourceError)s).
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The client failed.
    #[error("kafka {brokers}: {what}: {source}")]
    Client {
        /// The cluster.
        brokers: String,
        /// What was being done.
        what: String,
        /// librdkafka's error (boxed: it is large).
        #[source]
        source: Box<rdkafka::error::KafkaError>,
    },
    /// A record could not be delivered (after librdkafka's retries).
    #[error("kafka delivery failed: {0}")]
    Delivery(String),
    /// An administrative request failed.
    #[error("kafka: {0}")]
    Admin(String),
    /// Something did not finish in time.
    #[error("kafka: {what}: not done after {after:?}")]
    Timeout {
        /// What was being done.
        what: String,
        /// How long it was given.
        after: std::time::Duration,
    },
}

impl KafkaError {
    pub(crate) fn client(brokers: &str, what: &str, source: rdkafka::error::KafkaError) -> Self {
        KafkaError::Client { brokers: brokers.to_owned(), what: what.to_owned(), source: Box::new(source) }
    }
}
