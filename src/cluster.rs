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
