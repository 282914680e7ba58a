//! Running a job in one call: its workers on the layout timely's `-w -n -p
//! -h` describe, checkpointed if asked, until its sources end or it fails.
//!
//! [`Job::run`] does what a checkpointed program otherwise writes out in a
//! fixed order: it opens the checkpoints (as the job's coordinator on process
//! 0, as a member on the others), configures the timely computation with
//! them, connects the processes, builds every worker's dataflows with the
//! program's closure, declares them built, steps the workers until their
//! sources end or something fails for good (a source, a checkpoint), and
//! waits for the final checkpoint and the sinks' commit. The same path runs
//! jobs without checkpoints: their sources' failures stop them too.
//!
//! ```
//! use std::sync::Arc;
//!
//! use highwater::checkpoint::CheckpointConfig;
//! use highwater::prelude::*;
//! use highwater::Job;
//!
//! let dir = std::env::temp_dir().join(format!("highwater-job-doc-{}", std::process::id()));
//! let counts = Collected::default();
//! let sink = counts.clone();
//! let report = Job::new(timely::Config::process(2))
//!     .checkpointed(CheckpointConfig::new(&dir).recovering())
//!     .run(move |worker| {
//!         let sink = sink.clone();
//!         worker.dataflow(|scope| {
//!             let clicks = vec![vec![(1u32, 1_000u64), (2, 2_500)], vec![(1, 3_000), (1, 12_000)]];
//!             let source = Arc::new(MemorySource::new(clicks));
//!             let clicks = read(scope, source, |c: &(u32, u64)| c.1, SourceOptions::default(), &SourceMetrics::default(), None)?;
//!             let per_user = clicks.events.window(Tumbling::of(10.secs())).key_by(|c: &(u32, u64)| c.0).aggregate(Count);
//!             collect(&per_user.results, &sink);
//!             Ok::<_, highwater::source::SourceError>(())
//!         })
//!     })
//!     .unwrap();
//! assert!(report.final_checkpoint);
//! let mut rows: Vec<_> = counts.rows().into_iter().map(|r| (r.window.start, r.key, r.value)).collect();
//! rows.sort();
//! assert_eq!(rows, vec![(0, 1, 2), (0, 2, 1), (10_000, 1, 1)]);
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::activity::Activity;
use crate::checkpoint::{CheckpointConfig, CheckpointError, Checkpoints};
use crate::cluster::{checkpoint_membership, config_from_args, ClusterError, StartError};
pub use crate::failures::Failures;
use crate::failures::FAILURES_KEY;
use crate::latency::Latency;
use crate::source::{Alignment, Failing};
use crate::totals::{Finished, Totals};
use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::flow::InFlight;

/// Why a job did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The layout's arguments are wrong.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The workers could not be started (e.g. the processes did not connect).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The checkpoints could not be opened, restored or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Building a worker's dataflows failed, or the job stopped because
    /// something failed for good (a source, a checkpoint).
    #[error("worker {worker}: {error}")]
    Worker {
        /// The worker (its index in the job).
        worker: usize,
        /// What failed.
        error: String,
    },
    /// The check given to [`Job::verifying`] failed.
    #[error("{0}")]
    Verify(String),
    /// A worker panicked.
    #[error("a worker panicked: {0}")]
    Panicked(String),
    /// The workers ended without the job's final checkpoint being written.
    #[error("the job ended without writing its final checkpoint")]
    Unfinished,
}

/// What a job's run in this process gave.
#[derive(Debug)]
pub struct JobReport<T> {
    /// What the program's closure returned on each of this process's
    /// workers, in worker order.
    pub outputs: Vec<T>,
    /// The checkpoint the job resumed from, if it did.
    pub recovered_from: Option<CheckpointId>,
    /// The checkpoints this run wrote.
    pub checkpoints: Vec<CheckpointId>,
    /// Whether the job's final checkpoint (taken when its sources ended)
    /// is written: always, for a checkpointed job that returns `Ok`.
    pub final_checkpoint: bool,
    /// The job had completed before this run (its latest checkpoint is the
    /// final one): its dataflows were built (its sinks recovered) but not
    /// run.
    pub already_complete: bool,
    /// The job's counters ([`Totals`]) summed over every worker of every
    /// process, on every process: each source's `records`, `dead_letters`
    /// and `late_read`, each operator's `expired` entries (with a state
    /// time-to-live), and what the program counted; and gauges as they
    /// stood at the end (`<operator>.state_entries`, each source partition's
    /// `<source>/<index>.watermark`, `.offset`, `.partition_records`). Empty if the job had
    /// already completed, or if another process did not report its sums.
    pub totals: BTreeMap<String, u64>,
}

/// What [`Job::verifying`] runs.
type Verify = Box<dyn FnOnce(&Checkpoints) -> Result<(), String>>;

