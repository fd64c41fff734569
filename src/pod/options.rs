//! What a container's config is made with besides the pod: node facts and what a sync read
//! for the pod (its addresses, the objects its env references, its claims, its pull secrets).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::spec::SandboxOptions;
use crate::api::objects::ObjectError;
use crate::api::services::ServicesError;
use crate::volumes::projection::Allocatable;

/// Node facts a container config needs.
#[derive(Debug, Clone)]
pub struct ContainerOptions {
    /// Pod-level options (seccomp root and default).
    pub sandbox: SandboxOptions,
    /// `<root>/pods`: an emptyDir volume lives in
    /// `<pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<name>`.
    pub pods_dir: PathBuf,
    /// The node name (`spec.nodeName` when the pod does not say).
    pub node_name: String,
    /// The pod IPs, first the primary (for `status.podIP`/`status.podIPs`).
    pub pod_ips: Vec<String>,
    /// The node IPs (for `status.hostIP`/`status.hostIPs`).
    pub host_ips: Vec<String>,
    /// The node's memory capacity in bytes (Burstable OOM score).
    pub node_memory_bytes: i64,
    /// The runtime takes a container's own stop signal as the annotation
    /// `runtime::builtin::ANNOTATION_STOP_SIGNAL` (the built-in runtime does; CRI v1 as the
    /// `k8s-cri` bindings have it has no field for it, so for other runtimes a
    /// `lifecycle.stopSignal` is refused).
    pub stop_signal_annotation: bool,
    /// The ConfigMaps and Secrets the pod's environments reference, read for this sync.
    pub env_objects: EnvObjects,
    /// The pod's volumes set up for this sync, by name: what its containers' mounts bind.
    pub volumes: std::collections::BTreeMap<String, crate::volumes::MountedVolume>,
    /// The pod's `imagePullSecrets` read for this sync.
    pub pull_secrets: Vec<k8s_openapi::api::core::v1::Secret>,
    /// The device manager (device plugins), when the kubelet runs one.
    pub device_manager: Option<crate::devices::DeviceManager>,
    /// What each container gets from its devices, by container name, given for this sync.
    pub devices: BTreeMap<String, crate::devices::RunOptions>,
}

impl Default for ContainerOptions {
    fn default() -> Self {
        ContainerOptions {
            sandbox: SandboxOptions::default(),
            pods_dir: PathBuf::from("/var/lib/nodelet/pods"),
            node_name: String::new(),
            pod_ips: Vec::new(),
            host_ips: Vec::new(),
            node_memory_bytes: 0,
            stop_signal_annotation: false,
            env_objects: Default::default(),
            volumes: Default::default(),
            pull_secrets: Vec::new(),
            device_manager: None,
            devices: BTreeMap::new(),
        }
    }
}

/// What reading an object gave: its data, `None` when it does not exist, or why it could not
/// be read.
pub type Read<T> = std::result::Result<Option<T>, ObjectError>;

/// The ConfigMaps and Secrets a pod's containers' environments reference, as read for a sync,
/// and the node's allocatable resources.
#[derive(Debug, Clone, Default)]
pub struct EnvObjects {
    /// ConfigMaps' `data` by name.
    pub config_maps: BTreeMap<String, Read<BTreeMap<String, String>>>,
    /// Secrets' `data` by name.
    pub secrets: BTreeMap<String, Read<BTreeMap<String, Vec<u8>>>>,
    pub allocatable: Allocatable,
    /// The service environment variables of the pod ([`crate::api::services`]).
    pub service_env: BTreeMap<String, String>,
    /// Why the service environment could not be made (the Services not read yet).
    pub service_env_error: Option<ServicesError>,
}
