//! The transitions the other processes of a job drive (see
//! [`cluster`](super::super::cluster) for the protocol): joining them at
//! start, preparing a cut across processes, and the listener that turns
//! their messages into transitions. A message that the phase does not allow
//! (out of turn, or one that only the other role sends) fails the
//! checkpointing with an error that names it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::operators::checkpoint::{CheckpointId, Cut};
use crate::operators::Timestamp;

use super::super::cluster::{self, Membership, Message, Peer, ProcessPart};
use super::super::manifest::Manifest;
use super::super::store::CheckpointStore;
use super::super::{CheckpointConfig, CheckpointError};
use super::phase::{unexpected, CutPhase, Cuts, Effect, Job, Layout, Phase};
use super::restore::{check, choose_checkpoint};
use super::{lock, Inner};

/// How long the coordinator waits for the processes' answers to a prepare.
pub(super) const PREPARE_TIMEOUT: Duration = Duration::from_secs(30);

/// The coordinator's view of the other processes.
#[derive(Debug, Default)]
pub(super) struct Members {
    /// Followers whose workers have built their dataflows.
    pub(super) built: BTreeSet<usize>,
    /// Followers whose sources have all ended.
    pub(super) ended: BTreeSet<usize>,
}

impl Members {
    /// Whether every follower's workers are built (at a follower: yes).
    pub(super) fn all_built(&self, layout: Layout) -> bool {
        self.built.len() == layout.followers()
    }

    /// Whether every follower's sources have ended (at a follower: yes).
    pub(super) fn all_ended(&self, layout: Layout) -> bool {
        self.ended.len() == layout.followers()
    }
}

/// The connections to the other processes, and the checkpoint the job
/// recovers from, as agreed at start.
pub(super) struct Joined {
    pub(super) manifest: Option<Manifest>,
    /// The id of the next checkpoint (see `next_id`).
    pub(super) next_id: CheckpointId,
    /// The sending halves: to the followers (coordinator), or to the coordinator.
    pub(super) links: Vec<Peer>,
    /// The receiving halves, by process.
    pub(super) readers: Vec<(usize, BufReader<TcpStream>)>,
}

/// The coordinator (or the only process): waits for every other process to
/// join, chooses the checkpoint to recover from and tells them.
pub(super) fn lead(
    membership: Option<&Membership>,
    config: &CheckpointConfig,
    store: &dyn CheckpointStore,
) -> Result<Joined, CheckpointError> {
    let mut links = Vec::new();
    let mut readers = Vec::new();
    if let Some(m) = membership {
        for (peer, reader) in cluster::accept(m)? {
            readers.push((peer.process, reader));
            links.push(peer);
        }
    }
    let chosen =
        choose_checkpoint(config, store).and_then(|manifest| Ok((next_id(store, manifest.as_ref())?, manifest)));
    let answer = match &chosen {
        Ok((next_id, manifest)) => Message::Welcome { restored: manifest.as_ref().map(|m| m.id), next_id: *next_id },
        Err(e) => Message::Failed { error: e.to_string() },
    };
    for peer in &links {
        let _ = peer.send(&answer);
    }
    let (next_id, manifest) = chosen?;
    Ok(Joined { manifest, next_id, links, readers })
}

/// The id of the next checkpoint: above the restored one and above every
/// other in `store`, damaged or never completed ones included. A checkpoint
/// skipped as damaged may have committed its sinks' output (a Kafka
/// transaction with its progress record); its id taken again, an
/// exactly-once sink would take the new checkpoint's part for the old one
/// and skip it.
fn next_id(store: &dyn CheckpointStore, restored: Option<&Manifest>) -> Result<CheckpointId, CheckpointError> {
    let highest = store.list()?.last().copied().unwrap_or(0).max(restored.map_or(0, |m| m.id));
    if let Some(m) = restored.filter(|m| m.id < highest) {
        tracing::warn!(
            restored = m.id,
            highest,
            "checkpoints newer than the one recovered from are in the store: their ids are not used again"
        );
    }
    Ok(highest + 1)
}

/// A follower: joins the coordinator and learns the checkpoint to recover from.
pub(super) fn follow(membership: &Membership, store: &dyn CheckpointStore) -> Result<Joined, CheckpointError> {
    let (peer, mut reader) = cluster::connect(membership)?;
    let what = format!("checkpoint coordinator {}", membership.coordinator);
    let answer = cluster::receive(&mut reader).map_err(|source| CheckpointError::Io { what: what.clone(), source })?;
    let (manifest, next_id) = match answer {
        Some(Message::Welcome { restored: Some(id), next_id }) => {
            let manifest = check(store, id)?;
            tracing::info!(id = manifest.id, time = manifest.time, "recovering from checkpoint");
            (Some(manifest), next_id)
        }
        Some(Message::Welcome { restored: None, next_id }) => (None, next_id),
        Some(Message::Failed { error }) => return Err(CheckpointError::Failed(format!("process 0: {error}"))),
        other => return Err(CheckpointError::Config(format!("{what}: expected a welcome, got {other:?}"))),
    };
    Ok(Joined { manifest, next_id, links: vec![peer], readers: vec![(0, reader)] })
}

