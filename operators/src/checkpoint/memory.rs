//! An in-memory [`StateStore`] and a recovery check built on it: for testing
//! that an operator's checkpoint holds everything it needs, without the
//! runtime's files and threads.
//!
//! [`check_recovery`] runs a dataflow twice over the same input: once
//! uninterrupted, and once with a checkpoint at a cut `T`, a "crash" right
//! after it, and a restart from the checkpoint (with possibly another number
//! of workers) fed only the input from `T` on, as a rewound source would. The
//! recovered output is what an exactly-once sink commits: the first run's
//! updates at times before `T` and the second run's at `T` or later.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::core::input::Handle as InputHandle;
use timely::dataflow::operators::core::{Input as _, Inspect};

use super::{encode_chunk, BackendFiles, CheckpointId, Cut, Entry, Restored, Schema, StateError, StateStore};
use crate::key::Data;
use crate::state::Backend;
use crate::stream::{EventStream, Update};
use crate::time::{Diff, Timestamp};

/// What the workers of one in-memory job share.
#[derive(Default)]
struct Shared {
    /// Begun cuts, oldest first.
    cuts: Vec<Cut>,
    /// Checkpointed operators by name, with the workers they run on.
    registered: BTreeMap<String, BTreeSet<usize>>,
    /// The schema of each checkpointed operator's state.
    schemas: BTreeMap<String, Schema>,
    /// What went wrong with operators' state (restoring or taking it).
    failures: Vec<String>,
    /// Stateful operators that cannot be checkpointed.
    unsupported: BTreeSet<String>,
    /// Submitted entries by cut, operator and worker.
    submitted: BTreeMap<CheckpointId, BTreeMap<String, BTreeMap<usize, Vec<Entry>>>>,
    /// Submitted database checkpoints (incremental snapshots) by cut, operator and worker.
    databases: BTreeMap<CheckpointId, BTreeMap<String, BTreeMap<usize, Arc<DatabaseDir>>>>,
    /// Operators' wakers.
    wakers: Vec<Arc<dyn Fn() + Send + Sync>>,
    /// A cut begun on worker 0 that the other workers do not see yet, as if
    /// they were another process still waiting for its announcement.
    unannounced: Option<Cut>,
}

/// A checkpoint held in memory: its time and every operator's entries.
#[derive(Clone, Debug, Default)]
pub struct MemoryCheckpoint {
    /// The cut's time.
    pub time: Timestamp,
    /// Every operator's entries (from all workers).
    pub entries: BTreeMap<String, Vec<Entry>>,
    /// The schema each operator's entries were written under.
    pub schemas: BTreeMap<String, Schema>,
    /// The database checkpoints of operators whose snapshots were
    /// incremental (their keyed states on RocksDB), one per worker.
    pub databases: BTreeMap<String, Vec<Arc<DatabaseDir>>>,
}

impl MemoryCheckpoint {
    /// The number of entries of the operators whose names start with
    /// `prefix`: those handed over as entries, and the keys of their keyed
    /// states handed over as database files (an incremental snapshot).
    pub fn entries_of(&self, prefix: &str) -> usize {
        let entries: usize = self.entries.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, e)| e.len()).sum();
        let databases = self.databases.iter().filter(|(n, _)| n.starts_with(prefix)).flat_map(|(_, dirs)| dirs);
        entries + databases.map(|dir| database_keys(&dir.0)).sum::<usize>()
    }
}

/// The keys in the database checkpoint in `dir`.
#[cfg(feature = "rocksdb")]
fn database_keys(dir: &std::path::Path) -> usize {
    crate::state::RocksDbConfig::new(dir).open_read_only(dir, None).map_or(0, |db| db.count_keys())
}

/// Without the `rocksdb` feature there are no database checkpoints.
#[cfg(not(feature = "rocksdb"))]
fn database_keys(_dir: &std::path::Path) -> usize {
    0
}

/// A database checkpoint an operator handed over ([`StateStore::submit`]
/// with files), kept on disk while a [`MemoryCheckpoint`] refers to it and
/// removed with the last reference.
#[derive(Debug)]
pub struct DatabaseDir(pub std::path::PathBuf);

