//! The first path of [`NexmarkDecoder`](super::NexmarkDecoder): a line laid
//! out exactly as [`write_event`](super::write_event) (and the generator,
//! and Flink's Nexmark JSON) writes it — no whitespace, `event_type` first,
//! the record's fields in declaration order — read as a sequence of
//! expected byte strings and values, with no search for keys and no index
//! of quotes. `None` as soon as a byte differs; the caller then tries the
//! [`fast`](super::fast) path, which takes any order and whitespace, and
//! then `serde_json`.
//!
//! What it accepts: the fixed text between the values, integers of 1 to 18
//! digits without a leading zero (the next fixed text starts with `,` or
//! `}`, so no fraction or exponent follows), strings of ASCII without a
//! control character, `"` or `\` (so no escape and nothing to check for
//! UTF-8), and nothing after the last `}`. `serde_json` reads every such
//! line as the same event (the property tests in [`super`] and the
//! `nexmark_fast` fuzz target check it).

use super::{Auction, Bid, Event, Person};

use crate::source::intern;
use crate::source::scan::{digits, first_special};

/// The event on `line`, or `None` if it is not in the canonical layout.
#[inline]
pub(super) fn decode(line: &[u8]) -> Option<Event> {
    let mut c = Cursor { bytes: line, pos: 0 };
    c.fixed(b"{\"event_type\":")?;
    let event = match c.bytes.get(c.pos)? {
        b'2' => {
            c.pos += 1;
            Event::Bid(bid(&mut c)?)
        }
        b'1' => {
            c.pos += 1;
            Event::Auction(Box::new(auction(&mut c)?))
        }
        b'0' => {
            c.pos += 1;
            Event::Person(Box::new(person(&mut c)?))
        }
        _ => return None,
    };
    (c.pos == line.len()).then_some(event)
}

fn bid(c: &mut Cursor<'_>) -> Option<Bid> {
    c.fixed(b",\"bid\":{\"auction\":")?;
    let auction = c.integer()?;
    c.fixed(b",\"bidder\":")?;
    let bidder = c.integer()?;
    c.fixed(b",\"price\":")?;
    let price = c.integer()?;
    c.fixed(b",\"channel\":\"")?;
    let channel = intern::shared(c.string()?);
    c.fixed(b",\"url\":\"")?;
    let url = intern::shared(c.string()?);
    c.fixed(b",\"dateTime\":")?;
    let date_time = c.integer()? as u64;
    c.fixed(b",\"extra\":\"")?;
    let extra = c.string()?.to_owned();
    c.fixed(b"}}")?;
    Some(Bid { auction, bidder, price, channel, url, date_time, extra })
}

fn auction(c: &mut Cursor<'_>) -> Option<Auction> {
    c.fixed(b",\"auction\":{\"id\":")?;
    let id = c.integer()?;
    c.fixed(b",\"itemName\":\"")?;
    let item_name = c.string()?.to_owned();
    c.fixed(b",\"description\":\"")?;
    let description = c.string()?.to_owned();
    c.fixed(b",\"initialBid\":")?;
    let initial_bid = c.integer()?;
    c.fixed(b",\"reserve\":")?;
    let reserve = c.integer()?;
    c.fixed(b",\"dateTime\":")?;
    let date_time = c.integer()? as u64;
    c.fixed(b",\"expires\":")?;
    let expires = c.integer()? as u64;
    c.fixed(b",\"seller\":")?;
    let seller = c.integer()?;
    c.fixed(b",\"category\":")?;
    let category = c.integer()?;
    c.fixed(b",\"extra\":\"")?;
    let extra = c.string()?.to_owned();
    c.fixed(b"}}")?;
    Some(Auction { id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra })
}

