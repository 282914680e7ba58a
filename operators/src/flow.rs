//! Records in flight between workers: pushed into an exchange and not yet
//! taken out by the operator they go to. Sources pause while too many are
//! in flight (credit-based flow control), so a slow sink or operator slows
//! them down and memory stays bounded.
//!
//! What an operator has taken out of its input is its own (state, or work in
//! hand), not in flight: a window waiting for the watermark holds its
//! records as state, and the sources read on. Only records that sit in a
//! channel because their operator has not taken them (it is busy, or its
//! worker is blocked writing to a slow output) count. The count is kept per
//! process ([`InFlight`], shared by its workers through the timely
//! configuration, see [`InFlight::configure`]) by every exchange of the
//! operators ([`exchange`]): a pusher counts the records it sends to each
//! process, a puller the records it takes from each. Records sent to another
//! process count as in flight until that process reports having taken them:
//! a `Job` of several processes exchanges those receipts between its
//! processes every few milliseconds ([`InFlight::receipts`],
//! [`InFlight::acknowledge`]); without such reports (a computation run
//! without a `Job`), only the records exchanged within the process count.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use timely::communication::{Pull, Push};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{LogPuller, LogPusher, ParallelizationContract};
use timely::dataflow::channels::pushers::exchange::DrainContainerDistributor;
use timely::dataflow::channels::Message;
use timely::logging::TimelyLogger;
use timely::worker::Worker;

use crate::key::Data;
use crate::stream::Update;
use crate::time::Timestamp;

/// The key under which the [`InFlight`] count sits in the timely worker
/// configuration.
const KEY: &str = "highwater::flow::in_flight";

/// The records in flight between the workers of one process.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    received: AtomicU64,
    /// This process's index and workers (`process · threads ..`).
    process: usize,
    threads: usize,
    /// Whether exchanged records are serialized (several processes, or
    /// timely's binary process mode).
    serializes: bool,
    /// Per process: records sent to its workers, records taken from its
    /// workers, and the records it has reported taking from this process.
    sent_to: Vec<AtomicU64>,
    received_from: Vec<AtomicU64>,
    acknowledged: Vec<AtomicU64>,
    /// Whether the processes report their receipts (else records sent to
    /// other processes do not count).
    reported: std::sync::atomic::AtomicBool,
}

impl InFlight {
    /// Counts the records in flight between the workers of the process
    /// `config` describes: every exchange of the operators then counts, and
    /// the sources pause on it. [`Job`](../../highwater/struct.Job.html)
    /// does this itself; a program that calls `timely::execute` directly
    /// calls it on its configuration first.
    pub fn configure(config: &mut timely::Config) -> InFlight {
        let (process, processes, threads) = match &config.communication {
            timely::CommunicationConfig::Thread => (0, 1, 1),
            timely::CommunicationConfig::Process(n) | timely::CommunicationConfig::ProcessBinary(n) => (0, 1, *n),
            timely::CommunicationConfig::Cluster { threads, process, addresses, .. } => {
                (*process, addresses.len(), *threads)
            }
        };
        let serializes = match &config.communication {
            timely::CommunicationConfig::ProcessBinary(_) => true,
            timely::CommunicationConfig::Cluster { addresses, .. } => addresses.len() > 1,
            _ => false,
        };
        let per_process = || (0..processes).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        let counts = InFlight(Arc::new(Counts {
            process,
            threads: threads.max(1),
            serializes,
            sent_to: per_process(),
            received_from: per_process(),
            acknowledged: per_process(),
            ..Counts::default()
        }));
        config.worker.set(KEY.to_owned(), counts.clone());
        counts
    }

    /// The count of the computation `worker` belongs to, if it was configured.
    pub fn of_worker(worker: &Worker) -> Option<InFlight> {
        worker.config().get::<InFlight>(KEY).cloned()
    }

    /// The count of the computation `scope` belongs to, if it was configured.
    pub fn of(scope: &timely::dataflow::Scope<'_, Timestamp>) -> Option<InFlight> {
        scope.worker().config().get::<InFlight>(KEY).cloned()
    }

    /// Records this process sent and the workers they went to have not yet
    /// taken: to its own workers, and (if the processes report their
    /// receipts) to other processes' workers.
    pub fn records(&self) -> u64 {
        // Read in this order, a record taken between the two reads is not
        // counted twice as taken.
        let received = self.0.received.load(Ordering::Acquire);
        let mut records = self.0.sent.load(Ordering::Acquire).saturating_sub(received);
        if self.0.reported.load(Ordering::Acquire) {
            for (sent, acknowledged) in self.0.sent_to.iter().zip(&self.0.acknowledged) {
                let acknowledged = acknowledged.load(Ordering::Acquire);
                records += sent.load(Ordering::Acquire).saturating_sub(acknowledged);
            }
        }
        records
    }

    /// The number of workers of this process.
    pub fn threads(&self) -> usize {
        self.0.threads
    }

    /// This process's index.
    pub fn process(&self) -> usize {
        self.0.process
    }

