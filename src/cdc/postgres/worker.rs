//! The background thread of a reader: connects, sets up, takes the snapshot,
//! polls the slot, and reconnects with backoff when the server goes away.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls, SimpleQueryMessage};

use super::catalog::{self, quote_ident};
use super::changes::{decode_value, Decoder, EventClock, TableInfo, Transaction};
use super::error::Failure;
use super::lsn::format_lsn;
use super::replication::{CreatedSlot, ReplicationConnection};
use super::snapshot::set_transaction_snapshot;
use super::source::{Msg, Shared, Stats};
use super::PostgresConfig;
use crate::cdc::{Change, Op, Row};
use crate::dead_letter::DeadLetter;
use crate::source::SourceError;

/// Session settings that fix the text form of values (see `types.rs`).
const SESSION_SETUP: &str = "SET DateStyle = 'ISO, YMD'; SET TimeZone = 'UTC'; SET extra_float_digits = 3; \
                             SET bytea_output = 'hex'; SET IntervalStyle = 'postgres'; \
                             SET application_name = 'highwater-cdc'";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing set up yet.
    Start,
    /// The snapshot is being sent: a failure now cannot be resumed.
    Snapshot,
    /// Streaming from the slot.
    Stream,
}

/// The state of the background thread; it survives reconnections.
pub(crate) struct Worker {
    config: Arc<PostgresConfig>,
    shared: Arc<Shared>,
    stats: Arc<Stats>,
    tx: SyncSender<Msg>,
    /// The offset to resume after (`None`: take a new snapshot).
    from: Option<u64>,
    phase: Phase,
    /// Transactions committing before this LSN were sent to the reader (or
    /// are in the snapshot): the end LSN of the last transaction sent, the
    /// consistent point after the snapshot, or the offset resumed from.
    sent_before: u64,
    /// The end LSN of the last transaction sent.
    last_sent_end: u64,
    /// Where the slot read from was last advanced to.
    advanced: u64,
    /// The job takes checkpoints: read from a cursor, a temporary copy of
    /// the slot made by each session, and leave the slot itself to
    /// [`advance_slot`] when a checkpoint commits.
    acknowledging: bool,
    /// Event times, non-decreasing in delivery order.
    clock: EventClock,
    decoder: Decoder,
    origin: String,
}

