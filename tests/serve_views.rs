//! Views served over HTTP (issue 18) from a running job on two workers, read
//! with a real HTTP client while the job ingests: point and range reads
//! against a naive model, `as_of` against a naive replay of the log up to
//! that time, two views read in one request at one time, a subscription
//! that receives every change once, in time order, with progress marks,
//! errors for bad requests, and the bearer token enforced.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::serve::{serve_views, ServeOptions, Views};
use highwater_operators::prelude::*;
use highwater_operators::table::TableReader;
use highwater_operators::{Update, END_OF_TIME};
use serde_json::{json, Value};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::core::input::Handle as InputHandle;
use timely::dataflow::operators::core::Input as _;

/// An upsert: account, new balance (`None` closes it), at an event time.
type Upsert = (u64, Option<i64>, u64);

/// The log up to and including `as_of`, replayed: each account's latest balance.
fn replay(log: &[Upsert], as_of: u64) -> BTreeMap<u64, i64> {
    let mut state = BTreeMap::new();
    for (k, v, _) in log.iter().filter(|u| u.2 <= as_of) {
        match v {
            Some(v) => state.insert(*k, *v),
            None => state.remove(k),
        };
    }
    state
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// GET `url`: the status and the JSON body.
fn get(url: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = ureq::get(url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{url}: {e}"),
    };
    let status = response.status();
    let body = response.into_string().expect("a body");
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}")))
}

/// POST `url` with a JSON `body`: the status and the JSON body.
fn post(url: &str, body: &Value) -> (u16, Value) {
    let response = match ureq::post(url).set("Content-Type", "application/json").send_string(&body.to_string()) {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{url}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().expect("a body");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}")))
}

/// The job: upserts of account balances into the table `balances` (a day of
/// history), `doubled` (each balance times two; no history) and `names`
/// (string keys, `acct-<n>`), served on two workers. Returns the sender of
/// epochs (upserts at one time, then the input advances past it) and the
/// job's thread.
fn job(views: &Views) -> (mpsc::Sender<Vec<Upsert>>, std::thread::JoinHandle<()>) {
    let balances: TableReader<u64, i64> = views.table("balances", 24 * 3_600_000);
    let doubled: TableReader<u64, i64> = views.table("doubled", 0);
    let names: TableReader<String, i64> = views.table("names", 0);
    let (tx, rx) = mpsc::channel::<Vec<Upsert>>();
    let rx = Arc::new(Mutex::new(Some(rx)));
    let thread = std::thread::spawn(move || {
        timely::execute(timely::Config::process(2), move |worker| {
            type Handle = InputHandle<u64, CapacityContainerBuilder<Vec<Update<(u64, Option<i64>)>>>>;
            let mut handle: Handle = InputHandle::new();
            let (b, d, n) = (balances.clone(), doubled.clone(), names.clone());
            worker.dataflow::<u64, _, _>(|scope| {
                let table = EventStream::new(scope.input_from(&mut handle)).upsert().table;
                table.serve(&b);
                Table::from_changelog(&table.changelog().map(|(k, v)| (k, v * 2))).serve(&d);
                Table::from_changelog(&table.changelog().map(|(k, v)| (format!("acct-{k}"), v))).serve(&n);
            });
            let epochs = if worker.index() == 0 { rx.lock().unwrap().take() } else { None };
            if let Some(epochs) = epochs {
                // The dataflow runs on while the test reads: the worker steps
                // whenever no epoch is waiting.
                loop {
                    match epochs.try_recv() {
                        Ok(epoch) => {
                            let Some(time) = epoch.first().map(|u| u.2) else { continue };
                            handle.advance_to(time);
                            for (k, v, t) in epoch {
                                handle.send(((k, v), t, 1));
                            }
                            handle.advance_to(time + 1);
                        }
                        Err(mpsc::TryRecvError::Empty) => {
                            worker.step_or_park(Some(Duration::from_millis(1)));
                        }
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    }
                }
            }
            handle.close();
            while worker.step() {}
        })
        .expect("timely starts")
        .join()
        .into_iter()
        .for_each(|r| r.expect("a worker succeeds"));
    });
    (tx, thread)
}

