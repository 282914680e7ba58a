//! Harnesses for fuzzing the parsers of untrusted input: not part of the
//! public API (hidden from the documentation), only for the `cargo fuzz`
//! targets in `fuzz/` and the regression test `tests/fuzz_regressions.rs`,
//! which both call these functions so that they check the same things.
//!
//! Each harness takes arbitrary bytes, runs them through one parser the way
//! the runtime does, and panics if an invariant breaks: a panic inside the
//! parser, or a cheap check of what it returned (a round trip through the
//! writer, agreement with another reader of the same format). Bad input is
//! never a panic: the parser must return an error, which the harness
//! reports as [`Outcome::Rejected`]. Nothing here runs unless called.

mod cep;
mod checkpoint;
mod json;
#[cfg(feature = "postgres")]
mod pgoutput;

pub use cep::cep;
pub use checkpoint::{manifest, shard_chunk, shard_file};
pub use json::{debezium, json_lines, nexmark, nexmark_fast, Click, Page};
#[cfg(feature = "postgres")]
pub use pgoutput::{encode_pgoutput, pgoutput};

/// What a parser made of a fuzz input (that it did not panic and passed
/// the harness's checks goes without saying: the harness panics otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The input was accepted: parsed or decoded into a value.
    Accepted,
    /// The input was rejected with this error.
    Rejected(String),
}

impl Outcome {
    /// Whether the input was accepted.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Outcome::Accepted)
    }
}

impl<T, E: std::fmt::Display> From<&Result<T, E>> for Outcome {
    fn from(r: &Result<T, E>) -> Self {
        match r {
            Ok(_) => Outcome::Accepted,
            Err(e) => Outcome::Rejected(e.to_string()),
        }
    }
}
