//! The timely operator that reads a [`Source`]: partitions spread over
//! workers, a watermark per partition, dead letters, credit-based flow control.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater_operators::{Counter, EventStream, Timestamp, Update};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::dataflow::{ProbeHandle, Scope};

use super::{Offset, PartitionReader, ReadStatus, Source, SourceError};
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
            max_in_flight: 500_000,
            start_offsets: Vec::new(),
            board: WatermarkBoard::default(),
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
    /// Errors that ended a partition early.
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl SourceMetrics {
    /// Errors recorded so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
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
}

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
    let mut queue = VecDeque::new();
    for i in (0..names.len()).filter(|i| i % peers == index) {
        let from = options.start_offsets.iter().find(|(p, _)| *p == i).map(|(_, o)| *o);
        queue.push_back((i, source.open(i, from)?));
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
                let Some((index, reader)) = queue.pop_front() else { break };
                let mut watermark = PartitionWatermark::new(options.watermark.clone(), options.idle_timeout);
                watermark.touch(now);
                open.push(Partition { index, reader, watermark, idle: false });
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

            let mut any_data = false;
            if may_read {
                let mut events = events_out.activate();
                let mut dead = dead_out.activate();
                for partition in open.iter_mut() {
                    // The batch goes out at the partition's watermark before it.
                    let emit_at = (*held.time()).max(partition.watermark.current());
                    let (mut max_time, mut late) = (0, 0);
                    let mut take = |record: S::Record| {
                        let time = time_of(&record);
                        max_time = max_time.max(time);
                        late += u64::from(time < emit_at);
                        updates.push((record, time, 1));
                    };
                    let status = match partition.reader.read(options.batch_size, &mut take, &mut dead_letters) {
                        Ok(status) => status,
                        Err(e) if e.is_retryable() => {
                            tracing::warn!(source = %options.name, partition = partition.index, "retrying after: {e}");
                            ReadStatus::Idle
                        }
                        Err(e) => {
                            tracing::error!(source = %options.name, partition = partition.index, "partition ends: {e}");
                            if let Ok(mut errors) = metrics.errors.lock() {
                                errors.push(format!("{}: partition {}: {e}", options.name, partition.index));
                            }
                            ReadStatus::End
                        }
                    };
                    if !updates.is_empty() || !dead_letters.is_empty() {
                        any_data = true;
                        partition.watermark.touch(now);
                        partition.idle = false;
                        let n = updates.len();
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
                        partition.index = usize::MAX;
                    } else if status == ReadStatus::Idle && partition.watermark.is_idle(now) {
                        partition.idle = true;
                    }
                }
                open.retain(|p| p.index != usize::MAX);
            }

            if open.is_empty() && queue.is_empty() {
                // Done: idle workers may follow as far as this one got.
                options.board.post(index, Posted::Resting(highest));
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
                    held.downgrade(&w);
                    if let Some(d) = dead_cap.as_mut() {
                        d.downgrade(&w);
                    }
                }
            }
            if any_data || open.len() < concurrent && !queue.is_empty() {
                activator.activate();
            } else {
                activator.activate_after(Duration::from_millis(1));
            }
        }
    });

    Ok(SourceStreams { events: EventStream::new(events), dead_letters: EventStream::new(dead) })
}
