//! Event-time dataflow operators for highwater: windows, aggregations,
//! tables and joins over [`EventStream`]s, built on timely dataflow.
//!
//! This crate holds operators only: no I/O, no connectors. Streams carry
//! `(data, event_time, diff)` updates whose timely timestamps are watermarks;
//! see [`EventStream`] for the time model and [`window`] for windows.
//!
//! ```
//! use highwater_operators::prelude::*;
//! use timely::dataflow::operators::ToStream;
//! use timely::dataflow::operators::capture::{Capture, Extract};
//!
//! let captured = timely::example(|scope| {
//!     let bids = vec![((1u64, 100i64), 1_000u64, 1i64), ((1, 300), 2_000, 1), ((2, 50), 3_000, 1)];
//!     EventStream::new(bids.to_stream(scope))
//!         .window(Tumbling::of(10.secs()))
//!         .key_by(|(auction, _price): &(u64, i64)| *auction)
//!         .aggregate(Max::of(|(_, price): &(u64, i64)| *price))
//!         .results.inner.capture()
//! });
//! let mut maxima: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d)
//!     .map(|(r, _, _)| (r.key, r.value)).collect();
//! maxima.sort();
//! assert_eq!(maxima, vec![(1, 300), (2, 50)]);
//! ```

#![forbid(missing_docs)]

pub mod aggregate;
pub mod cep;
pub mod checkpoint;
pub mod collection;
pub mod flow;
mod group;
mod hold;
pub mod join;
pub mod key;
pub mod late;
mod partial;
pub mod state;
pub mod stream;
pub mod table;
pub mod time;
pub mod totals;
pub mod window;
pub mod wire;

pub use aggregate::Aggregate;
pub use group::TtlAggregated;
pub use late::{Counter, LateOutput, WithLateness};
pub use stream::{EventStream, Update};
pub use time::{AllowedLateness, Diff, DurationExt, IntoMillis, Timestamp, END_OF_TIME};

/// The names most programs use.
pub mod prelude {
    pub use crate::aggregate::{
        Aggregate, Avg, Collect, Count, Decimal, DistinctCount, Fold, Max, MaxBy, Min, Sum, TopK,
    };
    pub use crate::cep::{AfterMatchSkip, Match, Matches, Pattern, PatternExt};
    pub use crate::group::TtlAggregated;
    pub use crate::join::{between, by_record, Interval, IntervalJoined, Side, TtlJoined, WindowJoined};
    pub use crate::late::{LateOutput, WithLateness};
    pub use crate::stream::EventStream;
    pub use crate::table::{AsOfJoined, Table, TableReader, Upserted};
    pub use crate::time::{AllowedLateness, Diff, DurationExt, IntoMillis, Timestamp};
    pub use crate::window::{
        windows_by, CountTrigger, CountWindows, EventTimeTrigger, GlobalWindows, Phases, ProcessingTimeTrigger,
        Session, Sliding, Trigger, TriggerAction, Tumbling, Window, WindowResult, WindowSpec, Windowed,
    };
}
