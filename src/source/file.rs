//! JSON Lines from files (split into blocks read in parallel) or stdin.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use super::{Decode, Offset, PartitionReader, ReadStatus, Source, SourceError};
use crate::dead_letter::DeadLetter;

/// The default size of the blocks a file is split into.
pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;

/// How much a reader reads from a file at once: 128 KiB, so that what it
/// reads is still in the core's cache when it is decoded (1 MiB reads
/// decode 4 % slower, BENCHMARKS.md "Decoding JSON").
const CHUNK: usize = 1 << 17;

/// The default longest line a reader takes as a record (4 MiB); see
/// [`JsonLines::max_record_size`].
pub const DEFAULT_MAX_RECORD_SIZE: usize = 4 << 20;

#[derive(Clone, Debug)]
enum Input {
    Files(Vec<PathBuf>),
    Stdin,
}

/// One block of one file: the lines that start in `[start, end)`.
#[derive(Clone, Debug)]
struct Block {
    file: usize,
    start: u64,
    end: u64,
}

/// A source of JSON Lines: one record per line, decoded by `Dec`.
///
/// Files are split into blocks (8 MiB by default), each a partition, so that
/// several workers parse one file; a worker reads its blocks one after
/// another. The offset of a partition is the byte offset in its file. Stdin is
/// a single partition, read by a background thread so that waiting for input
/// never blocks the worker. Empty lines are skipped; any other line that does
/// not decode becomes a dead letter, and so does a line longer than
/// [`max_record_size`](Self::max_record_size): a reader never holds more
/// than that limit (plus one read of 128 KiB) of a line, however long it is.
pub struct JsonLines<Dec> {
    input: Input,
    blocks: Vec<Block>,
    decoder: Arc<Dec>,
    stdin: Mutex<Option<Receiver<Vec<u8>>>>,
    max_record: usize,
}

impl<Dec> std::fmt::Debug for JsonLines<Dec> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLines").field("input", &self.input).field("blocks", &self.blocks.len()).finish()
    }
}

impl<Dec: Decode> JsonLines<Dec> {
    /// Reads the given files, in blocks of [`DEFAULT_BLOCK_SIZE`].
    pub fn files<P: AsRef<Path>>(paths: &[P], decoder: Dec) -> Result<Self, SourceError> {
        Self::files_with_block_size(paths, decoder, DEFAULT_BLOCK_SIZE)
    }

    /// Reads the given files, in blocks of `block_size` bytes.
    pub fn files_with_block_size<P: AsRef<Path>>(
        paths: &[P],
        decoder: Dec,
        block_size: u64,
    ) -> Result<Self, SourceError> {
        if block_size == 0 {
            return Err(SourceError::Config("block_size must be positive".into()));
        }
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let mut blocks = Vec::new();
        for (file, path) in paths.iter().enumerate() {
            let len = std::fs::metadata(path)
                .map_err(|source| SourceError::Io { what: path.display().to_string(), source })?
                .len();
            let mut start = 0;
            while start < len {
                blocks.push(Block { file, start, end: (start + block_size).min(len) });
                start += block_size;
            }
        }
        Ok(JsonLines {
            input: Input::Files(paths),
            blocks,
            decoder: Arc::new(decoder),
            stdin: Mutex::new(None),
            max_record: DEFAULT_MAX_RECORD_SIZE,
        })
    }

    /// Reads standard input (one partition, on worker 0).
    pub fn stdin(decoder: Dec) -> Self {
        JsonLines {
            input: Input::Stdin,
            blocks: Vec::new(),
            decoder: Arc::new(decoder),
            stdin: Mutex::new(None),
            max_record: DEFAULT_MAX_RECORD_SIZE,
        }
    }

