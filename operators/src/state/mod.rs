//! The stateful-operator model: what every operator that keeps state across
//! records is written with.
//!
//! A stateful operator in highwater is three things, and this module provides
//! the parts that are the same for all of them:
//!
//! - **Its keyed input.** [`Stateful::keyed_input`] exchanges an input by the
//!   routing hash of its key ([`crate::key::route`]) and, when the job is
//!   checkpointed, puts it through a *checkpoint gate* (see
//!   [`crate::checkpoint`]): the operator's frontier then stops at a cut's
//!   time with everything before it received and nothing after it.
//! - **Its state, declared once** as a type implementing [`OperatorState`]:
//!   the [`Schema`] (name and version) its checkpoint entries are written
//!   under, how it becomes entries ([`OperatorState::snapshot`]), how an
//!   entry written by an older version is migrated
//!   ([`OperatorState::migrate`]). [`Managed`] holds the state inside the
//!   operator: it restores it ([`Managed::restore`], entries routed to this
//!   worker whatever the number of workers the checkpoint was taken with),
//!   takes snapshots when a cut is due ([`Managed::checkpoint`]) on a
//!   background thread so that the worker does not pause, and hands it back
//!   ([`Managed::home`]).
//! - **Where its keyed state lives**: what it holds per key is a
//!   [`KeyedState`], on the job's [`Backend`] (memory by default; every
//!   backend implements [`KeyedStateBackend`]), so that the operator's
//!   logic is the same whether its state is a hash map or encoded bytes.
//! - **Its own logic**: what it does with records, timers and the watermark.
//!   Event-time timers and the hold on the output capability are the
//!   crate's [`Timers`] and `Hold`; late records go to a [`LateOutput`](crate::LateOutput).
//!
//! [`Stateful`] builds the operator: its gated inputs, its outputs, its
//! registration with the checkpoint runtime under the state's schema. For
//! operators written by users the same model comes whole in
//! [`EventStream::process_keyed`](crate::EventStream::process_keyed): a
//! [`KeyedProcess`] (like Flink's `KeyedProcessFunction`) with per-key
//! state, event-time timers and checkpoints, with nothing but its own logic
//! to write.
//!
//! State is encoded with postcard (a documented, stable wire format; see the
//! workspace's Cargo.toml), through [`Snapshot::push`] and
//! [`OperatorState::Entry`]: no operator reads a byte layout by hand.

mod backend;
pub mod keycode;
mod keyed;
pub(crate) mod multiset;
pub(crate) mod pending;
mod process;
#[cfg(feature = "rocksdb")]
mod rocks;
mod stateful;
mod timers;
mod ttl;

pub use crate::checkpoint::{BackendFiles, Schema, StateError};
pub use backend::{
    sampled_bytes, sampled_size, Appendable, Appender, Encoded, InMemory, KeyedStateBackend, StateValue, SAMPLE,
};
pub use keyed::{AnyKeyedState, Backend, Detached, KeyedState, Opener, UnknownBackend, BACKEND_ENV};
pub use process::{KeyedContext, KeyedProcess, TtlProcessed};
#[cfg(feature = "rocksdb")]
pub use rocks::{parse_size, InvalidSize, RocksDbConfig, RocksDbState, SPILL_AT, STATE_CACHE_ENV, STATE_DIR_ENV};
#[cfg(feature = "rocksdb")]
pub use stateful::entries_from_database;
pub(crate) use stateful::{give_all, ActiveOutput};
pub use stateful::{
    snapshot_without_keyed, GatedInput, InputOf, Managed, OutputOf, RestoredEntries, Stateful, StatefulBuilder,
};
pub use timers::Timers;
pub(crate) use ttl::in_event_time;
pub use ttl::{Clock, Expiry, Refresh, StateTtl, WithTtl};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::checkpoint::Entry;

