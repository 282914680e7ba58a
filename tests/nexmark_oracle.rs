//! Every Nexmark query against a naive evaluator of its definition.
//!
//! The evaluator below works on the whole list of events at once (sort, group,
//! nested loops), straight from the definitions in the Nexmark query table,
//! sharing no code with the dataflows. Each query runs on generated events at
//! 1 and 2 workers, in event-time order and out of order (within the
//! watermark delay), and its final result must equal the evaluator's.

mod common;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::{field, run_query};
use highwater::nexmark::{Auction, Bid, Event, GeneratorConfig, Person, Query, QueryOptions};

/// Days since the epoch to `yyyy-MM-dd`, by counting years and months.
fn day(ms: u64) -> String {
    let mut days = ms / 86_400_000;
    let leap = |y: u64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mut year = 1970;
    while days >= if leap(year) { 366 } else { 365 } {
        days -= if leap(year) { 366 } else { 365 };
        year += 1;
    }
    let lengths = [31, if leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 0;
    while days >= lengths[month] {
        days -= lengths[month];
        month += 1;
    }
    format!("{year:04}-{:02}-{:02}", month + 1, days + 1)
}

fn hour(ms: u64) -> u64 {
    ms % 86_400_000 / 3_600_000
}

fn euro(price: i64) -> String {
    let t = price as i128 * 908;
    format!("{}{}.{:03}", if t < 0 { "-" } else { "" }, t.abs() / 1000, t.abs() % 1000)
}

fn row(fields: &[String]) -> String {
    fields.join(",")
}

macro_rules! r {
    ($($f:expr),* $(,)?) => { row(&[$(format!("{}", $f)),*]) };
}

struct Data {
    persons: Vec<Person>,
    auctions: Vec<Auction>,
    bids: Vec<Bid>,
}

fn split(events: &[Event]) -> Data {
    let mut d = Data { persons: vec![], auctions: vec![], bids: vec![] };
    for e in events {
        match e {
            Event::Person(p) => d.persons.push((**p).clone()),
            Event::Auction(a) => d.auctions.push((**a).clone()),
            Event::Bid(b) => d.bids.push(b.clone()),
        }
    }
    d
}

/// The winning bid of every auction that has a bid in its lifetime.
fn winners(d: &Data) -> Vec<(&Auction, &Bid)> {
    let mut out = Vec::new();
    for a in &d.auctions {
        let best = d
            .bids
            .iter()
            .filter(|b| b.auction == a.id && a.date_time <= b.date_time && b.date_time <= a.expires)
            .max_by_key(|b| (b.price, Reverse(b.date_time), Reverse(b.bidder), Reverse(b.extra.clone())));
        if let Some(b) = best {
            out.push((a, b));
        }
    }
    out
}

fn rank(price: i64) -> usize {
    if price < 10_000 {
        1
    } else if price < 1_000_000 {
        2
    } else {
        3
    }
}

/// 12 counts of q15/q16 over a group of bids.
fn counts(bids: &[&Bid]) -> Vec<String> {
    let mut out = vec![bids.len().to_string()];
    for r in 1..=3 {
        out.push(bids.iter().filter(|b| rank(b.price) == r).count().to_string());
    }
    let distinct = |f: &dyn Fn(&Bid) -> i64, r: usize| {
        bids.iter().filter(|b| r == 0 || rank(b.price) == r).map(|b| f(b)).collect::<BTreeSet<_>>().len().to_string()
    };
    for r in 0..=3 {
        out.push(distinct(&|b| b.bidder, r));
    }
    for r in 0..=3 {
        out.push(distinct(&|b| b.auction, r));
    }
    out
}

fn expected(query: u8, events: &[Event]) -> Vec<String> {
    expected_with_ttl(query, events, u64::MAX)
}

/// [`expected`], the unwindowed joins (q3, q20) joining only records whose
/// event times are at most `ttl` apart (a state time-to-live in event time).
/// A key's bids in the epochs a state TTL makes of them: in event-time
/// order, a bid more than `ttl` after the latest one before it starts the
/// key afresh.
fn epochs(mut bids: Vec<&Bid>, ttl: u64) -> Vec<Vec<&Bid>> {
    bids.sort_by_key(|b| b.date_time);
    let mut out: Vec<Vec<&Bid>> = Vec::new();
    for b in bids {
        match out.last_mut() {
            Some(epoch) if b.date_time - epoch.last().unwrap().date_time <= ttl => epoch.push(b),
            _ => out.push(vec![b]),
        }
    }
    out
}

fn expected_with_ttl(query: u8, events: &[Event], ttl: u64) -> Vec<String> {
    let within = |a: u64, b: u64| a.abs_diff(b) <= ttl;
    let d = split(events);
    let mut rows: Vec<String> = match query {
        0 => d
            .bids
            .iter()
            .map(|b| r!(b.auction, b.bidder, b.price, field(&b.channel), field(&b.url), b.date_time, field(&b.extra)))
            .collect(),
        1 => d.bids.iter().map(|b| r!(b.auction, b.bidder, euro(b.price), b.date_time, field(&b.extra))).collect(),
        2 => d.bids.iter().filter(|b| b.auction % 123 == 0).map(|b| r!(b.auction, b.price)).collect(),
        3 => {
            let mut out = vec![];
            for p in d.persons.iter().filter(|p| ["OR", "ID", "CA"].contains(&p.state.as_str())) {
                for a in d
                    .auctions
                    .iter()
                    .filter(|a| a.category == 10 && a.seller == p.id && within(a.date_time, p.date_time))
                {
                    out.push(r!(field(&p.name), field(&p.city), field(&p.state), a.id));
                }
            }
            out
        }
        4 => {
            let mut per: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
            for (a, b) in winners(&d) {
                per.entry(a.category).or_default().push(b.price);
            }
            per.into_iter()
                .map(|(c, prices)| r!(c, prices.iter().map(|p| *p as i128).sum::<i128>() as f64 / prices.len() as f64))
                .collect()
        }
        5 => {
            let mut per_window: BTreeMap<u64, HashMap<i64, u64>> = BTreeMap::new();
            for b in &d.bids {
                let mut start = b.date_time - b.date_time % 2000;
                loop {
                    *per_window.entry(start).or_default().entry(b.auction).or_default() += 1;
                    if start < 2000 || start - 2000 + 10_000 <= b.date_time {
                        break;
                    }
                    start -= 2000;
                }
            }
            let mut out = vec![];
            for (start, counts) in per_window {
                let max = counts.values().max().unwrap();
                for (auction, n) in counts.iter().filter(|(_, n)| *n == max) {
                    out.push(r!(start, start + 10_000, auction, n));
                }
            }
            out
        }
        6 => {
            let mut per: BTreeMap<i64, Vec<(u64, i64, i64)>> = BTreeMap::new();
            for (a, b) in winners(&d) {
                per.entry(a.seller).or_default().push((a.expires, a.id, b.price));
            }
            per.into_iter()
                .map(|(seller, mut closed)| {
                    closed.sort();
                    let last: Vec<_> = closed.iter().rev().take(10).collect();
                    r!(seller, last.iter().map(|c| c.2 as i128).sum::<i128>() as f64 / last.len() as f64)
                })
                .collect()
        }
        7 => {
            let mut per: BTreeMap<u64, Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry(b.date_time / 10_000 * 10_000).or_default().push(b);
            }
            let mut out = vec![];
            for (start, bids) in per {
                let max = bids.iter().map(|b| b.price).max().unwrap();
                for b in bids.iter().filter(|b| b.price == max) {
                    out.push(r!(start, start + 10_000, b.auction, b.bidder, b.price, b.date_time, field(&b.extra)));
                }
            }
            out
        }
        8 => {
            let mut out = BTreeSet::new();
            for p in &d.persons {
                let w = p.date_time / 10_000;
                if d.auctions.iter().any(|a| a.seller == p.id && a.date_time / 10_000 == w) {
                    out.insert(r!(w * 10_000, w * 10_000 + 10_000, p.id, field(&p.name)));
                }
            }
            out.into_iter().collect()
        }
        9 => winners(&d)
            .into_iter()
            .map(|(a, b)| {
                r!(
                    a.id,
                    a.seller,
                    a.category,
                    a.initial_bid,
                    a.reserve,
                    a.date_time,
                    a.expires,
                    b.bidder,
                    b.price,
                    b.date_time
                )
            })
            .collect(),
        10 => d.bids.iter().map(|b| r!(b.auction, b.bidder, b.price, b.date_time, field(&b.extra))).collect(),
        11 => {
            let mut per: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
            for b in &d.bids {
                per.entry(b.bidder).or_default().push(b.date_time);
            }
            let mut out = vec![];
            for (bidder, mut times) in per {
                times.sort();
                let (mut first, mut last, mut n) = (times[0], times[0], 0);
                for t in times {
                    if t > last + 10_000 {
                        out.push(r!(first, last + 10_000, bidder, n));
                        first = t;
                        n = 0;
                    }
                    last = t;
                    n += 1;
                }
                out.push(r!(first, last + 10_000, bidder, n));
            }
            out
        }
        13 => d
            .bids
            .iter()
            .map(|b| r!(b.auction, b.bidder, b.price, b.date_time, format!("value-{}", b.auction % 10_000)))
            .collect(),
        14 => d
            .bids
            .iter()
            .filter(|b| {
                let t = b.price as i128 * 908;
                t > 1_000_000_000 && t < 50_000_000_000
            })
            .map(|b| {
                let kind = match hour(b.date_time) {
                    8..=18 => "dayTime",
                    0..=6 | 20..=23 => "nightTime",
                    _ => "otherTime",
                };
                r!(b.auction, b.bidder, euro(b.price), kind, b.date_time, field(&b.extra), b.extra.matches('c').count())
            })
            .collect(),
        15 => {
            let mut per: BTreeMap<String, Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry(day(b.date_time)).or_default().push(b);
            }
            per.into_iter().map(|(k, bids)| [vec![k], counts(&bids)].concat().join(",")).collect()
        }
        16 => {
            let mut per: BTreeMap<(String, String), Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry((b.channel.to_string(), day(b.date_time))).or_default().push(b);
            }
            per.into_iter()
                .map(|((c, k), bids)| {
                    let latest = bids.iter().map(|b| b.date_time % 86_400_000).max().unwrap();
                    let minute = format!("{:02}:{:02}", latest / 3_600_000, latest / 60_000 % 60);
                    [vec![field(&c), k, minute], counts(&bids)].concat().join(",")
                })
                .collect()
        }
        17 => {
            let mut per: BTreeMap<(i64, String), Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry((b.auction, day(b.date_time))).or_default().push(b);
            }
            per.into_iter()
                .map(|((a, k), bids)| {
                    let prices: Vec<i64> = bids.iter().map(|b| b.price).collect();
                    let sum: i64 = prices.iter().sum();
                    let ranks: Vec<usize> = (1..=3).map(|r| prices.iter().filter(|p| rank(**p) == r).count()).collect();
                    r!(
                        a,
                        k,
                        prices.len(),
                        ranks[0],
                        ranks[1],
                        ranks[2],
                        prices.iter().min().unwrap(),
                        prices.iter().max().unwrap(),
                        sum as f64 / prices.len() as f64,
                        sum
                    )
                })
                .collect()
        }
        18 => {
            let mut per: BTreeMap<(i64, i64), Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry((b.bidder, b.auction)).or_default().push(b);
            }
            // Each epoch's latest bid stands (silent expiry retracts nothing).
            per.into_values()
                .flat_map(|bids| epochs(bids, ttl))
                .map(|epoch| {
                    let b = epoch
                        .into_iter()
                        .max_by(|x, y| (x.date_time, x.price, &x.extra).cmp(&(y.date_time, y.price, &y.extra)))
                        .unwrap();
                    r!(b.auction, b.bidder, b.price, field(&b.channel), field(&b.url), b.date_time, field(&b.extra))
                })
                .collect()
        }
        19 => {
            let mut per: BTreeMap<i64, Vec<&Bid>> = BTreeMap::new();
            for b in &d.bids {
                per.entry(b.auction).or_default().push(b);
            }
            let mut out = vec![];
            for (a, bids) in per {
                for mut epoch in epochs(bids, ttl) {
                    epoch.sort_by(|x, y| {
                        y.price
                            .cmp(&x.price)
                            .then(x.date_time.cmp(&y.date_time))
                            .then(x.bidder.cmp(&y.bidder))
                            .then(x.extra.cmp(&y.extra))
                    });
                    for (i, b) in epoch.iter().take(10).enumerate() {
                        out.push(r!(a, b.bidder, b.price, b.date_time, field(&b.extra), i + 1));
                    }
                }
            }
            out
        }
        20 => {
            let mut out = vec![];
            for a in d.auctions.iter().filter(|a| a.category == 10) {
                for b in d.bids.iter().filter(|b| b.auction == a.id && within(a.date_time, b.date_time)) {
                    out.push(r!(
                        b.auction,
                        b.bidder,
                        b.price,
                        field(&b.channel),
                        field(&b.url),
                        b.date_time,
                        field(&b.extra),
                        field(&a.item_name),
                        field(&a.description),
                        a.initial_bid,
                        a.reserve,
                        a.date_time,
                        a.expires,
                        a.seller,
                        a.category,
                        field(&a.extra)
                    ));
                }
            }
            out
        }
        21 => d
            .bids
            .iter()
            .filter_map(|b| {
                let id = match &*b.channel {
                    "Apple" => "0".to_string(),
                    "Google" => "1".to_string(),
                    "Facebook" => "2".to_string(),
                    "Baidu" => "3".to_string(),
                    _ => {
                        let (_, query) = b.url.split_once('?')?;
                        query.split('&').find_map(|kv| kv.strip_prefix("channel_id="))?.to_string()
                    }
                };
                Some(r!(b.auction, b.bidder, b.price, field(&b.channel), id))
            })
            .collect(),
        22 => d
            .bids
            .iter()
            .map(|b| {
                let path = b.url.trim_start_matches("https://www.nexmark.com/");
                let dirs: Vec<&str> = path.split('/').collect();
                r!(b.auction, b.bidder, b.price, field(&b.channel), dirs[0], dirs[1], dirs[2])
            })
            .collect(),
        q => panic!("no oracle for q{q}"),
    };
    rows.sort();
    rows
}

