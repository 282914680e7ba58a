//! Building a stateful operator and holding its state: the checkpoint
//! protocol every stateful operator follows, written once.

use std::cell::Cell;
use std::marker::PhantomData;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{ParallelizationContract, Pipeline};
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::{InputHandleCore, OperatorInfo, OutputBuilder, OutputBuilderSession};
use timely::dataflow::operators::Capability;
use timely::dataflow::Scope;
use timely::progress::frontier::MutableAntichain;
use timely::scheduling::Activator;

use super::{Backend, OperatorState, Snapshot};
use crate::checkpoint::{keyed_input, Away, Checkpointer, KeyPact, Restored, Schema, StateError};
use crate::key::Data;
use crate::late::Counter;
use crate::stream::{EventStream, Update};
use crate::time::Timestamp;

/// An operator output of updates of `T`, as every stateful operator builds it.
pub type OutputOf<T> = OutputBuilder<Timestamp, CapacityContainerBuilder<Vec<Update<T>>>>;

/// An output of updates of `T` during an activation ([`OutputBuilder::activate`]
/// of an [`OutputOf`]): what the operator's steps open sessions on.
pub(crate) type ActiveOutput<'a, T> = OutputBuilderSession<'a, Timestamp, CapacityContainerBuilder<Vec<Update<T>>>>;

/// Gives out `updates` under `cap`, if there are any, leaving the buffer
/// empty: how an operator's steps hand on what they buffered.
pub(crate) fn give_all<T: Data, C>(output: &mut ActiveOutput<'_, T>, cap: &C, updates: &mut Vec<Update<T>>)
where
    C: timely::dataflow::operators::CapabilityTrait<Timestamp>,
{
    if !updates.is_empty() {
        output.session(cap).give_iterator(updates.drain(..));
    }
}

/// The input handle of a stateful operator's input read through `P`.
pub type InputOf<D, P> =
    InputHandleCore<Timestamp, Vec<Update<D>>, <P as ParallelizationContract<Timestamp, Vec<Update<D>>>>::Puller>;

/// A stateful operator being built, before its inputs are gated: builds the
/// checkpoint gates first (they come before the operator in the dataflow),
/// then the operator itself ([`builder`](Self::builder)).
///
/// # Examples
/// Operators are usually written on the whole model,
/// [`EventStream::process_keyed`]; this is the lower level every built-in
/// operator uses:
/// ```
/// use highwater_operators::key::route;
/// use highwater_operators::state::{OperatorState, Schema, Snapshot, Stateful};
/// use highwater_operators::EventStream;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// /// A running count per key.
/// #[derive(Default)]
/// struct Counts(std::collections::HashMap<char, i64>);
/// impl OperatorState for Counts {
///     const SCHEMA: Schema = Schema::new("doc.counts", 1);
///     type Entry = (char, i64);
///     type Prepared = ();
///     fn snapshot(&self, (): (), out: &mut Snapshot) {
///         for (k, n) in &self.0 {
///             out.push(route(k), &(k, n));
///         }
///     }
/// }
///
/// let captured = timely::example(|scope| {
///     let input = EventStream::new(vec![('a', 1u64, 1i64), ('b', 2, 1), ('a', 3, 1)].to_stream(scope));
///     let stateful = Stateful::<Counts>::new("Counts", &input.scope());
///     let gated = stateful.keyed_input(&input, |u: &(char, u64, i64)| route(&u.0));
///     let mut op = stateful.builder(&input.scope());
///     let mut input = op.input(gated);
///     let (mut out, counts) = op.output::<(char, i64)>();
///     op.build(move |_caps, mut state| {
///         state.restore(|counts, _time, entries| entries.for_each(|(k, n)| {
///             counts.0.insert(k, n);
///         }));
///         move |frontiers| {
///             if !state.home() {
///                 return;
///             }
///             let mut out = out.activate();
///             input.for_each_stamp(|cap, data| {
///                 let mut session = out.session(&cap);
///                 for batch in data {
///                     for (k, t, d) in batch.drain(..) {
///                         let n = state.get().0.entry(k).or_insert(0);
///                         *n += d;
///                         session.give(((k, *n), t, 1));
///                     }
///                 }
///             });
///             state.checkpoint(highwater_operators::time::watermark_of(&frontiers[0]), ());
///         }
///     });
///     counts.inner.capture()
/// });
/// let mut out: Vec<_> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(kn, _, _)| kn).collect();
/// out.sort();
/// assert_eq!(out, vec![('a', 1), ('a', 2), ('b', 1)]);
/// ```
pub struct Stateful<S> {
    name: String,
    checkpointer: Option<Checkpointer>,
    _state: PhantomData<S>,
}

impl<S> std::fmt::Debug for Stateful<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stateful")
            .field("name", &self.name)
            .field("checkpointed", &self.checkpointer.is_some())
            .finish()
    }
}

