//! Keyed state as operators hold it: one type over whichever backend the job
//! chose.

use super::backend::{Appendable, Appender, Encoded, InMemory, KeyedStateBackend, StateValue};
use crate::key::Key;
use crate::time::Timestamp;

/// The registry key of the job's [`Backend`] in timely's worker configuration.
const BACKEND_KEY: &str = "highwater.state.backend";

/// The environment variable that chooses the backend of computations whose
/// configuration does not ([`Backend::of_config`]).
pub const BACKEND_ENV: &str = "HIGHWATER_STATE_BACKEND";

/// A backend name that is not one of [`Backend`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownBackend {
    /// Not a backend's name.
    #[error("unknown state backend {0:?}: expected memory, encoded or rocksdb")]
    Unknown(String),
    /// `rocksdb`, in a build without the `rocksdb` feature.
    #[error("the rocksdb state backend is not in this build: enable the `rocksdb` feature")]
    NotBuilt,
}

impl std::str::FromStr for Backend {
    type Err = UnknownBackend;

    /// `memory`, `encoded`, or `rocksdb` (with [`RocksDbConfig::from_env`](super::RocksDbConfig::from_env)).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "memory" => Ok(Backend::Memory),
            "encoded" => Ok(Backend::Encoded),
            #[cfg(feature = "rocksdb")]
            "rocksdb" => Ok(Backend::RocksDb(super::RocksDbConfig::from_env())),
            #[cfg(not(feature = "rocksdb"))]
            "rocksdb" => Err(UnknownBackend::NotBuilt),
            other => Err(UnknownBackend::Unknown(other.to_owned())),
        }
    }
}

/// Where a job keeps its operators' keyed state.
///
/// Chosen per job in the computation's configuration
/// ([`configure`](Self::configure)) and read by every stateful operator when
/// it is built, like the checkpoint runtime; the default is memory.
///
/// ```
/// use highwater_operators::state::Backend;
/// let mut config = timely::Config::thread();
/// Backend::Encoded.configure(&mut config.worker);
/// assert_eq!(Backend::of_config(&config.worker), Backend::Encoded);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// A hash map per operator ([`InMemory`]): the fastest; state is bounded
    /// by memory.
    #[default]
    Memory,
    /// Every value kept encoded, with a write-back cache per activation
    /// ([`Encoded`]): the access pattern of an on-disk store, in memory.
    Encoded,
    /// RocksDB on local disk (feature `rocksdb`): a database per operator and
    /// worker, a block cache shared by the process
    /// ([`RocksDbState`](super::RocksDbState)); state larger than memory.
    #[cfg(feature = "rocksdb")]
    RocksDb(super::RocksDbConfig),
}

impl Backend {
    /// Makes this the backend of every stateful operator of computations
    /// run with `config`.
    pub fn configure(self, config: &mut timely::WorkerConfig) {
        config.set(BACKEND_KEY.to_owned(), self);
    }

    /// The backend a worker's configuration holds; if none was set, the one
    /// the environment variable `HIGHWATER_STATE_BACKEND` names (`memory`,
    /// `encoded` or `rocksdb`: how a test suite is run on another backend
    /// without changing its tests); otherwise memory.
    pub fn of_config(config: &timely::WorkerConfig) -> Backend {
        if let Some(backend) = config.get::<Backend>(BACKEND_KEY) {
            return backend.clone();
        }
        match std::env::var(BACKEND_ENV) {
            Ok(name) => name.parse().unwrap_or_else(|e: UnknownBackend| {
                tracing::warn!(%e, "{BACKEND_ENV} is ignored: keyed state stays in memory");
                Backend::Memory
            }),
            Err(_) => Backend::Memory,
        }
    }

    /// The backend of `scope`'s computation.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Backend {
        Self::of_config(scope.worker().config())
    }

    /// The backend's name (`memory`, `encoded`, `rocksdb`).
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Encoded => "encoded",
            #[cfg(feature = "rocksdb")]
            Backend::RocksDb(_) => "rocksdb",
        }
    }

    /// What opens the keyed states of the operator `name` on this backend
    /// ([`KeyedState::open`]); on RocksDB, the operator's database is made
    /// when its first state opens.
    pub fn opener(&self, name: &str) -> Opener {
        Opener {
            backend: self.clone(),
            name: name.to_owned(),
            next_tag: 0,
            error: None,
            #[cfg(feature = "rocksdb")]
            db: None,
        }
    }
}

