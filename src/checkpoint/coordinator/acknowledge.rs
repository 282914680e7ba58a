//! The sources' commit step: once a checkpoint has committed (its manifest
//! written, its sinks committed), each source acknowledges upstream what the
//! checkpoint covers (Kafka group offsets, a database's replication
//! position), never earlier: a recovery may still need anything after the
//! latest committed checkpoint.
//!
//! Every process acknowledges the partitions its own workers read, with the
//! positions they handed in at the cut.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::operators::checkpoint::CheckpointId;

use super::super::manifest::PartitionState;

/// How a source acknowledges upstream the records a committed checkpoint
/// covers (see [`crate::source::Source::acknowledge`]).
pub trait SourceCommitter: Send + Sync + std::fmt::Debug {
    /// Checkpoint `id` has committed; `partitions` are where this process's
    /// partitions of the source stood at its cut.
    fn commit(&self, id: CheckpointId, partitions: &[PartitionState]) -> Result<(), String>;
}

/// The committers of this process's sources and the positions they handed
/// in at the checkpoints not yet acknowledged.
#[derive(Debug, Default)]
pub(super) struct Acknowledgements {
    committers: HashMap<String, Arc<dyn SourceCommitter>>,
    /// By checkpoint, by source: the partitions' positions at the cut.
    pending: BTreeMap<CheckpointId, BTreeMap<String, Vec<PartitionState>>>,
}

impl Acknowledgements {
    /// `source` acknowledges through `committer` (registered once per process).
    pub(super) fn register(&mut self, source: &str, committer: Arc<dyn SourceCommitter>) {
        self.committers.insert(source.to_owned(), committer);
    }

    /// A worker handed in `partitions` of `source` at checkpoint `id`.
    pub(super) fn handed_in(&mut self, id: CheckpointId, source: &str, partitions: &[PartitionState]) {
        if self.committers.contains_key(source) {
            self.pending.entry(id).or_default().entry(source.to_owned()).or_default().extend_from_slice(partitions);
        }
    }

    /// Takes what checkpoints up to `committed` cover: per source, the
    /// positions at the latest of them (positions only move forward).
    pub(super) fn due(
        &mut self,
        committed: CheckpointId,
    ) -> Vec<(Arc<dyn SourceCommitter>, CheckpointId, Vec<PartitionState>)> {
        let later = self.pending.split_off(&(committed + 1));
        let due = std::mem::replace(&mut self.pending, later);
        let mut latest: BTreeMap<String, (CheckpointId, Vec<PartitionState>)> = BTreeMap::new();
        for (id, sources) in due {
            for (source, partitions) in sources {
                latest.insert(source, (id, partitions));
            }
        }
        latest
            .into_iter()
            .filter_map(|(source, (id, partitions))| {
                self.committers.get(&source).map(|c| (Arc::clone(c), id, partitions))
            })
            .collect()
    }
}

/// Serializes the commit calls of a process, so that they happen in
/// checkpoint order (a worker that finds another committing leaves it to
/// that one, or to its next activation).
#[derive(Debug, Default)]
pub(super) struct Committing(pub(super) Mutex<()>);
