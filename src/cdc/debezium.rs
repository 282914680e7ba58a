//! The Debezium JSON change-event format.
//!
//! A Debezium change event is a JSON object whose `payload` (or the object
//! itself, when the converter's schemas are disabled) holds `op` (`c` create,
//! `u` update, `d` delete, `r` snapshot read), the row's `before` and `after`
//! images, and a `source` block with the database's commit time `ts_ms`, the
//! database, schema and table, and for PostgreSQL the `lsn`. A `null` value is
//! a *tombstone*, which Kafka's log compaction uses after a delete: it stands
//! for no change and is skipped.
//!
//! With a `schema` block, column values are typed by it: integers, floats,
//! booleans, strings, bytes (base64), and Debezium's logical types for dates,
//! times, timestamps, decimals, UUIDs and JSON. Without one, they are typed
//! by their JSON type ([`Value::from_json`]).
//!
//! Event time is `source.ts_ms`, the time the change was committed in the
//! database (the top-level `ts_ms`, when the connector processed it, is used
//! only if the source block has none).
//!
//! ```
//! use highwater::cdc::debezium::DebeziumDecoder;
//! use highwater::cdc::{Op, Value};
//! use highwater::source::Decode;
//!
//! let decoder = DebeziumDecoder::new(["id"]);
//! let event = br#"{"before":null,"after":{"id":1001,"email":"sally@example.com"},
//!     "source":{"ts_ms":1559033904863,"db":"postgres","schema":"inventory","table":"customers","lsn":24023128},
//!     "op":"c","ts_ms":1559033904870}"#;
//! let change = decoder.decode(event).unwrap();
//! assert_eq!(change.op, Op::Insert);
//! assert_eq!(&*change.table, "inventory.customers");
//! assert_eq!(change.key.get("id"), Some(&Value::Int(1001)));
//! assert_eq!(change.time, 1559033904863);
//! assert!(decoder.decode(br#"{"op":"c","after":{"email":"x"},"source":{"ts_ms":1}}"#)
//!     .unwrap_err().0.contains("key column `id`"));
//! ```

use std::sync::Arc;

use base64::Engine;
use serde_json::{Map, Value as Json};

use super::{Change, Float, Op, Row, Value};
use crate::source::{Decode, DecodeError};

/// Decodes Debezium JSON change events into [`Change`]s keyed by the given
/// primary-key columns.
#[derive(Clone, Debug)]
pub struct DebeziumDecoder {
    key: Vec<String>,
}

impl DebeziumDecoder {
    /// A decoder whose changes are keyed by `key_columns` (the table's
    /// primary key, as in the Kafka message key Debezium writes).
    pub fn new<S: Into<String>>(key_columns: impl IntoIterator<Item = S>) -> Self {
        DebeziumDecoder { key: key_columns.into_iter().map(Into::into).collect() }
    }

    /// The key columns.
    pub fn key_columns(&self) -> &[String] {
        &self.key
    }

    /// The key of `row`, or an error naming the missing column.
    fn key_of(&self, row: &Row, image: &str) -> Result<Row, DecodeError> {
        let names: Vec<&str> = self.key.iter().map(String::as_str).collect();
        row.project(&names).ok_or_else(|| {
            let missing = names.iter().find(|n| row.get(n).is_none()).copied().unwrap_or_default();
            err(format!("key column `{missing}` missing from `{image}`"))
        })
    }

