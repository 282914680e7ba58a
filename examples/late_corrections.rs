//! Allowed lateness with corrections: a window fires when the watermark
//! passes its end; a record that arrives later, but within the allowed
//! lateness, corrects it (a retraction of the old result and the new one);
//! a record later still goes to the late output, never silently dropped.
//!
//! ```sh
//! cargo run --release --example late_corrections -- -w 2
//! ```
//!
//! Taps per user are summed in 10 s windows with 5 s of allowed lateness, on
//! a stream whose watermark is 2 s behind the greatest event time read. The
//! source reads one record at a time (`batch_size(1)`), so the watermark
//! advances after every record and each record is judged against the ones
//! before it (by default a read holds 4096 records, and a small input would
//! show no late record at all). The results are written as a changelog
//! (`SinkMode::Changelog`: each row with `,1` or `,-1`) to stdout. The
//! program checks, against a model of the watermark computed directly from
//! the input, which records were too late, and that the changelog, applied,
//! gives the sums of all the others. Arguments are timely's `-w -n -p -h`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use highwater::prelude::*;

/// Window size, allowed lateness and watermark delay (ms).
const WINDOW: u64 = 10_000;
const LATENESS: u64 = 5_000;
const DELAY: u64 = 2_000;

/// A tap: who, how many points, when.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tap {
    /// The user.
    pub user: char,
    /// Points.
    pub points: i64,
    /// Event time (ms).
    pub time: u64,
    /// Its position in the input.
    pub seq: usize,
}

/// 600 taps, mostly in order; every 7th arrives 6.5 s late (after its
/// window fired, within the lateness), every 23rd 16.5 s late (too late).
pub fn taps() -> Vec<Tap> {
    (0..600)
        .map(|i| {
            let now = i as u64 * 300 + 20_037;
            let behind = if i % 23 == 0 {
                16_500
            } else if i % 7 == 0 {
                6_500
            } else {
                0
            };
            Tap { user: ['a', 'b', 'c'][i % 3], points: (i % 10) as i64 + 1, time: now - behind, seq: i }
        })
        .collect()
}

/// The model: which taps the windows must reject (too late), and the sums
/// of the rest, `(window start, user) → points`.
pub fn model(taps: &[Tap]) -> (BTreeSet<usize>, BTreeMap<(u64, char), i64>) {
    let mut late = BTreeSet::new();
    let mut sums = BTreeMap::new();
    let mut max_seen: Option<u64> = None;
    for tap in taps {
        // A record goes out at the watermark before its read: the greatest
        // event time read so far minus the delay.
        let watermark = max_seen.map_or(0, |m| m.saturating_sub(DELAY));
        let end = tap.time / WINDOW * WINDOW + WINDOW;
        if watermark >= end + LATENESS {
            late.insert(tap.seq);
        } else {
            *sums.entry((end - WINDOW, tap.user)).or_insert(0) += tap.points;
        }
        max_seen = Some(max_seen.map_or(tap.time, |m| m.max(tap.time)));
    }
    (late, sums)
}

/// What a run produced: the late taps, the changelog's rows, and the sums
/// the changelog gives once applied.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Taps on the late output, by position.
    pub late: BTreeSet<usize>,
    /// Window results with their diffs, as they came.
    pub changes: Vec<((u64, char, i64), i64)>,
}

impl Outcome {
    /// The changelog applied: the final sum of every window and user.
    pub fn sums(&self) -> BTreeMap<(u64, char), i64> {
        let mut rows: BTreeMap<(u64, char, i64), i64> = BTreeMap::new();
        for (row, diff) in &self.changes {
            *rows.entry(*row).or_insert(0) += diff;
        }
        rows.into_iter()
            .filter(|(_, n)| *n != 0)
            .map(|((start, user, sum), n)| {
                assert_eq!(n, 1, "one result per window and user");
                ((start, user), sum)
            })
            .collect()
    }

    /// How many results were retracted by a correction.
    pub fn corrections(&self) -> usize {
        self.changes.iter().filter(|(_, diff)| *diff < 0).count()
    }
}

/// Runs the job on the layout `timely_args` describe; writes the changelog
/// to stdout if `print`.
pub fn run(timely_args: &[String], print: bool) -> anyhow::Result<Outcome> {
    let source = Arc::new(MemorySource::new(vec![taps()]));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let shared = Arc::clone(&outcome);
    Job::from_args(timely_args)?.run(move |worker| {
        let (source, outcome) = (Arc::clone(&source), Arc::clone(&shared));
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let taps = FromSource::new(source, |t: &Tap| t.time)
                .watermark(WatermarkStrategy::bounded(DELAY))
                .batch_size(1)
                .build(scope)?;
            let sums = taps
                .events
                .window(Tumbling::of(WINDOW))
                .key_by(|t: &Tap| t.user)
                .allowed_lateness(LATENESS)
                .aggregate(Sum::of(|t: &Tap| t.points));
            let log = Arc::clone(&outcome);
            let results = sums.results.inspect(move |(r, _, diff)| {
                log.lock().unwrap().changes.push(((r.window.start, r.key, r.value), *diff));
            });
            let log = Arc::clone(&outcome);
            sums.late.stream.inspect(move |(t, _, _)| {
                log.lock().unwrap().late.insert(t.seq);
            });
            if print {
                let rows = results.map(|r| format!("{},{},{}", r.window.start, r.key, r.value));
                write_lines(
                    &rows,
                    Some("window_start,user,points,diff".into()),
                    LineTarget::Stdout,
                    SinkMode::Changelog,
                );
            }
            Ok(())
        })
    })?;
    let outcome = std::mem::take(&mut *outcome.lock().unwrap());
    Ok(outcome)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = run(&args, true)?;
    let (late, sums) = model(&taps());
    anyhow::ensure!(outcome.late == late, "late taps {:?}, the model says {:?}", outcome.late, late);
    anyhow::ensure!(outcome.sums() == sums, "the changelog applied differs from the sums of the taps in time");
    anyhow::ensure!(!late.is_empty(), "the input should have taps too late for their window");
    eprintln!(
        "ok: {} windows, {} results corrected by late taps, {} taps too late (as the model says)",
        sums.len(),
        outcome.corrections(),
        late.len()
    );
    Ok(())
}
