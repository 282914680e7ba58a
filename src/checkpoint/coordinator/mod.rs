//! The process-wide checkpoint coordinator: begins cuts, collects every
//! worker's share, writes checkpoints on a background thread, and restores.
//!
//! The checkpointing of the job in this process is a state machine
//! (`phase.rs`): the job's phase (building, running, draining, final,
//! finished, failed) and each checkpoint's (preparing, collecting,
//! writing), moved on by transitions that return the next phase or an
//! error, beside a registry of the operators, sources and sinks
//! (`registry.rs`). Three kinds of threads drive it, under one lock: the
//! workers, through [`Checkpoints`] and [`WorkerStore`] (here); the
//! coordinator's timer choosing cuts (`local.rs`); and, across processes,
//! one listener per other process (`members.rs`). The writer thread
//! (`writer.rs`) writes what is collected; `restore.rs` chooses and loads
//! the checkpoint to recover from; `probe.rs` records a dataflow before the
//! workers start.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::operators::checkpoint::{
    BackendFiles, CheckpointId, Cut, Entry, Restored, Schema, StateError, StateRuntime, StateStore,
};
use crate::operators::Timestamp;

use super::cluster::{Membership, Peer};
use super::manifest::{Manifest, PartitionState};
use super::store::{open_store, CheckpointStore};
use super::{CheckpointConfig, CheckpointError};

mod acknowledge;
mod local;
mod members;
mod phase;
mod probe;
mod registry;
mod restore;
mod sink;
#[cfg(test)]
mod tests;
mod writer;

pub use acknowledge::SourceCommitter;
use acknowledge::{Acknowledgements, Committing};
use phase::{DatabaseCheckpoint, Effect, Job, Layout, Phase, Share, State};
pub use probe::{probe, DataflowProbe};
use restore::RestoredState;
pub use restore::{check, latest_usable};
pub use sink::{SinkCommitter, SinkSubmission};
use writer::Work;