impl Drop for DatabaseDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An in-memory checkpoint store shared by the workers of one job.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
    workers: usize,
    restored: Option<Arc<MemoryCheckpoint>>,
    /// Restored entries encoded as chunks, by operator.
    chunks: Arc<HashMap<String, Vec<Arc<Vec<u8>>>>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("workers", &self.workers).finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store for a job of `workers` workers, restored from `restored` if given.
    pub fn new(workers: usize, restored: Option<MemoryCheckpoint>) -> Self {
        let chunks = restored
            .as_ref()
            .map(|r| {
                r.entries.iter().map(|(name, entries)| (name.clone(), vec![Arc::new(encode_chunk(entries))])).collect()
            })
            .unwrap_or_default();
        MemoryStore { shared: Arc::default(), workers, restored: restored.map(Arc::new), chunks: Arc::new(chunks) }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Begins checkpoint `id` at `time` on worker 0 only: the other workers
    /// see it once [`announce`](Self::announce)d, and meanwhile see the
    /// processes choosing a cut at `time` ([`StateStore::choosing`]), as the
    /// processes of a job do while the coordinator's announcement travels.
    pub fn begin_on_first(&self, id: CheckpointId, time: Timestamp) {
        self.lock().unannounced = Some(Cut { id, time });
        self.begin(id, time);
    }

    /// Shows the cut begun by [`begin_on_first`](Self::begin_on_first) to
    /// every worker and wakes the operators.
    pub fn announce(&self) {
        let wakers = {
            let mut shared = self.lock();
            shared.unannounced = None;
            shared.wakers.clone()
        };
        for wake in wakers {
            wake();
        }
    }

    /// Begins checkpoint `id` at `time` and wakes the operators.
    pub fn begin(&self, id: CheckpointId, time: Timestamp) {
        let wakers = {
            let mut shared = self.lock();
            shared.cuts.push(Cut { id, time });
            shared.wakers.clone()
        };
        for wake in wakers {
            wake();
        }
    }

    /// The store as worker `worker` sees it.
    pub fn worker(&self, worker: usize) -> WorkerView {
        WorkerView { store: self.clone(), worker }
    }

    /// Configures a timely computation to be built with this store (see
    /// [`super::configure`]).
    pub fn configure(&self, config: &mut timely::Config) {
        super::configure(&mut config.worker, Arc::new(self.clone()));
    }

    /// Whether every registered operator has submitted its state for `id` on every worker.
    pub fn complete(&self, id: CheckpointId) -> bool {
        let shared = self.lock();
        let submitted = shared.submitted.get(&id);
        shared
            .registered
            .keys()
            .all(|name| submitted.and_then(|s| s.get(name)).is_some_and(|by_worker| by_worker.len() == self.workers))
    }

    /// The checkpoint `id` as taken, if complete.
    pub fn checkpoint(&self, id: CheckpointId) -> Option<MemoryCheckpoint> {
        if !self.complete(id) {
            return None;
        }
        let shared = self.lock();
        let time = shared.cuts.iter().find(|c| c.id == id)?.time;
        let entries = shared
            .submitted
            .get(&id)
            .map(|by_operator| {
                by_operator
                    .iter()
                    .map(|(name, by_worker)| (name.clone(), by_worker.values().flatten().cloned().collect()))
                    .collect()
            })
            .unwrap_or_default();
        let schemas = shared.schemas.clone();
        let databases = shared
            .databases
            .get(&id)
            .map(|by_operator| {
                by_operator
                    .iter()
                    .map(|(name, by_worker)| (name.clone(), by_worker.values().cloned().collect()))
                    .collect()
            })
            .unwrap_or_default();
        Some(MemoryCheckpoint { time, entries, schemas, databases })
    }

    /// The operators registered as checkpointable.
    pub fn registered(&self) -> Vec<String> {
        self.lock().registered.keys().cloned().collect()
    }

    /// The stateful operators that declared they cannot be checkpointed.
    pub fn unsupported(&self) -> Vec<String> {
        self.lock().unsupported.iter().cloned().collect()
    }

    /// What went wrong with operators' state, as `operator: error` (a
    /// checkpoint of another schema, an entry that does not decode).
    pub fn failures(&self) -> Vec<String> {
        self.lock().failures.clone()
    }
}

/// One worker's view of a [`MemoryStore`].
#[derive(Debug)]
pub struct WorkerView {
    store: MemoryStore,
    worker: usize,
}