/// A job: a timely computation on a layout of workers and processes,
/// checkpointed if asked, run to its end by [`run`](Self::run).
pub struct Job {
    config: timely::Config,
    checkpoints: Option<CheckpointConfig>,
    coordinator: Option<String>,
    verify: Option<Verify>,
    in_flight: InFlight,
    alignment: Alignment,
    latency: Option<Latency>,
    totals: Totals,
    activity: Option<Activity>,
    checkpoint_stats: crate::checkpoint::CheckpointStats,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("config", &self.config.communication)
            .field("checkpoints", &self.checkpoints)
            .field("coordinator", &self.coordinator)
            .finish_non_exhaustive()
    }
}

/// The timely configuration entry that marks a computation run by a [`Job`].
const JOB_KEY: &str = "highwater.job";

/// The marker's value.
#[derive(Clone, Debug)]
struct InJob;

/// Whether the computation of a worker with `config` runs in a [`Job`]:
/// misuse messages then name the `Job`'s builder methods.
pub(crate) fn in_job(config: &timely::WorkerConfig) -> bool {
    config.get::<InJob>(JOB_KEY).is_some()
}

impl Job {
    /// A job on the layout `config` describes (`timely::Config::process(n)`,
    /// or a cluster).
    pub fn new(config: timely::Config) -> Self {
        let mut config = config;
        config.worker.set(JOB_KEY.to_owned(), InJob);
        let in_flight = InFlight::configure(&mut config);
        let alignment = Alignment::configure(&mut config);
        let totals = Totals::default();
        totals.configure(&mut config.worker);
        // Calls to services run on the job's own runtime, stopped with it.
        #[cfg(feature = "enrich")]
        crate::enrich::EnrichRuntime::configure(&mut config.worker);
        Job {
            config,
            checkpoints: None,
            coordinator: None,
            verify: None,
            in_flight,
            alignment,
            latency: None,
            totals,
            activity: None,
            checkpoint_stats: Default::default(),
        }
    }

    /// A job on the layout timely's arguments describe: `-w` workers per
    /// process, `-n` processes, `-p` this process's index, `-h` a file of
    /// `host:port` lines. `args` may be the whole command line
    /// (`std::env::args()`): timely's arguments are those after `--`, or
    /// without a `--` all of them but a leading program name
    /// ([`timely_args`](crate::cluster::timely_args)).
    ///
    /// ```
    /// let args: Vec<String> = ["my-job", "--input", "in.jsonl", "--", "-w", "2"].map(String::from).into();
    /// let job = highwater::Job::from_args(&args).unwrap();
    /// # let _ = job;
    /// ```
    pub fn from_args(args: &[String]) -> Result<Self, ClusterError> {
        Ok(Job::new(config_from_args(crate::cluster::timely_args(args))?))
    }

    /// Keeps the keyed state of the job's operators on `backend` (memory by
    /// default; [`Backend::RocksDb`](crate::operators::state::Backend) with
    /// the `rocksdb` feature, for state larger than memory).
    pub fn state_backend(mut self, backend: crate::operators::state::Backend) -> Self {
        backend.configure(&mut self.config.worker);
        self
    }

    /// A job-wide state time-to-live (as Flink's `table.exec.state.ttl`):
    /// the operators whose state no watermark releases (unwindowed joins,
    /// upsert tables, aggregations by key, user keyed processes) and that
    /// are not given one of their own
    /// ([`EventStream::state_ttl`](crate::operators::EventStream::state_ttl))
    /// forget their entries `ttl` of event time after their last write
    /// (see [`StateTtl`](crate::operators::state::StateTtl)). What expires
    /// is counted in [`JobReport::totals`] as `<operator>.expired`.
    pub fn state_ttl(mut self, ttl: crate::operators::state::StateTtl) -> Self {
        ttl.configure(&mut self.config.worker);
        self
    }

    /// A job-wide allowed lateness (a `Duration`, or milliseconds): every
    /// operator with a lateness (windows, patterns, upsert tables, as-of,
    /// interval and window joins) that is not given one of its own
    /// ([`EventStream::allowed_lateness`](crate::operators::EventStream::allowed_lateness))
    /// takes records up to `lateness` behind the watermark, as Flink's
    /// `allowedLateness` on each window would. Later records still go to
    /// each operator's `late` output, and each operator's count of them to
    /// [`JobReport::totals`] (`<operator>.late`).
    pub fn allowed_lateness(mut self, lateness: impl crate::time::IntoMillis) -> Self {
        crate::operators::time::AllowedLateness(lateness.into_millis()).configure(&mut self.config.worker);
        self
    }

    /// Checkpoints the job as `config` says.
    pub fn checkpointed(mut self, config: CheckpointConfig) -> Self {
        self.checkpoints = Some(config);
        self
    }