fn check(query: u8, workers: usize, out_of_order_ms: u64) {
    let config: GeneratorConfig = common::config(60_000, out_of_order_ms);
    let events = common::events(&config);
    let want = expected(query, &events);
    let (got, late) = run_query(Query(query), &config, workers, QueryOptions::default());
    assert_eq!(late, 0, "q{query}: nothing is late within the watermark delay");
    assert!(!want.is_empty(), "q{query}: the test data should give a non-empty result");
    if got != want {
        let missing: Vec<_> = want.iter().filter(|r| !got.contains(r)).take(5).collect();
        let extra: Vec<_> = got.iter().filter(|r| !want.contains(r)).take(5).collect();
        panic!(
            "q{query} at {workers} workers, out-of-order {out_of_order_ms} ms: {} rows, expected {}\nmissing: {missing:#?}\nunexpected: {extra:#?}",
            got.len(),
            want.len()
        );
    }
}

macro_rules! oracle_tests {
    ($($name:ident: $q:expr),* $(,)?) => {$(
        mod $name {
            #[test] fn in_order_1w() { super::check($q, 1, 0) }
            #[test] fn in_order_2w() { super::check($q, 2, 0) }
            #[test] fn out_of_order_1w() { super::check($q, 1, 2_000) }
            #[test] fn out_of_order_2w() { super::check($q, 2, 2_000) }
        }
    )*};
}

