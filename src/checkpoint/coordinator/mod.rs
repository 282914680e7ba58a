//! The process-wide checkpoint coordinator: begins cuts, collects every
//! worker's share, writes checkpoints on a background thread, and restores.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::operators::checkpoint::{CheckpointId, Cut, Entry, Restored, Schema, StateError, StateRuntime, StateStore};
use crate::operators::{Timestamp, END_OF_TIME};

use super::cluster::{self, Membership, Message, Peer, ProcessPart};
use super::manifest::{Manifest, PartitionState, ShardInfo, FORMAT_VERSION};
use super::store::{open_store, CheckpointStore};
use super::{kill, shard, CheckpointConfig, CheckpointError};

mod probe;
mod restore;
mod sink;

pub use probe::{probe, DataflowProbe};
pub use restore::{check, latest_usable};
use restore::{choose_checkpoint, load_entries, RestoredState};
pub use sink::{SinkCommitter, SinkSubmission};

/// One checkpoint being collected from the workers.
#[derive(Debug)]
struct Collecting {
    cut: Cut,
    operators: Vec<(usize, String, Vec<Entry>)>,
    sources: BTreeMap<String, Vec<PartitionState>>,
    source_parts: usize,
    sinks: Vec<(usize, SinkSubmission)>,
    begun: Instant,
}

#[derive(Debug, Default)]
struct State {
    built: BTreeSet<usize>,
    operators: BTreeSet<(usize, String)>,
    /// The schema of each checkpointed operator's state.
    schemas: BTreeMap<String, crate::operators::checkpoint::Schema>,
    unsupported: BTreeSet<String>,
    sources: BTreeSet<(String, usize)>,
    finished: BTreeSet<(String, usize)>,
    sinks: BTreeSet<(String, usize)>,
    committers: BTreeMap<String, Arc<dyn SinkCommitter>>,
    max_published: Timestamp,
    next_id: CheckpointId,
    announced: Vec<Cut>,
    final_announced: bool,
    collecting: BTreeMap<CheckpointId, Collecting>,
    in_flight: usize,
    written: Vec<CheckpointId>,
    final_written: bool,
    error: Option<String>,
    // Across processes (see `cluster`):
    /// Sources may not publish times above `max_published` (a cut is being chosen).
    frozen: bool,
    /// The coordinator's round choosing the next cut: its id, start, and the
    /// processes' answers.
    prepared: Option<(CheckpointId, Instant, BTreeMap<usize, Timestamp>)>,
    /// Followers whose workers have built their dataflows (coordinator).
    followers_built: BTreeSet<usize>,
    /// Followers whose sources have all ended (coordinator).
    followers_finished: BTreeSet<usize>,
    /// This process's sources have all ended (and it said so).
    sources_finished: bool,
}

/// Work for the checkpoint writer thread.
#[derive(Debug)]
enum Job {
    /// This process's workers' shares of a cut.
    Local(Collecting),
    /// Another process's part of a checkpoint (coordinator).
    Remote { process: usize, id: CheckpointId, part: ProcessPart },
}

#[derive(Debug)]
struct Inner {
    config: CheckpointConfig,
    store: Arc<dyn CheckpointStore>,
    /// This process's workers.
    workers: usize,
    /// The job's workers in all processes.
    peers: usize,
    /// The job's index of this process's first worker.
    first_worker: usize,
    /// This process's place in a job of several processes.
    membership: Option<Membership>,
    /// The other processes: the followers (coordinator), or the coordinator.
    links: Vec<Peer>,
    restored: Option<RestoredState>,
    state: Mutex<State>,
    /// Signalled when `frozen`, `in_flight` or `error` change.
    changed: Condvar,
    /// One more than the id of the latest cut begun (0: none), for cheap checks.
    latest: AtomicU64,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Schedule the checkpointed operators and gates of every worker.
    wakers: Wakers,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stop: AtomicBool,
    /// Given when a process is gone before the workers started, so that the
    /// processes' connection gives up (see [`Checkpoints::startup_abort`]).
    startup: crate::cluster::Abort,
}

/// Callbacks that schedule operators, called when cuts begin or are abandoned.
#[derive(Default)]
struct Wakers(Mutex<Vec<Box<dyn Fn() + Send + Sync>>>);

impl std::fmt::Debug for Wakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wakers")
    }
}

