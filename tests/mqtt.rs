//! The MQTT source and sink against a real broker (Debian's mosquitto,
//! started by each test on a free port, `tests/common/mqtt.rs`):
//! - readings published at QoS 1 → 1 s tumbling windows per device: the
//!   counts equal a naive count, malformed payloads are dead letters, and
//!   the counts published back over MQTT by the sink arrive as computed;
//! - a checkpointed job killed with SIGKILL twice (this binary run again as
//!   a child, `child_job`) while messages keep coming, some while it is
//!   down: every QoS 1 message reaches the committed output (at least
//!   once);
//! - the broker restarted while a job runs: the job reconnects, nothing is
//!   lost.

#[path = "common/crash.rs"]
mod crash;
#[path = "common/mqtt.rs"]
mod mqtt;
#[path = "../examples/mqtt_sensors.rs"]
#[allow(dead_code, unreachable_pub)]
mod mqtt_sensors;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crash::{committed_parts, seed, Rng, Scratch};
use highwater::checkpoint::{CheckpointConfig, Checkpoints};
use highwater::mqtt::{Arrived, MqttConfig, MqttSink, MqttSource, QoS, WithArrival};
use highwater::prelude::*;
use highwater::sink::{write_parts, JsonEncoder, PartFormat};
use highwater::source::run_until_failed;
use mqtt::MqttBroker;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Reading {
    device: String,
    id: u64,
    time: u64,
}

/// A client that publishes at QoS 1 and counts the broker's
/// acknowledgements (its connection driven on a thread of its own, which
/// reconnects by itself).
struct Publisher {
    client: rumqttc::Client,
    acked: Arc<AtomicU64>,
    sent: u64,
}

