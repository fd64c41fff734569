//! `nodeletNetwork.routes`: the node reaches the other nodes' pods with nothing else
//! installed, from a watch of every Node.
//! - `host-gw`: one route per other node's pod subnet via that node's InternalIP (nodes on one
//!   L2 segment).
//! - `vxlan`: a VXLAN device (`nodelet.<vni>`, flannel's VNI 1 and UDP port 8472 unless set)
//!   whose MAC and local address this node publishes in its Node's annotations
//!   ([`VTEP_MAC_ANNOTATION`], [`VTEP_ADDRESS_ANNOTATION`]); per other node that published
//!   them, an FDB entry (its MAC to its address), a neighbour entry (its subnet's network
//!   address to its MAC) and a route to its subnet through the device (nodes across L3).
//!
//! A Node that goes, or loses its subnet or address, has its entries removed; everything is
//! checked again every minute (someone may have flushed it). The routes carry nodelet's own
//! protocol number (`runtime::builtin::sync_node_routes`), so no other route is touched.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use runtime::builtin::{Subnet, VxlanDevice, VxlanPeer};
use tokio_util::sync::CancellationToken;

use crate::config::network::{Routes, Vxlan};

/// How often the routes are checked when no Node changes.
const RESYNC: Duration = Duration::from_secs(60);

/// The annotation in which a node publishes its VXLAN device's MAC (`aa:bb:cc:dd:ee:ff`).
pub const VTEP_MAC_ANNOTATION: &str = "nodelet.io/vxlan-vtep-mac";
/// The annotation in which a node publishes the address its VXLAN tunnels end at.
pub const VTEP_ADDRESS_ANNOTATION: &str = "nodelet.io/vxlan-vtep-address";

/// A node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`), the first of each family.
fn subnets_of(node: &Node) -> Vec<Subnet> {
    let spec = node.spec.as_ref();
    let cidrs: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()) {
        Some(list) if !list.is_empty() => list,
        _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect(),
    };
    let mut out: Vec<Subnet> = Vec::new();
    for s in cidrs
        .iter()
        .filter_map(|c| runtime::builtin::parse_pod_cidr(c).ok())
    {
        if !out.iter().any(|o| o.is_ipv6() == s.is_ipv6()) {
            out.push(s);
        }
    }
    out
}

/// A node's first IPv4 pod CIDR.
fn subnet_of(node: &Node) -> Option<Subnet> {
    subnets_of(node).into_iter().find(|s| !s.is_ipv6())
}

/// A node's first IPv6 pod CIDR.
fn subnet6_of(node: &Node) -> Option<Subnet> {
    subnets_of(node).into_iter().find(Subnet::is_ipv6)
}

/// A node's InternalIPs.
fn internal_ips(node: &Node) -> impl Iterator<Item = IpAddr> + '_ {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
}

/// A node's first IPv4 InternalIP.
fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    internal_ips(node).find_map(|ip| match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    })
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The VXLAN peers `nodes` make for the node named `own`: each other node with an IPv4 pod
/// subnet (and its IPv6 one, if any, carried through the same tunnel) and a published MAC,
/// its tunnel ending at its published address (else its InternalIP).
pub fn vxlan_peers(nodes: &BTreeMap<String, Node>, own: &str) -> Vec<VxlanPeer> {
    let mut out = Vec::new();
    for (name, node) in nodes {
        if name == own {
            continue;
        }
        let Some(subnet) = subnet_of(node) else {
            continue;
        };
        let Some(mac) = annotation(node, VTEP_MAC_ANNOTATION).and_then(runtime::builtin::parse_mac)
        else {
            continue;
        };
        let endpoint = annotation(node, VTEP_ADDRESS_ANNOTATION)
            .and_then(|a| a.parse::<Ipv4Addr>().ok())
            .or_else(|| internal_ip(node));
        if let Some(endpoint) = endpoint {
            out.push(VxlanPeer {
                subnet,
                subnet6: subnet6_of(node),
                endpoint,
                mac,
            });
        }
    }
    out
}

/// The routes `nodes` ask for on the node named `own`: each other node's pod CIDR of each
/// family via its first InternalIP of that family. A CIDR without an InternalIP of its family
/// is left out.
pub fn wanted(nodes: &BTreeMap<String, Node>, own: &str) -> Vec<(Subnet, IpAddr)> {
    nodes
        .iter()
        .filter(|(name, _)| name.as_str() != own)
        .flat_map(|(_, node)| {
            subnets_of(node).into_iter().filter_map(|s| {
                let via = internal_ips(node).find(|ip| ip.is_ipv6() == s.is_ipv6())?;
                Some((s, via))
            })
        })
        .collect()
}

