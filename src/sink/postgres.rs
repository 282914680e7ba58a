//! Exactly-once output to a PostgreSQL table, upserted by key once per checkpoint.
//!
//! The sink's rows (CSV lines, as the queries write them) go to worker 0,
//! which sets aside, at every checkpoint cut, the rows below the cut as the
//! checkpoint's *part*. The [`PostgresCommitter`] pre-commits the part by
//! storing it in a staging table (`highwater_sink_pending`) before the
//! checkpoint's manifest is written, and commits it after: in one
//! transaction it applies the part to the target table (upserts by key for
//! inserted rows, deletes by key for retracted ones), records the checkpoint
//! in `highwater_sink_progress` and drops the staged part. A commit that
//! finds the progress at or beyond its checkpoint does nothing, so commits
//! replayed by a recovery are no-ops; readers of the table see each
//! checkpoint's output all at once or not at all, and never twice.
//!
//! The bookkeeping tables live in the target table's schema (the first
//! schema of the `search_path` when the table name is not qualified); a
//! sink's rows in them are keyed by `{sink name}:{table}` (e.g.
//! `Output:nexmark_q5`): two jobs must not write the same table under the
//! same sink name.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::time::watermark_of;
use highwater_operators::{EventStream, Timestamp, Update};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Transaction};
use serde::Deserialize;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;

use super::SinkHandle;
use crate::checkpoint::{CheckpointError, Checkpoints, SinkCommitter, SinkPart, SinkSubmission};

/// The staging table of pre-committed parts.
const PENDING_TABLE: &str = "highwater_sink_pending";
/// The table of the last checkpoint each sink committed.
const PROGRESS_TABLE: &str = "highwater_sink_progress";
/// Rows per statement when a part is applied.
const CHUNK: usize = 5_000;
/// Malformed lines recorded one by one in the sink's handle; later ones are only counted.
const REPORTED_BAD_LINES: u64 = 10;
/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1 bytes); longer ones are truncated.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// Where and how [`write_postgres`] writes: a table with one `text` column
/// per field of the stream's CSV lines, keyed by some of them.
///
/// Names are plain SQL identifiers (`[A-Za-z_][A-Za-z0-9_$]*`, folded to
/// lower case as PostgreSQL does) or double-quoted ones (`"Mixed Case"`, with
/// `""` for a quote inside). The table may be qualified by its schema
/// (`schema.table`).
#[derive(Clone, Deserialize)]
pub struct PostgresSinkConfig {
    /// A libpq connection string (`host=… port=… user=… dbname=…`) or URL
    /// (`postgresql://user@host:port/db`). Connections are made without TLS.
    pub conninfo: String,
    /// The target table, created if it does not exist.
    pub table: String,
    /// The table's columns, one per field of a line, in order.
    pub columns: Vec<String>,
    /// The columns of the primary key: a non-empty subset of `columns`.
    pub key: Vec<String>,
}

impl std::fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSinkConfig")
            .field("conninfo", &redact_password(&self.conninfo))
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("key", &self.key)
            .finish()
    }
}

