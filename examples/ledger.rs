//! An event-sourced ledger (CQRS): an append-only log of account events is
//! the only source of truth, a rule rejects overdrafts, and projections of
//! the log — balances, per-account statements, daily totals per currency,
//! and the rejections with their reasons — are served over HTTP while the
//! job runs, balances as of any past time.
//!
//! ```sh
//! cargo run --release --example ledger -- generate /tmp/ledger.jsonl 200 100000
//! cargo run --release --example ledger -- run /tmp/ledger.jsonl --serve 127.0.0.1:8080 --hold -w 2
//! # or from a Kafka topic:
//! cargo run --release --example ledger -- publish 127.0.0.1:9092 ledger /tmp/ledger.jsonl
//! cargo run --release --example ledger -- run --kafka 127.0.0.1:9092 ledger --serve 127.0.0.1:8080 --hold -w 2
//! curl localhost:8080/views/balances/acct-7                        # a balance now
//! curl 'localhost:8080/views/balances/acct-7?as_of=1704070000000'  # as of a past time
//! curl 'localhost:8080/views/statements?prefix=acct-7/&limit=20'   # its statement, in time order
//! curl 'localhost:8080/views/daily?prefix=EUR/'                    # daily totals in euros
//! curl 'localhost:8080/views/rejections?limit=5'                   # overdrafts, with the reason
//! ```
//!
//! The log (JSON Lines, one event per line, in the order they were
//! appended) holds events such as
//!
//! ```text
//! {"seq":1,"time":1704067200000,"type":"opened","account":"acct-1","currency":"EUR"}
//! {"seq":2,"time":1704067200150,"type":"deposited","account":"acct-1","currency":"EUR","amount":5000}
//! {"seq":3,"time":1704067200300,"type":"withdrew","account":"acct-1","currency":"EUR","amount":1200}
//! {"seq":4,"time":1704067200420,"type":"transferred","account":"acct-1","to":"acct-2","currency":"EUR","amount":800}
//! ```
//!
//! (amounts in cents; a log may be a little out of time order, within the
//! watermark's bound of 5 s).
//!
//! **The write model.** Each currency's ledger is a consistency boundary:
//! its events are decided one after the other in event-time order (ties by
//! `seq`) by a [`KeyedProcess`] keyed by currency, which holds the ledger's
//! balances. An event is rejected, with its reason, if it would overdraw an
//! account, names an account that is not open (or is open already), moves
//! a non-positive amount, or transfers to itself or to another currency's
//! account. Ledgers of different currencies are decided in parallel on
//! different workers.
//!
//! **The read models.** The decisions (postings, with the balance after
//! each) feed the projections in parallel, keyed by account or by day: each
//! a highwater table served as a view, checkpointed with the job. A
//! replay from the start of the log rebuilds identical projections on any
//! number of workers; killed and recovered, the job serves the projections
//! an uninterrupted run would (`tests/ledger.rs`).
//!
//! Arguments of `run`: `LOG|--kafka BROKERS TOPIC [--serve ADDR] [--token T] [--checkpoint-dir DIR]
//! [--rate EVENTS_PER_S] [--out FILE] [--hold] [timely args]`. `--out`
//! writes the final projections as JSON; `--hold` keeps serving after the
//! log ends, until stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use highwater::operators::aggregate::Aggregate;
use highwater::operators::state::{KeyedContext, KeyedProcess, Schema};
use highwater::operators::table::{Table, TableReader};
use highwater::prelude::*;
use highwater::serve::{serve_views, ServeOptions, Views};
use serde::{Deserialize, Serialize};
use timely::dataflow::operators::Inspect;

/// What happened to an account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The account is opened (balance 0).
    Opened,
    /// Money comes in.
    Deposited,
    /// Money goes out.
    Withdrew,
    /// Money goes to another account of the same currency.
    Transferred,
}

