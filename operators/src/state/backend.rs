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
/// // An entry is a pair (a tag and a count, 2 bytes), the u32 below 2^14 2 or
/// // 3 bytes (tag and varint), the string 6 (tag, length and bytes).
/// let bytes = sampled_bytes(map.len(), map.iter());
/// assert!((10_000..=11_000).contains(&bytes), "{bytes}");
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
    let mut scratch = Vec::new();
    for item in items.take(SAMPLE) {
        scratch.clear();
        if crate::checkpoint::codec::to_extend(&item, &mut scratch).is_ok() {
            bytes += scratch.len() as u64;
        }
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

/// A value that items are appended to: a list state (Flink's `ListState`),
/// such as the records a join holds for a key.
///
/// A [`KeyedState`](super::KeyedState) of such values made with
/// [`KeyedState::appending`](super::KeyedState::appending) appends with
/// [`KeyedState::append`](super::KeyedState::append), which a store on disk
/// serves without reading the value: on RocksDB the encoded item is written
/// as a merge operand, and the value is put together from its items when it
/// is next read (or compacted), so an append costs the item's size and not
/// the list's.
///
/// ```
/// use highwater_operators::state::{Appendable, Backend, KeyedState};
/// #[derive(Default, serde::Serialize, serde::Deserialize)]
/// struct Seen(Vec<u32>);
/// impl Appendable for Seen {
///     type Item = u32;
///     fn append(&mut self, item: u32) {
///         self.0.push(item);
///     }
/// }
/// let mut seen = KeyedState::<char, Seen>::appending();
/// seen.open(&mut Backend::Encoded.opener("seen"));
/// seen.append('a', 1);
/// seen.append('a', 2);
/// seen.flush().unwrap();
/// assert_eq!(seen.get(&'a').map(|s| s.0.clone()), Some(vec![1, 2]));
/// ```
pub trait Appendable: StateValue + Default {
    /// What is appended.
    type Item: StateValue;
    /// Appends `item`.
    fn append(&mut self, item: Self::Item);
}

/// What a backend needs to append to values of type `V` blindly and read
/// them back: the value's default and how an encoded item is appended to
/// it ([`Appendable`]).
pub struct Appender<V> {
    make: fn() -> V,
    apply: fn(&mut V, &[u8]) -> Result<(), String>,
}

impl<V> Clone for Appender<V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Appender<V> {}

impl<V> std::fmt::Debug for Appender<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appender").finish_non_exhaustive()
    }
}

/// Decodes `bytes` as an item of `V` and appends it.
fn apply_encoded<V: Appendable>(value: &mut V, bytes: &[u8]) -> Result<(), String> {
    let item = crate::checkpoint::decode_stored::<V::Item>(bytes)
        .map_err(|e| format!("an appended item does not decode: {e}"))?;
    value.append(item);
    Ok(())
}

/// A frame of an appended value holding the whole value.
const WHOLE: u8 = 0;
/// A frame of an appended value holding one item.
const ITEM: u8 = 1;

impl<V: Appendable> Appender<V> {
    /// The appender of `V`.
    pub fn of() -> Self {
        Appender { make: V::default, apply: apply_encoded::<V> }
    }
}

/// A value as a byte backend stores it: the state encoding, or frames for a list
/// state ([`Appender`]).
pub(crate) fn encode_stored<V: StateValue>(appender: Option<&Appender<V>>, value: &V) -> Result<Vec<u8>, String> {
    match appender {
        None => crate::checkpoint::encode(value).map_err(|e| e.to_string()),
        Some(a) => a.encode(value),
    }
}

/// A stored value ([`encode_stored`]) decoded.
pub(crate) fn decode_stored<V: StateValue>(appender: Option<&Appender<V>>, bytes: &[u8]) -> Result<V, String> {
    match appender {
        None => crate::checkpoint::decode_stored::<V>(bytes).map_err(|e| e.to_string()),
        Some(a) => a.decode(bytes),
    }
}

impl<V: StateValue> Appender<V> {
    /// `value` encoded as the bytes a store appends item frames to: one
    /// frame `[0][length][encoded value]`.
    pub fn encode(&self, value: &V) -> Result<Vec<u8>, String> {
        let body = crate::checkpoint::encode(value).map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(body.len() + 6);
        frame(&mut out, WHOLE, &body);
        Ok(out)
    }

    /// An encoded item (`item`, the state encoding) as the frame a store appends:
    /// `[1][length][item]`.
    pub fn item_frame(out: &mut Vec<u8>, item: &[u8]) {
        frame(out, ITEM, item);
    }

    /// The value that `bytes`, frames as [`encode`](Self::encode) and
    /// [`item_frame`](Self::item_frame) write, concatenated, hold: the last
    /// whole value (or the default) with every item after it appended.
    pub fn decode(&self, bytes: &[u8]) -> Result<V, String> {
        self.extend(None, bytes)
    }

