//! `highwater cep`: a CEP pattern, written in text, over JSON Lines events.
//!
//! ```text
//! highwater cep --pattern examples/cep/login_reset.cep --input examples/cep/login_reset.jsonl --key user -- -w 2
//! ```
//!
//! Prints one JSON object per match, with the matched events verbatim under
//! their step names: `{"key":"u1","match":{"fail":[{…},{…}],"reset":[{…}]}}`;
//! with `--timeouts` also the partial matches that timed out,
//! `{"key":"u2","timed_out":true,"match":{…}}`. Lines come out as the
//! watermark passes them, ordered by the time of the match (its last event;
//! for a time-out, the end of its time bound), then key, matches before
//! time-outs: the same whatever the number of workers. Events without a
//! usable key or time are dead letters, reported on stderr with the reason.
//!
//! `--kafka BROKERS --topic T [--to latest]` reads the events from Kafka
//! instead, and `--output-topic T2` also writes the lines to a topic.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use highwater_operators::cep::Match;
use highwater_operators::{Counter, Timestamp, Update};
use serde_json::{Map, Value};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use crate::cep::{compile, FieldPath, KeyedEvent, KeyedEventDecoder};
use crate::sink::{write, write_json_lines, LineTarget, Placement, Sink, SinkError, SinkHandle, SinkMode};
use crate::source::{read, JsonLines, SourceMetrics, SourceOptions};
use crate::time::{Millis, WatermarkStrategy};

/// Arguments of `highwater cep`.
#[derive(Debug, Args)]
pub(super) struct CepArgs {
    /// The pattern file: PATTERN, WITHIN, AFTER MATCH SKIP and DEFINE clauses
    /// (the language is described in the `highwater::cep` module).
    #[arg(long, short)]
    pattern: PathBuf,
    /// JSON Lines input files, one event per line (`-` for stdin).
    #[arg(long, short, num_args = 1.., required_unless_present = "kafka", conflicts_with = "kafka")]
    input: Vec<PathBuf>,
    /// Read the events from Kafka instead (`HOST:PORT[,...]`): one JSON
    /// event per record of the --topic topics' partitions.
    #[arg(long, value_name = "BROKERS", requires = "topic")]
    kafka: Option<String>,
    /// --kafka: the topics (a topic starting with `^` is a pattern).
    #[arg(long, value_name = "TOPIC", num_args = 1.., requires = "kafka")]
    topic: Vec<String>,
    /// --kafka: where to start: earliest, latest, group or a timestamp in ms.
    #[arg(long, default_value = "earliest", requires = "kafka")]
    from: crate::kafka::StartFrom,
    /// --kafka: `latest` reads up to the end offsets found at start, then
    /// ends; `never` (the default) follows the topics.
    #[arg(long, default_value = "never", requires = "kafka")]
    to: crate::kafka::StopAt,
    /// --kafka: the consumer group.
    #[arg(long, default_value = crate::kafka::DEFAULT_GROUP, requires = "kafka")]
    group: String,
    /// --kafka: also write each match (the JSON line) to this topic
    /// (created with 4 partitions if missing), keyed by the match's key,
    /// at least once.
    #[arg(long, value_name = "TOPIC", requires = "kafka")]
    output_topic: Option<String>,
    /// The field that keys the events (matches are per key), e.g. `user` or `user.id`.
    #[arg(long, short)]
    key: String,
    /// The field that holds the event time, in whole milliseconds since the epoch.
    #[arg(long, default_value = "time")]
    time_field: String,
    /// Watermark delay behind the greatest event time seen: how far out of
    /// order events may come before they are late.
    #[arg(long, default_value = "5s")]
    watermark_delay: Millis,
    /// An input without events for this long stops holding the watermark.
    #[arg(long, default_value = "5s")]
    idle_timeout: Millis,
    /// Input lines longer than this many bytes become dead letters (with
    /// their length and offset) instead of events: memory stays bounded.
    #[arg(long, default_value_t = crate::source::DEFAULT_MAX_RECORD_SIZE)]
    max_record_size: usize,
    /// Also print the partial matches that timed out (`"timed_out": true`).
    #[arg(long)]
    timeouts: bool,
    /// The output file (default stdout).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write dead letters to this file as JSON Lines (default: each on stderr).
    #[arg(long)]
    dead_letters: Option<PathBuf>,
    /// Timely arguments: -w THREADS, -n PROCESSES, -p INDEX, -h HOSTFILE.
    #[arg(last = true)]
    timely: Vec<String>,
}

