//! A worker's shard of operator state: one file of framed chunks.
//!
//! The file `state` in a shard's directory starts with [`MAGIC`], then holds
//! one record per chunk: the operator's name (`u32` length, little-endian,
//! then UTF-8), the chunk's length (`u64`, little-endian), then the chunk, a
//! list of [`Entry`]s (routing hash and bytes, see [`encode_chunk`]) of
//! about 1 MiB. The routing hash stays with each entry, so a run with a different
//! number of workers redistributes the entries by key. The manifest records
//! the file's size and CRC-32, which the store checks before the file is read.
//!
//! A shard is written once and read whole, in order, so it needs no index and
//! no database: a checkpoint to a directory depends on no C++ library.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::operators::checkpoint::{check_chunk, encode_chunk, Entry};

use super::CheckpointError;

/// The first bytes of a shard file (format 1).
pub const MAGIC: &[u8; 8] = b"HWSHARD1";

/// The name of the shard's file within its directory.
pub const FILE: &str = "state";

/// Target size of one chunk.
const CHUNK_BYTES: usize = 1 << 20;

/// Longest operator name a shard accepts (names are dataflow paths).
const MAX_NAME: usize = 1 << 16;

fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { what: path.display().to_string(), source }
}

/// Writes `operators`' entries into a new shard in the directory `dir`
/// (replacing what was there); returns the number of entries.
pub fn write(dir: &Path, operators: &[(String, Vec<Entry>)]) -> Result<u64, CheckpointError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(FILE);
    let file = std::fs::File::create(&path).map_err(io(&path))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let entries = write_to(&mut out, operators).map_err(io(&path))?;
    out.into_inner().map_err(|e| io(&path)(e.into_error()))?.sync_all().map_err(io(&path))?;
    Ok(entries)
}

/// Writes a shard of `operators`' entries to `out`; see [`write()`].
pub fn write_to(out: &mut impl Write, operators: &[(String, Vec<Entry>)]) -> std::io::Result<u64> {
    out.write_all(MAGIC)?;
    let mut entries = 0u64;
    for (operator, list) in operators {
        let mut put = |chunk: &[Entry]| -> std::io::Result<()> {
            let value = encode_chunk(chunk);
            out.write_all(&(operator.len() as u32).to_le_bytes())?;
            out.write_all(operator.as_bytes())?;
            out.write_all(&(value.len() as u64).to_le_bytes())?;
            out.write_all(&value)
        };
        if list.is_empty() {
            // The operator is known to the shard even with no state.
            put(&[])?;
        }
        let mut start = 0;
        while start < list.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < list.len() && (end == start || bytes < CHUNK_BYTES) {
                bytes += list[end].1.len() + 16;
                end += 1;
            }
            put(&list[start..end])?;
            entries += (end - start) as u64;
            start = end;
        }
    }
    Ok(entries)
}

/// Reads every operator's chunks from the shard in the directory `dir`,
/// handing each to `each(operator, chunk)`: a chunk of [`Entry`]s
/// (see [`Restored`](crate::operators::checkpoint::Restored)), checked for
/// framing here.
pub fn read(dir: &Path, each: impl FnMut(&str, Vec<u8>)) -> Result<(), CheckpointError> {
    let path = dir.join(FILE);
    let file = std::fs::File::open(&path).map_err(io(&path))?;
    let length = file.metadata().map_err(io(&path))?.len();
    read_from(BufReader::with_capacity(1 << 20, file), length, each).map_err(|e| match e {
        ReadError::Io(source) => CheckpointError::Io { what: path.display().to_string(), source },
        ReadError::Corrupt(reason) => CheckpointError::Corrupt { what: path.display().to_string(), reason },
    })
}

/// Why a shard could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// Reading failed.
    Io(std::io::Error),
    /// The bytes are not a shard.
    Corrupt(String),
}

/// The bytes of a shard not read yet.
struct Rest<R> {
    input: R,
    left: u64,
}

impl<R: Read> Rest<R> {
    /// The next `n` bytes, which hold `what`.
    fn take(&mut self, n: u64, what: &str) -> Result<Vec<u8>, ReadError> {
        if n > self.left {
            return Err(ReadError::Corrupt(format!("{what} of {n} bytes, but only {} are left", self.left)));
        }
        self.left -= n;
        let mut buf = vec![0; n as usize];
        self.input.read_exact(&mut buf).map_err(ReadError::Io)?;
        Ok(buf)
    }

