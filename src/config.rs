//! The kubelet configuration file: a `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration`
//! in YAML or JSON, reduced to the fields nodelet supports, with the upstream kubelet's
//! defaults. Unknown fields are collected as warnings (a config written for the upstream
//! kubelet still loads); invalid values are errors naming the field. Settings that come from
//! flags (node name, node IP, kubeconfig, root dir) are plain fields the CLI sets afterwards.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

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
            testing: TestingConfig::default(),
            node_name: host_name(),
            node_ip: None,
            kubeconfig: None,
            root_dir: PathBuf::from("/var/lib/nodelet"),
            pod_cidr: "10.88.0.0/16".to_string(),
            pod_bridge: "nodelet0".to_string(),
            pod_masquerade: true,
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
    let Value::Object(map) = value else {
        return Err(ConfigError::Invalid(
            "the configuration must be a mapping".to_string(),
        ));
    };
    let mut cfg = KubeletConfig::default();
    let mut warnings = Vec::new();
    match map.get("apiVersion") {
        None => {
            return Err(invalid(
                "apiVersion",
                "missing, must be ".to_string() + API_VERSION,
            ));
        }
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(v) => return Err(invalid("apiVersion", format!("{v} is not {API_VERSION}"))),
    }
    match map.get("kind") {
        None => return Err(invalid("kind", format!("missing, must be {KIND}"))),
        Some(Value::String(v)) if v == KIND => {}
        Some(v) => return Err(invalid("kind", format!("{v} is not {KIND}"))),
    }
    for (key, v) in &map {
        let k = key.as_str();
        match k {
            "apiVersion" | "kind" => {}
            "staticPodPath" => cfg.static_pod_path = PathBuf::from(string(k, v)?),
            "staticPodURL" => cfg.static_pod_url = string(k, v)?,
            "syncFrequency" => cfg.sync_frequency = positive_duration(k, v)?,
            "fileCheckFrequency" => cfg.file_check_frequency = positive_duration(k, v)?,
            "httpCheckFrequency" => cfg.http_check_frequency = positive_duration(k, v)?,
            "nodeStatusUpdateFrequency" => {
                cfg.node_status_update_frequency = positive_duration(k, v)?
            }
            "nodeStatusReportFrequency" => {
                cfg.node_status_report_frequency = positive_duration(k, v)?
            }
            "nodeLeaseDurationSeconds" => {
                cfg.node_lease_duration_seconds = int_at_least(k, v, 1)?;
            }
            "maxPods" => cfg.max_pods = int_at_least(k, v, 1)?,
            "podPidsLimit" => {
                let n = integer(k, v)?;
                if n != -1 && n < 1 {
                    return Err(invalid(k, "must be -1 (unlimited) or >= 1".to_string()));
                }
                cfg.pod_pids_limit = n;
            }
            "podLogsDir" => {
                let s = string(k, v)?;
                if !s.starts_with('/') {
                    return Err(invalid(k, format!("{s:?} is not an absolute path")));
                }
                cfg.pod_logs_dir = PathBuf::from(s);
            }
            "containerRuntimeEndpoint" => cfg.container_runtime_endpoint = string(k, v)?,
            "imageServiceEndpoint" => cfg.image_service_endpoint = string(k, v)?,
            "cgroupRoot" => cfg.cgroup_root = string(k, v)?,
            "cgroupsPerQOS" => cfg.cgroups_per_qos = boolean(k, v)?,
            "clusterDNS" => cfg.cluster_dns = ip_list(k, v)?,
            "clusterDomain" => cfg.cluster_domain = string(k, v)?,
            "registerNode" => cfg.register_node = boolean(k, v)?,
            "evictionHard" => cfg.eviction_hard = eviction(k, v)?,
            "nodeletTesting" => cfg.testing = testing(v, &mut warnings)?,
            "podCIDR" => {
                let c = string(k, v)?;
                sandbox_subnet_check(&c).map_err(|e| invalid(k, e))?;
                cfg.pod_cidr = c;
            }
            "nodeletPodBridge" => cfg.pod_bridge = string(k, v)?,
            "nodeletPodMasquerade" => cfg.pod_masquerade = boolean(k, v)?,
            _ => warnings.push(format!("unknown field {k:?} ignored")),
        }
    }
    Ok((cfg, warnings))
}

