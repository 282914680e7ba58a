//! Event time at the edges of a dataflow: watermark strategies for sources and
//! human-readable durations for configuration.
//!
//! The operators' view of time lives in [`highwater_operators::time`]: a
//! record's timely timestamp is the watermark it was read under, and the
//! frontier of every operator is its watermark.

mod duration;
mod watermark;

pub use duration::{parse_duration, DurationError, Millis};
pub use highwater_operators::time::{AllowedLateness, Diff, DurationExt, Timestamp, END_OF_TIME};
pub use watermark::{CustomWatermark, PartitionWatermark, WatermarkStrategy};