/// The checkpointing of one job in this process; clones share it.
#[derive(Clone, Debug)]
pub struct Checkpoints(Arc<Inner>);

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Checkpoints {
    /// Starts checkpointing a job of `workers` workers (threads of this
    /// process). With `config.recover`, restores the newest usable checkpoint
    /// (if the store holds none, the job starts afresh); without it, the store
    /// must not hold checkpoints already.
    pub fn open(config: CheckpointConfig, workers: usize) -> Result<Self, CheckpointError> {
        Self::start(config, workers, None)
    }

    /// Starts checkpointing the part of a job that runs in this process, one
    /// of several (see [`Membership`]): process 0 coordinates and chooses the
    /// checkpoint to recover from, the others connect to it. Blocks until
    /// every process has joined (or `membership.connect_timeout` has passed).
    pub fn open_member(config: CheckpointConfig, membership: Membership) -> Result<Self, CheckpointError> {
        if membership.processes <= 1 {
            return Self::open(config, membership.workers_per_process);
        }
        let workers = membership.workers_per_process;
        Self::start(config, workers, Some(membership))
    }

    fn start(
        config: CheckpointConfig,
        workers: usize,
        membership: Option<Membership>,
    ) -> Result<Self, CheckpointError> {
        if config.keep == 0 {
            return Err(CheckpointError::Config("keep must be at least 1".into()));
        }
        if config.interval.is_zero() {
            return Err(CheckpointError::Config("the interval must be positive".into()));
        }
        let store: Arc<dyn CheckpointStore> = Arc::from(open_store(&config.location)?);
        let leads = membership.as_ref().is_none_or(Membership::leads);
        let mut links = Vec::new();
        let mut readers = Vec::new();
        let manifest = if leads {
            if let Some(m) = membership.as_ref() {
                for (peer, reader) in cluster::accept(m)? {
                    readers.push((peer.process, reader));
                    links.push(peer);
                }
            }
            let chosen = choose_checkpoint(&config, &*store);
            let answer = match &chosen {
                Ok(manifest) => Message::Welcome { restored: manifest.as_ref().map(|m| m.id) },
                Err(e) => Message::Failed { error: e.to_string() },
            };
            for peer in &links {
                let _ = peer.send(&answer);
            }
            chosen?
        } else {
            let m = membership.as_ref().expect("a follower has a membership");
            let (peer, mut reader) = cluster::connect(m)?;
            let what = format!("checkpoint coordinator {}", m.coordinator);
            let answer =
                cluster::receive(&mut reader).map_err(|source| CheckpointError::Io { what: what.clone(), source })?;
            let manifest = match answer {
                Some(Message::Welcome { restored: Some(id) }) => {
                    let manifest = check(&*store, id)?;
                    tracing::info!(id = manifest.id, time = manifest.time, "recovering from checkpoint");
                    Some(manifest)
                }
                Some(Message::Welcome { restored: None }) => None,
                Some(Message::Failed { error }) => return Err(CheckpointError::Failed(format!("process 0: {error}"))),
                other => return Err(CheckpointError::Config(format!("{what}: expected a welcome, got {other:?}"))),
            };
            readers.push((0, reader));
            links.push(peer);
            manifest
        };
        let mut restored = None;
        let mut next_id = 1;
        if let Some(manifest) = manifest {
            let loading = Instant::now();
            let entries = load_entries(&*store, &manifest)?;
            let count: u64 = entries.values().flatten().map(|c| shard::chunk_entries(c)).sum();
            tracing::info!(entries = count, elapsed = ?loading.elapsed(), "checkpoint state loaded");
            next_id = manifest.id + 1;
            restored = Some(RestoredState { manifest, entries });
        }
        if leads {
            // Others' staging directories are their own (shards are named by worker).
            let _ = std::fs::remove_dir_all(store.staging());
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let restored_time = restored.as_ref().map_or(0, |r: &RestoredState| r.manifest.time);
        let peers = membership.as_ref().map_or(workers, Membership::peers);
        let first_worker = membership.as_ref().map_or(0, Membership::first_worker);
        let inner = Arc::new(Inner {
            config,
            store,
            workers,
            peers,
            first_worker,
            membership,
            links,
            restored,
            // Cuts lie above the restored time, where the sources resume.
            state: Mutex::new(State { next_id, max_published: restored_time, ..State::default() }),
            changed: Condvar::new(),
            wakers: Wakers::default(),
            latest: AtomicU64::new(0),
            jobs: Mutex::new(Some(tx.clone())),
            threads: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            startup: crate::cluster::Abort::new(),
        });
        for (process, reader) in readers {
            let (inner, tx) = (Arc::clone(&inner), tx.clone());
            std::thread::Builder::new()
                .name(format!("highwater-checkpoint-link-{process}"))
                .spawn(move || listen(&inner, process, reader, &tx))
                .map_err(|e| CheckpointError::Io { what: "starting a checkpoint link".into(), source: e })?;
        }
        drop(tx);
        let writer = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("highwater-checkpoint-writer".into())
                .spawn(move || write_loop(&inner, rx))
                .map_err(|e| CheckpointError::Io { what: "starting the checkpoint writer".into(), source: e })?
        };
        let mut threads = vec![writer];
        if leads {
            let inner = Arc::clone(&inner);
            let timer = std::thread::Builder::new()
                .name("highwater-checkpoint-timer".into())
                .spawn(move || time_loop(&inner))
                .map_err(|e| CheckpointError::Io { what: "starting the checkpoint timer".into(), source: e })?;
            threads.push(timer);
        }
        inner.threads.lock().unwrap_or_else(|p| p.into_inner()).extend(threads);
        Ok(Checkpoints(inner))
    }

    /// The signal that gives up the processes' connection when a process is
    /// gone before the job started: pass it to
    /// [`cluster::execute_abortable`](crate::cluster::execute_abortable).
    pub fn startup_abort(&self) -> crate::cluster::Abort {
        self.0.startup.clone()
    }

    /// Fails the job's checkpointing with `error` (e.g. a source failed for
    /// good): no checkpoint begun from now on is written, no sink commits
    /// again, and [`finish`](Self::finish) reports the error.
    pub fn fail_job(&self, error: impl Into<String>) {
        let mut state = lock(&self.0.state);
        fail(&self.0, &mut state, error.into());
    }

    /// The store's location, for messages.
    pub fn location(&self) -> String {
        self.0.store.describe()
    }

    /// The manifest of the checkpoint the job recovered from, if any.
    pub fn restored(&self) -> Option<&Manifest> {
        self.0.restored.as_ref().map(|r| &r.manifest)
    }

    /// The time of the checkpoint the job recovered from, if any.
    pub fn restored_time(&self) -> Option<Timestamp> {
        self.restored().map(|m| m.time)
    }

    /// The restored state of `source`'s partitions, if the job recovered.
    pub fn restored_partitions(&self, source: &str) -> Option<&[PartitionState]> {
        self.restored().and_then(|m| m.sources.get(source)).map(|v| v.as_slice())
    }

    /// Configures the timely computation of this job (started with
    /// `config`) to be built with these checkpoints: its stateful operators,
    /// sources and sinks find them through their scope (see
    /// [`highwater_operators::checkpoint::configure`] and
    /// [`of`](Self::of)). Call [`built`](Self::built) once a worker's
    /// dataflows are built.
    pub fn configure(&self, config: &mut timely::Config) {
        crate::operators::checkpoint::configure(&mut config.worker, Arc::new(self.clone()));
    }

    /// The checkpoints the computation of `scope` was configured with
    /// ([`configure`](Self::configure)), if any.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<Checkpoints> {
        let runtime = crate::operators::checkpoint::runtime(scope)?;
        runtime.as_any().downcast_ref::<Checkpoints>().cloned()
    }

    /// The per-worker [`StateStore`] the operators of `worker` use.
    pub fn worker(&self, worker: usize) -> WorkerStore {
        WorkerStore { checkpoints: self.clone(), worker }
    }

    /// Declares that `worker` has built its dataflow: checks that its
    /// computation was configured with these checkpoints
    /// ([`configure`](Self::configure)), that every stateful operator can be
    /// checkpointed and that a restored checkpoint was taken by the same
    /// dataflow. Checkpoints begin once every worker is built.
    pub fn built(&self, worker: &timely::worker::Worker) -> Result<(), CheckpointError> {
        let configured = crate::operators::checkpoint::runtime_of(worker.config())
            .and_then(|r| r.as_any().downcast_ref::<Checkpoints>().map(|c| Arc::ptr_eq(&c.0, &self.0)));
        if configured != Some(true) {
            let error = CheckpointError::NotConfigured("the job's dataflow".to_owned());
            fail(&self.0, &mut lock(&self.0.state), error.to_string());
            return Err(error);
        }
        let worker = worker.index();
        let mut state = lock(&self.0.state);
        // An operator's state could not be restored (another schema, an
        // entry that does not decode): the job does not start.
        if let Some(error) = state.error.clone() {
            return Err(CheckpointError::Failed(error));
        }
        let unsupported: Vec<_> = state.unsupported.iter().cloned().collect();
        let error = if !unsupported.is_empty() {
            Some(CheckpointError::Unsupported(unsupported.join(", ")))
        } else {
            let fingerprint = fingerprint(&state, worker);
            self.0.restored.as_ref().filter(|r| r.manifest.fingerprint != fingerprint).map(|r| {
                CheckpointError::Fingerprint {
                    id: r.manifest.id,
                    found: r.manifest.fingerprint.clone(),
                    expected: fingerprint,
                }
            })
        };
        if let Some(e) = error {
            // The job cannot be checkpointed: its sources and gates let go so
            // that it ends instead of waiting for checkpoints.
            fail(&self.0, &mut state, e.to_string());
            return Err(e);
        }
        state.built.insert(worker);
        if state.built.len() == self.0.workers {
            if !self.leads() {
                self.0.send_or_fail(&mut state, &Message::Built);
            }
            if state.sources.is_empty() || state.finished.len() == state.sources.len() {
                sources_ended(&self.0, &mut state);
            }
        }
        Ok(())
    }

    /// Whether this process coordinates (it is the only one, or process 0).
    fn leads(&self) -> bool {
        self.0.leads()
    }

    /// Checks a dataflow recorded by [`probe`] before the workers start: every
    /// stateful operator can be checkpointed, and a restored checkpoint was
    /// taken by the same dataflow.
    pub fn check_dataflow(&self, probe: &DataflowProbe) -> Result<(), CheckpointError> {
        let unsupported = probe.unsupported.lock().unwrap_or_else(|p| p.into_inner());
        if !unsupported.is_empty() {
            return Err(CheckpointError::Unsupported(unsupported.join(", ")));
        }
        let operators = probe.operators.lock().unwrap_or_else(|p| p.into_inner());
        let fingerprint = fingerprint_of(operators.iter().map(String::as_str));
        match self.restored() {
            Some(m) if m.fingerprint != fingerprint => {
                Err(CheckpointError::Fingerprint { id: m.id, found: m.fingerprint.clone(), expected: fingerprint })
            }
            _ => Ok(()),
        }
    }

    /// Registers a source (by name) read on `worker`.
    pub fn register_source(&self, source: &str, worker: usize) {
        lock(&self.0.state).sources.insert((source.to_owned(), worker));
    }

    /// A source is about to emit (or hold its capability) at `time`: the next
    /// cut will lie above it.
    pub fn publish(&self, time: Timestamp) {
        let mut state = lock(&self.0.state);
        // While the processes choose a cut, no source publishes beyond what
        // its process has reported (a round trip on the network).
        while state.frozen && time > state.max_published && state.error.is_none() {
            state = self.0.changed.wait_timeout(state, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.max_published = state.max_published.max(time);
    }

    /// A lower bound on the time of any cut begun from now on.
    pub fn horizon(&self) -> Timestamp {
        lock(&self.0.state).max_published.saturating_add(1)
    }

    /// `source` on `worker` has read all its partitions; once every source
    /// has, the final checkpoint is begun.
    pub fn source_finished(&self, source: &str, worker: usize) {
        let mut state = lock(&self.0.state);
        state.finished.insert((source.to_owned(), worker));
        if state.finished.len() == state.sources.len() && state.built.len() == self.0.workers {
            sources_ended(&self.0, &mut state);
        }
    }

    /// Whether the final checkpoint has begun (every source is exhausted), or
    /// checkpointing has failed: either way sources that have ended may let go.
    pub fn final_begun(&self) -> bool {
        let state = lock(&self.0.state);
        state.final_announced || state.error.is_some()
    }

    /// While the processes choose the next cut: one above the latest time
    /// this process has published (see [`StateStore::choosing`]).
    pub fn choosing(&self) -> Option<Timestamp> {
        self.0.membership.as_ref()?;
        let state = lock(&self.0.state);
        (state.frozen && state.error.is_none()).then(|| state.max_published.saturating_add(1))
    }

    /// The oldest cut after `done` not yet collected in this process.
    pub fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut> {
        let latest = self.0.latest.load(Ordering::Acquire);
        if latest == 0 || done.is_some_and(|d| d + 1 >= latest) {
            return None;
        }
        let state = lock(&self.0.state);
        state.announced.iter().find(|c| done.is_none_or(|d| c.id > d)).copied()
    }

    /// A source's partitions at `cut`.
    pub fn submit_source(&self, source: &str, cut: Cut, partitions: Vec<PartitionState>) {
        let mut state = lock(&self.0.state);
        if let Some(c) = state.collecting.get_mut(&cut.id) {
            c.sources.entry(source.to_owned()).or_default().extend(partitions);
            c.source_parts += 1;
        }
        self.try_complete(&mut state, cut.id);
    }

    /// Registers an exactly-once sink (by name) on `worker`. After a
    /// recovery, re-commits the sink's parts of the restored checkpoint (a
    /// no-op if they were), then discards what newer checkpoints prepared.
    pub fn register_sink(
        &self,
        sink: &str,
        worker: usize,
        committer: Arc<dyn SinkCommitter>,
    ) -> Result<(), CheckpointError> {
        if let Some(manifest) = self.restored() {
            for part in manifest.sinks.iter().filter(|p| p.sink == sink) {
                committer.commit(part)?;
            }
        }
        committer.abort_after(self.restored().map_or(0, |m| m.id))?;
        let mut state = lock(&self.0.state);
        state.sinks.insert((sink.to_owned(), worker));
        state.committers.insert(sink.to_owned(), committer);
        Ok(())
    }

    /// A sink's part at `cut`.
    pub fn submit_sink(&self, worker: usize, cut: Cut, submission: SinkSubmission) {
        let mut state = lock(&self.0.state);
        if let Some(c) = state.collecting.get_mut(&cut.id) {
            c.sinks.push((worker, submission));
        }
        self.try_complete(&mut state, cut.id);
    }

    fn try_complete(&self, state: &mut State, id: CheckpointId) {
        let Some(c) = state.collecting.get(&id) else { return };
        let complete = c.operators.len() == state.operators.len()
            && c.source_parts == state.sources.len()
            && c.sinks.len() == state.sinks.len();
        if !complete {
            return;
        }
        let c = state.collecting.remove(&id).expect("present above");
        // Collected here: this process's operators and sources are past it.
        state.announced.retain(|cut| cut.id != id);
        tracing::debug!(id, time = c.cut.time, elapsed = ?c.begun.elapsed(), "checkpoint collected");
        if let Some(tx) = self.0.jobs.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(Job::Local(c));
        }
    }

    /// Checkpoints written by this run so far.
    pub fn written(&self) -> Vec<CheckpointId> {
        lock(&self.0.state).written.clone()
    }

    /// Stops beginning checkpoints, waits for those collected to be written,
    /// and reports whether the job's final checkpoint was written (or the
    /// first error). Call after the workers have finished.
    pub fn finish(&self) -> Result<bool, CheckpointError> {
        self.0.stop.store(true, Ordering::Relaxed);
        drop(self.0.jobs.lock().unwrap_or_else(|p| p.into_inner()).take());
        let threads: Vec<_> = self.0.threads.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        let state = lock(&self.0.state);
        match &state.error {
            Some(e) => Err(CheckpointError::Failed(e.clone())),
            None => Ok(state.final_written),
        }
    }
}

