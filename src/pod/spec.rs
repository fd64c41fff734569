//! Pod → CRI `PodSandboxConfig`, and the pod-level helpers shared with [`super::container`].
//!
//! Follows upstream's `generatePodSandboxConfig`: metadata and attempt, hostname (not for
//! hostNetwork pods), the log directory `<podLogsDir>/<namespace>_<name>_<uid>`, DNS from the
//! kubelet's clusterDNS/clusterDomain and the pod's dnsPolicy/dnsConfig, host port mappings,
//! kubelet labels on top of the pod's labels, the pod's annotations, and the Linux part (cgroup
//! parent, namespaces, user/groups, sysctls, seccomp, privileged). [`qos_class`] is upstream's
//! `GetPodQOS`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SeccompProfile};
use runtime::cri;
use runtime::{Error, Result};

use super::{LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, host_network};
use crate::model::PodRef;
use crate::util::quantity;

/// What the kubelet knows that the pod does not say.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// The sandbox attempt (0 for the first sandbox of the pod).
    pub attempt: u32,
    /// Root of the pod log directories (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The pod cgroup (CRI `cgroup_parent`); empty lets the runtime choose.
    pub cgroup_parent: String,
    /// The kubelet's clusterDNS servers.
    pub cluster_dns: Vec<String>,
    /// The kubelet's clusterDomain (`cluster.local`).
    pub cluster_domain: String,
    /// Directory of localhost seccomp profiles (`<root>/seccomp`).
    pub seccomp_profile_root: PathBuf,
    /// Use `RuntimeDefault` when the pod sets no seccomp profile (kubelet `seccompDefault`).
    pub seccomp_default: bool,
    /// The pod's own user namespace (`hostUsers: false`), with the host IDs the kubelet gave it.
    pub user_namespace: Option<cri::UserNamespace>,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            attempt: 0,
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            cgroup_parent: String::new(),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            seccomp_profile_root: PathBuf::from("/var/lib/nodelet/seccomp"),
            seccomp_default: false,
            user_namespace: None,
        }
    }
}

pub(crate) fn pod_spec(pod: &Pod) -> Result<&PodSpec> {
    pod.spec
        .as_ref()
        .ok_or_else(|| Error::invalid_argument("pod has no spec"))
}

/// Every container of the pod, init containers first.
pub(crate) fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

/// The pod's hostname: `spec.hostname` or the pod name, at most 63 characters, without trailing
/// `-` or `.`.
pub fn hostname(pod: &Pod, who: &PodRef) -> String {
    let explicit = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty());
    let name = explicit.unwrap_or(&who.name);
    let truncated: String = name.chars().take(63).collect();
    truncated.trim_end_matches(['-', '.']).to_string()
}

