//! The kubelet configuration file: a `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration`
//! in YAML or JSON, reduced to the fields nodelet supports, with the upstream kubelet's
//! defaults. Unknown fields are collected as warnings (a config written for the upstream
//! kubelet still loads); invalid values are errors naming the field. Settings that come from
//! flags (node name, node IP, kubeconfig, root dir) are plain fields the CLI sets afterwards.
//!
//! The file is read with serde into `RawConfig` (the v1beta1 names, every field optional),
//! which one conversion turns into [`KubeletConfig`], defaulting and checking each value.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

mod allocatable;
mod cgroups;
mod eviction;
mod export;
pub mod flags;
mod image_gc;
mod layers;
mod logs;
pub mod network;
mod raw;
mod registration;
mod server;
mod shutdown;
mod testing;
mod values;
pub use allocatable::Reserved;
pub use cgroups::{CgroupDriver, Cgroups};
pub use eviction::{Eviction, default_eviction_hard};
pub use image_gc::ImageGcConfig;
pub use layers::{Layers, load_layers, merge};
pub use logs::ContainerLogConfig;
pub use registration::{
    Registration, TAINT_EXTERNAL_CLOUD_PROVIDER, TaintSpec, format_taint, parse_node_labels,
    parse_taint,
};
pub use server::{AuthzMode, ServerConfig};
pub use shutdown::{PriorityGroup, SYSTEM_CRITICAL_PRIORITY, Shutdown};
pub use testing::TestingConfig;
use testing::testing;
pub use values::parse_duration;
use values::{IpList, NetworkField, Quantities, Shaped, Testing, Thresholds, Typed, wrong_type};

/// The only accepted `apiVersion`.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only accepted `kind`.
pub const KIND: &str = "KubeletConfiguration";

/// Why a configuration file could not be loaded, or why one of its values is refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is neither YAML nor JSON. (The parser's error is printed in the message, not
    /// chained as a source, so that `{:#}` does not print it twice.)
    #[error("parsing {path}: {error}")]
    Parse {
        path: PathBuf,
        error: serde_norway::Error,
    },
    /// The document is not a mapping.
    #[error("the configuration must be a mapping")]
    NotAMapping,
    /// A field is missing or has an invalid value: the field's path (`clusterDNS[1]`) and why,
    /// in the file's terms.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A value of the wrong type (`must be an integer, not "many"`); [`Error::Invalid`] names
    /// the field.
    #[error("must be {want}, not {got}")]
    WrongType { want: &'static str, got: String },
    /// Not an IP address.
    #[error("invalid IP address {0:?}")]
    IpAddress(String),
    /// Not a Go duration.
    #[error("invalid duration {0:?}")]
    Duration(String),
    /// A negative Go duration (nothing nodelet configures can be negative).
    #[error("invalid duration {0:?}: must not be negative")]
    NegativeDuration(String),
    /// A threshold ending in `%` that is not a percentage.
    #[error("invalid percentage {0:?}")]
    Percentage(String),
    /// A threshold that is not a quantity (`"100Mi"`).
    #[error("invalid quantity {0:?}")]
    Quantity(String),
    /// A taint that cannot be registered.
    #[error("invalid taint {0}")]
    Taint(String),
    /// A node label that cannot be registered.
    #[error("invalid node label {0}")]
    Label(String),
    /// The drop-in directory (`--config-dir`) could not be listed.
    #[error("reading the drop-in directory {path}: {source}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// One file of several is refused: which one, and why (printed, not chained, so that
    /// `{:#}` does not print it twice).
    #[error("{path}: {error}")]
    InFile { path: PathBuf, error: Box<Error> },
}

