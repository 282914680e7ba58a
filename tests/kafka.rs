//! The Kafka source against a real Kafka-protocol broker (tests/common/kafka.rs
//! starts one per test on a free port).
//!
//! - Windowed counts over a topic of 4 partitions, one of them empty, equal
//!   a naive count of the events produced, at 1 and 2 workers (bounded with
//!   `StopAt::Latest`), and the empty partition of a live source goes idle
//!   instead of stalling the windows.
//! - `highwater nexmark --kafka ... --to latest` gives the rows of the same
//!   query over the same events in a file (tests/nexmark_oracle.rs checks the
//!   file runs against a naive evaluator), at 1 and 2 workers and at 2
//!   processes.
//! - Start positions (`latest`, a timestamp, the group's offsets) and bad
//!   records (dead letters with topic, partition and offset; the job goes on).
//! - A checkpointed job over Kafka killed with SIGKILL recovers from the
//!   offsets in its checkpoint, and its committed output equals an
//!   uninterrupted run's.

#[path = "common/crash.rs"]
mod crash;
#[path = "common/kafka.rs"]
mod kafka;
#[path = "../examples/kafka_fraud.rs"]
#[allow(dead_code, unreachable_pub)]
mod kafka_fraud;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crash::{committed_parts, events_file, seed, Rng, Scratch};
use highwater::kafka::{create_topic, KafkaConfig, KafkaSource, Producer, StartFrom, StopAt, WithTimestamp};
use highwater::prelude::*;
use highwater::source::{PartitionReader, ReadStatus, Source};
use kafka::KafkaBroker;
use serde::{Deserialize, Serialize};

const BIN: &str = env!("CARGO_BIN_EXE_highwater");

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Click {
    user: String,
    time: u64,
}

/// `n` clicks of 20 users, about 1 ms of event time apart, each up to 2 s
/// out of order, round-robin over `partitions` partitions; as
/// `(partition, click)`.
fn clicks(n: u64, partitions: u64) -> Vec<(i32, Click)> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..n)
        .map(|i| {
            let time = 1_700_000_000_000 + i + 2_000 - next() % 2_000;
            ((i % partitions) as i32, Click { user: format!("u{}", next() % 20), time })
        })
        .collect()
}

