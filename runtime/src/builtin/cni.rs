//! The built-in runtime in CNI mode: pods join whatever network the node's CNI config
//! describes (the first config in the conf dir, `runtime_cni::load`), through the plugins in
//! the bin dirs, instead of the runtime's own bridge.
//!
//! A sandbox process makes the pod's network namespace (with loopback up) and nothing else in
//! it; the runtime then pins that namespace (a bind mount under the state dir, so that it
//! outlives the process until the DEL) and runs the ADD with the pod's names in `CNI_ARGS` and
//! the capabilities (`portMappings`, `bandwidth`, `dns`, `cgroupPath`) from the sandbox config.
//! StopPodSandbox runs the DEL once the process is gone; a sandbox found dead does too. At
//! start, alone on the root dir, the runtime GCs the network with its live sandboxes as the
//! valid attachments: what a killed agent left half made (an ADD cut short leaves its cache
//! entry) is deleted.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::{Error, Result, cri};

/// The pod's interface, as the kubelet and containerd name it.
pub const POD_IFNAME: &str = "eth0";

/// Where the CNI configs, plugins and cache are.
#[derive(Debug, Clone)]
pub struct CniConfig {
    /// The configs: the first `.conf`, `.conflist` or `.json` by name is the pod network.
    pub conf_dir: PathBuf,
    /// Where the plugins are looked for, in order.
    pub bin_dirs: Vec<PathBuf>,
    /// libcni's cache (`results/` under it).
    pub cache_dir: PathBuf,
    /// The deadline of each plugin call.
    pub timeout: Duration,
}

impl Default for CniConfig {
    fn default() -> Self {
        CniConfig {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin")],
            cache_dir: PathBuf::from("/var/lib/cni"),
            timeout: Duration::from_secs(60),
        }
    }
}

/// The message of the runtime's NetworkReady condition until a config loads: upstream's.
pub const NOT_INITIALIZED: &str = "cni plugin not initialized";

/// A CNI network: the plugins' caller, the config last loaded, and where namespaces are pinned.
pub(super) struct PodCni {
    pub cfg: CniConfig,
    cni: runtime_cni::Cni,
    loaded: std::sync::Mutex<Loaded>,
    netns_dir: PathBuf,
}

/// The config as last read, and what it was read from.
#[derive(Default)]
struct Loaded {
    fingerprint: Vec<(PathBuf, std::time::SystemTime, u64)>,
    network: Option<runtime_cni::NetworkList>,
    skipped: Vec<(PathBuf, String)>,
    read_once: bool,
}

/// The conf dir's config files with their modification times and sizes: a change in any of
/// them (or a file coming or going) makes the config be read again.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime, u64)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let ext = path.extension()?.to_str()?;
            if !matches!(ext, "conf" | "conflist" | "json") {
                return None;
            }
            let meta = std::fs::metadata(&path).ok()?;
            Some((path, meta.modified().ok()?, meta.len()))
        })
        .collect();
    out.sort();
    out
}

impl PodCni {
    pub fn new(cfg: CniConfig, state_dir: &Path) -> Self {
        let cni = runtime_cni::Cni::new(runtime_cni::Settings {
            conf_dir: cfg.conf_dir.clone(),
            bin_dirs: cfg.bin_dirs.clone(),
            cache_dir: cfg.cache_dir.clone(),
            timeout: cfg.timeout,
        });
        PodCni {
            cfg,
            cni,
            loaded: Default::default(),
            netns_dir: state_dir.join("netns"),
        }
    }

