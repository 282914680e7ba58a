//! A circuit breaker: stop calling a service that keeps failing, and probe
//! it before trusting it again.
//!
//! - **Closed**: every call is made. A failure is remembered for
//!   [`BreakerConfig::window`]; when [`BreakerConfig::failures`] of them lie
//!   within the window, the breaker opens.
//! - **Open** for [`BreakerConfig::open_for`]: no call is made; the caller
//!   sends the record to its side output with the reason
//!   ([`Admission::Rejected`]) instead of waiting.
//! - **Half-open** after that: up to [`BreakerConfig::probes`] calls at a time
//!   are let through as probes. As many successful probes close the breaker
//!   (its failures forgotten); a failed probe opens it again.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use highwater::enrich::{Admission, BreakerConfig, BreakerState, CircuitBreaker};
//!
//! let config = BreakerConfig { failures: 2, window: Duration::from_secs(10), open_for: Duration::from_secs(1), probes: 1 };
//! let mut breaker = CircuitBreaker::new(config);
//! let t0 = Instant::now();
//! assert_eq!(breaker.admit(t0), Admission::Call);
//! breaker.failure(t0);
//! breaker.failure(t0 + Duration::from_millis(10));
//! assert!(matches!(breaker.state(), BreakerState::Open { .. }));
//! assert!(matches!(breaker.admit(t0 + Duration::from_millis(20)), Admission::Rejected { .. }));
//! // A second later one probe goes through; its success closes the breaker.
//! let t1 = t0 + Duration::from_millis(1_010);
//! assert_eq!(breaker.admit(t1), Admission::Probe);
//! assert!(matches!(breaker.admit(t1), Admission::Rejected { .. }), "one probe at a time");
//! breaker.success(t1);
//! assert_eq!(breaker.state(), BreakerState::Closed);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// When a [`CircuitBreaker`] opens and how it recovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Failures within [`window`](Self::window) that open the breaker (at least 1).
    pub failures: u32,
    /// How long a failure counts.
    pub window: Duration,
    /// How long the breaker stays open before it probes.
    pub open_for: Duration,
    /// Probes let through at a time when half-open, and the successes that
    /// close it (at least 1).
    pub probes: u32,
}

impl Default for BreakerConfig {
    /// 5 failures within 10 s open the breaker for 5 s; 1 probe.
    fn default() -> Self {
        BreakerConfig { failures: 5, window: Duration::from_secs(10), open_for: Duration::from_secs(5), probes: 1 }
    }
}

/// Where a breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls are made.
    Closed,
    /// No call is made before `until`.
    Open {
        /// When the breaker turns half-open.
        until: Instant,
    },
    /// Probes are let through.
    HalfOpen {
        /// Probes made and not yet answered.
        in_flight: u32,
        /// Probes that succeeded.
        succeeded: u32,
    },
}

/// What a caller may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Call (the breaker is closed).
    Call,
    /// Call as a probe (half-open): report its outcome.
    Probe,
    /// Do not call: the breaker is open (or its probes are all out).
    Rejected {
        /// When a call may be admitted again, at the earliest (the end of
        /// the open period; `None` while probes are out).
        retry_at: Option<Instant>,
    },
}