/// Stops checkpointing after `error`: abandons the cuts begun (gates open,
/// operators stop taking snapshots), tells the other processes, and wakes
/// everyone; [`Checkpoints::finish`] reports the error.
fn fail(inner: &Inner, state: &mut State, error: String) {
    if state.error.is_none() {
        for peer in &inner.links {
            let _ = peer.send(&Message::Failed { error: error.clone() });
        }
    }
    state.error.get_or_insert(error);
    state.announced.clear();
    state.collecting.clear();
    state.in_flight = 0;
    state.frozen = false;
    state.prepared = None;
    inner.changed.notify_all();
    wake(inner);
}

impl Inner {
    /// Whether this process coordinates (it is the only one, or process 0).
    fn leads(&self) -> bool {
        self.membership.as_ref().is_none_or(Membership::leads)
    }

    /// The number of processes of the job.
    fn processes(&self) -> usize {
        self.membership.as_ref().map_or(1, |m| m.processes)
    }

    /// Sends `message` to the coordinator (a follower's only link); failing
    /// the checkpointing if it is gone.
    fn send_or_fail(&self, state: &mut State, message: &Message) {
        for peer in &self.links {
            if let Err(e) = peer.send(message) {
                fail(self, state, format!("lost the connection to process {}: {e}", peer.process));
                return;
            }
        }
    }
}