/// The sandbox config of `pod`, who is `who` (upstream `generatePodSandboxConfig`).
pub fn sandbox_config(
    pod: &Pod,
    who: &PodRef,
    opts: &SandboxOptions,
) -> Result<cri::PodSandboxConfig> {
    let spec = pod_spec(pod)?;
    if who.uid.is_empty() || who.name.is_empty() {
        return Err(Error::invalid_argument(
            "metadata.name and metadata.uid are required",
        ));
    }
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(LABEL_POD_NAME.into(), who.name.clone());
    labels.insert(LABEL_POD_NAMESPACE.into(), who.namespace.clone());
    labels.insert(LABEL_POD_UID.into(), who.uid.clone());
    let annotations = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();

    let mut port_mappings = Vec::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            let host_port = p.host_port.unwrap_or(0);
            if host_port <= 0 {
                continue;
            }
            let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => cri::Protocol::Tcp,
                "UDP" => cri::Protocol::Udp,
                "SCTP" => cri::Protocol::Sctp,
                other => {
                    return Err(Error::invalid_argument(format!(
                        "spec.containers[{}].ports: unknown protocol {other:?}",
                        c.name
                    )));
                }
            };
            port_mappings.push(cri::PortMapping {
                protocol: protocol as i32,
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }

    let psc = spec.security_context.clone().unwrap_or_default();
    let sysctls = psc
        .sysctls
        .iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    let mut supplemental_groups = psc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = psc.fs_group {
        supplemental_groups.push(fs);
    }
    let privileged = all_containers(spec).any(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    });
    let security_context = cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(spec, opts.user_namespace.as_ref())),
        run_as_user: psc.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: psc.run_as_group.map(|value| cri::Int64Value { value }),
        supplemental_groups,
        privileged,
        seccomp: Some(seccomp_profile(
            psc.seccomp_profile.as_ref(),
            opts,
            "spec.securityContext.seccompProfile",
        )?),
        ..Default::default()
    };

    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: who.name.clone(),
            uid: who.uid.clone(),
            namespace: who.namespace.clone(),
            attempt: opts.attempt,
        }),
        hostname: if host_network(pod) {
            String::new()
        } else {
            let domain = super::identity::domain(pod, who, &opts.cluster_domain);
            super::identity::kernel_hostname(pod, &hostname(pod, who), domain.as_deref())?
        },
        log_directory: opts
            .pod_logs_dir
            .join(format!("{}_{}_{}", who.namespace, who.name, who.uid))
            .to_string_lossy()
            .into_owned(),
        dns_config: dns_config(pod, &who.namespace, opts).map(|mut c| {
            super::identity::fit_dns_limits(&mut c);
            c
        }),
        port_mappings,
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: opts.cgroup_parent.clone(),
            security_context: Some(security_context),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    })
}

/// The pod's namespace modes: hostNetwork/hostPID/hostIPC → NODE, shareProcessNamespace → POD
/// pid, otherwise POD network/ipc and CONTAINER pid; the pod's own user namespace if it has one.
pub fn namespace_options(
    spec: &PodSpec,
    user_namespace: Option<&cri::UserNamespace>,
) -> cri::NamespaceOption {
    let mode = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let pid_default = if spec.share_process_namespace.unwrap_or(false) {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: mode(spec.host_network, cri::NamespaceMode::Pod),
        pid: mode(spec.host_pid, pid_default),
        ipc: mode(spec.host_ipc, cri::NamespaceMode::Pod),
        userns_options: user_namespace.cloned(),
        ..Default::default()
    }
}

/// The CRI seccomp profile for a pod or container `seccompProfile`.
pub(crate) fn seccomp_profile(
    profile: Option<&SeccompProfile>,
    opts: &SandboxOptions,
    field: &str,
) -> Result<cri::SecurityProfile> {
    use cri::security_profile::ProfileType;
    let (kind, localhost_ref) = match profile.map(|p| p.type_.as_str()) {
        None if opts.seccomp_default => (ProfileType::RuntimeDefault, String::new()),
        None | Some("Unconfined") => (ProfileType::Unconfined, String::new()),
        Some("RuntimeDefault") => (ProfileType::RuntimeDefault, String::new()),
        Some("Localhost") => {
            let rel = profile
                .and_then(|p| p.localhost_profile.as_deref())
                .filter(|p| !p.is_empty())
                .ok_or_else(|| {
                    Error::invalid_argument(format!("{field}.localhostProfile is required"))
                })?;
            if rel.starts_with('/') || rel.split('/').any(|c| c == "..") {
                return Err(Error::invalid_argument(format!(
                    "{field}.localhostProfile must be a relative path"
                )));
            }
            (
                ProfileType::Localhost,
                opts.seccomp_profile_root
                    .join(rel)
                    .to_string_lossy()
                    .into_owned(),
            )
        }
        Some(other) => {
            return Err(Error::invalid_argument(format!(
                "{field}.type: unknown {other:?}"
            )));
        }
    };
    Ok(cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref,
    })
}

/// What is wrong with the DNS the pod gets, as upstream's `DNSConfigForming` and
/// `MissingClusterDNS` warnings (reason, message), for the events of its sandbox's creation.
pub fn dns_warnings(
    pod: &Pod,
    who: &PodRef,
    opts: &SandboxOptions,
) -> Vec<(crate::api::events::Reason, String)> {
    use crate::api::events::Reason;
    let missing = super::identity::missing_cluster_dns(pod, who, &opts.cluster_dns);
    let mut out: Vec<(Reason, String)> = missing
        .into_iter()
        .map(|m| (Reason::MissingClusterDns, m))
        .collect();
    if let Some(mut cfg) = dns_config(pod, &who.namespace, opts) {
        let forming = super::identity::fit_dns_limits(&mut cfg);
        out.extend(forming.into_iter().map(|m| (Reason::DnsConfigForming, m)));
    }
    out
}

