//! The timely operator that reads a [`Source`]: partitions spread over
//! workers, a watermark per partition, dead letters, credit-based flow control.
//!
//! The operator is [`read`]; its concerns live beside it: the options
//! (`options.rs`), one partition's reading, retries and positions
//! (`partition.rs`), credit against the output probe (`credit.rs`),
//! watermark alignment (`align.rs`), the
//! source's part in checkpoints (`cuts.rs`), the board on which a process's
//! workers post their watermarks (`board.rs`), and its metrics with
//! [`run_until_failed`] (`metrics.rs`).

mod align;
mod board;
mod builder;
mod credit;
mod cuts;
mod metrics;
mod options;
mod pace;
mod partition;

pub use align::{Alignment, MaxDrift, Span, DEFAULT_MAX_DRIFT};
pub use board::WatermarkBoard;
pub use builder::FromSource;
pub(crate) use metrics::run_with_board;
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

use super::{Offset, PartitionReader, Source, SourceError};
use crate::checkpoint::Checkpoints;
use crate::dead_letter::DeadLetter;
use crate::time::PartitionWatermark;
use align::Aligner;
use board::Posted;
use credit::Credit;
use cuts::SourceCuts;
use pace::Pacer;
use partition::{Partition, PartitionGauges};

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

/// How many reads a worker spends per activation on starting a waiting
/// partition (one record at a time, until its first record).
const STARTING_READS: usize = 64;

