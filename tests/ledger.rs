//! The event-sourced ledger (`examples/ledger.rs`, issue 18 item 3) against
//! a naive model that replays the log one event after the other: the
//! projections on 1 and 3 workers, the ledger's invariants at every served
//! time (balances as of each time from the retained history, in process and
//! over HTTP with a real client), and a job killed with SIGKILL at a random
//! moment and recovered, which serves what an uninterrupted run serves.

#[path = "../examples/ledger.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger;

#[path = "common/crash.rs"]
mod crash;

#[cfg(feature = "kafka")]
#[path = "common/kafka.rs"]
mod kafka;

use std::collections::BTreeMap;
use std::path::Path;

use ledger::{Balance, Kind, LedgerEvent, Posting, Projections, Readers, Rejection, RunOptions};

/// The model: the log sorted by time and position, each event applied to a
/// map of balances per (currency, account) by the rules the example's
/// documentation states.
struct Model {
    projections: Projections,
    /// Every posting, in decision order.
    postings: Vec<Posting>,
}

fn model(log: &[LedgerEvent]) -> Model {
    let mut events: Vec<&LedgerEvent> = log.iter().collect();
    events.sort_by_key(|e| (e.time, e.seq));
    let mut open: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut postings = Vec::new();
    let mut rejections = BTreeMap::new();
    for e in events {
        let key = (e.currency.clone(), e.account.clone());
        let post = |account: &str, kind, amount, balance, counterparty: Option<String>| Posting {
            account: account.to_owned(),
            currency: e.currency.clone(),
            time: e.time,
            seq: e.seq,
            kind,
            amount,
            balance,
            counterparty,
        };
        let reason = match (e.kind, open.get(&key).copied()) {
            (Kind::Opened, Some(_)) => Some(format!("{} is open already", e.account)),
            (Kind::Opened, None) => {
                open.insert(key, 0);
                postings.push(post(&e.account, Kind::Opened, 0, 0, None));
                None
            }
            _ if e.amount <= 0 => Some(format!("the amount must be positive, not {}", e.amount)),
            (_, None) => Some(format!("{} is not an open {} account", e.account, e.currency)),
            (Kind::Deposited, Some(b)) => {
                open.insert(key, b + e.amount);
                postings.push(post(&e.account, Kind::Deposited, e.amount, b + e.amount, None));
                None
            }
            (_, Some(b)) if b < e.amount => {
                Some(format!("overdraft: the balance of {} is {b}, {} asked", e.account, e.amount))
            }
            (Kind::Withdrew, Some(b)) => {
                open.insert(key, b - e.amount);
                postings.push(post(&e.account, Kind::Withdrew, -e.amount, b - e.amount, None));
                None
            }
            (Kind::Transferred, Some(b)) => {
                let to = e.to.clone().expect("the generator gives every transfer a receiver");
                let to_key = (e.currency.clone(), to.clone());
                match open.get(&to_key).copied() {
                    _ if to == e.account => Some("a transfer to the same account".to_owned()),
                    None => Some(format!("{to} is not an open {} account", e.currency)),
                    Some(r) => {
                        open.insert(key, b - e.amount);
                        open.insert(to_key, r + e.amount);
                        postings.push(post(&e.account, Kind::Transferred, -e.amount, b - e.amount, Some(to.clone())));
                        postings.push(post(&to, Kind::Transferred, e.amount, r + e.amount, Some(e.account.clone())));
                        None
                    }
                }
            }
        };
        if let Some(reason) = reason {
            let r = Rejection {
                seq: e.seq,
                time: e.time,
                account: e.account.clone(),
                kind: e.kind,
                amount: e.amount,
                reason,
            };
            rejections.insert(ledger::rejection_key(&r), r);
        }
    }
    let mut projections = Projections { rejections, ..Projections::default() };
    for p in &postings {
        projections.balances.insert(p.account.clone(), Balance { currency: p.currency.clone(), balance: p.balance });
        projections.statements.insert(ledger::statement_key(p), p.clone());
        let day = projections.daily.entry(format!("{}/{}", p.currency, ledger::day_of(p.time))).or_default();
        match p.kind {
            Kind::Opened => {}
            Kind::Deposited => day.deposited += p.amount,
            Kind::Withdrew => day.withdrawn -= p.amount,
            Kind::Transferred if p.amount < 0 => day.transferred -= p.amount,
            Kind::Transferred => continue,
        }
        day.events += 1;
    }
    Model { projections, postings }
}

