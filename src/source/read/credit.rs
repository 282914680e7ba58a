//! Credit-based flow control of a source: it reads while fewer records than
//! its credit are in flight between the workers of its process
//! ([`InFlight`]: sent into an exchange, not yet taken by the operator they
//! go to), and notes the records it has sent that have not yet passed the
//! probe on the dataflow's outputs (for checkpoint cuts).
//!
//! Without an [`InFlight`] count (a computation not run as a `Job` nor
//! configured with [`InFlight::configure`]), credit is counted against the
//! probe alone: the source pauses while its records have not passed it, and
//! reads on when the probe has not moved for a while (the dataflow then
//! waits for input rather than catching up).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use highwater_operators::flow::InFlight;
use highwater_operators::{Counter, Timestamp};
use timely::dataflow::ProbeHandle;

/// How long a source waits, out of credit, for a probe that does not move
/// before it reads on (the dataflow then waits for input, e.g. a window that
/// needs more event time, rather than catching up).
const STALLED: Duration = Duration::from_millis(200);

/// The records a source's worker has in flight, by the time they went out at.
pub(super) struct Credit {
    probe: Option<ProbeHandle<Timestamp>>,
    max_in_flight: usize,
    /// Records sent, by the time they went out at (partitions' times interleave).
    sent: BTreeMap<Timestamp, usize>,
    outstanding: usize,
    /// Since when the source has been out of credit, and the probe's frontier then.
    paused_since: Option<(Instant, Option<Timestamp>)>,
    /// The records in flight between the process's workers, if counted.
    in_flight: Option<InFlight>,
    /// Microseconds the source spent out of credit.
    throttled: Counter,
}

impl Credit {
    /// Credit of `max_in_flight` records per worker of the process in flight
    /// (`in_flight`), or, without that count, past `probe`; with neither,
    /// unlimited. Time spent out of credit is added to `throttled` (µs).
    pub(super) fn new(
        probe: Option<ProbeHandle<Timestamp>>,
        max_in_flight: usize,
        in_flight: Option<InFlight>,
        throttled: Counter,
    ) -> Self {
        Credit { probe, max_in_flight, sent: BTreeMap::new(), outstanding: 0, paused_since: None, in_flight, throttled }
    }

    /// Whether the source may read now: it has credit, or the probe has not
    /// moved for [`STALLED`] while it had none. Records the probe has passed
    /// give their credit back.
    pub(super) fn may_read(&mut self, now: Instant) -> bool {
        let frontier = self.probe.as_ref().map(|probe| probe.with_frontier(|f| f.as_option().copied()));
        if let Some(frontier) = frontier {
            while let Some(entry) = self.sent.first_entry() {
                if frontier.is_some_and(|f| f <= *entry.key()) {
                    break;
                }
                self.outstanding -= entry.remove();
            }
        }
        if let Some(in_flight) = self.in_flight.as_ref() {
            let limit = self.max_in_flight.saturating_mul(in_flight.threads()) as u64;
            let may = in_flight.records() < limit;
            match (may, self.paused_since) {
                (true, Some((since, _))) => {
                    self.throttled.add(now.duration_since(since).as_micros() as u64);
                    self.paused_since = None;
                }
                (false, None) => self.paused_since = Some((now, None)),
                _ => {}
            }
            return may;
        }
        let Some(frontier) = frontier else { return true };
        if self.outstanding < self.max_in_flight {
            self.paused_since = None;
            return true;
        }
        match self.paused_since {
            Some((since, seen)) if seen == frontier => now.duration_since(since) > STALLED,
            _ => {
                self.paused_since = Some((now, frontier));
                false
            }
        }
    }

    /// Whether fewer than `limit` of the records in flight went out at or
    /// after `time`.
    pub(super) fn below_at_or_after(&self, time: Timestamp, limit: usize) -> bool {
        self.sent.range(time..).map(|(_, n)| *n).sum::<usize>() < limit
    }

    /// Notes `n` records sent at `time`.
    pub(super) fn sent(&mut self, time: Timestamp, n: usize) {
        if self.probe.is_some() {
            *self.sent.entry(time).or_insert(0) += n;
            self.outstanding += n;
        }
    }
}