/// Reads `source` into the dataflow.
///
/// Partition `i` is read by worker `i % peers`, [`SourceOptions::batch_size`]
/// records at a time. If the source's partitions take turns (each worker
/// reads at most [`Source::concurrent_partitions`] of its partitions at a
/// time, as for a file's blocks), the worker starts the others at once: it
/// reads every partition one record at a time until its first record (which
/// sets the partition's watermark), then in batches. A batch of records goes
/// out at its partition's watermark before the batch, so a record whose event
/// time is below that time was late where it was read.
/// The operator's capability follows the minimum watermark of the worker's
/// partitions not yet exhausted (those waiting to be read included) and is
/// dropped when all are exhausted, which lets every window fire.
///
/// # Determinism
/// The time every record and dead letter goes out at, and so which records
/// are late here and in every operator downstream, depends only on its
/// partition's records and on `options` (the watermark strategy and the
/// batch size): not on the number of workers or processes, on how the
/// partitions are spread over them, on the order they are read in, or on a
/// recovery onto another layout. A job whose operators are deterministic
/// (all of highwater's, except processing-time triggers) therefore gives the
/// same results, late outputs and dead letters on any layout. Two things
/// depend on timing and are left out of this promise: partitions that go idle
/// ([`SourceOptions::idle_timeout`]; while all of a worker's partitions are
/// idle, its capability follows the other workers, and a partition that wakes
/// up sends at that time), and live sources, whose batches hold what had
/// arrived when they were read.
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
    if let Some(rate) = options.rate_limit.filter(|r| !(*r > 0.0 && r.is_finite())) {
        return Err(SourceError::Config(format!(
            "source {}: rate limit {rate}: give a positive number of records a second",
            options.name
        )));
    }
    let names = source.partitions()?;
    let checkpoints = Checkpoints::of(&scope);
    if let Some(totals) = crate::totals::Totals::of(&scope) {
        totals.count(&format!("{}.records", options.name), &metrics.records);
        totals.count(&format!("{}.dead_letters", options.name), &metrics.dead_letters);
        totals.count(&format!("{}.late_read", options.name), &metrics.late);
        totals.count(&format!("{}.throttled_us", options.name), &metrics.throttled_us);
        totals.count(&format!("{}.aligned_us", options.name), &metrics.aligned_us);
        totals.count(&format!("{}.pauses", options.name), &metrics.pauses);
    }
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
    if checkpoints.is_some() {
        source.acknowledge_on_commit();
    }
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
        let mut partition = Partition::new(i, source.open(i, from)?, watermark, from);
        let counts_bytes = partition.reader.bytes_read().is_some();
        partition.gauges = crate::totals::Totals::of(&scope)
            .map(|totals| PartitionGauges::register(&totals, &options.name, i, counts_bytes));
        queue.push_back(partition);
    }
    tracing::debug!(source = %options.name, worker = index, partitions = queue.len(), "opened source partitions");
    if let Some(c) = checkpoints.as_ref() {
        c.register_source_committer(&options.name, Arc::new(Acknowledging(Arc::clone(&source))));
    }
    let cuts = checkpoints.map(|c| SourceCuts::<S::Reader>::new(c, &options.name, index));
    // Paced: this worker's share of the rate, by its share of the partitions.
    let pacer = options
        .rate_limit
        .filter(|_| !queue.is_empty())
        .map(|rate| Pacer::new(rate * queue.len() as f64 / names.len() as f64, options.batch_size));

    let mut builder = OperatorBuilder::new(options.name.clone(), scope);
    let address = builder.operator_info().address;
    let activator = scope.activator_for(address);
    let (events_out, events) = builder.new_output();
    let (dead_out, dead) = builder.new_output();
    let mut events_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<S::Record>>>>::from(events_out);
    let mut dead_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<DeadLetter>>>>::from(dead_out);
    let aligner = Aligner::new(
        align::Alignment::of(&scope),
        options.alignment_group.as_deref(),
        options.max_drift,
        metrics.aligned_us.clone(),
    );
    let mut reading = Reading::<S, TF> {
        concurrent: source.concurrent_partitions().max(1),
        aligner,
        limit: None,
        credit: Credit::new(
            probe,
            options.max_in_flight,
            highwater_operators::flow::InFlight::of(&scope),
            metrics.throttled_us.clone(),
        ),
        options,
        metrics: metrics.clone(),
        time_of,
        index,
        queue,
        open: Vec::new(),
        cuts,
        failures: crate::failures::Failures::of(&scope),
        checked_built: false,
        updates: Vec::new(),
        dead_letters: Vec::new(),
        highest: 0,
        pacer,
        due: usize::MAX,
        latency: crate::latency::Latency::of(&scope),
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
            reading.check_built();
            reading.align(now);
            reading.open_partitions(now);
            let any_data =
                reading.read_partitions(held, held_dead, &mut events_out.activate(), &mut dead_out.activate(), now);
            if reading.open.is_empty() && reading.queue.is_empty() {
                // No longer holds the others back (posted before its last
                // partition ended, the span would stay for good).
                reading.align(now);
                match reading.all_ended() {
                    Some(horizon) => {
                        // Held until every source has ended, so that no
                        // operator runs ahead of a cut still to come.
                        if *held.time() < horizon {
                            held.downgrade(&horizon);
                            held_dead.downgrade(&horizon);
                            if let Some(latency) = reading.latency.as_ref() {
                                latency.watermark(reading.index, horizon);
                            }
                        }
                        activator.activate_after(Duration::from_millis(5));
                    }
                    None => {
                        if let Some(latency) = reading.latency.as_ref() {
                            latency.watermark(reading.index, END_OF_TIME);
                        }
                        cap = None;
                        dead_cap = None;
                    }
                }
                return;
            }
            reading.advance(held, held_dead);
            // Paced and read up to the pace: back when the next record is due.
            let paced = reading.pacer.as_ref().map(|p| p.wait(Instant::now())).filter(|w| !w.is_zero());
            if let Some(wait) = paced {
                activator.activate_after(wait.min(Duration::from_millis(1)));
            } else if any_data || reading.open.len() < reading.concurrent && !reading.queue.is_empty() {
                activator.activate();
            } else {
                activator.activate_after(Duration::from_millis(1));
            }
        }
    });

    Ok(SourceStreams { events: EventStream::append_only(events), dead_letters: EventStream::append_only(dead) })
}

/// The time `partition`'s next batch goes out at: its watermark, which the
/// capability (`held`) does not pass while the partition is read, except when
/// every partition of the worker was idle and the capability followed the
/// other workers (a partition that wakes up then sends at the capability).
fn emit_time<R>(held: &Capability<Timestamp>, partition: &Partition<R>) -> Timestamp {
    (*held.time()).max(partition.watermark.current())
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
    /// Watermark alignment, and the watermark above which a partition waits
    /// in this activation (`None`: none waits).
    aligner: Aligner,
    limit: Option<Timestamp>,
    /// With checkpoints.
    cuts: Option<SourceCuts<S::Reader>>,
    /// The failures of the job, if it runs as a [`crate::Job`].
    failures: Option<crate::failures::Failures>,
    /// Whether the first activation checked that the worker's dataflows were
    /// declared built.
    checked_built: bool,
    /// Buffers for a read call's records and dead letters.
    updates: Vec<Update<S::Record>>,
    dead_letters: Vec<DeadLetter>,
    /// The highest watermark any partition of this worker has reached.
    highest: Timestamp,
    /// With a rate limit: the worker's pace, and the records due in this
    /// activation (unlimited without one).
    pacer: Option<Pacer>,
    due: usize,
    /// The job's latency measurement, if it measures: this worker's reads
    /// and watermarks go on its clock.
    latency: Option<crate::latency::Latency>,
}

