//! The async enrichment operator ([`EnrichAsync::enrich_async`]): each
//! record handed to a user function that returns a future (a call to a
//! service), at most `capacity` calls in flight per worker, each with a
//! timeout, retries with backoff and a circuit breaker; the results in
//! input order or as they complete, every failure on a side output (or
//! turned into a fallback value), never dropped.
//!
//! Event time and exactly once: the operator holds its output capabilities
//! at the earliest time of a record it has taken and not yet answered, so
//! the watermark downstream never passes a call in flight, and a checkpoint
//! at time `T` completes only once every record before `T` has its answer
//! out. A recovery replays the records from `T` on from the sources, which
//! calls the service again for them: the service may see a call twice (as
//! with Flink's async I/O); make calls idempotent (a request id from the
//! record) where that matters.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use highwater_operators::flow::exchange;
use highwater_operators::key::Data;
use highwater_operators::{Counter, Diff, EventStream, Timestamp};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::{OutputBuilder, OutputBuilderSession};
use timely::dataflow::operators::Capability;
use timely::scheduling::SyncActivator;

use super::{Admission, Backoff, BreakerConfig, BreakerState, CircuitBreaker, EnrichRuntime};

/// Which errors are answers rather than failures of the service.
type Permanent = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How [`EnrichAsync::enrich_async`] calls: see each setter.
#[derive(Clone)]
pub struct AsyncOptions {
    name: String,
    capacity: usize,
    timeout: Duration,
    ordered: bool,
    retry: Option<Backoff>,
    breaker: Option<BreakerConfig>,
    permanent: Option<Permanent>,
}

impl std::fmt::Debug for AsyncOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncOptions")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("timeout", &self.timeout)
            .field("ordered", &self.ordered)
            .field("retry", &self.retry)
            .field("breaker", &self.breaker)
            .field("permanent", &self.permanent.is_some())
            .finish()
    }
}

impl AsyncOptions {
    /// Calls named `name` (the operator's name, and its counters'): at most
    /// 100 in flight per worker, a timeout of 5 s, results in input order,
    /// no retry, no breaker.
    pub fn new(name: impl Into<String>) -> Self {
        AsyncOptions {
            name: name.into(),
            capacity: 100,
            timeout: Duration::from_secs(5),
            ordered: true,
            retry: None,
            breaker: None,
            permanent: None,
        }
    }

    /// Errors for which `permanent(message)` is true are answers, not
    /// failures of the service (e.g. a 404 for an unknown user): the record
    /// goes to the failure path at once, without a retry, and the breaker
    /// counts the call as a success (the service did answer), as
    /// resilience4j's `ignoreExceptions`.
    pub fn permanent(mut self, permanent: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.permanent = Some(Arc::new(permanent));
        self
    }

    /// At most `capacity` calls in flight per worker (at least 1); when
    /// they are, the operator takes no input, and the sources slow down.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// Each attempt fails after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Results as the calls complete (Flink's `unorderedWait`) instead of
    /// in input order (`orderedWait`, the default). Either way no result
    /// falls behind the watermark: the operator holds it back until every
    /// call before it is answered.
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// Retries a failed or timed-out attempt after the waits `backoff`
    /// gives (each record starts from it afresh, its jitter drawn from the
    /// record's sequence number).
    pub fn retry(mut self, backoff: Backoff) -> Self {
        self.retry = Some(backoff);
        self
    }

    /// A circuit breaker around the calls of each worker: while it is open,
    /// records go to the failure path at once, without a call.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }
}

/// A record whose call failed for good: the record, why, and the attempts
/// made (0: the breaker was open).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Failed<D> {
    /// The record as it came in.
    pub record: D,
    /// The last attempt's error, its timeout, or the open breaker.
    pub reason: String,
    /// Calls made for it.
    pub attempts: u32,
}

/// What [`EnrichAsync::enrich_async`] gives: the results, the failures, and
/// counters.
pub struct Enriched<'scope, D: 'static, O: 'static> {
    /// Each answered record's result, at the record's event time and diff.
    pub results: EventStream<'scope, O>,
    /// Each record whose call failed for good, at its event time and diff.
    pub failures: EventStream<'scope, Failed<D>>,
    /// Counters of this process's workers (also in the job's totals as
    /// `<name>.calls`, `.retries`, `.timeouts`, `.failed`, `.rejected`,
    /// `.breaker_opened`, `.breaker_closed`, and the gauges `.in_flight`,
    /// `.breaker_open` and `.breaker_half_open`).
    pub counters: EnrichCounters,
}

