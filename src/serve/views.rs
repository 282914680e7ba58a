//! The registry of named views and their type-erased reads: keys parsed
//! from and values written as JSON.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use highwater_operators::key::{Data, Key};
use highwater_operators::table::{AsOfError, ReadHold, TableReader, Timeline};
use highwater_operators::time::{Diff, Timestamp};
use serde_json::Value;

/// Why a view read failed; each maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// No view has this name.
    #[error("no view is named {0:?}")]
    UnknownView(String),
    /// The key has no value (as of the read's time).
    #[error("view {view:?} has no value for key {key}")]
    NoValue {
        /// The view.
        view: String,
        /// The key, as given.
        key: String,
    },
    /// A key that is not one of the view's.
    #[error("{key:?} is not a key of view {view:?}: {reason}")]
    BadKey {
        /// The view.
        view: String,
        /// The key, as given.
        key: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A query parameter that makes no sense.
    #[error("{0}")]
    BadParameter(String),
    /// The read's time is outside the view's history.
    #[error(transparent)]
    AsOf(#[from] AsOfError),
}

/// A key's change in a view's changelog.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Change {
    /// The event time of the change.
    pub time: Timestamp,
    /// The key.
    pub key: Value,
    /// The value added or retracted.
    pub value: Value,
    /// +1 when the value is added, -1 when it is retracted.
    pub diff: Diff,
}

/// A range or prefix scan of a view.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// The first key (inclusive).
    pub from: Option<String>,
    /// The key to stop before (exclusive).
    pub to: Option<String>,
    /// Only keys (strings) that start with it.
    pub prefix: Option<String>,
    /// At most this many rows.
    pub limit: usize,
}

/// A view's reads, whatever its key and value types.
pub(crate) trait View: Send + Sync {
    fn watermark(&self) -> Timestamp;
    fn earliest(&self) -> Timestamp;
    fn keys_held(&self) -> usize;
    fn example(&self) -> Option<(Value, Value)>;
    fn hold_current(&self) -> ReadHold;
    fn get(&self, name: &str, hold: &ReadHold, key: &str) -> Result<Option<Value>, ViewError>;
    fn scan(&self, name: &str, hold: &ReadHold, scan: &Scan) -> Result<Vec<(Value, Value)>, ViewError>;
    fn changes(&self, from: Timestamp, upto: Timestamp) -> Result<Vec<Change>, ViewError>;
}

/// A key from its text in a URL: JSON (`42`, `[1,"a"]`, `"a"`), or else the
/// text itself as a JSON string (`alice`).
fn parse_key<K: Key>(view: &str, text: &str) -> Result<K, ViewError> {
    serde_json::from_str::<K>(text).or_else(|_| {
        serde_json::from_value::<K>(Value::String(text.to_owned())).map_err(|e| ViewError::BadKey {
            view: view.to_owned(),
            key: text.to_owned(),
            reason: e.to_string(),
        })
    })
}

fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| Value::String(format!("<not JSON: {e}>")))
}

struct TableView<K, V>(TableReader<K, V>);

