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
    /// Undoes an upsert (a negative diff).
    Undo(Upsert, u64),
    Event(Event, u64),
    Watermark(u64),
    TableWatermark(u64),
    EventWatermark(u64),
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
    BTreeMap<((u32, char), u64), i64>,
) {
    let (inner, left, updating, late, changelog) = timely::execute_directly(move |worker| {
        let (mut table_in, mut events_in, captured) = worker.dataflow::<u64, _, _>(|scope| {
            let (table_in, table) = scope.new_input::<Vec<Update<Upsert>>>();
            let (events_in, events) = scope.new_input::<Vec<Update<Event>>>();
            let table = EventStream::new(table).allowed_lateness(1_000).upsert().table;
            let changelog = table.changelog().inner.capture();
            let events = EventStream::new(events);
            let joined = events.allowed_lateness(1_000).join_as_of(&table, |e| e.0);
            let left = events.allowed_lateness(1_000).left_join_as_of(&table, |e| e.0);
            let updating = events.join_updating(&table, |e| e.0);
            let captured = (
                joined.results.inner.capture(),
                left.results.inner.capture(),
                updating.inner.capture(),
                joined.late.stream.inner.capture(),
                changelog,
            );
            (table_in, events_in, captured)
        });
        for step in steps {
            match step {
                Step::Table(u, t) => table_in.send((u, t, 1)),
                Step::Undo(u, t) => table_in.send((u, t, -1)),
                Step::Event(e, t) => events_in.send((e, t, 1)),
                Step::Watermark(w) => {
                    table_in.advance_to(w);
                    events_in.advance_to(w);
                }
                Step::TableWatermark(w) => table_in.advance_to(w),
                Step::EventWatermark(w) => events_in.advance_to(w),
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
    (log(inner), log(left), log(updating), late, log(changelog))
}

#[test]
fn events_see_the_table_as_of_their_time_whatever_the_arrival_order() {
    use Step::*;
    let (inner, left, _, late, _) = run(vec![
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
    let (inner, _, updating, late, _) = run(vec![
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
    let (inner, left, _, _, _) = run(vec![
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

#[test]
fn events_wait_for_a_lagging_table_watermark() {
    use Step::*;
    let (inner, _, _, late, _) = run(vec![
        Table((1, Some('A')), 0),
        TableWatermark(50),
        Event((1, 150), 150),
        EventWatermark(200),
        // The table is behind: its update at 100 is not late, and the event at 150 must see it.
        Table((1, Some('B')), 100),
        TableWatermark(300),
        EventWatermark(300),
    ]);
    let want: BTreeMap<_, _> = [((((1, 150), 'B'), 150), 1)].into_iter().collect();
    assert_eq!(inner, want);
    assert!(late.is_empty());
}

#[test]
fn an_undo_at_the_compaction_horizon_restores_the_version_before_it() {
    use Step::*;
    // The table's allowed lateness is 1 000 ms: at watermark 1 010 an undo at 10 is still accepted.
    let (_, _, _, _, changelog) = run(vec![
        Table((1, Some('a')), 5),
        Table((1, Some('b')), 10),
        Watermark(1_010),
        Undo((1, Some('b')), 10),
        Watermark(2_000),
    ]);
    let want: BTreeMap<_, _> = [(((1, 'a'), 5), 1)].into_iter().collect();
    assert_eq!(changelog, want);
}

#[test]
fn an_undo_of_an_unknown_key_changes_nothing() {
    use Step::*;
    let (_, _, _, _, changelog) = run(vec![Undo((9, Some('z')), 10), Table((1, Some('a')), 20), Watermark(100)]);
    let want: BTreeMap<_, _> = [(((1, 'a'), 20), 1)].into_iter().collect();
    assert_eq!(changelog, want);
}
