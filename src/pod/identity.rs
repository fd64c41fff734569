//! A pod's names and lookups as its containers see them, as upstream's kubelet makes them:
//! the hostname and the domain (`spec.hostname`, `spec.subdomain`), the kernel's hostname
//! (`setHostnameAsFQDN`), the `/etc/hosts` file the kubelet writes for each pod and binds into
//! every container, and the limits a resolv.conf is kept within (with their events).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{HostAlias, Pod};
use runtime::cri;
use runtime::{Error, Result};

use crate::model::PodRef;

/// Where containers find the hosts file.
pub const ETC_HOSTS: &str = "/etc/hosts";
/// The kernel's nodename field: 64 characters (and the terminating NUL).
const FQDN_MAX_LEN: usize = 64;
/// Upstream's resolv.conf limits (`MaxDNSNameservers`, `MaxDNSSearchPaths`,
/// `MaxDNSSearchListChars`) and the longest search path glibc accepts.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH_PATHS: usize = 32;
const MAX_SEARCH_LINE_CHARS: usize = 2048;
const MAX_SEARCH_PATH_CHARS: usize = 253;

/// The pod's domain: `<subdomain>.<namespace>.svc.<cluster domain>` when it has a
/// subdomain (upstream's `GeneratePodHostNameAndDomain`).
pub fn domain(pod: &Pod, who: &PodRef, cluster_domain: &str) -> Option<String> {
    let sub = pod
        .spec
        .as_ref()?
        .subdomain
        .as_deref()
        .filter(|s| !s.is_empty())?;
    let cluster = cluster_domain.trim_end_matches('.');
    Some(format!("{sub}.{}.svc.{cluster}", who.namespace))
}

/// The hostname the pod's kernel gets: its hostname, or with `setHostnameAsFQDN` and a domain
/// the FQDN, which must fit the kernel's 64 characters (upstream's `GetNodenameForKernel`
/// and its error).
pub fn kernel_hostname(pod: &Pod, hostname: &str, domain: Option<&str>) -> Result<String> {
    let as_fqdn = pod
        .spec
        .as_ref()
        .and_then(|s| s.set_hostname_as_fqdn)
        .unwrap_or(false);
    let Some(domain) = domain.filter(|_| as_fqdn) else {
        return Ok(hostname.to_string());
    };
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > FQDN_MAX_LEN {
        return Err(Error::invalid_argument(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too \
             long ({FQDN_MAX_LEN} characters is the max, {} characters requested)",
            fqdn.len()
        )));
    }
    Ok(fqdn)
}

/// `/etc/hosts` of a pod with its own network: upstream's managed file, one line per pod IP
/// (with the FQDN when the pod has a domain), then the pod's `hostAliases`.
pub fn managed_hosts(
    pod_ips: &[String],
    hostname: &str,
    domain: Option<&str>,
    aliases: &[HostAlias],
) -> String {
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost \
         ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    for ip in pod_ips {
        match domain {
            Some(d) => s.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
            None => s.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    s.push_str(&alias_entries(aliases));
    s
}

/// `/etc/hosts` of a pod on the node's network: the node's file, then the pod's `hostAliases`.
pub fn node_hosts(node_file: &str, aliases: &[HostAlias]) -> String {
    format!(
        "# Kubernetes-managed hosts file (host network).\n{node_file}{}",
        alias_entries(aliases)
    )
}

fn alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.as_deref().unwrap_or_default().join("\t");
        s.push_str(&format!("{}\t{names}\n", a.ip));
    }
    s
}

/// Writes the pod's hosts file (`<pods dir>/<uid>/etc-hosts`, 0644) for `pod_ips` and returns
/// the mount binding it at `/etc/hosts` (upstream's `makeHostsMount`), or `None` before the
/// pod has an address.
pub fn hosts_mount(
    pods_dir: &Path,
    pod: &Pod,
    who: &PodRef,
    hostname: &str,
    cluster_domain: &str,
    pod_ips: &[String],
) -> Result<Option<cri::Mount>> {
    if pod_ips.is_empty() {
        return Ok(None);
    }
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or_default();
    let text = if super::host_network(pod) {
        let node = std::fs::read_to_string(ETC_HOSTS).map_err(|e| {
            Error::internal(format!(
                "reading the node's {ETC_HOSTS} for a hostNetwork pod: {e}"
            ))
        })?;
        node_hosts(&node, aliases)
    } else {
        let domain = domain(pod, who, cluster_domain);
        managed_hosts(pod_ips, hostname, domain.as_deref(), aliases)
    };
    let dir = pods_dir.join(&who.uid);
    let path: PathBuf = dir.join("etc-hosts");
    let write = |p: &Path| -> std::io::Result<()> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o750)
            .create(&dir)?;
        std::fs::write(p, &text)?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644))
    };
    write(&path).map_err(|e| {
        Error::internal(format!(
            "writing the pod's hosts file {}: {e}",
            path.display()
        ))
    })?;
    Ok(Some(cri::Mount {
        container_path: ETC_HOSTS.to_string(),
        host_path: path.to_string_lossy().into_owned(),
        readonly: false,
        selinux_relabel: true,
        ..Default::default()
    }))
}

/// Keeps a resolv.conf within upstream's limits: at most 3 nameservers; at most 32 search
/// paths, none longer than 253 characters, the line at most 2048. Returns the warnings
/// (`DNSConfigForming` events) for what was left out, in upstream's words.
pub fn fit_dns_limits(cfg: &mut cri::DnsConfig) -> Vec<String> {
    let mut warnings = Vec::new();
    if cfg.servers.len() > MAX_NAMESERVERS {
        cfg.servers.truncate(MAX_NAMESERVERS);
        warnings.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied \
             nameserver line is: {}",
            cfg.servers.join(" ")
        ));
    }
    let mut exceeded = false;
    if cfg.searches.len() > MAX_SEARCH_PATHS {
        cfg.searches.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let before = cfg.searches.len();
    cfg.searches.retain(|s| s.len() <= MAX_SEARCH_PATH_CHARS);
    exceeded |= cfg.searches.len() != before;
    while cfg.searches.join(" ").len() > MAX_SEARCH_LINE_CHARS {
        cfg.searches.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the \
             applied search line is: {}",
            cfg.searches.join(" ")
        ));
    }
    warnings
}

/// The warning of a `ClusterFirst` pod on a kubelet without `clusterDNS` (upstream's
/// `MissingClusterDNS`, after which the pod gets the node's resolv.conf).
pub fn missing_cluster_dns(pod: &Pod, who: &PodRef, cluster_dns: &[String]) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !spec.host_network.unwrap_or(false),
        _ => false,
    };
    (cluster_first && cluster_dns.is_empty()).then(|| {
        format!(
            "pod: \"{}_{}({})\". kubelet does not have ClusterDNS IP configured and cannot \
             create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
            who.name, who.namespace, who.uid
        )
    })
}

#[cfg(test)]
mod tests;
