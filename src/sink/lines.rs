//! Writing lines (CSV rows, JSON objects) to a file or stdout.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use highwater_operators::{EventStream, Update};

use super::{write, Placement, Sink, SinkError, SinkHandle};

/// Where lines go.
#[derive(Clone, Debug)]
pub enum LineTarget {
    /// A file, created or truncated.
    File(PathBuf),
    /// Standard output.
    Stdout,
    /// Nowhere: lines are only counted (benchmarks).
    Discard,
}

impl LineTarget {
    fn name(&self) -> String {
        match self {
            LineTarget::File(path) => path.display().to_string(),
            LineTarget::Stdout => "stdout".to_owned(),
            LineTarget::Discard => "nowhere".to_owned(),
        }
    }
}

/// How a changelog of lines is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkMode {
    /// Every inserted line is written as it arrives. A retraction cannot
    /// un-write a line: it is counted in [`SinkHandle::unapplied_retractions`]
    /// and reported. Right for append-only results.
    Append,
    /// The changelog is consolidated and the resulting table written when the
    /// input ends (sorted, one line per unit of multiplicity). Right for
    /// updating results of bounded inputs.
    Table,
}

enum Writer {
    File(BufWriter<File>),
    Stdout(BufWriter<std::io::Stdout>),
    Discard,
}

/// A [`Sink`] of lines to a file, stdout or nowhere.
pub struct LineSink {
    target: String,
    writer: Writer,
    mode: SinkMode,
    table: HashMap<String, i64>,
    handle: SinkHandle,
}

impl std::fmt::Debug for LineSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineSink").field("target", &self.target).field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl LineSink {
    /// Opens `target` and writes `header` (if any) as its first line.
    pub fn open(
        target: &LineTarget,
        header: Option<&str>,
        mode: SinkMode,
        handle: &SinkHandle,
    ) -> Result<Self, SinkError> {
        let io = |source| SinkError::Io { what: target.name(), source };
        let writer = match target {
            LineTarget::File(path) => Writer::File(BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?)),
            LineTarget::Stdout => Writer::Stdout(BufWriter::with_capacity(1 << 16, std::io::stdout())),
            LineTarget::Discard => Writer::Discard,
        };
        let mut sink = LineSink { target: target.name(), writer, mode, table: HashMap::new(), handle: handle.clone() };
        if let Some(header) = header {
            sink.line(header)?;
        }
        Ok(sink)
    }

    fn line(&mut self, line: &str) -> Result<(), SinkError> {
        let result = match &mut self.writer {
            Writer::File(w) => w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")),
            Writer::Stdout(w) => w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")),
            Writer::Discard => Ok(()),
        };
        result.map_err(|source| SinkError::Io { what: self.target.clone(), source })
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        let result = match &mut self.writer {
            Writer::File(w) => w.flush(),
            Writer::Stdout(w) => w.flush(),
            Writer::Discard => Ok(()),
        };
        result.map_err(|source| SinkError::Io { what: self.target.clone(), source })
    }
}

impl Sink for LineSink {
    type Item = String;

    fn write(&mut self, updates: &mut Vec<Update<String>>) -> Result<u64, SinkError> {
        let mut written = 0;
        for (line, _time, diff) in updates.drain(..) {
            match self.mode {
                SinkMode::Table => *self.table.entry(line).or_insert(0) += diff,
                SinkMode::Append if diff < 0 => self.handle.unapplied_retractions.add(diff.unsigned_abs()),
                SinkMode::Append => {
                    for _ in 0..diff {
                        self.line(&line)?;
                        written += 1;
                    }
                }
            }
        }
        Ok(written)
    }

    fn advance(&mut self, _frontier: highwater_operators::Timestamp) -> Result<u64, SinkError> {
        // Lines before the watermark are final: let readers (`tail -f`) see them.
        self.flush()?;
        Ok(0)
    }

    fn finish(&mut self) -> Result<u64, SinkError> {
        let mut written = 0;
        let mut rows: Vec<_> = self.table.drain().filter(|(_, n)| *n != 0).collect();
        rows.sort();
        for (line, n) in rows {
            if n < 0 {
                self.handle.unapplied_retractions.add(n.unsigned_abs());
                continue;
            }
            for _ in 0..n {
                self.line(&line)?;
                written += 1;
            }
        }
        self.flush()?;
        Ok(written)
    }
}

/// Writes a stream of lines (without line endings), after an optional header,
/// from worker 0. The output is complete once the dataflow's input is
/// exhausted and the workers are joined.
pub fn write_lines(
    lines: &EventStream<'_, String>,
    header: Option<String>,
    target: LineTarget,
    mode: SinkMode,
) -> SinkHandle {
    // Discarded lines are only counted: no need to gather them on one worker.
    let placement = if matches!(target, LineTarget::Discard) { Placement::EachWorker } else { Placement::Worker0 };
    write(lines, "WriteLines", placement, move |_worker, handle| {
        LineSink::open(&target, header.as_deref(), mode, handle)
    })
}

/// Writes every record as one JSON object per line (JSON Lines), from worker 0.
///
/// Updating streams should be written in [`SinkMode::Table`]; the lines are the
/// records' serde JSON form.
pub fn write_json_lines<T: highwater_operators::key::Data>(
    stream: &EventStream<'_, T>,
    target: LineTarget,
    mode: SinkMode,
) -> SinkHandle {
    let lines = stream.map(|record| {
        serde_json::to_string(&record).unwrap_or_else(|e| {
            // Only types whose Serialize fails (e.g. maps with non-string keys) get here.
            serde_json::json!({ "error": format!("record not representable as JSON: {e}") }).to_string()
        })
    });
    write_lines(&lines, None, target, mode)
}
