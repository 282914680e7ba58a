//! The state machine of the job's checkpointing in this process.
//!
//! The job goes through the [`Phase`]s `Building` → `Running` → `Draining`
//! → `Final` → `Finished`, or to `Failed` from any of them. While it runs,
//! each checkpoint goes through its [`CutPhase`]s `Preparing` (across
//! processes only) → `Collecting` → `Writing`, and leaves the [`Cuts`] in
//! flight once written.
//!
//! A transition is a method that takes the phase by value with its event and
//! returns the next phase, or the [`CheckpointError`] of an event the phase
//! does not allow (which fails the checkpointing: see [`State::apply`]).
//! What a transition asks of the world (messages to the other processes,
//! work for the writer, waking operators) it queues as [`Effect`]s, which
//! the coordinator carries out under the same lock (`Inner::step` in
//! `mod.rs`), so that messages leave in the order of the transitions.
//!
//! The transitions this process's workers and timer drive are in
//! `local.rs`, those the other processes' messages drive in `members.rs`;
//! those both drive (beginning a cut, handing in shares, a checkpoint
//! written, failing, moving on from phase to phase) are here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use crate::operators::checkpoint::{BackendFiles, CheckpointId, Cut, Entry};
use crate::operators::{Timestamp, END_OF_TIME};

use super::super::cluster::{Message, ProcessPart};
use super::super::manifest::PartitionState;
use super::super::CheckpointError;
use super::members::Members;
use super::registry::Registry;
use super::sink::SinkSubmission;

/// This process's place in the job, fixed at start.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// This process's workers.
    pub(super) workers: usize,
    /// The job's processes.
    pub(super) processes: usize,
    /// Whether this process coordinates (it is the only one, or process 0).
    pub(super) leads: bool,
}

impl Layout {
    /// The processes this one coordinates (none at a follower).
    pub(super) fn followers(&self) -> usize {
        if self.leads {
            self.processes - 1
        } else {
            0
        }
    }
}

/// The checkpointing of the job in this process: where it stands, and what
/// every phase shares. Behind the coordinator's one lock.
#[derive(Debug)]
pub(super) struct State {
    /// Where the checkpointing stands.
    pub(super) phase: Phase,
    /// What its phases share.
    pub(super) job: Job,
}

/// What the phases share: this process's place in the job, what its
/// workers registered, what the other processes reported, what its sources
/// published and the checkpoints written so far.
#[derive(Debug)]
pub(super) struct Job {
    /// This process's place in the job.
    pub(super) layout: Layout,
    /// The operators, sources and sinks of this process.
    pub(super) registry: Registry,
    /// The coordinator's view of the other processes.
    pub(super) members: Members,
    /// The latest time a source of this process has published (at start,
    /// the restored time: cuts lie above it, where the sources resume).
    pub(super) published: Timestamp,
    /// The time of the last cut begun by this run (not the final one): the
    /// next is begun only if a source has published a time at or above it
    /// since (else nothing has changed, and the sources that rest would
    /// have to move their watermarks up for nothing: see
    /// `Checkpoints::publish`).
    pub(super) last_cut: Option<Timestamp>,
    /// The checkpoints written by this run, in order.
    pub(super) written: Vec<CheckpointId>,
    /// What the transitions so far ask of the world, in order.
    pub(super) effects: Vec<Effect>,
}

impl Job {
    /// Whether a cut at `time` (one above every time published) is worth
    /// beginning: it lies above the last cut, so a source has published a
    /// time at or above that one since. Else nothing was sent since the last
    /// cut; a cut at the same time would be none, and one above it would
    /// make the sources that rest move their watermarks for nothing, once
    /// every interval.
    pub(super) fn worth_a_cut(&self, time: Timestamp) -> bool {
        self.last_cut.is_none_or(|last| time > last)
    }
}