/// Where the events come from.
enum Input {
    Files(Arc<JsonLines<KeyedEventDecoder>>),
    Kafka(Arc<crate::kafka::KafkaSource<KeyedEventDecoder>>),
}

/// A rendered match or time-out, with what orders the output.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Found {
    key: String,
    timed_out: bool,
    line: String,
}

/// One JSON line for a match: the key as JSON, the events by step.
fn render(m: &Match<String, KeyedEvent>, timed_out: bool) -> Found {
    let mut steps = Map::new();
    for (name, events) in &m.steps {
        let slot = steps.entry(name.to_string()).or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = slot {
            list.extend(events.iter().map(|e| e.value.clone()));
        }
    }
    let mut object = Map::new();
    // The key is the JSON text of a string, number or boolean (see `KeyedEventDecoder`).
    object.insert("key".into(), serde_json::from_str(&m.key).unwrap_or_else(|_| Value::String(m.key.clone())));
    if timed_out {
        object.insert("timed_out".into(), Value::Bool(true));
    }
    object.insert("match".into(), Value::Object(steps));
    Found { key: m.key.clone(), timed_out, line: Value::Object(object).to_string() }
}

/// Writes the lines in (time, key, match before time-out) order: each as
/// soon as the watermark has passed its time, so that no earlier one can
/// still come.
struct OrderedLines {
    what: String,
    out: Box<dyn Write>,
    /// By time, key and kind; in arrival order within (one key's results
    /// come from one worker, in the order its matcher found them).
    pending: BTreeMap<(Timestamp, String, bool), Vec<String>>,
}

impl OrderedLines {
    fn open(output: Option<&PathBuf>) -> Result<Self, SinkError> {
        Ok(match output {
            Some(path) if path.as_os_str() != "-" => OrderedLines {
                what: path.display().to_string(),
                out: Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path)
                        .map_err(|source| SinkError::Io { what: path.display().to_string(), source })?,
                )),
                pending: BTreeMap::new(),
            },
            _ => OrderedLines {
                what: "stdout".into(),
                out: Box::new(std::io::BufWriter::new(std::io::stdout())),
                pending: BTreeMap::new(),
            },
        })
    }

    fn release(&mut self, before: Option<Timestamp>) -> Result<u64, SinkError> {
        let rest = match before {
            Some(t) => self.pending.split_off(&(t, String::new(), false)),
            None => BTreeMap::new(),
        };
        let ready = std::mem::replace(&mut self.pending, rest);
        let mut written = 0;
        let io = |source| SinkError::Io { what: self.what.clone(), source };
        for line in ready.into_values().flatten() {
            self.out.write_all(line.as_bytes()).and_then(|_| self.out.write_all(b"\n")).map_err(io)?;
            written += 1;
        }
        if written > 0 {
            self.out.flush().map_err(io)?;
        }
        Ok(written)
    }
}

impl Sink for OrderedLines {
    type Item = Found;

    fn write(&mut self, updates: &mut Vec<Update<Found>>) -> Result<u64, SinkError> {
        for (found, time, diff) in updates.drain(..) {
            let slot = self.pending.entry((time, found.key, found.timed_out)).or_default();
            for _ in 0..diff.max(0) {
                slot.push(found.line.clone());
            }
        }
        Ok(0)
    }

    fn advance(&mut self, frontier: Timestamp) -> Result<u64, SinkError> {
        self.release(Some(frontier))
    }

    fn finish(&mut self) -> Result<u64, SinkError> {
        self.release(None)
    }
}

/// Counters shared by the workers.
#[derive(Clone, Debug, Default)]
struct Counts {
    matches: Counter,
    timeouts: Counter,
    late: Arc<Mutex<Vec<Counter>>>,
    sinks: Arc<Mutex<Vec<SinkHandle>>>,
}

