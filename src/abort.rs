//! The signal that gives up the start of a job of several processes.

use std::sync::{Arc, Mutex};

/// Gives up the start of a job of several processes from another thread.
///
/// While the processes connect, [`execute_abortable`](crate::cluster::execute_abortable) waits for its peers
/// (timely's own connection would retry forever); once [`abort`](Self::abort)
/// is called, for example by the checkpoint coordinator when a peer is gone
/// before the job started, the wait ends with that reason as the error.
/// Clones share the signal.
#[derive(Clone, Debug, Default)]
pub struct Abort(Arc<Mutex<Option<String>>>);

impl Abort {
    /// A signal not yet given.
    pub fn new() -> Self {
        Abort::default()
    }

    /// Gives up the start for `reason` (the first reason given stays).
    pub fn abort(&self, reason: impl Into<String>) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| reason.into());
    }

    /// The reason, once the start was given up.
    pub fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
