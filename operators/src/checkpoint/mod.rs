//! Checkpoints as operators see them: consistent cuts at a logical time, and
//! the state an operator hands over at such a cut or gets back on recovery.
//!
//! A checkpoint *cut* `(id, T)` is begun by the runtime (the `highwater`
//! crate's `checkpoint` module), which installs a [`StateStore`] on every
//! worker thread before the dataflow is built ([`install`]). Each
//! checkpointable operator then:
//!
//! 1. reads its input through a *gate*: an operator that passes updates
//!    whose timely time is below the pending cut's `T` and keeps the others
//!    back, holding its capability at `T`. The operator's input frontier thus
//!    stops exactly at `T` with every update below it received, and none above;
//! 2. when its frontier reaches `T`, fires what the watermark `T` completes,
//!    serializes its state into [`Entry`]s and [`submit`](StateStore::submit)s
//!    them: the state as of `T`. The gate then lets the held-back updates
//!    through. Data keeps flowing everywhere else, and the entries are written
//!    out by the runtime on a background thread;
//! 3. on recovery, gets back the entries whose routing hash falls on its worker
//!    ([`StateStore::restored`]), whatever the number of workers the
//!    checkpoint was taken with, and resumes with its frontier at `T`.
//!    Updates at times before `T` that reach a gate after a recovery are
//!    replays of restored differential collections (see
//!    [`EventStream::as_collection`](crate::EventStream::as_collection)),
//!    whose effect the operator's restored state holds already: the gate
//!    drops them, as exactly-once sinks do.
//!
//! Without an installed store (the default) nothing of this happens and the
//! operators run exactly as before. Stateful operators that cannot yet be
//! checkpointed report themselves ([`StateStore::unsupported`]) so that the
//! runtime refuses to start a checkpointed job it could not restore.

pub mod memory;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::scheduling::Activator;

use crate::key::Data;
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, Timestamp, END_OF_TIME};

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
/// to the operator's exchange, see [`crate::key::route`]) and its bytes.
pub type Entry = (u64, Vec<u8>);

/// An operator's restored entries on one worker: read in place from the
/// checkpoint's chunks (each a bincode list of [`Entry`]s, as written), keeping
/// those whose routing hash falls on this worker, with no copy per entry.
#[derive(Clone, Debug, Default)]
pub struct Restored {
    chunks: Vec<std::sync::Arc<Vec<u8>>>,
    worker: u64,
    workers: u64,
}

impl Restored {
    /// The entries of `chunks` that fall on `worker` of `workers`.
    pub fn new(chunks: Vec<std::sync::Arc<Vec<u8>>>, worker: usize, workers: usize) -> Self {
        Restored { chunks, worker: worker as u64, workers: workers.max(1) as u64 }
    }

    /// Calls `each(routing hash, bytes)` for every entry of this worker.
    ///
    /// # Panics
    /// If a chunk is not a list of entries (checkpoint files are checksummed).
    pub fn for_each(&self, mut each: impl FnMut(u64, &[u8])) {
        fn word(bytes: &[u8], at: &mut usize) -> u64 {
            let w = u64::from_le_bytes(bytes[*at..*at + 8].try_into().expect("8 bytes"));
            *at += 8;
            w
        }
        for chunk in &self.chunks {
            let bytes = chunk.as_slice();
            let mut at = 0;
            let count = word(bytes, &mut at);
            for _ in 0..count {
                let route = word(bytes, &mut at);
                let len = word(bytes, &mut at) as usize;
                if route % self.workers == self.worker {
                    each(route, &bytes[at..at + len]);
                }
                at += len;
            }
        }
    }

    /// The number of entries of this worker.
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(|_, _| n += 1);
        n
    }

    /// Whether this worker has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a worker's operators see of the checkpointing runtime.