/// What is wrong with a [`PostgresSinkConfig`], or why the sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum PostgresSinkError {
    /// A table or column name is not a valid identifier.
    #[error("postgres sink: `{field}`: {name:?} is not a valid identifier: {reason}")]
    Identifier {
        /// The configuration field (`table`, `columns`, `key`).
        field: &'static str,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A list of names is empty.
    #[error("postgres sink: `{field}` must name at least one column")]
    Empty {
        /// The configuration field (`columns`, `key`).
        field: &'static str,
    },
    /// A name appears twice in a list.
    #[error("postgres sink: `{field}` names column {name:?} twice")]
    Duplicate {
        /// The configuration field (`columns`, `key`).
        field: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A key column is not one of the columns.
    #[error("postgres sink: `key`: {name:?} is not one of the `columns` ({columns})")]
    KeyNotInColumns {
        /// The key column.
        name: String,
        /// The columns, comma-separated.
        columns: String,
    },
    /// The connection string does not parse.
    #[error("postgres sink: `conninfo`: {reason}")]
    Conninfo {
        /// The parser's message.
        reason: String,
    },
    /// Connecting, creating the tables or recovering the sink failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// A malformed CSV line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed CSV at byte {at}: {reason}")]
pub struct CsvLineError {
    /// The byte offset of the problem in the line.
    pub at: usize,
    /// What is wrong.
    pub reason: &'static str,
}

/// Splits one CSV line, as [`csv_field`](super::csv_field) writes them, into
/// its fields: separated by commas; a field starting with `"` is quoted,
/// ends at the next lone `"`, and holds `""` for a quote (and may hold commas,
/// CR and LF). An unterminated quoted field, anything but a comma or the end
/// after a quoted field, or a quote inside an unquoted field is an error.
///
/// ```
/// use highwater::sink::parse_csv_line;
/// assert_eq!(parse_csv_line(r#"1,"a, ""b""",,x"#).unwrap(), ["1", r#"a, "b""#, "", "x"]);
/// assert!(parse_csv_line(r#"1,"open"#).is_err());
/// ```
pub fn parse_csv_line(line: &str) -> Result<Vec<String>, CsvLineError> {
    let bytes = line.as_bytes();
    let mut fields = Vec::new();
    let mut i = 0;
    loop {
        if bytes.get(i) == Some(&b'"') {
            let opening = i;
            let mut field = String::new();
            i += 1;
            loop {
                let Some(p) = memchr::memchr(b'"', &bytes[i..]) else {
                    return Err(CsvLineError { at: opening, reason: "a quoted field is not closed" });
                };
                field.push_str(&line[i..i + p]);
                i += p + 1;
                if bytes.get(i) == Some(&b'"') {
                    field.push('"');
                    i += 1;
                } else {
                    break;
                }
            }
            fields.push(field);
            match bytes.get(i) {
                None => return Ok(fields),
                Some(b',') => i += 1,
                Some(_) => {
                    return Err(CsvLineError {
                        at: i,
                        reason: "a quoted field must be followed by a comma or the end of the line",
                    })
                }
            }
        } else {
            let end = memchr::memchr(b',', &bytes[i..]).map_or(bytes.len(), |p| i + p);
            let field = &line[i..end];
            if let Some(q) = field.find('"') {
                return Err(CsvLineError { at: i + q, reason: "a quote inside an unquoted field" });
            }
            fields.push(field.to_owned());
            if end == bytes.len() {
                return Ok(fields);
            }
            i = end + 1;
        }
    }
}

/// An SQL identifier: its name as the catalog stores it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Ident(String);

impl Ident {
    /// Parses one identifier at the start of `text`; returns it and the rest.
    fn parse_prefix<'t>(
        field: &'static str,
        whole: &str,
        text: &'t str,
    ) -> Result<(Ident, &'t str), PostgresSinkError> {
        let bad =
            |reason: &str| PostgresSinkError::Identifier { field, name: whole.to_owned(), reason: reason.to_owned() };
        let (name, rest) = if let Some(quoted) = text.strip_prefix('"') {
            let mut name = String::new();
            let mut rest = quoted;
            loop {
                let Some(p) = rest.find('"') else { return Err(bad("the quoted name is not closed")) };
                name.push_str(&rest[..p]);
                rest = &rest[p + 1..];
                match rest.strip_prefix('"') {
                    Some(after) => {
                        name.push('"');
                        rest = after;
                    }
                    None => break,
                }
            }
            if name.is_empty() {
                return Err(bad("a quoted name must not be empty"));
            }
            if name.contains('\0') {
                return Err(bad("a name must not contain NUL"));
            }
            (name, rest)
        } else {
            let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$')).unwrap_or(text.len());
            let name = &text[..end];
            match name.chars().next() {
                None => {
                    return Err(bad(
                        "expected a plain name ([A-Za-z_][A-Za-z0-9_$]*) or a double-quoted one (\"Name\")",
                    ))
                }
                Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
                    return Err(bad("a plain name starts with a letter or an underscore"))
                }
                _ => {}
            }
            (name.to_ascii_lowercase(), &text[end..])
        };
        if name.len() > MAX_IDENTIFIER_BYTES {
            return Err(bad("longer than 63 bytes (PostgreSQL would truncate it)"));
        }
        Ok((Ident(name), rest))
    }

    /// Parses a whole identifier.
    fn parse(field: &'static str, text: &str) -> Result<Ident, PostgresSinkError> {
        let (ident, rest) = Ident::parse_prefix(field, text, text)?;
        if !rest.is_empty() {
            return Err(PostgresSinkError::Identifier {
                field,
                name: text.to_owned(),
                reason: format!("unexpected {rest:?} after the name (quote names with other characters)"),
            });
        }
        Ok(ident)
    }

    /// The identifier quoted for SQL.
    fn sql(&self) -> String {
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }
}

/// A table name, optionally qualified by its schema.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TableName {
    schema: Option<Ident>,
    name: Ident,
}

impl TableName {
    fn parse(text: &str) -> Result<TableName, PostgresSinkError> {
        let (first, rest) = Ident::parse_prefix("table", text, text)?;
        if rest.is_empty() {
            return Ok(TableName { schema: None, name: first });
        }
        let Some(rest) = rest.strip_prefix('.') else {
            return Err(PostgresSinkError::Identifier {
                field: "table",
                name: text.to_owned(),
                reason: format!("unexpected {rest:?} after the name (expected `table` or `schema.table`)"),
            });
        };
        let name = Ident::parse("table", rest).map_err(|e| match e {
            PostgresSinkError::Identifier { reason, .. } => {
                PostgresSinkError::Identifier { field: "table", name: text.to_owned(), reason }
            }
            other => other,
        })?;
        Ok(TableName { schema: Some(first), name })
    }

    /// A table of the same schema.
    fn sibling(&self, name: &str) -> TableName {
        TableName { schema: self.schema.clone(), name: Ident(name.to_owned()) }
    }

    /// The name quoted for SQL.
    fn sql(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", schema.sql(), self.name.sql()),
            None => self.name.sql(),
        }
    }

    /// The name for people (unquoted).
    fn display(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", schema.0, self.name.0),
            None => self.name.0.clone(),
        }
    }
}

/// A checked configuration.
#[derive(Clone, Debug)]
struct Validated {
    table: TableName,
    columns: Vec<Ident>,
    /// Positions of the key columns in `columns`.
    key: Vec<usize>,
}

impl PostgresSinkConfig {
    /// Checks the names: valid identifiers, no duplicates, a non-empty key
    /// made of columns; and that the connection string parses.
    pub fn validate(&self) -> Result<(), PostgresSinkError> {
        self.checked().map(|_| ())
    }

