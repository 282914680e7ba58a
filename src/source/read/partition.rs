//! One partition as the source operator reads it: its reader, watermark and
//! idleness, retries after errors that may go away, and (with checkpoints)
//! where it stood before each new output time.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use highwater_operators::{Timestamp, Update};

use super::SourceOptions;
use crate::checkpoint::PartitionState;
use crate::dead_letter::DeadLetter;
use crate::source::{Offset, PartitionReader, ReadStatus};
use crate::time::PartitionWatermark;

pub(super) struct Partition<R> {
    pub(super) index: usize,
    pub(super) reader: R,
    pub(super) watermark: PartitionWatermark,
    pub(super) idle: bool,
    /// The offset it was opened at.
    from: Option<Offset>,
    /// Whether it has returned records since.
    read_any: bool,
    /// With checkpoints: where the partition stood before the first batch it
    /// emitted at each new output time, since the last cut.
    pub(super) log: VecDeque<Mark>,
    pub(super) done: bool,
    /// Failed for good: read no more, and hold the watermark where it is.
    pub(super) failed: bool,
    /// Retryable errors in a row, and when to try again.
    retries: u32,
    retry_at: Option<Instant>,
    /// With a watermark interval: the greatest event time read but not yet
    /// let into the watermark, and when the watermark last took one in.
    held_back: Option<Timestamp>,
    published: Option<Instant>,
    /// Since when flow control has held the partition back, and whether its
    /// reader was told to pause.
    withheld_since: Option<Instant>,
    paused: bool,
    /// Its watermark, offset, records and bytes read, in the job's totals (as
    /// gauges: `<source>/<partition>.watermark`, `.offset`,
    /// `.partition_records`, `.partition_bytes`).
    pub(super) gauges: Option<PartitionGauges>,
}

/// A partition's gauges in the job's totals.
#[derive(Clone, Debug, Default)]
pub(super) struct PartitionGauges {
    pub(super) watermark: highwater_operators::Counter,
    pub(super) offset: highwater_operators::Counter,
    pub(super) records: highwater_operators::Counter,
    /// Registered only for readers that count their bytes.
    pub(super) bytes: Option<highwater_operators::Counter>,
}

impl PartitionGauges {
    /// Registered in `totals` for partition `index` of source `source`
    /// (`<source>/<index>.partition_bytes` too if its reader `counts_bytes`).
    pub(super) fn register(totals: &crate::totals::Totals, source: &str, index: usize, counts_bytes: bool) -> Self {
        let mut gauges = PartitionGauges::default();
        totals.count(&format!("{source}/{index}.watermark"), &gauges.watermark);
        totals.count(&format!("{source}/{index}.offset"), &gauges.offset);
        totals.count(&format!("{source}/{index}.partition_records"), &gauges.records);
        if counts_bytes {
            let bytes = highwater_operators::Counter::new();
            totals.count(&format!("{source}/{index}.partition_bytes"), &bytes);
            gauges.bytes = Some(bytes);
        }
        gauges
    }
}

/// How long flow control holds a partition back before its reader is told
/// to pause ([`PartitionReader::pause`]): credit comes and goes within
/// milliseconds, and a Kafka partition that pauses drops its prefetched
/// records, to fetch them again when it resumes.
pub(super) const PAUSE_AFTER: Duration = Duration::from_millis(200);

/// A partition's position and watermark before a batch emitted at `emit_at`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark {
    pub(super) emit_at: Timestamp,
    offset: Option<Offset>,
    max_seen: Option<Timestamp>,
    floor: Timestamp,
}

/// What one read call of a partition gave (its records and dead letters are
/// in the buffers it was handed).
pub(super) struct Batch {
    /// What the reader said; [`ReadStatus::Idle`] after an error.
    pub(super) status: ReadStatus,
    /// The greatest event time of the batch's records (0 if none).
    pub(super) max_time: Timestamp,
    /// Records whose event time is below the time the batch goes out at.
    pub(super) late: u64,
    /// The error the partition failed with for good in this call, worded for
    /// the job's report (the records read before it are in the buffers).
    pub(super) failure: Option<String>,
}

impl<R: PartitionReader> Partition<R> {
    /// Partition `index`, opened at `from`.
    pub(super) fn new(index: usize, reader: R, watermark: PartitionWatermark, from: Option<Offset>) -> Self {
        Partition {
            index,
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
            held_back: None,
            published: None,
            withheld_since: None,
            paused: false,
            gauges: None,
        }
    }

    /// Takes a batch's greatest event time into the watermark: at once
    /// without an `interval` (and for the partition's first records, which
    /// start it), else at the next [`publish`](Self::publish); while the
    /// reader is not [`resumable`](PartitionReader::resumable), once it is.
    pub(super) fn observe(&mut self, max_time: Timestamp, now: Instant, interval: Option<Duration>) {
        if !self.reader.resumable() || interval.is_some() && self.watermark.max_seen().is_some() {
            self.held_back = Some(self.held_back.map_or(max_time, |t| t.max(max_time)));
        } else {
            self.watermark.observe(max_time);
            self.published.get_or_insert(now);
        }
    }

    /// Lets the event times held back into the watermark: with a watermark
    /// `interval`, once it has passed since the watermark last moved; held
    /// back because the reader was not [`resumable`](PartitionReader::resumable),
    /// once it is (at once if the partition has ended).
    pub(super) fn publish(&mut self, now: Instant, interval: Option<Duration>) {
        let Some(time) = self.held_back else { return };
        if !self.done && !self.reader.resumable() {
            return; // not yet: see `PartitionReader::resumable`
        }
        if self.done || interval.is_none_or(|i| self.published.is_none_or(|at| now.duration_since(at) >= i)) {
            self.watermark.observe(time);
            self.held_back = None;
            self.published = Some(now);
        }
    }

