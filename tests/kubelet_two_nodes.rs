//! Two nodelet nodes, each in a network namespace of the test's, registered with the test API
//! server with a pod CIDR each: a pod on node B reaches a pod on node A by its pod IP with
//! nothing but nodelet installed, through `host-gw` routes (the nodes on one link) and through
//! `vxlan` (the nodes on two subnets joined by a router namespace, so only the tunnel gets
//! there); the routes (and the tunnel's entries) go when node B's Node object is deleted. The
//! clusters are dual-stack (a pod CIDR of each family): the client reaches the web pod over
//! IPv6 too, by host-gw routes via the nodes' IPv6 addresses (an IPv6 address on the link),
//! and through the IPv4 tunnel with vxlan.
//!
//! The API server listens in node A's namespace too, where both agents reach it.

mod apiserver;
mod common;

use std::process::Command;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

/// Runs `ip` with `args`; panics with its stderr when it fails.
fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Network namespaces of the test's (deleted when dropped).
struct Namespaces(Vec<String>);

impl Namespaces {
    fn add(&mut self, name: &str) {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        ip(&["netns", "add", name]);
        ip(&["-n", name, "link", "set", "lo", "up"]);
        self.0.push(name.to_string());
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// A veth pair between namespaces `a` and `b`, each end with its address (CIDR).
fn link(a: (&str, &str, &str), b: (&str, &str, &str)) {
    let ((ns_a, if_a, addr_a), (ns_b, if_b, addr_b)) = (a, b);
    ip(&[
        "-n", ns_a, "link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", ns_b,
    ]);
    for (ns, ifname, addr) in [(ns_a, if_a, addr_a), (ns_b, if_b, addr_b)] {
        ip(&["-n", ns, "addr", "add", addr, "dev", ifname]);
        ip(&["-n", ns, "link", "set", ifname, "up"]);
    }
}

/// A listener bound to `addr` in network namespace `netns`.
fn listen_in(netns: &str, addr: &str) -> std::net::TcpListener {
    let (netns, addr) = (netns.to_string(), addr.to_string());
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/run/netns/{netns}")).expect("the namespace");
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("entering it");
        std::net::TcpListener::bind(&addr).expect("binding in the namespace")
    })
    .join()
    .expect("the binding thread")
}

