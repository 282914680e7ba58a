//! Differential collections recover from a checkpoint: the bridge
//! (`as_collection`) checkpoints the collection's accumulation at the cut and
//! replays it on recovery, the arrangements downstream (counts, reductions,
//! joins, table–table joins) are rebuilt from it, and the committed output
//! (before the cut from the first run, from the cut on from the recovered
//! one) equals an uninterrupted run's, time by time.

use differential_dataflow::operators::CountTotal;
use highwater_operators::checkpoint::memory::{check_recovery, Input};
use highwater_operators::collection::from_collection;
use highwater_operators::prelude::*;
use highwater_operators::table::Table;
use proptest::prelude::*;

/// Random updates `((key, value), event time, diff, arrival)`: arrival times
/// in [0, 2000), event times up to 300 before or after the arrival (some in
/// the future of the cut), with retractions of earlier insertions.
fn updates() -> impl Strategy<Value = Vec<Input<(u8, u8)>>> {
    prop::collection::vec((0u8..6, 0u8..4, 0u64..2000, 0u64..600, any::<bool>()), 1..120).prop_map(|raw| {
        let mut out = Vec::new();
        for (k, v, arrival, skew, retract) in raw {
            let time = (arrival + skew).saturating_sub(300);
            out.push(((k, v), time, 1, arrival));
            if retract {
                // Taken back a little later.
                out.push(((k, v), time + 50, -1, arrival + 50));
            }
        }
        out
    })
}

fn workers() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((1, 2)), Just((2, 1)), Just((2, 2)), Just((1, 1))]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn counts_of_a_collection_recover(input in updates(), cut in 1u64..2200, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            from_collection(&events.as_collection().map(|(k, _v)| k).count_total_core::<i64>())
        });
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn reductions_and_self_joins_recover(input in updates(), cut in 1u64..2200, (before, after) in workers()) {
        let run = check_recovery(&input, cut, before, after, |events| {
            let pairs = events.as_collection();
            // The largest value per key, joined back with every value of the key.
            let max = pairs.clone().reduce(|_k, vals, out| out.push((*vals.last().expect("non-empty").0, 1i64)));
            from_collection(&pairs.join(max).map(|(k, (v, m))| (k, v, m)))
        });
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn windows_around_collections_recover(input in updates(), cut in 1u64..2200, (before, after) in workers()) {
        // A window over a collection's changes (its gate drops the replay of
        // the restored collection), and a collection of window results.
        let run = check_recovery(&input, cut, before, after, |events| {
            let counts = from_collection(&events.as_collection().map(|(k, _v)| k).count_total_core::<i64>());
            let per_window = counts
                .window(Tumbling::of(250))
                .key_by(|(k, _): &(u8, i64)| *k)
                .aggregate(Sum::of(|(_, c): &(u8, i64)| *c))
                .results
                .map(|r| (r.window.start, r.key, r.value));
            from_collection(&per_window.as_collection().map(|(_start, k, _sum)| k).count_total_core::<i64>())
        });
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }

    #[test]
    fn table_table_joins_recover(input in updates(), cut in 1u64..2200, (before, after) in workers()) {
        // Even keys feed one table, odd keys the other; joined on value.
        let run = check_recovery(&input, cut, before, after, |events| {
            let left = Table::from_changelog(&events.filter(|(k, _)| k % 2 == 0));
            let right = Table::from_changelog(&events.filter(|(k, _)| k % 2 == 1));
            left.join(&right, |_k, v| *v)
        });
        prop_assert!(run.unsupported.is_empty(), "{:?}", run.unsupported);
        prop_assert_eq!(run.recovered, run.expected);
    }
}

#[test]
fn the_checkpoint_holds_the_collection_and_future_updates() {
    // Three records before the cut at 100, one of them changing the
    // collection only at event time 150; one record after the cut.
    let input = vec![((1u8, 1u8), 10, 1, 10), ((2, 2), 20, 1, 20), ((3, 3), 150, 1, 30), ((4, 4), 120, 1, 120)];
    let run = check_recovery(&input, 100, 1, 2, |events| {
        from_collection(&events.as_collection().map(|(k, _)| k).count_total_core::<i64>())
    });
    assert_eq!(run.recovered, run.expected);
    let entries: usize = run.checkpoint.entries.values().map(Vec::len).sum();
    assert_eq!(entries, 3, "{:?}", run.checkpoint.entries.keys().collect::<Vec<_>>());
    // The recovered run did produce the update of key 3 at 150 and key 4 at 120.
    assert_eq!(run.expected.get(&((3, 1), 150)), Some(&1));
    assert_eq!(run.recovered.get(&((4, 1), 120)), Some(&1));
}
