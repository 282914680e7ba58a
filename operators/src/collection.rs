//! Bridges to differential dataflow: an [`EventStream`] as a differential
//! collection, and a collection as an event stream.
//!
//! Differential operators (arrangements, `join`, `reduce`, iteration) apply
//! to a highwater stream through [`EventStream::as_collection`]. A
//! collection's update times are the times at which its value changes, so
//! each update takes the later of its event time and the time it travels at
//! (a late record changes the collection when it arrives).

use differential_dataflow::{AsCollection, VecCollection};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use std::collections::{BTreeMap, HashMap};

use crate::checkpoint::{decode, encode, Checkpointer, Entry};
use crate::key::{route, Data};
use crate::stream::EventStream;
use crate::time::{arrival_time, watermark_of, Diff, Timestamp};

impl<'scope, D: Data> EventStream<'scope, D> {
    /// The stream as a differential collection.
    ///
    /// # Examples
    /// ```
    /// use differential_dataflow::operators::CountTotal;
    /// use highwater_operators::collection::from_collection;
    /// use highwater_operators::EventStream;
    /// use timely::dataflow::operators::ToStream;
    /// use timely::dataflow::operators::capture::{Capture, Extract};
    ///
    /// let captured = timely::example(|scope| {
    ///     let words = vec![('a', 1u64, 1i64), ('b', 2, 1), ('a', 3, 1)].to_stream(scope);
    ///     let counts = EventStream::new(words).as_collection().count_total_core::<i64>();
    ///     from_collection(&counts).inner.capture()
    /// });
    /// let mut table = std::collections::BTreeMap::new();
    /// for ((word, count), _t, diff) in captured.extract().into_iter().flat_map(|(_, d)| d) {
    ///     *table.entry((word, count)).or_insert(0) += diff;
    /// }
    /// table.retain(|_, d| *d != 0);
    /// assert_eq!(table.into_keys().collect::<Vec<_>>(), vec![('a', 2i64), ('b', 1)]);
    /// ```
    pub fn as_collection(&self) -> VecCollection<'scope, Timestamp, D, Diff> {
        if let Some(checkpointer) = Checkpointer::new() {
            return checkpointed(self, checkpointer);
        }
        self.inner
            .clone()
            .unary(Pipeline, "AsCollection", |_cap, _info| {
                move |input, output| {
                    input.for_each_stamp(|cap, data| {
                        let at = arrival_time(&cap);
                        let mut session = output.session(&cap);
                        for batch in data {
                            session.give_iterator(batch.drain(..).map(|(d, t, r)| (d, t.max(at), r)));
                        }
                    });
                }
            })
            .as_collection()
    }
}

/// The accumulation of a collection as a checkpoint keeps it: records by their
/// bytes (records need not be hashable), with the sum of their diffs.
#[derive(Default)]
struct Accumulation {
    /// Updates at times below the input watermark, consolidated.
    settled: HashMap<Vec<u8>, Diff>,
    /// Updates at later times (a record may change the collection at an
    /// event time after its arrival), by time.
    pending: BTreeMap<Timestamp, Vec<(Vec<u8>, Diff)>>,
}

impl Accumulation {
    fn settle(&mut self, bytes: Vec<u8>, diff: Diff) {
        match self.settled.entry(bytes) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                *e.get_mut() += diff;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if diff != 0 {
                    e.insert(diff);
                }
            }
        }
    }

    /// Settles the pending updates below `watermark`.
    fn advance(&mut self, watermark: Timestamp) {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() >= watermark {
                break;
            }
            for (bytes, diff) in entry.remove() {
                self.settle(bytes, diff);
            }
        }
    }

    /// The accumulation as checkpoint entries: `(time if pending, bytes, diff)`,
    /// routed by the record's bytes.
    fn snapshot(&self) -> Vec<Entry> {
        let settled =
            self.settled.iter().map(|(bytes, diff)| (route(bytes), encode(&(None::<Timestamp>, bytes, diff))));
        let pending = self.pending.iter().flat_map(|(t, updates)| {
            updates.iter().map(move |(bytes, diff)| (route(bytes), encode(&(Some(*t), bytes, diff))))
        });
        settled.chain(pending).collect()
    }
}