    /// The pod network: the conf dir's first valid config, read again when the dir changed.
    /// The error says why there is none (upstream's "cni plugin not initialized", with the
    /// files that were refused and why).
    pub fn network(&self) -> Result<runtime_cni::NetworkList> {
        let now = fingerprint(&self.cfg.conf_dir);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if !loaded.read_once || loaded.fingerprint != now {
            match runtime_cni::load(&self.cfg.conf_dir) {
                Ok(l) => {
                    for (path, why) in &l.skipped {
                        tracing::warn!("CNI config {} is not used: {why}", path.display());
                    }
                    if let Some(n) = &l.network {
                        let changed = loaded.network.as_ref().map(|o| (&o.name, &o.source))
                            != Some((&n.name, &n.source));
                        if changed || !loaded.read_once {
                            tracing::info!(
                                "CNI network {:?} (version {}) from {}",
                                n.name,
                                n.cni_version,
                                n.source.display()
                            );
                        }
                    }
                    loaded.network = l.network;
                    loaded.skipped = l.skipped;
                }
                Err(e) => {
                    loaded.network = None;
                    loaded.skipped = vec![(self.cfg.conf_dir.clone(), e.to_string())];
                }
            }
            loaded.fingerprint = now;
            loaded.read_once = true;
        }
        match &loaded.network {
            Some(n) => Ok(n.clone()),
            None => {
                let mut why = format!(
                    "{NOT_INITIALIZED}: no network config in {}",
                    self.cfg.conf_dir.display()
                );
                for (path, reason) in &loaded.skipped {
                    why.push_str(&format!("; {}: {reason}", path.display()));
                }
                Err(Error::failed_precondition(why))
            }
        }
    }

    /// Whether pods can be networked: a config loaded and its plugins' STATUS answered (CNI
    /// 1.1 configs; older ones have no STATUS). The error is NetworkReady's message.
    pub async fn ready(&self) -> std::result::Result<(), String> {
        let net = self.network().map_err(|e| {
            if e.message().starts_with(NOT_INITIALIZED) {
                NOT_INITIALIZED.to_string()
            } else {
                e.message().to_string()
            }
        })?;
        Box::pin(self.cni.status(&net))
            .await
            .map_err(|e| e.to_string())
    }

    /// The pinned network namespace of sandbox `id`.
    pub fn netns_path(&self, id: &str) -> PathBuf {
        self.netns_dir.join(id)
    }

    /// Pins the network namespace of process `pid` as sandbox `id`'s: a bind mount that keeps
    /// it until [`Self::unpin`], whatever becomes of the process.
    pub fn pin(&self, id: &str, pid: i32) -> Result<PathBuf> {
        use nix::mount::{MsFlags, mount};
        let path = self.netns_path(id);
        std::fs::create_dir_all(&self.netns_dir)
            .map_err(|e| Error::internal(format!("creating {}: {e}", self.netns_dir.display())))?;
        std::fs::File::create(&path)
            .map_err(|e| Error::internal(format!("creating {}: {e}", path.display())))?;
        let source = format!("/proc/{pid}/ns/net");
        if let Err(e) = mount(
            Some(source.as_str()),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            let _ = std::fs::remove_file(&path);
            return Err(Error::internal(format!(
                "pinning the pod's network namespace {source} at {}: {e}",
                path.display()
            )));
        }
        Ok(path)
    }

