//! The `reason`s of the kubelet's events, spelled as upstream's (pkg/kubelet/events and the
//! node status setters) so that tools and people reading events see the same words.

// Containers.
pub const CREATED_CONTAINER: &str = "Created";
pub const STARTED_CONTAINER: &str = "Started";
pub const FAILED_TO_CREATE_CONTAINER: &str = "Failed";
pub const FAILED_TO_START_CONTAINER: &str = "Failed";
pub const KILLING_CONTAINER: &str = "Killing";
pub const PREEMPT_CONTAINER: &str = "Preempting";
pub const BACK_OFF_START_CONTAINER: &str = "BackOff";
pub const EXCEEDED_GRACE_PERIOD: &str = "ExceededGracePeriod";

// Pods.
pub const FAILED_TO_KILL_POD: &str = "FailedKillPod";
pub const FAILED_TO_CREATE_POD_CONTAINER: &str = "FailedCreatePodContainer";
pub const FAILED_TO_MAKE_POD_DATA_DIRECTORIES: &str = "Failed";
pub const NETWORK_NOT_READY: &str = "NetworkNotReady";

// Images.
pub const PULLING_IMAGE: &str = "Pulling";
pub const PULLED_IMAGE: &str = "Pulled";
pub const FAILED_TO_PULL_IMAGE: &str = "Failed";
pub const FAILED_TO_INSPECT_IMAGE: &str = "InspectFailed";
pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
pub const BACK_OFF_PULL_IMAGE: &str = "BackOff";

// The kubelet and its node.
pub const NODE_READY: &str = "NodeReady";
pub const NODE_NOT_READY: &str = "NodeNotReady";
pub const NODE_SCHEDULABLE: &str = "NodeSchedulable";
pub const NODE_NOT_SCHEDULABLE: &str = "NodeNotSchedulable";
pub const STARTING_KUBELET: &str = "Starting";
pub const KUBELET_SETUP_FAILED: &str = "KubeletSetupFailed";
pub const FAILED_ATTACH_VOLUME: &str = "FailedAttachVolume";
pub const FAILED_MOUNT_VOLUME: &str = "FailedMount";
pub const SUCCESSFUL_MOUNT_VOLUME: &str = "SuccessfulMountVolume";
pub const NODE_REBOOTED: &str = "Rebooted";
pub const NODE_SHUTDOWN: &str = "Shutdown";
pub const CONTAINER_GC_FAILED: &str = "ContainerGCFailed";
pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
pub const NODE_ALLOCATABLE_ENFORCED: &str = "NodeAllocatableEnforced";
pub const SANDBOX_CHANGED: &str = "SandboxChanged";
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
pub const FAILED_STATUS_POD_SANDBOX: &str = "FailedPodSandBoxStatus";
pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";

// Node conditions, as the node status setters record their transitions.
pub const NODE_HAS_SUFFICIENT_MEMORY: &str = "NodeHasSufficientMemory";
pub const NODE_HAS_INSUFFICIENT_MEMORY: &str = "NodeHasInsufficientMemory";
pub const NODE_HAS_NO_DISK_PRESSURE: &str = "NodeHasNoDiskPressure";
pub const NODE_HAS_DISK_PRESSURE: &str = "NodeHasDiskPressure";
pub const NODE_HAS_SUFFICIENT_PID: &str = "NodeHasSufficientPID";
pub const NODE_HAS_INSUFFICIENT_PID: &str = "NodeHasInsufficientPID";

// Probes and lifecycle hooks.
pub const CONTAINER_UNHEALTHY: &str = "Unhealthy";
pub const CONTAINER_PROBE_WARNING: &str = "ProbeWarning";
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";

/// A pod worker's sync failed.
pub const FAILED_SYNC: &str = "FailedSync";
/// A pod (such as a static pod manifest) that cannot be used.
pub const FAILED_VALIDATION: &str = "FailedValidation";