    /// The number of processes.
    pub fn processes(&self) -> usize {
        self.0.sent_to.len().max(1)
    }

    /// The records this process's workers have taken from each process's
    /// workers so far, by process: what it reports to the others.
    pub fn receipts(&self) -> Vec<u64> {
        self.0.received_from.iter().map(|r| r.load(Ordering::Acquire)).collect()
    }

    /// Process `from` reports having taken `records` from this process's
    /// workers so far; from now on, records sent to other processes count
    /// until they report them taken.
    pub fn acknowledge(&self, from: usize, records: u64) {
        if let Some(acknowledged) = self.0.acknowledged.get(from) {
            acknowledged.fetch_max(records, Ordering::AcqRel);
        }
        self.0.reported.store(true, Ordering::Release);
    }

    /// Whether the computation's exchanges serialize records (bincode):
    /// several processes, or timely's binary process mode.
    pub fn serializes(&self) -> bool {
        self.0.serializes
    }

    fn process_of(&self, worker: usize) -> usize {
        worker / self.0.threads
    }
}

/// Counts what it pushes to one worker: as sent within the process, or to
/// the worker's process.
struct CountingPush<P> {
    inner: P,
    counter: Option<(Arc<Counts>, Option<usize>)>,
}

impl<T, D, P: Push<Message<T, Vec<D>>>> Push<Message<T, Vec<D>>> for CountingPush<P> {
    fn push(&mut self, message: &mut Option<Message<T, Vec<D>>>) {
        if let (Some((counts, remote)), Some(message)) = (self.counter.as_ref(), message.as_ref()) {
            let n = message.data.len() as u64;
            match remote {
                None => counts.sent.fetch_add(n, Ordering::AcqRel),
                Some(process) => counts.sent_to[*process].fetch_add(n, Ordering::AcqRel),
            };
        }
        self.inner.push(message);
    }
}

/// Counts what it takes, by the process of the worker it came from.
struct CountingPull<P> {
    inner: P,
    counts: Option<InFlight>,
}

impl<T, D, P: Pull<Message<T, Vec<D>>>> Pull<Message<T, Vec<D>>> for CountingPull<P> {
    fn pull(&mut self) -> &mut Option<Message<T, Vec<D>>> {
        let message = self.inner.pull();
        if let (Some(counts), Some(m)) = (self.counts.as_ref(), message.as_ref()) {
            let n = m.data.len() as u64;
            let from = counts.process_of(m.from);
            if from == counts.0.process {
                counts.0.received.fetch_add(n, Ordering::AcqRel);
            } else if let Some(received) = counts.0.received_from.get(from) {
                received.fetch_add(n, Ordering::AcqRel);
            }
        }
        message
    }
}

type Batch<D> = Message<Timestamp, Vec<Update<D>>>;

/// An exchange of updates by the routing hash `route` gives each (see
/// [`crate::key::route`]), counting what is in flight if the computation
/// was configured with an [`InFlight`] count; otherwise timely's
/// `Exchange`.
#[derive(Debug)]
pub struct CountedExchange<F>(pub F);

/// Refuses (panics while the dataflow is built, before any record is sent)
/// a record type that bincode cannot read back ([`crate::wire`]): timely
/// would panic on its first record on the other side, with no word of the
/// type. Checked once per type and thread.
fn refuse_unless_exchangeable<D: Data>() {
    thread_local! {
        static CHECKED: std::cell::RefCell<rustc_hash::FxHashSet<std::any::TypeId>> = Default::default();
    }
    if CHECKED.with(|c| c.borrow_mut().insert(std::any::TypeId::of::<D>())) {
        if let Err(e) = crate::wire::wire_check::<D>() {
            panic!("{e}");
        }
    }
}

/// The pact every operator exchanges its input with: see [`CountedExchange`].
pub fn exchange<D, F: FnMut(&Update<D>) -> u64 + 'static>(route: F) -> CountedExchange<F> {
    CountedExchange(route)
}

impl<D, F> ParallelizationContract<Timestamp, Vec<Update<D>>> for CountedExchange<F>
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
        let counts = InFlight::of_worker(worker);
        if counts.as_ref().is_some_and(InFlight::serializes) {
            refuse_unless_exchangeable::<D>();
        }
        let (senders, receiver) = worker.allocate::<Batch<D>>(identifier, address);
        let index = worker.index();
        let senders: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(target, sender)| {
                let sender = LogPusher::new(sender, index, target, identifier, logging.clone());
                let counter = counts.as_ref().map(|c| {
                    let process = c.process_of(target);
                    (Arc::clone(&c.0), (process != c.0.process).then_some(process))
                });
                CountingPush { inner: sender, counter }
            })
            .collect();
        let distributor =
            DrainContainerDistributor::<CapacityContainerBuilder<Vec<Update<D>>>, F>::new(self.0, worker.peers());
        let pusher = timely::dataflow::channels::pushers::Exchange::new(senders, distributor);
        let puller = CountingPull { inner: receiver, counts };
        (Box::new(pusher), LogPuller::new(Box::new(puller), index, identifier, logging))
    }
}