    /// The records in flight between this process's workers, which its
    /// sources pause on (flow control; for progress reports).
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.clone()
    }

    /// The counters of the job in this process, by name, as they count
    /// (for progress reports; [`JobReport::totals`] has the job's sums).
    pub fn totals(&self) -> Totals {
        self.totals.clone()
    }

    /// Watermark alignment of the job's sources (those that take the job's
    /// setting, as they do by default): a partition whose watermark is more
    /// than `drift` of event time ahead of the job's combined watermark
    /// waits until the others catch up, so that the operators hold a
    /// bounded amount of state; `None` turns it off. On by default with
    /// [`DEFAULT_MAX_DRIFT`](crate::source::DEFAULT_MAX_DRIFT) (10 s). See
    /// [`SourceOptions::max_drift`](crate::source::SourceOptions::max_drift).
    pub fn max_drift(self, drift: Option<std::time::Duration>) -> Self {
        self.alignment.set_max_drift(drift);
        self
    }

    /// The job's watermark alignment: where its sources stand (for
    /// progress reports, e.g. [`Alignment::greatest_drift`]).
    pub fn alignment(&self) -> Alignment {
        self.alignment.clone()
    }

    /// Measures the job's latency ([`crate::latency`]): its sources keep
    /// clocks, its sinks record how long after a record was read, and after
    /// the watermark passed an update's time, they emitted it. Read it with
    /// [`latency`](Self::latency) (before [`run`](Self::run): a handle that
    /// sees the measurements as they are made).
    pub fn measuring_latency(mut self) -> Self {
        if self.latency.is_none() {
            self.latency = Some(Latency::configure(&mut self.config));
        }
        self
    }

    /// Observes what each operator does ([`crate::activity`]): its
    /// activations, time busy and records between workers, from timely's
    /// event log, for the metrics and the status page. Read it through
    /// [`activity`](Self::activity).
    pub fn observing(mut self) -> Self {
        self.activity.get_or_insert_with(Activity::default);
        self
    }

    /// What the job's operators do in this process, if it observes them
    /// ([`observing`](Self::observing)).
    pub fn activity(&self) -> Option<Activity> {
        self.activity.clone()
    }

    /// What the job's checkpoints did in this process (written, failed, the
    /// latest one's duration and size), for the metrics and the status
    /// page; counts nothing if the job is not checkpointed.
    pub fn checkpoint_stats(&self) -> crate::checkpoint::CheckpointStats {
        self.checkpoint_stats.clone()
    }

    /// The job's latency measurement, if it measures
    /// ([`measuring_latency`](Self::measuring_latency)).
    pub fn latency(&self) -> Option<Latency> {
        self.latency.clone()
    }

    /// For a checkpointed job of several processes: where process 0
    /// coordinates the checkpoints (`host:port`); by default process 0's
    /// host at its timely port + 1000.
    pub fn coordinator(mut self, address: impl Into<String>) -> Self {
        self.coordinator = Some(address.into());
        self
    }

    /// For a checkpointed job: `verify` runs with the opened checkpoints
    /// before the workers start (e.g. to check a dataflow built once on no
    /// input against the restored checkpoint, [`Checkpoints::check_dataflow`],
    /// or to recover a sink before anything runs); its error stops the job.
    pub fn verifying(mut self, verify: impl FnOnce(&Checkpoints) -> Result<(), String> + 'static) -> Self {
        self.verify = Some(Box::new(verify));
        self
    }

    /// Runs the job: `build` builds a worker's dataflows (it is called once
    /// on every worker of this process, like the closure of
    /// `timely::execute`); then the workers run until every source has ended,
    /// or until a source or the checkpoints fail for good (then the
    /// dataflows are dropped and the error returned). A checkpointed job
    /// resumes from its latest checkpoint if `recover` is set, and returns
    /// once its final checkpoint is written and its sinks have committed.
    pub fn run<T, E, F>(self, build: F) -> Result<JobReport<T>, JobError>
    where
        T: Send + 'static,
        E: std::fmt::Display,
        F: Fn(&mut timely::worker::Worker) -> Result<T, E> + Send + Sync + 'static,
    {
        let Job {
            mut config,
            checkpoints,
            coordinator,
            verify,
            in_flight,
            alignment,
            latency: _,
            totals,
            activity,
            checkpoint_stats,
        } = self;
        let checkpoints = match checkpoints {
            Some(ck) => Some(match checkpoint_membership(&config, coordinator.as_deref())? {
                Some(membership) => Checkpoints::open_member(ck, membership)?,
                None => Checkpoints::open(ck, crate::cluster::threads(&config))?,
            }),
            None => None,
        };
        if let Some(ck) = checkpoints.as_ref() {
            ck.report_to(checkpoint_stats);
        }
        if let (Some(ck), Some(verify)) = (checkpoints.as_ref(), verify) {
            verify(ck).map_err(JobError::Verify)?;
        }
        let recovered_from = checkpoints.as_ref().and_then(|c| c.restored()).map(|m| m.id);
        // The job had completed: its dataflows are built (so that its sinks
        // recover, committing the final checkpoint's output if a crash came
        // between its manifest and the commit), and dropped without running.
        let complete = checkpoints.as_ref().is_some_and(|c| c.restored().is_some_and(|m| m.is_final()));
        let failures = Failures::default();
        config.worker.set(FAILURES_KEY.to_owned(), failures.clone());
        let threads = crate::cluster::threads(&config).max(1);
        let summed: Arc<Mutex<Option<BTreeMap<String, u64>>>> = Arc::default();
        let summed_here = Arc::clone(&summed);
        let finished = Finished::default();
        if let Some(ck) = checkpoints.as_ref() {
            ck.configure(&mut config);
        }
        let abort = checkpoints.as_ref().map(Checkpoints::startup_abort).unwrap_or_default();
        alignment.expect_processes(in_flight.process(), in_flight.processes());
        let ck = checkpoints.clone();
        let started = crate::cluster::execute_abortable(config, &abort, move |worker| -> Result<T, JobError> {
            let index = worker.index();
            let mut finish = finished.mark();
            // A worker that stops with an error drops its dataflows: timely
            // would step them until they complete, and they would not, with
            // another worker's half missing or its sources held.
            let failed = |worker: &mut timely::worker::Worker, error: String| {
                for dataflow in worker.installed_dataflows() {
                    worker.drop_dataflow(dataflow);
                }
                JobError::Worker { worker: index, error }
            };
            if let Some(activity) = activity.as_ref() {
                activity.install(worker);
            }
            let output = match build(worker) {
                Ok(output) => output,
                Err(e) => {
                    let error = format!("building the dataflow: {e}");
                    // The other workers' sources let go instead of waiting for checkpoints.
                    if let Some(ck) = ck.as_ref() {
                        ck.fail_job(error.clone());
                    }
                    failures.report(error.clone());
                    return Err(failed(worker, error));
                }
            };
            if complete {
                for dataflow in worker.installed_dataflows() {
                    worker.drop_dataflow(dataflow);
                }
                return Ok(output);
            }
            if let Some(ck) = ck.as_ref() {
                if let Err(e) = ck.built(worker) {
                    return Err(failed(worker, e.to_string()));
                }
            }
            // Several processes: their receipts for flow control, on a
            // dataflow of their own, built after the job's (whose operators'
            // addresses, and so their checkpointed state's names, are then
            // the same on any number of processes) on every worker.
            let board = (in_flight.processes() > 1).then(|| {
                crate::board::Board::build(worker, in_flight.clone(), alignment.clone(), index % threads == 0)
            });
            let mut watched: Vec<&dyn Failing> = vec![&failures];
            if let Some(ck) = ck.as_ref() {
                watched.push(ck);
            }
            let ran = crate::source::run_with_board(worker, &watched, board);
            finish.finish();
            ran.map_err(|e| JobError::Worker { worker: index, error: e.0 })?;
            // One worker per process gives the process's sums, once every
            // worker of the process has finished (its sinks written out).
            let mine = if index % threads == 0 {
                if !finished.wait_for(threads, crate::totals::EXCHANGE_TIMEOUT) {
                    tracing::warn!(
                        "a worker of this process did not finish: its counts may be missing from the totals"
                    );
                }
                totals.local()
            } else {
                BTreeMap::new()
            };
            match crate::totals::sum_over_job(worker, mine) {
                Some(sums) if index % threads == 0 => {
                    *summed_here.lock().unwrap_or_else(|e| e.into_inner()) = Some(sums)
                }
                Some(_) => {}
                None => tracing::warn!("the other processes did not report their counters: totals left out"),
            }
            Ok(output)
        });
        let joined = started.map(|guards| {
            let mut outputs = Vec::new();
            for result in guards.join() {
                outputs.push(result.map_err(JobError::Panicked).and_then(|r| r));
            }
            outputs
        });
        // The checkpoints are finished whatever happened (their threads stop,
        // a final checkpoint is waited for), and the first error reported.
        let finished = checkpoints.as_ref().map(Checkpoints::finish).transpose();
        let outputs = joined?.into_iter().collect::<Result<Vec<T>, JobError>>()?;
        let final_checkpoint = match finished? {
            _ if complete => true,
            Some(false) => return Err(JobError::Unfinished),
            Some(true) => true,
            None => false,
        };
        let checkpoints = checkpoints.map(|c| c.written()).unwrap_or_default();
        let totals = summed.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        Ok(JobReport { outputs, recovered_from, checkpoints, final_checkpoint, already_complete: complete, totals })
    }
}
