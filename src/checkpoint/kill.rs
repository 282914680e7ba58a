//! Deterministic kill points for crash tests.
//!
//! `HIGHWATER_KILL_AT=POINT:N` makes the process SIGKILL itself the `N`-th
//! time it reaches `POINT` (1-based): `shard-write` (a shard file put into the
//! store), `manifest-write` (half of the manifest's temporary file written),
//! `sink-commit` (the manifest is in place, the sink's parts not yet renamed),
//! `database-put` (a checkpoint's shards and database files are in the
//! store, its manifest not yet).
//! Without the variable these are no-ops.
//!
//! Fault injection for the crash tests only: compiled in with the cargo
//! feature `fault-injection` (which the test command enables). In every other
//! build [`point`] is an empty function and the variable is ignored.

#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "fault-injection")]
use std::sync::OnceLock;

/// The configured kill point and count, read once.
#[cfg(feature = "fault-injection")]
fn target() -> Option<&'static (String, u64)> {
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let spec = std::env::var("HIGHWATER_KILL_AT").ok()?;
            let (point, n) = spec.split_once(':')?;
            Some((point.to_owned(), n.parse().ok()?))
        })
        .as_ref()
}

/// Marks that `point` was reached; kills the process if it is the configured one.
#[cfg(feature = "fault-injection")]
pub(crate) fn point(point: &str) {
    static REACHED: AtomicU64 = AtomicU64::new(0);
    if let Some((p, n)) = target() {
        if p == point && REACHED.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            tracing::warn!("HIGHWATER_KILL_AT: killing the process at {point} #{n}");
            // SAFETY: signals this very process; nothing is left to clean up.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// Marks that `point` was reached: nothing, without fault injection.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn point(_point: &str) {}