fn produce(config: &KafkaConfig, topic: &str, records: &[(i32, Vec<u8>)]) {
    let producer = Producer::new(config).unwrap();
    for (partition, payload) in records {
        producer.send(topic, Some(*partition), None, payload).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn produce_clicks(config: &KafkaConfig, topic: &str, clicks: &[(i32, Click)]) {
    let records: Vec<_> = clicks.iter().map(|(p, c)| (*p, serde_json::to_vec(c).unwrap())).collect();
    produce(config, topic, &records);
}

/// The naive count of clicks per user and 10 s window.
fn naive_counts(clicks: &[(i32, Click)]) -> BTreeMap<(String, u64), u64> {
    let mut counts = BTreeMap::new();
    for (_, c) in clicks {
        *counts.entry((c.user.clone(), c.time - c.time % 10_000)).or_insert(0) += 1;
    }
    counts
}

type Counts = Collected<(String, u64, u64)>;

/// Counts clicks per user in 10 s tumbling windows, reading `source`.
fn count_windows<M>(source: Arc<KafkaSource<M>>, scope: timely::dataflow::Scope<'_, u64>, into: &Counts)
where
    M: highwater::kafka::MessageDecode<Record = Click>,
{
    let read = FromSource::new(source, |c: &Click| c.time)
        .watermark(WatermarkStrategy::bounded(3.secs()))
        .idle_timeout(300.millis())
        .build(scope)
        .unwrap();
    let counts = read
        .events
        .window(Tumbling::of(10.secs()))
        .key_by(|c: &Click| c.user.clone())
        .aggregate(Count)
        .results
        .map(|r| (r.key, r.window.start, r.value));
    collect(&counts, into);
}

fn as_map(rows: Vec<(String, u64, u64)>) -> BTreeMap<(String, u64), u64> {
    let mut map = BTreeMap::new();
    for (user, start, count) in rows {
        assert!(map.insert((user, start), count).is_none(), "a window fired twice");
    }
    map
}

#[test]
fn bounded_windowed_counts_equal_the_naive_counts_at_one_and_two_workers() {
    let broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "clicks", 4).unwrap();
    // Partition 3 stays empty.
    let clicks = clicks(30_000, 3);
    produce_clicks(&config, "clicks", &clicks);
    let expected = naive_counts(&clicks);
    // Each partition's payload bytes (the records have no key).
    let mut expected_bytes: BTreeMap<u64, u64> = (0..4).map(|p| (p, 0)).collect();
    for (p, c) in &clicks {
        *expected_bytes.get_mut(&(*p as u64)).unwrap() += serde_json::to_vec(c).unwrap().len() as u64;
    }
    for workers in [1, 2] {
        let counts = Counts::default();
        let into = counts.clone();
        let source =
            Arc::new(KafkaSource::new(config.clone(), ["clicks"], JsonDecoder::<Click>::new()).stop_at(StopAt::Latest));
        let report = Job::new(timely::Config::process(workers))
            .run(move |worker| {
                worker.dataflow(|scope| count_windows(Arc::clone(&source), scope, &into));
                Ok::<_, String>(())
            })
            .unwrap();
        assert_eq!(as_map(counts.rows()), expected, "at {workers} worker(s)");
        let bytes: BTreeMap<u64, u64> = report
            .totals
            .iter()
            .filter_map(|(name, v)| {
                let (_, index) = name.strip_suffix(".partition_bytes")?.rsplit_once('/')?;
                Some((index.parse().ok()?, *v))
            })
            .collect();
        assert_eq!(bytes, expected_bytes, "at {workers} worker(s): the bytes read per partition");
    }
}

#[test]
fn an_empty_partition_of_a_live_source_goes_idle_instead_of_stalling_the_windows() {
    let broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "live", 4).unwrap();
    let clicks = clicks(40_000, 3);
    produce_clicks(&config, "live", &clicks);
    // Every window that ends 3 s (the watermark delay) before the last
    // click must fire although partition 3 never has a record.
    let last = clicks.iter().map(|(_, c)| c.time).max().unwrap();
    let expected: BTreeMap<_, _> =
        naive_counts(&clicks).into_iter().filter(|((_, start), _)| start + 10_000 + 3_000 <= last).collect();
    assert!(!expected.is_empty());
    let counts = Counts::default();
    let into = counts.clone();
    let source = Arc::new(KafkaSource::new(config.clone(), ["live"], JsonDecoder::<Click>::new()));
    // A live job does not end: it runs on a thread of its own, left running
    // when the test returns (each test is a process of its own).
    std::thread::spawn(move || {
        Job::new(timely::Config::process(2))
            .run(move |worker| {
                worker.dataflow(|scope| count_windows(Arc::clone(&source), scope, &into));
                Ok::<_, String>(())
            })
            .unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = as_map(counts.rows());
        let fired: BTreeMap<_, _> =
            got.iter().filter(|(k, _)| expected.contains_key(k)).map(|(k, v)| (k.clone(), *v)).collect();
        if fired == expected {
            // Nothing beyond what the watermark allows has fired.
            assert!(got.keys().all(|(_, start)| start + 10_000 <= last), "a window fired before its end");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the windows did not fire within 60 s: {} of {}",
            fired.len(),
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn start_positions_latest_timestamp_and_group() {
    let broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers()).group("positions");
    create_topic(&config, "pos", 1).unwrap();
    let clicks = clicks(1_000, 1);
    produce_clicks(&config, "pos", &clicks);
    let run = |start: StartFrom| -> Vec<Click> {
        let out = Collected::default();
        let into = out.clone();
        let source = Arc::new(
            KafkaSource::new(config.clone(), ["pos"], JsonDecoder::<Click>::new())
                .start_from(start)
                .stop_at(StopAt::Latest),
        );
        Job::new(timely::Config::process(1))
            .run(move |worker| {
                worker.dataflow(|scope| {
                    let read = FromSource::new(Arc::clone(&source), |c: &Click| c.time).build(scope).unwrap();
                    collect(&read.events, &into);
                });
                Ok::<_, String>(())
            })
            .unwrap();
        out.updates().into_iter().map(|(c, _, _)| c).collect()
    };
    let all: Vec<Click> = clicks.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(run(StartFrom::Earliest), all);
    assert_eq!(run(StartFrom::Latest), vec![]);
    // Without committed offsets, the group starts at the earliest.
    assert_eq!(run(StartFrom::Group), all);
    // The broker stamps records with the time they were produced: from a
    // time after they all were, nothing; from before, everything.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert_eq!(run(StartFrom::Timestamp(now + 60_000)), vec![]);
    assert_eq!(run(StartFrom::Timestamp(now - 600_000)), all);
}

#[test]
fn record_timestamps_as_event_time_and_bad_records_as_dead_letters() {
    let broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "mixed", 2).unwrap();
    let records: Vec<(i32, Vec<u8>)> = vec![
        (0, br#"{"user":"a","time":1}"#.to_vec()),
        (0, b"not json".to_vec()),
        (1, br#"{"user":"b","time":2}"#.to_vec()),
        (1, br#"{"user":"c"}"#.to_vec()),
        (1, br#"{"user":"d","time":4}"#.to_vec()),
    ];
    produce(&config, "mixed", &records);
    let (out, dead) = (Collected::default(), Collected::default());
    let (into, dead_into) = (out.clone(), dead.clone());
    let source = Arc::new(
        KafkaSource::new(config.clone(), ["mixed"], WithTimestamp(JsonDecoder::<Click>::new())).stop_at(StopAt::Latest),
    );
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    Job::new(timely::Config::process(2))
        .run(move |worker| {
            worker.dataflow(|scope| {
                let read = FromSource::new(Arc::clone(&source), |c: &highwater::kafka::Stamped<Click>| c.time)
                    .build(scope)
                    .unwrap();
                collect(&read.events, &into);
                collect(&read.dead_letters.map(|d| (d.origin, d.offset, d.reason.is_empty())), &dead_into);
            });
            Ok::<_, String>(())
        })
        .unwrap();
    let mut users: Vec<String> = out.rows().into_iter().map(|s| s.value.user).collect();
    users.sort();
    assert_eq!(users, ["a", "b", "d"]);
    // Event time is the broker's timestamp, not the payload's `time`.
    assert!(out.updates().iter().all(|(s, t, _)| *t == s.time && s.time >= before - 600_000));
    assert_eq!(dead.rows(), [("kafka:mixed/0".to_owned(), 1, false), ("kafka:mixed/1".to_owned(), 1, false)]);
}

/// `highwater generate --kafka`: the events of `events` into `topic`, which
/// has 4 partitions, over its first 3 (the last stays empty).
fn generate_to_kafka(broker: &KafkaBroker, topic: &str, events: u64) {
    create_topic(&KafkaConfig::new(broker.brokers()), topic, 4).unwrap();
    let out = Command::new(BIN)
        .args(["generate", "--events", &events.to_string(), "--kafka", &broker.brokers(), "--topic", topic])
        .args(["--partitions", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The sorted rows of a CSV output file (header left out).
fn rows_of(csv: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut rows: Vec<String> = text.lines().skip(1).map(str::to_owned).collect();
    rows.sort();
    rows
}

fn nexmark(query: &str, input: &[&str], output: &Path, timely: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["nexmark", "-q", query]).args(input).arg("--output").arg(output).arg("--").args(timely);
    cmd
}

/// Runs the two processes of a job (`command(process, hostfile)`) to
/// completion; if one fails, kills the other and reports both.
fn run_two_processes(dir: &Path, command: impl Fn(usize, &str) -> Command) {
    // Two ports free at the same time.
    let listeners: Vec<_> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
    drop(listeners);
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", ports[0], ports[1])).unwrap();
    let logs: Vec<_> = (0..2).map(|p| dir.join(format!("process-{p}.log"))).collect();
    let mut children: Vec<_> = (0..2)
        .map(|p| {
            command(p, hosts.to_str().unwrap())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&logs[p]).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    let report = |children: &mut Vec<std::process::Child>, why: &str| -> ! {
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let logs: Vec<String> = logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect();
        panic!("{why}\nprocess 0: {}\nprocess 1: {}", logs[0], logs[1]);
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut done = [false, false];
    while !done.iter().all(|d| *d) {
        for p in 0..2 {
            if !done[p] {
                if let Some(status) = children[p].try_wait().unwrap() {
                    if !status.success() {
                        report(&mut children, &format!("process {p} failed: {status}"));
                    }
                    done[p] = true;
                }
            }
        }
        if Instant::now() > deadline {
            report(&mut children, "the processes did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most 60 s) until `ready` holds while `child` runs, then kills
/// it with SIGKILL; the job must not end first.
fn kill_when(child: &mut std::process::Child, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(child.try_wait().unwrap().is_none(), "the job ended before {what}: make it longer");
        assert!(Instant::now() < deadline, "not {what} within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// The ids of the complete checkpoints (with their manifest) in the
/// directory `checkpoints`, ascending.
fn complete_checkpoints(checkpoints: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(checkpoints)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("MANIFEST").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

fn run_ok(mut cmd: Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn nexmark_from_kafka_equals_the_file_run_at_one_and_two_workers_and_two_processes() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "nexmark");
    let dir = &scratch.0;
    let events = 40_000;
    let file = events_file(dir, events);
    generate_to_kafka(&broker, "nexmark", events);
    let brokers = broker.brokers();
    let kafka = ["--kafka", &brokers, "--topic", "nexmark", "--to", "latest"];
    for query in ["q5", "q7", "q8"] {
        let reference = dir.join(format!("{query}-file.csv"));
        run_ok(nexmark(query, &["--input", file.to_str().unwrap()], &reference, &["-w", "2"]));
        let expected = rows_of(&reference);
        assert!(!expected.is_empty());
        for workers in ["1", "2"] {
            let out = dir.join(format!("{query}-kafka-{workers}.csv"));
            run_ok(nexmark(query, &kafka, &out, &["-w", workers]));
            assert_eq!(rows_of(&out), expected, "{query} from kafka at -w {workers}");
        }
        // Two processes: both read their share of the partitions; process
        // 0 writes the output.
        let out = dir.join(format!("{query}-kafka-n2.csv"));
        run_two_processes(dir, |p, hosts| {
            nexmark(query, &kafka, &out, &["-n", "2", "-p", &p.to_string(), "-h", hosts])
        });
        assert_eq!(rows_of(&out), expected, "{query} from kafka at -n 2");
    }
}

/// The test broker answers a fetch with the whole rest of the partition,
/// whatever the fetch limits: a partition above librdkafka's default
/// response limit (100 MB) was never read (the response dropped, fetched
/// again, forever).
#[test]
fn a_partition_larger_than_a_fetch_response_limit_is_read_to_its_end() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "large");
    let dir = &scratch.0;
    let events = 420_000;
    let file = events_file(dir, events);
    create_topic(&KafkaConfig::new(broker.brokers()), "large", 1).unwrap();
    let out = Command::new(BIN)
        .args(["generate", "--events", &events.to_string(), "--kafka", &broker.brokers(), "--topic", "large"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size > 105_000_000, "the partition holds {size} bytes: not above the 100 MB limit");
    let reference = dir.join("q1-file.csv");
    run_ok(nexmark("q1", &["--input", file.to_str().unwrap()], &reference, &["-w", "1"]));
    let brokers = broker.brokers();
    let kafka = ["--kafka", brokers.as_str(), "--topic", "large", "--to", "latest"];
    let from_kafka = dir.join("q1-kafka.csv");
    let mut cmd = nexmark("q1", &kafka, &from_kafka, &["-w", "1"]);
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the job did not read the large partition to its end in 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(rows_of(&from_kafka), rows_of(&reference));
}

#[test]
fn a_killed_checkpointed_job_recovers_from_the_offsets_in_its_checkpoint() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "recover");
    let dir = &scratch.0;
    let events = 600_000;
    generate_to_kafka(&broker, "crash", events);
    let brokers = broker.brokers();
    let kafka = ["--kafka", &brokers, "--topic", "crash", "--to", "latest"];
    let reference = dir.join("plain.csv");
    run_ok(nexmark("q5", &kafka, &reference, &["-w", "2"]));
    let expected = rows_of(&reference);
    let output = dir.join("out");
    let checkpoints = dir.join("ck");
    let job = |recover: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q5"]).args(kafka).arg("--checkpoint-dir").arg(&checkpoints);
        cmd.args(["--checkpoint-interval", "200ms", "--output-dir"]).arg(&output);
        if recover {
            cmd.arg("--recover");
        }
        cmd.args(["--", "-w", "2"]).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    };
    // Killed once a checkpoint is complete, then recovered.
    let mut child = job(false).spawn().unwrap();
    let parts = || {
        std::fs::read_dir(&output)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
            .count()
    };
    kill_when(&mut child, "a part was committed", || parts() > 0);
    let out = job(true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A run that started over instead of resuming from the checkpoint's
    // offsets would commit the first parts' rows twice.
    let mut rows: Vec<String> = committed_parts(&output).lines().map(str::to_owned).collect();
    rows.sort();
    assert_eq!(rows, expected);
}

/// Every record of `topic` (read `read_committed`, up to its end), as text,
/// in no particular order.
fn topic_records(brokers: &str, topic: &str) -> Vec<String> {
    let out = Collected::default();
    let into = out.clone();
    let source = Arc::new(
        KafkaSource::new(KafkaConfig::new(brokers), [topic], highwater::source::TextDecoder).stop_at(StopAt::Latest),
    );
    Job::new(timely::Config::process(1))
        .run(move |worker| {
            worker.dataflow(|scope| {
                let read = FromSource::new(Arc::clone(&source), |_: &String| 0).build(scope).unwrap();
                collect(&read.events, &into);
            });
            Ok::<_, String>(())
        })
        .unwrap();
    out.updates().into_iter().map(|(r, _, _)| r).collect()
}

#[test]
fn kafka_to_kafka_at_least_once_writes_the_rows_of_the_file_run() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "sink");
    let dir = &scratch.0;
    let events = 40_000;
    let file = events_file(dir, events);
    generate_to_kafka(&broker, "events", events);
    let brokers = broker.brokers();
    for (query, workers) in [("q5", "2"), ("q7", "1")] {
        let reference = dir.join(format!("{query}-file.csv"));
        run_ok(nexmark(query, &["--input", file.to_str().unwrap()], &reference, &["-w", "2"]));
        let expected = rows_of(&reference);
        assert!(!expected.is_empty());
        let topic = format!("{query}-rows");
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", query, "--kafka", &brokers, "--topic", "events", "--to", "latest"]).args([
            "--output-topic",
            &topic,
            "--",
            "-w",
            workers,
        ]);
        run_ok(cmd);
        let mut rows = topic_records(&brokers, &topic);
        rows.sort();
        assert_eq!(rows, expected, "{query} to kafka at -w {workers}");
    }
    // --format json: one object per row, the header's names as keys.
    let mut cmd = Command::new(BIN);
    cmd.args(["nexmark", "-q", "q7", "--kafka", &brokers, "--topic", "events", "--to", "latest"]).args([
        "--output-topic",
        "q7-json",
        "--format",
        "json",
    ]);
    run_ok(cmd);
    let reference = rows_of(&dir.join("q7-file.csv"));
    let header = std::fs::read_to_string(dir.join("q7-file.csv")).unwrap().lines().next().unwrap().to_owned();
    let names: Vec<&str> = header.split(',').collect();
    let mut rows: Vec<String> = topic_records(&brokers, "q7-json")
        .into_iter()
        .map(|json| {
            let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&json).unwrap();
            names.iter().map(|n| object[*n].as_str().unwrap().to_owned()).collect::<Vec<_>>().join(",")
        })
        .collect();
    rows.sort();
    assert_eq!(rows, reference);
}

#[test]
fn at_least_once_kafka_output_has_every_row_after_a_kill_and_recovery() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "sink-crash");
    let dir = &scratch.0;
    let events = 600_000;
    generate_to_kafka(&broker, "events", events);
    let brokers = broker.brokers();
    let kafka = ["--kafka", &brokers, "--topic", "events", "--to", "latest"];
    let reference = dir.join("plain.csv");
    run_ok(nexmark("q5", &kafka, &reference, &["-w", "2"]));
    let expected = rows_of(&reference);
    let checkpoints = dir.join("ck");
    let job = |recover: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q5"]).args(kafka).arg("--checkpoint-dir").arg(&checkpoints);
        cmd.args(["--checkpoint-interval", "200ms", "--output-topic", "rows"]);
        if recover {
            cmd.arg("--recover");
        }
        cmd.args(["--", "-w", "2"]).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    };
    let mut child = job(false).spawn().unwrap();
    // Killed once some rows are out and a checkpoint is complete.
    kill_when(&mut child, "a checkpoint and rows", || {
        !complete_checkpoints(&checkpoints).is_empty() && !topic_records(&brokers, "rows").is_empty()
    });
    let out = job(true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut rows = topic_records(&brokers, "rows");
    rows.sort();
    let mut distinct = rows.clone();
    distinct.dedup();
    // Every row at least once; nothing that is not a row.
    let mut expected_distinct = expected.clone();
    expected_distinct.dedup();
    assert_eq!(distinct, expected_distinct);
    assert!(rows.len() >= expected.len());
}

/// How many records of `topic` a consumer of `group` has still to read
/// (from the group's committed offsets to the end).
fn group_remaining(brokers: &str, topic: &str, group: &str) -> usize {
    let config = KafkaConfig::new(brokers).group(group);
    let source = Arc::new(
        KafkaSource::new(config, [topic], highwater::source::RawDecoder)
            .start_from(StartFrom::Group)
            .stop_at(StopAt::Latest),
    );
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&count);
    Job::new(timely::Config::process(1))
        .run(move |worker| {
            let counted = Arc::clone(&counted);
            worker.dataflow(|scope| {
                let read = FromSource::new(Arc::clone(&source), |_: &Vec<u8>| 0).build(scope).unwrap();
                read.events.inspect(move |_| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                });
            });
            Ok::<_, String>(())
        })
        .unwrap();
    count.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn the_group_offsets_are_committed_only_when_a_checkpoint_covering_them_has_committed() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "commit");
    let dir = &scratch.0;
    let events = 600_000;
    generate_to_kafka(&broker, "events", events);
    let brokers = broker.brokers();
    let run = |group: &str, checkpoints: Option<&Path>, recover: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q5", "--kafka", &brokers, "--topic", "events", "--to", "latest"]);
        cmd.args(["--group", group, "--from", "group"]);
        match checkpoints {
            Some(ck) => {
                cmd.arg("--checkpoint-dir").arg(ck).args(["--checkpoint-interval", "200ms", "--output-dir"]);
                cmd.arg(dir.join(format!("out-{group}")));
                if recover {
                    cmd.arg("--recover");
                }
            }
            None => {
                cmd.arg("--discard");
            }
        }
        cmd.args(["--", "-w", "2"]).stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    };
    // Without checkpoints nothing is committed.
    run_ok(run("plain", None, false));
    assert_eq!(group_remaining(&brokers, "events", "plain"), events as usize);

    // Killed mid-run: the group's offsets are at most the latest
    // checkpoint's (never ahead of what a recovery would read again).
    let checkpoints = dir.join("ck");
    let mut child = run("checked", Some(&checkpoints), false).spawn().unwrap();
    let store = highwater::checkpoint::open_store(checkpoints.to_str().unwrap()).unwrap();
    kill_when(&mut child, "three checkpoints", || complete_checkpoints(&checkpoints).len() >= 3);
    let (manifest, _) = highwater::checkpoint::latest_usable(&*store).unwrap().expect("a complete checkpoint");
    let checkpointed: u64 = manifest.sources.values().flatten().filter_map(|p| p.offset).sum();
    let remaining = group_remaining(&brokers, "events", "checked") as u64;
    assert!(
        events - remaining <= checkpointed,
        "the group committed {} records, the checkpoint covers {checkpointed}",
        events - remaining
    );
    assert!(remaining < events, "no offsets were committed after {} checkpoints", manifest.id);

    // Recovered and run to the end: every offset is committed.
    let out = run("checked", Some(&checkpoints), true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(group_remaining(&brokers, "events", "checked"), 0);
}

/// A checkpointed q8 (windows + join) from topic `events` to topic `rows`,
/// exactly once, killing itself at `kill_at` (a kill point) if given.
fn exactly_once_job(brokers: &str, checkpoints: &Path, recover: bool, workers: &str, kill_at: Option<&str>) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["nexmark", "-q", "q8", "--kafka", brokers, "--topic", "events", "--to", "latest"]);
    cmd.arg("--checkpoint-dir").arg(checkpoints).args(["--checkpoint-interval", "100ms"]);
    cmd.args(["--output-topic", "rows", "--exactly-once"]);
    if recover {
        cmd.arg("--recover");
    }
    if let Some(point) = kill_at {
        cmd.env("HIGHWATER_KILL_AT", point);
    }
    cmd.args(["--", "-w", workers]).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// `query`'s rows of an uninterrupted run over topic `events` to a file
/// (`-w 2`), sorted; more than `at_least` of them, or the test is vacuous.
fn reference_rows(query: &str, brokers: &str, dir: &Path, at_least: usize) -> Vec<String> {
    let reference = dir.join(format!("{query}-reference.csv"));
    run_ok(nexmark(query, &["--kafka", brokers, "--topic", "events", "--to", "latest"], &reference, &["-w", "2"]));
    let expected = rows_of(&reference);
    assert!(expected.len() > at_least, "{query} gave {} rows: a vacuous test", expected.len());
    expected
}

/// The records of topic `rows`, read `read_committed`, sorted: a duplicate
/// or a gap shows against the uninterrupted run's rows.
fn committed_rows(brokers: &str) -> Vec<String> {
    let mut rows = topic_records(brokers, "rows");
    rows.sort();
    rows
}

/// Asserts that two sorted lists of rows are equal, naming the rows
/// missing and the rows in excess (duplicates) when they are not.
fn same_rows(actual: Vec<String>, expected: &[String], context: &str) {
    if actual == expected {
        return;
    }
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for row in &actual {
        *counts.entry(row).or_default() += 1;
    }
    for row in expected {
        *counts.entry(row).or_default() -= 1;
    }
    let missing: Vec<_> = counts.iter().filter(|(_, c)| **c < 0).map(|(r, c)| (*r, -c)).collect();
    let excess: Vec<_> = counts.iter().filter(|(_, c)| **c > 0).collect();
    let mut by_first: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (row, _) in &missing {
        by_first.entry(row.split(',').next().unwrap_or("")).or_default().0 += 1;
    }
    for (row, _) in &excess {
        by_first.entry(row.split(',').next().unwrap_or("")).or_default().1 += 1;
    }
    panic!(
        "{context}: {} rows, expected {}; (missing, excess) by first field: {by_first:?}; \
         {} missing, e.g. {:?}; {} in excess, e.g. {:?}",
        actual.len(),
        expected.len(),
        missing.len(),
        &missing[..missing.len().min(5)],
        excess.len(),
        &excess[..excess.len().min(5)]
    );
}

#[test]
fn exactly_once_kafka_to_kafka_through_random_sigkills_onto_other_worker_counts() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "exactly-once");
    let dir = &scratch.0;
    generate_to_kafka(&broker, "events", 2_000_000);
    let brokers = broker.brokers();
    let expected = reference_rows("q8", &brokers, dir, 100);
    let checkpoints = dir.join("ck");
    let seed = seed();
    let mut rng = Rng(seed);
    let (mut kills, mut runs) = (0, 0);
    loop {
        let workers = if runs % 2 == 0 { "2" } else { "1" };
        let mut child = exactly_once_job(&brokers, &checkpoints, runs > 0, workers, None).spawn().unwrap();
        runs += 1;
        if kills >= 10 {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "the last run: {}", String::from_utf8_lossy(&out.stderr));
            break;
        }
        // Every kill lands after the run made a checkpoint of its own (its
        // commit, or the next one's, is under way): a run killed while it
        // starts up would test nothing.
        let before = complete_checkpoints(&checkpoints).last().copied();
        let waited = Instant::now();
        while complete_checkpoints(&checkpoints).last().copied() == before
            && child.try_wait().unwrap().is_none()
            && waited.elapsed() < Duration::from_secs(120)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(rng.millis(0, 600));
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "run {runs}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(kills >= 10, "the job ended after {kills} kills (HIGHWATER_CRASH_SEED={seed}): make it longer");
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
    }
    same_rows(
        committed_rows(&brokers),
        &expected,
        &format!("after {kills} kills in {runs} runs (HIGHWATER_CRASH_SEED={seed})"),
    );
}

