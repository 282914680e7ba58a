//! The MQTT source: one partition, a subscription with a persistent
//! session, read by a background thread that drives the client.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{Client, Connection, Event, Packet, Publish, QoS};
use serde::{Deserialize, Serialize};

use super::config::MqttConfig;
use crate::dead_letter::DeadLetter;
use crate::source::{Decode, DecodeError, Offset, PartitionReader, ReadStatus, Source, SourceError};

/// What a decoder sees of one MQTT message.
#[derive(Clone, Copy, Debug)]
pub struct MqttMessage<'a> {
    /// The topic it was published to.
    pub topic: &'a str,
    /// The payload.
    pub payload: &'a [u8],
    /// The QoS it was delivered with.
    pub qos: QoS,
    /// When the source received it (ms since the epoch).
    pub arrival: u64,
}

/// Turns MQTT messages into typed records.
///
/// Every [`Decode`] is one (it decodes the payload); [`WithArrival`] adds
/// the arrival time and the topic, for event time taken from arrival.
pub trait MqttDecode: Send + Sync + 'static {
    /// The decoded record.
    type Record: highwater_operators::key::Data;
    /// Decodes one message into any number of records.
    fn decode_message(&self, message: &MqttMessage<'_>, out: &mut dyn FnMut(Self::Record)) -> Result<(), DecodeError>;
}

impl<D: Decode> MqttDecode for D
where
    D::Record: highwater_operators::key::Data,
{
    type Record = D::Record;
    fn decode_message(&self, message: &MqttMessage<'_>, out: &mut dyn FnMut(D::Record)) -> Result<(), DecodeError> {
        self.decode_into(message.payload, out)
    }
}

/// A record with its message's arrival time and topic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Arrived<T> {
    /// When the source received the message, ms since the epoch.
    pub time: u64,
    /// The topic.
    pub topic: String,
    /// The decoded payload.
    pub value: T,
}

/// Decodes the payload with `D`, keeping the arrival time and the topic.
///
/// ```
/// use highwater::mqtt::{Arrived, MqttDecode, MqttMessage, QoS, WithArrival};
/// use highwater::source::JsonDecoder;
/// let decode = WithArrival(JsonDecoder::<f64>::new());
/// let message = MqttMessage { topic: "sensors/7", payload: b"21.5", qos: QoS::AtLeastOnce, arrival: 1_000 };
/// let mut out = Vec::new();
/// decode.decode_message(&message, &mut |r| out.push(r)).unwrap();
/// assert_eq!(out, vec![Arrived { time: 1_000, topic: "sensors/7".to_owned(), value: 21.5 }]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct WithArrival<D>(pub D);

impl<D: Decode> MqttDecode for WithArrival<D>
where
    D::Record: highwater_operators::key::Data,
{
    type Record = Arrived<D::Record>;
    fn decode_message(&self, message: &MqttMessage<'_>, out: &mut dyn FnMut(Self::Record)) -> Result<(), DecodeError> {
        let (time, topic) = (message.arrival, message.topic);
        self.0.decode_into(message.payload, &mut |value| out(Arrived { time, topic: topic.to_owned(), value }))
    }
}

/// What the client's thread hands to the reader.
#[derive(Debug)]
enum Msg {
    /// A new connection: acknowledgements of the earlier ones are void
    /// (the broker sends their messages again).
    Connected,
    /// A message.
    Publish(Publish),
}

/// The QoS 1 messages handed out and not yet acknowledged, with the
/// client that acknowledges them.
struct Acks {
    client: Client,
    /// (sequence number, the message without its payload).
    unacked: Mutex<VecDeque<(u64, Publish)>>,
}

/// A source over the messages of MQTT topic filters (wildcards `+` and `#`
/// allowed), each subscribed with its QoS; see the [module
/// documentation](super) for the delivery guarantees.
///
/// One partition, named `mqtt:{client id}`. Its offset counts the messages
/// handed out (MQTT has no offsets): a recovered job does not rewind it,
/// the broker delivers again what was not acknowledged. Payloads that fail
/// to decode become dead letters (origin `mqtt:{topic}`).
///
/// ```no_run
/// use highwater::mqtt::{MqttConfig, MqttSource, QoS};
/// use highwater::source::JsonDecoder;
/// # #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
/// # struct Reading { device: String, value: f64, time: u64 }
/// let config = MqttConfig::new("127.0.0.1:1883", "sensors-job").unwrap();
/// let source = MqttSource::new(config, [("sensors/+/temperature", QoS::AtLeastOnce)], JsonDecoder::<Reading>::new());
/// # let _ = source;
/// ```
pub struct MqttSource<M> {
    config: MqttConfig,
    filters: Vec<(String, QoS)>,
    decode: Arc<M>,
    acknowledging: AtomicBool,
    stopped: Arc<AtomicBool>,
    acks: Mutex<Option<Arc<Acks>>>,
}

