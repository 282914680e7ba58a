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
//! operators ([`exchange`]): a pusher counts the records it sends to a
//! worker of its own process, a puller the records it takes that came from
//! one. Records exchanged with other processes are not counted (each
//! process bounds what it holds for its own workers).

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
    /// This process's workers: `first..first + threads`.
    first: usize,
    threads: usize,
}

impl InFlight {
    /// Counts the records in flight between the workers of the process
    /// `config` describes: every exchange of the operators then counts, and
    /// the sources pause on it. [`Job`](../../highwater/struct.Job.html)
    /// does this itself; a program that calls `timely::execute` directly
    /// calls it on its configuration first.
    pub fn configure(config: &mut timely::Config) -> InFlight {
        let (first, threads) = match &config.communication {
            timely::CommunicationConfig::Thread => (0, 1),
            timely::CommunicationConfig::Process(n) | timely::CommunicationConfig::ProcessBinary(n) => (0, *n),
            timely::CommunicationConfig::Cluster { threads, process, .. } => (process * threads, *threads),
        };
        let counts = InFlight(Arc::new(Counts { first, threads, ..Counts::default() }));
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

    /// Records sent to this process's workers and not yet taken.
    pub fn records(&self) -> u64 {
        // Read in this order, a record taken between the two reads is not
        // counted twice as taken.
        let received = self.0.received.load(Ordering::Acquire);
        self.0.sent.load(Ordering::Acquire).saturating_sub(received)
    }

    /// The number of workers of this process.
    pub fn threads(&self) -> usize {
        self.0.threads.max(1)
    }

    fn is_local(&self, worker: usize) -> bool {
        (self.0.first..self.0.first + self.0.threads).contains(&worker)
    }
}

/// Counts what it pushes to a worker of its process.
struct CountingPush<P> {
    inner: P,
    counts: Option<Arc<Counts>>,
}

impl<T, D, P: Push<Message<T, Vec<D>>>> Push<Message<T, Vec<D>>> for CountingPush<P> {
    fn push(&mut self, message: &mut Option<Message<T, Vec<D>>>) {
        if let (Some(counts), Some(message)) = (self.counts.as_ref(), message.as_ref()) {
            counts.sent.fetch_add(message.data.len() as u64, Ordering::AcqRel);
        }
        self.inner.push(message);
    }
}

/// Counts what it takes that came from a worker of its process.
struct CountingPull<P> {
    inner: P,
    counts: Option<InFlight>,
}

impl<T, D, P: Pull<Message<T, Vec<D>>>> Pull<Message<T, Vec<D>>> for CountingPull<P> {
    fn pull(&mut self) -> &mut Option<Message<T, Vec<D>>> {
        let message = self.inner.pull();
        if let (Some(counts), Some(m)) = (self.counts.as_ref(), message.as_ref()) {
            if counts.is_local(m.from) {
                counts.0.received.fetch_add(m.data.len() as u64, Ordering::AcqRel);
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
        let (senders, receiver) = worker.allocate::<Batch<D>>(identifier, address);
        let index = worker.index();
        let senders: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(target, sender)| {
                let sender = LogPusher::new(sender, index, target, identifier, logging.clone());
                let local = counts.as_ref().filter(|c| c.is_local(target)).map(|c| Arc::clone(&c.0));
                CountingPush { inner: sender, counts: local }
            })
            .collect();
        let distributor =
            DrainContainerDistributor::<CapacityContainerBuilder<Vec<Update<D>>>, F>::new(self.0, worker.peers());
        let pusher = timely::dataflow::channels::pushers::Exchange::new(senders, distributor);
        let puller = CountingPull { inner: receiver, counts };
        (Box::new(pusher), LogPuller::new(Box::new(puller), index, identifier, logging))
    }
}
