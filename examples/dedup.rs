//! A stateful operator of one's own, written on highwater's operator model:
//! drop repeated events (an order sent twice by a retrying client) within a
//! time to live of event time.
//!
//! [`Dedup`] is a [`KeyedProcess`]: its logic is all there is to write. The
//! operator that runs it (`EventStream::process_keyed`) exchanges the events
//! by id, keeps each id's state and timer, checkpoints them under the schema
//! `example.dedup` v1, and restores them on any number of workers.
//!
//! ```text
//! cargo run --release --example dedup -- examples/data/orders.jsonl
//! cargo run --release --example dedup -- examples/data/orders.jsonl -w 2
//! ```
//!
//! prints the orders without their repeats (in an order that varies with `-w`):
//!
//! ```text
//! order 1 at 1700000000000: 25
//! order 2 at 1700000001000: 40
//! order 3 at 1700000002000: 13
//! order 1 at 1700000400000: 25
//! ```
//!
//! (order 1 comes again after the 5 minutes it is remembered for: it counts
//! as new.)

use std::sync::Arc;

use anyhow::Context;
use highwater::operators::key::Data;
use highwater::operators::state::{KeyedContext, KeyedProcess, Schema};
use highwater::prelude::*;
use timely::dataflow::operators::Inspect;

/// An order event.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Order {
    /// The order's id: repeats carry the same.
    pub id: u64,
    /// Its amount.
    pub amount: i64,
    /// Event time, epoch ms.
    pub time: u64,
}

/// Keeps the first of the events with the same key within `ttl` ms of event
/// time after it; later ones are repeats. The key's state (the time of the
/// event kept) is forgotten once the watermark is `ttl + lateness` past it,
/// `lateness` being how far out of order events may arrive.
#[derive(Clone, Copy, Debug)]
pub struct Dedup {
    /// How long an event's key is remembered, in ms of event time.
    pub ttl: u64,
    /// How far behind the watermark an event may arrive, in ms.
    pub lateness: u64,
}

impl<K, D: Data> KeyedProcess<K, D> for Dedup {
    /// The event time of the event kept.
    type State = Timestamp;
    type Output = D;
    const SCHEMA: Schema = Schema::new("example.dedup", 1);

    fn on_record(&self, ctx: &mut KeyedContext<'_, K, Timestamp, D>, event: D, time: Timestamp, diff: i64) {
        if diff <= 0 {
            return; // a retraction of an event: nothing to keep or drop
        }
        // Within the time to live of the event kept, before or after it.
        if ctx.state().is_some_and(|kept| kept.abs_diff(time) < self.ttl) {
            return;
        }
        // A new event for its key: the first, or one past the time to live.
        if ctx.state().is_none_or(|kept| time > *kept) {
            *ctx.state_mut() = Some(time);
            ctx.schedule(time + self.ttl + self.lateness);
        }
        ctx.emit(event, time, 1);
    }

    fn on_timer(&self, ctx: &mut KeyedContext<'_, K, Timestamp, D>, at: Timestamp) {
        // Forgotten only if no later event replaced it (which set a later timer).
        if ctx.state().is_some_and(|kept| kept + self.ttl + self.lateness <= at) {
            ctx.clear_state();
        }
    }
}

#[allow(dead_code)] // the tests include this file for `Dedup` only
fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().context("usage: dedup ORDERS.jsonl [timely args]")?;
    let timely_args: Vec<String> = args.collect();
    let config = highwater::cluster::config_from_args(&timely_args)?;
    let source = Arc::new(JsonLines::files_with_block_size(&[&path], JsonDecoder::<Order>::new(), 256)?);
    let dedup = Dedup { ttl: 5.minutes(), lateness: 1.minutes() };
    let metrics = SourceMetrics::default();
    let guards = timely::execute(config, move |worker| {
        let source = Arc::clone(&source);
        worker.dataflow(|scope| {
            let options = SourceOptions { watermark: WatermarkStrategy::bounded(dedup.lateness), ..Default::default() };
            let orders =
                read(scope, source, |o: &Order| o.time, options, &metrics, None).expect("the file was opened above");
            orders.events.process_keyed("Dedup", |o: &Order| o.id, dedup).inner.inspect(|(o, _, _)| {
                println!("order {} at {}: {}", o.id, o.time, o.amount);
            });
            orders.dead_letters.inner.inspect(|(d, _, _)| eprintln!("dead letter: {d}"));
        });
        // A source that fails for good (say, the file cut short) stops the job.
        highwater::source::run_until_failed(worker, &[&metrics])
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    for result in guards.join() {
        result.map_err(anyhow::Error::msg)??;
    }
    Ok(())
}