/// Every file under `dir`, for a failure's report.
fn logs_under(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push_str(&logs_under(&p));
        } else {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            out.push_str(&format!("{}:\n{text}\n", p.display()));
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    HostGw,
    Vxlan,
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_on_two_nodes_reach_each_other_over_host_gw_routes() {
    two_nodes(
        Mode::HostGw,
        "pods_on_two_nodes_reach_each_other_over_host_gw_routes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_on_two_nodes_reach_each_other_through_vxlan_across_subnets() {
    two_nodes(
        Mode::Vxlan,
        "pods_on_two_nodes_reach_each_other_through_vxlan_across_subnets",
    )
    .await;
}

async fn two_nodes(mode: Mode, test: &str) {
    if !common::root_or_skip(test) {
        return;
    }
    // Names of this test's own: namespaces, links, bridges, subnets.
    let (tag, third) = match mode {
        Mode::HostGw => ("g", 60),
        Mode::Vxlan => ("x", 70),
    };
    let (ns_a, ns_b, ns_r) = (
        format!("nl2n{tag}a"),
        format!("nl2n{tag}b"),
        format!("nl2n{tag}r"),
    );
    let mut namespaces = Namespaces(Vec::new());
    namespaces.add(&ns_a);
    namespaces.add(&ns_b);
    let (ip_a, ip_b) = match mode {
        // One link: the nodes on one L2 segment.
        Mode::HostGw => {
            let (a, b) = (format!("10.250.{third}.2"), format!("10.250.{third}.3"));
            link(
                (&ns_a, "nl2nga", &format!("{a}/24")),
                (&ns_b, "nl2ngb", &format!("{b}/24")),
            );
            for (ns, dev, v6) in [(&ns_a, "nl2nga", "2"), (&ns_b, "nl2ngb", "3")] {
                let addr = format!("fd00:250:{third}::{v6}/64");
                ip(&["-n", ns, "addr", "add", &addr, "dev", dev, "nodad"]);
            }
            (a, b)
        }
        // Two subnets and a router between them.
        Mode::Vxlan => {
            namespaces.add(&ns_r);
            let (a, b) = (
                format!("10.250.{third}.2"),
                format!("10.250.{}.2", third + 1),
            );
            link(
                (&ns_a, "nl2nxa", &format!("{a}/24")),
                (&ns_r, "nl2nxra", &format!("10.250.{third}.1/24")),
            );
            link(
                (&ns_b, "nl2nxb", &format!("{b}/24")),
                (&ns_r, "nl2nxrb", &format!("10.250.{}.1/24", third + 1)),
            );
            let st = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns_r,
                    "sysctl",
                    "-qw",
                    "net.ipv4.ip_forward=1",
                ])
                .status()
                .expect("sysctl");
            assert!(st.success());
            ip(&[
                "-n",
                &ns_a,
                "route",
                "add",
                "default",
                "via",
                &format!("10.250.{third}.1"),
            ]);
            ip(&[
                "-n",
                &ns_b,
                "route",
                "add",
                "default",
                "via",
                &format!("10.250.{}.1", third + 1),
            ]);
            (a, b)
        }
    };

    let api = ApiServer::start().await;
    let inside = listen_in(&ns_a, &format!("{ip_a}:0"));
    let inside_addr = inside.local_addr().expect("its address");
    api.listen_also(inside);
    let routes = match mode {
        Mode::HostGw => "host-gw",
        Mode::Vxlan => "vxlan",
    };
    let config = |node: &str, cidr: &str| -> &'static str {
        let cluster = format!("10.{third}.0.0/16, \"fd00:{third}::/48\"");
        Box::leak(
            format!(
                "syncFrequency: 5s\npodCIDR: \"{cidr}\"\nnodeletPodBridge: nl2n{tag}br{node}\n\
                 nodeletNetwork:\n  routes: {routes}\n  clusterCIDRs: [{cluster}]\n"
            )
            .into_boxed_str(),
        )
    };
    let (cidr_a, cidr_b) = (format!("10.{third}.1.0/24"), format!("10.{third}.2.0/24"));
    let (cidr6_a, cidr6_b) = (
        format!("fd00:{third}:1::/64"),
        format!("fd00:{third}:2::/64"),
    );
    let (all_a, all_b) = (format!("{cidr_a},{cidr6_a}"), format!("{cidr_b},{cidr6_b}"));
    let name_a: &'static str = Box::leak(format!("two-{tag}-a").into_boxed_str());
    let name_b: &'static str = Box::leak(format!("two-{tag}-b").into_boxed_str());
    let kubeconfig = |d: &std::path::Path| api.kubeconfig_at(d, inside_addr);
    let setup_a = Setup {
        name: name_a,
        config: config("a", &all_a),
        cri_listen: false,
    };
    let setup_b = Setup {
        name: name_b,
        config: config("b", &all_b),
        cri_listen: false,
    };
    let Some(node_a) = ApiNode::prepare(&setup_a, Backend::Builtin, test, kubeconfig).await else {
        return;
    };
    let Some(node_b) = ApiNode::prepare(&setup_b, Backend::Builtin, test, kubeconfig).await else {
        return;
    };
    let client = api.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node_ips = |v4: &str, v6: &str| {
        if mode == Mode::HostGw {
            format!("{v4},fd00:250:{third}::{v6}")
        } else {
            v4.to_string()
        }
    };
    let _agent_a = node_a.start_in_netns(&ns_a, &node_ips(&ip_a, "2"));
    let mut agent_b = Some(node_b.start_in_netns(&ns_b, &node_ips(&ip_b, "3")));

    // The cluster's node IPAM gives each node its pod CIDRs.
    for (name, all) in [(name_a, &all_a), (name_b, &all_b)] {
        wait_for(&format!("{name} registered"), 60, async || {
            nodes.get_opt(name).await.ok().flatten()
        })
        .await;
        let list: Vec<&str> = all.split(',').collect();
        let patch = serde_json::json!({"spec": {"podCIDR": list[0], "podCIDRs": list}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("setting the pod CIDR");
    }

    // A web server on node A; on node B a client fetching from it by pod IP.
    let web = node_a.plain_pod(
        "web",
        &format!(
            "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
            busybox(
                "main",
                "mkdir -p /tmp/w && echo hello-from-a > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
            )
        ),
    );
    pods.create(&PostParams::default(), &web)
        .await
        .expect("creating web");
    let (web_ip, web_ips) = wait_for("web Running with its IPs", 90, async || {
        let st = pods.get_opt("web").await.ok().flatten()?.status?;
        let ips: Vec<String> = st.pod_ips?.into_iter().map(|p| p.ip).collect();
        (st.phase.as_deref() == Some("Running")).then_some((st.pod_ip?, ips))
    })
    .await;
    assert!(
        web_ip.starts_with(&format!("10.{third}.1.")),
        "web's IP {web_ip}"
    );
    // Dual stack: both, IPv4 (the first node IP's family) first.
    assert_eq!(web_ips.len(), 2, "{web_ips:?}");
    assert_eq!(web_ips[0], web_ip);
    assert!(
        web_ips[1].starts_with(&format!("fd00:{third}:1::")),
        "{web_ips:?}"
    );
    let urls = [
        format!("http://{web_ip}:8080/"),
        format!("http://[{}]:8080/", web_ips[1]),
    ];
    let fetch: Vec<String> = urls
        .iter()
        .map(|u| format!("timeout 3 wget -q -O /tmp/got {u} && grep -q hello-from-a /tmp/got"))
        .collect();
    let fetch = fetch.join(" && ");
    let client_pod = node_b.plain_pod(
        "client",
        &format!(
            "  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n{}",
            busybox(
                "main",
                &format!(
                    "for i in $(seq 60); do {fetch} && exit 0; sleep 1; done; ip addr; ip route; \
                     ip -6 route; exit 1"
                )
            )
        ),
    );
    pods.create(&PostParams::default(), &client_pod)
        .await
        .expect("creating client");
    let phase = wait_for("client done", 120, async || {
        let st = pods.get_opt("client").await.ok().flatten()?.status?;
        let phase = st.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let client_ip = pods
        .get("client")
        .await
        .ok()
        .and_then(|p| p.status?.pod_ip)
        .unwrap_or_default();
    assert_eq!(
        phase,
        "Succeeded",
        "the client on B ({client_ip}) reached web on A ({web_ip}); A's routes: {}\nB's: {}\nthe client's log: {}",
        ip(&["-n", &ns_a, "route"]),
        ip(&["-n", &ns_b, "route"]),
        logs_under(&node_b.logs)
    );

    // Node A's entries toward B: a route (through the tunnel with vxlan), and B's VTEP.
    let routes_a = ip(&["-n", &ns_a, "route", "show", "proto", "110"]);
    assert!(routes_a.contains(&cidr_b), "{routes_a}");
    let routes6 = ip(&["-n", &ns_a, "-6", "route", "show", "proto", "110"]);
    let via = match mode {
        Mode::HostGw => format!("{cidr6_b} via fd00:250:{third}::3"),
        Mode::Vxlan => format!("{cidr6_b} via fd00:{third}:2:: dev nodelet.1"),
    };
    assert!(routes6.contains(&via), "{routes6}");
    if mode == Mode::Vxlan {
        assert!(routes_a.contains("dev nodelet.1"), "{routes_a}");
        let b = nodes.get(name_b).await.expect("node B");
        let mac = b
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("nodelet.io/vxlan-vtep-mac"))
            .cloned()
            .expect("B published its VTEP's MAC");
        let fdb = Command::new("bridge")
            .args(["-n", &ns_a, "fdb", "show", "dev", "nodelet.1"])
            .output()
            .expect("bridge fdb");
        let fdb = String::from_utf8_lossy(&fdb.stdout);
        assert!(fdb.contains(&format!("{mac} dst {ip_b}")), "{fdb}");
    }

    // Node B goes (its agent stopped, its Node deleted): A's entries toward it go too.
    agent_b.take();
    nodes
        .delete(name_b, &DeleteParams::default())
        .await
        .expect("deleting node B");
    wait_for("A's routes to B's pods removed", 90, async || {
        let r = ip(&["-n", &ns_a, "route", "show", "proto", "110"]);
        let r6 = ip(&["-n", &ns_a, "-6", "route", "show", "proto", "110"]);
        (!r.contains(&cidr_b) && !r6.contains(&cidr6_b)).then_some(())
    })
    .await;
    if mode == Mode::Vxlan {
        let neigh = ip(&["-n", &ns_a, "neigh", "show", "dev", "nodelet.1"]);
        assert!(!neigh.contains(&format!("10.{third}.2.0")), "{neigh}");
    }
    // The web pod goes through its node, freeing its address on A's bridge.
    pods.delete("web", &DeleteParams::default())
        .await
        .expect("deleting web");
    wait_for("web gone", 60, async || {
        pods.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(node_b);
}
