//! Ad clicks attributed to their impressions and enriched with the user's
//! profile *as it was when the click happened*.
//!
//! Three JSON Lines inputs: impressions and clicks (`{"ad", "user", "time"}`)
//! and profile updates (`{"user", "profile": {"tier", "country"} or null to
//! delete, "time"}`). A click counts if it comes within 10 minutes after an
//! impression of the same ad to the same user (an interval join); each such
//! click is then joined with the profile table as of the click's event time (a
//! temporal left join), so ann's clicks before her upgrade to `gold` are
//! attributed to `free`, and bob's click after his profile was deleted has
//! none, whatever order the files are read in. Inputs may be out of order by up
//! to 5 minutes.
//!
//! ```text
//! cargo run --release --example enrich_clicks -- \
//!     examples/data/impressions.jsonl examples/data/ad_clicks.jsonl examples/data/profiles.jsonl
//! ```
//!
//! prints (in some order; add `-w 2` for two workers):
//!
//! ```text
//! ann clicked shoes at 1700000090000, 90 s after the impression: free FR
//! ann clicked hats at 1700000130000, 30 s after the impression: free FR
//! cid clicked hats at 1700000260000, 60 s after the impression: free US
//! ann clicked shoes at 1700001020000, 20 s after the impression: gold FR
//! bob clicked bags at 1700001230000, 30 s after the impression: no profile
//! ```
//!
//! (bob's shoes click came 14.5 minutes after the impression: not attributed.)

use std::sync::{Arc, Mutex};

use anyhow::Context;
use highwater::prelude::*;

/// An ad shown to a user, or clicked by them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct AdEvent {
    ad: String,
    user: String,
    time: u64,
}

/// What the profile service knows about a user.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Profile {
    tier: String,
    country: String,
}

/// A change of a user's profile (`None` deletes it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct ProfileUpdate {
    user: String,
    profile: Option<Profile>,
    time: u64,
}

/// What the program prints for the files in `examples/data`, sorted.
pub const EXPECTED: [&str; 5] = [
    "ann clicked hats at 1700000130000, 30 s after the impression: free FR",
    "ann clicked shoes at 1700000090000, 90 s after the impression: free FR",
    "ann clicked shoes at 1700001020000, 20 s after the impression: gold FR",
    "bob clicked bags at 1700001230000, 30 s after the impression: no profile",
    "cid clicked hats at 1700000260000, 60 s after the impression: free US",
];

/// Attributes and enriches the clicks on the layout `timely_args` describe;
/// the lines to print (late records and dead letters included), in the
/// order they came.
pub fn run(impressions: &str, clicks: &str, profiles: &str, timely_args: &[String]) -> anyhow::Result<Vec<String>> {
    let impressions = Arc::new(JsonLines::files(&[impressions], JsonDecoder::<AdEvent>::new())?);
    let clicks = Arc::new(JsonLines::files(&[clicks], JsonDecoder::<AdEvent>::new())?);
    let profiles = Arc::new(JsonLines::files(&[profiles], JsonDecoder::<ProfileUpdate>::new())?);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::clone(&lines);
    Job::from_args(timely_args)?.run(move |worker| {
        let (impressions, clicks, profiles) = (Arc::clone(&impressions), Arc::clone(&clicks), Arc::clone(&profiles));
        let lines = Arc::clone(&shared);
        worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
            let delay = WatermarkStrategy::bounded(5.minutes());
            let time = |e: &AdEvent| e.time;
            let impressions =
                FromSource::new(impressions, time).named("impressions").watermark(delay.clone()).build(scope)?;
            let clicks = FromSource::new(clicks, time).named("clicks").watermark(delay.clone()).build(scope)?;
            let profiles = FromSource::new(profiles, |p: &ProfileUpdate| p.time)
                .named("profiles")
                .watermark(delay)
                .build(scope)?;

            // The profile table: upserts by user, deletes as `None`.
            let table = profiles.events.map(|p| (p.user, p.profile)).upsert().table;

            // Clicks within 10 minutes after an impression of the same ad to the same user.
            let key = |e: &AdEvent| (e.ad.clone(), e.user.clone());
            let attributed = impressions.events.interval_join(
                &clicks.events,
                key,
                key,
                between(0, 10.minutes() as i64),
                |impression, click| (impression.clone(), click.clone()),
            );

            // Each attributed click with the profile as of the click's time.
            let enriched = attributed.results.left_join_as_of(&table, |(_, click)| click.user.clone());
            let out = Arc::clone(&lines);
            enriched.results.inspect(move |(((impression, click), profile), _time, _diff)| {
                let who = profile.as_ref().map_or("no profile".to_owned(), |p| format!("{} {}", p.tier, p.country));
                let after = (click.time - impression.time) / 1_000;
                let line = format!(
                    "{} clicked {} at {}, {after} s after the impression: {who}",
                    click.user, click.ad, click.time
                );
                out.lock().unwrap().push(line);
            });
            for late in [&attributed.late_left.stream, &attributed.late_right.stream] {
                let out = Arc::clone(&lines);
                late.inspect(move |(e, _, _)| out.lock().unwrap().push(format!("late: {e:?}")));
            }
            for dead in [&impressions.dead_letters, &clicks.dead_letters, &profiles.dead_letters] {
                let out = Arc::clone(&lines);
                dead.inspect(move |(d, _, _)| out.lock().unwrap().push(format!("dead letter: {d}")));
            }
            Ok(())
        })
    })?;
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    Ok(lines)
}

fn main() -> anyhow::Result<()> {
    let usage = "usage: enrich_clicks IMPRESSIONS.jsonl CLICKS.jsonl PROFILES.jsonl [timely args]";
    let mut args = std::env::args().skip(1);
    let (impressions, clicks, profiles) =
        (args.next().context(usage)?, args.next().context(usage)?, args.next().context(usage)?);
    let mut lines = run(&impressions, &clicks, &profiles, &args.collect::<Vec<_>>())?;
    for line in &lines {
        println!("{line}");
    }
    if impressions.ends_with("examples/data/impressions.jsonl") {
        lines.sort();
        anyhow::ensure!(lines == EXPECTED, "the output differs from the one documented above");
    }
    Ok(())
}
