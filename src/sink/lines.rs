//! Writing encoded lines to a file or stdout.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use highwater_operators::{Counter, EventStream, Timestamp};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;

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

/// Counters of a line sink, and its I/O errors.
#[derive(Clone, Debug, Default)]
pub struct SinkHandle {
    /// Lines written.
    pub lines: Counter,
    /// Retractions an append sink could not apply.
    pub unapplied_retractions: Counter,
    /// I/O errors (the sink stops writing after the first).
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl SinkHandle {
    /// Errors recorded so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

enum Writer {
    File(BufWriter<File>),
    Stdout(BufWriter<std::io::Stdout>),
    Discard,
}

impl Writer {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Writer::File(w) => w.write_all(bytes),
            Writer::Stdout(w) => w.write_all(bytes),
            Writer::Discard => Ok(()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Writer::File(w) => w.flush(),
            Writer::Stdout(w) => w.flush(),
            Writer::Discard => Ok(()),
        }
    }
}

/// Writes a stream of lines (without line endings), after an optional header,
/// from worker 0. Returns the counters; the output is complete once the
/// dataflow's input is exhausted and the workers are joined.
pub fn write_lines(
    lines: &EventStream<'_, String>,
    header: Option<String>,
    target: LineTarget,
    mode: SinkMode,
) -> SinkHandle {
    let handle = SinkHandle::default();
    let h = handle.clone();
    let pact = Exchange::new(|_: &(String, Timestamp, i64)| 0u64);
    let mut writer: Option<Writer> = None;
    // Every line goes to worker 0; the others never open the target.
    let mut opened = lines.scope().index() != 0;
    let mut finished = false;
    let mut table: HashMap<String, i64> = HashMap::new();
    let target_name = match &target {
        LineTarget::File(path) => path.display().to_string(),
        LineTarget::Stdout => "stdout".to_owned(),
        LineTarget::Discard => "nowhere".to_owned(),
    };
    let fail = move |h: &SinkHandle, writer: &mut Option<Writer>, e: std::io::Error| {
        if let Ok(mut errors) = h.errors.lock() {
            errors.push(format!("writing {target_name}: {e}"));
        }
        *writer = None;
    };
    lines.inner.clone().sink(pact, "WriteLines", move |(input, frontier)| {
        if !opened {
            opened = true;
            match open(&target) {
                Ok(mut w) => {
                    let header_written = match &header {
                        Some(line) => w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")),
                        None => Ok(()),
                    };
                    match header_written {
                        Ok(()) => writer = Some(w),
                        Err(e) => fail(&h, &mut writer, e),
                    }
                }
                Err(e) => fail(&h, &mut writer, e),
            }
        }
        let mut written = 0u64;
        let mut error = None;
        input.for_each_stamp(|_cap, data| {
            for batch in data {
                for (line, _time, diff) in batch.drain(..) {
                    match mode {
                        SinkMode::Table => *table.entry(line).or_insert(0) += diff,
                        SinkMode::Append if diff < 0 => h.unapplied_retractions.add(diff.unsigned_abs()),
                        SinkMode::Append => {
                            if let Some(w) = writer.as_mut() {
                                for _ in 0..diff {
                                    if let Err(e) = w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")) {
                                        error = Some(e);
                                    }
                                    written += 1;
                                }
                            }
                        }
                    }
                }
            }
        });
        if let Some(e) = error.take() {
            fail(&h, &mut writer, e);
        }
        if frontier.is_empty() && !finished {
            finished = true;
            if mode == SinkMode::Table {
                let mut rows: Vec<_> = table.drain().filter(|(_, n)| *n != 0).collect();
                rows.sort();
                for (line, n) in rows {
                    if n < 0 {
                        h.unapplied_retractions.add(n.unsigned_abs());
                        continue;
                    }
                    if let Some(w) = writer.as_mut() {
                        for _ in 0..n {
                            if let Err(e) = w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")) {
                                error = Some(e);
                            }
                            written += 1;
                        }
                    }
                }
            }
        }
        if let Some(w) = writer.as_mut() {
            if let Err(e) = w.flush() {
                error = Some(e);
            }
        }
        if let Some(e) = error {
            fail(&h, &mut writer, e);
        }
        h.lines.add(written);
    });
    handle
}

fn open(target: &LineTarget) -> std::io::Result<Writer> {
    Ok(match target {
        LineTarget::File(path) => Writer::File(BufWriter::with_capacity(1 << 20, File::create(path)?)),
        LineTarget::Stdout => Writer::Stdout(BufWriter::with_capacity(1 << 16, std::io::stdout())),
        LineTarget::Discard => Writer::Discard,
    })
}