/// An event of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEvent {
    /// Its position in the log (unique; orders events of one millisecond).
    pub seq: u64,
    /// Event time, epoch ms.
    pub time: u64,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// The account (for a transfer, the one paying).
    pub account: String,
    /// The currency of the account (and of the ledger that decides it).
    pub currency: String,
    /// The amount in cents (not for `opened`).
    #[serde(default)]
    pub amount: i64,
    /// A transfer's receiving account. (Never skipped when `None`: the
    /// ledger's checkpointed state holds events in a binary encoding that
    /// needs every field.)
    #[serde(default)]
    pub to: Option<String>,
}

/// A change of one account's balance, as the ledger decided it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Posting {
    /// The account.
    pub account: String,
    /// Its currency.
    pub currency: String,
    /// The event's time.
    pub time: u64,
    /// The event's position in the log.
    pub seq: u64,
    /// What happened.
    pub kind: Kind,
    /// The change of the balance (negative when money goes out).
    pub amount: i64,
    /// The balance after it.
    pub balance: i64,
    /// The other account of a transfer.
    pub counterparty: Option<String>,
}

/// An event the ledger rejected.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rejection {
    /// The event's position in the log.
    pub seq: u64,
    /// Its time.
    pub time: u64,
    /// Its account.
    pub account: String,
    /// What it asked for.
    pub kind: Kind,
    /// Its amount.
    pub amount: i64,
    /// Why it was rejected.
    pub reason: String,
}

/// An account's balance.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Balance {
    /// The currency.
    pub currency: String,
    /// In cents.
    pub balance: i64,
}

/// A day's totals in one currency, in cents.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DayTotals {
    /// Money deposited.
    pub deposited: i64,
    /// Money withdrawn.
    pub withdrawn: i64,
    /// Money moved between accounts.
    pub transferred: i64,
    /// Events accepted.
    pub events: i64,
}

/// What the ledger decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// A balance changed (a transfer makes two).
    Posted(Posting),
    /// An event was rejected.
    Rejected(Rejection),
}

/// One currency's ledger: its accounts' balances, and the events waiting
/// for the watermark to pass their time.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LedgerState {
    balances: BTreeMap<String, i64>,
    waiting: BTreeMap<(u64, u64), LedgerEvent>,
    /// Every event at or before this time is decided.
    decided: Option<u64>,
}

/// The write model: decides a currency's events in event-time order.
#[derive(Debug)]
pub struct Decide;

impl LedgerState {
    /// Decides `e`: the postings it makes, or why not.
    fn decide(&mut self, e: &LedgerEvent) -> Result<Vec<Posting>, String> {
        let posting = |account: &str, kind, amount, balance, counterparty: Option<&String>| Posting {
            account: account.to_owned(),
            currency: e.currency.clone(),
            time: e.time,
            seq: e.seq,
            kind,
            amount,
            balance,
            counterparty: counterparty.cloned(),
        };
        if e.kind == Kind::Opened {
            if self.balances.contains_key(&e.account) {
                return Err(format!("{} is open already", e.account));
            }
            self.balances.insert(e.account.clone(), 0);
            return Ok(vec![posting(&e.account, Kind::Opened, 0, 0, None)]);
        }
        if e.amount <= 0 {
            return Err(format!("the amount must be positive, not {}", e.amount));
        }
        let Some(&balance) = self.balances.get(&e.account) else {
            return Err(format!("{} is not an open {} account", e.account, e.currency));
        };
        match e.kind {
            Kind::Opened => unreachable!("handled above"),
            Kind::Deposited => {
                let after = balance + e.amount;
                self.balances.insert(e.account.clone(), after);
                Ok(vec![posting(&e.account, Kind::Deposited, e.amount, after, None)])
            }
            Kind::Withdrew | Kind::Transferred => {
                if balance < e.amount {
                    return Err(format!("overdraft: the balance of {} is {balance}, {} asked", e.account, e.amount));
                }
                if e.kind == Kind::Withdrew {
                    self.balances.insert(e.account.clone(), balance - e.amount);
                    return Ok(vec![posting(&e.account, Kind::Withdrew, -e.amount, balance - e.amount, None)]);
                }
                let Some(to) = e.to.as_ref() else { return Err("a transfer needs a receiving account".into()) };
                if *to == e.account {
                    return Err("a transfer to the same account".into());
                }
                let Some(&received) = self.balances.get(to) else {
                    return Err(format!("{to} is not an open {} account", e.currency));
                };
                self.balances.insert(e.account.clone(), balance - e.amount);
                self.balances.insert(to.clone(), received + e.amount);
                Ok(vec![
                    posting(&e.account, Kind::Transferred, -e.amount, balance - e.amount, Some(to)),
                    posting(to, Kind::Transferred, e.amount, received + e.amount, Some(&e.account)),
                ])
            }
        }
    }
}