impl Publisher {
    fn new(broker: &str, id: &str) -> Publisher {
        let (host, port) = broker.rsplit_once(':').unwrap();
        let mut options = rumqttc::MqttOptions::new(id, host, port.parse().unwrap());
        options.set_keep_alive(Duration::from_secs(5));
        let (client, mut connection) = rumqttc::Client::new(options, 10_000);
        let acked = Arc::new(AtomicU64::new(0));
        let a = Arc::clone(&acked);
        std::thread::spawn(move || {
            for event in connection.iter() {
                match event {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => {
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        Publisher { client, acked, sent: 0 }
    }

    fn publish(&mut self, topic: &str, payload: Vec<u8>) {
        self.client.publish(topic, QoS::AtLeastOnce, false, payload).unwrap();
        self.sent += 1;
    }

    fn reading(&mut self, r: &Reading) {
        self.publish(&format!("sensors/{}/reading", r.device), serde_json::to_vec(r).unwrap());
    }

    /// Waits until the broker has acknowledged everything published.
    fn wait_acked(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.acked.load(Ordering::SeqCst) < self.sent {
            assert!(
                Instant::now() < deadline,
                "{} of {} publishes acknowledged",
                self.acked.load(Ordering::SeqCst),
                self.sent
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A client subscribed to `filter`, collecting (topic, payload).
fn subscriber(broker: &str, id: &str, filter: &str) -> Arc<Mutex<Vec<(String, String)>>> {
    let (host, port) = broker.rsplit_once(':').unwrap();
    let options = rumqttc::MqttOptions::new(id, host, port.parse().unwrap());
    let (client, mut connection) = rumqttc::Client::new(options, 100);
    client.subscribe(filter, QoS::AtLeastOnce).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    let (subscribed_tx, subscribed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _client = client;
        for event in connection.iter() {
            match event {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                    let _ = subscribed_tx.send(());
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    g.lock().unwrap().push((p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned()));
                }
                Ok(_) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    });
    subscribed.recv_timeout(Duration::from_secs(10)).expect("the subscriber's subscription");
    got
}

/// `n` readings of 5 devices, about 2 ms of event time apart, up to 500 ms
/// out of order, ids from `first`.
fn readings(first: u64, n: u64) -> Vec<Reading> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ first);
    (first..first + n)
        .map(|id| Reading {
            device: format!("d{}", rng.next() % 5),
            id,
            time: 1_700_000_000_000 + 2 * id + 500 - rng.next() % 500,
        })
        .collect()
}

/// Publishes a probe reading until `seen` says the job has one: the
/// subscription exists from then on.
fn until_subscribed(publisher: &mut Publisher, seen: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen() {
        assert!(Instant::now() < deadline, "the job never received a probe");
        publisher.reading(&Reading { device: "probe".into(), id: u64::MAX, time: 1_700_000_000_000 });
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn windowed_counts_from_mqtt_equal_the_naive_ones_and_are_published_back() {
    let broker = MqttBroker::start();
    let address = broker.address();
    let config = MqttConfig::new(&address, "hw-windows").unwrap();
    let source =
        Arc::new(MqttSource::new(config, [("sensors/+/reading", QoS::AtLeastOnce)], JsonDecoder::<Reading>::new()));
    let published = subscriber(&address, "checker", "counts/#");
    let counts: Collected<(String, u64, u64)> = Collected::default();
    let (seen, dead) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let job = {
        let (source, into, seen, dead, address) =
            (Arc::clone(&source), counts.clone(), Arc::clone(&seen), Arc::clone(&dead), address.clone());
        std::thread::spawn(move || {
            Job::new(timely::Config::process(2))
                .run(move |worker| {
                    worker.dataflow(|scope| {
                        let read = FromSource::new(Arc::clone(&source), |r: &Reading| r.time)
                            .watermark(WatermarkStrategy::bounded(1.secs()))
                            .build(scope)
                            .unwrap();
                        let s = Arc::clone(&seen);
                        read.events.inspect(move |_| {
                            s.fetch_add(1, Ordering::SeqCst);
                        });
                        let d = Arc::clone(&dead);
                        read.dead_letters.inspect(move |_| {
                            d.fetch_add(1, Ordering::SeqCst);
                        });
                        let windows = read
                            .events
                            .filter(|r: &Reading| r.device != "probe")
                            .window(Tumbling::of(1.secs()))
                            .key_by(|r: &Reading| r.device.clone())
                            .aggregate(Count)
                            .results
                            .map(|r| (r.key, r.window.start, r.value));
                        collect(&windows, &into);
                        let config = MqttConfig::new(&address, "hw-windows-out").unwrap();
                        MqttSink::new(
                            config,
                            |(device, _, _): &(String, u64, u64)| format!("counts/{device}"),
                            JsonEncoder,
                        )
                        .write(&windows, "Counts")
                        .unwrap();
                    });
                    Ok::<_, String>(())
                })
                .unwrap()
        })
    };
    let mut publisher = Publisher::new(&address, "readings");
    until_subscribed(&mut publisher, || seen.load(Ordering::SeqCst) > 0);
    let probes = seen.load(Ordering::SeqCst);
    let all = readings(0, 5_000);
    for r in &all {
        publisher.reading(r);
    }
    publisher.publish("sensors/d1/reading", b"{not json".to_vec());
    publisher.publish("sensors/d2/reading", b"{\"device\": 7}".to_vec());
    publisher.wait_acked();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.load(Ordering::SeqCst) < probes + all.len() as u64 || dead.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the job read {} of {} readings", seen.load(Ordering::SeqCst), all.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    source.stop();
    let report = job.join().unwrap();
    // The bytes read: every message's topic and payload, the probes the
    // job read (records beyond the readings) included.
    let size =
        |r: &Reading| (format!("sensors/{}/reading", r.device).len() + serde_json::to_vec(r).unwrap().len()) as u64;
    let probe = Reading { device: "probe".into(), id: u64::MAX, time: 1_700_000_000_000 };
    let probes_read = seen.load(Ordering::SeqCst) - all.len() as u64;
    let bad = ("sensors/d1/reading".len() + 9 + "sensors/d2/reading".len() + 13) as u64;
    let expected_bytes = all.iter().map(size).sum::<u64>() + probes_read * size(&probe) + bad;
    let bytes: u64 = report.totals.iter().filter(|(n, _)| n.ends_with(".partition_bytes")).map(|(_, v)| v).sum();
    assert_eq!(bytes, expected_bytes, "the bytes read ({probes_read} probes)");
    let mut expected: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for r in &all {
        *expected.entry((r.device.clone(), r.time - r.time % 1_000)).or_default() += 1;
    }
    let mut got = BTreeMap::new();
    for (device, start, count) in counts.rows() {
        assert!(got.insert((device, start), count).is_none(), "a window fired twice");
    }
    assert_eq!(got, expected);
    assert_eq!(dead.load(Ordering::SeqCst), 2, "two malformed payloads, two dead letters");
    // The sink published every count to counts/{device}.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut out: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for (topic, payload) in published.lock().unwrap().iter() {
            let (device, start, count): (String, u64, u64) = serde_json::from_str(payload).unwrap();
            assert_eq!(topic, &format!("counts/{device}"));
            out.insert((device, start), count);
        }
        if out == expected {
            break;
        }
        assert!(Instant::now() < deadline, "the sink published {} of {} counts", out.len(), expected.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The job of the crash test, when this binary runs as the child
/// (`HW_MQTT_CHILD` = `broker|checkpoint-dir|output-dir|recover`): each
/// reading's id into exactly-once part files, checkpointed every 100 ms.
#[test]
#[ignore = "the child process of qos1_messages_reach_a_job_killed_and_recovered_twice; runs only when that test starts it"]
fn child_job() {
    let spec = std::env::var("HW_MQTT_CHILD").expect("started by qos1_messages_reach_a_job_killed_and_recovered_twice");
    let parts: Vec<&str> = spec.split('|').collect();
    let [broker, checkpoints, output, recover] = parts[..] else { panic!("bad HW_MQTT_CHILD {spec}") };
    let config = MqttConfig::new(broker, "hw-crash").unwrap();
    // Event time from arrival: it advances with the clock, and the
    // checkpoints commit the rows behind it.
    let decode = WithArrival(JsonDecoder::<Reading>::new());
    let source = Arc::new(MqttSource::new(config, [("sensors/#", QoS::AtLeastOnce)], decode));
    let mut ck_config = CheckpointConfig::new(checkpoints);
    ck_config.recover = recover == "true";
    ck_config.interval = Duration::from_millis(100);
    let ck = Checkpoints::open(ck_config, 1).unwrap();
    let mut timely_config = timely::Config::thread();
    ck.configure(&mut timely_config);
    let metrics = SourceMetrics::default();
    let (m, c, output) = (metrics.clone(), ck.clone(), output.to_owned());
    let guards = timely::execute(timely_config, move |worker| -> Result<(), String> {
        worker.dataflow(|scope| -> Result<(), String> {
            let options = SourceOptions { name: "mqtt".into(), ..Default::default() };
            let read = read(scope, Arc::clone(&source), |r: &Arrived<Reading>| r.time, options, &m, None)
                .map_err(|e| e.to_string())?;
            let ids = read.events.map(|r: Arrived<Reading>| r.value.id.to_string());
            write_parts(&ids, "ids", output.clone().into(), Some("id".to_owned()), PartFormat::Rows)
                .map_err(|e| e.to_string())?;
            Ok(())
        })?;
        c.built(worker).map_err(|e| e.to_string())?;
        run_until_failed(worker, &[&m]).map_err(|e| e.to_string())
    })
    .unwrap();
    for result in guards.join() {
        result.unwrap().unwrap();
    }
}

fn start_child(spec: &str, log: &Path) -> Child {
    crash::start_child_job("HW_MQTT_CHILD", spec, log)
}

/// The ids in the committed part files of `output`.
fn committed_ids(output: &Path) -> Vec<String> {
    if !output.exists() {
        return Vec::new();
    }
    committed_parts(output).lines().map(str::to_owned).collect()
}

#[test]
fn qos1_messages_reach_a_job_killed_and_recovered_twice() {
    let broker = MqttBroker::start();
    let scratch = Scratch::new("mqtt", "crash");
    let (checkpoints, output) = (scratch.0.join("ck"), scratch.0.join("out"));
    let spec = |recover: bool| format!("{}|{}|{}|{recover}", broker.address(), checkpoints.display(), output.display());
    let log = |run: usize| scratch.0.join(format!("job-{run}.log"));
    let mut rng = Rng(seed());
    let mut publisher = Publisher::new(&broker.address(), "crash-readings");
    let mut job = start_child(&spec(false), &log(0));
    until_subscribed(&mut publisher, || !committed_ids(&output).is_empty());
    let probe = u64::MAX.to_string();
    let mut published = 0u64;
    for run in 1..=2 {
        // Messages while the job runs, then the kill.
        let until = Instant::now() + rng.millis(300, 900);
        while Instant::now() < until {
            for r in readings(published, 20) {
                publisher.reading(&r);
            }
            published += 20;
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(job.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(log(run - 1)).unwrap());
        job.kill().unwrap(); // SIGKILL
        job.wait().unwrap();
        // Messages while the job is down: the broker queues them for its session.
        for r in readings(published, 300) {
            publisher.reading(&r);
        }
        published += 300;
        publisher.wait_acked();
        job = start_child(&spec(true), &log(run));
    }
    for r in readings(published, 300) {
        publisher.reading(&r);
    }
    published += 300;
    publisher.wait_acked();
    let expected: BTreeSet<String> = (0..published).map(|i| i.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids = committed_ids(&output);
        let got: BTreeSet<String> = ids.iter().filter(|i| **i != probe).cloned().collect();
        if got == expected {
            break;
        }
        // A probe moves event time (arrival) on, so that a checkpoint
        // commits the last ids.
        publisher.reading(&Reading { device: "probe".into(), id: u64::MAX, time: 0 });
        if Instant::now() > deadline || job.try_wait().unwrap().is_some() {
            let _ = job.kill();
            let missing: Vec<_> = expected.difference(&got).take(10).collect();
            let unexpected: Vec<_> = got.difference(&expected).take(10).collect();
            panic!(
                "{} of {published} ids committed; missing e.g. {missing:?}; unexpected {unexpected:?}; the last run's log:\n{}",
                got.len(),
                std::fs::read_to_string(log(2)).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    job.kill().unwrap();
    job.wait().unwrap();
}

#[test]
fn a_broker_restarted_while_a_job_runs_loses_nothing() {
    let mut broker = MqttBroker::start();
    let address = broker.address();
    let mut config = MqttConfig::new(&address, "hw-restart").unwrap();
    config.max_backoff = Duration::from_millis(300);
    let source = Arc::new(MqttSource::new(config, [("sensors/#", QoS::AtLeastOnce)], JsonDecoder::<Reading>::new()));
    let ids: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let job = {
        let (source, ids) = (Arc::clone(&source), Arc::clone(&ids));
        std::thread::spawn(move || {
            Job::new(timely::Config::process(1))
                .run(move |worker| {
                    let ids = Arc::clone(&ids);
                    worker.dataflow(|scope| {
                        let read = FromSource::new(Arc::clone(&source), |r: &Reading| r.time).build(scope).unwrap();
                        read.events.inspect(move |(r, _, _)| {
                            ids.lock().unwrap().insert(r.id);
                        });
                    });
                    Ok::<_, String>(())
                })
                .unwrap()
        })
    };
    let mut publisher = Publisher::new(&address, "restart-readings");
    until_subscribed(&mut publisher, || ids.lock().unwrap().contains(&u64::MAX));
    for r in readings(0, 1_000) {
        publisher.reading(&r);
    }
    publisher.wait_acked();
    broker.stop();
    std::thread::sleep(Duration::from_millis(500));
    broker.resume();
    for r in readings(1_000, 1_000) {
        publisher.reading(&r);
    }
    publisher.wait_acked();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = ids.lock().unwrap().iter().filter(|i| **i != u64::MAX).count();
        if got == 2_000 {
            break;
        }
        assert!(Instant::now() < deadline, "{got} of 2000 readings after the broker's restart: {}", broker.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    source.stop();
    job.join().unwrap();
}

/// `examples/mqtt_sensors.rs` as its documentation says (`--demo`): the
/// alerts it publishes are the hot windows computed directly.
#[test]
fn the_mqtt_sensors_example_alerts_on_the_hot_windows() {
    let broker = MqttBroker::start();
    let watcher = subscriber(&broker.address(), "alert-watcher", "alerts/#");
    let readings = mqtt_sensors::demo_readings(2_000);
    let expected = mqtt_sensors::expected_alerts(&readings);
    assert!(expected.len() > 3, "{} alerts: a vacuous test", expected.len());
    let alerts = mqtt_sensors::run(&broker.address(), Some(readings)).unwrap();
    let key = |a: &mqtt_sensors::Alert| (a.device.clone(), a.window_start, (a.average * 1e6).round() as i64);
    let mut got: Vec<_> = alerts.iter().map(key).collect();
    got.sort();
    let mut want: Vec<_> = expected.iter().map(key).collect();
    want.sort();
    assert_eq!(got, want);
    let deadline = Instant::now() + Duration::from_secs(30);
    while watcher.lock().unwrap().len() < expected.len() {
        assert!(Instant::now() < deadline, "{} of {} alerts published", watcher.lock().unwrap().len(), expected.len());
        std::thread::sleep(Duration::from_millis(20));
    }
    for (topic, payload) in watcher.lock().unwrap().iter() {
        let alert: mqtt_sensors::Alert = serde_json::from_str(payload).unwrap();
        assert_eq!(topic, &format!("alerts/{}", alert.device));
    }
}
