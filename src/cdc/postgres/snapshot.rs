//! The initial snapshot and how the stream is joined to it exactly.
//!
//! The source creates its replication slot first, then opens a `REPEATABLE
//! READ` transaction, reads its MVCC snapshot (`pg_current_snapshot()`: xmin,
//! xmax and the transactions in progress) and the tables under it. The slot
//! decodes exactly the transactions that commit after its consistent point,
//! and every transaction that committed before that point had already ended
//! (left the process array) when slot creation returned, so it is visible to
//! the snapshot, taken later. Each transaction is therefore in the snapshot,
//! in the stream, or in both: those in both are exactly the streamed
//! transactions visible to the snapshot, which the stream skips
//! ([`SnapshotFilter`]). Nothing is lost and nothing is applied twice.
//!
//! pgoutput's `Begin` carries a 32-bit xid; the snapshot's xids are 64-bit
//! (`xid8`, with the epoch). A transaction visible to the snapshot committed
//! before the snapshot was taken, hence before the WAL insert position read
//! right after it (`until_lsn`): only streamed transactions that commit
//! before that position are checked, and their xids are within 2^31 of the
//! snapshot's xmax, which gives the epoch ([`widen_xid`]).

/// An MVCC snapshot as `pg_current_snapshot()` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XidSnapshot {
    /// Every transaction below is finished.
    pub(crate) xmin: u64,
    /// Every transaction from here on had not started.
    pub(crate) xmax: u64,
    /// Transactions in `[xmin, xmax)` in progress (sorted).
    pub(crate) xip: Vec<u64>,
}

impl XidSnapshot {
    /// Parses `xmin:xmax:xip,xip,...` (the text form of `pg_snapshot`).
    pub(crate) fn parse(text: &str) -> Option<XidSnapshot> {
        let mut parts = text.trim().splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let xip = parts.next()?;
        let mut xip: Vec<u64> =
            if xip.is_empty() { Vec::new() } else { xip.split(',').map(|x| x.parse().ok()).collect::<Option<_>>()? };
        xip.sort_unstable();
        (xmin <= xmax).then_some(XidSnapshot { xmin, xmax, xip })
    }

    /// Whether the committed transaction `xid` is visible to the snapshot
    /// (committed before it was taken).
    pub(crate) fn visible(&self, xid: u64) -> bool {
        xid < self.xmin || (xid < self.xmax && self.xip.binary_search(&xid).is_err())
    }
}

/// The 64-bit xid of a 32-bit `xid` near `reference` (within 2^31 of it).
pub(crate) fn widen_xid(xid: u32, reference: u64) -> u64 {
    const HALF: u64 = 1 << 31;
    const EPOCH: u64 = 1 << 32;
    let full = (reference & !(EPOCH - 1)) | u64::from(xid);
    if full > reference.saturating_add(HALF) && full >= EPOCH {
        full - EPOCH
    } else if full.saturating_add(HALF) < reference {
        full + EPOCH
    } else {
        full
    }
}

/// Which streamed transactions the initial snapshot already contains.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotFilter {
    /// The snapshot.
    pub(crate) snapshot: XidSnapshot,
    /// The WAL insert position read right after the snapshot: transactions
    /// committing at or after it are not in the snapshot.
    pub(crate) until_lsn: u64,
}

impl SnapshotFilter {
    /// Whether the transaction `xid` committed at `commit_lsn` is in the snapshot.
    pub(crate) fn contains(&self, xid: u32, commit_lsn: u64) -> bool {
        commit_lsn < self.until_lsn && self.snapshot.visible(widen_xid(xid, self.snapshot.xmax))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_snapshots() {
        assert_eq!(XidSnapshot::parse("10:20:"), Some(XidSnapshot { xmin: 10, xmax: 20, xip: vec![] }));
        assert_eq!(XidSnapshot::parse("10:20:15,12"), Some(XidSnapshot { xmin: 10, xmax: 20, xip: vec![12, 15] }));
        assert_eq!(XidSnapshot::parse("20:10:"), None);
        assert_eq!(XidSnapshot::parse("a:b:"), None);
        assert_eq!(XidSnapshot::parse("10:20"), None);
    }

    #[test]
    fn visibility() {
        let s = XidSnapshot::parse("10:20:12,15").unwrap();
        for (xid, visible) in [(9, true), (10, true), (11, true), (12, false), (15, false), (19, true), (20, false)] {
            assert_eq!(s.visible(xid), visible, "xid {xid}");
        }
    }

    #[test]
    fn widening_follows_the_epoch() {
        let epoch = 1u64 << 32;
        assert_eq!(widen_xid(5, 10), 5);
        assert_eq!(widen_xid(5, 3 * epoch + 10), 3 * epoch + 5);
        // Just before a wraparound, xids just after it belong to the next epoch ...
        assert_eq!(widen_xid(3, 3 * epoch + u64::from(u32::MAX) - 2), 4 * epoch + 3);
        // ... and just after it, xids just before it to the previous one.
        assert_eq!(widen_xid(u32::MAX - 2, 4 * epoch + 3), 3 * epoch + u64::from(u32::MAX) - 2);
        // Epoch 0 has no previous epoch.
        assert_eq!(widen_xid(u32::MAX, 3), u64::from(u32::MAX));
    }

    #[test]
    fn filter_checks_only_before_the_snapshot_position() {
        let epoch = 1u64 << 32;
        let f = SnapshotFilter {
            snapshot: XidSnapshot { xmin: 2 * epoch + 100, xmax: 2 * epoch + 110, xip: vec![2 * epoch + 105] },
            until_lsn: 1_000,
        };
        assert!(f.contains(99, 900));
        assert!(f.contains(104, 900));
        assert!(!f.contains(105, 900));
        assert!(!f.contains(110, 900));
        assert!(!f.contains(99, 1_000));
    }
}
