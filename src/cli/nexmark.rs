//! `highwater nexmark`: one Nexmark query over a file, Kafka or the generator.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::ProbeHandle;

use super::progress::{summary, Gauges, Progress};
use crate::checkpoint::{CheckpointConfig, Checkpoints};
use crate::dead_letter::DeadLetter;
use crate::job::{Job, JobError};
use crate::kafka::{create_topic, KafkaConfig, KafkaSink, KafkaSinkMode, KafkaSource, TextEncoder};
use crate::nexmark::queries::{q10_partition, QueryKind};
use crate::nexmark::{
    build, Event, Generator, GeneratorConfig, GeneratorSource, NexmarkDecoder, Query, QueryOptions, QueryOutput,
};
use crate::operators::table::{Table, TableReader};
use crate::operators::{EventStream, Timestamp};
use crate::sink::{
    write, write_json_lines, write_lines, write_parts, write_postgres, LineTarget, PartFiles, PartFormat, Placement,
    PostgresCommitter, PostgresSinkConfig, Sink, SinkError, SinkHandle, SinkMode,
};
use crate::source::{
    read, JsonLines, MemorySource, SourceMetrics, SourceOptions, SourceStreams, DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
};
use crate::time::{Millis, WatermarkStrategy};

/// Arguments of `highwater nexmark`.
#[derive(Debug, Args)]
pub(super) struct NexmarkArgs {
    /// The query, q0 to q22.
    #[arg(long, short)]
    query: Query,
    /// Nexmark JSON Lines input files (`-` for stdin).
    #[arg(long, short, num_args = 1.., conflicts_with = "events")]
    input: Vec<PathBuf>,
    /// Generate this many events instead of reading a file.
    #[arg(long, short)]
    events: Option<u64>,
    /// The Kafka cluster (`HOST:PORT[,HOST:PORT...]`) of --topic and
    /// --output-topic.
    #[arg(long, value_name = "BROKERS")]
    kafka: Option<String>,
    /// Read the events from the partitions of these Kafka topics (Nexmark
    /// JSON, one event per record).
    #[arg(long, value_name = "TOPIC", num_args = 1.., requires = "kafka", conflicts_with_all = ["input", "events"])]
    topic: Vec<String>,
    /// Write the rows to this Kafka topic (created with 4 partitions if
    /// missing): one record per row, CSV without a header (--format json:
    /// a JSON object per row). At least once by default: the idempotent
    /// producer on every worker, flushed before each checkpoint completes;
    /// a recovered job produces again what followed its checkpoint
    /// (--exactly-once: Kafka transactions). An updating query writes its
    /// changelog, each record with a header `diff` (1 or -1).
    #[arg(long, value_name = "TOPIC", requires = "kafka", conflicts_with_all = ["output", "output_dir", "output_postgres", "discard"])]
    output_topic: Option<String>,
    /// --kafka: also write the records that fail to decode to this topic
    /// (created with one partition if missing): the record as it came, its
    /// origin as the key, the reason, topic, partition and offset in
    /// headers (`highwater.reason`, `highwater.topic`, ...).
    #[arg(long, value_name = "TOPIC", requires = "kafka")]
    dead_letter_topic: Option<String>,
    /// --output-topic: `csv` (the default) or `json`.
    #[arg(long, default_value = "csv", requires = "output_topic")]
    format: OutputFormat,
    /// --output-topic, exactly once (needs --checkpoint-dir): the rows of
    /// each checkpoint are produced in Kafka transactions committed with it
    /// (`transactional.id` `highwater-q{N}-{topic}-{worker}`, progress
    /// records in `{topic}-highwater-progress`); `read_committed` readers
    /// see every row once, whenever the job is killed and recovered.
    #[arg(long, requires_all = ["output_topic", "checkpoint_dir"])]
    exactly_once: bool,
    /// --kafka: where to start without a checkpoint: earliest, latest,
    /// group (the consumer group's committed offsets) or a timestamp in ms.
    #[arg(long, default_value = "earliest", requires = "topic")]
    from: crate::kafka::StartFrom,
    /// --kafka: `latest` reads up to the end offsets found at start, then
    /// ends (a bounded run); `never` (the default) follows the topic.
    #[arg(long, default_value = "never", requires = "topic")]
    to: crate::kafka::StopAt,
    /// --kafka: the consumer group.
    #[arg(long, default_value = crate::kafka::DEFAULT_GROUP, requires = "topic")]
    group: String,
    /// Generator: events per second of event time.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Generator: random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Generator: out-of-orderness bound (e.g. 2s).
    #[arg(long, default_value = "0ms")]
    max_out_of_order: Millis,
    /// Generator: pace events by the wall clock (event time = now).
    #[arg(long)]
    real_time: bool,
    /// The CSV output file (default stdout). For q10, a directory of
    /// `dt=yyyy-MM-dd/hm=HH/part-0.csv` files.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Count the rows without formatting or writing them: a blackhole sink,
    /// for benchmarks (`--output /dev/null` measures with CSV formatting).
    #[arg(long, conflicts_with = "output")]
    discard: bool,
    /// Watermark delay behind the greatest event time seen, per partition.
    #[arg(long, default_value = "4s")]
    watermark_delay: Millis,
    /// How long late records may still correct window results.
    #[arg(long, default_value = "0ms")]
    allowed_lateness: Millis,
    /// A partition without records for this long stops holding the watermark.
    #[arg(long, default_value = "5s")]
    idle_timeout: Millis,
    /// q13's side input: a file of `key,value` lines.
    #[arg(long)]
    side_input: Option<PathBuf>,
    /// Write records that fail to parse here, as JSON Lines.
    #[arg(long)]
    dead_letters: Option<PathBuf>,
    /// Input files are split into blocks of this many bytes, each a
    /// partition that one worker reads.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    block_size: u64,
    /// Input lines longer than this many bytes become dead letters (with
    /// their length and offset) instead of records: memory stays bounded.
    #[arg(long, default_value_t = DEFAULT_MAX_RECORD_SIZE)]
    max_record_size: usize,
    /// Records per source read (the watermark advances between reads).
    #[arg(long, default_value_t = 4096)]
    batch_size: usize,
    /// Advance the watermark at most once per this interval of processing
    /// time (e.g. 200ms), instead of after every read of --batch-size records.
    #[arg(long)]
    watermark_interval: Option<Millis>,
    /// Records in flight between the workers (sent, not yet taken by the
    /// operator they go to) per worker, above which the sources pause.
    #[arg(long, default_value_t = 100_000)]
    max_in_flight: usize,
    /// Watermark alignment: a source partition more than this much event
    /// time ahead of the job's watermark waits for the others (bounds the
    /// state of windows and joins when partitions read at different
    /// speeds); `off` to read unaligned.
    #[arg(long, default_value = "10s")]
    max_drift: super::progress::Drift,
    /// Print a progress line every second.
    #[arg(long)]
    progress: bool,
    /// Serve the job's Prometheus metrics at `http://ADDR/metrics` and its
    /// status page at `http://ADDR/` while it runs (e.g. `127.0.0.1:9464`;
    /// port 0 picks one, printed on stderr).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Serve the query's result as a view over HTTP at `http://ADDR/views/qN`
    /// (rows keyed by their CSV text, values by column name: point reads,
    /// prefix scans by leading columns, as-of reads within --serve-retain,
    /// subscriptions), with the metrics and the status page on the same
    /// address (see the README, "Views over HTTP").
    #[arg(long, value_name = "ADDR")]
    serve_addr: Option<std::net::SocketAddr>,
    /// The bearer token every request to --serve-addr must carry (required
    /// on a non-loopback address).
    #[arg(long, value_name = "TOKEN", requires = "serve_addr")]
    serve_token: Option<String>,
    /// How long the served result keeps its history for as-of reads, in
    /// event time (e.g. `10m`).
    #[arg(long, default_value = "0ms", requires = "serve_addr")]
    serve_retain: Millis,
    /// Measure latency and print its percentiles at the end: from the
    /// instant a source read a record to the instant the sink emitted an
    /// update at its event time, and from the instant the watermark passed
    /// an update's time (a window's end) to its emission. On one process.
    #[arg(long)]
    latency: bool,
    /// Pace the input in processing time: at most this many events a second
    /// over all workers (file and generator alike), to measure latency below
    /// saturation.
    #[arg(long, value_name = "EVENTS_PER_SECOND")]
    rate_limit: Option<f64>,
    /// Read the events and count them without running the query: the
    /// baseline benchmarks compare queries with.
    #[arg(long)]
    source_only: bool,
    /// Generator: partitions (default one per worker, 4 with checkpoints so
    /// that a job can recover with a different number of workers).
    #[arg(long)]
    partitions: Option<usize>,
    /// Take checkpoints into this directory (or `s3://bucket/prefix`).
    #[arg(long)]
    checkpoint_dir: Option<String>,
    #[command(flatten)]
    state: super::state::StateArgs,
    /// Processing time between checkpoints.
    #[arg(long, default_value = "1s", requires = "checkpoint_dir")]
    checkpoint_interval: Millis,
    /// Complete checkpoints to keep.
    #[arg(long, default_value_t = 3, requires = "checkpoint_dir")]
    checkpoints_kept: usize,
    /// Resume from the latest complete checkpoint in --checkpoint-dir (start
    /// afresh if there is none).
    #[arg(long, requires = "checkpoint_dir")]
    recover: bool,
    /// With several processes (-n): where process 0 coordinates the
    /// checkpoints (HOST:PORT; default: process 0's host, its port + 1000).
    #[arg(long, requires = "checkpoint_dir")]
    checkpoint_coordinator: Option<String>,
    /// Exactly-once output: a directory of committed CSV part files
    /// (`part-{checkpoint}.csv`, each with the header row), one per checkpoint.
    /// An updating query's parts hold its changelog: each row with a last
    /// column `diff` (1 inserted, -1 retracted).
    #[arg(long, requires = "checkpoint_dir", conflicts_with_all = ["output", "discard"])]
    output_dir: Option<PathBuf>,
    /// Exactly-once output to a PostgreSQL table: a connection string
    /// (`host=… port=… user=… dbname=…`, or a `postgresql://` URL; no TLS).
    /// Each checkpoint's rows are upserted (retractions deleted) by key in one
    /// transaction with the sink's progress.
    #[arg(long, value_name = "CONNINFO", requires = "checkpoint_dir", conflicts_with_all = ["output", "output_dir", "discard"])]
    output_postgres: Option<String>,
    /// --output-postgres: the table (`name` or `schema.name`; default
    /// `nexmark_q{N}`), created if missing with a `text` column per output column.
    #[arg(long, value_name = "NAME", requires = "output_postgres")]
    output_table: Option<String>,
    /// --output-postgres: the table's primary key columns (default: all the
    /// query's columns).
    #[arg(long, value_name = "COL,COL", value_delimiter = ',', requires = "output_postgres")]
    output_key: Vec<String>,
    /// Timely arguments: -w THREADS, -n PROCESSES, -p INDEX, -h HOSTFILE.
    #[arg(last = true)]
    timely: Vec<String>,
}

