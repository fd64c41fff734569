//! The error a sync of a pod ends with.

use std::fmt;

/// Why a sync of a pod did not bring it all the way to its spec. The worker retries (after the
/// pod's own requeue time, or its error back-off) and the status shows the waiting reasons.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// The runtime's network is not ready and the pod is not on the host network.
    #[error("network is not ready: {0}")]
    NetworkNotReady(String),
    /// The pod cannot run here as it is (a user namespace the runtime does not offer, ...).
    #[error("{0}")]
    Unsupported(String),
    /// Volumes the pod's containers use could not be set up (an unsupported type, a failed
    /// hostPath check): its containers wait in `ContainerCreating`.
    #[error(transparent)]
    Volumes(#[from] crate::volumes::VolumeError),
    /// Some containers could not start for their image (pull, inspect, policy).
    #[error("{0}")]
    Image(String),
    /// A container's configuration could not be built (a missing reference, a bad path).
    #[error("{0}")]
    Config(String),
    /// A container is in CrashLoopBackOff.
    #[error("{0}")]
    BackOff(String),
    /// The runtime refused or failed a call.
    #[error("{0}")]
    Runtime(String),
}

impl SyncError {
    /// The error of a failed runtime call.
    pub fn runtime(e: impl fmt::Display) -> Self {
        SyncError::Runtime(e.to_string())
    }
}
