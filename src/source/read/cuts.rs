//! A source's part in the job's checkpoints: the times it publishes (the next
//! cut lies above them), where each partition stood before each new output
//! time, the partitions' states it reports at every cut, and holding its
//! capability after its input ends until every source has ended.

use std::collections::VecDeque;

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::{Timestamp, END_OF_TIME};

use super::partition::{Mark, Partition};
use crate::checkpoint::{Checkpoints, PartitionState};
use crate::source::PartitionReader;

/// The checkpointing of one worker's instance of a source.
pub(super) struct SourceCuts<R> {
    checkpoints: Checkpoints,
    /// The source's name and this worker's index.
    source: String,
    worker: usize,
    /// The last cut reported.
    reported: Option<CheckpointId>,
    /// The highest time published.
    published: Timestamp,
    /// Whether the end of this worker's partitions was reported.
    announced_end: bool,
    /// Exhausted partitions, kept for the cuts that still need their log.
    ended: Vec<Partition<R>>,
}

/// The partitions a worker still reads: open and queued.
pub(super) type Reading<'a, R> = (&'a mut Vec<Partition<R>>, &'a mut VecDeque<Partition<R>>);

impl<R: PartitionReader> SourceCuts<R> {
    /// Registers `source`, read on `worker`, with `checkpoints`.
    pub(super) fn new(checkpoints: Checkpoints, source: &str, worker: usize) -> Self {
        checkpoints.register_source(source, worker);
        SourceCuts {
            checkpoints,
            source: source.to_owned(),
            worker,
            reported: None,
            published: 0,
            announced_end: false,
            ended: Vec::new(),
        }
    }

    /// The time of the pending cut, if one is begun (and it is not the final one).
    pub(super) fn pending(&self) -> Option<Timestamp> {
        self.checkpoints.cut_after(None).map(|cut| cut.time).filter(|time| *time != END_OF_TIME)
    }

    /// The source is about to emit (or hold its capability) at `time`: the
    /// next cut will lie above it.
    pub(super) fn publish(&mut self, time: Timestamp) {
        if time > self.published {
            self.checkpoints.publish(time);
            self.published = time;
        }
    }

    /// `partition` emitted a batch at `emit_at`, having stood at `before`: the
    /// time is published, and the position kept if it is the first batch at
    /// this time.
    pub(super) fn emitted(&mut self, partition: &mut Partition<R>, before: Mark, emit_at: Timestamp) {
        self.publish(emit_at);
        if partition.log.back().is_none_or(|m| m.emit_at < emit_at) {
            partition.log.push_back(before);
        }
    }

    /// Keeps exhausted partitions for the cuts that still need them.
    pub(super) fn ended(&mut self, done: impl IntoIterator<Item = Partition<R>>) {
        self.ended.extend(done);
    }

    /// Whether `worker` has declared its dataflows built.
    pub(super) fn is_built(&self, worker: usize) -> bool {
        self.checkpoints.is_built(worker)
    }

    /// Fails the job's checkpointing: a partition failed for good.
    pub(super) fn fail_job(&self, error: &str) {
        self.checkpoints.fail_job(format!("source {error}"));
    }

    /// All of this worker's partitions have ended: says so (once) and reports
    /// the cuts begun. Returns the time to hold the capability at until every
    /// source has ended (no operator runs ahead of a cut still to come), or
    /// `None` once the final cut is begun (the capability may go).
    pub(super) fn all_ended(&mut self) -> Option<Timestamp> {
        if !std::mem::replace(&mut self.announced_end, true) {
            self.checkpoints.source_finished(&self.source, self.worker);
        }
        let final_begun = self.checkpoints.final_begun();
        self.report(None);
        (!final_begun).then(|| self.checkpoints.horizon())
    }

    /// Reports this worker's partitions for every begun cut its capability
    /// (at `held`, with the partitions still read) has passed, or for every
    /// begun cut if all its partitions have ended (`held` is `None`); then
    /// forgets the positions no later cut can need.
    pub(super) fn report(&mut self, mut held: Option<(Timestamp, Reading<'_, R>)>) {
        while let Some(cut) = self.checkpoints.cut_after(self.reported) {
            if held.as_ref().is_some_and(|(time, _)| *time < cut.time) {
                break;
            }
            let mut partitions: Vec<PartitionState> = self.ended.iter().map(|p| p.at_cut(cut.time)).collect();
            if let Some((_, (open, queue))) = held.as_mut() {
                partitions.extend(open.iter().chain(queue.iter()).map(|p| p.at_cut(cut.time)));
            }
            self.checkpoints.submit_source(&self.source, cut, partitions);
            self.reported = Some(cut.id);
            self.ended.iter_mut().for_each(|p| p.trim(cut.time));
            if let Some((_, (open, queue))) = held.as_mut() {
                open.iter_mut().chain(queue.iter_mut()).for_each(|p| p.trim(cut.time));
            }
        }
        // The commit step of the checkpoints committed since.
        self.checkpoints.acknowledge();
    }
}