    /// Decodes a parsed event; `None` for a tombstone.
    pub fn decode_json(&self, event: &Json) -> Result<Option<Change>, DecodeError> {
        let (payload, schema) = match event {
            Json::Null => return Ok(None),
            Json::Object(o) if o.contains_key("payload") && o.contains_key("schema") => {
                (&o["payload"], Some(&o["schema"]))
            }
            Json::Object(_) => (event, None),
            _ => return Err(err("a Debezium event is a JSON object (or null for a tombstone)")),
        };
        let payload = match payload {
            Json::Null => return Ok(None),
            Json::Object(p) => p,
            _ => return Err(err("`payload` must be an object")),
        };
        let op = match payload.get("op").and_then(Json::as_str) {
            Some("c") => Op::Insert,
            Some("u") => Op::Update,
            Some("d") => Op::Delete,
            Some("r") => Op::Read,
            Some("t") => return Err(err("`op` t (truncate) is not a row change; truncate the table's sink by hand")),
            Some("m") => return Err(err("`op` m (logical decoding message) is not a row change")),
            Some(other) => return Err(err(format!("unknown `op` {other:?}; expected c, u, d or r"))),
            None => return Err(err("missing `op`")),
        };
        let fields = |image: &str| -> Option<&Vec<Json>> {
            let fields = schema?.get("fields")?.as_array()?;
            let image = fields.iter().find(|f| f.get("field").and_then(Json::as_str) == Some(image))?;
            image.get("fields")?.as_array()
        };
        let image = |name: &str| -> Result<Option<Row>, DecodeError> {
            match payload.get(name) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::Object(columns)) => row(columns, fields(name)).map(Some),
                Some(_) => Err(err(format!("`{name}` must be an object or null"))),
            }
        };
        let before = image("before")?;
        let after = image("after")?;
        let source = payload.get("source").and_then(Json::as_object);
        let time = source
            .and_then(|s| s.get("ts_ms"))
            .or_else(|| payload.get("ts_ms"))
            .and_then(Json::as_u64)
            .ok_or_else(|| err("missing `source.ts_ms` (the commit time, used as event time)"))?;
        let key = match op {
            Op::Delete => {
                let before = before.as_ref().ok_or_else(|| err("a delete (`op` d) needs `before`"))?;
                self.key_of(before, "before")?
            }
            _ => {
                let after = after.as_ref().ok_or_else(|| err(format!("`op` {op:?} needs `after`")))?;
                self.key_of(after, "after")?
            }
        };
        let text = |k: &str| source.and_then(|s| s.get(k)).and_then(Json::as_str);
        let table: Arc<str> = match (text("schema").or(text("db")), text("table")) {
            (Some(ns), Some(t)) => format!("{ns}.{t}").into(),
            (None, Some(t)) => t.into(),
            _ => "".into(),
        };
        let lsn = source.and_then(|s| s.get("lsn")).and_then(Json::as_u64).unwrap_or(0);
        Ok(Some(Change { table, op, key, before, after, time, lsn }))
    }
}

fn err(message: impl Into<String>) -> DecodeError {
    DecodeError(message.into())
}

/// A row image, typed by its field schemas when there are some.
fn row(columns: &Map<String, Json>, schema: Option<&Vec<Json>>) -> Result<Row, DecodeError> {
    let mut out = Vec::with_capacity(columns.len());
    for (name, json) in columns {
        let field =
            schema.and_then(|fields| fields.iter().find(|f| f.get("field").and_then(Json::as_str) == Some(name)));
        let value = match field {
            Some(field) => typed(json, field).map_err(|e| err(format!("column `{name}`: {}", e.0)))?,
            None => Value::from_json(json),
        };
        out.push((Arc::from(name.as_str()), value));
    }
    Ok(Row { columns: out })
}

/// A value typed by its Kafka Connect field schema.
fn typed(json: &Json, field: &Json) -> Result<Value, DecodeError> {
    if json.is_null() {
        return Ok(Value::Null);
    }
    let kind = field.get("type").and_then(Json::as_str).unwrap_or("");
    let name = field.get("name").and_then(Json::as_str).unwrap_or("");
    let int = || json.as_i64().ok_or_else(|| err(format!("expected an integer ({kind}), found {json}")));
    let string = || json.as_str().ok_or_else(|| err(format!("expected a string ({kind}), found {json}")));
    Ok(match (kind, name) {
        (_, "io.debezium.time.Date") => Value::Date(i32::try_from(int()?).map_err(|_| err("date out of range"))?),
        (_, "io.debezium.time.Timestamp") => Value::Timestamp(int()?.saturating_mul(1_000)),
        (_, "io.debezium.time.MicroTimestamp") => Value::Timestamp(int()?),
        (_, "io.debezium.time.NanoTimestamp") => Value::Timestamp(int()? / 1_000),
        (_, "io.debezium.time.Time") => Value::Time(int()?.saturating_mul(1_000)),
        (_, "io.debezium.time.MicroTime") => Value::Time(int()?),
        (_, "io.debezium.time.NanoTime") => Value::Time(int()? / 1_000),
        (_, "io.debezium.data.Uuid") => Value::Uuid(string()?.to_owned()),
        (_, "io.debezium.data.Json") => Value::Json(string()?.to_owned()),
        (_, "org.apache.kafka.connect.data.Decimal") => {
            let scale = match field.get("parameters").and_then(|p| p.get("scale")) {
                None => 0,
                Some(s) => s
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    .or_else(|| s.as_u64())
                    .ok_or_else(|| err(format!("decimal scale {s} is not a whole number")))?,
            };
            Value::Numeric(decimal(&base64_bytes(string()?)?, scale)?)
        }
        (_, "io.debezium.data.VariableScaleDecimal") => {
            let scale = json.get("scale").and_then(Json::as_u64).ok_or_else(|| err("missing `scale`"))?;
            let value = json.get("value").and_then(Json::as_str).ok_or_else(|| err("missing `value`"))?;
            Value::Numeric(decimal(&base64_bytes(value)?, scale)?)
        }
        ("int8" | "int16" | "int32" | "int64", _) => Value::Int(int()?),
        ("float" | "float32" | "float64" | "double", _) => {
            Value::Float(Float(json.as_f64().ok_or_else(|| err(format!("expected a number ({kind}), found {json}")))?))
        }
        ("boolean", _) => Value::Bool(json.as_bool().ok_or_else(|| err(format!("expected a boolean, found {json}")))?),
        ("string", _) => Value::Text(string()?.to_owned()),
        ("bytes", _) => Value::Bytes(base64_bytes(string()?)?),
        _ => Value::from_json(json),
    })
}

