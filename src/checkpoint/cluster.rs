//! Checkpoints of a job spread over several processes (timely's `-n`).
//!
//! Process 0 coordinates; the others follow, each over one TCP connection to
//! it (newline-delimited JSON messages). Every process collects its own
//! workers' shares of a cut and writes their shards to the shared store; the
//! coordinator writes the manifest once every process has reported its part.
//!
//! - **Choosing a cut.** A cut's time `T` must lie above every time any source
//!   of any process has emitted at. The coordinator asks every process for the
//!   latest time its sources have published (`Message::Prepare`); each
//!   answers and, until the cut is announced, holds back any source about to
//!   publish a later time (a round trip on the network, once per interval).
//!   `T` is one above the largest answer (`Message::Announce`). If that is
//!   not above the last cut's time, nothing was sent since: no cut is begun
//!   now (`Message::Skip`).
//! - **Gates.** A checkpoint gate opens once its operator has taken its
//!   snapshot on its own worker (the gate sits after the operator's exchange):
//!   no message is needed for that.
//! - **Writing.** A process that has collected its workers' shares writes
//!   their shards and reports them, with its sources' offsets
//!   (`Message::ProcessDone`). The coordinator writes the manifest, commits
//!   the sinks (which run in its process, on worker 0), and reports the
//!   checkpoint written (`Message::Written`).
//! - **Recovery.** The coordinator chooses the checkpoint to restore and tells
//!   the others (`Message::Welcome`); every process reads all of its shards
//!   and keeps the entries of its own workers, so the number of processes and
//!   workers may differ from the checkpoint's.
//! - **Failure.** A process that fails, or loses its connection, fails the
//!   checkpointing of the whole job (`Message::Failed`). So does a message
//!   that the receiver's phase does not allow (out of turn, or one only the
//!   other role sends): see `coordinator/members.rs`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::manifest::{PartitionState, ShardInfo, SinkPart};
use super::CheckpointError;
use crate::operators::checkpoint::{CheckpointId, Cut};
use crate::operators::Timestamp;

/// Where this process stands in a job of several processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// This process's index (timely's `-p`).
    pub process: usize,
    /// The number of processes (timely's `-n`).
    pub processes: usize,
    /// Workers per process (timely's `-w`); worker `w` of process `p` is
    /// the job's worker `p * workers_per_process + w`.
    pub workers_per_process: usize,
    /// The coordinator's address (`host:port`): process 0 listens there, the
    /// others connect to it.
    pub coordinator: String,
    /// How long to wait for the other processes at start.
    pub connect_timeout: Duration,
}

impl Membership {
    /// The job's workers in all processes.
    pub fn peers(&self) -> usize {
        self.processes * self.workers_per_process
    }

    /// The job's index of this process's first worker.
    pub fn first_worker(&self) -> usize {
        self.process * self.workers_per_process
    }

    /// Whether this process coordinates.
    pub fn leads(&self) -> bool {
        self.process == 0
    }
}

/// A process's part of a checkpoint: its workers' shards, its sources'
/// partitions and its sinks' prepared parts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct ProcessPart {
    pub(super) shards: Vec<ShardInfo>,
    pub(super) sources: BTreeMap<String, Vec<PartitionState>>,
    pub(super) sinks: Vec<SinkPart>,
}

/// What the processes tell each other.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) enum Message {
    /// A follower introduces itself.
    Hello { process: usize, workers: usize },
    /// The coordinator's answer: the checkpoint the job recovers from, and
    /// the id of the next one (above every id in the store, so that a
    /// checkpoint skipped as damaged never has its id taken again).
    Welcome { restored: Option<CheckpointId>, next_id: CheckpointId },
    /// A follower's workers have built their dataflows.
    Built,
    /// The coordinator is about to begin checkpoint `id`: report the latest
    /// time published, and publish no later one until the cut is announced.
    Prepare { id: CheckpointId },
    /// A follower's answer to [`Message::Prepare`].
    Prepared { id: CheckpointId, max_published: Timestamp },
    /// A cut is begun.
    Announce { cut: Cut },
    /// The coordinator begins no cut `id` now: no source of any process has
    /// published a time at or above the last cut since it was begun (the
    /// job rests). The followers' sources publish again.
    Skip { id: CheckpointId },
    /// A process's sources have all read their partitions to the end.
    SourcesFinished,
    /// A follower has written its part of checkpoint `id`.
    ProcessDone { id: CheckpointId, part: ProcessPart },
    /// The coordinator has written (and committed) checkpoint `id`.
    Written { id: CheckpointId, is_final: bool },
    /// Checkpointing failed.
    Failed { error: String },
}

