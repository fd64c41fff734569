//! Typed forms of the strings the pod API and the kubelet's status speak: restart and pull
//! policies, the pod phase and the waiting reasons a sync gives a container. Parsed once at the
//! edge; the decision code matches on them.

use std::fmt;

use k8s_openapi::api::core::v1::Container;

/// A pod's (or a sidecar's) restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The policy a pod's `restartPolicy` names; unset or unknown is `Always`, as the API
    /// server defaults it (validation refuses other values before a pod reaches a node).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is started again under this policy
    /// (upstream `ShouldContainerBeRestarted` for an exited container).
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// A container's effective image pull policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy, else `Always` for `:latest` or untagged images and
    /// `IfNotPresent` otherwise (the API server's defaulting).
    pub fn of(c: &Container) -> Self {
        match c.image_pull_policy.as_deref() {
            Some("Always") => return PullPolicy::Always,
            Some("IfNotPresent") => return PullPolicy::IfNotPresent,
            Some("Never") => return PullPolicy::Never,
            _ => {}
        }
        PullPolicy::default_for(c.image.as_deref().unwrap_or(""))
    }

    /// The API server's default for `image`: `Always` for an image without a tag or tagged
    /// `latest` (and no digest), else `IfNotPresent`.
    pub fn default_for(image: &str) -> Self {
        if image.contains('@') {
            return PullPolicy::IfNotPresent;
        }
        let last = image.rsplit('/').next().unwrap_or(image);
        match last.split_once(':') {
            Some((_, tag)) if tag != "latest" => PullPolicy::IfNotPresent,
            _ => PullPolicy::Always,
        }
    }

    /// The policy as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// The pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    /// The phase a status string names (`Pending` for anything else).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Pending,
        }
    }

    /// Succeeded or Failed: the pod will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a container waits, as the kubelet reports it (upstream's reasons, spelt as upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitingReason {
    ContainerCreating,
    PodInitializing,
    CrashLoopBackOff,
    ErrImagePull,
    ImagePullBackOff,
    ErrImageNeverPull,
    ImageInspectError,
    InvalidImageName,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PreStartHookError,
    PostStartHookError,
}

impl WaitingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingReason::ContainerCreating => "ContainerCreating",
            WaitingReason::PodInitializing => "PodInitializing",
            WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitingReason::ErrImagePull => "ErrImagePull",
            WaitingReason::ImagePullBackOff => "ImagePullBackOff",
            WaitingReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitingReason::ImageInspectError => "ImageInspectError",
            WaitingReason::InvalidImageName => "InvalidImageName",
            WaitingReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitingReason::CreateContainerError => "CreateContainerError",
            WaitingReason::RunContainerError => "RunContainerError",
            WaitingReason::PreStartHookError => "PreStartHookError",
            WaitingReason::PostStartHookError => "PostStartHookError",
        }
    }

    /// Whether this reason is a failed lifecycle hook (its message holds the hook's output).
    pub fn is_hook(self) -> bool {
        matches!(
            self,
            WaitingReason::PreStartHookError | WaitingReason::PostStartHookError
        )
    }

    /// Whether this reason comes from the image (pulling, inspecting).
    pub fn is_image(self) -> bool {
        matches!(
            self,
            WaitingReason::ErrImagePull
                | WaitingReason::ImagePullBackOff
                | WaitingReason::ErrImageNeverPull
                | WaitingReason::ImageInspectError
                | WaitingReason::InvalidImageName
        )
    }
}

impl fmt::Display for WaitingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A container that cannot start now: the reason and the message its status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: WaitingReason,
    pub message: String,
}

impl Waiting {
    pub fn new(reason: WaitingReason, message: impl Into<String>) -> Self {
        Waiting {
            reason,
            message: message.into(),
        }
    }
}
