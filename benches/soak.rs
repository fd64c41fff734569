//! The soak: N pod create/delete cycles through the real kubelet (`nodelet run-node`, the
//! built-in runtime, standalone with static pods), several pods alive at once, recording the
//! agent's fds, memory and threads and every kind of leftover as the cycles go.
//!
//! ```sh
//! sudo cargo bench --bench soak                                   # 1000 cycles, 6 alive
//! sudo SOAK_CYCLES=200 SOAK_ALIVE=4 SOAK_SAMPLE_EVERY=20 cargo bench --bench soak
//! ```
//!
//! The node: the `nodelet` binary cargo builds beside the bench, in a temp dir of its own (root
//! dir with busybox imported, static pod dir, pod logs dir), on a bridge and /24 of its own (no
//! masquerade), with `--cri-listen` so the bench reads the pods' state from the agent's own
//! runtime. Each cycle writes one pod's manifest (busybox writing log lines on both streams and
//! into an emptyDir on disk and a tmpfs emptyDir, then sleeping until SIGTERM) and waits until
//! its container runs; while more than `SOAK_ALIVE` pods are alive it deletes the oldest
//! manifest and waits until the runtime reports that pod stopped (the kubelet's garbage
//! collection removes it later). Every `SOAK_SAMPLE_EVERY` cycles it records the agent's open
//! fds, RSS, PSS and threads, and the leftovers (`benches/common/soak.rs`): sandbox and
//! container processes, mounts under the node's dir, the sandboxes' cgroups, pod dirs, sandbox
//! state dirs, container bundles, the runtime's records, rootfs keys in the image store,
//! network namespaces, veths on the bridge, address leases, pod log dirs. At the end all pods are
//! deleted, and it checks that every leftover count returns to its value before the first pod
//! and how the agent's figures compare. Everything is removed at the end, also after a failure.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::loadavg;
use common::soak::{self, Agent, Leftovers, Soak, SoakNode};

/// Per pod: running after its manifest appears, stopped after it goes.
const WAIT: Duration = Duration::from_secs(120);
/// After the last pod: until the runtime lists nothing, then until the leftovers are back.
const DRAIN: Duration = Duration::from_secs(180);
/// The agent's fds after the cycles may exceed their count before by this much.
const FD_SLACK: usize = 8;

struct Opts {
    cycles: usize,
    alive: usize,
    every: usize,
}

fn main() -> ExitCode {
    if !common::bench_run("soak", "the soak runs real containers") {
        return ExitCode::SUCCESS;
    }
    common::run_bench(async {
        ensure!(
            bench(&opts()?).await?,
            "the soak found leftovers or fd growth (above)"
        );
        Ok(())
    })
}

fn opts() -> Result<Opts> {
    let alive = common::env_count("SOAK_ALIVE", 6)?;
    ensure!(alive <= 100, "SOAK_ALIVE: at most 100 (a /24 per run)");
    Ok(Opts {
        cycles: common::env_count("SOAK_CYCLES", 1000)?,
        alive,
        every: common::env_count("SOAK_SAMPLE_EVERY", 50)?,
    })
}

fn nodelet_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nodelet"))
}