pub trait StateStore {
    /// The oldest begun checkpoint after `done` (or after the restored one,
    /// if `done` is `None`) that is not yet complete everywhere.
    fn cut_after(&self, done: Option<CheckpointId>) -> Option<Cut>;
    /// Declares a checkpointable operator, by a name stable across runs of
    /// the same program (its name and its address in the dataflow).
    fn register(&self, operator: &str);
    /// Declares a stateful operator whose state cannot be checkpointed.
    fn unsupported(&self, operator: &str);
    /// The entries restored for `operator` on this worker (those whose
    /// routing hash falls here), if the job was recovered.
    fn restored(&self, operator: &str) -> Option<Restored>;
    /// The time of the checkpoint the job was recovered from.
    fn restored_time(&self) -> Option<Timestamp>;
    /// Hands over `operator`'s state as of `cut`; taking it paused the
    /// worker for `pause`.
    fn submit(&self, operator: &str, cut: Cut, entries: Vec<Entry>, pause: std::time::Duration);
    /// Whether `operator` has handed over its state for `cut` on every
    /// worker (its gates open only then: an update let through on one worker
    /// may be exchanged to another whose instance has not yet taken its snapshot).
    fn submitted_everywhere(&self, operator: &str, cut: CheckpointId) -> bool;
    /// Calls `wake` whenever a cut is begun or abandoned (to schedule an
    /// operator whose frontier may already be at the cut's time).
    fn on_cut(&self, wake: Box<dyn Fn() + Send + Sync>);
}

thread_local! {
    static STORE: RefCell<Option<Rc<dyn StateStore>>> = const { RefCell::new(None) };
}

/// Installs `store` for the dataflows built next on this thread (a worker),
/// or removes it with `None`.
pub fn install(store: Option<Rc<dyn StateStore>>) {
    STORE.with(|s| *s.borrow_mut() = store);
}

/// The store installed on this thread, if any.
pub fn installed() -> Option<Rc<dyn StateStore>> {
    STORE.with(|s| s.borrow().clone())
}

/// Declares a stateful operator that cannot be checkpointed (if a store is installed).
pub(crate) fn unsupported(name: &str) {
    if let Some(store) = installed() {
        store.unsupported(name);
    }
}

/// Serializes a piece of state for an [`Entry`].
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).expect("operator state is plain data and serializes")
}

/// Deserializes a piece of state written by [`encode`].
///
/// # Panics
/// If the bytes are not a `T`: checkpoints are checksummed and carry the
/// dataflow's fingerprint, so this means a program changed its state types
/// without changing its structure.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> T {
    bincode::deserialize(bytes).expect("checkpointed state decodes as the operator's state type")
}

/// What a gate and its operator share.
struct Shared {
    /// The last checkpoint the operator has submitted.
    done: Cell<Option<CheckpointId>>,
    /// The gates to wake when the operator has submitted.
    gates: RefCell<Vec<Activator>>,
    /// The operator's registered name.
    name: RefCell<String>,
}

/// A checkpointable operator's link to the installed [`StateStore`].
pub(crate) struct Checkpointer {
    store: Rc<dyn StateStore>,
    shared: Rc<Shared>,
    name: String,
    /// Schedules the operator from another thread (its state coming back).
    waker: Option<timely::scheduling::SyncActivator>,
}

/// An operator's state, handed to a background thread to be serialized at a
/// cut ([`Checkpointer::snapshot_away`]).
pub(crate) struct Away<S> {
    cut: Cut,
    /// The time the worker spent handing it over.
    pause: std::time::Duration,
    back: std::sync::mpsc::Receiver<(S, Vec<Entry>, std::time::Duration)>,
}

/// Where an operator's state is while a snapshot may be taken of it.
pub(crate) enum Whereabouts<S> {
    /// With the operator.
    Home,
    /// Being serialized: the operator waits (its gates hold its input back
    /// anyway until its snapshot is taken on every worker).
    Away,
    /// Serialized and handed over: the operator takes it back.
    Back(S),
}

