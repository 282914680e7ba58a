//! Where keyed state lives: the state-backend trait, the in-memory backend,
//! and the encoded backend that keeps every value as bytes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::key::{Key, StateMap};

/// How many entries [`sampled_bytes`] encodes.
pub const SAMPLE: usize = 64;

/// The encoded size of `len` entries estimated from the first [`SAMPLE`]
/// of `entries` (key and value as [`encode`](crate::checkpoint::encode)
/// writes them): their mean size times `len`. A hash map's first entries
/// are as good as random ones; cost: [`SAMPLE`] encodings.
///
/// ```
/// use highwater_operators::state::sampled_bytes;
/// let map: std::collections::HashMap<u32, String> = (0..1000).map(|k| (k, "abcd".to_owned())).collect();
/// // A u32 below 2^14 takes 1 or 2 bytes (varint), the string 5 (length and bytes).
/// let bytes = sampled_bytes(map.len(), map.iter());
/// assert!((6_000..=7_000).contains(&bytes), "{bytes}");
/// ```
pub fn sampled_bytes<'a, K: Serialize + 'a, V: Serialize + 'a>(
    len: usize,
    entries: impl Iterator<Item = (&'a K, &'a V)>,
) -> u64 {
    sampled_size(len, entries)
}

/// [`sampled_bytes`] for any items: `len` items estimated from the first
/// [`SAMPLE`] of `items`, each encoded.
pub fn sampled_size<T: Serialize>(len: usize, items: impl Iterator<Item = T>) -> u64 {
    let (mut n, mut bytes) = (0u64, 0u64);
    for item in items.take(SAMPLE) {
        bytes += postcard::experimental::serialized_size(&item).map_or(0, |n| n as u64);
        n += 1;
    }
    if n == 0 {
        return 0;
    }
    (bytes as f64 / n as f64 * len as f64).round() as u64
}

/// The values an operator keeps per key: encodable, so that a backend may
/// keep them as bytes (on disk) and a checkpoint can write them.
pub trait StateValue: Serialize + DeserializeOwned + Send + 'static {}
impl<V: Serialize + DeserializeOwned + Send + 'static> StateValue for V {}

/// A store of keyed state: a map from keys to values that an operator reads
/// and writes by key during an activation, and a snapshot lists whole.
///
/// The shape is what a store that keeps values as bytes (RocksDB) can serve:
/// every access takes `&mut self`, so that a read may load the value into a
/// cache of the activation; changed values are written back by
/// [`flush`](Self::flush), which the model calls at the end of every
/// activation ([`crate::state::Managed::checkpoint`]), so writes are batched
/// per activation. Whole-state passes ([`retain`](Self::retain),
/// [`for_each_mut`](Self::for_each_mut)) are for what the watermark releases.
///
/// Operators do not use a backend directly but through [`KeyedState`](super::KeyedState),
/// which dispatches to the backend the job chose ([`Backend`](super::Backend)):
/// the trait is object safe for that reason.
pub trait KeyedStateBackend<K, V>: Send + 'static {
    /// The value of `key`.
    fn get(&mut self, key: &K) -> Option<&V>;
    /// The value of `key`, to change in place (written back at the next flush).
    fn get_mut(&mut self, key: &K) -> Option<&mut V>;
    /// The value of `key`, made by `make` if there is none.
    fn get_or_insert_with(&mut self, key: K, make: &mut dyn FnMut() -> V) -> &mut V;
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
    /// The state's size in bytes, encoded as a checkpoint writes it,
    /// estimated cheaply (the operator's `state_bytes` gauge reads it about
    /// once a second): e.g. the mean size of a sample of entries times their
    /// number ([`sampled_bytes`]). `None`: the backend does not estimate it.
    fn approximate_bytes(&self) -> Option<u64> {
        None
    }
    /// Reads `keys` ahead (a hint): a store on disk reads them in one call
    /// into the activation's cache, where the next reads find them. The
    /// default does nothing.
    fn prefetch(&mut self, keys: &mut dyn Iterator<Item = &K>) {
        let _ = keys;
    }
    /// Calls `each` with every key and value, in no particular order (a
    /// snapshot, on a background thread).
    fn for_each(&self, each: &mut dyn FnMut(&K, &V));
    /// Calls `each` with every key and value, to change in place.
    fn for_each_mut(&mut self, each: &mut dyn FnMut(&K, &mut V));
    /// Keeps the keys for which `keep` is true (and the changes it made).
    fn retain(&mut self, keep: &mut dyn FnMut(&K, &mut V) -> bool);
    /// A RocksDB checkpoint of the database the state is in, if it is in one.
    #[cfg(feature = "rocksdb")]
    fn database_checkpoint(&self, dir: &std::path::Path) -> Option<Result<super::BackendFiles, String>> {
        let _ = dir;
        None
    }
    /// Removes every key.
    fn clear(&mut self) {
        self.retain(&mut |_, _| false);
    }
    /// Writes back what changed since the last flush.
    ///
    /// # Errors
    /// A value that does not encode (it stays in the cache, and the error
    /// fails the job's checkpointing), or a stored value that no longer
    /// decodes.
    fn flush(&mut self) -> Result<(), String>;
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
pub struct InMemory<K, V>(pub(crate) StateMap<K, V>);