    /// [`decode`](Self::decode), onto `value` (`None`: the default) as the
    /// value before the frames.
    pub fn extend(&self, value: Option<V>, bytes: &[u8]) -> Result<V, String> {
        let mut value = value;
        let mut rest = bytes;
        while !rest.is_empty() {
            let kind = rest[0];
            let (len, used) = read_varint(&rest[1..]).ok_or("a stored value's frame is cut short")?;
            let start = 1 + used;
            let body =
                rest.get(start..start.saturating_add(len)).ok_or("a stored value's frame is longer than the value")?;
            match kind {
                WHOLE => {
                    value = Some(crate::checkpoint::decode_stored::<V>(body).map_err(|e| e.to_string())?);
                }
                ITEM => (self.apply)(value.get_or_insert_with(self.make), body)?,
                other => return Err(format!("a stored value has a frame of unknown kind {other}")),
            }
            rest = &rest[start + len..];
        }
        Ok(value.unwrap_or_else(self.make))
    }

    /// Appends the item encoded as `bytes` to `value`.
    pub fn apply(&self, value: &mut V, bytes: &[u8]) -> Result<(), String> {
        (self.apply)(value, bytes)
    }

    /// The value with nothing appended.
    pub fn make(&self) -> V {
        (self.make)()
    }
}

/// Appends a frame: `kind`, the length of `body` (LEB128), `body`.
fn frame(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    out.push(kind);
    let mut n = body.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(body);
}

/// A LEB128 length and the bytes it took.
fn read_varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut n = 0usize;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        n |= usize::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((n, i + 1));
        }
    }
    None
}

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
    /// Whether [`append_encoded`](Self::append_encoded) appends (without
    /// reading the value). The default: no.
    fn appends_blindly(&self) -> bool {
        false
    }
    /// Appends the item encoded as `item` (the state encoding) to the value of `key`
    /// (made if there is none), without reading the value where the store
    /// can; called only if [`appends_blindly`](Self::appends_blindly).
    /// The default does nothing.
    fn append_encoded(&mut self, key: &K, item: &[u8]) {
        let _ = (key, item);
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

/// Keyed state kept as encoded bytes (the state encoding) in an ordered map of byte
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
    /// Of a list state: values are kept as frames that appends add to
    /// without decoding the value ([`Appender`]).
    appender: Option<Appender<V>>,
}