/// Schedules every checkpointed operator and gate.
fn wake(inner: &Inner) {
    for waker in inner.wakers.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        waker();
    }
}

/// Begins the cut `(next id, time)` (the coordinator) and tells the other processes.
fn announce(inner: &Inner, state: &mut State, time: Timestamp) {
    let cut = Cut { id: state.next_id, time };
    begin(inner, state, cut);
    inner.send_or_fail(state, &Message::Announce { cut });
}

/// Begins `cut`, announced here or by the coordinator.
fn begin(inner: &Inner, state: &mut State, cut: Cut) {
    let id = cut.id;
    state.next_id = id + 1;
    state.frozen = false;
    if !cut.is_final() {
        // The cut lies above every time published in any process: sources
        // here that have ended may hold their capability up to it (see
        // `horizon`), or the other processes' operators could not reach it.
        state.max_published = state.max_published.max(cut.time - 1);
    }
    state.final_announced |= cut.is_final();
    state.announced.push(cut);
    state.collecting.insert(
        id,
        Collecting {
            cut,
            operators: Vec::new(),
            sources: BTreeMap::new(),
            source_parts: 0,
            sinks: Vec::new(),
            begun: Instant::now(),
        },
    );
    state.in_flight += 1;
    inner.latest.store(id + 1, Ordering::Release);
    tracing::debug!(id, time = cut.time, "checkpoint begun");
    inner.changed.notify_all();
    wake(inner);
}