/// An input of a stateful operator, gated (if checkpointed) and with the pact
/// the operator reads it with.
#[derive(Debug)]
pub struct GatedInput<'scope, D: 'static, P> {
    stream: EventStream<'scope, D>,
    pact: P,
}

impl<S: OperatorState> Stateful<S> {
    /// A stateful operator named `name` (its name in logs, and with its address
    /// in the dataflow, the name its state is checkpointed under), to be built
    /// in `scope`: checkpointed if the computation was configured with a
    /// checkpoint runtime ([`crate::checkpoint::configure`]).
    pub fn new(name: &str, scope: &Scope<'_, Timestamp>) -> Self {
        Stateful { name: name.to_owned(), checkpointer: Checkpointer::new(scope), _state: PhantomData }
    }

    /// Whether the job is checkpointed (its computation has a checkpoint runtime).
    pub fn is_checkpointed(&self) -> bool {
        self.checkpointer.is_some()
    }

    /// An input exchanged by `route` (the routing hash of each update's key,
    /// [`crate::key::route`]) and gated.
    pub fn keyed_input<'scope, D, F>(
        &self,
        stream: &EventStream<'scope, D>,
        route: F,
    ) -> GatedInput<'scope, D, KeyPact<F>>
    where
        D: Data,
        F: FnMut(&Update<D>) -> u64 + 'static,
    {
        let (stream, pact) = keyed_input(self.checkpointer.as_ref(), stream, route);
        GatedInput { stream, pact }
    }

    /// An input read on the worker it is on (not exchanged), gated.
    pub fn local_input<'scope, D: Data>(&self, stream: &EventStream<'scope, D>) -> GatedInput<'scope, D, Pipeline> {
        let stream = self.checkpointer.as_ref().map_or_else(|| stream.clone(), |c| c.gate(stream));
        GatedInput { stream, pact: Pipeline }
    }

    /// The operator itself, registered with the checkpoint runtime under its
    /// state's schema: add the gated inputs and the outputs, then build it.
    pub fn builder<'scope>(mut self, scope: &timely::dataflow::Scope<'scope, Timestamp>) -> StatefulBuilder<'scope, S> {
        let builder = OperatorBuilder::new(self.name.clone(), *scope);
        if let Some(c) = self.checkpointer.as_mut() {
            c.register(&self.name, &builder.operator_info().address, scope, &S::SCHEMA, S::MIGRATES_FROM);
        }
        StatefulBuilder {
            builder,
            scope: *scope,
            checkpointer: self.checkpointer,
            name: self.name,
            _state: PhantomData,
        }
    }
}

/// A stateful operator's builder: see [`Stateful`].
pub struct StatefulBuilder<'scope, S> {
    builder: OperatorBuilder<'scope, Timestamp>,
    scope: timely::dataflow::Scope<'scope, Timestamp>,
    checkpointer: Option<Checkpointer>,
    name: String,
    _state: PhantomData<S>,
}

impl<S> std::fmt::Debug for StatefulBuilder<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatefulBuilder").field("checkpointer", &self.checkpointer).finish_non_exhaustive()
    }
}

