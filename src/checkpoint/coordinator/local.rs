//! The transitions this process's own workers and timer drive: a worker
//! built, a source ended, and the coordinator's timer choosing cuts
//! ([`time_loop`]). Alone, the coordinator begins a cut above the latest
//! time published; across processes it asks the others first (`prepare`,
//! in `members.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::operators::checkpoint::Cut;

use super::super::CheckpointError;
use super::members::PREPARE_TIMEOUT;
use super::phase::{unexpected, Job, Phase};
use super::{lock, Inner};

impl Phase {
    /// `worker` has built its dataflow (and `Checkpoints::built` has checked
    /// it): once every worker has, the job runs.
    pub(super) fn worker_built(self, worker: usize, job: &mut Job) -> Result<Phase, CheckpointError> {
        match self {
            Phase::Building { mut built, next_id } => {
                if !built.insert(worker) {
                    let state = format!("worker {worker} had built it already");
                    return Err(unexpected(format!("worker {worker} built its dataflow"), state));
                }
                Phase::Building { built, next_id }.advance(job)
            }
            phase => Err(unexpected(format!("worker {worker} built its dataflow"), &phase)),
        }
    }

    /// A source has read all its partitions (recorded in the registry): once
    /// every source of the process has, it drains.
    pub(super) fn source_finished(self, job: &mut Job) -> Result<Phase, CheckpointError> {
        self.advance(job)
    }

    /// The coordinator's timer, an interval after the last cut: alone,
    /// begins the next cut above every time published; across processes,
    /// asks the others for their times first.
    pub(super) fn next_cut(self, now: Instant, job: &mut Job) -> Result<Phase, CheckpointError> {
        if job.layout.followers() > 0 {
            return self.prepare(now, job);
        }
        let Some(id) = self.cuts().map(|cuts| cuts.next_id) else {
            return Err(unexpected("the timer began a checkpoint", &self));
        };
        let time = job.published.saturating_add(1);
        if !job.worth_a_cut(time) {
            tracing::trace!(id, time, "no checkpoint: nothing published since the last");
            return Ok(self);
        }
        self.announce(Cut { id, time }, job)
    }
}

/// The coordinator's timer: begins a cut every interval once every worker of
/// every process is built and the previous checkpoint is written.
pub(super) fn time_loop(inner: &Inner) {
    let mut last = Instant::now();
    while !inner.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        let mut state = lock(&inner.state);
        if let Some((id, since)) = state.phase.preparing() {
            if since.elapsed() > PREPARE_TIMEOUT {
                inner.fail(&mut state, format!("checkpoint {id}: not every process reported its sources' time"));
            }
            continue;
        }
        if last.elapsed() < inner.config.interval || !state.may_begin() {
            continue;
        }
        last = Instant::now();
        // An error has failed the checkpointing (see `Inner::step`).
        let _ = inner.step(&mut state, |phase, job| phase.next_cut(last, job));
    }
}
