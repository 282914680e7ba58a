//! Reading and writing the Nexmark JSON Lines format.
//!
//! Each line is `{"event_type": 0|1|2, "person"|"auction"|"bid": {...}}` with
//! exactly those two keys, the record's key matching the type, every field
//! present and of the right JSON type. Any key order, whitespace and string
//! escapes are accepted; anything else is a [`DecodeError`] (and so a dead
//! letter) that says what is wrong.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::model::{Auction, Bid, Event, Person};
use crate::source::{Decode, DecodeError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    event_type: u8,
    person: Option<Person>,
    auction: Option<Auction>,
    bid: Option<Bid>,
}

/// Decodes one line of a Nexmark file.
///
/// ```
/// use highwater::nexmark::{NexmarkDecoder, Event};
/// use highwater::source::Decode;
/// let line = br#"{"event_type":2,"bid":{"auction":1008,"bidder":1001,"price":16637,"channel":"Google","url":"https://www.nexmark.com/a/b/c/item.htm?query=1","dateTime":1704067203456,"extra":"x"}}"#;
/// let Event::Bid(bid) = NexmarkDecoder.decode(line).unwrap() else { panic!() };
/// assert_eq!(bid.price, 16637);
/// let err = NexmarkDecoder.decode(br#"{"event_type":1,"bid":{}}"#).unwrap_err();
/// assert!(err.0.contains("missing field"), "{err}");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NexmarkDecoder;

impl Decode for NexmarkDecoder {
    type Record = Event;
    fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        let line: Line = serde_json::from_slice(bytes).map_err(|e| DecodeError(e.to_string()))?;
        let event = match (line.event_type, line.person, line.auction, line.bid) {
            (0, Some(p), None, None) => Event::Person(Box::new(p)),
            (1, None, Some(a), None) => Event::Auction(Box::new(a)),
            (2, None, None, Some(b)) => Event::Bid(b),
            (t @ 0..=2, p, a, b) => {
                let want = ["person", "auction", "bid"][t as usize];
                let have: Vec<&str> = [("person", p.is_some()), ("auction", a.is_some()), ("bid", b.is_some())]
                    .into_iter()
                    .filter(|(_, present)| *present)
                    .map(|(k, _)| k)
                    .collect();
                return Err(DecodeError(format!("event_type {t} needs exactly the key \"{want}\", found {have:?}")));
            }
            (t, ..) => return Err(DecodeError(format!("event_type {t} is not 0 (person), 1 (auction) or 2 (bid)"))),
        };
        if let Event::Auction(a) = &event {
            if a.expires <= a.date_time {
                return Err(DecodeError(format!(
                    "auction {}: expires {} is not after dateTime {}",
                    a.id, a.expires, a.date_time
                )));
            }
        }
        Ok(event)
    }
}

#[derive(Serialize)]
struct LineRef<'a> {
    event_type: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    person: Option<&'a Person>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auction: Option<&'a Auction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bid: Option<&'a Bid>,
}

/// Writes `event` as one line of the Nexmark format (with its `\n`).
pub fn write_event<W: Write>(out: &mut W, event: &Event) -> std::io::Result<()> {
    let line = match event {
        Event::Person(p) => LineRef { event_type: 0, person: Some(p.as_ref()), auction: None, bid: None },
        Event::Auction(a) => LineRef { event_type: 1, person: None, auction: Some(a.as_ref()), bid: None },
        Event::Bid(b) => LineRef { event_type: 2, person: None, auction: None, bid: Some(b) },
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}
