//! A short soak of the real kubelet (`nodelet run-node`, built-in runtime, standalone): 40 pod
//! create/delete cycles with 4 pods alive, then every pod deleted. Afterwards nothing of the pods
//! may be left (processes, mounts, cgroups, pod dirs, sandbox state dirs, bundles, the
//! runtime's records, rootfs keys, network namespaces, veths, address leases, log dirs) and the
//! agent's open fds must be back within a few of their count before the first pod. The long
//! version, with the agent's memory over 1000 cycles, is `cargo bench --bench soak`; both use
//! `benches/common/soak.rs`.

#[path = "../benches/common/mod.rs"]
mod bench_common;
mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bench_common::soak::{self, Leftovers, Soak, SoakNode};
use common::*;

const CYCLES: usize = 40;
const ALIVE: usize = 4;
/// The agent's fds after the cycles may exceed their count before by at most this.
const FD_SLACK: usize = 8;

#[tokio::test(flavor = "multi_thread")]
async fn soak_cycles_leave_nothing_behind() {
    if !root_or_skip("soak_cycles_leave_nothing_behind") {
        return;
    }
    let (bridge, cidr) = soak::own_network("nlk", 94).expect("a bridge and /24 of our own");
    let node = standalone::Standalone::new(&format!(
        "podCIDR: {cidr}\nnodeletPodBridge: {bridge}\nnodeletPodMasquerade: false\n"
    ));
    let socket = node.dir.path().join("cri.sock");
    let endpoint = format!("unix://{}", socket.display());
    let agent = node.start_with(&["--cri-listen", &endpoint]);
    let snode = SoakNode {
        work: node.dir.path().to_path_buf(),
        root: node.root.clone(),
        state: common::state_dir(&node.root),
        logs: node.logs.clone(),
        manifests: node.manifests.clone(),
        bridge,
        agent_pid: agent.0.id(),
        cgroup_root: node.cgroup_root.clone(),
    };
    let mut seen = HashSet::new();
    let result = soak(&snode, &endpoint, &socket, &mut seen).await;
    // Whatever happened: the agent stops, and what it may have left goes.
    drop(agent);
    let errors = soak::remove_everything(&snode, &nodelet_bin(), &cidr).await;
    if let Err(e) = result {
        panic!("{e:#}");
    }
    assert!(
        errors.is_empty(),
        "the clean-up found something: {errors:?}"
    );
    node.assert_all_gone().await;
}

async fn soak(
    node: &SoakNode,
    endpoint: &str,
    socket: &Path,
    seen: &mut HashSet<String>,
) -> Result<()> {
    let start = Instant::now();
    let rt = loop {
        if socket.exists()
            && let Ok(rt) = runtime::remote::connect(endpoint, Duration::from_secs(30)).await
        {
            break rt;
        }
        soak::agent(node.agent_pid).context("the agent exited at start")?;
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "the agent's CRI socket did not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = soak::agent(node.agent_pid)?;
    let base = soak::census(node, seen)?;
    ensure!(
        base == Leftovers::default(),
        "a fresh node holds something: {base:?}"
    );

    let mut soak = Soak::new(&rt, &node.manifests, "soak", Duration::from_secs(60));
    for cycle in 1..=CYCLES {
        soak.cycle(ALIVE)
            .await
            .with_context(|| format!("cycle {cycle}"))?;
    }
    let during = soak::census(node, seen)?;
    ensure!(
        during.sandbox_procs >= ALIVE && during.veths >= ALIVE && during.leases == ALIVE,
        "the census does not see the pods alive: {during:?}"
    );
    soak.delete_all().await?;
    seen.extend(soak.seen_sandboxes.iter().cloned());
    ensure!(
        seen.len() >= CYCLES,
        "only {} sandboxes seen for {CYCLES} pods",
        seen.len()
    );
    soak::wait_all_removed(&rt, seen, Duration::from_secs(60)).await?;

    // Killed processes and closing connections take a moment: wait (30 s at most) until
    // everything is back, then compare.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = soak::census(node, seen)?;
        let agent = soak::agent(node.agent_pid)?;
        let fds_ok = agent.fds <= before.fds + FD_SLACK;
        if left == base && fds_ok {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {CYCLES} cycles and every pod deleted: leftovers {:?} (kind, before, after); the agent's fds {} -> {} (at most +{FD_SLACK})",
            left.differences(&base),
            before.fds,
            agent.fds
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
