//! `nodeletNetwork`: how the built-in runtime's pod network joins the cluster's.
//!
//! ```yaml
//! nodeletNetwork:
//!   mode: bridge          # the runtime's own bridge, or cni (the plugins of a CNI config)
//!   cniConfDir: /etc/cni/net.d   # mode cni: the config (the first file by name)
//!   cniBinDir: /opt/cni/bin      # mode cni: the plugins (a comma-separated list of dirs)
//!   cniCacheDir: /var/lib/cni    # mode cni: libcni's cache
//!   routes: host-gw       # none (default), host-gw (one L2 segment) or vxlan (across L3)
//!   vxlan: {vni: 1, port: 8472}  # routes vxlan: flannel's defaults
//!   clusterCIDRs: [10.244.0.0/16]   # not masqueraded (default: the node's podCIDR only)
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

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
    /// Through a VXLAN device (`nodelet.<vni>`), with FDB and neighbour entries from the other
    /// nodes' addresses and published VTEP MACs (nodes across L3).
    Vxlan,
}

/// `nodeletNetwork.vxlan`: flannel's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vxlan {
    pub vni: u32,
    pub port: u16,
}

impl Default for Vxlan {
    fn default() -> Self {
        Vxlan { vni: 1, port: 8472 }
    }
}

impl Vxlan {
    /// The device's name: says nodelet, and which VNI.
    pub fn device(&self) -> String {
        format!("nodelet.{}", self.vni)
    }
}

impl Routes {
    pub fn as_str(self) -> &'static str {
        match self {
            Routes::None => "none",
            Routes::HostGw => "host-gw",
            Routes::Vxlan => "vxlan",
        }
    }
}

/// How the built-in runtime networks pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Mode {
    /// Its own bridge (`podCIDR`, `nodeletPodBridge`, `nodeletPodMasquerade`).
    #[default]
    Bridge,
    /// The network a CNI config describes, through its plugins.
    Cni(Cni),
}

/// Where mode `cni` finds its config, plugins and cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cni {
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    pub cache_dir: PathBuf,
}

impl Default for Cni {
    fn default() -> Self {
        Cni {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin")],
            cache_dir: PathBuf::from("/var/lib/cni"),
        }
    }
}

/// `nodeletNetwork`, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkSettings {
    pub mode: Mode,
    pub routes: Routes,
    pub vxlan: Vxlan,
    /// The cluster's pod subnets (IPv4 CIDRs): traffic to them is not masqueraded.
    pub cluster_cidrs: Vec<String>,
}