/// How rows are written to a Kafka topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum OutputFormat {
    /// The CSV row, without a header.
    Csv,
    /// A JSON object, the header's names as keys, every value a string.
    Json,
}

/// The CSV `row` as a JSON object with `names` as keys.
fn row_as_json(names: &[&str], row: &str) -> String {
    row_object(names, row).to_string()
}

/// A row's columns by name (a served result's values).
type Columns = std::collections::BTreeMap<String, String>;

/// A CSV row's columns by name (rows are written by the queries: never
/// malformed; if one were, the row itself under `row`).
fn row_columns(names: &[&str], row: &str) -> Columns {
    match crate::sink::parse_csv_line(row) {
        Ok(fields) => names.iter().map(|n| (*n).to_owned()).zip(fields).collect(),
        Err(_) => Columns::from([("row".to_owned(), row.to_owned())]),
    }
}

/// A CSV row as a JSON object of its columns by name.
fn row_object(names: &[&str], row: &str) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    match crate::sink::parse_csv_line(row) {
        Ok(fields) => {
            for (name, field) in names.iter().zip(fields) {
                object.insert((*name).to_owned(), serde_json::Value::String(field));
            }
        }
        // Rows are written by the queries: never malformed.
        Err(e) => {
            object.insert("row".to_owned(), serde_json::Value::String(row.to_owned()));
            object.insert("error".to_owned(), serde_json::Value::String(e.to_string()));
        }
    }
    serde_json::Value::Object(object)
}