/// Reads `reader` until `got` holds `n` records (or 30 s pass).
fn read_until<R: PartitionReader<Record = String>>(reader: &mut R, got: &mut Vec<String>, n: usize) {
    let started = Instant::now();
    let mut dead = Vec::new();
    while got.len() < n && started.elapsed() < Duration::from_secs(30) {
        let max = n - got.len();
        if reader.read(max, &mut |r| got.push(r), &mut dead).unwrap() != ReadStatus::Data {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(dead.is_empty(), "{dead:?}");
}

/// Every record of `topic` with its `diff` header (`None` without one), read
/// from the beginning of each partition to its end.
fn changelog_records(brokers: &str, topic: &str) -> Vec<(String, Option<i64>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "changelog-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
    }
    consumer.assign(&list).unwrap();
    let (mut records, mut ended) = (Vec::new(), BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    while ended.len() < partitions as usize && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let diff = m.headers().and_then(|h| {
                    h.iter()
                        .find(|header| header.key == "diff")
                        .and_then(|header| std::str::from_utf8(header.value?).ok()?.parse().ok())
                });
                records.push((String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap(), diff));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    assert_eq!(ended.len(), partitions as usize, "{topic} not read to its end in 30 s");
    records
}

/// An updating query to Kafka (q4: averages that change as auctions close)
/// writes its changelog: every record has a `diff` header, and the records
/// summed by their diffs are the query's final rows, as the file run gives
/// them (at 1 and 2 workers).
#[test]
fn an_updating_query_writes_its_changelog_to_kafka_with_diff_headers() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "changelog");
    let dir = &scratch.0;
    generate_to_kafka(&broker, "events", 300_000);
    let brokers = broker.brokers();
    let expected: BTreeMap<String, i64> = reference_rows("q4", &brokers, dir, 2).into_iter().map(|r| (r, 1)).collect();
    for workers in ["1", "2"] {
        let topic = format!("q4-{workers}");
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q4", "--kafka", &brokers, "--topic", "events", "--to", "latest"]).args([
            "--output-topic",
            &topic,
            "--",
            "-w",
            workers,
        ]);
        run_ok(cmd);
        let records = changelog_records(&brokers, &topic);
        assert!(records.iter().all(|(_, diff)| matches!(diff, Some(1 | -1))), "a record without a diff of ±1");
        let retractions = records.iter().filter(|(_, diff)| *diff == Some(-1)).count();
        assert!(retractions > 0, "q4's averages change: the changelog retracts ({} records)", records.len());
        let mut sums: BTreeMap<String, i64> = BTreeMap::new();
        for (row, diff) in records {
            *sums.entry(row).or_default() += diff.unwrap_or(0);
        }
        sums.retain(|_, n| *n != 0);
        assert_eq!(sums, expected, "-w {workers}: the changelog summed by its diffs");
    }
}

