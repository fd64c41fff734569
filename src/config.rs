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
use std::marker::PhantomData;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

mod export;
mod logs;
mod server;
pub use logs::{ContainerLogConfig, parse_bytes};
pub use server::{AuthzMode, ServerConfig};

/// The only accepted `apiVersion`.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only accepted `kind`.
pub const KIND: &str = "KubeletConfiguration";

/// Why a configuration file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A field is missing or has an invalid value; the message starts with the field's name.
    #[error("{0}")]
    Invalid(String),
}

/// Test-only knobs (`nodeletTesting`), so end-to-end tests need not wait minutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestingConfig {
    /// First back-off after a container crash (`crashLoopBackOffInitial`, default 10s).
    pub crash_loop_back_off_initial: Duration,
    /// Back-off ceiling (`crashLoopBackOffMax`, default 5m).
    pub crash_loop_back_off_max: Duration,
}

impl Default for TestingConfig {
    fn default() -> Self {
        TestingConfig {
            crash_loop_back_off_initial: Duration::from_secs(10),
            crash_loop_back_off_max: Duration::from_secs(300),
        }
    }
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
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub register_node: bool,
    /// Hard eviction thresholds, signal → value (`"100Mi"`, `"10%"`). A file that sets
    /// `evictionHard` replaces the defaults entirely, as upstream does.
    pub eviction_hard: BTreeMap<String, String>,
    /// `serializeImagePulls`: pull one image at a time. Unset, true unless
    /// `maxParallelImagePulls` is more than 1 (upstream's default).
    pub serialize_image_pulls: bool,
    /// `maxParallelImagePulls`: at most this many pulls at once when they are not serialized;
    /// `None`: no limit. More than 1 requires `serialize_image_pulls` false.
    pub max_parallel_image_pulls: Option<u32>,
    pub testing: TestingConfig,
    /// `--hostname-override`, else the host name, lowercased.
    pub node_name: String,
    /// `--node-ip`.
    pub node_ip: Option<IpAddr>,
    /// `--kubeconfig`; `None`: standalone (no API server).
    pub kubeconfig: Option<PathBuf>,
    /// `--root-dir`.
    pub root_dir: PathBuf,
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
            cgroup_root: "/".to_string(),
            cgroups_per_qos: true,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            register_node: true,
            eviction_hard: default_eviction_hard(),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            testing: TestingConfig::default(),
            node_name: host_name(),
            node_ip: None,
            kubeconfig: None,
            root_dir: PathBuf::from("/var/lib/nodelet"),
            pod_cidr: "10.88.0.0/16".to_string(),
            pod_bridge: "nodelet0".to_string(),
            pod_masquerade: true,
            insecure_registries: Vec::new(),
            server: ServerConfig::default(),
            container_logs: ContainerLogConfig::default(),
        }
    }
}

/// The upstream kubelet's default hard eviction thresholds.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("imagefs.available", "15%"),
        ("nodefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

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
pub fn load(path: &Path) -> Result<(KubeletConfig, Vec<String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| match e {
        ConfigError::Parse { message, .. } => ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        },
        other => other,
    })
}

/// Like [`load`], from the file's text.
pub fn parse(text: &str) -> Result<(KubeletConfig, Vec<String>), ConfigError> {
    // YAML is a superset of JSON, so one parser reads both.
    let value: Value = serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
        path: PathBuf::new(),
        message: e.to_string(),
    })?;
    let Value::Object(mut map) = value else {
        return Err(ConfigError::Invalid(
            "the configuration must be a mapping".to_string(),
        ));
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
    // A value of the wrong type is refused with its path in the file: `clusterDNS[1]: ...`.
    let raw: RawConfig = serde_path_to_error::deserialize(Value::Object(map))
        .map_err(|e| invalid(&e.path().to_string(), e.into_inner().to_string()))?;
    raw.into_config()
}