impl KeyedProcess<String, LedgerEvent> for Decide {
    type State = LedgerState;
    type Output = Decision;
    const SCHEMA: Schema = Schema::new("example.ledger", 1);

    fn on_record(
        &self,
        ctx: &mut KeyedContext<'_, String, LedgerState, Decision>,
        event: LedgerEvent,
        time: Timestamp,
        diff: i64,
    ) {
        if diff <= 0 {
            return; // the log is append-only
        }
        let ledger = ctx.state_or_insert_with(LedgerState::default);
        if let Some(decided) = ledger.decided.filter(|d| time <= *d) {
            // Later than the log's disorder allows (the source's watermark
            // had passed it): events after it are decided already.
            let reason = format!("arrived after the events up to {decided} were decided");
            ctx.emit(Decision::Rejected(reject(&event, reason)), time, 1);
            return;
        }
        ledger.waiting.insert((time, event.seq), event);
        ctx.schedule(time);
    }

    fn on_timer(&self, ctx: &mut KeyedContext<'_, String, LedgerState, Decision>, at: Timestamp) {
        let Some(ledger) = ctx.state_mut().as_mut() else { return };
        let later = ledger.waiting.split_off(&(at + 1, 0));
        let due = std::mem::replace(&mut ledger.waiting, later);
        ledger.decided = Some(at);
        let mut decisions = Vec::new();
        for ((time, _), event) in due {
            match ledger.decide(&event) {
                Ok(postings) => decisions.extend(postings.into_iter().map(|p| (Decision::Posted(p), time))),
                Err(reason) => decisions.push((Decision::Rejected(reject(&event, reason)), time)),
            }
        }
        for (decision, time) in decisions {
            ctx.emit(decision, time, 1);
        }
    }
}

fn reject(e: &LedgerEvent, reason: String) -> Rejection {
    Rejection { seq: e.seq, time: e.time, account: e.account.clone(), kind: e.kind, amount: e.amount, reason }
}

/// Sums a day's postings per currency.
struct Daily;

impl Aggregate<Posting> for Daily {
    type Acc = DayTotals;
    type Output = DayTotals;
    fn init(&self) -> DayTotals {
        DayTotals::default()
    }
    fn update(&self, acc: &mut DayTotals, p: &Posting, diff: i64) {
        match p.kind {
            Kind::Opened => {}
            Kind::Deposited => acc.deposited += p.amount * diff,
            Kind::Withdrew => acc.withdrawn -= p.amount * diff,
            // Each transfer posts twice: count the paying side.
            Kind::Transferred if p.amount < 0 => acc.transferred -= p.amount * diff,
            Kind::Transferred => return,
        }
        acc.events += diff;
    }
    fn merge(&self, acc: &mut DayTotals, other: DayTotals) {
        acc.deposited += other.deposited;
        acc.withdrawn += other.withdrawn;
        acc.transferred += other.transferred;
        acc.events += other.events;
    }
    fn output(&self, acc: &DayTotals) -> Option<DayTotals> {
        (acc.events != 0).then(|| acc.clone())
    }
}

/// `yyyy-mm-dd` of an epoch time in ms (UTC).
pub fn day_of(ms: u64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = (ms / 86_400_000) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The key of a statement line: the account, then time and position, so
/// that a prefix scan of `account/` gives its statement in time order.
pub fn statement_key(p: &Posting) -> String {
    format!("{}/{:013}/{:010}", p.account, p.time, p.seq)
}

/// The key of a rejection: time and position.
pub fn rejection_key(r: &Rejection) -> String {
    format!("{:013}/{:010}", r.time, r.seq)
}

/// The projections, as served.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Projections {
    /// By account.
    pub balances: BTreeMap<String, Balance>,
    /// By [`statement_key`].
    pub statements: BTreeMap<String, Posting>,
    /// By `currency/yyyy-mm-dd`.
    pub daily: BTreeMap<String, DayTotals>,
    /// By [`rejection_key`].
    pub rejections: BTreeMap<String, Rejection>,
}

