//! Pacing a source in processing time ([`SourceOptions::rate_limit`](super::SourceOptions::rate_limit)):
//! a worker reads at most its share of the rate, as a token bucket that
//! starts with the worker's first read and holds at most one batch.

use std::time::{Duration, Instant};

/// One worker's pace: `per_second` records a second from the first read on.
#[derive(Debug)]
pub(super) struct Pacer {
    per_second: f64,
    /// The first read, and how many records have been read since.
    start: Option<Instant>,
    read: u64,
    /// At most this many records are due at once (one batch): a worker that
    /// falls behind (a pause, backpressure) does not then read a burst.
    burst: u64,
}

impl Pacer {
    /// A pace of `per_second` records a second, in bursts of at most `burst`.
    pub(super) fn new(per_second: f64, burst: usize) -> Self {
        Pacer { per_second: per_second.max(f64::MIN_POSITIVE), start: None, read: 0, burst: burst.max(1) as u64 }
    }

    /// How many records are due now.
    pub(super) fn due(&mut self, now: Instant) -> usize {
        let start = *self.start.get_or_insert(now);
        let due = (now.duration_since(start).as_secs_f64() * self.per_second) as u64 + 1;
        if due > self.read + self.burst {
            // Behind by more than a burst: forget the backlog.
            self.read = due - self.burst;
        }
        (due - self.read.min(due)) as usize
    }

    /// Notes `n` records read.
    pub(super) fn took(&mut self, n: usize) {
        self.read += n as u64;
    }

    /// How long until the next record is due.
    pub(super) fn wait(&self, now: Instant) -> Duration {
        let Some(start) = self.start else { return Duration::ZERO };
        let next = Duration::from_secs_f64(self.read as f64 / self.per_second);
        (start + next).saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_fall_due_at_the_rate_and_a_backlog_is_forgotten() {
        let mut pace = Pacer::new(1000.0, 10);
        let t0 = Instant::now();
        assert_eq!(pace.due(t0), 1, "the first record at once");
        pace.took(1);
        assert_eq!(pace.due(t0), 0);
        assert_eq!(pace.wait(t0), Duration::from_millis(1));
        assert_eq!(pace.due(t0 + Duration::from_micros(5500)), 5);
        pace.took(5);
        assert_eq!(pace.wait(t0 + Duration::from_micros(5500)), Duration::from_micros(500));
        // A second later: one burst, not a thousand records.
        assert_eq!(pace.due(t0 + Duration::from_secs(1)), 10);
    }
}