#[derive(Debug)]
struct Inner {
    config: CheckpointConfig,
    store: Arc<dyn CheckpointStore>,
    /// This process's place in the job (also in the state).
    layout: Layout,
    /// The job's workers in all processes.
    peers: usize,
    /// The job's index of this process's first worker.
    first_worker: usize,
    /// This process's place in a job of several processes.
    membership: Option<Membership>,
    /// The other processes: the followers (coordinator), or the coordinator.
    links: Vec<Peer>,
    restored: Option<RestoredState>,
    /// Where written and failed checkpoints are counted.
    stats: Mutex<crate::checkpoint::stats::CheckpointStats>,
    state: Mutex<State>,
    /// Signalled when the state changes in a way waiting threads look at
    /// (a cut begun or written, sources no longer held back, a failure).
    changed: Condvar,
    /// One more than the id of the latest cut begun (0: none), for cheap checks.
    latest: AtomicU64,
    /// This process's collected cuts, to the writer; dropped by `finish`.
    work: Mutex<Option<mpsc::Sender<Work>>>,
    /// The other processes' parts, to the writer (the coordinator of others).
    remote: Option<mpsc::Sender<Work>>,
    /// Schedule the checkpointed operators and gates of every worker.
    wakers: Wakers,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stop: AtomicBool,
    /// Given when a process is gone before the workers started, so that the
    /// processes' connection gives up (see [`Checkpoints::startup_abort`]).
    startup: crate::abort::Abort,
    /// The sources' commit step: their committers and positions per cut.
    acks: Mutex<Acknowledgements>,
    committing: Committing,
    /// The latest checkpoint written (0: none), and the latest acknowledged.
    committed: AtomicU64,
    acked: AtomicU64,
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
pub struct Checkpoints(Arc<Handle>);

/// What every clone of a [`Checkpoints`] shares (the checkpointing's threads
/// hold the [`Inner`] alone): when the last clone goes without
/// [`Checkpoints::finish`] having been called, the checkpoints are finished
/// then, so that the threads writing them stop before the process exits and
/// the final checkpoint is not lost, and the omission is logged.
#[derive(Debug)]
struct Handle(Arc<Inner>);

impl std::ops::Deref for Handle {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.0.stop.load(Ordering::Relaxed) {
            crate::failures::report_misuse(
                "the job's checkpoints were dropped without Checkpoints::finish(): finishing them now \
                 (call finish() once the workers have ended to know whether the final checkpoint was written, \
                 or run the job with highwater::Job)",
            );
            if let Err(e) = self.0.finish() {
                crate::failures::report_misuse(&format!("checkpointing: {e}"));
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let layout = Layout {
            workers,
            processes: membership.as_ref().map_or(1, |m| m.processes),
            leads: membership.as_ref().is_none_or(Membership::leads),
        };
        let joined = match membership.as_ref() {
            Some(m) if !m.leads() => members::follow(m, &*store)?,
            m => members::lead(m, &config, &*store)?,
        };
        let restored = joined.manifest.map(|manifest| RestoredState::load(&*store, manifest)).transpose()?;
        if layout.leads {
            // Others' staging directories are their own (shards are named by worker).
            let _ = std::fs::remove_dir_all(store.staging());
        }
        // Cuts lie above the restored time, where the sources resume.
        let (next_id, published) = (joined.next_id, restored.as_ref().map_or(0, |r| r.manifest.time));
        let (tx, rx) = mpsc::channel::<Work>();
        let inner = Arc::new(Inner {
            config,
            store,
            layout,
            peers: membership.as_ref().map_or(workers, Membership::peers),
            first_worker: membership.as_ref().map_or(0, Membership::first_worker),
            membership,
            links: joined.links,
            restored,
            stats: Mutex::default(),
            state: Mutex::new(State::new(layout, next_id, published)),
            changed: Condvar::new(),
            wakers: Wakers::default(),
            latest: AtomicU64::new(0),
            work: Mutex::new(Some(tx.clone())),
            remote: (!joined.readers.is_empty()).then_some(tx),
            threads: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            startup: crate::abort::Abort::new(),
            acks: Mutex::new(Acknowledgements::default()),
            committing: Committing::default(),
            committed: AtomicU64::new(0),
            acked: AtomicU64::new(0),
        });
        let spawn = |name: String, what: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(run)
                .map_err(|e| CheckpointError::Io { what: format!("starting {what}"), source: e })
        };
        for (process, reader) in joined.readers {
            let inner = Arc::clone(&inner);
            let run = Box::new(move || members::listen(&inner, process, reader));
            spawn(format!("highwater-checkpoint-link-{process}"), "a checkpoint link", run)?;
        }
        let mut threads = Vec::new();
        let writer = Arc::clone(&inner);
        let run = Box::new(move || writer::write_loop(&writer, rx));
        threads.push(spawn("highwater-checkpoint-writer".into(), "the checkpoint writer", run)?);
        if layout.leads {
            let timer = Arc::clone(&inner);
            let run = Box::new(move || local::time_loop(&timer));
            threads.push(spawn("highwater-checkpoint-timer".into(), "the checkpoint timer", run)?);
        }
        inner.threads.lock().unwrap_or_else(|p| p.into_inner()).extend(threads);
        Ok(Checkpoints(Arc::new(Handle(inner))))
    }

    /// The signal that gives up the processes' connection when a process is
    /// gone before the job started: pass it to
    /// [`cluster::execute_abortable`](crate::cluster::execute_abortable).
    pub fn startup_abort(&self) -> crate::abort::Abort {
        self.0.startup.clone()
    }

    /// Fails the job's checkpointing with `error` (e.g. a source failed for
    /// good): no checkpoint begun from now on is written, no sink commits
    /// again, and [`finish`](Self::finish) reports the error.
    pub fn fail_job(&self, error: impl Into<String>) {
        self.0.fail(&mut lock(&self.0.state), error.into());
    }

