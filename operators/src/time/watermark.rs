//! Watermark strategies: how a source partition turns the event times it has
//! seen into a watermark.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// How a partition's watermark follows the event times it reads.
///
/// The watermark of a source is the minimum over its partitions' watermarks,
/// leaving out partitions that have been idle (no record) for longer than the
/// idle timeout. A record whose event time is below its partition's watermark
/// is *late*.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WatermarkStrategy {
    /// `max event time seen − bound` (the default, with a 4 s bound as in the
    /// Nexmark suite).
    BoundedOutOfOrderness {
        /// The delay in ms.
        bound: u64,
    },
    /// `max event time seen`: the input is in event-time order.
    Monotonous,
    /// No watermark until the partition ends: everything waits for the end of
    /// input (useful for bounded inputs in arbitrary order).
    AtEnd,
    /// A function of the greatest event time seen (`None` before any record),
    /// e.g. a delay that depends on the time of day. It must not decrease as its
    /// argument grows: watermarks only advance. Not part of serialized configuration.
    #[serde(skip)]
    Custom(CustomWatermark),
}

/// The function of a [`WatermarkStrategy::Custom`].
///
/// ```
/// use highwater_operators::time::{CustomWatermark, WatermarkStrategy};
/// // Bounded out-of-orderness, but never ahead of a fixed cut-over time.
/// let strategy = WatermarkStrategy::Custom(CustomWatermark::new(|max| max.map_or(0, |m| m.saturating_sub(500).min(10_000))));
/// assert_eq!(strategy.watermark(Some(2_000)), 1_500);
/// assert_eq!(strategy.watermark(Some(20_000)), 10_000);
/// ```
#[derive(Clone)]
pub struct CustomWatermark(Arc<dyn Fn(Option<Timestamp>) -> Timestamp + Send + Sync>);

impl CustomWatermark {
    /// Wraps `f`, which maps the greatest event time seen to the watermark.
    pub fn new(f: impl Fn(Option<Timestamp>) -> Timestamp + Send + Sync + 'static) -> Self {
        CustomWatermark(Arc::new(f))
    }
}

impl std::fmt::Debug for CustomWatermark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CustomWatermark(..)")
    }
}

/// Two custom strategies are equal when they are the same function.
impl PartialEq for CustomWatermark {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CustomWatermark {}

impl Default for WatermarkStrategy {
    fn default() -> Self {
        WatermarkStrategy::BoundedOutOfOrderness { bound: 4_000 }
    }
}

impl WatermarkStrategy {
    /// Bounded out-of-orderness: the watermark `bound` behind the greatest
    /// event time seen.
    pub fn bounded(bound: impl super::IntoMillis) -> Self {
        WatermarkStrategy::BoundedOutOfOrderness { bound: bound.into_millis() }
    }

    /// The watermark after seeing `max_seen` as the greatest event time.
    pub fn watermark(&self, max_seen: Option<Timestamp>) -> Timestamp {
        match (self, max_seen) {
            (WatermarkStrategy::Custom(f), max) => (f.0)(max),
            (_, None) | (WatermarkStrategy::AtEnd, _) => 0,
            (WatermarkStrategy::BoundedOutOfOrderness { bound }, Some(max)) => max.saturating_sub(*bound),
            (WatermarkStrategy::Monotonous, Some(max)) => max,
        }
    }
}

/// The watermark of one source partition, with idleness.
#[derive(Clone, Debug)]
pub struct PartitionWatermark {
    strategy: WatermarkStrategy,
    max_seen: Option<Timestamp>,
    last_record: Instant,
    idle_timeout: Option<Duration>,
    floor: Timestamp,
}

impl PartitionWatermark {
    /// A partition that has seen nothing yet.
    pub fn new(strategy: WatermarkStrategy, idle_timeout: Option<Duration>) -> Self {
        PartitionWatermark { strategy, max_seen: None, last_record: Instant::now(), idle_timeout, floor: 0 }
    }

    /// Takes a record's event time into account.
    #[inline]
    pub fn observe(&mut self, time: Timestamp) {
        if self.max_seen.is_none_or(|m| time > m) {
            self.max_seen = Some(time);
        }
    }

    /// Raises the watermark to at least `bound`: the source promises that no
    /// later record of the partition has an earlier event time (e.g. a change
    /// stream that has caught up with its database at that time).
    pub fn advance_to(&mut self, bound: Timestamp) {
        self.floor = self.floor.max(bound);
    }

    /// Notes that records arrived now (the partition is active).
    pub fn touch(&mut self, now: Instant) {
        self.last_record = now;
    }

    /// The current watermark.
    pub fn current(&self) -> Timestamp {
        self.strategy.watermark(self.max_seen).max(self.floor)
    }

    /// Whether the partition has had no record for longer than the idle timeout.
    pub fn is_idle(&self, now: Instant) -> bool {
        self.idle_timeout.is_some_and(|t| now.duration_since(self.last_record) > t)
    }

    /// The greatest event time seen, if any.
    pub fn max_seen(&self) -> Option<Timestamp> {
        self.max_seen
    }

    /// The floor raised by [`advance_to`](Self::advance_to).
    pub fn floor(&self) -> Timestamp {
        self.floor
    }

    /// Resumes from a checkpointed state: the greatest event time seen and the floor.
    pub fn restore(&mut self, max_seen: Option<Timestamp>, floor: Timestamp) {
        self.max_seen = max_seen;
        self.floor = floor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lags_the_maximum() {
        let mut w = PartitionWatermark::new(WatermarkStrategy::bounded(4_000), None);
        assert_eq!(w.current(), 0);
        w.observe(10_000);
        w.observe(7_000);
        assert_eq!(w.current(), 6_000);
    }

    #[test]
    fn idleness_needs_a_timeout() {
        let w = PartitionWatermark::new(WatermarkStrategy::Monotonous, Some(Duration::from_millis(0)));
        std::thread::sleep(Duration::from_millis(2));
        assert!(w.is_idle(Instant::now()));
        let w = PartitionWatermark::new(WatermarkStrategy::Monotonous, None);
        assert!(!w.is_idle(Instant::now()));
    }
}