/// Where the job's checkpointing stands in this process.
#[derive(Debug)]
pub(super) enum Phase {
    /// The workers build their dataflows (at the coordinator: until every
    /// process's are built); `built` are this process's built so far.
    Building { built: BTreeSet<usize>, next_id: CheckpointId },
    /// Every worker is built: cuts are chosen, announced, collected, written.
    Running(Cuts),
    /// This process's sources have all ended (a follower has said so): cuts
    /// go on until every process's have, then the coordinator begins the
    /// final one.
    Draining(Cuts),
    /// The final cut is begun: no other is; those in flight are written.
    Final(Cuts),
    /// The final checkpoint is written.
    Finished,
    /// Checkpointing failed (the first error): every cut begun is
    /// abandoned, nothing is written or committed any more.
    Failed(String),
}

/// The cuts in flight: prepared or begun and not yet written.
#[derive(Debug)]
pub(super) struct Cuts {
    /// The id of the next cut to begin.
    pub(super) next_id: CheckpointId,
    /// Each cut in flight, in its phase, by id.
    pub(super) cuts: BTreeMap<CheckpointId, CutPhase>,
}

/// The phase that cuts in flight were taken out of, to put them back into.
pub(super) type Stay = fn(Cuts) -> Phase;

/// Where one checkpoint stands in this process.
#[derive(Debug)]
pub(super) enum CutPhase {
    /// Across processes, before its time is chosen: the coordinator has
    /// asked every process for the latest time its sources published
    /// (`answers`, so far, by process); a follower was asked and answered.
    /// Meanwhile this process's sources publish no later time.
    Preparing { since: Instant, answers: BTreeMap<usize, Timestamp> },
    /// Announced: this process's operators, sources and sinks hand in their
    /// shares.
    Collecting(Collecting),
    /// Every share is in: the writer writes this process's part (the
    /// coordinator, once every process's part is in, the manifest).
    Writing(Cut),
}

/// The shares of one cut handed in so far in this process.
#[derive(Debug)]
pub(super) struct Collecting {
    pub(super) cut: Cut,
    /// Operators' state: (worker, operator, entries, database checkpoint).
    pub(super) operators: Vec<(usize, String, Vec<Entry>, Option<DatabaseCheckpoint>)>,
    /// Sources' partitions, by source.
    pub(super) sources: BTreeMap<String, Vec<PartitionState>>,
    /// The sources (on all workers) that handed in their partitions.
    pub(super) source_parts: usize,
    /// Sinks' parts: (worker, part).
    pub(super) sinks: Vec<(usize, SinkSubmission)>,
    pub(super) begun: Instant,
}

/// An operator's database checkpoint handed in with its share (an
/// incremental snapshot): its directory is removed when this goes, once the
/// writer has put its files into the store or the cut was abandoned.
#[derive(Debug)]
pub(super) struct DatabaseCheckpoint(pub(super) BackendFiles);

impl Drop for DatabaseCheckpoint {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// A share of a cut that an operator, a source or a sink of this process hands in.
#[derive(Debug)]
pub(super) enum Share {
    /// A checkpointed operator's state as of the cut: its entries and, if
    /// incremental, the checkpoint of its database.
    Operator { worker: usize, operator: String, entries: Vec<Entry>, files: Option<DatabaseCheckpoint> },
    /// A source's partitions (offsets, watermarks) at the cut.
    Source { source: String, partitions: Vec<PartitionState> },
    /// An exactly-once sink's output below the cut.
    Sink { worker: usize, submission: SinkSubmission },
}

/// What a transition asks of the world, carried out in order once the
/// state is updated (`Inner::perform` in `mod.rs`).
#[derive(Debug)]
pub(super) enum Effect {
    /// Send to the other processes (a follower: the coordinator); a lost
    /// connection fails the checkpointing.
    Send(Message),
    /// Tell the other processes, if they still listen.
    Inform(Message),
    /// A cut is begun: let the operators' cheap check see it.
    Begun(Cut),
    /// Wake the threads waiting on the state, and every checkpointed
    /// operator and gate.
    Wake,
    /// Every share of a cut is in here: to the writer.
    Collected(Collecting),
    /// Another process's part of a checkpoint: to the writer (the coordinator).
    Part { process: usize, id: CheckpointId, part: ProcessPart },
}

/// The error of `event`, which `state` does not allow.
pub(super) fn unexpected(event: impl Into<String>, state: impl fmt::Display) -> CheckpointError {
    CheckpointError::Protocol { event: event.into(), state: state.to_string() }
}

/// The reason a failure records: `error`'s message, without the prefix of
/// a failure reported again.
fn reason(error: &CheckpointError) -> String {
    match error {
        CheckpointError::Failed(reason) => reason.clone(),
        other => other.to_string(),
    }
}

impl State {
    /// A process of `layout` whose next cut is `next_id`, above `published`.
    pub(super) fn new(layout: Layout, next_id: CheckpointId, published: Timestamp) -> Self {
        State {
            phase: Phase::Building { built: BTreeSet::new(), next_id },
            job: Job {
                layout,
                registry: Registry::default(),
                members: Members::default(),
                published,
                last_cut: None,
                written: Vec::new(),
                effects: Vec::new(),
            },
        }
    }

