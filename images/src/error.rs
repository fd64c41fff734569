//! The images crate's error type. Each variant names the operation that failed and keeps the
//! underlying error as its source; callers classify failures by [`Kind`], never by message text.

use std::path::PathBuf;

/// What sort of failure this is, so a caller can map it onto its own error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// The image, tag, manifest or rootfs does not exist.
    NotFound,
    /// The request or its input was bad: a malformed reference or key, a corrupt or truncated
    /// archive, a blob whose digest or size does not match its descriptor, an unsafe layer entry.
    InvalidArgument,
    /// The image is used by a prepared rootfs and cannot be removed.
    InUse,
    /// The registry could not be reached (connection refused, DNS failure, timeout, 5xx).
    Unavailable,
    /// The registry refused our credentials (401/403).
    PermissionDenied,
    /// Anything else: local I/O, syscalls, a corrupt store index.
    Internal,
}

/// An error from the image store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An image reference (name, tag or digest) could not be parsed.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// No image in the store matches the reference.
    #[error("image {reference:?} not found")]
    ImageNotFound { reference: String },

    /// A container key given to prepare_rootfs/release_rootfs is unusable as a directory name.
    #[error("invalid rootfs key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },

    /// The image cannot be removed because prepared rootfs still use it.
    #[error("image {image} is in use by rootfs {keys:?}")]
    InUse { image: String, keys: Vec<String> },

    /// The rootfs key is already held with a different image.
    #[error("rootfs key {key:?} is held for image {held}, not {requested}")]
    KeyConflict {
        key: String,
        held: String,
        requested: String,
    },

    /// An archive, layout or manifest being imported is malformed or unsupported.
    #[error("importing {path}: {reason}")]
    InvalidImage { path: PathBuf, reason: String },

    /// A registry served a manifest, index or config the store cannot use.
    #[error("pulling {reference}: {reason}")]
    InvalidManifest { reference: String, reason: String },

    /// An archive being imported could not be read as tar (corrupt or truncated).
    #[error("importing {path}: corrupt archive: {source}")]
    CorruptArchive {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Content did not match the digest or size its descriptor promised.
    #[error("verifying {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    /// A layer tar could not be decompressed or parsed.
    #[error("unpacking layer {layer}: corrupt layer: {source}")]
    CorruptLayer {
        layer: String,
        #[source]
        source: std::io::Error,
    },

    /// A layer entry is unsafe (escapes the layer, goes through a symlink) or unsupported.
    #[error("unpacking layer {layer}: entry {entry:?}: {reason}")]
    UnsafeLayerEntry {
        layer: String,
        entry: String,
        reason: String,
    },

    /// An image index has no manifest for the host platform.
    #[error("{reference}: no manifest for platform {platform}")]
    NoMatchingPlatform { reference: String, platform: String },

    /// The registry has no such repository, tag or manifest.
    #[error("pulling {reference}: not found: {source}")]
    PullNotFound {
        reference: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },

    /// The registry could not be reached.
    #[error("pulling {reference}: registry {registry} unavailable: {source}")]
    RegistryUnavailable {
        reference: String,
        registry: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },

    /// The registry refused the credentials (or demands some).
    #[error("pulling {reference}: not authorized: {source}")]
    PullUnauthorized {
        reference: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },

    /// Any other registry failure (protocol violation, unsupported manifest, ...).
    #[error("pulling {reference}: {source}")]
    Pull {
        reference: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },

    /// An I/O failure on a path.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A system call (mount, umount, mknod, flock, ...) failed on a path.
    #[error("{op} {path}: {source}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: nix::Error,
    },

    /// A JSON document of the store itself (index, rootfs record) could not be read or written.
    #[error("{op} {path}: {source}")]
    Json {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A blocking task of an async operation panicked or was cancelled.
    #[error("{op}: background task failed: {source}")]
    Task {
        op: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl Error {
    /// Builds an I/O error naming the operation and the path.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Builds a syscall error naming the operation and the path.
    pub(crate) fn sys(op: &'static str, path: impl Into<PathBuf>, source: nix::Error) -> Self {
        Error::Sys {
            op,
            path: path.into(),
            source,
        }
    }

    /// Builds an "invalid image" error for an import source.
    pub(crate) fn invalid_image(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidImage {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// The kind of this error.
    pub fn kind(&self) -> Kind {
        match self {
            Error::ImageNotFound { .. }
            | Error::PullNotFound { .. }
            | Error::NoMatchingPlatform { .. } => Kind::NotFound,
            Error::InvalidReference { .. }
            | Error::InvalidKey { .. }
            | Error::KeyConflict { .. }
            | Error::InvalidImage { .. }
            | Error::InvalidManifest { .. }
            | Error::CorruptArchive { .. }
            | Error::DigestMismatch { .. }
            | Error::CorruptLayer { .. }
            | Error::UnsafeLayerEntry { .. } => Kind::InvalidArgument,
            Error::InUse { .. } => Kind::InUse,
            Error::RegistryUnavailable { .. } => Kind::Unavailable,
            Error::PullUnauthorized { .. } => Kind::PermissionDenied,
            Error::Pull { .. }
            | Error::Io { .. }
            | Error::Sys { .. }
            | Error::Json { .. }
            | Error::Task { .. } => Kind::Internal,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
