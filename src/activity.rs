//! What each operator of a running job does, read from timely's own event
//! log: the dataflow's operators and the channels between them, each
//! operator's activations and time busy, and the records it received and
//! sent over its channels (pipelines within a worker and exchanges between
//! workers alike).
//!
//! For the metrics ([`crate::metrics`]) and the status page of a running
//! job: [`Job::observing`](crate::Job::observing) installs it on every
//! worker before the dataflows are built. Each worker folds its log into
//! counters of its own and publishes them a few times a second, so a read
//! never waits for a worker and a worker never waits for a read.
//!
//! ```
//! use highwater::activity::Activity;
//! let activity = Activity::default();
//! timely::execute(timely::Config::thread(), {
//!     let activity = activity.clone();
//!     move |worker| {
//!         use timely::dataflow::operators::vec::ToStream;
//!         use timely::dataflow::operators::{Exchange, Inspect};
//!         activity.install(worker);
//!         worker.dataflow::<u64, _, _>(|scope| {
//!             (0..100u64).to_stream(scope).exchange(|x| *x).inspect(|_| {});
//!         });
//!     }
//! })
//! .unwrap()
//! .join();
//! let operators = activity.operators();
//! assert!(operators.iter().any(|op| op.name == "Inspect" && op.records_in == 100));
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::logging::{StartStop, TimelyEvent, TimelyEventBuilder};

/// How often a worker publishes its counters.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// An operator of the job, summed over this process's workers.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OperatorActivity {
    /// Its address in the dataflow, e.g. `"0.4"` (dataflow 0, operator 4);
    /// the same on every worker.
    pub address: String,
    /// Its name.
    pub name: String,
    /// The addresses of the operators its outputs feed.
    pub feeds: Vec<String>,
    /// Times it was scheduled.
    pub activations: u64,
    /// Time spent in it, in seconds.
    pub busy_seconds: f64,
    /// Records it received over its input channels.
    pub records_in: u64,
    /// Records it sent over its output channels (a record sent to two
    /// operators counts twice).
    pub records_out: u64,
}

/// One worker's view of the operators, by address.
#[derive(Debug, Clone, Default)]
struct Published {
    operators: BTreeMap<Vec<usize>, OperatorActivity>,
}

/// The activity of the job's operators in this process: cheap to clone,
/// shared by the workers that log into it and the readers.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    workers: Arc<Mutex<BTreeMap<usize, Published>>>,
}

/// A worker's log, folded as it comes.
#[derive(Default)]
struct Folding {
    worker: usize,
    /// By operator id: its address.
    addresses: BTreeMap<usize, Vec<usize>>,
    /// By channel id: the addresses of its source and target operators.
    channels: BTreeMap<usize, (Vec<usize>, Vec<usize>)>,
    /// By operator id: when it was last scheduled, while it runs.
    started: BTreeMap<usize, Duration>,
    operators: BTreeMap<Vec<usize>, OperatorActivity>,
    published: Option<Duration>,
}

fn address_text(addr: &[usize]) -> String {
    addr.iter().map(usize::to_string).collect::<Vec<_>>().join(".")
}

impl Folding {
    fn fold(&mut self, time: Duration, event: &TimelyEvent) {
        match event {
            TimelyEvent::Operates(op) => {
                self.addresses.insert(op.id, op.addr.clone());
                let entry = self.operators.entry(op.addr.clone()).or_default();
                entry.address = address_text(&op.addr);
                entry.name = op.name.clone();
            }
            TimelyEvent::Channels(ch) => {
                // Index 0 of a scope is the scope itself (its inputs and outputs).
                let at = |index: usize| {
                    if index == 0 {
                        ch.scope_addr.clone()
                    } else {
                        let mut addr = ch.scope_addr.clone();
                        addr.push(index);
                        addr
                    }
                };
                let (source, target) = (at(ch.source.0), at(ch.target.0));
                let feeds = &mut self.operators.entry(source.clone()).or_default().feeds;
                let target_text = address_text(&target);
                if !feeds.contains(&target_text) {
                    feeds.push(target_text);
                }
                self.channels.insert(ch.id, (source, target));
            }
            TimelyEvent::Messages(m) => {
                if let Some((source, target)) = self.channels.get(&m.channel) {
                    let records = u64::try_from(m.record_count).unwrap_or(0);
                    if m.is_send {
                        self.operators.entry(source.clone()).or_default().records_out += records;
                    } else {
                        self.operators.entry(target.clone()).or_default().records_in += records;
                    }
                }
            }
            TimelyEvent::Schedule(s) => match s.start_stop {
                StartStop::Start => {
                    self.started.insert(s.id, time);
                }
                StartStop::Stop => {
                    let (Some(start), Some(addr)) = (self.started.remove(&s.id), self.addresses.get(&s.id)) else {
                        return;
                    };
                    let op = self.operators.entry(addr.clone()).or_default();
                    op.activations += 1;
                    op.busy_seconds += time.saturating_sub(start).as_secs_f64();
                }
            },
            _ => {}
        }
    }
}

impl Activity {
    /// Logs `worker`'s operators into this from now on: call it before the
    /// worker builds its dataflows (their operators are logged as they are
    /// built).
    pub fn install(&self, worker: &mut timely::worker::Worker) {
        let workers = Arc::clone(&self.workers);
        let mut folding = Folding { worker: worker.index(), ..Folding::default() };
        let Some(mut register) = worker.log_register() else { return };
        register.insert::<TimelyEventBuilder, _>("timely", move |time, events| {
            // `None`: the log closes, and what is left is published.
            if let Some(events) = events {
                for (at, event) in events.iter() {
                    folding.fold(*at, event);
                }
                if folding.published.is_some_and(|p| time.saturating_sub(p) < PUBLISH_EVERY) {
                    return;
                }
            }
            folding.published = Some(*time);
            if let Ok(mut workers) = workers.lock() {
                workers.insert(folding.worker, Published { operators: folding.operators.clone() });
            }
        });
    }

    /// The operators, summed over this process's workers, by address.
    pub fn operators(&self) -> Vec<OperatorActivity> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut sum: BTreeMap<Vec<usize>, OperatorActivity> = BTreeMap::new();
        for published in workers.values() {
            for (addr, op) in &published.operators {
                let into = sum.entry(addr.clone()).or_insert_with(|| OperatorActivity {
                    address: op.address.clone(),
                    name: op.name.clone(),
                    feeds: op.feeds.clone(),
                    ..OperatorActivity::default()
                });
                into.activations += op.activations;
                into.busy_seconds += op.busy_seconds;
                into.records_in += op.records_in;
                into.records_out += op.records_out;
            }
        }
        // A scope's own address (no Operates event of its own on some
        // paths) has no name: it is the dataflow's boundary.
        sum.into_values().filter(|op| !op.name.is_empty()).collect()
    }
}