/// DNS for the sandbox; `None` means the runtime's (host's) resolv.conf.
fn dns_config(pod: &Pod, ns: &str, opts: &SandboxOptions) -> Option<cri::DnsConfig> {
    let spec = pod.spec.as_ref()?;
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !spec.host_network.unwrap_or(false),
        "None" => false,
        _ => false, // "Default": the node's resolv.conf
    };
    let mut cfg = cri::DnsConfig::default();
    if cluster_first && !opts.cluster_dns.is_empty() {
        let d = opts.cluster_domain.trim_end_matches('.');
        cfg.servers = opts.cluster_dns.clone();
        cfg.searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.to_string()];
        cfg.options = vec!["ndots:5".into()];
    } else if policy != "None" && spec.dns_config.is_none() {
        return None;
    }
    if let Some(extra) = &spec.dns_config {
        for s in extra.nameservers.iter().flatten() {
            if !cfg.servers.contains(s) {
                cfg.servers.push(s.clone());
            }
        }
        for s in extra.searches.iter().flatten() {
            if !cfg.searches.contains(s) {
                cfg.searches.push(s.clone());
            }
        }
        for o in extra.options.iter().flatten() {
            let name = o.name.clone().unwrap_or_default();
            cfg.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            cfg.options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    Some(cfg)
}

/// A container's effective requests (limits stand in for missing requests, as API defaulting
/// does) and limits, as `(cpu millis, memory bytes)` options.
pub(crate) struct Resources {
    pub cpu_request: Option<i64>,
    pub cpu_limit: Option<i64>,
    pub mem_request: Option<i64>,
    pub mem_limit: Option<i64>,
}

pub(crate) fn container_resources(c: &Container) -> Result<Resources> {
    let empty = BTreeMap::new();
    let r = c.resources.as_ref();
    let requests = r.and_then(|r| r.requests.as_ref()).unwrap_or(&empty);
    let limits = r.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
    let get = |m: &BTreeMap<_, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
               key: &str,
               kind: &str,
               cpu: bool|
     -> Result<Option<i64>> {
        m.get(key)
            .map(|q| {
                if cpu {
                    quantity::parse_cpu_millis(&q.0)
                } else {
                    quantity::parse_bytes(&q.0)
                }
                .map_err(|e| {
                    Error::invalid_argument(format!(
                        "spec.containers[{}].resources.{kind}.{key}: {e}",
                        c.name
                    ))
                })
            })
            .transpose()
    };
    let cpu_limit = get(limits, "cpu", "limits", true)?;
    let mem_limit = get(limits, "memory", "limits", false)?;
    Ok(Resources {
        cpu_request: get(requests, "cpu", "requests", true)?.or(cpu_limit),
        cpu_limit,
        mem_request: get(requests, "memory", "requests", false)?.or(mem_limit),
        mem_limit,
    })
}

/// The pod's QoS class (upstream `GetPodQOS`): `Guaranteed` when every container has CPU and
/// memory limits equal to its requests, `BestEffort` when none has any, else `Burstable`.
/// Unparsable quantities count as set but unequal.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in all_containers(spec) {
        match container_resources(c) {
            Ok(r) => {
                let set = |v: Option<i64>| v.is_some_and(|v| v != 0);
                if set(r.cpu_request) || set(r.mem_request) || set(r.cpu_limit) || set(r.mem_limit)
                {
                    any = true;
                }
                if !(set(r.cpu_limit) && set(r.mem_limit))
                    || r.cpu_request != r.cpu_limit
                    || r.mem_request != r.mem_limit
                {
                    guaranteed = false;
                }
            }
            Err(_) => {
                any = true;
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

#[cfg(test)]
pub(crate) mod tests;
