//! Collecting a stream's updates in memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use highwater_operators::key::Data;
use highwater_operators::{Diff, EventStream, Update};
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

/// Updates collected from a stream, shared by every worker of the process.
#[derive(Debug)]
pub struct Collected<T> {
    updates: Arc<Mutex<Vec<Update<T>>>>,
}

impl<T> Clone for Collected<T> {
    fn clone(&self) -> Self {
        Collected { updates: Arc::clone(&self.updates) }
    }
}

impl<T> Default for Collected<T> {
    fn default() -> Self {
        Collected { updates: Arc::new(Mutex::new(Vec::new())) }
    }
}

impl<T: Clone + Ord> Collected<T> {
    /// Every update received, in arrival order.
    pub fn updates(&self) -> Vec<Update<T>> {
        self.updates.lock().expect("collector lock").clone()
    }

    /// The consolidated result: each record with its total multiplicity,
    /// records whose multiplicity is zero left out.
    pub fn consolidated(&self) -> BTreeMap<T, Diff> {
        let mut table = BTreeMap::new();
        for (d, _t, r) in self.updates.lock().expect("collector lock").iter() {
            *table.entry(d.clone()).or_insert(0) += r;
        }
        table.retain(|_, r| *r != 0);
        table
    }

    /// The consolidated result as a sorted list with repetitions.
    pub fn rows(&self) -> Vec<T> {
        let mut rows = Vec::new();
        for (d, r) in self.consolidated() {
            for _ in 0..r.max(0) {
                rows.push(d.clone());
            }
        }
        rows
    }
}

/// Collects every update of `stream` (on every worker) into `into`.
///
/// ```
/// use highwater::sink::{collect, Collected};
/// use highwater_operators::EventStream;
/// use timely::dataflow::operators::ToStream;
///
/// let out = Collected::default();
/// let sink = out.clone();
/// timely::example(move |scope| {
///     collect(&EventStream::new(vec![(1u64, 0u64, 1i64), (1, 0, 1)].to_stream(scope)), &sink);
/// });
/// assert_eq!(out.rows(), vec![1, 1]);
/// ```
pub fn collect<T: Data>(stream: &EventStream<'_, T>, into: &Collected<T>) {
    let target = Arc::clone(&into.updates);
    stream.inner.clone().sink(Pipeline, "Collect", move |(input, _frontier)| {
        input.for_each_stamp(|_cap, data| {
            let mut target = target.lock().expect("collector lock");
            for batch in data {
                target.extend(batch.drain(..));
            }
        });
    });
}