fn testing(v: &Value, warnings: &mut Vec<String>) -> Result<TestingConfig, ConfigError> {
    let Value::Object(map) = v else {
        return Err(invalid("nodeletTesting", "must be a mapping".to_string()));
    };
    let mut t = TestingConfig::default();
    for (key, v) in map {
        let k = format!("nodeletTesting.{key}");
        match key.as_str() {
            "crashLoopBackOffInitial" => t.crash_loop_back_off_initial = positive_duration(&k, v)?,
            "crashLoopBackOffMax" => t.crash_loop_back_off_max = positive_duration(&k, v)?,
            _ => warnings.push(format!("unknown field {k:?} ignored")),
        }
    }
    if t.crash_loop_back_off_max < t.crash_loop_back_off_initial {
        return Err(invalid(
            "nodeletTesting.crashLoopBackOffMax",
            "must be >= crashLoopBackOffInitial".to_string(),
        ));
    }
    Ok(t)
}

/// A pod CIDR the built-in runtime can use (one IPv4 subnet).
fn sandbox_subnet_check(cidr: &str) -> Result<(), String> {
    runtime::builtin::parse_pod_cidr(cidr)
        .map(drop)
        .map_err(|e| e.message().to_string())
}

fn invalid(field: &str, what: String) -> ConfigError {
    ConfigError::Invalid(format!("{field}: {what}"))
}

fn string(k: &str, v: &Value) -> Result<String, ConfigError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        other => Err(invalid(k, format!("must be a string, not {other}"))),
    }
}

fn boolean(k: &str, v: &Value) -> Result<bool, ConfigError> {
    v.as_bool()
        .ok_or_else(|| invalid(k, format!("must be true or false, not {v}")))
}

fn integer(k: &str, v: &Value) -> Result<i64, ConfigError> {
    v.as_i64()
        .ok_or_else(|| invalid(k, format!("must be an integer, not {v}")))
}

fn int_at_least(k: &str, v: &Value, min: i64) -> Result<u32, ConfigError> {
    let n = integer(k, v)?;
    if n < min {
        return Err(invalid(k, format!("must be >= {min}")));
    }
    u32::try_from(n).map_err(|_| invalid(k, format!("{n} is too large")))
}

fn positive_duration(k: &str, v: &Value) -> Result<Duration, ConfigError> {
    let Value::String(s) = v else {
        return Err(invalid(
            k,
            format!("must be a duration string like \"10s\", not {v}"),
        ));
    };
    let d = parse_duration(s).map_err(|e| invalid(k, e))?;
    if d.is_zero() {
        return Err(invalid(k, "must be greater than zero".to_string()));
    }
    Ok(d)
}

fn ip_list(k: &str, v: &Value) -> Result<Vec<IpAddr>, ConfigError> {
    let Value::Array(items) = v else {
        return Err(invalid(k, "must be a list of IP addresses".to_string()));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let s = string(&format!("{k}[{i}]"), item)?;
            s.parse()
                .map_err(|_| invalid(&format!("{k}[{i}]"), format!("invalid IP address {s:?}")))
        })
        .collect()
}

fn eviction(k: &str, v: &Value) -> Result<BTreeMap<String, String>, ConfigError> {
    let Value::Object(map) = v else {
        return Err(invalid(
            k,
            "must be a mapping of signal to threshold".to_string(),
        ));
    };
    let mut out = BTreeMap::new();
    for (signal, value) in map {
        let field = format!("{k}.{signal}");
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            return Err(invalid(&field, "unknown eviction signal".to_string()));
        }
        let s = string(&field, value)?;
        check_threshold(&s).map_err(|e| invalid(&field, e))?;
        out.insert(signal.clone(), s);
    }
    Ok(out)
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
            nanos += digit * place;
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