/// A partition that flow control holds back is paused: its consumer stops
/// fetching and drops what it had prefetched (nothing comes while it is
/// paused, records produced meanwhile included); resumed, it reads on from
/// the record after the last one read: every record once, in order.
#[test]
fn a_paused_partition_fetches_nothing_and_resumes_after_the_last_record_read() {
    let broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "numbers", 1).unwrap();
    let records: Vec<(i32, Vec<u8>)> = (0..3_000u32).map(|i| (0, i.to_string().into_bytes())).collect();
    produce(&config, "numbers", &records[..2_000]);
    let source = KafkaSource::new(config.clone(), ["numbers"], highwater::source::TextDecoder);
    let mut reader = source.open(0, Some(0)).unwrap();
    let mut got = Vec::new();
    read_until(&mut reader, &mut got, 500);
    assert_eq!(got.len(), 500);
    reader.pause();
    produce(&config, "numbers", &records[2_000..]);
    std::thread::sleep(Duration::from_millis(500));
    let mut dead = Vec::new();
    let mut while_paused = 0;
    for _ in 0..20 {
        reader.read(1_000, &mut |_| while_paused += 1, &mut dead).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(while_paused, 0, "records came while the partition was paused");
    reader.resume();
    read_until(&mut reader, &mut got, 3_000);
    let expected: Vec<String> = (0..3_000u32).map(|i| i.to_string()).collect();
    assert_eq!(got, expected, "each record once, in order, across the pause");
}

