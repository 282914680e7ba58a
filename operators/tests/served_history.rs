//! A served table's history: a [`TableReader`] with a retention answers as of
//! any retained time exactly as a naive replay of the upserts up to that
//! time does, range scans equal the model's rows in the range, the changes
//! between two times add up to the difference of the two states, and a time
//! before the history gets an error naming where it starts. Two tables on
//! one [`Timeline`] read through one hold are as of the same time.

use std::collections::BTreeMap;
use std::sync::Arc;

use highwater_operators::prelude::*;
use highwater_operators::table::{AsOfError, TableReader, Timeline};
use highwater_operators::{Update, END_OF_TIME};
use proptest::prelude::*;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::core::input::Handle as InputHandle;
use timely::dataflow::operators::core::Input as _;

/// An upsert: key, value (`None` deletes), event time, arrival time.
type Upsert = (u8, Option<u16>, u64, u64);

/// Random upserts of a few keys at distinct event times (so that no two
/// upserts of a key tie), arriving up to 50 ms after their time, out of order.
fn upserts() -> impl Strategy<Value = Vec<Upsert>> {
    let one = (0u8..12, prop::option::weighted(0.85, 0u16..1000), 0u64..50);
    prop::collection::vec(one, 1..120).prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (k, v, skew))| {
                let time = 10 * i as u64 + 5;
                (k, v, time, time + skew)
            })
            .collect()
    })
}

/// The table as of `as_of` by a naive replay: each key's latest upsert at
/// or before it.
fn model(input: &[Upsert], as_of: u64) -> BTreeMap<u8, u16> {
    let mut latest: BTreeMap<u8, (u64, Option<u16>)> = BTreeMap::new();
    for (k, v, t, _) in input.iter().filter(|u| u.2 <= as_of) {
        if latest.get(k).is_none_or(|(lt, _)| lt < t) {
            latest.insert(*k, (*t, *v));
        }
    }
    latest.into_iter().filter_map(|(k, (_, v))| Some((k, v?))).collect()
}

/// The input of the served tables' dataflow.
type Handle = InputHandle<u64, CapacityContainerBuilder<Vec<Update<(u8, Option<u16>)>>>>;

/// Serves the upserts' table (values) and the table of each key's value
/// doubled (doubled) on one timeline, both retaining `retain`.
fn serve(input: &[Upsert], workers: usize, retain: u64) -> (TableReader<u8, u16>, TableReader<u8, u32>) {
    let timeline = Timeline::new();
    let values: TableReader<u8, u16> = TableReader::on(&timeline).retain(retain);
    let doubled: TableReader<u8, u32> = TableReader::on(&timeline).retain(retain);
    let (v, d) = (values.clone(), doubled.clone());
    let input: Arc<Vec<Upsert>> = Arc::new(input.to_vec());
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let index = worker.index();
        let mut handle: Handle = InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            let table = EventStream::new(scope.input_from(&mut handle)).allowed_lateness(100).upsert().table;
            table.serve(&v);
            Table::from_changelog(&table.changelog().map(|(k, v)| (k, u32::from(v) * 2))).serve(&d);
        });
        if index == 0 {
            let mut sorted: Vec<&Upsert> = input.iter().collect();
            sorted.sort_by_key(|u| u.3);
            for (k, v, time, arrival) in sorted {
                // The watermark trails arrivals by the lateness bound (50).
                let low = arrival.saturating_sub(50);
                if low > *handle.time() {
                    handle.advance_to(low);
                    worker.step();
                }
                handle.send(((*k, *v), *time, 1));
            }
        }
        handle.close();
    })
    .expect("timely starts");
    for result in guards.join() {
        result.expect("a worker failed");
    }
    (values, doubled)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn served_tables_answer_as_of_any_retained_time(
        input in upserts(),
        workers in prop::sample::select(vec![1usize, 3]),
        retain in prop::sample::select(vec![0u64, 200, 5_000]),
        lo in 0u8..12,
        span in 0u8..12,
    ) {
        let (values, doubled) = serve(&input, workers, retain);
        let last = input.iter().map(|u| u.2).max().unwrap_or(0);
        prop_assert_eq!(values.watermark(), END_OF_TIME);
        let earliest = values.earliest();
        // At least the retention is kept behind the last watermark before the end.
        prop_assert!(earliest <= (last + 1).saturating_sub(retain), "earliest {} last {}", earliest, last);
        let now = model(&input, END_OF_TIME);
        prop_assert_eq!(values.snapshot(), now.clone().into_iter().collect::<Vec<_>>());
        // Every upsert's time and the millisecond before it, and times between.
        for as_of in (0..=last + 20).filter(|t| t % 5 == 0 || t % 5 == 4) {
            let expected = model(&input, as_of);
            if as_of < earliest {
                prop_assert_eq!(
                    values.get_as_of(&0, as_of),
                    Err(AsOfError::BeforeHistory { as_of, earliest })
                );
                continue;
            }
            prop_assert_eq!(values.snapshot_as_of(as_of).unwrap(), expected.clone().into_iter().collect::<Vec<_>>());
            for k in 0..12u8 {
                prop_assert_eq!(values.get_as_of(&k, as_of).unwrap(), expected.get(&k).copied());
            }
            // The changes from here to the end turn this state into the final one.
            let mut state: BTreeMap<(u8, u16), i64> = expected.iter().map(|(k, v)| ((*k, *v), 1)).collect();
            for (k, v, t, diff) in values.changes(as_of + 1, END_OF_TIME).unwrap() {
                prop_assert!(t > as_of);
                *state.entry((k, v)).or_default() += diff;
            }
            state.retain(|_, d| *d != 0);
            prop_assert_eq!(state, now.iter().map(|(k, v)| ((*k, *v), 1)).collect::<BTreeMap<_, _>>());
        }
        // Range scans: the model's rows in the range, limited.
        let (from, to) = (lo, lo.saturating_add(span));
        let in_range: Vec<(u8, u16)> = now.range(from..to).map(|(k, v)| (*k, *v)).collect();
        prop_assert_eq!(values.range(from..to, usize::MAX), in_range.clone());
        prop_assert_eq!(values.range(from..to, 2), in_range.into_iter().take(2).collect::<Vec<_>>());
        // Both tables through one hold: as of one time.
        let hold = values.timeline().hold_current();
        let (a, b) = (values.read(&hold).unwrap(), doubled.read(&hold).unwrap());
        for k in 0..12u8 {
            prop_assert_eq!(a.get(&k).map(|v| u32::from(v) * 2), b.get(&k));
        }
    }
}