impl<D, O> std::fmt::Debug for Enriched<'_, D, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enriched").field("counters", &self.counters).finish_non_exhaustive()
    }
}

impl<'scope, D: Data, O: Data> Enriched<'scope, D, O> {
    /// The results with every failure turned into a result by `fallback`
    /// (e.g. a default profile): one stream, nothing dropped.
    pub fn or_else(&self, fallback: impl Fn(&Failed<D>) -> O + 'static) -> EventStream<'scope, O> {
        self.results.concat(&self.failures.map(move |f| fallback(&f)))
    }
}

/// The counters of an enrichment operator (see [`Enriched::counters`]).
#[derive(Clone, Debug, Default)]
pub struct EnrichCounters {
    /// Attempts made (first calls and retries).
    pub calls: Counter,
    /// Retries made.
    pub retries: Counter,
    /// Attempts that timed out.
    pub timeouts: Counter,
    /// Records sent to the failure path (retries spent, or the breaker open).
    pub failed: Counter,
    /// Records failed without a call because the breaker was open.
    pub rejected: Counter,
    /// Times a breaker opened.
    pub breaker_opened: Counter,
    /// Times a breaker closed again.
    pub breaker_closed: Counter,
    /// Calls in flight now (a gauge).
    pub in_flight: Counter,
    /// 1 while this worker's breaker is open, else 0 (a gauge: summed over
    /// the workers in the job's totals, the number of breakers open).
    pub breaker_open: Counter,
    /// 1 while this worker's breaker is half-open (probing), else 0.
    pub breaker_half_open: Counter,
}

impl EnrichCounters {
    fn register(&self, scope: &timely::dataflow::Scope<'_, Timestamp>, name: &str) {
        let each = [
            ("calls", &self.calls),
            ("retries", &self.retries),
            ("timeouts", &self.timeouts),
            ("failed", &self.failed),
            ("rejected", &self.rejected),
            ("breaker_opened", &self.breaker_opened),
            ("breaker_closed", &self.breaker_closed),
            ("in_flight", &self.in_flight),
            ("breaker_open", &self.breaker_open),
            ("breaker_half_open", &self.breaker_half_open),
        ];
        for (what, counter) in each {
            highwater_operators::totals::Totals::count_in(scope, &format!("{name}.{what}"), counter);
        }
    }
}

/// A worker's breaker, shared with its calls: every outcome goes through
/// it, and each transition is counted and logged.
struct SharedBreaker {
    breaker: Mutex<CircuitBreaker>,
    name: String,
    counters: EnrichCounters,
}

impl SharedBreaker {
    fn admit(&self, now: Instant) -> Admission {
        self.update(|b| b.admit(now))
    }

    /// A call that took `took` ended at `now`, successfully or not.
    fn outcome(&self, ok: bool, now: Instant, took: Duration) {
        self.update(|b| b.outcome(now, took, ok));
    }