/// The bridge of a checkpointed job. A differential collection's state lives
/// in the arrangements of the operators downstream (joins, reductions), and
/// they are all functions of the collection. So the bridge keeps the
/// collection's accumulation, checkpoints it as of the cut `T`, and on
/// recovery replays it: the settled part at `T - 1`, the rest at its times.
/// The arrangements downstream are rebuilt from it. What they derive at times
/// before `T` was committed before the crash: checkpoint gates and
/// exactly-once sinks drop updates at times before the restored cut.
fn checkpointed<'scope, D: Data>(
    stream: &EventStream<'scope, D>,
    mut checkpointer: Checkpointer,
) -> VecCollection<'scope, Timestamp, D, Diff> {
    let gated = checkpointer.gate(stream);
    let scope = gated.scope();
    gated
        .inner
        .clone()
        .unary_frontier(Pipeline, "AsCollection", move |cap, info| {
            checkpointer.register("AsCollection", &info.address, &scope);
            let mut state = Accumulation::default();
            // The restored collection, to replay on the first activation.
            let mut replay: Vec<(D, Timestamp, Diff)> = Vec::new();
            let mut initial = None;
            if let Some((time, entries)) = checkpointer.restored() {
                let before = time.saturating_sub(1);
                entries.for_each(|_route, bytes| {
                    let (at, record, diff): (Option<Timestamp>, Vec<u8>, Diff) = decode(bytes);
                    replay.push((decode(&record), at.unwrap_or(before), diff));
                    match at {
                        Some(t) => state.pending.entry(t).or_default().push((record, diff)),
                        None => state.settle(record, diff),
                    }
                });
                replay.sort_by_key(|u| u.1);
                initial = Some(cap);
            }
            // The accumulation while a background thread serializes it for a checkpoint.
            let mut away = None;
            move |(input, frontier), output| {
                if !checkpointer.home(&mut away, |back| state = back) {
                    return;
                }
                if let Some(cap) = initial.take() {
                    let mut updates = std::mem::take(&mut replay).into_iter().peekable();
                    while let Some(&(_, time, _)) = updates.peek() {
                        let at = cap.delayed(&time);
                        let mut session = output.session(&at);
                        while let Some(u) = updates.next_if(|u| u.1 == time) {
                            session.give(u);
                        }
                    }
                }
                input.for_each_stamp(|cap, data| {
                    let at = arrival_time(&cap);
                    let mut session = output.session(&cap);
                    for batch in data {
                        for (d, t, r) in batch.drain(..) {
                            let time = t.max(at);
                            state.pending.entry(time).or_default().push((encode(&d), r));
                            session.give((d, time, r));
                        }
                    }
                });
                let watermark = watermark_of(frontier);
                state.advance(watermark);
                if let Some(cut) = checkpointer.due(watermark) {
                    let taken = std::mem::take(&mut state);
                    away = Some(checkpointer.snapshot_away(cut, taken, Accumulation::snapshot));
                }
            }
        })
        .as_collection()
}

/// A differential collection as an event stream: each update with its time as
/// its event time, and travelling at that time.
///
/// A differential operator may send an update under a capability earlier
/// than the update's time (a batch spans the times its frontier passed at
/// once, which depends on scheduling). Here each update travels at its own
/// time, so that what a sink commits at a checkpoint cut (the updates that
/// travel below the cut) is the same in every run.
pub fn from_collection<'scope, D: Data>(
    collection: &VecCollection<'scope, Timestamp, D, Diff>,
) -> EventStream<'scope, D> {
    let stream = collection.inner.clone().unary(Pipeline, "FromCollection", |_cap, _info| {
        let mut later: BTreeMap<Timestamp, Vec<(D, Timestamp, Diff)>> = BTreeMap::new();
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                let at = arrival_time(&cap);
                {
                    let mut session = output.session(&cap);
                    for batch in data {
                        for update in batch.drain(..) {
                            if update.1 <= at {
                                session.give(update);
                            } else {
                                later.entry(update.1).or_default().push(update);
                            }
                        }
                    }
                }
                for (time, updates) in std::mem::take(&mut later) {
                    let delayed = cap.delayed(&time, 0);
                    output.session(&delayed).give_iterator(updates.into_iter());
                }
            });
        }
    });
    EventStream::new(stream)
}