    fn checked(&self) -> Result<Validated, PostgresSinkError> {
        postgres::Config::from_str(&self.conninfo)
            .map_err(|e| PostgresSinkError::Conninfo { reason: e.to_string() })?;
        let table = TableName::parse(&self.table)?;
        let names = |field: &'static str, list: &[String]| -> Result<Vec<Ident>, PostgresSinkError> {
            if list.is_empty() {
                return Err(PostgresSinkError::Empty { field });
            }
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for text in list {
                let ident = Ident::parse(field, text)?;
                if !seen.insert(ident.clone()) {
                    return Err(PostgresSinkError::Duplicate { field, name: text.clone() });
                }
                out.push(ident);
            }
            Ok(out)
        };
        let columns = names("columns", &self.columns)?;
        let key_names = names("key", &self.key)?;
        let mut key = Vec::new();
        for (ident, text) in key_names.iter().zip(&self.key) {
            match columns.iter().position(|c| c == ident) {
                Some(i) => key.push(i),
                None => {
                    return Err(PostgresSinkError::KeyNotInColumns {
                        name: text.clone(),
                        columns: self.columns.join(","),
                    })
                }
            }
        }
        Ok(Validated { table, columns, key })
    }
}

/// Hides the password of a connection string (key/value or URL form).
fn redact_password(conninfo: &str) -> String {
    if let Some(scheme_end) = conninfo.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end =
            conninfo[authority_start..].find(['/', '?']).map_or(conninfo.len(), |p| authority_start + p);
        if let Some(at) = conninfo[authority_start..authority_end].rfind('@') {
            let userinfo = &conninfo[authority_start..authority_start + at];
            if let Some(colon) = userinfo.find(':') {
                return format!("{}:***{}", &conninfo[..authority_start + colon], &conninfo[authority_start + at..]);
            }
        }
        return conninfo.to_owned();
    }
    let mut out = String::new();
    let mut rest = conninfo;
    while let Some(p) = rest.find("password") {
        let after = rest[p + "password".len()..].trim_start();
        let Some(value) = after.strip_prefix('=') else {
            out.push_str(&rest[..p + "password".len()]);
            rest = &rest[p + "password".len()..];
            continue;
        };
        let value = value.trim_start();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            let mut i = 0;
            let b = quoted.as_bytes();
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            (i + 2).min(value.len())
        } else {
            value.find(char::is_whitespace).unwrap_or(value.len())
        };
        out.push_str(&rest[..p]);
        out.push_str("password=***");
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// A part as stored: every row with its net change (positive: present, to be
/// upserted; negative: retracted, to be deleted by key), retractions first.
type PartRows = Vec<(Vec<String>, i64)>;

/// Nets the rows of one checkpoint and orders them: retractions (by row),
/// then insertions by the latest (timely time, event time) at which each was
/// seen, so that of two rows with one key the later is upserted last.
fn net_rows(due: BTreeMap<Timestamp, Vec<(Timestamp, Vec<String>, i64)>>) -> PartRows {
    let mut net: HashMap<Vec<String>, (i64, (Timestamp, Timestamp))> = HashMap::new();
    for (at, rows) in due {
        for (t, fields, diff) in rows {
            let entry = net.entry(fields).or_insert((0, (at, t)));
            entry.0 += diff;
            entry.1 = entry.1.max((at, t));
        }
    }
    let mut deletes = Vec::new();
    let mut upserts = Vec::new();
    for (fields, (diff, last)) in net {
        match diff {
            0 => {}
            d if d < 0 => deletes.push((fields, d)),
            d => upserts.push((last, fields, d)),
        }
    }
    deletes.sort_unstable();
    upserts.sort_unstable();
    deletes.extend(upserts.into_iter().map(|(_, fields, d)| (fields, d)));
    deletes
}