    fn update<R>(&self, f: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        let mut breaker = self.breaker.lock().unwrap_or_else(|p| p.into_inner());
        let before = breaker.state();
        let r = f(&mut breaker);
        let after = breaker.state();
        self.counters.breaker_open.set(u64::from(matches!(after, BreakerState::Open { .. })));
        self.counters.breaker_half_open.set(u64::from(matches!(after, BreakerState::HalfOpen { .. })));
        match (before, after) {
            (BreakerState::Open { .. }, BreakerState::Open { .. })
            | (BreakerState::Closed, BreakerState::Closed)
            | (BreakerState::HalfOpen { .. }, BreakerState::HalfOpen { .. }) => {}
            (_, BreakerState::Open { .. }) => {
                self.counters.breaker_opened.add(1);
                tracing::warn!(operator = %self.name, "circuit breaker opened: calls fail fast");
            }
            (_, BreakerState::Closed) => {
                self.counters.breaker_closed.add(1);
                tracing::info!(operator = %self.name, "circuit breaker closed: calls resume");
            }
            (_, BreakerState::HalfOpen { .. }) => {
                tracing::info!(operator = %self.name, "circuit breaker half-open: probing");
            }
        }
        r
    }
}

/// A record taken in and not yet answered.
struct Slot<D, O> {
    /// The timely time it came at (its results go out there).
    stamp: Timestamp,
    time: Timestamp,
    diff: Diff,
    record: D,
    outcome: Option<Result<O, (String, u32)>>,
}

/// An answer on its way out: the timely time it goes at, and the update.
type Answer<R> = (Timestamp, (R, Timestamp, Diff));

/// A call's completion, sent from the runtime to the worker.
type Completion<O> = (u64, Result<O, (String, u32)>);

/// Calls to external services from a dataflow: see the [module](self).
pub trait EnrichAsync<'scope, D: 'static> {
    /// Calls `call` for each record, as [`AsyncOptions`] says, on the job's
    /// runtime ([`EnrichRuntime`]): see the [module](self).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use highwater::enrich::{AsyncOptions, EnrichAsync};
    /// use highwater::prelude::*;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let users = EventStream::new(vec![(1u32, 10u64, 1i64), (2, 20, 1), (13, 30, 1)].to_stream(scope));
    ///     // A "service": user 13 is unknown; the others answer after 1 ms.
    ///     let lookup = |user: u32| async move {
    ///         tokio::time::sleep(Duration::from_millis(1)).await;
    ///         if user == 13 { Err(format!("no user {user}")) } else { Ok((user, format!("name-{user}"))) }
    ///     };
    ///     let enriched = users.enrich_async(AsyncOptions::new("Profiles").capacity(8), lookup);
    ///     (enriched.results.inner.capture(), enriched.failures.inner.capture())
    /// });
    /// let results: Vec<_> = captured.0.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// assert_eq!(results, vec![((1, "name-1".into()), 10, 1), ((2, "name-2".into()), 20, 1)]);
    /// let failed: Vec<_> = captured.1.extract().into_iter().flat_map(|(_, d)| d).collect();
    /// assert_eq!((failed[0].0.record, failed[0].0.reason.as_str(), failed[0].1), (13, "no user 13", 30));
    /// ```
    fn enrich_async<O, E, F, Fut>(&self, options: AsyncOptions, call: F) -> Enriched<'scope, D, O>
    where
        O: Data,
        E: Display,
        F: Fn(D) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static;
}

impl<'scope, D: Data> EnrichAsync<'scope, D> for EventStream<'scope, D> {
    fn enrich_async<O, E, F, Fut>(&self, options: AsyncOptions, call: F) -> Enriched<'scope, D, O>
    where
        O: Data,
        E: Display,
        F: Fn(D) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
    {
        let scope = self.scope();
        let runtime = EnrichRuntime::of(&scope).handle();
        let counters = EnrichCounters::default();
        counters.register(&scope, &options.name);
        let mut builder = OperatorBuilder::new(options.name.clone(), scope);
        // Through a counting channel to this worker itself: records the
        // operator has not taken count as in flight, and the sources pause.
        let me = scope.index() as u64;
        let mut input = builder.new_input(self.inner.clone(), exchange(move |_| me));
        let (results_out, results) = builder.new_output();
        let (failures_out, failures) = builder.new_output();
        let mut results_out =
            OutputBuilder::<_, CapacityContainerBuilder<Vec<(O, Timestamp, Diff)>>>::from(results_out);
        let mut failures_out =
            OutputBuilder::<_, CapacityContainerBuilder<Vec<(Failed<D>, Timestamp, Diff)>>>::from(failures_out);
        let waker = scope.worker().sync_activator_for(builder.operator_info().address.to_vec());
        let breaker = options.breaker.map(|config| SharedBreaker {
            breaker: Mutex::new(CircuitBreaker::new(config)),
            name: options.name.clone(),
            counters: counters.clone(),
        });
        let (done_tx, done_rx) = mpsc::channel::<Completion<O>>();
        // What every call of this operator shares: one `Arc` clone per call.
        let shared = Arc::new(Calls {
            call,
            done: done_tx,
            waker,
            woken: AtomicBool::new(false),
            breaker,
            counters: counters.clone(),
            timeout: options.timeout,
            permanent: options.permanent.clone(),
            _record: std::marker::PhantomData,
        });
        let c = counters.clone();

        builder.build(move |capabilities| {
            let mut caps: Vec<Option<Capability<Timestamp>>> = capabilities.into_iter().map(Some).collect();
            // Records taken in and not answered: in order (ordered), or by
            // sequence number; and how many per timely time.
            let mut queue: VecDeque<(u64, Slot<D, O>)> = VecDeque::new();
            let mut slots: HashMap<u64, Slot<D, O>> = HashMap::new();
            let mut stamps: BTreeMap<Timestamp, usize> = BTreeMap::new();
            // Records taken from the input that wait for room.
            let mut backlog: VecDeque<(Timestamp, D, Timestamp, Diff)> = VecDeque::new();
            // Answers of this activation, sent at the end in runs of one
            // timely time (one session each).
            let mut ok_out: Vec<Answer<O>> = Vec::new();
            let mut failed_out: Vec<Answer<Failed<D>>> = Vec::new();
            let mut next_seq = 0u64;
            let mut in_flight = 0usize;
            move |frontiers| {
                // Answers out: in order, or as they come.
                let mut emit = |slot: Slot<D, O>, stamps: &mut BTreeMap<Timestamp, usize>| {
                    match slot.outcome.expect("an answered slot") {
                        Ok(o) => ok_out.push((slot.stamp, (o, slot.time, slot.diff))),
                        Err((reason, attempts)) => failed_out.push((
                            slot.stamp,
                            (Failed { record: slot.record, reason, attempts }, slot.time, slot.diff),
                        )),
                    }
                    if let Some(n) = stamps.get_mut(&slot.stamp) {
                        *n -= 1;
                        if *n == 0 {
                            stamps.remove(&slot.stamp);
                        }
                    }
                };
                // Completed calls first; then, while there is room, the
                // input (all that waits in the channel) and calls for it;
                // records the breaker rejects are answered at once, which
                // makes room again. (Cleared before the completions are
                // read: a call completing after this wakes the operator.)
                shared.woken.store(false, Ordering::Release);
                let mut answered: Vec<Completion<O>> = done_rx.try_iter().collect();
                in_flight -= answered.len();
                let mut read = false;
                loop {
                    if options.ordered {
                        let base = queue.front().map_or(0, |(s, _)| *s);
                        for (seq, outcome) in answered.drain(..) {
                            if let Some((_, slot)) = queue.get_mut((seq - base) as usize) {
                                slot.outcome = Some(outcome);
                            }
                        }
                        while queue.front().is_some_and(|(_, s)| s.outcome.is_some()) {
                            let (_, slot) = queue.pop_front().expect("a front");
                            emit(slot, &mut stamps);
                        }
                    } else {
                        for (seq, outcome) in answered.drain(..) {
                            if let Some(mut slot) = slots.remove(&seq) {
                                slot.outcome = Some(outcome);
                                emit(slot, &mut stamps);
                            }
                        }
                    }
                    let held = if options.ordered { queue.len() } else { slots.len() };
                    if held >= options.capacity || (backlog.is_empty() && read) {
                        break;
                    }
                    if backlog.is_empty() {
                        read = true;
                        input.for_each(|cap, data| {
                            let stamp = *cap.least().expect("a message travels under a time");
                            for (d, t, diff) in data.drain(..) {
                                backlog.push_back((stamp, d, t, diff));
                                *stamps.entry(stamp).or_default() += 1;
                            }
                        });
                    }
                    let now = Instant::now();
                    let mut room = options.capacity - held;
                    while room > 0 {
                        let Some((stamp, record, time, diff)) = backlog.pop_front() else { break };
                        room -= 1;
                        let seq = next_seq;
                        next_seq += 1;
                        let admission = shared.breaker.as_ref().map_or(Admission::Call, |b| b.admit(now));
                        let slot = Slot { stamp, time, diff, record, outcome: None };
                        if let Admission::Rejected { .. } = admission {
                            // Fails fast: answered in this activation, without a call.
                            c.rejected.add(1);
                            answered.push((seq, Err(("the circuit breaker is open".to_owned(), 0))));
                        } else {
                            in_flight += 1;
                            let (calls, record) = (Arc::clone(&shared), slot.record.clone());
                            let mut retry = options.retry.clone().map(|b| b.reseed(seq));
                            runtime.spawn(async move {
                                let outcome = attempts(&calls, record, &mut retry).await;
                                calls.answer(seq, outcome);
                            });
                        }
                        if options.ordered {
                            queue.push_back((seq, slot));
                        } else {
                            slots.insert(seq, slot);
                        }
                    }
                    if answered.is_empty() && (backlog.is_empty() || room == 0) && read {
                        break;
                    }
                }
                c.in_flight.set(in_flight as u64);
                c.failed.add(failed_out.len() as u64);
                send_runs(&mut results_out.activate(), &caps[0], &mut ok_out);
                send_runs(&mut failures_out.activate(), &caps[1], &mut failed_out);
                // The capabilities: at the earliest record held, or the input's frontier.
                let frontier = frontiers[0].frontier().as_option().copied();
                match [frontier, stamps.keys().next().copied()].into_iter().flatten().min() {
                    Some(t) => {
                        for cap in caps.iter_mut().flatten() {
                            if *cap.time() < t {
                                cap.downgrade(&t);
                            }
                        }
                    }
                    None => caps.iter_mut().for_each(|c| *c = None),
                }
            }
        });
        Enriched { results: EventStream::new(results), failures: EventStream::new(failures), counters }
    }
}

