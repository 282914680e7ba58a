//! The timely operator that reads a [`Source`]: partitions spread over
//! workers, a watermark per partition, dead letters, credit-based flow control.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::{Counter, EventStream, Timestamp, Update, END_OF_TIME};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::dataflow::{ProbeHandle, Scope};

use super::{Offset, PartitionReader, ReadStatus, Source, SourceError};
use crate::checkpoint::{Checkpoints, PartitionState};
use crate::dead_letter::DeadLetter;
use crate::time::{PartitionWatermark, WatermarkStrategy};

/// How a source is read.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Operator name, also used in logs.
    pub name: String,
    /// Per-partition watermark strategy.
    pub watermark: WatermarkStrategy,
    /// A partition with no records for this long stops holding the watermark.
    pub idle_timeout: Option<Duration>,
    /// Records per read call; the partition's watermark advances between calls.
    pub batch_size: usize,
    /// Records read but not yet past the probe (the sinks' frontier) above which
    /// the source pauses; see [`read`].
    pub max_in_flight: usize,
    /// Offsets to start partitions from (by partition index), e.g. on recovery.
    pub start_offsets: Vec<(usize, Offset)>,
    /// Where the workers of a process post their watermarks, so that a worker
    /// whose partitions are all idle follows the others instead of holding the
    /// watermark back. Shared by cloning: make the options once, outside
    /// `timely::execute`. Across processes nothing is shared: a process whose
    /// partitions are all idle holds the watermark at the highest it reached
    /// until they resume or end.
    pub board: WatermarkBoard,
    /// How errors that may go away (timeouts, interruptions) are retried
    /// before the source fails.
    pub retry: RetryPolicy,
}

/// How a source retries a partition's read after an error that may go away
/// ([`SourceError::is_retryable`](crate::source::SourceError::is_retryable)):
/// after `initial_backoff`, then twice as long each time up to `max_backoff`,
/// at most `attempts` times in a row; then the source fails, as on any other
/// error.
///
/// ```
/// use std::time::Duration;
/// let retry = highwater::source::RetryPolicy::default();
/// assert_eq!(retry.backoff(1), Duration::from_millis(100));
/// assert_eq!(retry.backoff(3), Duration::from_millis(400));
/// assert_eq!(retry.backoff(30), Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries in a row before the source fails.
    pub attempts: u32,
    /// The wait before the first retry.
    pub initial_backoff: Duration,
    /// The longest wait between two retries.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 retries, from 100 ms up to 10 s apart (about 40 s in all).
    fn default() -> Self {
        RetryPolicy { attempts: 10, initial_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self.initial_backoff.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        doubled.min(self.max_backoff)
    }
}

/// The watermarks of the workers of one process reading one source.
#[derive(Clone, Debug, Default)]
pub struct WatermarkBoard(Arc<Mutex<Vec<Posted>>>);

/// What a worker posts on the board.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Posted {
    /// Nothing yet.
    #[default]
    Unknown,
    /// Reading active partitions, at this watermark.
    Active(Timestamp),
    /// All partitions idle, or all done; the highest watermark they reached.
    Resting(Timestamp),
}

impl WatermarkBoard {
    fn post(&self, index: usize, posted: Posted) {
        if let Ok(mut board) = self.0.lock() {
            if board.len() <= index {
                board.resize(index + 1, Posted::Unknown);
            }
            board[index] = posted;
        }
    }

    /// Where a worker whose partitions all rest may take its watermark: the
    /// least watermark of the workers still reading, or if none is, the
    /// highest any worker reached. Workers that have not posted (starting, or
    /// in another process) are not counted.
    fn resting_target(&self) -> Timestamp {
        let Ok(board) = self.0.lock() else { return 0 };
        let mut active = None::<Timestamp>;
        let mut highest = 0;
        for posted in board.iter() {
            match *posted {
                Posted::Unknown => {}
                Posted::Active(w) => active = Some(active.map_or(w, |a| a.min(w))),
                Posted::Resting(w) => highest = highest.max(w),
            }
        }
        active.unwrap_or(highest)
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            name: "Source".to_owned(),
            watermark: WatermarkStrategy::default(),
            idle_timeout: Some(Duration::from_secs(5)),
            batch_size: 4096,
            max_in_flight: 100_000,
            start_offsets: Vec::new(),
            board: WatermarkBoard::default(),
            retry: RetryPolicy::default(),
        }
    }
}