impl StateStore for WorkerView {
    fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut> {
        let shared = self.store.lock();
        let hidden = shared.unannounced.filter(|_| self.worker != 0);
        shared.cuts.iter().filter(|c| hidden != Some(**c)).find(|c| done.is_none_or(|d| c.id > d)).copied()
    }

    fn choosing(&self) -> Option<Timestamp> {
        self.store.lock().unannounced.filter(|_| self.worker != 0).map(|c| c.time)
    }

    fn register(&self, operator: &str, schema: &Schema, migrates_from: &[u32]) {
        let mut shared = self.store.lock();
        shared.registered.entry(operator.to_owned()).or_default().insert(self.worker);
        shared.schemas.insert(operator.to_owned(), schema.clone());
        let found = self.store.restored.as_ref().and_then(|r| r.schemas.get(operator));
        if let Some(found) = found {
            let migrates = found.name == schema.name && migrates_from.contains(&found.version);
            if found != schema && !migrates {
                let error = StateError::Schema { found: found.clone(), expected: schema.clone() };
                shared.failures.push(format!("{operator}: {error}"));
            }
        }
    }

    fn fail(&self, operator: &str, error: StateError) {
        self.store.lock().failures.push(format!("{operator}: {error}"));
    }

    fn unsupported(&self, operator: &str) {
        self.store.lock().unsupported.insert(operator.to_owned());
    }

    fn restored(&self, operator: &str) -> Option<Restored> {
        self.store.restored.as_ref()?;
        let chunks = self.store.chunks.get(operator).cloned().unwrap_or_default();
        let schema = self.store.restored.as_ref().and_then(|r| r.schemas.get(operator)).cloned();
        Some(Restored::new(chunks, self.worker, self.store.workers).with_schema(schema))
    }

    fn restored_time(&self) -> Option<Timestamp> {
        self.store.restored.as_ref().map(|r| r.time)
    }

    fn submit(&self, operator: &str, cut: Cut, entries: Vec<Entry>, files: Option<BackendFiles>, _pause: Duration) {
        let mut shared = self.store.lock();
        let by_worker = shared.submitted.entry(cut.id).or_default().entry(operator.to_owned()).or_default();
        by_worker.insert(self.worker, entries);
        if let Some(files) = files {
            let by_worker = shared.databases.entry(cut.id).or_default().entry(operator.to_owned()).or_default();
            by_worker.insert(self.worker, Arc::new(DatabaseDir(files.dir)));
        }
    }

    fn takes_database_files(&self) -> bool {
        true
    }

    fn restored_databases(&self, operator: &str) -> Vec<std::path::PathBuf> {
        let Some(restored) = self.store.restored.as_ref() else { return Vec::new() };
        restored.databases.get(operator).map_or_else(Vec::new, |dirs| dirs.iter().map(|d| d.0.clone()).collect())
    }

    fn on_cut(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.store.lock().wakers.push(Arc::from(wake));
    }
}

/// One input update: `(record, event time, diff, arrival time)`; the
/// arrival time is the timely time it travels at.
pub type Input<D> = (D, Timestamp, Diff, Timestamp);

/// A consolidated output: `(record, timely time) → diff`, zeros removed.
pub type Output<O> = BTreeMap<(O, Timestamp), Diff>;

/// The outputs of [`check_recovery`]'s runs.
#[derive(Debug)]
pub struct Recovery<O: Ord> {
    /// The uninterrupted run's output.
    pub expected: Output<O>,
    /// The committed output of the run checkpointed at the cut and recovered from it.
    pub recovered: Output<O>,
    /// The entries of the checkpoint, by operator.
    pub checkpoint: MemoryCheckpoint,
    /// The operators that declared themselves not checkpointable.
    pub unsupported: Vec<String>,
    /// What went wrong with operators' state in either run (see [`MemoryStore::failures`]).
    pub failures: Vec<String>,
}

