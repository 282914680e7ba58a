//! What can go wrong in the source's background thread, and whether
//! reconnecting helps.

use crate::source::SourceError;

/// A failure of the background thread.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// Retrying cannot help (configuration, catalog, protocol): the partition ends.
    #[error(transparent)]
    Fatal(#[from] SourceError),
    /// The server went away or is busy: reconnect with backoff.
    #[error("{0}")]
    Retry(String),
}

impl Failure {
    /// A configuration error: retrying cannot help.
    pub(crate) fn config(message: impl Into<String>) -> Failure {
        Failure::Fatal(SourceError::Config(message.into()))
    }

    /// Bad data from the server (a protocol violation, a value of an
    /// unexpected type): retrying cannot help.
    pub(crate) fn invalid(what: &str, error: impl std::fmt::Display) -> Failure {
        Failure::Fatal(SourceError::Io {
            what: format!("postgres: {what}"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string()),
        })
    }
}

impl From<postgres::Error> for Failure {
    /// Connection-level errors (I/O, closed connections, server shutdown or
    /// start-up, resource shortages, a slot still held by a terminating
    /// backend) are retried; other server errors are fatal.
    fn from(error: postgres::Error) -> Failure {
        let retry = error.is_closed() || error.code().is_none_or(|code| retryable_code(code.code()));
        // The error's own text is only its kind ("db error"): the server's
        // message (a failed login, a missing object) is its source.
        let text = match std::error::Error::source(&error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        };
        if retry {
            Failure::Retry(text)
        } else {
            Failure::Fatal(SourceError::Io { what: "postgres".to_owned(), source: std::io::Error::other(text) })
        }
    }
}

/// Whether a server error with SQLSTATE `code` may go away by reconnecting:
/// connection exceptions, transaction rollbacks (serialization failures,
/// deadlocks), insufficient resources, operator intervention (shutdown,
/// start-up), system errors, a slot still held by a terminating backend
/// (object in use) and lock timeouts.
pub(crate) fn retryable_code(code: &str) -> bool {
    ["08", "40", "53", "57", "58"].iter().any(|class| code.starts_with(class))
        || code == "55006" // object in use: the slot is active in another (dying) backend
        || code == "55P03" // lock not available
}