/// Opens an operator's keyed states on its backend ([`Backend::opener`]):
/// on RocksDB, all in one database, each under a tag of its own.
pub struct Opener {
    backend: Backend,
    name: String,
    next_tag: u8,
    error: Option<String>,
    #[cfg(feature = "rocksdb")]
    db: Option<std::sync::Arc<super::rocks::OperatorDb>>,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("backend", &self.backend.name())
            .field("name", &self.name)
            .field("opened", &self.next_tag)
            .field("error", &self.error)
            .finish()
    }
}

impl Opener {
    /// Opens the database files in `dir` (a RocksDB checkpoint of an
    /// operator's database, [`AnyKeyedState::database_checkpoint`]) read-only:
    /// the operator's keyed states, opened with it in the order they were,
    /// read what the checkpoint holds. The files are left in place.
    ///
    /// # Errors
    /// RocksDB's, as a message.
    ///
    /// With `routes`, `(worker, workers)`, the states hold only the keys
    /// whose routing hash falls on `worker` of `workers` (the others are
    /// skipped before they are decoded).
    #[cfg(feature = "rocksdb")]
    pub fn from_database_files(dir: &std::path::Path, routes: Option<(usize, usize)>) -> Result<Opener, String> {
        let config = super::RocksDbConfig::new(dir);
        let db = config.open_read_only(dir, routes)?;
        let mut opener = Backend::RocksDb(config).opener("restore");
        opener.db = Some(db);
        Ok(opener)
    }

    /// The directory of the operator's database, if its states opened one.
    #[cfg(feature = "rocksdb")]
    pub(crate) fn database_dir(&self) -> Option<std::path::PathBuf> {
        self.db.as_ref().map(|db| db.dir().to_owned())
    }

    /// Why the backend could not be opened (the states then stay in memory),
    /// if it could not: the caller reports it.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn open<K: Key, V: StateValue>(&mut self, appender: Option<Appender<V>>) -> Store<K, V> {
        match &self.backend {
            Backend::Memory => Store::Memory(InMemory::default()),
            Backend::Encoded => Store::Other(Box::new(Encoded::<K, V>::default().with_appender(appender))),
            #[cfg(feature = "rocksdb")]
            Backend::RocksDb(config) => {
                if self.error.is_some() {
                    return Store::Memory(InMemory::default());
                }
                if self.db.is_none() {
                    match config.open(&self.name) {
                        Ok(db) => self.db = Some(db),
                        Err(e) => {
                            self.error = Some(e);
                            return Store::Memory(InMemory::default());
                        }
                    }
                }
                let db = std::sync::Arc::clone(self.db.as_ref().expect("opened above"));
                let tag = self.next_tag;
                self.next_tag += 1;
                Store::Other(Box::new(super::RocksDbState::<K, V>::new(db, tag).with_appender(appender)))
            }
        }
    }
}

/// The keyed state of an operator: a map from keys to values on the job's
/// [`Backend`].
///
/// Every stateful operator keeps what it holds per key in a `KeyedState`,
/// and lists it in [`OperatorState::keyed_states`](super::OperatorState::keyed_states),
/// through which the model opens it on the job's backend and flushes it at
/// the end of every activation; the operator's
/// logic is the same on every backend. In memory every call goes straight to
/// a hash map.
///
/// ```
/// use highwater_operators::state::{Backend, KeyedState};
/// for backend in [Backend::Memory, Backend::Encoded] {
///     let mut counts = KeyedState::<char, u64>::default();
///     counts.open(&mut backend.opener("counts"));
///     *counts.get_or_insert_with('a', || 0) += 1;
///     *counts.get_or_insert_with('a', || 0) += 1;
///     counts.flush().unwrap();
///     assert_eq!(counts.get(&'a'), Some(&2));
///     assert_eq!(counts.len(), 1);
/// }
/// ```
pub struct KeyedState<K, V> {
    store: Store<K, V>,
    /// Of a list state ([`appending`](KeyedState::appending)): how its
    /// backend appends blindly.
    appender: Option<Appender<V>>,
}

enum Store<K, V> {
    Memory(InMemory<K, V>),
    Other(Box<dyn KeyedStateBackend<K, V>>),
}

impl<K, V> Default for KeyedState<K, V> {
    fn default() -> Self {
        KeyedState { store: Store::Memory(InMemory::default()), appender: None }
    }
}

impl<K, V> std::fmt::Debug for KeyedState<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.store {
            Store::Memory(_) => "memory",
            Store::Other(_) => "other",
        };
        f.debug_struct("KeyedState").field("backend", &backend).finish_non_exhaustive()
    }
}