/// Runs `build` over `input` uninterrupted on `before` workers, then with a
/// checkpoint at `cut` on `before` workers and a recovery from it on `after`
/// workers fed the input that arrives at `cut` or later; returns both outputs.
///
/// The checkpoint begins while the dataflow runs, as a source would begin it:
/// when the input has been sent up to `cut` and the next update is at or
/// after it (the other workers' operators meanwhile run on).
///
/// # Panics
/// If a worker panics, or the checkpoint does not complete.
///
/// # Examples
/// ```
/// use highwater_operators::checkpoint::memory::check_recovery;
/// use highwater_operators::prelude::*;
///
/// let input: Vec<(char, u64, i64, u64)> =
///     (0..200u64).map(|i| ((b'a' + (i % 3) as u8) as char, i * 100, 1, i * 100)).collect();
/// // Cut in the middle of the window [7 s, 8 s): its count is in the checkpoint.
/// let run = check_recovery(&input, 7_450, 1, 2, |events| {
///     events.window(Tumbling::of(1.secs())).key_by(|c: &char| *c).aggregate(Count).results
/// });
/// assert!(run.unsupported.is_empty());
/// assert!(run.checkpoint.entries.values().any(|e| !e.is_empty()));
/// assert_eq!(run.recovered, run.expected);
/// ```
pub fn check_recovery<D, O, B>(input: &[Input<D>], cut: Timestamp, before: usize, after: usize, build: B) -> Recovery<O>
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    recovery(input, cut, before, after, build, false, None)
}

/// As [`check_recovery`], with the state on backend `from` in the
/// uninterrupted and the checkpointed run, and on `to` in the recovered one
/// (e.g. a job moved from memory to an encoded store), whatever the
/// `HIGHWATER_STATE_BACKEND` environment variable says.
///
/// # Panics
/// As [`check_recovery`].
pub fn check_recovery_across<D, O, B>(
    input: &[Input<D>],
    cut: Timestamp,
    (before, after): (usize, usize),
    (from, to): (Backend, Backend),
    build: B,
) -> Recovery<O>
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    recovery(input, cut, before, after, build, false, Some((from, to)))
}

/// As [`check_recovery`], with the cut seen late by the workers other than
/// worker 0 (which sends the input), as by the other processes of a job: they
/// learn of it only after all the input has been sent, updates past the cut
/// included, and until then see the processes choosing a cut.
///
/// # Panics
/// As [`check_recovery`].
pub fn check_recovery_announced_late<D, O, B>(
    input: &[Input<D>],
    cut: Timestamp,
    before: usize,
    after: usize,
    build: B,
) -> Recovery<O>
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    recovery(input, cut, before, after, build, true, None)
}

fn recovery<D, O, B>(
    input: &[Input<D>],
    cut: Timestamp,
    before: usize,
    after: usize,
    build: B,
    late: bool,
    backends: Option<(Backend, Backend)>,
) -> Recovery<O>
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    let input: Arc<Vec<Input<D>>> = Arc::new(input.to_vec());
    let build = Arc::new(build);
    let (from, to) = backends.map_or((None, None), |(from, to)| (Some(from), Some(to)));
    let expected = run_from(&input, before, None, &build, |_| true, 0, from.clone());
    // Checkpointed at the cut, then crashed: only output before the cut is committed.
    let store = MemoryStore::new(before, None);
    let first = run_from(&input, before, Some((store.clone(), Some((cut, late)))), &build, move |t| t < cut, 0, from);
    let checkpoint = store.checkpoint(1).expect("the checkpoint completes once the input is closed");
    let unsupported = store.unsupported();
    // Recovered: the state as of the cut, and the input from the cut on.
    let (second, mut failures) = recover_with(&checkpoint, &input, cut, after, &build, to);
    failures.extend(store.failures());
    let mut recovered = first;
    for (key, diff) in second {
        *recovered.entry(key).or_insert(0) += diff;
    }
    recovered.retain(|_, d| *d != 0);
    Recovery { expected, recovered, checkpoint, unsupported, failures }
}

/// Runs `build` on `workers` workers recovered from `checkpoint` (taken at
/// `cut`), fed the updates of `input` that arrive at `cut` or later; returns
/// its output at `cut` or later and what went wrong with restoring the
/// operators' state (see [`MemoryStore::failures`]): e.g. for a program whose
/// operators' state changed schema since the checkpoint was taken.
pub fn recover_from<D, O, B>(
    checkpoint: &MemoryCheckpoint,
    input: &[Input<D>],
    cut: Timestamp,
    workers: usize,
    build: B,
) -> (Output<O>, Vec<String>)
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    recover_with(checkpoint, input, cut, workers, &Arc::new(build), None)
}