/// The kubelet's effective configuration: the file's fields plus those the flags set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletConfig {
    /// Directory of static pod manifests; empty: none.
    pub static_pod_path: PathBuf,
    /// URL of static pod manifests; empty: none.
    pub static_pod_url: String,
    pub sync_frequency: Duration,
    pub file_check_frequency: Duration,
    pub http_check_frequency: Duration,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: u32,
    pub max_pods: u32,
    /// Per-pod PID limit; -1: unlimited.
    pub pod_pids_limit: i64,
    pub pod_logs_dir: PathBuf,
    /// CRI endpoint; empty: the built-in runtime.
    pub container_runtime_endpoint: String,
    /// CRI image endpoint; empty: the runtime endpoint.
    pub image_service_endpoint: String,
    /// `cgroupRoot`, `cgroupsPerQOS`, `cgroupDriver`, `enforceNodeAllocatable`, `cpuCFSQuota`.
    pub cgroups: Cgroups,
    /// `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`, `imageMinimumGCAge`,
    /// `imageMaximumGCAge`.
    pub image_gc: ImageGcConfig,
    /// `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
    /// `shutdownGracePeriodByPodPriority`, `nodeletShutdownOnSigterm`.
    pub shutdown: Shutdown,
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub register_node: bool,
    /// `registerWithTaints`, `providerID`, and the flags `--node-labels` and
    /// `--cloud-provider`.
    pub registration: Registration,
    /// `runtimeRequestTimeout`: the deadline of a remote runtime's calls (pulls get more).
    pub runtime_request_timeout: Duration,
    /// `rotateCertificates`: renew the client certificate through a CSR before it expires.
    pub rotate_certificates: bool,
    /// Hard eviction thresholds, signal → value (`"100Mi"`, `"10%"`). A file that sets
    /// `evictionHard` replaces the defaults entirely, as upstream does, unless it sets
    /// `mergeDefaultEvictionSettings`.
    pub eviction_hard: BTreeMap<String, String>,
    /// The other eviction settings.
    pub eviction: Eviction,
    /// `kubeReserved`, `systemReserved`, `reservedSystemCPUs`: kept from the pods.
    pub reserved: Reserved,
    /// `serializeImagePulls`: pull one image at a time. Unset, true unless
    /// `maxParallelImagePulls` is more than 1 (upstream's default).
    pub serialize_image_pulls: bool,
    /// `maxParallelImagePulls`: at most this many pulls at once when they are not serialized;
    /// `None`: no limit. More than 1 requires `serialize_image_pulls` false.
    pub max_parallel_image_pulls: Option<u32>,
    pub testing: TestingConfig,
    /// `--hostname-override`, else the host name, lowercased.
    pub node_name: String,
    /// `--node-ip`: none (found from the host name), one, or one of each family (dual stack,
    /// the first the primary).
    pub node_ips: Vec<IpAddr>,
    /// `--kubeconfig`; `None`: standalone (no API server).
    pub kubeconfig: Option<PathBuf>,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// `--cert-dir`: the self-signed serving certificate (and, with TLS bootstrap, the
    /// client certificates); default `<root-dir>/pki`.
    pub cert_dir: Option<PathBuf>,
    /// `--pod-infra-container-image`: never garbage collected (upstream keeps the flag for
    /// that alone).
    pub pod_infra_container_image: Option<String>,
    /// `podCIDR`: the built-in runtime's pod subnet (upstream: the standalone kubelet's).
    pub pod_cidr: String,
    /// `nodeletPodBridge`: the built-in runtime's bridge.
    pub pod_bridge: String,
    /// `nodeletPodMasquerade`: whether the built-in runtime masquerades pod traffic leaving the
    /// pod CIDR.
    pub pod_masquerade: bool,
    /// `nodeletInsecureRegistries`: registries (`host[:port]`) the built-in runtime pulls from
    /// over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// `nodeletImagePreloadDir`: image archives and reference lists the built-in runtime
    /// imports (and pulls) and pins; unset: `<root-dir>/images-preload`.
    pub image_preload_dir: Option<PathBuf>,
    /// `nodeletRegistriesConfig`: the built-in runtime's registries config file (k3s's
    /// `registries.yaml` shape: mirrors, rewrites, credentials, CAs), read at start.
    pub registries_config: Option<PathBuf>,
    /// `nodeletRegistryHostsDir`: the built-in runtime's registry hosts dir (containerd's
    /// `certs.d/<registry>/hosts.toml` layout), read at start; instead of the file above.
    pub registry_hosts_dir: Option<PathBuf>,
    /// `nodeletCDISpecDirs`: the built-in runtime's CDI spec dirs, later ones taking priority
    /// (default `/etc/cdi`, `/var/run/cdi`).
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `nodeletNetwork`: routes to other nodes' pods, the cluster's pod subnets.
    pub network: network::NetworkSettings,
    /// The kubelet server: HTTPS on `address`:`port`, healthz, authentication, authorization.
    pub server: ServerConfig,
    /// Rotation of the containers' log files.
    pub container_logs: ContainerLogConfig,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            static_pod_path: PathBuf::new(),
            static_pod_url: String::new(),
            sync_frequency: Duration::from_secs(60),
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            max_pods: 110,
            pod_pids_limit: -1,
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_runtime_endpoint: String::new(),
            image_service_endpoint: String::new(),
            cgroups: Cgroups::default(),
            image_gc: ImageGcConfig::default(),
            shutdown: Shutdown::default(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            register_node: true,
            registration: Registration::default(),
            runtime_request_timeout: Duration::from_secs(120),
            rotate_certificates: false,
            eviction_hard: default_eviction_hard(),
            eviction: Eviction::default(),
            reserved: Reserved::default(),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            testing: TestingConfig::default(),
            node_name: host_name(),
            node_ips: Vec::new(),
            kubeconfig: None,
            root_dir: PathBuf::from("/var/lib/nodelet"),
            cert_dir: None,
            pod_infra_container_image: None,
            pod_cidr: "10.88.0.0/16".to_string(),
            pod_bridge: "nodelet0".to_string(),
            pod_masquerade: true,
            insecure_registries: Vec::new(),
            image_preload_dir: None,
            registries_config: None,
            registry_hosts_dir: None,
            cdi_spec_dirs: runtime::builtin::DEFAULT_CDI_SPEC_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            network: Default::default(),
            server: ServerConfig::default(),
            container_logs: ContainerLogConfig::default(),
        }
    }
}