oracle_tests!(
    q0: 0, q1: 1, q2: 2, q3: 3, q4: 4, q5: 5, q6: 6, q7: 7, q8: 8, q9: 9, q10: 10, q11: 11,
    q13: 13, q14: 14, q15: 15, q16: 16, q17: 17, q18: 18, q19: 19, q20: 20, q21: 21, q22: 22,
);

/// The queries with tumbling, sliding or per-auction windows, which aggregate
/// in two phases (partial results per worker): also at 3 workers.
mod three_workers {
    #[test]
    fn q4() {
        super::check(4, 3, 2_000)
    }
    #[test]
    fn q5() {
        super::check(5, 3, 2_000)
    }
    #[test]
    fn q7() {
        super::check(7, 3, 2_000)
    }
    #[test]
    fn q8() {
        super::check(8, 3, 2_000)
    }
    #[test]
    fn q9() {
        super::check(9, 3, 2_000)
    }
}

/// q12 counts per processing-time window, which no oracle can predict; its
/// counts must still add up to the number of bids per bidder.
#[test]
fn q12_counts_every_bid_once() {
    let config = common::config(60_000, 1_000);
    let events = common::events(&config);
    let mut want: BTreeMap<i64, u64> = BTreeMap::new();
    for e in &events {
        if let Event::Bid(b) = e {
            *want.entry(b.bidder).or_default() += 1;
        }
    }
    for workers in [1, 2] {
        let (rows, _) = run_query(Query(12), &config, workers, QueryOptions::default());
        let mut got: BTreeMap<i64, u64> = BTreeMap::new();
        for row in rows {
            let cols: Vec<&str> = row.split(',').collect();
            *got.entry(cols[0].parse().unwrap()).or_default() += cols[1].parse::<u64>().unwrap();
        }
        assert_eq!(got, want);
    }
}

