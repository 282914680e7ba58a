//! How an MQTT client connects.

use std::time::Duration;

use rumqttc::MqttOptions;
use serde::{Deserialize, Serialize};

use super::MqttError;

/// An MQTT broker and how to connect to it.
///
/// ```
/// use highwater::mqtt::MqttConfig;
/// let config = MqttConfig::new("127.0.0.1:1883", "sensors-job").unwrap();
/// assert_eq!((config.host.as_str(), config.port), ("127.0.0.1", 1883));
/// assert!(MqttConfig::new("no-port", "x").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MqttConfig {
    /// The broker's host.
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// The client id: stable across runs, so that the broker keeps the
    /// persistent session (subscriptions, unacknowledged and queued
    /// messages) for the job. A sink's workers add `-{worker}`.
    pub client_id: String,
    /// User name and password, if the broker wants them.
    pub credentials: Option<(String, String)>,
    /// The keep-alive interval.
    #[serde(with = "highwater_operators::time::duration_text")]
    pub keep_alive: Duration,
    /// The longest wait between reconnection attempts.
    #[serde(with = "highwater_operators::time::duration_text")]
    pub max_backoff: Duration,
    /// The largest packet accepted or sent, in bytes.
    pub max_packet_size: usize,
}

impl MqttConfig {
    /// The broker at `host:port`, as client `client_id`.
    pub fn new(broker: &str, client_id: impl Into<String>) -> Result<Self, MqttError> {
        let (host, port) = broker
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| MqttError::Config(format!("broker {broker:?}: expected HOST:PORT")))?;
        let client_id = client_id.into();
        if client_id.is_empty() || client_id.len() > 200 {
            return Err(MqttError::Config(format!("client id {client_id:?}: 1 to 200 characters")));
        }
        Ok(MqttConfig {
            host: host.to_owned(),
            port,
            client_id,
            credentials: None,
            keep_alive: Duration::from_secs(30),
            max_backoff: Duration::from_secs(5),
            max_packet_size: 1 << 20,
        })
    }

    /// `host:port`, for messages.
    pub fn broker(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The client's options, as `client_id`, with a persistent session.
    pub(crate) fn options(&self, client_id: &str, manual_acks: bool) -> MqttOptions {
        let mut options = MqttOptions::new(client_id, self.host.clone(), self.port);
        options
            .set_keep_alive(self.keep_alive)
            .set_clean_session(false)
            .set_manual_acks(manual_acks)
            .set_max_packet_size(self.max_packet_size, self.max_packet_size);
        if let Some((user, password)) = &self.credentials {
            options.set_credentials(user.clone(), password.clone());
        }
        options
    }
}