/// A time not complete yet is refused with the watermark; a start after the
/// end of a range is an empty range, not a panic.
#[test]
fn incomplete_times_and_empty_ranges() {
    let reader: TableReader<u8, u16> = TableReader::new();
    assert_eq!(reader.get_as_of(&1, 5), Err(AsOfError::NotComplete { as_of: 5, watermark: 0 }));
    let (values, _) = serve(&[(1, Some(7), 5, 5), (2, Some(8), 15, 20)], 2, 0);
    let (start, end) = (2u8, 1u8);
    assert_eq!(values.range(start..end, 10), vec![]);
    assert_eq!(values.range((std::ops::Bound::Excluded(2), std::ops::Bound::Excluded(2)), 10), vec![]);
    assert_eq!(values.range(2..=2, 10), vec![(2, 8)]);
    assert_eq!(values.snapshot(), vec![(1, 7), (2, 8)]);
}

/// Reads from another thread while the table is written: every time sets
/// every key to that time, so a read as of any time finds that one value in
/// every key (point reads and whole scans, across the shards' parts and
/// workers), while the operators insert and fold the history away under
/// the reads. A read at the table's watermark is never refused.
#[test]
fn reads_while_the_table_is_written_see_one_time_in_every_key() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use timely::dataflow::operators::Probe as _;
    const KEYS: u32 = 2_000;
    const TIMES: u64 = 1_000;
    type Input = InputHandle<u64, CapacityContainerBuilder<Vec<Update<(u32, Option<u64>)>>>>;
    let reader: TableReader<u32, u64> = TableReader::new();
    let writing = Arc::new(AtomicBool::new(true));
    let (r, w) = (reader.clone(), Arc::clone(&writing));
    let checker = std::thread::spawn(move || {
        let (mut gets, mut scans, mut key) = (0u64, 0u64, 0u32);
        while w.load(Ordering::Acquire) || scans == 0 {
            let hold = r.hold_current();
            let Some(as_of) = hold.as_of() else { continue };
            let read = r.read(&hold).unwrap_or_else(|e| panic!("a read at the watermark {as_of} refused: {e}"));
            let expected = (as_of > 0).then_some(as_of.min(TIMES));
            key = (key * 7 + 13) % KEYS;
            assert_eq!(read.get(&key), expected, "key {key} as of {as_of}");
            gets += 1;
            if gets % 64 == 0 && expected.is_some() {
                let rows = read.range(.., usize::MAX);
                assert_eq!(rows.len(), KEYS as usize, "keys as of {as_of}");
                assert!(rows.iter().enumerate().all(|(i, (k, v))| *k == i as u32 && Some(*v) == expected));
                scans += 1;
            }
        }
        (gets, scans)
    });
    let r = reader.clone();
    let guards = timely::execute(timely::Config::process(2), move |worker| {
        let mut handle: Input = InputHandle::new();
        let probe = timely::dataflow::ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            let table = EventStream::new(scope.input_from(&mut handle)).upsert().table;
            table.serve(&r);
            table.changelog().inner.probe_with(&probe);
        });
        let index = worker.index() as u32;
        for time in 1..=TIMES {
            handle.advance_to(time);
            for k in (index..KEYS).step_by(2) {
                handle.send(((k, Some(time)), time, 1));
            }
            handle.advance_to(time + 1);
            while probe.less_than(&time) {
                worker.step();
            }
        }
    })
    .expect("timely starts");
    for result in guards.join() {
        result.expect("a worker failed");
    }
    writing.store(false, Ordering::Release);
    let (gets, scans) = checker.join().expect("the reads agree");
    assert!(gets > 0 && scans > 0, "{gets} gets, {scans} scans");
    assert_eq!(reader.snapshot().len(), KEYS as usize);
    assert!(reader.snapshot().iter().all(|(_, v)| *v == TIMES));
}
