//! MQTT (feature `mqtt`): a source over topic filters and a sink that
//! publishes records, on the `rumqttc` client (MQTT 3.1.1, plain TCP).
//!
//! The source ([`MqttSource`]) is one partition: MQTT has no offsets to
//! rewind to, so recovery rests on the broker instead. The source connects
//! with a persistent session (clean session off) under a stable client id,
//! so that messages published while the job is down are kept for it, and in
//! a checkpointed job it acknowledges QoS 1 messages (PUBACK) only once a
//! checkpoint that covers them has committed (the source's commit step):
//! a job killed at any moment gets every unacknowledged message again from
//! the broker. That is **at least once** end to end: messages handed out
//! after the last committed checkpoint, or acknowledged late, are delivered
//! again. QoS 0 messages are at most once, as MQTT defines them.
//!
//! The broker must let enough QoS 1 messages be in flight unacknowledged
//! for a checkpoint interval: Mosquitto's `max_inflight_messages` (20 by
//! default) bounds how many it sends before the job acknowledges; set it to
//! 0 (no limit) or above the messages a checkpoint interval brings.
//!
//! The sink ([`MqttSink`]) publishes each record to a topic computed from
//! it, with QoS 0 or 1; at QoS 1 it waits at each checkpoint until the
//! broker has acknowledged everything published before it (at least once).
//!
//! Both reconnect by themselves with exponential backoff when the broker
//! goes away; the persistent session resumes the subscription.

mod config;
mod sink;
mod source;

pub use config::MqttConfig;
pub use rumqttc::QoS;
pub use sink::MqttSink;
pub use source::{Arrived, MqttDecode, MqttMessage, MqttReader, MqttSource, WithArrival};

/// An error of the MQTT client outside a source.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    /// The configuration is wrong.
    #[error("mqtt: {0}")]
    Config(String),
    /// The client failed.
    #[error("mqtt {broker}: {what}: {reason}")]
    Client {
        /// `host:port`.
        broker: String,
        /// What was being done.
        what: String,
        /// The client's error.
        reason: String,
    },
}