/// Reads q13's side input.
fn read_side_input(path: &PathBuf) -> anyhow::Result<HashMap<i64, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading side input {}", path.display()))?;
    let mut map = HashMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (key, value) = line
            .split_once(',')
            .with_context(|| format!("{}:{}: expected `key,value`, got {line:?}", path.display(), n + 1))?;
        let key = key
            .trim()
            .parse()
            .with_context(|| format!("{}:{}: key {key:?} is not an integer", path.display(), n + 1))?;
        map.insert(key, value.to_owned());
    }
    Ok(map)
}

/// Where the events come from.
pub(super) enum Input {
    Files(Arc<JsonLines<NexmarkDecoder>>),
    Generator(Arc<Generator>),
    Kafka(Arc<KafkaSource<NexmarkDecoder>>),
}

/// Reads the events of `input` into the dataflow.
pub(super) fn events<'scope>(
    scope: timely::dataflow::Scope<'scope, Timestamp>,
    input: &Input,
    options: SourceOptions,
    gauges: &Gauges,
    probe: &ProbeHandle<Timestamp>,
) -> anyhow::Result<SourceStreams<'scope, Event>> {
    let time = |e: &Event| e.time();
    Ok(match input {
        Input::Files(source) => read(scope, Arc::clone(source), time, options, &gauges.source, Some(probe.clone()))?,
        Input::Generator(g) => {
            let source = Arc::new(GeneratorSource::new(Arc::clone(g), scope.peers()));
            read(scope, source, time, options, &gauges.source, Some(probe.clone()))?
        }
        Input::Kafka(source) => read(scope, Arc::clone(source), time, options, &gauges.source, Some(probe.clone()))?,
    })
}