impl<K, V> Default for InMemory<K, V> {
    fn default() -> Self {
        InMemory(StateMap::default())
    }
}

impl<K: Key, V: Send + 'static> KeyedStateBackend<K, V> for InMemory<K, V> {
    fn get(&mut self, key: &K) -> Option<&V> {
        self.0.get(key)
    }
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.0.get_mut(key)
    }
    fn get_or_insert_with(&mut self, key: K, make: &mut dyn FnMut() -> V) -> &mut V {
        self.0.entry(key).or_insert_with(make)
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
    fn for_each(&self, each: &mut dyn FnMut(&K, &V)) {
        for (k, v) in &self.0 {
            each(k, v);
        }
    }
    fn for_each_mut(&mut self, each: &mut dyn FnMut(&K, &mut V)) {
        for (k, v) in &mut self.0 {
            each(k, v);
        }
    }
    fn retain(&mut self, keep: &mut dyn FnMut(&K, &mut V) -> bool) {
        self.0.retain(|k, v| keep(k, v));
    }
    fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// Keyed state kept as encoded bytes (postcard) in an ordered map of byte
/// strings, with a write-back cache of the values an activation touched:
/// the shape of an on-disk store such as RocksDB, in memory.
///
/// Every value an operator reads is decoded from its bytes, and every value
/// it touched is encoded again at the end of the activation
/// ([`KeyedStateBackend::flush`]), so an operator that keeps a borrowed
/// value across activations, relies on the order of keys, or holds a value
/// whose encoding does not round-trip fails on this backend. The tests run
/// the operators' oracles on it for that reason ([`Backend::Encoded`](super::Backend::Encoded)).
pub struct Encoded<K, V> {
    /// Encoded key to encoded value: what is written back.
    store: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The values touched since the last flush (`None`: removed).
    cache: StateMap<K, Option<V>>,
    /// The number of keys, counting the cache's changes.
    len: usize,
    /// The first value that did not decode (reported by the next flush).
    failed: Mutex<Option<String>>,
}

impl<K, V> Default for Encoded<K, V> {
    fn default() -> Self {
        Encoded { store: BTreeMap::new(), cache: StateMap::default(), len: 0, failed: Mutex::new(None) }
    }
}

impl<K, V> std::fmt::Debug for Encoded<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoded")
            .field("stored", &self.store.len())
            .field("cached", &self.cache.len())
            .field("len", &self.len)
            .finish()
    }
}

impl<K: Key, V: StateValue> Encoded<K, V> {
    fn fail(&self, reason: String) {
        let mut failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        failed.get_or_insert(reason);
    }

    fn key_bytes(&self, key: &K) -> Option<Vec<u8>> {
        match crate::checkpoint::encode(key) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.fail(format!("a key of the state does not encode: {e} ({key:?})"));
                None
            }
        }
    }

    /// Brings `key` into the cache (from the store, or as absent); whether it
    /// has a value.
    fn load(&mut self, key: &K) -> bool {
        if let Some(slot) = self.cache.get(key) {
            return slot.is_some();
        }
        let value = self.key_bytes(key).and_then(|bytes| self.store.get(&bytes)).and_then(|bytes| {
            match crate::checkpoint::decode::<V>(bytes) {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail(format!("a stored value does not decode: {e} (key {key:?})"));
                    None
                }
            }
        });
        let present = value.is_some();
        self.cache.insert(key.clone(), value);
        present
    }

    /// Calls `each` with every stored key and value the cache does not
    /// override, decoded (what does not decode is reported by the next flush).
    fn for_each_stored(&self, mut each: impl FnMut(K, V)) {
        for (kb, vb) in &self.store {
            let key = match crate::checkpoint::decode::<K>(kb) {
                Ok(k) => k,
                Err(e) => {
                    self.fail(format!("a stored key does not decode: {e}"));
                    continue;
                }
            };
            if self.cache.contains_key(&key) {
                continue;
            }
            match crate::checkpoint::decode::<V>(vb) {
                Ok(v) => each(key, v),
                Err(e) => self.fail(format!("a stored value does not decode: {e} (key {key:?})")),
            }
        }
    }

    /// Brings every stored key into the cache.
    fn load_all(&mut self) {
        let mut loaded = Vec::new();
        self.for_each_stored(|k, v| loaded.push((k, v)));
        for (k, v) in loaded {
            self.cache.insert(k, Some(v));
        }
    }
}

