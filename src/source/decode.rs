//! Decoding raw records (lines, messages) into typed ones.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;

/// Why a raw record could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Turns the bytes of one raw record into a typed record.
pub trait Decode: Send + Sync + 'static {
    /// The decoded record.
    type Record;
    /// Decodes one record.
    fn decode(&self, bytes: &[u8]) -> Result<Self::Record, DecodeError>;

    /// Decodes one raw record into any number of records (by default exactly
    /// one, with [`decode`](Decode::decode)): a format may carry raw records
    /// that stand for nothing, such as a changelog's tombstones.
    fn decode_into(&self, bytes: &[u8], out: &mut dyn FnMut(Self::Record)) -> Result<(), DecodeError> {
        out(self.decode(bytes)?);
        Ok(())
    }
}

/// Decodes one JSON value per record with serde.
///
/// A line takes a fast path first: a deserializer that reads printable
/// ASCII, strings without escapes and numbers `serde_json` computes exactly,
/// indexing the line's quotes in one SIMD pass (2.2× `serde_json` on the
/// Nexmark lines, BENCHMARKS.md "Decoding"). On anything else — an escape, a
/// long number, an error — the line is decoded by `serde_json`, which decides
/// what is accepted and gives the reason of what is not; the fast path gives
/// the same value as `serde_json` whenever it takes a line.
///
/// ```
/// use highwater::source::{Decode, JsonDecoder};
/// #[derive(serde::Deserialize, Debug, PartialEq)]
/// struct Click { user: u64, time: u64 }
/// let d = JsonDecoder::<Click>::new();
/// assert_eq!(d.decode(br#"{"user":7,"time":12}"#), Ok(Click { user: 7, time: 12 }));
/// assert!(d.decode(br#"{"user":"seven","time":12}"#).unwrap_err().0.contains("invalid type"));
/// ```
pub struct JsonDecoder<T>(PhantomData<fn() -> T>);

impl<T> JsonDecoder<T> {
    /// A decoder for `T`.
    pub fn new() -> Self {
        JsonDecoder(PhantomData)
    }
}

impl<T> Default for JsonDecoder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for JsonDecoder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JsonDecoder<{}>", std::any::type_name::<T>())
    }
}

impl<T: DeserializeOwned + 'static> Decode for JsonDecoder<T> {
    type Record = T;
    fn decode(&self, bytes: &[u8]) -> Result<T, DecodeError> {
        match super::deserializer::from_slice(bytes) {
            Some(value) => Ok(value),
            None => serde_json::from_slice(bytes).map_err(|e| DecodeError(e.to_string())),
        }
    }
}

/// Keeps each raw record's bytes as they are.
///
/// ```
/// use highwater::source::{Decode, RawDecoder};
/// assert_eq!(RawDecoder.decode(b"\x00\x01"), Ok(vec![0, 1]));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct RawDecoder;

impl Decode for RawDecoder {
    type Record = Vec<u8>;
    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
        Ok(bytes.to_vec())
    }
}

/// Takes each raw record as UTF-8 text (a CSV row, a log line); other bytes
/// are an error.
///
/// ```
/// use highwater::source::{Decode, TextDecoder};
/// assert_eq!(TextDecoder.decode(b"1,a"), Ok("1,a".to_owned()));
/// assert!(TextDecoder.decode(b"\xff").is_err());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TextDecoder;

impl Decode for TextDecoder {
    type Record = String;
    fn decode(&self, bytes: &[u8]) -> Result<String, DecodeError> {
        String::from_utf8(bytes.to_vec()).map_err(|e| DecodeError(format!("not UTF-8: {e}")))
    }
}