/// The served views of the projections.
#[derive(Clone, Debug)]
pub struct Readers {
    /// The registry, to serve.
    pub views: Views,
    /// Balances by account (all history kept: as of any time).
    pub balances: TableReader<String, Balance>,
    /// Statement lines.
    pub statements: TableReader<String, Posting>,
    /// Daily totals per currency.
    pub daily: TableReader<String, DayTotals>,
    /// Rejections.
    pub rejections: TableReader<String, Rejection>,
}

impl Readers {
    /// The views, balances keeping every past time.
    pub fn new() -> Self {
        let views = Views::new();
        Readers {
            balances: views.table("balances", Timestamp::MAX),
            statements: views.table("statements", 0),
            daily: views.table("daily", 0),
            rejections: views.table("rejections", 0),
            views,
        }
    }

    /// What the views hold now.
    pub fn projections(&self) -> Projections {
        Projections {
            balances: self.balances.snapshot().into_iter().collect(),
            statements: self.statements.snapshot().into_iter().collect(),
            daily: self.daily.snapshot().into_iter().collect(),
            rejections: self.rejections.snapshot().into_iter().collect(),
        }
    }
}

impl Default for Readers {
    fn default() -> Self {
        Self::new()
    }
}

/// How to run the ledger.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The log, a JSON Lines file (unless `kafka` is given).
    pub log: PathBuf,
    /// The log in a Kafka topic instead: `(brokers, topic)`, read from its
    /// start to the end it has when the job starts (feature `kafka`).
    pub kafka: Option<(String, String)>,
    /// Checkpoints (and recovery from the latest) in this directory.
    pub checkpoints: Option<PathBuf>,
    /// At most this many events a second.
    pub rate: Option<f64>,
    /// timely's arguments (`-w`, `-n`, `-p`, `-h`).
    pub timely: Vec<String>,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The checkpoint it resumed from, if it did.
    pub recovered_from: Option<u64>,
    /// Whether the job's final checkpoint is written (always, when
    /// checkpointed and the run returns).
    pub final_checkpoint: bool,
}

/// Runs the ledger over its log into `readers`' views.
pub fn run(options: &RunOptions, readers: &Readers) -> anyhow::Result<Ran> {
    let mut job = Job::from_args(&options.timely)?;
    if let Some(dir) = &options.checkpoints {
        job = job.checkpointed(
            CheckpointConfig::new(dir.display().to_string()).every(std::time::Duration::from_millis(200)).recovering(),
        );
    }
    let source = LogSource::open(options)?;
    let (readers, rate) = (readers.clone(), options.rate);
    let report = job.run(move |worker| {
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let options = SourceOptions {
                name: "Log".into(),
                watermark: WatermarkStrategy::bounded(5_000),
                batch_size: 256,
                rate_limit: rate,
                ..Default::default()
            };
            let log = source.read(scope, options)?;
            let decisions = log.events.process_keyed("Ledger", |e: &LedgerEvent| e.currency.clone(), Decide);
            let postings = decisions.flat_map(|d| match d {
                Decision::Posted(p) => Some(p),
                Decision::Rejected(_) => None,
            });
            let rejections = decisions.flat_map(|d| match d {
                Decision::Rejected(r) => Some(r),
                Decision::Posted(_) => None,
            });
            // Balances: the last posting of each account at each time.
            let balances = postings
                .map(|p| (p.account.clone(), Some(Balance { currency: p.currency.clone(), balance: p.balance })));
            balances.upsert().table.serve(&readers.balances);
            Table::from_changelog(&postings.map(|p| (statement_key(&p), p))).serve(&readers.statements);
            let daily = postings.aggregate_by_key(|p: &Posting| format!("{}/{}", p.currency, day_of(p.time)), Daily);
            Table::from_changelog(&daily).serve(&readers.daily);
            Table::from_changelog(&rejections.map(|r| (rejection_key(&r), r))).serve(&readers.rejections);
            log.dead_letters.inner.inspect(|(d, _, _)| eprintln!("dead letter: {d}"));
            Ok(())
        })
    })?;
    Ok(Ran { recovered_from: report.recovered_from, final_checkpoint: report.final_checkpoint })
}

