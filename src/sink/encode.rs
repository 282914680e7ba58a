//! Turning records into the bytes of a message (a Kafka record's value, an
//! MQTT payload).

use serde::Serialize;

/// Why a record could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EncodeError(pub String);

/// Turns a record into the bytes of a message (a Kafka record's value,
/// an MQTT payload).
pub trait Encode<T>: 'static {
    /// Appends the encoded `record` to `out`.
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), EncodeError>;
}

/// Encodes records as JSON (serde).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonEncoder;

impl<T: Serialize> Encode<T> for JsonEncoder {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        serde_json::to_writer(out, record).map_err(|e| EncodeError(e.to_string()))
    }
}

/// Writes records that are already text (a CSV row, a JSON line) as they
/// are.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextEncoder;

impl<T: AsRef<str>> Encode<T> for TextEncoder {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.extend_from_slice(record.as_ref().as_bytes());
        Ok(())
    }
}

/// Writes records that are bytes as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawEncoder;

impl<T: AsRef<[u8]>> Encode<T> for RawEncoder {
    fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.extend_from_slice(record.as_ref());
        Ok(())
    }
}
