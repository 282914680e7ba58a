//! Queries over closed auctions: the winning bid of each auction.

use std::cmp::Reverse;

use highwater_operators::join::by_record;
use highwater_operators::prelude::*;
use highwater_operators::Counter;
use serde::{Deserialize, Serialize};

use super::{auctions, bids, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Auction, Bid, Event};

/// The fields of an auction the closing-price queries use (plain integers:
/// cheap to copy into every matching pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Lot {
    id: i64,
    seller: i64,
    category: i64,
    initial_bid: i64,
    reserve: i64,
    date_time: u64,
    expires: u64,
}

/// The fields of a bid the closing-price queries use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct Offer {
    bidder: i64,
    price: i64,
    date_time: u64,
    extra: String,
}

/// Per auction, its best bid among the bids with a time in
/// `[auction.dateTime, auction.expires]`, emitted when the auction closes.
/// Best: highest price, then earliest bid, then lowest bidder, then lowest
/// `extra` (all ties only if two bids are identical in all of these).
/// `extra` is carried only if `with_extra` (q9): q4 and q6 need the price alone.
fn winning_bids<'scope>(
    events: &EventStream<'scope, Event>,
    options: &QueryOptions,
    with_extra: bool,
) -> (EventStream<'scope, (Lot, Offer)>, Vec<Counter>) {
    let lateness = options.allowed_lateness;
    let lots = auctions(events).map(move |a: Auction| Lot {
        id: a.id,
        seller: a.seller,
        category: a.category,
        initial_bid: a.initial_bid,
        reserve: a.reserve,
        date_time: a.date_time,
        expires: a.expires,
    });
    let offers = bids(events).map(move |b: Bid| {
        (
            b.auction,
            Offer {
                bidder: b.bidder,
                price: b.price,
                date_time: b.date_time,
                extra: if with_extra { b.extra } else { String::new() },
            },
        )
    });
    let joined = lots.interval_join_core(
        "AuctionBids",
        &offers,
        |a: &Lot| a.id,
        |(auction, _): &(i64, Offer)| *auction,
        by_record(0, |a: &Lot, _t| (a.date_time, a.expires)),
        AllowedLateness(lateness),
        |a, (_, o)| (*a, o.clone()),
    );
    // Ranked without `extra` (no string copies per bid); ties on all the rest are
    // broken by `extra` below.
    let rank = |(_, o): &(Lot, Offer)| (o.price, Reverse(o.date_time), Reverse(o.bidder));
    let best = if options.exact() { MaxBy::of(rank) } else { MaxBy::append_only(rank) };
    let closed = joined
        .results
        .window(windows_by(|(a, _): &(Lot, Offer), _t| Window::new(a.date_time, a.expires + 1)))
        .key_by(|(a, _): &(Lot, Offer)| a.id)
        .allowed_lateness(lateness)
        .named("ClosingBid")
        .aggregate(best);
    let winners = closed.results.flat_map(move |r| {
        let least_extra = r.value.iter().map(move |(_, o)| o.extra.clone()).min();
        r.value.into_iter().filter(move |(_, o)| Some(&o.extra) == least_extra.as_ref())
    });
    (winners, vec![joined.late_left.count, joined.late_right.count, closed.late.count])
}

/// Average closing price per category.
pub(super) fn q4<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let (winners, late) = winning_bids(events, options, false);
    let rows = winners
        .map(move |(a, b)| (a.category, b.price))
        .aggregate_by_key_named("AvgByCategory", |(c, _): &(i64, i64)| *c, Avg::of(|(_, p): &(i64, i64)| *p))
        .map(move |(category, avg)| fmt.row().int(category).float(avg).done());
    QueryOutput { header: &["category", "avg_final"], rows, kind: QueryKind::Updating, late }
}

/// Per seller, the average closing price of its last 10 closed auctions.
pub(super) fn q6<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let (winners, late) = winning_bids(events, options, false);
    // Closed auctions in closing order: (expires, id) orders ties by id.
    let closed = winners.map(move |(a, b)| (a.expires, a.id, a.seller, b.price));
    let last_closed = |c: &(u64, i64, i64, i64)| (c.0, c.1);
    let windows = closed
        .window(CountWindows::sliding(10, 1))
        .key_by(|c: &(u64, i64, i64, i64)| c.2)
        .allowed_lateness(options.allowed_lateness)
        .named("LastTenClosed")
        .aggregate((
            Avg::of(|c: &(u64, i64, i64, i64)| c.3),
            if options.exact() { Max::of(last_closed) } else { Max::append_only(last_closed) },
        ));
    let newest = |r: &WindowResult<i64, (f64, (u64, i64))>| r.value.1;
    let latest = if options.exact() { MaxBy::of(newest) } else { MaxBy::append_only(newest) };
    let rows = windows.results.aggregate_by_key_named("LatestPerSeller", |r| r.key, latest).flat_map(
        move |(seller, results)| results.into_iter().map(move |r| fmt.row().int(seller).float(r.value.0).done()),
    );
    let mut late = late;
    late.push(windows.late.count);
    QueryOutput { header: &["seller", "avg_price"], rows, kind: QueryKind::Updating, late }
}

/// Per auction, its winning bid.
pub(super) fn q9<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let (winners, late) = winning_bids(events, options, true);
    let rows = winners.map(move |(a, b)| {
        fmt.row()
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
