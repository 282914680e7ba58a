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

use std::sync::Arc;

use anyhow::Context;
use highwater::prelude::*;
use timely::dataflow::operators::Inspect;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Click {
    user: String,
    page: String,
    time: u64,
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().context("usage: sessionize CLICKS.jsonl [timely args]")?;
    let timely_args: Vec<String> = args.collect();
    let config = highwater::cluster::config_from_args(&timely_args)?;
    let source = Arc::new(JsonLines::files_with_block_size(&[&path], JsonDecoder::<Click>::new(), 256)?);
    timely::execute(config, move |worker| {
        let source = Arc::clone(&source);
        worker.dataflow(|scope| {
            let options = SourceOptions {
                watermark: WatermarkStrategy::bounded(1.minutes()),
                batch_size: 1,
                ..Default::default()
            };
            let clicks = read(scope, source, |c: &Click| c.time, options, &SourceMetrics::default(), None)
                .expect("the file was opened above");
            let sessions = clicks
                .events
                .window(Session::with_gap(10.minutes()))
                .key_by(|c: &Click| c.user.clone())
                .allowed_lateness(5.minutes())
                .aggregate(Collect);
            sessions.results.inner.inspect(|(s, _time, diff)| {
                let mut clicks = s.value.clone();
                clicks.sort_by_key(|c| c.time);
                let pages: Vec<&str> = clicks.iter().map(|c| c.page.as_str()).collect();
                let sign = if *diff > 0 { '+' } else { '-' };
                println!("{sign} {} {}..{} {pages:?}", s.key, s.window.start, s.window.end);
            });
            sessions.late.stream.inner.inspect(|(c, _, _)| println!("late: {} {} at {}", c.user, c.page, c.time));
            clicks.dead_letters.inner.inspect(|(d, _, _)| println!("dead letter: {d}"));
        });
    })
    .map_err(anyhow::Error::msg)?;
    Ok(())
}
