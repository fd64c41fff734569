//! Pod start latency, throughput and memory of the kubelet logic on the built-in runtime,
//! against a private containerd (Debian's `containerd` 1.6 with `runc`).
//!
//! ```sh
//! sudo cargo bench --bench pods                 # N = 1, 10, 100
//! sudo BENCH_PODS=1,10 cargo bench --bench pods
//! sudo BENCH_NETWORK=pod cargo bench --bench pods   # pods on the pod network (needs the CNI plugins)
//! sudo BENCH_STATIC_BIN=$(bash scripts/build-static.sh | tail -n1) cargo bench --bench pods
//! ```
//!
//! With `BENCH_STATIC_BIN` (a static nodelet from scripts/build-static.sh) a third backend,
//! **static**, is the built-in runtime whose sandbox processes are that binary instead of this
//! (dynamic, same release profile) one; the agent part is this process in both. It prints
//! static against dynamic: time to Running, and the sandbox processes' PSS and private dirty
//! memory (PSS favours the dynamic side, whose sandboxes share their binary's pages with this
//! process; private dirty memory is what each sandbox costs whatever it shares).
//!
//! With `BENCH_NETWORK=pod` and Debian's CNI plugins in `/usr/lib/cni`, another backend,
//! **builtin-cni**, is the built-in runtime in CNI mode: the same kind of bridge made through
//! Debian's bridge, host-local and portmap plugins instead of the runtime's own network; it
//! prints CNI against the built-in bridge: time to Running and memory (the agent and the
//! sandboxes; the plugins run only while a pod is set up or torn down).
//!
//! Both backends are driven by the same kubelet logic: `nodelet::kubelet::Syncer` +
//! `nodelet::pod_workers::PodWorkers` + `nodelet::status_manager::StatusManager` (standalone,
//! `StatusManager::new(None)`) over `Arc<dyn RuntimeService>` / `Arc<dyn ImageService>`:
//! - **builtin**: `runtime::builtin::BuiltinRuntime` in a temp root dir with the busybox image
//!   imported; its sandbox processes are this bench binary re-executed (dispatched at the top of
//!   `main`), as the nodelet binary re-executes itself;
//! - **containerd**: `runtime::remote::connect` to a private containerd started with
//!   `tests/common/containerd.rs`, busybox and the busybox-based pause image pulled through CRI
//!   from its local registry before the first round.
//!
//! For each N, N pods (one busybox container `sleep 3600`, hostNetwork on both backends so that
//! neither pays for a pod network — with `BENCH_NETWORK=pod` on the pod network instead: the
//! built-in runtime's bridge against containerd's CNI bridge —, `IfNotPresent`, the image present) are handed to the pod
//! workers at once (for N < 10, 10 / N rounds). Each pod's latency is the time from its
//! `update_pod(Create)` until the status the kubelet computed (read from the `StatusManager`,
//! polled every 2 ms) says phase Running with the container running.
//! It prints the median and p99 (nearest rank) of those, the wall time until all N run (pods per
//! second), for rounds of one pod where its start went (the kubelet logic's CRI calls recorded
//! through the seam's decorator, folded into phases: see `pods/timeline.rs`), the memory with
//! the N pods running, the ratios builtin / containerd, and the time to
//! kill all pods through the workers (grace 0). After each round it checks that nothing is left:
//! no sandbox or container in the runtime, no status, no worker, no sandbox process or shim, no
//! mount.
//!
//! Memory is PSS from `/proc/<pid>/smaps_rollup`: for the built-in runtime, this process (the
//! agent: kubelet logic + runtime) plus every sandbox process; for containerd, containerd plus
//! every shim plus the shims' other children (the pause processes, any runc still running). The
//! containers' own processes (`sleep 3600`) are shown apart and counted on neither side.
//!
//! Needs root, `containerd`, `runc` and `docker-registry`; otherwise prints a SKIP line and exits
//! 0.

#[path = "../tests/common/containerd.rs"]
mod containerd;

mod common;
#[path = "pods/timeline.rs"]
mod timeline;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use common::procs::{self, Group, Kind, Memory, Proc, mib};
use common::{loadavg, median_sorted, remove_cgroup, stats, unmount_under};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use nodelet::kubelet::gc::{GarbageCollector, PodState};
use nodelet::kubelet::pleg::{Pleg, PlegConfig, PlegHealth, RELIST_THRESHOLD};
use nodelet::kubelet::pod_cache::PodCache;
use nodelet::kubelet::{Syncer, SyncerParts};
use nodelet::pod::sync::{ImagePulls, NoEvents};
use nodelet::pod::{Backoff, ContainerOptions, SandboxOptions};
use nodelet::pod_workers::{PodWorkers, Timing, UpdateType};
use nodelet::status_manager::StatusManager;
use runtime::builtin::{BuiltinRuntime, Config};
use runtime::{ImageService, RuntimeService, cri};