/// Writes dead letters to a file, or reports the first few on stderr.
pub(super) fn dead_letter_sink(dead: &EventStream<'_, DeadLetter>, path: Option<&PathBuf>) -> Option<SinkHandle> {
    match path {
        Some(path) => Some(write_json_lines(dead, LineTarget::File(path.clone()), SinkMode::Append)),
        None => {
            let mut shown = 0;
            dead.inner.clone().sink(Pipeline, "ReportDeadLetters", move |(input, _)| {
                input.for_each_stamp(|_, data| {
                    for batch in data {
                        for (d, _, _) in batch.drain(..) {
                            shown += 1;
                            if shown <= 5 {
                                tracing::warn!("dead letter: {d}");
                            }
                        }
                    }
                });
            });
            None
        }
    }
}

/// Records the frontier of `stream` (the output watermark) from worker 0,
/// passing its updates on: an operator that only watched (a second reader of
/// the stream) would get a copy of every batch.
///
/// Every worker builds the operator (timely needs the same dataflow on every
/// worker); only worker 0 stores, the frontier being the same everywhere.
pub(super) fn watch_watermark<'scope>(
    stream: &EventStream<'scope, String>,
    gauges: &Gauges,
) -> EventStream<'scope, String> {
    let gauge = (stream.scope().index() == 0).then(|| Arc::clone(&gauges.watermark));
    let inner = stream.inner.clone().unary_frontier(Pipeline, "WatchWatermark", move |_cap, _info| {
        move |(input, frontier), output| {
            input.for_each_stamp(|cap, data| {
                for batch in data {
                    output.session(&cap).give_container(batch);
                }
            });
            if let Some(gauge) = &gauge {
                gauge.store(crate::operators::time::watermark_of(frontier), Ordering::Relaxed);
            }
        }
    });
    if stream.is_append_only() {
        EventStream::append_only(inner)
    } else {
        EventStream::new(inner)
    }
}

/// q10's sink: rows into `dir/dt=yyyy-MM-dd/hm=HH/part-0.csv`, by the row's `dateTime`.
struct PartitionedCsv {
    dir: PathBuf,
    header: String,
    files: HashMap<String, std::io::BufWriter<std::fs::File>>,
}

impl PartitionedCsv {
    fn file(&mut self, part: String) -> Result<&mut std::io::BufWriter<std::fs::File>, SinkError> {
        use std::io::Write;
        let path = self.dir.join(&part);
        if !self.files.contains_key(&part) {
            let io = |source| SinkError::Io { what: path.display().to_string(), source };
            std::fs::create_dir_all(&path).map_err(io)?;
            let mut w = std::io::BufWriter::new(std::fs::File::create(path.join("part-0.csv")).map_err(io)?);
            w.write_all(self.header.as_bytes()).and_then(|_| w.write_all(b"\n")).map_err(io)?;
            self.files.insert(part.clone(), w);
        }
        Ok(self.files.get_mut(&part).expect("inserted above"))
    }
}

impl Sink for PartitionedCsv {
    type Item = String;