/// How a session ended without failure.
enum Ended {
    /// The reader is gone or the source stopped.
    Stopped,
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl Worker {
    pub(crate) fn new(
        config: Arc<PostgresConfig>,
        shared: Arc<Shared>,
        stats: Arc<Stats>,
        tx: SyncSender<Msg>,
        from: Option<u64>,
        acknowledging: bool,
    ) -> Self {
        let origin = format!("postgres:{}", config.slot);
        // Offset 0 is the one reported during the snapshot: take a new one.
        let from = from.filter(|&f| f > 0);
        Worker {
            decoder: Decoder::new(&[], origin.clone()),
            config,
            shared,
            stats,
            tx,
            from,
            phase: Phase::Start,
            sent_before: from.unwrap_or(0),
            last_sent_end: 0,
            advanced: 0,
            acknowledging,
            clock: EventClock::default(),
            origin,
        }
    }

    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    /// Sleeps up to `duration`, waking early when stopped; returns whether stopped.
    fn sleep(&self, duration: Duration) -> bool {
        let until = Instant::now() + duration;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
        true
    }

    /// Sends to the reader; `Err` if it is gone.
    fn send(&self, msg: Msg) -> Result<(), Ended> {
        let started = Instant::now();
        let sent = self.tx.send(msg).map_err(|_| Ended::Stopped);
        add_elapsed(&self.stats.handoff_nanos, started);
        sent
    }

    /// Runs until stopped or a fatal error.
    pub(crate) fn run(mut self) {
        let min_backoff = Duration::from_millis(100);
        let max_backoff = Duration::from_millis(self.config.max_backoff.0).max(min_backoff);
        let mut backoff = min_backoff;
        let mut attempts = 0u64;
        let reconnect_timeout = Duration::from_millis(self.config.reconnect_timeout.0);
        // Since when the server has been unreachable (no session connected).
        let mut unreachable_since: Option<Instant> = None;
        loop {
            if self.stopped() {
                return;
            }
            if attempts > 0 {
                self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            attempts += 1;
            let mut connected = false;
            match self.session(&mut connected) {
                Ok(Ended::Stopped) => return,
                Err(Failure::Fatal(e)) => {
                    tracing::error!(slot = %self.config.slot, "postgres source stops: {e}");
                    let _ = self.tx.send(Msg::Fatal(e));
                    return;
                }
                Err(Failure::Retry(e)) if self.phase == Phase::Snapshot => {
                    let e = SourceError::Config(format!(
                        "postgres source: the connection was lost during the initial snapshot ({e}); \
                         start again without offset to take a new snapshot"
                    ));
                    tracing::error!(slot = %self.config.slot, "{e}");
                    let _ = self.tx.send(Msg::Fatal(e));
                    return;
                }
                Err(Failure::Retry(e)) => {
                    if connected {
                        backoff = min_backoff;
                        unreachable_since = None;
                    }
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= reconnect_timeout {
                        let e = SourceError::Unavailable {
                            what: format!("postgres source (slot {})", self.config.slot),
                            reason: format!(
                                "the server could not be reached for {:?} ({} attempts); last error: {e}",
                                since.elapsed(),
                                attempts
                            ),
                        };
                        tracing::error!(slot = %self.config.slot, "{e}");
                        let _ = self.tx.send(Msg::Fatal(e));
                        return;
                    }
                    tracing::warn!(slot = %self.config.slot, "postgres source: {e}; reconnecting in {backoff:?}");
                    if self.sleep(backoff) {
                        return;
                    }
                    backoff = (backoff * 2).min(max_backoff);
                }
            }
        }
    }

    fn connect(&self) -> Result<Client, Failure> {
        connect(&self.config)
    }

    /// Makes this session's cursor: a temporary copy of `slot` (dropped when
    /// the session ends), advanced past what was handed out before (a
    /// reconnection) or lies before the offset resumed from.
    fn open_cursor(&self, client: &mut Client, slot: &str) -> Result<String, Failure> {
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])?
            .try_get(0)
            .map_err(|e| Failure::invalid("reading the server version", e))?;
        if version < 120_000 {
            return Err(Failure::config(format!(
                "a checkpointed PostgreSQL source needs PostgreSQL 12 or later \
                 (pg_copy_logical_replication_slot); the server is version {version}"
            )));
        }
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])?
            .try_get(0)
            .map_err(|e| Failure::invalid("reading the backend pid", e))?;
        let cursor = format!("highwater_cursor_{pid}");
        client.execute("SELECT pg_copy_logical_replication_slot($1, $2, true)", &[&slot, &cursor])?;
        let start = self.shared.handed_end.load(Ordering::SeqCst).max(self.from.unwrap_or(0));
        let position = catalog::slot_position(client, &cursor)?.unwrap_or(0);
        if start > position {
            client.query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)", &[&cursor, &format_lsn(start)])?;
        }
        tracing::debug!(slot, cursor, start = %format_lsn(start), "reading from a cursor on the slot");
        Ok(cursor)
    }

    /// One connection: set-up (first time: slot and snapshot), then streaming.
    fn session(&mut self, connected: &mut bool) -> Result<Ended, Failure> {
        let mut client = self.connect()?;
        catalog::check_server(&mut client)?;
        let tables = catalog::describe_tables(&mut client, &self.config.tables)?;
        catalog::ensure_publication(&mut client, &self.config.publication, &tables)?;
        self.decoder.set_tables(&tables);
        let slot = self.config.slot.clone();
        match self.phase {
            Phase::Start => match self.from {
                Some(from) => {
                    check_resume(&slot, from, catalog::slot_position(&mut client, &slot)?)?;
                    tracing::info!(slot, from = %format_lsn(from), "resuming the replication slot");
                    self.phase = Phase::Stream;
                }
                None => {
                    catalog::drop_slot(&mut client, &slot)?;
                    let consistent = if self.config.snapshot {
                        let mut replication = ReplicationConnection::connect(&self.config.url)?;
                        let created = replication.create_slot(&slot)?;
                        tracing::info!(
                            slot, lsn = %format_lsn(created.consistent), snapshot = %created.snapshot,
                            "created the replication slot with an exported snapshot"
                        );
                        self.phase = Phase::Snapshot;
                        match self.snapshot(&mut client, replication, &tables, &created)? {
                            Ok(()) => created.consistent,
                            Err(Ended::Stopped) => return Ok(Ended::Stopped),
                        }
                    } else {
                        catalog::create_slot(&mut client, &slot)?
                    };
                    self.sent_before = consistent;
                    if self.send(Msg::SnapshotDone { lsn: consistent }).is_err() {
                        return Ok(Ended::Stopped);
                    }
                    self.phase = Phase::Stream;
                }
            },
            Phase::Snapshot | Phase::Stream => {}
        }
        let Some(position) = catalog::slot_position(&mut client, &slot)? else {
            return Err(Failure::config(format!("replication slot {slot} was dropped while the source ran")));
        };
        let reading = if self.acknowledging {
            let cursor = self.open_cursor(&mut client, &slot)?;
            self.advanced = catalog::slot_position(&mut client, &cursor)?.unwrap_or(position);
            cursor
        } else {
            self.advanced = self.advanced.max(position);
            slot
        };
        *connected = true;
        self.stream(&mut client, reading)
    }

    /// Reads the tables in the slot's exported snapshot and sends them
    /// (see `snapshot.rs`); closes the replication connection once the
    /// snapshot is imported.
    fn snapshot(
        &mut self,
        client: &mut Client,
        replication: ReplicationConnection,
        tables: &[TableInfo],
        created: &CreatedSlot,
    ) -> Result<Result<(), Ended>, Failure> {
        let (consistent, exported) = (created.consistent, created.snapshot.as_str());
        let bad = |what: &str| Failure::invalid("reading the snapshot", format!("unexpected result of {what}"));
        let set_snapshot = set_transaction_snapshot(exported)
            .ok_or_else(|| Failure::invalid("creating the slot", format!("bad snapshot name {exported:?}")))?;
        client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
        client.batch_execute(&set_snapshot)?;
        let rows = simple_rows(client.simple_query("SELECT floor(extract(epoch FROM now()) * 1000)::int8::text")?);
        let now: i64 = rows
            .first()
            .and_then(|r| r.first())
            .and_then(|s| s.as_deref())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("now()"))?;
        // The transaction holds the snapshot now: the exporting session may end.
        drop(replication);
        tracing::info!(slot = %self.config.slot, snapshot = exported, "taking the initial snapshot");
        let time = u64::try_from(now).unwrap_or(0);
        self.clock = EventClock::starting_at(time);
        for table in tables {
            let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(&c.name)).collect();
            client.batch_execute(&format!(
                "DECLARE highwater_snapshot NO SCROLL CURSOR FOR SELECT {} FROM {}.{}",
                columns.join(", "),
                quote_ident(&table.schema),
                quote_ident(&table.table)
            ))?;
            let stream_columns: Vec<_> = table.columns.iter().map(|c| (Arc::clone(&c.name), Ok(c.ty))).collect();
            let mut read = 0u64;
            loop {
                let rows = simple_rows(
                    client.simple_query(&format!("FETCH {} FROM highwater_snapshot", self.config.snapshot_batch))?,
                );
                let mut changes = Vec::with_capacity(rows.len());
                let mut dead = Vec::new();
                for values in &rows {
                    let decoded: Result<Vec<_>, String> = stream_columns
                        .iter()
                        .zip(values)
                        .map(|(column, text)| {
                            Ok((Arc::clone(&column.0), decode_value(column, text.as_deref().map(str::as_bytes))?))
                        })
                        .collect();
                    let row = decoded.map(|columns| Row { columns }).and_then(|row| match table.key_of(&row) {
                        Some(key) => Ok((key, row)),
                        None => Err(format!("key columns {:?} missing", table.key)),
                    });
                    match row {
                        Ok((key, row)) => changes.push(Change {
                            table: Arc::clone(&table.name),
                            op: Op::Read,
                            key,
                            before: None,
                            after: Some(row),
                            time,
                            lsn: consistent,
                        }),
                        Err(reason) => {
                            let raw: Vec<&str> = values.iter().map(|v| v.as_deref().unwrap_or("NULL")).collect();
                            dead.push(DeadLetter::new(
                                format!("{}/{}", self.origin, table.name),
                                consistent,
                                reason,
                                raw.join("\t").as_bytes(),
                            ));
                        }
                    }
                }
                read += rows.len() as u64;
                self.stats.changes.fetch_add(changes.len() as u64, Ordering::Relaxed);
                let done = rows.len() < self.config.snapshot_batch as usize;
                if !changes.is_empty() || !dead.is_empty() || done {
                    if let Err(stopped) = self.send(Msg::Snapshot { changes, dead }) {
                        return Ok(Err(stopped));
                    }
                }
                if done {
                    break;
                }
            }
            client.batch_execute("CLOSE highwater_snapshot")?;
            tracing::info!(table = %table.name, rows = read, "snapshot read");
        }
        client.batch_execute("COMMIT")?;
        Ok(Ok(()))
    }

    /// Polls `slot` (the slot, or this session's cursor on it) until
    /// stopped or the connection fails.
    fn stream(&mut self, client: &mut Client, slot: String) -> Result<Ended, Failure> {
        let peek = client.prepare(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, \
             'proto_version', '1', 'publication_names', $3)",
        )?;
        let clock = client.prepare("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8")?;
        let advance = client.prepare("SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)")?;
        let limit = self.config.max_changes_per_poll as i32;
        let publication = quote_ident(&self.config.publication);
        let margin = self.config.watermark_margin.0;
        loop {
            if self.stopped() {
                return Ok(Ended::Stopped);
            }
            // Re-reading what the reader has not taken yet is wasted work: wait a little for it.
            let waiting = Instant::now();
            while self.shared.handed_end.load(Ordering::SeqCst) < self.last_sent_end
                && waiting.elapsed() < Duration::from_millis(200)
                && !self.stopped()
            {
                std::thread::sleep(Duration::from_micros(200));
            }
            let started = Instant::now();
            let handed = self.shared.handed_end.load(Ordering::SeqCst);
            if handed > self.advanced {
                client.query(&advance, &[&slot, &format_lsn(handed)])?;
                self.advanced = handed;
            }
            let now: i64 = client
                .query_one(&clock, &[])?
                .try_get(0)
                .map_err(|e| Failure::invalid("reading the server clock", e))?;
            self.decoder.reset();
            let mut rows =
                client.query_raw(&peek, [&slot as &(dyn postgres::types::ToSql + Sync), &limit, &publication])?;
            self.stats.polls.fetch_add(1, Ordering::Relaxed);
            let mut count = 0u64;
            let mut server = started.elapsed();
            loop {
                let waited = Instant::now();
                let Some(row) = rows.next()? else {
                    server += waited.elapsed();
                    break;
                };
                server += waited.elapsed();
                count += 1;
                let decoding = Instant::now();
                let data: &[u8] = row.try_get(0).map_err(|e| Failure::invalid("reading a change", e))?;
                let txn = self.decoder.feed(data).map_err(|e| Failure::invalid("decoding pgoutput", e))?;
                add_elapsed(&self.stats.decode_nanos, decoding);
                if let Some(txn) = txn {
                    if let Err(stopped) = self.deliver(txn) {
                        return Ok(stopped);
                    }
                }
            }
            self.stats.server_nanos.fetch_add(server.as_nanos() as u64, Ordering::Relaxed);
            self.stats.messages.fetch_add(count, Ordering::Relaxed);
            if count < limit as u64 {
                let bound = u64::try_from(now).unwrap_or(0).saturating_sub(margin);
                if self.send(Msg::CaughtUp(bound)).is_err()
                    || self.sleep(Duration::from_millis(self.config.poll_interval.0))
                {
                    return Ok(Ended::Stopped);
                }
            }
        }
    }

    /// Sends a decoded transaction, unless it was sent before (or lies
    /// before the offset resumed from), with its event time raised to keep
    /// delivery order (see [`EventClock`]).
    fn deliver(&mut self, mut txn: Transaction) -> Result<(), Ended> {
        if txn.commit_lsn < self.sent_before {
            tracing::trace!(xid = txn.xid, lsn = %format_lsn(txn.commit_lsn), "skipping a transaction already sent");
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.clock.stamp_transaction(&mut txn);
        self.sent_before = txn.end_lsn;
        self.last_sent_end = txn.end_lsn;
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.stats.changes.fetch_add(txn.changes.len() as u64, Ordering::Relaxed);
        self.send(Msg::Txn(txn))
    }
}