/// Counters of a source, shared by all workers of the process.
#[derive(Clone, Debug, Default)]
pub struct SourceMetrics {
    /// Records read and decoded.
    pub records: Counter,
    /// Records that failed to decode.
    pub dead_letters: Counter,
    /// Records that were late when read (below their partition's watermark).
    pub late: Counter,
    /// The greatest event time read so far.
    pub max_event_time: Arc<AtomicU64>,
    /// Errors a partition failed with (the source then holds its watermark
    /// and reads no more: see [`read`]).
    pub errors: Arc<Mutex<Vec<String>>>,
    /// Whether a partition has failed for good.
    pub failed: Arc<std::sync::atomic::AtomicBool>,
}

impl SourceMetrics {
    /// Errors recorded so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether a partition has failed for good (see [`read`]).
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records that a partition failed for good with `error`.
    fn fail(&self, error: String) {
        if let Ok(mut errors) = self.errors.lock() {
            errors.push(error);
        }
        self.failed.store(true, Ordering::Release);
    }
}

/// The streams a source produces.
#[derive(Debug)]
pub struct SourceStreams<'scope, T: 'static> {
    /// Decoded records with their event times.
    pub events: EventStream<'scope, T>,
    /// Records that could not be decoded.
    pub dead_letters: EventStream<'scope, DeadLetter>,
}

struct Partition<R> {
    index: usize,
    reader: R,
    watermark: PartitionWatermark,
    idle: bool,
    /// The offset it was opened at.
    from: Option<Offset>,
    /// Whether it has returned records since.
    read_any: bool,
    /// With checkpoints: where the partition stood before the first batch it
    /// emitted at each new output time, since the last cut.
    log: VecDeque<Mark>,
    done: bool,
    /// Failed for good: read no more, and hold the watermark where it is.
    failed: bool,
    /// Retryable errors in a row, and when to try again.
    retries: u32,
    retry_at: Option<Instant>,
}

/// A partition's position and watermark before a batch emitted at `emit_at`.
#[derive(Clone, Copy, Debug)]
struct Mark {
    emit_at: Timestamp,
    offset: Option<Offset>,
    max_seen: Option<Timestamp>,
    floor: Timestamp,
}

impl<R: PartitionReader> Partition<R> {
    /// Where the partition stands now.
    fn mark(&self, emit_at: Timestamp) -> Mark {
        Mark {
            emit_at,
            offset: if self.read_any { Some(self.reader.offset()) } else { self.from },
            max_seen: self.watermark.max_seen(),
            floor: self.watermark.floor(),
        }
    }

    /// The partition at the cut at `time`: as it stood before its first batch
    /// emitted at or after `time`, or as it stands now if there was none.
    fn at_cut(&self, time: Timestamp) -> PartitionState {
        let (mark, done) = match self.log.iter().find(|m| m.emit_at >= time) {
            Some(m) => (*m, false),
            None => (self.mark(time), self.done),
        };
        PartitionState { partition: self.index, offset: mark.offset, max_seen: mark.max_seen, floor: mark.floor, done }
    }
}

/// A source still reading: its capability's time, its open and queued partitions.
type Reading<'a, R> = (Timestamp, &'a mut Vec<Partition<R>>, &'a mut VecDeque<Partition<R>>);