/// q3 and q20 with a state time-to-live (`--state-ttl`): records expire
/// `ttl` of event time after their own, so the joins keep the pairs whose
/// times are at most that apart: equal to the oracle with the same expiry,
/// on 1 and 2 workers, in and out of order; and the TTL does cut pairs (the
/// result differs from the unbounded join's). With retractions every pair
/// is taken back by the end of the input.
mod state_ttl {
    use super::*;
    use highwater_operators::state::{Expiry, StateTtl};

    fn check(query: u8, workers: usize, out_of_order_ms: u64, ttl: u64) {
        let config: GeneratorConfig = common::config(60_000, out_of_order_ms);
        let events = common::events(&config);
        let want = expected_with_ttl(query, &events, ttl);
        assert!(!want.is_empty(), "q{query}: the test data should give a non-empty result");
        let all = expected(query, &events);
        assert!(
            want != all,
            "q{query}: a TTL of {ttl} ms should change the result ({} rows of {})",
            want.len(),
            all.len()
        );
        let options = QueryOptions { state_ttl: Some(StateTtl::event_time(ttl)), ..QueryOptions::default() };
        let (got, late) = run_query(Query(query), &config, workers, options);
        assert_eq!(late, 0, "q{query}: nothing is late within the watermark delay");
        assert_eq!(got.len(), want.len(), "q{query} with a TTL of {ttl} ms at {workers} workers");
        assert!(got == want, "q{query} with a TTL of {ttl} ms at {workers} workers: other rows");
        let retracting = StateTtl::event_time(ttl).expiry(Expiry::Retract);
        let options = QueryOptions { state_ttl: Some(retracting), ..QueryOptions::default() };
        let (got, _) = run_query(Query(query), &config, workers, options);
        assert!(got.is_empty(), "q{query}: every pair is retracted when it expires: {} left", got.len());
    }

    #[test]
    fn q20_in_order_1w() {
        check(20, 1, 0, 300);
    }
    #[test]
    fn q20_out_of_order_2w() {
        check(20, 2, 2_000, 300);
    }
    #[test]
    fn q3_in_order_2w() {
        check(3, 2, 0, 5_000);
    }
    #[test]
    fn q3_out_of_order_1w() {
        check(3, 1, 2_000, 5_000);
    }
    #[test]
    fn q18_in_order_2w() {
        check(18, 2, 0, 100);
    }
    #[test]
    fn q18_out_of_order_1w() {
        check(18, 1, 2_000, 100);
    }
    #[test]
    fn q19_out_of_order_2w() {
        check(19, 2, 2_000, 50);
    }
}