/// Exactly once from a live topic (no `--to latest`): once the input goes
/// quiet, its partitions idle, the pending cut passes and its transaction
/// commits every row sent so far; before, the rows after the last cut
/// waited for more input (the watermark, so the cut, stood still).
#[test]
fn a_live_exactly_once_job_commits_its_last_rows_once_the_input_goes_quiet() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "exactly-once-quiet");
    let dir = &scratch.0;
    generate_to_kafka(&broker, "events", 60_000);
    let brokers = broker.brokers();
    let expected = reference_rows("q0", &brokers, dir, 1_000);
    create_topic(&KafkaConfig::new(&brokers), "rows", 4).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["nexmark", "-q", "q0", "--kafka", &brokers, "--topic", "events"])
        .arg("--checkpoint-dir")
        .arg(dir.join("ck"))
        .args(["--checkpoint-interval", "200ms", "--idle-timeout", "500ms"])
        .args(["--output-topic", "rows", "--exactly-once", "--", "-w", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("job.log")).unwrap());
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let mut rows = committed_rows(&brokers);
    while rows.len() < expected.len() && started.elapsed() < Duration::from_secs(60) {
        if child.try_wait().unwrap().is_some() {
            panic!("the live job ended: {}", std::fs::read_to_string(dir.join("job.log")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(500));
        rows = committed_rows(&brokers);
    }
    let waited = started.elapsed();
    child.kill().unwrap();
    child.wait().unwrap();
    same_rows(rows, &expected, &format!("committed after {waited:?} of a live run whose input went quiet"));
}

/// Killed between a checkpoint's manifest and its sink's commit, and with
/// a transaction produced but not committed: the recovery produces those
/// parts again from the checkpoint's copy, the broker's open transaction is
/// aborted, and `read_committed` readers see each row once.
#[cfg(feature = "fault-injection")]
#[test]
fn exactly_once_kafka_output_survives_kills_between_manifest_and_commit_and_inside_a_transaction() {
    use std::os::unix::process::ExitStatusExt;
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "exactly-once-points");
    let dir = &scratch.0;
    generate_to_kafka(&broker, "events", 1_000_000);
    let brokers = broker.brokers();
    let expected = reference_rows("q8", &brokers, dir, 100);
    let checkpoints = dir.join("ck");
    // q8's windows close every 100 K events: most parts are empty, and
    // transactions (non-empty parts) are few; the second run's first one
    // may be the recovery's commit of the restored checkpoint.
    for (run, point) in ["sink-commit:3", "kafka-transaction:1", "sink-commit:2"].into_iter().enumerate() {
        let out = exactly_once_job(&brokers, &checkpoints, run > 0, "2", Some(point)).output().unwrap();
        assert_eq!(out.status.signal(), Some(9), "{point} not reached: {}", String::from_utf8_lossy(&out.stderr));
        // Nothing of the killed commit is visible.
        let rows = committed_rows(&brokers);
        let mut distinct = rows.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), rows.len(), "a duplicate after the kill at {point}");
    }
    run_ok(exactly_once_job(&brokers, &checkpoints, true, "1", None));
    same_rows(committed_rows(&brokers), &expected, "after the kill points");
}