    /// Takes the phase through `transition`. An error fails the
    /// checkpointing (unless it had failed already) and is returned.
    pub(super) fn apply(
        &mut self,
        transition: impl FnOnce(Phase, &mut Job) -> Result<Phase, CheckpointError>,
    ) -> Result<(), CheckpointError> {
        let failed = self.phase.error().map(str::to_owned);
        // Moved into the transition; whatever it returns replaces it.
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        match transition(phase, &mut self.job) {
            Ok(next) => {
                self.phase = next;
                Ok(())
            }
            Err(e) => {
                // What failing looks at of the phase moved out: whether it had failed.
                let before = failed.map_or(Phase::Finished, Phase::Failed);
                self.phase = before.fail(reason(&e), &mut self.job);
                Err(e)
            }
        }
    }

    /// Fails the checkpointing with `reason` (the first reason stays).
    pub(super) fn fail(&mut self, reason: String) {
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        self.phase = phase.fail(reason, &mut self.job);
    }

    /// Whether the coordinator's timer may begin the next cut: every worker
    /// is built, no cut is in flight, the final one is not begun, and there
    /// are sources (whose times a cut lies above).
    pub(super) fn may_begin(&self) -> bool {
        matches!(&self.phase, Phase::Running(cuts) | Phase::Draining(cuts) if cuts.cuts.is_empty())
            && self.job.registry.has_sources()
    }

    /// Whether this process's sources are held back: the processes choose a cut.
    pub(super) fn frozen(&self) -> bool {
        self.phase.preparing().is_some()
    }
}

impl Phase {
    /// The error checkpointing failed with, if it did.
    pub(super) fn error(&self) -> Option<&str> {
        match self {
            Phase::Failed(error) => Some(error),
            _ => None,
        }
    }

    /// Whether checkpointing has failed.
    pub(super) fn is_failed(&self) -> bool {
        matches!(self, Phase::Failed(_))
    }

    /// Whether the final checkpoint is begun, or checkpointing has failed:
    /// either way, sources that have ended may let go.
    pub(super) fn final_begun(&self) -> bool {
        matches!(self, Phase::Final(_) | Phase::Finished | Phase::Failed(_))
    }

    /// Whether `worker` has built its dataflows (every worker has, once the
    /// phase is past building).
    pub(super) fn is_built(&self, worker: usize) -> bool {
        match self {
            Phase::Building { built, .. } => built.contains(&worker),
            _ => true,
        }
    }

    /// Whether some of this process's workers have not built their dataflows yet.
    pub(super) fn workers_building(&self, workers: usize) -> bool {
        matches!(self, Phase::Building { built, .. } if built.len() < workers)
    }

    /// The cuts in flight, in the phases that have them.
    pub(super) fn cuts(&self) -> Option<&Cuts> {
        match self {
            Phase::Running(cuts) | Phase::Draining(cuts) | Phase::Final(cuts) => Some(cuts),
            _ => None,
        }
    }

    /// The cut being prepared across processes, and since when.
    pub(super) fn preparing(&self) -> Option<(CheckpointId, Instant)> {
        self.cuts()?.cuts.iter().find_map(|(id, phase)| match phase {
            CutPhase::Preparing { since, .. } => Some((*id, *since)),
            _ => None,
        })
    }

    /// The cuts begun and not yet written.
    pub(super) fn in_flight(&self) -> usize {
        self.cuts()
            .map_or(0, |cuts| cuts.cuts.values().filter(|phase| !matches!(phase, CutPhase::Preparing { .. })).count())
    }

