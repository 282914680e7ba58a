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

use crate::checkpoint::{decode, encode};
use crate::key::{route, Data};
use crate::state::{OperatorState, Schema, Snapshot, StateError, Stateful};
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
        let stateful = Stateful::<Accumulation>::new("AsCollection", &self.scope());
        if stateful.is_checkpointed() {
            return checkpointed(self, stateful);
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
}

impl OperatorState for Accumulation {
    const SCHEMA: Schema = Schema::new("as_collection", 1);
    /// `(time if pending, the record's encoding, diff)`.
    type Entry = (Option<Timestamp>, Vec<u8>, Diff);
    type Prepared = ();

    /// The records of the accumulation, settled and pending.
    fn held(&self) -> (usize, u64) {
        let pending: usize = self.pending.values().map(Vec::len).sum();
        let n = self.settled.len() + pending;
        let settled = self.settled.iter().map(|(bytes, diff)| (None, bytes, diff));
        let later = self.pending.iter().flat_map(|(t, u)| u.iter().map(move |(bytes, diff)| (Some(*t), bytes, diff)));
        (n, crate::state::sampled_size(n, settled.chain(later)))
    }

    /// The accumulation as checkpoint entries, routed by the record's bytes.
    fn snapshot(&self, (): (), out: &mut Snapshot) {
        out.reserve(self.settled.len());
        for (bytes, diff) in &self.settled {
            out.push(route(bytes), &(None::<Timestamp>, bytes, diff));
        }
        for (t, updates) in &self.pending {
            for (bytes, diff) in updates {
                out.push(route(bytes), &(Some(*t), bytes, diff));
            }
        }
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
    stateful: Stateful<Accumulation>,
) -> VecCollection<'scope, Timestamp, D, Diff> {
    let gated = stateful.local_input(stream);
    let mut builder = stateful.builder(&stream.scope());
    let mut input = builder.input(gated);
    let (mut output, collection) = builder.output::<D>();
    builder.build(move |mut capabilities, mut managed| {
        // The restored collection, to replay on the first activation.
        let mut replay: Vec<(D, Timestamp, Diff)> = Vec::new();
        let mut initial = None;
        let cap = capabilities.pop();
        managed.restore(|state, time, entries| {
            let before = time.saturating_sub(1);
            let mut failed = None;
            entries.for_each(|(at, mut record, diff)| {
                match decode::<D>(&record) {
                    Ok(d) => {
                        // A record of an older checkpoint's encoding is kept in
                        // this build's, so that updates of it net out.
                        if crate::checkpoint::reading_encoding() != crate::checkpoint::StateEncoding::Tagged {
                            match encode(&d) {
                                Ok(bytes) => record = bytes,
                                Err(e) => {
                                    failed.get_or_insert(StateError::Encode {
                                        schema: Accumulation::SCHEMA,
                                        reason: e.to_string(),
                                    });
                                }
                            }
                        }
                        replay.push((d, at.unwrap_or(before), diff));
                    }
                    Err(e) => {
                        failed
                            .get_or_insert(StateError::Decode { schema: Accumulation::SCHEMA, reason: e.to_string() });
                    }
                }
                match at {
                    Some(t) => state.pending.entry(t).or_default().push((record, diff)),
                    None => state.settle(record, diff),
                }
            });
            if let Some(e) = failed {
                entries.fail(e);
            }
            replay.sort_by_key(|u| u.1);
            initial = cap;
        });
        move |frontiers| {
            if !managed.home() {
                return;
            }
            let mut output = output.activate();
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
            let state = managed.get();
            let mut failed = None;
            input.for_each_stamp(|cap, data| {
                let at = arrival_time(&cap);
                let mut session = output.session(&cap);
                for batch in data {
                    for (d, t, r) in batch.drain(..) {
                        let time = t.max(at);
                        match encode(&d) {
                            Ok(bytes) => state.pending.entry(time).or_default().push((bytes, r)),
                            Err(e) => {
                                failed.get_or_insert(StateError::Encode {
                                    schema: Accumulation::SCHEMA,
                                    reason: e.to_string(),
                                });
                            }
                        }
                        session.give((d, time, r));
                    }
                }
            });
            let watermark = watermark_of(&frontiers[0]);
            state.advance(watermark);
            if let Some(e) = failed {
                managed.fail(e);
            }
            managed.checkpoint(watermark, ());
        }
    });
    collection.inner.as_collection()
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
