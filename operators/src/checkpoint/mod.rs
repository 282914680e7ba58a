//! Checkpoints as operators see them: consistent cuts at a logical time, and
//! the state an operator hands over at such a cut or gets back on recovery.
//!
//! A checkpoint *cut* `(id, T)` is begun by the runtime (the `highwater`
//! crate's `checkpoint` module), a [`StateRuntime`] the timely computation is
//! configured with before its dataflows are built ([`configure`]): every
//! worker's operators find it through their scope and take their worker's
//! [`StateStore`] from it. Each checkpointable operator then:
//!
//! 1. reads its input through a *gate*: an operator that passes updates
//!    whose timely time is below the pending cut's `T` and keeps the others
//!    back, holding its capability at `T`. The operator's input frontier thus
//!    stops exactly at `T` with every update below it received, and none above.
//!    A keyed operator's input is exchanged on its way into the gate, so what a
//!    gate holds back is for its own worker's instance only;
//! 2. when its frontier reaches `T`, fires what the watermark `T` completes,
//!    serializes its state into [`Entry`]s and [`submit`](StateStore::submit)s
//!    them: the state as of `T`. The gate then lets the held-back updates
//!    through, whatever the operator's instances on other workers are at.
//!    Data keeps flowing everywhere else, and the entries are written out by
//!    the runtime on a background thread;
//! 3. on recovery, gets back the entries whose routing hash falls on its worker
//!    ([`StateStore::restored`]), whatever the number of workers the
//!    checkpoint was taken with, and resumes with its frontier at `T`.
//!    Updates at times before `T` that reach a gate after a recovery are
//!    replays of restored differential collections (see
//!    [`EventStream::as_collection`](crate::EventStream::as_collection)),
//!    whose effect the operator's restored state holds already: the gate
//!    drops them, as exactly-once sinks do.
//!
//! Without a runtime (the default) nothing of this happens and the
//! operators run exactly as before. Stateful operators that cannot yet be
//! checkpointed report themselves ([`StateStore::unsupported`]) so that the
//! runtime refuses to start a checkpointed job it could not restore.

pub mod codec;
mod gate;
pub mod memory;

pub use gate::KeyPact;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use timely::dataflow::channels::pact::Pipeline;
use timely::scheduling::Activator;

use crate::key::Data;
use crate::stream::{EventStream, Update};
use crate::time::{Timestamp, END_OF_TIME};

/// A checkpoint's number: increasing over the life of a job, across restarts.
pub type CheckpointId = u64;

/// A checkpoint begun at logical time `time`: it holds the effect of every
/// update whose timely time is below `time`, and nothing of the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    /// The checkpoint's number.
    pub id: CheckpointId,
    /// The logical time of the cut; [`END_OF_TIME`] for the final checkpoint
    /// taken when every source is exhausted.
    pub time: Timestamp,
}

impl Cut {
    /// Whether this is the final checkpoint of a bounded run.
    pub fn is_final(&self) -> bool {
        self.time == END_OF_TIME
    }
}

/// One piece of an operator's state: the routing hash of its key (as given
/// to the operator's exchange, see [`crate::key::route`]) and its bytes
/// (a value encoded with [`encode`]).
pub type Entry = (u64, Vec<u8>);

/// A checkpoint of an operator's database on local disk, taken by its state
/// backend at a cut (RocksDB's own checkpoint, by hard links: see
/// [`AnyKeyedState::database_checkpoint`](crate::state::AnyKeyedState::database_checkpoint)):
/// what an *incremental* checkpoint hands over for the operator's keyed
/// states instead of their entries ([`StateStore::submit`]). The runtime
/// puts into its store only the files that the previous checkpoint did not
/// have, and removes the directory once it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendFiles {
    /// Where its files are.
    pub dir: std::path::PathBuf,
    /// The database's identity (a UUID RocksDB writes when it makes the database).
    pub identity: String,
    /// Its files' names and sizes.
    pub files: Vec<(String, u64)>,
}

