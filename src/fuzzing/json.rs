//! JSON Lines files, Nexmark events and Debezium change events.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::Outcome;
use crate::cdc::debezium::DebeziumDecoder;
use crate::cdc::{Change, Op, Value};
use crate::dead_letter::DeadLetter;
use crate::nexmark::{write_event, Event, NexmarkDecoder};
use crate::source::{Decode, DecodeError, JsonDecoder, JsonLines, PartitionReader, ReadStatus, Source};

/// A record type for [`json_lines`]: what a user decodes with
/// [`JsonDecoder`] (numbers, strings, options, lists, a tagged enum).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Click {
    /// A user name.
    pub user: String,
    /// Event time.
    pub time: u64,
    /// A page.
    #[serde(default)]
    pub page: Option<Page>,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// A signed number.
    #[serde(default)]
    pub delta: i64,
}

/// Where a [`Click`] went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Page {
    /// The home page.
    Home,
    /// An item's page.
    Item {
        /// The item.
        id: u64,
    },
}

/// A file in the temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &[u8]) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("highwater-fuzz-{}-{n}.jsonl", std::process::id()));
        std::fs::write(&path, contents).expect("writing the fuzz input to a temporary file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One line as the reference splitter sees it: its offset and what decoding it gives.
type Line = (u64, Result<Click, DeadLetter>);

/// Reads `reader` to its end, `max` records at a time; returns the records
/// and dead letters, and checks that `offset()` always stands at a line start.
fn drain<R: PartitionReader<Record = Click>>(
    reader: &mut R,
    max: usize,
    text: &[u8],
    records: &mut Vec<Click>,
    dead: &mut Vec<DeadLetter>,
    calls: Option<usize>,
) {
    let at_line_start =
        |o: u64| o == 0 || o as usize >= text.len() || text.get(o as usize - 1).is_some_and(|b| *b == b'\n');
    // A reader that returns Data forever is a bug, not a slow input.
    let limit = text.len() + 2;
    for call in 0.. {
        assert!(call <= limit, "the reader did not reach the end of its block after {call} reads");
        if calls.is_some_and(|c| call == c) {
            return;
        }
        let status = reader.read(max, &mut |r| records.push(r), dead).expect("reading a file");
        let offset = reader.offset();
        assert!(at_line_start(offset), "offset {offset} after a read is not at the start of a line");
        match status {
            ReadStatus::Data => {}
            ReadStatus::End => return,
            status @ (ReadStatus::Idle | ReadStatus::Behind) => panic!("a file block read {status:?}"),
        }
    }
}

/// The JSON Lines source ([`JsonLines`] over a file, with [`JsonDecoder`]
/// for [`Click`]): the file is split into blocks (partitions); each block is
/// read once, a few records, then resumed in a new reader from the offset
/// the first reported (as recovery from a checkpoint does), to its end.
/// Checks that the records and dead letters, over all blocks, are exactly
/// those of splitting the file at `\n` (a trailing `\r` dropped, empty
/// lines skipped) and decoding each line alone, so that neither the blocks
/// nor the resumption lose or repeat a line; that offsets stay at line
/// starts; that each line decodes exactly as `serde_json` decodes it (the
/// decoder's fast path); and that every decoded record round-trips through
/// `serde_json`.
///
/// The first byte chooses the number of blocks (1 to 4), the second how many
/// records one read takes (1 to 8); the rest is the file. Rejected if any
/// line is a dead letter.
pub fn json_lines(data: &[u8]) -> Outcome {
    let (blocks, max, text) = match data {
        [b, m, rest @ ..] => (u64::from(b % 4) + 1, usize::from(m % 8) + 1, rest),
        _ => (1, 1, &[][..]),
    };
    let file = TempFile::new(text);
    let origin = file.0.display().to_string();

    // The reference: split at '\n', decode each line alone.
    let decoder = JsonDecoder::<Click>::new();
    let mut expected: Vec<Line> = Vec::new();
    let mut start = 0usize;
    while start < text.len() {
        let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |i| start + i);
        let mut line = &text[start..end];
        if let [head @ .., b'\r'] = line {
            line = head;
        }
        if !line.is_empty() {
            let decoded = decoder.decode(line);
            // The decoder's fast path gives exactly serde_json's answer.
            let reference = serde_json::from_slice::<Click>(line).map_err(|e| DecodeError(e.to_string()));
            assert_eq!(decoded, reference, "the decoder disagrees with serde_json");
            let decoded = decoded.map_err(|e| DeadLetter::new(origin.clone(), start as u64, e.0, line));
            if let Ok(click) = &decoded {
                assert!(serde_json::from_slice::<serde_json::Value>(line).is_ok(), "decoded a line that is not JSON");
                let again = serde_json::to_vec(click).expect("a click serializes");
                assert_eq!(decoder.decode(&again).as_ref(), Ok(click), "a click does not round-trip");
            }
            expected.push((start as u64, decoded));
        }
        start = end + 1;
    }

    // The source, block by block.
    let block_size = (text.len() as u64).div_ceil(blocks).max(1);
    let source = JsonLines::files_with_block_size(&[&file.0], JsonDecoder::<Click>::new(), block_size)
        .expect("opening the temporary file");
    let partitions = source.partitions().expect("listing partitions");
    assert_eq!(partitions.len() as u64, (text.len() as u64).div_ceil(block_size));
    let (mut records, mut dead) = (Vec::new(), Vec::new());
    for index in 0..partitions.len() {
        // One read, then resume from its offset in a new reader.
        let mut reader = source.open(index, None).expect("opening a block");
        drain(&mut reader, max, text, &mut records, &mut dead, Some(1));
        let mut resumed = source.open(index, Some(reader.offset())).expect("reopening a block");
        drain(&mut resumed, max, text, &mut records, &mut dead, None);
    }
    let expected_records: Vec<&Click> = expected.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    let expected_dead: Vec<&DeadLetter> = expected.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    assert_eq!(records.iter().collect::<Vec<_>>(), expected_records, "records differ from the lines'");
    assert_eq!(dead.iter().collect::<Vec<_>>(), expected_dead, "dead letters differ from the lines'");
    match dead.first() {
        None => Outcome::Accepted,
        Some(d) => Outcome::Rejected(d.reason.clone()),
    }
}