/// A connection with the session settings of the source.
pub(crate) fn connect(config: &PostgresConfig) -> Result<Client, Failure> {
    let mut pg = postgres::Config::from_str(&config.url)
        .map_err(|e| Failure::config(format!("invalid connection string: {e}")))?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(10));
    }
    let mut client = pg.connect(NoTls)?;
    client.batch_execute(SESSION_SETUP)?;
    Ok(client)
}

/// Advances the configured slot to `lsn` (a committed checkpoint's offset)
/// unless it is there already, connecting first if `connection` is empty.
pub(crate) fn advance_slot(config: &PostgresConfig, connection: &mut Option<Client>, lsn: u64) -> Result<(), Failure> {
    if connection.is_none() {
        *connection = Some(connect(config)?);
    }
    let client = connection.as_mut().expect("connected above");
    let slot = &config.slot;
    match catalog::slot_position(client, slot)? {
        None => Err(Failure::config(format!("replication slot {slot} was dropped while the source ran"))),
        Some(confirmed) if confirmed >= lsn => Ok(()),
        Some(_) => {
            client.query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)", &[slot, &format_lsn(lsn)])?;
            tracing::debug!(slot, lsn = %format_lsn(lsn), "advanced the replication slot to a committed checkpoint");
            Ok(())
        }
    }
}