/// Where the log is read from.
enum LogSource {
    File(Arc<JsonLines<JsonDecoder<LedgerEvent>>>),
    #[cfg(feature = "kafka")]
    Kafka(Arc<highwater::kafka::KafkaSource<JsonDecoder<LedgerEvent>>>),
}

impl LogSource {
    fn open(options: &RunOptions) -> anyhow::Result<LogSource> {
        if let Some((brokers, topic)) = &options.kafka {
            #[cfg(feature = "kafka")]
            {
                use highwater::kafka::{KafkaConfig, KafkaSource, StopAt};
                let config = KafkaConfig::new(brokers.clone());
                let source = KafkaSource::new(config, [topic.clone()], JsonDecoder::<LedgerEvent>::new());
                return Ok(LogSource::Kafka(Arc::new(source.stop_at(StopAt::Latest))));
            }
            #[cfg(not(feature = "kafka"))]
            bail!("reading the log from Kafka ({brokers}, {topic}) needs the feature kafka");
        }
        let file = JsonLines::files_with_block_size(&[&options.log], JsonDecoder::<LedgerEvent>::new(), 64 * 1024)
            .with_context(|| format!("opening the log {}", options.log.display()))?;
        Ok(LogSource::File(Arc::new(file)))
    }

    fn read<'scope>(
        &self,
        scope: timely::dataflow::Scope<'scope, Timestamp>,
        options: SourceOptions,
    ) -> anyhow::Result<highwater::source::SourceStreams<'scope, LedgerEvent>> {
        let time = |e: &LedgerEvent| e.time;
        Ok(match self {
            LogSource::File(file) => read(scope, Arc::clone(file), time, options, &SourceMetrics::default(), None)?,
            #[cfg(feature = "kafka")]
            LogSource::Kafka(topic) => read(scope, Arc::clone(topic), time, options, &SourceMetrics::default(), None)?,
        })
    }
}

/// Appends `log` to the Kafka topic `topic` (made with 3 partitions if it
/// does not exist), each event keyed by its currency: a currency's events
/// keep their order.
#[cfg(feature = "kafka")]
pub fn publish(brokers: &str, topic: &str, log: &[LedgerEvent]) -> anyhow::Result<()> {
    use highwater::kafka::{create_topic, KafkaConfig, Producer};
    let config = KafkaConfig::new(brokers);
    create_topic(&config, topic, 3)?;
    let producer = Producer::new(&config)?;
    for e in log {
        producer.send(topic, None, Some(e.currency.as_bytes()), &serde_json::to_vec(e)?)?;
    }
    producer.flush(std::time::Duration::from_secs(60))?;
    Ok(())
}

/// A log of `events` events over `accounts` accounts in EUR and USD, a
/// little out of time order, with overdrafts and mistakes among them
/// (deterministic in `seed`).
pub fn generate(accounts: u64, events: u64, seed: u64) -> Vec<LedgerEvent> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    let mut next = move |n: u64| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n.max(1)
    };
    let currency = |a: u64| if a % 3 == 0 { "USD" } else { "EUR" };
    let start = 1_704_067_200_000u64; // 2024-01-01
    let mut log = Vec::new();
    let mut time = start;
    for seq in 1..=events {
        // An event every 2 s of event time on average, a day every 43 200
        // events; some go back in time by up to 4 s (within the watermark's
        // bound of 5 s).
        time += next(4_000);
        let at = time.saturating_sub(if next(10) == 0 { next(4_000) } else { 0 }).max(start);
        let account_no = if seq <= accounts { seq - 1 } else { next(accounts + 2) };
        let account = format!("acct-{account_no}");
        let cur = currency(account_no).to_owned();
        let (kind, amount, to) = if seq <= accounts {
            (Kind::Opened, 0, None)
        } else {
            match next(20) {
                0..=7 => (Kind::Deposited, 1 + next(10_000) as i64, None),
                8..=13 => (Kind::Withdrew, 1 + next(8_000) as i64, None),
                14..=18 => (Kind::Transferred, 1 + next(6_000) as i64, Some(format!("acct-{}", next(accounts + 1)))),
                _ => (Kind::Withdrew, -(next(50) as i64), None),
            }
        };
        log.push(LedgerEvent { seq, time: at, kind, account, currency: cur, amount, to });
    }
    log
}