/// A [`KeyedState`] of any key and value type, as the model sees it: what it
/// needs to put the state on a backend and write it back
/// ([`OperatorState::keyed_states`](super::OperatorState::keyed_states)).
pub trait AnyKeyedState {
    /// [`KeyedState::open`].
    fn open(&mut self, opener: &mut Opener);
    /// [`KeyedState::flush`].
    ///
    /// # Errors
    /// The backend's.
    fn flush(&mut self) -> Result<(), String>;
    /// [`KeyedState::len`]: the keys held.
    fn entries(&self) -> usize;
    /// [`KeyedStateBackend::approximate_bytes`](super::KeyedStateBackend::approximate_bytes):
    /// the state's size encoded, estimated.
    fn approximate_bytes(&self) -> Option<u64>;
    /// Takes the state's contents out, leaving it empty in memory (so that
    /// a snapshot taken meanwhile holds the operator's state without this
    /// keyed state), to be put back by [`attach`](Self::attach).
    fn detach(&mut self) -> Detached;
    /// Puts back what [`detach`](Self::detach) took out.
    fn attach(&mut self, detached: Detached);
    /// A RocksDB checkpoint of the state's database into `dir`, if the state
    /// is on RocksDB ([`RocksDbState::checkpoint_database`](super::RocksDbState::checkpoint_database)).
    #[cfg(feature = "rocksdb")]
    fn database_checkpoint(&self, dir: &std::path::Path) -> Option<Result<super::BackendFiles, String>>;
}

/// The contents of a keyed state taken out by [`AnyKeyedState::detach`].
pub struct Detached(Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached").finish_non_exhaustive()
    }
}

impl<K: Key, V: StateValue> AnyKeyedState for KeyedState<K, V> {
    fn open(&mut self, opener: &mut Opener) {
        KeyedState::open(self, opener);
    }
    fn flush(&mut self) -> Result<(), String> {
        KeyedState::flush(self)
    }
    fn entries(&self) -> usize {
        self.len()
    }
    fn approximate_bytes(&self) -> Option<u64> {
        match &self.store {
            Store::Memory(m) => Some(super::backend::sampled_bytes(m.0.len(), m.0.iter())),
            Store::Other(b) => b.approximate_bytes(),
        }
    }
    fn detach(&mut self) -> Detached {
        Detached(Box::new(std::mem::replace(&mut self.store, Store::Memory(InMemory::default()))))
    }
    fn attach(&mut self, detached: Detached) {
        match detached.0.downcast::<Store<K, V>>() {
            Ok(store) => self.store = *store,
            Err(_) => unreachable!("a keyed state is attached what it detached"),
        }
    }
    #[cfg(feature = "rocksdb")]
    fn database_checkpoint(&self, dir: &std::path::Path) -> Option<Result<super::BackendFiles, String>> {
        match &self.store {
            Store::Memory(_) => None,
            Store::Other(b) => b.database_checkpoint(dir),
        }
    }
}

/// Dispatches a call to the backend.
macro_rules! dispatch {
    ($self:expr, $s:ident => $call:expr) => {
        match $self {
            Store::Memory($s) => $call,
            Store::Other($s) => $call,
        }
    };
}

impl<K, V: Appendable> KeyedState<K, V> {
    /// A list state: a keyed state whose values items are appended to
    /// ([`Appendable`]), on a backend that keeps values as bytes without
    /// reading them ([`append`](Self::append)).
    pub fn appending() -> Self {
        KeyedState { store: Store::Memory(InMemory::default()), appender: Some(Appender::of()) }
    }
}

impl<K: Key, V: Appendable> KeyedState<K, V> {
    /// Appends `item` to the value of `key` (the default value if there is
    /// none). In memory, or on a state not made [`appending`](Self::appending),
    /// the value is read and changed in place; on a store that keeps values as
    /// bytes the encoded item is written on its own (on RocksDB, a merge
    /// operand), and the value is put together when it is next read.
    #[inline]
    pub fn append(&mut self, key: K, item: V::Item) {
        match &mut self.store {
            Store::Memory(m) => m.0.entry(key).or_default().append(item),
            Store::Other(b) => {
                if b.appends_blindly() {
                    if let Ok(bytes) = crate::checkpoint::encode(&item) {
                        b.append_encoded(&key, &bytes);
                        return;
                    }
                }
                // Not blind, or the item does not encode (the value then
                // fails to encode at the flush, which reports it).
                b.get_or_insert_with(key, &mut V::default).append(item);
            }
        }
    }
}

