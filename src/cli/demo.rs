//! `highwater demo`: the generator through windows and a join, printed live.
//!
//! Per 10 s window of event time, the auction with the most bids, joined with
//! the auction's details; a progress line on stderr every second.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use highwater_operators::join::between;
use highwater_operators::prelude::*;
use timely::dataflow::ProbeHandle;

use super::nexmark::{dead_letter_sink, events, watch_watermark, Input};
use super::progress::{iso, summary, Gauges, Progress};
use crate::nexmark::{Auction, Bid, Event, Generator, GeneratorConfig};
use crate::sink::{write_lines, LineTarget, SinkHandle, SinkMode};
use crate::source::SourceOptions;
use crate::time::{Millis, WatermarkStrategy};

/// Arguments of `highwater demo`.
#[derive(Debug, Args)]
pub(super) struct DemoArgs {
    /// Stop after this many events (default: run until stopped).
    #[arg(long, short)]
    events: Option<u64>,
    /// Events per second of event time.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Pace events by the wall clock (event time = now).
    #[arg(long)]
    real_time: bool,
    /// Out-of-orderness of the generated events.
    #[arg(long, default_value = "1s")]
    max_out_of_order: Millis,
    /// Watermark delay.
    #[arg(long, default_value = "4s")]
    watermark_delay: Millis,
    /// Timely arguments: -w THREADS, -n PROCESSES, -p INDEX, -h HOSTFILE.
    #[arg(last = true)]
    timely: Vec<String>,
}

pub(super) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let config = crate::cluster::config_from_args(&args.timely)?;
    let generator = Generator::new(GeneratorConfig {
        events: args.events,
        rate: args.rate,
        real_time: args.real_time,
        max_out_of_order_ms: args.max_out_of_order.0,
        ..Default::default()
    })
    .context("configuring the generator")?;
    let input = Arc::new(Input::Generator(Arc::new(generator)));
    let options = SourceOptions {
        name: "Nexmark".into(),
        watermark: WatermarkStrategy::bounded(args.watermark_delay.0),
        ..Default::default()
    };
    let mut config = config;
    let in_flight = highwater_operators::flow::InFlight::configure(&mut config);
    let alignment = crate::source::Alignment::configure(&mut config);
    let gauges = Gauges { in_flight: Some(in_flight), alignment: Some(alignment), ..Gauges::default() };
    let started = Instant::now();
    let progress = Progress::start(gauges.clone(), started);
    let printed: Arc<std::sync::Mutex<Vec<SinkHandle>>> = Default::default();
    let (g, p) = (gauges.clone(), Arc::clone(&printed));
    eprintln!("highwater demo: hottest auction per 10 s window of event time (Ctrl-C to stop)");
    let guards = crate::cluster::execute(config, move |worker| -> anyhow::Result<()> {
        let probe = ProbeHandle::new();
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let streams = events(scope, &input, options.clone(), &g, &probe)?;
            let bids = streams.events.flat_map(|e| match e {
                Event::Bid(b) => Some(b),
                _ => None,
            });
            let auctions = streams.events.flat_map(|e| match e {
                Event::Auction(a) => Some(*a),
                _ => None,
            });
            let counts = bids
                .window(Tumbling::of(10.secs()))
                .key_by(|b: &Bid| b.auction)
                .named("BidsPerAuction")
                .aggregate(Count);
            let hottest = counts
                .results
                .window(Tumbling::of(10.secs()))
                .key_by(|r: &WindowResult<i64, u64>| r.window)
                .named("Hottest")
                .aggregate(MaxBy::append_only(|r: &WindowResult<i64, u64>| r.value));
            let hot = hottest.results.flat_map(|r| r.value);
            // The auction opened at most 30 s before the window that made it hot ended.
            let joined = auctions.interval_join(
                &hot,
                |a: &Auction| a.id,
                |h| h.key,
                between(0, 30.secs() as i64),
                |a, h| {
                    format!(
                        "{} .. {}  auction {:>7}  category {}  {:>6} bids  \"{}\"",
                        iso(h.window.start),
                        iso(h.window.end),
                        a.id,
                        a.category,
                        h.value,
                        a.item_name
                    )
                },
            );
            let lines = watch_watermark(&joined.results.probe_with(&probe), &g);
            if let Ok(mut late) = g.late.lock() {
                late.extend([counts.late.count, hottest.late.count, joined.late_left.count, joined.late_right.count]);
            }
            let printed = write_lines(&lines, None, LineTarget::Stdout, SinkMode::Append);
            if let Ok(mut all) = p.lock() {
                all.push(printed);
            }
            dead_letter_sink(&streams.dead_letters, None);
            Ok(())
        })?;
        // A source that fails for good stops the job (not as an end of input).
        crate::source::run_until_failed(worker, &[&g.source])?;
        Ok(())
    })
    .map_err(|e| anyhow::anyhow!("starting the workers: {e}"))?;
    super::join_workers(guards)?;
    drop(progress);
    let lines = printed.lock().map(|all| all.iter().map(|h| h.lines.get()).sum()).unwrap_or(0);
    eprintln!("{}", summary(&gauges, &Default::default(), started, lines));
    Ok(())
}
