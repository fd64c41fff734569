//! The error type that crosses the runtime seam.
//!
//! CRI is a gRPC API, so its failures are classified by gRPC status codes.
//! [`Error`] carries such a [`Code`], a human-readable message and an optional
//! underlying cause. It converts to [`tonic::Status`] and back keeping the code
//! and the message, which lets a CRI gRPC server or client sit on either side
//! of the traits in `runtime::service` without losing information that the
//! kubelet relies on (for example `NotFound` after a container vanished).

use std::fmt;

/// A convenient result alias whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The class of a runtime failure: the gRPC status codes, minus `OK`.
///
/// The mapping onto [`tonic::Code`] is one-to-one for every variant.
/// [`tonic::Code::Ok`] has no counterpart (an error is never "OK"); converting
/// it yields [`Code::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// The operation was cancelled, typically by the caller.
    Canceled,
    /// An error that fits no other class.
    Unknown,
    /// The request is malformed, whatever the state of the runtime.
    InvalidArgument,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded,
    /// A referenced object (sandbox, container, image) does not exist.
    NotFound,
    /// The object the caller tried to create already exists.
    AlreadyExists,
    /// The caller lacks permission for the operation.
    PermissionDenied,
    /// Some resource (disk, memory, quota) has been exhausted.
    ResourceExhausted,
    /// The runtime is not in the state the operation requires
    /// (e.g. starting a container that is not in the CREATED state).
    FailedPrecondition,
    /// The operation was aborted, typically because of a concurrency conflict.
    Aborted,
    /// The operation was attempted past the valid range.
    OutOfRange,
    /// The operation is not implemented or supported by this runtime.
    Unimplemented,
    /// An invariant of the runtime was broken.
    Internal,
    /// The runtime is currently unavailable; retrying may help.
    Unavailable,
    /// Unrecoverable data loss or corruption.
    DataLoss,
    /// The request lacks valid authentication credentials.
    Unauthenticated,
}

impl Code {
    /// A short lowercase description, used as the prefix of [`Error`]'s
    /// `Display` output (e.g. `"not found"`).
    pub fn description(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid argument",
            Code::DeadlineExceeded => "deadline exceeded",
            Code::NotFound => "not found",
            Code::AlreadyExists => "already exists",
            Code::PermissionDenied => "permission denied",
            Code::ResourceExhausted => "resource exhausted",
            Code::FailedPrecondition => "failed precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out of range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

impl From<Code> for tonic::Code {
    fn from(code: Code) -> Self {
        match code {
            Code::Canceled => tonic::Code::Cancelled,
            Code::Unknown => tonic::Code::Unknown,
            Code::InvalidArgument => tonic::Code::InvalidArgument,
            Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Code::NotFound => tonic::Code::NotFound,
            Code::AlreadyExists => tonic::Code::AlreadyExists,
            Code::PermissionDenied => tonic::Code::PermissionDenied,
            Code::ResourceExhausted => tonic::Code::ResourceExhausted,
            Code::FailedPrecondition => tonic::Code::FailedPrecondition,
            Code::Aborted => tonic::Code::Aborted,
            Code::OutOfRange => tonic::Code::OutOfRange,
            Code::Unimplemented => tonic::Code::Unimplemented,
            Code::Internal => tonic::Code::Internal,
            Code::Unavailable => tonic::Code::Unavailable,
            Code::DataLoss => tonic::Code::DataLoss,
            Code::Unauthenticated => tonic::Code::Unauthenticated,
        }
    }
}

impl From<tonic::Code> for Code {
    /// Maps each gRPC code onto its namesake; `Ok` (which is not an error)
    /// becomes [`Code::Unknown`].
    fn from(code: tonic::Code) -> Self {
        match code {
            tonic::Code::Ok | tonic::Code::Unknown => Code::Unknown,
            tonic::Code::Cancelled => Code::Canceled,
            tonic::Code::InvalidArgument => Code::InvalidArgument,
            tonic::Code::DeadlineExceeded => Code::DeadlineExceeded,
            tonic::Code::NotFound => Code::NotFound,
            tonic::Code::AlreadyExists => Code::AlreadyExists,
            tonic::Code::PermissionDenied => Code::PermissionDenied,
            tonic::Code::ResourceExhausted => Code::ResourceExhausted,
            tonic::Code::FailedPrecondition => Code::FailedPrecondition,
            tonic::Code::Aborted => Code::Aborted,
            tonic::Code::OutOfRange => Code::OutOfRange,
            tonic::Code::Unimplemented => Code::Unimplemented,
            tonic::Code::Internal => Code::Internal,
            tonic::Code::Unavailable => Code::Unavailable,
            tonic::Code::DataLoss => Code::DataLoss,
            tonic::Code::Unauthenticated => Code::Unauthenticated,
        }
    }
}

/// A runtime failure: a [`Code`], a message and an optional cause.
///
/// `Display` renders `"<code description>: <message>"`, e.g.
/// `"not found: container \"abc\""`. The cause, if any, is reachable through
/// [`std::error::Error::source`] and is not part of the `Display` output.
#[derive(Debug)]
pub struct Error {
    code: Code,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error of the given class.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// A referenced object does not exist ([`Code::NotFound`]).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// The object to create already exists ([`Code::AlreadyExists`]).
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(Code::AlreadyExists, message)
    }

    /// The request is malformed ([`Code::InvalidArgument`]).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// The object is in the wrong state ([`Code::FailedPrecondition`]).
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }

    /// The runtime is temporarily unavailable ([`Code::Unavailable`]).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// A deadline expired ([`Code::DeadlineExceeded`]).
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message)
    }

    /// The operation is not supported ([`Code::Unimplemented`]).
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// A resource is exhausted ([`Code::ResourceExhausted`]).
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }

    /// The caller lacks permission ([`Code::PermissionDenied`]).
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, message)
    }

    /// The operation was cancelled ([`Code::Canceled`]).
    pub fn canceled(message: impl Into<String>) -> Self {
        Self::new(Code::Canceled, message)
    }

    /// An error that fits no other class ([`Code::Unknown`]).
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(Code::Unknown, message)
    }

    /// An internal invariant was broken ([`Code::Internal`]).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// Attaches the underlying cause, replacing any previous one.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The class of this error.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message, without the code prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether this is a [`Code::NotFound`] error.
    pub fn is_not_found(&self) -> bool {
        self.code == Code::NotFound
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<tonic::Status> for Error {
    /// Keeps the status code (see [`Code`]'s `From<tonic::Code>`) and message.
    fn from(status: tonic::Status) -> Self {
        Error::new(status.code().into(), status.message())
    }
}

impl From<Error> for tonic::Status {
    /// Keeps the code and the message; the cause is not transmitted.
    fn from(err: Error) -> Self {
        tonic::Status::new(err.code.into(), err.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    #[test]
    fn code_round_trips_through_tonic() {
        let mut seen = std::collections::HashSet::new();
        for code in ALL {
            let t: tonic::Code = code.into();
            assert_ne!(t, tonic::Code::Ok);
            assert!(
                seen.insert(t),
                "{code:?} maps onto an already used tonic code"
            );
            assert_eq!(Code::from(t), code);
        }
        assert_eq!(Code::from(tonic::Code::Ok), Code::Unknown);
    }

    #[test]
    fn every_tonic_error_code_round_trips() {
        for i in 1..=16 {
            let t = tonic::Code::from_i32(i);
            assert_eq!(tonic::Code::from(Code::from(t)), t);
        }
    }

    #[test]
    fn display_and_accessors() {
        let e = Error::not_found("container \"abc\"");
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(e.message(), "container \"abc\"");
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "not found: container \"abc\"");
        assert_eq!(
            Error::failed_precondition("x").to_string(),
            "failed precondition: x"
        );
    }

    #[test]
    fn constructors_pick_their_code() {
        let cases = [
            (Error::already_exists("m"), Code::AlreadyExists),
            (Error::invalid_argument("m"), Code::InvalidArgument),
            (Error::failed_precondition("m"), Code::FailedPrecondition),
            (Error::unavailable("m"), Code::Unavailable),
            (Error::deadline_exceeded("m"), Code::DeadlineExceeded),
            (Error::unimplemented("m"), Code::Unimplemented),
            (Error::resource_exhausted("m"), Code::ResourceExhausted),
            (Error::permission_denied("m"), Code::PermissionDenied),
            (Error::canceled("m"), Code::Canceled),
            (Error::unknown("m"), Code::Unknown),
            (Error::internal("m"), Code::Internal),
            (Error::new(Code::DataLoss, "m"), Code::DataLoss),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code);
            assert_eq!(err.message(), "m");
        }
    }

    #[test]
    fn source_is_kept() {
        use std::error::Error as _;
        let io = std::io::Error::other("disk on fire");
        let e = Error::internal("writing state").with_source(io);
        assert_eq!(e.to_string(), "internal: writing state");
        let src = e.source().map(|s| s.to_string());
        assert_eq!(src.as_deref(), Some("disk on fire"));
        assert!(Error::internal("x").source().is_none());
    }

    #[test]
    fn status_round_trip_preserves_code_and_message() {
        for code in ALL {
            let err = Error::new(code, format!("message for {code}"));
            let status: tonic::Status = err.into();
            assert_eq!(status.code(), tonic::Code::from(code));
            assert_eq!(status.message(), format!("message for {code}"));
            let back: Error = status.into();
            assert_eq!(back.code(), code);
            assert_eq!(back.message(), format!("message for {code}"));
        }
    }

    #[test]
    fn error_is_send_sync_static() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Error>();
    }
}