impl BackendFiles {
    /// Whether the file `name` is immutable (an SST file: shared between
    /// checkpoints); the others (the database's MANIFEST, CURRENT, OPTIONS)
    /// belong to this checkpoint only.
    ///
    /// ```
    /// use highwater_operators::checkpoint::BackendFiles;
    /// assert!(BackendFiles::is_shared("000012.sst"));
    /// assert!(!BackendFiles::is_shared("MANIFEST-000005"));
    /// ```
    pub fn is_shared(name: &str) -> bool {
        name.ends_with(".sst")
    }

    /// The SST files of this checkpoint that `before` (an earlier checkpoint
    /// of the same database) does not have: what an incremental checkpoint
    /// puts into its store.
    pub fn new_since<'a>(&'a self, before: Option<&BackendFiles>) -> Vec<&'a (String, u64)> {
        let known =
            |name: &str| before.is_some_and(|b| b.identity == self.identity && b.files.iter().any(|(n, _)| n == name));
        self.files.iter().filter(|(name, _)| Self::is_shared(name) && !known(name)).collect()
    }

    /// Removes the directory (once its files are in a store, or the
    /// checkpoint was abandoned).
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), "cannot remove a database checkpoint: {e}");
            }
        }
    }
}

/// Encodes a list of entries as one chunk: the postcard encoding of a
/// sequence of `(routing hash, bytes)` pairs (a varint count, then per entry
/// a varint hash, a varint length and the bytes). [`Restored`] reads chunks in
/// place; [`check_chunk`] checks one.
pub fn encode_chunk(entries: &[Entry]) -> Vec<u8> {
    postcard::to_allocvec(entries).expect("a list of integers and byte strings encodes")
}

/// The entries of a chunk written by [`encode_chunk`], in order, borrowed from it.
fn chunk_entries(chunk: &[u8]) -> ChunkEntries<'_> {
    match postcard::take_from_bytes::<u64>(chunk) {
        Ok((count, rest)) => ChunkEntries { rest, left: count, failed: false },
        Err(_) => ChunkEntries { rest: chunk, left: 0, failed: true },
    }
}

/// Iterates over the entries of a chunk; see [`chunk_entries`].
struct ChunkEntries<'a> {
    rest: &'a [u8],
    left: u64,
    failed: bool,
}

impl<'a> Iterator for ChunkEntries<'a> {
    type Item = Result<(u64, &'a [u8]), StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            self.failed = false;
            self.left = 0;
            return Some(Err(StateError::Chunk("no entry count".into())));
        }
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match postcard::take_from_bytes::<(u64, &'a [u8])>(self.rest) {
            Ok((entry, rest)) => {
                self.rest = rest;
                Some(Ok(entry))
            }
            Err(e) => {
                self.left = 0;
                Some(Err(StateError::Chunk(format!("entry unreadable: {e}"))))
            }
        }
    }
}

/// Checks that `chunk` is a list of entries as [`encode_chunk`] writes it,
/// exactly; returns the number of entries.
pub fn check_chunk(chunk: &[u8]) -> Result<u64, StateError> {
    let mut entries = chunk_entries(chunk);
    let mut n = 0;
    for entry in entries.by_ref() {
        entry?;
        n += 1;
    }
    if !entries.rest.is_empty() {
        return Err(StateError::Chunk(format!("{} bytes after the entries", entries.rest.len())));
    }
    Ok(n)
}