fn recover_with<D, O, B>(
    checkpoint: &MemoryCheckpoint,
    input: &[Input<D>],
    cut: Timestamp,
    workers: usize,
    build: &Arc<B>,
    backend: Option<Backend>,
) -> (Output<O>, Vec<String>)
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    let rewound: Arc<Vec<Input<D>>> = Arc::new(input.iter().filter(|u| u.3 >= cut).cloned().collect());
    let restored = MemoryStore::new(workers, Some(checkpoint.clone()));
    let output = run_from(&rewound, workers, Some((restored.clone(), None)), build, move |t| t >= cut, cut, backend);
    (output, restored.failures())
}

impl super::StateRuntime for MemoryStore {
    fn worker(&self, index: usize) -> Rc<dyn StateStore> {
        Rc::new(MemoryStore::worker(self, index))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Runs `build` over `input` from `start` on, built with `store` (and its
/// state on `backend`, if given); with
/// `Some((cut, late))` beside it, worker 0 (which sends the input) begins
/// checkpoint 1 at `cut` before it sends the first update that arrives at or
/// after it; `late`, for itself only, announcing it to the others once it has
/// sent all the input.
fn run_from<D, O, B>(
    input: &Arc<Vec<Input<D>>>,
    workers: usize,
    store: Option<(MemoryStore, Option<(Timestamp, bool)>)>,
    build: &Arc<B>,
    keep: impl Fn(Timestamp) -> bool + Send + Sync + 'static,
    start: Timestamp,
    backend: Option<Backend>,
) -> Output<O>
where
    D: Data + Send + Sync,
    O: Data + Ord + Send,
    B: for<'s> Fn(&EventStream<'s, D>) -> EventStream<'s, O> + Send + Sync + 'static,
{
    let collected: Arc<Mutex<Output<O>>> = Arc::default();
    let keep = Arc::new(keep);
    let (input, build, out) = (Arc::clone(input), Arc::clone(build), Arc::clone(&collected));
    let mut config = timely::Config::process(workers);
    if let Some((s, _)) = store.as_ref() {
        s.configure(&mut config);
    }
    if let Some(backend) = backend {
        backend.configure(&mut config.worker);
    }
    let guards = timely::execute(config, move |worker| {
        let index = worker.index();
        // Worker 0 sends the input, and begins the checkpoint if there is one.
        let checkpoint = store.as_ref().filter(|_| index == 0).and_then(|(s, cut)| cut.map(|(c, late)| (s, c, late)));
        let mut handle: InputHandle<Timestamp, CapacityContainerBuilder<Vec<Update<D>>>> = InputHandle::new();
        let (out, keep) = (Arc::clone(&out), Arc::clone(&keep));
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let events = EventStream::new(scope.input_from(&mut handle));
            build(&events).inner.inspect_core(move |event| {
                if let Ok((stamp, data)) = event {
                    let time = *stamp.iter().min().expect("highwater messages travel under a non-empty stamp");
                    if keep(time) {
                        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
                        for (record, _event_time, diff) in data.iter().cloned() {
                            *out.entry((record, time)).or_insert(0) += diff;
                        }
                    }
                }
            });
        });
        handle.advance_to(start);
        if index == 0 {
            let mut sorted: Vec<&Input<D>> = input.iter().collect();
            sorted.sort_by_key(|u| u.3);
            let mut begun = false;
            let mut begin = || {
                if let Some((store, cut, late)) = checkpoint.filter(|_| !std::mem::replace(&mut begun, true)) {
                    if late {
                        store.begin_on_first(1, cut);
                    } else {
                        store.begin(1, cut);
                    }
                }
            };
            for (record, time, diff, arrival) in sorted {
                if checkpoint.is_some_and(|(_, cut, _)| *arrival >= cut) {
                    begin();
                }
                if *arrival > *handle.time() {
                    handle.advance_to(*arrival);
                    worker.step();
                }
                handle.send((record.clone(), *time, *diff));
            }
            // No update at or after the cut: begun once all is sent.
            begin();
            if let Some((store, _, true)) = checkpoint {
                // The others run on meanwhile, reading what was sent past the cut.
                handle.advance_to(*handle.time() + 1);
                let until = std::time::Instant::now() + Duration::from_millis(50);
                while std::time::Instant::now() < until {
                    worker.step();
                }
                store.announce();
            }
        }
        handle.close();
    })
    .expect("timely starts");
    for result in guards.join() {
        result.expect("a worker of the recovery check failed");
    }
    let mut out = Arc::try_unwrap(collected)
        .unwrap_or_else(|_| panic!("workers are done"))
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    out.retain(|_, d| *d != 0);
    out
}