    /// Lets sandbox `id`'s network namespace go (nothing to do when it is not pinned).
    pub fn unpin(&self, id: &str) {
        let path = self.netns_path(id);
        match nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => tracing::warn!(sandbox = %id, "unpinning {}: {e}", path.display()),
        }
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(sandbox = %id, "removing {}: {e}", path.display());
            }
        }
    }

    /// The sandboxes whose namespaces are pinned.
    pub fn pinned(&self) -> Vec<String> {
        std::fs::read_dir(&self.netns_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }

    /// ADD for sandbox `id` (its config `config`, its pod cgroup `cgroup_parent`) in the
    /// namespace pinned at `netns`; the pod's addresses, IPv4 first. A failed ADD has been
    /// DELeted whole by the time this returns.
    pub async fn add(
        &self,
        net: &runtime_cni::NetworkList,
        id: &str,
        netns: &Path,
        config: &cri::PodSandboxConfig,
        cgroup_parent: &str,
    ) -> Result<Vec<IpAddr>> {
        let att = attachment(id, netns, config, cgroup_parent)?;
        // Boxed, as the DEL below: the plugin calls' futures are large, and the callers'
        // (adoption at start among them) would carry them inline.
        let result = Box::pin(self.cni.add(net, &att)).await.map_err(|e| {
            Error::unknown(format!(
                "failed to setup network for sandbox {id:?}: network {:?}: {e}",
                net.name
            ))
        })?;
        let mut ips: Vec<IpAddr> = result.ips.iter().map(|i| i.address.0).collect();
        // The pod's IP is IPv4 when it has one, as containerd picks it.
        ips.sort_by_key(|ip| ip.is_ipv6());
        if ips.is_empty() {
            tracing::warn!(sandbox = %id, "the CNI network {:?} gave the pod no address", net.name);
        }
        Ok(ips)
    }

    /// DEL for sandbox `id`, attached to `network`: with the config its ADD used (its cache
    /// entry's), else the current one.
    pub async fn del(
        &self,
        id: &str,
        network: &str,
        config: &cri::PodSandboxConfig,
        cgroup_parent: &str,
    ) -> Result<()> {
        let netns = self.netns_path(id);
        let att = attachment(id, &netns, config, cgroup_parent)?;
        let cached = self
            .cni
            .cached_entry(network, id, POD_IFNAME)
            .and_then(|c| c.network().ok());
        let net = match cached {
            Some(n) => n,
            None => self.network()?,
        };
        Box::pin(self.cni.del(&net, &att)).await.map_err(|e| {
            Error::unknown(format!(
                "failed to teardown network of sandbox {id:?}: network {:?}: {e}",
                net.name
            ))
        })
    }

    /// GC with `valid` (the live sandboxes) as the valid attachments, then unpins the
    /// namespaces of every other sandbox.
    pub async fn gc(&self, valid: &[String]) {
        let net = match self.network() {
            Ok(n) => n,
            Err(e) => {
                tracing::info!("no CNI garbage collection: {}", e.message());
                return;
            }
        };
        let pairs: Vec<(String, String)> = valid
            .iter()
            .map(|id| (id.clone(), POD_IFNAME.to_string()))
            .collect();
        match Box::pin(self.cni.gc(&net, &pairs)).await {
            Ok(report) => {
                for (container, ifname) in &report.deleted {
                    tracing::info!(sandbox = %container, "CNI GC: deleted the attachment {ifname} no live sandbox has");
                }
                for e in &report.errors {
                    tracing::warn!("CNI GC: {e}");
                }
            }
            Err(e) => tracing::warn!("CNI GC of network {:?}: {e}", net.name),
        }
        for id in self.pinned() {
            if !valid.contains(&id) {
                self.unpin(&id);
            }
        }
    }
}

/// Sets `sysctls` (all `net.*`, `.` or `/` separated) in the network namespace pinned at
/// `netns`, from a thread that joins it (network sysctls are those of the writer's
/// namespace), as the sandbox process sets the others.
pub(super) fn set_net_sysctls(
    netns: &Path,
    sysctls: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let (netns, sysctls) = (netns.to_path_buf(), sysctls.clone());
    std::thread::spawn(move || -> Result<()> {
        let ns = std::fs::File::open(&netns)
            .map_err(|e| Error::internal(format!("opening {}: {e}", netns.display())))?;
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::internal(format!("joining the pod's network namespace: {e}")))?;
        sandbox::process::set_sysctls(&sysctls).map_err(super::sandbox_error)
    })
    .join()
    .map_err(|_| Error::internal("setting the pod's sysctls: the thread panicked"))?
}

/// What identifies sandbox `id`'s attachment, with the capabilities its config asks for.
fn attachment(
    id: &str,
    netns: &Path,
    config: &cri::PodSandboxConfig,
    cgroup_parent: &str,
) -> Result<runtime_cni::Attachment> {
    let meta = config.metadata.clone().unwrap_or_default();
    Ok(runtime_cni::Attachment {
        container_id: id.to_string(),
        netns: netns.to_path_buf(),
        ifname: POD_IFNAME.to_string(),
        args: vec![
            ("K8S_POD_NAMESPACE".into(), meta.namespace),
            ("K8S_POD_NAME".into(), meta.name),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), id.to_string()),
            ("K8S_POD_UID".into(), meta.uid),
        ],
        capability_args: capability_args(config, cgroup_parent)?,
    })
}

