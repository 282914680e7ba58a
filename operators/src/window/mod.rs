//! Windows over event time: tumbling, sliding, session, global with triggers,
//! and count windows, each aggregated per key.
//!
//! Time windows are aligned to the epoch, as in Flink: a 10 s tumbling window
//! is `[k·10 s, (k+1)·10 s)`. A window's result is emitted when the watermark
//! (the operator's input frontier) passes the window's end, with the window's
//! last millisecond as its event time. Records that arrive after that, but
//! within the [`AllowedLateness`], retract the emitted result and emit the
//! corrected one; records later still go to the [`LateOutput`]. (A sliding
//! window record too late for some of its windows but not all counts in those
//! still open, as in Flink, and goes to the late output only when it is too late
//! for all of them.) A window's state is released once the watermark passes
//! `end + allowed lateness`, so memory stays flat over an unbounded input.
//!
//! # Examples
//! ```
//! use highwater_operators::prelude::*;
//! use timely::dataflow::operators::ToStream;
//! use timely::dataflow::operators::capture::{Capture, Extract};
//!
//! let captured = timely::example(|scope| {
//!     // (word, event time, diff): two words in [0, 10s), one in [10s, 20s).
//!     let words = vec![('a', 1_000u64, 1i64), ('b', 9_999, 1), ('a', 10_000, 1)].to_stream(scope);
//!     EventStream::new(words)
//!         .window(Tumbling::of(10.secs()))
//!         .aggregate(Count)
//!         .results
//!         .inner
//!         .capture()
//! });
//! let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d)
//!     .map(|(r, _time, diff)| (r.window.start, r.value, diff)).collect();
//! out.sort();
//! assert_eq!(out, vec![(0, 2, 1), (10_000, 1, 1)]);
//! ```

mod aligned;
mod count;
mod global;
mod session;
mod two_phase;

use std::rc::Rc;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use timely::communication::Pull;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::LogPuller;
use timely::dataflow::channels::Message;
use timely::dataflow::operators::generic::{InputHandleCore, OutputBuilder};

use crate::aggregate::Aggregate;
use crate::key::route;
use crate::key::{Data, Key};
use crate::late::{Counter, LateOutput};
use crate::state::{OperatorState, Stateful, StatefulBuilder};
use crate::stream::{EventStream, Update};
use crate::time::{AllowedLateness, IntoMillis, Timestamp};

pub use count::CountWindows;
pub use global::{
    CountTrigger, EventTimeTrigger, GlobalWindows, ProcessingTimeTrigger, Purging, Trigger, TriggerAction,
};
pub use session::Session;

/// A window of event time, `[start, end)`.
///
/// For a [`Session`], `end` is the last record's time plus the gap, and a
/// record at exactly `end` still joins the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond in the window.
    pub start: Timestamp,
    /// First millisecond after the window.
    pub end: Timestamp,
}

impl Window {
    /// The window `[start, end)`.
    pub fn new(start: Timestamp, end: Timestamp) -> Self {
        Window { start, end }
    }
    /// Whether `time` lies in `[start, end)`.
    pub fn contains(&self, time: Timestamp) -> bool {
        self.start <= time && time < self.end
    }
}

/// One result of a windowed aggregation: the window, the key, the value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WindowResult<K, O> {
    /// The window the value was computed over.
    pub window: Window,
    /// The key the value was computed for.
    pub key: K,
    /// The aggregate.
    pub value: O,
}

/// The outputs of a windowed aggregation.
#[derive(Debug)]
pub struct Windowed<'scope, K: 'static, O: 'static, D: 'static> {
    /// Window results; corrections of late windows as retraction plus insertion.
    pub results: EventStream<'scope, WindowResult<K, O>>,
    /// Records that came after their window's allowed lateness.
    pub late: LateOutput<'scope, D>,
}