    /// Counts written and failed checkpoints into `stats` from now on.
    pub fn report_to(&self, stats: crate::checkpoint::CheckpointStats) {
        *self.0.stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    /// The store's location, for messages.
    pub fn location(&self) -> String {
        self.0.store.describe()
    }

    /// The store the checkpoints go to (exactly-once sinks keep their
    /// pending parts in it, [`CheckpointStore::put_sink_part`]).
    pub fn store(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(&self.0.store)
    }

    /// Whether this is the job's first process, the one that writes the
    /// manifests and commits the sinks' parts (of every process).
    pub fn is_first_process(&self) -> bool {
        self.0.first_worker == 0
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
            let error = CheckpointError::NotConfigured {
                what: "the job's dataflow".to_owned(),
                job: crate::job::in_job(worker.config()),
            };
            self.0.fail(&mut lock(&self.0.state), error.to_string());
            return Err(error);
        }
        let worker = worker.index();
        let mut state = lock(&self.0.state);
        // An operator's state could not be restored (another schema, an
        // entry that does not decode): the job does not start.
        if let Some(error) = state.phase.error() {
            return Err(CheckpointError::Failed(error.to_owned()));
        }
        let registry = &state.job.registry;
        let error = if !registry.unsupported.is_empty() {
            let unsupported: Vec<_> = registry.unsupported.iter().cloned().collect();
            Some(CheckpointError::Unsupported(unsupported.join(", ")))
        } else {
            let fingerprint = registry.fingerprint(worker);
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
            self.0.fail(&mut state, e.to_string());
            return Err(e);
        }
        let result = self.0.step(&mut state, |phase, job| phase.worker_built(worker, job));
        if !state.phase.workers_building(self.0.layout.workers) {
            // Every worker of this process has restored its operators.
            if let Some(restored) = self.0.restored.as_ref() {
                restored.release_databases();
            }
        }
        result
    }

    /// Checks a dataflow recorded by [`probe`] before the workers start: every
    /// stateful operator can be checkpointed, and a restored checkpoint was
    /// taken by the same dataflow.
    pub fn check_dataflow(&self, probe: &DataflowProbe) -> Result<(), CheckpointError> {
        probe.check(self.restored())
    }

    /// Registers a source (by name) read on `worker`.
    pub fn register_source(&self, source: &str, worker: usize) {
        lock(&self.0.state).job.registry.sources.insert((source.to_owned(), worker));
    }

