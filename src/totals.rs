//! Counters summed over every worker of every process of a job: what a
//! [`Job`](crate::Job) reports at its end ([`JobReport::totals`](crate::JobReport::totals)).
//!
//! Counters ([`Counter`](highwater_operators::Counter)) count on one worker, or on one process when its
//! workers share them (a [`SourceMetrics`](crate::source::SourceMetrics)
//! made outside the workers). A program registers them under a name with
//! [`Totals::count`]; sources register their own (`<source>.records`,
//! `<source>.dead_letters`, `<source>.late_read`), operators with a state
//! time-to-live theirs (`<operator>.expired`). When the job's sources
//! have ended, each process adds up its distinct counters per name (a
//! counter shared by several workers counts once), and the processes
//! exchange their sums over the job's own connections, so every process
//! reports the totals of the whole job, on any number of processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Input, Inspect, Probe};

/// How long the workers wait for the other processes' sums.
pub(crate) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

pub use highwater_operators::totals::Totals;

/// The workers of a process that have run their dataflows to the end.
///
/// A process's sums are read once all its workers have: a worker's
/// dataflow completes when every worker's operators have dropped their
/// capabilities, but another worker's sink may still write its last rows
/// (a table sink writes its rows at the end) after that, so a sum read as
/// soon as one worker is done can miss them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Finished(Arc<(Mutex<usize>, std::sync::Condvar)>);

impl Finished {
    /// A worker's mark, given when it has run its dataflows (or failed):
    /// [`FinishMark::finish`], or dropped.
    pub(crate) fn mark(&self) -> FinishMark {
        FinishMark { finished: self.clone(), given: false }
    }

    /// Waits until `workers` workers have finished, at most `timeout`;
    /// whether they have.
    pub(crate) fn wait_for(&self, workers: usize, timeout: Duration) -> bool {
        let (count, changed) = &*self.0;
        let count = count.lock().unwrap_or_else(|e| e.into_inner());
        let (count, _) =
            changed.wait_timeout_while(count, timeout, |n| *n < workers).unwrap_or_else(|e| e.into_inner());
        *count >= workers
    }
}

/// One worker's part of [`Finished`]: counted once, when given or dropped.
#[derive(Debug)]
pub(crate) struct FinishMark {
    finished: Finished,
    given: bool,
}

impl FinishMark {
    /// Counts this worker as finished.
    pub(crate) fn finish(&mut self) {
        if !std::mem::replace(&mut self.given, true) {
            let (count, changed) = &*self.finished.0;
            *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            changed.notify_all();
        }
    }
}

impl Drop for FinishMark {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Sums `mine` (a process's sums, given on one worker per process; empty on
/// the others) over every worker of the computation, on every worker: a
/// small dataflow that broadcasts each process's sums. `None` if the other
/// processes did not answer within [`EXCHANGE_TIMEOUT`] (one of them failed).
pub(crate) fn sum_over_job(
    worker: &mut timely::worker::Worker,
    mine: BTreeMap<String, u64>,
) -> Option<BTreeMap<String, u64>> {
    let sums = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let into = Arc::clone(&sums);
    let dataflow = worker.next_dataflow_index();
    let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
        let (input, stream) = scope.new_input::<Vec<(String, u64)>>();
        let (probe, _) = stream
            .broadcast()
            .inspect(move |(name, n)| {
                *into.lock().unwrap_or_else(|e| e.into_inner()).entry(name.clone()).or_insert(0) += n;
            })
            .probe();
        (input, probe)
    });
    for sum in mine {
        input.send(sum);
    }
    input.close();
    if !crate::board::step_until_done(worker, &probe, dataflow, EXCHANGE_TIMEOUT) {
        return None;
    }
    let sums = std::mem::take(&mut *sums.lock().unwrap_or_else(|e| e.into_inner()));
    Some(sums)
}