/// The file as written: the `KubeletConfiguration` (v1beta1) fields nodelet reads, by their
/// names there, `None` when unset (or `null`). Anything else lands in `other`, to be warned
/// about. [`RawConfig::into_config`] applies the defaults and checks the values.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    static_pod_path: Option<Typed<String>>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<Typed<String>>,
    sync_frequency: Option<Typed<Duration>>,
    file_check_frequency: Option<Typed<Duration>>,
    http_check_frequency: Option<Typed<Duration>>,
    node_status_update_frequency: Option<Typed<Duration>>,
    node_status_report_frequency: Option<Typed<Duration>>,
    node_lease_duration_seconds: Option<Typed<i64>>,
    max_pods: Option<Typed<i64>>,
    pod_pids_limit: Option<Typed<i64>>,
    pod_logs_dir: Option<Typed<String>>,
    container_runtime_endpoint: Option<Typed<String>>,
    image_service_endpoint: Option<Typed<String>>,
    cgroup_root: Option<Typed<String>>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<Typed<bool>>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<IpList>,
    cluster_domain: Option<Typed<String>>,
    register_node: Option<Typed<bool>>,
    eviction_hard: Option<Thresholds>,
    serialize_image_pulls: Option<Typed<bool>>,
    max_parallel_image_pulls: Option<Typed<i64>>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<Typed<String>>,
    nodelet_pod_bridge: Option<Typed<String>>,
    nodelet_pod_masquerade: Option<Typed<bool>>,
    nodelet_insecure_registries: Option<Typed<Vec<String>>>,
    nodelet_testing: Option<Testing>,
    /// The server's fields (taken before `other` sees the rest).
    #[serde(flatten)]
    server: server::RawServer,
    /// The container log rotation fields.
    #[serde(flatten)]
    container_logs: logs::RawContainerLogs,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// `nodeletTesting` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTesting {
    crash_loop_back_off_initial: Option<Typed<Duration>>,
    crash_loop_back_off_max: Option<Typed<Duration>>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

impl RawConfig {
    /// The effective configuration: upstream's defaults for what is unset, every value
    /// checked. Returns the warnings too (unknown fields, in the order of their paths).
    fn into_config(self) -> Result<(KubeletConfig, Vec<String>), ConfigError> {
        let d = KubeletConfig::default();
        let mut warnings: Vec<String> = self.other.keys().map(|k| unknown(k)).collect();

        let testing = match self.nodelet_testing {
            None => d.testing,
            Some(Testing(t)) => {
                warnings.extend(
                    t.other
                        .keys()
                        .map(|k| unknown(&format!("nodeletTesting.{k}"))),
                );
                t.into_config()?
            }
        };
        let server = self.server.into_config(&mut warnings)?;
        let container_logs = self.container_logs.into_config()?;
        warnings.sort();

        let pod_pids_limit = match get(self.pod_pids_limit) {
            None => d.pod_pids_limit,
            Some(n) if n == -1 || n >= 1 => n,
            Some(_) => {
                return Err(invalid(
                    "podPidsLimit",
                    "must be -1 (unlimited) or >= 1".to_string(),
                ));
            }
        };
        let pod_logs_dir = match get(self.pod_logs_dir) {
            None => d.pod_logs_dir,
            Some(s) if s.starts_with('/') => PathBuf::from(s),
            Some(s) => {
                return Err(invalid(
                    "podLogsDir",
                    format!("{s:?} is not an absolute path"),
                ));
            }
        };
        let eviction_hard = match self.eviction_hard {
            None => d.eviction_hard,
            Some(Thresholds(map)) => {
                for (signal, threshold) in &map {
                    let field = format!("evictionHard.{signal}");
                    if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                        return Err(invalid(&field, "unknown eviction signal".to_string()));
                    }
                    check_threshold(threshold).map_err(|e| invalid(&field, e))?;
                }
                map
            }
        };
        let pod_cidr = match get(self.pod_cidr) {
            None => d.pod_cidr,
            Some(c) => {
                sandbox_subnet_check(&c).map_err(|e| invalid("podCIDR", e))?;
                c
            }
        };

