//! The example operator written on the operator model (`examples/dedup.rs`,
//! a `KeyedProcess`): its output against a brute-force reference, and its
//! checkpoint and recovery onto another number of workers.

#[path = "../examples/dedup.rs"]
#[allow(dead_code, unreachable_pub)]
mod dedup;

use std::collections::BTreeMap;

use dedup::{Dedup, Order};
use highwater::operators::checkpoint::memory::{check_recovery, Input, Output};
use proptest::prelude::*;

const TTL: u64 = 300;
const LATENESS: u64 = 200;

/// Orders of 6 ids, arriving in [0, 3000): each up to `LATENESS` after its
/// event time or up to 100 before it.
fn orders() -> impl Strategy<Value = Vec<Input<Order>>> {
    prop::collection::vec((0u64..6, 0u64..3000, 0u64..300, 0i64..3), 1..120).prop_map(|raw| {
        raw.into_iter()
            .map(|(id, arrival, skew, amount)| {
                let time = (arrival + 100).saturating_sub(skew).max(1);
                (Order { id, amount, time }, time, 1, arrival)
            })
            .collect()
    })
}

/// The reference: orders in arrival order (input order within an arrival),
/// each kept unless an order of its id kept before lies within the time to
/// live of it; a kept order replaces the one remembered if it is later.
fn reference(input: &[Input<Order>]) -> Output<Order> {
    let mut sorted: Vec<&Input<Order>> = input.iter().collect();
    sorted.sort_by_key(|u| u.3);
    let mut kept: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out = Output::new();
    for (order, time, _, arrival) in sorted {
        match kept.get(&order.id) {
            Some(k) if k.abs_diff(*time) < TTL => continue,
            Some(k) if *k > *time => {}
            _ => {
                kept.insert(order.id, *time);
            }
        }
        *out.entry((order.clone(), *arrival)).or_insert(0) += 1;
    }
    out
}

fn dedup() -> Dedup {
    Dedup { ttl: TTL, lateness: LATENESS }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn dedup_matches_the_reference_and_recovers(
        input in orders(),
        cut in 1u64..3000,
        (before, after) in prop_oneof![Just((1usize, 2usize)), Just((2, 1)), Just((2, 2))],
    ) {
        let run = check_recovery(&input, cut, before, after, |orders| {
            orders.process_keyed("Dedup", |o: &Order| o.id, dedup())
        });
        prop_assert!(run.failures.is_empty(), "{:?}", run.failures);
        prop_assert_eq!(&run.expected, &reference(&input));
        prop_assert_eq!(run.recovered, run.expected);
    }
}

#[test]
fn the_checkpoint_holds_the_remembered_ids_under_the_example_schema() {
    let input: Vec<Input<Order>> =
        (0..40u64).map(|i| (Order { id: i % 4, amount: 1, time: i * 50 }, i * 50, 1, i * 50)).collect();
    let run = check_recovery(&input, 1_000, 1, 2, |orders| orders.process_keyed("Dedup", |o: &Order| o.id, dedup()));
    let (name, entries) = run.checkpoint.entries.iter().find(|(name, _)| name.starts_with("Dedup@")).unwrap();
    assert_eq!(entries.len(), 4, "one entry per id remembered");
    assert_eq!(run.checkpoint.schemas[name].to_string(), "state schema example.dedup v1");
    assert_eq!(run.recovered, run.expected);
}
