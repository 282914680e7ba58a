//! Dead letters: input that could not be read, kept with the reason.

use serde::{Deserialize, Serialize};

/// The longest piece of a bad record kept in its dead letter, in bytes.
pub const MAX_RAW_BYTES: usize = 4096;

/// A record a source could not decode, with where it came from and why.
///
/// Bad input never stops a job and is never dropped silently: it becomes a
/// dead letter on the source's dead-letter stream and is counted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The source and partition, e.g. `events.jsonl` or `stdin`.
    pub origin: String,
    /// Where in the partition: a byte offset for files.
    pub offset: u64,
    /// Why it was rejected, e.g. `missing field `price` at line 1 column 80`.
    pub reason: String,
    /// The record itself (lossily decoded as UTF-8, cut at [`MAX_RAW_BYTES`]).
    pub raw: String,
}

impl DeadLetter {
    /// A dead letter for `raw` bytes.
    pub fn new(origin: impl Into<String>, offset: u64, reason: impl Into<String>, raw: &[u8]) -> Self {
        let cut = &raw[..raw.len().min(MAX_RAW_BYTES)];
        DeadLetter {
            origin: origin.into(),
            offset,
            reason: reason.into(),
            raw: String::from_utf8_lossy(cut).into_owned(),
        }
    }
}

impl std::fmt::Display for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}: {}: {}", self.origin, self.offset, self.reason, self.raw)
    }
}