/// Waits until `view`'s watermark passes `time`.
fn await_watermark(base: &str, view: &str, time: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, list) = get(&format!("{base}/views"), None);
        let watermark = list["views"].as_array().unwrap().iter().find(|v| v["name"] == view).unwrap()["watermark"]
            .as_u64()
            .unwrap();
        if watermark > time {
            return;
        }
        assert!(Instant::now() < deadline, "{view}'s watermark stays at {watermark}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_running_job_serves_its_views() {
    let views = Views::new();
    let (epochs, job) = job(&views);
    let server = serve_views("127.0.0.1:0".parse().unwrap(), views.clone(), ServeOptions::default()).unwrap();
    let base = format!("http://{}", server.local_addr());

    // A subscription from the start, read on a thread of its own.
    let subscription = {
        let url = format!("{base}/views/balances/changes");
        std::thread::spawn(move || {
            // A read that waits longer than this is a failure, not a hang.
            let agent = ureq::AgentBuilder::new().timeout_read(Duration::from_secs(60)).build();
            let response = agent.get(&url).call().expect("the subscription starts");
            let mut lines = Vec::new();
            for line in BufReader::new(response.into_reader()).lines() {
                let line: Value = serde_json::from_str(&line.expect("a line")).unwrap();
                let done = line["progress"].as_u64() == Some(END_OF_TIME);
                lines.push(line);
                if done {
                    break;
                }
            }
            lines
        })
    };

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut log: Vec<Upsert> = Vec::new();
    for round in 0..6u64 {
        // Ten epochs of upserts to distinct accounts among 50.
        for epoch in 0..10u64 {
            let time = 1_000 * (round * 10 + epoch + 1);
            let mut accounts: Vec<u64> = (0..8).map(|_| rng.next() % 50).collect();
            accounts.sort_unstable();
            accounts.dedup();
            let batch: Vec<Upsert> = accounts
                .into_iter()
                .map(|k| (k, (rng.next() % 7 != 0).then(|| (rng.next() % 10_000) as i64), time))
                .collect();
            log.extend(batch.iter().copied());
            epochs.send(batch).unwrap();
        }
        let last = log.last().unwrap().2;
        await_watermark(&base, "balances", last);
        await_watermark(&base, "doubled", last);

        // Point reads as of the view's watermark against the replay.
        for k in 0..50u64 {
            let (status, body) = get(&format!("{base}/views/balances/{k}"), None);
            let as_of = body["as_of"].as_u64();
            match status {
                200 => {
                    let as_of = as_of.expect("an answer says its time");
                    assert_eq!(Some(&body["value"].as_i64().unwrap()), replay(&log, as_of).get(&k), "{body}");
                    assert!(as_of >= last, "{body}");
                }
                404 => assert!(body["error"].as_str().unwrap().contains("no value"), "{body}"),
                other => panic!("{other}: {body}"),
            }
        }
        // A range scan and a prefix scan.
        let (status, body) = get(&format!("{base}/views/balances?from=10&to=30&limit=5"), None);
        assert_eq!(status, 200, "{body}");
        let model = replay(&log, body["as_of"].as_u64().unwrap());
        let expected: Vec<Value> = model.range(10..30).take(5).map(|(k, v)| json!({"key": k, "value": v})).collect();
        assert_eq!(body["rows"], Value::Array(expected), "{body}");
        let (status, body) = get(&format!("{base}/views/names?prefix=acct-1&limit=100"), None);
        assert_eq!(status, 200, "{body}");
        let model = replay(&log, body["as_of"].as_u64().unwrap());
        let mut expected: Vec<(String, i64)> =
            model.iter().map(|(k, v)| (format!("acct-{k}"), *v)).filter(|(k, _)| k.starts_with("acct-1")).collect();
        expected.sort();
        let expected: Vec<Value> = expected.into_iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
        assert_eq!(body["rows"], Value::Array(expected), "{body}");

        // As of past times, from the retained history.
        for _ in 0..10 {
            let as_of = rng.next() % (last + 1);
            let k = rng.next() % 50;
            let (status, body) = get(&format!("{base}/views/balances/{k}?as_of={as_of}"), None);
            match replay(&log, as_of).get(&k) {
                Some(v) => {
                    assert_eq!((status, body["value"].as_i64(), body["as_of"].as_u64()), (200, Some(*v), Some(as_of)))
                }
                None => assert_eq!(status, 404, "{body}"),
            }
        }
        let (status, body) = get(&format!("{base}/views/balances?as_of={}&limit=10000", last / 2), None);
        assert_eq!(status, 200);
        let expected: Vec<Value> = replay(&log, last / 2).iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
        assert_eq!(body["rows"], Value::Array(expected));

        // Two views in one request: as of one time.
        let keys: Vec<String> = (0..50).map(|k| k.to_string()).collect();
        let (status, body) = get(&format!("{base}/views?names=balances,doubled&keys={}", keys.join(",")), None);
        assert_eq!(status, 200, "{body}");
        let model = replay(&log, body["as_of"].as_u64().unwrap());
        for k in 0..50u64 {
            let (b, d) = (&body["views"]["balances"][k.to_string()], &body["views"]["doubled"][k.to_string()]);
            assert_eq!(b.as_i64(), model.get(&k).copied(), "{body}");
            assert_eq!(d.as_i64(), model.get(&k).map(|v| v * 2), "{body}");
        }

        // A batch of point reads and scans of several views, POSTed: as of one time.
        let as_of = last / 3;
        let reads: Vec<Value> = (0..10u64)
            .map(|k| json!({"view": "balances", "key": k}))
            .chain([json!({"view": "balances", "from": 10, "to": 20, "limit": 100})])
            .chain([json!({"view": "balances", "key": 7})])
            .collect();
        let (status, body) = post(&format!("{base}/views"), &json!({"as_of": as_of, "reads": reads}));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["as_of"].as_u64(), Some(as_of));
        let model = replay(&log, as_of);
        let results = body["results"].as_array().unwrap();
        for k in 0..10u64 {
            assert_eq!(results[k as usize]["value"].as_i64(), model.get(&k).copied(), "{body}");
        }
        let scanned: Vec<Value> = model.range(10..20).map(|(k, v)| json!({"key": k, "value": v})).collect();
        assert_eq!(results[10]["rows"], Value::Array(scanned), "{body}");
        assert_eq!(results[11]["value"].as_i64(), model.get(&7).copied());
    }

    // Errors.
    let errors = [
        ("/views/nothing/1", 404),
        ("/views/balances/not-a-number", 400),
        ("/views/balances/1?as_of=soon", 400),
        ("/views/balances/1?as_of=999999999999", 400),
        ("/views/doubled/1?as_of=0", 410),
        ("/views/balances?limit=0", 400),
        ("/views/balances?prefix=1", 400),
        ("/views?names=balances,nothing&keys=1", 404),
    ];
    for (path, expected) in errors {
        let (status, body) = get(&format!("{base}{path}"), None);
        assert_eq!(status, expected, "{path}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}: {body}");
    }
    for (body, expected) in [
        (json!({"reads": [{"view": "nothing", "key": 1}]}), 404),
        (json!({"reads": [{"key": 1}]}), 400),
        (json!({"as_of": "soon", "reads": []}), 400),
        (json!({"reads": [{"view": "balances", "key": "x"}]}), 400),
        (json!({"reads": [{"view": "balances", "limit": 0}]}), 400),
        (json!({"as_of": 0, "reads": [{"view": "doubled", "key": 1}]}), 410),
    ] {
        let (status, answer) = post(&format!("{base}/views"), &body);
        assert_eq!(status, expected, "{body}: {answer}");
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}: {answer}");
    }
    let (_, body) = get(&format!("{base}/views/doubled/1?as_of=0"), None);
    assert!(body["error"].as_str().unwrap().contains("history starts at"), "{body}");

    drop(epochs);
    job.join().unwrap();
    // The subscription: the state at its start, then every change once, in
    // time order, each after the progress mark before it and before the next.
    let lines = subscription.join().unwrap();
    let mut state: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    let (mut progress, mut last_time) = (0u64, 0u64);
    for line in &lines {
        if let Some(p) = line["progress"].as_u64() {
            assert!(p >= progress, "progress goes back: {line}");
            progress = p;
            continue;
        }
        let time = line["time"].as_u64().unwrap_or(0);
        assert!(time >= progress && time >= last_time, "{line} after progress {progress}");
        last_time = time;
        *state.entry((line["key"].as_u64().unwrap(), line["value"].as_i64().unwrap())).or_default() +=
            line["diff"].as_i64().unwrap();
    }
    assert_eq!(progress, END_OF_TIME);
    state.retain(|_, d| *d != 0);
    let expected: BTreeMap<(u64, i64), i64> = replay(&log, END_OF_TIME).into_iter().map(|kv| (kv, 1)).collect();
    assert_eq!(state, expected);
    drop(server);
}

#[test]
fn the_token_is_enforced() {
    let views = Views::new();
    let _reader: TableReader<u64, i64> = views.table("balances", 0);
    let addr = "0.0.0.0:0".parse().unwrap();
    assert!(serve_views(addr, views.clone(), ServeOptions::default()).is_err(), "no token off loopback");
    let options = ServeOptions { token: Some("s3cret".into()), ..ServeOptions::default() };
    let server = serve_views("127.0.0.1:0".parse().unwrap(), views, options).unwrap();
    let base = format!("http://{}", server.local_addr());
    assert_eq!(get(&format!("{base}/views"), None).0, 401);
    assert_eq!(get(&format!("{base}/views"), Some("wrong")).0, 401);
    let (status, body) = get(&format!("{base}/views"), Some("s3cret"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["views"][0]["name"], "balances");
}
