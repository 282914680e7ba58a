//! A circuit breaker: stop calling a service that keeps failing, and probe
//! it before trusting it again.
//!
//! - **Closed**: every call is made. A failure is remembered for
//!   [`BreakerConfig::window`]; when [`BreakerConfig::failures`] of them lie
//!   within the window, the breaker opens. Rates can open it too, as
//!   Resilience4j's do: with [`BreakerConfig::failure_rate`], when at least
//!   [`BreakerConfig::minimum_calls`] outcomes lie within the window and that
//!   share of them failed; with [`BreakerConfig::slow_calls`], when that
//!   share of them took longer than its threshold (a slow call is reported
//!   with its duration: [`CircuitBreaker::outcome`]).
//! - **Open** for [`BreakerConfig::open_for`]: no call is made; the caller
//!   sends the record to its side output with the reason
//!   ([`Admission::Rejected`]) instead of waiting.
//! - **Half-open** after that: up to [`BreakerConfig::probes`] calls at a time
//!   are let through as probes. As many successful probes close the breaker
//!   (its failures forgotten); a failed probe (or, with
//!   [`BreakerConfig::slow_calls`], a slow one) opens it again.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use highwater::enrich::{Admission, BreakerConfig, BreakerState, CircuitBreaker, SlowCalls};
//!
//! let config = BreakerConfig {
//!     failures: 2,
//!     window: Duration::from_secs(10),
//!     open_for: Duration::from_secs(1),
//!     probes: 1,
//!     ..BreakerConfig::default()
//! };
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
//!
//! // Half of at least 4 calls in 10 s slower than 1 s opens it as well.
//! let slow = SlowCalls { longer_than: Duration::from_secs(1), rate: 0.5 };
//! let config = BreakerConfig { failures: u32::MAX, slow_calls: Some(slow), minimum_calls: 4, ..BreakerConfig::default() };
//! let mut breaker = CircuitBreaker::new(config);
//! for took in [100, 1_500, 200, 2_000] {
//!     breaker.outcome(t0, Duration::from_millis(took), true);
//! }
//! assert!(matches!(breaker.state(), BreakerState::Open { .. }));
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// When a [`CircuitBreaker`] opens and how it recovers.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// The share of failed calls (0 to 1) among those within the window
    /// that opens the breaker (none: no rate rule).
    pub failure_rate: Option<f64>,
    /// The share of slow calls among those within the window that opens the
    /// breaker, and what is slow (none: no rule).
    pub slow_calls: Option<SlowCalls>,
    /// The outcomes within the window before a rate is judged (at least 1).
    pub minimum_calls: u32,
}

/// Calls that take long: see [`BreakerConfig::slow_calls`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowCalls {
    /// A call that took longer than this (succeeded or not) is slow.
    pub longer_than: Duration,
    /// The share of slow calls (0 to 1) that opens the breaker.
    pub rate: f64,
}