    /// Lines longer than `bytes` (without their line ending) are not
    /// decoded: each becomes a dead letter that gives its length and offset,
    /// with its first bytes, and reading resumes after its newline, in time
    /// linear in its length and with memory bounded by `bytes`. Default
    /// [`DEFAULT_MAX_RECORD_SIZE`].
    pub fn max_record_size(mut self, bytes: usize) -> Self {
        self.max_record = bytes.max(1);
        self
    }
}

impl<Dec: Decode> Source for JsonLines<Dec>
where
    Dec::Record: highwater_operators::key::Data,
{
    type Record = Dec::Record;
    type Reader = JsonLinesReader<Dec>;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(match &self.input {
            Input::Stdin => vec!["stdin".to_owned()],
            Input::Files(paths) => {
                self.blocks.iter().map(|b| format!("{}[{}..{})", paths[b.file].display(), b.start, b.end)).collect()
            }
        })
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<JsonLinesReader<Dec>, SourceError> {
        match &self.input {
            Input::Stdin => {
                let mut slot = self.stdin.lock().map_err(|_| SourceError::Config("stdin reader poisoned".into()))?;
                let rx = slot.take().unwrap_or_else(spawn_stdin);
                Ok(JsonLinesReader {
                    origin: "stdin".to_owned(),
                    decoder: Arc::clone(&self.decoder),
                    input: ReaderInput::Stdin(rx),
                    buf: Buffer::default(),
                    pos: 0,
                    buf_offset: from.unwrap_or(0),
                    end: u64::MAX,
                    eof: false,
                    skip_first_line: false,
                    max_record: self.max_record,
                    long_line: None,
                    opened: from.unwrap_or(0),
                })
            }
            Input::Files(paths) => {
                let block =
                    self.blocks.get(index).ok_or_else(|| SourceError::Config(format!("no partition {index}")))?;
                let path = &paths[block.file];
                let io = |source| SourceError::Io { what: path.display().to_string(), source };
                let mut file = File::open(path).map_err(io)?;
                let mut reader = JsonLinesReader {
                    origin: path.display().to_string(),
                    decoder: Arc::clone(&self.decoder),
                    input: ReaderInput::File(file.try_clone().map_err(io)?),
                    buf: Buffer::default(),
                    pos: 0,
                    buf_offset: 0,
                    end: block.end,
                    eof: false,
                    skip_first_line: false,
                    max_record: self.max_record,
                    long_line: None,
                    opened: 0,
                };
                match from {
                    Some(offset) => {
                        file.seek(SeekFrom::Start(offset)).map_err(io)?;
                        reader.buf_offset = offset;
                    }
                    None if block.start == 0 => {}
                    None => {
                        // The block's first line is the first that starts at or after `start`.
                        file.seek(SeekFrom::Start(block.start - 1)).map_err(io)?;
                        reader.buf_offset = block.start - 1;
                        // Done on the first read: opening a partition reads nothing.
                        reader.skip_first_line = true;
                    }
                }
                reader.opened = reader.buf_offset;
                Ok(reader)
            }
        }
    }

    fn concurrent_partitions(&self) -> usize {
        1
    }
}

fn spawn_stdin() -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(64);
    std::thread::Builder::new()
        .name("highwater-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut chunk = vec![0u8; 64 << 10];
                match stdin.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        chunk.truncate(n);
                        if tx.send(chunk).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::error!("reading stdin: {e}");
                        break;
                    }
                }
            }
        })
        .expect("spawning the stdin reader thread");
    rx
}

/// The bytes a reader has read: `bytes[..filled]`. The rest of `bytes` is
/// where the next read goes; it is zeroed once, when the buffer grows, not
/// before every read.
#[derive(Debug, Default)]
struct Buffer {
    bytes: Vec<u8>,
    filled: usize,
}

impl Buffer {
    /// Drops the first `n` bytes read.
    fn consume(&mut self, n: usize) {
        self.bytes.copy_within(n..self.filled, 0);
        self.filled -= n;
    }