/// What can go wrong with an operator's checkpointed state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// A chunk of entries is not framed as [`encode_chunk`] writes it.
    #[error("a chunk of state entries is damaged: {0}")]
    Chunk(String),
    /// An entry does not decode as the operator's entry type.
    #[error("an entry of {schema} does not decode: {reason}")]
    Decode {
        /// The schema the entry was written under.
        schema: Schema,
        /// The decoder's message.
        reason: String,
    },
    /// A value does not encode (a type postcard cannot write, such as a
    /// sequence of unknown length).
    #[error("state of {schema} does not encode: {reason}")]
    Encode {
        /// The operator's schema.
        schema: Schema,
        /// The encoder's message.
        reason: String,
    },
    /// A value of the operator's state does not read back what it wrote
    /// (checked when a checkpoint is written, so that it fails then, not
    /// at the recovery that would read it).
    #[error(
        "state of type `{type_name}` ({schema}) does not read back from the state encoding: {reason}; its \
         Deserialize does not read what its Serialize writes, so a checkpoint of it could not be restored: \
         make the two agree (a round trip through serde_json shows it), or keep the value out of the \
         operator's state"
    )]
    ReadBack {
        /// The operator's schema.
        schema: Schema,
        /// The Rust type that does not read back.
        type_name: String,
        /// The decoder's message.
        reason: String,
    },
    /// The state backend failed to keep the operator's state (a value that
    /// does not encode on it, or a stored value that no longer decodes).
    #[error("the state backend of {schema} failed: {reason}")]
    Backend {
        /// The operator's schema.
        schema: Schema,
        /// The backend's message.
        reason: String,
    },
    /// The checkpoint holds another schema than the operator's, and the
    /// operator has no migration from it.
    #[error("the checkpoint holds {found}, this program's operator has {expected} and no migration from it")]
    Schema {
        /// The schema in the checkpoint.
        found: Schema,
        /// The operator's.
        expected: Schema,
    },
}

/// The schema of an operator's checkpointed state: a name and a version the
/// operator declares ([`OperatorState::SCHEMA`](crate::state::OperatorState::SCHEMA)).
/// A checkpoint records it per operator; restoring into another schema fails
/// with an error naming both, unless the operator migrates from the old one.
///
/// ```
/// use highwater_operators::checkpoint::Schema;
/// const SCHEMA: Schema = Schema::new("dedup", 2);
/// assert_eq!(SCHEMA.to_string(), "state schema dedup v2");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schema {
    /// What the state is (stable across versions).
    pub name: std::borrow::Cow<'static, str>,
    /// Its version: bumped whenever the encoded form of an entry changes.
    pub version: u32,
}

impl Schema {
    /// The schema `name`, version `version`.
    pub const fn new(name: &'static str, version: u32) -> Self {
        Schema { name: std::borrow::Cow::Borrowed(name), version }
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "state schema {} v{}", self.name, self.version)
    }
}

/// An operator's restored entries on one worker: read in place from the
/// checkpoint's chunks (see [`encode_chunk`]), keeping those whose routing
/// hash falls on this worker, with no copy per entry.
#[derive(Clone, Debug, Default)]
pub struct Restored {
    chunks: Vec<std::sync::Arc<Vec<u8>>>,
    /// How the values of `chunks` are encoded (the checkpoint's format).
    encoding: StateEncoding,
    /// Chunks added since ([`with_chunk`](Self::with_chunk)), in this build's encoding.
    added: Vec<std::sync::Arc<Vec<u8>>>,
    worker: u64,
    workers: u64,
    /// The schema the entries were written under, if the checkpoint says.
    schema: Option<Schema>,
}

impl Restored {
    /// The entries of `chunks` that fall on `worker` of `workers`.
    pub fn new(chunks: Vec<std::sync::Arc<Vec<u8>>>, worker: usize, workers: usize) -> Self {
        Restored {
            chunks,
            encoding: StateEncoding::Tagged,
            added: Vec::new(),
            worker: worker as u64,
            workers: workers.max(1) as u64,
            schema: None,
        }
    }