/// Sets the node up, soaks it, and removes everything whatever happened. `Ok(false)`: the run
/// finished but something leaked.
async fn bench(opts: &Opts) -> Result<bool> {
    // A short path: sandbox socket paths must fit sun_path.
    let work = tempfile::Builder::new()
        .prefix("nls")
        .tempdir()
        .context("creating the work dir")?;
    let (bridge, cidr) = soak::own_network("nls", 93)?;
    let mut node = SoakNode {
        work: work.path().to_path_buf(),
        root: work.path().join("root"),
        state: work.path().join("run"),
        logs: work.path().join("logs"),
        manifests: work.path().join("manifests"),
        bridge,
        agent_pid: 0,
        cgroup_root: format!("/nl-soak-{}", std::process::id()),
    };
    let mut seen = HashSet::new();
    let mut agent: Option<Child> = None;
    let result = async {
        std::fs::create_dir_all(&node.manifests).context("creating the manifest dir")?;
        import_busybox(&node.root, &node.state, work.path())?;
        let config = work.path().join("config.yaml");
        std::fs::write(&config, soak::kubelet_config(&node, &cidr)).context("writing config")?;
        let socket = work.path().join("cri.sock");
        let log = std::fs::File::create(work.path().join("agent.log")).context("agent log")?;
        let child = Command::new(nodelet_bin())
            .arg("--root-dir")
            .arg(&node.root)
            .arg("--state-dir")
            .arg(&node.state)
            .args(["run-node", "--hostname-override", "soak-node", "--config"])
            .arg(&config)
            .arg("--cri-listen")
            .arg(format!("unix://{}", socket.display()))
            .env(
                "NODELET_LOG",
                std::env::var("NODELET_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting nodelet run-node")?;
        node.agent_pid = child.id();
        agent = Some(child);
        run(&node, &socket, &mut seen, opts).await
    }
    .await;
    if result.is_err() {
        let log = std::fs::read_to_string(work.path().join("agent.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("-- the agent's log, last lines:");
        for l in tail.iter().rev() {
            eprintln!("   {l}");
        }
    }
    // Stop the agent (SIGTERM, then SIGKILL), then remove whatever is left.
    if let Some(mut child) = agent {
        stop(&mut child).await;
    }
    let errors = soak::remove_everything(&node, &nodelet_bin(), &cidr).await;
    for e in &errors {
        eprintln!("cleanup: {e:#}");
    }
    drop(work);
    let ok = result?;
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(ok),
    }
}

async fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for _ in 0..200 {
        if child.try_wait().is_ok_and(|s| s.is_some()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("cleanup: the agent did not stop within 20 s of SIGTERM; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

fn import_busybox(root: &Path, state: &Path, work: &Path) -> Result<()> {
    let archive = work.join("busybox.tar");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(&archive)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `bash {}`", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let out = Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(root)
        .arg("--state-dir")
        .arg(state)
        .args(["images", "import"])
        .arg(&archive)
        .output()
        .context("running nodelet images import")?;
    ensure!(
        out.status.success(),
        "nodelet images import failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

struct Sample {
    cycle: usize,
    alive: usize,
    agent: Agent,
    left: Leftovers,
    secs: f64,
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn header() {
    println!(
        "{:>6} {:>5} {:>5} {:>7} {:>7} {:>4} | {:>4} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5} {:>4} {:>6} {:>5} {:>4} {:>5} {:>4} | {:>7}",
        "cycle",
        "alive",
        "fds",
        "RSS MiB",
        "PSS MiB",
        "thr",
        "sbx",
        "ctr",
        "mnt",
        "cgrp",
        "pods",
        "state",
        "bndl",
        "rec",
        "rootfs",
        "netns",
        "veth",
        "lease",
        "logs",
        "time s"
    );
}

fn row(label: &str, s: &Sample) {
    let l = &s.left;
    println!(
        "{label:>6} {:>5} {:>5} {:>7.1} {:>7.1} {:>4} | {:>4} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5} {:>4} {:>6} {:>5} {:>4} {:>5} {:>4} | {:>7.1}",
        s.alive,
        s.agent.fds,
        mib(s.agent.rss_kb),
        mib(s.agent.pss_kb),
        s.agent.threads,
        l.sandbox_procs,
        l.container_procs,
        l.mounts,
        l.cgroups,
        l.pod_dirs,
        l.state_dirs,
        l.bundles,
        l.records,
        l.rootfs_keys,
        l.netns,
        l.veths,
        l.leases,
        l.log_dirs,
        s.secs
    );
}

/// Connects to the agent's CRI socket, runs the cycles, deletes every pod and compares.
async fn run(
    node: &SoakNode,
    socket: &Path,
    seen: &mut HashSet<String>,
    opts: &Opts,
) -> Result<bool> {
    let endpoint = format!("unix://{}", socket.display());
    let start = Instant::now();
    let rt = loop {
        if socket.exists()
            && let Ok(rt) = runtime::remote::connect(&endpoint, Duration::from_secs(30)).await
        {
            break rt;
        }
        soak::agent(node.agent_pid).context("the agent exited at start")?;
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "the agent's CRI socket did not answer within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Let the agent finish starting (its first relist, housekeeping, the node's figures).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fds_before = soak::fd_kinds(node.agent_pid);
    let baseline = Sample {
        cycle: 0,
        alive: 0,
        agent: soak::agent(node.agent_pid)?,
        left: soak::census(node, seen)?,
        secs: 0.0,
    };
    println!(
        "== soak: {} create/delete cycles through `nodelet run-node` (built-in runtime, standalone, static pods), {} pods alive, a sample every {} cycles",
        opts.cycles, opts.alive, opts.every
    );
    println!(
        "   pod: busybox writing 10 log lines and to an emptyDir and a tmpfs emptyDir, then `sleep 3600` until SIGTERM; pod network (bridge {}); binary {}",
        node.bridge,
        nodelet_bin().display()
    );
    println!("   load average before: {}", loadavg());
    header();
    row("base", &baseline);

    let t0 = Instant::now();
    let mut soak = Soak::new(
        &rt,
        &node.manifests,
        &format!("soak{}", std::process::id()),
        WAIT,
    );
    let mut samples = Vec::new();
    for cycle in 1..=opts.cycles {
        soak.cycle(opts.alive)
            .await
            .with_context(|| format!("cycle {cycle}"))?;
        if cycle % opts.every == 0 || cycle == opts.cycles {
            seen.extend(soak.seen_sandboxes.iter().cloned());
            let s = Sample {
                cycle,
                alive: soak.alive(),
                agent: soak::agent(node.agent_pid)?,
                left: soak::census(node, seen)?,
                secs: t0.elapsed().as_secs_f64(),
            };
            row(&cycle.to_string(), &s);
            samples.push(s);
        }
    }
    let cycles_secs = t0.elapsed().as_secs_f64();

    // Every pod goes; the kubelet's garbage collection removes them; the leftovers must return.
    soak.delete_all().await?;
    seen.extend(soak.seen_sandboxes.iter().cloned());
    let removed = soak::wait_all_removed(&rt, seen, DRAIN).await?;
    let drain = Instant::now();
    let mut left = soak::census(node, seen)?;
    while left != baseline.left && drain.elapsed() < DRAIN {
        tokio::time::sleep(Duration::from_millis(500)).await;
        left = soak::census(node, seen)?;
    }
    // A moment for the agent's connections to the stopped sandboxes to close.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = Sample {
        cycle: opts.cycles,
        alive: 0,
        agent: soak::agent(node.agent_pid)?,
        left: soak::census(node, seen)?,
        secs: t0.elapsed().as_secs_f64(),
    };
    let fds_after = soak::fd_kinds(node.agent_pid);
    row("after", &after);
    println!("   load average after: {}", loadavg());

    // Summary: the first and last samples with the same pods alive, and before/after.
    println!(
        "== summary: {} cycles in {:.0} s ({:.2} s per cycle); every pod removed from the runtime {:.1} s after the last one stopped",
        opts.cycles,
        cycles_secs,
        cycles_secs / opts.cycles as f64,
        removed.as_secs_f64()
    );
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.alive == opts.alive).collect();
    if let (Some(first), Some(last)) = (steady.first(), steady.last())
        && last.cycle > first.cycle
    {
        let per = 1000.0 / (last.cycle - first.cycle) as f64;
        let d = |a: f64, b: f64| (b - a) * per;
        println!(
            "   with {} alive, cycle {} -> {}: fds {} -> {} ({:+.1} per 1000 cycles), RSS {:.1} -> {:.1} MiB ({:+.2} MiB per 1000), PSS {:.1} -> {:.1} MiB ({:+.2} MiB per 1000), threads {} -> {} ({:+.1} per 1000)",
            opts.alive,
            first.cycle,
            last.cycle,
            first.agent.fds,
            last.agent.fds,
            d(first.agent.fds as f64, last.agent.fds as f64),
            mib(first.agent.rss_kb),
            mib(last.agent.rss_kb),
            d(mib(first.agent.rss_kb), mib(last.agent.rss_kb)),
            mib(first.agent.pss_kb),
            mib(last.agent.pss_kb),
            d(mib(first.agent.pss_kb), mib(last.agent.pss_kb)),
            first.agent.threads,
            last.agent.threads,
            d(first.agent.threads as f64, last.agent.threads as f64),
        );
    }
    println!(
        "   no pod, before -> after: fds {} -> {}, RSS {:.1} -> {:.1} MiB, PSS {:.1} -> {:.1} MiB, threads {} -> {}",
        baseline.agent.fds,
        after.agent.fds,
        mib(baseline.agent.rss_kb),
        mib(after.agent.rss_kb),
        mib(baseline.agent.pss_kb),
        mib(after.agent.pss_kb),
        baseline.agent.threads,
        after.agent.threads
    );
    let diffs = after.left.differences(&baseline.left);
    let fds_ok = after.agent.fds <= baseline.agent.fds + FD_SLACK;
    if diffs.is_empty() {
        println!(
            "   leftovers: every kind back to its baseline ({})",
            baseline
                .left
                .kinds()
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        for (kind, was, now) in &diffs {
            println!("   LEAK: {kind}: {was} before the first pod, {now} after the last");
        }
    }
    let changes = soak::fd_changes(&fds_before, &fds_after);
    println!(
        "   agent fds: {} ({} before the cycles, {} after, at most {} allowed); changed: {}",
        if fds_ok { "OK" } else { "GREW" },
        baseline.agent.fds,
        after.agent.fds,
        baseline.agent.fds + FD_SLACK,
        if changes.is_empty() {
            "none".to_string()
        } else {
            changes.join(" ")
        }
    );
    Ok(diffs.is_empty() && fds_ok)
}
