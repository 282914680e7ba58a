//! Dead letters to a Kafka topic.

use highwater_operators::EventStream;

use super::config::KafkaConfig;
use super::sink::{Encode, EncodeError, KafkaSink};
use super::KafkaError;
use crate::dead_letter::DeadLetter;
use crate::sink::SinkHandle;

/// Writes a dead letter's record as it came (its `raw` text).
#[derive(Clone, Copy, Debug, Default)]
struct RawRecord;

impl Encode<DeadLetter> for RawRecord {
    fn encode(&self, record: &DeadLetter, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.extend_from_slice(record.raw.as_bytes());
        Ok(())
    }
}

/// The headers of a dead letter's Kafka record: `highwater.reason`,
/// `highwater.origin`, `highwater.offset`, and for records of a Kafka
/// source (origin `kafka:topic/partition`) `highwater.topic` and
/// `highwater.partition` (the offset is then the Kafka offset).
pub fn dead_letter_headers(letter: &DeadLetter) -> Vec<(String, Vec<u8>)> {
    let mut headers = vec![
        ("highwater.reason".to_owned(), letter.reason.clone().into_bytes()),
        ("highwater.origin".to_owned(), letter.origin.clone().into_bytes()),
        ("highwater.offset".to_owned(), letter.offset.to_string().into_bytes()),
    ];
    if let Some((topic, partition)) = letter.origin.strip_prefix("kafka:").and_then(|o| o.rsplit_once('/')) {
        headers.push(("highwater.topic".to_owned(), topic.as_bytes().to_vec()));
        headers.push(("highwater.partition".to_owned(), partition.as_bytes().to_vec()));
    }
    headers
}

/// Writes dead letters to `topic`, at least once: each record's value is
/// the rejected record (as text, cut at
/// [`MAX_RAW_BYTES`](crate::dead_letter::MAX_RAW_BYTES)), its key the
/// origin, its headers the reason and where it came from
/// ([`dead_letter_headers`]). The dataflow's dead-letter output is a
/// stream like any other: write it here as well as anywhere else.
///
/// ```no_run
/// use std::sync::Arc;
/// use highwater::kafka::{write_dead_letters, KafkaConfig, KafkaSource};
/// use highwater::prelude::*;
/// # #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
/// # struct Click { user: String, time: u64 }
/// timely::execute_directly(|worker| {
///     worker.dataflow::<u64, _, _>(|scope| {
///         let config = KafkaConfig::new("127.0.0.1:9092");
///         let source = Arc::new(KafkaSource::new(config.clone(), ["clicks"], JsonDecoder::<Click>::new()));
///         let clicks = FromSource::new(source, |c: &Click| c.time).build(scope).unwrap();
///         write_dead_letters(&clicks.dead_letters, config, "clicks-dead-letters", "DeadLetters").unwrap();
///     });
/// });
/// ```
pub fn write_dead_letters(
    dead_letters: &EventStream<'_, DeadLetter>,
    config: KafkaConfig,
    topic: &str,
    name: &str,
) -> Result<SinkHandle, KafkaError> {
    KafkaSink::new(config, topic, RawRecord)
        .key(|letter: &DeadLetter| Some(letter.origin.clone().into_bytes()))
        .headers(dead_letter_headers)
        .write(dead_letters, name)
}
