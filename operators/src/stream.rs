//! The stream type every highwater operator consumes and produces.

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::{Concat, Inspect, Probe};
use timely::dataflow::{ProbeHandle, Scope, Stream};

use crate::key::{route, Data};
use crate::time::{Diff, Timestamp};

/// One record of an [`EventStream`]: the data, its event time, and its
/// multiplicity change (`+1` insert, `-1` retract).
pub type Update<D> = (D, Timestamp, Diff);

/// A changelog of records stamped with event time.
///
/// The underlying timely stream carries `(data, event_time, diff)` triples.
/// Its timely timestamps are watermarks: a record travels at (at least) the
/// watermark of the partition it was read from, so the timely frontier at any
/// operator is its watermark. A record whose event time is below its timely
/// time was *late* when it was read; operators compare the two to apply their
/// [`AllowedLateness`](crate::AllowedLateness).
///
/// Append-only streams (sources) carry `diff = +1`; operators that correct
/// their results (late updates, updating aggregates) emit retractions. A
/// stream knows, as it is built, whether it is append-only
/// ([`is_append_only`](Self::is_append_only)): sources say so
/// ([`EventStream::append_only`]), record-by-record steps (`map`, `filter`,
/// `flat_map`, `concat` of two append-only streams, `exchange`, `inspect`)
/// keep it, and any other stream may carry retractions. Operators that can
/// take insertions only more cheaply (session windows) use it to choose how
/// they keep their state; every operator accepts retractions.
///
/// # Examples
/// ```
/// use highwater_operators::EventStream;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// let captured = timely::example(|scope| {
///     let input = vec![("a".to_string(), 5u64, 1i64), ("bb".to_string(), 7, 1)].to_stream(scope);
///     EventStream::new(input)
///         .map(|word: String| word.len())
///         .filter(|len| *len > 1)
///         .inner
///         .capture()
/// });
/// let out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).collect();
/// assert_eq!(out, vec![(2, 7, 1)]);
/// ```
pub struct EventStream<'scope, D: 'static> {
    /// The timely stream of `(data, event_time, diff)` triples.
    pub inner: Stream<'scope, Timestamp, Vec<Update<D>>>,
    /// Whether every update is an insertion (`diff > 0`), as declared.
    append_only: bool,
}

impl<D: Clone + 'static> Clone for EventStream<'_, D> {
    fn clone(&self) -> Self {
        EventStream { inner: self.inner.clone(), append_only: self.append_only }
    }
}

impl<D: 'static> std::fmt::Debug for EventStream<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").field("inner", &self.inner).finish()
    }
}

impl<'scope, D: Data> EventStream<'scope, D> {
    /// Wraps a timely stream of `(data, event_time, diff)` triples, which
    /// may carry retractions.
    pub fn new(inner: Stream<'scope, Timestamp, Vec<Update<D>>>) -> Self {
        EventStream { inner, append_only: false }
    }

    /// Wraps a timely stream of insertions only (`diff > 0`), such as a
    /// source's records. An operator handed a retraction on it anyway does not
    /// fail: it sends the retraction to its late output, if it has one, or
    /// applies it as on any stream.
    pub fn append_only(inner: Stream<'scope, Timestamp, Vec<Update<D>>>) -> Self {
        EventStream { inner, append_only: true }
    }

    /// Whether the stream was declared to carry insertions only (see
    /// [`append_only`](Self::append_only)).
    pub fn is_append_only(&self) -> bool {
        self.append_only
    }

    /// The scope the stream lives in.
    pub fn scope(&self) -> Scope<'scope, Timestamp> {
        self.inner.scope()
    }

    /// Transforms every record; times and diffs are kept.
    pub fn map<D2: Data, F: FnMut(D) -> D2 + 'static>(&self, mut logic: F) -> EventStream<'scope, D2> {
        self.flat_map_updates("Map", move |(d, t, r), out| out.push((logic(d), t, r))).kept_from(self)
    }

    /// Keeps the records for which `predicate` holds.
    pub fn filter<F: FnMut(&D) -> bool + 'static>(&self, mut predicate: F) -> EventStream<'scope, D> {
        self.flat_map_updates("Filter", move |(d, t, r), out| {
            if predicate(&d) {
                out.push((d, t, r))
            }
        })
        .kept_from(self)
    }

    /// Replaces every record by the records of an iterator, at the same time
    /// and with the same diff.
    pub fn flat_map<D2, I, F>(&self, mut logic: F) -> EventStream<'scope, D2>
    where
        D2: Data,
        I: IntoIterator<Item = D2>,
        F: FnMut(D) -> I + 'static,
    {
        self.flat_map_updates("FlatMap", move |(d, t, r), out| out.extend(logic(d).into_iter().map(|d2| (d2, t, r))))
            .kept_from(self)
    }

    /// The same stream, append-only if `source` is (for steps that keep diffs).
    fn kept_from<D0>(mut self, source: &EventStream<'scope, D0>) -> Self {
        self.append_only = source.append_only;
        self
    }

    /// Transforms whole updates: the closure sees data, event time and diff and
    /// pushes any number of updates. The event times it pushes should not be
    /// earlier than the input's, or downstream operators will see them late.
    pub fn flat_map_updates<D2, F>(&self, name: &str, mut logic: F) -> EventStream<'scope, D2>
    where
        D2: Data,
        F: FnMut(Update<D>, &mut Vec<Update<D2>>) + 'static,
    {
        let inner = self.inner.clone().unary(Pipeline, name, move |_cap, _info| {
            let mut buffer = Vec::new();
            move |input, output| {
                input.for_each_stamp(|cap, data| {
                    for batch in data {
                        for update in batch.drain(..) {
                            logic(update, &mut buffer);
                        }
                    }
                    if !buffer.is_empty() {
                        output.session(&cap).give_container(&mut buffer);
                        buffer.clear();
                    }
                });
            }
        });
        EventStream::new(inner)
    }

    /// Negates every diff: insertions become retractions and back.
    pub fn negate(&self) -> EventStream<'scope, D> {
        self.flat_map_updates("Negate", |(d, t, r), out| out.push((d, t, -r)))
    }

    /// Merges two streams of the same type.
    pub fn concat(&self, other: &EventStream<'scope, D>) -> EventStream<'scope, D> {
        let append_only = self.append_only && other.append_only;
        EventStream { inner: self.inner.clone().concat(other.inner.clone()), append_only }
    }

    /// Moves every record to the worker that owns its key.
    pub fn exchange<K: std::hash::Hash, F: Fn(&D) -> K + 'static>(&self, key: F) -> EventStream<'scope, D> {
        let pact = crate::flow::exchange(move |u: &Update<D>| route(&key(&u.0)));
        let inner = self.inner.clone().unary(pact, "Exchange", |_cap, _info| {
            move |input, output| {
                input.for_each_stamp(|cap, data| {
                    output.session(&cap).give_containers(data);
                });
            }
        });
        EventStream { inner, append_only: self.append_only }
    }

    /// Calls `logic` on every update as it passes.
    pub fn inspect<F: FnMut(&Update<D>) + 'static>(&self, logic: F) -> EventStream<'scope, D> {
        EventStream { inner: self.inner.clone().inspect(logic), append_only: self.append_only }
    }

    /// Attaches a probe that reports the stream's frontier (its watermark).
    pub fn probe_with(&self, handle: &ProbeHandle<Timestamp>) -> EventStream<'scope, D> {
        EventStream { inner: self.inner.clone().probe_with(handle), append_only: self.append_only }
    }
}