        // Upstream: unset, serializeImagePulls is true unless maxParallelImagePulls asks for
        // more than one pull at a time; set true, it cannot.
        let max_parallel_image_pulls = match get(self.max_parallel_image_pulls) {
            None => None,
            Some(n) if n < 1 => {
                return Err(invalid(
                    "maxParallelImagePulls",
                    format!("{n} must be a positive number"),
                ));
            }
            Some(n) => Some(int32("maxParallelImagePulls", n)?),
        };
        let many_pulls = max_parallel_image_pulls.is_some_and(|n| n > 1);
        let serialize_image_pulls = get(self.serialize_image_pulls).unwrap_or(!many_pulls);
        if serialize_image_pulls && many_pulls {
            return Err(invalid(
                "maxParallelImagePulls",
                "cannot be larger than 1 unless serializeImagePulls is false".to_string(),
            ));
        }

        let cfg = KubeletConfig {
            static_pod_path: get(self.static_pod_path).map_or(d.static_pod_path, PathBuf::from),
            static_pod_url: get(self.static_pod_url).unwrap_or(d.static_pod_url),
            sync_frequency: positive("syncFrequency", self.sync_frequency, d.sync_frequency)?,
            file_check_frequency: positive(
                "fileCheckFrequency",
                self.file_check_frequency,
                d.file_check_frequency,
            )?,
            http_check_frequency: positive(
                "httpCheckFrequency",
                self.http_check_frequency,
                d.http_check_frequency,
            )?,
            node_status_update_frequency: positive(
                "nodeStatusUpdateFrequency",
                self.node_status_update_frequency,
                d.node_status_update_frequency,
            )?,
            node_status_report_frequency: positive(
                "nodeStatusReportFrequency",
                self.node_status_report_frequency,
                d.node_status_report_frequency,
            )?,
            node_lease_duration_seconds: at_least_one(
                "nodeLeaseDurationSeconds",
                self.node_lease_duration_seconds,
                d.node_lease_duration_seconds,
            )?,
            max_pods: at_least_one("maxPods", self.max_pods, d.max_pods)?,
            pod_pids_limit,
            pod_logs_dir,
            container_runtime_endpoint: get(self.container_runtime_endpoint)
                .unwrap_or(d.container_runtime_endpoint),
            image_service_endpoint: get(self.image_service_endpoint)
                .unwrap_or(d.image_service_endpoint),
            cgroup_root: get(self.cgroup_root).unwrap_or(d.cgroup_root),
            cgroups_per_qos: get(self.cgroups_per_qos).unwrap_or(d.cgroups_per_qos),
            cluster_dns: self.cluster_dns.map_or(d.cluster_dns, |IpList(ips)| ips),
            cluster_domain: get(self.cluster_domain).unwrap_or(d.cluster_domain),
            register_node: get(self.register_node).unwrap_or(d.register_node),
            eviction_hard,
            serialize_image_pulls,
            max_parallel_image_pulls,
            testing,
            server,
            container_logs,
            pod_cidr,
            pod_bridge: get(self.nodelet_pod_bridge).unwrap_or(d.pod_bridge),
            pod_masquerade: get(self.nodelet_pod_masquerade).unwrap_or(d.pod_masquerade),
            insecure_registries: get(self.nodelet_insecure_registries)
                .unwrap_or(d.insecure_registries),
            // Set from flags.
            node_name: d.node_name,
            node_ip: d.node_ip,
            kubeconfig: d.kubeconfig,
            root_dir: d.root_dir,
        };
        Ok((cfg, warnings))
    }
}

