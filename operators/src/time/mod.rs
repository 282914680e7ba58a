//! Event time: timestamps, durations and the allowed lateness of an
//! operator; at the edges of a dataflow, the watermark strategies of sources
//! and human-readable durations for configuration.
//!
//! A highwater timestamp is event time in milliseconds since the Unix epoch.
//! Timely's frontier *is* the watermark: when the frontier of an operator's
//! input has passed `t`, no record will arrive there with a timely time below
//! `t`. Every record also carries its own event time (see
//! [`EventStream`](crate::EventStream)), which is below its timely time exactly
//! when the record was late where it was read.
//!
//! The operators' view of time is [`Timestamp`], [`Diff`], [`END_OF_TIME`],
//! [`DurationExt`], [`AllowedLateness`] and [`watermark_of`]. At the edges,
//! a source partition turns the event times it reads into a watermark with a
//! [`WatermarkStrategy`] ([`PartitionWatermark`]), and configuration writes
//! durations as `4s` or `250ms` ([`parse_duration`], [`Millis`]). The
//! `highwater` crate re-exports this module as `highwater::time`.

// The operators' time is here; watermark strategies are in `watermark.rs`,
// durations in text in `duration.rs`.
mod duration;
mod watermark;

pub use duration::{duration_text, parse_duration, DurationError, IntoMillis, Millis};
pub use watermark::{CustomWatermark, PartitionWatermark, WatermarkStrategy};

use serde::{Deserialize, Serialize};

/// Event time in milliseconds since the Unix epoch (UTC).
pub type Timestamp = u64;

/// The multiplicity change of a record: `+1` for an insertion, `-1` for a
/// retraction, as in differential dataflow.
pub type Diff = i64;

/// The largest timestamp; a watermark at `END_OF_TIME` means the input is done.
pub const END_OF_TIME: Timestamp = u64::MAX;

/// Durations in event-time milliseconds, written the way people say them.
///
/// # Examples
/// ```
/// use highwater_operators::DurationExt;
/// assert_eq!(10.secs(), 10_000);
/// assert_eq!(2.minutes(), 120_000);
/// assert_eq!(250.millis(), 250);
/// ```
pub trait DurationExt {
    /// This many milliseconds.
    fn millis(self) -> u64;
    /// This many seconds, in milliseconds.
    fn secs(self) -> u64;
    /// This many minutes, in milliseconds.
    fn minutes(self) -> u64;
    /// This many hours, in milliseconds.
    fn hours(self) -> u64;
}

impl DurationExt for u64 {
    fn millis(self) -> u64 {
        self
    }
    fn secs(self) -> u64 {
        self * 1_000
    }
    fn minutes(self) -> u64 {
        self * 60_000
    }
    fn hours(self) -> u64 {
        self * 3_600_000
    }
}

impl DurationExt for i32 {
    fn millis(self) -> u64 {
        u64::try_from(self).expect("a duration is not negative")
    }
    fn secs(self) -> u64 {
        self.millis() * 1_000
    }
    fn minutes(self) -> u64 {
        self.millis() * 60_000
    }
    fn hours(self) -> u64 {
        self.millis() * 3_600_000
    }
}

/// How long after a window's end late records still update its result.
///
/// A record that arrives after the watermark passed its window's end, but
/// before the watermark passed `end + allowed lateness`, retracts the result
/// already emitted and emits the corrected one. Later records go to the
/// operator's [`LateOutput`](crate::LateOutput). The default is zero: a window
/// is final when it fires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AllowedLateness(pub u64);

/// The timely configuration entry that holds a job-wide allowed lateness.
const DEFAULT_LATENESS_KEY: &str = "highwater.allowed_lateness";

impl AllowedLateness {
    /// No lateness: results are final when first emitted.
    pub const ZERO: AllowedLateness = AllowedLateness(0);

    /// Makes `self` the allowed lateness of every operator of the
    /// computation started with `config` that is not given one of its own
    /// ([`EventStream::allowed_lateness`](crate::EventStream::allowed_lateness)):
    /// windows, patterns, upsert tables, as-of, interval and window joins
    /// (`highwater::Job::allowed_lateness` calls it).
    ///
    /// ```
    /// use highwater_operators::time::AllowedLateness;
    /// let mut config = timely::WorkerConfig::default();
    /// AllowedLateness(5_000).configure(&mut config);
    /// assert_eq!(AllowedLateness::of_config(&config), AllowedLateness(5_000));
    /// assert_eq!(AllowedLateness::of_config(&timely::WorkerConfig::default()), AllowedLateness::ZERO);
    /// ```
    pub fn configure(self, config: &mut timely::WorkerConfig) {
        config.set(DEFAULT_LATENESS_KEY.to_owned(), self);
    }

    /// The job-wide allowed lateness of a worker's configuration
    /// ([`configure`](Self::configure)), or zero.
    pub fn of_config(config: &timely::WorkerConfig) -> AllowedLateness {
        config.get::<AllowedLateness>(DEFAULT_LATENESS_KEY).copied().unwrap_or(AllowedLateness::ZERO)
    }

    /// The allowed lateness of an operator built in `scope` without one of
    /// its own: the job's ([`configure`](Self::configure)), or zero.
    pub fn default_of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> AllowedLateness {
        Self::of_config(scope.worker().config())
    }

    /// The watermark at which state that completes at `complete_at` can be
    /// released: `complete_at + lateness`, saturating at the end of time.
    pub fn release_at(self, complete_at: Timestamp) -> Timestamp {
        complete_at.saturating_add(self.0)
    }
}

impl From<u64> for AllowedLateness {
    fn from(ms: u64) -> Self {
        AllowedLateness(ms)
    }
}

/// The watermark an input frontier stands for: its least time, or
/// [`END_OF_TIME`] once the input is complete.
pub fn watermark_of(frontier: &timely::progress::frontier::MutableAntichain<Timestamp>) -> Timestamp {
    frontier.frontier().as_option().copied().unwrap_or(END_OF_TIME)
}

/// The timely time of a received message: the least element of its stamp.
///
/// highwater operators only send messages under a single capability, so the
/// stamp is never empty.
pub(crate) fn arrival_time(cap: &timely::dataflow::operators::InputCapability<Timestamp>) -> Timestamp {
    *cap.least().expect("highwater messages travel under a capability (non-empty stamp)")
}