/// The input of a window operator: the stream's updates, exchanged by key.
type KeyedInput<D> =
    InputHandleCore<Timestamp, Vec<Update<D>>, LogPuller<Box<dyn Pull<Message<Timestamp, Vec<Update<D>>>>>>>;

/// An operator output of updates of `T`.
type OutputOf<T> = OutputBuilder<Timestamp, CapacityContainerBuilder<Vec<Update<T>>>>;

/// What every window operator is built from: the stateful operator (its
/// state `S`), its input exchanged by key, an output of results and one of
/// late records, and the late records' counter.
struct Skeleton<'scope, S, D: 'static, K: 'static, O: 'static> {
    builder: StatefulBuilder<'scope, S>,
    input: KeyedInput<D>,
    results: OutputOf<WindowResult<K, O>>,
    late: OutputOf<D>,
    late_count: Counter,
}

/// A window operator's skeleton and the streams it will produce.
type Built<'scope, S, D, K, O> = (Skeleton<'scope, S, D, K, O>, Windowed<'scope, K, O, D>);

/// Builds the skeleton of a window operator named `name` keyed by `key`,
/// keeping state `S`, and the [`Windowed`] streams it will produce.
fn skeleton<'scope, S, D, K, O, KF>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: &Rc<KF>,
) -> Built<'scope, S, D, K, O>
where
    S: OperatorState,
    D: Data,
    K: Key,
    O: Data,
    KF: Fn(&D) -> K + 'static,
{
    let key = Rc::clone(key);
    let stateful = Stateful::<S>::new(name, &stream.scope());
    let gated = stateful.keyed_input(stream, move |u: &Update<D>| route(&key(&u.0)));
    let mut builder = stateful.builder(&stream.scope());
    let input = builder.input(gated);
    let (results, results_stream) = builder.output();
    let (late, late_stream) = builder.output();
    let late_count = Counter::new();
    crate::totals::Totals::count_in(&stream.scope(), &format!("{name}.late"), &late_count);
    let windowed =
        Windowed { results: results_stream, late: LateOutput { stream: late_stream, count: late_count.clone() } };
    (Skeleton { builder, input, results, late, late_count }, windowed)
}

/// Sorts updates by record and sums the diffs of equal records, dropping
/// those that cancel out (the records of one millisecond, before a count or
/// global window takes them in their own order).
fn consolidate<D: Ord>(updates: &mut Vec<(D, crate::time::Diff)>) {
    updates.sort_by(|a, b| a.0.cmp(&b.0));
    let mut write = 0;
    for read in 0..updates.len() {
        if write > 0 && updates[write - 1].0 == updates[read].0 {
            updates[write - 1].1 += updates[read].1;
        } else {
            updates.swap(write, read);
            write += 1;
        }
    }
    updates.truncate(write);
    updates.retain(|(_, diff)| *diff != 0);
}

/// Assigns a record to the time windows it belongs to.
///
/// Implemented by [`Tumbling`], [`Sliding`] and [`WindowsFn`]; windows are
/// independent of each other (no merging).
pub trait AssignWindows<D>: 'static {
    /// Pushes the windows containing `record`, whose event time is `time`.
    fn assign(&self, record: &D, time: Timestamp, out: &mut SmallVec<[Window; 4]>);

    /// For windows that depend on the time alone: the first millisecond of
    /// `time`'s *pane*, the span of times around it that lie in exactly the
    /// same windows (a tumbling window; a `gcd(size, slide)` slice of sliding
    /// windows). Two-phase aggregation combines a pane's records once for all
    /// of its windows. `None` (the default) when the windows depend on the
    /// record: records are then combined per window.
    fn pane(&self, time: Timestamp) -> Option<Timestamp> {
        let _ = time;
        None
    }

    /// Pushes the windows of the pane that starts at `pane` (a value
    /// [`pane`](Self::pane) returned): those of every time in the pane.
    fn pane_windows(&self, pane: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        let _ = (pane, out);
        unreachable!("pane_windows is called only with a pane that pane() returned")
    }
}