/// The state of a stateful operator as a checkpoint keeps it.
///
/// The state is taken at a cut as a list of *entries*, each a value routed by
/// the hash of its key (so that a recovery on another number of workers gives
/// each key's entries to the worker that owns the key), written under the
/// operator's [`SCHEMA`](Self::SCHEMA). On recovery every entry of this
/// worker is decoded as an [`Entry`](Self::Entry), or migrated from an older
/// version of the schema by [`migrate`](Self::migrate).
pub trait OperatorState: Default + Send + 'static {
    /// The schema of the entries: bump the version whenever their encoded
    /// form changes.
    const SCHEMA: Schema;
    /// The older versions of [`SCHEMA`](Self::SCHEMA) that
    /// [`migrate`](Self::migrate) reads. A checkpoint of any other version is
    /// refused when the dataflow is built, with an error naming both versions.
    const MIGRATES_FROM: &'static [u32] = &[];
    /// One restored entry, as [`snapshot`](Self::snapshot) pushed it (the
    /// same shape: pushing `(&K, &V)` restores as `(K, V)`).
    type Entry: DeserializeOwned;
    /// What the worker computes before the state moves to the background
    /// thread that snapshots it (for what needs the operator's closures, which
    /// need not be `Send`, such as key functions); usually `()`.
    type Prepared: Send + 'static;

    /// Pushes the state's entries; runs on a background thread.
    fn snapshot(&self, prepared: Self::Prepared, out: &mut Snapshot);

    /// Calls `each` with every [`KeyedState`] of the state: the model puts
    /// them on the job's backend when the operator is built (before it is
    /// restored) and writes back what each activation changed in them
    /// ([`KeyedState::flush`], at [`Managed::checkpoint`]). State with no
    /// keyed part keeps the default, which has none. An interval join's
    /// state, with one `KeyedState` per side, calls `each(&mut self.lefts)`
    /// and `each(&mut self.rights)`.
    fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
        let _ = each;
    }

    /// The entries a state keeps outside its [`KeyedState`]s (window
    /// slots, records waiting for the watermark, ...) and their size
    /// encoded, estimated (e.g. [`sampled_size`]): added to the keyed
    /// states' in the operator's `state_entries` and `state_bytes` gauges,
    /// about once a second. The default: none (all of it is keyed).
    fn held(&self) -> (usize, u64) {
        (0, 0)
    }

    /// Whether the state splits for incremental checkpoints, and the
    /// [`Prepared`](Self::Prepared) value a snapshot of its keyed part takes:
    /// `Some` if [`snapshot`](Self::snapshot) over the keyed states alone
    /// (the others empty, as a recovery opens them on a checkpoint's
    /// database files, `entries_from_database` with the `rocksdb` feature), plus `snapshot` with the
    /// keyed states taken out ([`snapshot_without_keyed`]), restore exactly
    /// what the whole snapshot restores. The default, `None`: the state is
    /// checkpointed whole. State whose snapshot writes an entry per key of a
    /// keyed state, routed by that key ([`route`](crate::key::route)), and
    /// entries of the rest on their own (or none), splits.
    fn split_prepared() -> Option<Self::Prepared> {
        None
    }

    /// Reads an entry written under `version` of the schema, one of
    /// [`MIGRATES_FROM`](Self::MIGRATES_FROM).
    fn migrate(version: u32, bytes: &[u8]) -> Result<Self::Entry, StateError> {
        let _ = bytes;
        Err(StateError::Schema { found: Schema { name: Self::SCHEMA.name.clone(), version }, expected: Self::SCHEMA })
    }
}

/// The entries of a snapshot being taken ([`OperatorState::snapshot`]).
#[derive(Debug)]
pub struct Snapshot {
    schema: Schema,
    entries: Vec<Entry>,
    error: Option<StateError>,
}

impl Snapshot {
    pub(crate) fn new(schema: Schema) -> Self {
        Snapshot { schema, entries: Vec::new(), error: None }
    }

    /// Room for `n` more entries.
    pub fn reserve(&mut self, n: usize) {
        self.entries.reserve(n);
    }

    /// Adds `value`, routed by `route` (the hash the operator's exchange
    /// routes its key by, [`crate::key::route`]).
    pub fn push<T: Serialize + ?Sized>(&mut self, route: u64, value: &T) {
        match crate::checkpoint::encode(value) {
            Ok(bytes) => self.entries.push((route, bytes)),
            Err(e) => {
                if self.error.is_none() {
                    self.error = Some(StateError::Encode { schema: self.schema.clone(), reason: e.to_string() });
                }
            }
        }
    }

    /// Fails the snapshot: the checkpoint is not taken, and the job's
    /// checkpointing fails with `reason` (e.g. a part of the state that did
    /// not encode, found by the operator itself).
    pub fn fail(&mut self, reason: impl std::fmt::Display) {
        if self.error.is_none() {
            self.error = Some(StateError::Encode { schema: self.schema.clone(), reason: reason.to_string() });
        }
    }

    /// Fails the snapshot with `error` (see [`fail`](Self::fail)).
    pub fn fail_with(&mut self, error: StateError) {
        self.error.get_or_insert(error);
    }

    /// The entries, or the first value that did not encode.
    pub(crate) fn finish(self) -> Result<Vec<Entry>, StateError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.entries),
        }
    }
}