impl<K, V> View for TableView<K, V>
where
    K: Key + Sync,
    V: Data + PartialEq + Sync,
{
    fn watermark(&self) -> Timestamp {
        self.0.watermark()
    }

    fn earliest(&self) -> Timestamp {
        self.0.earliest()
    }

    fn keys_held(&self) -> usize {
        self.0.keys_held()
    }

    fn example(&self) -> Option<(Value, Value)> {
        self.0.range(.., 1).into_iter().next().map(|(k, v)| (json(&k), json(&v)))
    }

    fn hold_current(&self) -> ReadHold {
        self.0.hold_current()
    }

    fn get(&self, name: &str, hold: &ReadHold, key: &str) -> Result<Option<Value>, ViewError> {
        let key: K = parse_key(name, key)?;
        Ok(self.0.read(hold)?.get(&key).map(|v| json(&v)))
    }

    fn scan(&self, name: &str, hold: &ReadHold, scan: &Scan) -> Result<Vec<(Value, Value)>, ViewError> {
        let bound = |text: &Option<String>, inclusive: bool| -> Result<Bound<K>, ViewError> {
            Ok(match text {
                None => Bound::Unbounded,
                Some(t) if inclusive => Bound::Included(parse_key(name, t)?),
                Some(t) => Bound::Excluded(parse_key(name, t)?),
            })
        };
        let (mut from, to) = (bound(&scan.from, true)?, bound(&scan.to, false)?);
        let read = self.0.read(hold)?;
        let Some(prefix) = &scan.prefix else {
            return Ok(read.range((from, to), scan.limit).into_iter().map(|(k, v)| (json(&k), json(&v))).collect());
        };
        // A prefix scan: the keys from the prefix on that start with it
        // (contiguous, in the keys' order, for string keys).
        let start: K = serde_json::from_value(Value::String(prefix.clone())).map_err(|_| {
            ViewError::BadParameter(format!("prefix scans need string keys, and view {name:?}'s keys are not strings"))
        })?;
        if matches!(&from, Bound::Unbounded) || matches!(&from, Bound::Included(f) if *f < start) {
            from = Bound::Included(start);
        }
        let rows = read.range((from, to), scan.limit);
        Ok(rows
            .into_iter()
            .map(|(k, v)| (json(&k), json(&v)))
            .take_while(|(k, _)| k.as_str().is_some_and(|k| k.starts_with(prefix.as_str())))
            .collect())
    }

    fn changes(&self, from: Timestamp, upto: Timestamp) -> Result<Vec<Change>, ViewError> {
        Ok(self
            .0
            .changes(from, upto)?
            .into_iter()
            .map(|(k, v, time, diff)| Change { time, key: json(&k), value: json(&v), diff })
            .collect())
    }
}

/// The named views of a job, on one [`Timeline`]: what
/// [`serve_views`](super::serve_views) serves over HTTP.
///
/// Make the readers here ([`table`](Self::table)), hand them to the
/// workers, and call [`Table::serve`](highwater_operators::table::Table::serve)
/// with them in the dataflow. Keys and values are written as JSON (serde);
/// keys in URLs are JSON (`42`, `[1,"a"]`) or plain text for string keys.
///
/// ```
/// use highwater::serve::Views;
/// use highwater_operators::table::TableReader;
/// let views = Views::new();
/// let balances: TableReader<u64, i64> = views.table("balances", 0);
/// let names: TableReader<String, String> = views.table("names", 60_000);
/// assert_eq!(views.names(), vec!["balances".to_string(), "names".to_string()]);
/// # drop((balances, names));
/// ```
#[derive(Clone, Default)]
pub struct Views {
    timeline: Timeline,
    views: Arc<RwLock<BTreeMap<String, Arc<dyn View>>>>,
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Views").field("names", &self.names()).finish()
    }
}

impl Views {
    /// No views yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader for a table to be served as the view `name`, keeping
    /// `retain` milliseconds of event-time history for reads as of a past
    /// time (0: none). A view of the same name is replaced.
    pub fn table<K, V>(&self, name: &str, retain: Timestamp) -> TableReader<K, V>
    where
        K: Key + Sync,
        V: Data + PartialEq + Sync,
    {
        let reader = TableReader::on(&self.timeline).retain(retain);
        if let Ok(mut views) = self.views.write() {
            views.insert(name.to_owned(), Arc::new(TableView(reader.clone())));
        }
        reader
    }

    /// The views' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.views.read().map(|v| v.keys().cloned().collect()).unwrap_or_default()
    }

    /// The timeline the views are read on.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    pub(crate) fn view(&self, name: &str) -> Result<Arc<dyn View>, ViewError> {
        self.views.read().ok().and_then(|v| v.get(name).cloned()).ok_or_else(|| ViewError::UnknownView(name.to_owned()))
    }

    pub(crate) fn all(&self) -> Vec<(String, Arc<dyn View>)> {
        self.views.read().map(|v| v.iter().map(|(n, v)| (n.clone(), Arc::clone(v))).collect()).unwrap_or_default()
    }
}