/// Writes the CSV lines of `stream` to a PostgreSQL table with exactly-once
/// effect, one transaction per checkpoint.
///
/// Each line is split into fields ([`parse_csv_line`]), one per configured
/// column. A malformed line, or one with the wrong number of fields, is
/// skipped and recorded in the handle's errors (the first
/// ten with their text), never a panic. Lines go to worker 0, which
/// at every checkpoint cut `T` nets the rows below `T` not yet set aside and
/// submits them as the checkpoint's part, committed by a
/// [`PostgresCommitter`] (see there how). Retractions are applied (deletes
/// by key); the handle's `lines` counts rows upserted.
///
/// On worker 0 this connects, creates the tables if needed and registers the
/// sink, which after a recovery commits the restored checkpoint's part (if it
/// was not) and discards what newer checkpoints pre-committed.
///
/// The sink commits with the job's checkpoints, which the timely computation
/// must be configured with ([`Checkpoints::configure`]); without them it
/// returns [`CheckpointError::NotConfigured`].
pub fn write_postgres(
    stream: &EventStream<'_, String>,
    name: &str,
    config: PostgresSinkConfig,
) -> Result<SinkHandle, PostgresSinkError> {
    let validated = config.checked()?;
    let handle = SinkHandle::default();
    let h = handle.clone();
    let worker = stream.scope().index();
    let Some(checkpoints) = Checkpoints::of(&stream.scope()) else {
        return Err(CheckpointError::NotConfigured {
            what: format!("the exactly-once sink {name}"),
            job: crate::job::in_job(stream.scope().worker().config()),
        }
        .into());
    };
    let checkpoints = (worker == 0).then_some(checkpoints);
    if let Some(c) = checkpoints.as_ref() {
        let committer = PostgresCommitter::connect(name, &config)?;
        c.register_sink(name, worker, Arc::new(committer))?;
    }
    let width = validated.columns.len();
    let sink = name.to_owned();
    let mut buffer: BTreeMap<Timestamp, Vec<(Timestamp, Vec<String>, i64)>> = BTreeMap::new();
    let mut done: Option<CheckpointId> = None;
    // After a recovery from a cut at `T`, what travels below `T` was committed
    // before (see `EventStream::as_collection`).
    let replayed_below = checkpoints.as_ref().and_then(|c| c.restored_time()).unwrap_or(0);
    let mut bad_lines = 0u64;
    stream.inner.clone().sink(Exchange::new(|_: &Update<String>| 0), name, move |(input, frontier)| {
        input.for_each_stamp(|at, data| {
            let time = *at.least().expect("highwater messages travel under a capability");
            if time < replayed_below {
                // Derived from a restored collection's replay: committed before the crash.
                data.for_each(Vec::clear);
                return;
            }
            let rows = buffer.entry(time).or_default();
            for batch in data {
                for (line, t, diff) in batch.drain(..) {
                    let problem = match parse_csv_line(&line) {
                        Ok(fields) if fields.len() == width => {
                            rows.push((t, fields, diff));
                            continue;
                        }
                        Ok(fields) => format!("{} fields, the table has {width} columns", fields.len()),
                        Err(e) => e.to_string(),
                    };
                    bad_lines += 1;
                    if bad_lines <= REPORTED_BAD_LINES {
                        let shown: String = line.chars().take(200).collect();
                        let message = format!("sink {sink}: skipping line {shown:?}: {problem}");
                        tracing::error!("{message}");
                        if let Ok(mut errors) = h.errors.lock() {
                            errors.push(message);
                            if bad_lines == REPORTED_BAD_LINES {
                                errors.push(format!("sink {sink}: further malformed lines are skipped unreported"));
                            }
                        }
                    }
                }
            }
        });
        let Some(c) = checkpoints.as_ref() else { return };
        let watermark = watermark_of(frontier);
        while let Some(cut) = c.cut_after(done).filter(|cut| cut.time <= watermark) {
            let later = buffer.split_off(&cut.time);
            let due = std::mem::replace(&mut buffer, later);
            let rows = net_rows(due);
            let part = if rows.is_empty() {
                None
            } else {
                match postcard::to_allocvec(&rows) {
                    Ok(bytes) => {
                        h.lines.add(rows.iter().filter(|(_, d)| *d > 0).count() as u64);
                        Some((bytes, rows.len() as u64))
                    }
                    Err(e) => {
                        // Not expected for strings and integers; the job fails at its end.
                        let message = format!("sink {sink}: encoding checkpoint {}'s part: {e}", cut.id);
                        tracing::error!("{message}");
                        if let Ok(mut errors) = h.errors.lock() {
                            errors.push(message);
                        }
                        None
                    }
                }
            };
            c.submit_sink(0, cut, SinkSubmission { sink: sink.clone(), part });
            done = Some(cut.id);
        }
    });
    Ok(handle)
}

/// Commits a [`write_postgres`] sink's parts to its table.
///
/// [`prepare`](SinkCommitter::prepare) stores a checkpoint's part in the
/// staging table `highwater_sink_pending` (durable before the manifest,
/// invisible to readers of the table). [`commit`](SinkCommitter::commit), in
/// one transaction, locks the sink's row of `highwater_sink_progress`; if it
/// is at or beyond the checkpoint, the commit was done before (a replay) and
/// nothing happens; otherwise the part's retracted rows are deleted by key,
/// its rows upserted (`INSERT … ON CONFLICT (key) DO UPDATE`, the last row of
/// each key), the progress set to the checkpoint and the staged part
/// dropped. [`abort_after`](SinkCommitter::abort_after) drops parts staged
/// for later checkpoints and, if the progress is beyond the recovered
/// checkpoint (a newer one was damaged), sets it back with a warning: the
/// replay applies the same rows again, by key, to the same effect.
///
/// The bookkeeping tables live in the target table's schema (the first of
/// the `search_path` when the name is not qualified); the sink's rows there
/// are keyed by `{sink name}:{table}` (e.g. `Output:nexmark_q5`), so two jobs
/// must not write one table under one sink name. The committer holds its own
/// connection, reconnecting (once per call) if it was lost.
pub struct PostgresCommitter {
    /// The sink's key in the bookkeeping tables: `{name}:{table}`.
    sink: String,
    config: postgres::Config,
    table: TableName,
    columns: Vec<Ident>,
    key: Vec<usize>,
    /// `INSERT … ON CONFLICT (key) DO UPDATE` of `unnest`ed text arrays.
    upsert: String,
    /// `DELETE … USING unnest(…)` by key.
    delete: String,
    pending: TableName,
    progress: TableName,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCommitter").field("sink", &self.sink).field("table", &self.table.sql()).finish()
    }
}

/// Why a database call failed, in full (a `postgres::Error` displays as just `db error`).
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.to_string(),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        }
    }
}

/// An error of a committer's call.
enum Failure {
    Db(String, postgres::Error),
    Other(String),
}

impl Failure {
    fn db(what: impl Into<String>) -> impl FnOnce(postgres::Error) -> Failure {
        let what = what.into();
        move |e| Failure::Db(what, e)
    }
}

/// The checkpoint id of a part's `committed` field (`checkpoint {id}`).
fn part_checkpoint(part: &SinkPart) -> Option<i64> {
    part.committed.strip_prefix("checkpoint ").and_then(|id| id.parse().ok())
}

