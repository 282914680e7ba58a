//! Values with multiplicities: what an operator's state keeps of a changelog
//! (a value inserted twice and retracted once is there once).

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::time::Diff;

/// A short list of `(value, multiplicity)` pairs, none with multiplicity 0.
pub(crate) trait Multiplicities<V> {
    /// The pairs.
    fn pairs(&mut self) -> &mut [(V, Diff)];
    /// Adds a pair.
    fn add_pair(&mut self, pair: (V, Diff));
    /// Removes the pair at `i`, keeping the order of the others.
    fn remove_pair(&mut self, i: usize);
}

impl<V> Multiplicities<V> for Vec<(V, Diff)> {
    fn pairs(&mut self) -> &mut [(V, Diff)] {
        self
    }
    fn add_pair(&mut self, pair: (V, Diff)) {
        self.push(pair);
    }
    fn remove_pair(&mut self, i: usize) {
        self.remove(i);
    }
}

impl<V, A: smallvec::Array<Item = (V, Diff)>> Multiplicities<V> for SmallVec<A> {
    fn pairs(&mut self) -> &mut [(V, Diff)] {
        self
    }
    fn add_pair(&mut self, pair: (V, Diff)) {
        self.push(pair);
    }
    fn remove_pair(&mut self, i: usize) {
        self.remove(i);
    }
}

/// Adds `diff` to the multiplicity of `value` in `values`, removing it at zero
/// (`value` is cloned only if it is new).
pub(crate) fn bump<V: PartialEq + Clone, M: Multiplicities<V>>(values: &mut M, value: &V, diff: Diff) {
    match values.pairs().iter_mut().position(|(x, _)| x == value) {
        Some(i) => {
            let pairs = values.pairs();
            pairs[i].1 += diff;
            if pairs[i].1 == 0 {
                values.remove_pair(i);
            }
        }
        None if diff != 0 => values.add_pair((value.clone(), diff)),
        None => {}
    }
}

/// Adds `diff` to the multiplicity of `value` in an ordered multiset,
/// removing it at zero.
pub(crate) fn bump_ordered<V: Ord>(map: &mut BTreeMap<V, Diff>, value: V, diff: Diff) {
    match map.entry(value) {
        std::collections::btree_map::Entry::Vacant(e) => {
            if diff != 0 {
                e.insert(diff);
            }
        }
        std::collections::btree_map::Entry::Occupied(mut e) => {
            *e.get_mut() += diff;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}
