//! The first of two aggregation phases: when combining records into partial
//! results before the exchange pays, and how much room it keeps.
//!
//! Combining pays when a stamp's records fall into few groups (a window over
//! all records, a hot key); with as many groups as records it only adds an
//! accumulator per record (q16's distinct counts per (channel, day)). The
//! rule is measured, not configured: a stamp of at least [`MEASURED`]
//! records that made more than a quarter as many groups (fewer than four
//! records per partial result: q16 makes 2.2) sends the next
//! [`SKIPPED`] stamps' records as they are, and then combining is tried
//! again. Smaller stamps are combined (they cost little either way). Results do not depend on it:
//! merging a partial result is exact ([`Aggregate::merge`](crate::aggregate::Aggregate::merge)).

/// The partial results a combining step keeps room for between two stamps:
/// its map is shrunk back to this after a stamp that needed more, so that
/// draining it stays cheap.
pub(crate) const KEPT_PARTIALS: usize = 1 << 14;

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

    /// A combined stamp made `groups` partial results of `records` records.
    pub(crate) fn made(&mut self, records: usize, groups: usize) {
        if records >= MEASURED && groups * 4 > records {
            self.skip = SKIPPED;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_after_a_stamp_that_did_not_pay_then_tries_again() {
        let mut c = Combining::default();
        assert!(c.now());
        c.made(100, 10);
        assert!(c.now(), "a tenfold reduction pays");
        c.made(10, 10);
        assert!(c.now(), "a small stamp does not count");
        c.made(100, 30);
        for _ in 0..SKIPPED {
            assert!(!c.now());
        }
        assert!(c.now(), "tried again");
    }
}