/// What a node keeps toward the other nodes' pods.
pub enum Keep {
    /// `routes: host-gw`.
    HostGw,
    /// `routes: vxlan`, with the node's own subnets when its Node has none (the configured
    /// `podCIDR`'s IPv4 one, and its IPv6 one when dual-stack).
    Vxlan {
        settings: Vxlan,
        fallback: Subnet,
        fallback6: Option<Subnet>,
    },
}

impl Keep {
    /// What `routes` asks for; `None` for `none`.
    pub fn of(routes: Routes, settings: Vxlan, pod_cidr: &str) -> Option<Keep> {
        match routes {
            Routes::None => None,
            Routes::HostGw => Some(Keep::HostGw),
            Routes::Vxlan => {
                let configured = runtime::builtin::parse_pod_cidrs(pod_cidr).ok()?;
                Some(Keep::Vxlan {
                    settings,
                    fallback: configured.iter().copied().find(|s| !s.is_ipv6())?,
                    fallback6: configured.iter().copied().find(Subnet::is_ipv6),
                })
            }
        }
    }
}

/// Keeps the routes (or the VXLAN device and its entries) until `cancel`.
pub async fn run(client: kube::Client, own: String, keep: Keep, cancel: CancellationToken) {
    let api: Api<Node> = Api::all(client);
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Node>> = None;
    let mut tick = tokio::time::interval(RESYNC);
    let mut state = match keep {
        Keep::HostGw => State::HostGw { applied: None },
        Keep::Vxlan {
            settings,
            fallback,
            fallback6,
        } => State::Vxlan(VxlanState {
            settings,
            fallback,
            fallback6,
            device: None,
            applied: None,
            published: None,
        }),
    };
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => state.forget(),
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(n))) => {
                    nodes.insert(n.metadata.name.clone().unwrap_or_default(), n);
                }
                Some(Ok(watcher::Event::Delete(n))) => {
                    nodes.remove(n.metadata.name.as_deref().unwrap_or_default());
                }
                Some(Ok(watcher::Event::Init)) => listing = Some(BTreeMap::new()),
                Some(Ok(watcher::Event::InitApply(n))) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    listing.get_or_insert_with(BTreeMap::new).insert(name, n);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    nodes = listing.take().unwrap_or_default();
                }
                Some(Err(e)) => {
                    tracing::warn!("watching the nodes for their pod routes: {e}");
                    continue;
                }
                None => return,
            },
        }
        if listing.is_some() {
            continue;
        }
        match &mut state {
            State::HostGw { applied } => host_gw(applied, &nodes, &own).await,
            State::Vxlan(st) => st.apply(&api, &nodes, &own).await,
        }
    }
}

/// What was last applied (forgotten every [`RESYNC`], so that it is checked again).
enum State {
    HostGw {
        applied: Option<Vec<(Subnet, IpAddr)>>,
    },
    Vxlan(VxlanState),
}

impl State {
    fn forget(&mut self) {
        match self {
            State::HostGw { applied } => *applied = None,
            State::Vxlan(st) => {
                st.device = None;
                st.applied = None;
                st.published = None;
            }
        }
    }
}

async fn host_gw(
    applied: &mut Option<Vec<(Subnet, IpAddr)>>,
    nodes: &BTreeMap<String, Node>,
    own: &str,
) {
    let want = wanted(nodes, own);
    if applied.as_ref() == Some(&want) {
        return;
    }
    let routes = want.clone();
    match tokio::task::spawn_blocking(move || runtime::builtin::sync_node_routes(&routes)).await {
        Ok(Ok(changed)) => {
            if changed > 0 {
                let list: Vec<String> =
                    want.iter().map(|(s, ip)| format!("{s} via {ip}")).collect();
                tracing::info!(changed, routes = ?list, "routes to the other nodes' pods");
            }
            *applied = Some(want);
        }
        Ok(Err(e)) => tracing::warn!("setting the routes to the other nodes' pods: {e}"),
        Err(e) => tracing::warn!("setting the routes to the other nodes' pods: {e}"),
    }
}

/// The VXLAN device as made (for which subnet and local address, its MAC) and the peers last
/// applied.
struct VxlanState {
    settings: Vxlan,
    fallback: Subnet,
    fallback6: Option<Subnet>,
    device: Option<(Subnet, Option<Subnet>, Ipv4Addr, [u8; 6])>,
    applied: Option<Vec<VxlanPeer>>,
    /// The annotations last patched in, until the watch shows them.
    published: Option<(String, String)>,
}

