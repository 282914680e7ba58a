//! Stateless queries: projections, filters and a static side input.

use std::sync::Arc;

use super::format::{utc_day, utc_hour_minute, BID_COLUMNS};
use super::{bids, default_side_input, QueryKind, QueryOptions, QueryOutput};
use crate::nexmark::model::{Bid, Event};
use highwater_operators::EventStream;

fn append<'scope>(header: &'static [&'static str], rows: EventStream<'scope, String>) -> QueryOutput<'scope> {
    QueryOutput { header, rows, kind: QueryKind::Append, late: Vec::new() }
}

/// Every bid, unchanged.
pub(super) fn q0<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events).map(move |b: Bid| fmt.row().bid(&b).done());
    append(&BID_COLUMNS, rows)
}

/// Every bid with its price in euros.
pub(super) fn q1<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events)
        .map(move |b: Bid| fmt.row().int(b.auction).int(b.bidder).euros(b.price).int(b.date_time).str(&b.extra).done());
    append(&["auction", "bidder", "price", "dateTime", "extra"], rows)
}

/// Bids on auctions whose id is a multiple of 123.
pub(super) fn q2<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = events.flat_map(move |e| match e {
        Event::Bid(b) if b.auction % 123 == 0 => Some(fmt.row().int(b.auction).int(b.price).done()),
        _ => None,
    });
    append(&["auction", "price"], rows)
}

/// Every bid, for files partitioned by UTC day and hour (the partition is
/// derived from the `dateTime` column when written).
pub(super) fn q10<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events)
        .map(move |b: Bid| fmt.row().int(b.auction).int(b.bidder).int(b.price).int(b.date_time).str(&b.extra).done());
    append(&["auction", "bidder", "price", "dateTime", "extra"], rows)
}

/// The partition directory of a q10 row's `dateTime`: `dt=yyyy-MM-dd/hm=HH`.
pub fn q10_partition(date_time: u64) -> String {
    format!("dt={}/hm={:02}", utc_day(date_time), utc_hour_minute(date_time).0)
}

/// Bids joined with a static side input on `auction % 10000`.
pub(super) fn q13<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let side = options.side_input.clone().unwrap_or_else(|| Arc::new(default_side_input()));
    let rows = bids(events).flat_map(move |b: Bid| {
        side.get(&(b.auction % 10_000))
            .map(move |value| fmt.row().int(b.auction).int(b.bidder).int(b.price).int(b.date_time).str(value).done())
    });
    append(&["auction", "bidder", "price", "dateTime", "value"], rows)
}

/// Bids with a euro price in (1 000 000, 50 000 000), with the time of day and
/// the number of `c` in `extra`.
pub(super) fn q14<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events).flat_map(move |b: Bid| {
        let thousandths = i128::from(b.price) * 908;
        if !(thousandths > 1_000_000_000 && thousandths < 50_000_000_000) {
            return None;
        }
        let hour = utc_hour_minute(b.date_time).0;
        let time_type = match hour {
            8..=18 => "dayTime",
            0..=6 | 20..=23 => "nightTime",
            _ => "otherTime",
        };
        let c_counts = b.extra.bytes().filter(|c| *c == b'c').count();
        Some(
            fmt.row()
                .int(b.auction)
                .int(b.bidder)
                .euros(b.price)
                .str(time_type)
                .int(b.date_time)
                .str(&b.extra)
                .int(c_counts)
                .done(),
        )
    });
    append(&["auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts"], rows)
}

/// The channel id of a bid: fixed for the hot channels, else the url's
/// `channel_id` parameter.
pub fn channel_id(channel: &str, url: &str) -> Option<String> {
    match channel.to_ascii_lowercase().as_str() {
        "apple" => return Some("0".into()),
        "google" => return Some("1".into()),
        "facebook" => return Some("2".into()),
        "baidu" => return Some("3".into()),
        _ => {}
    }
    let at = url.find("&channel_id=").map(move |i| i + 1).or_else(|| url.starts_with("channel_id=").then_some(0))?;
    let value = &url[at + "channel_id=".len()..];
    Some(value.split('&').next().unwrap_or("").to_owned())
}

/// Bids with a channel id.
pub(super) fn q21<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events).flat_map(move |b: Bid| {
        channel_id(&b.channel, &b.url)
            .map(move |id| fmt.row().int(b.auction).int(b.bidder).int(b.price).str(&b.channel).str(&id).done())
    });
    append(&["auction", "bidder", "price", "channel", "channel_id"], rows)
}

/// The first three path segments of the bid url.
pub(super) fn q22<'scope>(events: &EventStream<'scope, Event>, options: &QueryOptions) -> QueryOutput<'scope> {
    let fmt = options.format();
    let rows = bids(events).map(move |b: Bid| {
        let mut parts = b.url.split('/').skip(3);
        let (d1, d2, d3) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        fmt.row().int(b.auction).int(b.bidder).int(b.price).str(&b.channel).str(d1).str(d2).str(d3).done()
    });
    append(&["auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"], rows)
}
