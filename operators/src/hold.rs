//! Bookkeeping shared by the windowed operators: which output times they still
//! owe, and the capability that lets them emit there.

use std::collections::BTreeMap;

use timely::dataflow::operators::{Capability, InputCapability};

use crate::time::Timestamp;

/// A capability for the least of the times an operator still has to emit at.
///
/// Operators add a time when they promise output there (a window that will
/// fire, a record waiting for the watermark), remove it when the output has
/// gone out, and [`settle`](Hold::settle) to downgrade the capability so that
/// the watermark downstream advances as far as the promises allow.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    cap: Option<Capability<Timestamp>>,
    /// The same capability for the operator's outputs 1, 2, ... (see
    /// [`Hold::with_outputs`]); a capability is valid for one output only.
    others: Vec<Capability<Timestamp>>,
    /// How many outputs the operator emits on under the hold (0 counts as 1).
    outputs: usize,
    times: BTreeMap<Timestamp, usize>,
}

impl Hold {
    /// A hold whose promises cover `outputs` outputs (ports `0..outputs`).
    pub(crate) fn with_outputs(outputs: usize) -> Self {
        Hold { outputs, ..Hold::default() }
    }

    /// Takes capabilities at `time` for every output from `input`.
    fn mint(&mut self, input: &InputCapability<Timestamp>, time: Timestamp) {
        self.cap = Some(input.delayed(&time, 0));
        self.others = (1..self.outputs.max(1)).map(|port| input.delayed(&time, port)).collect();
    }

    /// Promises output at `time`, which must not precede `input`'s time.
    pub(crate) fn insert(&mut self, time: Timestamp, input: &InputCapability<Timestamp>) {
        *self.times.entry(time).or_insert(0) += 1;
        if self.cap.as_ref().is_none_or(|c| *c.time() > time) {
            self.mint(input, time);
        }
    }

    /// Owes output at `time` on recovery, minting the capabilities from the
    /// operator's initial ones (one per output port, the first for port 0).
    pub(crate) fn restore(&mut self, time: Timestamp, initial: &[Capability<Timestamp>]) {
        *self.times.entry(time).or_insert(0) += 1;
        if self.cap.as_ref().is_none_or(|c| *c.time() > time) {
            self.cap = Some(initial[0].delayed(&time));
            self.others = (1..self.outputs.max(1)).map(|port| initial[port].delayed(&time)).collect();
        }
    }

    /// Makes sure a capability is held no later than `input`'s time, without
    /// promising output there: [`settle`](Hold::settle) with a floor keeps it.
    pub(crate) fn retain(&mut self, input: &InputCapability<Timestamp>) {
        let time = *input.least().expect("highwater messages travel under a capability");
        if self.cap.as_ref().is_none_or(|c| *c.time() > time) {
            self.mint(input, time);
        }
    }

    /// Promises output at `time`, which must not precede the held capability's
    /// time (e.g. a timer set while handling input held here).
    pub(crate) fn promise(&mut self, time: Timestamp) {
        debug_assert!(
            self.cap.as_ref().is_some_and(|c| *c.time() <= time),
            "a promise needs a capability at or before it"
        );
        *self.times.entry(time).or_insert(0) += 1;
    }

    /// Withdraws one promise at `time`.
    pub(crate) fn remove(&mut self, time: Timestamp) {
        if let Some(n) = self.times.get_mut(&time) {
            *n -= 1;
            if *n == 0 {
                self.times.remove(&time);
            }
        }
    }

    /// A capability to emit at `time`, which must not precede a promise still held.
    pub(crate) fn at(&self, time: Timestamp) -> Capability<Timestamp> {
        self.cap.as_ref().expect("output is only owed under a held capability").delayed(&time)
    }

    /// A capability to emit at `time`, or at the held time if that is later.
    pub(crate) fn at_or_after(&self, time: Timestamp) -> Capability<Timestamp> {
        self.at_or_after_on(time, 0)
    }

    /// [`at_or_after`](Hold::at_or_after) for output `port`.
    pub(crate) fn at_or_after_on(&self, time: Timestamp, port: usize) -> Capability<Timestamp> {
        let cap = if port == 0 { self.cap.as_ref() } else { self.others.get(port - 1) };
        let cap = cap.expect("output is only owed under a held capability (for a port the hold covers)");
        cap.delayed(&time.max(*cap.time()))
    }

    /// The time of the held capability, if one is held.
    pub(crate) fn time(&self) -> Option<Timestamp> {
        self.cap.as_ref().map(|c| *c.time())
    }

    /// The least time still promised, if any.
    pub(crate) fn least(&self) -> Option<Timestamp> {
        self.times.first_key_value().map(|(t, _)| *t)
    }

    /// Downgrades the capability to the least promise, or to `floor` if that is
    /// lower; drops it when nothing is promised and there is no floor.
    pub(crate) fn settle(&mut self, floor: Option<Timestamp>) {
        let least = match (self.least(), floor) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match least {
            Some(t) => {
                for cap in self.cap.iter_mut().chain(self.others.iter_mut()) {
                    if *cap.time() < t {
                        cap.downgrade(&t);
                    }
                }
            }
            None => {
                self.cap = None;
                self.others.clear();
            }
        }
    }
}