impl RawTesting {
    fn into_config(self) -> Result<TestingConfig, ConfigError> {
        let d = TestingConfig::default();
        let t = TestingConfig {
            crash_loop_back_off_initial: positive(
                "nodeletTesting.crashLoopBackOffInitial",
                self.crash_loop_back_off_initial,
                d.crash_loop_back_off_initial,
            )?,
            crash_loop_back_off_max: positive(
                "nodeletTesting.crashLoopBackOffMax",
                self.crash_loop_back_off_max,
                d.crash_loop_back_off_max,
            )?,
        };
        if t.crash_loop_back_off_max < t.crash_loop_back_off_initial {
            return Err(invalid(
                "nodeletTesting.crashLoopBackOffMax",
                "must be >= crashLoopBackOffInitial".to_string(),
            ));
        }
        Ok(t)
    }
}

fn unknown(path: &str) -> String {
    format!("unknown field {path:?} ignored")
}

fn invalid(field: &str, what: String) -> ConfigError {
    ConfigError::Invalid(format!("{field}: {what}"))
}

/// A set field's value.
fn get<T>(field: Option<Typed<T>>) -> Option<T> {
    field.map(|Typed(v)| v)
}

fn positive(
    k: &str,
    field: Option<Typed<Duration>>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match get(field) {
        None => Ok(default),
        Some(d) if d.is_zero() => Err(invalid(k, "must be greater than zero".to_string())),
        Some(d) => Ok(d),
    }
}

fn at_least_one(k: &str, field: Option<Typed<i64>>, default: u32) -> Result<u32, ConfigError> {
    match get(field) {
        None => Ok(default),
        Some(n) if n < 1 => Err(invalid(k, "must be >= 1".to_string())),
        Some(n) => u32::try_from(n).map_err(|_| invalid(k, format!("{n} is too large"))),
    }
}

/// A positive `int32` (upstream's type) as a `u32`.
fn int32(k: &str, n: i64) -> Result<u32, ConfigError> {
    i32::try_from(n)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| invalid(k, format!("{n} is too large")))
}

/// A pod CIDR the built-in runtime can use (one IPv4 subnet).
fn sandbox_subnet_check(cidr: &str) -> Result<(), String> {
    runtime::builtin::parse_pod_cidr(cidr)
        .map(drop)
        .map_err(|e| e.message().to_string())
}

/// A scalar field's value: read as whatever the file holds, then checked, so a value of the
/// wrong type is refused in the file's terms (`must be an integer, not "many"`) rather than
/// serde's; [`parse`] puts the field's path in front.
struct Typed<T>(T);

/// How a scalar is read from the file's value.
trait FromValue: Sized {
    fn from_value(v: Value) -> Result<Self, String>;
}

impl<'de, T: FromValue> Deserialize<'de> for Typed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::from_value(Value::deserialize(d)?)
            .map(Typed)
            .map_err(de::Error::custom)
    }
}

impl FromValue for String {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(s),
            // A list item or mapping value written as `null` (a field is then unset).
            Value::Null => Ok(String::new()),
            other => Err(format!("must be a string, not {other}")),
        }
    }
}

/// A list of non-empty strings.
impl FromValue for Vec<String> {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Value::String(s) if !s.is_empty() => Ok(s),
                    other => Err(format!("must be a list of non-empty strings, not {other}")),
                })
                .collect(),
            other => Err(format!("must be a list of strings, not {other}")),
        }
    }
}

impl FromValue for bool {
    fn from_value(v: Value) -> Result<Self, String> {
        v.as_bool()
            .ok_or_else(|| format!("must be true or false, not {v}"))
    }
}

impl FromValue for i64 {
    fn from_value(v: Value) -> Result<Self, String> {
        v.as_i64()
            .ok_or_else(|| format!("must be an integer, not {v}"))
    }
}

/// A Go duration string (`"1m30s"`).
impl FromValue for Duration {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => parse_duration(&s),
            other => Err(format!(
                "must be a duration string like \"10s\", not {other}"
            )),
        }
    }
}

impl FromValue for IpAddr {
    fn from_value(v: Value) -> Result<Self, String> {
        let s = String::from_value(v)?;
        s.parse().map_err(|_| format!("invalid IP address {s:?}"))
    }
}

