//! The MQTT sink: each worker publishes its share of a stream through its
//! own client, and at QoS 1 waits at every checkpoint until the broker has
//! acknowledged what it published before it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::key::Data;
use highwater_operators::time::watermark_of;
use highwater_operators::EventStream;
use rumqttc::{Client, Connection, Event, Packet, QoS};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use super::config::MqttConfig;
use super::MqttError;
use crate::checkpoint::{Checkpoints, SinkSubmission};
use crate::sink::at_least_once::AtLeastOnce;
use crate::sink::{Encode, SinkError, SinkHandle};

type TopicFn<T> = Box<dyn Fn(&T) -> String>;

/// An MQTT sink: each record is published to a topic computed from it.
///
/// At QoS 1 ([`QoS::AtLeastOnce`], the default) the sink waits at every
/// checkpoint until the broker has acknowledged every message published
/// before it, so nothing before a checkpoint is lost: at least once (a
/// recovered job publishes again what followed its checkpoint). At QoS 0,
/// at most once. Retractions cannot be taken back: they are counted in
/// [`SinkHandle::unapplied_retractions`]. Each worker connects as
/// `{client_id}-{worker}`.
///
/// ```no_run
/// use highwater::mqtt::{MqttConfig, MqttSink, QoS};
/// use highwater::prelude::*;
/// use highwater::sink::JsonEncoder;
/// use timely::dataflow::operators::ToStream;
///
/// timely::execute_directly(|worker| {
///     worker.dataflow::<u64, _, _>(|scope| {
///         let alerts = EventStream::new(vec![(("device-7".to_owned(), 31.5f64), 1_000u64, 1i64)].to_stream(scope));
///         let config = MqttConfig::new("127.0.0.1:1883", "alerts-job").unwrap();
///         MqttSink::new(config, |(device, _): &(String, f64)| format!("alerts/{device}"), JsonEncoder)
///             .qos(QoS::AtLeastOnce)
///             .write(&alerts, "Alerts")
///             .expect("a client");
///     });
/// });
/// ```
pub struct MqttSink<T, E> {
    config: MqttConfig,
    topic: TopicFn<T>,
    encode: E,
    qos: QoS,
    retain: bool,
    flush_timeout: Duration,
}

impl<T, E> std::fmt::Debug for MqttSink<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSink")
            .field("broker", &self.config.broker())
            .field("qos", &self.qos)
            .finish_non_exhaustive()
    }
}

/// What a worker's client thread counts.
#[derive(Debug, Default)]
struct Counts {
    /// QoS 1 messages acknowledged by the broker.
    acked: AtomicU64,
    stop: AtomicBool,
}

impl<T: Data, E: Encode<T>> MqttSink<T, E> {
    /// A sink publishing each record, encoded by `encode`, to `topic(record)`.
    pub fn new(config: MqttConfig, topic: impl Fn(&T) -> String + 'static, encode: E) -> Self {
        MqttSink {
            config,
            topic: Box::new(topic),
            encode,
            qos: QoS::AtLeastOnce,
            retain: false,
            flush_timeout: Duration::from_secs(60),
        }
    }

    /// The QoS of the published messages (QoS 2 is published as QoS 1).
    pub fn qos(mut self, qos: QoS) -> Self {
        self.qos = if qos == QoS::ExactlyOnce { QoS::AtLeastOnce } else { qos };
        self
    }

    /// Whether the broker retains the last message of each topic.
    pub fn retain(mut self, retain: bool) -> Self {
        self.retain = retain;
        self
    }

