//! `nodeletNetwork`: how the built-in runtime's pod network joins the cluster's.
//!
//! ```yaml
//! nodeletNetwork:
//!   mode: bridge          # the runtime's own bridge (cni: not supported yet)
//!   routes: host-gw       # none (default), or routes to the other nodes' pod subnets
//!   clusterCIDRs: [10.244.0.0/16]   # not masqueraded (default: the node's podCIDR only)
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{Error, Typed, get, invalid, unknown};

/// How pods on other nodes are reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Routes {
    /// Not by nodelet: the network routes the pod subnets (or pods stay node-local).
    #[default]
    None,
    /// One route per other node's pod subnet via that node's InternalIP (nodes on one L2
    /// segment), kept from the Node objects.
    HostGw,
}

impl Routes {
    pub fn as_str(self) -> &'static str {
        match self {
            Routes::None => "none",
            Routes::HostGw => "host-gw",
        }
    }
}

/// `nodeletNetwork`, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkSettings {
    pub routes: Routes,
    /// The cluster's pod subnets (IPv4 CIDRs): traffic to them is not masqueraded.
    pub cluster_cidrs: Vec<String>,
}

/// `nodeletNetwork` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawNetwork {
    mode: Option<Typed<String>>,
    routes: Option<Typed<String>>,
    #[serde(rename = "clusterCIDRs")]
    cluster_cidrs: Option<Typed<Vec<String>>>,
    cni_conf_dir: Option<Typed<String>>,
    cni_bin_dir: Option<Typed<String>>,
    cni_cache_dir: Option<Typed<String>>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// `nodeletNetwork`, its unknown fields added to `warnings`.
pub(super) fn network(
    field: Option<RawNetwork>,
    warnings: &mut Vec<String>,
) -> Result<NetworkSettings, Error> {
    let Some(raw) = field else {
        return Ok(NetworkSettings::default());
    };
    warnings.extend(
        raw.other
            .keys()
            .map(|k| unknown(&format!("nodeletNetwork.{k}"))),
    );
    match get(raw.mode).as_deref() {
        None | Some("bridge") => {}
        Some("cni") => {
            return Err(invalid(
                "nodeletNetwork.mode",
                "cni is not supported yet: the built-in runtime connects pods to its own \
                 bridge (mode: bridge)",
            ));
        }
        Some(other) => {
            return Err(invalid(
                "nodeletNetwork.mode",
                format!("{other:?} must be bridge or cni"),
            ));
        }
    }
    for (name, set) in [
        ("cniConfDir", raw.cni_conf_dir.is_some()),
        ("cniBinDir", raw.cni_bin_dir.is_some()),
        ("cniCacheDir", raw.cni_cache_dir.is_some()),
    ] {
        if set {
            return Err(invalid(
                &format!("nodeletNetwork.{name}"),
                "is for mode: cni, which is not supported yet",
            ));
        }
    }
    let routes = match get(raw.routes).as_deref() {
        None | Some("none") => Routes::None,
        Some("host-gw") => Routes::HostGw,
        Some("vxlan") => {
            return Err(invalid(
                "nodeletNetwork.routes",
                "vxlan is not supported yet (host-gw routes nodes on one L2 segment)",
            ));
        }
        Some(other) => {
            return Err(invalid(
                "nodeletNetwork.routes",
                format!("{other:?} must be none, host-gw or vxlan"),
            ));
        }
    };
    let cluster_cidrs = get(raw.cluster_cidrs).unwrap_or_default();
    for (i, c) in cluster_cidrs.iter().enumerate() {
        runtime::builtin::parse_pod_cidr(c)
            .map_err(|e| invalid(&format!("nodeletNetwork.clusterCIDRs[{i}]"), e.message()))?;
    }
    Ok(NetworkSettings {
        routes,
        cluster_cidrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<(NetworkSettings, Vec<String>), String> {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
        );
        super::super::parse(&text)
            .map(|(c, w)| (c.network, w))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn routes_and_cluster_cidrs_with_clear_refusals() {
        assert_eq!(read("").unwrap().0, NetworkSettings::default());
        let (n, w) = read(
            "nodeletNetwork:\n  mode: bridge\n  routes: host-gw\n  clusterCIDRs: [10.244.0.0/16]\n  extra: 1\n",
        )
        .unwrap();
        assert_eq!(n.routes, Routes::HostGw);
        assert_eq!(n.cluster_cidrs, vec!["10.244.0.0/16"]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("nodeletNetwork.extra"), "{w:?}");
        for (body, want) in [
            (
                "nodeletNetwork: {mode: cni}",
                "nodeletNetwork.mode: cni is not supported yet",
            ),
            ("nodeletNetwork: {mode: calico}", "must be bridge or cni"),
            (
                "nodeletNetwork: {routes: vxlan}",
                "vxlan is not supported yet",
            ),
            (
                "nodeletNetwork: {routes: bgp}",
                "must be none, host-gw or vxlan",
            ),
            (
                "nodeletNetwork: {cniConfDir: /etc/cni/net.d}",
                "nodeletNetwork.cniConfDir",
            ),
            (
                "nodeletNetwork: {clusterCIDRs: [10.0.0.0/33]}",
                "nodeletNetwork.clusterCIDRs[0]",
            ),
            ("nodeletNetwork: [1]", "nodeletNetwork"),
        ] {
            let e = read(&format!("{body}\n")).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
    }
}
