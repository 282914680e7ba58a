//! Updating aggregates over bids: daily statistics, latest and top bids.

use std::cmp::Reverse;

use highwater_operators::key::Key;
use highwater_operators::prelude::*;

use super::format::{utc_hour_minute, Row, BID_COLUMNS};
use super::{bids, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Bid, Event};

const DAY_MS: u64 = 86_400_000;

/// The UTC day of a time, as days since the epoch (formatted only on output).
fn day_of(ms: u64) -> u64 {
    ms / DAY_MS
}

/// Price rank: 1 below 10 000, 2 below 1 000 000, else 3.
fn rank(price: i64) -> u8 {
    if price < 10_000 {
        1
    } else if price < 1_000_000 {
        2
    } else {
        3
    }
}

type Counts = ((u64, i64, i64, i64), (u64, u64, u64, u64), (u64, u64, u64, u64));

/// Bids, bidders and auctions, in total and per price rank.
fn counts() -> impl Aggregate<Bid, Output = Counts> {
    (
        (
            Count,
            Sum::of(|b: &Bid| i64::from(rank(b.price) == 1)),
            Sum::of(|b: &Bid| i64::from(rank(b.price) == 2)),
            Sum::of(|b: &Bid| i64::from(rank(b.price) == 3)),
        ),
        (
            DistinctCount::of(|b: &Bid| Some(b.bidder)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 1).then_some(b.bidder)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 2).then_some(b.bidder)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 3).then_some(b.bidder)),
        ),
        (
            DistinctCount::of(|b: &Bid| Some(b.auction)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 1).then_some(b.auction)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 2).then_some(b.auction)),
            DistinctCount::of(|b: &Bid| (rank(b.price) == 3).then_some(b.auction)),
        ),
    )
}

fn push_counts(row: Row, ((b, b1, b2, b3), (p, p1, p2, p3), (a, a1, a2, a3)): Counts) -> Row {
    row.int(b).int(b1).int(b2).int(b3).int(p).int(p1).int(p2).int(p3).int(a).int(a1).int(a2).int(a3)
}

const COUNT_COLUMNS: [&str; 12] = [
    "total_bids",
    "rank1_bids",
    "rank2_bids",
    "rank3_bids",
    "total_bidders",
    "rank1_bidders",
    "rank2_bidders",
    "rank3_bidders",
    "total_auctions",
    "rank1_auctions",
    "rank2_auctions",
    "rank3_auctions",
];

macro_rules! with_counts {
    ($($first:literal),*) => {{
        const H: [&str; 12 + [$($first),*].len()] = {
            let first = [$($first),*];
            let mut out = [""; 12 + [$($first),*].len()];
            let mut i = 0;
            while i < first.len() {
                out[i] = first[i];
                i += 1;
            }
            let mut j = 0;
            while j < 12 {
                out[first.len() + j] = COUNT_COLUMNS[j];
                j += 1;
            }
            out
        };
        &H
    }};
}

/// `aggregate` of `bids` per key: for ever, or with the options' state
/// time-to-live (then in event time; the operator counts the expired keys
/// in the job's totals as `<name>.expired`).
fn by_key<'scope, K, A>(
    bids: &EventStream<'scope, Bid>,
    name: &str,
    key: impl Fn(&Bid) -> K + 'static,
    aggregate: A,
    options: &QueryOptions,
) -> EventStream<'scope, (K, A::Output)>
where
    K: Key,
    A: Aggregate<Bid>,
{
    let Some(ttl) = options.state_ttl else {
        return bids.aggregate_by_key_named(name, key, aggregate);
    };
    bids.state_ttl(ttl).aggregate_by_key_named(name, key, aggregate).results
}

/// Per UTC day: bids, bidders and auctions by price rank.
pub(super) fn q15<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = by_key(&bids(events), "DailyStats", |b: &Bid| day_of(b.date_time), counts(), options)
        .map(move |(day, c)| push_counts(fmt.row().day(day), c).done());
    QueryOutput { header: with_counts!("day"), rows, kind: QueryKind::Updating, late: Vec::new() }
}

/// Per channel and UTC day: as q15, with the latest minute seen.
pub(super) fn q16<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let minute = |b: &Bid| b.date_time % DAY_MS / 60_000;
    let rows = by_key(
        &bids(events),
        "ChannelDailyStats",
        |b: &Bid| (b.channel.clone(), day_of(b.date_time)),
        (Max::append_only(minute), counts()),
        options,
    )
    .map(move |((channel, day), (minute, c))| {
        let (h, m) = utc_hour_minute(minute * 60_000);
        push_counts(fmt.row().str(&channel).day(day).str(&format!("{h:02}:{m:02}")), c).done()
    });
    QueryOutput { header: with_counts!("channel", "day", "minute"), rows, kind: QueryKind::Updating, late: Vec::new() }
}

/// Per auction and UTC day: bids by rank and price statistics.
pub(super) fn q17<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let price = |b: &Bid| b.price;
    let rows = by_key(
        &bids(events),
        "AuctionDailyStats",
        |b: &Bid| (b.auction, day_of(b.date_time)),
        (
            (
                Count,
                Sum::of(|b: &Bid| i64::from(rank(b.price) == 1)),
                Sum::of(|b: &Bid| i64::from(rank(b.price) == 2)),
                Sum::of(|b: &Bid| i64::from(rank(b.price) == 3)),
            ),
            (Min::append_only(price), Max::append_only(price), Avg::of(price), Sum::of(price)),
        ),
        options,
    )
    .map(move |((auction, day), ((n, n1, n2, n3), (min, max, avg, sum)))| {
        fmt.row().int(auction).day(day).int(n).int(n1).int(n2).int(n3).int(min).int(max).float(avg).int(sum).done()
    });
    QueryOutput {
        header: &[
            "auction",
            "day",
            "total_bids",
            "rank1_bids",
            "rank2_bids",
            "rank3_bids",
            "min_price",
            "max_price",
            "avg_price",
            "sum_price",
        ],
        rows,
        kind: QueryKind::Updating,
        late: Vec::new(),
    }
}

/// Per bidder and auction, the latest bid.
pub(super) fn q18<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = by_key(
        &bids(events),
        "LatestBid",
        |b: &Bid| (b.bidder, b.auction),
        MaxBy::append_only(|b: &Bid| (b.date_time, b.price, b.extra.clone())),
        options,
    )
    .flat_map(move |(_, latest)| latest.into_iter().map(move |b| fmt.row().bid(&b).done()).collect::<Vec<_>>());
    QueryOutput { header: &BID_COLUMNS, rows, kind: QueryKind::Updating, late: Vec::new() }
}

/// Per auction, its ten highest bids with their rank.
pub(super) fn q19<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = by_key(
        &bids(events),
        "TopBids",
        |b: &Bid| b.auction,
        TopK::append_only(10, |b: &Bid| (b.price, Reverse(b.date_time), Reverse(b.bidder), Reverse(b.extra.clone()))),
        options,
    )
    .flat_map(move |(auction, top)| {
        top.into_iter()
            .enumerate()
            .map(move |(i, (price, Reverse(time), Reverse(bidder), Reverse(extra)))| {
                fmt.row().int(auction).int(bidder).int(price).int(time).str(&extra).int(i + 1).done()
            })
            .collect::<Vec<_>>()
    });
    QueryOutput {
        header: &["auction", "bidder", "price", "dateTime", "extra", "rank_number"],
        rows,
        kind: QueryKind::Updating,
        late: Vec::new(),
    }
}