impl Checkpointer {
    /// A checkpointer for an operator about to be built, if a store is installed.
    pub(crate) fn new() -> Option<Self> {
        let store = installed()?;
        let shared = Rc::new(Shared {
            done: Cell::new(None),
            gates: RefCell::new(Vec::new()),
            name: RefCell::new(String::new()),
        });
        Some(Checkpointer { store, shared, name: String::new(), waker: None })
    }

    /// Gates `stream`, one of the operator's inputs (build the gates before the operator).
    pub(crate) fn gate<'scope, D: Data>(&self, stream: &EventStream<'scope, D>) -> EventStream<'scope, D> {
        gate(stream, Rc::clone(&self.store), Rc::clone(&self.shared))
    }

    /// Registers the operator under `name` at `address` in `scope`.
    pub(crate) fn register(&mut self, name: &str, address: &[usize], scope: &timely::dataflow::Scope<'_, Timestamp>) {
        self.name = format!("{name}@{address:?}");
        self.store.register(&self.name);
        let activator = scope.worker().sync_activator_for(address.to_vec());
        self.waker = Some(activator.clone());
        self.store.on_cut(Box::new(move || {
            let _ = activator.activate();
        }));
        *self.shared.name.borrow_mut() = self.name.clone();
    }

    /// Takes the state as of `cut` without pausing the worker: `state` is
    /// moved to a background thread, which `serialize`s it and hands it back;
    /// [`returned`](Self::returned) submits the entries and gives the state
    /// back. Meanwhile the operator must leave its input alone (nothing
    /// reaches it: its gates hold back what is at or after the cut, and all
    /// that was before it has been received) and the worker runs its other
    /// operators.
    pub(crate) fn snapshot_away<S, F>(&self, cut: Cut, state: S, serialize: F) -> Away<S>
    where
        S: Send + 'static,
        F: FnOnce(&S) -> Vec<Entry> + Send + 'static,
    {
        let started = std::time::Instant::now();
        let (tx, back) = std::sync::mpsc::sync_channel(1);
        let waker = self.waker.clone();
        std::thread::Builder::new()
            .name("highwater-snapshot".into())
            .spawn(move || {
                let serializing = std::time::Instant::now();
                let entries = serialize(&state);
                let _ = tx.send((state, entries, serializing.elapsed()));
                if let Some(w) = waker {
                    let _ = w.activate();
                }
            })
            .expect("starting a snapshot thread");
        Away { cut, pause: started.elapsed(), back }
    }

    /// Where the state handed away (if any) is; when it is back, its entries
    /// have been submitted and the gates opened.
    ///
    /// # Panics
    /// If the thread serializing it panicked.
    pub(crate) fn returned<S>(&self, away: &mut Option<Away<S>>) -> Whereabouts<S> {
        let Some(a) = away.as_ref() else { return Whereabouts::Home };
        match a.back.try_recv() {
            Ok((state, entries, serializing)) => {
                let a = away.take().expect("matched above");
                tracing::debug!(operator = %self.name, id = a.cut.id, ?serializing, "state serialized in the background");
                self.submitted(a.cut, entries, a.pause);
                Whereabouts::Back(state)
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => Whereabouts::Away,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                panic!("serializing {}'s state for checkpoint {} failed", self.name, a.cut.id)
            }
        }
    }

    /// Hands over the entries of `cut` and opens the gates.
    fn submitted(&self, cut: Cut, entries: Vec<Entry>, pause: std::time::Duration) {
        self.store.submit(&self.name, cut, entries, pause);
        self.shared.done.set(Some(cut.id));
        for gate in self.shared.gates.borrow().iter() {
            gate.activate();
        }
    }

    /// The state restored for this worker, with the time it was taken at.
    pub(crate) fn restored(&self) -> Option<(Timestamp, Restored)> {
        let time = self.store.restored_time()?;
        Some((time, self.store.restored(&self.name).unwrap_or_default()))
    }

    /// The cut to snapshot now that the operator's input watermark is
    /// `watermark` and it has fired everything that completes, if any.
    pub(crate) fn due(&self, watermark: Timestamp) -> Option<Cut> {
        self.store.cut_after(self.shared.done.get()).filter(|c| c.time <= watermark)
    }

    /// Takes the state as of `cut` with `snapshot`, hands it over, and opens the gates.
    pub(crate) fn snapshot(&self, cut: Cut, snapshot: impl FnOnce() -> Vec<Entry>) {
        let started = std::time::Instant::now();
        let entries = snapshot();
        self.submitted(cut, entries, started.elapsed());
    }
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer").field("name", &self.name).field("done", &self.shared.done.get()).finish()
    }
}

