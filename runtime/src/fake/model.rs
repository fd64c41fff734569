//! The objects held by [`FakeRuntime`](super::FakeRuntime) and their CRI views.

use std::collections::HashMap;

use crate::cri;

/// A pod sandbox as the fake runtime stores it. Snapshots are returned by
/// [`FakeRuntime::sandboxes`](super::FakeRuntime::sandboxes).
#[derive(Debug, Clone, PartialEq)]
pub struct FakeSandbox {
    /// Runtime-chosen id (64 hex characters).
    pub id: String,
    /// Metadata from the config the sandbox was created with.
    pub metadata: cri::PodSandboxMetadata,
    /// The full config passed to `RunPodSandbox`.
    pub config: cri::PodSandboxConfig,
    /// `SandboxReady` after `RunPodSandbox`, `SandboxNotready` after `StopPodSandbox`.
    pub state: cri::PodSandboxState,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// Labels from the config.
    pub labels: HashMap<String, String>,
    /// Annotations from the config.
    pub annotations: HashMap<String, String>,
    /// The runtime handler requested by `RunPodSandbox`.
    pub runtime_handler: String,
    /// The fake network status: a `10.88.x.y` address for pod-network
    /// sandboxes, none for host-network ones or once stopped.
    pub network: cri::PodSandboxNetworkStatus,
}

/// A container as the fake runtime stores it. Snapshots are returned by
/// [`FakeRuntime::containers`](super::FakeRuntime::containers).
#[derive(Debug, Clone, PartialEq)]
pub struct FakeContainer {
    /// Runtime-chosen id (64 hex characters).
    pub id: String,
    /// The sandbox the container belongs to.
    pub pod_sandbox_id: String,
    /// Metadata from the container config.
    pub metadata: cri::ContainerMetadata,
    /// The full config passed to `CreateContainer`.
    pub config: cri::ContainerConfig,
    /// The image spec from the config.
    pub image: cri::ImageSpec,
    /// The image id if the image is known to the fake, else the reference.
    pub image_ref: String,
    /// Lifecycle state.
    pub state: cri::ContainerState,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// Start time (0 until started), nanoseconds since the Unix epoch.
    pub started_at: i64,
    /// Finish time (0 until exited), nanoseconds since the Unix epoch.
    pub finished_at: i64,
    /// Exit code, meaningful once exited.
    pub exit_code: i32,
    /// Short reason for the current state (e.g. `"Completed"`, `"Error"`).
    pub reason: String,
    /// Human-readable detail for the current state.
    pub message: String,
    /// Absolute log path: the sandbox's log directory joined with the
    /// container config's relative log path.
    pub log_path: String,
    /// Labels from the config.
    pub labels: HashMap<String, String>,
    /// Annotations from the config.
    pub annotations: HashMap<String, String>,
    /// Resources from the config, replaced by `UpdateContainerResources`.
    pub resources: Option<cri::ContainerResources>,
}

impl FakeSandbox {
    pub(crate) fn is_ready(&self) -> bool {
        self.state == cri::PodSandboxState::SandboxReady
    }

    /// Whether the config asks for the node's network namespace.
    pub(crate) fn host_network(config: &cri::PodSandboxConfig) -> bool {
        config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.network == cri::NamespaceMode::Node as i32)
    }

    pub(crate) fn to_cri(&self) -> cri::PodSandbox {
        cri::PodSandbox {
            id: self.id.clone(),
            metadata: Some(self.metadata.clone()),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    pub(crate) fn status(&self) -> cri::PodSandboxStatus {
        cri::PodSandboxStatus {
            id: self.id.clone(),
            metadata: Some(self.metadata.clone()),
            state: self.state as i32,
            created_at: self.created_at,
            network: Some(self.network.clone()),
            linux: None,
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    pub(crate) fn attributes(&self) -> cri::PodSandboxAttributes {
        cri::PodSandboxAttributes {
            id: self.id.clone(),
            metadata: Some(self.metadata.clone()),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
        }
    }

    pub(crate) fn matches(&self, filter: &cri::PodSandboxFilter) -> bool {
        filter.state.is_none_or(|s| s.state == self.state as i32)
            && labels_match(&self.labels, &filter.label_selector)
    }
}

impl FakeContainer {
    pub(crate) fn to_cri(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.pod_sandbox_id.clone(),
            metadata: Some(self.metadata.clone()),
            image: Some(self.image.clone()),
            image_ref: self.image_ref.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            image_id: self.image_ref.clone(),
        }
    }

    pub(crate) fn status(&self) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: self.id.clone(),
            metadata: Some(self.metadata.clone()),
            state: self.state as i32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: Some(self.image.clone()),
            image_ref: self.image_ref.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            mounts: self.config.mounts.clone(),
            log_path: self.log_path.clone(),
            resources: self.resources.clone(),
            image_id: self.image_ref.clone(),
            user: None,
        }
    }

    /// Zero-valued usage stamped with `now`.
    pub(crate) fn stats(&self, now: i64) -> cri::ContainerStats {
        let zero = Some(cri::UInt64Value { value: 0 });
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: self.id.clone(),
                metadata: Some(self.metadata.clone()),
                labels: self.labels.clone(),
                annotations: self.annotations.clone(),
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: now,
                usage_core_nano_seconds: zero,
                usage_nano_cores: zero,
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: now,
                working_set_bytes: zero,
                available_bytes: zero,
                usage_bytes: zero,
                rss_bytes: zero,
                page_faults: zero,
                major_page_faults: zero,
            }),
            writable_layer: None,
            swap: None,
        }
    }

    /// Moves a running (or unknown) container to EXITED.
    pub(crate) fn exit(&mut self, now: i64, exit_code: i32, reason: &str) {
        self.state = cri::ContainerState::ContainerExited;
        self.finished_at = now;
        self.exit_code = exit_code;
        self.reason = reason.to_string();
    }

    pub(crate) fn is_running(&self) -> bool {
        matches!(
            self.state,
            cri::ContainerState::ContainerRunning | cri::ContainerState::ContainerUnknown
        )
    }

    pub(crate) fn matches(&self, filter: &cri::ContainerFilter) -> bool {
        filter.state.is_none_or(|s| s.state == self.state as i32)
            && (filter.pod_sandbox_id.is_empty() || filter.pod_sandbox_id == self.pod_sandbox_id)
            && labels_match(&self.labels, &filter.label_selector)
    }
}

/// Every selector entry must be present with an equal value.
pub(crate) fn labels_match(
    labels: &HashMap<String, String>,
    selector: &HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}
