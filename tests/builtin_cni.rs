//! The built-in runtime in CNI mode (`nodelet cri serve --network cni`), with Debian's
//! `containernetworking-plugins` (bridge, host-local, portmap): a pod's address comes from
//! host-local, its hostPort goes through portmap, pods reach each other and the node, and a
//! removed pod's DEL frees its address; until a config loads (and while a CNI 1.1 plugin's
//! STATUS fails) the network is not ready and only hostNetwork pods run; a plugin that hangs
//! hits its deadline and leaves nothing, and what an agent killed in the middle of an ADD
//! leaked is deleted by the GC at its next start.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use common::cni::{TestNet, plugins_or_skip};
use common::cri_serve::CriNode;
use common::*;
use runtime::remote::RemoteRuntime;
use runtime::{RuntimeService, cri};

async fn network_ready(rt: &RemoteRuntime) -> cri::RuntimeCondition {
    rt.status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .status
        .expect("a status")
        .conditions
        .into_iter()
        .find(|c| c.r#type == "NetworkReady")
        .expect("a NetworkReady condition")
}

async fn wait_network_ready(rt: &RemoteRuntime, want: bool, what: &str) -> cri::RuntimeCondition {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = network_ready(rt).await;
        if c.status == want {
            return c;
        }
        assert!(Instant::now() < deadline, "{what}: {c:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pod(cri: &CriNode, name: &str) -> cri::PodSandboxConfig {
    sandbox_config(name, cri.logs.path())
}

async fn run_pod(rt: &RemoteRuntime, config: cri::PodSandboxConfig) -> Result<String, String> {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .await
    .map(|r| r.pod_sandbox_id)
    .map_err(|e| e.to_string())
}

async fn start_container(
    rt: &RemoteRuntime,
    sandbox: &str,
    config: &cri::PodSandboxConfig,
    name: &str,
    cmd: &[&str],
) -> String {
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(container_config(name, cmd)),
            sandbox_config: Some(config.clone()),
        })
        .await
        .expect("CreateContainer")
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("StartContainer");
    id
}

async fn exec(rt: &RemoteRuntime, id: &str, cmd: &[&str]) -> (i32, String) {
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 20,
        })
        .await
        .expect("ExecSync");
    let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&r.stderr));
    (r.exit_code, out)
}

async fn sandbox_ips(rt: &RemoteRuntime, id: &str) -> (String, Vec<String>) {
    let net = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .status
        .and_then(|s| s.network)
        .unwrap_or_default();
    (
        net.ip,
        net.additional_ips.into_iter().map(|i| i.ip).collect(),
    )
}

async fn remove_pod(rt: &RemoteRuntime, id: &str) {
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .expect("StopPodSandbox");
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .expect("RemovePodSandbox");
}

fn host_network(c: &mut cri::PodSandboxConfig) {
    c.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
}

const WEB: &str = "mkdir -p /tmp/w && echo hello-from-$(hostname) > /tmp/w/index.html && \
                   exec httpd -f -p 8080 -h /tmp/w";

