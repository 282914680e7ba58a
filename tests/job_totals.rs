//! A job's totals ([`JobReport::totals`]) count what every worker's sinks
//! wrote, also what a sink writes at the very end (a table written out when
//! its input is complete) on a worker that gets there after the others.

use std::sync::Arc;
use std::time::Duration;

use highwater::prelude::*;
use highwater::sink::{write, Placement, Sink, SinkError};
use highwater::source::MemorySource;
use highwater::totals::Totals;
use highwater::{Job, Timestamp};

/// A sink that writes nothing until its input is complete, and then, after
/// a pause on worker 1, counts every record it was given.
struct AtTheEnd {
    held: u64,
    slow: bool,
}

impl Sink for AtTheEnd {
    type Item = u64;
    fn write(&mut self, updates: &mut Vec<(u64, Timestamp, i64)>) -> Result<u64, SinkError> {
        self.held += updates.drain(..).map(|u| u.2 as u64).sum::<u64>();
        Ok(0)
    }
    fn finish(&mut self) -> Result<u64, SinkError> {
        if self.slow {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(self.held)
    }
}

#[test]
fn totals_count_what_the_last_worker_writes_at_the_end() {
    let records = 10_000u64;
    let partitions: Vec<Vec<u64>> = (0..2).map(|p| (0..records).filter(|i| i % 2 == p).collect()).collect();
    let source = Arc::new(MemorySource::new(partitions));
    for _ in 0..3 {
        let source = Arc::clone(&source);
        let report = Job::new(timely::Config::process(2))
            .run(move |worker| -> Result<(), String> {
                let source = Arc::clone(&source);
                worker.dataflow::<Timestamp, _, _>(move |scope| {
                    let read = FromSource::new(source, |t: &u64| *t).build(scope).map_err(|e| e.to_string())?;
                    let handle = write(&read.events, "AtTheEnd", Placement::EachWorker, |worker, _| {
                        Ok(AtTheEnd { held: 0, slow: worker == 1 })
                    });
                    if let Some(totals) = Totals::of(&scope) {
                        totals.count("rows", &handle.lines);
                    }
                    Ok::<_, String>(())
                })
            })
            .expect("the job runs");
        assert_eq!(report.totals.get("rows").copied(), Some(records), "{:?}", report.totals);
    }
}

/// Runs windows, a pattern and an as-of join over one partition of
/// `(key, time)` records, some behind the watermark (bounded by 0, a
/// watermark per record), with `lateness` job-wide; returns the job's
/// totals and the records each operator's `.late` stream carried.
fn late_job(lateness: Option<u64>) -> (std::collections::BTreeMap<String, u64>, [u64; 3]) {
    use highwater::time::WatermarkStrategy;
    use std::sync::atomic::{AtomicU64, Ordering};
    use timely::dataflow::operators::Inspect;

    let times = [1_000u64, 5_000, 12_000, 2_000, 25_000, 3_000, 11_000, 40_000, 4_000, 39_000, 60_000, 15_000];
    let records: Vec<(u8, u64)> = times.iter().enumerate().map(|(i, t)| ((i % 2) as u8, *t)).collect();
    let source = Arc::new(MemorySource::new(vec![records]));
    let seen: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let counted = Arc::clone(&seen);
    let mut job = Job::new(timely::Config::process(1));
    if let Some(lateness) = lateness {
        job = job.allowed_lateness(lateness);
    }
    let report = job
        .run(move |worker| -> Result<(), String> {
            let (source, seen) = (Arc::clone(&source), Arc::clone(&counted));
            worker.dataflow::<Timestamp, _, _>(move |scope| {
                let read = FromSource::new(source, |r: &(u8, u64)| r.1)
                    .watermark(WatermarkStrategy::bounded(0))
                    .batch_size(1)
                    .build(scope)
                    .map_err(|e| e.to_string())?;
                let events = read.events;
                let windows =
                    events.key_by(|r: &(u8, u64)| r.0).window(Tumbling::of(10_000)).named("Tumble").aggregate(Count);
                let matches = events
                    .key_by(|r: &(u8, u64)| r.0)
                    .pattern(Pattern::begin("any").where_(|_: &(u8, u64)| true))
                    .map_err(|e| e.to_string())?;
                let table = events.map(|r| (r.0, Some(r.1))).upsert().table;
                let joined = events.left_join_as_of(&table, |r: &(u8, u64)| r.0);
                for (i, late) in [
                    windows.late.stream.inner.clone(),
                    matches.late.stream.inner.clone(),
                    joined.late.stream.inner.clone(),
                ]
                .into_iter()
                .enumerate()
                {
                    let seen = Arc::clone(&seen);
                    late.inspect(move |_| {
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
                Ok::<_, String>(())
            })
        })
        .expect("the job runs");
    let seen = [0, 1, 2].map(|i| seen[i].load(Ordering::Relaxed));
    (report.totals, seen)
}

#[test]
fn every_operator_reports_its_late_records_and_the_job_wide_lateness_applies() {
    let (totals, seen) = late_job(None);
    let late = |name: &str| totals.get(name).copied().unwrap_or(0);
    assert!(seen.iter().all(|&n| n > 0), "each operator had late records: {seen:?} {totals:?}");
    assert_eq!(
        [late("Tumble.late"), late("MatchPattern.late"), late("LeftJoinAsOf.late")],
        seen,
        "each operator's late count is what its late stream carried: {totals:?}"
    );
    // Job-wide, an hour of lateness: no record is late anywhere.
    let (totals, seen) = late_job(Some(3_600_000));
    assert_eq!(seen, [0, 0, 0], "{totals:?}");
    assert_eq!(totals.iter().filter(|(name, _)| name.ends_with(".late")).map(|(_, n)| n).sum::<u64>(), 0);
}