use containerd::Containerd;
use timeline::{Breakdown, Timeline};

const BUSYBOX: &str = "docker.io/library/busybox:latest";
const DEFAULT_SIZES: &[usize] = &[1, 10, 100];
/// The app container's command line, as /proc/<pid>/cmdline shows it.
const APP_CMDLINE: &str = "sleep\x003600\x00";
const POLL: Duration = Duration::from_millis(2);

fn main() -> ExitCode {
    if let Some(code) = common::run_sandbox_if_asked() {
        return code;
    }
    if !common::bench_run("pods", "the pods benchmark runs real containers") {
        return ExitCode::SUCCESS;
    }
    let ctd_bin = match containerd::prerequisites() {
        Ok(bin) => bin,
        Err(why) => {
            println!("SKIP ({why}): the pods benchmark");
            return ExitCode::SUCCESS;
        }
    };
    common::init_logging();
    common::run_bench(async { bench(&ctd_bin, &sizes()?).await })
}

fn sizes() -> Result<Vec<usize>> {
    let Ok(s) = std::env::var("BENCH_PODS") else {
        return Ok(DEFAULT_SIZES.to_vec());
    };
    let sizes: Vec<usize> = s
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| anyhow!("BENCH_PODS must be positive integers like 1,10,100, not {s:?}"))?;
    ensure!(!sizes.is_empty(), "BENCH_PODS is empty");
    Ok(sizes)
}

// ---------------------------------------------------------------------------------------------
// Set-up and clean-up.

