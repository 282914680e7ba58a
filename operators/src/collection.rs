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

use crate::key::Data;
use crate::stream::EventStream;
use crate::time::{arrival_time, Diff, Timestamp};

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
        // Differential arrangements downstream keep state of their own.
        crate::checkpoint::unsupported("AsCollection");
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

/// A differential collection as an event stream: each update with its time as
/// its event time.
pub fn from_collection<'scope, D: Data>(
    collection: &VecCollection<'scope, Timestamp, D, Diff>,
) -> EventStream<'scope, D> {
    EventStream::new(collection.inner.clone())
}