    /// The same entries, their values encoded in `encoding` (that of the
    /// checkpoint they come from).
    pub fn with_encoding(mut self, encoding: StateEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// How the values of the checkpoint's chunks are encoded.
    pub fn encoding(&self) -> StateEncoding {
        self.encoding
    }

    /// The same entries, written under `schema`.
    pub fn with_schema(mut self, schema: Option<Schema>) -> Self {
        self.schema = schema;
        self
    }

    /// The same entries and those of `chunk` (a chunk as [`encode_chunk`]
    /// writes it, e.g. of entries read from a database checkpoint).
    /// The chunk's values are in this build's encoding ([`encode`]).
    pub fn with_chunk(mut self, chunk: Vec<u8>) -> Self {
        self.added.push(std::sync::Arc::new(chunk));
        self
    }

    /// The worker these entries are for, and the job's number of workers.
    pub fn worker(&self) -> (usize, usize) {
        (self.worker as usize, self.workers as usize)
    }

    /// The schema the entries were written under, if known.
    pub fn schema(&self) -> Option<&Schema> {
        self.schema.as_ref()
    }

    /// Calls `each(routing hash, bytes)` for every entry of this worker, in
    /// the order they were written; stops at the first damaged chunk.
    /// [`decode`] reads each entry's encoding while `each` runs ([`reading`]).
    pub fn try_for_each(&self, mut each: impl FnMut(u64, &[u8])) -> Result<(), StateError> {
        let parts = [(&self.chunks, self.encoding), (&self.added, StateEncoding::Tagged)];
        for (chunks, encoding) in parts {
            reading(encoding, || {
                for chunk in chunks {
                    for entry in chunk_entries(chunk) {
                        let (route, bytes) = entry?;
                        if route % self.workers.max(1) == self.worker {
                            each(route, bytes);
                        }
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The number of entries of this worker (0 if a chunk is damaged).
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.try_for_each(|_, _| n += 1).map_or(0, |()| n)
    }

    /// Whether this worker has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a worker's operators see of the checkpointing runtime.
pub trait StateStore {
    /// The oldest begun checkpoint after `done` (or after the restored one,
    /// if `done` is `None`) that this process has not yet collected (its
    /// operators, sources and sinks have not all handed over their part).
    fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut>;
    /// While the processes of a job choose the next cut (a round trip on the
    /// network, during which this process's sources publish no later time):
    /// one above the latest time this process has published. The cut will
    /// lie at or above it, and another process that has already heard of the
    /// cut may send updates past it, so gates hold back updates from this
    /// time on. `None` otherwise, and in a single process.
    fn choosing(&self) -> Option<Timestamp> {
        None
    }
    /// Declares a checkpointable operator, by a name stable across runs of
    /// the same program (its name and its address in the dataflow), with the
    /// schema of its state and the older versions it migrates from. A store
    /// restoring a checkpoint refuses (see [`fail`](Self::fail)) an operator
    /// whose checkpointed schema is neither.
    fn register(&self, operator: &str, schema: &Schema, migrates_from: &[u32]);
    /// Reports that `operator`'s state could not be restored or taken: the
    /// store fails the job's checkpointing with `error` (no later checkpoint
    /// commits) and reports it where the job is started or finished.
    fn fail(&self, operator: &str, error: StateError);
    /// Declares a stateful operator whose state cannot be checkpointed.
    fn unsupported(&self, operator: &str);
    /// The entries restored for `operator` on this worker (those whose
    /// routing hash falls here), if the job was recovered.
    fn restored(&self, operator: &str) -> Option<Restored>;
    /// The time of the checkpoint the job was recovered from.
    fn restored_time(&self) -> Option<Timestamp>;
    /// Hands over `operator`'s state as of `cut`; taking it paused the
    /// worker for `pause`. With `files` (only if the store
    /// [`takes_database_files`](Self::takes_database_files)), the state is
    /// incremental: its keyed states are the database checkpoint `files`,
    /// and `entries` hold the rest of the state; the store owns the files'
    /// directory from now on (and removes it).
    fn submit(
        &self,
        operator: &str,
        cut: Cut,
        entries: Vec<Entry>,
        files: Option<BackendFiles>,
        pause: std::time::Duration,
    );
    /// Whether the store takes an operator's keyed states as its state
    /// backend's database files ([`submit`](Self::submit)): an incremental
    /// checkpoint, which writes only the files new since the last one.
    /// `false` by default: operators hand over every entry.
    fn takes_database_files(&self) -> bool {
        false
    }
    /// The database checkpoints restored for `operator`, one directory per
    /// worker of the run that took them (each holding every key of that
    /// worker: the operator reads those of its own worker, whatever the
    /// number of workers). Empty if the operator's state was restored as
    /// entries only.
    fn restored_databases(&self, operator: &str) -> Vec<std::path::PathBuf> {
        let _ = operator;
        Vec::new()
    }
    /// Calls `wake` whenever a cut is begun or abandoned (to schedule an
    /// operator whose frontier may already be at the cut's time).
    fn on_cut(&self, wake: Box<dyn Fn() + Send + Sync>);
}

/// A job's checkpointing runtime, shared by all its workers: what the
/// dataflow is built with (see [`configure`]). The `highwater` crate's
/// `Checkpoints` is one; [`memory::MemoryCheckpoint`] is the in-memory one of
/// the operators' tests.
pub trait StateRuntime: Send + Sync + std::fmt::Debug + 'static {
    /// The store the operators of worker `index` use.
    fn worker(&self, index: usize) -> Rc<dyn StateStore>;
    /// The runtime as `Any`, for its owner to find its own type again (the
    /// `highwater` crate's sources and sinks reach their `Checkpoints` so).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The key of the timely configuration entry that holds a job's [`StateRuntime`].
const RUNTIME_KEY: &str = "highwater.checkpoint.runtime";

/// The configuration entry (timely's registry holds sized values).
#[derive(Clone)]
struct Configured(Arc<dyn StateRuntime>);

/// Builds every dataflow of the timely computation started with `config`
/// with `runtime`: its stateful operators take their state from it and hand
/// it over at its checkpoints. The runtime travels with the configuration to
/// every worker (timely's [`WorkerConfig`](timely::WorkerConfig) registry),
/// and operators find it through their scope ([`runtime`]): nothing is
/// installed per thread, and a worker of a computation configured without a
/// runtime builds its operators without checkpoints.
pub fn configure(config: &mut timely::WorkerConfig, runtime: Arc<dyn StateRuntime>) {
    config.set(RUNTIME_KEY.to_owned(), Configured(runtime));
}

/// The runtime the computation of `scope` was configured with ([`configure`]), if any.
pub fn runtime(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Arc<dyn StateRuntime>> {
    runtime_of(scope.worker().config())
}

/// The runtime a worker's configuration holds ([`configure`]), if any.
pub fn runtime_of(config: &timely::WorkerConfig) -> Option<Arc<dyn StateRuntime>> {
    config.get::<Configured>(RUNTIME_KEY).map(|c| Arc::clone(&c.0))
}

/// The [`StateStore`] of `scope`'s worker, if its computation has a runtime.
pub fn store(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Rc<dyn StateStore>> {
    runtime(scope).map(|r| r.worker(scope.index()))
}

/// How the values of a checkpoint's entries are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateEncoding {
    /// The self-describing state encoding ([`codec`]): checkpoints of format
    /// 5 and later, and every value the backends keep as bytes.
    #[default]
    Tagged,
    /// postcard: checkpoints before format 5, read for their recovery
    /// (types that need a self-describing format never restored from them).
    Postcard,
}

thread_local! {
    /// The encoding [`decode`] reads on this thread: the restored chunk's,
    /// while an operator restores it (see [`Restored::try_for_each`]).
    static READING: Cell<StateEncoding> = const { Cell::new(StateEncoding::Tagged) };
    /// The encoding of the values a state backend reads on this thread: an
    /// older checkpoint's database files', while they are read
    /// ([`reading_stored`]); the backends' own values are always [`encode`]'s.
    static STORED: Cell<StateEncoding> = const { Cell::new(StateEncoding::Tagged) };
}

/// `f` with `cell` set to `encoding`, and back.
fn with_encoding<R>(
    cell: &'static std::thread::LocalKey<Cell<StateEncoding>>,
    encoding: StateEncoding,
    f: impl FnOnce() -> R,
) -> R {
    struct Reset(&'static std::thread::LocalKey<Cell<StateEncoding>>, StateEncoding);
    impl Drop for Reset {
        fn drop(&mut self) {
            self.0.with(|r| r.set(self.1));
        }
    }
    let _reset = Reset(cell, cell.with(|r| r.replace(encoding)));
    f()
}

/// Runs `f` with [`decode`] (and [`encode_restoring`]) on this thread in
/// `encoding`: how the entries of an older checkpoint are read.
pub fn reading<R>(encoding: StateEncoding, f: impl FnOnce() -> R) -> R {
    with_encoding(&READING, encoding, f)
}

/// Runs `f` with the state backends on this thread reading stored values
/// in `encoding`: how an older checkpoint's database files are read.
pub fn reading_stored<R>(encoding: StateEncoding, f: impl FnOnce() -> R) -> R {
    with_encoding(&STORED, encoding, f)
}

/// Decodes a value a state backend stored (with [`encode`]; in an older
/// checkpoint's database files, as [`reading_stored`] says).
pub(crate) fn decode_stored<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, EncodingError> {
    decode_in(STORED.with(Cell::get), bytes)
}

/// The encoding [`decode`] reads on this thread now.
pub fn reading_encoding() -> StateEncoding {
    READING.with(Cell::get)
}

/// A piece of state that does not encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EncodingError(String);

impl From<codec::CodecError> for EncodingError {
    fn from(e: codec::CodecError) -> Self {
        EncodingError(e.0)
    }
}

impl From<postcard::Error> for EncodingError {
    fn from(e: postcard::Error) -> Self {
        EncodingError(format!("{e} (postcard, a checkpoint before format 5)"))
    }
}

/// Encodes a piece of state for an [`Entry`] (or a backend's stored value)
/// in the state encoding ([`codec`]: self-describing, so every type that
/// round-trips through serde restores; see the `state encoding` entry of
/// the workspace's Cargo.toml for why).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodingError> {
    Ok(codec::to_vec(value)?)
}

/// Encodes as [`decode`] reads on this thread now: for a migration that
/// writes what the restoring operator decodes next (an older checkpoint's
/// entry re-encoded within its restore).
pub fn encode_restoring<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodingError> {
    match reading_encoding() {
        StateEncoding::Tagged => encode(value),
        StateEncoding::Postcard => Ok(postcard::to_allocvec(value)?),
    }
}

/// Decodes a piece of state written by [`encode`]; trailing bytes are an
/// error. While an operator restores an older checkpoint's entries
/// ([`reading`]), it reads their encoding (postcard) instead.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, EncodingError> {
    decode_in(reading_encoding(), bytes)
}

/// Decodes `bytes`, one value in `encoding`; trailing bytes are an error.
pub fn decode_in<T: serde::de::DeserializeOwned>(encoding: StateEncoding, bytes: &[u8]) -> Result<T, EncodingError> {
    match encoding {
        StateEncoding::Tagged => Ok(codec::from_slice(bytes)?),
        StateEncoding::Postcard => {
            let (value, rest) = postcard::take_from_bytes(bytes)?;
            if rest.is_empty() {
                Ok(value)
            } else {
                Err(postcard::Error::DeserializeBadEncoding.into())
            }
        }
    }
}

/// Decodes the first value of an entry written by [`encode`] (e.g. the
/// leading field of a tuple), ignoring the rest.
pub fn decode_prefix<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, EncodingError> {
    match reading_encoding() {
        StateEncoding::Tagged => {
            // A tuple's leading field: the tuple's tag and count come first.
            let mut decoder = bytes;
            if let Some((&tag, rest)) = decoder.split_first() {
                if codec::is_sequence(tag) {
                    decoder = codec::skip_count(rest)?;
                }
            }
            Ok(codec::take_from_slice(decoder)?.0)
        }
        StateEncoding::Postcard => Ok(postcard::take_from_bytes(bytes).map(|(value, _)| value)?),
    }
}

/// What a gate and its operator share.
struct Shared {
    /// The last checkpoint the operator has submitted.
    done: Cell<Option<CheckpointId>>,
    /// The gates to wake when the operator has submitted.
    gates: RefCell<Vec<Activator>>,
}

/// A checkpointable operator's link to its worker's [`StateStore`].
pub(crate) struct Checkpointer {
    store: Rc<dyn StateStore>,
    shared: Rc<Shared>,
    name: String,
    /// Schedules the operator from another thread (its state coming back).
    waker: Option<timely::scheduling::SyncActivator>,
}

/// An operator's state taken for a snapshot at a cut ([`Checkpointer::snapshot_away`]).
pub(crate) enum Away<S> {
    /// With a background thread that serializes it.
    Serializing {
        cut: Cut,
        /// The time the worker spent handing it over.
        pause: std::time::Duration,
        /// The database checkpoint of the state's keyed states, if incremental.
        files: Option<BackendFiles>,
        back: std::sync::mpsc::Receiver<(S, Result<Vec<Entry>, StateError>, std::time::Duration)>,
    },
    /// Serialized in place (the final cut) and submitted already.
    Kept(S),
}

impl Checkpointer {
    /// A checkpointer for an operator about to be built in `scope`, if its
    /// computation has a checkpoint runtime.
    pub(crate) fn new(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Self> {
        let store = store(scope)?;
        let shared = Rc::new(Shared { done: Cell::new(None), gates: RefCell::new(Vec::new()) });
        Some(Checkpointer { store, shared, name: String::new(), waker: None })
    }

    /// Gates `stream`, one of the operator's inputs that the operator reads
    /// in place (build the gates before the operator).
    pub(crate) fn gate<'scope, D: Data>(&self, stream: &EventStream<'scope, D>) -> EventStream<'scope, D> {
        gate::gate(stream, Pipeline, Rc::clone(&self.store), Rc::clone(&self.shared))
    }

    /// Registers the operator under `name` at `address` in `scope`, with
    /// the schema of its state and the versions it migrates from.
    pub(crate) fn register(
        &mut self,
        name: &str,
        address: &[usize],
        scope: &timely::dataflow::Scope<'_, Timestamp>,
        schema: &Schema,
        migrates_from: &[u32],
    ) {
        self.name = format!("{name}@{address:?}");
        self.store.register(&self.name, schema, migrates_from);
        let activator = scope.worker().sync_activator_for(address.to_vec());
        self.waker = Some(activator.clone());
        self.store.on_cut(Box::new(move || {
            let _ = activator.activate();
        }));
    }

    /// Takes the state as of `cut` without pausing the worker: `state` is
    /// moved to a background thread, which `serialize`s it and hands it back;
    /// [`home`](Self::home) submits the entries and gives the state back.
    /// Meanwhile the operator must leave its input alone (nothing reaches it:
    /// its gates hold back what is at or after the cut, and all that was
    /// before it has been received) and the worker runs its other operators.
    ///
    /// The final cut is taken in place: the input has ended (no gate holds
    /// it back) and the dataflow may end with this activation. The operator
    /// gets its state back from `home` all the same.
    ///
    /// With `files` (a checkpoint of the state's database, taken on the
    /// worker), the snapshot is incremental: `serialize` gives the entries
    /// of the rest of the state.
    pub(crate) fn snapshot_away<S, F>(
        &self,
        cut: Cut,
        mut state: S,
        files: Option<BackendFiles>,
        serialize: F,
    ) -> Away<S>
    where
        S: Send + 'static,
        F: FnOnce(&mut S) -> Result<Vec<Entry>, StateError> + Send + 'static,
    {
        if cut.is_final() {
            let started = std::time::Instant::now();
            let entries = serialize(&mut state);
            self.submitted(cut, entries, files, started.elapsed());
            return Away::Kept(state);
        }
        let started = std::time::Instant::now();
        let (tx, back) = std::sync::mpsc::sync_channel(1);
        let waker = self.waker.clone();
        std::thread::Builder::new()
            .name("highwater-snapshot".into())
            .spawn(move || {
                let serializing = std::time::Instant::now();
                let mut state = state;
                let entries = serialize(&mut state);
                let _ = tx.send((state, entries, serializing.elapsed()));
                if let Some(w) = waker {
                    let _ = w.activate();
                }
            })
            .expect("starting a snapshot thread");
        Away::Serializing { cut, pause: started.elapsed(), files, back }
    }

    /// Whether the operator's state is with it: `false` while a background
    /// thread serializes it (the operator then returns and waits to be woken
    /// up). State that has come back is handed to `back`, its entries having
    /// been submitted and the gates opened.
    ///
    /// # Panics
    /// If the thread serializing it panicked.
    pub(crate) fn home<S>(&self, away: &mut Option<Away<S>>, back: impl FnOnce(S)) -> bool {
        match away.take() {
            None => true,
            Some(Away::Kept(state)) => {
                back(state);
                true
            }
            Some(Away::Serializing { cut, pause, files, back: rx }) => match rx.try_recv() {
                Ok((state, entries, serializing)) => {
                    tracing::debug!(operator = %self.name, id = cut.id, ?serializing, "state serialized in the background");
                    self.submitted(cut, entries, files, pause);
                    back(state);
                    true
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    *away = Some(Away::Serializing { cut, pause, files, back: rx });
                    false
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    panic!("serializing {}'s state for checkpoint {} failed", self.name, cut.id)
                }
            },
        }
    }

    /// Hands over the entries of `cut` and opens the gates. State that did
    /// not encode fails the checkpointing (the gates open all the same, so
    /// that the dataflow goes on to report it).
    fn submitted(
        &self,
        cut: Cut,
        entries: Result<Vec<Entry>, StateError>,
        files: Option<BackendFiles>,
        pause: std::time::Duration,
    ) {
        match entries {
            Ok(entries) => self.store.submit(&self.name, cut, entries, files, pause),
            Err(e) => {
                if let Some(files) = files {
                    files.remove();
                }
                self.store.fail(&self.name, e)
            }
        }
        self.shared.done.set(Some(cut.id));
        for gate in self.shared.gates.borrow().iter() {
            gate.activate();
        }
    }

    /// The state restored for this worker, with the time it was taken at,
    /// and the database checkpoints restored for the operator (see
    /// [`StateStore::restored_databases`]).
    pub(crate) fn restored(&self) -> Option<(Timestamp, Restored, Vec<std::path::PathBuf>)> {
        let time = self.store.restored_time()?;
        let restored = self.store.restored(&self.name).unwrap_or_default();
        Some((time, restored, self.store.restored_databases(&self.name)))
    }

    /// Whether the store takes keyed states as database files ([`StateStore::takes_database_files`]).
    #[cfg(feature = "rocksdb")]
    pub(crate) fn takes_database_files(&self) -> bool {
        self.store.takes_database_files()
    }

    /// Reports that the operator's state could not be restored.
    pub(crate) fn fail(&self, error: StateError) {
        self.store.fail(&self.name, error);
    }

    /// The cut to snapshot now that the operator's input watermark is
    /// `watermark` and it has fired everything that completes, if any.
    pub(crate) fn due(&self, watermark: Timestamp) -> Option<Cut> {
        self.store.cut_after(self.shared.done.get()).filter(|c| c.time <= watermark)
    }
}

/// An operator's input `stream`, exchanged by `route`, and the pact the
/// operator reads it with: gated and exchanged on the way into the gate if
/// the operator is checkpointed, else exchanged by the operator itself.
pub(crate) fn keyed_input<'scope, D, F>(
    checkpointer: Option<&Checkpointer>,
    stream: &EventStream<'scope, D>,
    route: F,
) -> (EventStream<'scope, D>, KeyPact<F>)
where
    D: Data,
    F: FnMut(&Update<D>) -> u64 + 'static,
{
    match checkpointer {
        Some(c) => {
            let gated = gate::gate(stream, KeyPact::Exchange(route), Rc::clone(&c.store), Rc::clone(&c.shared));
            (gated, KeyPact::Local)
        }
        None => (stream.clone(), KeyPact::Exchange(route)),
    }
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer").field("name", &self.name).field("done", &self.shared.done.get()).finish()
    }
}
