//! Calls to external services from a dataflow: the resilience policies an
//! enrichment step applies to each call. [`breaker`] is the circuit breaker
//! (closed → open after N failures within a window → half-open probes →
//! closed); [`retry`] is exponential backoff with full jitter. Both take the
//! current instant as an argument, so that their behaviour is a function of
//! the calls' outcomes and times alone (and is tested so).

pub mod breaker;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "enrich")]
pub mod operator;
pub mod retry;
#[cfg(feature = "enrich")]
pub mod runtime;

pub use breaker::{Admission, BreakerConfig, BreakerState, CircuitBreaker, SlowCalls};
#[cfg(feature = "enrich")]
pub use operator::{AsyncOptions, EnrichAsync, EnrichCounters, Enriched, Failed};
pub use retry::Backoff;
#[cfg(feature = "enrich")]
pub use runtime::EnrichRuntime;
