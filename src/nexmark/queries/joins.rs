//! Join queries: people with their auctions, bids with their auctions.

use highwater_operators::join::by_record;
use highwater_operators::key::{Data, Key};
use highwater_operators::prelude::*;
use highwater_operators::Counter;

use super::{auctions, bids, persons, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Auction, Bid, Event, Person};

/// Sellers in OR, ID or CA with their category-10 auctions (unwindowed).
pub(super) fn q3<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let sellers = persons(events).filter(|p: &Person| matches!(p.state.as_str(), "OR" | "ID" | "CA"));
    let auctions = auctions(events).filter(|a: &Auction| a.category == 10);
    let (rows, kind, late) = join(
        &sellers,
        &auctions,
        |p| p.id,
        |a| a.seller,
        move |p, a| fmt.row().str(&p.name).str(&p.city).str(&p.state).int(a.id).done(),
        options,
    );
    QueryOutput { header: &["name", "city", "state", "id"], rows, kind, late }
}

/// `left` joined with `right` unwindowed: for ever, or with the options'
/// state time-to-live. Then records behind the watermark are late
/// (counted), the expired ones are counted in the job's totals (as
/// `Join.expired`, by the operator), and with retractions the rows are a
/// changelog.
#[allow(clippy::too_many_arguments)]
fn join<'scope, L, R, K, O>(
    left: &EventStream<'scope, L>,
    right: &EventStream<'scope, R>,
    key_left: impl Fn(&L) -> K + 'static,
    key_right: impl Fn(&R) -> K + 'static,
    output: impl Fn(&L, &R) -> O + 'static,
    options: &QueryOptions,
) -> (EventStream<'scope, O>, QueryKind, Vec<Counter>)
where
    L: Data + PartialEq,
    R: Data + PartialEq,
    K: Key,
    O: Data,
{
    let Some(ttl) = options.state_ttl else {
        return (left.join(right, key_left, key_right, output), QueryKind::Append, Vec::new());
    };
    let joined = left.state_ttl(ttl).join(right, key_left, key_right, output);
    let kind = if ttl.retracts() { QueryKind::Updating } else { QueryKind::Append };
    (joined.results, kind, vec![joined.late_left.count, joined.late_right.count])
}

/// People who registered and opened an auction in the same 10 s window.
pub(super) fn q8<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let lateness = options.allowed_lateness;
    let exact = options.exact();
    let name = |p: &Person| p.name.clone();
    let people = persons(events)
        .window(Tumbling::of(10.secs()))
        .key_by(|p: &Person| p.id)
        .allowed_lateness(lateness)
        .named("Q8People")
        .aggregate(if exact { Max::of(name) } else { Max::append_only(name) });
    let sellers = auctions(events)
        .window(Tumbling::of(10.secs()))
        .key_by(|a: &Auction| a.seller)
        .allowed_lateness(lateness)
        .named("Q8Sellers")
        .aggregate(Count);
    // Both sides are window results at the window's last millisecond: join on
    // (window, person) at equal times.
    let joined = people.results.interval_join_core(
        "Q8Join",
        &sellers.results,
        |p| (p.window, p.key),
        |s| (s.window, s.key),
        by_record(0, |_, t| (t, t)),
        AllowedLateness(lateness),
        move |p, _s| fmt.row().int(p.window.start).int(p.window.end).int(p.key).str(&p.value).done(),
    );
    QueryOutput {
        header: &["window_start", "window_end", "id", "name"],
        rows: joined.results,
        kind: QueryKind::Append,
        late: vec![people.late.count, sellers.late.count, joined.late_left.count, joined.late_right.count],
    }
}

/// Bids on category-10 auctions, with the auction (unwindowed).
pub(super) fn q20<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let auctions = auctions(events).filter(|a: &Auction| a.category == 10);
    let (rows, kind, late) = join(
        &bids(events),
        &auctions,
        |b: &Bid| b.auction,
        |a: &Auction| a.id,
        move |b, a| {
            fmt.row()
                .bid(b)
                .str(&a.item_name)
                .str(&a.description)
                .int(a.initial_bid)
                .int(a.reserve)
                .int(a.date_time)
                .int(a.expires)
                .int(a.seller)
                .int(a.category)
                .str(&a.extra)
                .done()
        },
        options,
    );
    QueryOutput {
        header: &[
            "auction",
            "bidder",
            "price",
            "channel",
            "url",
            "dateTime",
            "extra",
            "itemName",
            "description",
            "initialBid",
            "reserve",
            "auction_dateTime",
            "expires",
            "seller",
            "category",
            "auction_extra",
        ],
        rows,
        kind,
        late,
    }
}
