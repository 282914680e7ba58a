//! The board where the workers of one process post their watermarks, so that
//! a worker whose partitions all rest follows the others.

use std::sync::{Arc, Mutex};

use highwater_operators::Timestamp;

/// The watermarks of the workers of one process reading one source.
#[derive(Clone, Debug, Default)]
pub struct WatermarkBoard(Arc<Mutex<Vec<Posted>>>);

/// What a worker posts on the board.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Posted {
    /// Nothing yet.
    #[default]
    Unknown,
    /// Reading active partitions, at this watermark.
    Active(Timestamp),
    /// All partitions idle, or all done; the highest watermark they reached.
    Resting(Timestamp),
}

impl WatermarkBoard {
    pub(super) fn post(&self, index: usize, posted: Posted) {
        if let Ok(mut board) = self.0.lock() {
            if board.len() <= index {
                board.resize(index + 1, Posted::Unknown);
            }
            board[index] = posted;
        }
    }

    /// The least watermark of the workers reading active partitions, if
    /// any: the combined watermark that a source aligns its partitions to
    /// when the computation has no [`Alignment`](super::Alignment).
    pub(super) fn active_min(&self) -> Option<Timestamp> {
        let Ok(board) = self.0.lock() else { return None };
        board
            .iter()
            .filter_map(|posted| match posted {
                Posted::Active(w) => Some(*w),
                _ => None,
            })
            .min()
    }

    /// Where a worker whose partitions all rest may take its watermark: the
    /// least watermark of the workers still reading, or if none is, the
    /// highest any worker reached. Workers that have not posted (starting, or
    /// in another process) are not counted.
    pub(super) fn resting_target(&self) -> Timestamp {
        let Ok(board) = self.0.lock() else { return 0 };
        let mut active = None::<Timestamp>;
        let mut highest = 0;
        for posted in board.iter() {
            match *posted {
                Posted::Unknown => {}
                Posted::Active(w) => active = Some(active.map_or(w, |a| a.min(w))),
                Posted::Resting(w) => highest = highest.max(w),
            }
        }
        active.unwrap_or(highest)
    }
}