/// Epoch-aligned tumbling windows of a fixed size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tumbling {
    size: u64,
    offset: u64,
}

impl Tumbling {
    /// Windows `[k·size, (k+1)·size)`.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn of(size: impl IntoMillis) -> Self {
        let size = size.into_millis();
        assert!(size > 0, "a tumbling window has a positive size");
        Tumbling { size, offset: 0 }
    }
    /// Shifts the windows by `offset` ms: `[k·size + offset, (k+1)·size + offset)`.
    pub fn offset(mut self, offset: impl IntoMillis) -> Self {
        self.offset = offset.into_millis() % self.size;
        self
    }
}

impl Tumbling {
    /// The window containing `time`.
    #[inline]
    fn window_of(&self, time: Timestamp) -> Window {
        // Computed from the end so that a window reaching before the epoch starts at 0.
        let end = time.saturating_add(self.size - (time + self.size - self.offset) % self.size);
        Window::new(end.saturating_sub(self.size), end)
    }
}

impl<D> AssignWindows<D> for Tumbling {
    #[inline]
    fn assign(&self, _record: &D, time: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        out.push(self.window_of(time));
    }
    /// The window itself.
    #[inline]
    fn pane(&self, time: Timestamp) -> Option<Timestamp> {
        Some(self.window_of(time).start)
    }
    fn pane_windows(&self, pane: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        out.push(self.window_of(pane));
    }
}

/// Epoch-aligned sliding (hopping) windows: `size` long, one every `slide`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sliding {
    size: u64,
    slide: u64,
    /// `gcd(size, slide)`: every window starts and ends on a multiple of it.
    pane: u64,
}

impl Sliding {
    /// Windows `[k·slide, k·slide + size)` for every `k`.
    ///
    /// # Panics
    /// If `slide` is zero or larger than `size`.
    pub fn of(size: impl IntoMillis, slide: impl IntoMillis) -> Self {
        let (size, slide) = (size.into_millis(), slide.into_millis());
        assert!(slide > 0 && slide <= size, "a sliding window needs 0 < slide <= size");
        let (mut a, mut b) = (size, slide);
        while b > 0 {
            (a, b) = (b, a % b);
        }
        Sliding { size, slide, pane: a }
    }

    /// Pushes the windows containing `time`.
    #[inline]
    fn windows_of(&self, time: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        // The last window starting at or before `time`, then earlier ones while they still contain it.
        let mut start = time - time % self.slide;
        loop {
            out.push(Window::new(start, start.saturating_add(self.size)));
            if start < self.slide || start - self.slide + self.size <= time {
                break;
            }
            start -= self.slide;
        }
    }
}

impl<D> AssignWindows<D> for Sliding {
    #[inline]
    fn assign(&self, _record: &D, time: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        self.windows_of(time, out);
    }
    /// A `gcd(size, slide)` slice: no window starts or ends inside it.
    #[inline]
    fn pane(&self, time: Timestamp) -> Option<Timestamp> {
        Some(time - time % self.pane)
    }
    fn pane_windows(&self, pane: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        self.windows_of(pane, out);
    }
}

/// Windows chosen by a function of the record and its time: e.g. an auction
/// whose bids count from its opening until it expires.
pub struct WindowsFn<F>(F);

impl<F> std::fmt::Debug for WindowsFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WindowsFn")
    }
}

/// Windows given by `f(record, time)`; each record belongs to one window,
/// which must contain `time`.
///
/// ```
/// use highwater_operators::window::{windows_by, Window};
/// // Each (auction, opens, expires) record opens the window of its auction.
/// let _w = windows_by(|a: &(u64, u64, u64), _t| Window::new(a.1, a.2 + 1));
/// ```
pub fn windows_by<D, F: Fn(&D, Timestamp) -> Window + 'static>(f: F) -> WindowsFn<F> {
    WindowsFn(f)
}