/// This process's sources have all ended: a follower says so; the
/// coordinator begins the final checkpoint once every process's have.
fn sources_ended(inner: &Inner, state: &mut State) {
    if state.sources_finished || state.error.is_some() {
        return;
    }
    state.sources_finished = true;
    if inner.leads() {
        final_if_ended(inner, state);
    } else {
        inner.send_or_fail(state, &Message::SourcesFinished);
    }
}

/// Begins the final checkpoint if every process's sources have ended.
fn final_if_ended(inner: &Inner, state: &mut State) {
    let others = inner.processes() - 1;
    if state.sources_finished
        && state.followers_finished.len() == others
        && state.followers_built.len() == others
        && !state.final_announced
        && state.error.is_none()
        && !state.sources.is_empty()
    {
        announce(inner, state, END_OF_TIME);
    }
}

/// The coordinator's timer: begins a cut every interval once every worker of
/// every process is built and the previous checkpoint is written.
fn time_loop(inner: &Inner) {
    let mut last = Instant::now();
    while !inner.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        let mut state = lock(&inner.state);
        if let Some((id, since, _)) = &state.prepared {
            if since.elapsed() > PREPARE_TIMEOUT {
                let error = format!("checkpoint {id}: not every process reported its sources' time");
                fail(inner, &mut state, error);
            }
            continue;
        }
        if last.elapsed() < inner.config.interval {
            continue;
        }
        let others = inner.processes() - 1;
        let ready = state.built.len() == inner.workers
            && state.followers_built.len() == others
            && !state.final_announced
            && state.in_flight == 0
            && state.error.is_none()
            && !state.sources.is_empty();
        if !ready {
            continue;
        }
        last = Instant::now();
        if others == 0 {
            let time = state.max_published.saturating_add(1);
            announce(inner, &mut state, time);
        } else {
            // Ask every process for its sources' latest time first.
            let id = state.next_id;
            state.frozen = true;
            state.prepared = Some((id, Instant::now(), BTreeMap::new()));
            for peer in &inner.links {
                if let Err(e) = peer.send(&Message::Prepare { id }) {
                    fail(inner, &mut state, format!("lost the connection to process {}: {e}", peer.process));
                    break;
                }
            }
        }
    }
}