    fn take_array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ReadError> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes taken"))
    }
}

/// Reads the chunks of a shard of `length` bytes from `input`; see [`read`].
///
/// # Errors
/// If reading fails, or the bytes are not a shard of `length` bytes.
pub fn read_from(input: impl Read, length: u64, mut each: impl FnMut(&str, Vec<u8>)) -> Result<(), ReadError> {
    let mut rest = Rest { input, left: length };
    if rest.take(MAGIC.len() as u64, "header")? != MAGIC {
        return Err(ReadError::Corrupt("not a highwater shard (wrong header)".into()));
    }
    while rest.left > 0 {
        let len = u32::from_le_bytes(rest.take_array("name length")?);
        if len as usize > MAX_NAME {
            return Err(ReadError::Corrupt(format!("operator name of {len} bytes")));
        }
        let name = String::from_utf8(rest.take(len.into(), "operator name")?)
            .map_err(|_| ReadError::Corrupt("operator name is not UTF-8".into()))?;
        let len = u64::from_le_bytes(rest.take_array("chunk length")?);
        let chunk = rest.take(len, "chunk")?;
        check_chunk(&chunk).map_err(|reason| ReadError::Corrupt(format!("entries of {name}: {reason}")))?;
        each(&name, chunk);
    }
    Ok(())
}

/// The number of entries in a chunk whose framing was checked (0 if it is damaged).
pub fn chunk_entries(chunk: &[u8]) -> u64 {
    check_chunk(chunk).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize, size: usize) -> Vec<Entry> {
        (0..n).map(|i| (i as u64 * 7919, vec![i as u8; size])).collect()
    }

    #[test]
    fn a_shard_reads_back_every_operator_and_entry_in_order() {
        let dir = std::env::temp_dir().join(format!("hw-shard-{}", std::process::id()));
        // Big entries: several chunks for one operator.
        let operators =
            vec![("a".to_owned(), entries(3000, 1000)), ("b".to_owned(), vec![]), ("c".to_owned(), entries(5, 3))];
        assert_eq!(write(&dir, &operators).unwrap(), 3005);
        let mut back: Vec<(String, Vec<Entry>)> = Vec::new();
        read(&dir, |name, chunk| {
            let list: Vec<Entry> = postcard::from_bytes(&chunk).unwrap();
            match back.last_mut() {
                Some((last, all)) if last == name => all.extend(list),
                _ => back.push((name.to_owned(), list)),
            }
        })
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(back, operators);
    }

    #[test]
    fn damaged_shards_are_errors_not_panics() {
        let mut good = MAGIC.to_vec();
        let chunk = encode_chunk(&entries(3, 4));
        good.extend_from_slice(&1u32.to_le_bytes());
        good.push(b'x');
        good.extend_from_slice(&(chunk.len() as u64).to_le_bytes());
        good.extend_from_slice(&chunk);
        let read = |bytes: &[u8]| read_from(bytes, bytes.len() as u64, |_, _| {});
        assert!(read(&good).is_ok());
        // Cut anywhere but after the header (an empty shard): damaged.
        for cut in (0..good.len()).filter(|&cut| cut != MAGIC.len()) {
            assert!(matches!(read(&good[..cut]), Err(ReadError::Corrupt(_))), "cut at {cut}");
        }
        let mut wrong = good.clone();
        wrong[0] = b'X';
        assert!(matches!(read(&wrong), Err(ReadError::Corrupt(m)) if m.contains("header")));
        let mut huge = good.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read(&huge), Err(ReadError::Corrupt(_))));
        let mut bad_chunk = good.clone();
        let last = bad_chunk.len() - 1;
        bad_chunk.truncate(last);
        bad_chunk.extend_from_slice(&[0xff, 0xff]);
        let len_at = 8 + 4 + 1;
        bad_chunk[len_at..len_at + 8].copy_from_slice(&((chunk.len() + 1) as u64).to_le_bytes());
        assert!(matches!(read(&bad_chunk), Err(ReadError::Corrupt(m)) if m.contains("entries of x")));
    }
}
