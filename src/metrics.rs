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

use crate::operators::END_OF_TIME;
use crate::totals::Totals;

/// What a job's metrics are read from.
#[derive(Clone, Debug)]
pub struct JobMetrics {
    totals: Totals,
    in_flight: Option<InFlight>,
    watermark: Option<Arc<AtomicU64>>,
}

impl JobMetrics {
    /// The metrics of the job whose counters are `totals` ([`Job::totals`](crate::Job::totals)).
    pub fn new(totals: Totals) -> Self {
        JobMetrics { totals, in_flight: None, watermark: None }
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

/// A counter of the job's totals, by the name it is registered under.
enum Named<'a> {
    /// `<source>.<what>`.
    Source(&'static str, &'static str, &'a str),
    /// `<operator>.<what>`.
    Operator(&'static str, &'static str, &'a str),
    Other(&'a str),
}

/// A counter's value: a count, or a time counted in microseconds, as seconds.
enum Value {
    Count(u64),
    Seconds(f64),
}

fn classify(name: &str) -> (Named<'_>, bool) {
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
        if let Some(watermark) = self.watermark.as_ref().map(|w| w.load(Ordering::Relaxed)) {
            if watermark != 0 && watermark != END_OF_TIME {
                let seconds = watermark as f64 / 1e3;
                let gauge = ConstGauge::new(seconds);
                gauge.encode(encoder.encode_descriptor(
                    "highwater_watermark_seconds",
                    "The output watermark, in seconds since the epoch.",
                    None,
                    gauge.metric_type(),
                )?)?;
                let now =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                let lag = ConstGauge::new(now - seconds);
                lag.encode(encoder.encode_descriptor(
                    "highwater_watermark_lag_seconds",
                    "How far the output watermark is behind the wall clock.",
                    None,
                    lag.metric_type(),
                )?)?;
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
/// dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// The address the server listens on (the port chosen, if 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves `metrics` at `GET /metrics` on `addr` (HTTP/1.1), from a thread
/// with a tokio runtime of its own: scrapes never stop the dataflow.
pub fn serve_metrics(addr: SocketAddr, metrics: JobMetrics) -> std::io::Result<MetricsServer> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new().name("highwater-metrics".into()).spawn(move || {
        runtime.block_on(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(%e, "the metrics server cannot listen");
                    return;
                }
            };
            let app =
                axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move || {
                        let body = metrics.render();
                        async move {
                            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
                        }
                    }),
                );
            let served = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = served.await {
                tracing::error!(%e, "the metrics server failed");
            }
        });
    })?;
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    Ok(MetricsServer { addr, stop: Some(stop), thread: Some(thread) })
}
