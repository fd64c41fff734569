//! The pod worker's core: from a Kubernetes `Pod` to CRI calls and back.
//!
//! Mostly pure functions over `k8s-openapi` objects and `runtime::cri` messages, table-tested
//! without a runtime: [`spec`] turns a pod into `PodSandboxConfig` and `ContainerConfig`,
//! [`actions`] compares a pod with what the runtime reports and decides what to kill and start
//! (like upstream's `computePodActions`), [`backoff`] keeps the CrashLoopBackOff delays,
//! [`status`] derives the API `PodStatus` (phase, conditions, container states), [`types`] holds
//! the typed policies and reasons. I/O happens in two places: [`sync`] executes
//! [`actions::PodActions`] through `&dyn RuntimeService` and `&dyn ImageService`, [`volumes`]
//! sets up a pod's volumes (emptyDir directories, hostPath checks) before its sandbox, and
//! [`termination`] makes each container's termination-message file (when its config is built)
//! and reads it back (with the log's tail) when the container has exited.

pub mod actions;
pub mod backoff;
pub mod container;
pub mod env;
pub mod hash;
pub mod hooks;
pub mod kill;
pub mod pull_secrets;
pub mod spec;
pub mod status;
pub mod sync;
pub mod termination;
pub mod types;
pub mod volumes;

pub use actions::{
    ContainerInfo, KillContainer, PodActions, RunState, RuntimePodStatus, SandboxInfo,
    compute_pod_actions, compute_pod_actions_with, is_sidecar,
};
pub use backoff::Backoff;
pub use container::{ContainerOptions, container_config};
pub use hash::container_hash;
pub use spec::{SandboxOptions, qos_class, sandbox_config};
pub use status::{StatusContext, pod_status};
pub use types::{Phase, PullPolicy, RestartPolicy, SyncError, Waiting, WaitingReason};

/// Label carrying the pod name on sandboxes and containers.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label carrying the pod namespace on sandboxes and containers.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label carrying the pod UID on sandboxes and containers.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Label carrying the container name on containers.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation carrying the [`container_hash`] of the spec a container was created from.
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation carrying the restart count a container was created with.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation carrying the container's termination message path.
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";

use k8s_openapi::api::core::v1::Pod;

/// The pod's restart policy (`Always` when unset, as the API server defaults it).
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    RestartPolicy::parse(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()))
}

/// Whether the pod uses the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The pod's UID, name and namespace (empty strings when unset; namespace `default`).
pub fn pod_identity(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.uid.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or(""),
        m.namespace.as_deref().unwrap_or("default"),
    )
}
