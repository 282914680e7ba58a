//! highwater: event-stream processing on timely and differential dataflow.
//!
//! A highwater program is a timely dataflow whose timestamps are event time
//! (ms since the epoch) and whose frontiers are watermarks. This crate holds
//! the operators ([`operators`]: the `highwater-operators` crate, documented
//! here in full) and the runtime around them: watermarks at the sources
//! ([`time`]), sources and sinks ([`source`], [`sink`]), running a job
//! ([`Job`], [`cluster`]), checkpoints ([`checkpoint`]), dead letters, change
//! data capture ([`cdc`]), CEP patterns in text ([`cep`]), resilience
//! policies for calls to external services ([`enrich`]: circuit breaker,
//! retries with jitter), the Nexmark benchmark ([`nexmark`]) and the
//! `highwater` command line (`cli`).
//!
//! Start with the [`prelude`], [`Job`] and [`source::read()`]; the README
//! has a guide. Cargo features: `postgres` (CDC source, exactly-once sink),
//! `s3` (S3 checkpoint stores), `cli` (the command, with both; the default).
//! With default features off the crate compiles no C or C++ library.

#![forbid(missing_docs)]

mod abort;
pub mod activity;
mod board;
pub mod cdc;
pub mod cep;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub mod cluster;
pub mod dead_letter;
pub mod enrich;
mod failures;
#[doc(hidden)]
pub mod fuzzing;
pub mod job;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod latency;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "mqtt")]
pub mod mqtt;
pub mod nexmark;
#[cfg(feature = "serve")]
pub mod serve;
pub mod sink;
pub mod source;
pub mod totals;

/// The operators (the `highwater-operators` crate, documented here in full):
/// windows, aggregations, joins, tables, CEP, the stateful-operator model,
/// checkpoint state.
#[doc(inline)]
pub use highwater_operators as operators;
#[doc(inline)]
pub use highwater_operators::time;
#[doc(inline)]
pub use highwater_operators::{EventStream, Timestamp};
pub use job::{Job, JobError, JobReport};

/// The names most programs use.
pub mod prelude {
    pub use crate::checkpoint::CheckpointConfig;
    pub use crate::dead_letter::DeadLetter;
    pub use crate::job::Job;
    pub use crate::sink::{
        collect, write_json_lines, write_lines, write_parts, Collected, LineTarget, PartFormat, SinkMode,
    };
    pub use crate::source::{
        read, FromSource, JsonDecoder, JsonLines, MemorySource, Source, SourceMetrics, SourceOptions,
    };
    pub use crate::time::{parse_duration, WatermarkStrategy};
    pub use highwater_operators::prelude::*;
}

/// The README's code, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
