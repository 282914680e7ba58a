//! Reading and writing the Nexmark JSON Lines format.
//!
//! Each line is `{"event_type": 0|1|2, "person"|"auction"|"bid": {...}}` with
//! exactly those two keys, the record's key matching the type, every field
//! present and of the right JSON type. Any key order, whitespace and string
//! escapes are accepted; anything else is a [`DecodeError`] (and so a dead
//! letter) that says what is wrong.
//!
//! Decoding tries three readers in turn. First [`canonical`]: the line as
//! [`write_event`] writes it (no whitespace, fields in declaration order),
//! read as fixed text between values, without searching for keys. Then a
//! fast path ([`fast`]): a scanner that reads the format as written (any key
//! order and whitespace). Both share `channel` and `url` between bids
//! ([`crate::source::intern`]) and give up on anything unusual — an escape
//! in a string, a number that is not a plain integer, a duplicate or
//! unknown key. A line both give up on is decoded by `serde_json`, which
//! decides what is accepted and says why a line is not.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::model::{Auction, Bid, Event, Person};
use crate::source::{Decode, DecodeError};

mod canonical;
mod fast;

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
        let event = match canonical::decode(bytes) {
            Some(event) => event,
            None => match fast::decode(bytes) {
                Some(event) => event,
                None => decode_with_serde(bytes)?,
            },
        };
        check(event)
    }
}

/// What the decoder gives without its fast path: `serde_json`'s reading and
/// the checks across fields (the fuzz target `nexmark_fast` compares).
pub(crate) fn decode_without_fast_path(bytes: &[u8]) -> Result<Event, DecodeError> {
    check(decode_with_serde(bytes)?)
}

