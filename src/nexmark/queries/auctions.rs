//! Queries over closed auctions: the winning bid of each auction.

use std::cmp::Reverse;

use highwater_operators::join::by_record;
use highwater_operators::prelude::*;
use highwater_operators::Counter;

use super::format::Row;
use super::{auctions, bids, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Auction, Bid, Event};

/// Per auction, its best bid among the bids with a time in
/// `[auction.dateTime, auction.expires]`, emitted when the auction closes.
/// Best: highest price, then earliest bid, then lowest bidder, then lowest
/// `extra` (all ties only if two bids are identical in all of these).
fn winning_bids<'scope>(
    events: &EventStream<'scope, Event>,
    options: &QueryOptions,
) -> (EventStream<'scope, (Auction, Bid)>, Vec<Counter>) {
    let lateness = options.allowed_lateness;
    let joined = auctions(events).interval_join_core(
        "AuctionBids",
        &bids(events),
        |a: &Auction| a.id,
        |b: &Bid| b.auction,
        by_record(0, |a: &Auction, _t| (a.date_time, a.expires)),
        AllowedLateness(lateness),
        |a, b| (a.clone(), b.clone()),
    );
    let rank = |(_, b): &(Auction, Bid)| {
        (
            b.price,
            Reverse(b.date_time),
            Reverse(b.bidder),
            Reverse(b.extra.clone()),
        )
    };
    let best = if options.exact() {
        MaxBy::of(rank)
    } else {
        MaxBy::append_only(rank)
    };
    let closed = joined
        .results
        .window(windows_by(|(a, _): &(Auction, Bid), _t| {
            Window::new(a.date_time, a.expires + 1)
        }))
        .key_by(|(a, _): &(Auction, Bid)| a.id)
        .allowed_lateness(lateness)
        .named("ClosingBid")
        .aggregate(best);
    let winners = closed.results.flat_map(|r| r.value);
    (
        winners,
        vec![
            joined.late_left.count,
            joined.late_right.count,
            closed.late.count,
        ],
    )
}

/// Average closing price per category.
pub(super) fn q4<'scope>(
    events: &EventStream<'scope, Event>,
    options: &QueryOptions,
) -> QueryOutput<'scope> {
    let (winners, late) = winning_bids(events, options);
    let rows = winners
        .map(|(a, b)| (a.category, b.price))
        .aggregate_by_key_named(
            "AvgByCategory",
            |(c, _): &(i64, i64)| *c,
            Avg::of(|(_, p): &(i64, i64)| *p),
        )
        .map(|(category, avg)| Row::new().int(category).float(avg).done());
    QueryOutput {
        header: &["category", "avg_final"],
        rows,
        kind: QueryKind::Updating,
        late,
    }
}

/// Per seller, the average closing price of its last 10 closed auctions.
pub(super) fn q6<'scope>(
    events: &EventStream<'scope, Event>,
    options: &QueryOptions,
) -> QueryOutput<'scope> {
    let (winners, late) = winning_bids(events, options);
    // Closed auctions in closing order: (expires, id) orders ties by id.
    let closed = winners.map(|(a, b)| (a.expires, a.id, a.seller, b.price));
    let last_closed = |c: &(u64, i64, i64, i64)| (c.0, c.1);
    let windows = closed
        .window(CountWindows::sliding(10, 1))
        .key_by(|c: &(u64, i64, i64, i64)| c.2)
        .allowed_lateness(options.allowed_lateness)
        .named("LastTenClosed")
        .aggregate((
            Avg::of(|c: &(u64, i64, i64, i64)| c.3),
            if options.exact() {
                Max::of(last_closed)
            } else {
                Max::append_only(last_closed)
            },
        ));
    let newest = |r: &WindowResult<i64, (f64, (u64, i64))>| r.value.1;
    let latest = if options.exact() {
        MaxBy::of(newest)
    } else {
        MaxBy::append_only(newest)
    };
    let rows = windows
        .results
        .aggregate_by_key_named("LatestPerSeller", |r| r.key, latest)
        .flat_map(|(seller, results)| {
            results
                .into_iter()
                .map(move |r| Row::new().int(seller).float(r.value.0).done())
        });
    let mut late = late;
    late.push(windows.late.count);
    QueryOutput {
        header: &["seller", "avg_price"],
        rows,
        kind: QueryKind::Updating,
        late,
    }
}

/// Per auction, its winning bid.
pub(super) fn q9<'scope>(
    events: &EventStream<'scope, Event>,
    options: &QueryOptions,
) -> QueryOutput<'scope> {
    let (winners, late) = winning_bids(events, options);
    let rows = winners.map(|(a, b)| {
        Row::new()
            .int(a.id)
            .int(a.seller)
            .int(a.category)
            .int(a.initial_bid)
            .int(a.reserve)
            .int(a.date_time)
            .int(a.expires)
            .int(b.bidder)
            .int(b.price)
            .int(b.date_time)
            .done()
    });
    QueryOutput {
        header: &[
            "id",
            "seller",
            "category",
            "initialBid",
            "reserve",
            "dateTime",
            "expires",
            "bidder",
            "price",
            "bid_dateTime",
        ],
        rows,
        kind: QueryKind::Updating,
        late,
    }
}
