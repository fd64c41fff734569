//! The volume manager's errors: [`PluginError`], why one volume could not be set up (or torn
//! down), composed from the errors of what it calls (the objects' watches, the token manager,
//! the projection, the atomic writer, quantities); and [`VolumeError`], the sync's error naming
//! every volume that failed. A `PluginError`'s text is the reason of the volume's `FailedMount`
//! event (`MountVolume.SetUp failed for volume "x" : <reason>`), upstream's where it has one.

use std::io;
use std::path::PathBuf;

use super::MOUNTINFO;
use super::atomic_writer::WriteError;
use super::projection::{ProjectionError, bracketed};
use crate::api::objects::ObjectError;
use crate::api::tokens::TokenError;
use crate::util::quantity::QuantityError;

/// Volumes the pod's containers use that could not be set up: the pod waits in
/// `ContainerCreating` and its worker tries again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to attach or mount volumes: {0}")]
pub struct VolumeError(pub String);

/// Why a volume could not be set up, or torn down.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A volume type (by its API field name) this kubelet does not support.
    #[error("volume type {0} is not supported by nodelet yet")]
    Unsupported(String),
    /// A mount of a volume the sync did not set up.
    #[error("volume {0:?} was not set up for this sync")]
    NotSetUp(String),
    /// A mount of a claim the sync did not resolve.
    #[error("persistentVolumeClaim {0:?} was not resolved for this sync")]
    ClaimNotResolved(String),
    /// An emptyDir of huge pages.
    #[error(
        "emptyDir medium {0} is not supported by nodelet yet (only the node's disk and memory)"
    )]
    HugePages(String),
    /// An emptyDir medium the API does not know.
    #[error("unknown storage medium {0:?}")]
    UnknownMedium(String),
    /// A volume the volume manager sets up, handed to the local plugins.
    #[error("volume {0:?} is set up by the volume manager, not here")]
    Managed(String),
    /// A volume the kubelet does not write, asked for its content.
    #[error("not a volume the kubelet writes")]
    NotWritten,
    /// An `fsGroup` that is not a group id.
    #[error("invalid fsGroup {0}")]
    InvalidFsGroup(i64),

    /// A volume's file or directory could not be given to the pod's `fsGroup`.
    #[error("giving {} to group {group}: {source}", path.display())]
    Own {
        path: PathBuf,
        group: u32,
        #[source]
        source: io::Error,
    },
    /// An emptyDir's directory could not be made.
    #[error("creating {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Something other than a directory is where an emptyDir's directory goes.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),

    /// A hostPath with a `..` name.
    #[error("invalid HostPath `{0}`: must not contain '..'")]
    HostPathClimbs(String),
    /// A relative hostPath.
    #[error("invalid HostPath `{0}`: must be an absolute path")]
    HostPathRelative(String),
    /// What is at a hostPath is not what its `type` says (`expected`: "a directory", ...).
    #[error("hostPath type check failed: {path} is not {expected}")]
    HostPathType {
        path: String,
        expected: &'static str,
    },
    /// A hostPath's `...OrCreate` could not make it (`what`: "directory" or "file").
    #[error("creating {what} {path}: {source}")]
    HostPathCreate {
        what: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    /// A hostPath `type` the API does not know.
    #[error("{0} is an invalid volume type")]
    HostPathTypeUnknown(String),

    /// A mount's `subPath` could not be resolved beneath its volume.
    #[error("{sub:?}{}", sub_path_reason(.source))]
    SubPath {
        sub: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    /// The volume of a `subPath` could not be opened.
    #[error("opening its volume: {0}")]
    OpenVolume(#[source] rustix::io::Errno),
    /// The mode of the volume of a `subPath` could not be read.
    #[error("reading its volume's mode: {0}")]
    VolumeMode(#[source] rustix::io::Errno),
    /// What a resolved `subPath` names could not be read.
    #[error("reading what it names: {0}")]
    ReadResolved(#[source] rustix::io::Errno),
    /// The target of a `subPath` bind (or its parent) could not be made.
    #[error("making {}: {source}", path.display())]
    MakeTarget {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A `subPath` could not be bound at its target.
    #[error("binding it at {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },

    /// The kernel's mount table could not be read.
    #[error("reading {MOUNTINFO}: {0}")]
    MountInfo(#[source] io::Error),
    /// A volume directory's real path could not be had.
    #[error("resolving {}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A tmpfs could not be mounted on a volume's directory.
    #[error("mounting a tmpfs at {}: {source}", path.display())]
    MountTmpfs {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    /// A tmpfs or a bind could not be unmounted.
    #[error("unmounting {}: {source}", path.display())]
    Unmount {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    /// A volume's directory could not be removed.
    #[error("removing {}: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// What went wrong tearing a pod's volumes down, each in turn: `first; second`.
    #[error("{}", semicolons(.0))]
    TearDown(Vec<PluginError>),

    /// A ConfigMap or Secret a volume needs (not optional) does not exist (upstream's message;
    /// `kind`: `configmap`, `secret`).
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// A projected source of a type this kubelet does not support (by its API field name).
    #[error("projected source {0} is not supported by nodelet yet")]
    UnsupportedProjection(String),
    /// A token projection in a pod that names no service account.
    #[error("cannot request a service account token: the pod has no spec.serviceAccountName")]
    NoServiceAccount,
    /// Several sources of a projected volume failed (upstream's aggregate): `[first, second]`.
    #[error("{}", bracketed(.0))]
    Sources(Vec<PluginError>),

    /// A claim that could not be resolved to its PersistentVolume.
    #[error("error processing PVC {namespace}/{name}: {source}")]
    Claim {
        namespace: String,
        name: String,
        #[source]
        source: ClaimError,
    },
    /// A claim's PersistentVolume in `Block` mode.
    #[error("persistentVolume {0}: volumeMode Block is not supported by nodelet yet")]
    BlockVolume(String),
    /// A claim's `local` PersistentVolume whose path is not there.
    #[error("path {0:?} does not exist")]
    LocalPathMissing(String),
    /// A claim's PersistentVolume of a type this kubelet does not support (by its API field
    /// name, or `with no source`).
    #[error(
        "persistentVolume {volume}: volume type {what} is not supported by nodelet yet (only \
         hostPath and local)"
    )]
    UnsupportedVolume { volume: String, what: String },

    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Quantity(#[from] QuantityError),
}

/// What [`PluginError::SubPath`] says after the path, by the error `openat2` gave.
fn sub_path_reason(e: &rustix::io::Errno) -> String {
    use rustix::io::Errno;
    match *e {
        Errno::XDEV => " leads out of its volume".into(),
        Errno::LOOP => ": too many levels of symbolic links".into(),
        Errno::NOTDIR => ": a component is not a directory".into(),
        Errno::NOSYS => ": resolving needs openat2 (Linux 5.6 or newer)".into(),
        e => format!(": {e}"),
    }
}

fn semicolons(errors: &[PluginError]) -> String {
    let texts: Vec<String> = errors.iter().map(PluginError::to_string).collect();
    texts.join("; ")
}

/// Why a claim and its PersistentVolume are not (yet) usable: upstream's messages, which a
/// [`PluginError::Claim`] prefixes with the claim's name.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The node has no API server to read the claim from.
    #[error("the node has no API server (standalone) to read it from")]
    Standalone,
    /// Reading the claim (`what`: `PVC`) or its volume (`PV <name>`) took too long.
    #[error("failed to fetch {what} from API server: timed out")]
    Timeout { what: String },
    /// Reading the claim or its volume failed: the API server's message, or the client's error.
    #[error("failed to fetch {what} from API server: {}", api_message(.source))]
    Fetch {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("PVC is being deleted")]
    Deleting,
    #[error("PVC is not bound")]
    NotBound,
    #[error("PVC has empty pvc.Spec.VolumeName")]
    NoVolumeName,
    /// The claim's PersistentVolume is bound to no claim.
    #[error(
        "found PV object {0} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound \
         to the claim"
    )]
    VolumeUnbound(String),
    /// The claim's PersistentVolume is bound to another claim.
    #[error(
        "found PV object {volume} but its pv.Spec.ClaimRef.UID {uid} does not point to \
         claim.UID {claim_uid}"
    )]
    VolumeOfOtherClaim {
        volume: String,
        uid: String,
        claim_uid: String,
    },
}

/// The API server's message for a refusal, else the client's error.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        e => e.to_string(),
    }
}
