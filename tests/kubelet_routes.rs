//! `nodeletNetwork.routes: host-gw` through the real binary on the built-in runtime: another
//! node (a network namespace the test makes, joined to the host by a veth pair, with a
//! server on an address of its pod subnet) is registered as a Node with a podCIDR and an
//! InternalIP; the agent routes that subnet via that address, a pod reaches the other node's
//! "pod" by its IP without being masqueraded (the cluster's CIDRs), and the route goes when
//! the Node is deleted.

mod apiserver;
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::process::Command;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

const NODE: &str = "routes-node";
const BRIDGE: &str = "nlroute0";
const NETNS: &str = "nlroute-peer";
const HOST_END: &str = "nlrtA";
const PEER_END: &str = "nlrtB";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

/// The test's peer "node": its namespace, link and addresses, removed when dropped.
struct Peer;

impl Peer {
    fn make() -> Peer {
        Peer::remove();
        ip(&["netns", "add", NETNS]);
        ip(&[
            "link", "add", HOST_END, "type", "veth", "peer", "name", PEER_END, "netns", NETNS,
        ]);
        ip(&["addr", "add", "192.168.231.1/24", "dev", HOST_END]);
        ip(&["link", "set", HOST_END, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", NETNS, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", "192.168.231.2/24", "dev", PEER_END]);
        inside(&["link", "set", PEER_END, "up"]);
        inside(&["link", "set", "lo", "up"]);
        // A "pod" of the other node, and the way back to this node's pods.
        inside(&["addr", "add", "10.69.7.1/32", "dev", "lo"]);
        inside(&["route", "add", "10.68.0.0/16", "via", "192.168.231.1"]);
        Peer
    }

    fn remove() {
        let _ = Command::new("ip").args(["link", "del", HOST_END]).output();
        let _ = Command::new("ip").args(["netns", "del", NETNS]).output();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        Peer::remove();
    }
}

/// Serves one answer per connection on 10.69.7.1:8080 inside the peer's namespace, telling
/// whom it saw connecting.
fn serve_in_peer() {
    let ns = std::fs::File::open(format!("/run/netns/{NETNS}")).expect("the peer's namespace");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // This thread alone moves into the peer's network namespace.
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let listener = TcpListener::bind("10.69.7.1:8080").expect("bind in the peer");
        tx.send(()).expect("ready");
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let peer = conn
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let body = format!("peer-node saw {peer}\n");
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    rx.recv().expect("the peer's server is up");
}

fn routes() -> String {
    let out = Command::new("ip")
        .args(["route", "show", "proto", "110"])
        .output()
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn host_gw_routes_follow_the_other_nodes() {
    let test = "host_gw_routes_follow_the_other_nodes";
    let setup = Setup {
        name: NODE,
        config: "syncFrequency: 5s\npodCIDR: 10.68.0.0/16\nnodeletPodBridge: nlroute0\nnodeletNetwork:\n  routes: host-gw\n  clusterCIDRs: [10.68.0.0/16, 10.69.0.0/16]\n",
        cri_listen: false,
    };
    let api = ApiServer::start().await;
    let Some(node) =
        ApiNode::prepare(&setup, Backend::Builtin, test, |d| api.write_kubeconfig(d)).await
    else {
        return;
    };
    let _peer = Peer::make();
    serve_in_peer();
    let client = api.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let agent = node.start();

    // The other node, as the cluster shows it.
    let other: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "peer-node"},
        "spec": {"podCIDR": "10.69.7.0/24", "podCIDRs": ["10.69.7.0/24"]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &other).await.unwrap();
    let status = serde_json::json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "192.168.231.2"},
        {"type": "Hostname", "address": "peer-node"}]}});
    nodes
        .patch_status("peer-node", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let shown = wait_for("the route to the other node's pods", 60, async || {
        let r = routes();
        r.contains("10.69.7.0/24 via 192.168.231.2").then_some(r)
    })
    .await;
    assert_eq!(shown.lines().count(), 1, "{shown}");

    // A pod reaches the other node's pod by its IP, seen with its own address.
    let probe = node.pod(
        "probe",
        &format!(
            "  restartPolicy: Never\n  containers:\n{}",
            busybox("main", "wget -q -O - http://10.69.7.1:8080/")
        ),
    );
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let st = wait_for("the probe pod done", 90, async || {
        let p = pods.get_opt("probe").await.ok().flatten()?;
        let st = p.status?;
        matches!(st.phase.as_deref(), Some("Succeeded") | Some("Failed")).then_some(st)
    })
    .await;
    assert_eq!(st.phase.as_deref(), Some("Succeeded"), "{st:?}");
    let pod_ip = st.pod_ip.unwrap_or_default();
    let log = std::fs::read_dir(&node.logs)
        .unwrap()
        .flatten()
        .find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("default_probe_")
        })
        .and_then(|d| std::fs::read_to_string(d.path().join("main/0.log")).ok())
        .unwrap_or_default();
    assert!(
        log.contains(&format!("peer-node saw {pod_ip}")),
        "not masqueraded: the other node sees the pod's own address {pod_ip}: {log}"
    );

    // The other node goes: so does its route.
    nodes
        .delete("peer-node", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the route gone", 60, async || {
        routes().trim().is_empty().then_some(())
    })
    .await;
    drop(agent);
    let cfg = runtime::builtin::NetworkConfig {
        bridge: BRIDGE.to_string(),
        ..Default::default()
    };
    runtime::builtin::remove_node_network(&cfg).unwrap();
    let _ = std::fs::remove_dir_all(cfg.ipam_dir.join(BRIDGE));
}