impl<M> std::fmt::Debug for MqttSource<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSource")
            .field("broker", &self.config.broker())
            .field("client_id", &self.config.client_id)
            .field("filters", &self.filters)
            .finish_non_exhaustive()
    }
}

impl<M: MqttDecode> MqttSource<M> {
    /// A source over the messages of `filters` (topic filter, QoS).
    pub fn new<S: Into<String>>(config: MqttConfig, filters: impl IntoIterator<Item = (S, QoS)>, decode: M) -> Self {
        MqttSource {
            config,
            filters: filters.into_iter().map(|(f, q)| (f.into(), q)).collect(),
            decode: Arc::new(decode),
            acknowledging: AtomicBool::new(false),
            stopped: Arc::default(),
            acks: Mutex::new(None),
        }
    }

    /// Ends the stream: readers return [`ReadStatus::End`] at their next
    /// read and their clients disconnect (the session stays on the broker).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

impl<M: MqttDecode> Source for MqttSource<M> {
    type Record = M::Record;
    type Reader = MqttReader<M>;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        if self.filters.is_empty() {
            return Err(SourceError::Config("an mqtt source needs at least one topic filter".to_owned()));
        }
        Ok(vec![format!("mqtt:{}", self.config.client_id)])
    }

    /// In a checkpointed job QoS 1 messages are acknowledged only in
    /// [`acknowledge`](Source::acknowledge); otherwise the client
    /// acknowledges them on receipt.
    fn acknowledge_on_commit(&self) {
        self.acknowledging.store(true, Ordering::SeqCst);
    }

    /// Acknowledges (PUBACK) the QoS 1 messages before the committed
    /// checkpoint's offset.
    fn acknowledge(&self, offsets: &[(usize, Offset)]) -> Result<(), SourceError> {
        let Some(&(_, offset)) = offsets.iter().find(|(p, _)| *p == 0) else { return Ok(()) };
        let Some(acks) = self.acks.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return Ok(()) };
        let mut unacked = acks.unacked.lock().unwrap_or_else(|p| p.into_inner());
        while unacked.front().is_some_and(|(seq, _)| *seq < offset) {
            let (_, publish) = unacked.pop_front().expect("checked");
            acks.client.try_ack(&publish).map_err(|e| SourceError::Unavailable {
                what: format!("mqtt {} (acknowledging)", self.config.broker()),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<MqttReader<M>, SourceError> {
        if index != 0 {
            return Err(SourceError::Config(format!("mqtt source: no partition {index}")));
        }
        let acknowledging = self.acknowledging.load(Ordering::SeqCst);
        let options = self.config.options(&self.config.client_id, acknowledging);
        let (client, connection) = Client::new(options, 1024);
        let (tx, rx) = mpsc::sync_channel(8192);
        let stop = Arc::new(AtomicBool::new(false));
        let driver = Driver {
            client: client.clone(),
            connection,
            filters: self.filters.clone(),
            tx,
            stop: Arc::clone(&stop),
            broker: self.config.broker(),
            max_backoff: self.config.max_backoff,
        };
        std::thread::Builder::new()
            .name(format!("highwater-mqtt-{}", self.config.client_id))
            .spawn(move || driver.run())
            .map_err(|source| SourceError::Io { what: "spawning the mqtt client thread".into(), source })?;
        let acks = Arc::new(Acks { client, unacked: Mutex::new(VecDeque::new()) });
        *self.acks.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&acks));
        Ok(MqttReader {
            rx,
            acks,
            acknowledging,
            decode: Arc::clone(&self.decode),
            next: from.unwrap_or(0),
            stop,
            source_stopped: Arc::clone(&self.stopped),
            bytes: 0,
        })
    }
}

/// Drives the client's connection on its own thread: connects (again,
/// with backoff), subscribes when the broker has no session for it, and
/// hands messages to the reader.
struct Driver {
    client: Client,
    connection: Connection,
    filters: Vec<(String, QoS)>,
    tx: SyncSender<Msg>,
    stop: Arc<AtomicBool>,
    broker: String,
    max_backoff: Duration,
}

impl Driver {
    fn run(mut self) {
        let min_backoff = Duration::from_millis(50);
        let mut backoff = min_backoff;
        let mut last_warning: Option<Instant> = None;
        while !self.stop.load(Ordering::SeqCst) {
            match self.connection.recv_timeout(Duration::from_millis(100)) {
                Err(rumqttc::RecvTimeoutError::Timeout) => {}
                Err(rumqttc::RecvTimeoutError::Disconnected) => return,
                Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => {
                    backoff = min_backoff;
                    tracing::debug!(broker = %self.broker, session_present = ack.session_present, "mqtt connected");
                    if !ack.session_present {
                        for (filter, qos) in &self.filters {
                            if let Err(e) = self.client.try_subscribe(filter.clone(), *qos) {
                                tracing::error!(broker = %self.broker, filter, "mqtt subscribe: {e}");
                            }
                        }
                    }
                    if self.tx.send(Msg::Connected).is_err() {
                        break;
                    }
                }
                Ok(Ok(Event::Incoming(Packet::SubAck(ack)))) => {
                    let failed = ack.return_codes.iter().any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure));
                    if failed {
                        tracing::error!(broker = %self.broker, "mqtt: the broker refused a subscription: {ack:?}");
                    }
                }
                Ok(Ok(Event::Incoming(Packet::Publish(publish)))) => {
                    if self.tx.send(Msg::Publish(publish)).is_err() {
                        break;
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                        tracing::warn!(broker = %self.broker, "mqtt source: {e}; reconnecting in {backoff:?}");
                        last_warning = Some(Instant::now());
                    }
                    let until = Instant::now() + backoff;
                    while Instant::now() < until && !self.stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    backoff = (backoff * 2).min(self.max_backoff.max(min_backoff));
                }
            }
        }
        let _ = self.client.try_disconnect();
    }
}