/// `clusterDNS`.
struct IpList(Vec<IpAddr>);

impl<'de> Deserialize<'de> for IpList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ips: Vec<Typed<IpAddr>> = d.deserialize_any(Shaped::list("a list of IP addresses"))?;
        Ok(IpList(ips.into_iter().map(|Typed(ip)| ip).collect()))
    }
}

/// `evictionHard`: signal → threshold, checked by [`RawConfig::into_config`].
struct Thresholds(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Thresholds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map: BTreeMap<String, Typed<String>> =
            d.deserialize_any(Shaped::mapping("a mapping of signal to threshold"))?;
        Ok(Thresholds(
            map.into_iter().map(|(k, Typed(v))| (k, v)).collect(),
        ))
    }
}

/// `nodeletTesting`.
struct Testing(RawTesting);

impl<'de> Deserialize<'de> for Testing {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Shaped::mapping("a mapping")).map(Testing)
    }
}

/// Reads a `T` written as a list (or as a mapping), through the file's own sequence (or map)
/// so that errors inside keep their path (`clusterDNS[1]`, `nodeletTesting.crashLoopBackOffMax`);
/// refuses anything else as `must be {what}, not ...`.
struct Shaped<T> {
    what: &'static str,
    list: bool,
    t: PhantomData<T>,
}

impl<T> Shaped<T> {
    fn list(what: &'static str) -> Self {
        Shaped {
            what,
            list: true,
            t: PhantomData,
        }
    }

    fn mapping(what: &'static str) -> Self {
        Shaped {
            what,
            list: false,
            t: PhantomData,
        }
    }

    fn refuse<E: de::Error>(&self, got: impl fmt::Display) -> E {
        E::custom(format!("must be {}, not {got}", self.what))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Shaped<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        if self.list {
            T::deserialize(SeqAccessDeserializer::new(seq))
        } else {
            Err(self.refuse("a list"))
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        if self.list {
            Err(self.refuse("a mapping"))
        } else {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Err(self.refuse(Value::Null))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        Err(self.refuse(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Err(self.refuse(Value::from(v)))
    }
}

/// A threshold is a percentage (`"10%"`) or a quantity (`"100Mi"`, `"1G"`, `"500"`).
fn check_threshold(s: &str) -> Result<(), String> {
    if let Some(p) = s.strip_suffix('%') {
        return match p.parse::<f64>() {
            Ok(x) if (0.0..=100.0).contains(&x) => Ok(()),
            _ => Err(format!("invalid percentage {s:?}")),
        };
    }
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let ok_suffix = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "k" | "M" | "G" | "T" | "P" | "E" | "m"
    );
    if !digits.is_empty() && ok_suffix && digits.parse::<f64>().is_ok_and(|x| x >= 0.0) {
        Ok(())
    } else {
        Err(format!("invalid quantity {s:?}"))
    }
}

/// Parses a Go duration (`"1m30s"`, `"500ms"`, `"2h"`, `"1.5s"`, `"0"`). Units: ns, us, µs,
/// ms, s, m, h. Negative durations are rejected (nothing nodelet configures can be negative).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?}");
    if let Some(abs) = s.strip_prefix('-') {
        return match parse_duration(abs) {
            Ok(d) if d.is_zero() => Ok(d),
            Ok(_) => Err(format!("invalid duration {s:?}: must not be negative")),
            Err(_) => Err(err()),
        };
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: u128 = 0; // nanoseconds
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(err());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err()),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err())?
        };
        let mut nanos = int.checked_mul(scale).ok_or_else(err)?;
        // Fractional part: at most 9 + 13 digits matter; truncate like Go does.
        let mut place = scale;
        for c in frac.chars().take(24) {
            place /= 10;
            let digit = u128::from(c.to_digit(10).ok_or_else(err)?);
            nanos = nanos.checked_add(digit * place).ok_or_else(err)?;
        }
        total = total.checked_add(nanos).ok_or_else(err)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| err())?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| err())?;
    Ok(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests;