/// Passes the updates of `stream` below the pending cut and holds back the
/// others (and its capability at the cut) until the operator behind it has
/// submitted its state for the cut on every worker.
fn gate<'scope, D: Data>(
    stream: &EventStream<'scope, D>,
    store: Rc<dyn StateStore>,
    shared: Rc<Shared>,
) -> EventStream<'scope, D> {
    let scope = stream.scope();
    let mut builder = OperatorBuilder::new("CheckpointGate".to_owned(), scope);
    let mut input = builder.new_input(stream.inner.clone(), Pipeline);
    let (out, gated) = builder.new_output();
    let mut out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<D>>>>::from(out);
    let address = builder.operator_info().address;
    let activator = scope.activator_for(std::rc::Rc::clone(&address));
    shared.gates.borrow_mut().push(scope.activator_for(std::rc::Rc::clone(&address)));
    let waker = scope.worker().sync_activator_for(address.to_vec());
    store.on_cut(Box::new(move || {
        let _ = waker.activate();
    }));

    builder.build(move |mut capabilities| {
        let mut cap = capabilities.pop();
        let mut stash: BTreeMap<Timestamp, Vec<Vec<Update<D>>>> = BTreeMap::new();
        // The last cut the operator has submitted on every worker.
        let mut open_upto: Option<CheckpointId> = None;
        // After a recovery from a cut at `T`, updates before `T` can only be
        // replays of restored collections.
        let replayed_below = store.restored_time().unwrap_or(0);
        move |frontiers| {
            let mut limit = None;
            while let Some(cut) = store.cut_after(open_upto).filter(|c| !c.is_final()) {
                let local = shared.done.get().is_some_and(|d| d >= cut.id);
                if local && store.submitted_everywhere(&shared.name.borrow(), cut.id) {
                    open_upto = Some(cut.id);
                } else {
                    if local {
                        // Waiting for the other workers' instances.
                        activator.activate_after(std::time::Duration::from_millis(1));
                    }
                    limit = Some(cut.time);
                    break;
                }
            }
            let mut output = out.activate();
            // Held-back updates first: per time, updates go out in the order they came.
            while let Some(entry) = stash.first_entry() {
                if limit.is_some_and(|l| *entry.key() >= l) {
                    break;
                }
                let (time, batches) = entry.remove_entry();
                let held = cap.as_ref().expect("stashed updates are held under the gate's capability").delayed(&time);
                let mut session = output.session(&held);
                for mut batch in batches {
                    session.give_container(&mut batch);
                }
            }
            input.for_each_stamp(|at, data| {
                let time = arrival_time(&at);
                if time < replayed_below {
                    // A replay of state the operator has restored (see
                    // `EventStream::as_collection`): already in its state.
                    data.for_each(Vec::clear);
                    return;
                }
                for batch in data {
                    if limit.is_some_and(|l| time >= l) {
                        stash.entry(time).or_default().push(std::mem::take(batch));
                    } else {
                        output.session(&at).give_container(batch);
                    }
                }
            });
            let frontier = frontiers[0].frontier().as_option().copied();
            let target = [frontier, limit, stash.keys().next().copied()].into_iter().flatten().min();
            match target {
                Some(t) => {
                    if let Some(c) = cap.as_mut() {
                        if *c.time() < t {
                            c.downgrade(&t);
                        }
                    }
                }
                None => cap = None,
            }
        }
    });
    EventStream::new(gated)
}
