//! The kubelet on the built-in runtime in CNI mode (`nodeletNetwork.mode: cni`), through the
//! real binary: with no CNI config the Node is NotReady with upstream's message and a pod with
//! a pod network waits; once a config appears in the conf dir (Debian's bridge and host-local)
//! the node turns Ready, the pod runs with its address from host-local and answers at it, and
//! deleting the pod frees the address.

mod apiserver;
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use common::cni::{TestNet, plugins_or_skip};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NODE: &str = "cni-node";

fn fetch(ip: &str) -> Option<String> {
    let addr = format!("{ip}:8080");
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The Node's Ready condition: (status, message).
async fn ready(nodes: &Api<Node>) -> Option<(String, String)> {
    let n = nodes.get_opt(NODE).await.ok().flatten()?;
    let c = n
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status, c.message.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_waits_for_a_cni_config_and_pods_join_its_network() {
    let test = "the_node_waits_for_a_cni_config_and_pods_join_its_network";
    if !plugins_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnik0", [10, 231, 10]);
    let config: &'static str =
        Box::leak(format!("syncFrequency: 5s\n{}", net.kubelet_config()).into_boxed_str());
    let setup = Setup {
        name: NODE,
        config,
        cri_listen: false,
    };
    let api = ApiServer::start().await;
    let Some(node) =
        ApiNode::prepare(&setup, Backend::Builtin, test, |d| api.write_kubeconfig(d)).await
    else {
        return;
    };
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let _agent = node.start();

    // No config yet: NotReady, as upstream says it.
    let want = "container runtime network not ready: NetworkReady=false \
                reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin \
                not initialized";
    wait_for("the node NotReady for its network", 60, async || {
        let (status, message) = ready(&nodes).await?;
        (status == "False" && message == want).then_some(())
    })
    .await;

    let pod: Pod = serde_norway::from_str(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: {NODE}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox(
            "main",
            "mkdir -p /tmp/w && echo hello-cni > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
        )
    ))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pods.get("web").await.expect("the pod");
    let st = p.status.unwrap_or_default();
    assert_ne!(
        st.phase.as_deref(),
        Some("Running"),
        "a pod with a pod network waits for it: {st:?}"
    );

    // The config appears: Ready, and the pod runs on the network.
    net.write_conf(
        "10-kubelet.conflist",
        &net.conflist("nl-kubelet", "1.0.0", &[]),
    );
    wait_for("the node Ready", 60, async || {
        let (status, _) = ready(&nodes).await?;
        (status == "True").then_some(())
    })
    .await;
    let ip = wait_for("the pod Running with its IP", 90, async || {
        let st = pods.get_opt("web").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(st.pod_ip?)
    })
    .await;
    assert!(ip.starts_with("10.231.10."), "pod IP {ip}");
    assert_eq!(net.leases("nl-kubelet"), vec![ip.clone()]);
    let body = wait_for("the pod's answer", 30, async || fetch(&ip)).await;
    assert!(body.contains("hello-cni"), "{body}");

    // Deleted, its address goes with it.
    pods.delete("web", &DeleteParams::default())
        .await
        .expect("deleting the pod");
    wait_for("the address freed", 60, async || {
        (net.leases("nl-kubelet").is_empty() && net.cached().is_empty()).then_some(())
    })
    .await;
}

/// The body of an HTTP/1.0 GET of `addr`.
fn fetch_at(addr: std::net::SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dual_stack_pod_has_both_addresses_and_its_host_port_on_ipv6() {
    let test = "a_dual_stack_pod_has_both_addresses_and_its_host_port_on_ipv6";
    if !plugins_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnid0", [10, 231, 13]);
    net.write_conf("10-dual.conflist", &net.conflist_dual("nl-dual"));
    let config: &'static str =
        Box::leak(format!("syncFrequency: 5s\n{}", net.kubelet_config()).into_boxed_str());
    let setup = Setup {
        name: "cni-dual-node",
        config,
        cri_listen: false,
    };
    let api = ApiServer::start().await;
    let Some(node) =
        ApiNode::prepare(&setup, Backend::Builtin, test, |d| api.write_kubeconfig(d)).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    // A dual-stack node: one address of each family, IPv4 the primary.
    let _agent = node.start_with_node_ip("127.0.0.1,::1");
    let nodes: Api<Node> = Api::all(api.client());
    let addresses = wait_for("the node's addresses", 60, async || {
        let n = nodes.get_opt("cni-dual-node").await.ok().flatten()?;
        let a: Vec<String> = n
            .status?
            .addresses?
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect();
        (!a.is_empty()).then_some(a)
    })
    .await;
    assert_eq!(addresses, vec!["127.0.0.1", "::1"]);
    let host_port = common::free_port();
    let pod: Pod = serde_norway::from_str(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: dual\nspec:\n  nodeName: cni-dual-node\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n{}    ports:\n    - containerPort: 8080\n      hostPort: {host_port}\n",
        busybox(
            "main",
            "mkdir -p /tmp/w && echo hello-dual > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
        )
    ))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");
    let ips = wait_for("the pod Running with its IPs", 90, async || {
        let st = pods.get_opt("dual").await.ok().flatten()?.status?;
        if st.phase.as_deref() != Some("Running") {
            return None;
        }
        let ips: Vec<String> = st.pod_ips?.into_iter().map(|p| p.ip).collect();
        let host_ips: Vec<String> = st.host_ips?.into_iter().map(|p| p.ip).collect();
        assert_eq!(host_ips, vec!["127.0.0.1", "::1"], "the pod's hostIPs");
        Some((st.pod_ip?, ips))
    })
    .await;
    let (primary, all) = ips;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(primary, all[0]);
    // The node's first IP (127.0.0.1) is IPv4: IPv4 first.
    assert!(all[0].starts_with("10.231.13."), "{all:?}");
    assert!(all[1].starts_with("fd00:10:13:"), "{all:?}");
    let v6: std::net::Ipv6Addr = all[1].parse().expect("an IPv6 address");

    // Reached over IPv6 at its address and through its hostPort on the bridge's IPv6 address.
    let direct = std::net::SocketAddr::new(v6.into(), 8080);
    let body = wait_for("the pod's answer over IPv6", 30, async || fetch_at(direct)).await;
    assert!(body.contains("hello-dual"), "{body}");
    let gateway: std::net::Ipv6Addr = "fd00:10:13::1".parse().unwrap();
    let via = std::net::SocketAddr::new(gateway.into(), host_port);
    let body = wait_for("the hostPort over IPv6", 30, async || fetch_at(via)).await;
    assert!(body.contains("hello-dual"), "{body}");

    pods.delete("dual", &DeleteParams::default())
        .await
        .expect("deleting the pod");
    wait_for("both addresses freed", 60, async || {
        net.leases("nl-dual").is_empty().then_some(())
    })
    .await;
}
