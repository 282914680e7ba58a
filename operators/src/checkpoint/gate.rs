//! Checkpoint gates: where a checkpointed operator's input waits while the
//! operator takes its snapshot, and the key exchange that comes before them.

use std::collections::BTreeMap;
use std::rc::Rc;

use timely::communication::{Pull, Push};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{LogPuller, LogPusher, ParallelizationContract};
use timely::dataflow::channels::Message;
use timely::dataflow::operators::generic::builder_rc::OperatorBuilder;
use timely::dataflow::operators::generic::OutputBuilder;
use timely::logging::TimelyLogger;
use timely::worker::Worker;

use super::{CheckpointId, Shared, StateStore};
use crate::key::Data;
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, Timestamp};

/// The messages of an event stream's channels.
type Batch<D> = Message<Timestamp, Vec<Update<D>>>;

/// How a keyed operator reads its input: exchanged by key on the way in
/// (`Exchange`, the routing function), or in place (`Local`) because its
/// checkpoint gate has exchanged it already. One type for both, so that an
/// operator's input handle has the same type with checkpoints or without.
pub enum KeyPact<F> {
    /// Exchanged by the routing function (see [`crate::key::route`]).
    Exchange(F),
    /// Read on the worker it is on.
    Local,
}

impl<F> std::fmt::Debug for KeyPact<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyPact::Exchange(_) => "KeyPact::Exchange",
            KeyPact::Local => "KeyPact::Local",
        })
    }
}

impl<D, F> ParallelizationContract<Timestamp, Vec<Update<D>>> for KeyPact<F>
where
    D: Data,
    F: FnMut(&Update<D>) -> u64 + 'static,
{
    type Pusher = Box<dyn Push<Batch<D>>>;
    type Puller = LogPuller<Box<dyn Pull<Batch<D>>>>;

    fn connect(
        self,
        worker: &Worker,
        identifier: usize,
        address: Rc<[usize]>,
        logging: Option<TimelyLogger>,
    ) -> (Self::Pusher, Self::Puller) {
        match self {
            KeyPact::Exchange(route) => crate::flow::exchange(route).connect(worker, identifier, address, logging),
            KeyPact::Local => {
                let (push, pull) = worker.pipeline::<Batch<D>>(identifier, address);
                let index = worker.index();
                let push = LogPusher::new(push, index, index, identifier, logging.clone());
                (Box::new(push), LogPuller::new(Box::new(pull), index, identifier, logging))
            }
        }
    }
}

/// Passes the updates of `stream` (read through `pact`) below the pending
/// cut and holds back the others, and its capability at the cut, until the
/// operator behind it on this worker has submitted its state for the cut.
///
/// The gate sits after the operator's exchange, so what it holds back can
/// only reach its own worker's instance of the operator: a gate opens as soon
/// as that instance has taken its snapshot, without waiting for the others.
pub(super) fn gate<'scope, D, P>(
    stream: &EventStream<'scope, D>,
    pact: P,
    store: Rc<dyn StateStore>,
    shared: Rc<Shared>,
) -> EventStream<'scope, D>
where
    D: Data,
    P: ParallelizationContract<Timestamp, Vec<Update<D>>>,
{
    let scope = stream.scope();
    let mut builder = OperatorBuilder::new("CheckpointGate".to_owned(), scope);
    let mut input = builder.new_input(stream.inner.clone(), pact);
    let (out, gated) = builder.new_output();
    let mut out = OutputBuilder::<_, CapacityContainerBuilder<Vec<Update<D>>>>::from(out);
    let address = builder.operator_info().address;
    shared.gates.borrow_mut().push(scope.activator_for(Rc::clone(&address)));
    let waker = scope.worker().sync_activator_for(address.to_vec());
    store.on_cut(Box::new(move || {
        let _ = waker.activate();
    }));

    builder.build(move |mut capabilities| {
        let mut cap = capabilities.pop();
        let mut stash: BTreeMap<Timestamp, Vec<Vec<Update<D>>>> = BTreeMap::new();
        // This activation's input, read before the cut is looked up.
        let mut arrived: Vec<(Timestamp, Vec<Update<D>>)> = Vec::new();
        // The last cut the operator has submitted.
        let mut open_upto: Option<CheckpointId> = None;
        // After a recovery from a cut at `T`, updates before `T` can only be
        // replays of restored collections.
        let replayed_below = store.restored_time().unwrap_or(0);
        move |frontiers| {
            // The input first, then the cut. Sources publish a time before
            // they emit at it, and a cut lies above every time published when
            // it begins, so an update at or after a cut's time was sent after
            // the cut began: once it has been read here, the cut is known. The
            // other way round, a cut begun (and an update past it sent by
            // another worker) while this gate reads would go unnoticed.
            input.for_each_stamp(|at, data| {
                let time = arrival_time(&at);
                if time < replayed_below {
                    // A replay of state the operator has restored (see
                    // `EventStream::as_collection`): already in its state.
                    data.for_each(Vec::clear);
                    return;
                }
                arrived.extend(data.map(|batch| (time, std::mem::take(batch))));
            });
            // While the processes choose a cut, and then the cuts begun here
            // (in this order: choosing ends when the cut begins).
            let mut limit = store.choosing();
            while let Some(cut) = store.cut_after(open_upto).filter(|c| !c.is_final()) {
                if shared.done.get().is_some_and(|d| d >= cut.id) {
                    open_upto = Some(cut.id);
                } else {
                    limit = Some(limit.map_or(cut.time, |l| l.min(cut.time)));
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
            for (time, mut batch) in arrived.drain(..) {
                if limit.is_some_and(|l| time >= l) {
                    stash.entry(time).or_default().push(batch);
                } else {
                    let at =
                        cap.as_ref().expect("an update arrived: the input frontier is at or below it").delayed(&time);
                    output.session(&at).give_container(&mut batch);
                }
            }
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
