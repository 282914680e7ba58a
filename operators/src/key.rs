//! Keys: what a keyed operator groups by, and how keys are spread over workers.

use std::hash::{Hash, Hasher};

use serde::{de::DeserializeOwned, Serialize};

/// A key of a keyed operator: hashed to pick the worker that owns it,
/// compared for equality to group, ordered so that outputs can be sorted.
pub trait Key: Hash + Eq + Ord + Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static {}
impl<K: Hash + Eq + Ord + Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static> Key for K {}

/// Data that flows between workers: cloneable, printable and serde-encodable.
pub trait Data: Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static {}
impl<D: Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + 'static> Data for D {}

/// The hash that routes a key to a worker.
///
/// The exchange channel keeps the low bits of this hash (a mask when the
/// number of workers is a power of two), so the hash is finished with a
/// full-avalanche mix: consecutive ids still spread evenly.
///
/// # Examples
/// ```
/// use highwater_operators::key::route;
/// assert_eq!(route(&7u64), route(&7u64));
/// assert_ne!(route(&7u64) & 1, route(&8u64) & 1);
/// ```
pub fn route<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut hasher = rustc_hash::FxHasher::default();
    key.hash(&mut hasher);
    mix(hasher.finish())
}

/// MurmurHash3's 64-bit finaliser.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The hash map used for operator state: fast, not DoS-resistant (keys come
/// from the program's own data, not from an adversary's requests).
pub type StateMap<K, V> = rustc_hash::FxHashMap<K, V>;