    /// A source is about to emit (or hold its capability) at `time`: the next
    /// cut will lie above it. A source at rest that moves its capability up
    /// to the pending cut (so that the cut passes without more input) does
    /// not publish; the coordinator begins no further cut until a source
    /// publishes a time at or above the last cut's.
    pub fn publish(&self, time: Timestamp) {
        let mut state = lock(&self.0.state);
        // While the processes choose a cut, no source publishes beyond what
        // its process has reported (a round trip on the network).
        while state.frozen() && time > state.job.published {
            state = self.0.changed.wait_timeout(state, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.job.published = state.job.published.max(time);
    }

    /// A lower bound on the time of any cut begun from now on.
    pub fn horizon(&self) -> Timestamp {
        lock(&self.0.state).job.published.saturating_add(1)
    }

    /// `source` on `worker` has read all its partitions; once every source
    /// has, the final checkpoint is begun.
    pub fn source_finished(&self, source: &str, worker: usize) {
        let mut state = lock(&self.0.state);
        state.job.registry.finished.insert((source.to_owned(), worker));
        // An error has failed the checkpointing, which `finish` reports.
        let _ = self.0.step(&mut state, Phase::source_finished);
    }

    /// Whether the final checkpoint has begun (every source is exhausted), or
    /// checkpointing has failed: either way sources that have ended may let go.
    pub fn final_begun(&self) -> bool {
        lock(&self.0.state).phase.final_begun()
    }

    /// While the processes choose the next cut: one above the latest time
    /// this process has published (see [`StateStore::choosing`]).
    pub fn choosing(&self) -> Option<Timestamp> {
        self.0.membership.as_ref()?;
        let state = lock(&self.0.state);
        state.frozen().then(|| state.job.published.saturating_add(1))
    }

    /// The oldest cut after `done` not yet collected in this process.
    pub fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut> {
        let latest = self.0.latest.load(Ordering::Acquire);
        if latest == 0 || done.is_some_and(|d| d + 1 >= latest) {
            return None;
        }
        lock(&self.0.state).phase.collecting_after(done)
    }

    /// A source's partitions at `cut`.
    pub fn submit_source(&self, source: &str, cut: Cut, partitions: Vec<PartitionState>) {
        self.0.acks.lock().unwrap_or_else(|p| p.into_inner()).handed_in(cut.id, source, &partitions);
        self.hand_in(cut, Share::Source { source: source.to_owned(), partitions });
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
        state.job.registry.sinks.insert((sink.to_owned(), worker));
        state.job.registry.committers.insert(sink.to_owned(), committer);
        Ok(())
    }

    /// Registers an exactly-once sink on `worker` ([`register_sink`](Self::register_sink))
    /// with one committer shared by all workers of this process: the first
    /// worker to register makes it with `make`, the others reuse it (a
    /// committer that holds connections or producers, such as Kafka's
    /// transactional one, must exist once per process).
    pub fn register_shared_sink(
        &self,
        sink: &str,
        worker: usize,
        make: impl FnOnce() -> Result<Arc<dyn SinkCommitter>, String>,
    ) -> Result<(), CheckpointError> {
        let committer = {
            let mut state = lock(&self.0.state);
            match state.job.registry.committers.get(sink) {
                Some(c) => Arc::clone(c),
                None => {
                    let c = make().map_err(|reason| CheckpointError::Sink { sink: sink.to_owned(), reason })?;
                    state.job.registry.committers.insert(sink.to_owned(), Arc::clone(&c));
                    c
                }
            }
        };
        self.register_sink(sink, worker, committer)
    }

    /// A sink's part at `cut`.
    pub fn submit_sink(&self, worker: usize, cut: Cut, submission: SinkSubmission) {
        self.hand_in(cut, Share::Sink { worker, submission });
    }

    /// A share of `cut` handed in; once every share is in, the cut goes to the writer.
    fn hand_in(&self, cut: Cut, share: Share) {
        let mut state = lock(&self.0.state);
        // An error has failed the checkpointing, which `finish` reports.
        let _ = self.0.step(&mut state, |phase, job| phase.hand_in(cut.id, share, job));
    }

    /// `source` acknowledges upstream through `committer` what each
    /// committed checkpoint covers (the source's commit step; registered by
    /// the source operator, once per process).
    pub fn register_source_committer(&self, source: &str, committer: Arc<dyn SourceCommitter>) {
        self.0.acks.lock().unwrap_or_else(|p| p.into_inner()).register(source, committer);
    }

    /// Runs the sources' commit step for the checkpoints committed since the
    /// last call (in checkpoint order; a call while another runs it leaves
    /// the work to that one). Source operators call it as they run; the
    /// final checkpoint's is run by [`finish`](Self::finish).
    pub fn acknowledge(&self) {
        self.0.acknowledge(false);
    }

    /// Checkpoints written by this run so far.
    pub fn written(&self) -> Vec<CheckpointId> {
        lock(&self.0.state).job.written.clone()
    }

    /// The error the job's checkpointing failed with, if it did (no later
    /// checkpoint commits; [`finish`](Self::finish) reports it too).
    pub fn error(&self) -> Option<String> {
        match &lock(&self.0.state).phase {
            Phase::Failed(error) => Some(error.clone()),
            _ => None,
        }
    }

    /// Stops beginning checkpoints, waits for those collected to be written,
    /// and reports whether the job's final checkpoint was written (or the
    /// first error). Call after the workers have finished.
    pub fn finish(&self) -> Result<bool, CheckpointError> {
        self.0.finish()
    }

    /// Whether `worker` (its index in the job) has declared its dataflows
    /// built ([`built`](Self::built)); once checkpointing has moved past
    /// building, or failed, every worker counts as built.
    pub fn is_built(&self, worker: usize) -> bool {
        lock(&self.0.state).phase.is_built(worker)
    }
}

impl Inner {
    /// Where checkpoints are counted.
    fn stats(&self) -> crate::checkpoint::CheckpointStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// See [`Checkpoints::finish`].
    fn finish(&self) -> Result<bool, CheckpointError> {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.work.lock().unwrap_or_else(|p| p.into_inner()).take());
        let threads: Vec<_> = self.threads.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        self.acknowledge(true);
        if let Some(restored) = self.restored.as_ref() {
            restored.release_databases();
        }
        let state = lock(&self.state);
        match &state.phase {
            Phase::Failed(error) => Err(CheckpointError::Failed(error.clone())),
            phase => Ok(matches!(phase, Phase::Finished)),
        }
    }

    /// See [`Checkpoints::acknowledge`]; with `wait`, waits for a call in
    /// progress instead of leaving the work to it.
    fn acknowledge(&self, wait: bool) {
        let committed = self.committed.load(Ordering::Acquire);
        if committed <= self.acked.load(Ordering::Acquire) {
            return;
        }
        let _guard = if wait {
            self.committing.0.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            match self.committing.0.try_lock() {
                Ok(guard) => guard,
                Err(_) => return,
            }
        };
        let due = self.acks.lock().unwrap_or_else(|p| p.into_inner()).due(committed);
        for (committer, id, partitions) in due {
            if let Err(e) = committer.commit(id, &partitions) {
                tracing::warn!(
                    checkpoint = id,
                    "a source could not acknowledge upstream what the checkpoint covers: {e} \
                     (the next checkpoint acknowledges again)"
                );
            }
        }
        self.acked.fetch_max(committed, Ordering::Release);
    }

    /// Takes the state through `transition` and carries out what it asks;
    /// an error fails the checkpointing and is returned.
    fn step(
        &self,
        state: &mut State,
        transition: impl FnOnce(Phase, &mut Job) -> Result<Phase, CheckpointError>,
    ) -> Result<(), CheckpointError> {
        let result = state.apply(transition);
        self.perform(state);
        result
    }

    /// Fails the checkpointing with `reason` (see `Phase::fail`).
    fn fail(&self, state: &mut State, reason: String) {
        state.fail(reason);
        self.perform(state);
    }

    /// Carries out the effects the transitions queued, in order, still
    /// under the lock: messages leave in the order of the transitions.
    fn perform(&self, state: &mut State) {
        while !state.job.effects.is_empty() {
            for effect in std::mem::take(&mut state.job.effects) {
                match effect {
                    // After a failure only the failure is told.
                    Effect::Send(_) if state.phase.is_failed() => {}
                    Effect::Send(message) => {
                        for peer in &self.links {
                            if let Err(e) = peer.send(&message) {
                                state.fail(format!("lost the connection to process {}: {e}", peer.process));
                                break;
                            }
                        }
                    }
                    Effect::Inform(message) => {
                        for peer in &self.links {
                            let _ = peer.send(&message);
                        }
                    }
                    Effect::Begun(cut) => self.latest.store(cut.id + 1, Ordering::Release),
                    Effect::Wake => {
                        if let Some(id) = state.job.written.last() {
                            self.committed.fetch_max(*id, Ordering::Release);
                        }
                        self.changed.notify_all();
                        for waker in self.wakers.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                            waker();
                        }
                    }
                    Effect::Collected(c) => {
                        if let Some(work) = self.work.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                            let _ = work.send(Work::Local(c));
                        }
                    }
                    Effect::Part { process, id, part } => {
                        if let Some(remote) = &self.remote {
                            let _ = remote.send(Work::Remote { process, id, part });
                        }
                    }
                }
            }
        }
    }
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
        state.job.registry.operators.insert((self.worker, operator.to_owned()));
        state.job.registry.schemas.insert(operator.to_owned(), schema.clone());
        let refused = inner.restored.as_ref().and_then(|r| r.refuses(operator, schema, migrates_from));
        if let Some(error) = refused {
            inner.fail(&mut state, error);
        }
    }

    fn fail(&self, operator: &str, error: StateError) {
        let inner = &self.checkpoints.0;
        let checkpoint = inner.restored.as_ref().map(|r| format!(" (restoring checkpoint {})", r.manifest.id));
        let reason = format!("operator {operator}: {error}{}", checkpoint.unwrap_or_default());
        inner.fail(&mut lock(&inner.state), reason);
    }

    fn unsupported(&self, operator: &str) {
        lock(&self.checkpoints.0.state).job.registry.unsupported.insert(operator.to_owned());
    }

    fn restored(&self, operator: &str) -> Option<Restored> {
        let inner = &self.checkpoints.0;
        Some(inner.restored.as_ref()?.of(operator, self.worker, inner.peers))
    }

    fn restored_time(&self) -> Option<Timestamp> {
        self.checkpoints.restored_time()
    }

    fn on_cut(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.checkpoints.0.wakers.0.lock().unwrap_or_else(|p| p.into_inner()).push(wake);
    }

    fn submit(&self, operator: &str, cut: Cut, entries: Vec<Entry>, files: Option<BackendFiles>, pause: Duration) {
        tracing::debug!(
            operator,
            worker = self.worker,
            id = cut.id,
            entries = entries.len(),
            database_files = files.as_ref().map(|f| f.files.len()),
            ?pause,
            "snapshot taken"
        );
        let files = files.map(DatabaseCheckpoint);
        let share = Share::Operator { worker: self.worker, operator: operator.to_owned(), entries, files };
        self.checkpoints.hand_in(cut, share);
    }

    fn takes_database_files(&self) -> bool {
        true
    }

    fn restored_databases(&self, operator: &str) -> Vec<std::path::PathBuf> {
        self.checkpoints.0.restored.as_ref().map_or_else(Vec::new, |r| r.databases_of(operator))
    }
}