    fn write(&mut self, updates: &mut Vec<(String, Timestamp, i64)>) -> Result<u64, SinkError> {
        use std::io::Write;
        let mut written = 0;
        for (line, _, diff) in updates.drain(..) {
            let date_time: u64 = line.split(',').nth(3).and_then(|t| t.parse().ok()).unwrap_or(0);
            let dir = self.dir.clone();
            let file = self.file(q10_partition(date_time))?;
            for _ in 0..diff.max(0) {
                file.write_all(line.as_bytes())
                    .and_then(|_| file.write_all(b"\n"))
                    .map_err(|source| SinkError::Io { what: dir.display().to_string(), source })?;
                written += 1;
            }
        }
        Ok(written)
    }

    fn finish(&mut self) -> Result<u64, SinkError> {
        use std::io::Write;
        for (part, f) in self.files.iter_mut() {
            f.flush().map_err(|source| SinkError::Io { what: self.dir.join(part).display().to_string(), source })?;
        }
        Ok(0)
    }
}

/// The `--output-postgres` settings, all but the columns (the query's header).
#[derive(Clone, Debug)]
struct PostgresOutput {
    conninfo: String,
    table: String,
    key: Vec<String>,
}

impl PostgresOutput {
    fn from_args(args: &NexmarkArgs) -> Option<PostgresOutput> {
        let conninfo = args.output_postgres.clone()?;
        let table = args.output_table.clone().unwrap_or_else(|| format!("nexmark_q{}", args.query.0));
        Some(PostgresOutput { conninfo, table, key: args.output_key.clone() })
    }

    /// The sink's configuration for a query with columns `header`.
    fn config(&self, header: &[&str]) -> PostgresSinkConfig {
        let columns: Vec<String> = header.iter().map(|c| (*c).to_owned()).collect();
        let key = if self.key.is_empty() { columns.clone() } else { self.key.clone() };
        PostgresSinkConfig { conninfo: self.conninfo.clone(), table: self.table.clone(), columns, key }
    }
}

/// Before the workers of a checkpointed run start: recovers the sinks
/// (committing the restored checkpoint's output, discarding newer parts; also
/// when that checkpoint is the final one and no worker will run), and checks
/// that the query's dataflow, built once on no input, is checkpointable and
/// the one a restored checkpoint was taken by.
fn verify(
    ck: &Checkpoints,
    query: Query,
    options: &QueryOptions,
    source_only: bool,
    postgres: Option<PostgresOutput>,
    output_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    if let Some(postgres) = postgres {
        // Before the workers start (an error while they build the dataflow
        // would leave the others waiting): check the settings, connect,
        // create the tables, and recover the sink. Worker 0 registers the
        // sink again, a no-op for the database.
        let config = postgres.config(query_header(query));
        let committer = PostgresCommitter::connect("Output", &config).context("--output-postgres")?;
        ck.register_sink("Output", 0, Arc::new(committer)).context("--output-postgres")?;
    }
    if let Some(dir) = output_dir {
        ck.register_sink("Output", 0, Arc::new(PartFiles::new(dir))).context("--output-dir")?;
    }
    let options = options.clone();
    let (probe, built) = crate::checkpoint::probe(|config| {
        timely::execute(config, move |worker| {
            worker.dataflow::<Timestamp, _, _>(|scope| {
                let nothing = Arc::new(MemorySource::<Event>::new(Vec::new()));
                let metrics = SourceMetrics::default();
                if let Ok(streams) = read(scope, nothing, Event::time, SourceOptions::default(), &metrics, None) {
                    if !source_only {
                        build(query, &streams.events, &options);
                    }
                }
            })
        })
        .map(drop)
    });
    built.map_err(|e| anyhow::anyhow!("building query {query} to check it: {e}"))?;
    ck.check_dataflow(&probe).with_context(|| format!("query {query} with --checkpoint-dir"))?;
    Ok(())
}

/// The column names of `query`'s output (built over no events).
fn query_header(query: Query) -> &'static [&'static str] {
    timely::execute_directly(move |worker| {
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let events = EventStream::new(timely::dataflow::operators::generic::operator::empty(scope));
            build(query, &events, &QueryOptions::default()).header
        })
    })
}

