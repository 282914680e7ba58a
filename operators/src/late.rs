//! The late side output: records that arrived after their allowed lateness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::stream::EventStream;

/// A shared counter, readable from outside the dataflow (for progress lines
/// and summaries) while the workers update it.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Counter::default()
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }
    /// Sets the value: a counter used as a gauge (a state's size, a
    /// position), which [`Totals`](crate::totals::Totals) sums with the
    /// others of its name like any counter.
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Whether `other` is this counter (a clone of it), not just one with
    /// the same value.
    pub fn same_as(&self, other: &Counter) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Records an operator could not take into account because they arrived after
/// the watermark had passed their window's end plus the allowed lateness.
///
/// They are never silently dropped: `stream` carries them unchanged (with
/// their own event time and diff, at the timely time they arrived), and
/// `count` counts them on this worker.
#[derive(Debug)]
pub struct LateOutput<'scope, D: 'static> {
    /// The late records.
    pub stream: EventStream<'scope, D>,
    /// How many late records this worker has seen.
    pub count: Counter,
}

/// A stream whose next stateful operator accepts records up to an allowed
/// lateness behind the watermark: made by
/// [`EventStream::allowed_lateness`], consumed by the operator called on it.
///
/// One builder for every operator that has a lateness: windows
/// ([`window`](Self::window), also after
/// [`WindowedStream::allowed_lateness`](crate::window::WindowedStream::allowed_lateness)),
/// CEP patterns ([`key_by`](Self::key_by) then `pattern`), upsert tables
/// ([`upsert`](Self::upsert)), as-of joins ([`join_as_of`](Self::join_as_of),
/// [`left_join_as_of`](Self::left_join_as_of)), interval and window joins
/// ([`interval_join`](Self::interval_join), [`window_join`](Self::window_join)).
/// Called directly on an [`EventStream`], the same operators allow no
/// lateness. Records within the lateness correct the operator's results
/// (retractions and insertions at the time they arrive); later ones go to
/// the operator's late output, never silently dropped.
///
/// ```
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::Probe;
/// use timely::dataflow::InputHandle;
///
/// let (late, counts) = timely::execute_directly(|worker| {
///     let mut input = InputHandle::new();
///     let (probe, captured) = worker.dataflow(|scope| {
///         let records = EventStream::new(input.to_stream(scope));
///         let strict = records.window(Tumbling::of(10.secs())).aggregate(Count);
///         let lenient = records.allowed_lateness(10.secs()).window(Tumbling::of(10.secs())).aggregate(Count);
///         let (probe, results) = lenient.results.inner.probe();
///         (probe, (strict.late.stream.inner.capture(), results.capture()))
///     });
///     // (record, event time, diff): one at 1 s; the watermark passes 12 s and
///     // the window [0 s, 10 s) fires; then one at 5 s, 7 s behind it.
///     input.send(((), 1_000u64, 1i64));
///     input.advance_to(12_000);
///     while probe.less_than(&12_000) {
///         worker.step();
///     }
///     input.send(((), 5_000, 1));
///     input.close();
///     while worker.step() {}
///     captured
/// });
/// let late: Vec<_> = late.extract().into_iter().flat_map(|(_, d)| d).collect();
/// assert_eq!(late, vec![((), 5_000, 1)]);
/// let mut counts: Vec<(u64, i64)> =
///     counts.extract().into_iter().flat_map(|(_, d)| d).map(|(r, _, d)| (r.value, d)).collect();
/// counts.sort();
/// // The window fired with 1, then was corrected to 2.
/// assert_eq!(counts, vec![(1, -1), (1, 1), (2, 1)]);
/// ```
#[derive(Debug)]
pub struct WithLateness<'scope, D: 'static> {
    pub(crate) stream: EventStream<'scope, D>,
    pub(crate) lateness: crate::time::AllowedLateness,
}

impl<'scope, D: crate::key::Data> EventStream<'scope, D> {
    /// This stream, for an operator that accepts records up to `lateness`
    /// behind the watermark (see [`WithLateness`]).
    pub fn allowed_lateness(&self, lateness: impl crate::time::IntoMillis) -> WithLateness<'scope, D> {
        WithLateness { stream: self.clone(), lateness: crate::time::AllowedLateness(lateness.into_millis()) }
    }
}