/// Answers one HTTP request on `listener` with `body`, in a thread.
fn answer_once(listener: TcpListener, body: &'static str) -> std::thread::JoinHandle<SocketAddr> {
    std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        peer
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_join_the_cni_network_through_debians_plugins() {
    let test = "pods_join_the_cni_network_through_debians_plugins";
    if !root_or_skip(test) {
        return;
    }
    if !plugins_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnie0", [10, 231, 7]);
    net.write_conf(
        "10-e2e.conflist",
        &net.conflist(
            "nl-e2e",
            "1.0.0",
            &[serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})],
        ),
    );
    // A later file is not the network: the first by name is.
    net.write_conf(
        "20-other.conf",
        r#"{"cniVersion":"1.0.0","name":"other","type":"bridge"}"#,
    );
    let node = CriNode::new("cni");
    let args = net.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = node.serve("serve.log", &args).await;
    let rt = node.connect().await;
    let ready = wait_network_ready(&rt, true, "the network with a config").await;
    assert!(ready.status, "{ready:?}");

    // Pod A serves HTTP on a hostPort.
    let host_port = free_port();
    let mut a_cfg = pod(&node, "cni-a");
    a_cfg.port_mappings = vec![cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: i32::from(host_port),
        host_ip: String::new(),
    }];
    // A sysctl of the interface the ADD makes: set after it.
    a_cfg.linux = Some(cri::LinuxPodSandboxConfig {
        sysctls: [
            (
                "net.ipv4.conf.eth0.accept_local".to_string(),
                "1".to_string(),
            ),
            (
                "net.ipv4.ip_unprivileged_port_start".to_string(),
                "80".to_string(),
            ),
        ]
        .into(),
        ..Default::default()
    });
    let a = run_pod(&rt, a_cfg.clone()).await.expect("RunPodSandbox a");
    let web = start_container(&rt, &a, &a_cfg, "web", &["sh", "-c", WEB]).await;
    let (ip_a, more) = sandbox_ips(&rt, &a).await;
    assert!(more.is_empty(), "{more:?}");
    let prefix = format!("{}.{}.{}.", net.prefix[0], net.prefix[1], net.prefix[2]);
    assert!(ip_a.starts_with(&prefix), "pod IP {ip_a:?} from host-local");
    assert_eq!(net.leases("nl-e2e"), vec![ip_a.clone()]);
    assert_eq!(
        net.cached(),
        vec![format!("nl-e2e-{a}-eth0")],
        "libcni's cache entry"
    );
    let (_, addr) = exec(&rt, &web, &["ip", "-4", "addr", "show", "eth0"]).await;
    assert!(addr.contains(&format!("inet {ip_a}/24")), "{addr}");
    let (_, sysctls) = exec(
        &rt,
        &web,
        &[
            "cat",
            "/proc/sys/net/ipv4/conf/eth0/accept_local",
            "/proc/sys/net/ipv4/ip_unprivileged_port_start",
        ],
    )
    .await;
    assert_eq!(sysctls.split_whitespace().collect::<Vec<_>>(), ["1", "80"]);
    let (_, route) = exec(&rt, &web, &["ip", "route"]).await;
    assert!(
        route.contains(&format!("default via {}", net.gateway())),
        "{route}"
    );

    // The node reaches it at its address and through portmap's hostPort.
    let ip: Ipv4Addr = ip_a.parse().unwrap();
    assert_eq!(
        http_get(SocketAddr::new(ip.into(), 8080)).await.trim(),
        "hello-from-cni-a"
    );
    let via_host_port = SocketAddr::new(net.gateway().into(), host_port);
    assert_eq!(http_get(via_host_port).await.trim(), "hello-from-cni-a");

    // Pod B reaches pod A, and the node.
    let b_cfg = pod(&node, "cni-b");
    let b = run_pod(&rt, b_cfg.clone()).await.expect("RunPodSandbox b");
    let client = start_container(&rt, &b, &b_cfg, "client", &["sleep", "300"]).await;
    let (ip_b, _) = sandbox_ips(&rt, &b).await;
    assert_ne!(ip_a, ip_b);
    let (code, out) = exec(
        &rt,
        &client,
        &["wget", "-q", "-O", "-", &format!("http://{ip_a}:8080/")],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "hello-from-cni-a"));
    let listener = TcpListener::bind((net.gateway(), 0)).expect("a listener on the bridge");
    let port = listener.local_addr().unwrap().port();
    let answered = answer_once(listener, "hello-from-the-node");
    let (code, out) = exec(
        &rt,
        &client,
        &[
            "wget",
            "-q",
            "-O",
            "-",
            &format!("http://{}:{port}/", net.gateway()),
        ],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "hello-from-the-node"));
    let peer = answered.join().expect("the node's answer");
    assert_eq!(
        peer.ip().to_string(),
        ip_b,
        "the pod's own address, not masqueraded"
    );

    // A sysctl that cannot be set after the ADD fails the pod, and its address goes back.
    let mut bad = pod(&node, "cni-bad-sysctl");
    bad.linux = Some(cri::LinuxPodSandboxConfig {
        sysctls: [("net.ipv4.conf.eth9.forwarding".to_string(), "1".to_string())].into(),
        ..Default::default()
    });
    let err = run_pod(&rt, bad).await.unwrap_err();
    assert!(err.contains("net.ipv4.conf.eth9.forwarding"), "{err}");
    let mut both = vec![ip_a.clone(), ip_b.clone()];
    both.sort();
    assert_eq!(
        net.leases("nl-e2e"),
        both,
        "the failed pod's address was freed"
    );

    // A hostNetwork pod runs beside them, with no attachment.
    let mut h_cfg = pod(&node, "cni-host");
    host_network(&mut h_cfg);
    let h = run_pod(&rt, h_cfg).await.expect("a hostNetwork pod");
    assert_eq!(net.cached().len(), 2);

    // Removing pod A DELs it: host-local's address and libcni's entry go, portmap's rules too.
    remove_pod(&rt, &a).await;
    assert_eq!(net.leases("nl-e2e"), vec![ip_b.clone()]);
    assert_eq!(net.cached(), vec![format!("nl-e2e-{b}-eth0")]);
    let nat = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .expect("iptables-save");
    let nat = String::from_utf8_lossy(&nat.stdout);
    assert!(
        !nat.contains(&format!("dport {host_port}")),
        "portmap's rule for {host_port} is left:\n{nat}"
    );

    // Pod B survives a restart of the agent with its attachment, then goes too.
    drop(rt);
    server.terminate().await;
    let server = node.serve("serve-2.log", &args).await;
    let rt = node.connect().await;
    let (code, _) = exec(&rt, &client, &["true"]).await;
    assert_eq!(code, 0);
    assert_eq!(sandbox_ips(&rt, &b).await.0, ip_b);
    assert_eq!(
        net.cached(),
        vec![format!("nl-e2e-{b}-eth0")],
        "kept by the GC"
    );
    remove_pod(&rt, &b).await;
    remove_pod(&rt, &h).await;
    assert!(net.leases("nl-e2e").is_empty());
    assert!(net.cached().is_empty());
    drop(rt);
    server.terminate().await;
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_a_config_loads_and_its_plugins_status_answers() {
    let test = "not_ready_until_a_config_loads_and_its_plugins_status_answers";
    if !root_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnis0", [10, 231, 8]);
    let node = CriNode::new("cnistatus");
    let args = net.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = node.serve("serve.log", &args).await;
    let rt = node.connect().await;

    // No config: upstream's message; pods with a network are refused, hostNetwork ones run.
    let c = network_ready(&rt).await;
    assert!(!c.status);
    assert_eq!(c.reason, "NetworkPluginNotReady");
    assert_eq!(
        c.message,
        "Network plugin returns error: cni plugin not initialized"
    );
    let err = run_pod(&rt, pod(&node, "early")).await.unwrap_err();
    assert!(
        err.contains("the pod network is not ready") && err.contains("cni plugin not initialized"),
        "{err}"
    );
    let mut h_cfg = pod(&node, "host");
    host_network(&mut h_cfg);
    let h = run_pod(&rt, h_cfg).await.expect("a hostNetwork pod");

    // A broken file is no config: named in the refusal, still not ready.
    net.write_conf(
        "05-broken.conflist",
        "{\"cniVersion\": \"1.0.0\", \"plugins\": [",
    );
    let err = run_pod(&rt, pod(&node, "broken")).await.unwrap_err();
    assert!(err.contains("05-broken.conflist"), "{err}");
    assert!(!network_ready(&rt).await.status);

    // A CNI 1.1 plugin whose STATUS says it is not available yet.
    net.script(
        "nlstatus",
        &format!(
            "case \"$CNI_COMMAND\" in\n\
             VERSION) echo '{{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.0.0\",\"1.1.0\"]}}' ;;\n\
             STATUS) cat >/dev/null; if [ -e {ok} ]; then exit 0; fi\n\
               echo '{{\"cniVersion\":\"1.1.0\",\"code\":50,\"msg\":\"waiting for the test\"}}'; exit 1 ;;\n\
             *) cat >/dev/null; echo '{{\"cniVersion\":\"1.1.0\",\"code\":4,\"msg\":\"not for pods\"}}'; exit 1 ;;\n\
             esac",
            ok = net.path("ok").display()
        ),
    );
    net.write_conf(
        "10-status.conflist",
        r#"{"cniVersion":"1.1.0","name":"nl-status","plugins":[{"type":"nlstatus"}]}"#,
    );
    let c = wait_network_ready(&rt, false, "STATUS failing").await;
    assert!(c.message.contains("waiting for the test"), "{c:?}");
    std::fs::write(net.path("ok"), b"").unwrap();
    wait_network_ready(&rt, true, "STATUS answering").await;

    remove_pod(&rt, &h).await;
    drop(rt);
    server.terminate().await;
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_plugin_hits_its_deadline_and_a_killed_agent_leaks_no_address() {
    let test = "a_hanging_plugin_hits_its_deadline_and_a_killed_agent_leaks_no_address";
    if !root_or_skip(test) {
        return;
    }
    if !plugins_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnih0", [10, 231, 9]);
    // After the bridge (which takes an address), a plugin whose ADD hangs until the test
    // releases it; its DEL answers at once.
    net.script(
        "nlhang",
        &format!(
            "case \"$CNI_COMMAND\" in\n\
             VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}}' ;;\n\
             ADD) cat >/dev/null; touch {started}; while [ ! -e {release} ]; do sleep 0.1; done; exit 1 ;;\n\
             *) cat >/dev/null ;;\n\
             esac",
            started = net.path("started").display(),
            release = net.path("release").display()
        ),
    );
    net.write_conf(
        "10-hang.conflist",
        &net.conflist("nl-hang", "1.0.0", &[serde_json::json!({"type": "nlhang"})]),
    );
    let node = CriNode::new("cnihang");
    let mut args = net.args();
    args.extend(["--cni-plugin-timeout".to_string(), "2".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = node.serve("serve.log", &args).await;
    let rt = node.connect().await;

    // The deadline: the ADD fails naming the plugin, and is undone whole.
    let started = Instant::now();
    let err = run_pod(&rt, pod(&node, "hang")).await.unwrap_err();
    assert!(err.contains("nlhang"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    assert!(
        net.leases("nl-hang").is_empty(),
        "the DEL freed the address"
    );
    assert!(net.cached().is_empty(), "{:?}", net.cached());
    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .items;
    assert!(listed.is_empty(), "{listed:?}");

    // The agent killed in the middle of an ADD: the bridge's address stays taken, and the
    // cache entry written before the ADD names it.
    let _ = std::fs::remove_file(net.path("started"));
    let rt2 = node.connect().await;
    let cfg = pod(&node, "killed");
    let pending = tokio::spawn(async move { run_pod(&rt2, cfg).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !net.path("started").exists() {
        assert!(Instant::now() < deadline, "the hanging plugin never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(server);
    let _ = pending.await;
    assert_eq!(net.leases("nl-hang").len(), 1, "the address the ADD took");
    assert_eq!(net.cached().len(), 1, "{:?}", net.cached());
    std::fs::write(net.path("release"), b"").unwrap();

    // The next agent's GC deletes it.
    drop(rt);
    let server = node.serve("serve-2.log", &args).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(net.leases("nl-hang").is_empty() && net.cached().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "leases {:?}, cache {:?}\n{}",
            net.leases("nl-hang"),
            net.cached(),
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.terminate().await;
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegating_plugin_as_flannels_finds_its_delegate_on_the_cni_path() {
    let test = "a_delegating_plugin_as_flannels_finds_its_delegate_on_the_cni_path";
    if !root_or_skip(test) || !plugins_or_skip(test) {
        return;
    }
    let net = TestNet::new("nlcnif0", [10, 231, 11]);
    // flannel's shape: the config names the plugin and a delegate; the plugin reads the node's
    // subnet (flannel's subnet.env) and hands a bridge config to the bridge plugin it finds
    // on CNI_PATH, for every command.
    std::fs::write(
        net.path("subnet.env"),
        "FLANNEL_SUBNET=10.231.11.0/24\nFLANNEL_MTU=1450\n",
    )
    .unwrap();
    net.script(
        "nlflannel",
        &format!(
            "input=$(cat)\n\
             . {env}\n\
             if [ \"$CNI_COMMAND\" = VERSION ]; then\n\
               echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.1\",\"0.4.0\",\"1.0.0\"]}}'; exit 0\n\
             fi\n\
             for d in $(echo \"$CNI_PATH\" | tr ':' ' '); do\n\
               if [ -x \"$d/bridge\" ]; then delegate=\"$d/bridge\"; break; fi\n\
             done\n\
             printf '{{\"cniVersion\":\"1.0.0\",\"name\":\"nl-flannel\",\"type\":\"bridge\",\"bridge\":\"{bridge}\",\"mtu\":%s,\"isGateway\":true,\"ipam\":{{\"type\":\"host-local\",\"subnet\":\"%s\",\"dataDir\":\"{data}\"}}}}' \"$FLANNEL_MTU\" \"$FLANNEL_SUBNET\" | \"$delegate\"",
            env = net.path("subnet.env").display(),
            bridge = net.bridge,
            data = net.path("host-local").display(),
        ),
    );
    net.write_conf(
        "10-flannel.conflist",
        r#"{"cniVersion":"1.0.0","name":"nl-flannel","plugins":[
            {"type":"nlflannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},
            {"type":"portmap","capabilities":{"portMappings":true}}]}"#,
    );
    let node = CriNode::new("cniflannel");
    let args = net.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = node.serve("serve.log", &args).await;
    let rt = node.connect().await;
    wait_network_ready(&rt, true, "the flannel-shaped network").await;
    let cfg = pod(&node, "flannel");
    let id = run_pod(&rt, cfg.clone()).await.expect("RunPodSandbox");
    let c = start_container(&rt, &id, &cfg, "main", &["sleep", "300"]).await;
    let (ip, _) = sandbox_ips(&rt, &id).await;
    assert!(
        ip.starts_with("10.231.11."),
        "pod IP {ip:?} from the delegate"
    );
    let (_, link) = exec(&rt, &c, &["ip", "link", "show", "eth0"]).await;
    assert!(link.contains("mtu 1450"), "the delegate's MTU: {link}");
    assert_eq!(net.leases("nl-flannel"), vec![ip.clone()]);
    remove_pod(&rt, &id).await;
    assert!(net.leases("nl-flannel").is_empty(), "the delegate's DEL");
    drop(rt);
    server.terminate().await;
    node.assert_all_gone();
}