/// Checks that the slot can resume after offset `from`: it exists and has
/// not confirmed anything past `from` (the slot cannot go back, so the
/// transactions between would be lost).
fn check_resume(slot: &str, from: u64, confirmed: Option<u64>) -> Result<(), Failure> {
    match confirmed {
        None => Err(Failure::config(format!(
            "replication slot {slot} does not exist: cannot resume after {}; \
             start without offset to take a new snapshot",
            format_lsn(from)
        ))),
        Some(confirmed) if confirmed > from => Err(Failure::config(format!(
            "replication slot {slot} is already at {}, past the offset {} to resume after: \
             the changes between were handed out before and the slot no longer has them; \
             resume from the latest offset, or start without offset to take a new snapshot",
            format_lsn(confirmed),
            format_lsn(from)
        ))),
        Some(_) => Ok(()),
    }
}

/// The rows of a simple query, as text values.
fn simple_rows(messages: Vec<SimpleQueryMessage>) -> Vec<Vec<Option<String>>> {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => {
                Some((0..row.columns().len()).map(|i| row.try_get(i).ok().flatten().map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resuming_checks_the_slot() {
        assert!(check_resume("s", 0x100, Some(0x100)).is_ok());
        assert!(check_resume("s", 0x100, Some(0x80)).is_ok());
        let message = |r: Result<(), Failure>| r.unwrap_err().to_string();
        let e = message(check_resume("s", 0x100, Some(0x180)));
        assert!(e.contains("replication slot s is already at 0/180, past the offset 0/100"), "{e}");
        let e = message(check_resume("s", 0x100, None));
        assert!(e.contains("replication slot s does not exist"), "{e}");
    }
}