impl<'scope, S: OperatorState> StatefulBuilder<'scope, S> {
    /// Adds an input made by [`Stateful::keyed_input`] or [`Stateful::local_input`].
    pub fn input<D, P>(&mut self, input: GatedInput<'scope, D, P>) -> InputOf<D, P>
    where
        D: Data,
        P: ParallelizationContract<Timestamp, Vec<Update<D>>>,
    {
        self.builder.new_input(input.stream.inner, input.pact)
    }

    /// Adds an output of updates of `T`.
    pub fn output<T: Data>(&mut self) -> (OutputOf<T>, EventStream<'scope, T>) {
        let (output, stream) = self.builder.new_output();
        (OutputBuilder::from(output), EventStream::new(stream))
    }

    /// The operator's place in the dataflow.
    pub fn info(&self) -> OperatorInfo {
        self.builder.operator_info()
    }

    /// An activator that schedules the operator (e.g. to go on with work it
    /// split over several activations).
    pub fn activator(&self) -> Activator {
        self.scope.activator_for(self.builder.operator_info().address)
    }

    /// Builds the operator: `constructor` gets the initial capabilities (one
    /// per output) and the operator's [`Managed`] state, restores it, and
    /// returns the logic run at each activation with the input frontiers.
    pub fn build<B, L>(self, constructor: B)
    where
        B: FnOnce(Vec<Capability<Timestamp>>, Managed<S>) -> L,
        L: FnMut(&[MutableAntichain<Timestamp>]) + 'static,
    {
        let checkpointer = self.checkpointer;
        let backend = Backend::of(&self.scope);
        let name = format!("w{}-op{}", self.scope.worker().index(), self.builder.operator_info().global_id);
        // The keys its keyed states hold, in the computation's totals (a
        // gauge, summed over the workers): `<operator>.state_entries`.
        // And their size encoded, estimated about once a second: `<operator>.state_bytes`.
        let entries = Counter::new();
        crate::totals::Totals::count_in(&self.scope, &format!("{}.state_entries", self.name), &entries);
        let bytes = Counter::new();
        crate::totals::Totals::count_in(&self.scope, &format!("{}.state_bytes", self.name), &bytes);
        self.builder.build(move |capabilities| {
            let mut managed = Managed::new(checkpointer, &backend, &name);
            managed.entries = Some(entries);
            managed.bytes = Some((bytes, None));
            constructor(capabilities, managed)
        });
    }
}

/// How often [`Managed`] estimates its state's size (`<operator>.state_bytes`).
const SIZE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A stateful operator's state, with its link to the checkpoint runtime.
///
/// At each activation the operator first asks [`home`](Self::home) (while a
/// background thread snapshots the state, it is away: the operator returns,
/// and is woken up when it is back), works on [`get`](Self::get), and at the
/// end hands the input watermark to [`checkpoint`](Self::checkpoint), which
/// snapshots the state if a cut at or below the watermark is due.
pub struct Managed<S> {
    state: S,
    checkpointer: Option<Checkpointer>,
    away: Option<Away<S>>,
    /// Set while the state is away (cheap test in [`Managed::home`]).
    is_away: Cell<bool>,
    /// Whether the backend failed (reported once).
    backend_failed: bool,
    /// The directory of the operator's database, if its keyed states are in one.
    database_dir: Option<std::path::PathBuf>,
    /// Where the keys its keyed states hold are shown (set at each flush).
    entries: Option<Counter>,
    /// The gauge of their size, and when it was last estimated.
    bytes: Option<(Counter, Option<std::time::Instant>)>,
    /// The entries kept outside keyed states when it was ([`OperatorState::held`]).
    held_entries: usize,
}

impl<S> std::fmt::Debug for Managed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed").field("checkpointer", &self.checkpointer).field("away", &self.is_away.get()).finish()
    }
}

impl<S: OperatorState> Managed<S> {
    fn new(checkpointer: Option<Checkpointer>, backend: &Backend, name: &str) -> Self {
        let mut state = S::default();
        let mut opener = backend.opener(name);
        state.keyed_states(&mut |keyed| keyed.open(&mut opener));
        #[cfg(feature = "rocksdb")]
        let database_dir = opener.database_dir();
        #[cfg(not(feature = "rocksdb"))]
        let database_dir = None;
        let mut managed = Managed {
            state,
            checkpointer,
            away: None,
            is_away: Cell::new(false),
            backend_failed: false,
            database_dir,
            entries: None,
            bytes: None,
            held_entries: 0,
        };
        if let Some(reason) = opener.error() {
            // The states stay in memory; a checkpointed job fails, as on any
            // failure of its backend.
            managed.backend_failed = true;
            let error = StateError::Backend { schema: S::SCHEMA, reason: reason.to_owned() };
            match managed.checkpointer.as_ref() {
                Some(c) => c.fail(error),
                None => tracing::error!(%error, "the state backend did not open: keyed state stays in memory"),
            }
        }
        managed
    }

