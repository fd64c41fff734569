//! Why a pod source could not use what it read: a static pod manifest that does not decode or
//! validate, a static pod directory that cannot be listed, a static pod URL that does not
//! answer with pods. The messages are what the kubelet logs and records as `FailedValidation`
//! events, so they say in the manifest's terms what is wrong (`metadata.name "Web" is not a
//! DNS-1123 subdomain ...`).

use std::path::PathBuf;
use std::time::Duration;

/// An error of a pod source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // Decoding a manifest.
    /// The manifest is neither YAML nor JSON.
    #[error("not YAML/JSON: {0}")]
    NotYaml(#[source] serde_norway::Error),
    /// The manifest is a scalar or a list.
    #[error("not a Pod: the manifest is not a mapping")]
    NotAMapping,
    /// The manifest has no `kind`.
    #[error("kind is missing, want \"Pod\"")]
    KindMissing,
    /// The manifest is of another kind.
    #[error("kind is {0:?}, want \"Pod\"")]
    WrongKind(String),
    /// The manifest has no `apiVersion`.
    #[error("apiVersion is missing, want \"v1\"")]
    ApiVersionMissing,
    /// The manifest is of another API version.
    #[error("apiVersion is {0:?}, want \"v1\"")]
    WrongApiVersion(String),
    /// The manifest does not decode as a `v1` `Pod`.
    #[error("invalid Pod: {0}")]
    InvalidPod(#[source] serde_json::Error),

    // Validating a pod.
    #[error("metadata.name is required")]
    NameRequired,
    #[error(
        "metadata.name {0:?} is not a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', at most 253)"
    )]
    NameNotSubdomain(String),
    #[error("metadata.namespace {0:?} is not a DNS-1123 label")]
    NamespaceNotLabel(String),
    #[error("spec is required")]
    SpecRequired,
    #[error("spec.containers: at least one container is required")]
    NoContainers,
    /// `field` is `spec.initContainers` or `spec.containers`; `index` counts init containers
    /// first.
    #[error("{field}: container #{index} has no name")]
    ContainerWithoutName { field: &'static str, index: usize },
    #[error(
        "{field}: container name {name:?} is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63)"
    )]
    ContainerNameNotLabel { field: &'static str, name: String },
    #[error("{field}: duplicate container name {name:?}")]
    DuplicateContainer { field: &'static str, name: String },
    #[error("{field}: container {name:?} has no image")]
    NoImage { field: &'static str, name: String },
    /// An extended resource (a device plugin's) is not overcommitable: its request, when
    /// given, must equal its limit, and both must be whole numbers (the API server's rules).
    #[error("{field}[{name}].resources: {why}")]
    ExtendedResource {
        field: &'static str,
        name: String,
        why: String,
    },
    /// A container's probe or lifecycle handler is invalid; the prober's reason, which names
    /// the field.
    #[error("{0}")]
    InvalidProbe(#[from] crate::prober::InvalidHandler),

    // The static pod directory.
    /// The directory (or file) named by `staticPodPath` cannot be read.
    #[error("static pod path {}: {source}", path.display())]
    ListDirectory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A manifest file cannot be read.
    #[error("reading: {0}")]
    ReadManifest(#[source] std::io::Error),

    // The static pod URL.
    /// Something went wrong with the URL; says which.
    #[error("{url}: {source}")]
    Url {
        url: String,
        #[source]
        source: Box<Error>,
    },
    #[error("only http:// URLs are supported")]
    UnsupportedScheme,
    #[error("invalid host")]
    InvalidHost,
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    #[error("sending: {0}")]
    SendRequest(#[source] std::io::Error),
    #[error("reading: {0}")]
    ReadResponse(#[source] std::io::Error),
    #[error("incomplete response")]
    IncompleteResponse,
    /// An answer other than 200; the status line.
    #[error("HTTP status {0}")]
    Status(String),
    #[error("bad Content-Length")]
    BadContentLength,
    #[error("truncated body")]
    TruncatedBody,
    #[error("truncated chunk")]
    TruncatedChunk,
    #[error("bad chunk size")]
    BadChunkSize,
    #[error("body larger than {0} bytes")]
    BodyTooLarge(u64),
    #[error("body is not UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    /// A `PodList` or `List` without `items`.
    #[error("{kind} without items")]
    ListWithoutItems { kind: String },
    /// A `PodList` or `List` of another API version than `v1`.
    #[error("{kind} apiVersion must be \"v1\"")]
    ListApiVersion { kind: String },
    /// One pod of the body is wrong.
    #[error("pod #{index}: {source}")]
    Item {
        index: usize,
        #[source]
        source: Box<Error>,
    },
}