/// How long the coordinator waits for the processes' answers to a prepare.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a process waits, when it finishes, for the checkpoints begun to be written.
const FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// Handles the messages of the other process at the end of `reader`.
fn listen(
    inner: &Inner,
    process: usize,
    mut reader: std::io::BufReader<std::net::TcpStream>,
    jobs: &mpsc::Sender<Job>,
) {
    loop {
        let message = match cluster::receive(&mut reader) {
            Ok(Some(message)) => message,
            end => {
                let mut state = lock(&inner.state);
                let done = state.final_written || (inner.stop.load(Ordering::Relaxed) && state.in_flight == 0);
                if !done && state.error.is_none() {
                    let why = match end {
                        Err(e) => e.to_string(),
                        _ => "connection closed".into(),
                    };
                    fail(inner, &mut state, format!("process {process} is gone ({why})"));
                    if state.built.len() < inner.workers {
                        // The workers are not running yet: this process waits for its
                        // peers to connect, which would otherwise go on forever.
                        inner
                            .startup
                            .abort(format!("checkpointing: process {process} is gone ({why}) before the job started"));
                    }
                }
                return;
            }
        };
        tracing::trace!(process, ?message, "checkpoint message");
        let mut state = lock(&inner.state);
        match message {
            // From the followers, at the coordinator.
            Message::Built => {
                state.followers_built.insert(process);
                final_if_ended(inner, &mut state);
            }
            Message::Prepared { id, max_published } => {
                let others = inner.processes() - 1;
                let complete = match state.prepared.as_mut() {
                    Some((prepared, _, answers)) if *prepared == id => {
                        answers.insert(process, max_published);
                        answers.len() == others
                    }
                    _ => false,
                };
                if complete {
                    let (_, _, answers) = state.prepared.take().expect("matched above");
                    if state.final_announced || state.error.is_some() {
                        state.frozen = false;
                        inner.changed.notify_all();
                        wake(inner);
                    } else {
                        let time = answers.values().fold(state.max_published, |a, b| a.max(*b)).saturating_add(1);
                        announce(inner, &mut state, time);
                    }
                }
            }
            Message::SourcesFinished => {
                state.followers_finished.insert(process);
                final_if_ended(inner, &mut state);
            }
            Message::ProcessDone { id, part } => {
                let _ = jobs.send(Job::Remote { process, id, part });
            }
            // From the coordinator, at a follower.
            Message::Prepare { id } => {
                state.frozen = true;
                let answer = Message::Prepared { id, max_published: state.max_published };
                inner.send_or_fail(&mut state, &answer);
            }
            Message::Announce { cut } => {
                if state.error.is_none() {
                    begin(inner, &mut state, cut);
                }
            }
            Message::Written { id, is_final } => written(inner, &mut state, id, is_final),
            Message::Failed { error } => fail(inner, &mut state, format!("process {process}: {error}")),
            Message::Hello { .. } | Message::Welcome { .. } => {
                tracing::warn!(process, ?message, "unexpected checkpoint message");
            }
        }
    }
}

/// Checkpoint `id` is written (and committed): it is over everywhere.
fn written(inner: &Inner, state: &mut State, id: CheckpointId, is_final: bool) {
    state.in_flight = state.in_flight.saturating_sub(1);
    state.written.push(id);
    state.final_written |= is_final;
    state.announced.retain(|cut| cut.id != id);
    inner.changed.notify_all();
    wake(inner);
}

