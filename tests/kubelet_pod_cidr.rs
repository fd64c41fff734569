//! The Node's pod CIDR through the real binary on the built-in runtime: until the Node has
//! one, pods get addresses from the configured `podCIDR`; once the cluster sets
//! `spec.podCIDRs`, the kubelet hands it to the runtime (UpdateRuntimeConfig) and new pods get
//! addresses from it, while a pod started before keeps its address and stays reachable, from
//! the node and from the new pod.

mod apiserver;
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

const NODE: &str = "cidr-node";
/// The test's own bridge (and so its own address book and masquerade table).
const BRIDGE: &str = "nlpcidr0";

/// The body `ip`:8080 serves, read with a plain HTTP/1.0 request.
fn fetch(ip: &str) -> Option<String> {
    let addr = format!("{ip}:8080");
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn in_subnet(ip: &str, net: [u8; 4], prefix: u32) -> bool {
    let Ok(ip) = ip.parse::<Ipv4Addr>() else {
        return false;
    };
    let mask = u32::MAX << (32 - prefix);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

#[tokio::test(flavor = "multi_thread")]
async fn the_nodes_pod_cidr_takes_over_for_new_pods() {
    let test = "the_nodes_pod_cidr_takes_over_for_new_pods";
    let setup = Setup {
        name: NODE,
        config: "syncFrequency: 5s\npodCIDR: 10.66.0.0/16\nnodeletPodBridge: nlpcidr0\n",
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
    let agent = node.start();
    let serve = |text: &str| {
        busybox(
            "main",
            &format!(
                "mkdir -p /tmp/w && echo {text} > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
            ),
        )
    };
    let spec = |text: &str| {
        format!(
            "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
            serve(text)
        )
    };
    let ip_of = async |name: &str| -> String {
        wait_for(&format!("{name}'s pod IP"), 90, async || {
            let p = pods.get_opt(name).await.ok().flatten()?;
            let st = p.status?;
            (st.phase.as_deref() == Some("Running")).then_some(st.pod_ip?)
        })
        .await
    };

    // Before the Node has a pod CIDR: the configured one.
    pods.create(&PostParams::default(), &node.pod("before", &spec("before")))
        .await
        .unwrap();
    let before = ip_of("before").await;
    assert!(in_subnet(&before, [10, 66, 0, 0], 16), "{before}");

    // The cluster gives the Node its pod CIDRs (with an IPv6 one the built-in network leaves
    // out for now).
    wait_for("the node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    let patch = serde_json::json!({"spec": {"podCIDR": "10.67.5.0/24",
        "podCIDRs": ["10.67.5.0/24", "fd00:67::/64"]}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for("the runtime told of the pod CIDR", 60, async || {
        let log = std::fs::read_to_string(node.root.with_extension("log")).ok()?;
        log.contains("the node's pod CIDR handed to the runtime")
            .then_some(())
    })
    .await;
    pods.create(&PostParams::default(), &node.pod("after", &spec("after")))
        .await
        .unwrap();
    let after = ip_of("after").await;
    assert!(in_subnet(&after, [10, 67, 5, 0], 24), "{after}");

    // Both reachable from the node; the old pod from the new one.
    let got = wait_for("the old pod's page", 30, async || {
        fetch(&before).filter(|b| b.contains("before"))
    })
    .await;
    assert!(got.contains("200 OK"), "{got}");
    wait_for("the new pod's page", 30, async || {
        fetch(&after).filter(|b| b.contains("after"))
    })
    .await;
    let probe = node.pod(
        "probe",
        &format!(
            "  restartPolicy: Never\n  containers:\n{}",
            busybox(
                "main",
                &format!("wget -q -O - http://{before}:8080/ && echo reached")
            )
        ),
    );
    pods.create(&PostParams::default(), &probe).await.unwrap();
    wait_for("the probe pod reaching the old pod", 90, async || {
        let p = pods.get_opt("probe").await.ok().flatten()?;
        (p.status?.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    drop(agent);
    // The test's bridge and its masquerade table go with it.
    let cfg = runtime::builtin::NetworkConfig {
        bridge: BRIDGE.to_string(),
        ..Default::default()
    };
    runtime::builtin::remove_node_network(&cfg).unwrap();
    let _ = std::fs::remove_dir_all(cfg.ipam_dir.join(BRIDGE));
}
