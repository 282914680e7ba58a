//! A job's failures, shared by its workers, and how misuse of the library
//! is reported. Below the job: sources and checkpoints report here, the job
//! ([`crate::Job`]) reads what they reported.

use std::sync::{Arc, Mutex};

use crate::source::Failing;

/// Reports a misuse of the library's API: to the log, and on standard error
/// too when the program has installed no `tracing` subscriber, so that it is
/// never silent.
pub(crate) fn report_misuse(message: &str) {
    tracing::error!("{message}");
    if !tracing::dispatcher::has_been_set() {
        eprintln!("highwater: {message}");
    }
}

/// The key under which a job's [`Failures`] sit in the timely worker
/// configuration.
pub(crate) const FAILURES_KEY: &str = "highwater::job::failures";

/// The failures of a job's sources, shared by its workers: a source that
/// fails for good reports here (as well as in its
/// [`SourceMetrics`](crate::source::SourceMetrics)), and [`Job::run`](crate::Job::run) stops
/// the workers then.
#[derive(Clone, Debug, Default)]
pub struct Failures(Arc<Mutex<Vec<String>>>);

impl Failures {
    /// Records a failure.
    pub fn report(&self, failure: impl Into<String>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(failure.into());
    }

    /// The failures of the job that `scope`'s computation runs, if it runs
    /// as a [`Job`](crate::Job).
    pub fn of(scope: &timely::dataflow::Scope<'_, crate::Timestamp>) -> Option<Failures> {
        scope.worker().config().get::<Failures>(FAILURES_KEY).cloned()
    }
}

impl Failing for Failures {
    fn failure(&self) -> Option<String> {
        let failures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (!failures.is_empty()).then(|| failures.join("; "))
    }
}