    /// Where the partition stands now.
    pub(super) fn mark(&self, emit_at: Timestamp) -> Mark {
        Mark {
            emit_at,
            offset: if self.read_any { Some(self.reader.offset()) } else { self.from },
            max_seen: self.watermark.max_seen(),
            floor: self.watermark.floor(),
        }
    }

    /// The partition at the cut at `time`: as it stood before its first batch
    /// emitted at or after `time`, or as it stands now if there was none.
    pub(super) fn at_cut(&self, time: Timestamp) -> PartitionState {
        let (mark, done) = match self.log.iter().find(|m| m.emit_at >= time) {
            Some(m) => (*m, false),
            None => (self.mark(time), self.done),
        };
        PartitionState { partition: self.index, offset: mark.offset, max_seen: mark.max_seen, floor: mark.floor, done }
    }

    /// Forgets the positions before `time` (no later cut needs them).
    pub(super) fn trim(&mut self, time: Timestamp) {
        while self.log.front().is_some_and(|m| m.emit_at < time) {
            self.log.pop_front();
        }
    }

    /// Whether the partition has seen a record (or ended, or failed): its
    /// watermark no longer stands at its start.
    pub(super) fn started(&self) -> bool {
        self.watermark.max_seen().is_some() || self.done || self.failed
    }

    /// Whether the partition may be read now: it has not failed and is not
    /// waiting to retry.
    pub(super) fn readable(&self, now: Instant) -> bool {
        !self.failed && self.retry_at.is_none_or(|at| at <= now)
    }

    /// Flow control held the partition back in this activation: after
    /// [`PAUSE_AFTER`] its reader pauses. Returns whether it paused now.
    pub(super) fn withheld(&mut self, now: Instant) -> bool {
        if self.done || self.failed {
            return false;
        }
        let since = *self.withheld_since.get_or_insert(now);
        if self.paused || now.duration_since(since) < PAUSE_AFTER {
            return false;
        }
        self.reader.pause();
        self.paused = true;
        true
    }

    /// Reads up to `options.batch_size` records (with `start_small`, for a
    /// source whose partitions take turns, a single one until the partition
    /// has [`started`](Self::started): all it takes to know its watermark)
    /// into `updates` (stamped with
    /// `time_of`, counted late below `emit_at`) and `dead`. An error that may
    /// go away schedules a retry (see [`super::RetryPolicy`]); any other, or
    /// the last retry's, fails the partition for good ([`Batch::failure`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_batch<D>(
        &mut self,
        options: &SourceOptions,
        now: Instant,
        emit_at: Timestamp,
        start_small: bool,
        limit: usize,
        time_of: impl Fn(&D) -> Timestamp,
        updates: &mut Vec<Update<D>>,
        dead: &mut Vec<DeadLetter>,
    ) -> Batch
    where
        R: PartitionReader<Record = D>,
    {
        self.withheld_since = None;
        if std::mem::take(&mut self.paused) {
            self.reader.resume();
        }
        let max = if self.started() || !start_small { options.batch_size } else { 1 }.min(limit);
        // The batch's container is handed downstream whole, so each batch
        // starts with an empty one: room for it at once, not by doubling
        // (a dozen moves of the records read so far, 4 % of a read); up to
        // a bound, so that a huge --batch-size costs memory only when used.
        updates.reserve(max.min(1 << 16));
        let (mut max_time, mut late, mut failure) = (0, 0, None);
        let mut take = |record: D| {
            let time = time_of(&record);
            max_time = max_time.max(time);
            late += u64::from(time < emit_at);
            updates.push((record, time, 1));
        };
        let status = match self.reader.read(max, &mut take, dead) {
            Ok(status) => {
                self.retries = 0;
                self.retry_at = None;
                status
            }
            Err(e) if e.is_retryable() && self.retries < options.retry.attempts => {
                self.retries += 1;
                let wait = options.retry.backoff(self.retries);
                tracing::warn!(source = %options.name, partition = self.index, attempt = self.retries, ?wait, "retrying after: {e}");
                self.retry_at = Some(now + wait);
                ReadStatus::Idle
            }
            Err(e) => {
                // An error is never the end of the input: the partition holds
                // its watermark (nothing downstream is computed as if it had
                // ended); the caller fails the job (see `read`).
                let retried =
                    if self.retries > 0 { format!(" (after {} retries)", self.retries) } else { String::new() };
                self.failed = true;
                failure = Some(format!("{}: partition {}: {e}{retried}", options.name, self.index));
                ReadStatus::Idle
            }
        };
        Batch { status, max_time, late, failure }
    }

    /// Notes that a read returned records or dead letters.
    pub(super) fn got_data(&mut self, now: Instant) {
        self.watermark.touch(now);
        self.idle = false;
        self.read_any = true;
    }

    /// After a read that said `status`: follows the reader's watermark hint,
    /// and tells the end of the partition, its failure and its idleness.
    pub(super) fn settle(&mut self, status: ReadStatus, now: Instant) {
        let resumable = self.reader.resumable();
        if let Some(bound) = self.reader.watermark_hint().filter(|_| resumable) {
            if bound > self.watermark.current() {
                self.watermark.advance_to(bound);
                self.watermark.touch(now);
                self.idle = false;
            }
        }
        if status == ReadStatus::End {
            self.idle = true;
            self.done = true;
            self.held_back.take().into_iter().for_each(|t| self.watermark.observe(t));
        } else if self.failed || status == ReadStatus::Behind || !resumable {
            // A failed partition holds the watermark where it is; one
            // behind its known end, or inside a snapshot, is slow, not idle.
            self.idle = false;
        } else if status == ReadStatus::Idle && self.watermark.is_idle(now) {
            self.idle = true;
        }
    }
}