/// The writer thread: writes this process's part of every collected
/// checkpoint; the coordinator also writes the manifests, in order, once
/// every process's part is in.
fn write_loop(inner: &Inner, jobs: mpsc::Receiver<Job>) {
    // Parts by checkpoint, with its cut and the start of its writing once
    // this process's part is written (coordinator).
    type Parts = BTreeMap<CheckpointId, (Option<(Cut, Instant)>, BTreeMap<usize, ProcessPart>)>;
    let mut parts = Parts::new();
    let process = inner.membership.as_ref().map_or(0, |m| m.process);
    let mut stopping: Option<Instant> = None;
    loop {
        let job = match jobs.recv_timeout(Duration::from_millis(50)) {
            Ok(job) => Some(job),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => None,
        };
        if lock(&inner.state).error.is_some() {
            // After a failure no later checkpoint may be committed: its
            // sinks' parts would follow a gap.
            if inner.stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        match job {
            Some(Job::Local(c)) => {
                let (id, cut, started) = (c.cut.id, c.cut, Instant::now());
                match write_part(inner, c) {
                    Ok(part) if inner.leads() => {
                        let entry = parts.entry(id).or_default();
                        entry.0 = Some((cut, started));
                        entry.1.insert(process, part);
                    }
                    Ok(part) => {
                        let mut state = lock(&inner.state);
                        inner.send_or_fail(&mut state, &Message::ProcessDone { id, part });
                    }
                    Err(e) => {
                        tracing::error!("checkpoint {id} failed: {e}");
                        fail(inner, &mut lock(&inner.state), format!("checkpoint {id}: {e}"));
                    }
                }
            }
            Some(Job::Remote { process, id, part }) => {
                parts.entry(id).or_default().1.insert(process, part);
            }
            None => {}
        }
        // The coordinator writes the manifests of complete checkpoints, in order.
        while let Some(entry) = parts.first_entry() {
            let (cut, by_process) = entry.get();
            let Some((cut, started)) = *cut else { break };
            if by_process.len() < inner.processes() {
                break;
            }
            let (_, by_process) = entry.remove();
            let result = write_manifest(inner, cut, started, by_process.into_values().collect());
            let mut state = lock(&inner.state);
            match result {
                Ok(manifest) => {
                    written(inner, &mut state, cut.id, manifest.is_final());
                    for peer in &inner.links {
                        let _ = peer.send(&Message::Written { id: cut.id, is_final: manifest.is_final() });
                    }
                }
                Err(e) => {
                    tracing::error!("checkpoint {} failed: {e}", cut.id);
                    fail(inner, &mut state, format!("checkpoint {}: {e}", cut.id));
                }
            }
        }
        if inner.stop.load(Ordering::Relaxed) && inner.membership.is_some() {
            // Across processes: until every checkpoint begun is written.
            let mut state = lock(&inner.state);
            if state.in_flight == 0 || state.error.is_some() {
                break;
            }
            let since = *stopping.get_or_insert_with(Instant::now);
            if since.elapsed() > FINISH_TIMEOUT {
                fail(inner, &mut state, format!("checkpoints begun were not written within {FINISH_TIMEOUT:?}"));
                break;
            }
        }
    }
}

/// The dataflow's fingerprint: its checkpointed operators on `worker`.
fn fingerprint(state: &State, worker: usize) -> String {
    fingerprint_of(state.operators.iter().filter(|(w, _)| *w == worker).map(|(_, name)| name.as_str()))
}

/// The fingerprint of a dataflow with checkpointed operators `names`
/// (name and address in the dataflow).
fn fingerprint_of<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    let text = names.join("\n");
    format!("{:08x}-{}", crc32fast::hash(text.as_bytes()), names.len())
}

/// Writes this process's part of a collected checkpoint: its workers'
/// shards (put into the store) and its sinks' prepared parts.
fn write_part(inner: &Inner, c: Collecting) -> Result<ProcessPart, CheckpointError> {
    let id = c.cut.id;
    let store = &*inner.store;
    let staging = store.staging();
    std::fs::create_dir_all(&staging)
        .map_err(|source| CheckpointError::Io { what: staging.display().to_string(), source })?;
    let mut by_worker: BTreeMap<usize, Vec<(String, Vec<Entry>)>> = BTreeMap::new();
    for (worker, name, entries) in c.operators {
        by_worker.entry(worker).or_default().push((name, entries));
    }
    let mut shards = Vec::new();
    for (worker, mut operators) in by_worker {
        operators.sort_by(|a, b| a.0.cmp(&b.0));
        let local = staging.join(format!("chk-{id}-shard-{worker}"));
        let entries = shard::write(&local, &operators)?;
        let files = store.put_shard(id, worker, &local)?;
        shards.push(ShardInfo { worker, entries, files });
    }
    let mut sinks = Vec::new();
    for (_, submission) in c.sinks {
        let part = submission.part.as_ref().map(|(bytes, rows)| (bytes.as_slice(), *rows));
        let mut prepared = committer(inner, &submission.sink)?.prepare(id, part)?;
        prepared.sink = submission.sink;
        sinks.push(prepared);
    }
    Ok(ProcessPart { shards, sources: c.sources, sinks })
}

/// The committer of `sink` (registered in this process).
fn committer(inner: &Inner, sink: &str) -> Result<Arc<dyn SinkCommitter>, CheckpointError> {
    lock(&inner.state)
        .committers
        .get(sink)
        .cloned()
        .ok_or_else(|| CheckpointError::Failed(format!("sink {sink} has no committer in this process")))
}