/// `nodeletNetwork` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawNetwork {
    mode: Option<Typed<String>>,
    routes: Option<Typed<String>>,
    vxlan: Option<RawVxlan>,
    #[serde(rename = "clusterCIDRs")]
    cluster_cidrs: Option<Typed<Vec<String>>>,
    cni_conf_dir: Option<Typed<String>>,
    cni_bin_dir: Option<Typed<String>>,
    cni_cache_dir: Option<Typed<String>>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// `nodeletNetwork.vxlan` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawVxlan {
    vni: Option<u32>,
    port: Option<u16>,
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
    let dirs = [
        ("cniConfDir", get(raw.cni_conf_dir)),
        ("cniBinDir", get(raw.cni_bin_dir)),
        ("cniCacheDir", get(raw.cni_cache_dir)),
    ];
    for (name, value) in &dirs {
        if let Some(v) = value {
            let bad = v.split(',').any(|d| !d.trim().starts_with('/'));
            if bad {
                return Err(invalid(
                    &format!("nodeletNetwork.{name}"),
                    format!("{v:?} must be an absolute path"),
                ));
            }
        }
    }
    let [(_, conf_dir), (_, bin_dir), (_, cache_dir)] = dirs;
    let mode = match get(raw.mode).as_deref() {
        None | Some("bridge") => {
            if let Some((name, _)) = [
                ("cniConfDir", &conf_dir),
                ("cniBinDir", &bin_dir),
                ("cniCacheDir", &cache_dir),
            ]
            .into_iter()
            .find(|(_, v)| v.is_some())
            {
                return Err(invalid(
                    &format!("nodeletNetwork.{name}"),
                    "is for mode: cni (the mode is bridge)",
                ));
            }
            Mode::Bridge
        }
        Some("cni") => {
            let d = Cni::default();
            Mode::Cni(Cni {
                conf_dir: conf_dir.map(PathBuf::from).unwrap_or(d.conf_dir),
                bin_dirs: bin_dir
                    .map(|b| {
                        b.split(',')
                            .map(|d| PathBuf::from(d.trim()))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or(d.bin_dirs),
                cache_dir: cache_dir.map(PathBuf::from).unwrap_or(d.cache_dir),
            })
        }
        Some(other) => {
            return Err(invalid(
                "nodeletNetwork.mode",
                format!("{other:?} must be bridge or cni"),
            ));
        }
    };
    let routes = match get(raw.routes).as_deref() {
        None | Some("none") => Routes::None,
        Some("host-gw") => Routes::HostGw,
        Some("vxlan") => Routes::Vxlan,
        Some(other) => {
            return Err(invalid(
                "nodeletNetwork.routes",
                format!("{other:?} must be none, host-gw or vxlan"),
            ));
        }
    };
    let mut vxlan = Vxlan::default();
    if let Some(v) = raw.vxlan {
        if let Some(vni) = v.vni {
            // 24 bits; VNI 0 is not for a segment.
            if vni == 0 || vni >= 1 << 24 {
                return Err(invalid(
                    "nodeletNetwork.vxlan.vni",
                    format!("{vni} must be between 1 and 16777215"),
                ));
            }
            vxlan.vni = vni;
        }
        if let Some(port) = v.port {
            if port == 0 {
                return Err(invalid("nodeletNetwork.vxlan.port", "0 is not a port"));
            }
            vxlan.port = port;
        }
    }
    let cluster_cidrs = get(raw.cluster_cidrs).unwrap_or_default();
    for (i, c) in cluster_cidrs.iter().enumerate() {
        runtime::builtin::parse_pod_cidr(c)
            .map_err(|e| invalid(&format!("nodeletNetwork.clusterCIDRs[{i}]"), e.message()))?;
    }
    Ok(NetworkSettings {
        mode,
        routes,
        vxlan,
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
        assert_eq!(n.mode, Mode::Bridge);
        assert_eq!(n.vxlan, Vxlan { vni: 1, port: 8472 });
        let (n, _) =
            read("nodeletNetwork: {routes: vxlan, vxlan: {vni: 7, port: 4789}}\n").unwrap();
        assert_eq!(n.routes, Routes::Vxlan);
        assert_eq!(
            (n.vxlan.device(), n.vxlan.port),
            ("nodelet.7".to_string(), 4789)
        );
        let (n, _) = read("nodeletNetwork: {mode: cni}\n").unwrap();
        assert_eq!(n.mode, Mode::Cni(Cni::default()));
        let (n, _) = read(
            "nodeletNetwork: {mode: cni, cniConfDir: /c, cniBinDir: '/b1,/b2', cniCacheDir: /k}\n",
        )
        .unwrap();
        assert_eq!(
            n.mode,
            Mode::Cni(Cni {
                conf_dir: "/c".into(),
                bin_dirs: vec!["/b1".into(), "/b2".into()],
                cache_dir: "/k".into(),
            })
        );
        for (body, want) in [
            (
                "nodeletNetwork: {mode: cni, cniBinDir: 'opt/cni'}",
                "nodeletNetwork.cniBinDir: \"opt/cni\" must be an absolute path",
            ),
            ("nodeletNetwork: {mode: calico}", "must be bridge or cni"),
            (
                "nodeletNetwork: {routes: vxlan, vxlan: {vni: 0}}",
                "nodeletNetwork.vxlan.vni: 0 must be between 1 and 16777215",
            ),
            (
                "nodeletNetwork: {vxlan: {vni: 2, group: 239.1.1.1}}",
                "nodeletNetwork",
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