/// The CNI capabilities of a sandbox config, as containerd passes them: `portMappings` (the
/// mappings with a host port), `bandwidth` (from the pod's `kubernetes.io/ingress-bandwidth`
/// and `egress-bandwidth` annotations, bits per second), `dns` and `cgroupPath`.
pub(super) fn capability_args(
    config: &cri::PodSandboxConfig,
    cgroup_parent: &str,
) -> Result<Map<String, Value>> {
    let mut caps = Map::new();
    let ports: Vec<Value> = config
        .port_mappings
        .iter()
        .filter(|m| m.host_port > 0)
        .map(|m| {
            let protocol = match cri::Protocol::try_from(m.protocol) {
                Ok(cri::Protocol::Udp) => "udp",
                Ok(cri::Protocol::Sctp) => "sctp",
                _ => "tcp",
            };
            json!({
                "hostPort": m.host_port,
                "containerPort": m.container_port,
                "protocol": protocol,
                "hostIP": m.host_ip,
            })
        })
        .collect();
    if !ports.is_empty() {
        caps.insert("portMappings".into(), Value::Array(ports));
    }
    let mut bandwidth = Map::new();
    for (annotation, rate, burst) in [
        (
            "kubernetes.io/ingress-bandwidth",
            "ingressRate",
            "ingressBurst",
        ),
        (
            "kubernetes.io/egress-bandwidth",
            "egressRate",
            "egressBurst",
        ),
    ] {
        if let Some(v) = config.annotations.get(annotation) {
            let bits = bandwidth_quantity(v).map_err(|why| {
                Error::invalid_argument(format!("annotation {annotation}: {v:?} {why}"))
            })?;
            bandwidth.insert(rate.into(), json!(bits));
            // No burst limit of its own, as containerd sets it.
            bandwidth.insert(burst.into(), json!(u32::MAX));
        }
    }
    if !bandwidth.is_empty() {
        caps.insert("bandwidth".into(), Value::Object(bandwidth));
    }
    if let Some(dns) = &config.dns_config {
        caps.insert(
            "dns".into(),
            json!({"servers": dns.servers, "searches": dns.searches, "options": dns.options}),
        );
    }
    if !cgroup_parent.is_empty() {
        caps.insert("cgroupPath".into(), json!(cgroup_parent));
    }
    Ok(caps)
}

/// A bandwidth annotation's quantity (`10M`, `1Gi`, `500k`) in bits per second, rounded up,
/// between 1k and 1P as upstream accepts.
fn bandwidth_quantity(v: &str) -> std::result::Result<u64, &'static str> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(split);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return Err("is not a quantity such as 10M"),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| "is not a quantity such as 10M")?;
    let bits = (n * multiplier).ceil();
    if !(1e3..=1e15).contains(&bits) {
        return Err("is outside 1k to 1P bits per second");
    }
    Ok(bits as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_from_the_sandbox_config() {
        let mut config = cri::PodSandboxConfig {
            port_mappings: vec![
                cri::PortMapping {
                    protocol: cri::Protocol::Tcp as i32,
                    container_port: 80,
                    host_port: 8080,
                    host_ip: String::new(),
                },
                cri::PortMapping {
                    protocol: cri::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 0,
                    host_ip: String::new(),
                },
            ],
            dns_config: Some(cri::DnsConfig {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            ..Default::default()
        };
        config
            .annotations
            .insert("kubernetes.io/ingress-bandwidth".into(), "10M".into());
        let caps = capability_args(&config, "/kubepods/pod1").unwrap();
        assert_eq!(
            Value::Object(caps),
            json!({
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}],
                "bandwidth": {"ingressRate": 10_000_000u64, "ingressBurst": u32::MAX},
                "dns": {"servers": ["10.96.0.10"], "searches": ["default.svc.cluster.local"], "options": ["ndots:5"]},
                "cgroupPath": "/kubepods/pod1",
            })
        );
        config
            .annotations
            .insert("kubernetes.io/egress-bandwidth".into(), "fast".into());
        let e = capability_args(&config, "").unwrap_err();
        assert!(
            e.message().contains("kubernetes.io/egress-bandwidth"),
            "{e}"
        );
    }

    #[test]
    fn bandwidth_quantities() {
        assert_eq!(bandwidth_quantity("1k"), Ok(1000));
        assert_eq!(bandwidth_quantity("1.5M"), Ok(1_500_000));
        assert_eq!(bandwidth_quantity("1Gi"), Ok(1 << 30));
        assert_eq!(bandwidth_quantity("2000"), Ok(2000));
        assert!(bandwidth_quantity("999").is_err());
        assert!(bandwidth_quantity("2P").is_err());
        assert!(bandwidth_quantity("10X").is_err());
        assert!(bandwidth_quantity("").is_err());
    }
}