/// A committed checkpoint found damaged at recovery (with the one after
/// it): the job recovers from the one before and reads the input between
/// them again. Kafka cannot take the damaged checkpoint's committed rows
/// back, so they are in the topic twice (with a warning); but nothing is
/// lost: checkpoint ids are never taken again, so the sink does not take a
/// new checkpoint's part for the damaged one's (committed, says the progress
/// topic) and skip it.
#[cfg(feature = "fault-injection")]
#[test]
fn a_damaged_committed_checkpoint_is_recovered_from_the_one_before_and_no_row_is_lost() {
    use std::os::unix::process::ExitStatusExt;
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "exactly-once-damaged");
    let dir = &scratch.0;
    generate_to_kafka(&broker, "events", 1_000_000);
    let brokers = broker.brokers();
    let expected = reference_rows("q0", &brokers, dir, 1_000);
    let checkpoints = dir.join("ck");
    let job = |kill_at: Option<&str>, interval: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["nexmark", "-q", "q0", "--kafka", &brokers, "--topic", "events", "--to", "latest"])
            .arg("--checkpoint-dir")
            .arg(&checkpoints)
            .args(["--checkpoint-interval", interval, "--recover", "--output-topic", "rows", "--exactly-once"]);
        if let Some(point) = kill_at {
            // Paced, so that four checkpoints commit before the input ends
            // also when the machine is busy (every commit waits for the
            // broker to take the rows produced since the last one).
            cmd.env("HIGHWATER_KILL_AT", point).args(["--rate-limit", "60000"]);
        }
        cmd.args(["--", "-w", "2"]).output().unwrap()
    };
    // Checkpoint 3 committed; 4's manifest written, its commit killed.
    let out = job(Some("sink-commit:4"), "100ms");
    assert_eq!(out.status.signal(), Some(9), "not killed: {}", String::from_utf8_lossy(&out.stderr));
    let complete = complete_checkpoints(&checkpoints);
    assert_eq!(complete.last(), Some(&4), "{complete:?}");
    assert!(complete.contains(&2), "{complete:?}");
    let committed_before = committed_rows(&brokers).len();
    for id in [3, 4] {
        let manifest = checkpoints.join(format!("chk-{id:010}")).join("MANIFEST");
        let mut bytes = std::fs::read(&manifest).unwrap();
        let i = bytes.len() - 10;
        bytes[i] ^= 0x01;
        std::fs::write(&manifest, bytes).unwrap();
    }
    // The recovery's next checkpoint is its final one (the interval is
    // longer than the run): it holds every row from checkpoint 2 on. Had it
    // taken id 3 again, the sink would skip it as committed.
    let out = job(None, "60s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("skipping a damaged checkpoint"), "{stderr}");
    assert!(stderr.contains("are in the topic twice"), "no warning of the rows committed twice: {stderr}");
    let rows = committed_rows(&brokers);
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for row in &rows {
        *counts.entry(row).or_default() += 1;
    }
    let missing: Vec<&String> = expected.iter().filter(|r| !counts.contains_key(r.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} of {} rows missing, e.g. {:?}",
        missing.len(),
        expected.len(),
        &missing[..3.min(missing.len())]
    );
    assert!(counts.keys().all(|r| expected.binary_search_by(|e| e.as_str().cmp(r)).is_ok()), "a row of no run");
    // Checkpoint 4's rows (committed before the damage) came again.
    assert!(
        rows.len() > expected.len(),
        "{} rows, {} expected, {committed_before} committed before",
        rows.len(),
        expected.len()
    );
}

