//! The fast path of [`NexmarkDecoder`](super::NexmarkDecoder): the format
//! read with a [`Scanner`], `None` for anything it does not handle (the caller
//! then asks `serde_json`).
//!
//! It takes `event_type` first and then the record's key (the order
//! [`write_event`](super::write_event), Flink's and the generator's files
//! use), the record's fields in any order, each exactly once, strings without
//! escapes and non-negative integers of at most 18 digits. Whatever it
//! accepts, `serde_json` accepts as the same event (the property test below
//! and the `nexmark_fast` fuzz target check it).

use super::{Auction, Bid, Event, Person};

use crate::source::intern;
use crate::source::scan::Scanner;

/// The event on `line`, or `None` if the fast path does not handle it.
#[inline]
pub(super) fn decode(line: &[u8]) -> Option<Event> {
    let mut s = Scanner::new(line);
    s.punct(b'{')?;
    if s.key()? != b"event_type" {
        return None;
    }
    let event_type = s.integer()?;
    if !s.next_member()? {
        return None;
    }
    let event = match (event_type, s.key()?) {
        (2, b"bid") => Event::Bid(bid(&mut s)?),
        (1, b"auction") => Event::Auction(Box::new(auction(&mut s)?)),
        (0, b"person") => Event::Person(Box::new(person(&mut s)?)),
        _ => return None,
    };
    if s.next_member()? {
        return None;
    }
    s.end()?;
    Some(event)
}

/// Reads an object into the struct `$ty`: each JSON key with the field it
/// fills and how its value is read; `None` on an unknown, repeated or
/// missing key.
macro_rules! record {
    ($s:ident, $ty:ident { $($key:literal => $field:ident: $read:expr),* $(,)? }) => {{
        $s.punct(b'{')?;
        $(let mut $field = None;)*
        loop {
            match $s.key()? {
                $($key if $field.is_none() => $field = Some($read),)*
                _ => return None,
            }
            if !$s.next_member()? {
                break;
            }
        }
        Some($ty { $($field: $field?,)* })
    }};
}

fn bid(s: &mut Scanner<'_>) -> Option<Bid> {
    record!(s, Bid {
        b"auction" => auction: s.integer()? as i64,
        b"bidder" => bidder: s.integer()? as i64,
        b"price" => price: s.integer()? as i64,
        b"channel" => channel: intern::shared(s.string()?),
        b"url" => url: intern::shared(s.string()?),
        b"dateTime" => date_time: s.integer()?,
        b"extra" => extra: s.string()?.to_owned(),
    })
}

fn auction(s: &mut Scanner<'_>) -> Option<Auction> {
    record!(s, Auction {
        b"id" => id: s.integer()? as i64,
        b"itemName" => item_name: s.string()?.to_owned(),
        b"description" => description: s.string()?.to_owned(),
        b"initialBid" => initial_bid: s.integer()? as i64,
        b"reserve" => reserve: s.integer()? as i64,
        b"dateTime" => date_time: s.integer()?,
        b"expires" => expires: s.integer()?,
        b"seller" => seller: s.integer()? as i64,
        b"category" => category: s.integer()? as i64,
        b"extra" => extra: s.string()?.to_owned(),
    })
}

fn person(s: &mut Scanner<'_>) -> Option<Person> {
    record!(s, Person {
        b"id" => id: s.integer()? as i64,
        b"name" => name: s.string()?.to_owned(),
        b"emailAddress" => email_address: s.string()?.to_owned(),
        b"creditCard" => credit_card: s.string()?.to_owned(),
        b"city" => city: s.string()?.to_owned(),
        b"state" => state: s.string()?.to_owned(),
        b"dateTime" => date_time: s.integer()?,
        b"extra" => extra: s.string()?.to_owned(),
    })
}
