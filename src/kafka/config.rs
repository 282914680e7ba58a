//! How a Kafka client connects, where a source starts and where it stops.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use serde::{Deserialize, Serialize};

/// The consumer group a source uses when none is given.
pub const DEFAULT_GROUP: &str = "highwater";

/// A Kafka cluster and the client properties to reach it.
///
/// ```
/// use highwater::kafka::KafkaConfig;
/// let config = KafkaConfig::new("127.0.0.1:9092").group("clicks-job").set("client.id", "clicks");
/// assert_eq!(config.brokers, "127.0.0.1:9092");
/// assert_eq!(config.properties["client.id"], "clicks");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: `host:port[,host:port...]`.
    pub brokers: String,
    /// The consumer group (`group.id`): whose committed offsets
    /// [`StartFrom::Group`] starts from.
    pub group: String,
    /// Any other librdkafka property (`security.protocol`, `client.id`,
    /// `queued.max.messages.kbytes`, ...); they override highwater's own
    /// settings.
    pub properties: BTreeMap<String, String>,
    /// How long a metadata or offset request may take before it fails.
    #[serde(with = "highwater_operators::time::duration_text")]
    pub timeout: Duration,
}

impl KafkaConfig {
    /// A cluster reached through `brokers`, in consumer group [`DEFAULT_GROUP`].
    pub fn new(brokers: impl Into<String>) -> Self {
        KafkaConfig {
            brokers: brokers.into(),
            group: DEFAULT_GROUP.to_owned(),
            properties: BTreeMap::new(),
            timeout: Duration::from_secs(10),
        }
    }

    /// This configuration in consumer group `group`.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// This configuration with librdkafka property `key` set to `value`.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// The client configuration: `defaults` (highwater's settings for one
    /// kind of client), then the user's properties over them.
    pub(crate) fn client(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (k, v) in defaults {
            config.set(*k, *v);
        }
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
    }
}

/// Where a source starts reading a partition that no checkpoint has an
/// offset for (a checkpoint's offsets always win: a recovered job rewinds to
/// them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartFrom {
    /// The oldest record the broker keeps (a replay of the whole log).
    #[default]
    Earliest,
    /// The end of the partition: only records produced from now on.
    Latest,
    /// The first record whose timestamp is at or after this time (ms since
    /// the epoch); the end if there is none.
    Timestamp(u64),
    /// The consumer group's committed offsets; [`Earliest`](Self::Earliest)
    /// for partitions the group has none for.
    Group,
}

impl FromStr for StartFrom {
    type Err = String;

    /// `earliest`, `latest`, `group`, or a timestamp in ms since the epoch.
    ///
    /// ```
    /// use highwater::kafka::StartFrom;
    /// assert_eq!("latest".parse(), Ok(StartFrom::Latest));
    /// assert_eq!("1700000000000".parse(), Ok(StartFrom::Timestamp(1_700_000_000_000)));
    /// assert!("yesterday".parse::<StartFrom>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            "group" => Ok(StartFrom::Group),
            _ => s
                .parse()
                .map(StartFrom::Timestamp)
                .map_err(|_| format!("{s:?} is not a start position: earliest, latest, group or a timestamp in ms")),
        }
    }
}

/// Where a source stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopAt {
    /// Never: the source follows its partitions for as long as the job runs.
    #[default]
    Never,
    /// At the end offsets each partition has when the source opens it
    /// (Flink's `setBounded(OffsetsInitializer.latest())`): the job reads
    /// what was there and ends, so that it can be tested and measured to
    /// completion.
    Latest,
}

impl FromStr for StopAt {
    type Err = String;

    /// `latest` (or `never`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "latest" => Ok(StopAt::Latest),
            "never" => Ok(StopAt::Never),
            _ => Err(format!("{s:?} is not a stop position: latest or never")),
        }
    }
}