    /// Writes back what the activation changed in the state's
    /// [`KeyedState`](super::KeyedState)s ([`OperatorState::keyed_states`]);
    /// a backend's failure fails the job's checkpointing (reported once; a
    /// job without checkpoints logs it).
    /// The gauges: keys held at every flush, their size at most once a
    /// second (it encodes a sample) and at the `last` (the end of input).
    fn flush(&mut self, last: bool) {
        let mut failed = None;
        let mut entries = 0;
        let sizing = self.bytes.as_mut().filter(|(_, at)| last || at.is_none_or(|at| at.elapsed() >= SIZE_EVERY));
        let mut bytes = sizing.is_some().then_some(0u64);
        self.state.keyed_states(&mut |keyed| {
            if let Err(e) = keyed.flush() {
                failed.get_or_insert(e);
            }
            entries += keyed.entries();
            if let Some(total) = bytes.as_mut() {
                *total += keyed.approximate_bytes().unwrap_or(0);
            }
        });
        if let Some(total) = bytes.as_mut() {
            let (held, held_bytes) = self.state.held();
            self.held_entries = held;
            *total += held_bytes;
        }
        entries += self.held_entries;
        if let Some(gauge) = &self.entries {
            gauge.set(entries as u64);
        }
        if let (Some((gauge, at)), Some(total)) = (sizing, bytes) {
            gauge.set(total);
            *at = Some(std::time::Instant::now());
        }
        if let Some(reason) = failed {
            if !std::mem::replace(&mut self.backend_failed, true) {
                let error = StateError::Backend { schema: S::SCHEMA, reason };
                match self.checkpointer.as_ref() {
                    Some(c) => c.fail(error),
                    None => tracing::error!(%error, "operator state is not kept"),
                }
            }
        }
    }

    /// Whether the job is checkpointed.
    pub fn is_checkpointed(&self) -> bool {
        self.checkpointer.is_some()
    }

    /// On recovery, calls `restore(state, time of the cut, entries)` with this
    /// worker's entries; returns the time of the cut the job recovered from.
    /// Entries that do not decode (or migrate) fail the job's checkpointing
    /// with an error naming the operator and the schema; the rest are
    /// restored.
    ///
    /// A checkpoint that holds the operator's keyed states as database files
    /// (an incremental one) is restored through the same `restore`: the
    /// entries are read from the files ([`entries_from_database`]).
    pub fn restore(&mut self, restore: impl FnOnce(&mut S, Timestamp, &mut RestoredEntries<S>)) -> Option<Timestamp> {
        let checkpointer = self.checkpointer.as_ref()?;
        let (time, restored, databases) = checkpointer.restored()?;
        let (restored, error) = if databases.is_empty() {
            (restored, None)
        } else {
            let started = std::time::Instant::now();
            let (worker, workers) = restored.worker();
            match with_databases::<S>(restored.clone(), &databases) {
                Ok(restored) => {
                    tracing::debug!(worker, workers, databases = databases.len(), elapsed = ?started.elapsed(), "keyed state read from database checkpoints");
                    (restored, None)
                }
                Err(e) => (restored, Some(e)),
            }
        };
        let mut entries = RestoredEntries { restored, error, _state: PhantomData };
        restore(&mut self.state, time, &mut entries);
        if let Some(e) = entries.error {
            checkpointer.fail(e);
        }
        Some(time)
    }

    /// Reports that the state cannot be kept (e.g. a record that does not
    /// encode): the job's checkpointing fails with `error`.
    pub fn fail(&self, error: StateError) {
        if let Some(c) = self.checkpointer.as_ref() {
            c.fail(error);
        }
    }

    /// Whether the state is here; if a snapshot of it has come back, its
    /// entries are handed to the runtime first.
    #[inline]
    pub fn home(&mut self) -> bool {
        if !self.is_away.get() {
            return true;
        }
        let checkpointer = self.checkpointer.as_ref().expect("only a checkpointed state goes away");
        let state = &mut self.state;
        let home = checkpointer.home(&mut self.away, |back| *state = back);
        self.is_away.set(!home);
        home
    }

