//! highwater: event-stream processing on timely and differential dataflow.
//!
//! A highwater program is a timely dataflow whose timestamps are event time
//! (ms since the epoch) and whose frontiers are watermarks. This crate holds
//! the runtime around the operators of [`highwater_operators`]: watermarks at
//! the sources ([`time`]), sources and sinks ([`source`], [`sink`]), dead
//! letters, cluster start-up ([`cluster`]), CEP patterns in text ([`cep`]),
//! the Nexmark benchmark ([`nexmark`]) and the `highwater` command line
//! ([`cli`]).

#![forbid(missing_docs)]

pub mod cdc;
pub mod cep;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod dead_letter;
#[doc(hidden)]
pub mod fuzzing;
pub mod job;
pub mod nexmark;
pub mod sink;
pub mod source;

pub use highwater_operators as operators;
/// Event time: timestamps, lateness, watermark strategies and durations (the
/// operators crate's [`highwater_operators::time`]).
pub use highwater_operators::time;
pub use highwater_operators::{EventStream, Timestamp};
pub use job::{Job, JobError, JobReport};

/// The names most programs use.
pub mod prelude {
    pub use crate::dead_letter::DeadLetter;
    pub use crate::sink::{collect, write_lines, Collected, LineTarget, SinkMode};
    pub use crate::source::{read, JsonDecoder, JsonLines, MemorySource, Source, SourceMetrics, SourceOptions};
    pub use crate::time::{parse_duration, WatermarkStrategy};
    pub use highwater_operators::prelude::*;
}

/// The README's code, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