pub(super) fn run(args: CepArgs) -> anyhow::Result<()> {
    let config = crate::cluster::config_from_args(&args.timely)?;
    let text = std::fs::read_to_string(&args.pattern)
        .with_context(|| format!("reading the pattern file {}", args.pattern.display()))?;
    let program = Arc::new(compile(&text).with_context(|| format!("in the pattern file {}", args.pattern.display()))?);
    let key = FieldPath::parse(&args.key).with_context(|| format!("in --key {:?}", args.key))?;
    let time = FieldPath::parse(&args.time_field).with_context(|| format!("in --time-field {:?}", args.time_field))?;
    let decoder = KeyedEventDecoder::new(key, time);
    let source = match &args.kafka {
        Some(brokers) => {
            let config = crate::kafka::KafkaConfig::new(brokers.clone()).group(args.group.clone());
            Input::Kafka(Arc::new(
                crate::kafka::KafkaSource::new(config, args.topic.clone(), decoder)
                    .start_from(args.from)
                    .stop_at(args.to),
            ))
        }
        None if args.input.len() == 1 && args.input[0].as_os_str() == "-" => {
            Input::Files(Arc::new(JsonLines::stdin(decoder).max_record_size(args.max_record_size)))
        }
        None => Input::Files(Arc::new(
            JsonLines::files(&args.input, decoder).context("opening the input")?.max_record_size(args.max_record_size),
        )),
    };
    let output_topic = match (&args.kafka, &args.output_topic) {
        (Some(brokers), Some(topic)) => {
            let config = crate::kafka::KafkaConfig::new(brokers.clone());
            crate::kafka::create_topic(&config, topic, 4).context("creating the output topic")?;
            Some((config, topic.clone()))
        }
        _ => None,
    };
    let options = SourceOptions {
        name: "Events".into(),
        watermark: WatermarkStrategy::bounded(args.watermark_delay.0),
        idle_timeout: Some(Duration::from_millis(args.idle_timeout.0)),
        ..Default::default()
    };
    let metrics = SourceMetrics::default();
    let counts = Counts::default();
    let (m, c) = (metrics.clone(), counts.clone());
    let (show_timeouts, output, dead_path) = (args.timeouts, args.output.clone(), args.dead_letters.clone());
    let guards = crate::cluster::execute(config, move |worker| -> anyhow::Result<()> {
        worker.dataflow::<Timestamp, _, _>(|scope| -> anyhow::Result<()> {
            let time = |e: &KeyedEvent| e.time;
            let streams = match &source {
                Input::Files(s) => read(scope, Arc::clone(s), time, options.clone(), &m, None)?,
                Input::Kafka(s) => read(scope, Arc::clone(s), time, options.clone(), &m, None)?,
            };
            let pattern = program.pattern_with(|e: &KeyedEvent| &e.value);
            let found = streams.events.match_pattern(|e: &KeyedEvent| e.key.clone(), pattern)?;
            if let Ok(mut late) = c.late.lock() {
                late.push(found.late.count.clone());
            }
            let matches = c.matches.clone();
            let lines = found.matches.map(move |m| {
                matches.add(1);
                render(&m, false)
            });
            let timeouts = c.timeouts.clone();
            let timed_out = found.timeouts.flat_map(move |m| {
                timeouts.add(1);
                show_timeouts.then(|| render(&m, true))
            });
            let output = output.clone();
            let handle = write(&lines.concat(&timed_out), "CepOutput", Placement::Worker0, move |_, _| {
                OrderedLines::open(output.as_ref())
            });
            let mut handles = vec![handle];
            if let Some((config, topic)) = output_topic.as_ref() {
                let found = lines.concat(&timed_out);
                handles.push(
                    crate::kafka::KafkaSink::new(config.clone(), topic.clone(), crate::kafka::TextEncoder)
                        .key(|f: &String| {
                            serde_json::from_str::<Value>(f).ok().map(|v| v["key"].to_string().into_bytes())
                        })
                        .write(&found.map(|f: Found| f.line), "CepTopic")?,
                );
            }
            match &dead_path {
                Some(path) => handles.push(write_json_lines(
                    &streams.dead_letters,
                    LineTarget::File(path.clone()),
                    SinkMode::Append,
                )),
                None => {
                    streams.dead_letters.inner.clone().sink(Pipeline, "ReportDeadLetters", |(input, _)| {
                        input.for_each_stamp(|_, data| {
                            for batch in data {
                                for (d, _, _) in batch.drain(..) {
                                    eprintln!("dead letter: {d}");
                                }
                            }
                        });
                    });
                }
            }
            if let Ok(mut sinks) = c.sinks.lock() {
                sinks.extend(handles);
            }
            Ok(())
        })?;
        // A source that fails for good stops the job (not as an end of input).
        crate::source::run_until_failed(worker, &[&m])?;
        Ok(())
    })
    .map_err(|e| anyhow::anyhow!("starting the workers: {e}"))?;
    super::join_workers(guards)?;

    let late: u64 = counts.late.lock().map(|l| l.iter().map(Counter::get).sum()).unwrap_or(0);
    eprintln!(
        "events={} matches={} timeouts={} late={late} dead_letters={}",
        metrics.records.get(),
        counts.matches.get(),
        counts.timeouts.get(),
        metrics.dead_letters.get(),
    );
    let mut problems = metrics.errors();
    if let Ok(sinks) = counts.sinks.lock() {
        problems.extend(sinks.iter().flat_map(SinkHandle::errors));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}
