//! Prometheus metrics of a running job over HTTP (feature `metrics`): the
//! job's counters and gauges in the Prometheus text exposition format at
//! `GET /metrics`, read live on every scrape.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `highwater_source_records_total` | counter | `source` |
//! | `highwater_source_dead_letters_total` | counter | `source` |
//! | `highwater_source_late_read_total` | counter | `source` |
//! | `highwater_source_throttled_seconds_total` | counter | `source` |
//! | `highwater_source_aligned_seconds_total` | counter | `source` |
//! | `highwater_source_pauses_total` | counter | `source` |
//! | `highwater_state_expired_total` | counter | `operator` |
//! | `highwater_late_records_total` | counter | `operator` |
//! | `highwater_counter_total` | counter | `name` (any other counter of the job's [`Totals`]) |
//! | `highwater_watermark_seconds` | gauge | (the output watermark, seconds since the epoch) |
//! | `highwater_watermark_lag_seconds` | gauge | (the wall clock minus the watermark) |
//! | `highwater_in_flight_records` | gauge | (between this process's workers) |
//! | `highwater_source_watermark_seconds` | gauge | `source` (its active partitions' earliest watermark) |
//! | `highwater_source_watermark_lag_seconds` | gauge | `source` (the wall clock minus it) |
//! | `highwater_operator_activations_total` | counter | `operator`, `address` |
//! | `highwater_operator_busy_seconds_total` | counter | `operator`, `address` |
//! | `highwater_operator_records_received_total` | counter | `operator`, `address` |
//! | `highwater_operator_records_sent_total` | counter | `operator`, `address` |
//! | `highwater_partition_watermark_seconds` | gauge | `source`, `partition` |
//! | `highwater_partition_watermark_lag_seconds` | gauge | `source`, `partition` |
//! | `highwater_partition_offset` | gauge | `source`, `partition` (where it reads next: a file's byte, a Kafka offset) |
//! | `highwater_partition_records_total` | counter | `source`, `partition` |
//! | `highwater_partition_read_bytes_total` | counter | `source`, `partition` (sources that count bytes: files, Kafka, MQTT, PostgreSQL) |
//! | `highwater_state_entries` | gauge | `operator` (entries in its state: keys of its keyed state, window slots, records waiting for the watermark; this process) |
//! | `highwater_state_bytes` | gauge | `operator` (its state encoded as a checkpoint writes it, estimated from a sample of 64 entries about once a second, this process) |
//! | `highwater_checkpoints_total` | counter | `outcome` (`completed`, `failed`) |
//! | `highwater_checkpoint_written_bytes_total` | counter | |
//! | `highwater_checkpoint_duration_seconds` | gauge | (the latest checkpoint's) |
//! | `highwater_checkpoint_state_bytes` | gauge | (the latest checkpoint's) |
//! | `highwater_checkpoint_age_seconds` | gauge | (since the latest checkpoint) |
//!
//! The per-source gauges need the job's [`Alignment`]
//! ([`JobMetrics::alignment`]), the per-operator counters its
//! [`Activity`] ([`Job::observing`](crate::Job::observing)), the checkpoint
//! metrics its [`CheckpointStats`] ([`Job::checkpoint_stats`](crate::Job::checkpoint_stats)).
//!
//! The counters are this process's ([`Totals::local`]); a job on several
//! processes is scraped at each, as Prometheus does with any fleet.
//!
//! ```no_run
//! use highwater::metrics::{serve_metrics, JobMetrics};
//! use highwater::Job;
//!
//! let job = Job::new(timely::Config::process(2));
//! let metrics = JobMetrics::new(job.totals()).in_flight(job.in_flight());
//! let server = serve_metrics("127.0.0.1:9464".parse().unwrap(), metrics).expect("the address is free");
//! println!("metrics at http://{}/metrics", server.local_addr());
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use highwater_operators::flow::InFlight;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::activity::Activity;
use crate::checkpoint::CheckpointStats;
use crate::operators::END_OF_TIME;
use crate::source::Alignment;
use crate::totals::Totals;

/// What a job's metrics are read from.
#[derive(Clone, Debug)]
pub struct JobMetrics {
    totals: Totals,
    in_flight: Option<InFlight>,
    watermark: Option<Arc<AtomicU64>>,
    alignment: Option<Alignment>,
    activity: Option<Activity>,
    checkpoints: Option<CheckpointStats>,
}

