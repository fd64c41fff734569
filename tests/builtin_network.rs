//! The built-in runtime's pod network, with no CNI binaries: each pod gets an address on a
//! bridge of the node, reachable from the node and from other pods; node ports (hostPorts)
//! forward to the pod and survive a restart of the agent; stopping the pod frees the address,
//! the veth pair and the node port; a node port in use or a broken bridge fail with a message.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use common::*;
use runtime::builtin::{NetworkConfig, parse_pod_cidr};
use runtime::{RuntimeService, cri};

async fn pod_ip(rt: &dyn RuntimeService, id: &str) -> String {
    rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.into(),
        verbose: false,
    })
    .await
    .expect("PodSandboxStatus")
    .status
    .and_then(|s| s.network)
    .map(|n| n.ip)
    .unwrap_or_default()
}

fn leases(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<Ipv4Addr>().is_ok())
                .count()
        })
        .unwrap_or(0)
}

/// `pod-a`, serving its host name on port 8080, forwarded from node port `host_port`: the
/// sandbox and the web container.
async fn web_pod(node: &Node, host_port: u16) -> ((String, cri::PodSandboxConfig), String) {
    let a = node
        .sandbox_with("pod-a", |c| {
            c.port_mappings = vec![cri::PortMapping {
                protocol: cri::Protocol::Tcp as i32,
                container_port: 8080,
                host_port: i32::from(host_port),
                host_ip: String::new(),
            }];
        })
        .await;
    let web = node.container(&a, "web", &["sh", "-c", WEB]).await;
    (a, web)
}

const WEB: &str = "mkdir -p /tmp/w && echo hello-from-$(hostname) > /tmp/w/index.html && \
                   exec httpd -f -p 8080 -h /tmp/w";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_addresses_reach_each_other_and_node_ports_forward() {
    if !root_or_skip("pods_get_addresses_reach_each_other_and_node_ports_forward") {
        return;
    }
    let mut net = None;
    let node = Node::with_network("net", |n| {
        let tmp = std::env::temp_dir().join(format!("nodelet-net-{}", std::process::id()));
        let cfg = own_network(&tmp);
        net = Some(cfg.clone());
        *n = Some(cfg);
    })
    .await;
    let net = net.expect("network config");
    let _network = NetworkGuard(net.clone());
    let ipam_dir = net.ipam_dir.join(&net.bridge);
    let subnet = net.pod_cidrs[0];

    // The runtime reports its network ready once the bridge is there.
    let st = node
        .rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status");
    let conds = st.status.expect("status").conditions;
    assert!(
        conds.iter().any(|c| c.r#type == "NetworkReady" && c.status),
        "{conds:?}"
    );
    assert!(Path::new("/sys/class/net").join(&net.bridge).exists());

    let host_port = free_port();
    let (a, web) = web_pod(&node, host_port).await;
    let ip_a = pod_ip(&node.rt, &a.0).await;
    let ip: Ipv4Addr = ip_a.parse().unwrap_or_else(|_| panic!("pod IP {ip_a:?}"));
    assert!(
        subnet.assignable(ip.into()),
        "{ip} is not a pod address of {subnet}"
    );
    assert_eq!(leases(&ipam_dir), 1);

    // Inside: eth0 with the address, the default route through the bridge, /etc/hosts.
    let addr = node.exec(&web, &["ip", "-4", "addr", "show", "eth0"]).await;
    let text = String::from_utf8_lossy(&addr.stdout);
    assert!(
        text.contains(&format!("inet {ip}/{}", subnet.prefix_len)),
        "{text}"
    );
    let route = node.exec(&web, &["ip", "route"]).await;
    let text = String::from_utf8_lossy(&route.stdout);
    assert!(
        text.contains(&format!("default via {}", subnet.gateway())),
        "{text}"
    );
    let hosts = node.exec(&web, &["cat", "/etc/hosts"]).await;
    let text = String::from_utf8_lossy(&hosts.stdout);
    assert!(text.contains(&format!("{ip}\tpod-a")), "{text}");

    // The node reaches the pod at its address, and at the node port.
    assert_eq!(
        http_get(SocketAddr::new(ip.into(), 8080)).await.trim(),
        "hello-from-pod-a"
    );
    let node_port = SocketAddr::from(([127, 0, 0, 1], host_port));
    assert_eq!(http_get(node_port).await.trim(), "hello-from-pod-a");

    // Another pod reaches it by address.
    let b = node.sandbox("pod-b").await;
    let client = node.container(&b, "client", &["sleep", "300"]).await;
    let ip_b = pod_ip(&node.rt, &b.0).await;
    assert_ne!(ip_a, ip_b);
    let got = node
        .exec(
            &client,
            &["wget", "-q", "-O", "-", &format!("http://{ip_a}:8080/")],
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "hello-from-pod-a",
        "stderr: {}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(leases(&ipam_dir), 2);

    // A node port in use fails the pod with a message naming it, and holds no address.
    let err = node
        .try_sandbox({
            let mut c = sandbox_config("pod-c", &node.log_dir());
            c.port_mappings = vec![cri::PortMapping {
                protocol: cri::Protocol::Tcp as i32,
                container_port: 80,
                host_port: i32::from(host_port),
                host_ip: String::new(),
            }];
            c
        })
        .await
        .expect_err("a second pod on the same node port");
    assert_eq!(err.code(), runtime::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains(&host_port.to_string()), "{err}");
    assert_eq!(leases(&ipam_dir), 2);

    // Traffic leaving the pod subnet is masqueraded: a host outside (a network namespace on a
    // link with no route back to the pods) answers the node's address.
    let outside = Outside::new();
    let got = node
        .exec(
            &client,
            &[
                "wget",
                "-q",
                "-O",
                "-",
                &format!("http://{}:9000/", outside.addr),
            ],
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "from-outside",
        "stderr: {}",
        String::from_utf8_lossy(&got.stderr)
    );
    let seen = outside.peer();
    assert_eq!(
        seen, outside.node_addr,
        "the outside host saw {seen}, not the node"
    );
    drop(outside);

    // A restarted agent finds the addresses, and the node port still forwards.
    let rt = node.reopen().await;
    assert_eq!(pod_ip(&rt, &a.0).await, ip_a);
    assert_eq!(http_get(node_port).await.trim(), "hello-from-pod-a");

    // Stopping the pod frees its address, its veth pair and its node port.
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: a.0.clone(),
    })
    .await
    .expect("StopPodSandbox");
    assert_eq!(pod_ip(&rt, &a.0).await, "");
    assert_eq!(leases(&ipam_dir), 1);
    let veth = format!("nlv{}", &a.0[..12]);
    let mut gone = false;
    for _ in 0..50 {
        if !Path::new("/sys/class/net").join(&veth).exists() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "veth {veth} outlived its pod");
    TcpListener::bind(node_port).expect("the node port is free again");

    node.teardown().await;
    assert_eq!(leases(&ipam_dir), 0);
    runtime::builtin::remove_node_network(&net).expect("remove the bridge and masquerade rule");
    assert!(!Path::new("/sys/class/net").join(&net.bridge).exists());
}