    /// The state (while it is [`home`](Self::home)).
    #[inline]
    pub fn get(&mut self) -> &mut S {
        debug_assert!(!self.is_away.get(), "the state is used only while it is home");
        &mut self.state
    }

    /// The state, read-only.
    #[inline]
    pub fn peek(&self) -> &S {
        &self.state
    }

    /// The cut due now that the operator's input watermark is `watermark`,
    /// if any (the operator has fired what the watermark completes).
    pub fn due(&self, watermark: Timestamp) -> bool {
        self.checkpointer.as_ref().is_some_and(|c| c.due(watermark).is_some())
    }

    /// Ends the activation: writes back what it changed in the state's
    /// backend, and snapshots the state if a cut is due at `watermark` (everything the
    /// watermark completes having been emitted), with `prepared` computed on
    /// the worker: the state moves to a background thread until it comes
    /// back ([`home`](Self::home)). The final cut is taken in place.
    pub fn checkpoint(&mut self, watermark: Timestamp, prepared: S::Prepared) {
        self.checkpoint_with(watermark, |_| prepared);
    }

    /// [`checkpoint`](Self::checkpoint), computing what the snapshot needs
    /// from the worker's side only if a cut is due.
    ///
    /// If the state's keyed states are in a database (the RocksDB backend),
    /// the state splits ([`OperatorState::split_prepared`]) and the runtime
    /// takes database files ([`StateStore::takes_database_files`](crate::checkpoint::StateStore::takes_database_files)),
    /// the snapshot is incremental: the database is checkpointed here, on
    /// the worker (its memtables written out, its files hard-linked), and
    /// only the rest of the state is serialized in the background
    /// ([`snapshot_without_keyed`]).
    pub fn checkpoint_with(&mut self, watermark: Timestamp, prepare: impl FnOnce(&S) -> S::Prepared) {
        self.flush(watermark == crate::time::END_OF_TIME);
        let Some(cut) = self.checkpointer.as_ref().and_then(|c| c.due(watermark)) else { return };
        let prepared = prepare(&self.state);
        let files = self.database_files(cut);
        let c = self.checkpointer.as_ref().expect("a cut is due");
        let taken = std::mem::take(&mut self.state);
        let away = match files {
            Some(files) => c.snapshot_away(cut, taken, Some(files), move |state: &mut S| {
                snapshot_without_keyed(state, prepared).and_then(reads_back::<S>)
            }),
            None => c.snapshot_away(cut, taken, None, move |state: &mut S| {
                let mut out = Snapshot::new(S::SCHEMA);
                state.snapshot(prepared, &mut out);
                out.finish().and_then(reads_back::<S>)
            }),
        };
        self.away = Some(away);
        // A final cut is kept in place: bring it back at once.
        self.is_away.set(true);
        if matches!(self.away, Some(Away::Kept(_))) {
            self.home();
        }
    }
}

impl<S: OperatorState> Managed<S> {
    /// A checkpoint of the operator's database for `cut`, if the snapshot
    /// is to be incremental (see [`checkpoint_with`](Self::checkpoint_with));
    /// a failure to take it fails the job's checkpointing (the snapshot is
    /// then taken whole, to open the gates).
    #[cfg(feature = "rocksdb")]
    fn database_files(&mut self, cut: crate::checkpoint::Cut) -> Option<crate::checkpoint::BackendFiles> {
        let c = self.checkpointer.as_ref()?;
        if self.backend_failed || S::split_prepared().is_none() || !c.takes_database_files() {
            return None;
        }
        let base = self.database_dir.as_ref()?;
        let dir = std::path::PathBuf::from(format!("{}.chk-{}", base.display(), cut.id));
        let _ = std::fs::remove_dir_all(&dir);
        let mut taken = None;
        self.state.keyed_states(&mut |keyed| {
            if taken.is_none() {
                taken = keyed.database_checkpoint(&dir);
            }
        });
        match taken? {
            Ok(files) => Some(files),
            Err(reason) => {
                let _ = std::fs::remove_dir_all(&dir);
                self.backend_failed = true;
                c.fail(StateError::Backend { schema: S::SCHEMA, reason });
                None
            }
        }
    }