pub(super) fn run(args: NexmarkArgs) -> anyhow::Result<()> {
    let config = crate::cluster::config_from_args(&args.timely)?;
    let checkpointed = args.checkpoint_dir.is_some();
    let mut job = Job::new(config.clone())
        .max_drift(args.max_drift.0.map(|d| Duration::from_millis(d.0)))
        .state_backend(args.state.backend()?);
    if args.latency {
        if job.in_flight().processes() > 1 {
            bail!("--latency measures on one process (each process sees only its own sources' clocks): drop -n");
        }
        job = job.measuring_latency();
    }
    if args.metrics_addr.is_some() || args.serve_addr.is_some() {
        // The operators' rates, for the metrics and the status page.
        job = job.observing();
    }
    if let Some(rate) = args.rate_limit.filter(|r| !(*r > 0.0 && r.is_finite())) {
        bail!("--rate-limit {rate}: give a positive number of events a second");
    }
    if let Some(location) = &args.checkpoint_dir {
        let mut checkpoints = CheckpointConfig::new(location.clone())
            .every(Duration::from_millis(args.checkpoint_interval.0.max(1)))
            .keeping(args.checkpoints_kept);
        if args.recover {
            checkpoints = checkpoints.recovering();
        }
        job = job.checkpointed(checkpoints);
        if let Some(coordinator) = &args.checkpoint_coordinator {
            job = job.coordinator(coordinator.clone());
        }
    }
    // Sinks write on worker 0, in process 0, which commits them.
    let process = match &config.communication {
        timely::CommunicationConfig::Cluster { process, .. } => *process,
        _ => 0,
    };
    let input = if !args.input.is_empty() {
        let source = if args.input.len() == 1 && args.input[0].as_os_str() == "-" {
            if checkpointed {
                bail!("--checkpoint-dir: stdin cannot be rewound; give the events as files (--input FILE...)");
            }
            JsonLines::stdin(NexmarkDecoder).max_record_size(args.max_record_size)
        } else {
            JsonLines::files_with_block_size(&args.input, NexmarkDecoder, args.block_size)
                .context("opening the input")?
                .max_record_size(args.max_record_size)
        };
        Input::Files(Arc::new(source))
    } else if let Some(events) = args.events {
        let generator = Generator::new(GeneratorConfig {
            events: Some(events),
            seed: args.seed,
            rate: args.rate,
            max_out_of_order_ms: args.max_out_of_order.0,
            real_time: args.real_time,
            partitions: args.partitions.unwrap_or(if checkpointed { 4 } else { 0 }),
            ..Default::default()
        })?;
        Input::Generator(Arc::new(generator))
    } else if let (Some(brokers), false) = (&args.kafka, args.topic.is_empty()) {
        let config = KafkaConfig::new(brokers.clone()).group(args.group.clone());
        Input::Kafka(Arc::new(
            KafkaSource::new(config, args.topic.clone(), NexmarkDecoder).start_from(args.from).stop_at(args.to),
        ))
    } else {
        bail!("give the events with --input FILE..., --events N or --kafka BROKERS --topic T");
    };
    let input = Arc::new(input);
    let side_input = args.side_input.as_ref().map(read_side_input).transpose()?.map(Arc::new);
    let query_options = QueryOptions {
        allowed_lateness: args.allowed_lateness.0,
        side_input,
        // A served result needs its rows.
        blackhole: args.discard && args.serve_addr.is_none(),
        state_ttl: args.state.ttl(),
    };
    if checkpointed {
        if args.output_dir.is_none() && args.output_postgres.is_none() && args.output_topic.is_none() && !args.discard {
            tracing::warn!("--checkpoint-dir without --output-dir or --output-postgres: rows written since the last checkpoint are written again after a recovery");
        }
        let (query, options, source_only) = (args.query, query_options.clone(), args.source_only);
        let postgres = PostgresOutput::from_args(&args).filter(|_| process == 0);
        let output_dir = args.output_dir.clone().filter(|_| process == 0);
        job = job.verifying(move |ck| {
            verify(ck, query, &options, source_only, postgres, output_dir).map_err(|e| format!("{e:#}"))
        });
    }
    let source_options = SourceOptions {
        name: "Nexmark".into(),
        watermark: WatermarkStrategy::bounded(args.watermark_delay.0),
        idle_timeout: Some(Duration::from_millis(args.idle_timeout.0)),
        batch_size: args.batch_size.max(1),
        max_in_flight: args.max_in_flight,
        rate_limit: args.rate_limit,
        watermark_interval: args.watermark_interval.map(|i| Duration::from_millis(i.0)),
        start_offsets: Vec::new(),
        ..Default::default()
    };
    if args.query.0 == 10 && args.output.is_some() {
        if let Some(dir) = &args.output {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the q10 output directory {}", dir.display()))?;
        }
    }

    let gauges = Gauges {
        in_flight: Some(job.in_flight()),
        alignment: Some(job.alignment()),
        totals: Some(job.totals()),
        ..Gauges::default()
    };
    let latency = job.latency();
    // (row sinks, dead-letter sinks) of every worker.
    let sinks: Arc<std::sync::Mutex<(Vec<SinkHandle>, Vec<SinkHandle>)>> = Default::default();
    let started = Instant::now();
    let progress = args.progress.then(|| Progress::start(gauges.clone(), started));
    let job_metrics = crate::metrics::JobMetrics::new(job.totals())
        .in_flight(job.in_flight())
        .watermark(Arc::clone(&gauges.watermark))
        .alignment(job.alignment())
        .checkpoints(job.checkpoint_stats());
    let job_metrics = match job.activity() {
        Some(activity) => job_metrics.activity(activity),
        None => job_metrics,
    };
    let metrics = match args.metrics_addr {
        Some(addr) => {
            let server = crate::metrics::serve_metrics(addr, job_metrics.clone())
                .with_context(|| format!("serving the metrics at {addr}"))?;
            eprintln!("metrics at http://{}/metrics", server.local_addr());
            eprintln!("status page at http://{}/", server.local_addr());
            Some(server)
        }
        None => None,
    };
    // The query's result as a view: rows keyed by their text.
    let views = crate::serve::Views::new();
    let served: Option<TableReader<String, Columns>> =
        args.serve_addr.map(|_| views.table(&format!("q{}", args.query.0), args.serve_retain.0));
    let view_server = match args.serve_addr {
        Some(addr) => {
            let options =
                crate::serve::ServeOptions { token: args.serve_token.clone(), metrics: Some(job_metrics.clone()) };
            let server = crate::serve::serve_views(addr, views, options)
                .with_context(|| format!("serving the views at {addr}"))?;
            let addr = server.local_addr();
            eprintln!("views at http://{addr}/views (the result: /views/q{})", args.query.0);
            eprintln!("metrics at http://{addr}/metrics");
            eprintln!("status page at http://{addr}/");
            Some(server)
        }
        None => None,
    };
    let (query, output, discard, dead_path) =
        (args.query, args.output.clone(), args.discard, args.dead_letters.clone());
    let source_only = args.source_only;
    let output_dir = args.output_dir.clone();
    let output_postgres = PostgresOutput::from_args(&args);
    let output_topic = match (&args.kafka, &args.output_topic) {
        (Some(brokers), Some(topic)) => {
            let config = KafkaConfig::new(brokers.clone());
            create_topic(&config, topic, 4).context("creating the output topic")?;
            let transactional = args.exactly_once.then(|| format!("highwater-q{}-{topic}", args.query.0));
            Some((config, topic.clone(), args.format, transactional))
        }
        _ => None,
    };
    let dead_letter_topic = match (&args.kafka, &args.dead_letter_topic) {
        (Some(brokers), Some(topic)) => {
            let config = KafkaConfig::new(brokers.clone());
            create_topic(&config, topic, 1).context("creating the dead-letter topic")?;
            Some((config, topic.clone()))
        }
        _ => None,
    };
    let (g, s) = (gauges.clone(), Arc::clone(&sinks));
    let report = job.run(move |worker| -> anyhow::Result<()> {
        let probe = ProbeHandle::new();
        worker.dataflow::<Timestamp, _, _>(|scope| -> anyhow::Result<()> {
            let streams = events(scope, &input, source_options.clone(), &g, &probe)?;
            let out = if source_only {
                let rows = streams.events.flat_map(|_| None);
                QueryOutput { header: &[], rows, kind: QueryKind::Append, late: Vec::new() }
            } else {
                build(query, &streams.events, &query_options)
            };
            if let Ok(mut late) = g.late.lock() {
                late.extend(out.late.iter().cloned());
            }
            let totals = crate::totals::Totals::of(&scope);
            for counter in &out.late {
                totals.iter().for_each(|t| t.count("late", counter));
            }
            let rows = watch_watermark(&out.rows.probe_with(&probe), &g);
            if let Some(reader) = served.as_ref() {
                let names = out.header;
                let keyed = rows.map(move |row| {
                    let columns = row_columns(names, &row);
                    (row, columns)
                });
                Table::from_changelog(&keyed).serve(reader);
            }
            let header = out.header.join(",");
            let handle = match (&output, query.0) {
                _ if output_dir.is_some() => {
                    let dir = output_dir.clone().expect("matched");
                    // An updating result (or one corrected by late records) as its changelog.
                    let format = if out.kind == QueryKind::Updating || query_options.allowed_lateness > 0 {
                        PartFormat::Changelog
                    } else {
                        PartFormat::Rows
                    };
                    write_parts(&rows, "Output", dir, Some(header), format)?
                }
                _ if output_topic.is_some() => {
                    let (config, topic, format, transactional) = output_topic.clone().expect("matched");
                    let mode = if out.kind == QueryKind::Updating || query_options.allowed_lateness > 0 {
                        KafkaSinkMode::Changelog
                    } else {
                        KafkaSinkMode::Append
                    };
                    let rows = match format {
                        OutputFormat::Csv => rows.clone(),
                        OutputFormat::Json => {
                            let names = out.header;
                            rows.map(move |row| row_as_json(names, &row))
                        }
                    };
                    let sink = KafkaSink::new(config, topic, TextEncoder).mode(mode);
                    match transactional {
                        Some(prefix) => sink.exactly_once(prefix).write(&rows, "Output")?,
                        None => sink.write(&rows, "Output")?,
                    }
                }
                _ if output_postgres.is_some() => {
                    let postgres = output_postgres.as_ref().expect("matched");
                    write_postgres(&rows, "Output", postgres.config(out.header))?
                }
                (Some(dir), 10) => {
                    let dir = dir.clone();
                    write(&rows, "WritePartitioned", Placement::Worker0, move |_, _| {
                        Ok(PartitionedCsv { dir, header, files: HashMap::new() })
                    })
                }
                _ => {
                    let target = match (&output, discard) {
                        (_, true) => LineTarget::Discard,
                        (Some(path), _) if path.as_os_str() != "-" => LineTarget::File(path.clone()),
                        _ => LineTarget::Stdout,
                    };
                    let mode = if out.kind == QueryKind::Updating || query_options.allowed_lateness > 0 {
                        SinkMode::Table
                    } else {
                        SinkMode::Append
                    };
                    write_lines(&rows, Some(header), target, mode)
                }
            };
            let mut dead: Vec<SinkHandle> =
                dead_letter_sink(&streams.dead_letters, dead_path.as_ref()).into_iter().collect();
            if let Some((config, topic)) = dead_letter_topic.as_ref() {
                dead.push(crate::kafka::write_dead_letters(
                    &streams.dead_letters,
                    config.clone(),
                    topic,
                    "DeadLetterTopic",
                )?);
            }
            totals.iter().for_each(|t| t.count("rows", &handle.lines));
            if let Ok(mut sinks) = s.lock() {
                sinks.0.push(handle);
                sinks.1.extend(dead);
            }
            Ok(())
        })?;
        Ok(())
    });
    drop(progress);
    drop(metrics);
    drop(view_server);
    let report = report.map_err(|e| match e {
        JobError::Checkpoint(e) => anyhow::Error::new(e).context("checkpointing"),
        JobError::Unfinished => anyhow::anyhow!("the job ended without writing its final checkpoint"),
        e => anyhow::Error::new(e),
    })?;
    if report.already_complete {
        let id = report.recovered_from.unwrap_or_default();
        eprintln!("checkpoint {id} is the final one: the job has completed, nothing to do");
        return Ok(());
    }

    let (row_sinks, dead_sinks) = sinks.lock().map(|s| s.clone()).unwrap_or_default();
    let rows: u64 = row_sinks.iter().map(|s| s.lines.get()).sum();
    let mut problems: Vec<String> = gauges.source.errors();
    for sink in row_sinks.iter().chain(&dead_sinks) {
        problems.extend(sink.errors());
        let unapplied = sink.unapplied_retractions.get();
        if unapplied > 0 {
            problems.push(format!("{unapplied} retractions could not be applied to append-only output"));
        }
    }
    // Over every process of the job (this process's own counts if another
    // process did not report).
    eprintln!("{}", summary(&gauges, &report.totals, started, rows));
    if let Some(latency) = latency {
        eprintln!("{}", latency.report());
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}