fn base64_bytes(text: &str) -> Result<Vec<u8>, DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| err(format!("bad base64: {e}")))
}

/// A big-endian two's-complement unscaled integer with `scale` decimal digits, as text.
fn decimal(bytes: &[u8], scale: u64) -> Result<String, DecodeError> {
    if scale > 1_000 {
        return Err(err(format!("decimal scale {scale} is out of range (at most 1000)")));
    }
    if bytes.len() > 16 {
        return Err(err("decimal wider than 128 bits"));
    }
    let mut unscaled: i128 = if bytes.first().is_some_and(|b| b & 0x80 != 0) { -1 } else { 0 };
    for b in bytes {
        unscaled = (unscaled << 8) | i128::from(*b);
    }
    let digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let sign = if unscaled < 0 { "-" } else { "" };
    if scale == 0 {
        return Ok(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    Ok(format!("{sign}{int}.{frac}"))
}

impl Decode for DebeziumDecoder {
    type Record = Change;

    /// Decodes one event; a tombstone is an error here (use
    /// [`decode_into`](Decode::decode_into), which skips it).
    fn decode(&self, bytes: &[u8]) -> Result<Change, DecodeError> {
        let mut out = None;
        self.decode_into(bytes, &mut |c| out = Some(c))?;
        out.ok_or_else(|| err("a tombstone (null value) carries no change"))
    }

    fn decode_into(&self, bytes: &[u8], out: &mut dyn FnMut(Change)) -> Result<(), DecodeError> {
        let json: Json = serde_json::from_slice(bytes).map_err(|e| err(e.to_string()))?;
        if let Some(change) = self.decode_json(&json)? {
            out(change);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_keep_their_scale_and_sign() {
        assert_eq!(decimal(&[0x04, 0xD2], 2).unwrap(), "12.34");
        assert_eq!(decimal(&[0xFB, 0x2E], 2).unwrap(), "-12.34");
        assert_eq!(decimal(&[0x05], 3).unwrap(), "0.005");
        assert_eq!(decimal(&[0x07], 0).unwrap(), "7");
        assert_eq!(decimal(&[], 0).unwrap(), "0");
        assert!(decimal(&[1], 4_000_000_000).unwrap_err().0.contains("out of range"));
        // A scale past u32 was truncated (2^32 + 2 read as 2), one that did not parse read as 0.
        assert!(decimal(&[1], (1 << 32) + 2).unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn decimal_scales_that_are_not_whole_numbers_are_errors() {
        let d = DebeziumDecoder::new(["id"]);
        let event = |parameters: &str, value: &str| {
            format!(
                r#"{{"schema":{{"fields":[{{"field":"after","fields":[{{"field":"n","type":"bytes",
                "name":"org.apache.kafka.connect.data.Decimal"{parameters}}}]}}]}},
                "payload":{{"op":"c","after":{{"id":1,"n":{value}}},"source":{{"ts_ms":1}}}}}}"#
            )
        };
        let n = |parameters: &str, value: &str| {
            d.decode(event(parameters, value).as_bytes()).map(|c| c.after.unwrap().get("n").cloned().unwrap())
        };
        assert_eq!(n(r#","parameters":{"scale":"2"}"#, r#""BNI=""#), Ok(Value::Numeric("12.34".into())));
        assert_eq!(n(r#","parameters":{"scale":2}"#, r#""BNI=""#), Ok(Value::Numeric("12.34".into())));
        assert_eq!(n("", r#""BNI=""#), Ok(Value::Numeric("1234".into())));
        assert!(n(r#","parameters":{"scale":"two"}"#, r#""BNI=""#).unwrap_err().0.contains("not a whole number"));
        assert!(n(r#","parameters":{"scale":4294967298}"#, r#""BNI=""#).unwrap_err().0.contains("out of range"));
        let variable = |scale: &str| {
            n(r#","name":"io.debezium.data.VariableScaleDecimal""#, &format!(r#"{{"scale":{scale},"value":"BNI="}}"#))
        };
        assert!(variable("4294967298").unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn tombstones_decode_to_nothing() {
        let d = DebeziumDecoder::new(["id"]);
        let mut n = 0;
        d.decode_into(b"null", &mut |_| n += 1).unwrap();
        d.decode_into(br#"{"schema":null,"payload":null}"#, &mut |_| n += 1).unwrap();
        assert_eq!(n, 0);
        assert!(d.decode(b"null").is_err());
    }
}