/// The sending half of a connection to another process.
#[derive(Debug)]
pub(super) struct Peer {
    pub(super) process: usize,
    stream: Mutex<TcpStream>,
}

impl Peer {
    /// Sends `message`; an error means the peer is gone.
    pub(super) fn send(&self, message: &Message) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.stream.lock().unwrap_or_else(|p| p.into_inner()).write_all(&line)
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Io { what, source }
}

/// Reads one message from `reader`; `Ok(None)` at the end of the connection.
pub(super) fn receive(reader: &mut impl BufRead) -> std::io::Result<Option<Message>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line).map(Some).map_err(std::io::Error::other)
}

/// The coordinator's side: listens on `membership.coordinator` until every
/// other process has connected and introduced itself. Returns one peer and
/// one reader per follower.
pub(super) fn accept(membership: &Membership) -> Result<Vec<(Peer, BufReader<TcpStream>)>, CheckpointError> {
    let what = format!("checkpoint coordinator on {}", membership.coordinator);
    let listener = TcpListener::bind(&membership.coordinator).map_err(io(format!("{what} (binding)")))?;
    listener.set_nonblocking(true).map_err(io(what.clone()))?;
    let deadline = Instant::now() + membership.connect_timeout;
    let mut peers: Vec<(Peer, BufReader<TcpStream>)> = Vec::new();
    while peers.len() + 1 < membership.processes {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(io(what.clone()))?;
                stream.set_nodelay(true).map_err(io(what.clone()))?;
                stream.set_read_timeout(Some(membership.connect_timeout)).map_err(io(what.clone()))?;
                let mut reader = BufReader::new(stream.try_clone().map_err(io(what.clone()))?);
                match receive(&mut reader).map_err(io(what.clone()))? {
                    Some(Message::Hello { process, workers }) => {
                        if process == 0 || process >= membership.processes {
                            return Err(CheckpointError::Config(format!(
                                "{what}: a process introduced itself as {process} of {}",
                                membership.processes
                            )));
                        }
                        if workers != membership.workers_per_process {
                            return Err(CheckpointError::Config(format!(
                                "{what}: process {process} runs {workers} workers, this one {}",
                                membership.workers_per_process
                            )));
                        }
                        if peers.iter().any(|(p, _)| p.process == process) {
                            return Err(CheckpointError::Config(format!(
                                "{what}: two processes introduced themselves as {process}"
                            )));
                        }
                        stream.set_read_timeout(None).map_err(io(what.clone()))?;
                        stream.set_write_timeout(Some(Duration::from_secs(30))).map_err(io(what.clone()))?;
                        peers.push((Peer { process, stream: Mutex::new(stream) }, reader));
                    }
                    other => {
                        return Err(CheckpointError::Config(format!(
                            "{what}: expected a process's hello, got {other:?}"
                        )))
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (1..membership.processes)
                        .filter(|p| !peers.iter().any(|(peer, _)| peer.process == *p))
                        .collect();
                    return Err(CheckpointError::Config(format!(
                        "{what}: processes {missing:?} did not connect within {:?}",
                        membership.connect_timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(what)(e)),
        }
    }
    peers.sort_by_key(|(p, _)| p.process);
    Ok(peers)
}

/// A follower's side: connects to the coordinator (retrying until the
/// timeout: it may start later) and introduces itself.
pub(super) fn connect(membership: &Membership) -> Result<(Peer, BufReader<TcpStream>), CheckpointError> {
    let what = format!("checkpoint coordinator {}", membership.coordinator);
    let deadline = Instant::now() + membership.connect_timeout;
    let stream = loop {
        let addresses: Vec<_> = membership
            .coordinator
            .to_socket_addrs()
            .map_err(|e| CheckpointError::Config(format!("{what}: not an address: {e}")))?
            .collect();
        let attempt = addresses.iter().find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).ok());
        if let Some(stream) = attempt {
            break stream;
        }
        if Instant::now() >= deadline {
            return Err(CheckpointError::Config(format!(
                "{what}: could not connect within {:?} (is process 0 running, and listening there?)",
                membership.connect_timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stream.set_nodelay(true).map_err(io(what.clone()))?;
    stream.set_write_timeout(Some(Duration::from_secs(30))).map_err(io(what.clone()))?;
    let reader = BufReader::new(stream.try_clone().map_err(io(what.clone()))?);
    let peer = Peer { process: 0, stream: Mutex::new(stream) };
    peer.send(&Message::Hello { process: membership.process, workers: membership.workers_per_process })
        .map_err(io(what))?;
    Ok((peer, reader))
}
