//! Recording what a dataflow declares before the workers start ([`probe`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::operators::checkpoint::{
    BackendFiles, CheckpointId, Cut, Entry, Restored, Schema, StateError, StateRuntime, StateStore,
};
use crate::operators::Timestamp;

use super::super::manifest::Manifest;
use super::super::CheckpointError;
use super::registry::fingerprint_of;

/// What a dataflow declares when built under [`probe`]: its checkpointed
/// operators and the stateful ones that cannot be checkpointed.
#[derive(Debug, Default)]
pub struct DataflowProbe {
    operators: Mutex<Vec<String>>,
    unsupported: Mutex<Vec<String>>,
}

impl DataflowProbe {
    /// Checks the dataflow recorded: every stateful operator can be
    /// checkpointed, and `restored` (the checkpoint the job recovers from)
    /// was taken by the same dataflow.
    pub(super) fn check(&self, restored: Option<&Manifest>) -> Result<(), CheckpointError> {
        let unsupported = self.unsupported.lock().unwrap_or_else(|p| p.into_inner());
        if !unsupported.is_empty() {
            return Err(CheckpointError::Unsupported(unsupported.join(", ")));
        }
        let operators = self.operators.lock().unwrap_or_else(|p| p.into_inner());
        let fingerprint = fingerprint_of(operators.iter().map(String::as_str));
        match restored {
            Some(m) if m.fingerprint != fingerprint => {
                Err(CheckpointError::Fingerprint { id: m.id, found: m.fingerprint.clone(), expected: fingerprint })
            }
            _ => Ok(()),
        }
    }
}

/// The probe as the runtime of the computation it builds.
#[derive(Debug, Default, Clone)]
struct ProbeRuntime(Arc<DataflowProbe>);

impl StateRuntime for ProbeRuntime {
    fn worker(&self, _index: usize) -> std::rc::Rc<dyn StateStore> {
        std::rc::Rc::new(self.clone())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl StateStore for ProbeRuntime {
    fn cut_after(&self, _done: Option<CheckpointId>) -> Option<Cut> {
        None
    }
    fn register(&self, operator: &str, _schema: &Schema, _migrates_from: &[u32]) {
        self.0.operators.lock().unwrap_or_else(|p| p.into_inner()).push(operator.to_owned());
    }
    fn fail(&self, _operator: &str, _error: StateError) {}
    fn unsupported(&self, operator: &str) {
        self.0.unsupported.lock().unwrap_or_else(|p| p.into_inner()).push(operator.to_owned());
    }
    fn restored(&self, _operator: &str) -> Option<Restored> {
        None
    }
    fn restored_time(&self) -> Option<Timestamp> {
        None
    }
    fn submit(&self, _operator: &str, _cut: Cut, _entries: Vec<Entry>, _files: Option<BackendFiles>, _pause: Duration) {
    }
    fn on_cut(&self, _wake: Box<dyn Fn() + Send + Sync>) {}
}

/// Runs `build` with a one-worker timely configuration under which the job's
/// dataflow is to be built (and run to its end, so give it no input), e.g.
/// with `timely::execute`, and records what its operators declare: for
/// `Checkpoints::check_dataflow` before the workers start.
pub fn probe<R>(build: impl FnOnce(timely::Config) -> R) -> (DataflowProbe, R) {
    let runtime = ProbeRuntime::default();
    let mut config = timely::Config::thread();
    crate::operators::checkpoint::configure(&mut config.worker, Arc::new(runtime.clone()));
    let result = build(config);
    let take =
        |names: &Mutex<Vec<String>>| Mutex::new(std::mem::take(&mut *names.lock().unwrap_or_else(|p| p.into_inner())));
    let probe = DataflowProbe { operators: take(&runtime.0.operators), unsupported: take(&runtime.0.unsupported) };
    (probe, result)
}
