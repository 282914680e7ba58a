//! The Nexmark benchmark: its records, the JSON Lines format, a generator, and
//! the queries q0–q22 as highwater dataflows.
//!
//! Each query is built from the operators of [`highwater_operators`]
//! (windows, joins, updating aggregates) over an [`EventStream`] of
//! [`Event`]s, and produces its rows in the canonical CSV form (see
//! [`queries`]).
//!
//! [`EventStream`]: highwater_operators::EventStream

mod generator;
mod json;
mod model;
pub mod queries;

pub use generator::{ConfigError, Generator, GeneratorConfig, GeneratorReader, GeneratorSource, DEFAULT_BASE_TIME};
pub(crate) use json::decode_without_fast_path;
pub use json::{write_event, NexmarkDecoder};
pub use model::{Auction, Bid, Event, Person};
pub use queries::{build, Query, QueryKind, QueryOptions, QueryOutput};
