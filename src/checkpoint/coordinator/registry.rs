//! What this process's workers registered while building their dataflows:
//! the checkpointed operators (and their state schemas), the stateful ones
//! that cannot be checkpointed, the sources and the exactly-once sinks. It
//! lies beside the [`Phase`](super::phase::Phase): every phase reads it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::operators::checkpoint::Schema;

use super::super::CheckpointError;
use super::sink::SinkCommitter;

/// The operators, sources and sinks of this process, by worker.
#[derive(Debug, Default)]
pub(super) struct Registry {
    /// Checkpointed operators: (worker, name and address in the dataflow).
    pub(super) operators: BTreeSet<(usize, String)>,
    /// The schema of each checkpointed operator's state.
    pub(super) schemas: BTreeMap<String, Schema>,
    /// Stateful operators that cannot be checkpointed.
    pub(super) unsupported: BTreeSet<String>,
    /// Sources: (name, worker).
    pub(super) sources: BTreeSet<(String, usize)>,
    /// Sources that have read all their partitions: (name, worker).
    pub(super) finished: BTreeSet<(String, usize)>,
    /// Exactly-once sinks: (name, worker).
    pub(super) sinks: BTreeSet<(String, usize)>,
    /// How each sink's parts are prepared and committed, by sink.
    pub(super) committers: BTreeMap<String, Arc<dyn SinkCommitter>>,
}

impl Registry {
    /// Whether the process has sources (a job without any takes no checkpoint).
    pub(super) fn has_sources(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Whether every source of the process has read all its partitions.
    pub(super) fn sources_ended(&self) -> bool {
        self.sources.is_empty() || self.finished.len() == self.sources.len()
    }

    /// The dataflow's fingerprint: its checkpointed operators on `worker`.
    pub(super) fn fingerprint(&self, worker: usize) -> String {
        fingerprint_of(self.operators.iter().filter(|(w, _)| *w == worker).map(|(_, name)| name.as_str()))
    }

    /// The committer of `sink` (registered in this process).
    pub(super) fn committer(&self, sink: &str) -> Result<Arc<dyn SinkCommitter>, CheckpointError> {
        self.committers
            .get(sink)
            .cloned()
            .ok_or_else(|| CheckpointError::Failed(format!("sink {sink} has no committer in this process")))
    }
}

/// The fingerprint of a dataflow with checkpointed operators `names`
/// (name and address in the dataflow).
pub(super) fn fingerprint_of<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    let text = names.join("\n");
    format!("{:08x}-{}", crc32fast::hash(text.as_bytes()), names.len())
}
