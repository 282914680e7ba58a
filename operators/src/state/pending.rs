//! Records waiting for the watermark to pass their event time, in
//! event-time order: the queue the as-of joins and pattern matching keep
//! their events in until the watermark completes them.

use std::collections::BTreeMap;

use crate::hold::Hold;
use crate::time::Timestamp;

/// Records waiting until the watermark passes their event time, taken in
/// event-time order, which can also be listed for a checkpoint and refilled
/// on recovery (used by the as-of joins and by pattern matching).
///
/// Each record's results go out at its own time, or at its arrival if that is
/// later, whichever records share its event time: so a record's output time
/// does not depend on what else was waiting when it came.
#[derive(Debug)]
pub(crate) struct Pending<D> {
    /// By event time and emission time, the records in arrival order.
    by_time: BTreeMap<(Timestamp, Timestamp), Vec<D>>,
}

impl<D> Default for Pending<D> {
    fn default() -> Self {
        Pending { by_time: BTreeMap::new() }
    }
}

impl<D> Pending<D> {
    /// Adds `record` at `time`; it arrived at timely time `arrived`.
    pub(crate) fn insert(
        &mut self,
        record: D,
        time: Timestamp,
        arrived: Timestamp,
        hold: &mut Hold,
        cap: &timely::dataflow::operators::InputCapability<Timestamp>,
    ) {
        let emit_at = time.max(arrived);
        let records = self.by_time.entry((time, emit_at)).or_default();
        if records.is_empty() {
            hold.insert(emit_at, cap);
        }
        records.push(record);
    }

    /// Adds a restored `record` at `time`, whose result goes out at `emit_at`,
    /// minting the hold's capabilities from the operator's `initial` ones.
    pub(crate) fn restore(
        &mut self,
        record: D,
        time: Timestamp,
        emit_at: Timestamp,
        hold: &mut Hold,
        initial: &[timely::dataflow::operators::Capability<Timestamp>],
    ) {
        let records = self.by_time.entry((time, emit_at)).or_default();
        if records.is_empty() {
            hold.restore(emit_at, initial);
        }
        records.push(record);
    }

    /// The earliest waiting records with an event time below `watermark`
    /// and the same emission time, with these times; the hold's promise for
    /// them is withdrawn (the caller emits under [`Hold::at`] before settling).
    pub(crate) fn pop_before(
        &mut self,
        watermark: Timestamp,
        hold: &mut Hold,
    ) -> Option<(Timestamp, Vec<D>, Timestamp)> {
        let entry = self.by_time.first_entry()?;
        if entry.key().0 >= watermark {
            return None;
        }
        let ((time, emit_at), records) = entry.remove_entry();
        hold.remove(emit_at);
        Some((time, records, emit_at))
    }

    /// The earliest waiting event time.
    pub(crate) fn first_time(&self) -> Option<Timestamp> {
        self.by_time.first_key_value().map(|((t, _), _)| *t)
    }

    /// Every waiting record with its event time and emission time, in
    /// event-time order (arrival order within a time).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Timestamp, &D, Timestamp)> + '_ {
        self.by_time.iter().flat_map(|((t, emit_at), records)| records.iter().map(move |r| (*t, r, *emit_at)))
    }
}
