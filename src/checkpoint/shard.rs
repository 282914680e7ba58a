//! A worker's shard of operator state in RocksDB.
//!
//! Keys are `operator name, 0, chunk number (u32, big-endian)`; each value is
//! a bincode list of [`Entry`]s (routing hash and bytes), about 1 MiB per
//! chunk. The routing hash stays with each entry, so a run with a different
//! number of workers redistributes the entries by key.

use std::path::Path;

use crate::operators::checkpoint::Entry;

use super::CheckpointError;

/// Target size of one value.
const CHUNK_BYTES: usize = 1 << 20;

fn db_error(path: &Path) -> impl Fn(rocksdb::Error) -> CheckpointError + '_ {
    move |e| CheckpointError::State { what: path.display().to_string(), reason: e.into_string() }
}

fn key(operator: &str, chunk: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(operator.len() + 5);
    key.extend_from_slice(operator.as_bytes());
    key.push(0);
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

/// Writes `operators`' entries into a new RocksDB database at `path`;
/// returns the number of entries.
pub fn write(path: &Path, operators: &[(String, Vec<Entry>)]) -> Result<u64, CheckpointError> {
    let _ = std::fs::remove_dir_all(path);
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    options.set_compression_type(rocksdb::DBCompressionType::None);
    // One flush at the end, not many small files.
    options.set_write_buffer_size(256 << 20);
    let db = rocksdb::DB::open(&options, path).map_err(db_error(path))?;
    let mut write_options = rocksdb::WriteOptions::default();
    write_options.disable_wal(true);
    let mut entries = 0u64;
    for (operator, list) in operators {
        let mut chunk = 0u32;
        let mut start = 0;
        while start < list.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < list.len() && (end == start || bytes < CHUNK_BYTES) {
                bytes += list[end].1.len() + 16;
                end += 1;
            }
            let value = bincode::serialize(&list[start..end]).expect("entries serialize");
            db.put_opt(key(operator, chunk), value, &write_options).map_err(db_error(path))?;
            entries += (end - start) as u64;
            chunk += 1;
            start = end;
        }
        if list.is_empty() {
            // The operator is known to the shard even with no state.
            db.put_opt(key(operator, 0), bincode::serialize(&Vec::<Entry>::new()).expect("serializes"), &write_options)
                .map_err(db_error(path))?;
        }
    }
    db.flush().map_err(db_error(path))?;
    drop(db);
    Ok(entries)
}

/// Reads every operator's chunks from the RocksDB database at `path`,
/// handing each to `each(operator, chunk)`: a bincode list of [`Entry`]s
/// (see [`Restored`](crate::operators::checkpoint::Restored)), checked for
/// framing here.
pub fn read(path: &Path, mut each: impl FnMut(&str, Vec<u8>)) -> Result<(), CheckpointError> {
    let options = rocksdb::Options::default();
    let db = rocksdb::DB::open_for_read_only(&options, path, false).map_err(db_error(path))?;
    for item in db.iterator(rocksdb::IteratorMode::Start) {
        let (key, value) = item.map_err(db_error(path))?;
        let corrupt = |reason: String| CheckpointError::Corrupt { what: path.display().to_string(), reason };
        let Some(split) = key.len().checked_sub(5).filter(|s| key[*s] == 0) else {
            return Err(corrupt("malformed key".into()));
        };
        let operator = String::from_utf8_lossy(&key[..split]).into_owned();
        check_framing(&value).map_err(|reason| corrupt(format!("entries of {operator}: {reason}")))?;
        each(&operator, value.into_vec());
    }
    Ok(())
}

/// Checks that `chunk` is a list of (routing hash, bytes) entries, exactly.
pub(crate) fn check_framing(chunk: &[u8]) -> Result<(), String> {
    let word = |at: usize| -> Result<u64, String> {
        chunk
            .get(at..at + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("truncated at byte {at}"))
    };
    let count = word(0)?;
    let mut at = 8;
    for _ in 0..count {
        let len = word(at + 8)?;
        at = (at as u64 + 16).checked_add(len).filter(|end| *end <= chunk.len() as u64).ok_or("entry past the end")?
            as usize;
    }
    if at != chunk.len() {
        return Err(format!("{} bytes after the entries", chunk.len() - at));
    }
    Ok(())
}

/// The number of entries in a chunk whose framing was checked.
pub fn chunk_entries(chunk: &[u8]) -> u64 {
    chunk.get(..8).map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}