/// A circuit breaker driven by the outcomes of calls; see the [module](self).
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: BreakerState,
    /// The instants of the failures that still count, oldest first (closed).
    failures: VecDeque<Instant>,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let config = BreakerConfig { failures: config.failures.max(1), probes: config.probes.max(1), ..config };
        CircuitBreaker { config, state: BreakerState::Closed, failures: VecDeque::new() }
    }

    /// Where the breaker stands (as of the last call made to it).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Whether a call may be made at `now`; an open breaker whose time is up
    /// turns half-open here.
    pub fn admit(&mut self, now: Instant) -> Admission {
        if let BreakerState::Open { until } = self.state {
            if now < until {
                return Admission::Rejected { retry_at: Some(until) };
            }
            self.state = BreakerState::HalfOpen { in_flight: 0, succeeded: 0 };
        }
        match &mut self.state {
            BreakerState::Closed => Admission::Call,
            BreakerState::HalfOpen { in_flight, succeeded } => {
                if *in_flight + *succeeded < self.config.probes {
                    *in_flight += 1;
                    Admission::Probe
                } else {
                    Admission::Rejected { retry_at: None }
                }
            }
            BreakerState::Open { .. } => unreachable!("turned half-open above"),
        }
    }

    /// A call admitted earlier succeeded at `now`.
    pub fn success(&mut self, _now: Instant) {
        if let BreakerState::HalfOpen { in_flight, succeeded } = &mut self.state {
            *in_flight = in_flight.saturating_sub(1);
            *succeeded += 1;
            if *succeeded >= self.config.probes {
                self.state = BreakerState::Closed;
                self.failures.clear();
            }
        }
    }

    /// A call admitted earlier failed (or timed out) at `now`.
    pub fn failure(&mut self, now: Instant) {
        match self.state {
            BreakerState::Closed => {
                self.failures.push_back(now);
                while self.failures.front().is_some_and(|f| now.saturating_duration_since(*f) >= self.config.window) {
                    self.failures.pop_front();
                }
                if self.failures.len() >= self.config.failures as usize {
                    self.open(now);
                }
            }
            BreakerState::HalfOpen { .. } => self.open(now),
            // A call admitted before the breaker opened, answered late.
            BreakerState::Open { .. } => {}
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open { until: now + self.config.open_for };
        self.failures.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What happens to the breaker: time passes (ms), a call is asked for,
    /// or the oldest admitted call succeeds or fails.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Wait(u64),
        Ask,
        Succeed,
        Fail,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            (0u64..400).prop_map(Step::Wait),
            Just(Step::Ask),
            Just(Step::Ask),
            Just(Step::Succeed),
            Just(Step::Fail),
            Just(Step::Fail),
        ];
        prop::collection::vec(step, 0..120)
    }

    /// The naive model: the whole history, scanned at every step.
    #[derive(Debug, Default)]
    struct Model {
        /// Failures since the breaker last closed or opened, in ms.
        failures: Vec<u64>,
        opened_at: Option<u64>,
        /// Half-open since this instant, with probes out and succeeded.
        half: Option<(u32, u32)>,
    }

    impl Model {
        fn admit(&mut self, now: u64, c: &BreakerConfig) -> &'static str {
            if let Some(at) = self.opened_at {
                if now < at + c.open_for.as_millis() as u64 {
                    return "rejected";
                }
                self.opened_at = None;
                self.half = Some((0, 0));
            }
            match &mut self.half {
                None => "call",
                Some((out, ok)) if *out + *ok < c.probes => {
                    *out += 1;
                    "probe"
                }
                Some(_) => "rejected",
            }
        }
        fn outcome(&mut self, now: u64, success: bool, c: &BreakerConfig) {
            if self.opened_at.is_some() {
                return;
            }
            match (&mut self.half, success) {
                (None, true) => {}
                (None, false) => {
                    self.failures.push(now);
                    let window = c.window.as_millis() as u64;
                    let recent = self.failures.iter().filter(|f| now - **f < window).count();
                    if recent >= c.failures as usize {
                        self.opened_at = Some(now);
                        self.failures.clear();
                    }
                }
                (Some((out, ok)), true) => {
                    *out = out.saturating_sub(1);
                    *ok += 1;
                    if *ok >= c.probes {
                        self.half = None;
                        self.failures.clear();
                    }
                }
                (Some(_), false) => {
                    self.half = None;
                    self.opened_at = Some(now);
                    self.failures.clear();
                }
            }
        }
    }

    proptest! {
        /// The breaker admits and rejects exactly as the naive model does.
        #[test]
        fn matches_the_naive_model(
            steps in steps(),
            failures in 1u32..4,
            window in 1u64..1000,
            open_for in 1u64..1000,
            probes in 1u32..3,
        ) {
            let config = BreakerConfig {
                failures,
                window: Duration::from_millis(window),
                open_for: Duration::from_millis(open_for),
                probes,
            };
            let t0 = Instant::now();
            let mut breaker = CircuitBreaker::new(config);
            let mut model = Model::default();
            let mut now = 0u64;
            // Calls admitted and not answered: whether each was a probe.
            let mut out: VecDeque<bool> = VecDeque::new();
            for step in steps {
                let at = t0 + Duration::from_millis(now);
                match step {
                    Step::Wait(ms) => now += ms,
                    Step::Ask => {
                        let got = breaker.admit(at);
                        let want = model.admit(now, &config);
                        let name = match got {
                            Admission::Call => "call",
                            Admission::Probe => "probe",
                            Admission::Rejected { .. } => "rejected",
                        };
                        prop_assert_eq!(name, want, "at {} ms", now);
                        if want != "rejected" {
                            out.push_back(want == "probe");
                        }
                    }
                    Step::Succeed | Step::Fail => {
                        // Outcomes of calls made before the breaker changed
                        // state are reported too: the model ignores them the same way.
                        let Some(_) = out.pop_front() else { continue };
                        let success = matches!(step, Step::Succeed);
                        if success { breaker.success(at) } else { breaker.failure(at) }
                        model.outcome(now, success, &config);
                    }
                }
            }
        }
    }
}
