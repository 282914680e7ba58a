//! Credit-based flow control of a source: the records it has sent that have
//! not yet passed the probe on the dataflow's outputs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use highwater_operators::Timestamp;
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
    in_flight: BTreeMap<Timestamp, usize>,
    outstanding: usize,
    /// Since when the source has been out of credit, and the probe's frontier then.
    paused_since: Option<(Instant, Option<Timestamp>)>,
}

impl Credit {
    /// Credit of `max_in_flight` records past `probe`; without a probe, unlimited.
    pub(super) fn new(probe: Option<ProbeHandle<Timestamp>>, max_in_flight: usize) -> Self {
        Credit { probe, max_in_flight, in_flight: BTreeMap::new(), outstanding: 0, paused_since: None }
    }

    /// Whether the source may read now: it has credit, or the probe has not
    /// moved for [`STALLED`] while it had none. Records the probe has passed
    /// give their credit back.
    pub(super) fn may_read(&mut self, now: Instant) -> bool {
        let Some(probe) = self.probe.as_ref() else { return true };
        let frontier = probe.with_frontier(|f| f.as_option().copied());
        while let Some(entry) = self.in_flight.first_entry() {
            if frontier.is_some_and(|f| f <= *entry.key()) {
                break;
            }
            self.outstanding -= entry.remove();
        }
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
        self.in_flight.range(time..).map(|(_, n)| *n).sum::<usize>() < limit
    }

    /// Notes `n` records sent at `time`.
    pub(super) fn sent(&mut self, time: Timestamp, n: usize) {
        if self.probe.is_some() {
            *self.in_flight.entry(time).or_insert(0) += n;
            self.outstanding += n;
        }
    }
}