/// What every call of one operator (on one worker) shares: the user
/// function, the way back to the worker, the breaker and the policy.
struct Calls<D, O, F> {
    call: F,
    done: mpsc::Sender<Completion<O>>,
    waker: SyncActivator,
    /// Whether the worker has been asked to run the operator since it last
    /// read the completions: one wake-up for many completions.
    woken: AtomicBool,
    breaker: Option<SharedBreaker>,
    counters: EnrichCounters,
    timeout: Duration,
    permanent: Option<Permanent>,
    _record: std::marker::PhantomData<fn(D)>,
}

impl<D, O, F> Calls<D, O, F> {
    /// Hands a call's outcome to the worker, waking it unless it is awake
    /// already. (The operator may be gone, the job ended: nothing to tell.)
    fn answer(&self, seq: u64, outcome: Result<O, (String, u32)>) {
        if self.done.send((seq, outcome)).is_ok() && !self.woken.swap(true, Ordering::AcqRel) {
            let _ = self.waker.activate();
        }
    }
}

/// One record's attempts: each with the timeout, retried after the waits of
/// `retry` while the breaker lets it; its result, or why it failed and the
/// attempts made.
async fn attempts<D: Clone, O, E: Display, F: Fn(D) -> Fut, Fut: Future<Output = Result<O, E>>>(
    calls: &Calls<D, O, F>,
    record: D,
    retry: &mut Option<Backoff>,
) -> Result<O, (String, u32)> {
    let (timeout, breaker, counters) = (calls.timeout, calls.breaker.as_ref(), &calls.counters);
    let mut made = 0u32;
    loop {
        made += 1;
        counters.calls.add(1);
        let started = Instant::now();
        let reason = match tokio::time::timeout(timeout, (calls.call)(record.clone())).await {
            Ok(Ok(o)) => {
                if let Some(b) = breaker {
                    b.outcome(true, Instant::now(), started.elapsed());
                }
                return Ok(o);
            }
            Ok(Err(e)) => {
                let reason = e.to_string();
                if calls.permanent.as_ref().is_some_and(|p| p(&reason)) {
                    if let Some(b) = breaker {
                        b.outcome(true, Instant::now(), started.elapsed());
                    }
                    return Err((reason, made));
                }
                reason
            }
            Err(_) => {
                counters.timeouts.add(1);
                format!("timed out after {timeout:?}")
            }
        };
        if let Some(b) = breaker {
            b.outcome(false, Instant::now(), started.elapsed());
        }
        let Some(wait) = retry.as_mut().and_then(Backoff::next_wait) else {
            return Err((reason, made));
        };
        tokio::time::sleep(wait).await;
        if let Some(b) = breaker {
            if let Admission::Rejected { .. } = b.admit(Instant::now()) {
                return Err((format!("{reason}; then the circuit breaker opened"), made));
            }
        }
        counters.retries.add(1);
    }
}

/// Sends `answers` (each with the timely time it goes out at) on `output`:
/// one session per run of one time, in their order.
fn send_runs<R: Clone + 'static>(
    output: &mut OutputBuilderSession<'_, Timestamp, CapacityContainerBuilder<Vec<R>>>,
    cap: &Option<Capability<Timestamp>>,
    answers: &mut Vec<(Timestamp, R)>,
) {
    let mut answers = answers.drain(..).peekable();
    while let Some((stamp, first)) = answers.next() {
        let cap = cap.as_ref().expect("a record held keeps the capabilities").delayed(&stamp);
        let mut session = output.session(&cap);
        session.give(first);
        while let Some((_, r)) = answers.next_if(|(s, _)| *s == stamp) {
            session.give(r);
        }
    }
}