/// The Nexmark decoder ([`NexmarkDecoder`]) on one line. An accepted line
/// is JSON, writes back ([`write_event`]) as one line that decodes to the
/// same event, and an auction expires after it opens.
pub fn nexmark(data: &[u8]) -> Outcome {
    let decoded = NexmarkDecoder.decode(data);
    if let Ok(event) = &decoded {
        assert!(serde_json::from_slice::<serde_json::Value>(data).is_ok(), "decoded a line that is not JSON");
        let mut line = Vec::new();
        write_event(&mut line, event).expect("writing to a Vec");
        assert_eq!(line.pop(), Some(b'\n'), "an event is written with its newline");
        assert!(!line.contains(&b'\n'), "an event is written on one line");
        assert_eq!(NexmarkDecoder.decode(&line).as_ref(), Ok(event), "an event does not round-trip");
        if let Event::Auction(a) = event {
            assert!(a.expires > a.date_time, "an auction that expires before it opens was accepted");
        }
    }
    Outcome::from(&decoded)
}

/// The Nexmark decoder's fast path (a scanner that gives up on anything
/// unusual, then `serde_json`) on one line: the decoder gives exactly what it
/// gives without the fast path — the same event, or the same error.
pub fn nexmark_fast(data: &[u8]) -> Outcome {
    let decoded = NexmarkDecoder.decode(data);
    let reference = crate::nexmark::decode_without_fast_path(data);
    assert_eq!(decoded, reference, "the fast path disagrees with serde_json");
    Outcome::from(&decoded)
}

/// The Debezium decoder ([`DebeziumDecoder`], keyed by `id`) on one line,
/// as its source reads it ([`Decode::decode_into`]; bytes, then JSON, then
/// the event). Checks that it accepts exactly the JSON that `serde_json`
/// does (whatever it makes of the event), that [`DebeziumDecoder::decode_json`]
/// on `serde_json`'s value gives the same change, and that a change is
/// consistent: its key is its row's `id`, a delete has a `before` image,
/// other changes an `after`, and it round-trips through postcard (as changes
/// travel between workers and into checkpoints).
pub fn debezium(data: &[u8]) -> Outcome {
    let decoder = DebeziumDecoder::new(["id"]);
    let mut changes = Vec::new();
    let result = decoder.decode_into(data, &mut |c| changes.push(c));
    match serde_json::from_slice::<serde_json::Value>(data) {
        Err(e) => {
            assert!(result.is_err(), "decoded a line that serde_json rejects: {e}");
        }
        Ok(json) => {
            let direct = decoder.decode_json(&json);
            match (&result, direct) {
                (Ok(()), Ok(change)) => assert_eq!(changes, change.into_iter().collect::<Vec<_>>()),
                (Err(a), Err(b)) => assert_eq!(a, &b, "decode_into and decode_json give different errors"),
                (a, b) => panic!("decode_into gives {a:?} ({changes:?}), decode_json {b:?}"),
            }
        }
    }
    assert!(changes.len() <= 1, "one event made {} changes", changes.len());
    for change in &changes {
        check_change(change);
    }
    // `decode` is `decode_into` with a tombstone as an error.
    match (decoder.decode(data), &result) {
        (Ok(change), Ok(())) => assert_eq!(changes, vec![change]),
        (Err(_), Ok(())) => assert!(changes.is_empty(), "decode failed where decode_into gave a change"),
        (Err(a), Err(b)) => assert_eq!(&a, b),
        (Ok(_), Err(_)) => panic!("decode accepted what decode_into rejects"),
    }
    Outcome::from(&result)
}

fn check_change(change: &Change) {
    let image = match change.op {
        Op::Delete => change.before.as_ref(),
        Op::Insert | Op::Update | Op::Read => change.after.as_ref(),
    };
    let image = image.unwrap_or_else(|| panic!("a {:?} change without its image: {change:?}", change.op));
    assert_eq!(image.project(&["id"]).as_ref(), Some(&change.key), "the key is not the row's id");
    let bytes = postcard::to_allocvec(change).expect("a change serializes");
    let back: Change = postcard::from_bytes(&bytes).expect("a change deserializes");
    assert_eq!(&back, change, "a change does not round-trip through postcard");
    // What sinks and tables do with it.
    for row in [&change.before, &change.after].into_iter().flatten() {
        let _ = row.to_json().to_string();
        for (_, value) in &row.columns {
            let _ = value.to_string();
            if let Value::Numeric(n) = value {
                // Decimals are written out from their unscaled integer.
                let digits = n.strip_prefix('-').unwrap_or(n);
                let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
                let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                assert!(plain(int) && plain(frac), "decimal {n:?}");
            }
        }
    }
    let upserts = change.upserts(|r| r.project(&["id"]));
    assert!(!upserts.is_empty() && upserts.len() <= 2, "{} upserts", upserts.len());
}
