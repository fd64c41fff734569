//! `nodeletNetwork.routes: host-gw`: the node keeps one route per other node's pod subnet via
//! that node's InternalIP, from a watch of every Node (nodes on one L2 segment reach each
//! other's pods with nothing else installed). A Node that goes, or loses its subnet or
//! address, has its route removed; the routes are checked again every minute (someone may
//! have flushed them). The routes carry nodelet's own protocol number
//! (`runtime::builtin::sync_node_routes`), so no other route is touched.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use runtime::builtin::Subnet;
use tokio_util::sync::CancellationToken;

/// How often the routes are checked when no Node changes.
const RESYNC: Duration = Duration::from_secs(60);

/// The routes `nodes` ask for on the node named `own`: each other node's first IPv4 pod CIDR
/// via its first IPv4 InternalIP. Nodes without either are left out (logged by the caller).
pub fn wanted(nodes: &BTreeMap<String, Node>, own: &str) -> Vec<(Subnet, Ipv4Addr)> {
    let mut out = Vec::new();
    for (name, node) in nodes {
        if name == own {
            continue;
        }
        let spec = node.spec.as_ref();
        let cidrs: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()) {
            Some(list) if !list.is_empty() => list,
            _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect(),
        };
        let Some(subnet) = cidrs
            .iter()
            .filter(|c| !c.contains(':'))
            .find_map(|c| runtime::builtin::parse_pod_cidr(c).ok())
        else {
            continue;
        };
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse::<Ipv4Addr>().ok());
        if let Some(ip) = ip {
            out.push((subnet, ip));
        }
    }
    out
}

/// Keeps the routes until `cancel`.
pub async fn run(client: kube::Client, own: String, cancel: CancellationToken) {
    let api: Api<Node> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Node>> = None;
    let mut tick = tokio::time::interval(RESYNC);
    let mut applied: Option<Vec<(Subnet, Ipv4Addr)>> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => applied = None,
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
        let want = wanted(&nodes, &own);
        if applied.as_ref() == Some(&want) {
            continue;
        }
        let routes = want.clone();
        match tokio::task::spawn_blocking(move || runtime::builtin::sync_node_routes(&routes)).await
        {
            Ok(Ok(changed)) => {
                if changed > 0 {
                    let list: Vec<String> =
                        want.iter().map(|(s, ip)| format!("{s} via {ip}")).collect();
                    tracing::info!(changed, routes = ?list, "routes to the other nodes' pods");
                }
                applied = Some(want);
            }
            Ok(Err(e)) => tracing::warn!("setting the routes to the other nodes' pods: {e}"),
            Err(e) => tracing::warn!("setting the routes to the other nodes' pods: {e}"),
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
        assert_eq!(
            got,
            vec![(
                "10.244.2.0/24".parse().unwrap(),
                "192.168.1.2".parse().unwrap()
            )]
        );
    }
}