/// Reads an [`MqttSource`]; its client disconnects when it is dropped.
pub struct MqttReader<M> {
    rx: Receiver<Msg>,
    acks: Arc<Acks>,
    acknowledging: bool,
    decode: Arc<M>,
    /// The sequence number of the next message.
    next: u64,
    stop: Arc<AtomicBool>,
    source_stopped: Arc<AtomicBool>,
    /// Topic and payload bytes of the messages read.
    bytes: u64,
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acks").finish_non_exhaustive()
    }
}

impl<M> std::fmt::Debug for MqttReader<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttReader").field("next", &self.next).finish_non_exhaustive()
    }
}

impl<M> Drop for MqttReader<M> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl<M: MqttDecode> PartitionReader for MqttReader<M> {
    type Record = M::Record;

    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(M::Record),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        if self.source_stopped.load(Ordering::SeqCst) {
            self.stop.store(true, Ordering::SeqCst);
            return Ok(ReadStatus::End);
        }
        let mut read = 0;
        let arrival = now_ms();
        while read < max {
            match self.rx.try_recv() {
                Ok(Msg::Connected) => self.acks.unacked.lock().unwrap_or_else(|p| p.into_inner()).clear(),
                Ok(Msg::Publish(mut publish)) => {
                    let seq = self.next;
                    self.next += 1;
                    read += 1;
                    let topic = publish.topic.clone();
                    self.bytes += (topic.len() + publish.payload.len()) as u64;
                    let message = MqttMessage { topic: &topic, payload: &publish.payload, qos: publish.qos, arrival };
                    if let Err(e) = self.decode.decode_message(&message, out) {
                        dead.push(DeadLetter::new(format!("mqtt:{topic}"), seq, e.0, &publish.payload));
                    }
                    if self.acknowledging && publish.qos != QoS::AtMostOnce {
                        publish.payload = Default::default();
                        self.acks.unacked.lock().unwrap_or_else(|p| p.into_inner()).push_back((seq, publish));
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    return Err(SourceError::Config("mqtt source: the client thread ended".to_owned()));
                }
            }
        }
        Ok(if read > 0 { ReadStatus::Data } else { ReadStatus::Idle })
    }

    fn offset(&self) -> Offset {
        self.next
    }

    fn bytes_read(&self) -> Option<u64> {
        Some(self.bytes)
    }
}