    /// Room for at least `len` more bytes after those read.
    fn spare(&mut self, len: usize) -> &mut [u8] {
        if self.bytes.len() < self.filled + len {
            self.bytes.resize(self.filled + len, 0);
        }
        &mut self.bytes[self.filled..]
    }

    /// `n` more bytes were written at the start of [`spare`](Self::spare).
    fn filled(&mut self, n: usize) {
        self.filled += n;
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.filled]
    }
}

enum ReaderInput {
    File(File),
    Stdin(Receiver<Vec<u8>>),
}

/// Reads the lines of one block (or of stdin).
pub struct JsonLinesReader<Dec> {
    origin: String,
    decoder: Arc<Dec>,
    input: ReaderInput,
    /// Bytes read but not yet consumed from `pos` on.
    buf: Buffer,
    pos: usize,
    /// File offset of `buf[0]`.
    buf_offset: u64,
    /// Lines starting at or after this offset belong to the next block.
    end: u64,
    eof: bool,
    /// The reader starts inside the previous block's last line.
    skip_first_line: bool,
    /// The longest line taken as a record.
    max_record: usize,
    /// A line longer than `max_record` being skipped: where it starts and
    /// its first bytes (for its dead letter).
    long_line: Option<(u64, Vec<u8>)>,
    /// The offset it was opened at ([`PartitionReader::bytes_read`]).
    opened: u64,
}

impl<Dec> std::fmt::Debug for JsonLinesReader<Dec> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesReader")
            .field("origin", &self.origin)
            .field("offset", &(self.buf_offset + self.pos as u64))
            .finish()
    }
}

impl<Dec: Decode> JsonLinesReader<Dec> {
    /// Reads more input into the buffer; returns false if none is available now.
    fn fill(&mut self) -> Result<bool, SourceError> {
        if self.pos > 0 {
            self.buf.consume(self.pos);
            self.buf_offset += self.pos as u64;
            self.pos = 0;
        }
        match &mut self.input {
            ReaderInput::File(file) => {
                let n = loop {
                    match file.read(self.buf.spare(CHUNK)) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(source) => return Err(SourceError::Io { what: self.origin.clone(), source }),
                    }
                };
                self.buf.filled(n);
                if n == 0 {
                    // The file ends before the block it was split into when the
                    // job started: it was truncated while read. Not an end of input.
                    let at = self.buf_offset + self.buf.len() as u64;
                    if at < self.end && self.end != u64::MAX {
                        let message = format!(
                            "the file ends at byte {at}, before byte {} where it ended when the job started \
                             (truncated while it was read)",
                            self.end
                        );
                        return Err(SourceError::Io {
                            what: self.origin.clone(),
                            source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, message),
                        });
                    }
                    self.eof = true;
                }
                Ok(n > 0)
            }
            ReaderInput::Stdin(rx) => match rx.try_recv() {
                Ok(chunk) => {
                    self.buf.spare(chunk.len())[..chunk.len()].copy_from_slice(&chunk);
                    self.buf.filled(chunk.len());
                    Ok(true)
                }
                Err(TryRecvError::Empty) => Ok(false),
                Err(TryRecvError::Disconnected) => {
                    self.eof = true;
                    Ok(false)
                }
            },
        }
    }

    /// Starts skipping the line at `pos` (at offset `start`): too long.
    fn start_long_line(&mut self, start: u64) {
        let raw = &self.buf[self.pos..];
        self.long_line = Some((start, raw[..raw.len().min(crate::dead_letter::MAX_RAW_BYTES)].to_vec()));
    }

    /// Skips the rest of the line the block starts in (begun in the one
    /// before), but not past the block's end: if no newline comes before
    /// it, no line starts in this block, and a long line is read once, by
    /// the block it starts in, not again by every block it spans.
    fn skip_partial_line(&mut self) -> Result<(), SourceError> {
        loop {
            if let Some(nl) = memchr::memchr(b'\n', &self.buf[self.pos..]) {
                self.pos += nl + 1;
                return Ok(());
            }
            self.pos = self.buf.len();
            if self.buf_offset + self.pos as u64 >= self.end || (!self.fill()? && self.eof) {
                return Ok(());
            }
        }
    }
}