/// The balances as of `t` by the model: each account's last posting at or before it.
fn balances_as_of(postings: &[Posting], t: u64) -> BTreeMap<String, Balance> {
    let mut balances = BTreeMap::new();
    for p in postings.iter().filter(|p| p.time <= t) {
        balances.insert(p.account.clone(), Balance { currency: p.currency.clone(), balance: p.balance });
    }
    balances
}

/// Each projection the job served is the model's (statements compared
/// without printing them: they are tens of thousands of lines).
fn same_projections(found: &Projections, expected: &Projections, what: &str) {
    assert_eq!(found.balances, expected.balances, "{what}: balances");
    assert_eq!(found.daily, expected.daily, "{what}: daily totals");
    assert_eq!(found.rejections, expected.rejections, "{what}: rejections");
    assert!(found.statements == expected.statements, "{what}: statements");
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn write_log(dir: &Path, events: u64) -> (std::path::PathBuf, Vec<LedgerEvent>) {
    let log = ledger::generate(60, events, 11);
    let path = dir.join("log.jsonl");
    ledger::write_log(&path, &log).unwrap();
    (path, log)
}

#[test]
fn the_projections_are_the_models_on_any_layout_and_a_replay_rebuilds_them() {
    let dir = crash::Scratch::new("ledger", "layouts");
    let (path, log) = write_log(&dir.0, 120_000);
    let expected = model(&log).projections;
    // The model's log exercises every rule.
    let reasons: Vec<&str> = expected.rejections.values().map(|r| r.reason.as_str()).collect();
    for reason in ["overdraft", "is not an open", "must be positive"] {
        assert!(reasons.iter().any(|r| r.contains(reason)), "no rejection for {reason}");
    }
    assert!(expected.daily.len() >= 4, "several days in two currencies: {:?}", expected.daily.keys());
    assert!(expected.statements.values().any(|p| p.kind == Kind::Transferred));
    for workers in ["1", "3", "1"] {
        let readers = Readers::new();
        let options = RunOptions { log: path.clone(), timely: args(&["-w", workers]), ..Default::default() };
        ledger::run(&options, &readers).unwrap();
        let found = readers.projections();
        same_projections(&found, &expected, &format!("-w {workers}"));
    }
}

#[test]
fn the_ledger_holds_its_invariants_at_every_served_time() {
    let dir = crash::Scratch::new("ledger", "invariants");
    let (path, log) = write_log(&dir.0, 30_000);
    let Model { postings, .. } = model(&log);
    let readers = Readers::new();
    let options = RunOptions { log: path, timely: args(&["-w", "2"]), ..Default::default() };
    ledger::run(&options, &readers).unwrap();

    // Every time at which a balance changed, and the times just before.
    let mut times: Vec<u64> = postings.iter().flat_map(|p| [p.time - 1, p.time]).collect();
    times.sort_unstable();
    times.dedup();
    let earliest = readers.balances.earliest();
    let mut checked = 0;
    for (i, &t) in times.iter().enumerate() {
        if t < earliest {
            continue;
        }
        let served: BTreeMap<String, Balance> = readers.balances.snapshot_as_of(t).unwrap().into_iter().collect();
        // Sum of balances per currency = deposits - withdrawals up to t.
        let mut net: BTreeMap<&str, i64> = BTreeMap::new();
        for p in postings.iter().filter(|p| p.time <= t && matches!(p.kind, Kind::Deposited | Kind::Withdrew)) {
            *net.entry(p.currency.as_str()).or_default() += p.amount;
        }
        let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
        for b in served.values() {
            assert!(b.balance >= 0, "as of {t}: a negative balance {b:?}");
            *sums.entry(b.currency.as_str()).or_default() += b.balance;
        }
        sums.retain(|_, s| *s != 0);
        net.retain(|_, s| *s != 0);
        assert_eq!(sums, net, "as of {t}: balances against deposits minus withdrawals");
        // Exactly the model's, at a sample of the times.
        if i % 97 == 0 {
            assert_eq!(served, balances_as_of(&postings, t), "as of {t}");
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} times compared");

    // Over HTTP, with a real client: balances as of past times, a statement.
    let server = highwater::serve::serve_views(
        "127.0.0.1:0".parse().unwrap(),
        readers.views.clone(),
        highwater::serve::ServeOptions::default(),
    )
    .unwrap();
    let base = format!("http://{}", server.local_addr());
    for (i, &t) in times.iter().enumerate().filter(|(i, _)| i % 1_000 == 0) {
        let expected = balances_as_of(&postings, t);
        let account = format!("acct-{}", i % 60);
        let url = format!("{base}/views/balances/{account}?as_of={t}");
        match (ureq::get(&url).call(), expected.get(&account)) {
            (Ok(response), Some(balance)) => {
                let body: serde_json::Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
                assert_eq!(body["value"]["balance"].as_i64(), Some(balance.balance), "{url}: {body}");
                assert_eq!(body["as_of"].as_u64(), Some(t), "{url}");
            }
            (Err(ureq::Error::Status(404, _)), None) => {}
            (answer, expected) => panic!("{url}: {answer:?}, expected {expected:?}"),
        }
    }
    let statement = ureq::get(&format!("{base}/views/statements?prefix=acct-7/&limit=10000")).call().unwrap();
    let statement: serde_json::Value = serde_json::from_str(&statement.into_string().unwrap()).unwrap();
    let lines: Vec<i64> =
        statement["rows"].as_array().unwrap().iter().map(|r| r["value"]["balance"].as_i64().unwrap()).collect();
    let mut of_7: Vec<&Posting> = postings.iter().filter(|p| p.account == "acct-7").collect();
    of_7.sort_by_key(|p| (p.time, p.seq));
    assert_eq!(lines, of_7.iter().map(|p| p.balance).collect::<Vec<_>>(), "acct-7's statement, in time order");
}

/// The log in a Kafka topic (the test broker, 3 partitions keyed by
/// currency): the projections are the model's, and a second replay from
/// the topic's start rebuilds them on another number of workers.
#[cfg(feature = "kafka")]
#[test]
fn the_log_in_a_kafka_topic_gives_the_same_projections() {
    let broker = kafka::KafkaBroker::start();
    let log = ledger::generate(60, 20_000, 5);
    let expected = model(&log).projections;
    ledger::publish(&broker.brokers(), "ledger", &log).unwrap();
    for workers in ["2", "3"] {
        let readers = Readers::new();
        let options = RunOptions {
            kafka: Some((broker.brokers(), "ledger".into())),
            timely: args(&["-w", workers]),
            ..Default::default()
        };
        ledger::run(&options, &readers).unwrap();
        let found = readers.projections();
        same_projections(&found, &expected, &format!("-w {workers}"));
    }
}

/// A child process of the crash test: runs the ledger as the environment
/// variable `LEDGER_CHILD` says (`log;checkpoints;out`), writing its
/// projections to `out` when the log ends.
#[test]
#[ignore = "a child process of the crash test"]
fn child_job() {
    let spec = std::env::var("LEDGER_CHILD").expect("run by the crash test");
    let [log, checkpoints, out]: [&str; 3] = spec.split(';').collect::<Vec<_>>().try_into().unwrap();
    let readers = Readers::new();
    let options = RunOptions {
        log: log.into(),
        checkpoints: Some(checkpoints.into()),
        rate: Some(8_000.0),
        timely: args(&["-w", "2"]),
        ..Default::default()
    };
    let ran = ledger::run(&options, &readers).unwrap();
    assert!(ran.final_checkpoint);
    eprintln!("recovered from {:?}", ran.recovered_from);
    std::fs::write(out, serde_json::to_vec(&readers.projections()).unwrap()).unwrap();
}

#[test]
fn killed_with_sigkill_and_recovered_it_serves_what_an_uninterrupted_run_serves() {
    let dir = crash::Scratch::new("ledger", "crash");
    let (path, log) = write_log(&dir.0, 40_000);
    let expected = model(&log).projections;
    let mut rng = crash::Rng(crash::seed());
    let checkpoints = dir.0.join("checkpoints");
    let out = dir.0.join("projections.json");
    let spec = format!("{};{};{}", path.display(), checkpoints.display(), out.display());
    // The log takes 5 s at 8000 events a second: killed at a random moment
    // within it, then again, then run to its end.
    for attempt in 0..2 {
        let child_log = dir.0.join(format!("kill-{attempt}.log"));
        let mut child = crash::start_child_job("LEDGER_CHILD", &spec, &child_log);
        std::thread::sleep(rng.millis(1_000, 2_200));
        let running = child.try_wait().unwrap().is_none();
        assert!(running, "the job was still running when killed: {}", std::fs::read_to_string(&child_log).unwrap());
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(!out.exists(), "a killed run wrote no projections");
    }
    let log_path = dir.0.join("final.log");
    let status = crash::start_child_job("LEDGER_CHILD", &spec, &log_path).wait().unwrap();
    let child_log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "{child_log}");
    assert!(child_log.contains("recovered from Some("), "the last run resumed from a checkpoint: {child_log}");
    let found: Projections = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    same_projections(&found, &expected, "after the kills");
}
