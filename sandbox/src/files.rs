//! The pod's generated /etc files: hosts, hostname and resolv.conf. Pure text generation plus
//! one function that writes them into the sandbox's state directory.

use std::path::Path;

use crate::spec::{Dns, Layout, NamespaceMode, Spec};
use crate::{Error, Result};

/// The pod's /etc/hosts.
pub fn hosts(spec: &Spec, node_hosts: Option<&str>) -> String {
    if spec.namespaces.network == NamespaceMode::Node {
        if let Some(node) = node_hosts {
            return node.to_string();
        }
    }
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    if !spec.hostname.is_empty() {
        // As the kubelet writes it: the pod's own addresses when it has them.
        match &spec.network {
            Some(net) => {
                for a in net.addresses() {
                    s.push_str(&format!("{}\t{}\n", a.address, spec.hostname));
                }
            }
            None => s.push_str(&format!("127.0.1.1\t{}\n", spec.hostname)),
        }
    }
    for (ip, names) in &spec.host_aliases {
        s.push_str(&format!("{ip}\t{}\n", names.join("\t")));
    }
    s
}

/// The pod's resolv.conf: the given DNS settings, or the node's file when there are none.
pub fn resolv_conf(dns: Option<&Dns>, node_resolv: &str) -> String {
    let Some(dns) = dns else {
        return node_resolv.to_string();
    };
    let mut s = String::new();
    if !dns.searches.is_empty() {
        s.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for server in &dns.servers {
        s.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.options.is_empty() {
        s.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    s
}

/// Writes hosts, hostname and resolv.conf under the sandbox's state directory.
pub fn write_pod_files(layout: &Layout, spec: &Spec) -> Result<()> {
    let dir = layout.etc_dir();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let node_hosts = std::fs::read_to_string("/etc/hosts").ok();
    let node_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let hostname = if spec.namespaces.network == NamespaceMode::Node {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default()
    } else {
        spec.hostname.clone()
    };
    write(&layout.hosts(), &hosts(spec, node_hosts.as_deref()))?;
    write(&layout.hostname(), &format!("{hostname}\n"))?;
    write(
        &layout.resolv_conf(),
        &resolv_conf(spec.dns.as_ref(), &node_resolv),
    )
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_has_localhost_hostname_and_aliases() {
        let spec = Spec {
            hostname: "web-0".into(),
            host_aliases: vec![("10.1.2.3".into(), vec!["a".into(), "b".into()])],
            ..Default::default()
        };
        let h = hosts(&spec, Some("node file"));
        assert!(h.contains("127.0.0.1\tlocalhost\n"));
        assert!(h.contains("\tweb-0\n"));
        assert!(h.contains("10.1.2.3\ta\tb\n"));
    }

    #[test]
    fn host_network_pods_see_the_node_hosts_file() {
        let mut spec = Spec::default();
        spec.namespaces.network = NamespaceMode::Node;
        assert_eq!(hosts(&spec, Some("node file")), "node file");
    }

    #[test]
    fn resolv_conf_from_dns_config_or_node() {
        let dns = Dns {
            servers: vec!["10.0.0.10".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(Some(&dns), "nameserver 1.1.1.1\n"),
            "search default.svc.cluster.local svc.cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n"
        );
        assert_eq!(
            resolv_conf(None, "nameserver 1.1.1.1\n"),
            "nameserver 1.1.1.1\n"
        );
    }
}