impl PostgresCommitter {
    /// Checks `config`, connects, and creates (if they do not exist) the
    /// target table (every column `text`, the primary key on the key columns)
    /// and the bookkeeping tables. The sink is known there as `{name}:{table}`.
    /// An existing target table may have other column types (values are cast
    /// from text) but must have the columns and a unique constraint on the key.
    pub fn connect(name: &str, config: &PostgresSinkConfig) -> Result<PostgresCommitter, PostgresSinkError> {
        let Validated { table, columns, key } = config.checked()?;
        let mut pg_config = postgres::Config::from_str(&config.conninfo)
            .map_err(|e| PostgresSinkError::Conninfo { reason: e.to_string() })?;
        if pg_config.get_connect_timeout().is_none() {
            pg_config.connect_timeout(Duration::from_secs(10));
        }
        if pg_config.get_application_name().is_none() {
            pg_config.application_name("highwater");
        }
        let mut committer = PostgresCommitter {
            sink: format!("{name}:{}", table.display()),
            config: pg_config,
            pending: table.sibling(PENDING_TABLE),
            progress: table.sibling(PROGRESS_TABLE),
            table,
            columns,
            key,
            upsert: String::new(),
            delete: String::new(),
            client: Mutex::new(None),
        };
        committer.set_up().map_err(|f| committer.error("setting up", f))?;
        tracing::info!(sink = %committer.sink, "postgres sink ready");
        Ok(committer)
    }

    fn error(&self, doing: &str, failure: Failure) -> CheckpointError {
        let reason = match failure {
            Failure::Db(what, e) => format!("{doing}: {what}: {}", describe(&e)),
            Failure::Other(what) => format!("{doing}: {what}"),
        };
        CheckpointError::Sink { sink: self.sink.clone(), reason }
    }

    fn open(&self) -> Result<Client, Failure> {
        self.config.connect(NoTls).map_err(Failure::db("connecting"))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Client>> {
        self.client.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `op` on the connection, (re)connecting first if there is none;
    /// if `op` fails because the connection was lost, runs it once more on a
    /// new one (every operation here may be repeated).
    fn with_client<T>(&self, mut op: impl FnMut(&mut Client) -> Result<T, Failure>) -> Result<T, Failure> {
        let mut guard = self.lock();
        let mut retried = false;
        loop {
            if guard.as_ref().is_none_or(Client::is_closed) {
                *guard = Some(self.open()?);
            }
            let client = guard.as_mut().expect("connected above");
            match op(client) {
                Err(Failure::Db(what, e)) if client.is_closed() && !retried => {
                    tracing::warn!(sink = %self.sink, "connection lost ({what}: {}); reconnecting", describe(&e));
                    *guard = None;
                    retried = true;
                }
                result => return result,
            }
        }
    }

    /// Creates the tables, learns the column types, prepares the statements.
    fn set_up(&mut self) -> Result<(), Failure> {
        let columns: Vec<String> = self.columns.iter().map(|c| format!("{} text", c.sql())).collect();
        let key = self.key_sql();
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {table} ({columns}, PRIMARY KEY ({key}));\n\
             CREATE TABLE IF NOT EXISTS {progress} (sink text PRIMARY KEY, checkpoint bigint NOT NULL);\n\
             CREATE TABLE IF NOT EXISTS {pending} (sink text, checkpoint bigint, payload bytea, \
             PRIMARY KEY (sink, checkpoint));",
            table = self.table.sql(),
            columns = columns.join(", "),
            progress = self.progress.sql(),
            pending = self.pending.sql(),
        );
        let table_sql = self.table.sql();
        let types = self.with_client(|client| {
            client.batch_execute(&ddl).map_err(Failure::db("creating the tables"))?;
            let rows = client
                .query(
                    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
                     WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped",
                    &[&table_sql],
                )
                .map_err(Failure::db("reading the table's columns"))?;
            Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, String>(1))).collect::<HashMap<_, _>>())
        })?;
        let mut column_types = Vec::new();
        for column in &self.columns {
            match types.get(&column.0) {
                Some(t) => column_types.push(t.clone()),
                None => {
                    return Err(Failure::Other(format!(
                        "table {} exists without column {} (it has: {})",
                        self.table.display(),
                        column.sql(),
                        types.keys().cloned().collect::<Vec<_>>().join(", ")
                    )))
                }
            }
        }
        let cast = |i: usize| format!("CAST(u.c{i} AS {})", column_types[i]);
        let arrays = |n: usize| (1..=n).map(|p| format!("${p}::text[]")).collect::<Vec<_>>().join(", ");
        let aliases = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>().join(", ");
        let names: Vec<String> = self.columns.iter().map(Ident::sql).collect();
        let updates: Vec<String> = (0..self.columns.len())
            .filter(|i| !self.key.contains(i))
            .map(|i| format!("{name} = EXCLUDED.{name}", name = names[i]))
            .collect();
        let on_conflict =
            if updates.is_empty() { "DO NOTHING".to_owned() } else { format!("DO UPDATE SET {}", updates.join(", ")) };
        self.upsert = format!(
            "INSERT INTO {table} ({names}) SELECT {casts} FROM unnest({arrays}) AS u({aliases}) \
             ON CONFLICT ({key}) {on_conflict}",
            table = self.table.sql(),
            names = names.join(", "),
            casts = (0..names.len()).map(cast).collect::<Vec<_>>().join(", "),
            arrays = arrays(names.len()),
            aliases = aliases(names.len()),
        );
        // The key's values come in the key's order: u.c{j} is key column j.
        let matches: Vec<String> = self
            .key
            .iter()
            .enumerate()
            .map(|(j, &i)| format!("t.{} = CAST(u.c{j} AS {})", names[i], column_types[i]))
            .collect();
        self.delete = format!(
            "DELETE FROM {table} AS t USING unnest({arrays}) AS u({aliases}) WHERE {matches}",
            table = self.table.sql(),
            arrays = arrays(self.key.len()),
            aliases = aliases(self.key.len()),
            matches = matches.join(" AND "),
        );
        // Running the statements on no rows checks them now, planning
        // included: the columns' types, and that a unique constraint matches
        // the key (ON CONFLICT needs one).
        let (upsert, delete) = (self.upsert.clone(), self.delete.clone());
        let (width, key_width) = (self.columns.len(), self.key.len());
        self.with_client(|client| {
            let none: Vec<&str> = Vec::new();
            let params = |n: usize| vec![&none as &(dyn ToSql + Sync); n];
            let mut tx = client.transaction().map_err(Failure::db("beginning"))?;
            tx.execute(&upsert, &params(width))
                .map_err(Failure::db(format!("checking the upsert statement ({upsert})")))?;
            tx.execute(&delete, &params(key_width))
                .map_err(Failure::db(format!("checking the delete statement ({delete})")))?;
            tx.rollback().map_err(Failure::db("rolling back the checks"))
        })
    }

    fn key_sql(&self) -> String {
        self.key.iter().map(|&i| self.columns[i].sql()).collect::<Vec<_>>().join(", ")
    }

    /// Applies a part's rows: deletes by key, then upserts (the last row of each key).
    fn apply(&self, tx: &mut Transaction<'_>, rows: &PartRows) -> Result<(), Failure> {
        let width = self.columns.len();
        if let Some((fields, _)) = rows.iter().find(|(fields, _)| fields.len() != width) {
            return Err(Failure::Other(format!(
                "a staged row has {} fields, the sink has {width} columns (was the checkpoint taken with other columns?)",
                fields.len()
            )));
        }
        let key_of = |fields: &[String]| -> Vec<String> { self.key.iter().map(|&i| fields[i].clone()).collect() };
        let mut seen = HashSet::new();
        let deletes: Vec<Vec<String>> =
            rows.iter().filter(|(_, d)| *d < 0).map(|(f, _)| key_of(f)).filter(|k| seen.insert(k.clone())).collect();
        let mut last: HashMap<Vec<String>, usize> = HashMap::new();
        let inserted: Vec<&Vec<String>> = rows.iter().filter(|(_, d)| *d > 0).map(|(f, _)| f).collect();
        for (n, fields) in inserted.iter().enumerate() {
            last.insert(key_of(fields), n);
        }
        let mut upserts: Vec<usize> = last.into_values().collect();
        upserts.sort_unstable();
        let delete = tx.prepare(&self.delete).map_err(Failure::db("preparing the delete"))?;
        for chunk in deletes.chunks(CHUNK) {
            let arrays: Vec<Vec<&str>> =
                (0..self.key.len()).map(|j| chunk.iter().map(|k| k[j].as_str()).collect()).collect();
            let params: Vec<&(dyn ToSql + Sync)> = arrays.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            tx.execute(&delete, &params).map_err(Failure::db("deleting retracted rows"))?;
        }
        let upsert = tx.prepare(&self.upsert).map_err(Failure::db("preparing the upsert"))?;
        for chunk in upserts.chunks(CHUNK) {
            let arrays: Vec<Vec<&str>> =
                (0..width).map(|i| chunk.iter().map(|&n| inserted[n][i].as_str()).collect()).collect();
            let params: Vec<&(dyn ToSql + Sync)> = arrays.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            tx.execute(&upsert, &params).map_err(Failure::db("upserting rows"))?;
        }
        Ok(())
    }
}