fn person(c: &mut Cursor<'_>) -> Option<Person> {
    c.fixed(b",\"person\":{\"id\":")?;
    let id = c.integer()?;
    c.fixed(b",\"name\":\"")?;
    let name = c.string()?.to_owned();
    c.fixed(b",\"emailAddress\":\"")?;
    let email_address = c.string()?.to_owned();
    c.fixed(b",\"creditCard\":\"")?;
    let credit_card = c.string()?.to_owned();
    c.fixed(b",\"city\":\"")?;
    let city = c.string()?.to_owned();
    c.fixed(b",\"state\":\"")?;
    let state = c.string()?.to_owned();
    c.fixed(b",\"dateTime\":")?;
    let date_time = c.integer()? as u64;
    c.fixed(b",\"extra\":\"")?;
    let extra = c.string()?.to_owned();
    c.fixed(b"}}")?;
    Some(Person { id, name, email_address, credit_card, city, state, date_time, extra })
}

/// A position in one line.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// Exactly the bytes `text` (a constant: compared as a few words).
    #[inline(always)]
    fn fixed<const N: usize>(&mut self, text: &[u8; N]) -> Option<()> {
        let here: &[u8; N] = self.bytes.get(self.pos..self.pos + N)?.try_into().ok()?;
        if here == text {
            self.pos += N;
            Some(())
        } else {
            None
        }
    }

    /// 1 to 18 digits, without a leading zero: a value any `i64` holds.
    #[inline(always)]
    fn integer(&mut self) -> Option<i64> {
        let (value, digits) = digits(self.bytes.get(self.pos..)?)?;
        self.pos += digits;
        // At most 18 digits: below 10^18 < i64::MAX.
        Some(value as i64)
    }

    /// The rest of a string whose opening quote has been read, and its
    /// closing quote: ASCII without control characters or `\`.
    #[inline(always)]
    fn string(&mut self) -> Option<&'a str> {
        let rest = &self.bytes[self.pos..];
        let len = first_special(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.pos += len + 1;
        // SAFETY: `first_special` stops at the first byte that is not
        // ASCII, is a control character, `"` or `\`, so the bytes before
        // it are ASCII.
        Some(unsafe { std::str::from_utf8_unchecked(&rest[..len]) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BID: &[u8] = br#"{"event_type":2,"bid":{"auction":1008,"bidder":1001,"price":16637,"channel":"Google","url":"https://www.nexmark.com/a/b/c/item.htm?query=1","dateTime":1704067203456,"extra":"x"}}"#;

    #[test]
    fn reads_the_layout_and_nothing_else() {
        let Some(Event::Bid(bid)) = decode(BID) else { panic!("the canonical layout") };
        assert_eq!((bid.auction, bid.bidder, bid.price, bid.date_time), (1008, 1001, 16637, 1_704_067_203_456));
        assert_eq!((&*bid.channel, &*bid.extra), ("Google", "x"));
        let text = std::str::from_utf8(BID).unwrap();
        for changed in [
            text.replace("16637", "016637"),
            text.replace("16637", "1.5"),
            text.replace("16637", "1e3"),
            text.replace("16637", "-1"),
            text.replace("16637", "1234567890123456789"),
            text.replace("16637", ""),
            text.replace("Google", "Goo\\\"gle"),
            text.replace("Google", "Goo\tgle"),
            text.replace("Google", "Goögle"),
            text.replace("\"x\"", "\"x"),
            text.replace(":2,", ":1,"),
            text.replace(":2,", ": 2,"),
            format!("{text} "),
            text.replace("}}", "}"),
        ] {
            assert_eq!(decode(changed.as_bytes()), None, "{changed}");
        }
        let Some(Event::Bid(bid)) = decode(text.replace("16637", "0").as_bytes()) else { panic!("a zero") };
        assert_eq!(bid.price, 0);
        let Some(Event::Bid(bid)) = decode(text.replace("16637", "123456789012345678").as_bytes()) else {
            panic!("18 digits")
        };
        assert_eq!(bid.price, 123_456_789_012_345_678);
        // A line cut anywhere is not taken (and does not panic).
        for end in 0..BID.len() {
            assert_eq!(decode(&BID[..end]), None, "{end}");
        }
    }
}
