//! Two-phase aggregation of aligned windows ([`Phases::Auto`](super::Phases)):
//! each worker combines its records per pane (or window) and key before the
//! exchange, and the key's owner merges the partial results.
//!
//! The first phase is stateless: it combines the records of one stamp (one
//! timely time, so one arrival time) and sends its partial results on at
//! that time, so that nothing is held across a checkpoint. Whether a record
//! is late depends only on its windows and its arrival time, which the
//! partial result keeps, so the second phase (the aligned-window operator,
//! its state and checkpoints unchanged) decides lateness and corrections
//! exactly as it would for the records themselves. Late records are passed
//! on as they are, for the second phase's late output.

use std::rc::Rc;
use std::slice::IterMut;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use super::{aligned, AssignWindows, Window, Windowed};
use crate::aggregate::Aggregate;
use crate::key::{Data, Key, StateMap};
use crate::late::LateOutput;
use crate::partial::{self, Combining, Slot};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, AllowedLateness, Diff, Timestamp};

/// What the first phase sends to a key's owner.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) enum Phase<D, K, Acc> {
    /// A record as it is: late for every window it lies in, or from a stamp
    /// that was not combined ([`Combining`]).
    Raw(D),
    /// The records of one stamp, pane (or window) and key, combined; boxed,
    /// so that a record sent as it is takes no more room than itself.
    Partial(Span, K, Box<Acc>),
}

/// What a partial result covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(super) enum Span {
    /// A pane (see [`AssignWindows::pane`]), by its first millisecond: the
    /// records count in each of its windows.
    Pane(Timestamp),
    /// One window (windows that depend on the record).
    Window(Window),
}

impl Span {
    /// An event time the span covers (the partial result's).
    fn time(self) -> Timestamp {
        match self {
            Span::Pane(start) => start,
            Span::Window(window) => window.start,
        }
    }
}

/// The windows of the second phase's input: a record's own, or those its
/// partial result covers.
struct PhaseWindows<W>(Rc<W>);

impl<D, K, Acc, W> AssignWindows<Phase<D, K, Acc>> for PhaseWindows<W>
where
    D: 'static,
    K: 'static,
    Acc: 'static,
    W: AssignWindows<D>,
{
    #[inline]
    fn assign(&self, record: &Phase<D, K, Acc>, time: Timestamp, out: &mut SmallVec<[Window; 4]>) {
        match record {
            Phase::Raw(d) => self.0.assign(d, time, out),
            Phase::Partial(Span::Pane(pane), ..) => self.0.pane_windows(*pane, out),
            Phase::Partial(Span::Window(window), ..) => out.push(*window),
        }
    }
}

/// The second phase's aggregate: a record updates the accumulator, a
/// partial result merges into it.
struct Merging<A>(Rc<A>);

impl<D, K, A> Aggregate<Phase<D, K, A::Acc>> for Merging<A>
where
    D: Data,
    K: Key,
    A: Aggregate<D>,
{
    type Acc = A::Acc;
    type Output = A::Output;
    fn init(&self) -> A::Acc {
        self.0.init()
    }
    #[inline]
    fn update(&self, acc: &mut A::Acc, record: &Phase<D, K, A::Acc>, diff: Diff) {
        match record {
            Phase::Raw(d) => self.0.update(acc, d, diff),
            Phase::Partial(_, _, partial) => {
                debug_assert_eq!(diff, 1, "partial results are sent once");
                self.0.merge(acc, A::Acc::clone(partial));
            }
        }
    }
    fn merge(&self, acc: &mut A::Acc, other: A::Acc) {
        self.0.merge(acc, other);
    }
    fn output(&self, acc: &A::Acc) -> Option<A::Output> {
        self.0.output(acc)
    }
}

/// The windowed aggregation in two phases; the same results, late records
/// and state as [`aligned::aggregate`].
pub(super) fn aggregate<'scope, D, K, KF, W, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: KF,
    windows: W,
    lateness: AllowedLateness,
    agg: A,
) -> Windowed<'scope, K, A::Output, D>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    W: AssignWindows<D>,
    A: Aggregate<D>,
{
    let (key, windows, agg) = (Rc::new(key), Rc::new(windows), Rc::new(agg));
    let partials = combine(stream, name, Rc::clone(&key), Rc::clone(&windows), lateness, Rc::clone(&agg));
    let owner = move |p: &Phase<D, K, A::Acc>| match p {
        Phase::Raw(d) => key(d),
        Phase::Partial(_, k, _) => k.clone(),
    };
    let merged = aligned::aggregate(&partials, name, owner, PhaseWindows(windows), lateness, Merging(agg));
    let late = merged.late.stream.flat_map_updates("LateRecords", |(p, t, r), out| match p {
        Phase::Raw(d) => out.push((d, t, r)),
        // A partial result holds only records on time for one of its windows
        // at its arrival time, which the second phase sees as well.
        Phase::Partial(..) => unreachable!("a partial result is never late"),
    });
    Windowed { results: merged.results, late: LateOutput { stream: late, count: merged.late.count } }
}