    /// The oldest cut after `done` being collected.
    pub(super) fn collecting_after(&self, done: Option<CheckpointId>) -> Option<Cut> {
        self.cuts()?.cuts.range(done.map_or(0, |d| d + 1)..).find_map(|(_, phase)| match phase {
            CutPhase::Collecting(c) => Some(c.cut),
            _ => None,
        })
    }

    /// The cuts of a phase with cuts in flight, and the phase to return to
    /// with them; the phase itself if it has none.
    pub(super) fn split(self) -> Result<(Cuts, Stay), Phase> {
        match self {
            Phase::Running(cuts) => Ok((cuts, Phase::Running)),
            Phase::Draining(cuts) => Ok((cuts, Phase::Draining)),
            Phase::Final(cuts) => Ok((cuts, Phase::Final)),
            phase => Err(phase),
        }
    }

    /// [`split`](Self::split), for the phases in which a cut other than the
    /// final one may begin.
    pub(super) fn split_open(self) -> Result<(Cuts, Stay), Phase> {
        match self {
            Phase::Running(cuts) => Ok((cuts, Phase::Running)),
            Phase::Draining(cuts) => Ok((cuts, Phase::Draining)),
            phase => Err(phase),
        }
    }

    /// Fails with `reason`: abandons the cuts in flight (gates open,
    /// operators stop taking snapshots), tells the other processes, and
    /// wakes everyone; `Checkpoints::finish` reports the error. After a
    /// failure the first reason stays.
    pub(super) fn fail(self, reason: String, job: &mut Job) -> Phase {
        let next = match self {
            Phase::Failed(first) => Phase::Failed(first),
            _ => {
                job.effects.push(Effect::Inform(Message::Failed { error: reason.clone() }));
                Phase::Failed(reason)
            }
        };
        job.effects.push(Effect::Wake);
        next
    }

    /// Moves on as far as what is known allows: `Building` → `Running` once
    /// every worker is built (a follower says so), `Running` → `Draining`
    /// once this process's sources have ended (a follower says so),
    /// `Draining` → `Final` at the coordinator once every process's have
    /// (it announces the final cut).
    pub(super) fn advance(self, job: &mut Job) -> Result<Phase, CheckpointError> {
        let layout = job.layout;
        let mut phase = self;
        loop {
            phase = match phase {
                Phase::Building { built, next_id }
                    if built.len() == layout.workers && job.members.all_built(layout) =>
                {
                    if !layout.leads {
                        job.effects.push(Effect::Send(Message::Built));
                    }
                    Phase::Running(Cuts::new(next_id))
                }
                Phase::Running(cuts) if job.registry.sources_ended() => {
                    if !layout.leads {
                        job.effects.push(Effect::Send(Message::SourcesFinished));
                    }
                    Phase::Draining(cuts)
                }
                Phase::Draining(cuts)
                    if layout.leads && job.members.all_ended(layout) && job.registry.has_sources() =>
                {
                    let cut = Cut { id: cuts.next_id, time: END_OF_TIME };
                    Phase::Draining(cuts).announce(cut, job)?
                }
                phase => return Ok(phase),
            };
        }
    }

    /// The coordinator begins `cut` and announces it to the other processes.
    pub(super) fn announce(self, cut: Cut, job: &mut Job) -> Result<Phase, CheckpointError> {
        let next = self.begin(cut, job)?;
        job.effects.push(Effect::Send(Message::Announce { cut }));
        Ok(next)
    }

    /// Begins `cut`, announced here or by the coordinator: this process's
    /// operators, sources and sinks are to hand in their shares. The final
    /// cut moves the job to `Final`.
    pub(super) fn begin(self, cut: Cut, job: &mut Job) -> Result<Phase, CheckpointError> {
        match self {
            Phase::Running(cuts) if !cut.is_final() => Ok(Phase::Running(cuts.begin(cut, job)?)),
            Phase::Draining(cuts) if !cut.is_final() => Ok(Phase::Draining(cuts.begin(cut, job)?)),
            Phase::Draining(cuts) => Ok(Phase::Final(cuts.begin(cut, job)?)),
            phase => Err(unexpected(format!("{} begun", describe(cut)), &phase)),
        }
    }