impl<D, F: Fn(&D, Timestamp) -> Window + 'static> AssignWindows<D> for WindowsFn<F> {
    #[inline]
    fn assign(&self, record: &D, time: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        out.push((self.0)(record, time));
    }
}

/// How a windowed aggregation spreads over the workers (Flink's
/// `table.optimizer.agg-phase-strategy`): see [`WindowedStream::phases`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phases {
    /// Two phases where they pay: with windows of the aligned kinds ([`Tumbling`], [`Sliding`], [`windows_by`]) and an
    /// aggregate that merges exactly ([`Aggregate::two_phase`]), each worker
    /// combines its records per window (or pane) and key before the
    /// exchange, and the key's owner merges the partial results. A window
    /// over all records, or a key that takes most of them, then no longer
    /// loads one worker with every record. Otherwise one phase.
    #[default]
    Auto,
    /// One phase: every record goes to its key's owner as it is.
    One,
}

/// A kind of window that can aggregate a keyed stream; implemented by every
/// window type of this module. Use it through [`EventStream::window`].
pub trait WindowSpec<D>: Sized + 'static {
    /// Builds the windowed aggregation; `phases` says whether it may
    /// pre-aggregate before the exchange (kinds that cannot ignore it).
    fn aggregate_core<'scope, K, KF, A>(
        self,
        stream: &EventStream<'scope, D>,
        name: &str,
        key: KF,
        lateness: AllowedLateness,
        phases: Phases,
        aggregate: A,
    ) -> Windowed<'scope, K, A::Output, D>
    where
        D: Data,
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>;
}

macro_rules! aligned_spec {
    ($($ty:ty => [$($gen:tt)*]),*) => {$(
        impl<D, $($gen)*> WindowSpec<D> for $ty where $ty: AssignWindows<D> {
            fn aggregate_core<'scope, K, KF, A>(
                self,
                stream: &EventStream<'scope, D>,
                name: &str,
                key: KF,
                lateness: AllowedLateness,
                phases: Phases,
                aggregate: A,
            ) -> Windowed<'scope, K, A::Output, D>
            where
                D: Data,
                K: Key,
                KF: Fn(&D) -> K + 'static,
                A: Aggregate<D>,
            {
                // Not by the number of workers: the dataflow keeps its shape
                // (and its operators' names in checkpoints) on any layout.
                if phases == Phases::Auto && aggregate.two_phase() {
                    two_phase::aggregate(stream, name, key, self, lateness, aggregate)
                } else {
                    aligned::aggregate(stream, name, key, self, lateness, aggregate)
                }
            }
        }
    )*};
}

aligned_spec!(Tumbling => [], Sliding => [], WindowsFn<F> => [F: 'static]);

/// A windowed stream under construction: pick the key, the lateness, then
/// the aggregation.
pub struct WindowedStream<'scope, D: 'static, W, KF> {
    stream: EventStream<'scope, D>,
    windows: W,
    key: KF,
    lateness: AllowedLateness,
    phases: Phases,
    name: String,
}

impl<D: 'static, W: std::fmt::Debug, KF> std::fmt::Debug for WindowedStream<'_, D, W, KF> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedStream")
            .field("windows", &self.windows)
            .field("lateness", &self.lateness)
            .field("phases", &self.phases)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// Groups the stream into windows (of all records together until
    /// [`WindowedStream::key_by`] names a key).
    pub fn window<W: WindowSpec<D>>(&self, windows: W) -> WindowedStream<'scope, D, W, fn(&D)> {
        self.window_with(windows, AllowedLateness::default_of(&self.scope()))
    }

    fn window_with<W: WindowSpec<D>>(
        &self,
        windows: W,
        lateness: AllowedLateness,
    ) -> WindowedStream<'scope, D, W, fn(&D)> {
        fn unit<D>(_: &D) {}
        WindowedStream {
            stream: self.clone(),
            windows,
            key: unit::<D>,
            lateness,
            phases: Phases::Auto,
            name: "Window".to_owned(),
        }
    }
}

