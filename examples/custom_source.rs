//! A source of your own: implement [`Source`] (the partitions) and
//! [`PartitionReader`] (reading one of them from an offset), and highwater
//! does the rest: partitions spread over the workers, per-partition
//! watermarks, dead letters for input that does not parse, checkpoints that
//! rewind to the offsets.
//!
//! ```sh
//! cargo run --release --example custom_source -- -w 2
//! ```
//!
//! The source here is a set of sensor logs, one partition per sensor, each a
//! list of text lines `time_ms,celsius` (some of them garbled). The job
//! takes the hottest reading per sensor and minute. The program checks the
//! results against maxima computed directly from the lines, and that every
//! garbled line came out as a dead letter, then prints a summary. Arguments
//! are timely's `-w -n -p -h`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use highwater::dead_letter::DeadLetter;
use highwater::prelude::*;
use highwater::source::{Offset, PartitionReader, ReadStatus, SourceError};

/// A reading parsed from a line.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reading {
    /// The sensor (the partition's index).
    pub sensor: usize,
    /// Event time (ms).
    pub time: u64,
    /// Temperature in tenths of a degree.
    pub decidegrees: i64,
}

/// The logs: `sensors` partitions of `lines` lines, every 97th garbled.
pub fn logs(sensors: usize, lines: usize) -> Vec<Vec<String>> {
    (0..sensors)
        .map(|s| {
            (0..lines)
                .map(|i| {
                    if i % 97 == 13 {
                        format!("garbled line {i}")
                    } else {
                        // A little out of order: every 5th reading comes 2 s late.
                        let time = i as u64 * 1_000 - if i % 5 == 0 && i > 0 { 2_000.min(i as u64 * 1_000) } else { 0 };
                        let celsius = 18.0 + ((i * 7 + s * 3) % 60) as f64 / 10.0;
                        format!("{time},{celsius:.1}")
                    }
                })
                .collect()
        })
        .collect()
}

/// The source: one partition per sensor log.
#[derive(Debug)]
pub struct SensorLogs {
    logs: Vec<Arc<Vec<String>>>,
}

impl SensorLogs {
    /// A source over these logs.
    pub fn new(logs: Vec<Vec<String>>) -> Self {
        SensorLogs { logs: logs.into_iter().map(Arc::new).collect() }
    }
}

impl Source for SensorLogs {
    type Record = Reading;
    type Reader = SensorReader;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok((0..self.logs.len()).map(|s| format!("sensor-{s}")).collect())
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<SensorReader, SourceError> {
        let lines = self.logs.get(index).ok_or_else(|| SourceError::Config(format!("no sensor {index}")))?;
        // The offset is the number of lines already read: a restored
        // checkpoint reopens the partition after them.
        Ok(SensorReader { sensor: index, lines: Arc::clone(lines), next: from.unwrap_or(0) as usize })
    }
}

/// Reads one sensor's log.
#[derive(Debug)]
pub struct SensorReader {
    sensor: usize,
    lines: Arc<Vec<String>>,
    next: usize,
}

impl SensorReader {
    fn parse(&self, line: &str) -> Result<Reading, String> {
        let (time, celsius) = line.split_once(',').ok_or("expected time_ms,celsius")?;
        let time = time.parse().map_err(|e| format!("time {time:?}: {e}"))?;
        let celsius: f64 = celsius.parse().map_err(|e| format!("temperature {celsius:?}: {e}"))?;
        Ok(Reading { sensor: self.sensor, time, decidegrees: (celsius * 10.0).round() as i64 })
    }
}

impl PartitionReader for SensorReader {
    type Record = Reading;

    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(Reading),
        dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        let end = (self.next + max).min(self.lines.len());
        for offset in self.next..end {
            let line = &self.lines[offset];
            match self.parse(line) {
                Ok(reading) => out(reading),
                // Bad input is a dead letter, never a panic or a silent loss.
                Err(reason) => dead.push(DeadLetter::new(
                    format!("sensor-{}", self.sensor),
                    offset as u64,
                    reason,
                    line.as_bytes(),
                )),
            }
        }
        self.next = end;
        Ok(if end == self.lines.len() { ReadStatus::End } else { ReadStatus::Data })
    }

    fn offset(&self) -> Offset {
        self.next as Offset
    }
}

/// What a run found: `(sensor, minute start, max decidegrees)` rows and the
/// dead letters' `(sensor partition, line)`.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    /// Hottest reading per sensor and minute.
    pub maxima: BTreeMap<(usize, u64), i64>,
    /// Garbled lines, as (partition, line number).
    pub dead: Vec<(String, u64)>,
}

/// Runs the job on the layout `timely_args` describe; this process's share
/// of the results (all of them on one process).
pub fn run(logs: Vec<Vec<String>>, timely_args: &[String]) -> anyhow::Result<Found> {
    let source = Arc::new(SensorLogs::new(logs));
    let found = Arc::new(Mutex::new(Found::default()));
    let shared = Arc::clone(&found);
    Job::from_args(timely_args)?.run(move |worker| {
        let (source, found) = (Arc::clone(&source), Arc::clone(&shared));
        worker.dataflow(|scope| -> Result<(), SourceError> {
            let readings = FromSource::new(source, |r: &Reading| r.time)
                .named("sensors")
                .watermark(WatermarkStrategy::bounded(3.secs()))
                .build(scope)?;
            let hottest = readings
                .events
                .key_by(|r: &Reading| r.sensor)
                .window(Tumbling::of(1.minutes()))
                .aggregate(Max::of(|r: &Reading| r.decidegrees));
            let sink = Arc::clone(&found);
            hottest.results.inspect(move |(r, _, diff)| {
                assert_eq!(*diff, 1, "no record is late: results are final");
                sink.lock().unwrap().maxima.insert((r.key, r.window.start), r.value);
            });
            let sink = Arc::clone(&found);
            readings
                .dead_letters
                .inspect(move |(d, _, _)| sink.lock().unwrap().dead.push((d.origin.clone(), d.offset)));
            Ok(())
        })
    })?;
    let mut found = std::mem::take(&mut *found.lock().unwrap());
    found.dead.sort();
    Ok(found)
}

/// The results computed directly from the lines.
pub fn expected(logs: &[Vec<String>]) -> Found {
    let mut out = Found::default();
    for (sensor, lines) in logs.iter().enumerate() {
        let reader = SensorReader { sensor, lines: Arc::new(Vec::new()), next: 0 };
        for (i, line) in lines.iter().enumerate() {
            match reader.parse(line) {
                Ok(r) => {
                    let max = out.maxima.entry((sensor, r.time / 60_000 * 60_000)).or_insert(i64::MIN);
                    *max = (*max).max(r.decidegrees);
                }
                Err(_) => out.dead.push((format!("sensor-{sensor}"), i as u64)),
            }
        }
    }
    out.dead.sort();
    out
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let logs = logs(6, 2_000);
    let found = run(logs.clone(), &args)?;
    anyhow::ensure!(found == expected(&logs), "the results differ from the maxima computed directly");
    println!(
        "ok: {} (sensor, minute) maxima and {} dead letters, as computed directly",
        found.maxima.len(),
        found.dead.len()
    );
    Ok(())
}
