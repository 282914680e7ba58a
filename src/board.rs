//! Receipts and watermarks between the processes of a job, for flow
//! control: every few milliseconds, one worker per process broadcasts how
//! many records its process's workers have taken from each process's
//! workers ([`InFlight::receipts`]) and where its source partitions stand
//! for watermark alignment ([`Alignment::summary`]); every process learns
//! how many of the records it sent the others have taken
//! ([`InFlight::acknowledge`]) and the others' watermarks
//! ([`Alignment::learn`]). A small dataflow of its own, built on every
//! worker after the job's, and closed once the job's dataflows have
//! completed.

use std::time::{Duration, Instant};

use highwater_operators::flow::InFlight;

use crate::source::{Alignment, Span};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};

/// How often a process reports its receipts (when they changed).
const EVERY: Duration = Duration::from_millis(2);

/// How long a worker waits for the other processes to close their boards.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// A process's report: its index, the records its workers have taken from
/// each process's workers, and by alignment group the watermarks of its
/// active source partitions.
type Report = (usize, Vec<u64>, Watermarks);

/// By alignment group, the span of a process's active source partitions.
type Watermarks = Vec<(String, Option<Span>)>;

/// One worker's end of the receipts' exchange.
pub(crate) struct Board {
    input: InputHandle<u64, CapacityContainerBuilder<Vec<Report>>>,
    probe: ProbeHandle<u64>,
    in_flight: InFlight,
    alignment: Alignment,
    /// Whether this worker reports for its process (its first worker).
    reports: bool,
    last: (Instant, Vec<u64>, Watermarks),
    /// The board's dataflow.
    pub(crate) dataflow: usize,
}

impl Board {
    /// Builds the board on `worker`; `reports` on one worker per process.
    pub(crate) fn build(
        worker: &mut timely::worker::Worker,
        in_flight: InFlight,
        alignment: Alignment,
        reports: bool,
    ) -> Board {
        let dataflow = worker.next_dataflow_index();
        let process = in_flight.process();
        let learn = in_flight.clone();
        let aligned = alignment.clone();
        let (input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<Report>>();
            let (probe, _) = stream
                .broadcast()
                .inspect(move |(from, receipts, watermarks)| {
                    if let Some(mine) = receipts.get(process) {
                        learn.acknowledge(*from, *mine);
                    }
                    if *from != process {
                        aligned.learn(*from, watermarks);
                    }
                })
                .probe();
            (input, probe)
        });
        Board { input, probe, in_flight, alignment, reports, last: (Instant::now(), Vec::new(), Vec::new()), dataflow }
    }

    /// Reports this process's receipts and watermarks if they changed and
    /// it is time.
    pub(crate) fn tick(&mut self) {
        if !self.reports || self.last.0.elapsed() < EVERY {
            return;
        }
        let receipts = self.in_flight.receipts();
        let watermarks = self.alignment.summary();
        if receipts != self.last.1 || watermarks != self.last.2 {
            self.input.send((self.in_flight.process(), receipts.clone(), watermarks.clone()));
            self.input.flush();
        }
        self.last = (Instant::now(), receipts, watermarks);
    }

    /// Closes the board and steps `worker` until every process has closed
    /// its own (or [`CLOSE_TIMEOUT`] has passed: then it is dropped).
    pub(crate) fn close(self, worker: &mut timely::worker::Worker) {
        let Board { input, probe, dataflow, .. } = self;
        input.close();
        if !step_until_done(worker, &probe, dataflow, CLOSE_TIMEOUT) {
            tracing::warn!("the other processes did not close their flow-control boards: dropped");
        }
    }
}

/// Steps `worker` until `probe`'s frontier is empty; if that takes longer
/// than `timeout` (another process failed), drops `dataflow` and returns
/// false.
pub(crate) fn step_until_done(
    worker: &mut timely::worker::Worker,
    probe: &ProbeHandle<u64>,
    dataflow: usize,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while !probe.done() {
        if Instant::now() > deadline {
            worker.drop_dataflow(dataflow);
            return false;
        }
        worker.step_or_park(Some(Duration::from_millis(5)));
    }
    true
}