/// Handles the messages of the other process at the end of `reader`.
pub(super) fn listen(inner: &Inner, process: usize, mut reader: BufReader<TcpStream>) {
    loop {
        let message = match cluster::receive(&mut reader) {
            Ok(Some(message)) => message,
            Ok(None) => return gone(inner, process, "connection closed".into()),
            Err(e) => return gone(inner, process, e.to_string()),
        };
        tracing::trace!(process, ?message, "checkpoint message");
        let mut state = lock(&inner.state);
        // An error has failed the checkpointing (see `Inner::step`).
        let _ = inner.step(&mut state, |phase, job| phase.receive(process, message, job));
    }
}

/// The connection to `process` ended (`why`): unless the job is done with
/// it, that fails the checkpointing.
fn gone(inner: &Inner, process: usize, why: String) {
    let mut state = lock(&inner.state);
    let phase = &state.phase;
    let done = matches!(phase, Phase::Finished) || (inner.stop.load(Ordering::Relaxed) && phase.in_flight() == 0);
    if done || phase.is_failed() {
        return;
    }
    let building = phase.workers_building(inner.layout.workers);
    inner.fail(&mut state, format!("process {process} is gone ({why})"));
    if building {
        // The workers are not running yet: this process waits for its peers
        // to connect, which would otherwise go on forever.
        inner.startup.abort(format!("checkpointing: process {process} is gone ({why}) before the job started"));
    }
}

impl Phase {
    /// `message` from `process`: at the coordinator from a follower, at a
    /// follower from the coordinator.
    pub(super) fn receive(self, process: usize, message: Message, job: &mut Job) -> Result<Phase, CheckpointError> {
        let leads = job.layout.leads;
        match message {
            Message::Failed { error } => Ok(self.fail(format!("process {process}: {error}"), job)),
            Message::Written { id, is_final } if !leads => self.written(id, is_final, job),
            // Nothing else matters once checkpointing has failed.
            _ if self.is_failed() => Ok(self),
            // From the followers, at the coordinator.
            Message::Built if leads => self.member_built(process, job),
            Message::Prepared { id, max_published } if leads => self.answered(process, id, max_published, job),
            Message::SourcesFinished if leads => self.member_ended(process, job),
            Message::ProcessDone { id, part } if leads => self.part_done(process, id, part, job),
            // From the coordinator, at a follower.
            Message::Prepare { id } if !leads => self.asked(id, job),
            Message::Announce { cut } if !leads => self.begin(cut, job),
            Message::Skip { id } if !leads => self.skipped(id, job),
            other => {
                let role = if leads { "this process coordinates" } else { "this process follows process 0" };
                Err(unexpected(format!("process {process} sent {}", what(&other)), role))
            }
        }
    }

    /// The coordinator's timer: asks every process for the latest time its
    /// sources published before choosing the next cut's.
    pub(super) fn prepare(self, since: Instant, job: &mut Job) -> Result<Phase, CheckpointError> {
        let (cuts, stay) = self.split_open().map_err(|phase| unexpected("the timer prepared a checkpoint", &phase))?;
        let id = cuts.next_id;
        let cuts = cuts.prepare(id, since)?;
        job.effects.push(Effect::Send(Message::Prepare { id }));
        Ok(stay(cuts))
    }

    /// A follower, asked by the coordinator for the latest time published
    /// before it chooses cut `id`: answers, and until the cut is announced
    /// publishes no later time.
    fn asked(self, id: CheckpointId, job: &mut Job) -> Result<Phase, CheckpointError> {
        let event = || format!("process 0 asked for the latest time published before checkpoint {id}");
        let (cuts, stay) = self.split_open().map_err(|phase| unexpected(event(), &phase))?;
        if id != cuts.next_id {
            return Err(unexpected(event(), cuts.describe(id)));
        }
        let cuts = cuts.prepare(id, Instant::now())?;
        job.effects.push(Effect::Send(Message::Prepared { id, max_published: job.published }));
        Ok(stay(cuts))
    }

    /// A follower: the coordinator found nothing published since the last
    /// cut and begins no cut `id` now; this process's sources publish again.
    fn skipped(self, id: CheckpointId, job: &mut Job) -> Result<Phase, CheckpointError> {
        let event = || format!("process 0 skipped checkpoint {id}");
        let (mut cuts, stay) = self.split_open().map_err(|phase| unexpected(event(), &phase))?;
        match cuts.cuts.remove(&id) {
            Some(CutPhase::Preparing { .. }) => {
                job.effects.push(Effect::Wake);
                Ok(stay(cuts))
            }
            Some(phase) => {
                cuts.cuts.insert(id, phase);
                Err(unexpected(event(), format!("checkpoint {id} is begun")))
            }
            None => Err(unexpected(event(), cuts.describe(id))),
        }
    }

