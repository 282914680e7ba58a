//! What an exactly-once sink hands in at a cut, and how its output is
//! made durable, then visible, per checkpoint.

use crate::operators::checkpoint::CheckpointId;

use super::super::manifest::SinkPart;
use super::super::CheckpointError;

/// A sink's share of a checkpoint: the output it sets aside at the cut.
#[derive(Debug)]
pub struct SinkSubmission {
    /// The sink's name.
    pub sink: String,
    /// The part's contents (encoded as its committer reads them) and row
    /// count; `None` if the sink had no output.
    pub part: Option<(Vec<u8>, u64)>,
}

/// How an exactly-once sink makes its output durable, then visible, per checkpoint.
///
/// The checkpoint writer calls [`prepare`](Self::prepare) for every part
/// before it writes the manifest, and [`commit`](Self::commit) after; on
/// recovery the sink, when registered, re-commits the parts of the restored
/// checkpoint and [`abort_after`](Self::abort_after) removes what later,
/// uncommitted checkpoints had prepared. `commit` must be idempotent.
pub trait SinkCommitter: Send + Sync + std::fmt::Debug {
    /// Makes a part durable but invisible (pre-commit); `part` is `None`
    /// when the sink had no output at checkpoint `id`.
    fn prepare(&self, id: CheckpointId, part: Option<(&[u8], u64)>) -> Result<SinkPart, CheckpointError>;
    /// Makes a prepared part visible; a part already committed is left as it is.
    fn commit(&self, part: &SinkPart) -> Result<(), CheckpointError>;
    /// Discards parts prepared for checkpoints after `id` (never committed),
    /// and any output of them already visible (a damaged newer checkpoint).
    fn abort_after(&self, id: CheckpointId) -> Result<(), CheckpointError>;
}
