//! Pods through the whole node, as a user sees them: the real binary (`nodelet run-node`)
//! registered with the project's test API server, N pods created back to back through the API,
//! each pod's time from its create to `status.phase: Running` as a watch sees it; the built-in
//! runtime against a private containerd (Debian's `containerd` 1.6 with `runc`, the same agent
//! binary driving it over CRI) in one run.
//!
//! ```sh
//! sudo cargo bench --bench api_pods                        # 20 pods, 3 rounds
//! sudo BENCH_API_PODS=50 BENCH_API_ROUNDS=1 cargo bench --bench api_pods
//! ```
//!
//! For each runtime: the test API server (plain HTTP on loopback) and a node from
//! `tests/common/api_node.rs` (its own root dir, cgroup root, kubelet config; the built-in
//! runtime on a bridge and /24 of the bench's own, containerd on its CNI bridge, or both with
//! `hostNetwork` when Debian's CNI plugins are missing); the agent is started and the bench
//! waits for the Node to be Ready. One pod is run and deleted first (each runtime's first pod
//! pays for caches the others do not). Then each round: a watch on the namespace's pods, N pods
//! (one busybox container `sleep 3600`, `imagePullPolicy: Never`, grace period 0) created one
//! after the other, each create's start time kept; a pod's latency is from that instant to the
//! first watch event with phase Running. Printed per round: the median, p90 and maximum of
//! the N latencies and the time until all N run; then the pods are deleted and the bench waits
//! until the API has none and the runtime lists no sandbox.
//!
//! `BENCH_API_RUNTIMES=builtin` (or `containerd`) runs one side only (for a profile). With
//! `BENCH_API_LOG_DIR` set, each agent's log (`NODELET_LOG` applies) is copied there as
//! `api_pods-<runtime>.log`.
//!
//! Last the ratio of the built-in runtime's median (of all rounds' latencies) to containerd's,
//! against issue 27's aim (at most 0.1), with the load average and the machine.
//!
//! Needs root, `containerd`, `runc` and `docker-registry`; otherwise prints a SKIP line and
//! exits 0.

#[path = "../tests/apiserver/mod.rs"]
mod apiserver;

mod common;

#[path = "../tests/common/mod.rs"]
mod node_common;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use apiserver::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use node_common::api_node::{ApiNode, Backend, NS, Setup, busybox};

const NODE: &str = "api-pods-bench";

const SETUP: Setup = Setup {
    name: NODE,
    config: "podCIDR: 10.94.7.0/24\nnodeletPodBridge: nlapib0\n",
    cri_listen: false,
};

fn main() -> ExitCode {
    if !common::bench_run(
        "api_pods",
        "benches/api_pods.rs: pods created through the API server until Running, built-in runtime vs containerd",
    ) {
        return ExitCode::SUCCESS;
    }
    common::init_logging();
    common::run_bench(bench())
}

async fn bench() -> Result<()> {
    let n = common::env_count("BENCH_API_PODS", 20)?;
    let rounds = common::env_count("BENCH_API_ROUNDS", 3)?;
    if node_common::containerd::prerequisites().is_err() {
        println!("SKIP (needs containerd, runc and docker-registry): benches/api_pods.rs");
        return Ok(());
    }
    println!(
        "== {n} pods created back to back through the API server, {rounds} rounds; machine: {}; load {}",
        machine(),
        common::loadavg()
    );
    // BENCH_API_RUNTIMES=builtin (or containerd) runs one side only, for profiling.
    let only = std::env::var("BENCH_API_RUNTIMES").unwrap_or_default();
    let mut medians = HashMap::new();
    for backend in [Backend::Builtin, Backend::Containerd] {
        if !only.is_empty() && !only.split(',').any(|o| o == label(backend)) {
            continue;
        }
        let name = label(backend);
        println!("-- {name} (load {})", common::loadavg());
        let all = run_backend(backend, n, rounds)
            .await
            .with_context(|| format!("the {name} node"))?;
        let s = common::stats(&all);
        println!(
            "   {name:<10}  all rounds: median {:.1} ms  p90 {:.1} ms  max {:.1} ms over {} pods",
            s.median,
            s.p90,
            all.iter().max().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
            s.n
        );
        medians.insert(name, s.median);
    }
    let (Some(&b), Some(&c)) = (medians.get("builtin"), medians.get("containerd")) else {
        return Ok(());
    };
    let ratio = b / c;
    println!(
        "== summary, builtin / containerd (load {})",
        common::loadavg()
    );
    println!("   create -> Running, median   {b:8.1} ms / {c:8.1} ms   ratio {ratio:.3}");
    println!(
        "   aim: at most 0.1 of containerd's median: {} (ratio {ratio:.3})",
        if ratio <= 0.1 {
            "HOLDS"
        } else {
            "DOES NOT HOLD"
        }
    );
    Ok(())
}

fn label(backend: Backend) -> &'static str {
    match backend {
        Backend::Builtin => "builtin",
        Backend::Containerd => "containerd",
    }
}

/// The CPU model and count, as /proc/cpuinfo gives them.
fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?", |(_, m)| m.trim())
        .to_string();
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count();
    format!("{cpus} x {model}")
}

