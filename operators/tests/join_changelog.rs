//! Joins of changelogs: a retraction at a later time takes back what its
//! insertion joined.

use std::collections::BTreeMap;

use highwater_operators::prelude::*;
use timely::dataflow::operators::capture::{Capture, Extract};
use timely::dataflow::operators::ToStream;

fn consolidate<T: Ord>(updates: impl IntoIterator<Item = (T, u64, i64)>) -> BTreeMap<T, i64> {
    let mut table = BTreeMap::new();
    for (d, _t, r) in updates {
        *table.entry(d).or_insert(0) += r;
    }
    table.retain(|_, r| *r != 0);
    table
}

#[test]
fn a_later_retraction_cancels_its_pairs() {
    let captured = timely::example(|scope| {
        // ("k", v) inserted at 1, retracted at 10, re-inserted as v+1 at 10: a
        // changelog like the one `aggregate_by_key` produces.
        let left = vec![(('k', 1u32), 1u64, 1i64), (('k', 1), 10, -1), (('k', 2), 10, 1)];
        let right = vec![(('k', "r".to_string()), 2u64, 1i64)];
        EventStream::new(left.to_stream(scope))
            .join(&EventStream::new(right.to_stream(scope)), |l| l.0, |r| r.0, |l, r| (l.1, r.1.clone()))
            .inner
            .capture()
    });
    let out = consolidate(captured.extract().into_iter().flat_map(|(_, d)| d));
    assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![((2, "r".to_string()), 1)]);
}

#[test]
fn interval_join_retraction_matches_as_its_insertion() {
    let captured = timely::example(|scope| {
        // The left record opens [t, t + 5]; its retraction comes at 100, outside
        // that interval, and must still take back the pair made at 3.
        let left = vec![(7u64, 1u64, 1i64), (7, 100, -1)];
        let right = vec![(7u64, 3u64, 1i64)];
        EventStream::new(left.to_stream(scope))
            .allowed_lateness(1_000)
            .interval_join(&EventStream::new(right.to_stream(scope)), |l| *l, |r| *r, between(0, 5), |l, r| (*l, *r))
            .results
            .inner
            .capture()
    });
    let out = consolidate(captured.extract().into_iter().flat_map(|(_, d)| d));
    assert!(out.is_empty(), "{out:?}");
}
