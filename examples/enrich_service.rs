//! Clicks enriched with a user profile from a service over HTTP, with a
//! circuit breaker around the calls and failures on a side output.
//!
//! The example serves the profiles itself (an axum server on a loopback
//! port: users whose id is 5 modulo 17 are unknown, a 404), reads 2 000
//! clicks of 60 users from memory, calls `GET /users/{id}` for each with
//! `enrich_async` (64 calls in flight per worker, 500 ms timeout, two
//! retries, a breaker), counts the enriched clicks per country in 1 s
//! windows, and checks its own output: every click once, enriched with its
//! user's profile or on the failure output with the service's answer.
//!
//! ```sh
//! cargo run --release --example enrich_service -- -w 2
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use highwater::enrich::http::get_json;
use highwater::enrich::{AsyncOptions, Backoff, BreakerConfig, EnrichAsync};
use highwater::prelude::*;
use highwater::source::MemorySource;
use highwater::Job;

/// A click on a page.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Click {
    /// Who clicked.
    pub user: u64,
    /// Where.
    pub page: String,
    /// When (ms of event time).
    pub time: u64,
}

/// What the profile service knows of a user.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// The user's name.
    pub name: String,
    /// Where they are.
    pub country: String,
}

/// The service's answer for `user`: `None` for an unknown user (404).
pub fn profile(user: u64) -> Option<Profile> {
    (user % 17 != 5)
        .then(|| Profile { name: format!("user-{user}"), country: ["DE", "FR", "JP"][user as usize % 3].into() })
}

/// `n` clicks of 60 users, 5 ms of event time apart.
pub fn clicks(n: u64) -> Vec<Click> {
    (0..n).map(|i| Click { user: i * 7 % 60, page: format!("/p/{}", i % 9), time: i * 5 }).collect()
}

/// Serves [`profile`] at `GET /users/{id}` on a loopback port, on a thread
/// of its own; returns the address.
pub fn serve_profiles() -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/users/{id}",
                axum::routing::get(|axum::extract::Path(id): axum::extract::Path<u64>| async move {
                    match profile(id) {
                        Some(p) => (axum::http::StatusCode::OK, serde_json::to_string(&p).expect("a profile encodes")),
                        None => (axum::http::StatusCode::NOT_FOUND, "unknown user".to_owned()),
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
            tx.send(listener.local_addr().expect("an address")).expect("the example waits");
            axum::serve(listener, app).await.expect("the service runs");
        });
    });
    rx.recv().expect("the service starts")
}

/// What a run gives: the enriched clicks, the failed ones with their
/// reasons, and the clicks per country and 1 s window.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Each enriched click.
    pub enriched: Vec<(Click, Profile)>,
    /// Each click whose call failed, with the reason.
    pub failed: Vec<(Click, String)>,
    /// Enriched clicks per (country, window start).
    pub per_country: BTreeMap<(String, u64), u64>,
}

/// Runs the job on `clicks` against the service at `addr` with timely's
/// arguments `args` (e.g. `-w 2`).
pub fn run(clicks: Vec<Click>, addr: std::net::SocketAddr, args: &[String]) -> Result<Outcome, String> {
    let half = clicks.len() / 2;
    let source = Arc::new(MemorySource::new(vec![clicks[..half].to_vec(), clicks[half..].to_vec()]));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let into = Arc::clone(&outcome);
    let job = Job::from_args(args).map_err(|e| e.to_string())?;
    job.run(move |worker| {
        let (source, into) = (Arc::clone(&source), Arc::clone(&into));
        worker.dataflow(|scope| -> Result<(), String> {
            let read = FromSource::new(source, |c: &Click| c.time).build(scope).map_err(|e| e.to_string())?;
            let options = AsyncOptions::new("Profiles")
                .capacity(64)
                .timeout(Duration::from_millis(500))
                .retry(Backoff::new(2, Duration::from_millis(10), Duration::from_millis(100), 1))
                .breaker(BreakerConfig::default())
                // An unknown user is an answer, not a failing service: no
                // retry, and the breaker does not count it.
                .permanent(|reason| reason.ends_with("answered 404"));
            let lookup = get_json::<Click, Profile>(&format!("http://{addr}/users/{{}}"), |c| vec![c.user.to_string()]);
            let enriched = read.events.enrich_async(options, lookup);
            let per_country = enriched
                .results
                .window(Tumbling::of(1.secs()))
                .key_by(|(_, p): &(Click, Profile)| p.country.clone())
                .aggregate(Count)
                .results;
            let (a, b, c) = (Arc::clone(&into), Arc::clone(&into), into);
            enriched.results.inspect(move |(e, _, _)| a.lock().expect("not poisoned").enriched.push(e.clone()));
            enriched.failures.inspect(move |(f, _, _)| {
                b.lock().expect("not poisoned").failed.push((f.record.clone(), f.reason.clone()))
            });
            per_country.inspect(move |(r, _, d)| {
                let mut outcome = c.lock().expect("not poisoned");
                let count = outcome.per_country.entry((r.key.clone(), r.window.start)).or_default();
                // A window's result once (no late clicks here): retractions would subtract.
                *count = count.wrapping_add_signed(r.value as i64 * *d);
            });
            Ok(())
        })
    })
    .map_err(|e| e.to_string())?;
    Ok(Arc::try_unwrap(outcome).map_err(|_| "the workers are done".to_owned())?.into_inner().expect("not poisoned"))
}

/// Checks `outcome` against [`profile`] directly: every click once,
/// enriched with its user's profile or failed with a 404; the counts per
/// country and window those of the enriched clicks.
pub fn check(clicks: &[Click], outcome: &Outcome) -> Result<(), String> {
    let mut enriched = outcome.enriched.clone();
    enriched.sort();
    let mut expected: Vec<(Click, Profile)> =
        clicks.iter().filter_map(|c| profile(c.user).map(|p| (c.clone(), p))).collect();
    expected.sort();
    if enriched != expected {
        return Err(format!("{} clicks enriched, {} expected", enriched.len(), expected.len()));
    }
    let mut failed: Vec<Click> = outcome.failed.iter().map(|(c, _)| c.clone()).collect();
    failed.sort();
    let mut unknown: Vec<Click> = clicks.iter().filter(|c| profile(c.user).is_none()).cloned().collect();
    unknown.sort();
    if failed != unknown {
        return Err(format!("{} clicks failed, {} of unknown users", failed.len(), unknown.len()));
    }
    if let Some((c, reason)) = outcome.failed.iter().find(|(_, r)| !r.contains("404")) {
        return Err(format!("click {c:?} failed with {reason}, not the service's 404"));
    }
    let mut per_country: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for (c, p) in &expected {
        *per_country.entry((p.country.clone(), c.time - c.time % 1_000)).or_default() += 1;
    }
    if per_country != outcome.per_country {
        return Err(format!("counts per country {:?}, expected {per_country:?}", outcome.per_country));
    }
    Ok(())
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let clicks = clicks(2_000);
    let addr = serve_profiles();
    let outcome = run(clicks.clone(), addr, &args)?;
    check(&clicks, &outcome)?;
    println!(
        "{} clicks: {} enriched, {} of unknown users on the failure output; {} (country, window) counts; checked",
        clicks.len(),
        outcome.enriched.len(),
        outcome.failed.len(),
        outcome.per_country.len()
    );
    Ok(())
}