impl<K: Key, V: StateValue> KeyedState<K, V> {
    /// Puts the state on the backend of `opener` (before anything is
    /// stored: what the state held is dropped).
    pub fn open(&mut self, opener: &mut Opener) {
        self.store = opener.open(self.appender);
    }

    /// Puts the state on a backend of the caller's (e.g. one a test wraps
    /// around another).
    pub fn open_with(&mut self, backend: Box<dyn KeyedStateBackend<K, V>>) {
        self.store = Store::Other(backend);
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&mut self, key: &K) -> Option<&V> {
        match &mut self.store {
            Store::Memory(m) => m.0.get(key),
            Store::Other(b) => b.get(key),
        }
    }

    /// The value of `key`, to change in place.
    #[inline]
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match &mut self.store {
            Store::Memory(m) => m.0.get_mut(key),
            Store::Other(b) => b.get_mut(key),
        }
    }

    /// The value of `key`, made by `make` if there is none.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        match &mut self.store {
            Store::Memory(m) => m.0.entry(key).or_insert_with(make),
            Store::Other(b) => {
                let mut make = Some(make);
                b.get_or_insert_with(key, &mut || (make.take().expect("made once"))())
            }
        }
    }

    /// Sets the value of `key`; returns the previous one.
    #[inline]
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match &mut self.store {
            Store::Memory(m) => m.0.insert(key, value),
            Store::Other(b) => b.insert(key, value),
        }
    }

    /// Removes `key`; returns its value.
    #[inline]
    pub fn remove(&mut self, key: &K) -> Option<V> {
        match &mut self.store {
            Store::Memory(m) => m.0.remove(key),
            Store::Other(b) => b.remove(key),
        }
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        dispatch!(&self.store, s => s.len())
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `n` more keys (a hint).
    pub fn reserve(&mut self, n: usize) {
        dispatch!(&mut self.store, s => s.reserve(n))
    }

    /// Whether [`append`](Self::append) writes without reading the value
    /// (a list state on a backend that keeps values as bytes): an operator
    /// then need not [`prefetch`](Self::prefetch) the keys it only appends to.
    #[inline]
    pub fn appends_blindly(&self) -> bool {
        match &self.store {
            Store::Memory(_) => false,
            Store::Other(b) => b.appends_blindly(),
        }
    }

    /// Whether [`prefetch`](Self::prefetch) does anything (the backend keeps
    /// values as bytes): an operator computes the keys to prefetch only then.
    #[inline]
    pub fn prefetches(&self) -> bool {
        matches!(self.store, Store::Other(_))
    }

    /// Reads `keys` ahead, in one call on a backend on disk (a hint: in
    /// memory it does nothing). An operator that is about to visit the keys
    /// of a batch calls it first.
    pub fn prefetch<'a>(&mut self, keys: impl IntoIterator<Item = &'a K>)
    where
        K: 'a,
    {
        if let Store::Other(b) = &mut self.store {
            b.prefetch(&mut keys.into_iter());
        }
    }

    /// Calls `each` with every key and value, in no particular order.
    pub fn for_each(&self, mut each: impl FnMut(&K, &V)) {
        match &self.store {
            Store::Memory(m) => m.0.iter().for_each(|(k, v)| each(k, v)),
            Store::Other(b) => b.for_each(&mut each),
        }
    }

    /// Calls `each` with every key and value, to change in place.
    pub fn for_each_mut(&mut self, mut each: impl FnMut(&K, &mut V)) {
        match &mut self.store {
            Store::Memory(m) => m.0.iter_mut().for_each(|(k, v)| each(k, v)),
            Store::Other(b) => b.for_each_mut(&mut each),
        }
    }

    /// Keeps the keys for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        match &mut self.store {
            Store::Memory(m) => m.0.retain(|k, v| keep(k, v)),
            Store::Other(b) => b.retain(&mut keep),
        }
    }

    /// Removes every key.
    pub fn clear(&mut self) {
        match &mut self.store {
            Store::Memory(m) => m.0.clear(),
            Store::Other(b) => b.clear(),
        }
    }

    /// Writes back what changed in this activation (nothing to do in memory).
    ///
    /// # Errors
    /// A value that does not encode or decode on the backend.
    #[inline]
    pub fn flush(&mut self) -> Result<(), String> {
        match &mut self.store {
            Store::Memory(_) => Ok(()),
            Store::Other(b) => b.flush(),
        }
    }
}