impl<K, V> Default for Encoded<K, V> {
    fn default() -> Self {
        Encoded { store: BTreeMap::new(), cache: StateMap::default(), len: 0, failed: Mutex::new(None), appender: None }
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
    /// A list state ([`Appendable`]): appends of keys not read in the
    /// activation add the item's frame to the stored bytes, as RocksDB's
    /// merges do.
    pub fn with_appender(mut self, appender: Option<Appender<V>>) -> Self {
        self.appender = appender;
        self
    }

    fn decode_value(&self, bytes: &[u8]) -> Result<V, String> {
        decode_stored(self.appender.as_ref(), bytes)
    }

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
            match self.decode_value(bytes) {
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
            let key = match crate::checkpoint::decode_stored::<K>(kb) {
                Ok(k) => k,
                Err(e) => {
                    self.fail(format!("a stored key does not decode: {e}"));
                    continue;
                }
            };
            if self.cache.contains_key(&key) {
                continue;
            }
            match self.decode_value(vb) {
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
    fn appends_blindly(&self) -> bool {
        self.appender.is_some()
    }
    fn append_encoded(&mut self, key: &K, item: &[u8]) {
        let Some(appender) = self.appender else { return };
        if let Some(slot) = self.cache.get_mut(key) {
            if slot.is_none() {
                self.len += 1;
            }
            if let Err(e) = appender.apply(slot.get_or_insert_with(|| appender.make()), item) {
                self.fail(e);
            }
            return;
        }
        let Some(kb) = self.key_bytes(key) else { return };
        let stored = self.store.entry(kb).or_insert_with(|| {
            self.len += 1;
            Vec::new()
        });
        Appender::<V>::item_frame(stored, item);
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
                Some(v) => match encode_stored(self.appender.as_ref(), v) {
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

/// A list state against a map of vectors, shared by the backends' tests.
#[cfg(test)]
pub(crate) mod list_testing {
    use super::{Appendable, KeyedStateBackend};

    /// A list of numbers.
    #[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Seen(pub Vec<u32>);

    impl Appendable for Seen {
        type Item = u32;
        fn append(&mut self, item: u32) {
            self.0.push(item);
        }
    }

    /// Random appends (blind where the state appends blindly), reads,
    /// changes in place, inserts, removals, whole-state passes, listings
    /// and flushes on `state`, against a map; `exact_len`: whether the
    /// state's number of keys must equal the map's (else it may fall short).
    pub(crate) fn agrees_with_a_map(state: &mut dyn KeyedStateBackend<u32, Seen>, keys: u32, exact_len: bool) {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut model = std::collections::HashMap::<u32, Vec<u32>>::new();
        let listed = |state: &dyn KeyedStateBackend<u32, Seen>| {
            let mut listed = Vec::new();
            state.for_each(&mut |k, v| listed.push((*k, v.0.clone())));
            listed.sort();
            listed
        };
        let sorted = |model: &std::collections::HashMap<u32, Vec<u32>>| {
            let mut expected: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            expected.sort();
            expected
        };
        let same = |listed: Vec<(u32, Vec<u32>)>, expected: Vec<(u32, Vec<u32>)>, when: &str| {
            let first = listed.iter().zip(&expected).position(|(a, b)| a != b);
            assert!(
                listed.len() == expected.len() && first.is_none(),
                "{when}: {} listed, {} held; first difference: {:?} against {:?}",
                listed.len(),
                expected.len(),
                first.map(|i| &listed[i]),
                first.map(|i| &expected[i]),
            );
        };
        for step in 0..40_000u32 {
            let k = (next() % u64::from(keys)) as u32;
            match next() % 100 {
                0..=44 => {
                    if state.appends_blindly() {
                        state.append_encoded(&k, &crate::checkpoint::encode(&step).unwrap());
                    } else {
                        state.get_or_insert_with(k, &mut Seen::default).append(step);
                    }
                    model.entry(k).or_default().push(step);
                }
                45..=59 => assert_eq!(state.get(&k).map(|s| &s.0), model.get(&k), "step {step}"),
                60..=64 => {
                    if let Some(v) = state.get_mut(&k) {
                        v.0.push(step);
                    }
                    if let Some(v) = model.get_mut(&k) {
                        v.push(step);
                    }
                }
                65..=69 => {
                    assert_eq!(state.insert(k, Seen(vec![step])).map(|s| s.0), model.insert(k, vec![step]));
                }
                70..=74 => assert_eq!(state.remove(&k).map(|s| s.0), model.remove(&k), "step {step}"),
                75 => {
                    let keys: Vec<u32> = (0..20).map(|_| (next() % u64::from(keys)) as u32).collect();
                    state.prefetch(&mut keys.iter());
                }
                76 if step % 13 == 0 => same(listed(state), sorted(&model), &format!("listing at step {step}")),
                77 if step % 11 == 0 => {
                    let m = next() % 4;
                    state.retain(&mut |k, v| (u64::from(*k) + v.0.len() as u64) % 4 != m);
                    model.retain(|k, v| (u64::from(*k) + v.len() as u64) % 4 != m);
                }
                78 if step % 17 == 0 => {
                    state.for_each_mut(&mut |_, v| v.0.push(7));
                    model.values_mut().for_each(|v| v.push(7));
                }
                79 if step % 1999 == 0 => {
                    state.clear();
                    model.clear();
                }
                80..=84 => state.flush().expect("flushes"),
                _ => {}
            }
            if exact_len {
                assert_eq!(state.len(), model.len(), "step {step}");
            } else {
                assert!(state.len() <= model.len(), "step {step}: {} keys counted, {} held", state.len(), model.len());
            }
        }
        same(listed(state), sorted(&model), "listing before the flush");
        state.flush().expect("flushes");
        same(listed(state), sorted(&model), "listing after the flush");
        assert!(state.len() * 100 >= model.len() * 95, "{} keys counted, {} held", state.len(), model.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list state on the encoded backend appends blindly (frames added
    /// to the stored bytes) and agrees with a map, its number of keys exact.
    #[test]
    fn encoded_list_state_agrees_with_a_map() {
        use list_testing::Seen;
        let mut state = Encoded::<u32, Seen>::default().with_appender(Some(Appender::of()));
        assert!(state.appends_blindly());
        list_testing::agrees_with_a_map(&mut state, 300, true);
        // Not a list state: appends read and write the whole value.
        let mut state = Encoded::<u32, Seen>::default();
        assert!(!state.appends_blindly());
        list_testing::agrees_with_a_map(&mut state, 300, true);
    }

    /// Frames: a whole value, then items, read back as the value with the
    /// items appended; a later whole value replaces what came before.
    #[test]
    fn frames_read_back_as_the_value_with_its_items() {
        use list_testing::Seen;
        let appender = Appender::<Seen>::of();
        let mut bytes = appender.encode(&Seen(vec![1, 2])).unwrap();
        for item in [3u32, 300, 70_000] {
            Appender::<Seen>::item_frame(&mut bytes, &crate::checkpoint::encode(&item).unwrap());
        }
        assert_eq!(appender.decode(&bytes).unwrap(), Seen(vec![1, 2, 3, 300, 70_000]));
        // Items alone: appended to the default.
        let mut items = Vec::new();
        Appender::<Seen>::item_frame(&mut items, &crate::checkpoint::encode(&9u32).unwrap());
        assert_eq!(appender.decode(&items).unwrap(), Seen(vec![9]));
        bytes.extend(appender.encode(&Seen(vec![5])).unwrap());
        assert_eq!(appender.decode(&bytes).unwrap(), Seen(vec![5]));
        // A long item (a two-byte length).
        let long = Seen((0..100).collect());
        assert_eq!(appender.decode(&appender.encode(&long).unwrap()).unwrap(), long);
        // Damaged bytes are errors, not panics.
        assert!(appender.decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(appender.decode(&[7, 0]).is_err());
        assert!(appender.decode(&[0, 0x80]).is_err());
    }

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
