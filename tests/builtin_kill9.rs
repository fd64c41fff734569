//! The agent killed with SIGKILL at random points while pods are created and removed, round
//! after round (`NODELET_KILL_ROUNDS`, 100 by default; `NODELET_KILL_SEED` replays a run). After
//! each restart of `nodelet cri serve`:
//! - every pod whose creation had completed (and whose removal was not started) is listed,
//!   ready, with its container running: adopted;
//! - every pod whose removal had completed is gone;
//! - a pod caught half-way is whatever the runtime lists, and it can be removed;
//! - nothing exists that the runtime does not list: each sandbox process, mount, address lease
//!   and veth belongs to a listed sandbox or container.
//!
//! At the end everything is removed and nothing is left: no mount, cgroup, process, network
//! namespace, veth, address or node port of the pods.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::cri_serve::CriNode;
use common::*;
use runtime::builtin::{NetworkConfig, parse_pod_cidr};
use runtime::remote::RemoteRuntime;
use runtime::{RuntimeService, cri};

/// xorshift64*: enough to spread delays and choices, and replayable from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// A pod the test made: its sandbox and container.
#[derive(Debug, Clone)]
struct Pod {
    name: String,
    sandbox: String,
    container: String,
}

/// Removes the node side of the test's network (bridge, masquerade rules, the lease dir).
struct Network(NetworkConfig);

impl Drop for Network {
    fn drop(&mut self) {
        let _ = runtime::builtin::remove_node_network(&self.0);
        let _ = std::fs::remove_dir_all(self.0.ipam_dir.join(&self.0.bridge));
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The node ports the test's pods forward (a proxy process each, in the sandbox).
fn port_range() -> std::ops::Range<u16> {
    let base = 21000 + (std::process::id() % 100) as u16 * 100;
    base..base + 100
}

async fn create(
    rt: &RemoteRuntime,
    log_dir: &Path,
    name: &str,
    host_port: u16,
) -> runtime::Result<Pod> {
    let mut cfg = sandbox_config(name, log_dir);
    cfg.port_mappings = vec![cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: host_port as i32,
        host_ip: "127.0.0.1".into(),
    }];
    let sandbox = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .pod_sandbox_id;
    let container = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(container_config("app", &["sleep", "3600"])),
            sandbox_config: Some(cfg),
        })
        .await?
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: container.clone(),
    })
    .await?;
    Ok(Pod {
        name: name.to_string(),
        sandbox,
        container,
    })
}

async fn remove(rt: &RemoteRuntime, sandbox: &str) -> runtime::Result<()> {
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.to_string(),
    })
    .await?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox.to_string(),
    })
    .await?;
    Ok(())
}

/// What the runtime lists: sandboxes (id → (name, ready)) and containers (id → (sandbox,
/// running)).
struct Listed {
    sandboxes: BTreeMap<String, (String, bool)>,
    containers: BTreeMap<String, (String, bool)>,
}

async fn listed(rt: &RemoteRuntime) -> Listed {
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .items
        .into_iter()
        .map(|s| {
            let name = s.metadata.map(|m| m.name).unwrap_or_default();
            let ready = s.state == cri::PodSandboxState::SandboxReady as i32;
            (s.id, (name, ready))
        })
        .collect();
    let containers = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .containers
        .into_iter()
        .map(|c| {
            let running = c.state == cri::ContainerState::ContainerRunning as i32;
            (c.id, (c.pod_sandbox_id, running))
        })
        .collect();
    Listed {
        sandboxes,
        containers,
    }
}

/// The sandbox ids of the sandbox processes serving state dirs of the runtime on `root`.
fn sandbox_processes(root: &Path) -> BTreeSet<String> {
    let dir = format!("{}/sandboxes/", common::state_dir(root).display());
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        for arg in cmdline.split(|b| *b == 0) {
            let arg = String::from_utf8_lossy(arg);
            if let Some(rest) = arg.strip_prefix(&dir) {
                ids.insert(rest.split('/').next().unwrap_or_default().to_string());
            }
        }
    }
    ids
}