/// Removes the test's bridge, masquerade rule and address book, also when the test fails
/// (pods a failed test left behind are `scripts/cleanup-test-leftovers.sh`'s).
/// A host outside the node: a network namespace behind a veth pair on its own /30, with no
/// route to the pod subnet, serving one HTTP answer on port 9000 and recording who asked.
struct Outside {
    ns: String,
    link: String,
    addr: Ipv4Addr,
    node_addr: Ipv4Addr,
    peer: std::sync::mpsc::Receiver<Ipv4Addr>,
}

impl Outside {
    fn new() -> Outside {
        let id = std::process::id() % 10_000;
        let (ns, link, peer_link) = (
            format!("nlout{id}"),
            format!("nloh{id}"),
            format!("nlop{id}"),
        );
        let n = std::process::id() % 250 + 1;
        let node_addr = Ipv4Addr::new(10, 90, n as u8, 1);
        let addr = Ipv4Addr::new(10, 90, n as u8, 2);
        let ip = |args: &[&str]| {
            let st = std::process::Command::new("ip")
                .args(args)
                .status()
                .expect("run ip");
            assert!(st.success(), "ip {args:?}");
        };
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .status();
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", &peer_link,
        ]);
        ip(&["link", "set", &peer_link, "netns", &ns]);
        ip(&["addr", "add", &format!("{node_addr}/30"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{addr}/30"), "dev", &peer_link]);
        inside(&["link", "set", &peer_link, "up"]);
        inside(&["link", "set", "lo", "up"]);
        let (tx, peer) = std::sync::mpsc::channel();
        let (bound_tx, bound) = std::sync::mpsc::channel();
        let ns_path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let f = std::fs::File::open(&ns_path).expect("open netns");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let l = TcpListener::bind((addr, 9000)).expect("bind outside");
            let _ = bound_tx.send(());
            if let Ok((mut c, from)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
                let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\nfrom-outside\n");
                if let std::net::IpAddr::V4(v4) = from.ip() {
                    let _ = tx.send(v4);
                }
            }
        });
        bound.recv().expect("outside listener");
        Outside {
            ns,
            link,
            addr,
            node_addr,
            peer,
        }
    }

    fn peer(&self) -> Ipv4Addr {
        self.peer
            .recv_timeout(Duration::from_secs(10))
            .expect("the outside host was never reached")
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

/// A bridge name taken by a link that is no bridge: the runtime says its network is not ready
/// and why, and a pod fails with that reason instead of starting without a network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_bridge_is_reported_not_ready() {
    if !root_or_skip("a_broken_bridge_is_reported_not_ready") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let node = Node::with_network("netbad", |n| {
        *n = Some(NetworkConfig {
            bridge: "lo".into(),
            pod_cidrs: vec![parse_pod_cidr("10.89.0.0/24").expect("cidr")],
            ipam_dir: tmp.path().to_path_buf(),
            masquerade: false,
            cluster_cidrs: Vec::new(),
        })
    })
    .await;
    let st = node
        .rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status");
    let conds = st.status.expect("status").conditions;
    let net = conds
        .iter()
        .find(|c| c.r#type == "NetworkReady")
        .expect("NetworkReady");
    assert!(!net.status);
    assert!(net.message.contains("not a bridge"), "{net:?}");
    let err = node
        .try_sandbox(sandbox_config("p", &node.log_dir()))
        .await
        .expect_err("a pod without its network");
    assert!(err.message().contains("not a bridge"), "{err}");
    assert_eq!(leases(&tmp.path().join("lo")), 0);
    // hostNetwork pods need no pod network.
    let host = node
        .sandbox_with("host", |c| {
            c.linux = Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
        })
        .await;
    assert_eq!(pod_ip(&node.rt, &host.0).await, "");
    node.teardown().await;
}

/// A dual-stack pod network (`podCIDR: "<v4>,<v6>"`): each pod gets an address of each
/// family, both in its status (the IPv4 one first, as configured), a default route of each;
/// pods reach each other over IPv6, and a node port forwards over IPv6 as over IPv4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_get_both_families_and_node_ports_forward_over_ipv6() {
    if !root_or_skip("dual_stack_pods_get_both_families_and_node_ports_forward_over_ipv6") {
        return;
    }
    let mut net = None;
    let node = Node::with_network("net6", |n| {
        let pid = std::process::id();
        let tmp = std::env::temp_dir().join(format!("nodelet-net6-{pid}"));
        let mut cfg = own_network(&tmp);
        let k = pid % 250 + 1;
        // A bridge and subnets of their own: the other tests of this binary run beside it.
        cfg.bridge = format!("nl6t{}", pid % 100_000);
        cfg.pod_cidrs =
            runtime::builtin::parse_pod_cidrs(&format!("10.92.{k}.0/24,fd00:92:{k:x}::/64"))
                .expect("cidrs");
        net = Some(cfg.clone());
        *n = Some(cfg);
    })
    .await;
    let net = net.expect("network config");
    let _network = NetworkGuard(net.clone());
    let (v4, v6) = (net.pod_cidrs[0], net.pod_cidrs[1]);

    let host_port = free_port();
    let (a, web) = web_pod(&node, host_port).await;
    let st = node
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: a.0.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .status
        .and_then(|s| s.network)
        .expect("network status");
    let ip4: std::net::IpAddr = st.ip.parse().expect("an IPv4 address first");
    assert!(v4.assignable(ip4), "{ip4} is not of {v4}");
    let ips: Vec<String> = st.additional_ips.iter().map(|i| i.ip.clone()).collect();
    assert_eq!(ips.len(), 1, "{ips:?}");
    let ip6: std::net::IpAddr = ips[0].parse().expect("an IPv6 address");
    assert!(v6.assignable(ip6), "{ip6} is not of {v6}");

    // Inside: both addresses on eth0, a default route of each family, both in /etc/hosts.
    let addr = node.exec(&web, &["ip", "addr", "show", "eth0"]).await;
    let text = String::from_utf8_lossy(&addr.stdout);
    assert!(text.contains(&format!("inet {ip4}/24")), "{text}");
    assert!(text.contains(&format!("inet6 {ip6}/64")), "{text}");
    let route = node.exec(&web, &["ip", "-6", "route"]).await;
    let text = String::from_utf8_lossy(&route.stdout);
    assert!(
        text.contains(&format!("default via {}", v6.gateway())),
        "{text}"
    );
    let hosts = node.exec(&web, &["cat", "/etc/hosts"]).await;
    let text = String::from_utf8_lossy(&hosts.stdout);
    assert!(text.contains(&format!("{ip4}\tpod-a")), "{text}");
    assert!(text.contains(&format!("{ip6}\tpod-a")), "{text}");

    // The node reaches the pod at its IPv6 address, and at the node port over both families.
    assert_eq!(
        http_get(SocketAddr::new(ip6, 8080)).await.trim(),
        "hello-from-pod-a"
    );
    let over6 = SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), host_port);
    assert_eq!(http_get(over6).await.trim(), "hello-from-pod-a");
    let over4 = SocketAddr::from(([127, 0, 0, 1], host_port));
    assert_eq!(http_get(over4).await.trim(), "hello-from-pod-a");

    // Another pod reaches it over IPv6.
    let b = node.sandbox("pod-b").await;
    let client = node.container(&b, "client", &["sleep", "300"]).await;
    let got = node
        .exec(
            &client,
            &[
                "timeout",
                "10",
                "wget",
                "-q",
                "-O",
                "-",
                &format!("http://[{ip6}]:8080/"),
            ],
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "hello-from-pod-a",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );

    // Stopping the pods frees the addresses of both families.
    let dir = net.ipam_dir.join(&net.bridge);
    let held = |dir: &Path| {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .parse::<std::net::IpAddr>()
                            .is_ok()
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(held(&dir), 4);
    for id in [&a.0, &b.0] {
        node.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .expect("StopPodSandbox");
    }
    assert_eq!(held(&dir), 0);
    node.teardown().await;
}
