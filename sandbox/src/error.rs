//! The sandbox crate's error type. Callers (the built-in runtime adapter) classify failures by
//! [`Kind`], never by message text.

use std::path::PathBuf;

/// What sort of failure this is, so a caller can map it onto its own error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// The sandbox or container does not exist.
    NotFound,
    /// The object already exists.
    AlreadyExists,
    /// The request was malformed or named impossible things.
    InvalidArgument,
    /// The object is in the wrong state for the operation (e.g. starting a running container).
    FailedPrecondition,
    /// The sandbox process cannot be reached (it is gone or not answering).
    Unavailable,
    /// The operation did not finish within its deadline.
    DeadlineExceeded,
    /// Anything else: a syscall or libcontainer failure.
    Internal,
}

/// An error from the sandbox process or its client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A failure reported by, or about, an operation: its kind and a message saying what went wrong.
    #[error("{message}")]
    Op { kind: Kind, message: String },
    /// An I/O failure on a path.
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The sandbox socket could not be reached.
    #[error("sandbox at {path} is unreachable: {source}")]
    Unreachable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A protocol message could not be encoded or decoded.
    #[error("sandbox protocol error: {0}")]
    Protocol(#[from] serde_json::Error),
}

impl Error {
    /// Builds an error of `kind` with a message.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error::Op {
            kind,
            message: message.into(),
        }
    }

    /// Builds an I/O error naming the path and what was being done.
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            context,
            path: path.into(),
            source,
        }
    }

    /// The kind of this error.
    pub fn kind(&self) -> Kind {
        match self {
            Error::Op { kind, .. } => *kind,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Kind::NotFound
            }
            Error::Io { .. } => Kind::Internal,
            Error::Unreachable { .. } => Kind::Unavailable,
            Error::Protocol(_) => Kind::Internal,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