/// Mount points under `root` or the runtime's state dir.
fn runtime_mounts(root: &Path) -> Vec<String> {
    let mut found = mounts_under(root);
    found.extend(mounts_under(&common::state_dir(root)));
    found
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

fn count_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| keep(&e.file_name().to_string_lossy()))
                .count()
        })
        .unwrap_or(0)
}

/// Nothing exists that the runtime does not list. A network namespace goes some time after
/// its last process (the kernel cleans it up in the background), its veth with it: the count
/// of veths is given that time.
async fn assert_consistent(
    round: usize,
    node: &CriNode,
    net: &NetworkConfig,
    l: &Listed,
    log: &str,
) {
    let ready: BTreeSet<String> = l
        .sandboxes
        .iter()
        .filter(|(_, (_, r))| *r)
        .map(|(id, _)| id.clone())
        .collect();
    // Every ready sandbox has its process; a sandbox that is not ready may still have one for
    // a while (its shutdown, asked by the agent that died, under way); nothing else does.
    let procs = sandbox_processes(node.root.path());
    assert!(
        ready.is_subset(&procs) && procs.iter().all(|id| l.sandboxes.contains_key(id)),
        "round {round}: sandbox processes {procs:?} against listed sandboxes {:?}\n{log}",
        l.sandboxes
    );
    for m in runtime_mounts(node.root.path()) {
        assert!(
            l.sandboxes.keys().any(|id| m.contains(id.as_str()))
                || l.containers.keys().any(|id| m.contains(id.as_str())),
            "round {round}: mount {m} belongs to nothing listed"
        );
    }
    // Each ready sandbox holds an address, and only listed ones hold any.
    let owners: Vec<String> = std::fs::read_dir(net.ipam_dir.join(&net.bridge))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .parse::<std::net::Ipv4Addr>()
                        .is_ok()
                })
                .map(|e| {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    text.lines().next().unwrap_or_default().to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    for owner in &owners {
        assert!(
            l.sandboxes.contains_key(owner),
            "round {round}: an address held by {owner:?}, which is not listed"
        );
    }
    for id in &ready {
        assert!(
            owners.contains(id),
            "round {round}: ready sandbox {id} has no address"
        );
    }
    // A veth lives as long as its pod's network namespace, which lives as long as a process of
    // the sandbox does.
    let brif = Path::new("/sys/class/net").join(&net.bridge).join("brif");
    let veths_match = || count_dir(&brif, |_| true) == sandbox_processes(node.root.path()).len();
    settle(veths_match).await;
    assert!(
        veths_match(),
        "round {round}: {} veths on the bridge, {:?} sandbox processes",
        count_dir(&brif, |_| true),
        sandbox_processes(node.root.path())
    );
    for (id, (sandbox, running)) in &l.containers {
        assert!(
            l.sandboxes.contains_key(sandbox),
            "round {round}: container {id} of an unlisted sandbox"
        );
        if *running {
            assert!(
                ready.contains(sandbox),
                "round {round}: container {id} runs in a sandbox that is not ready"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_leaves_every_pod_whole_or_gone() {
    if !root_or_skip("sigkill_at_random_points_leaves_every_pod_whole_or_gone") {
        return;
    }
    let rounds = env_u64("NODELET_KILL_ROUNDS").unwrap_or(100) as usize;
    let seed = env_u64("NODELET_KILL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1
    });
    eprintln!("kill -9 rounds: {rounds}, NODELET_KILL_SEED={seed}");
    let mut rng = Rng(seed);
    let node = CriNode::new("kill9");
    let n = std::process::id() % 250 + 1;
    let net = NetworkConfig {
        bridge: format!("nlk{}", std::process::id() % 100_000),
        pod_cidrs: vec![parse_pod_cidr(&format!("10.91.{n}.0/24")).expect("cidr")],
        ipam_dir: "/run/nodelet/ipam".into(),
        masquerade: true,
        cluster_cidrs: Vec::new(),
    };
    let _network = Network(net.clone());
    let cidr = net.pod_cidrs[0].to_string();
    let args = ["--pod-bridge", &net.bridge, "--pod-cidr", &cidr];
    let log_dir = node.root.path().join("logs");

    // Pods known whole (created, no removal started), and pods known gone.
    let mut whole: Vec<Pod> = Vec::new();
    let mut gone: Vec<Pod> = Vec::new();
    for round in 0..=rounds {
        let mut server = node.serve(&format!("round-{round}.log"), &args).await;
        // The socket is bound before the runtime adopts what the last server left; a first
        // connection in that window may fail: try again while the server runs (for 30 s).
        let started = std::time::Instant::now();
        let rt = loop {
            match runtime::remote::connect(&node.endpoint, Duration::from_secs(30)).await {
                Ok(rt) => break rt,
                Err(e) => {
                    let state = server.state();
                    if state != "still running" || started.elapsed() > Duration::from_secs(30) {
                        panic!(
                            "round {round}: connecting: {e}\nthe server: {state}\n{}",
                            server.log()
                        );
                    }
                    eprintln!("round {round}: connecting failed, again: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let l = listed(&rt).await;
        for pod in &whole {
            assert_eq!(
                l.sandboxes.get(&pod.sandbox),
                Some(&(pod.name.clone(), true)),
                "round {round}: {pod:?} was whole before the kill\n{}",
                server.log()
            );
            assert_eq!(
                l.containers.get(&pod.container),
                Some(&(pod.sandbox.clone(), true)),
                "round {round}: {pod:?}'s container was running before the kill\n{}",
                server.log()
            );
        }
        for pod in &gone {
            assert!(
                !l.sandboxes.contains_key(&pod.sandbox)
                    && !l.containers.contains_key(&pod.container),
                "round {round}: {pod:?} was removed before the kill"
            );
        }
        assert_consistent(round, &node, &net, &l, &server.log()).await;
        // What a kill caught half-way is removed, as a kubelet would remove a pod it does not
        // know; that must work.
        let known: BTreeSet<&str> = whole.iter().map(|p| p.sandbox.as_str()).collect();
        for id in l.sandboxes.keys().filter(|id| !known.contains(id.as_str())) {
            remove(&rt, id)
                .await
                .unwrap_or_else(|e| panic!("round {round}: removing caught sandbox {id}: {e}"));
        }
        if round == rounds {
            let l = listed(&rt).await;
            assert_consistent(round, &node, &net, &l, &server.log()).await;
            for pod in std::mem::take(&mut whole) {
                remove(&rt, &pod.sandbox).await.expect("final removal");
            }
            let l = listed(&rt).await;
            assert!(l.sandboxes.is_empty() && l.containers.is_empty());
            assert_consistent(round, &node, &net, &l, &server.log()).await;
            server.terminate().await;
            break;
        }

        // A burst of changes, and a SIGKILL somewhere in it.
        let mut tasks = Vec::new();
        for i in 0..=rng.below(2) {
            let rt = rt.clone();
            let (log_dir, name) = (log_dir.clone(), format!("kill-{round}-{i}"));
            let ports = port_range();
            let port = ports.start + ((round * 3 + i as usize) % ports.len()) as u16;
            tasks.push(tokio::spawn(async move {
                (None, create(&rt, &log_dir, &name, port).await.map(Some))
            }));
        }
        for _ in 0..rng.below(3) {
            if whole.is_empty() {
                break;
            }
            let pod = whole.remove(rng.below(whole.len() as u64) as usize);
            let rt = rt.clone();
            tasks.push(tokio::spawn(async move {
                let result = remove(&rt, &pod.sandbox).await.map(|()| None);
                (Some(pod), result)
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(600))).await;
        drop(server);
        for task in tasks {
            let (removing, result) = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a request hung after the kill"))
                .expect("task");
            match (removing, result) {
                (None, Ok(Some(pod))) => whole.push(pod),
                (Some(pod), Ok(None)) => gone.push(pod),
                // Caught by the kill: whatever is listed of it is removed next round.
                _ => {}
            }
        }
    }
    drop(_network);
    node.assert_all_gone();
    for port in port_range() {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "node port {port} is still held"
        );
    }

    let veth_left = std::fs::read_dir("/sys/class/net")
        .expect("sys/class/net")
        .flatten()
        .any(|e| e.file_name().to_string_lossy() == net.bridge);
    assert!(!veth_left, "the bridge is left");
}