/// The first phase: per stamp, the records combined per pane (or window)
/// and key, sent at the stamp's time; late records as they are, and every
/// record of a stamp that is not combined ([`Combining`]).
fn combine<'scope, D, K, KF, W, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: Rc<KF>,
    windows: Rc<W>,
    lateness: AllowedLateness,
    agg: Rc<A>,
) -> EventStream<'scope, Phase<D, K, A::Acc>>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    W: AssignWindows<D>,
    A: Aggregate<D>,
{
    let mut first = First {
        key,
        windows,
        agg,
        lateness,
        groups: StateMap::default(),
        assigned: SmallVec::new(),
        combining: Combining::default(),
    };
    let inner = stream.inner.clone().unary(Pipeline, &format!("{name}Partials"), move |_cap, _info| {
        let mut out: Vec<Update<Phase<D, K, A::Acc>>> = Vec::new();
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                if first.combining.now() {
                    first.combine(arrival_time(&cap), data, &mut out);
                } else {
                    for batch in data {
                        out.extend(batch.drain(..).map(|(d, t, r)| (Phase::Raw(d), t, r)));
                    }
                }
                if !out.is_empty() {
                    output.session(&cap).give_container(&mut out);
                    out.clear();
                }
            });
        }
    });
    EventStream::new(inner)
}

/// The first phase's work on a worker.
struct First<D, K, KF, W, A: Aggregate<D>> {
    key: Rc<KF>,
    windows: Rc<W>,
    agg: Rc<A>,
    lateness: AllowedLateness,
    /// The stamp's groups, by pane (or window) and key.
    groups: StateMap<(Span, K), Slot<D, A::Acc>>,
    /// Scratch: the windows of the record or pane being placed.
    assigned: SmallVec<[Window; 4]>,
    combining: Combining,
}

impl<D, K, KF, W, A> First<D, K, KF, W, A>
where
    D: Data,
    K: Key,
    KF: Fn(&D) -> K,
    W: AssignWindows<D>,
    A: Aggregate<D>,
{
    /// Combines the records of one stamp, arrived at `arrived`, into `out`:
    /// per pane (or window) and key, late records as they are.
    fn combine(
        &mut self,
        arrived: Timestamp,
        data: IterMut<'_, Vec<Update<D>>>,
        out: &mut Vec<Update<Phase<D, K, A::Acc>>>,
    ) {
        let lateness = self.lateness;
        let open = |w: &Window| lateness.release_at(w.end) > arrived;
        // The last pane seen, and whether one of its windows is open.
        let mut last: Option<(Timestamp, bool)> = None;
        let mut records = 0;
        for batch in data {
            records += batch.len();
            for (record, time, diff) in batch.drain(..) {
                if let Some(pane) = self.windows.pane(time) {
                    let is_open = match last {
                        Some((p, is_open)) if p == pane => is_open,
                        _ => {
                            self.assigned.clear();
                            self.windows.pane_windows(pane, &mut self.assigned);
                            let is_open = self.assigned.iter().any(open);
                            last = Some((pane, is_open));
                            is_open
                        }
                    };
                    if is_open {
                        let group = self.groups.entry((Span::Pane(pane), (self.key)(&record)));
                        partial::add(group, &*self.agg, record, time, diff);
                    } else {
                        out.push((Phase::Raw(record), time, diff));
                    }
                    continue;
                }
                self.assigned.clear();
                self.windows.assign(&record, time, &mut self.assigned);
                self.assigned.retain(|w| open(w));
                let k = (self.key)(&record);
                match self.assigned.as_slice() {
                    [] => out.push((Phase::Raw(record), time, diff)),
                    [window] => {
                        partial::add(self.groups.entry((Span::Window(*window), k)), &*self.agg, record, time, diff)
                    }
                    several => {
                        for window in several {
                            let group = self.groups.entry((Span::Window(*window), k.clone()));
                            partial::combine(group, &*self.agg, &record, diff);
                        }
                    }
                }
            }
        }
        self.combining.flush(
            records,
            &mut self.groups,
            out,
            |d, t, r| (Phase::Raw(d), t, r),
            |(span, k), acc| (Phase::Partial(span, k, Box::new(acc)), span.time(), 1),
        );
    }
}