/// Builds the image, starts both backends, measures, and removes everything it made.
async fn bench(ctd_bin: &Path, sizes: &[usize]) -> Result<()> {
    let work = tempfile::Builder::new()
        .prefix("nodelet-bench-pods-")
        .tempdir()
        .context("creating the work dir")?;
    let busybox = work.path().join("busybox.tar");
    build_busybox(&busybox)?;

    // The built-in runtime (short root path: sandbox socket paths must fit sun_path).
    let root = tempfile::Builder::new()
        .prefix("nlp")
        .tempdir()
        .context("creating the runtime root dir")?;
    let cgroup_root = format!("/nodelet-bench-pods-{}", std::process::id());
    let mut cfg = Config::new(root.path()).context("runtime config")?;
    cfg.cgroup_root = cgroup_root.clone();
    // The state dir inside the root dir: sandbox processes and mounts are told by its path.
    cfg.state_dir = Some(root.path().join("run"));
    let builtin = BuiltinRuntime::new(cfg)
        .await
        .context("opening the built-in runtime")?;
    // The same runtime with the static binary as its sandbox program, in its own root.
    let static_root = tempfile::Builder::new()
        .prefix("nls")
        .tempdir()
        .context("creating the static runtime's root dir")?;
    let static_cgroup_root = format!("/nodelet-bench-pods-static-{}", std::process::id());
    let static_rt = match std::env::var_os("BENCH_STATIC_BIN").filter(|b| !b.is_empty()) {
        None => None,
        Some(bin) => {
            let bin = std::path::PathBuf::from(bin);
            ensure!(
                bin.is_file(),
                "BENCH_STATIC_BIN={} is not a file",
                bin.display()
            );
            let mut cfg = Config::new(static_root.path()).context("runtime config")?;
            cfg.cgroup_root = static_cgroup_root.clone();
            cfg.state_dir = Some(static_root.path().join("run"));
            cfg.sandbox_program = bin;
            Some(
                BuiltinRuntime::new(cfg)
                    .await
                    .context("opening the static built-in runtime")?,
            )
        }
    };

    // The built-in runtime in CNI mode, on Debian's plugins (BENCH_NETWORK=pod).
    let cni_root = tempfile::Builder::new()
        .prefix("nlc")
        .tempdir()
        .context("creating the CNI runtime's root dir")?;
    let cni_cgroup_root = format!("/nodelet-bench-pods-cni-{}", std::process::id());
    let cni_rt = if pod_network() && Path::new(CNI_PLUGINS).join("bridge").exists() {
        let mut cfg = Config::new(cni_root.path()).context("runtime config")?;
        cfg.cgroup_root = cni_cgroup_root.clone();
        cfg.state_dir = Some(cni_root.path().join("run"));
        cfg.network = None;
        cfg.cni = Some(cni_config(cni_root.path())?);
        Some(
            BuiltinRuntime::new(cfg)
                .await
                .context("opening the built-in runtime in CNI mode")?,
        )
    } else {
        None
    };

    // The private containerd; dropping it kills it, its shims and their mounts.
    let ctd = Containerd::start(ctd_bin, &busybox).await;
    ensure!(
        !pod_network() || ctd.has_pod_network(),
        "BENCH_NETWORK=pod needs the CNI plugins for containerd (scripts/setup.sh)"
    );

    let mut extras = Vec::new();
    if let Some(rt) = &static_rt {
        extras.push(("static", rt, static_root.path()));
    }
    if let Some(rt) = &cni_rt {
        extras.push(("builtin-cni", rt, cni_root.path()));
    }
    let result = run(
        &builtin,
        root.path(),
        &extras,
        &ctd,
        &busybox,
        work.path(),
        sizes,
    )
    .await;

    // Clean-up whatever happened: sandboxes left by a failure, mounts, cgroups, containerd.
    let mut cleanup = Vec::new();
    for (rt, dir, cgroup) in [
        (Some(builtin), root.path(), &cgroup_root),
        (static_rt, static_root.path(), &static_cgroup_root),
        (cni_rt, cni_root.path(), &cni_cgroup_root),
    ] {
        let Some(rt) = rt else { continue };
        if let Ok(list) = rt.list_pod_sandbox(Default::default()).await {
            for sb in list.items {
                let id = sb.id;
                let _ = rt
                    .stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await;
                let _ = rt
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                    .await;
            }
        }
        drop(rt);
        if let Err(e) = unmount_under(dir) {
            cleanup.push(e);
        }
        if let Err(e) = remove_cgroup(cgroup) {
            cleanup.push(e);
        }
    }
    drop(ctd);
    let _ = Command::new("ip")
        .args(["link", "del", CNI_BRIDGE])
        .stderr(Stdio::null())
        .status();
    for e in &cleanup {
        eprintln!("cleanup: {e:#}");
    }
    result?;
    match cleanup.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Debian's CNI plugins.
const CNI_PLUGINS: &str = "/usr/lib/cni";
/// The bridge of the CNI backend's network.
const CNI_BRIDGE: &str = "nlbenchcni0";

/// The CNI backend's network under `root`: Debian's bridge with host-local (a /16, room for
/// every pod of a round) and portmap, as the built-in bridge network does it.
fn cni_config(root: &Path) -> Result<runtime::builtin::CniConfig> {
    let conf = root.join("cni-conf");
    std::fs::create_dir_all(&conf).context("creating the CNI conf dir")?;
    let list = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "nl-bench",
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.233.0.0/16"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": root.join("cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    std::fs::write(conf.join("10-bench.conflist"), list.to_string())
        .context("writing the CNI config")?;
    Ok(runtime::builtin::CniConfig {
        conf_dir: conf,
        bin_dirs: vec![CNI_PLUGINS.into()],
        cache_dir: root.join("cni-cache"),
        timeout: Duration::from_secs(60),
    })
}

fn build_busybox(out: &Path) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh");
    let res = Command::new("bash")
        .arg(&script)
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `bash {}`", script.display()))?;
    ensure!(
        res.status.success(),
        "{} failed ({}): {}",
        script.display(),
        res.status,
        String::from_utf8_lossy(&res.stderr).trim()
    );
    Ok(())
}

/// One backend under the kubelet logic.
struct Kubelet {
    name: &'static str,
    rt: Arc<dyn RuntimeService>,
    status: Arc<StatusManager>,
    workers: PodWorkers,
    /// The pods handed to the workers, for the PLEG's changes to reach them.
    pods: Arc<std::sync::Mutex<HashMap<String, Pod>>>,
    /// The kubelet's garbage collector: it removes what killed pods leave.
    gc: GarbageCollector,
    /// Who counts for the memory: see [`Kubelet::memory`].
    kind: Kind,
    /// The kubelet logic's CRI calls, recorded while one pod at a time starts.
    timeline: Arc<Timeline>,
}

impl Kubelet {
    /// Wires the Syncer, the PLEG and its pod cache, the pod workers and the status manager as
    /// `kubelet::Kubelet::start` does.
    async fn new(
        name: &'static str,
        rt: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        work: &Path,
        kind: Kind,
    ) -> Result<Kubelet> {
        let version = rt
            .version(cri::VersionRequest::default())
            .await
            .with_context(|| format!("{name}: Version"))?;
        // Every call of the kubelet logic goes through the seam's decorator, as in the kubelet
        // (which counts them as metrics); here it records them for the one-pod breakdown.
        let timeline = Arc::new(Timeline::default());
        let seam = Arc::new(runtime::Instrumented::new(
            rt.clone(),
            images,
            timeline.clone(),
        ));
        let (rt_seen, images): (Arc<dyn RuntimeService>, Arc<dyn ImageService>) =
            (seam.clone(), seam);
        let dir = work.join(name);
        let opts = ContainerOptions {
            sandbox: SandboxOptions {
                pod_logs_dir: dir.join("pod-logs"),
                seccomp_profile_root: dir.join("seccomp"),
                ..Default::default()
            },
            pods_dir: dir.join("pods"),
            node_name: "bench-node".into(),
            ..Default::default()
        };
        let status = StatusManager::new(None);
        // No pod of the bench asks for a user namespace.
        let userns = nodelet::kubelet::userns::UsernsManager::new(
            &opts.pods_dir,
            nodelet::kubelet::userns::DEFAULT_RANGE,
        )?;
        let cache = Arc::new(PodCache::new());
        let (changed_tx, mut changed_rx) = tokio::sync::mpsc::unbounded_channel();
        let (refresh_tx, refresh_rx) = tokio::sync::mpsc::unbounded_channel();
        let pleg = Pleg {
            rt: rt_seen.clone(),
            cache: cache.clone(),
            health: Arc::new(PlegHealth::new(RELIST_THRESHOLD)),
            changed: changed_tx,
            refresh: refresh_rx,
            config: PlegConfig::default(),
        };
        // Runs until the bench process ends.
        tokio::spawn(pleg.run(tokio_util::sync::CancellationToken::new()));
        let gc = GarbageCollector::new(
            rt_seen.clone(),
            opts.pods_dir.clone(),
            opts.sandbox.pod_logs_dir.clone(),
        );
        let syncer = Arc::new(Syncer::new(
            nodelet::kubelet::Runtime {
                runtime: rt_seen.clone(),
                images,
            },
            SyncerParts {
                opts,
                runtime_name: version.runtime_name,
                backoff: Backoff::default(),
                pulls: ImagePulls::default(),
                status: status.clone(),
                // Never checked: the bench's runtimes have their network ready (or use the
                // node's).
                runtime_state: Arc::new(nodelet::node::RuntimeState::default()),
                userns: Arc::new(userns),
                cache,
                refresh: refresh_tx,
                events: Arc::new(NoEvents),
                // The bench's pods have no probes: no worker ever starts.
                probes: Arc::new(nodelet::prober::ProbeManager::new(
                    Arc::new(nodelet::prober::RuntimeProber::new(rt_seen)),
                    status.clone(),
                    Arc::new(NoEvents),
                    tokio::sync::mpsc::unbounded_channel().0,
                    tokio_util::sync::CancellationToken::new(),
                )),
                // The runtime places the pods under the bench's cgroup root, as before.
                cm: Arc::new(nodelet::cm::ContainerManager::disabled()),
                // Kept in memory: the bench's pods are never resized.
                allocations: Arc::new(nodelet::kubelet::allocation::Allocations::open(None)),
            },
        ));
        let workers = PodWorkers::new(syncer, Timing::default());
        let pods: Arc<std::sync::Mutex<HashMap<String, Pod>>> = Arc::default();
        // The sync loop's part: a pod the PLEG saw change is synced.
        let (w, known) = (workers.clone(), pods.clone());
        tokio::spawn(async move {
            while let Some(uid) = changed_rx.recv().await {
                // Under the lock, so that a pod taken out (and killed) is never synced again
                // after its kill: that would start it anew.
                let known = known.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(p) = known.get(&uid) {
                    w.update_pod(p.clone(), UpdateType::Sync, None);
                }
            }
        });
        Ok(Kubelet {
            name,
            rt,
            status,
            workers,
            pods,
            gc,
            kind,
            timeline,
        })
    }
}

async fn run(
    builtin: &BuiltinRuntime,
    root: &Path,
    extras: &[(&'static str, &BuiltinRuntime, &Path)],
    ctd: &Containerd,
    busybox: &Path,
    work: &Path,
    sizes: &[usize],
) -> Result<()> {
    builtin
        .image_store()
        .import(busybox)
        .context("importing busybox into the built-in runtime")?;
    let remote = Arc::new(
        runtime::remote::connect(&ctd.endpoint(), Duration::from_secs(120))
            .await
            .map_err(|e| anyhow!("connecting to containerd: {e}\n{}", ctd.log()))?,
    );
    ctd.pull_all(remote.as_ref()).await;
    let b = Arc::new(builtin.clone());
    let mut kubelets = vec![
        Kubelet::new(
            "builtin",
            b.clone(),
            b,
            work,
            Kind::Builtin {
                root: root.to_string_lossy().into_owned(),
            },
        )
        .await?,
    ];
    for &(name, rt, dir) in extras {
        rt.image_store()
            .import(busybox)
            .with_context(|| format!("importing busybox into the {name} runtime"))?;
        let s = Arc::new(rt.clone());
        kubelets.push(
            Kubelet::new(
                name,
                s.clone(),
                s,
                work,
                Kind::Builtin {
                    root: dir.to_string_lossy().into_owned(),
                },
            )
            .await?,
        );
    }
    kubelets.push(
        Kubelet::new(
            "containerd",
            remote.clone(),
            remote,
            work,
            Kind::Containerd {
                pid: ctd.pid(),
                dir: ctd.dir().to_string_lossy().into_owned(),
            },
        )
        .await?,
    );
    // Where containerd's and the static backend's results are.
    let c_at = kubelets.len() - 1;
    let at = |name: &str| kubelets.iter().position(|k| k.name == name);
    let (static_at, cni_at) = (at("static"), at("builtin-cni"));
    let mut static_summary = Vec::new();
    let mut cni_summary = Vec::new();

    println!("== pods through the kubelet logic (Syncer + PodWorkers + StatusManager)");
    println!(
        "   pod: busybox `sleep 3600`, {}, IfNotPresent (present); {} CPUs; load {}",
        if pod_network() {
            "pod network"
        } else {
            "hostNetwork"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let idle: Vec<Memory> = kubelets.iter().map(memory).collect::<Result<_>>()?;
    println!("-- memory with no pod");
    for (k, m) in kubelets.iter().zip(&idle) {
        m.print(k.name);
    }
    let mut summary = Vec::new();
    for &n in sizes {
        let rounds = (10 / n).max(1);
        println!(
            "-- N = {n} pod(s) at once, {rounds} round(s) per backend; load before {}",
            loadavg()
        );
        let mut results = Vec::new();
        for k in &kubelets {
            let mut r = Results::default();
            for round in 0..rounds {
                eprintln!("[{}] N={n} round {}/{rounds}", k.name, round + 1);
                let last = round + 1 == rounds;
                one_round(k, n, round, last, &mut r)
                    .await
                    .with_context(|| format!("{} N={n} round {round}", k.name))?;
            }
            r.print(k.name, n);
            results.push(r);
        }
        if let Some(at) = static_at {
            let (d, st) = (&results[0], &results[at]);
            let (dl, sl) = (stats(&d.latencies), stats(&st.latencies));
            let sandboxes = |r: &Results| {
                r.memory.as_ref().map_or((0, 0), |m| {
                    (
                        m.others.get("sandboxes").map_or(0, |(_, kb)| *kb),
                        m.others_dirty.get("sandboxes").copied().unwrap_or(0),
                    )
                })
            };
            let ((dp, dd), (sp, sd)) = (sandboxes(d), sandboxes(st));
            println!(
                "   ratio static/dynamic: latency median {:.2}, p99 {:.2}; sandboxes' PSS {:.1} / {:.1} MiB ({:.2}), private dirty {:.1} / {:.1} MiB ({:.2})",
                sl.median / dl.median,
                sl.p99 / dl.p99,
                mib(sp),
                mib(dp),
                sp as f64 / dp.max(1) as f64,
                mib(sd),
                mib(dd),
                sd as f64 / dd.max(1) as f64
            );
            static_summary.push((n, dl, sl, dp, sp, dd, sd));
        }
        if let Some(at) = cni_at {
            let (b, c) = (&results[0], &results[at]);
            let (bl, cl) = (stats(&b.latencies), stats(&c.latencies));
            let total = |r: &Results| r.memory.as_ref().map_or(0, |m| m.total());
            let (bm, cm) = (total(b), total(c));
            println!(
                "   ratio builtin-cni/builtin (CNI plugins against the built-in bridge): latency median {:.2}, p99 {:.2}; pods/s {:.2}x; memory {:.2}",
                cl.median / bl.median,
                cl.p99 / bl.p99,
                median_f(&c.rates) / median_f(&b.rates),
                cm as f64 / bm.max(1) as f64
            );
            cni_summary.push((n, bl, cl, median_f(&b.rates), median_f(&c.rates), bm, cm));
        }
        let (b, c) = (&results[0], &results[c_at]);
        let (bl, cl) = (stats(&b.latencies), stats(&c.latencies));
        let (bm, cm) = (b.memory.as_ref(), c.memory.as_ref());
        let (bm, cm) = (bm.map_or(0, |m| m.total()), cm.map_or(0, |m| m.total()));
        println!(
            "   ratio builtin/containerd: latency median {:.2}, p99 {:.2}; pods/s {:.2}x containerd's; memory {:.2}",
            bl.median / cl.median,
            bl.p99 / cl.p99,
            median_f(&b.rates) / median_f(&c.rates),
            bm as f64 / cm as f64
        );
        println!("   load after {}", loadavg());
        summary.push((n, bl, cl, median_f(&b.rates), median_f(&c.rates), bm, cm));
    }
    println!("-- a container's exit -> the pod status showing it (one pod at a time, 20 samples)");
    let mut exits = Vec::new();
    for k in &kubelets {
        let lags = exit_latencies(k, 20)
            .await
            .with_context(|| format!("{}: exit latencies", k.name))?;
        let s = stats(&lags);
        println!(
            "   {:<11} exit -> status: median {:>7.1} ms  p99 {:>7.1} ms  min {:>7.1} ms  (n={})",
            k.name, s.median, s.p99, s.min, s.n
        );
        exits.push(s);
    }
    println!(
        "   ratio builtin/containerd: exit -> status median {:.3}, p99 {:.3}",
        exits[0].median / exits[c_at].median,
        exits[0].p99 / exits[c_at].p99
    );
    println!(
        "== summary (latency hand-off -> Running, ms; memory PSS MiB with the N pods running)"
    );
    println!(
        "{:>4} | {:>22} | {:>22} | {:>17} | {:>19} | ratio median / pods/s / memory",
        "N", "builtin median / p99", "containerd median/p99", "pods/s b / c", "memory b / c"
    );
    for (n, bl, cl, br, cr, bm, cm) in summary {
        println!(
            "{n:>4} | {:>9.1} / {:>10.1} | {:>9.1} / {:>10.1} | {br:>7.1} / {cr:>7.1} | {:>8.1} / {:>8.1} | {:.2} / {:.2} / {:.2}",
            bl.median,
            bl.p99,
            cl.median,
            cl.p99,
            mib(bm),
            mib(cm),
            bl.median / cl.median,
            br / cr,
            bm as f64 / cm as f64
        );
    }
    if !cni_summary.is_empty() {
        println!(
            "== CNI mode (Debian's bridge, host-local, portmap) against the built-in bridge network"
        );
        println!(
            "{:>4} | {:>22} | {:>22} | {:>17} | {:>19} | ratio median / pods/s / memory",
            "N", "bridge median / p99", "CNI median / p99", "pods/s b / cni", "memory b / cni"
        );
        for (n, bl, cl, br, cr, bm, cm) in cni_summary {
            println!(
                "{n:>4} | {:>9.1} / {:>10.1} | {:>9.1} / {:>10.1} | {br:>7.1} / {cr:>7.1} | {:>8.1} / {:>8.1} | {:.2} / {:.2} / {:.2}",
                bl.median,
                bl.p99,
                cl.median,
                cl.p99,
                mib(bm),
                mib(cm),
                cl.median / bl.median,
                cr / br,
                cm as f64 / bm.max(1) as f64
            );
        }
    }
    if !static_summary.is_empty() {
        println!(
            "== static binary against the dynamic one (sandbox processes; MiB with the N pods running)"
        );
        println!(
            "{:>4} | {:>22} | {:>22} | {:>17} | {:>19} | ratio median / PSS / dirty",
            "N", "dynamic median / p99", "static median / p99", "PSS d / s", "private dirty d / s"
        );
        for (n, dl, sl, dp, sp, dd, sd) in static_summary {
            println!(
                "{n:>4} | {:>9.1} / {:>10.1} | {:>9.1} / {:>10.1} | {:>7.1} / {:>7.1} | {:>8.1} / {:>8.1} | {:.2} / {:.2} / {:.2}",
                dl.median,
                dl.p99,
                sl.median,
                sl.p99,
                mib(dp),
                mib(sp),
                mib(dd),
                mib(sd),
                sl.median / dl.median,
                sp as f64 / dp.max(1) as f64,
                sd as f64 / dd.max(1) as f64
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// One round: start N pods, wait for Running, measure memory, kill them all, check for leftovers.

#[derive(Default)]
struct Results {
    latencies: Vec<Duration>,
    /// Pods per second of each round (N / time until all ran).
    rates: Vec<f64>,
    kills: Vec<Duration>,
    memory: Option<Memory>,
    /// Where each pod's start went, for rounds of one pod.
    breakdowns: Vec<Breakdown>,
}

impl Results {
    fn print(&self, name: &str, n: usize) {
        let s = stats(&self.latencies);
        println!(
            "   {name:<11} hand-off -> Running: median {:>7.1} ms  p99 {:>7.1} ms  min {:>7.1} ms  (n={})",
            s.median, s.p99, s.min, s.n
        );
        println!(
            "   {:<11} all {n} running: {:.1} pods/s (median of rounds); kill all {n} through the workers: {:.0} ms",
            "",
            median_f(&self.rates),
            stats(&self.kills).median
        );
        timeline::print(&self.breakdowns);
        if let Some(m) = &self.memory {
            m.print(name);
        }
    }
}

fn bench_pod(backend: &str, n: usize, round: usize, i: usize) -> Result<Pod> {
    let name = format!("bench-{n}-{round}-{i}");
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": format!("{backend}-{name}-{}", std::process::id()),
        },
        "spec": {
            "hostNetwork": !pod_network(),
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    });
    serde_json::from_value(pod).context("building the pod")
}

/// Whether the pods go on the pod network (`BENCH_NETWORK=pod`) instead of the node's.
fn pod_network() -> bool {
    std::env::var("BENCH_NETWORK").is_ok_and(|v| v == "pod")
}

fn running(status: &PodStatus) -> bool {
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.as_ref().is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

fn describe(status: Option<PodStatus>) -> String {
    match status {
        None => "no status".into(),
        Some(s) => {
            let waiting: Vec<String> = s
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.state.and_then(|s| s.waiting))
                .map(|w| format!("{:?}: {:?}", w.reason, w.message))
                .collect();
            format!("phase {:?} {waiting:?}", s.phase)
        }
    }
}

async fn one_round(k: &Kubelet, n: usize, round: usize, last: bool, r: &mut Results) -> Result<()> {
    let pods: Vec<Pod> = (0..n)
        .map(|i| bench_pod(k.name, n, round, i))
        .collect::<Result<_>>()?;
    let uids: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap_or_default())
        .collect();

    // Start: hand every pod to the workers, then watch the status manager.
    if n == 1 {
        k.timeline.begin();
    }
    let start = Instant::now();
    let mut pending: HashMap<String, Instant> = HashMap::new();
    for p in &pods {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        pending.insert(uid.clone(), Instant::now());
        k.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid, p.clone());
        k.workers.update_pod(p.clone(), UpdateType::Create, None);
    }
    let timeout = Duration::from_secs(300 + 3 * n as u64);
    while !pending.is_empty() {
        let now = Instant::now();
        pending.retain(|uid, handed| {
            let up = k.status.status(uid).is_some_and(|s| running(&s));
            if up {
                r.latencies.push(now - *handed);
                if n == 1 {
                    r.breakdowns.extend(k.timeline.end(*handed, now));
                }
            }
            !up
        });
        if pending.is_empty() {
            break;
        }
        if start.elapsed() > timeout {
            let uid = pending.keys().next().cloned().unwrap_or_default();
            bail!(
                "{} of {n} pods not running after {timeout:?}; {uid}: {}",
                pending.len(),
                describe(k.status.status(&uid))
            );
        }
        tokio::time::sleep(POLL).await;
    }
    r.rates.push(n as f64 / start.elapsed().as_secs_f64());

    if last {
        r.memory = Some(memory(k)?);
    }

    // Kill every pod through the workers, wait until the kubelet forgot them.
    let kill = Instant::now();
    for p in pods {
        // No source wants it any more: the PLEG's changes no longer sync it.
        kill_pod(k, p);
    }
    loop {
        let left = uids.iter().filter(|u| k.status.status(u).is_some()).count();
        if left == 0 {
            break;
        }
        if kill.elapsed() > timeout {
            bail!("{left} of {n} pods not cleaned up after {timeout:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    // What the killed pods left (their stopped containers and sandboxes) goes with the
    // garbage collection, as the kubelet's housekeeping runs it once no source wants them.
    collect_gone(k, &uids).await?;
    r.kills.push(kill.elapsed());
    check_nothing_left(k, &uids).await
}

/// Takes `pod` out of the pods the bench hands on (the sync loop's merger in the kubelet) and
/// kills it, under the lock the PLEG's changes are handed on with.
fn kill_pod(k: &Kubelet, pod: Pod) {
    let mut known = k.pods.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(uid) = pod.metadata.uid.as_deref() {
        known.remove(uid);
    }
    k.workers
        .update_pod(pod, UpdateType::Kill, Some(Duration::ZERO));
}

/// Forgets the terminated workers and collects everything of `uids` (pods nobody wants).
async fn collect_gone(k: &Kubelet, uids: &[String]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        k.workers.forget_terminated(&[]);
        let known = k.workers.known();
        let state = |uid: &str| {
            if known.iter().any(|k| k == uid) {
                PodState::Active
            } else {
                PodState::Gone
            }
        };
        let report = k.gc.collect(&state).await;
        ensure!(
            report.errors.is_empty(),
            "garbage collection: {:?}",
            report.errors
        );
        let left =
            k.rt.list_pod_sandbox(Default::default())
                .await
                .context("ListPodSandbox")?
                .items
                .into_iter()
                .filter(|s| {
                    s.labels
                        .get("io.kubernetes.pod.uid")
                        .is_some_and(|u| uids.contains(u))
                })
                .count();
        if left == 0 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{left} sandboxes not collected");
        tokio::time::sleep(POLL).await;
    }
}

/// How soon the pod status shows a container's exit: one pod at a time, its container exiting
/// by itself after a moment; the time from the exit (the runtime's `finished_at`) until the
/// status the kubelet computed has the container terminated.
async fn exit_latencies(k: &Kubelet, samples: usize) -> Result<Vec<Duration>> {
    let mut out = Vec::new();
    for i in 0..samples {
        let name = format!("exit-{i}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "bench",
                "uid": format!("{}-{name}-{}", k.name, std::process::id()),
            },
            "spec": {
                "hostNetwork": !pod_network(),
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "exit",
                    "image": BUSYBOX,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "sleep 0.3; exit 3"],
                }],
            },
        }))
        .context("building the pod")?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        k.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.clone(), pod.clone());
        k.workers.update_pod(pod.clone(), UpdateType::Create, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        let finished = loop {
            let seen = k.status.status(&uid).and_then(|s| {
                let c = s.container_statuses?.into_iter().next()?;
                c.state?.terminated?.finished_at
            });
            if let Some(t) = seen {
                break t;
            }
            ensure!(
                Instant::now() < deadline,
                "{}: the exit of {name} never showed: {}",
                k.name,
                describe(k.status.status(&uid))
            );
            tokio::time::sleep(Duration::from_micros(500)).await;
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let lag = now.duration_since(finished.0);
        out.push(Duration::try_from(lag).unwrap_or_default());
        kill_pod(k, pod);
        let gone = Instant::now() + Duration::from_secs(60);
        while k.status.status(&uid).is_some() {
            ensure!(Instant::now() < gone, "{}: {name} not cleaned up", k.name);
            tokio::time::sleep(POLL).await;
        }
        collect_gone(k, std::slice::from_ref(&uid)).await?;
    }
    Ok(out)
}

/// No sandbox, container, status or worker; no sandbox process or shim; no mount.
async fn check_nothing_left(k: &Kubelet, uids: &[String]) -> Result<()> {
    let sandboxes =
        k.rt.list_pod_sandbox(Default::default())
            .await
            .context("ListPodSandbox")?
            .items;
    ensure!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    let containers =
        k.rt.list_containers(Default::default())
            .await
            .context("ListContainers")?
            .containers;
    ensure!(containers.is_empty(), "containers left: {containers:?}");
    let statuses = k.status.statuses();
    ensure!(statuses.is_empty(), "statuses left: {:?}", statuses.keys());
    // The worker of a pod returns right after its last step; give the last ones a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        k.workers.forget_terminated(&[]);
        let known = k.workers.known();
        let procs = group_processes(k)?;
        // Only the agent (builtin) or containerd itself (containerd) may remain.
        let extra: Vec<&Proc> = procs.group.iter().skip(1).chain(&procs.apps).collect();
        let mounts = mounts_under(k)?;
        if known.is_empty() && extra.is_empty() && mounts.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let extra: Vec<String> = extra
                .iter()
                .map(|p| format!("{} {}", p.pid, p.cmdline))
                .collect();
            bail!(
                "left after removing {} pods: workers {known:?}, processes {extra:?}, mounts {mounts:?}",
                uids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn mounts_under(k: &Kubelet) -> Result<Vec<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let dir = match &k.kind {
        Kind::Builtin { root } => root,
        Kind::Containerd { dir, .. } => dir,
    };
    Ok(info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(dir.as_str()))
        .map(String::from)
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Processes and memory.

/// The processes of a backend; the containers' processes are `sleep 3600`.
fn group_processes(k: &Kubelet) -> Result<Group> {
    procs::group_processes(&k.kind, |cmdline| cmdline == APP_CMDLINE)
}

fn memory(k: &Kubelet) -> Result<Memory> {
    Ok(procs::memory(&k.kind, &group_processes(k)?))
}

// ---------------------------------------------------------------------------------------------
// Statistics and helpers.

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    median_sorted(&v)
}