    /// Without the `rocksdb` feature no state is in a database.
    #[cfg(not(feature = "rocksdb"))]
    fn database_files(&mut self, _cut: crate::checkpoint::Cut) -> Option<crate::checkpoint::BackendFiles> {
        let _ = &self.database_dir;
        None
    }
}

/// How many entries of a snapshot [`reads_back`] decodes: the first ones,
/// and one in [`CHECK_EVERY`] after them.
const CHECK_FIRST: usize = 8;
/// See [`CHECK_FIRST`].
const CHECK_EVERY: usize = 1024;

/// `entries`, if a sample of them decodes as `S`'s entry type: a state
/// whose type does not read back what it wrote fails the checkpoint that
/// writes it (the first), naming the type, instead of the recovery that
/// would read it. Runs on the background thread that took the snapshot.
fn reads_back<S: OperatorState>(
    entries: Vec<crate::checkpoint::Entry>,
) -> Result<Vec<crate::checkpoint::Entry>, StateError> {
    for (i, (_, bytes)) in entries.iter().enumerate() {
        if i >= CHECK_FIRST && i % CHECK_EVERY != 0 {
            continue;
        }
        if let Err(e) = crate::checkpoint::decode_in::<S::Entry>(crate::checkpoint::StateEncoding::Tagged, bytes) {
            return Err(StateError::ReadBack {
                schema: S::SCHEMA,
                type_name: std::any::type_name::<S::Entry>().to_owned(),
                reason: e.to_string(),
            });
        }
    }
    Ok(entries)
}

/// `restored` with the entries of this worker that the database
/// checkpoints in `dirs` hold for `S` ([`entries_from_database`]).
fn with_databases<S: OperatorState>(restored: Restored, dirs: &[std::path::PathBuf]) -> Result<Restored, StateError> {
    if let Some(found) = restored.schema().filter(|s| s.version != S::SCHEMA.version) {
        return Err(StateError::Backend {
            schema: S::SCHEMA,
            reason: format!(
                "the checkpoint holds the keyed state as database files of {found}; a migration reads entries \
                 only: restore it with the program that took it and take a checkpoint with --state-backend memory"
            ),
        });
    }
    if S::split_prepared().is_none() {
        return Err(StateError::Backend {
            schema: S::SCHEMA,
            reason: "the checkpoint holds the keyed state as database files, but this operator's state does not \
                     split into keyed states and the rest"
                .into(),
        });
    }
    #[cfg(feature = "rocksdb")]
    {
        let (worker, workers) = restored.worker();
        let mut restored = restored;
        for dir in dirs {
            let prepared = S::split_prepared().expect("checked above");
            // An older checkpoint's files hold its values in its encoding.
            let entries = crate::checkpoint::reading_stored(restored.encoding(), || {
                entries_from_database::<S>(dir, prepared, worker, workers)
            })?;
            restored = restored.with_chunk(crate::checkpoint::encode_chunk(&entries));
        }
        Ok(restored)
    }
    #[cfg(not(feature = "rocksdb"))]
    {
        let _ = (restored, dirs);
        Err(StateError::Backend {
            schema: S::SCHEMA,
            reason: "the checkpoint holds RocksDB database files: this build has no `rocksdb` feature".into(),
        })
    }
}

/// The entries restored for an operator on this worker
/// ([`Managed::restore`]), decoded as the state's [`OperatorState::Entry`]
/// (or migrated from the schema version they were written under).
pub struct RestoredEntries<S> {
    restored: Restored,
    error: Option<StateError>,
    _state: PhantomData<S>,
}

