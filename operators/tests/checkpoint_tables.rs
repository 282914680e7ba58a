//! Tables recover from a checkpoint: the upsert operator's key histories, the
//! as-of joins' table versions and waiting events, and a served reader's
//! shards. The committed output of a run checkpointed at a random cut and
//! recovered on another number of workers equals an uninterrupted run's,
//! time by time, and so does what a [`TableReader`] shows at the end.

use std::sync::Arc;

use highwater_operators::checkpoint;
use highwater_operators::checkpoint::memory::{check_recovery, Input, MemoryStore};
use highwater_operators::prelude::*;
use highwater_operators::table::TableReader;
use highwater_operators::{Update, END_OF_TIME};
use proptest::prelude::*;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::core::input::Handle as InputHandle;
use timely::dataflow::operators::core::Input as _;

/// The allowed lateness of every operator here.
const LATENESS: u64 = 100;

/// An upsert: a key and its new value (`None` deletes it).
type Upsert = (u8, Option<u8>);

/// Random upserts and deletes of a few keys at event times in [0, 1000),
/// arriving up to 200 ms before or 300 ms after their time (some later than
/// the lateness), with undos (negative diffs) of some of them.
fn upserts() -> impl Strategy<Value = Vec<Input<Upsert>>> {
    let one = (0u8..5, prop::option::weighted(0.8, 0u8..4), 0u64..1000, 0u64..500, 0u8..8);
    prop::collection::vec(one, 1..80).prop_map(|raw| {
        let mut out = Vec::new();
        for (k, v, time, skew, undo) in raw {
            let arrival = (time + skew).saturating_sub(200);
            out.push(((k, v), time, 1, arrival));
            if undo == 0 {
                // Undone a little later (or, now and then, before it arrives).
                out.push(((k, v), time, -1, (arrival + 40 * (skew % 3)).saturating_sub(20)));
            }
        }
        out
    })
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2))]
}

/// What the upsert test commits: the table's changelog and the late upserts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
enum Logged {
    Row(u8, u8),
    Late(u8, Option<u8>),
}

fn changelog<'s>(events: &EventStream<'s, Upsert>) -> EventStream<'s, Logged> {
    let upserted = events.allowed_lateness(LATENESS).upsert();
    let rows = upserted.table.changelog().map(|(k, v)| Logged::Row(k, v));
    rows.concat(&upserted.late.stream.map(|(k, v)| Logged::Late(k, v)))
}

/// The input of the as-of joins: table upserts and events `(key, id)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
enum Mixed {
    Table(Upsert),
    Event(u8, u16),
}

/// Table upserts that arrive at or before their event time (so that every
/// event sees the same table versions whenever it is joined), undos among
/// them, and events of the same keys arriving in any order, some late.
fn mixed() -> impl Strategy<Value = Vec<Input<Mixed>>> {
    let table = (0u8..4, prop::option::weighted(0.8, 0u8..4), 0u64..1000, 0u64..200, 0u8..6);
    let events = (0u8..5, 0u64..1000, 0u64..500);
    (prop::collection::vec(table, 0..40), prop::collection::vec(events, 1..60)).prop_map(|(table, events)| {
        let mut out = Vec::new();
        for (k, v, time, early, undo) in table {
            let arrival = time.saturating_sub(early);
            out.push((Mixed::Table((k, v)), time, 1, arrival));
            if undo == 0 {
                out.push((Mixed::Table((k, v)), time, -1, arrival + (time - arrival) / 2));
            }
        }
        for (id, (k, time, skew)) in events.into_iter().enumerate() {
            let arrival = (time + skew).saturating_sub(200);
            out.push((Mixed::Event(k, id as u16), time, 1, arrival));
        }
        out
    })
}

/// What the as-of tests commit: an event `(key, id)` with the value it was
/// joined with, or a late event.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
enum Joined {
    Row(u8, u16, Option<u8>),
    Late(u8, u16),
}

fn as_of_join<'s>(input: &EventStream<'s, Mixed>, left: bool) -> EventStream<'s, Joined> {
    let table = input
        .flat_map(|m| match m {
            Mixed::Table(upsert) => Some(upsert),
            Mixed::Event(..) => None,
        })
        .allowed_lateness(LATENESS)
        .upsert()
        .table;
    let events = input.flat_map(|m| match m {
        Mixed::Event(k, id) => Some((k, id)),
        Mixed::Table(_) => None,
    });
    let (results, late) = if left {
        let joined = events.allowed_lateness(LATENESS).left_join_as_of(&table, |e| e.0);
        (joined.results.map(|((k, id), v)| Joined::Row(k, id, v)), joined.late)
    } else {
        let joined = events.allowed_lateness(LATENESS).join_as_of(&table, |e| e.0);
        (joined.results.map(|((k, id), v)| Joined::Row(k, id, Some(v))), joined.late)
    };
    results.concat(&late.stream.map(|(k, id)| Joined::Late(k, id)))
}

/// Runs upserts into a table served by a [`TableReader`] on `workers`
/// workers, fed the updates of `input` that arrive at `start` or later;
/// returns what the reader shows once the input is done.
fn served(input: &[Input<Upsert>], workers: usize, store: Option<MemoryStore>, start: u64) -> Rows {
    let reader: TableReader<u8, u8> = TableReader::new();
    let serving = reader.clone();
    let input: Arc<Vec<Input<Upsert>>> = Arc::new(input.iter().filter(|u| u.3 >= start).cloned().collect());
    let mut config = timely::Config::process(workers);
    if let Some(s) = store.as_ref() {
        s.configure(&mut config);
    }
    let guards = timely::execute(config, move |worker| {
        let index = worker.index();
        let mut handle: InputHandle<u64, CapacityContainerBuilder<Vec<Update<Upsert>>>> = InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            EventStream::new(scope.input_from(&mut handle)).allowed_lateness(LATENESS).upsert().table.serve(&serving);
        });
        handle.advance_to(start);
        if index == 0 {
            let mut sorted: Vec<&Input<Upsert>> = input.iter().collect();
            sorted.sort_by_key(|u| u.3);
            for (record, time, diff, arrival) in sorted {
                if *arrival > *handle.time() {
                    handle.advance_to(*arrival);
                    worker.step();
                }
                handle.send((*record, *time, *diff));
            }
        }
        handle.close();
    })
    .expect("timely starts");
    for result in guards.join() {
        result.expect("a worker failed");
    }
    assert_eq!(reader.watermark(), END_OF_TIME);
    reader.snapshot()
}

