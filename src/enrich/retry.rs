//! Retries with exponential backoff and full jitter: the wait before retry
//! `n` is drawn uniformly from `[0, min(max, initial · 2ⁿ⁻¹)]`, so that the
//! callers a failure hit at once do not all retry at once (AWS's "full
//! jitter").
//!
//! ```
//! use std::time::Duration;
//! use highwater::enrich::Backoff;
//!
//! let mut backoff = Backoff::new(3, Duration::from_millis(100), Duration::from_secs(1), 7);
//! let waits: Vec<Duration> = std::iter::from_fn(|| backoff.next_wait()).collect();
//! assert_eq!(waits.len(), 3, "three retries, then give up");
//! assert!(waits[0] <= Duration::from_millis(100));
//! assert!(waits[2] <= Duration::from_millis(400));
//! ```

use std::time::Duration;

/// The waits between the attempts of one call: see the [module](self).
#[derive(Clone, Debug)]
pub struct Backoff {
    retries: u32,
    initial: Duration,
    max: Duration,
    /// Retries made so far.
    made: u32,
    /// A splitmix64 state: the jitter is reproducible from the seed.
    rng: u64,
}

impl Backoff {
    /// At most `retries` retries, the first after at most `initial`, each
    /// bound doubling up to `max`; the jitter drawn from `seed`.
    pub fn new(retries: u32, initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff { retries, initial, max: max.max(initial), made: 0, rng: seed }
    }

    /// The upper bound of the wait before retry `n` (from 1).
    pub fn bound(&self, n: u32) -> Duration {
        self.initial.saturating_mul(1u32 << n.saturating_sub(1).min(20)).min(self.max)
    }

    /// The wait before the next retry, or `None` once every retry is spent.
    pub fn next_wait(&mut self) -> Option<Duration> {
        if self.made >= self.retries {
            return None;
        }
        self.made += 1;
        let bound = self.bound(self.made).as_nanos() as u64;
        Some(Duration::from_nanos(if bound == 0 { 0 } else { self.next_u64() % (bound + 1) }))
    }

    /// The same policy afresh (no retry made) with its jitter drawn from
    /// its seed mixed with `salt` (e.g. a record's sequence number), so
    /// that records failing together retry at different moments.
    pub fn reseed(mut self, salt: u64) -> Self {
        self.made = 0;
        self.rng ^= salt.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self
    }

    /// Retries made so far.
    pub fn retries_made(&self) -> u32 {
        self.made
    }

    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every wait lies within its doubling bound, there are exactly
        /// `retries` of them, and the same seed gives the same waits.
        #[test]
        fn waits_lie_within_their_bounds(retries in 0u32..30, initial in 0u64..500, max in 0u64..5_000, seed: u64) {
            let (initial, max) = (Duration::from_millis(initial), Duration::from_millis(max));
            let mut b = Backoff::new(retries, initial, max, seed);
            let waits: Vec<Duration> = std::iter::from_fn(|| b.next_wait()).collect();
            prop_assert_eq!(waits.len(), retries as usize);
            for (i, w) in waits.iter().enumerate() {
                let bound = (initial * 2u32.saturating_pow(i as u32)).min(max.max(initial));
                prop_assert!(*w <= bound, "retry {}: {:?} > {:?}", i + 1, w, bound);
            }
            let mut again = Backoff::new(retries, initial, max, seed);
            prop_assert_eq!(waits, std::iter::from_fn(|| again.next_wait()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let waits: Vec<Duration> = (0..64)
            .map(|seed| Backoff::new(1, Duration::from_secs(1), Duration::from_secs(1), seed).next_wait().unwrap())
            .collect();
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(distinct.len() > 60, "64 callers draw (almost) 64 different waits");
        assert!(
            waits.iter().any(|w| *w < Duration::from_millis(500))
                && waits.iter().any(|w| *w > Duration::from_millis(500))
        );
    }
}
