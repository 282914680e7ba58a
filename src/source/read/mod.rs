//! The timely operator that reads a [`Source`]: partitions spread over
//! workers, a watermark per partition, dead letters, credit-based flow control.
//!
//! The operator is [`read`]; its concerns live beside it: the options
//! (`options.rs`), one partition's reading, retries and positions
//! (`partition.rs`), credit against the output probe (`credit.rs`), the
//! source's part in checkpoints (`cuts.rs`), the board on which a process's
//! workers post their watermarks (`board.rs`), and its metrics with
//! [`run_until_failed`] (`metrics.rs`).

mod board;
mod credit;
mod cuts;
mod metrics;
mod options;
mod partition;

pub use board::WatermarkBoard;
pub use metrics::{run_until_failed, Failing, JobFailed, SourceMetrics};
pub use options::{RetryPolicy, SourceOptions};

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use highwater_operators::{EventStream, Timestamp, Update, END_OF_TIME};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::{OutputBuilder, OutputBuilderSession};
use timely::dataflow::operators::Capability;
use timely::dataflow::{ProbeHandle, Scope};

use super::{Source, SourceError};
use crate::checkpoint::Checkpoints;
use crate::dead_letter::DeadLetter;
use crate::time::PartitionWatermark;
use board::Posted;
use credit::Credit;
use cuts::SourceCuts;
use partition::Partition;

/// The streams a source produces.
#[derive(Debug)]
pub struct SourceStreams<'scope, T: 'static> {
    /// Decoded records with their event times.
    pub events: EventStream<'scope, T>,
    /// Records that could not be decoded.
    pub dead_letters: EventStream<'scope, DeadLetter>,
}

/// While a checkpoint cut is pending, a source reads past it at most
/// `max_in_flight / AHEAD_OF_CUT` records (they wait at the gates).
const AHEAD_OF_CUT: usize = 4;

/// Reads `source` into the dataflow.
///
/// Partition `i` is read by worker `i % peers`; each worker reads at most
/// [`Source::concurrent_partitions`] of its partitions at a time. A batch of
/// records goes out at the partition's watermark (or the operator's, if
/// higher), so a record whose event time is below that time was late where it
/// was read; lateness is thereby judged per partition, independently of how
/// partitions are spread over workers. The operator's capability follows the
/// minimum watermark of its active partitions and is dropped when all are
/// exhausted, which lets every window fire.
///
/// With a `probe` on the dataflow's outputs, the source pauses while more than
/// `max_in_flight` of its records have not passed the probe, as long as the
/// probe is moving: if it has not moved for 200 ms the source reads on, since
/// the dataflow is then waiting for input (a window that needs more event
/// time) rather than catching up.
///
/// An error is never taken for the end of a partition. One that may go away
/// is retried as [`SourceOptions::retry`] says; any other (or the last retry's)
/// fails the source: it reads no more and holds its watermark where it is, so
/// that nothing downstream is computed as if the input had ended; the job's
/// checkpointing fails at once (no final checkpoint, no sink commit: a
/// recovery resumes from the last good checkpoint); and
/// [`SourceMetrics::has_failed`] turns true, with the error in
/// [`SourceMetrics::errors`]. Run the workers with [`run_until_failed`], which
/// stops them then.
///
/// If the computation was configured with the job's checkpoints
/// ([`Checkpoints::configure`]), the source reports its partitions' offsets
/// and watermarks at every cut, resumes from a restored checkpoint's
/// (overriding `start_offsets`), and holds its capability after its
/// partitions end until every source has ended.
pub fn read<'scope, S, TF>(
    scope: Scope<'scope, Timestamp>,
    source: Arc<S>,
    time_of: TF,
    options: SourceOptions,
    metrics: &SourceMetrics,
    probe: Option<ProbeHandle<Timestamp>>,
) -> Result<SourceStreams<'scope, S::Record>, SourceError>
where
    S: Source,
    TF: Fn(&S::Record) -> Timestamp + 'static,
{
    let (index, peers) = (scope.index(), scope.peers());
    let names = source.partitions()?;
    let checkpoints = Checkpoints::of(&scope);
    let restored = checkpoints.as_ref().and_then(|c| c.restored_partitions(&options.name));
    if let Some(restored) = restored {
        if restored.len() != names.len() {
            return Err(SourceError::Config(format!(
                "source {}: the checkpoint has {} partitions, the source now has {}",
                options.name,
                restored.len(),
                names.len()
            )));
        }
    }
    let restored_time = checkpoints.as_ref().and_then(|c| c.restored_time());
    let mut queue = VecDeque::new();
    for i in (0..names.len()).filter(|i| i % peers == index) {
        let mut watermark = PartitionWatermark::new(options.watermark.clone(), options.idle_timeout);
        let from = match restored.and_then(|r| r.iter().find(|p| p.partition == i)) {
            Some(state) => {
                watermark.restore(state.max_seen, state.floor);
                state.offset
            }
            None => options.start_offsets.iter().find(|(p, _)| *p == i).map(|(_, o)| *o),
        };
        queue.push_back(Partition::new(i, source.open(i, from)?, watermark, from));
    }
    tracing::debug!(source = %options.name, worker = index, partitions = queue.len(), "opened source partitions");
    let cuts = checkpoints.map(|c| SourceCuts::<S::Reader>::new(c, &options.name, index));

    let mut builder = OperatorBuilder::new(options.name.clone(), scope);
    let address = builder.operator_info().address;
    let activator = scope.activator_for(address);
    let (events_out, events) = builder.new_output();
    let (dead_out, dead) = builder.new_output();
    let mut events_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<S::Record>>>>::from(events_out);
    let mut dead_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<DeadLetter>>>>::from(dead_out);
    let mut reading = Reading::<S, TF> {
        concurrent: source.concurrent_partitions().max(1),
        credit: Credit::new(probe, options.max_in_flight),
        options,
        metrics: metrics.clone(),
        time_of,
        index,
        queue,
        open: Vec::new(),
        cuts,
        updates: Vec::new(),
        dead_letters: Vec::new(),
        highest: 0,
    };

    builder.build(move |mut capabilities| {
        let mut dead_cap = capabilities.pop();
        let mut cap = capabilities.pop();
        if let (Some(c), Some(t)) = (cap.as_mut(), restored_time) {
            // A recovered source resumes at the checkpoint's time.
            if t < END_OF_TIME {
                c.downgrade(&t);
                if let Some(d) = dead_cap.as_mut() {
                    d.downgrade(&t);
                }
            }
        }
        move |_frontiers| {
            let (Some(held), Some(held_dead)) = (cap.as_mut(), dead_cap.as_mut()) else { return };
            let now = Instant::now();
            reading.open_partitions(now);
            let any_data =
                reading.read_partitions(held, held_dead, &mut events_out.activate(), &mut dead_out.activate(), now);
            if reading.open.is_empty() && reading.queue.is_empty() {
                match reading.all_ended() {
                    Some(horizon) => {
                        // Held until every source has ended, so that no
                        // operator runs ahead of a cut still to come.
                        if *held.time() < horizon {
                            held.downgrade(&horizon);
                            held_dead.downgrade(&horizon);
                        }
                        activator.activate_after(Duration::from_millis(5));
                    }
                    None => {
                        cap = None;
                        dead_cap = None;
                    }
                }
                return;
            }
            reading.advance(held, held_dead);
            if any_data || reading.open.len() < reading.concurrent && !reading.queue.is_empty() {
                activator.activate();
            } else {
                activator.activate_after(Duration::from_millis(1));
            }
        }
    });

    Ok(SourceStreams { events: EventStream::append_only(events), dead_letters: EventStream::append_only(dead) })
}

