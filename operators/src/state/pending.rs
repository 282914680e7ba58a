//! Records waiting for the watermark to pass their event time, in
//! event-time order: the queue the count and global windows, the as-of joins
//! and pattern matching keep their records in until the watermark completes
//! them.

use std::collections::BTreeMap;

use crate::hold::Hold;
use crate::key::{Key, StateMap};
use crate::time::Timestamp;

/// Records waiting until the watermark passes their event time, taken in
/// event-time order, which can also be listed for a checkpoint and refilled
/// on recovery.
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

    /// Every waiting record of the earliest event time below `watermark`,
    /// whatever their emission times, with that time and the earliest of
    /// them (under which all of their results go out): for operators that
    /// take the records of one millisecond together. The hold's promises
    /// for them are withdrawn, as by [`pop_before`](Self::pop_before).
    pub(crate) fn pop_time_before(
        &mut self,
        watermark: Timestamp,
        hold: &mut Hold,
    ) -> Option<(Timestamp, Vec<D>, Timestamp)> {
        let (time, mut records, emit_at) = self.pop_before(watermark, hold)?;
        while let Some(entry) = self.by_time.first_entry().filter(|e| e.key().0 == time) {
            let ((_, later), mut more) = entry.remove_entry();
            hold.remove(later);
            records.append(&mut more);
        }
        Some((time, records, emit_at))
    }

    /// How many records wait, and their size encoded (from a sample, with
    /// their times): [`OperatorState::held`](super::OperatorState::held).
    pub(crate) fn held(&self) -> (usize, u64)
    where
        D: serde::Serialize,
    {
        let n = self.by_time.values().map(Vec::len).sum();
        (n, super::sampled_size(n, self.iter()))
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

    /// The keys of the waiting records, in the order [`by_key`](Self::by_key)
    /// takes them: computed on the worker, as key functions need not be
    /// `Send`, before the records go to a background thread to be serialized.
    pub(crate) fn keys<K>(&self, key: impl Fn(&D) -> K) -> Vec<K> {
        self.iter().map(|(_, record, _)| key(record)).collect()
    }

    /// The waiting records grouped by key, each with its event time, given
    /// their [`keys`](Self::keys).
    pub(crate) fn by_key<K: Key>(&self, keys: Vec<K>) -> StateMap<K, Vec<(Timestamp, &D)>> {
        let mut grouped: StateMap<K, Vec<(Timestamp, &D)>> = StateMap::default();
        for ((time, record, _), k) in self.iter().zip(keys) {
            grouped.entry(k).or_default().push((time, record));
        }
        grouped
    }
}
