//! Sinks: where results go.
//!
//! A [`Sink`] takes the updates of a stream and learns when the watermark
//! passes them ([`Sink::advance`]), which is where a transactional sink will
//! commit; [`write()`] runs one on worker 0 or on every worker. The embedded
//! sinks write lines (CSV or JSON) to a file or stdout, in append or table mode
//! ([`write_lines`]); [`collect`] gathers updates in memory for tests and
//! notebooks.

#[cfg(any(feature = "kafka", feature = "mqtt"))]
pub(crate) mod at_least_once;
mod collect;
mod csv;
mod encode;
mod lines;
mod parts;
#[cfg(feature = "postgres")]
mod postgres;

use std::sync::{Arc, Mutex};

use highwater_operators::key::Data;
use highwater_operators::{Counter, EventStream, Timestamp, Update};
use timely::dataflow::operators::generic::Operator;

#[cfg(feature = "postgres")]
pub use self::postgres::{
    parse_csv_line, write_postgres, CsvLineError, PostgresCommitter, PostgresSinkConfig, PostgresSinkError,
};
pub use collect::{collect, Collected};
pub use csv::{csv_field, CsvRow};
pub use encode::{Encode, EncodeError, JsonEncoder, RawEncoder, TextEncoder};
pub use lines::{write_json_lines, write_lines, LineSink, LineTarget, SinkMode};
pub use parts::{write_parts, PartFiles, PartFormat};

/// An error writing to a sink: what failed and on which output.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// An I/O error on a named output.
    #[error("writing {what}: {source}")]
    Io {
        /// The output, e.g. a file path.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl SinkError {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SinkError::Io { source, .. } => {
                matches!(source.kind(), std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock)
            }
        }
    }
}

/// A destination for the updates of a stream.
pub trait Sink: 'static {
    /// The records it takes.
    type Item;
    /// Takes a batch of updates; returns how many records it wrote.
    fn write(&mut self, updates: &mut Vec<Update<Self::Item>>) -> Result<u64, SinkError>;
    /// The watermark passed `frontier`: every update before it has been given
    /// to `write`. Returns how many records that released.
    fn advance(&mut self, _frontier: Timestamp) -> Result<u64, SinkError> {
        Ok(0)
    }
    /// The input is complete. Returns how many records that released.
    fn finish(&mut self) -> Result<u64, SinkError> {
        Ok(0)
    }
}

/// Which workers run a sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// All updates go to worker 0, which runs the only instance (one file).
    Worker0,
    /// Each worker runs an instance for the updates it has (partitioned output).
    EachWorker,
}

/// Counters of a sink and its errors.
#[derive(Clone, Debug, Default)]
pub struct SinkHandle {
    /// Records written.
    pub lines: Counter,
    /// Retractions an append-only sink could not apply.
    pub unapplied_retractions: Counter,
    /// Errors (a sink stops after its first).
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl SinkHandle {
    /// Errors recorded so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub(crate) fn fail(&self, e: SinkError) {
        tracing::error!("sink stops: {e}");
        if let Ok(mut errors) = self.errors.lock() {
            errors.push(e.to_string());
        }
    }
}

/// Runs the sink made by `make(worker, handle)` on `stream`.
///
/// In a job that measures its latency ([`crate::latency`]), the updates of
/// each [`Sink::write`] call count as emitted when it returns.
///
/// The sink is made lazily, on the workers that run it. After its first error
/// it is dropped (the error is in the returned handle) and the stream drained.
pub fn write<T, S, F>(stream: &EventStream<'_, T>, name: &str, placement: Placement, make: F) -> SinkHandle
where
    T: Data,
    S: Sink<Item = T>,
    F: FnOnce(usize, &SinkHandle) -> Result<S, SinkError> + 'static,
{
    let handle = SinkHandle::default();
    let h = handle.clone();
    let worker = stream.scope().index();
    let runs_here = placement == Placement::EachWorker || worker == 0;
    let mut make = Some(make);
    let mut sink: Option<S> = None;
    let mut finished = false;
    let mut batch = Vec::new();
    // Measuring latency: the event times of the batch being written.
    let latency = crate::latency::Latency::of(&stream.scope()).filter(|_| runs_here);
    let mut times = Vec::new();
    let logic = move |input: &mut timely::dataflow::operators::generic::InputHandleCore<_, Vec<Update<T>>, _>,
                      frontier: &timely::progress::frontier::MutableAntichain<Timestamp>| {
        if let Some(make) = make.take().filter(|_| runs_here) {
            match make(worker, &h) {
                Ok(s) => sink = Some(s),
                Err(e) => h.fail(e),
            }
        }
        input.for_each_stamp(|_cap, data| {
            for updates in data {
                std::mem::swap(updates, &mut batch);
                if let Some(s) = sink.as_mut() {
                    if latency.is_some() {
                        times.clear();
                        times.extend(batch.iter().map(|u| u.1));
                    }
                    match s.write(&mut batch) {
                        Ok(n) => {
                            h.lines.add(n);
                            if let Some(latency) = latency.as_ref() {
                                latency.emitted(&times);
                            }
                        }
                        Err(e) => {
                            h.fail(e);
                            sink = None;
                        }
                    }
                }
                batch.clear();
            }
        });
        if let Some(s) = sink.as_mut() {
            let released = if frontier.is_empty() {
                if std::mem::replace(&mut finished, true) {
                    Ok(0)
                } else {
                    s.finish()
                }
            } else {
                s.advance(highwater_operators::time::watermark_of(frontier))
            };
            match released {
                Ok(n) => h.lines.add(n),
                Err(e) => {
                    h.fail(e);
                    sink = None;
                }
            }
        }
    };
    // Worker 0, or each worker to itself (a move, not a copy, within a process).
    let target = if placement == Placement::Worker0 { 0 } else { worker as u64 };
    let mut logic = logic;
    let pact = highwater_operators::flow::exchange(move |_: &Update<T>| target);
    stream.inner.clone().sink(pact, name, move |(i, f)| logic(i, f));
    handle
}
