//! Stream–table joins with arrival order and watermarks driven by hand: a
//! table update at time `t` affects events at `t` and later only, whatever
//! order table and stream records arrive in; late table updates do not rewrite
//! results already emitted (the updating join does); late events go to the
//! late output.

use std::collections::BTreeMap;

use highwater_operators::prelude::*;
use highwater_operators::Update;
use timely::dataflow::operators::capture::{Capture, Extract};
use timely::dataflow::operators::Input;

type Upsert = (u32, Option<char>);
type Event = (u32, u64);

/// What arrives, in order: `Table(record, time)`, `Event(record, time)`, or a
/// watermark advance of both inputs.
enum Step {
    Table(Upsert, u64),
    Event(Event, u64),
    Watermark(u64),
}

/// Runs `steps` through an as-of join, a left as-of join and an updating join
/// (allowed lateness 1 000 ms); returns their consolidated `(row, time)`
/// changelogs and the late events.
#[allow(clippy::type_complexity)]
fn run(
    steps: Vec<Step>,
) -> (
    BTreeMap<((Event, char), u64), i64>,
    BTreeMap<((Event, Option<char>), u64), i64>,
    BTreeMap<((Event, char), u64), i64>,
    Vec<Event>,
) {
    let (inner, left, updating, late) = timely::execute_directly(move |worker| {
        let (mut table_in, mut events_in, captured) = worker.dataflow::<u64, _, _>(|scope| {
            let (table_in, table) = scope.new_input::<Vec<Update<Upsert>>>();
            let (events_in, events) = scope.new_input::<Vec<Update<Event>>>();
            let table = EventStream::new(table).upsert(1_000).table;
            let events = EventStream::new(events);
            let joined = events.join_as_of(&table, |e| e.0, 1_000);
            let left = events.left_join_as_of(&table, |e| e.0, 1_000);
            let updating = events.join_updating(&table, |e| e.0);
            let captured = (
                joined.results.inner.capture(),
                left.results.inner.capture(),
                updating.inner.capture(),
                joined.late.stream.inner.capture(),
            );
            (table_in, events_in, captured)
        });
        for step in steps {
            match step {
                Step::Table(u, t) => table_in.send((u, t, 1)),
                Step::Event(e, t) => events_in.send((e, t, 1)),
                Step::Watermark(w) => {
                    table_in.advance_to(w);
                    events_in.advance_to(w);
                }
            }
            worker.step();
        }
        drop((table_in, events_in));
        while worker.step() {}
        captured
    });
    fn log<D: Ord + 'static>(
        captured: std::sync::mpsc::Receiver<timely::dataflow::operators::capture::Event<u64, Vec<(D, u64, i64)>>>,
    ) -> BTreeMap<(D, u64), i64> {
        let mut out = BTreeMap::new();
        for (d, t, r) in captured.extract().into_iter().flat_map(|(_, batch)| batch) {
            *out.entry((d, t)).or_insert(0) += r;
        }
        out.retain(|_, r| *r != 0);
        out
    }
    let late = late.extract().into_iter().flat_map(|(_, b)| b).map(|(e, _, _)| e).collect();
    (log(inner), log(left), log(updating), late)
}

#[test]
fn events_see_the_table_as_of_their_time_whatever_the_arrival_order() {
    use Step::*;
    let (inner, left, _, late) = run(vec![
        // The events come first; the table's history arrives afterwards, out of order.
        Event((1, 99), 99),
        Event((1, 100), 100),
        Event((1, 150), 150),
        Event((2, 10), 10),
        Table((1, Some('B')), 100),
        Table((1, Some('A')), 0),
        Table((2, Some('X')), 20),
        Watermark(200),
    ]);
    let want: BTreeMap<_, _> =
        [((((1, 99), 'A'), 99), 1), ((((1, 100), 'B'), 100), 1), ((((1, 150), 'B'), 150), 1)].into_iter().collect();
    assert_eq!(inner, want);
    assert_eq!(left.get(&(((2, 10), None), 10)), Some(&1), "key 2 had no value at 10");
    assert_eq!(left.len(), 4);
    assert!(late.is_empty());
}

#[test]
fn a_late_table_update_changes_later_joins_but_not_results_already_emitted() {
    use Step::*;
    let (inner, _, updating, late) = run(vec![
        Table((1, Some('A')), 0),
        Table((1, Some('B')), 100),
        Event((1, 150), 150),
        Watermark(200),
        // Late (the watermark is at 200) but within the allowed lateness.
        Table((1, Some('C')), 120),
        Event((1, 130), 130),
        Event((1, 110), 110),
        Watermark(300),
        // Beyond the allowed lateness of the join (1 000 ms).
        Watermark(5_000),
        Event((1, 2_000), 2_000),
    ]);
    let want: BTreeMap<_, _> = [
        ((((1, 110), 'B'), 110), 1),
        ((((1, 130), 'C'), 130), 1),
        // Joined before the update at 120 arrived: not rewritten.
        ((((1, 150), 'B'), 150), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(inner, want);
    assert_eq!(late, vec![(1, 2_000)]);
    // The updating join follows the table: the event at 150 sees 'B', then 'C'
    // once the update at 120 arrives (at watermark 200).
    assert_eq!(updating.get(&(((1, 150), 'B'), 150)), Some(&1));
    assert_eq!(updating.get(&(((1, 150), 'B'), 200)), Some(&-1));
    assert_eq!(updating.get(&(((1, 150), 'C'), 200)), Some(&1));
}

#[test]
fn deletes_end_a_keys_value() {
    use Step::*;
    let (inner, left, _, _) = run(vec![
        Table((1, Some('A')), 0),
        Table((1, None), 50),
        Table((1, Some('D')), 80),
        Event((1, 40), 40),
        Event((1, 60), 60),
        Event((1, 90), 90),
        Watermark(100),
    ]);
    let want: BTreeMap<_, _> = [((((1, 40), 'A'), 40), 1), ((((1, 90), 'D'), 90), 1)].into_iter().collect();
    assert_eq!(inner, want);
    assert_eq!(left.get(&(((1, 60), None), 60)), Some(&1));
}