/// Writes `log` as JSON Lines.
pub fn write_log(path: &Path, log: &[LedgerEvent]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for e in log {
        serde_json::to_writer(&mut out, e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

#[allow(dead_code)] // the tests include this file for its functions
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ledger generate LOG ACCOUNTS EVENTS | ledger publish BROKERS TOPIC LOG | \
                 ledger run LOG|--kafka BROKERS TOPIC [--serve ADDR] [--token T] [--checkpoint-dir DIR] [--rate N] \
                 [--out FILE] [--hold] [timely args]";
    match args.first().map(String::as_str) {
        Some("generate") => {
            let [_, path, accounts, events] = args.as_slice() else { bail!(usage) };
            let log = generate(accounts.parse()?, events.parse()?, 7);
            write_log(Path::new(path), &log)?;
            println!("{} events written to {path}", log.len());
            Ok(())
        }
        #[cfg(feature = "kafka")]
        Some("publish") => {
            let [_, brokers, topic, path] = args.as_slice() else { bail!(usage) };
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
            let log: Vec<LedgerEvent> =
                text.lines().filter(|l| !l.trim().is_empty()).map(serde_json::from_str).collect::<Result<_, _>>()?;
            publish(brokers, topic, &log)?;
            println!("{} events appended to {topic}", log.len());
            Ok(())
        }
        Some("run") => {
            let first = args.get(1).context(usage)?;
            let mut options = RunOptions::default();
            let mut skip = 2;
            if first == "--kafka" {
                let (brokers, topic) = (args.get(2).context(usage)?, args.get(3).context(usage)?);
                options.kafka = Some((brokers.clone(), topic.clone()));
                skip = 4;
            } else {
                options.log = PathBuf::from(first);
            }
            let (mut serve, mut token, mut out, mut hold) = (None, None, None, false);
            let mut rest = args[skip..].iter();
            while let Some(arg) = rest.next() {
                let mut value = || rest.next().cloned().with_context(|| format!("{arg} needs a value"));
                match arg.as_str() {
                    "--serve" => serve = Some(value()?.parse::<std::net::SocketAddr>()?),
                    "--token" => token = Some(value()?),
                    "--checkpoint-dir" => options.checkpoints = Some(PathBuf::from(value()?)),
                    "--rate" => options.rate = Some(value()?.parse()?),
                    "--out" => out = Some(PathBuf::from(value()?)),
                    "--hold" => hold = true,
                    _ => options.timely.push(arg.clone()),
                }
            }
            let readers = Readers::new();
            let server = match serve {
                Some(addr) => {
                    let server =
                        serve_views(addr, readers.views.clone(), ServeOptions { token, ..Default::default() })?;
                    eprintln!("views at http://{}/views", server.local_addr());
                    Some(server)
                }
                None => None,
            };
            let ran = run(&options, &readers)?;
            anyhow::ensure!(
                ran.final_checkpoint || options.checkpoints.is_none(),
                "the job ended without its final checkpoint"
            );
            if let Some(id) = ran.recovered_from {
                eprintln!("recovered from checkpoint {id}");
            }
            let projections = readers.projections();
            eprintln!(
                "{} accounts, {} statement lines, {} days, {} rejections",
                projections.balances.len(),
                projections.statements.len(),
                projections.daily.len(),
                projections.rejections.len()
            );
            if let Some(path) = out {
                std::fs::write(&path, serde_json::to_vec_pretty(&projections)?)?;
            }
            if hold && server.is_some() {
                eprintln!("the log has ended; serving until stopped");
                loop {
                    std::thread::park();
                }
            }
            Ok(())
        }
        _ => bail!(usage),
    }
}