/// An output of the source operator during an activation.
type Active<'a, T> = OutputBuilderSession<'a, Timestamp, CapacityContainerBuilder<Vec<Update<T>>>>;

/// One worker's instance of a source operator, between activations.
struct Reading<S: Source, TF> {
    options: SourceOptions,
    metrics: SourceMetrics,
    time_of: TF,
    /// This worker's index.
    index: usize,
    /// Partitions read at a time.
    concurrent: usize,
    /// Partitions not yet opened, and those being read.
    queue: VecDeque<Partition<S::Reader>>,
    open: Vec<Partition<S::Reader>>,
    credit: Credit,
    /// With checkpoints.
    cuts: Option<SourceCuts<S::Reader>>,
    /// Buffers for a read call's records and dead letters.
    updates: Vec<Update<S::Record>>,
    dead_letters: Vec<DeadLetter>,
    /// The highest watermark any partition of this worker has reached.
    highest: Timestamp,
}

impl<S, TF> Reading<S, TF>
where
    S: Source,
    TF: Fn(&S::Record) -> Timestamp + 'static,
{
    /// Opens queued partitions up to the number read at a time.
    fn open_partitions(&mut self, now: Instant) {
        while self.open.len() < self.concurrent {
            let Some(mut partition) = self.queue.pop_front() else { break };
            partition.watermark.touch(now);
            self.open.push(partition);
        }
    }

    /// Reads a batch from every open partition that may be read (credit
    /// left, or behind a pending cut), sends it at the partition's watermark
    /// (or the capability's time `held`, if higher), and puts exhausted
    /// partitions aside. Returns whether any partition gave data.
    fn read_partitions(
        &mut self,
        held: &Capability<Timestamp>,
        held_dead: &Capability<Timestamp>,
        events: &mut Active<'_, S::Record>,
        dead: &mut Active<'_, DeadLetter>,
        now: Instant,
    ) -> bool {
        let may_read = self.credit.may_read(now);
        // A pending cut: partitions behind its time read on even without
        // credit, since the cut completes only once they pass it. What the
        // others read meanwhile waits at the checkpoint gates until the cut
        // completes: a little of it keeps the workers busy while the
        // operators take their snapshots, more would only fill memory.
        let pending = self.cuts.as_ref().and_then(SourceCuts::pending);
        let may_read_ahead = may_read
            && pending
                .is_none_or(|time| self.credit.below_at_or_after(time, self.options.max_in_flight / AHEAD_OF_CUT));
        if !may_read_ahead && pending.is_none_or(|time| time <= *held.time()) {
            return false;
        }
        let mut any_data = false;
        for partition in self.open.iter_mut() {
            if !partition.readable(now) {
                continue;
            }
            let behind = pending.is_some_and(|time| (*held.time()).max(partition.watermark.current()) < time);
            if !behind && !may_read_ahead {
                continue;
            }
            // The batch goes out at the partition's watermark before it.
            let emit_at = (*held.time()).max(partition.watermark.current());
            // With checkpoints: where the partition stood before this batch.
            let before = self.cuts.is_some().then(|| partition.mark(emit_at));
            let batch = partition.read_batch(
                &self.options,
                now,
                emit_at,
                &self.time_of,
                &mut self.updates,
                &mut self.dead_letters,
            );
            if let Some(error) = batch.failure {
                // The job's checkpointing fails before any final checkpoint
                // or sink commit, and the program learns of it through the
                // metrics (see `read`).
                tracing::error!(source = %self.options.name, partition = partition.index, "source failed: {error}");
                if let Some(cuts) = self.cuts.as_ref() {
                    cuts.fail_job(&error);
                }
                self.metrics.fail(error);
            }
            if !self.updates.is_empty() || !self.dead_letters.is_empty() {
                any_data = true;
                partition.got_data(now);
                if let (Some(cuts), Some(before)) = (self.cuts.as_mut(), before) {
                    // The next cut lies above every time emitted at, and the
                    // partition's position before this time is on record.
                    cuts.emitted(partition, before, emit_at);
                }
                let n = self.updates.len();
                if n > 0 {
                    partition.watermark.observe(batch.max_time);
                    self.metrics.records.add(n as u64);
                    self.metrics.late.add(batch.late);
                    self.metrics.max_event_time.fetch_max(batch.max_time, Ordering::Relaxed);
                    let at = held.delayed(&emit_at);
                    events.session(&at).give_container(&mut self.updates);
                    self.updates.clear();
                    self.credit.sent(emit_at, n);
                }
                if !self.dead_letters.is_empty() {
                    self.metrics.dead_letters.add(self.dead_letters.len() as u64);
                    let dead_at = held_dead.delayed(&emit_at);
                    let mut session = dead.session(&dead_at);
                    session.give_iterator(self.dead_letters.drain(..).map(|d| (d, emit_at, 1)));
                }
            }
            partition.settle(batch.status, now);
            if partition.done {
                self.highest = self.highest.max(partition.watermark.current());
            }
        }
        let (done, active): (Vec<_>, Vec<_>) = self.open.drain(..).partition(|p| p.done);
        self.open = active;
        if let Some(cuts) = self.cuts.as_mut() {
            cuts.ended(done);
        }
        any_data
    }

    /// All of this worker's partitions have ended: idle workers may follow as
    /// far as this one got. Returns the time to hold the capability at until
    /// every source has ended (with checkpoints), or `None` if it may go.
    fn all_ended(&mut self) -> Option<Timestamp> {
        self.options.board.post(self.index, Posted::Resting(self.highest));
        self.cuts.as_mut().and_then(SourceCuts::all_ended)
    }

    /// Moves the capability to the least watermark of the active partitions
    /// (or, if all are idle, where the board says), and reports the cuts the
    /// capability has passed.
    fn advance(&mut self, held: &mut Capability<Timestamp>, held_dead: &mut Capability<Timestamp>) {
        for p in self.open.iter() {
            self.highest = self.highest.max(p.watermark.current());
        }
        let local = self.open.iter().filter(|p| !p.idle).map(|p| p.watermark.current()).min();
        self.options.board.post(self.index, local.map_or(Posted::Resting(self.highest), Posted::Active));
        // All partitions idle: they do not hold the watermark back. It follows
        // the workers still reading (or, if none is, the highest any reached);
        // records that come later are judged late against it.
        let watermark = local.or_else(|| {
            // Moving this worker's capability only changes how its own later
            // records are judged: the others keep theirs.
            self.queue.is_empty().then(|| self.highest.max(self.options.board.resting_target()))
        });
        if let Some(w) = watermark.filter(|w| *w > *held.time()) {
            if let Some(cuts) = self.cuts.as_mut() {
                cuts.publish(w);
            }
            held.downgrade(&w);
            held_dead.downgrade(&w);
        }
        if let Some(cuts) = self.cuts.as_mut() {
            cuts.report(Some((*held.time(), (&mut self.open, &mut self.queue))));
        }
    }
}
