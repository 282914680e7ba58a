//! Sessionization: clicks per user grouped into sessions of activity.
//!
//! Reads JSON Lines clicks (`{"user": .., "page": .., "time": epoch ms}`),
//! groups each user's clicks into sessions that close after 10 minutes without
//! a click, and prints every session with its pages. Clicks may arrive out of
//! order: the watermark lags the latest click by 1 minute, and clicks up to 5
//! minutes late still correct their session: bob's late `/late` click bridges
//! his two sessions into one. Later clicks and lines that do not parse are
//! reported, not lost.
//!
//! ```text
//! cargo run --release --example sessionize -- examples/data/clicks.jsonl
//! cargo run --release --example sessionize -- examples/data/clicks.jsonl -w 2
//! ```
//!
//! prints (the order varies with `-w`; a late click that lands after its
//! session was emitted shows as `-` old session, `+` corrected session):
//!
//! ```text
//! + ann 1700000000000..1700000660000 ["/home", "/pay", "/cart"]
//! + bob 1700000005000..1700001500000 ["/home", "/late", "/help"]
//! + cid 1700003100000..1700003700000 ["/home"]
//! + ann 1700003000000..1700004000000 ["/home", "/bye"]
//! late: cid /very-late at 1699990000000
//! dead letter: examples/data/clicks.jsonl@305: expected ident at line 1 column 2: not json
//! dead letter: examples/data/clicks.jsonl@466: invalid type: string "yesterday", expected u64 at line 1 column 47: {"user":"cid","page":"/home","time":"yesterday"}
//! ```

use std::sync::{Arc, Mutex};

use anyhow::Context;
use highwater::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Click {
    user: String,
    page: String,
    time: u64,
}

/// What the program prints for `examples/data/clicks.jsonl` once the
/// changelog is consolidated (a `-` line cancels its `+` line), sorted.
pub const EXPECTED: [&str; 7] = [
    "+ ann 1700000000000..1700000660000 [\"/home\", \"/pay\", \"/cart\"]",
    "+ ann 1700003000000..1700004000000 [\"/home\", \"/bye\"]",
    "+ bob 1700000005000..1700001500000 [\"/home\", \"/late\", \"/help\"]",
    "+ cid 1700003100000..1700003700000 [\"/home\"]",
    "dead letter: examples/data/clicks.jsonl@305: expected ident at line 1 column 2: not json",
    "dead letter: examples/data/clicks.jsonl@466: invalid type: string \"yesterday\", expected u64 at line 1 column 47: {\"user\":\"cid\",\"page\":\"/home\",\"time\":\"yesterday\"}",
    "late: cid /very-late at 1699990000000",
];

/// Sessionizes the clicks in `path` on the layout `timely_args` describe;
/// the lines to print, in the order they came.
pub fn run(path: &str, timely_args: &[String]) -> anyhow::Result<Vec<String>> {
    // One partition: the late click is judged against the clicks before it
    // (the first record of a partition is never late where it is read).
    let source = Arc::new(JsonLines::files(&[&path], JsonDecoder::<Click>::new())?);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::clone(&lines);
    Job::from_args(timely_args)?.run(move |worker| {
        let (source, lines) = (Arc::clone(&source), Arc::clone(&shared));
        worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
            // Every click advances the watermark (see `late_corrections`).
            let clicks = FromSource::new(source, |c: &Click| c.time)
                .watermark(WatermarkStrategy::bounded(1.minutes()))
                .batch_size(1)
                .build(scope)?;
            let sessions = clicks
                .events
                .window(Session::with_gap(10.minutes()))
                .key_by(|c: &Click| c.user.clone())
                .allowed_lateness(5.minutes())
                .aggregate(Collect);
            let print = |lines: &Arc<Mutex<Vec<String>>>| {
                let lines = Arc::clone(lines);
                move |line: String| lines.lock().unwrap().push(line)
            };
            let out = print(&lines);
            sessions.results.inspect(move |(s, _time, diff)| {
                let mut clicks = s.value.clone();
                clicks.sort_by_key(|c| c.time);
                let pages: Vec<&str> = clicks.iter().map(|c| c.page.as_str()).collect();
                let sign = if *diff > 0 { '+' } else { '-' };
                out(format!("{sign} {} {}..{} {pages:?}", s.key, s.window.start, s.window.end));
            });
            let out = print(&lines);
            sessions.late.stream.inspect(move |(c, _, _)| out(format!("late: {} {} at {}", c.user, c.page, c.time)));
            let out = print(&lines);
            clicks.dead_letters.inspect(move |(d, _, _)| out(format!("dead letter: {d}")));
            Ok(())
        })
    })?;
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    Ok(lines)
}

/// `lines` with each `- x` line cancelling a `+ x` line, sorted.
pub fn consolidated(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        match line.strip_prefix("- ") {
            Some(rest) => {
                let plus = format!("+ {rest}");
                if let Some(i) = out.iter().position(|l| *l == plus) {
                    out.remove(i);
                }
            }
            None => out.push(line.clone()),
        }
    }
    out.sort();
    out
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().context("usage: sessionize CLICKS.jsonl [timely args]")?;
    let timely_args: Vec<String> = args.collect();
    let lines = run(&path, &timely_args)?;
    for line in &lines {
        println!("{line}");
    }
    if path.ends_with("examples/data/clicks.jsonl") {
        anyhow::ensure!(consolidated(&lines) == EXPECTED, "the output differs from the one documented above");
    }
    Ok(())
}