/// A table's rows, as a reader shows them.
type Rows = Vec<(u8, u8)>;

/// What the reader shows after an uninterrupted run, and after a run
/// checkpointed at `cut` on `before` workers and recovered on `after`.
fn served_recovery(input: &[Input<Upsert>], cut: u64, before: usize, after: usize) -> (Rows, Rows) {
    let expected = served(input, before, None, 0);
    let store = MemoryStore::new(before, None);
    store.begin(1, cut);
    served(input, before, Some(store.clone()), 0);
    assert!(store.unsupported().is_empty(), "{:?}", store.unsupported());
    assert!(store.registered().iter().any(|name| name.starts_with("ServeTable@")), "{:?}", store.registered());
    let checkpoint = store.checkpoint(1).expect("the checkpoint completes");
    let recovered = served(input, after, Some(MemoryStore::new(after, Some(checkpoint))), cut);
    (expected, recovered)
}

/// The entries of the operators whose names start with `prefix`.
fn entries_of(checkpoint: &checkpoint::memory::MemoryCheckpoint, prefix: &str) -> usize {
    checkpoint.entries_of(prefix)
}

#[test]
fn upsert_checkpoints_its_histories() {
    // Key 1's value is set before the cut and changed after it; key 2's is
    // set before the cut and deleted by a late record after it.
    let input = vec![
        ((1, Some(1)), 100, 1, 100),
        ((2, Some(5)), 200, 1, 200),
        ((1, Some(2)), 700, 1, 700),
        ((2, None), 450, 1, 520),
        ((3, Some(9)), 300, 1, 900),
    ];
    for (before, after) in [(1, 2), (2, 1), (2, 2)] {
        let run = check_recovery(&input, 500, before, after, changelog);
        assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        assert!(entries_of(&run.checkpoint, "Upsert@") >= 2, "{:?}", run.checkpoint);
        assert!(run.expected.contains_key(&(Logged::Row(1, 1), 700)), "{:?}", run.expected);
        assert!(run.expected.contains_key(&(Logged::Row(2, 5), 520)), "{:?}", run.expected);
        assert!(run.expected.contains_key(&(Logged::Late(3, Some(9)), 900)), "{:?}", run.expected);
        assert_eq!(run.recovered, run.expected);
    }
}

#[test]
fn as_of_join_checkpoints_versions_and_waiting_events() {
    // The table's value for key 1 is set before the cut; an event at 800
    // arrives before the cut and waits past it, another arrives after it.
    let input = vec![
        (Mixed::Table((1, Some(3))), 100, 1, 50),
        (Mixed::Table((1, Some(4))), 900, 1, 300),
        (Mixed::Event(1, 0), 800, 1, 200),
        (Mixed::Event(1, 1), 450, 1, 520),
        (Mixed::Event(2, 2), 950, 1, 100),
    ];
    for left in [false, true] {
        for (before, after) in [(1, 2), (2, 1), (2, 2)] {
            let run = check_recovery(&input, 500, before, after, move |s| as_of_join(s, left));
            assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
            let name = if left { "LeftJoinAsOf@" } else { "JoinAsOf@" };
            // Key 1's versions, and the two events waiting for the watermark.
            assert!(entries_of(&run.checkpoint, name) >= 3, "{:?}", run.checkpoint);
            assert!(run.expected.contains_key(&(Joined::Row(1, 0, Some(3)), 800)), "{:?}", run.expected);
            assert!(run.expected.contains_key(&(Joined::Row(1, 1, Some(3)), 520)), "{:?}", run.expected);
            assert_eq!(run.expected.contains_key(&(Joined::Row(2, 2, None), 950)), left, "{:?}", run.expected);
            assert_eq!(run.recovered, run.expected);
        }
    }
}

#[test]
fn served_reader_is_restored() {
    // Keys 1 and 2 are set only before the cut; key 2 is deleted after it.
    let input = vec![
        ((1, Some(1)), 100, 1, 100),
        ((2, Some(5)), 200, 1, 200),
        ((3, Some(7)), 650, 1, 450),
        ((2, None), 700, 1, 700),
        ((4, Some(8)), 800, 1, 800),
    ];
    for (before, after) in [(1, 2), (2, 1), (2, 2)] {
        let (expected, recovered) = served_recovery(&input, 500, before, after);
        assert_eq!(expected, vec![(1, 1), (3, 7), (4, 8)]);
        assert_eq!(recovered, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn upsert_changelog_recovers(input in upserts(), cut in 1u64..1300, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, changelog);
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn as_of_join_recovers(input in mixed(), cut in 1u64..1300, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |s| as_of_join(s, false));
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn left_as_of_join_recovers(input in mixed(), cut in 1u64..1300, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |s| as_of_join(s, true));
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn served_reader_recovers(input in upserts(), cut in 1u64..1300, (before, after) in workers()) {
        let (expected, recovered) = served_recovery(&input, cut, before, after);
        prop_assert_eq!(recovered, expected);
    }
}