impl SinkCommitter for PostgresCommitter {
    fn prepare(&self, id: CheckpointId, part: Option<(&[u8], u64)>) -> Result<SinkPart, CheckpointError> {
        let mut out = SinkPart {
            sink: String::new(),
            kind: "postgres".to_owned(),
            target: self.table.display(),
            pending: String::new(),
            committed: format!("checkpoint {id}"),
            rows: 0,
        };
        let Some((bytes, rows)) = part else { return Ok(out) };
        let checkpoint = i64::try_from(id)
            .map_err(|_| self.error("pre-committing", Failure::Other(format!("checkpoint id {id} exceeds bigint"))))?;
        let insert = format!(
            "INSERT INTO {} (sink, checkpoint, payload) VALUES ($1, $2, $3) \
             ON CONFLICT (sink, checkpoint) DO UPDATE SET payload = EXCLUDED.payload",
            self.pending.sql()
        );
        self.with_client(|client| {
            client.execute(&insert, &[&self.sink, &checkpoint, &bytes]).map_err(Failure::db("staging the part"))
        })
        .map_err(|f| self.error(&format!("pre-committing checkpoint {id}"), f))?;
        out.pending = self.pending.display();
        out.rows = rows;
        Ok(out)
    }

    fn commit(&self, part: &SinkPart) -> Result<(), CheckpointError> {
        let Some(id) = part_checkpoint(part) else {
            return Err(self.error(
                "committing",
                Failure::Other(format!("part {:?} does not name its checkpoint (`checkpoint ID`)", part.committed)),
            ));
        };
        if part.kind != "postgres" {
            return Err(self.error(
                &format!("committing checkpoint {id}"),
                Failure::Other(format!(
                    "the checkpoint's output went to a {} sink ({}), not a table: recover with the same output, \
                     or start afresh",
                    part.kind, part.target
                )),
            ));
        }
        if part.target != self.table.display() {
            return Err(self.error(
                &format!("committing checkpoint {id}"),
                Failure::Other(format!(
                    "the checkpoint's output went to table {}, this sink writes {}: recover with the same table, \
                     or start afresh",
                    part.target,
                    self.table.display()
                )),
            ));
        }
        let upsert_progress = format!(
            "INSERT INTO {} (sink, checkpoint) VALUES ($1, 0) ON CONFLICT (sink) DO NOTHING",
            self.progress.sql()
        );
        let select_progress = format!("SELECT checkpoint FROM {} WHERE sink = $1 FOR UPDATE", self.progress.sql());
        let set_progress = format!("UPDATE {} SET checkpoint = $2 WHERE sink = $1", self.progress.sql());
        let select_part = format!("SELECT payload FROM {} WHERE sink = $1 AND checkpoint = $2", self.pending.sql());
        let delete_part = format!("DELETE FROM {} WHERE sink = $1 AND checkpoint = $2", self.pending.sql());
        let applied = self
            .with_client(|client| {
                let mut tx = client.transaction().map_err(Failure::db("beginning"))?;
                tx.execute(&upsert_progress, &[&self.sink]).map_err(Failure::db("recording the sink"))?;
                let done: i64 =
                    tx.query_one(&select_progress, &[&self.sink]).map_err(Failure::db("reading the progress"))?.get(0);
                if done >= id {
                    // A replayed commit: applied already (and its part dropped then).
                    tx.execute(&delete_part, &[&self.sink, &id]).map_err(Failure::db("dropping the part"))?;
                    tx.commit().map_err(Failure::db("committing"))?;
                    return Ok(None);
                }
                let mut rows = 0;
                if !part.pending.is_empty() {
                    let Some(row) = tx
                        .query_opt(&select_part, &[&self.sink, &id])
                        .map_err(Failure::db("reading the staged part"))?
                    else {
                        return Err(Failure::Other(format!(
                            "the part is not staged in {} (progress is at checkpoint {done})",
                            self.pending.display()
                        )));
                    };
                    let payload: Vec<u8> = row.get(0);
                    let part_rows: PartRows = postcard::from_bytes(&payload)
                        .map_err(|e| Failure::Other(format!("the staged part does not decode: {e}")))?;
                    self.apply(&mut tx, &part_rows)?;
                    rows = part_rows.len();
                    tx.execute(&delete_part, &[&self.sink, &id]).map_err(Failure::db("dropping the part"))?;
                }
                tx.execute(&set_progress, &[&self.sink, &id]).map_err(Failure::db("recording the progress"))?;
                tx.commit().map_err(Failure::db("committing"))?;
                Ok(Some(rows))
            })
            .map_err(|f| self.error(&format!("committing checkpoint {id}"), f))?;
        match applied {
            Some(rows) => tracing::debug!(sink = %self.sink, id, rows, "postgres part committed"),
            None => tracing::debug!(sink = %self.sink, id, "postgres part committed before"),
        }
        Ok(())
    }