impl<S, TF> Reading<S, TF>
where
    S: Source,
    TF: Fn(&S::Record) -> Timestamp + 'static,
{
    /// Fails the source and the job: its checkpointing, its [`crate::Job`]
    /// and its metrics learn of `error`.
    fn fail(&mut self, error: String) {
        if let Some(cuts) = self.cuts.as_ref() {
            cuts.fail_job(&error);
        }
        if let Some(failures) = self.failures.as_ref() {
            failures.report(format!("source {error}"));
        }
        self.metrics.fail(error);
    }

    /// At the first activation of a checkpointed source: the worker runs its
    /// dataflows, so they must have been declared built. If not, checkpoints
    /// would never begin, and the job would wait for its final one forever:
    /// it fails instead, saying what to call.
    fn check_built(&mut self) {
        if std::mem::replace(&mut self.checked_built, true) {
            return;
        }
        if self.cuts.as_ref().is_some_and(|cuts| !cuts.is_built(self.index)) {
            let error = format!(
                "{}: worker {} runs its dataflows, but Checkpoints::built was not called for it: call it once \
                 the worker's dataflows are built, before they run (or run the job with highwater::Job)",
                self.options.name, self.index
            );
            crate::failures::report_misuse(&error);
            self.fail(error);
        }
    }

    /// Posts where this worker's active partitions stand for watermark
    /// alignment, and learns the watermark above which a partition waits.
    fn align(&mut self, now: Instant) {
        if !self.aligner.enabled() {
            return;
        }
        let span = self
            .open
            .iter()
            .chain(self.queue.iter())
            .filter(|p| !p.idle)
            .map(|p| p.watermark.current())
            .fold(None, |span: Option<align::Span>, w| Some(span.map_or((w, w), |(lo, hi)| (lo.min(w), hi.max(w)))));
        let board = &self.options.board;
        self.limit = self.aligner.limit(&self.options.name, self.index, span, || board.active_min());
        // Time paused for alignment does not count towards idleness: a
        // partition held back is not one without records.
        let mut paused = false;
        for p in self.open.iter_mut().filter(|p| p.started() && !p.done) {
            if self.limit.is_some_and(|limit| p.watermark.current() > limit) {
                p.watermark.touch(now);
                paused = true;
            }
        }
        self.aligner.paused(paused, now);
    }

    /// Whether `partition` waits for the others to catch up (alignment).
    fn ahead(&self, partition: &Partition<S::Reader>) -> bool {
        self.limit.is_some_and(|limit| partition.started() && partition.watermark.current() > limit)
    }

    /// Opens queued partitions up to the number read at a time. Of
    /// partitions that take turns, one that waits for alignment gives its
    /// turn to a waiting one that may read (else a worker whose open
    /// partition ran ahead could wait for good on one of its own queued
    /// partitions, the one at the minimum).
    fn open_partitions(&mut self, now: Instant) {
        while self.open.len() < self.concurrent {
            let Some(mut partition) = self.queue.pop_front() else { break };
            partition.watermark.touch(now);
            self.open.push(partition);
        }
        if self.concurrent == usize::MAX || self.limit.is_none() {
            return;
        }
        while let Some(i) = self.open.iter().position(|p| self.ahead(p)) {
            let Some(j) = self.queue.iter().position(|q| !q.done && !self.ahead(q)) else { break };
            let Some(mut turn) = self.queue.remove(j) else { break };
            let mut waits = self.open.swap_remove(i);
            waits.reader.set_aside();
            turn.watermark.touch(now);
            self.open.push(turn);
            self.queue.push_front(waits);
        }
    }

    /// Reads a batch from every partition that may be read now, sends it at
    /// the partition's own watermark, and puts exhausted partitions aside.
    /// Returns whether any partition gave data.
    ///
    /// An open partition reads while there is credit, or while it is behind a
    /// pending cut. A queued one (not yet open: the worker reads
    /// [`Source::concurrent_partitions`] at a time) reads only until it has
    /// seen its first record, or while it is behind a pending cut: the
    /// capability stays at or below every unfinished partition's watermark
    /// ([`advance`](Self::advance)), queued ones included, so that each
    /// batch can go out at its own partition's watermark, whichever worker
    /// reads it and whenever; starting every partition at once keeps a block
    /// not yet started from holding the watermark at its beginning.
    fn read_partitions(
        &mut self,
        held: &Capability<Timestamp>,
        held_dead: &Capability<Timestamp>,
        events: &mut Active<'_, S::Record>,
        dead: &mut Active<'_, DeadLetter>,
        now: Instant,
    ) -> bool {
        let may_read = self.credit.may_read(now);
        self.due = self.pacer.as_mut().map_or(usize::MAX, |p| p.due(now));
        // A pending cut: partitions behind its time read on even without
        // credit, since the cut completes only once they pass it. What the
        // others read meanwhile waits at the checkpoint gates until the cut
        // completes: a little of it keeps the workers busy while the
        // operators take their snapshots, more would only fill memory.
        let pending = self.cuts.as_ref().and_then(SourceCuts::pending);
        let may_read_ahead = may_read
            && pending
                .is_none_or(|time| self.credit.below_at_or_after(time, self.options.max_in_flight / AHEAD_OF_CUT));
        // A partition that cannot be resumed from (inside a snapshot) cannot
        // pass the cut by reading on: it reads with credit only.
        let behind =
            |p: &Partition<S::Reader>| p.reader.resumable() && pending.is_some_and(|time| emit_time(held, p) < time);
        let mut any_data = false;
        let interval = self.options.watermark_interval;
        self.open.iter_mut().chain(self.queue.iter_mut()).for_each(|p| p.publish(now, interval));
        let mut queue = std::mem::take(&mut self.queue);
        for partition in queue.iter_mut() {
            let mut reads = 0;
            while reads < STARTING_READS && partition.readable(now) && !partition.started() {
                any_data |= self.read_batch(partition, held, held_dead, events, dead, now);
                reads += 1;
            }
            if reads == 0 && partition.readable(now) && !partition.done && behind(partition) {
                any_data |= self.read_batch(partition, held, held_dead, events, dead, now);
                reads += 1;
            }
            if reads > 0 {
                partition.reader.set_aside();
            }
        }
        let mut open = std::mem::take(&mut self.open);
        let may_read_any = may_read_ahead || pending.is_some_and(|time| time > *held.time());
        for partition in open.iter_mut() {
            // Behind a pending cut, a partition reads even if it is ahead
            // of the others: the cut completes only once it passes.
            let aligned = !self.ahead(partition) || behind(partition);
            if may_read_any && partition.readable(now) && (may_read_ahead && aligned || behind(partition)) {
                any_data |= self.read_batch(partition, held, held_dead, events, dead, now);
            } else if partition.readable(now) && partition.withheld(now) {
                // Held back for a while: the reader stops fetching.
                self.metrics.pauses.add(1);
                tracing::debug!(source = %self.options.name, partition = partition.index, "partition paused");
            }
        }
        let (done, active): (Vec<_>, Vec<_>) = open.into_iter().partition(|p| p.done);
        let (done_queued, queued): (VecDeque<_>, VecDeque<_>) = queue.into_iter().partition(|p| p.done);
        (self.open, self.queue) = (active, queued);
        if let Some(cuts) = self.cuts.as_mut() {
            cuts.ended(done.into_iter().chain(done_queued));
        }
        any_data
    }

    /// Reads one batch of `partition` and sends it at the partition's
    /// watermark before it; returns whether it gave data.
    fn read_batch(
        &mut self,
        partition: &mut Partition<S::Reader>,
        held: &Capability<Timestamp>,
        held_dead: &Capability<Timestamp>,
        events: &mut Active<'_, S::Record>,
        dead: &mut Active<'_, DeadLetter>,
        now: Instant,
    ) -> bool {
        if self.due == 0 {
            return false; // paced: nothing more is due in this activation
        }
        let emit_at = emit_time(held, partition);
        // With checkpoints: where the partition stood before this batch.
        let before = self.cuts.is_some().then(|| partition.mark(emit_at));
        let batch = partition.read_batch(
            &self.options,
            now,
            emit_at,
            self.concurrent < usize::MAX,
            self.due,
            &self.time_of,
            &mut self.updates,
            &mut self.dead_letters,
        );
        if let Some(error) = batch.failure {
            // The job's checkpointing fails before any final checkpoint or
            // sink commit, and the program learns of it through the metrics
            // (see `read`).
            tracing::error!(source = %self.options.name, partition = partition.index, "source failed: {error}");
            self.fail(error);
        }
        let any_data = !self.updates.is_empty() || !self.dead_letters.is_empty();
        let read_now = self.updates.len() as u64;
        if let Some(pacer) = self.pacer.as_mut() {
            let n = self.updates.len() + self.dead_letters.len();
            pacer.took(n);
            self.due -= n.min(self.due);
        }
        if any_data {
            partition.got_data(now);
            if let (Some(cuts), Some(before)) = (self.cuts.as_mut(), before) {
                // The next cut lies above every time emitted at, and the
                // partition's position before this time is on record.
                cuts.emitted(partition, before, emit_at);
            }
            let n = self.updates.len();
            if n > 0 {
                partition.observe(batch.max_time, now, self.options.watermark_interval);
                self.metrics.records.add(n as u64);
                self.metrics.late.add(batch.late);
                self.metrics.max_event_time.fetch_max(batch.max_time, Ordering::Relaxed);
                let at = held.delayed(&emit_at);
                if let Some(latency) = self.latency.as_ref() {
                    latency.read(self.index, self.updates.iter().map(|u| u.1));
                }
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
        if let Some(gauges) = &partition.gauges {
            gauges.watermark.set(partition.watermark.current());
            gauges.offset.set(partition.reader.offset());
            gauges.records.add(read_now);
            if let (Some(bytes), Some(read)) = (&gauges.bytes, partition.reader.bytes_read()) {
                bytes.set(read);
            }
        }
        if partition.done {
            self.highest = self.highest.max(partition.watermark.current());
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
        for p in self.open.iter().chain(self.queue.iter()) {
            self.highest = self.highest.max(p.watermark.current());
        }
        // Queued partitions hold it too: their batches go out at their own
        // watermarks once they are read.
        let local = self.open.iter().chain(self.queue.iter()).filter(|p| !p.idle).map(|p| p.watermark.current()).min();
        self.options.board.post(self.index, local.map_or(Posted::Resting(self.highest), Posted::Active));
        // All partitions idle: they do not hold the watermark back. It follows
        // the workers still reading (or, if none is, the highest any reached);
        // records that come later are judged late against it.
        let mut quiet = false;
        let watermark = local.or_else(|| {
            // Moving this worker's capability only changes how its own later
            // records are judged: the others keep theirs.
            if !self.queue.is_empty() {
                return None;
            }
            let mut w = self.highest.max(self.options.board.resting_target());
            if self.options.board.active_min().is_none() {
                match self.aligner.combined() {
                    // No worker of this process reads the source, other
                    // sources of its group (or other processes) do: an idle
                    // source does not hold the job back (DESIGN, "Time").
                    Some(Some(combined)) => w = w.max(combined),
                    // Nothing is read anywhere (as far as this process
                    // knows): the pending cut may pass, so that what was sent
                    // before the input went quiet is checkpointed (and an
                    // exactly-once sink's output committed) without waiting
                    // for more input. Not published: the coordinator begins
                    // no further cut until a source sends again.
                    _ => {
                        if let Some(cut) = self.cuts.as_ref().and_then(SourceCuts::pending).filter(|cut| *cut > w) {
                            w = cut;
                            quiet = true;
                        }
                    }
                }
            }
            Some(w)
        });
        if let Some(w) = watermark.filter(|w| *w > *held.time()) {
            if let Some(cuts) = self.cuts.as_mut().filter(|_| !quiet) {
                cuts.publish(w);
            }
            held.downgrade(&w);
            held_dead.downgrade(&w);
            if let Some(latency) = self.latency.as_ref() {
                latency.watermark(self.index, w);
            }
        }
        if let Some(cuts) = self.cuts.as_mut() {
            cuts.report(Some((*held.time(), (&mut self.open, &mut self.queue))));
        }
    }
}

/// A source's commit step, as the checkpoints call it.
struct Acknowledging<S>(Arc<S>);

impl<S> std::fmt::Debug for Acknowledging<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Acknowledging<{}>", std::any::type_name::<S>())
    }
}

impl<S: Source> crate::checkpoint::SourceCommitter for Acknowledging<S> {
    fn commit(
        &self,
        _id: highwater_operators::checkpoint::CheckpointId,
        partitions: &[crate::checkpoint::PartitionState],
    ) -> Result<(), String> {
        let offsets: Vec<(usize, Offset)> = partitions.iter().filter_map(|p| Some((p.partition, p.offset?))).collect();
        if offsets.is_empty() {
            return Ok(());
        }
        self.0.acknowledge(&offsets).map_err(|e| e.to_string())
    }
}