impl Default for BreakerConfig {
    /// 5 failures within 10 s open the breaker for 5 s; 1 probe; no rate
    /// rule (rates judged on at least 10 calls when set).
    fn default() -> Self {
        BreakerConfig {
            failures: 5,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
            probes: 1,
            failure_rate: None,
            slow_calls: None,
            minimum_calls: 10,
        }
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
    /// The outcomes that still count for the rates, oldest first (closed,
    /// with a rate rule): when, failed, slow.
    outcomes: VecDeque<(Instant, bool, bool)>,
    /// How many of `outcomes` failed, and how many were slow.
    failed_slow: (usize, usize),
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let config = BreakerConfig {
            failures: config.failures.max(1),
            probes: config.probes.max(1),
            minimum_calls: config.minimum_calls.max(1),
            ..config
        };
        CircuitBreaker {
            config,
            state: BreakerState::Closed,
            failures: VecDeque::new(),
            outcomes: VecDeque::new(),
            failed_slow: (0, 0),
        }
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

    /// A call admitted earlier succeeded at `now` (not slow).
    pub fn success(&mut self, now: Instant) {
        self.outcome(now, Duration::ZERO, true);
    }

    /// A call admitted earlier failed (or timed out) at `now` (not slow).
    pub fn failure(&mut self, now: Instant) {
        self.outcome(now, Duration::ZERO, false);
    }

    /// A call admitted earlier ended at `now` after `took`, successfully
    /// (`ok`) or not.
    pub fn outcome(&mut self, now: Instant, took: Duration, ok: bool) {
        let slow = self.config.slow_calls.is_some_and(|s| took > s.longer_than);
        match &mut self.state {
            BreakerState::Closed => {
                let window = self.config.window;
                let counts = |at: &Instant| now.saturating_duration_since(*at) < window;
                if !ok {
                    self.failures.push_back(now);
                    while self.failures.front().is_some_and(|f| !counts(f)) {
                        self.failures.pop_front();
                    }
                }
                if self.config.failure_rate.is_some() || self.config.slow_calls.is_some() {
                    self.outcomes.push_back((now, !ok, slow));
                    self.failed_slow.0 += usize::from(!ok);
                    self.failed_slow.1 += usize::from(slow);
                    while let Some(&(_, failed, slow)) = self.outcomes.front().filter(|(at, _, _)| !counts(at)) {
                        self.outcomes.pop_front();
                        self.failed_slow.0 -= usize::from(failed);
                        self.failed_slow.1 -= usize::from(slow);
                    }
                }
                if self.failures.len() >= self.config.failures as usize || self.rate_reached() {
                    self.open(now);
                }
            }
            BreakerState::HalfOpen { .. } if !ok || slow => self.open(now),
            BreakerState::HalfOpen { in_flight, succeeded } => {
                *in_flight = in_flight.saturating_sub(1);
                *succeeded += 1;
                if *succeeded >= self.config.probes {
                    self.state = BreakerState::Closed;
                    self.forget();
                }
            }
            // A call admitted before the breaker opened, answered late.
            BreakerState::Open { .. } => {}
        }
    }

    /// Whether the outcomes within the window reach a rate rule.
    fn rate_reached(&self) -> bool {
        let calls = self.outcomes.len();
        if calls < self.config.minimum_calls as usize {
            return false;
        }
        let share = |n: usize| n as f64 / calls as f64;
        let (failed, slow) = self.failed_slow;
        self.config.failure_rate.is_some_and(|r| share(failed) >= r)
            || self.config.slow_calls.is_some_and(|s| share(slow) >= s.rate)
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open { until: now + self.config.open_for };
        self.forget();
    }

    /// Forgets the outcomes counted so far.
    fn forget(&mut self) {
        self.failures.clear();
        self.outcomes.clear();
        self.failed_slow = (0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What happens to the breaker: time passes (ms), a call is asked for,
    /// or the oldest admitted call succeeds or fails after some ms.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Wait(u64),
        Ask,
        Succeed(u64),
        Fail(u64),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            (0u64..400).prop_map(Step::Wait),
            Just(Step::Ask),
            Just(Step::Ask),
            Just(Step::Ask),
            (0u64..200).prop_map(Step::Succeed),
            (0u64..200).prop_map(Step::Succeed),
            (0u64..200).prop_map(Step::Fail),
        ];
        prop::collection::vec(step, 0..160)
    }

    /// The naive model: the whole history, scanned at every step.
    #[derive(Debug, Default)]
    struct Model {
        /// Outcomes since the breaker last closed or opened: when (ms),
        /// failed, took (ms).
        outcomes: Vec<(u64, bool, u64)>,
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
        fn outcome(&mut self, now: u64, took: u64, success: bool, c: &BreakerConfig) {
            if self.opened_at.is_some() {
                return;
            }
            let slow = |took: u64| c.slow_calls.is_some_and(|s| took > s.longer_than.as_millis() as u64);
            match &mut self.half {
                None => {
                    self.outcomes.push((now, !success, took));
                    let window = c.window.as_millis() as u64;
                    let recent: Vec<_> = self.outcomes.iter().filter(|o| now - o.0 < window).collect();
                    let failed = recent.iter().filter(|o| o.1).count();
                    let slow = recent.iter().filter(|o| slow(o.2)).count();
                    let n = recent.len() as f64;
                    let rates = recent.len() >= c.minimum_calls.max(1) as usize
                        && (c.failure_rate.is_some_and(|r| failed as f64 / n >= r)
                            || c.slow_calls.is_some_and(|s| slow as f64 / n >= s.rate));
                    if failed >= c.failures as usize || rates {
                        self.opened_at = Some(now);
                        self.outcomes.clear();
                    }
                }
                Some((out, ok)) if success && !slow(took) => {
                    *out = out.saturating_sub(1);
                    *ok += 1;
                    if *ok >= c.probes {
                        self.half = None;
                        self.outcomes.clear();
                    }
                }
                Some(_) => {
                    self.half = None;
                    self.opened_at = Some(now);
                    self.outcomes.clear();
                }
            }
        }
    }

    proptest! {
        /// The breaker admits and rejects exactly as the naive model does,
        /// with and without the rate rules.
        #[test]
        fn matches_the_naive_model(
            steps in steps(),
            failures in prop_oneof![1u32..4, Just(u32::MAX)],
            window in 1u64..1000,
            open_for in 1u64..1000,
            probes in 1u32..3,
            failure_rate in prop::option::of(0.2f64..0.9),
            slow_calls in prop::option::of((0u64..150, 0.2f64..0.9)),
            minimum_calls in 0u32..6,
        ) {
            let config = BreakerConfig {
                failures,
                window: Duration::from_millis(window),
                open_for: Duration::from_millis(open_for),
                probes,
                failure_rate,
                slow_calls: slow_calls.map(|(ms, rate)| SlowCalls { longer_than: Duration::from_millis(ms), rate }),
                minimum_calls,
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
                    Step::Succeed(took) | Step::Fail(took) => {
                        // Outcomes of calls made before the breaker changed
                        // state are reported too: the model ignores them the same way.
                        let Some(_) = out.pop_front() else { continue };
                        let success = matches!(step, Step::Succeed(_));
                        breaker.outcome(at, Duration::from_millis(took), success);
                        model.outcome(now, took, success, &config);
                    }
                }
            }
        }
    }