    /// How long a checkpoint may wait for the broker's acknowledgements
    /// before the sink fails (60 s by default).
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = timeout;
        self
    }

    /// Publishes `stream`, on every worker (each its own records).
    ///
    /// # Errors
    /// If the client thread cannot start, or the checkpoints refuse the sink.
    pub fn write(self, stream: &EventStream<'_, T>, name: &str) -> Result<SinkHandle, MqttError> {
        let worker = stream.scope().index();
        let client_id = format!("{}-{worker}", self.config.client_id);
        let (client, connection) = Client::new(self.config.options(&client_id, false), 1024);
        let counts = Arc::new(Counts::default());
        let (c, broker, max_backoff) = (Arc::clone(&counts), self.config.broker(), self.config.max_backoff);
        std::thread::Builder::new()
            .name(format!("highwater-mqtt-sink-{client_id}"))
            .spawn(move || drive(connection, &c, &broker, max_backoff))
            .map_err(|e| MqttError::Client {
                broker: self.config.broker(),
                what: "starting the client thread".into(),
                reason: e.to_string(),
            })?;
        let checkpoints = Checkpoints::of(&stream.scope());
        if let Some(c) = checkpoints.as_ref() {
            c.register_sink(
                name,
                worker,
                Arc::new(AtLeastOnce { kind: "mqtt-at-least-once", target: self.config.broker() }),
            )
            .map_err(|e| MqttError::Config(format!("sink {name}: {e}")))?;
        }
        let handle = SinkHandle::default();
        let h = handle.clone();
        let name = name.to_owned();
        let replayed_below = checkpoints.as_ref().and_then(|c| c.restored_time()).unwrap_or(0);
        let mut done: Option<CheckpointId> = None;
        let mut published = 0u64;
        let mut failed = false;
        let mut buffer = Vec::new();
        let what = format!("mqtt {} (sink {name})", self.config.broker());
        let error = move |e: String| SinkError::Io { what: what.clone(), source: std::io::Error::other(e) };
        let sink = self;
        let fail = move |failed: &mut bool, e: SinkError| {
            if !std::mem::replace(failed, true) {
                h.fail(e);
            }
        };
        let h = handle.clone();
        let operator = name.clone();
        stream.inner.clone().sink(Pipeline, &operator, move |(input, frontier)| {
            input.for_each_stamp(|at, data| {
                let time = *at.least().expect("highwater messages travel under a capability");
                for batch in data {
                    if time < replayed_below || failed {
                        batch.clear();
                        continue;
                    }
                    for (record, _, diff) in batch.drain(..) {
                        if diff < 0 {
                            h.unapplied_retractions.add(diff.unsigned_abs());
                        }
                        for _ in 0..diff.max(0) {
                            buffer.clear();
                            if let Err(e) = sink.encode.encode(&record, &mut buffer) {
                                fail(&mut failed, error(e.to_string()));
                                break;
                            }
                            let topic = (sink.topic)(&record);
                            if let Err(e) = client.publish(topic, sink.qos, sink.retain, buffer.clone()) {
                                fail(&mut failed, error(e.to_string()));
                                break;
                            }
                            h.lines.add(1);
                            if sink.qos != QoS::AtMostOnce {
                                published += 1;
                            }
                        }
                    }
                }
            });
            let Some(c) = checkpoints.as_ref() else { return };
            let watermark = watermark_of(frontier);
            while let Some(cut) = c.cut_after(done).filter(|cut| cut.time <= watermark) {
                // Everything below the cut was published: wait until the
                // broker has it before the checkpoint completes.
                let deadline = Instant::now() + sink.flush_timeout;
                while !failed && counts.acked.load(Ordering::SeqCst) < published {
                    if Instant::now() > deadline {
                        let e = format!(
                            "the broker acknowledged {} of {published} messages within {:?}",
                            counts.acked.load(Ordering::SeqCst),
                            sink.flush_timeout
                        );
                        fail(&mut failed, error(e));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                c.submit_sink(worker, cut, SinkSubmission { sink: name.clone(), part: None });
                done = Some(cut.id);
            }
            if frontier.is_empty() {
                counts.stop.store(true, Ordering::SeqCst);
            }
        });
        Ok(handle)
    }
}

/// Drives a sink worker's connection: counts acknowledgements, reconnects
/// with backoff (the client publishes again what was not acknowledged).
fn drive(mut connection: Connection, counts: &Counts, broker: &str, max_backoff: Duration) {
    let min_backoff = Duration::from_millis(50);
    let mut backoff = min_backoff;
    let mut last_warning: Option<Instant> = None;
    loop {
        match connection.recv_timeout(Duration::from_millis(100)) {
            Err(rumqttc::RecvTimeoutError::Timeout) => {
                if counts.stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(rumqttc::RecvTimeoutError::Disconnected) => return,
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => {
                counts.acked.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => backoff = min_backoff,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    tracing::warn!(broker, "mqtt sink: {e}; reconnecting in {backoff:?}");
                    last_warning = Some(Instant::now());
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(max_backoff.max(min_backoff));
            }
        }
    }
}
