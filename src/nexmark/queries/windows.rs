//! Windowed queries: hot items, highest bids, sessions, processing-time counts.

use highwater_operators::prelude::*;

use super::{bids, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Bid, Event};

/// Per 10 s sliding window (every 2 s), the auctions with the most bids.
pub(super) fn q5<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let lateness = options.allowed_lateness;
    let counts = bids(events)
        .window(Sliding::of(10.secs(), 2.secs()))
        .key_by(|b: &Bid| b.auction)
        .allowed_lateness(lateness)
        .named("BidsPerAuction")
        .aggregate(Count);
    // Each sliding window's counts arrive at its last millisecond, which lies
    // in exactly one 2 s tumbling window: group them there, by window.
    let num = |r: &WindowResult<i64, u64>| r.value;
    let hottest = counts
        .results
        .window(Tumbling::of(2.secs()))
        .key_by(|r: &WindowResult<i64, u64>| r.window)
        .allowed_lateness(lateness)
        .named("HottestPerWindow")
        .aggregate(if options.exact() { MaxBy::of(num) } else { MaxBy::append_only(num) });
    let rows = hottest.results.flat_map(move |r| {
        r.value
            .into_iter()
            .map(move |c| fmt.row().int(c.window.start).int(c.window.end).int(c.key).int(c.value).done())
            .collect::<Vec<_>>()
    });
    QueryOutput {
        header: &["window_start", "window_end", "auction", "num"],
        rows,
        kind: QueryKind::Append,
        late: vec![counts.late.count, hottest.late.count],
    }
}

/// Per 10 s tumbling window, the bids with the highest price.
pub(super) fn q7<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let price = |b: &Bid| b.price;
    let highest = bids(events)
        .window(Tumbling::of(10.secs()))
        .allowed_lateness(options.allowed_lateness)
        .named("HighestBid")
        .aggregate(if options.exact() { MaxBy::of(price) } else { MaxBy::append_only(price) });
    let rows = highest.results.flat_map(move |r| {
        let w = r.window;
        r.value
            .into_iter()
            .map(move |b| {
                fmt.row()
                    .int(w.start)
                    .int(w.end)
                    .int(b.auction)
                    .int(b.bidder)
                    .int(b.price)
                    .int(b.date_time)
                    .str(&b.extra)
                    .done()
            })
            .collect::<Vec<_>>()
    });
    QueryOutput {
        header: &["window_start", "window_end", "auction", "bidder", "price", "dateTime", "extra"],
        rows,
        kind: QueryKind::Append,
        late: vec![highest.late.count],
    }
}

/// Bid sessions per bidder (10 s gap), with their number of bids.
pub(super) fn q11<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let sessions = bids(events)
        .window(Session::with_gap(10.secs()))
        .key_by(|b: &Bid| b.bidder)
        .allowed_lateness(options.allowed_lateness)
        .named("BidderSessions")
        .aggregate(Count);
    let rows =
        sessions.results.map(move |r| fmt.row().int(r.window.start).int(r.window.end).int(r.key).int(r.value).done());
    QueryOutput {
        header: &["window_start", "window_end", "bidder", "bid_count"],
        rows,
        kind: QueryKind::Append,
        late: vec![sessions.late.count],
    }
}

/// Bids per bidder per 10 s of processing time.
pub(super) fn q12<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let counts = bids(events)
        .window(GlobalWindows::with_trigger(ProcessingTimeTrigger(10.secs()).purging()))
        .key_by(|b: &Bid| b.bidder)
        .named("ProcessingTimeCounts")
        .aggregate(Count);
    let rows =
        counts.results.map(move |r| fmt.row().int(r.key).int(r.value).int(r.window.start).int(r.window.end).done());
    QueryOutput {
        header: &["bidder", "bid_count", "window_start", "window_end"],
        rows,
        kind: QueryKind::Append,
        late: vec![counts.late.count],
    }
}
