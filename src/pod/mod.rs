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
pub mod identity;
pub mod images;
pub mod kill;
pub mod manager;
pub mod options;
pub mod pull_secrets;
pub mod spec;
pub mod status;
pub mod sync;
pub mod termination;
pub mod types;

pub use crate::model::is_sidecar;
pub use crate::model::{Phase, PullPolicy, RestartPolicy, Waiting, WaitingReason};
pub use actions::{
    ContainerInfo, KillContainer, PodActions, RunState, RuntimePodStatus, SandboxInfo,
    compute_pod_actions, compute_pod_actions_with,
};
pub use backoff::Backoff;
pub use container::{ContainerOptions, container_config};
pub use hash::container_hash;
pub use spec::{SandboxOptions, qos_class, sandbox_config};
pub use status::{StatusContext, pod_status};
pub use types::SyncError;

pub use crate::model::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_MESSAGE_PATH,
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, host_network,
    restart_policy,
};