    /// A failure rate is judged on at least `minimum_calls` outcomes, and
    /// only on those within the window.
    #[test]
    fn rates_wait_for_the_minimum_calls_and_count_within_the_window() {
        let config = BreakerConfig {
            failures: u32::MAX,
            window: Duration::from_secs(1),
            failure_rate: Some(0.5),
            minimum_calls: 4,
            ..BreakerConfig::default()
        };
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut breaker = CircuitBreaker::new(config);
        // Three failures of three calls: too few calls to judge.
        for n in 0..3 {
            breaker.failure(ms(n));
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
        // A second later they no longer count: 1 failure of 4 is 25 %.
        for n in 0..3 {
            breaker.success(ms(1_000 + n));
        }
        breaker.failure(ms(1_003));
        assert_eq!(breaker.state(), BreakerState::Closed);
        // 2 of 5: 40 %; 3 of 6: 50 % opens it.
        breaker.failure(ms(1_004));
        assert_eq!(breaker.state(), BreakerState::Closed);
        breaker.failure(ms(1_005));
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
    }

    /// A slow probe opens the breaker again when slow calls count.
    #[test]
    fn a_slow_probe_reopens() {
        let slow = SlowCalls { longer_than: Duration::from_millis(100), rate: 1.0 };
        let config = BreakerConfig { failures: 1, slow_calls: Some(slow), ..BreakerConfig::default() };
        let t0 = Instant::now();
        let mut breaker = CircuitBreaker::new(config);
        breaker.failure(t0);
        let later = t0 + config.open_for;
        assert_eq!(breaker.admit(later), Admission::Probe);
        breaker.outcome(later, Duration::from_millis(150), true);
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
        let again = later + config.open_for;
        assert_eq!(breaker.admit(again), Admission::Probe);
        breaker.outcome(again, Duration::from_millis(50), true);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