impl<Dec: Decode> PartitionReader for JsonLinesReader<Dec> {
    type Record = Dec::Record;

    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(Dec::Record),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        if std::mem::take(&mut self.skip_first_line) {
            self.skip_partial_line()?;
        }
        let mut taken = 0;
        while taken < max {
            if let Some((start, raw)) = self.long_line.take() {
                // Skipping a line too long to take: up to its newline, or
                // the end of the input, without holding it.
                let ended = match memchr::memchr(b'\n', &self.buf[self.pos..]) {
                    Some(nl) => Some((self.pos + nl, self.pos + nl + 1)),
                    None if self.eof => Some((self.buf.len(), self.buf.len())),
                    None => None,
                };
                let Some((line_end, next)) = ended else {
                    self.pos = self.buf.len();
                    self.long_line = Some((start, raw));
                    if self.fill()? || self.eof {
                        continue;
                    }
                    return Ok(if taken > 0 { ReadStatus::Data } else { ReadStatus::Idle });
                };
                let mut length = self.buf_offset + line_end as u64 - start;
                if line_end > 0 && line_end > self.pos && self.buf[line_end - 1] == b'\r' {
                    length -= 1;
                }
                let reason = format!(
                    "a line of {length} bytes, longer than the largest record of {} bytes \
                     (JsonLines::max_record_size): skipped",
                    self.max_record
                );
                dead.push(DeadLetter::new(self.origin.clone(), start, reason, &raw));
                taken += 1;
                self.pos = next;
                continue;
            }
            let line_start = self.buf_offset + self.pos as u64;
            if line_start >= self.end {
                return Ok(ReadStatus::End);
            }
            let (line, next) = match memchr::memchr(b'\n', &self.buf[self.pos..]) {
                Some(nl) => (self.pos..self.pos + nl, self.pos + nl + 1),
                None if self.eof => {
                    if self.pos == self.buf.len() {
                        return Ok(ReadStatus::End);
                    }
                    // A last line without its newline.
                    (self.pos..self.buf.len(), self.buf.len())
                }
                None if self.buf.len() - self.pos > self.max_record => {
                    self.start_long_line(line_start);
                    continue;
                }
                None => {
                    if self.fill()? || self.eof {
                        continue;
                    }
                    return Ok(if taken > 0 { ReadStatus::Data } else { ReadStatus::Idle });
                }
            };
            if line.len() > self.max_record + 1 || (line.len() > self.max_record && self.buf[line.end - 1] != b'\r') {
                // Too long, although it happens to be read whole.
                self.start_long_line(line_start);
                continue;
            }
            let mut bytes = &self.buf[line];
            if let [head @ .., b'\r'] = bytes {
                bytes = head;
            }
            if !bytes.is_empty() {
                if let Err(e) = self.decoder.decode_into(bytes, out) {
                    dead.push(DeadLetter::new(self.origin.clone(), line_start, e.0, bytes));
                }
                taken += 1;
            }
            self.pos = next;
        }
        Ok(ReadStatus::Data)
    }

    fn offset(&self) -> Offset {
        self.buf_offset + self.pos as u64
    }

    fn bytes_read(&self) -> Option<u64> {
        Some(self.offset().saturating_sub(self.opened))
    }

    /// Drops the buffer (a block waiting for its turn holds no memory): the
    /// file is read again from the first byte not consumed.
    fn set_aside(&mut self) {
        let ReaderInput::File(file) = &mut self.input else { return };
        if self.eof || self.skip_first_line {
            return;
        }
        let at = self.buf_offset + self.pos as u64;
        if file.seek(SeekFrom::Start(at)).is_ok() {
            (self.buf, self.pos, self.buf_offset) = (Buffer::default(), 0, at);
        }
    }
}