    /// An operator, source or sink of this process hands in its share of
    /// cut `id`; once every share is in, the cut goes to the writer.
    pub(super) fn hand_in(self, id: CheckpointId, share: Share, job: &mut Job) -> Result<Phase, CheckpointError> {
        if self.is_failed() {
            // The cut was abandoned.
            return Ok(self);
        }
        match self.split() {
            Ok((cuts, stay)) => Ok(stay(cuts.hand_in(id, share, job)?)),
            Err(phase) => Err(unexpected(format!("{share} handed in its share of checkpoint {id}"), &phase)),
        }
    }

    /// Checkpoint `id` is written and committed (the coordinator wrote its
    /// manifest): it is over everywhere. The final one finishes the job.
    pub(super) fn written(self, id: CheckpointId, is_final: bool, job: &mut Job) -> Result<Phase, CheckpointError> {
        let event = || format!("checkpoint {id}{} written", if is_final { " (the final one)" } else { "" });
        let next = match self {
            // Written before the failure was known here: it is, all the same.
            Phase::Failed(error) => Phase::Failed(error),
            phase => {
                let (cuts, stay) = phase.split().map_err(|phase| unexpected(event(), &phase))?;
                let cuts = cuts.written(id, is_final)?;
                if !is_final {
                    stay(cuts)
                } else if let Some(first) = cuts.cuts.keys().next() {
                    return Err(unexpected(event(), format!("checkpoint {first} is not written yet")));
                } else {
                    Phase::Finished
                }
            }
        };
        job.written.push(id);
        if job.layout.leads {
            job.effects.push(Effect::Inform(Message::Written { id, is_final }));
        }
        job.effects.push(Effect::Wake);
        Ok(next)
    }
}

impl Cuts {
    fn new(next_id: CheckpointId) -> Self {
        Cuts { next_id, cuts: BTreeMap::new() }
    }

    /// Where cut `id`, not in flight, stands.
    pub(super) fn describe(&self, id: CheckpointId) -> String {
        if id < self.next_id {
            format!("checkpoint {id} is over")
        } else {
            format!("checkpoint {id} is not begun (the next is {})", self.next_id)
        }
    }

    /// Begins `cut`, the next one (being prepared, across processes).
    fn begin(mut self, cut: Cut, job: &mut Job) -> Result<Cuts, CheckpointError> {
        if cut.id != self.next_id {
            return Err(unexpected(
                format!("{} begun", describe(cut)),
                format!("the next checkpoint is {}", self.next_id),
            ));
        }
        self.cuts.insert(cut.id, CutPhase::Collecting(Collecting::new(cut)));
        self.next_id = cut.id + 1;
        if !cut.is_final() {
            // The cut lies above every time published in any process: sources
            // here that have ended may hold their capability up to it (see
            // `Checkpoints::horizon`), or the other processes' operators could
            // not reach it.
            job.published = job.published.max(cut.time.saturating_sub(1));
            job.last_cut = Some(cut.time);
        }
        tracing::debug!(id = cut.id, time = cut.time, "checkpoint begun");
        job.effects.push(Effect::Begun(cut));
        job.effects.push(Effect::Wake);
        Ok(self)
    }

    /// A share of cut `id` handed in.
    fn hand_in(mut self, id: CheckpointId, share: Share, job: &mut Job) -> Result<Cuts, CheckpointError> {
        let Some(phase) = self.cuts.remove(&id) else {
            return Err(unexpected(format!("{share} handed in its share of checkpoint {id}"), self.describe(id)));
        };
        let next = phase.hand_in(id, share, job)?;
        self.cuts.insert(id, next);
        Ok(self)
    }

