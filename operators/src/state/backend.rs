//! Where keyed state lives: the state-backend trait and the in-memory backend.

use crate::key::{Key, StateMap};

/// Keyed state: a map from keys to values that an operator reads and writes
/// by key, and a snapshot lists whole. The in-memory backend ([`InMemory`])
/// is a hash map; an on-disk backend (RocksDB) implements the same trait, so
/// that operators written against it run on either without change.
pub trait KeyedStateBackend<K, V>: Default + Send + 'static {
    /// The value of `key`.
    fn get(&self, key: &K) -> Option<&V>;
    /// The value of `key`, to change in place.
    fn get_mut(&mut self, key: &K) -> Option<&mut V>;
    /// Sets the value of `key`; returns the previous one.
    fn insert(&mut self, key: K, value: V) -> Option<V>;
    /// Removes `key`; returns its value.
    fn remove(&mut self, key: &K) -> Option<V>;
    /// The number of keys.
    fn len(&self) -> usize;
    /// Whether there is no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Room for `n` more keys (a hint).
    fn reserve(&mut self, n: usize);
    /// Calls `each` with every key and value, in no particular order.
    fn for_each(&self, each: impl FnMut(&K, &V));
}

/// Keyed state in memory: a hash map ([`StateMap`]).
///
/// ```
/// use highwater_operators::state::{InMemory, KeyedStateBackend};
/// let mut state = InMemory::<u32, String>::default();
/// state.insert(7, "x".into());
/// assert_eq!(state.get(&7).map(String::as_str), Some("x"));
/// assert_eq!(state.remove(&7), Some("x".into()));
/// assert!(state.is_empty());
/// ```
#[derive(Debug)]
pub struct InMemory<K, V>(StateMap<K, V>);

impl<K, V> Default for InMemory<K, V> {
    fn default() -> Self {
        InMemory(StateMap::default())
    }
}

impl<K: Key, V: Send + 'static> KeyedStateBackend<K, V> for InMemory<K, V> {
    fn get(&self, key: &K) -> Option<&V> {
        self.0.get(key)
    }
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.0.get_mut(key)
    }
    fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.insert(key, value)
    }
    fn remove(&mut self, key: &K) -> Option<V> {
        self.0.remove(key)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn reserve(&mut self, n: usize) {
        self.0.reserve(n);
    }
    fn for_each(&self, mut each: impl FnMut(&K, &V)) {
        for (k, v) in &self.0 {
            each(k, v);
        }
    }
}