/// `examples/kafka_fraud.rs` as its documentation says: the alerts it
/// commits to `fraud-alerts` are the matches of the CEP golden file, once
/// each for a `read_committed` reader, also after a second run (recovered
/// from its final checkpoint: nothing again).
#[test]
fn the_kafka_fraud_example_alerts_once_per_golden_match() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "fraud");
    let checkpoints = scratch.0.join("ck");
    let checkpoints = checkpoints.to_str().unwrap();
    let found = kafka_fraud::run(&broker.brokers(), checkpoints, false, &[]).unwrap();
    let key = |alert: &serde_json::Value| (alert["card"].as_str().unwrap().to_owned(), alert["time"].as_u64().unwrap());
    let golden: BTreeSet<(String, u64)> = include_str!("../examples/cep/fraud.expected.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).unwrap();
            (m["key"].as_str().unwrap().to_owned(), m["match"]["large"][0]["time"].as_u64().unwrap())
        })
        .collect();
    assert!(!golden.is_empty());
    let of = |alerts: &[String]| -> Vec<(String, u64)> {
        let mut keys: Vec<_> = alerts.iter().map(|a| key(&serde_json::from_str(a).unwrap())).collect();
        keys.sort();
        keys
    };
    assert_eq!(of(&found), golden.iter().cloned().collect::<Vec<_>>());
    // A second run recovers from the final checkpoint and adds nothing.
    let again = kafka_fraud::run(&broker.brokers(), checkpoints, true, &["-w".into(), "2".into()]).unwrap();
    assert!(again.is_empty(), "{again:?}");
    let committed = topic_records(&broker.brokers(), "fraud-alerts");
    assert_eq!(of(&committed), golden.into_iter().collect::<Vec<_>>());
}

