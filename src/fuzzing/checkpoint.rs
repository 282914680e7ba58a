//! Checkpoint manifests and the chunks of entries in a shard.

use std::sync::Arc;

use super::Outcome;
use crate::checkpoint::manifest::{Manifest, MAGIC};
use crate::checkpoint::shard::{chunk_entries, read_from, write_to, ReadError};
use crate::checkpoint::FORMAT_VERSION;
use crate::operators::checkpoint::{check_chunk, encode_chunk, Entry, Restored};

/// A manifest file ([`Manifest::from_bytes`]), both as given and as the
/// body of a file with a valid header (so that the JSON body is reached
/// past the checksum). Checks that an accepted manifest writes back
/// ([`Manifest::to_bytes`]) to a file that reads as the same manifest, that
/// reading agrees with `serde_json` on the body, and that the state size a
/// listing prints is the sum of the file sizes (or saturates). Accepted if either reading is.
pub fn manifest(data: &[u8]) -> Outcome {
    let as_given = Manifest::from_bytes(data, "fuzz input");
    let mut framed = format!("{MAGIC} v{FORMAT_VERSION} crc32={:08x}\n", crc32fast::hash(data)).into_bytes();
    framed.extend_from_slice(data);
    let as_body = Manifest::from_bytes(&framed, "fuzz input");
    assert_eq!(
        as_body.is_ok(),
        serde_json::from_slice::<Manifest>(data).is_ok(),
        "reading a manifest and serde_json disagree on its body"
    );
    for manifest in [&as_given, &as_body].into_iter().flatten() {
        let bytes = manifest.to_bytes();
        match Manifest::from_bytes(&bytes, "written back") {
            Ok(back) => assert_eq!(&back, manifest, "a manifest does not round-trip"),
            Err(e) => panic!("a manifest written back does not read: {e}"),
        }
        let _ = manifest.is_final();
        let total = manifest.state_bytes();
        let files = || manifest.shards.iter().flat_map(|s| &s.files).chain(&manifest.shared);
        assert!(files().all(|f| f.size <= total), "state_bytes {total} is less than a file's size");
        assert!(files().map(|f| f.size).try_fold(0u64, u64::checked_add).is_none_or(|sum| sum == total));
        assert!(manifest.bytes_written() <= total, "bytes_written exceeds state_bytes");
    }
    if as_given.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::from(&as_body)
    }
}

/// One chunk of a shard's entries, as recovery reads it: the framing check
/// that [`shard::read`](crate::checkpoint::shard::read) applies
/// ([`check_chunk`]), then [`chunk_entries`] and the [`Restored`] reader every
/// worker uses on the chunks that pass. Checks that the framing check accepts
/// exactly the postcard encodings of entry lists (without trailing bytes;
/// overlong varints included, read as the same entries as the canonical
/// encoding), and that the workers of a job, together, read each of those
/// entries once.
pub fn shard_chunk(data: &[u8]) -> Outcome {
    let framing = check_chunk(data);
    let postcard = postcard::take_from_bytes::<Vec<Entry>>(data).and_then(|(entries, rest)| {
        if rest.is_empty() {
            Ok(entries)
        } else {
            Err(postcard::Error::DeserializeBadEncoding)
        }
    });
    let entries = match (&framing, postcard) {
        (Ok(_), Ok(entries)) => entries,
        (Err(_), Err(_)) => return Outcome::from(&framing),
        (Ok(_), Err(e)) => panic!("the framing check accepts a chunk that postcard rejects: {e}"),
        (Err(e), Ok(entries)) => panic!("the framing check rejects a chunk of {} entries: {e}", entries.len()),
    };
    assert_eq!(chunk_entries(data), entries.len() as u64, "chunk_entries miscounts");
    // Postcard reads overlong varints (e.g. `f8 f8 f8 00` for `f8 f8 78`) as
    // the same numbers, so an accepted chunk need not be the canonical
    // encoding of its entries; it must stand for exactly those entries.
    let canonical = encode_chunk(&entries);
    if canonical != data {
        let again = postcard::from_bytes::<Vec<Entry>>(&canonical).expect("a canonical chunk decodes");
        assert_eq!(again, entries, "a chunk's canonical encoding stands for other entries");
        assert_eq!(chunk_entries(&canonical), entries.len() as u64, "chunk_entries miscounts");
    }
    let chunk = Arc::new(data.to_vec());
    for workers in [1, 3] {
        let mut read: Vec<Entry> = Vec::new();
        for worker in 0..workers {
            Restored::new(vec![Arc::clone(&chunk)], worker, workers)
                .try_for_each(|route, bytes| {
                    assert_eq!(route % workers as u64, worker as u64, "an entry read by the wrong worker");
                    read.push((route, bytes.to_vec()));
                })
                .expect("a chunk that passed the framing check reads");
        }
        read.sort();
        let mut all = entries.clone();
        all.sort();
        assert_eq!(read, all, "{workers} workers do not read the chunk's entries");
    }
    Outcome::Accepted
}

/// A worker's shard file, as recovery reads it
/// ([`read_from`](crate::checkpoint::shard::read_from)): a header, then
/// records of an operator's name and a chunk of entries. Checks that an
/// accepted file's entries, written again as a shard, read back as the same
/// operators' entries in the same order, and that a damaged file is an error
/// (never a read past its end: the reader is told the file's length).
pub fn shard_file(data: &[u8]) -> Outcome {
    let read = |bytes: &[u8]| -> Result<Vec<(String, Vec<Entry>)>, String> {
        let mut operators: Vec<(String, Vec<Entry>)> = Vec::new();
        let mut damaged = None;
        let result =
            read_from(bytes, bytes.len() as u64, |name, chunk| match postcard::from_bytes::<Vec<Entry>>(&chunk) {
                Ok(list) => match operators.last_mut() {
                    Some((last, all)) if last == name => all.extend(list),
                    _ => operators.push((name.to_owned(), list)),
                },
                Err(e) => damaged = Some(format!("a chunk passed the framing check but does not decode: {e}")),
            });
        if let Some(message) = damaged {
            panic!("{message}");
        }
        match result {
            Ok(()) => Ok(operators),
            Err(ReadError::Corrupt(reason)) => Err(reason),
            Err(ReadError::Io(e)) => panic!("the reader read past the length it was given: {e}"),
        }
    };
    let operators = match read(data) {
        Ok(operators) => operators,
        Err(reason) => return Outcome::Rejected(reason),
    };
    let mut again = Vec::new();
    let entries = write_to(&mut again, &operators).expect("writing to memory");
    assert_eq!(entries, operators.iter().map(|(_, list)| list.len() as u64).sum::<u64>(), "write_to miscounts");
    match read(&again) {
        Ok(back) => assert_eq!(back, operators, "a shard written again reads as other entries"),
        Err(reason) => panic!("a shard written again does not read: {reason}"),
    }
    Outcome::Accepted
}
