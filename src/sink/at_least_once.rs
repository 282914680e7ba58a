//! The checkpoint committer of an at-least-once sink: the sink makes its
//! output durable (flushed, acknowledged) before it hands in its share of
//! a cut, so there is nothing to prepare, commit or abort; the manifest
//! only records what the sink wrote to.

use highwater_operators::checkpoint::CheckpointId;

use crate::checkpoint::{CheckpointError, SinkCommitter, SinkPart};

/// Records an at-least-once sink in a checkpoint's manifest.
#[derive(Debug)]
pub(crate) struct AtLeastOnce {
    /// The manifest's kind, e.g. `kafka-at-least-once`.
    pub(crate) kind: &'static str,
    /// Where the output goes (a topic, a broker).
    pub(crate) target: String,
}

impl SinkCommitter for AtLeastOnce {
    fn prepare(&self, _id: CheckpointId, _part: Option<(&[u8], u64)>) -> Result<SinkPart, CheckpointError> {
        Ok(SinkPart {
            sink: String::new(),
            kind: self.kind.to_owned(),
            target: self.target.clone(),
            pending: String::new(),
            committed: String::new(),
            rows: 0,
        })
    }

    fn commit(&self, _part: &SinkPart) -> Result<(), CheckpointError> {
        Ok(())
    }

    fn abort_after(&self, _id: CheckpointId) -> Result<(), CheckpointError> {
        Ok(())
    }
}