    /// Cut `id` is written.
    fn written(mut self, id: CheckpointId, is_final: bool) -> Result<Cuts, CheckpointError> {
        let event = || format!("checkpoint {id}{} written", if is_final { " (the final one)" } else { "" });
        match self.cuts.remove(&id) {
            Some(phase) => phase.written(id, is_final).map_err(|state| unexpected(event(), state)).map(|()| self),
            None => Err(unexpected(event(), self.describe(id))),
        }
    }
}

impl CutPhase {
    /// A share handed in: `Collecting` → `Collecting`, or `Writing` once
    /// every share is in (the shares go to the writer).
    fn hand_in(self, id: CheckpointId, share: Share, job: &mut Job) -> Result<CutPhase, CheckpointError> {
        match self {
            CutPhase::Collecting(mut c) => {
                c.add(share);
                if !c.complete(&job.registry) {
                    return Ok(CutPhase::Collecting(c));
                }
                tracing::debug!(id, time = c.cut.time, elapsed = ?c.begun.elapsed(), "checkpoint collected");
                let cut = c.cut;
                job.effects.push(Effect::Collected(c));
                Ok(CutPhase::Writing(cut))
            }
            phase => Err(unexpected(format!("{share} handed in its share of checkpoint {id}"), phase.describe(id))),
        }
    }

    /// Written: `Writing` → over. Otherwise where the cut stands instead.
    fn written(self, id: CheckpointId, is_final: bool) -> Result<(), String> {
        match self {
            CutPhase::Writing(cut) if cut.is_final() == is_final => Ok(()),
            CutPhase::Writing(cut) => Err(format!("{} is being written", describe(cut))),
            phase => Err(phase.describe(id)),
        }
    }

    /// Where cut `id` stands in this phase.
    pub(super) fn describe(&self, id: CheckpointId) -> String {
        match self {
            CutPhase::Preparing { .. } => format!("checkpoint {id} is being prepared"),
            CutPhase::Collecting(c) => format!("{} is being collected", describe(c.cut)),
            CutPhase::Writing(cut) => format!("{} is being written", describe(*cut)),
        }
    }
}

impl Collecting {
    fn new(cut: Cut) -> Self {
        Collecting {
            cut,
            operators: Vec::new(),
            sources: BTreeMap::new(),
            source_parts: 0,
            sinks: Vec::new(),
            begun: Instant::now(),
        }
    }

    fn add(&mut self, share: Share) {
        match share {
            Share::Operator { worker, operator, entries, files } => {
                self.operators.push((worker, operator, entries, files))
            }
            Share::Source { source, partitions } => {
                self.sources.entry(source).or_default().extend(partitions);
                self.source_parts += 1;
            }
            Share::Sink { worker, submission } => self.sinks.push((worker, submission)),
        }
    }

    /// Whether every operator, source and sink registered has handed in its share.
    fn complete(&self, registry: &Registry) -> bool {
        self.operators.len() == registry.operators.len()
            && self.source_parts == registry.sources.len()
            && self.sinks.len() == registry.sinks.len()
    }
}

/// A cut, for messages: `checkpoint 3 (time 1200)`, `the final checkpoint 4`.
pub(super) fn describe(cut: Cut) -> String {
    if cut.is_final() {
        format!("the final checkpoint {}", cut.id)
    } else {
        format!("checkpoint {} (time {})", cut.id, cut.time)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Building { built, .. } => {
                write!(f, "the workers are building their dataflows ({} built in this process)", built.len())
            }
            Phase::Running(cuts) => write!(f, "checkpoints are being taken{cuts}"),
            Phase::Draining(cuts) => write!(f, "this process's sources have ended{cuts}"),
            Phase::Final(cuts) => write!(f, "the final checkpoint is begun{cuts}"),
            Phase::Finished => f.write_str("the final checkpoint is written"),
            Phase::Failed(error) => write!(f, "checkpointing has failed ({error})"),
        }
    }
}

impl fmt::Display for Cuts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cuts.is_empty() {
            return write!(f, " (none in flight, the next is {})", self.next_id);
        }
        let cuts: Vec<String> = self.cuts.iter().map(|(id, phase)| phase.describe(*id)).collect();
        write!(f, " ({})", cuts.join(", "))
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Share::Operator { worker, operator, .. } => write!(f, "operator {operator} on worker {worker}"),
            Share::Source { source, .. } => write!(f, "source {source}"),
            Share::Sink { worker, submission } => write!(f, "sink {} on worker {worker}", submission.sink),
        }
    }
}
