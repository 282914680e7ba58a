//! The Nexmark queries q0–q22 as dataflows, with their canonical CSV output.
//!
//! Every query takes the stream of [`Event`]s and returns its rows as CSV
//! lines (columns exactly as the Nexmark query definitions name them), the
//! header, and whether the result is append-only or an updating table. The
//! final result of a bounded input is the consolidated changelog.
//!
//! [`Event`]: super::Event

mod aggregates;
mod auctions;
mod format;
mod joins;
mod simple;
mod windows;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use highwater_operators::{Counter, EventStream};

use super::model::{Auction, Bid, Event, Person};

pub use format::{euros, utc_day, utc_hour_minute};
pub use simple::{channel_id, q10_partition};

/// A Nexmark query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Query(pub u8);

impl Query {
    /// Every query, q0 to q22.
    pub fn all() -> impl Iterator<Item = Query> {
        (0..=22).map(Query)
    }
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

/// An unknown query name.
#[derive(Debug, thiserror::Error)]
#[error("unknown query {0:?}: expected q0 to q22")]
pub struct UnknownQuery(String);

impl FromStr for Query {
    type Err = UnknownQuery;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.strip_prefix(['q', 'Q']).unwrap_or(s);
        match digits.parse::<u8>() {
            Ok(n) if n <= 22 => Ok(Query(n)),
            _ => Err(UnknownQuery(s.to_owned())),
        }
    }
}

/// Whether a query's result is a stream of rows or a table updated over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// Rows are final when emitted (windows fire once, given no lateness).
    Append,
    /// The result is a table: rows are retracted and replaced as input arrives.
    Updating,
}

/// Options of the queries.
#[derive(Clone, Debug, Default)]
pub struct QueryOptions {
    /// Allowed lateness of the windows, in ms (late corrections retract rows).
    pub allowed_lateness: u64,
    /// q13's side input: `key → value`. Defaults to keys 0..10000 with value
    /// `"value-<key>"`.
    pub side_input: Option<Arc<HashMap<i64, String>>>,
    /// Benchmarks: produce empty rows instead of CSV lines, as a blackhole
    /// sink that takes rows without serializing them would.
    pub blackhole: bool,
    /// A time-to-live for the state no watermark releases (the joins of q3
    /// and q20, the aggregations by key of q15-q19): without it, that state
    /// is kept for ever.
    pub state_ttl: Option<highwater_operators::state::StateTtl>,
}

impl QueryOptions {
    /// Whether aggregates must be exact under retractions (late corrections
    /// flow downstream only when lateness is allowed).
    fn exact(&self) -> bool {
        self.allowed_lateness > 0
    }

    /// How rows are formatted.
    fn format(&self) -> format::RowFormat {
        format::RowFormat { blackhole: self.blackhole }
    }
}

/// A query's output.
#[derive(Debug)]
pub struct QueryOutput<'scope> {
    /// The column names.
    pub header: &'static [&'static str],
    /// The rows, as CSV lines without line endings.
    pub rows: EventStream<'scope, String>,
    /// Append-only or updating.
    pub kind: QueryKind,
    /// Counters of records that came after the allowed lateness.
    pub late: Vec<Counter>,
}

/// Builds query `query` over `events`.
pub fn build<'scope>(query: Query, events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    match query.0 {
        0 => simple::q0(events, options),
        1 => simple::q1(events, options),
        2 => simple::q2(events, options),
        3 => joins::q3(events, options),
        4 => auctions::q4(events, options),
        5 => windows::q5(events, options),
        6 => auctions::q6(events, options),
        7 => windows::q7(events, options),
        8 => joins::q8(events, options),
        9 => auctions::q9(events, options),
        10 => simple::q10(events, options),
        11 => windows::q11(events, options),
        12 => windows::q12(events, options),
        13 => simple::q13(events, options),
        14 => simple::q14(events, options),
        15 => aggregates::q15(events, options),
        16 => aggregates::q16(events, options),
        17 => aggregates::q17(events, options),
        18 => aggregates::q18(events, options),
        19 => aggregates::q19(events, options),
        20 => joins::q20(events, options),
        21 => simple::q21(events, options),
        22 => simple::q22(events, options),
        n => unreachable!("Query({n}) is built only by Query::from_str, which checks the range"),
    }
}

fn persons<'scope>(events: &EventStream<'scope, Event>) -> EventStream<'scope, Person> {
    events.flat_map(move |e| match e {
        Event::Person(p) => Some(*p),
        _ => None,
    })
}

fn auctions<'scope>(events: &EventStream<'scope, Event>) -> EventStream<'scope, Auction> {
    events.flat_map(move |e| match e {
        Event::Auction(a) => Some(*a),
        _ => None,
    })
}

fn bids<'scope>(events: &EventStream<'scope, Event>) -> EventStream<'scope, Bid> {
    events.flat_map(move |e| match e {
        Event::Bid(b) => Some(b),
        _ => None,
    })
}

/// The default side input of q13.
pub fn default_side_input() -> HashMap<i64, String> {
    (0..10_000).map(move |k| (k, format!("value-{k}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names_parse() {
        assert_eq!("q5".parse::<Query>().unwrap(), Query(5));
        assert_eq!("Q22".parse::<Query>().unwrap(), Query(22));
        assert_eq!("7".parse::<Query>().unwrap(), Query(7));
        assert!("q23".parse::<Query>().is_err());
        assert!("x".parse::<Query>().is_err());
    }
}
