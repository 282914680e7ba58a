//! Helpers of the crash tests: scratch directories and replayable kill times.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

/// A scratch directory, removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    /// `$TMPDIR/highwater-{suite}-{name}-{pid}`, empty.
    pub(crate) fn new(suite: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("highwater-{suite}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: kill times that a seed replays.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A duration in `[lo, hi)` ms.
    pub(crate) fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// The seed of the kill times: `HIGHWATER_CRASH_SEED`, or the clock (printed, to replay a run).
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("HIGHWATER_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("HIGHWATER_CRASH_SEED={seed}");
    seed
}