    /// The coordinator, answered by `process` with the latest `time` its
    /// sources published before cut `id`: once every process has answered,
    /// announces the cut above every answer.
    fn answered(
        self,
        process: usize,
        id: CheckpointId,
        time: Timestamp,
        job: &mut Job,
    ) -> Result<Phase, CheckpointError> {
        let event = || format!("process {process} answered the prepare of checkpoint {id}");
        let (mut cuts, stay) = match self.split() {
            Ok(split) => split,
            // The final cut was begun instead, and is written: a late answer.
            Err(Phase::Finished) => return Ok(Phase::Finished),
            Err(phase) => return Err(unexpected(event(), &phase)),
        };
        match cuts.cuts.remove(&id) {
            Some(CutPhase::Preparing { since, mut answers }) => {
                if answers.insert(process, time).is_some() {
                    return Err(unexpected(event(), format!("process {process} had answered it already")));
                }
                if answers.len() < job.layout.followers() {
                    cuts.cuts.insert(id, CutPhase::Preparing { since, answers });
                    return Ok(stay(cuts));
                }
                let time = answers.values().fold(job.published, |a, b| a.max(*b)).saturating_add(1);
                if !job.worth_a_cut(time) {
                    // The followers publish again; the next timer asks again.
                    tracing::trace!(id, time, "no checkpoint: nothing published since the last");
                    job.effects.push(Effect::Send(Message::Skip { id }));
                    job.effects.push(Effect::Wake);
                    return Ok(stay(cuts));
                }
                stay(cuts).announce(Cut { id, time }, job)
            }
            // The final cut was begun instead of the one prepared: a late answer.
            Some(phase) => {
                cuts.cuts.insert(id, phase);
                Ok(stay(cuts))
            }
            None if id < cuts.next_id => Ok(stay(cuts)),
            None => Err(unexpected(event(), cuts.describe(id))),
        }
    }

    /// The coordinator: `process`'s workers are built.
    fn member_built(self, process: usize, job: &mut Job) -> Result<Phase, CheckpointError> {
        let event = || format!("process {process} reported its workers built");
        match self {
            Phase::Building { .. } => {
                if !job.members.built.insert(process) {
                    return Err(unexpected(event(), format!("process {process} had reported it already")));
                }
                self.advance(job)
            }
            phase => Err(unexpected(event(), &phase)),
        }
    }

    /// The coordinator: `process`'s sources have all ended.
    fn member_ended(self, process: usize, job: &mut Job) -> Result<Phase, CheckpointError> {
        let event = || format!("process {process} reported its sources ended");
        match self {
            Phase::Building { .. } | Phase::Running(_) | Phase::Draining(_) => {
                if !job.members.built.contains(&process) {
                    return Err(unexpected(event(), format!("process {process} had not reported its workers built")));
                }
                if !job.members.ended.insert(process) {
                    return Err(unexpected(event(), format!("process {process} had reported it already")));
                }
                self.advance(job)
            }
            phase => Err(unexpected(event(), &phase)),
        }
    }

    /// The coordinator: `process` has written its part of checkpoint `id`,
    /// for the writer, which writes the manifest once every process's is in.
    fn part_done(
        self,
        process: usize,
        id: CheckpointId,
        part: ProcessPart,
        job: &mut Job,
    ) -> Result<Phase, CheckpointError> {
        let event = || format!("process {process} reported its part of checkpoint {id} written");
        let Some(cuts) = self.cuts() else { return Err(unexpected(event(), &self)) };
        match cuts.cuts.get(&id) {
            Some(CutPhase::Collecting(_) | CutPhase::Writing(_)) => {}
            Some(phase) => return Err(unexpected(event(), phase.describe(id))),
            None => return Err(unexpected(event(), cuts.describe(id))),
        }
        job.effects.push(Effect::Part { process, id, part });
        Ok(self)
    }
}

impl Cuts {
    /// Cut `id` (the next) is being prepared across processes, since `since`.
    fn prepare(mut self, id: CheckpointId, since: Instant) -> Result<Cuts, CheckpointError> {
        if let Some((preparing, _)) = self.cuts.iter().find(|(_, p)| matches!(p, CutPhase::Preparing { .. })) {
            let state = format!("checkpoint {preparing} is being prepared");
            return Err(unexpected(format!("checkpoint {id} prepared"), state));
        }
        self.cuts.insert(id, CutPhase::Preparing { since, answers: BTreeMap::new() });
        Ok(self)
    }
}

/// What `message` says, for errors.
fn what(message: &Message) -> String {
    match message {
        Message::Hello { process, .. } => format!("a hello (as process {process})"),
        Message::Welcome { .. } => "a welcome".into(),
        Message::Built => "that its workers are built".into(),
        Message::Prepare { id } => format!("a prepare of checkpoint {id}"),
        Message::Prepared { id, .. } => format!("an answer to the prepare of checkpoint {id}"),
        Message::Announce { cut } => format!("the announcement of {}", super::phase::describe(*cut)),
        Message::Skip { id } => format!("that checkpoint {id} is not begun now"),
        Message::SourcesFinished => "that its sources have ended".into(),
        Message::ProcessDone { id, .. } => format!("its part of checkpoint {id}"),
        Message::Written { id, .. } => format!("that checkpoint {id} is written"),
        Message::Failed { error } => format!("a failure ({error})"),
    }
}