impl<'scope, D: Data> crate::late::WithLateness<'scope, D> {
    /// Groups the stream into windows that accept records up to the allowed
    /// lateness after their end; see [`EventStream::window`].
    pub fn window<W: WindowSpec<D>>(&self, windows: W) -> WindowedStream<'scope, D, W, fn(&D)> {
        self.stream.window_with(windows, self.lateness)
    }
}

impl<'scope, E: Data, KF> crate::cep::KeyedEvents<'scope, E, KF> {
    /// Groups the keyed stream into windows, one result per window and key
    /// (Flink's order: `key_by(..).window(..)`, the same as
    /// `window(..).key_by(..)`), with the allowed lateness given before
    /// [`key_by`](EventStream::key_by), if any.
    pub fn window<W: WindowSpec<E>>(self, windows: W) -> WindowedStream<'scope, E, W, KF> {
        let (stream, key, lateness) = self.into_parts();
        WindowedStream { stream, windows, key, lateness, phases: Phases::Auto, name: "Window".to_owned() }
    }
}

impl<'scope, D: Data, W: WindowSpec<D>, KF> WindowedStream<'scope, D, W, KF> {
    /// Computes one result per window and key.
    pub fn key_by<K: Key, KF2: Fn(&D) -> K + 'static>(self, key: KF2) -> WindowedStream<'scope, D, W, KF2> {
        WindowedStream {
            stream: self.stream,
            windows: self.windows,
            key,
            lateness: self.lateness,
            phases: self.phases,
            name: self.name,
        }
    }

    /// Chooses how the aggregation spreads over the workers: [`Phases::Auto`]
    /// (the default) pre-aggregates on each worker where that is exact and
    /// pays, [`Phases::One`] sends every record to its key's owner.
    pub fn phases(mut self, phases: Phases) -> Self {
        self.phases = phases;
        self
    }

    /// Lets records up to `lateness` after a window's end correct it.
    pub fn allowed_lateness(mut self, lateness: impl IntoMillis) -> Self {
        self.lateness = AllowedLateness(lateness.into_millis());
        self
    }

    /// Names the operator (for logging and diagnostics).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Aggregates every window of every key.
    pub fn aggregate<K, A>(self, aggregate: A) -> Windowed<'scope, K, A::Output, D>
    where
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        self.windows.aggregate_core(&self.stream, &self.name, self.key, self.lateness, self.phases, aggregate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows<A: AssignWindows<()>>(a: &A, t: Timestamp) -> Vec<(u64, u64)> {
        let mut out = SmallVec::new();
        a.assign(&(), t, &mut out);
        let mut v: Vec<_> = out.into_iter().map(|w| (w.start, w.end)).collect();
        v.sort();
        v
    }

    #[test]
    fn tumbling_is_epoch_aligned() {
        assert_eq!(windows(&Tumbling::of(10), 0), vec![(0, 10)]);
        assert_eq!(windows(&Tumbling::of(10), 19), vec![(10, 20)]);
        assert_eq!(windows(&Tumbling::of(10), 20), vec![(20, 30)]);
        assert_eq!(windows(&Tumbling::of(10).offset(3), 12), vec![(3, 13)]);
        assert_eq!(windows(&Tumbling::of(10).offset(3), 13), vec![(13, 23)]);
        assert_eq!(windows(&Tumbling::of(10).offset(3), 2), vec![(0, 3)]);
    }

    #[test]
    fn sliding_covers_every_window_containing_the_time() {
        assert_eq!(windows(&Sliding::of(10, 2), 13), vec![(4, 14), (6, 16), (8, 18), (10, 20), (12, 22)]);
        assert_eq!(windows(&Sliding::of(10, 2), 3), vec![(0, 10), (2, 12)]);
        assert_eq!(windows(&Sliding::of(10, 10), 3), vec![(0, 10)]);
        assert_eq!(windows(&Sliding::of(10, 3), 10), vec![(3, 13), (6, 16), (9, 19)]);
    }
}