impl VxlanState {
    async fn apply(&mut self, api: &Api<Node>, nodes: &BTreeMap<String, Node>, own: &str) {
        // The node's own Node gives the tunnel's local address and the device's subnet.
        let Some(me) = nodes.get(own) else {
            return;
        };
        let Some(local) = internal_ip(me) else {
            tracing::debug!("vxlan: the node has no IPv4 InternalIP yet");
            return;
        };
        let (subnet, subnet6) = if subnets_of(me).is_empty() {
            (self.fallback, self.fallback6)
        } else {
            (subnet_of(me).unwrap_or(self.fallback), subnet6_of(me))
        };
        let name = self.settings.device();
        if self.device.map(|(s, s6, l, _)| (s, s6, l)) != Some((subnet, subnet6, local)) {
            let dev = VxlanDevice {
                name: name.clone(),
                vni: self.settings.vni,
                port: self.settings.port,
                local,
                mtu: None,
            };
            let made = tokio::task::spawn_blocking(move || {
                runtime::builtin::ensure_vxlan(&dev, subnet, subnet6)
            })
            .await;
            match made {
                Ok(Ok(mac)) => {
                    self.device = Some((subnet, subnet6, local, mac));
                    self.applied = None;
                }
                Ok(Err(e)) => {
                    tracing::warn!("setting up the VXLAN device {name}: {e}");
                    return;
                }
                Err(e) => {
                    tracing::warn!("setting up the VXLAN device {name}: {e}");
                    return;
                }
            }
        }
        let Some((_, _, local, mac)) = self.device else {
            return;
        };
        let mac_text = runtime::builtin::format_mac(mac);
        let address = local.to_string();
        let shown = annotation(me, VTEP_MAC_ANNOTATION) == Some(mac_text.as_str())
            && annotation(me, VTEP_ADDRESS_ANNOTATION) == Some(address.as_str());
        let wanted = (mac_text.clone(), address.clone());
        if shown {
            self.published = None;
        } else if self.published.as_ref() != Some(&wanted) {
            let patch = serde_json::json!({"metadata": {"annotations": {
                VTEP_MAC_ANNOTATION: mac_text,
                VTEP_ADDRESS_ANNOTATION: address,
            }}});
            match api
                .patch(own, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!("vxlan: published the VTEP {mac_text} at {local}");
                    self.published = Some(wanted);
                }
                Err(e) => tracing::warn!("vxlan: publishing the VTEP in the Node: {e}"),
            }
        }
        let peers = vxlan_peers(nodes, own);
        if self.applied.as_ref() == Some(&peers) {
            return;
        }
        let want = peers.clone();
        let dev = name.clone();
        match tokio::task::spawn_blocking(move || runtime::builtin::sync_vxlan(&dev, &want)).await {
            Ok(Ok(changed)) => {
                if changed > 0 {
                    let list: Vec<String> = peers
                        .iter()
                        .map(|p| format!("{} at {}", p.subnet, p.endpoint))
                        .collect();
                    tracing::info!(changed, peers = ?list, "vxlan: the other nodes' pods through {name}");
                }
                self.applied = Some(peers);
            }
            Ok(Err(e)) => tracing::warn!("vxlan: the entries of {name}: {e}"),
            Err(e) => tracing::warn!("vxlan: the entries of {name}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidrs: &[&str], ips: &[(&str, &str)]) -> (String, Node) {
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": ips.iter().map(|(t, a)| serde_json::json!({"type": t, "address": a})).collect::<Vec<_>>()},
        }))
        .unwrap();
        (name.to_string(), n)
    }

    #[test]
    fn one_route_per_other_node_with_a_subnet_and_an_address() {
        let nodes: BTreeMap<String, Node> = [
            node("a", &["10.244.1.0/24"], &[("InternalIP", "192.168.1.1")]),
            node(
                "b",
                &["fd00:2::/64", "10.244.2.0/24"],
                &[
                    ("Hostname", "b"),
                    ("InternalIP", "fd00::2"),
                    ("InternalIP", "192.168.1.2"),
                ],
            ),
            node("c", &[], &[("InternalIP", "192.168.1.3")]),
            node("d", &["10.244.4.0/24"], &[("ExternalIP", "203.0.113.4")]),
        ]
        .into_iter()
        .collect();
        let got = wanted(&nodes, "a");
        let mut with_vtep = nodes.clone();
        if let Some((_, b)) = with_vtep.iter_mut().find(|(n, _)| n.as_str() == "b") {
            b.metadata.annotations = Some(
                [(
                    VTEP_MAC_ANNOTATION.to_string(),
                    "0a:58:0a:f4:02:00".to_string(),
                )]
                .into(),
            );
        }
        let peers = vxlan_peers(&with_vtep, "a");
        assert_eq!(peers.len(), 1);
        assert_eq!(
            peers[0].endpoint,
            "192.168.1.2".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(peers[0].mac, [0x0a, 0x58, 0x0a, 0xf4, 0x02, 0x00]);
        assert!(vxlan_peers(&nodes, "a").is_empty(), "no VTEP published");
        // A dual-stack node: a route for each family, via its address of that family.
        assert_eq!(
            got,
            vec![
                ("fd00:2::/64".parse().unwrap(), "fd00::2".parse().unwrap()),
                (
                    "10.244.2.0/24".parse().unwrap(),
                    "192.168.1.2".parse().unwrap()
                )
            ]
        );
    }
}
