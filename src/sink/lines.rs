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
    /// The changelog itself, for updating results of unbounded inputs (a
    /// window with allowed lateness, a table, an upsert): once the watermark
    /// passes a time, that time's updates are consolidated and written, in
    /// time order, each line followed by its change in multiplicity: `,1`
    /// for an insertion, `,-1` for a retraction (as the part files of a
    /// checkpointed job do; `write_json_lines` writes
    /// `{"row":…,"diff":…}`). Applying the changes in order gives the
    /// table at any watermark. Needs no checkpoints; for exactly-once output
    /// across failures use [`write_parts`](crate::sink::write_parts).
    Changelog,
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
    /// Changelog mode: updates not yet passed by the watermark.
    pending: Vec<Update<String>>,
    /// Changelog mode: lines are JSON values, written as `{"row":…,"diff":…}`.
    json_rows: bool,
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
        let mut sink = LineSink {
            target: target.name(),
            writer,
            mode,
            table: HashMap::new(),
            pending: Vec::new(),
            json_rows: false,
            handle: handle.clone(),
        };
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

    /// In changelog mode, writes each line as a JSON object
    /// `{"row":line,"diff":n}` (the lines being JSON values) rather than
    /// `line,n`.
    pub fn json_rows(mut self) -> Self {
        self.json_rows = true;
        self
    }

    /// Changelog mode: writes the updates before `frontier` (all if `None`),
    /// consolidated per time and line, in time order (lines in order within
    /// a time).
    fn write_changes_before(&mut self, frontier: Option<highwater_operators::Timestamp>) -> Result<u64, SinkError> {
        let (mut due, rest): (Vec<_>, Vec<_>) =
            self.pending.drain(..).partition(|(_, time, _)| frontier.is_none_or(|f| *time < f));
        self.pending = rest;
        due.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let mut written = 0;
        let mut i = 0;
        while i < due.len() {
            let mut diff = 0;
            let mut j = i;
            while j < due.len() && due[j].1 == due[i].1 && due[j].0 == due[i].0 {
                diff += due[j].2;
                j += 1;
            }
            if diff != 0 {
                let line = if self.json_rows {
                    format!("{{\"row\":{},\"diff\":{diff}}}", due[i].0)
                } else {
                    format!("{},{diff}", due[i].0)
                };
                self.line(&line)?;
                written += 1;
            }
            i = j;
        }
        Ok(written)
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
        for (line, time, diff) in updates.drain(..) {
            match self.mode {
                SinkMode::Table => *self.table.entry(line).or_insert(0) += diff,
                SinkMode::Changelog => self.pending.push((line, time, diff)),
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

    fn advance(&mut self, frontier: highwater_operators::Timestamp) -> Result<u64, SinkError> {
        let written = if self.mode == SinkMode::Changelog { self.write_changes_before(Some(frontier))? } else { 0 };
        // Lines before the watermark are final: let readers (`tail -f`) see them.
        self.flush()?;
        Ok(written)
    }

    fn finish(&mut self) -> Result<u64, SinkError> {
        let mut written = self.write_changes_before(None)?;
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
    write_line_sink(lines, "WriteLines", header, target, mode, false)
}

/// Runs a [`LineSink`] on `lines` (its rows JSON values if `json_rows`).
fn write_line_sink(
    lines: &EventStream<'_, String>,
    name: &str,
    header: Option<String>,
    target: LineTarget,
    mode: SinkMode,
    json_rows: bool,
) -> SinkHandle {
    // Discarded lines are only counted: no need to gather them on one worker.
    let placement = if matches!(target, LineTarget::Discard) { Placement::EachWorker } else { Placement::Worker0 };
    write(lines, name, placement, move |_worker, handle| {
        let sink = LineSink::open(&target, header.as_deref(), mode, handle)?;
        Ok(if json_rows { sink.json_rows() } else { sink })
    })
}

/// Writes every record as one JSON object per line (JSON Lines), from worker 0.
///
/// Updating streams should be written in [`SinkMode::Table`] or
/// [`SinkMode::Changelog`] (`{"row":…,"diff":…}` per line); the lines are the
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
    write_line_sink(&lines, "WriteJsonLines", None, target, mode, true)
}

#[cfg(test)]
mod tests {
    use timely::dataflow::operators::ToStream;

    use super::*;

    fn changelog(updates: Vec<Update<String>>, json: bool) -> Vec<String> {
        let path = std::env::temp_dir().join(format!("hw-changelog-{}-{json}", std::process::id()));
        let target = LineTarget::File(path.clone());
        timely::example(move |scope| {
            let stream = EventStream::new(updates.to_stream(scope));
            if json {
                write_json_lines(&stream, target, SinkMode::Changelog);
            } else {
                write_lines(&stream, Some("word,diff".into()), target, SinkMode::Changelog);
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_changelog_is_written_consolidated_in_time_order() {
        let u = |line: &str, time, diff| (line.to_owned(), time, diff);
        // Out of time order, with a change that cancels out at time 5.
        let updates = vec![u("b", 7, 1), u("a", 5, 1), u("a", 5, -1), u("c", 5, 2), u("c", 7, -1), u("a", 9, 1)];
        assert_eq!(changelog(updates, false), ["word,diff", "c,2", "b,1", "c,-1", "a,1"]);
        let updates = vec![(r#""x""#.to_owned(), 1, 1), (r#""x""#.to_owned(), 2, -1)];
        // write_json_lines encodes the strings again: the rows are JSON strings of JSON text.
        assert_eq!(changelog(updates, true), [r#"{"row":"\"x\"","diff":1}"#, r#"{"row":"\"x\"","diff":-1}"#]);
    }
}
