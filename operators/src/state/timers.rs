//! Event-time timers per key.

use std::collections::BTreeMap;

use crate::time::Timestamp;

/// Event-time timers: keys waiting for the watermark to reach a time.
///
/// A key may be scheduled at several times, and at one time more than once;
/// an operator that keeps one timer per key checks, when a time is due,
/// whether the key's timer is still that time (a later schedule supersedes
/// an earlier one without removing it here).
///
/// ```
/// use highwater_operators::state::Timers;
/// use highwater_operators::time::Timestamp;
/// let mut timers = Timers::default();
/// timers.schedule(20, 'a');
/// timers.schedule(10, 'b');
/// assert_eq!(timers.next(), Some(10));
/// assert_eq!(timers.pop_due(15), Some((10, vec!['b'])));
/// assert_eq!(timers.pop_due(15), None);
/// assert_eq!(timers.pop_due(20), Some((20, vec!['a'])));
///
/// // One timer per key, kept in the key's state: brought forward only.
/// let mut at = Timestamp::MAX;
/// assert!(timers.bring_forward(&mut at, 30, &'c'));
/// assert!(!timers.bring_forward(&mut at, 40, &'c'));
/// assert_eq!((at, timers.next()), (30, Some(30)));
/// ```
#[derive(Clone, Debug)]
pub struct Timers<K> {
    by_time: BTreeMap<Timestamp, Vec<K>>,
}

impl<K> Default for Timers<K> {
    fn default() -> Self {
        Timers { by_time: BTreeMap::new() }
    }
}

impl<K> Timers<K> {
    /// Schedules `key` at `time`.
    pub fn schedule(&mut self, time: Timestamp, key: K) {
        self.by_time.entry(time).or_default().push(key);
    }

    /// Schedules `key` at `time` unless `time` is `Timestamp::MAX` (no
    /// timer): a key's timer restored from a checkpoint.
    pub fn restore(&mut self, time: Timestamp, key: K) {
        if time != Timestamp::MAX {
            self.schedule(time, key);
        }
    }

    /// Brings a key's one timer forward to `time`: `current` is the time the
    /// key's own state records its timer at (`Timestamp::MAX`: none). If
    /// `time` is earlier, it is recorded there and `key` scheduled at it (the
    /// later schedule stays, superseded); returns whether it was.
    pub fn bring_forward(&mut self, current: &mut Timestamp, time: Timestamp, key: &K) -> bool
    where
        K: Clone,
    {
        if time >= *current {
            return false;
        }
        *current = time;
        self.schedule(time, key.clone());
        true
    }

    /// The earliest scheduled time.
    pub fn next(&self) -> Option<Timestamp> {
        self.by_time.first_key_value().map(|(t, _)| *t)
    }

    /// The earliest time the watermark has reached (at or before
    /// `watermark`), with its keys, taken out.
    pub fn pop_due(&mut self, watermark: Timestamp) -> Option<(Timestamp, Vec<K>)> {
        let entry = self.by_time.first_entry()?;
        if *entry.key() > watermark {
            return None;
        }
        Some(entry.remove_entry())
    }

    /// Forgets every timer.
    pub fn clear(&mut self) {
        self.by_time.clear();
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    /// Every scheduled time with its keys, earliest first.
    pub fn iter(&self) -> impl Iterator<Item = (Timestamp, &K)> {
        self.by_time.iter().flat_map(|(t, keys)| keys.iter().map(move |k| (*t, k)))
    }
}
