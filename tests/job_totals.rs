//! A job's totals ([`JobReport::totals`]) count what every worker's sinks
//! wrote, also what a sink writes at the very end (a table written out when
//! its input is complete) on a worker that gets there after the others.

use std::sync::Arc;
use std::time::Duration;

use highwater::prelude::*;
use highwater::sink::{write, Placement, Sink, SinkError};
use highwater::source::MemorySource;
use highwater::totals::Totals;
use highwater::{Job, Timestamp};

/// A sink that writes nothing until its input is complete, and then, after
/// a pause on worker 1, counts every record it was given.
struct AtTheEnd {
    held: u64,
    slow: bool,
}

impl Sink for AtTheEnd {
    type Item = u64;
    fn write(&mut self, updates: &mut Vec<(u64, Timestamp, i64)>) -> Result<u64, SinkError> {
        self.held += updates.drain(..).map(|u| u.2 as u64).sum::<u64>();
        Ok(0)
    }
    fn finish(&mut self) -> Result<u64, SinkError> {
        if self.slow {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(self.held)
    }
}

#[test]
fn totals_count_what_the_last_worker_writes_at_the_end() {
    let records = 10_000u64;
    let partitions: Vec<Vec<u64>> = (0..2).map(|p| (0..records).filter(|i| i % 2 == p).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    for _ in 0..3 {
        let source = Arc::clone(&source);
        let report = Job::new(timely::Config::process(2))
            .run(move |worker| -> Result<(), String> {
                let source = Arc::clone(&source);
                worker.dataflow::<Timestamp, _, _>(move |scope| {
                    let read = FromSource::new(source, |t: &u64| *t).build(scope).map_err(|e| e.to_string())?;
                    let handle = write(&read.events, "AtTheEnd", Placement::EachWorker, |worker, _| {
                        Ok(AtTheEnd { held: 0, slow: worker == 1 })
                    });
                    if let Some(totals) = Totals::of(&scope) {
                        totals.count("rows", &handle.lines);
                    }
                    Ok::<_, String>(())
                })
            })
            .expect("the job runs");
        assert_eq!(report.totals.get("rows").copied(), Some(records), "{:?}", report.totals);
    }
}
