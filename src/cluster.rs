//! Cluster start-up: workers and processes from timely's `-w -n -p -h`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A bad cluster argument, naming it and what was expected.
#[derive(Debug, thiserror::Error)]
#[error("invalid cluster arguments {args:?}: {reason} (expected -w THREADS, -n PROCESSES, -p INDEX, -h HOSTFILE)")]
pub struct ClusterError {
    /// The arguments given.
    pub args: Vec<String>,
    /// What was wrong.
    pub reason: String,
}

/// Builds a timely configuration from timely's own arguments: `-w` worker
/// threads per process, `-n` processes, `-p` this process's index, `-h` a
/// file of `host:port` lines (one per process).
///
/// ```
/// let config = highwater::cluster::config_from_args(&["-w".into(), "2".into()]).unwrap();
/// assert!(format!("{:?}", config.communication).contains("Process(2)"));
/// assert!(highwater::cluster::config_from_args(&["--frobnicate".into()]).is_err());
/// ```
pub fn config_from_args(args: &[String]) -> Result<timely::Config, ClusterError> {
    let err = |reason: String| ClusterError { args: args.to_vec(), reason };
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        if matches!(flag.as_str(), "-w" | "--threads" | "-n" | "--processes" | "-p" | "--process") {
            let value = iter.next().ok_or_else(|| err(format!("{flag} needs a number")))?;
            let n: usize = value.parse().map_err(|_| err(format!("{flag} needs a number, got {value:?}")))?;
            if n == 0 && matches!(flag.as_str(), "-w" | "--threads" | "-n" | "--processes") {
                return Err(err(format!("{flag} must be at least 1")));
            }
        }
    }
    timely::Config::from_args(args.iter().cloned()).map_err(err)
}

/// The part of a command line that is timely's: what follows `--`, or
/// without a `--`, all of it but a leading program name (an argument that
/// is not a flag).
///
/// ```
/// use highwater::cluster::timely_args;
/// let line: Vec<String> = ["prog", "--input", "x", "--", "-w", "2"].map(String::from).into();
/// assert_eq!(timely_args(&line), ["-w", "2"]);
/// let line: Vec<String> = ["prog", "-w", "2"].map(String::from).into();
/// assert_eq!(timely_args(&line), ["-w", "2"]);
/// assert_eq!(timely_args(&line[1..]), ["-w", "2"]);
/// ```
pub fn timely_args(args: &[String]) -> &[String] {
    match args.iter().position(|a| a == "--") {
        Some(i) => &args[i + 1..],
        None => match args.first() {
            Some(first) if !first.starts_with('-') => &args[1..],
            _ => args,
        },
    }
}

/// The number of workers per process a configuration asks for.
pub fn threads(config: &timely::Config) -> usize {
    match &config.communication {
        timely::CommunicationConfig::Thread => 1,
        timely::CommunicationConfig::Process(n) | timely::CommunicationConfig::ProcessBinary(n) => *n,
        timely::CommunicationConfig::Cluster { threads, .. } => *threads,
    }
}

/// How this process takes part in the checkpoints of a job of several
/// processes, if `config` is one: process 0 coordinates at `coordinator`
/// (`host:port`), by default process 0's host with its port + 1000.
///
/// ```
/// let config = highwater::cluster::config_from_args(&["-n".into(), "2".into(), "-p".into(), "1".into()]).unwrap();
/// let m = highwater::cluster::checkpoint_membership(&config, None).unwrap().unwrap();
/// assert_eq!((m.process, m.processes, m.workers_per_process), (1, 2, 1));
/// assert_eq!(m.coordinator, "localhost:3101");
/// let single = highwater::cluster::config_from_args(&["-w".into(), "2".into()]).unwrap();
/// assert!(highwater::cluster::checkpoint_membership(&single, None).unwrap().is_none());
/// ```
pub fn checkpoint_membership(
    config: &timely::Config,
    coordinator: Option<&str>,
) -> Result<Option<crate::checkpoint::Membership>, ClusterError> {
    let timely::CommunicationConfig::Cluster { threads, process, addresses, .. } = &config.communication else {
        return Ok(None);
    };
    let err = |reason: String| ClusterError { args: Vec::new(), reason };
    let coordinator = match coordinator {
        Some(address) => address.to_owned(),
        None => {
            let first = addresses.first().ok_or_else(|| err("no process addresses".into()))?;
            let (host, port) = first
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                .ok_or_else(|| err(format!("process 0's address {first:?} is not host:port")))?;
            let port = port
                .checked_add(1000)
                .ok_or_else(|| err(format!("process 0's port {port} + 1000 is not a port: give the coordinator")))?;
            format!("{host}:{port}")
        }
    };
    Ok(Some(crate::checkpoint::Membership {
        process: *process,
        processes: addresses.len(),
        workers_per_process: *threads,
        coordinator,
        connect_timeout: std::time::Duration::from_secs(60),
    }))
}

pub use crate::abort::Abort;

/// Why the workers of a job could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Connecting to the other processes failed.
    #[error("connecting the processes: {0}")]
    Connect(String),
    /// Another part of the program gave up the start (see [`Abort`]).
    #[error("{0}")]
    Aborted(String),
    /// Timely could not start the workers.
    #[error("starting the workers: {0}")]
    Workers(String),
}

