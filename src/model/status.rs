//! What the runtime reports for one pod (upstream's `kubecontainer.PodStatus`): its sandboxes
//! and containers, built from CRI `PodSandboxStatus`/`ContainerStatus`, newest first.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runtime::cri;

use super::ANNOTATION_CONTAINER_HASH;

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// One sandbox of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxInfo {
    /// Runtime id.
    pub id: String,
    /// Metadata attempt.
    pub attempt: u32,
    /// `SANDBOX_READY`.
    pub ready: bool,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Whether it uses the node's network namespace.
    pub host_network: bool,
    /// Its primary IP (empty with host network or none).
    pub ip: String,
}

/// One container of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Runtime id.
    pub id: String,
    /// Container name (metadata).
    pub name: String,
    /// Metadata attempt (= restart count).
    pub attempt: u32,
    /// State.
    pub state: RunState,
    /// Exit code when exited.
    pub exit_code: i32,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// When it finished, if it did.
    pub finished_at: Option<SystemTime>,
    /// The `io.kubernetes.container.hash` annotation.
    pub hash: String,
}

/// What the runtime reports for one pod; sandboxes and containers newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimePodStatus {
    /// The pod's sandboxes, newest first.
    pub sandboxes: Vec<SandboxInfo>,
    /// The pod's containers (every attempt), newest first.
    pub containers: Vec<ContainerInfo>,
}

fn nanos_to_time(ns: i64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns.unsigned_abs()))
}

impl RuntimePodStatus {
    /// Builds the status from the CRI statuses of the pod's sandboxes and containers.
    pub fn from_cri(
        sandboxes: &[cri::PodSandboxStatus],
        containers: &[cri::ContainerStatus],
    ) -> Self {
        let mut s = RuntimePodStatus {
            sandboxes: sandboxes
                .iter()
                .map(|sb| SandboxInfo {
                    id: sb.id.clone(),
                    attempt: sb.metadata.as_ref().map_or(0, |m| m.attempt),
                    ready: sb.state == cri::PodSandboxState::SandboxReady as i32,
                    created_at: sb.created_at,
                    host_network: sb
                        .linux
                        .as_ref()
                        .and_then(|l| l.namespaces.as_ref())
                        .and_then(|n| n.options.as_ref())
                        .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32),
                    ip: sb
                        .network
                        .as_ref()
                        .map(|n| n.ip.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            containers: containers
                .iter()
                .map(|c| ContainerInfo {
                    id: c.id.clone(),
                    name: c
                        .metadata
                        .as_ref()
                        .map(|m| m.name.clone())
                        .unwrap_or_default(),
                    attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
                    state: match cri::ContainerState::try_from(c.state) {
                        Ok(cri::ContainerState::ContainerCreated) => RunState::Created,
                        Ok(cri::ContainerState::ContainerRunning) => RunState::Running,
                        Ok(cri::ContainerState::ContainerExited) => RunState::Exited,
                        _ => RunState::Unknown,
                    },
                    exit_code: c.exit_code,
                    created_at: c.created_at,
                    finished_at: nanos_to_time(c.finished_at),
                    hash: c
                        .annotations
                        .get(ANNOTATION_CONTAINER_HASH)
                        .cloned()
                        .unwrap_or_default(),
                })
                .collect(),
        };
        s.sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        s.containers
            .sort_by_key(|c| std::cmp::Reverse((c.created_at, c.attempt)));
        s
    }

    /// The newest container named `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The newest container named `name` that exited: what a restart's back-off counts from
    /// (also when a newer one runs and is about to be killed, as after a failed liveness probe).
    pub fn last_exited(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .find(|c| c.name == name && c.state == RunState::Exited)
    }
}
