//! Cluster start-up: workers and processes from timely's `-w -n -p -h`.

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

/// Runs `func` on every worker of `config`, like [`timely::execute`].
///
/// While the processes of a cluster connect, timely prints its progress on
/// standard output; that output belongs to the program (CSV rows), so during
/// the connection phase standard output is pointed at standard error.
pub fn execute<T, F>(config: timely::Config, func: F) -> Result<timely::communication::WorkerGuards<T>, String>
where
    T: Send + 'static,
    F: Fn(&mut timely::worker::Worker) -> T + Send + Sync + 'static,
{
    let clustered = matches!(config.communication, timely::CommunicationConfig::Cluster { .. });
    let (allocators, others) = if clustered {
        let _redirect = StdoutToStderr::new();
        config.communication.try_build()?
    } else {
        config.communication.try_build()?
    };
    timely::execute::execute_from(allocators, others, config.worker, func)
}

/// Points standard output at standard error until dropped.
struct StdoutToStderr {
    saved: Option<libc::c_int>,
}

impl StdoutToStderr {
    fn new() -> Self {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // SAFETY: dup/dup2 on the process's own standard descriptors; failures leave them as they were.
        let saved = unsafe {
            let saved = libc::dup(libc::STDOUT_FILENO);
            (saved >= 0 && libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) >= 0).then_some(saved)
        };
        StdoutToStderr { saved }
    }
}

impl Drop for StdoutToStderr {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if let Some(saved) = self.saved {
            // SAFETY: restores the descriptor saved in `new` and closes the copy.
            unsafe {
                libc::dup2(saved, libc::STDOUT_FILENO);
                libc::close(saved);
            }
        }
    }
}
