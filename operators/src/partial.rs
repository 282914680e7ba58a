//! The first of two aggregation phases: when combining records into partial
//! results before the exchange pays, and how much room it keeps.
//!
//! Combining pays when a stamp's records fall into few groups (a window over
//! all records, a hot key); with as many groups as records it only adds an
//! accumulator per record (q16's distinct counts per (channel, day)). So a
//! group's first record is kept as it is ([`Slot::One`], sent on unchanged
//! if it stays alone) and only a second one makes an accumulator; and the
//! rule is measured, not configured: a stamp of at least [`MEASURED`]
//! records of which less than a quarter were combined, or whose combined
//! records made fewer than four per partial result (q16 makes 2.2), sends
//! the next [`SKIPPED`] stamps' records as they are, and then combining is
//! tried again. A hot key among many cold ones (q17's hot auction) is
//! combined and the cold keys' records go on as they are. Results do not
//! depend on any of this: merging a partial result is exact
//! ([`Aggregate::merge`](crate::aggregate::Aggregate::merge)).

use std::collections::hash_map::Entry;

use crate::aggregate::Aggregate;
use crate::key::StateMap;
use crate::time::{Diff, Timestamp};

/// The partial results a combining step keeps room for between two stamps:
/// its map is shrunk back to this after a stamp that needed more, so that
/// draining it stays cheap.
const KEPT_PARTIALS: usize = 1 << 14;

/// Stamps sent as they are after one where combining did not pay.
const SKIPPED: u32 = 15;

/// The records a stamp needs for its reduction to count.
const MEASURED: usize = 64;

/// Whether the next stamp is combined, from what combining the last one gave.
#[derive(Debug, Default)]
pub(crate) struct Combining {
    skip: u32,
}

impl Combining {
    /// Whether to combine this stamp's records (else send them as they are).
    pub(crate) fn now(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// A combined stamp of `records` records combined `combined` of them
    /// into `partials` partial results (the others went on as they were).
    fn made(&mut self, records: usize, combined: usize, partials: usize) {
        if records >= MEASURED && (combined * 4 < records || partials * 4 > combined) {
            self.skip = SKIPPED;
        }
    }
}

impl Combining {
    /// Sends a combined stamp's groups on, into `out`: a lone record as it
    /// is (`raw`), several combined as one partial result (`partial`); notes
    /// what combining gave (`records` in the stamp) and shrinks the map back
    /// to [`KEPT_PARTIALS`].
    pub(crate) fn flush<G: std::hash::Hash + Eq, D, Acc, T>(
        &mut self,
        records: usize,
        groups: &mut StateMap<G, Slot<D, Acc>>,
        out: &mut Vec<T>,
        raw: impl Fn(D, Timestamp, Diff) -> T,
        partial: impl Fn(G, Acc) -> T,
    ) {
        let (mut combined, mut partials) = (0, 0);
        out.extend(groups.drain().map(|(group, slot)| match slot {
            Slot::One(d, t, r) => raw(d, t, r),
            Slot::Many(acc, n) => {
                (combined, partials) = (combined + n, partials + 1);
                partial(group, acc)
            }
        }));
        self.made(records, combined, partials);
        if groups.capacity() > KEPT_PARTIALS {
            groups.shrink_to(KEPT_PARTIALS);
        }
    }
}

/// A group's records of one stamp: the first as it is, then combined.
#[derive(Debug)]
pub(crate) enum Slot<D, Acc> {
    /// One record, with its event time and diff.
    One(D, Timestamp, Diff),
    /// Several records combined, and how many.
    Many(Acc, usize),
}

/// Adds a record to its group's slot: kept as it is if it is the first.
pub(crate) fn add<G, D, A: Aggregate<D>>(
    entry: Entry<'_, G, Slot<D, A::Acc>>,
    agg: &A,
    record: D,
    time: Timestamp,
    diff: Diff,
) {
    match entry {
        Entry::Vacant(e) => {
            e.insert(Slot::One(record, time, diff));
        }
        Entry::Occupied(mut e) => combine_into(e.get_mut(), agg, &record, diff),
    }
}

/// Combines a record into its group's slot (a record that lies in several
/// groups, which sent as it is would count in all of them).
pub(crate) fn combine<G, D, A: Aggregate<D>>(entry: Entry<'_, G, Slot<D, A::Acc>>, agg: &A, record: &D, diff: Diff) {
    combine_into(entry.or_insert_with(|| Slot::Many(agg.init(), 0)), agg, record, diff);
}

fn combine_into<D, A: Aggregate<D>>(slot: &mut Slot<D, A::Acc>, agg: &A, record: &D, diff: Diff) {
    if let Slot::One(..) = slot {
        let Slot::One(first, _, first_diff) = std::mem::replace(slot, Slot::Many(agg.init(), 1)) else {
            unreachable!("matched above")
        };
        if let Slot::Many(acc, _) = slot {
            agg.update(acc, &first, first_diff);
        }
    }
    if let Slot::Many(acc, n) = slot {
        agg.update(acc, record, diff);
        *n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_after_a_stamp_that_did_not_pay_then_tries_again() {
        let mut c = Combining::default();
        assert!(c.now());
        c.made(100, 100, 10);
        assert!(c.now(), "a tenfold reduction pays");
        c.made(100, 60, 1);
        assert!(c.now(), "a hot key among cold ones pays");
        c.made(10, 10, 10);
        assert!(c.now(), "a small stamp does not count");
        c.made(100, 20, 1);
        for _ in 0..SKIPPED {
            assert!(!c.now(), "too few records combined");
        }
        assert!(c.now(), "tried again");
        c.made(100, 90, 30);
        for _ in 0..SKIPPED {
            assert!(!c.now());
        }
        assert!(c.now(), "tried again");
    }
}