/// Seconds since the epoch, now.
fn now_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl JobMetrics {
    /// The metrics of the job whose counters are `totals` ([`Job::totals`](crate::Job::totals)).
    pub fn new(totals: Totals) -> Self {
        JobMetrics { totals, in_flight: None, watermark: None, alignment: None, activity: None, checkpoints: None }
    }

    /// With the records in flight between the process's workers ([`Job::in_flight`](crate::Job::in_flight)).
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// With the output watermark (milliseconds since the epoch, as a probe
    /// records it; 0 before the first, `END_OF_TIME` at the end).
    pub fn watermark(mut self, watermark: Arc<AtomicU64>) -> Self {
        self.watermark = Some(watermark);
        self
    }

    /// With each source's watermark ([`Job::alignment`](crate::Job::alignment)).
    pub fn alignment(mut self, alignment: Alignment) -> Self {
        self.alignment = Some(alignment);
        self
    }

    /// With what each operator does ([`Job::activity`](crate::Job::activity)).
    pub fn activity(mut self, activity: Activity) -> Self {
        self.activity = Some(activity);
        self
    }

    /// With what the checkpoints did ([`Job::checkpoint_stats`](crate::Job::checkpoint_stats)).
    pub fn checkpoints(mut self, checkpoints: CheckpointStats) -> Self {
        self.checkpoints = Some(checkpoints);
        self
    }

    /// The output watermark in milliseconds, once there is one (not at
    /// the end of input).
    fn output_watermark(&self) -> Option<u64> {
        self.watermark.as_ref().map(|w| w.load(Ordering::Relaxed)).filter(|w| *w != 0 && *w != END_OF_TIME)
    }

    /// Each source's watermark in milliseconds (`None`: all its partitions rest).
    fn source_watermarks(&self) -> Vec<(String, Option<u64>)> {
        let Some(alignment) = &self.alignment else { return Vec::new() };
        alignment.sources().into_iter().map(|(source, span)| (source, span.map(|(lo, _)| lo))).collect()
    }

    /// What the status page shows, as JSON: the counters, sources with
    /// their records, dead letters and watermarks, operators, checkpoints,
    /// the watermark and its lag, the records in flight, and the wall
    /// clock the numbers were read at.
    pub fn status(&self) -> serde_json::Value {
        use serde_json::json;
        let totals = self.totals.local();
        let now = now_seconds();
        let counter = |name: &str| totals.get(name).copied().unwrap_or(0);
        let mut sources: std::collections::BTreeMap<String, serde_json::Value> = Default::default();
        for name in totals.keys() {
            if let Some(source) = name.strip_suffix(".records").filter(|_| partition_of(name).is_none()) {
                sources.insert(
                    source.to_owned(),
                    json!({
                        "name": source,
                        "records": counter(name),
                        "dead_letters": counter(&format!("{source}.dead_letters")),
                        "late": counter(&format!("{source}.late_read")),
                        "throttled_seconds": counter(&format!("{source}.throttled_us")) as f64 / 1e6,
                    }),
                );
            }
        }
        for (source, watermark) in self.source_watermarks() {
            let entry = sources.entry(source.clone()).or_insert_with(|| json!({ "name": source }));
            entry["watermark"] = json!(watermark);
            entry["lag_seconds"] = json!(watermark.map(|w| now - w as f64 / 1e3));
        }
        let sum = |suffix: &str| totals.iter().filter(|(n, _)| n.ends_with(suffix)).map(|(_, v)| v).sum::<u64>();
        let watermark = self.output_watermark();
        json!({
            "now": now,
            "watermark": watermark,
            "lag_seconds": watermark.map(|w| now - w as f64 / 1e3),
            "in_flight": self.in_flight.as_ref().map(|f| f.records()),
            "records": sum(".records"),
            "dead_letters": sum(".dead_letters"),
            "late": sum(".late") + sum(".late_read"),
            "expired": sum(".expired"),
            "sources": sources.into_values().collect::<Vec<_>>(),
            "partitions": self.partitions_status(&totals, now),
            "state_entries": totals
                .iter()
                .filter_map(|(n, v)| Some((n.strip_suffix(".state_entries")?.to_owned(), *v)))
                .collect::<std::collections::BTreeMap<_, _>>(),
            "state_bytes": totals
                .iter()
                .filter_map(|(n, v)| Some((n.strip_suffix(".state_bytes")?.to_owned(), *v)))
                .collect::<std::collections::BTreeMap<_, _>>(),
            "operators": self.activity.as_ref().map(Activity::operators).unwrap_or_default(),
            "checkpoints": self.checkpoints.as_ref().map(|c| {
                let counts = c.read();
                json!({
                    "completed": counts.completed,
                    "failed": counts.failed,
                    "bytes_written": counts.bytes_written,
                    "last": counts.last,
                    "age_seconds": c.age().map(|a| a.as_secs_f64()),
                })
            }),
            "counters": totals,
        })
    }

    /// Each source partition's watermark, lag, offset and records read.
    fn partitions_status(&self, totals: &std::collections::BTreeMap<String, u64>, now: f64) -> Vec<serde_json::Value> {
        let mut by: std::collections::BTreeMap<(String, u64), serde_json::Map<String, serde_json::Value>> =
            Default::default();
        for (name, value) in totals {
            let Some((source, index, what)) = partition_of(name) else { continue };
            let entry = by.entry((source.to_owned(), index.parse().unwrap_or(0))).or_default();
            entry.insert("source".into(), source.into());
            entry.insert("partition".into(), index.parse::<u64>().unwrap_or(0).into());
            match what {
                "watermark" => {
                    let known = *value != 0 && *value < END_OF_TIME;
                    entry.insert("watermark".into(), serde_json::json!(known.then_some(*value)));
                    entry.insert("lag_seconds".into(), serde_json::json!(known.then(|| now - *value as f64 / 1e3)));
                }
                "offset" => {
                    entry.insert("offset".into(), (*value).into());
                }
                "partition_bytes" => {
                    entry.insert("bytes".into(), (*value).into());
                }
                _ => {
                    entry.insert("records".into(), (*value).into());
                }
            }
        }
        by.into_values().map(serde_json::Value::Object).collect()
    }

    /// The metrics in the text exposition format.
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// A partition's gauge in the job's totals: `<source>/<index>.<what>`.
fn partition_of(name: &str) -> Option<(&str, &str, &str)> {
    let (path, what) = name.rsplit_once('.')?;
    let (source, index) = path.rsplit_once('/')?;
    (index.bytes().all(|b| b.is_ascii_digit())
        && matches!(what, "watermark" | "offset" | "partition_records" | "partition_bytes"))
    .then_some((source, index, what))
}

/// A counter of the job's totals, by the name it is registered under.
enum Named<'a> {
    /// `<source>.<what>`.
    Source(&'static str, &'static str, &'a str),
    /// `<operator>.<what>`.
    Operator(&'static str, &'static str, &'a str),
    Other(&'a str),
    /// A gauge, encoded apart.
    Gauge,
}

/// A counter's value: a count, or a time counted in microseconds, as seconds.
enum Value {
    Count(u64),
    Seconds(f64),
}

fn classify(name: &str) -> (Named<'_>, bool) {
    if partition_of(name).is_some() {
        return (Named::Gauge, false);
    }
    if name.ends_with(".state_entries") || name.ends_with(".state_bytes") {
        return (Named::Gauge, false);
    }
    const SOURCE: [(&str, &str, &str, bool); 6] = [
        (".records", "highwater_source_records", "Records read, per source.", false),
        (".dead_letters", "highwater_source_dead_letters", "Records that did not decode, per source.", false),
        (".late_read", "highwater_source_late_read", "Records read behind the watermark, per source.", false),
        (".throttled_us", "highwater_source_throttled_seconds", "Time sources waited for credit.", true),
        (".aligned_us", "highwater_source_aligned_seconds", "Time sources waited for alignment.", true),
        (".pauses", "highwater_source_pauses", "Pauses of sources for flow control.", false),
    ];
    for (suffix, metric, help, micros) in SOURCE {
        if let Some(source) = name.strip_suffix(suffix) {
            return (Named::Source(metric, help, source), micros);
        }
    }
    if let Some(op) = name.strip_suffix(".expired") {
        return (Named::Operator("highwater_state_expired", "Entries expired by a state time-to-live.", op), false);
    }
    if let Some(op) = name.strip_suffix(".late") {
        return (Named::Operator("highwater_late_records", "Records behind the watermark, per operator.", op), false);
    }
    (Named::Other(name), false)
}

/// One gauge without labels.
fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: f64) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for JobMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // Each metric family once, with every label set of it.
        type Family = (&'static str, &'static str, Vec<(String, Value)>);
        let mut families: std::collections::BTreeMap<&'static str, Family> = std::collections::BTreeMap::new();
        let local = self.totals.local();
        for (name, value) in &local {
            let (named, micros) = classify(name);
            let value = if micros { Value::Seconds(*value as f64 / 1e6) } else { Value::Count(*value) };
            let (metric, help, label, of) = match named {
                Named::Gauge => continue,
                Named::Source(metric, help, source) => (metric, help, "source", source),
                Named::Operator(metric, help, op) => (metric, help, "operator", op),
                Named::Other(name) => ("highwater_counter", "Any other counter of the job, by name.", "name", name),
            };
            families.entry(metric).or_insert((help, label, Vec::new())).2.push((of.to_owned(), value));
        }
        for (metric, (help, label, values)) in &families {
            let mut family =
                encoder.encode_descriptor(metric, help, None, prometheus_client::metrics::MetricType::Counter)?;
            for (of, value) in values {
                let labels = [(*label, of.as_str())];
                match value {
                    Value::Count(n) => ConstCounter::new(*n).encode(family.encode_family(&labels)?)?,
                    Value::Seconds(s) => ConstCounter::new(*s).encode(family.encode_family(&labels)?)?,
                }
            }
        }
        if let Some(watermark) = self.output_watermark() {
            let seconds = watermark as f64 / 1e3;
            gauge(
                &mut encoder,
                "highwater_watermark_seconds",
                "The output watermark, in seconds since the epoch.",
                seconds,
            )?;
            gauge(
                &mut encoder,
                "highwater_watermark_lag_seconds",
                "How far the output watermark is behind the wall clock.",
                now_seconds() - seconds,
            )?;
        }
        let sources: Vec<(String, f64)> =
            self.source_watermarks().into_iter().filter_map(|(s, w)| Some((s, w? as f64 / 1e3))).collect();
        if !sources.is_empty() {
            let now = now_seconds();
            for (metric, help, lag) in [
                (
                    "highwater_source_watermark_seconds",
                    "A source's watermark (its active partitions' earliest).",
                    false,
                ),
                (
                    "highwater_source_watermark_lag_seconds",
                    "How far a source's watermark is behind the wall clock.",
                    true,
                ),
            ] {
                let mut family =
                    encoder.encode_descriptor(metric, help, None, prometheus_client::metrics::MetricType::Gauge)?;
                for (source, seconds) in &sources {
                    let value = if lag { now - seconds } else { *seconds };
                    ConstGauge::new(value).encode(family.encode_family(&[("source", source.as_str())])?)?;
                }
            }
        }
        for (suffix, metric, help) in [
            (
                ".state_entries",
                "highwater_state_entries",
                "Entries in an operator's state (keys, window slots, records waiting), in this process.",
            ),
            (
                ".state_bytes",
                "highwater_state_bytes",
                "An operator's state, encoded, estimated from a sample, in this process.",
            ),
        ] {
            let values: Vec<(&str, u64)> =
                local.iter().filter_map(|(n, v)| Some((n.strip_suffix(suffix)?, *v))).collect();
            if values.is_empty() {
                continue;
            }
            let mut family =
                encoder.encode_descriptor(metric, help, None, prometheus_client::metrics::MetricType::Gauge)?;
            for (op, n) in values {
                ConstGauge::new(n as i64).encode(family.encode_family(&[("operator", op)])?)?;
            }
        }
        let partitions: Vec<(&str, &str, &str, u64)> = local
            .iter()
            .filter_map(|(n, v)| partition_of(n).map(|(source, index, what)| (source, index, what, *v)))
            .collect();
        if !partitions.is_empty() {
            let now = now_seconds();
            type Family = (&'static str, &'static str, &'static str, prometheus_client::metrics::MetricType);
            let families: [Family; 5] = [
                (
                    "watermark",
                    "highwater_partition_watermark_seconds",
                    "A source partition's watermark.",
                    prometheus_client::metrics::MetricType::Gauge,
                ),
                (
                    "lag",
                    "highwater_partition_watermark_lag_seconds",
                    "How far a source partition's watermark is behind the wall clock.",
                    prometheus_client::metrics::MetricType::Gauge,
                ),
                (
                    "offset",
                    "highwater_partition_offset",
                    "Where a source partition reads next (a file's byte, a Kafka offset).",
                    prometheus_client::metrics::MetricType::Gauge,
                ),
                (
                    "partition_records",
                    "highwater_partition_records",
                    "Records read from a source partition.",
                    prometheus_client::metrics::MetricType::Counter,
                ),
                (
                    "partition_bytes",
                    "highwater_partition_read_bytes",
                    "Bytes of input a source partition consumed (a file's lines, Kafka keys and payloads, MQTT topics and payloads, pgoutput messages).",
                    prometheus_client::metrics::MetricType::Counter,
                ),
            ];
            for (what, metric, help, kind) in families {
                let mut family = encoder.encode_descriptor(metric, help, None, kind)?;
                let of = if what == "lag" { "watermark" } else { what };
                for (source, index, _, value) in partitions.iter().filter(|p| p.2 == of) {
                    let labels = [("source", *source), ("partition", *index)];
                    match what {
                        // Before its first record a partition has no watermark.
                        "watermark" | "lag" if *value == 0 || *value == END_OF_TIME => {}
                        "watermark" => ConstGauge::new(*value as f64 / 1e3).encode(family.encode_family(&labels)?)?,
                        "lag" => ConstGauge::new(now - *value as f64 / 1e3).encode(family.encode_family(&labels)?)?,
                        "offset" => ConstGauge::new(*value as i64).encode(family.encode_family(&labels)?)?,
                        _ => ConstCounter::new(*value).encode(family.encode_family(&labels)?)?,
                    }
                }
            }
        }
        if let Some(activity) = &self.activity {
            let operators = activity.operators();
            type Read = fn(&crate::activity::OperatorActivity) -> f64;
            let families: [(&str, &str, Read); 4] = [
                ("highwater_operator_activations", "Times an operator was scheduled.", |o| o.activations as f64),
                ("highwater_operator_busy_seconds", "Time spent in an operator.", |o| o.busy_seconds),
                ("highwater_operator_records_received", "Records an operator received over its channels.", |o| {
                    o.records_in as f64
                }),
                ("highwater_operator_records_sent", "Records an operator sent over its channels.", |o| {
                    o.records_out as f64
                }),
            ];
            for (metric, help, read) in families {
                let mut family =
                    encoder.encode_descriptor(metric, help, None, prometheus_client::metrics::MetricType::Counter)?;
                for op in &operators {
                    let labels = [("operator", op.name.as_str()), ("address", op.address.as_str())];
                    ConstCounter::new(read(op)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        if let Some(checkpoints) = &self.checkpoints {
            let counts = checkpoints.read();
            let mut family = encoder.encode_descriptor(
                "highwater_checkpoints",
                "Checkpoints written or failed in this process.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            ConstCounter::new(counts.completed).encode(family.encode_family(&[("outcome", "completed")])?)?;
            ConstCounter::new(counts.failed).encode(family.encode_family(&[("outcome", "failed")])?)?;
            let written = ConstCounter::new(counts.bytes_written);
            written.encode(encoder.encode_descriptor(
                "highwater_checkpoint_written_bytes",
                "Bytes written by checkpoints.",
                None,
                written.metric_type(),
            )?)?;
            if let Some(last) = &counts.last {
                let help = "The latest checkpoint's time from its cut to its manifest.";
                gauge(&mut encoder, "highwater_checkpoint_duration_seconds", help, last.duration_seconds)?;
                let help = "The state the latest checkpoint holds.";
                gauge(&mut encoder, "highwater_checkpoint_state_bytes", help, last.state_bytes as f64)?;
            }
            if let Some(age) = checkpoints.age() {
                let help = "Time since the latest checkpoint was written.";
                gauge(&mut encoder, "highwater_checkpoint_age_seconds", help, age.as_secs_f64())?;
            }
        }
        if let Some(in_flight) = &self.in_flight {
            let gauge = ConstGauge::new(in_flight.records() as i64);
            gauge.encode(encoder.encode_descriptor(
                "highwater_in_flight_records",
                "Records in flight between this process's workers.",
                None,
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The HTTP server of [`serve_metrics`]: runs on a thread of its own until
/// dropped (the views' server, serving no views).
pub type MetricsServer = crate::serve::ViewServer;

/// Serves `metrics` at `GET /metrics` on `addr` (HTTP/1.1), with the job's
/// status page at `/` and its numbers as JSON at `/status`, from a thread
/// with a tokio runtime of its own: scrapes never stop the dataflow. The
/// server of [`serve_views`](crate::serve::serve_views) without views: to
/// serve views, metrics and the status page on one address, give the
/// metrics to `serve_views` in its [`ServeOptions`](crate::serve::ServeOptions).
///
/// # Errors
/// The address cannot be bound.
pub fn serve_metrics(addr: SocketAddr, metrics: JobMetrics) -> Result<MetricsServer, crate::serve::ServeError> {
    let options = crate::serve::ServeOptions { token: None, metrics: Some(metrics) };
    crate::serve::serve_views(addr, crate::serve::Views::new(), options)
}