/// Completes checkpoint `cut` from every process's part, begun at `started`:
/// writes the manifest, commits the sinks, collects garbage.
fn write_manifest(
    inner: &Inner,
    cut: Cut,
    started: Instant,
    parts: Vec<ProcessPart>,
) -> Result<Manifest, CheckpointError> {
    let id = cut.id;
    let store = &*inner.store;
    let mut shards = Vec::new();
    let mut sinks = Vec::new();
    let mut sources: BTreeMap<String, Vec<PartitionState>> = BTreeMap::new();
    for part in parts {
        shards.extend(part.shards);
        sinks.extend(part.sinks);
        for (source, partitions) in part.sources {
            sources.entry(source).or_default().extend(partitions);
        }
    }
    shards.sort_by_key(|s| s.worker);
    for partitions in sources.values_mut() {
        partitions.sort_by_key(|p| p.partition);
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        id,
        time: cut.time,
        fingerprint: {
            let state = lock(&inner.state);
            fingerprint(&state, inner.first_worker)
        },
        workers: inner.peers,
        created_unix_ms: now_ms(),
        sources,
        shards,
        sinks,
        schemas: lock(&inner.state).schemas.clone(),
    };
    store.put_manifest(id, &manifest.to_bytes())?;
    kill::point("sink-commit");
    for part in &manifest.sinks {
        committer(inner, &part.sink)?.commit(part)?;
    }
    tracing::info!(
        id,
        time = manifest.time,
        bytes = manifest.state_bytes(),
        write = ?started.elapsed(),
        "checkpoint committed"
    );
    collect_garbage(store, inner.config.keep, id)?;
    Ok(manifest)
}

/// Keeps the newest `keep` complete checkpoints up to `newest`; deletes the
/// rest and incomplete ones older than `newest`.
fn collect_garbage(store: &dyn CheckpointStore, keep: usize, newest: CheckpointId) -> Result<(), CheckpointError> {
    let ids = store.list()?;
    let mut kept = 0;
    for &id in ids.iter().rev().filter(|id| **id <= newest) {
        let complete = store.get_manifest(id)?.is_some();
        if complete && kept < keep {
            kept += 1;
        } else if id != newest {
            store.delete(id)?;
        }
    }
    Ok(())
}

impl StateRuntime for Checkpoints {
    fn worker(&self, index: usize) -> std::rc::Rc<dyn StateStore> {
        std::rc::Rc::new(Checkpoints::worker(self, index))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A worker's view of the [`Checkpoints`], for its operators.
#[derive(Debug)]
pub struct WorkerStore {
    checkpoints: Checkpoints,
    worker: usize,
}

impl StateStore for WorkerStore {
    fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut> {
        self.checkpoints.cut_after(done)
    }

    fn choosing(&self) -> Option<Timestamp> {
        self.checkpoints.choosing()
    }

    fn register(&self, operator: &str, schema: &Schema, migrates_from: &[u32]) {
        let inner = &self.checkpoints.0;
        let mut state = lock(&inner.state);
        state.operators.insert((self.worker, operator.to_owned()));
        state.schemas.insert(operator.to_owned(), schema.clone());
        let Some(restored) = inner.restored.as_ref() else { return };
        let found = restored.manifest.schemas.get(operator);
        let refused = match found {
            Some(found) => found != schema && !(found.name == schema.name && migrates_from.contains(&found.version)),
            None => false,
        };
        if refused {
            let found = found.expect("refused only when found");
            let error = format!(
                "operator {operator}: checkpoint {} holds its state as {found}, this program's is {schema}, with \
                 no migration from v{}; start without --recover in an empty checkpoint directory, or add a migration",
                restored.manifest.id, found.version
            );
            fail(inner, &mut state, error);
        }
    }

    fn fail(&self, operator: &str, error: StateError) {
        let inner = &self.checkpoints.0;
        let mut state = lock(&inner.state);
        let checkpoint = inner.restored.as_ref().map(|r| format!(" (restoring checkpoint {})", r.manifest.id));
        fail(inner, &mut state, format!("operator {operator}: {error}{}", checkpoint.unwrap_or_default()));
    }

    fn unsupported(&self, operator: &str) {
        lock(&self.checkpoints.0.state).unsupported.insert(operator.to_owned());
    }

    fn restored(&self, operator: &str) -> Option<Restored> {
        let restored = self.checkpoints.0.restored.as_ref()?;
        let chunks = restored.entries.get(operator).cloned().unwrap_or_default();
        let schema = restored.manifest.schemas.get(operator).cloned();
        Some(Restored::new(chunks, self.worker, self.checkpoints.0.peers).with_schema(schema))
    }

    fn restored_time(&self) -> Option<Timestamp> {
        self.checkpoints.restored_time()
    }

    fn on_cut(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.checkpoints.0.wakers.0.lock().unwrap_or_else(|p| p.into_inner()).push(wake);
    }

    fn submit(&self, operator: &str, cut: Cut, entries: Vec<Entry>, pause: Duration) {
        tracing::debug!(operator, worker = self.worker, id = cut.id, entries = entries.len(), ?pause, "snapshot taken");
        let inner = &self.checkpoints.0;
        let mut state = lock(&inner.state);
        if let Some(c) = state.collecting.get_mut(&cut.id) {
            c.operators.push((self.worker, operator.to_owned(), entries));
        }
        self.checkpoints.try_complete(&mut state, cut.id);
    }
}
