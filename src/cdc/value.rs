//! Typed column values and rows, as change-data-capture sources produce them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A double with a total order (IEEE 754 `totalOrder`), so that rows can be
/// hashed, compared and used as keys.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Float(pub f64);

impl PartialEq for Float {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for Float {}
impl PartialOrd for Float {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Float {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl std::hash::Hash for Float {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// One column value.
///
/// Types map from PostgreSQL as follows: `bool` → `Bool`; `int2`, `int4`,
/// `int8`, `oid` → `Int`; `float4`, `float8` → `Float`; `numeric` → `Numeric`
/// (exact decimal text); `text`, `varchar`, `bpchar`, `name`, `char` → `Text`;
/// `bytea` → `Bytes`; `date` → `Date` (days since 1970-01-01); `timestamp` →
/// `Timestamp` and `timestamptz` → `TimestampTz` (µs since 1970-01-01 UTC);
/// `time` → `Time` (µs since midnight); `uuid` → `Uuid`; `json`, `jsonb` →
/// `Json` (the document's text).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(Float),
    /// An exact decimal, as text (e.g. `"12.50"`, `"NaN"`).
    Numeric(String),
    /// A string.
    Text(String),
    /// Raw bytes.
    Bytes(Vec<u8>),
    /// A date: days since 1970-01-01.
    Date(i32),
    /// A timestamp without time zone: µs since 1970-01-01 00:00.
    Timestamp(i64),
    /// A timestamp with time zone: µs since 1970-01-01 00:00 UTC.
    TimestampTz(i64),
    /// A time of day: µs since midnight.
    Time(i64),
    /// A UUID in its canonical text form.
    Uuid(String),
    /// A JSON document, as text.
    Json(String),
}

impl Value {
    /// The value as JSON: numbers, strings, booleans and null; exact decimals
    /// as strings (a JSON number would lose their scale); bytes as an
    /// array of numbers, dates and times as numbers (as stored), JSON
    /// documents parsed (or as a string if they do not parse).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(f.0).map_or(J::Null, J::Number),
            Value::Text(s) | Value::Uuid(s) | Value::Numeric(s) => J::String(s.clone()),
            Value::Bytes(b) => J::Array(b.iter().map(|x| J::from(*x)).collect()),
            Value::Date(d) => J::from(*d),
            Value::Timestamp(t) | Value::TimestampTz(t) | Value::Time(t) => J::from(*t),
            Value::Json(s) => serde_json::from_str(s).unwrap_or_else(|_| J::String(s.clone())),
        }
    }

    /// The value from JSON, by JSON type: null, booleans, integers (that fit
    /// an `i64`), other numbers as floats, strings as text, arrays and objects
    /// as JSON text.
    pub fn from_json(json: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match json {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => n.as_i64().map_or_else(|| Value::Float(Float(n.as_f64().unwrap_or(f64::NAN))), Value::Int),
            J::String(s) => Value::Text(s.clone()),
            J::Array(_) | J::Object(_) => Value::Json(json.to_string()),
        }
    }

    /// The integer, if this is an `Int`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number as a double, for `Int`, `Float` and `Numeric`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(f.0),
            Value::Numeric(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The string, for `Text`, `Numeric`, `Uuid` and `Json`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) | Value::Numeric(s) | Value::Uuid(s) | Value::Json(s) => Some(s),
            _ => None,
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Text(s) | Value::Numeric(s) | Value::Uuid(s) | Value::Json(s) => f.write_str(s),
            other => write!(f, "{}", other.to_json()),
        }
    }
}

/// A row: column names with their values, in the table's column order.
///
/// Rows are ordered and hashable, so they serve as table keys (the primary
/// key columns of a change) as well as values.
///
/// ```
/// use highwater::cdc::{Row, Value};
/// let row = Row::new(vec![("id", Value::Int(7)), ("name", Value::Text("ann".into()))]);
/// assert_eq!(row.get("id"), Some(&Value::Int(7)));
/// assert_eq!(row.project(&["id"]), Some(Row::new(vec![("id", Value::Int(7))])));
/// assert_eq!(row.to_json().to_string(), r#"{"id":7,"name":"ann"}"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Row {
    /// The columns, in order.
    pub columns: Vec<(Arc<str>, Value)>,
}

impl Row {
    /// A row from `(name, value)` pairs.
    pub fn new<N: Into<Arc<str>>>(columns: Vec<(N, Value)>) -> Self {
        Row { columns: columns.into_iter().map(|(n, v)| (n.into(), v)).collect() }
    }

    /// The value of column `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.columns.iter().find(|(n, _)| &**n == name).map(|(_, v)| v)
    }

    /// The columns `names`, in that order; `None` if one is missing.
    pub fn project(&self, names: &[&str]) -> Option<Row> {
        let columns = names
            .iter()
            .map(|name| self.columns.iter().find(|(n, _)| &**n == *name).cloned())
            .collect::<Option<Vec<_>>>()?;
        Some(Row { columns })
    }

    /// The row as a JSON object, columns in order.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.columns.iter().map(|(n, v)| (n.to_string(), v.to_json())).collect())
    }

    /// A row from a JSON object, with [`Value::from_json`] for each column;
    /// `None` if `json` is not an object.
    pub fn from_json(json: &serde_json::Value) -> Option<Row> {
        let object = json.as_object()?;
        Some(Row { columns: object.iter().map(|(n, v)| (Arc::from(n.as_str()), Value::from_json(v))).collect() })
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_json())
    }
}
