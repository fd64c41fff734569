//! The `reason`s of the kubelet's events: every reason the kubelet records and only those,
//! spelled as upstream's (pkg/kubelet/events and the node status setters) so that tools and
//! people reading events see the same words.

use std::fmt;

/// An event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // Containers.
    /// A container was created (`Created`).
    CreatedContainer,
    /// A container was started (`Started`).
    StartedContainer,
    /// A container could not be made or started, or its image pulled (`Failed`).
    Failed,
    /// A container is being stopped (`Killing`).
    KillingContainer,
    /// A crash-looping container or an image pull waits (`BackOff`).
    BackOff,
    /// A container's environment has names the runtime may not accept.
    InvalidEnvironmentVariableNames,
    // Pods.
    /// The pod's sandbox changed: it is killed and made again.
    SandboxChanged,
    /// The pod's sandbox could not be made (`FailedCreatePodSandBox`).
    FailedCreatePodSandbox,
    /// A volume could not be mounted (`FailedMount`).
    FailedMountVolume,
    /// An image pull secret could not be read.
    FailedToRetrieveImagePullSecret,
    /// The devices an admitted pod asks for could not be given to it.
    UnexpectedAdmissionError,
    /// The pod's resolv.conf had to be cut to the limits.
    DnsConfigForming,
    /// A ClusterFirst pod on a kubelet without clusterDNS.
    MissingClusterDns,
    // Images.
    /// An image pull began.
    PullingImage,
    /// An image is there (pulled, or already present).
    PulledImage,
    /// An image is missing and the policy forbids pulling it.
    ErrImageNeverPull,
    // Probes and lifecycle hooks.
    /// A probe failed (`Unhealthy`).
    ContainerUnhealthy,
    /// A probe passed with a warning.
    ContainerProbeWarning,
    /// A postStart hook failed.
    FailedPostStartHook,
    /// A preStop hook failed.
    FailedPreStopHook,
    // The kubelet and its node.
    /// The kubelet started (`Starting`).
    StartingKubelet,
    /// The node became Ready.
    NodeReady,
    /// The node became NotReady.
    NodeNotReady,
    NodeHasSufficientMemory,
    NodeHasInsufficientMemory,
    NodeHasNoDiskPressure,
    NodeHasDiskPressure,
    NodeHasSufficientPid,
    NodeHasInsufficientPid,
    /// Something the kubelet was given cannot be used (a static pod manifest).
    FailedValidation,
    // Image garbage collection.
    /// Not enough image space could be freed.
    FreeDiskSpaceFailed,
    /// Image garbage collection failed twice in a row.
    ImageGcFailed,
    // Node-pressure eviction.
    /// An eviction threshold is met: the kubelet reclaims the resource.
    EvictionThresholdMet,
    /// A pod was evicted.
    Evicted,
    // Graceful node shutdown.
    /// logind announced the node's shutdown, or its cancellation.
    NodeShutdown,
}

impl Reason {
    /// Every reason, in the order declared.
    pub const ALL: [Reason; 35] = [
        Reason::CreatedContainer,
        Reason::StartedContainer,
        Reason::Failed,
        Reason::KillingContainer,
        Reason::BackOff,
        Reason::InvalidEnvironmentVariableNames,
        Reason::SandboxChanged,
        Reason::FailedCreatePodSandbox,
        Reason::FailedMountVolume,
        Reason::FailedToRetrieveImagePullSecret,
        Reason::UnexpectedAdmissionError,
        Reason::DnsConfigForming,
        Reason::MissingClusterDns,
        Reason::PullingImage,
        Reason::PulledImage,
        Reason::ErrImageNeverPull,
        Reason::ContainerUnhealthy,
        Reason::ContainerProbeWarning,
        Reason::FailedPostStartHook,
        Reason::FailedPreStopHook,
        Reason::StartingKubelet,
        Reason::NodeReady,
        Reason::NodeNotReady,
        Reason::NodeHasSufficientMemory,
        Reason::NodeHasInsufficientMemory,
        Reason::NodeHasNoDiskPressure,
        Reason::NodeHasDiskPressure,
        Reason::NodeHasSufficientPid,
        Reason::NodeHasInsufficientPid,
        Reason::FailedValidation,
        Reason::FreeDiskSpaceFailed,
        Reason::ImageGcFailed,
        Reason::EvictionThresholdMet,
        Reason::Evicted,
        Reason::NodeShutdown,
    ];

    /// The reason as events spell it.
    pub fn as_str(self) -> &'static str {
        use Reason::*;
        match self {
            CreatedContainer => "Created",
            StartedContainer => "Started",
            Failed => "Failed",
            KillingContainer => "Killing",
            BackOff => "BackOff",
            InvalidEnvironmentVariableNames => "InvalidEnvironmentVariableNames",
            SandboxChanged => "SandboxChanged",
            FailedCreatePodSandbox => "FailedCreatePodSandBox",
            FailedMountVolume => "FailedMount",
            FailedToRetrieveImagePullSecret => "FailedToRetrieveImagePullSecret",
            UnexpectedAdmissionError => "UnexpectedAdmissionError",
            DnsConfigForming => "DNSConfigForming",
            MissingClusterDns => "MissingClusterDNS",
            PullingImage => "Pulling",
            PulledImage => "Pulled",
            ErrImageNeverPull => "ErrImageNeverPull",
            ContainerUnhealthy => "Unhealthy",
            ContainerProbeWarning => "ProbeWarning",
            FailedPostStartHook => "FailedPostStartHook",
            FailedPreStopHook => "FailedPreStopHook",
            StartingKubelet => "Starting",
            NodeReady => "NodeReady",
            NodeNotReady => "NodeNotReady",
            NodeHasSufficientMemory => "NodeHasSufficientMemory",
            NodeHasInsufficientMemory => "NodeHasInsufficientMemory",
            NodeHasNoDiskPressure => "NodeHasNoDiskPressure",
            NodeHasDiskPressure => "NodeHasDiskPressure",
            NodeHasSufficientPid => "NodeHasSufficientPID",
            NodeHasInsufficientPid => "NodeHasInsufficientPID",
            FailedValidation => "FailedValidation",
            FreeDiskSpaceFailed => "FreeDiskSpaceFailed",
            ImageGcFailed => "ImageGCFailed",
            EvictionThresholdMet => "EvictionThresholdMet",
            Evicted => "Evicted",
            NodeShutdown => "NodeShutdown",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn every_reason_is_listed_once_and_spelled_as_a_word() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r), "{r:?} twice");
            assert!(r.as_str().chars().all(|c| c.is_ascii_alphabetic()), "{r:?}");
        }
        let spelled: std::collections::HashSet<_> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            spelled.len(),
            Reason::ALL.len(),
            "two reasons spelled alike"
        );
    }
}
