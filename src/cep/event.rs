//! JSON events with a key and an event time, as `highwater cep` reads them.

use highwater_operators::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::FieldPath;
use crate::source::{Decode, DecodeError};

/// A JSON event with its key and its event time.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyedEvent {
    /// The key, as compact JSON text (`"u1"`, `42`, `true`): keys of
    /// different JSON types never collide.
    pub key: String,
    /// Event time, in milliseconds since the epoch.
    pub time: Timestamp,
    /// The event as read.
    pub value: Value,
}

// Between processes, events travel as (key, time, JSON text): binary formats
// cannot decode a `serde_json::Value` (it is self-describing).
impl Serialize for KeyedEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.key, self.time, self.value.to_string()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for KeyedEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (key, time, text) = <(String, Timestamp, String)>::deserialize(d)?;
        let value = serde_json::from_str(&text).map_err(serde::de::Error::custom)?;
        Ok(KeyedEvent { key, time, value })
    }
}

/// Decodes one JSON object per record into a [`KeyedEvent`], taking the key
/// and the event time (whole milliseconds since the epoch) from the given
/// fields. A record without a usable key or time is rejected with the reason
/// (a source turns it into a dead letter).
///
/// ```
/// use highwater::cep::{FieldPath, KeyedEventDecoder};
/// use highwater::source::Decode;
///
/// let d = KeyedEventDecoder::new(FieldPath::parse("user.id").unwrap(), FieldPath::parse("ts").unwrap());
/// let e = d.decode(br#"{"user":{"id":"u1"},"ts":1000,"kind":"view"}"#).unwrap();
/// assert_eq!((e.key.as_str(), e.time), (r#""u1""#, 1000));
/// assert_eq!(
///     d.decode(br#"{"ts":1000}"#).unwrap_err().0,
///     "no key: field user.id is missing or null"
/// );
/// assert_eq!(
///     d.decode(br#"{"user":{"id":7},"ts":"noon"}"#).unwrap_err().0,
///     "invalid event time: field ts is a string; expected whole milliseconds since the epoch"
/// );
/// ```
#[derive(Clone, Debug)]
pub struct KeyedEventDecoder {
    key: FieldPath,
    time: FieldPath,
}

impl KeyedEventDecoder {
    /// A decoder taking the key from `key` and the event time from `time`.
    pub fn new(key: FieldPath, time: FieldPath) -> Self {
        KeyedEventDecoder { key, time }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Decode for KeyedEventDecoder {
    type Record = KeyedEvent;

    fn decode(&self, bytes: &[u8]) -> Result<KeyedEvent, DecodeError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError(format!("invalid JSON: {e}")))?;
        let key = match self.key.get(&value) {
            None | Some(Value::Null) => {
                return Err(DecodeError(format!("no key: field {} is missing or null", self.key)))
            }
            Some(k @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => k.to_string(),
            Some(other) => {
                return Err(DecodeError(format!(
                    "invalid key: field {} is {}; expected a string, a number or a boolean",
                    self.key,
                    kind(other)
                )))
            }
        };
        let time = match self.time.get(&value) {
            None | Some(Value::Null) => {
                return Err(DecodeError(format!("no event time: field {} is missing or null", self.time)))
            }
            Some(Value::Number(n)) => n.as_u64().or_else(|| {
                n.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < u64::MAX as f64).map(|f| f as u64)
            }),
            Some(_) => None,
        };
        let Some(time) = time else {
            let found = self.time.get(&value).map_or("missing", kind);
            let found = if found == "a number" { "not a whole number ≥ 0" } else { found };
            return Err(DecodeError(format!(
                "invalid event time: field {} is {found}; expected whole milliseconds since the epoch",
                self.time
            )));
        };
        Ok(KeyedEvent { key, time, value })
    }
}
