//! Sensor readings over MQTT → 10 s sliding-window averages per device
//! (every 2 s) → alerts published over MQTT when a device runs hot.
//!
//! Readings are JSON objects `{"device": "d1", "celsius": 21.5, "time": MS}`
//! on `sensors/{device}/temperature` (QoS 1); an alert, the device's
//! window and its average, goes to `alerts/{device}` (QoS 1) when the
//! average is above 30 °C.
//!
//! Against any MQTT 3.1.1 broker, e.g. Debian's mosquitto
//! (`apt-get install mosquitto`; for a checkpointed job let enough
//! unacknowledged messages be in flight: `max_inflight_messages 0`):
//!
//! ```text
//! mosquitto -p 1883 &
//! cargo run --release --features mqtt --example mqtt_sensors -- 127.0.0.1:1883 --demo 2000
//! ```
//!
//! `--demo N` publishes N readings of five devices itself (one of them
//! heating up), waits until the job has read them, and stops; without it
//! the job runs until killed, reading whatever the devices publish. Watch
//! the alerts with `mosquitto_sub -t 'alerts/#' -v`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use highwater::mqtt::{MqttConfig, MqttSink, MqttSource, QoS};
use highwater::prelude::*;
use highwater::sink::JsonEncoder;
use highwater::Job;
use serde::{Deserialize, Serialize};

/// A temperature reading.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The device.
    pub device: String,
    /// Degrees Celsius.
    pub celsius: f64,
    /// When it was measured (ms since the epoch).
    pub time: u64,
}

/// An alert: a device's window whose average is above the threshold.
#[derive(Clone, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
pub struct Alert {
    /// The device.
    pub device: String,
    /// The window's start (ms).
    pub window_start: u64,
    /// The average temperature in the window.
    pub average: f64,
}

/// Averages above this raise an alert.
pub const THRESHOLD: f64 = 30.0;

/// `n` readings of five devices, 100 ms apart per device; `d3` heats up.
pub fn demo_readings(n: u64) -> Vec<Reading> {
    (0..n)
        .map(|i| {
            let device = i % 5;
            let step = i / 5;
            let celsius = if device == 3 { 20.0 + step as f64 * 0.05 } else { 20.0 + (step % 7) as f64 * 0.5 };
            Reading { device: format!("d{device}"), celsius, time: 1_700_000_000_000 + step * 100 }
        })
        .collect()
}

/// The alerts for `readings`, computed directly (the windows the job
/// closes: every 10 s window, sliding by 2 s, that holds a reading).
pub fn expected_alerts(readings: &[Reading]) -> Vec<Alert> {
    let mut sums: std::collections::BTreeMap<(String, u64), (f64, u64)> = Default::default();
    for r in readings {
        // The windows [start, start + 10 s) holding r.time, starts a multiple of 2 s.
        let mut start = r.time - r.time % 2_000;
        while start + 10_000 > r.time {
            let e = sums.entry((r.device.clone(), start)).or_default();
            e.0 += r.celsius;
            e.1 += 1;
            match start.checked_sub(2_000) {
                Some(s) => start = s,
                None => break,
            }
        }
    }
    sums.into_iter()
        .map(|((device, window_start), (sum, n))| Alert { device, window_start, average: sum / n as f64 })
        .filter(|a| a.average > THRESHOLD)
        .collect()
}

/// Runs the job against `broker`; with `demo`, publishes those readings,
/// waits until the job has read them all and stops it. Returns the alerts
/// the job published, sorted.
pub fn run(broker: &str, demo: Option<Vec<Reading>>) -> anyhow::Result<Vec<Alert>> {
    let config = MqttConfig::new(broker, "mqtt-sensors")?;
    let source = Arc::new(MqttSource::new(
        config.clone(),
        [("sensors/+/temperature", QoS::AtLeastOnce)],
        JsonDecoder::<Reading>::new(),
    ));
    let read_count = Arc::new(AtomicU64::new(0));
    let alerts = Collected::default();
    let (s, n, into) = (Arc::clone(&source), Arc::clone(&read_count), alerts.clone());
    let job = std::thread::spawn(move || {
        Job::new(timely::Config::process(1)).run(move |worker| {
            worker.dataflow(|scope| -> anyhow::Result<()> {
                let readings = FromSource::new(Arc::clone(&s), |r: &Reading| r.time)
                    .watermark(WatermarkStrategy::bounded(1.secs()))
                    .build(scope)?;
                let n = Arc::clone(&n);
                readings.events.inspect(move |_| {
                    n.fetch_add(1, Ordering::SeqCst);
                });
                readings.dead_letters.inspect(|(d, _, _)| eprintln!("dead letter: {d}"));
                let hot = readings
                    .events
                    .window(Sliding::of(10.secs(), 2.secs()))
                    .key_by(|r: &Reading| r.device.clone())
                    .aggregate(Avg::of(|r: &Reading| r.celsius))
                    .results
                    .map(|r| Alert { device: r.key, window_start: r.window.start, average: r.value })
                    .filter(|a: &Alert| a.average > THRESHOLD);
                // Collected as (device, window start, average's bits): comparable.
                collect(&hot.map(|a: Alert| (a.device, a.window_start, a.average.to_bits())), &into);
                MqttSink::new(config.clone(), |a: &Alert| format!("alerts/{}", a.device), JsonEncoder)
                    .write(&hot, "Alerts")?;
                Ok(())
            })
        })
    });
    if let Some(readings) = demo {
        publish(broker, &readings, || read_count.load(Ordering::SeqCst))?;
        source.stop();
    }
    job.join().map_err(|_| anyhow::anyhow!("the job panicked"))??;
    let mut rows: Vec<Alert> = alerts
        .rows()
        .into_iter()
        .map(|(device, window_start, bits)| Alert { device, window_start, average: f64::from_bits(bits) })
        .collect();
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Ok(rows)
}

/// Publishes `readings` at QoS 1 once the job reads (a probe reading is
/// sent until it arrives), then waits until the job has read them all.
fn publish(broker: &str, readings: &[Reading], read: impl Fn() -> u64) -> anyhow::Result<()> {
    let (host, port) = broker.rsplit_once(':').context("BROKER is HOST:PORT")?;
    let options = rumqttc::MqttOptions::new("mqtt-sensors-demo", host, port.parse()?);
    let (client, mut connection) = rumqttc::Client::new(options, 10_000);
    std::thread::spawn(move || for _ in connection.iter() {});
    let probe = Reading { device: "probe".into(), celsius: 0.0, time: 1_700_000_000_000 };
    let deadline = Instant::now() + Duration::from_secs(30);
    while read() == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the job did not subscribe within 30 s");
        client.publish("sensors/probe/temperature", QoS::AtLeastOnce, false, serde_json::to_vec(&probe)?)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    let probes = read();
    for r in readings {
        client.publish(format!("sensors/{}/temperature", r.device), QoS::AtLeastOnce, false, serde_json::to_vec(r)?)?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while read() < probes + readings.len() as u64 {
        anyhow::ensure!(Instant::now() < deadline, "the job read {} of {} readings", read() - probes, readings.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let usage = "usage: mqtt_sensors BROKER [--demo N]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let broker = args.first().context(usage)?;
    let demo = match args.iter().position(|a| a == "--demo") {
        Some(i) => Some(demo_readings(args.get(i + 1).context(usage)?.parse()?)),
        None => None,
    };
    for alert in run(broker, demo)? {
        println!("{}", serde_json::to_string(&alert)?);
    }
    Ok(())
}