/// The event's fields agree with each other: an auction expires after it opens.
fn check(event: Event) -> Result<Event, DecodeError> {
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

/// The line's event as `serde_json` reads it (without the checks across fields).
fn decode_with_serde(bytes: &[u8]) -> Result<Event, DecodeError> {
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
    Ok(event)
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    use super::*;

    /// A JSON number's text as it may appear in a file: plain integers, and
    /// the cases around the fast path's limits.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            60 => (0u64..2_000_000_000_000_000).prop_map(|n| n.to_string()),
            1 => prop::sample::select(vec![
                "0", "-0", "-1", "01", "00", "1.0", "1.5", "1e3", "1E3", "2e-1", "123456789012345678",
                "999999999999999999", "1234567890123456789", "9223372036854775807", "9223372036854775808",
                "-9223372036854775808", "18446744073709551615", "18446744073709551616", "\"7\"", "null", "true",
                "[]", "{}", "-", "1x", "",
            ])
            .prop_map(str::to_owned),
        ]
    }

    /// A JSON string literal (or not quite one): plain text, escapes,
    /// unicode, raw control characters, bytes that are not UTF-8.
    fn string() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            60 => "[a-zA-Z0-9 :/.?=-]{0,40}".prop_map(String::into_bytes),
            1 => prop::sample::select(vec![
                &b"\\\""[..], b"\\\\", b"\\n", b"\\u00e9", b"\\ud83d\\ude00", b"\\ud800", b"\\x", b"\t", b"\x01",
                b"\x7f", "é".as_bytes(), "😀".as_bytes(), b"\xff", b"\xc3", b"\"",
            ])
            .prop_map(<[u8]>::to_vec),
        ];
        prop::collection::vec(piece, 0..4).prop_map(|pieces| {
            let mut s = vec![b'"'];
            s.extend(pieces.concat());
            s.push(b'"');
            s
        })
    }

    /// JSON whitespace, mostly none.
    fn ws() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["", "", "", "", "", "", "", "", "", "", " ", "\t", "\r\n ", "\u{a0}"])
    }

    /// The members of one record: its fields in any order, some dropped,
    /// repeated, renamed or escaped, with numbers and strings as above.
    fn members(fields: &'static [(&'static str, bool)]) -> impl Strategy<Value = Vec<u8>> {
        let values: Vec<BoxedStrategy<Vec<u8>>> = fields
            .iter()
            .map(|&(_, is_string)| {
                if is_string {
                    prop_oneof![40 => string(), 1 => number().prop_map(String::into_bytes)].boxed()
                } else {
                    prop_oneof![40 => number().prop_map(String::into_bytes), 1 => string()].boxed()
                }
            })
            .collect();
        let edits = prop::collection::vec((0..fields.len(), 0u8..12), 0..2);
        let order = Just((0..fields.len()).collect::<Vec<usize>>()).prop_shuffle();
        (values, order, edits, prop::collection::vec(ws(), 4)).prop_map(move |(values, order, edits, spaces)| {
            let mut members: Vec<(Vec<u8>, Vec<u8>)> =
                order.iter().map(|&i| (format!("\"{}\"", fields[i].0).into_bytes(), values[i].clone())).collect();
            for (i, edit) in edits {
                let i = i % members.len().max(1);
                match edit {
                    0 => drop(members.remove(i)),
                    1 => members.push(members[i].clone()),
                    2 => members.push((b"\"other\"".to_vec(), b"1".to_vec())),
                    3 => members[i].0 = b"\"\\u0069d\"".to_vec(),
                    4 => members[i].1 = b"null".to_vec(),
                    _ => {}
                }
                if members.is_empty() {
                    break;
                }
            }
            let mut out = format!("{{{}", spaces[0]).into_bytes();
            for (k, (key, value)) in members.iter().enumerate() {
                if k > 0 {
                    out.extend_from_slice(format!("{},{}", spaces[1], spaces[2]).as_bytes());
                }
                out.extend_from_slice(key);
                out.extend_from_slice(format!("{}:{}", spaces[3], spaces[0]).as_bytes());
                out.extend_from_slice(value);
            }
            out.extend_from_slice(format!("{}}}", spaces[1]).as_bytes());
            out
        })
    }

    const PERSON: &[(&str, bool)] = &[
        ("id", false),
        ("name", true),
        ("emailAddress", true),
        ("creditCard", true),
        ("city", true),
        ("state", true),
        ("dateTime", false),
        ("extra", true),
    ];
    const AUCTION: &[(&str, bool)] = &[
        ("id", false),
        ("itemName", true),
        ("description", true),
        ("initialBid", false),
        ("reserve", false),
        ("dateTime", false),
        ("expires", false),
        ("seller", false),
        ("category", false),
        ("extra", true),
    ];
    const BID: &[(&str, bool)] = &[
        ("auction", false),
        ("bidder", false),
        ("price", false),
        ("channel", true),
        ("url", true),
        ("dateTime", false),
        ("extra", true),
    ];

    /// A whole line: `event_type` and the record's key, usually matching,
    /// in either order, with whitespace around and sometimes bytes after.
    fn line() -> impl Strategy<Value = Vec<u8>> {
        let record = prop_oneof![
            (Just(0u8), Just("person"), members(PERSON)),
            (Just(1u8), Just("auction"), members(AUCTION)),
            (Just(2u8), Just("bid"), members(BID)),
        ];
        (record, 0u8..20, ws(), ws(), prop::sample::select(vec!["", "", "", "", "\n", "x", "}", ",", " "])).prop_map(
            |((event_type, key, members), twist, a, b, tail)| {
                let event_type = match twist {
                    0 => 3,
                    1 => (event_type + 1) % 3,
                    _ => event_type,
                };
                let head = format!("\"event_type\"{a}:{b}{event_type}");
                let body = format!("\"{key}\":{a}");
                let mut line = if twist == 2 {
                    format!("{b}{{{body}").into_bytes()
                } else {
                    format!("{b}{{{head},{a}{body}").into_bytes()
                };
                line.extend_from_slice(&members);
                if twist == 2 {
                    line.extend_from_slice(format!(",{head}").as_bytes());
                }
                line.extend_from_slice(format!("{a}}}{tail}").as_bytes());
                line
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

        /// On any line the decoder gives exactly what `serde_json` gives
        /// (the same event, or an error with the same reason), and whatever
        /// the fast path accepts, `serde_json` reads as the same event.
        #[test]
        fn the_fast_path_agrees_with_serde_json(line in line()) {
            agrees_with_serde(&line, fast::decode)?;
        }
    }

    /// The decoder gives on `line` exactly what `serde_json` gives (the same
    /// event, or an error with the same reason), and whatever `path` takes,
    /// `serde_json` reads as the same event.
    fn agrees_with_serde(line: &[u8], path: fn(&[u8]) -> Option<Event>) -> Result<(), TestCaseError> {
        prop_assert_eq!(NexmarkDecoder.decode(line), decode_without_fast_path(line));
        if let Some(event) = path(line) {
            prop_assert_eq!(decode_with_serde(line), Ok(event));
        }
        Ok(())
    }

    /// An event with any field values (negative numbers, strings with
    /// quotes, escapes, control characters and non-ASCII), as `write_event`
    /// writes it: mostly the canonical layout.
    fn written() -> impl Strategy<Value = Vec<u8>> {
        let text = prop_oneof![4 => "[a-zA-Z0-9 :/.?=-]{0,30}", 1 => "\\PC{0,8}", 1 => ".{0,8}"];
        let int = prop_oneof![4 => 0i64..2_000_000_000_000_000, 1 => any::<i64>()];
        let time = prop_oneof![4 => 0u64..2_000_000_000_000_000, 1 => any::<u64>()];
        let bid = (int.clone(), int.clone(), int.clone(), text.clone(), text.clone(), time.clone(), text.clone())
            .prop_map(|(auction, bidder, price, channel, url, date_time, extra)| {
                Event::Bid(Bid { auction, bidder, price, channel: channel.into(), url: url.into(), date_time, extra })
            });
        let person = (
            int.clone(),
            [text.clone(), text.clone(), text.clone(), text.clone(), text.clone()],
            time.clone(),
            text.clone(),
        )
            .prop_map(|(id, [name, email_address, credit_card, city, state], date_time, extra)| {
                Event::Person(Box::new(Person { id, name, email_address, credit_card, city, state, date_time, extra }))
            });
        let auction = (
            int.clone(),
            text.clone(),
            text.clone(),
            [int.clone(), int.clone(), int.clone(), int.clone()],
            time.clone(),
            0u64..1000,
            text,
        )
            .prop_map(
                |(id, item_name, description, [initial_bid, reserve, seller, category], date_time, open, extra)| {
                    let expires = date_time.wrapping_add(open);
                    Event::Auction(Box::new(Auction {
                        id,
                        item_name,
                        description,
                        initial_bid,
                        reserve,
                        date_time,
                        expires,
                        seller,
                        category,
                        extra,
                    }))
                },
            );
        prop_oneof![4 => bid, 1 => person, 1 => auction].prop_map(|event| {
            let mut line = Vec::new();
            write_event(&mut line, &event).unwrap();
            line.pop();
            line
        })
    }

    /// A written line with a few bytes changed, inserted or removed: the
    /// canonical path's edges (a digit more, a quote less, a key misspelt).
    fn edited() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"0123456789\"\\,:{}-.eE \t\x01\x7f\xc3\xa9\xffa".to_vec()),
            1 => any::<u8>(),
        ];
        let edit = (0u8..3, any::<prop::sample::Index>(), byte);
        (written(), prop::collection::vec(edit, 0..3)).prop_map(|(mut line, edits)| {
            for (kind, at, byte) in edits {
                let i = at.index(line.len() + 1);
                match kind {
                    0 if i < line.len() => line[i] = byte,
                    1 => line.insert(i, byte),
                    _ if i < line.len() => drop(line.remove(i)),
                    _ => {}
                }
            }
            line
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

        /// Written lines, edited or not: the decoder gives what `serde_json`
        /// gives, and what the canonical path takes, `serde_json` reads as
        /// the same event.
        #[test]
        fn the_canonical_path_agrees_with_serde_json(line in edited()) {
            agrees_with_serde(&line, canonical::decode)?;
        }
    }

    /// The lines that the generator and `write_event` write take the fast
    /// path (so the property above tests it, and the files decode fast); so
    /// do lines with whitespace and fields in another order. Escapes do not.
    #[test]
    fn written_lines_take_the_fast_path() {
        let generator = crate::nexmark::Generator::new(crate::nexmark::GeneratorConfig::default()).unwrap();
        let events: Vec<Event> = (0..2_000).map(|n| generator.event(n)).collect();
        for event in &events {
            let mut line = Vec::new();
            write_event(&mut line, event).unwrap();
            line.pop();
            assert_eq!(fast::decode(&line).as_ref(), Some(event));
            assert_eq!(canonical::decode(&line).as_ref(), Some(event));
        }
        let spaced = br#" { "event_type" : 2 , "bid" : { "price" : 5 , "auction" : 1, "bidder" : 2, "channel" : "c", "url" : "u", "dateTime" : 9, "extra" : "" } } "#;
        assert!(matches!(fast::decode(spaced), Some(Event::Bid(b)) if b.price == 5));
        let escaped = br#"{"event_type":2,"bid":{"price":5,"auction":1,"bidder":2,"channel":"c\"","url":"u","dateTime":9,"extra":""}}"#;
        assert_eq!(fast::decode(escaped), None);
        let Ok(Event::Bid(bid)) = NexmarkDecoder.decode(escaped) else { panic!("an escape is valid JSON") };
        assert_eq!(&*bid.channel, "c\"");
    }

    /// Most random lines of the property test take the fast path or at least
    /// get far into it: count the fast path's acceptances over a sample.
    #[test]
    fn random_lines_often_take_the_fast_path() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = line();
        let (mut fast_accepted, mut total) = (0, 0);
        for _ in 0..5_000 {
            let line = strategy.new_tree(&mut runner).unwrap().current();
            total += 1;
            fast_accepted += usize::from(fast::decode(&line).is_some());
        }
        assert!(fast_accepted * 10 > total, "only {fast_accepted} of {total} random lines took the fast path");
    }
}