/// One runtime's node: started, warmed up, then `rounds` rounds of `n` pods. Returns every
/// pod's latency.
async fn run_backend(backend: Backend, n: usize, rounds: usize) -> Result<Vec<Duration>> {
    let api = ApiServer::start().await;
    let Some(node) =
        ApiNode::prepare(&SETUP, backend, "api_pods", |d| api.write_kubeconfig(d)).await
    else {
        bail!("this machine cannot run the node (see the SKIP line)");
    };
    let agent = node.start();
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_node_ready(&client, node.has_pod_network()).await?;

    let warm = Instant::now();
    run_round(&node, &pods, "warm", 1).await?;
    println!(
        "   {:<10}  first pod (not counted): {:.1} ms to Running and back",
        label(backend),
        warm.elapsed().as_secs_f64() * 1e3
    );
    let mut all = Vec::new();
    for r in 0..rounds {
        let (lat, wall) = run_round(&node, &pods, &format!("r{r}"), n).await?;
        let s = common::stats(&lat);
        println!(
            "   {:<10}  round {}: median {:.1} ms  p90 {:.1} ms  max {:.1} ms; all {n} Running {:.1} ms after the first create (load {})",
            label(backend),
            r + 1,
            s.median,
            s.p90,
            lat.iter().max().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
            wall.as_secs_f64() * 1e3,
            common::loadavg()
        );
        all.extend(lat);
    }
    drop(agent);
    if backend == Backend::Builtin {
        // The node's bridge and masquerade table outlive its agent, as on a real node.
        let bridge = runtime::builtin::NetworkConfig {
            bridge: "nlapib0".into(),
            ..Default::default()
        };
        runtime::builtin::remove_node_network(&bridge)
            .map_err(|e| anyhow::anyhow!("removing bridge nlapib0: {e}"))?;
    }
    if let Some(dir) = std::env::var_os("BENCH_API_LOG_DIR") {
        let to = std::path::Path::new(&dir).join(format!("api_pods-{}.log", label(backend)));
        std::fs::copy(node.root.with_extension("log"), &to)
            .with_context(|| format!("copying the agent's log to {}", to.display()))?;
    }
    Ok(all)
}

/// Waits until the Node is registered and Ready (when pods have a network of their own; on a
/// containerd without CNI it stays NotReady for the network, and hostNetwork pods still run).
async fn wait_node_ready(client: &kube::Client, want_ready: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(n)) = nodes.get_opt(NODE).await {
            let ready = n
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready || !want_ready {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the Node {NODE} was not Ready within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates `n` pods `<tag>-<i>` back to back, waits until each is Running (as the watch sees
/// it), deletes them and waits until they are gone from the API and from the runtime. Returns
/// each pod's create → Running time and the time from the first create until all ran.
async fn run_round(
    node: &ApiNode,
    pods: &Api<Pod>,
    tag: &str,
    n: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let running: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen = running.clone();
    // When the watch first saw each pod, and first saw a status the kubelet wrote (startTime).
    let marks: Arc<Mutex<HashMap<String, Marks>>> = Arc::default();
    let marked = marks.clone();
    let prefix = format!("{tag}-");
    let mut stream = watcher(pods.clone(), watcher::Config::default()).boxed();
    // The watch is established (its initial list done) before the first create.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            let pod = match ev {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                _ => continue,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if !name.starts_with(&prefix) {
                continue;
            }
            let started = pod.status.as_ref().is_some_and(|s| s.start_time.is_some());
            let mark = *lock(&marked).entry(name.clone()).or_insert((now, None));
            if started && mark.1.is_none() {
                lock(&marked).insert(name.clone(), (mark.0, Some(now)));
            }
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Running") {
                lock(&seen).entry(name).or_insert(now);
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .context("the pods watch did not start within 30 s")?
        .context("the pods watch ended")?;

    let first = Instant::now();
    let mut created = HashMap::new();
    for i in 0..n {
        let name = format!("{tag}-{i}");
        let pod = node.pod(
            &name,
            &format!(
                "  terminationGracePeriodSeconds: 0\n  containers:\n{}",
                busybox("c", "exec sleep 3600")
            ),
        );
        let at = Instant::now();
        pods.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {name}"))?;
        created.insert(name, at);
    }
    let deadline = Instant::now() + Duration::from_secs(60 + 3 * n as u64);
    while lock(&running).len() < n {
        if Instant::now() > deadline {
            let not: Vec<&String> = created
                .keys()
                .filter(|k| !lock(&running).contains_key(*k))
                .collect();
            bail!("pods not Running in time: {not:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watch.abort();
    let running = lock(&running).clone();
    let mut lat = Vec::with_capacity(n);
    let mut last = first;
    let (mut to_watch, mut to_kubelet) = (Vec::new(), Vec::new());
    let marks = lock(&marks).clone();
    for (name, at) in &created {
        let r = running[name];
        last = last.max(r);
        lat.push(r.saturating_duration_since(*at));
        if let Some((w, k)) = marks.get(name) {
            to_watch.push(w.saturating_duration_since(*at));
            if let Some(k) = k {
                to_kubelet.push(k.saturating_duration_since(*at));
            }
        }
    }
    if n > 1 {
        println!(
            "   {:<10}  spans (median from each create): the watch sees the pod {:.1} ms, the kubelet's first status (startTime) {:.1} ms, Running {:.1} ms",
            "",
            common::stats(&to_watch).median,
            common::stats(&to_kubelet).median,
            common::stats(&lat).median
        );
    }

    for name in created.keys() {
        pods.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting pod {name}"))?;
    }
    let gone = Instant::now() + Duration::from_secs(120);
    loop {
        let left = pods.list(&ListParams::default()).await?.items.len();
        let sandboxes = node
            .runtime()
            .await
            .list_pod_sandbox(Default::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if left == 0 && sandboxes == 0 {
            break;
        }
        if Instant::now() > gone {
            bail!(
                "{left} pods in the API and {sandboxes} sandboxes left 120 s after deleting them"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((lat, last - first))
}

/// When the watch first saw a pod, and first saw it with a status the kubelet wrote.
type Marks = (Instant, Option<Instant>);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