/// Malformed records go to the dead-letter topic, with the reason and
/// where they came from in headers, and the job reads everything else; the
/// source's topic is a pattern (`^ev.*`), which leaves other topics alone.
#[test]
fn malformed_records_go_to_the_dead_letter_topic_and_a_topic_pattern_reads_its_topics() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "dead-letters");
    let dir = &scratch.0;
    let events = 20_000;
    let file = events_file(dir, events);
    // Events on partitions 0-2 of `events`; three malformed records on partition 3.
    generate_to_kafka(&broker, "events", events);
    let config = KafkaConfig::new(broker.brokers());
    let bad: Vec<&[u8]> = vec![b"{not json", b"{\"unknown\": 1}", b"[1, 2"];
    produce(&config, "events", &bad.iter().map(|b| (3, b.to_vec())).collect::<Vec<_>>());
    // A topic the pattern does not match, holding garbage.
    create_topic(&config, "other", 1).unwrap();
    produce(&config, "other", &[(0, b"garbage".to_vec())]);
    let brokers = broker.brokers();
    let reference = dir.join("q1-file.csv");
    run_ok(nexmark("q1", &["--input", file.to_str().unwrap()], &reference, &["-w", "1"]));
    let out = dir.join("q1-kafka.csv");
    let kafka = ["--kafka", &brokers, "--topic", "^ev.*", "--to", "latest", "--dead-letter-topic", "dlq"];
    run_ok(nexmark("q1", &kafka, &out, &["-w", "2"]));
    assert_eq!(rows_of(&out), rows_of(&reference), "the job read every event");

    let consumer: BaseConsumer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &brokers).set("group.id", "dlq-check").create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("dlq", 0, rdkafka::Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut letters = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while letters.len() < bad.len() && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            let headers: BTreeMap<String, String> = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or(b"")).into_owned()))
                        .collect()
                })
                .unwrap_or_default();
            letters.push((m.payload().unwrap_or_default().to_vec(), headers));
        }
    }
    assert_eq!(letters.len(), bad.len(), "dead letters in the topic");
    letters.sort_by_key(|(_, h)| h["highwater.offset"].parse::<u64>().unwrap());
    for (offset, ((payload, headers), expected)) in letters.iter().zip(&bad).enumerate() {
        assert_eq!(payload.as_slice(), *expected);
        assert_eq!(headers["highwater.topic"], "events");
        assert_eq!(headers["highwater.partition"], "3");
        assert_eq!(headers["highwater.offset"], offset.to_string());
        assert_eq!(headers["highwater.origin"], "kafka:events/3");
        assert!(!headers["highwater.reason"].is_empty(), "{headers:?}");
    }
}

/// Kappa: a live job follows a topic while clicks arrive in batches and the
/// broker is killed (SIGKILL) and started again under it; it resumes and
/// loses nothing. Then the same program replays the topic from the
/// earliest offset to its end: the same windows as live, and both equal
/// the naive count.
#[test]
fn a_live_job_survives_a_broker_restart_and_a_replay_from_earliest_equals_it() {
    let mut broker = KafkaBroker::start();
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "clicks", 4).unwrap();
    let all = clicks(20_000, 3);
    let live_counts = Counts::default();
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let source = Arc::new(KafkaSource::new(config.clone(), ["clicks"], JsonDecoder::<Click>::new()));
    let job = {
        let (source, into, read) = (Arc::clone(&source), live_counts.clone(), Arc::clone(&read));
        std::thread::spawn(move || {
            Job::new(timely::Config::process(2))
                .run(move |worker| {
                    let read = Arc::clone(&read);
                    worker.dataflow(|scope| {
                        let clicks = FromSource::new(Arc::clone(&source), |c: &Click| c.time)
                            .watermark(WatermarkStrategy::bounded(3.secs()))
                            .build(scope)
                            .unwrap();
                        clicks.events.inspect(move |_| {
                            read.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        });
                        let counts = clicks
                            .events
                            .window(Tumbling::of(10.secs()))
                            .key_by(|c: &Click| c.user.clone())
                            .aggregate(Count)
                            .results
                            .map(|r| (r.key, r.window.start, r.value));
                        collect(&counts, &into);
                    });
                    Ok::<_, String>(())
                })
                .unwrap()
        })
    };
    let wait_read = |n: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while read.load(std::sync::atomic::Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} clicks read",
                read.load(std::sync::atomic::Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for (i, batch) in all.chunks(5_000).enumerate() {
        produce_clicks(&config, "clicks", batch);
        wait_read((i + 1) * 5_000, "live");
        if i == 1 {
            broker.kill();
            std::thread::sleep(Duration::from_millis(500));
            broker.resume();
        }
    }
    assert_eq!(read.load(std::sync::atomic::Ordering::SeqCst), all.len(), "no click read twice");
    source.stop();
    job.join().unwrap();
    let live = as_map(live_counts.rows());
    assert_eq!(live, naive_counts(&all), "the live run");

    let replayed = Counts::default();
    let into = replayed.clone();
    let replay = Arc::new(
        KafkaSource::new(config, ["clicks"], JsonDecoder::<Click>::new())
            .start_from(StartFrom::Earliest)
            .stop_at(StopAt::Latest),
    );
    Job::new(timely::Config::process(1))
        .run(move |worker| {
            worker.dataflow(|scope| count_windows(Arc::clone(&replay), scope, &into));
            Ok::<_, String>(())
        })
        .unwrap();
    assert_eq!(as_map(replayed.rows()), live, "the replay equals the live run");
}

/// `highwater cep --kafka`: the fraud sample from a topic gives the CEP
/// golden file's matches, on stdout and in the output topic.
#[test]
fn cep_over_kafka_gives_the_golden_matches_and_writes_them_to_a_topic() {
    let broker = KafkaBroker::start();
    let scratch = Scratch::new("kafka", "cep");
    let config = KafkaConfig::new(broker.brokers());
    create_topic(&config, "payments", 2).unwrap();
    let producer = Producer::new(&config).unwrap();
    for line in include_str!("../examples/cep/fraud.jsonl").lines().filter(|l| !l.trim().is_empty()) {
        let card = serde_json::from_str::<serde_json::Value>(line).unwrap()["card"].as_str().unwrap().to_owned();
        producer.send("payments", None, Some(card.as_bytes()), line.as_bytes()).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let out = scratch.0.join("matches.jsonl");
    let mut cmd = Command::new(BIN);
    cmd.args(["cep", "--pattern", concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cep/fraud.cep"), "--key", "card"]);
    cmd.args(["--kafka", &broker.brokers(), "--topic", "payments", "--to", "latest", "--output-topic", "matches"]);
    cmd.arg("--output").arg(&out).args(["--", "-w", "2"]);
    run_ok(cmd);
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let golden = sorted(include_str!("../examples/cep/fraud.expected.jsonl"));
    assert!(!golden.is_empty());
    assert_eq!(sorted(&std::fs::read_to_string(&out).unwrap()), golden);
    let mut in_topic = topic_records(&broker.brokers(), "matches");
    in_topic.sort();
    assert_eq!(in_topic, golden);
}
