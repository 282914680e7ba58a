//! Source watermarks: the minimum over partitions, with idle partitions left out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::dead_letter::DeadLetter;
use highwater::source::{read, Offset, PartitionReader, ReadStatus, Source, SourceError, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::prelude::*;
use timely::dataflow::operators::Inspect;

/// Partition 0 has records at 0..20 s; partition 1 stays silent for `silence`, then ends.
struct Lopsided {
    silence: Duration,
    started: Instant,
}

enum Reader {
    Busy(std::vec::IntoIter<u64>),
    Silent(Instant, Duration),
}

impl PartitionReader for Reader {
    type Record = u64;
    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(u64),
        _: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        match self {
            Reader::Busy(times) => {
                times.by_ref().take(max).for_each(out);
                Ok(if times.len() == 0 { ReadStatus::End } else { ReadStatus::Data })
            }
            Reader::Silent(started, silence) => {
                Ok(if started.elapsed() >= *silence { ReadStatus::End } else { ReadStatus::Idle })
            }
        }
    }
    fn offset(&self) -> Offset {
        0
    }
}

impl Source for Lopsided {
    type Record = u64;
    type Reader = Reader;
    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok(vec!["busy".into(), "silent".into()])
    }
    fn open(&self, index: usize, _from: Option<Offset>) -> Result<Reader, SourceError> {
        Ok(match index {
            0 => Reader::Busy((0..20_000).step_by(100).collect::<Vec<u64>>().into_iter()),
            _ => Reader::Silent(self.started, self.silence),
        })
    }
}

/// Runs a 1 s tumbling count over the lopsided source; returns when each
/// window result arrived, relative to the start.
fn arrivals(idle_timeout: Option<Duration>, workers: usize) -> Vec<(u64, Duration)> {
    let started = Instant::now();
    let source = Arc::new(Lopsided { silence: Duration::from_millis(1500), started });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    // Made once: the workers share its watermark board.
    let options =
        SourceOptions { watermark: WatermarkStrategy::bounded(0), idle_timeout, batch_size: 10, ..Default::default() };
    timely::execute(timely::Config::process(workers), move |worker| {
        let (source, seen, options) = (Arc::clone(&source), Arc::clone(&s), options.clone());
        worker.dataflow(|scope| {
            let times = read(scope, source, |t: &u64| *t, options, &SourceMetrics::default(), None).unwrap();
            let counts = times.events.window(Tumbling::of(1_000)).aggregate(Count);
            counts
                .results
                .inner
                .inspect(move |(r, _, _)| seen.lock().unwrap().push((r.window.start, started.elapsed())));
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    seen
}

fn idle_partition_stops_holding_the_watermark(workers: usize) {
    let with_idleness = arrivals(Some(Duration::from_millis(100)), workers);
    assert_eq!(with_idleness.len(), 20, "one count per second of data");
    // The busy partition's windows fire while the other partition is still silent.
    let early = with_idleness.iter().filter(|(_, at)| *at < Duration::from_millis(1400)).count();
    assert!(early >= 19, "windows should fire during the silence: {with_idleness:?}");

    let without = arrivals(None, workers);
    assert_eq!(without.len(), 20);
    // A silent partition that is never idle holds every window until it ends.
    assert!(without.iter().all(|(_, at)| *at >= Duration::from_millis(1500)), "{without:?}");
}

#[test]
fn idle_partition_stops_holding_the_watermark_1w() {
    idle_partition_stops_holding_the_watermark(1)
}

#[test]
fn idle_partition_stops_holding_the_watermark_2w() {
    idle_partition_stops_holding_the_watermark(2)
}

/// A third worker with no partition at all must not hold the idle one back.
#[test]
fn idle_partition_stops_holding_the_watermark_3w() {
    idle_partition_stops_holding_the_watermark(3)
}
