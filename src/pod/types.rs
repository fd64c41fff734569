//! The errors a sync of a pod ends with: [`SyncError`], and [`StopError`] for a container or
//! sandbox that could not be stopped.

use std::path::PathBuf;

use crate::model::Waiting;
use crate::volumes::VolumeError;

/// Why a sync of a pod did not bring it all the way to its spec. The worker retries (after the
/// pod's own requeue time, or its error back-off) and the status shows the waiting reasons.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The runtime's network is not ready and the pod is not on the host network.
    #[error("network is not ready: {0}")]
    NetworkNotReady(String),
    /// The pod asks for a user namespace (`hostUsers: false`) the runtime does not offer.
    #[error(
        "the container runtime's handler \"\" does not support user namespaces \
         (spec.hostUsers: false)"
    )]
    UserNamespacesUnsupported,
    /// The pod's user namespace could not be allocated.
    #[error("{0}")]
    UserNamespace(#[source] runtime::Error),
    /// The pod's UID cannot name its data directory.
    #[error("pod UID {0:?} cannot name a directory")]
    PodUid(String),
    /// The pod's data directories could not be made.
    #[error("creating {}: {source}", path.display())]
    PodDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The pod's cgroup could not be made (upstream: "Failed to create pod cgroup").
    #[error("unable to ensure pod container exists: {0}")]
    PodCgroup(#[source] crate::cm::Error),
    /// Volumes the pod's containers use could not be set up: its containers wait in
    /// `ContainerCreating`.
    #[error(transparent)]
    Volumes(#[from] VolumeError),
    /// The devices the pod's containers ask for could not be given (a device plugin failed
    /// or went away): its containers wait in `ContainerCreating`.
    #[error(transparent)]
    Devices(#[from] crate::devices::DeviceError),
    /// The runtime refused or failed a call (its code kept).
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// Containers or sandboxes that could not be stopped.
    #[error("{}", join(.0))]
    Stop(Vec<StopError>),
    /// A container cannot start now (its image, its config, a crash loop, a hook): upstream's
    /// `SyncPod` result for the first such container by name.
    #[error("{}", waiting_text(container, waiting))]
    Waiting { container: String, waiting: Waiting },
}

impl SyncError {
    /// Whether the sync only waits for a back-off or a container that cannot start yet:
    /// nothing failed that a retry at the pod's own requeue time would not see again.
    pub fn is_waiting(&self) -> bool {
        matches!(self, SyncError::Waiting { .. })
    }
}

/// `failed to "StartContainer" for "app" with ErrImagePull: "..."`, as upstream's sync result
/// prints; a hook's message (which carries what the hook printed) is left out.
fn waiting_text(container: &str, w: &Waiting) -> String {
    if w.reason.is_hook() {
        format!(
            "failed to \"StartContainer\" for \"{container}\" with {}",
            w.reason
        )
    } else {
        format!(
            "failed to \"StartContainer\" for \"{container}\" with {}: \"{}\"",
            w.reason, w.message
        )
    }
}

fn join(errors: &[StopError]) -> String {
    let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

/// A container or a sandbox that could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    /// Stopping a container failed; `why` is the reason it was being stopped, if one was
    /// given (a failed liveness probe, a changed spec).
    #[error("stopping container {container}: {source}{}", why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default())]
    Container {
        container: String,
        why: Option<String>,
        #[source]
        source: runtime::Error,
    },
    /// Stopping a sandbox failed.
    #[error("stopping sandbox {sandbox}: {source}")]
    Sandbox {
        sandbox: String,
        #[source]
        source: runtime::Error,
    },
}