impl<K: Key, V: StateValue> KeyedStateBackend<K, V> for Encoded<K, V> {
    fn get(&mut self, key: &K) -> Option<&V> {
        self.get_mut(key).map(|v| &*v)
    }
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.load(key);
        self.cache.get_mut(key).and_then(Option::as_mut)
    }
    fn get_or_insert_with(&mut self, key: K, make: &mut dyn FnMut() -> V) -> &mut V {
        if !self.load(&key) {
            self.len += 1;
        }
        self.cache.entry(key).or_insert(None).get_or_insert_with(make)
    }
    fn insert(&mut self, key: K, value: V) -> Option<V> {
        if !self.load(&key) {
            self.len += 1;
        }
        self.cache.insert(key, Some(value)).flatten()
    }
    fn remove(&mut self, key: &K) -> Option<V> {
        if !self.load(key) {
            return None;
        }
        self.len -= 1;
        self.cache.get_mut(key).and_then(Option::take)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn reserve(&mut self, n: usize) {
        self.cache.reserve(n);
    }
    fn for_each(&self, each: &mut dyn FnMut(&K, &V)) {
        self.for_each_stored(|k, v| each(&k, &v));
        for (k, v) in &self.cache {
            if let Some(v) = v {
                each(k, v);
            }
        }
    }
    fn for_each_mut(&mut self, each: &mut dyn FnMut(&K, &mut V)) {
        self.load_all();
        for (k, v) in &mut self.cache {
            if let Some(v) = v {
                each(k, v);
            }
        }
    }
    fn retain(&mut self, keep: &mut dyn FnMut(&K, &mut V) -> bool) {
        self.load_all();
        let mut removed = 0;
        for (k, slot) in &mut self.cache {
            if let Some(v) = slot {
                if !keep(k, v) {
                    *slot = None;
                    removed += 1;
                }
            }
        }
        self.len -= removed;
    }
    fn flush(&mut self) -> Result<(), String> {
        let mut first_error = None;
        let mut kept = StateMap::default();
        for (k, slot) in self.cache.drain() {
            let Ok(kb) = crate::checkpoint::encode(&k) else {
                first_error.get_or_insert_with(|| format!("a key of the state does not encode ({k:?})"));
                kept.insert(k, slot);
                continue;
            };
            match &slot {
                None => {
                    self.store.remove(&kb);
                }
                Some(v) => match crate::checkpoint::encode(v) {
                    Ok(vb) => {
                        self.store.insert(kb, vb);
                    }
                    Err(e) => {
                        first_error
                            .get_or_insert_with(|| format!("a value of the state does not encode: {e} (key {k:?})"));
                        kept.insert(k, slot);
                    }
                },
            }
        }
        self.cache = kept;
        let failed = self.failed.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match failed.or(first_error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoded backend against a hash map, through random operations
    /// with flushes in between.
    #[test]
    fn encoded_agrees_with_a_map() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut enc = Encoded::<u16, Vec<u32>>::default();
        let mut model = std::collections::HashMap::<u16, Vec<u32>>::new();
        for step in 0..20_000u32 {
            let k = (next() % 64) as u16;
            match next() % 7 {
                0 => assert_eq!(enc.insert(k, vec![step]), model.insert(k, vec![step])),
                1 => assert_eq!(enc.remove(&k), model.remove(&k)),
                2 => assert_eq!(enc.get(&k), model.get(&k)),
                3 => {
                    enc.get_or_insert_with(k, &mut Vec::new).push(step);
                    model.entry(k).or_default().push(step);
                }
                4 => {
                    if let Some(v) = enc.get_mut(&k) {
                        v.push(step);
                    }
                    if let Some(v) = model.get_mut(&k) {
                        v.push(step);
                    }
                }
                5 => {
                    let m = next() % 5;
                    enc.retain(&mut |k, v| (*k as u64 + v.len() as u64) % 5 != m);
                    model.retain(|k, v| (*k as u64 + v.len() as u64) % 5 != m);
                }
                _ => enc.flush().expect("flushes"),
            }
            assert_eq!(enc.len(), model.len());
        }
        let mut listed = Vec::new();
        enc.for_each(&mut |k, v| listed.push((*k, v.clone())));
        listed.sort();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort();
        assert_eq!(listed, expected);
    }
}