impl KubeletConfig {
    /// `--cert-dir`, else `<root-dir>/pki`.
    pub fn cert_dir(&self) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| self.root_dir.join("pki"))
    }

    /// `nodeletImagePreloadDir`, by default `<root-dir>/images-preload`.
    pub fn image_preload_dir(&self) -> PathBuf {
        self.image_preload_dir
            .clone()
            .unwrap_or_else(|| self.root_dir.join("images-preload"))
    }
}

/// The host's name, lowercased (`localhost` if it cannot be read).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Reads and checks a configuration file (YAML or JSON). Returns the configuration and
/// warnings (unknown fields).
pub fn load(path: &Path) -> Result<(KubeletConfig, Vec<String>), Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| match e {
        Error::Parse { error, .. } => Error::Parse {
            path: path.to_path_buf(),
            error,
        },
        other => other,
    })
}

/// Like [`load`], from the file's text.
pub fn parse(text: &str) -> Result<(KubeletConfig, Vec<String>), Error> {
    from_document(document(text)?)
}

/// A `KubeletConfiguration` document's fields (YAML or JSON), its `apiVersion` and `kind`
/// checked and taken out: one layer for [`layers::load_layers`] to merge.
pub(crate) fn document(text: &str) -> Result<serde_json::Map<String, Value>, Error> {
    // YAML is a superset of JSON, so one parser reads both.
    let value: Value = serde_norway::from_str(text).map_err(|error| Error::Parse {
        path: PathBuf::new(),
        error,
    })?;
    let Value::Object(mut map) = value else {
        return Err(Error::NotAMapping);
    };
    // The type's identity first, so a file of another kind is refused as such and not for
    // its fields.
    match map.remove("apiVersion") {
        None => {
            return Err(invalid(
                "apiVersion",
                "missing, must be ".to_string() + API_VERSION,
            ));
        }
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(v) => return Err(invalid("apiVersion", format!("{v} is not {API_VERSION}"))),
    }
    match map.remove("kind") {
        None => return Err(invalid("kind", format!("missing, must be {KIND}"))),
        Some(Value::String(v)) if v == KIND => {}
        Some(v) => return Err(invalid("kind", format!("{v} is not {KIND}"))),
    }
    Ok(map)
}

/// The configuration a document's fields give: defaults for what is unset, every value
/// checked, unknown fields as warnings.
pub(crate) fn from_document(
    map: serde_json::Map<String, Value>,
) -> Result<(KubeletConfig, Vec<String>), Error> {
    // A value of the wrong type is refused with its path in the file: `clusterDNS[1]: ...`.
    let raw: raw::RawConfig = serde_path_to_error::deserialize(Value::Object(map))
        .map_err(|e| invalid(&e.path().to_string(), e.into_inner()))?;
    raw.into_config()
}

fn unknown(path: &str) -> String {
    format!("unknown field {path:?} ignored")
}

/// The field's value is refused, for `reason`.
fn invalid(field: &str, reason: impl fmt::Display) -> Error {
    Error::Invalid {
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

/// A set field's value.
fn get<T>(field: Option<Typed<T>>) -> Option<T> {
    field.map(|Typed(v)| v)
}

fn positive(k: &str, field: Option<Typed<Duration>>, default: Duration) -> Result<Duration, Error> {
    match get(field) {
        None => Ok(default),
        Some(d) if d.is_zero() => Err(invalid(k, "must be greater than zero")),
        Some(d) => Ok(d),
    }
}

fn at_least_one(k: &str, field: Option<Typed<i64>>, default: u32) -> Result<u32, Error> {
    match get(field) {
        None => Ok(default),
        Some(n) if n < 1 => Err(invalid(k, "must be >= 1")),
        Some(n) => u32::try_from(n).map_err(|_| invalid(k, format!("{n} is too large"))),
    }
}

/// A positive `int32` (upstream's type) as a `u32`.
fn int32(k: &str, n: i64) -> Result<u32, Error> {
    i32::try_from(n)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| invalid(k, format!("{n} is too large")))
}

#[cfg(test)]
mod tests;