    fn abort_after(&self, id: CheckpointId) -> Result<(), CheckpointError> {
        let checkpoint = i64::try_from(id)
            .map_err(|_| self.error("aborting", Failure::Other(format!("checkpoint id {id} exceeds bigint"))))?;
        let delete_parts = format!("DELETE FROM {} WHERE sink = $1 AND checkpoint > $2", self.pending.sql());
        let select_progress = format!("SELECT checkpoint FROM {} WHERE sink = $1 FOR UPDATE", self.progress.sql());
        let set_progress = format!("UPDATE {} SET checkpoint = $2 WHERE sink = $1", self.progress.sql());
        let (discarded, newer) = self
            .with_client(|client| {
                let mut tx = client.transaction().map_err(Failure::db("beginning"))?;
                let discarded = tx
                    .execute(&delete_parts, &[&self.sink, &checkpoint])
                    .map_err(Failure::db("discarding staged parts"))?;
                let done: Option<i64> = tx
                    .query_opt(&select_progress, &[&self.sink])
                    .map_err(Failure::db("reading the progress"))?
                    .map(|r| r.get(0));
                let newer = done.filter(|&done| done > checkpoint);
                if newer.is_some() {
                    // The replay commits its checkpoints after `id` again, applying
                    // the same rows once more: upserts and deletes by key are
                    // idempotent, so the table ends as if they had been applied once.
                    tx.execute(&set_progress, &[&self.sink, &checkpoint])
                        .map_err(Failure::db("resetting the progress"))?;
                }
                tx.commit().map_err(Failure::db("committing"))?;
                Ok((discarded, newer))
            })
            .map_err(|f| self.error(&format!("aborting the parts after checkpoint {id}"), f))?;
        if discarded > 0 {
            tracing::info!(sink = %self.sink, discarded, "discarded parts pre-committed after checkpoint {id}");
        }
        if let Some(newer) = newer {
            tracing::warn!(
                sink = %self.sink,
                "the table holds the output up to checkpoint {newer}, newer than checkpoint {id} being recovered \
                 (a damaged checkpoint, or a fresh start over an old table): the replay re-applies the same \
                 rows, upserts and deletes by key, which is idempotent"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(table: &str, columns: &[&str], key: &[&str]) -> PostgresSinkConfig {
        PostgresSinkConfig {
            conninfo: "host=localhost user=postgres password=secret dbname=db".into(),
            table: table.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            key: key.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn csv_lines_split_into_fields() {
        let ok = |line: &str| parse_csv_line(line).unwrap();
        assert_eq!(ok("1,2,3"), ["1", "2", "3"]);
        assert_eq!(ok(""), [""]);
        assert_eq!(ok(","), ["", ""]);
        assert_eq!(ok("a,,b,"), ["a", "", "b", ""]);
        assert_eq!(ok(r#""a,b",c"#), ["a,b", "c"]);
        assert_eq!(ok(r#""say ""hi""""#), [r#"say "hi""#]);
        assert_eq!(ok(r#""""#), [""]);
        assert_eq!(ok(r#""""""#), ["\""]);
        assert_eq!(ok("\"two\nlines\r\",x"), ["two\nlines\r", "x"]);
        assert_eq!(ok("héllo,\"wörld, ü\""), ["héllo", "wörld, ü"]);
        assert_eq!(ok(" spaced , kept "), [" spaced ", " kept "]);
    }

    #[test]
    fn malformed_csv_lines_are_errors() {
        let err = |line: &str| parse_csv_line(line).unwrap_err();
        assert_eq!(err(r#"1,"open"#).at, 2);
        assert_eq!(err(r#""closed"x,1"#).at, 8);
        assert_eq!(err(r#"a"b,c"#).at, 1);
        assert_eq!(err(r#"x,"a""b"#).at, 2);
        assert_eq!(err(r#"""#).at, 0);
        assert!(err(r#""a" ,b"#).to_string().contains("followed by a comma"));
    }

    #[test]
    fn csv_lines_round_trip_through_the_writer() {
        let values = ["plain", "", "a,b", "q\"uote", "\"", ",", "line\nbreak", "ü"];
        for a in values {
            for b in values {
                let mut line = String::new();
                super::super::csv_field(&mut line, a);
                line.push(',');
                super::super::csv_field(&mut line, b);
                assert_eq!(parse_csv_line(&line).unwrap(), [a, b], "{line:?}");
            }
        }
    }

    #[test]
    fn configurations_are_checked() {
        let v = config("q5", &["a", "B", "\"C d\""], &["a", "b"]).checked().unwrap();
        assert_eq!(v.table.sql(), "\"q5\"");
        assert_eq!(v.columns.iter().map(Ident::sql).collect::<Vec<_>>(), ["\"a\"", "\"b\"", "\"C d\""]);
        assert_eq!(v.key, [0, 1]);
        let v = config("Out.\"My \"\"T\"\"\"", &["x"], &["x"]).checked().unwrap();
        assert_eq!(v.table.sql(), "\"out\".\"My \"\"T\"\"\"");
        assert_eq!(v.table.display(), "out.My \"T\"");
        let field = |c: PostgresSinkConfig| match c.checked().unwrap_err() {
            PostgresSinkError::Identifier { field, .. } => field,
            PostgresSinkError::Empty { field } => field,
            PostgresSinkError::Duplicate { field, .. } => field,
            PostgresSinkError::KeyNotInColumns { .. } => "key ⊄ columns",
            PostgresSinkError::Conninfo { .. } => "conninfo",
            e => panic!("{e}"),
        };
        assert_eq!(field(config("q5; drop table x", &["a"], &["a"])), "table");
        assert_eq!(field(config("1q", &["a"], &["a"])), "table");
        assert_eq!(field(config("a.b.c", &["a"], &["a"])), "table");
        assert_eq!(field(config("\"open", &["a"], &["a"])), "table");
        assert_eq!(field(config("\"\"", &["a"], &["a"])), "table");
        assert_eq!(field(config(&"t".repeat(64), &["a"], &["a"])), "table");
        assert_eq!(field(config("t", &["a", "b c"], &["a"])), "columns");
        assert_eq!(field(config("t", &["a", "\"x\"y"], &["a"])), "columns");
        assert_eq!(field(config("t", &[], &["a"])), "columns");
        assert_eq!(field(config("t", &["a", "A"], &["a"])), "columns");
        assert_eq!(field(config("t", &["a"], &[])), "key");
        assert_eq!(field(config("t", &["a"], &["a", "a"])), "key");
        assert_eq!(field(config("t", &["a", "b"], &["c"])), "key ⊄ columns");
        assert_eq!(field(config("t", &["a", "\"B\""], &["b"])), "key ⊄ columns");
        let mut bad = config("t", &["a"], &["a"]);
        bad.conninfo = "host=localhost port=notaport".into();
        assert_eq!(field(bad), "conninfo");
        let e = config("t", &["a", "b"], &["c"]).checked().unwrap_err().to_string();
        assert!(e.contains("`key`") && e.contains("\"c\""), "{e}");
    }

    #[test]
    fn passwords_are_not_shown() {
        let shown = format!("{:?}", config("t", &["a"], &["a"]));
        assert!(!shown.contains("secret") && shown.contains("password=***"), "{shown}");
        assert_eq!(redact_password("host=h password = 'a b\\'c' user=u"), "host=h password=*** user=u");
        assert_eq!(redact_password("postgresql://me:secret@host:5432/db"), "postgresql://me:***@host:5432/db");
        assert_eq!(redact_password("postgresql://me@host/db"), "postgresql://me@host/db");
    }

    #[test]
    fn parts_net_rows_and_order_retractions_first() {
        let row = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        let mut due = BTreeMap::new();
        due.insert(1, vec![(10, row("k,old"), 1), (10, row("z,1"), 1)]);
        due.insert(2, vec![(20, row("k,old"), -1), (20, row("k,new"), 1), (5, row("gone,x"), -1)]);
        due.insert(3, vec![(30, row("z,1"), -1), (30, row("a,later"), 1)]);
        assert_eq!(net_rows(due), [(row("gone,x"), -1), (row("k,new"), 1), (row("a,later"), 1)]);
    }
}
