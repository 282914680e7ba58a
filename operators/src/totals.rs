//! Named counters of a computation, summed by whoever runs it: the place
//! where operators report what a user should see at the end of a job
//! (records expired by a time-to-live, say) without the job's code
//! registering each counter.
//!
//! A runner (highwater's `Job`) puts a [`Totals`] in the timely worker
//! configuration ([`Totals::configure`]); operators find it there
//! ([`Totals::of`]) and [`count`](Totals::count) their counters under a
//! name. A computation run without one counts nothing there.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::late::Counter;
use crate::time::Timestamp;

/// The key under which a computation's [`Totals`] sit in the timely worker
/// configuration.
const TOTALS_KEY: &str = "highwater::totals";

/// The counters of a computation's process, by name; shared by its workers.
///
/// ```
/// use highwater_operators::totals::Totals;
/// use highwater_operators::Counter;
/// let totals = Totals::default();
/// let (a, b) = (Counter::new(), Counter::new());
/// a.add(2);
/// b.add(3);
/// totals.count("expired", &a);
/// totals.count("expired", &b);
/// totals.count("expired", &a); // counted once
/// assert_eq!(totals.local()["expired"], 5);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Totals(Arc<Mutex<BTreeMap<String, Vec<Counter>>>>);

impl Totals {
    /// Makes these the totals of the computations run with `config`.
    pub fn configure(&self, config: &mut timely::WorkerConfig) {
        config.set(TOTALS_KEY.to_owned(), self.clone());
    }

    /// The totals of the computation that `scope` belongs to, if its runner
    /// keeps any.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Totals> {
        scope.worker().config().get::<Totals>(TOTALS_KEY).cloned()
    }

    /// Counts `counter` under `name` in the totals of `scope`'s computation,
    /// if it has any.
    pub fn count_in(scope: &timely::dataflow::Scope<'_, Timestamp>, name: &str, counter: &Counter) {
        if let Some(totals) = Totals::of(scope) {
            totals.count(name, counter);
        }
    }

    /// Counts `counter` under `name`: the total for `name` is the sum of
    /// every distinct counter registered under it.
    pub fn count(&self, name: &str, counter: &Counter) {
        let mut counters = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let list = counters.entry(name.to_owned()).or_default();
        if !list.iter().any(|c| c.same_as(counter)) {
            list.push(counter.clone());
        }
    }

    /// This process's sums, by name.
    pub fn local(&self) -> BTreeMap<String, u64> {
        let counters = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counters.iter().map(|(name, list)| (name.clone(), list.iter().map(Counter::get).sum())).collect()
    }
}