/// Reports this worker's partitions for every begun cut its capability has
/// passed (`held`: the capability's time and the partitions still read), or
/// for every begun cut if all its partitions have ended (`held` is `None`);
/// then forgets the positions no later cut can need.
fn report_cuts<R: PartitionReader>(
    checkpoints: &Checkpoints,
    source: &str,
    reported: &mut Option<CheckpointId>,
    ended: &mut [Partition<R>],
    mut held: Option<Reading<'_, R>>,
) {
    while let Some(cut) = checkpoints.cut_after(*reported) {
        if held.as_ref().is_some_and(|(time, _, _)| *time < cut.time) {
            break;
        }
        let mut partitions: Vec<PartitionState> = ended.iter().map(|p| p.at_cut(cut.time)).collect();
        if let Some((_, open, queue)) = held.as_mut() {
            partitions.extend(open.iter().chain(queue.iter()).map(|p| p.at_cut(cut.time)));
        }
        checkpoints.submit_source(source, cut, partitions);
        *reported = Some(cut.id);
        let trim = |p: &mut Partition<R>| {
            while p.log.front().is_some_and(|m| m.emit_at < cut.time) {
                p.log.pop_front();
            }
        };
        ended.iter_mut().for_each(trim);
        if let Some((_, open, queue)) = held.as_mut() {
            open.iter_mut().chain(queue.iter_mut()).for_each(trim);
        }
    }
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
    if let Some(c) = checkpoints.as_ref() {
        c.register_source(&options.name, index);
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
        let reader = source.open(i, from)?;
        queue.push_back(Partition {
            index: i,
            reader,
            watermark,
            idle: false,
            from,
            read_any: false,
            log: VecDeque::new(),
            done: false,
            failed: false,
            retries: 0,
            retry_at: None,
        });
    }
    tracing::debug!(source = %options.name, worker = index, partitions = queue.len(), "opened source partitions");

    let mut builder = OperatorBuilder::new(options.name.clone(), scope);
    let address = builder.operator_info().address;
    let activator = scope.activator_for(address);
    let (events_out, events) = builder.new_output();
    let (dead_out, dead) = builder.new_output();
    let mut events_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<S::Record>>>>::from(events_out);
    let mut dead_out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<DeadLetter>>>>::from(dead_out);
    let metrics = metrics.clone();
    let concurrent = source.concurrent_partitions().max(1);

    builder.build(move |mut capabilities| {
        let mut dead_cap = capabilities.pop();
        let mut cap = capabilities.pop();
        let mut open: Vec<Partition<S::Reader>> = Vec::new();
        // Exhausted partitions, kept for the cuts that still need their log.
        let mut ended: Vec<Partition<S::Reader>> = Vec::new();
        // Checkpoints: the last cut reported, the highest time published, whether the end was reported.
        let mut reported: Option<CheckpointId> = None;
        let mut published: Timestamp = 0;
        let mut announced_end = false;
        if let (Some(c), Some(t)) = (cap.as_mut(), restored_time) {
            // A recovered source resumes at the checkpoint's time.
            if t < END_OF_TIME {
                c.downgrade(&t);
                if let Some(d) = dead_cap.as_mut() {
                    d.downgrade(&t);
                }
            }
        }
        let mut updates: Vec<Update<S::Record>> = Vec::new();
        let mut dead_letters = Vec::new();
        // Records read, by the time they went out at (partitions' times interleave).
        let mut in_flight: BTreeMap<Timestamp, usize> = BTreeMap::new();
        let mut outstanding = 0usize;
        let mut paused_since: Option<(Instant, Option<Timestamp>)> = None;
        // The highest watermark any partition of this worker has reached.
        let mut highest: Timestamp = 0;

        move |_frontiers| {
            let Some(held) = cap.as_mut() else { return };
            let now = Instant::now();
            while open.len() < concurrent {
                let Some(mut partition) = queue.pop_front() else { break };
                partition.watermark.touch(now);
                open.push(partition);
            }

            // Credit: records not yet past the probe.
            let mut may_read = true;
            if let Some(probe) = probe.as_ref() {
                let frontier = probe.with_frontier(|f| f.as_option().copied());
                while let Some(entry) = in_flight.first_entry() {
                    if frontier.is_some_and(|f| f <= *entry.key()) {
                        break;
                    }
                    outstanding -= entry.remove();
                }
                if outstanding >= options.max_in_flight {
                    match paused_since {
                        Some((since, seen)) if seen == frontier => {
                            may_read = now.duration_since(since) > Duration::from_millis(200);
                        }
                        _ => {
                            paused_since = Some((now, frontier));
                            may_read = false;
                        }
                    }
                } else {
                    paused_since = None;
                }
            }

            // A pending cut: partitions behind its time read on even without
            // credit, since the cut completes only once they pass it. What the
            // others read meanwhile waits at the checkpoint gates until the cut
            // completes: a little of it keeps the workers busy while the
            // operators take their snapshots, more would only fill memory.
            let pending = checkpoints
                .as_ref()
                .and_then(|c| c.cut_after(None))
                .map(|cut| cut.time)
                .filter(|time| *time != END_OF_TIME);
            let may_read_ahead = may_read
                && pending.is_none_or(|time| {
                    in_flight.range(time..).map(|(_, n)| *n).sum::<usize>() < options.max_in_flight / AHEAD_OF_CUT
                });
            let mut any_data = false;
            if may_read_ahead || pending.is_some_and(|time| time > *held.time()) {
                let mut events = events_out.activate();
                let mut dead = dead_out.activate();
                for partition in open.iter_mut() {
                    if partition.failed || partition.retry_at.is_some_and(|at| at > now) {
                        continue;
                    }
                    let behind = pending.is_some_and(|time| (*held.time()).max(partition.watermark.current()) < time);
                    if !behind && !may_read_ahead {
                        continue;
                    }
                    // The batch goes out at the partition's watermark before it.
                    let emit_at = (*held.time()).max(partition.watermark.current());
                    // With checkpoints: where the partition stood before this batch.
                    let before = checkpoints.is_some().then(|| partition.mark(emit_at));
                    let (mut max_time, mut late) = (0, 0);
                    let mut take = |record: S::Record| {
                        let time = time_of(&record);
                        max_time = max_time.max(time);
                        late += u64::from(time < emit_at);
                        updates.push((record, time, 1));
                    };
                    let status = match partition.reader.read(options.batch_size, &mut take, &mut dead_letters) {
                        Ok(status) => {
                            partition.retries = 0;
                            partition.retry_at = None;
                            status
                        }
                        Err(e) if e.is_retryable() && partition.retries < options.retry.attempts => {
                            partition.retries += 1;
                            let wait = options.retry.backoff(partition.retries);
                            tracing::warn!(source = %options.name, partition = partition.index, attempt = partition.retries, ?wait, "retrying after: {e}");
                            partition.retry_at = Some(now + wait);
                            ReadStatus::Idle
                        }
                        Err(e) => {
                            // An error is never the end of the input: the partition
                            // holds its watermark (nothing downstream is computed as
                            // if it had ended), the job's checkpointing fails before
                            // any final checkpoint or sink commit, and the program
                            // learns of it through the metrics (see `read`).
                            let retried = if partition.retries > 0 {
                                format!(" (after {} retries)", partition.retries)
                            } else {
                                String::new()
                            };
                            let error = format!("{}: partition {}: {e}{retried}", options.name, partition.index);
                            tracing::error!(source = %options.name, partition = partition.index, "source failed: {error}");
                            if let Some(c) = checkpoints.as_ref() {
                                c.fail_job(format!("source {error}"));
                            }
                            metrics.fail(error);
                            partition.failed = true;
                            ReadStatus::Idle
                        }
                    };
                    if !updates.is_empty() || !dead_letters.is_empty() {
                        any_data = true;
                        partition.watermark.touch(now);
                        partition.idle = false;
                        let n = updates.len();
                        if let Some(c) = checkpoints.as_ref() {
                            // The next cut lies above every time emitted at, and the
                            // partition's position before this time is on record.
                            if emit_at > published {
                                c.publish(emit_at);
                                published = emit_at;
                            }
                            if let Some(before) =
                                before.filter(|_| partition.log.back().is_none_or(|m| m.emit_at < emit_at))
                            {
                                partition.log.push_back(before);
                            }
                        }
                        partition.read_any = true;
                        if n > 0 {
                            partition.watermark.observe(max_time);
                            metrics.records.add(n as u64);
                            metrics.late.add(late);
                            metrics.max_event_time.fetch_max(max_time, Ordering::Relaxed);
                            let at = held.delayed(&emit_at);
                            events.session(&at).give_container(&mut updates);
                            updates.clear();
                            if probe.is_some() {
                                *in_flight.entry(emit_at).or_insert(0) += n;
                                outstanding += n;
                            }
                        }
                        if !dead_letters.is_empty() {
                            metrics.dead_letters.add(dead_letters.len() as u64);
                            let dead_at = dead_cap.as_ref().expect("held with the events capability").delayed(&emit_at);
                            let mut session = dead.session(&dead_at);
                            session.give_iterator(dead_letters.drain(..).map(|d| (d, emit_at, 1)));
                        }
                    }
                    if let Some(bound) = partition.reader.watermark_hint() {
                        if bound > partition.watermark.current() {
                            partition.watermark.advance_to(bound);
                            partition.watermark.touch(now);
                            partition.idle = false;
                        }
                    }
                    if status == ReadStatus::End {
                        highest = highest.max(partition.watermark.current());
                        partition.idle = true;
                        partition.done = true;
                    } else if partition.failed {
                        partition.idle = false;
                    } else if status == ReadStatus::Idle && partition.watermark.is_idle(now) {
                        partition.idle = true;
                    }
                }
                let (done, active): (Vec<_>, Vec<_>) = open.drain(..).partition(|p| p.done);
                open = active;
                if checkpoints.is_some() {
                    ended.extend(done);
                }
            }

            if open.is_empty() && queue.is_empty() {
                // Done: idle workers may follow as far as this one got.
                options.board.post(index, Posted::Resting(highest));
                if let Some(c) = checkpoints.as_ref() {
                    // Held until every source has ended, so that no operator
                    // runs ahead of a cut still to come.
                    if !std::mem::replace(&mut announced_end, true) {
                        c.source_finished(&options.name, index);
                    }
                    let final_begun = c.final_begun();
                    report_cuts(c, &options.name, &mut reported, &mut ended, None);
                    if !final_begun {
                        let horizon = c.horizon();
                        if let Some(held) = cap.as_mut().filter(|h| *h.time() < horizon) {
                            held.downgrade(&horizon);
                            if let Some(d) = dead_cap.as_mut() {
                                d.downgrade(&horizon);
                            }
                        }
                        activator.activate_after(Duration::from_millis(5));
                        return;
                    }
                }
                cap = None;
                dead_cap = None;
                return;
            }
            for p in open.iter() {
                highest = highest.max(p.watermark.current());
            }
            let local = open.iter().filter(|p| !p.idle).map(|p| p.watermark.current()).min();
            options.board.post(index, local.map_or(Posted::Resting(highest), Posted::Active));
            // All partitions idle: they do not hold the watermark back. It follows
            // the workers still reading (or, if none is, the highest any reached);
            // records that come later are judged late against it.
            let watermark = local.or_else(|| {
                // Moving this worker's capability only changes how its own later
                // records are judged: the others keep theirs.
                queue.is_empty().then(|| highest.max(options.board.resting_target()))
            });
            if let Some(w) = watermark {
                if w > *held.time() {
                    if let Some(c) = checkpoints.as_ref().filter(|_| w > published) {
                        c.publish(w);
                        published = w;
                    }
                    held.downgrade(&w);
                    if let Some(d) = dead_cap.as_mut() {
                        d.downgrade(&w);
                    }
                }
            }
            if let Some(c) = checkpoints.as_ref() {
                let held_at = *held.time();
                report_cuts(c, &options.name, &mut reported, &mut ended, Some((held_at, &mut open, &mut queue)));
            }
            if any_data || open.len() < concurrent && !queue.is_empty() {
                activator.activate();
            } else {
                activator.activate_after(Duration::from_millis(1));
            }
        }
    });

    Ok(SourceStreams { events: EventStream::append_only(events), dead_letters: EventStream::append_only(dead) })
}

/// Steps `worker` until its dataflows have completed, or until a source of
/// `metrics` has failed for good (see [`read`]): then the worker's dataflows
/// are dropped (nothing downstream sees an end of input that did not happen)
/// and the sources' errors are returned.
pub fn run_until_failed(worker: &mut timely::worker::Worker, metrics: &[&SourceMetrics]) -> Result<(), SourceFailed> {
    let failed = || metrics.iter().any(|m| m.has_failed());
    while !failed() && worker.step_or_park(Some(Duration::from_millis(50))) {}
    if failed() {
        for dataflow in worker.installed_dataflows() {
            worker.drop_dataflow(dataflow);
        }
        let errors: Vec<String> = metrics.iter().flat_map(|m| m.errors()).collect();
        return Err(SourceFailed(errors.join("; ")));
    }
    Ok(())
}

/// A source failed for good (see [`read`]), with its errors.
#[derive(Debug, thiserror::Error)]
#[error("source failed: {0}")]
pub struct SourceFailed(pub String);