/// Runs `func` on every worker of `config`, like [`timely::execute()`].
pub fn execute<T, F>(config: timely::Config, func: F) -> Result<timely::communication::WorkerGuards<T>, StartError>
where
    T: Send + 'static,
    F: Fn(&mut timely::worker::Worker) -> T + Send + Sync + 'static,
{
    execute_abortable(config, &Abort::new(), func)
}

/// [`execute`], giving up while the processes connect once `abort` is given.
///
/// The processes of a cluster are connected here rather than by timely,
/// whose connection prints its progress on standard output (which belongs
/// to the program: CSV rows) and retries forever; here progress goes to the
/// log and the wait ends when `abort` is given.
pub fn execute_abortable<T, F>(
    config: timely::Config,
    abort: &Abort,
    func: F,
) -> Result<timely::communication::WorkerGuards<T>, StartError>
where
    T: Send + 'static,
    F: Fn(&mut timely::worker::Worker) -> T + Send + Sync + 'static,
{
    use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
    use timely::communication::allocator::{AllocatorBuilder, ProcessBuilder};
    use timely::communication::Hooks;

    let (allocators, others): (Vec<AllocatorBuilder>, Box<dyn std::any::Any + Send>) = match config.communication {
        timely::CommunicationConfig::Cluster { threads, process, addresses, zerocopy, .. } => {
            let sockets = connect(&addresses, process, abort)?;
            let hooks = Hooks::default();
            let local = if zerocopy {
                ProcessBuilder::new_bytes_vector(threads, hooks.refill.clone(), hooks.spill.clone())
            } else {
                ProcessBuilder::new_typed_vector(threads, hooks.refill.clone(), hooks.spill.clone())
            };
            let (builders, guard) = initialize_networking_from_sockets(local, sockets, process, threads, hooks)
                .map_err(|e| StartError::Connect(e.to_string()))?;
            (builders.into_iter().map(AllocatorBuilder::Tcp).collect(), Box::new(guard))
        }
        communication => communication.try_build().map_err(StartError::Workers)?,
    };
    timely::execute::execute_from(allocators, others, config.worker, func).map_err(StartError::Workers)
}

/// How often a waiting process retries and looks at its [`Abort`].
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// Connects this process (`me`) to the others, as timely's networking does:
/// it connects to the processes before it, sending its index (a big-endian
/// `u64`), and accepts the processes after it, reading theirs. The result has
/// a socket per process, `None` at `me`.
fn connect(addresses: &[String], me: usize, abort: &Abort) -> Result<Vec<Option<TcpStream>>, StartError> {
    let aborted = || abort.reason().map(StartError::Aborted);
    let io = |what: String| move |e: std::io::Error| StartError::Connect(format!("{what}: {e}"));
    let address = addresses.get(me).ok_or_else(|| StartError::Connect(format!("no address for process {me}")))?;
    let listeners = address
        .split_whitespace()
        .map(|a| {
            let listener = TcpListener::bind(a).map_err(io(format!("listening at {a}")))?;
            listener.set_nonblocking(true).map_err(io(format!("listening at {a}")))?;
            Ok(listener)
        })
        .collect::<Result<Vec<_>, StartError>>()?;
    let mut sockets: Vec<Option<TcpStream>> = (0..addresses.len()).map(|_| None).collect();
    let mut logged = std::time::Instant::now();
    for (index, peer) in addresses.iter().enumerate().take(me) {
        let mut stream = loop {
            if let Some(e) = aborted() {
                return Err(e);
            }
            match TcpStream::connect(peer) {
                Ok(stream) => break stream,
                Err(e) => {
                    if logged.elapsed() >= Duration::from_secs(1) {
                        tracing::info!(process = me, peer = index, %peer, "waiting for process {index}: {e}");
                        logged = std::time::Instant::now();
                    }
                    std::thread::sleep(CONNECT_RETRY);
                }
            }
        };
        let what = format!("connecting to process {index} at {peer}");
        stream.set_nodelay(true).map_err(io(what.clone()))?;
        stream.write_all(&(me as u64).to_be_bytes()).map_err(io(what))?;
        tracing::debug!(process = me, peer = index, "connected");
        sockets[index] = Some(stream);
    }
    while sockets.iter().enumerate().skip(me + 1).any(|(_, s)| s.is_none()) {
        if let Some(e) = aborted() {
            return Err(e);
        }
        let mut accepted = false;
        for listener in &listeners {
            match listener.accept() {
                Ok((mut stream, from)) => {
                    let what = format!("accepting a process from {from}");
                    stream.set_nonblocking(false).map_err(io(what.clone()))?;
                    stream.set_nodelay(true).map_err(io(what.clone()))?;
                    let mut index = [0u8; 8];
                    stream.read_exact(&mut index).map_err(io(what.clone()))?;
                    let index = u64::from_be_bytes(index) as usize;
                    if index <= me || index >= addresses.len() || sockets[index].is_some() {
                        return Err(StartError::Connect(format!("{what}: unexpected process index {index}")));
                    }
                    tracing::debug!(process = me, peer = index, "accepted");
                    sockets[index] = Some(stream);
                    accepted = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(io(format!("accepting at {address}"))(e)),
            }
        }
        if !accepted {
            if logged.elapsed() >= Duration::from_secs(1) {
                let waiting = sockets.iter().skip(me + 1).filter(|s| s.is_none()).count();
                tracing::info!(process = me, "waiting for {waiting} process(es) to connect");
                logged = std::time::Instant::now();
            }
            std::thread::sleep(CONNECT_RETRY);
        }
    }
    Ok(sockets)
}