impl<S> std::fmt::Debug for RestoredEntries<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoredEntries").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<S: OperatorState> RestoredEntries<S> {
    /// The number of entries (of this worker).
    pub fn len(&self) -> usize {
        self.restored.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reports that the restored state is unusable (found by the operator
    /// while restoring it): the job's checkpointing fails with `error`.
    pub fn fail(&mut self, error: StateError) {
        self.error.get_or_insert(error);
    }

    /// Calls `each` with every entry; an entry that does not decode is
    /// skipped and reported (the first such error fails the checkpointing).
    pub fn for_each(&mut self, mut each: impl FnMut(S::Entry)) {
        let version = self.restored.schema().map_or(S::SCHEMA.version, |s| s.version);
        if version != S::SCHEMA.version && !S::MIGRATES_FROM.contains(&version) {
            // Refused when the dataflow was registered; nothing of it is read.
            let found = Schema { name: S::SCHEMA.name.clone(), version };
            self.error.get_or_insert(StateError::Schema { found, expected: S::SCHEMA });
            return;
        }
        let error = &mut self.error;
        let result = self.restored.try_for_each(|_route, bytes| {
            let entry = if version == S::SCHEMA.version {
                crate::checkpoint::decode::<S::Entry>(bytes)
                    .map_err(|e| StateError::Decode { schema: S::SCHEMA, reason: e.to_string() })
            } else {
                S::migrate(version, bytes)
            };
            match entry {
                Ok(entry) => each(entry),
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        });
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
    }

    /// Calls `each` with the first value of every entry (e.g. the leading
    /// field of a tuple), decoded as a `T`: to size the state before
    /// restoring it. Entries of another version than the operator's are
    /// skipped (their layout is the migration's business).
    pub fn for_each_prefix<T: serde::de::DeserializeOwned>(&mut self, mut each: impl FnMut(T)) {
        if self.restored.schema().is_some_and(|s| s.version != S::SCHEMA.version) {
            return;
        }
        let error = &mut self.error;
        let result = self.restored.try_for_each(|_route, bytes| match crate::checkpoint::decode_prefix::<T>(bytes) {
            Ok(value) => each(value),
            Err(e) => {
                error.get_or_insert(StateError::Decode { schema: S::SCHEMA, reason: e.to_string() });
            }
        });
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
    }
}

/// The entries of `state` without its keyed states: what a snapshot holds
/// besides the keyed states that an incremental checkpoint takes as the
/// backend's files ([`AnyKeyedState::database_checkpoint`](super::AnyKeyedState::database_checkpoint)).
/// Each keyed state is taken out ([`AnyKeyedState::detach`](super::AnyKeyedState::detach))
/// while `snapshot` runs, and put back.
///
/// # Errors
/// A value that does not encode.
pub fn snapshot_without_keyed<S: OperatorState>(
    state: &mut S,
    prepared: S::Prepared,
) -> Result<Vec<crate::checkpoint::Entry>, StateError> {
    let mut aside = Vec::new();
    state.keyed_states(&mut |keyed| aside.push(keyed.detach()));
    let mut out = Snapshot::new(S::SCHEMA);
    state.snapshot(prepared, &mut out);
    let mut aside = aside.into_iter();
    state.keyed_states(&mut |keyed| {
        if let Some(detached) = aside.next() {
            keyed.attach(detached);
        }
    });
    out.finish()
}

/// The entries that the database files in `dir` (a RocksDB checkpoint of an
/// operator's database) hold for `S`, of the keys whose routing hash falls
/// on `worker` of `workers`: the operator's own
/// [`snapshot`](OperatorState::snapshot) over keyed states opened on the
/// files, so that a recovery restores them, with the entries of
/// [`snapshot_without_keyed`], through the operator's usual restore, on any
/// number of workers.
///
/// # Errors
/// The files do not open, or a stored key or value does not decode.
#[cfg(feature = "rocksdb")]
pub fn entries_from_database<S: OperatorState>(
    dir: &std::path::Path,
    prepared: S::Prepared,
    worker: usize,
    workers: usize,
) -> Result<Vec<crate::checkpoint::Entry>, StateError> {
    let backend = |reason| StateError::Backend { schema: S::SCHEMA, reason };
    // Only this worker's keys are decoded (entries are routed by their keys:
    // see OperatorState::split_prepared).
    let mut opener = super::Opener::from_database_files(dir, Some((worker, workers))).map_err(backend)?;
    let mut state = S::default();
    state.keyed_states(&mut |keyed| keyed.open(&mut opener));
    let mut out = Snapshot::new(S::SCHEMA);
    state.snapshot(prepared, &mut out);
    let mut failed = None;
    // Nothing was changed: a flush writes nothing and reports what failed to read.
    state.keyed_states(&mut |keyed| {
        if let Err(e) = keyed.flush() {
            failed.get_or_insert(e);
        }
    });
    if let Some(reason) = failed {
        return Err(backend(reason));
    }
    let workers = workers.max(1) as u64;
    Ok(out.finish()?.into_iter().filter(|(route, _)| route % workers == worker as u64).collect())
}

#[cfg(all(test, feature = "rocksdb"))]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::key::route;
    use crate::state::{AnyKeyedState, KeyedState, RocksDbConfig};

    /// Counts per key in a keyed state, and records waiting per key beside it.
    #[derive(Default)]
    struct Split {
        counts: KeyedState<u32, u64>,
        waiting: Vec<(u32, u64)>,
    }

    impl OperatorState for Split {
        const SCHEMA: Schema = Schema::new("test.split", 1);
        type Entry = (u32, Option<u64>, Vec<u64>);
        type Prepared = ();
        fn keyed_states(&mut self, each: &mut dyn FnMut(&mut dyn AnyKeyedState)) {
            each(&mut self.counts);
        }
        fn snapshot(&self, (): (), out: &mut Snapshot) {
            let mut waiting: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
            for (k, v) in &self.waiting {
                waiting.entry(*k).or_default().push(*v);
            }
            self.counts.for_each(|k, n| out.push(route(k), &(k, Some(n), waiting.remove(k).unwrap_or_default())));
            for (k, w) in waiting {
                out.push(route(&k), &(k, None::<u64>, w));
            }
        }
    }

    /// What restoring `entries` gives: per key, its count and waiting records.
    fn restored(entries: &[crate::checkpoint::Entry]) -> BTreeMap<u32, (Option<u64>, Vec<u64>)> {
        let mut out: BTreeMap<u32, (Option<u64>, Vec<u64>)> = BTreeMap::new();
        for (_, bytes) in entries {
            let (k, n, mut w): (u32, Option<u64>, Vec<u64>) = crate::checkpoint::decode(bytes).unwrap();
            let slot = out.entry(k).or_default();
            slot.0 = slot.0.or(n);
            slot.1.append(&mut w);
            slot.1.sort_unstable();
        }
        out
    }

    /// The database's files plus the snapshot without the keyed state restore
    /// what the whole snapshot restores, on one worker and split over three.
    #[test]
    fn database_files_and_the_rest_restore_the_whole_snapshot() {
        let dir = std::env::temp_dir().join(format!("highwater-split-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opener = crate::state::Backend::RocksDb(RocksDbConfig::new(dir.join("work"))).opener("split");
        let mut state = Split::default();
        state.keyed_states(&mut |keyed| keyed.open(&mut opener));
        for k in 0..5_000u32 {
            state.counts.insert(k, u64::from(k) * 3);
        }
        state.counts.flush().unwrap();
        state.waiting = (4_990..5_010u32).map(|k| (k, u64::from(k) + 1)).collect();
        let mut whole = Snapshot::new(Split::SCHEMA);
        state.snapshot((), &mut whole);
        let whole = whole.finish().unwrap();

        let files = state.counts.database_checkpoint(&dir.join("chk")).expect("on RocksDB").unwrap();
        assert!(files.files.iter().any(|(name, _)| name.ends_with(".sst")), "{files:?}");
        let rest = snapshot_without_keyed(&mut state, ()).unwrap();
        assert_eq!(rest.len(), 20, "the waiting records only");
        assert_eq!(state.counts.len(), 5_000, "the keyed state is back");

        for workers in [1, 3] {
            for worker in 0..workers {
                let mine = |e: &crate::checkpoint::Entry| e.0 % workers as u64 == worker as u64;
                let expected: Vec<_> = whole.iter().filter(|e| mine(e)).cloned().collect();
                let mut split = entries_from_database::<Split>(&files.dir, (), worker, workers).unwrap();
                split.extend(rest.iter().filter(|e| mine(e)).cloned());
                assert_eq!(restored(&split), restored(&expected), "worker {worker} of {workers}");
                assert!(!restored(&expected).is_empty());
            }
        }
        assert!(entries_from_database::<Split>(&dir.join("missing"), (), 0, 1).is_err());
        drop(state);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
