//! A node of the built-in runtime under benchmark: the busybox image, a pod network of the
//! run's own, and removing pods and checking that nothing is left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use runtime::builtin::NetworkConfig;
use runtime::{RuntimeService, cri};

use super::procs::{self, Kind};

pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
const POLL: Duration = Duration::from_millis(100);

/// Builds the project's busybox image (an OCI archive) at `out`.
pub fn build_busybox(out: &Path) -> Result<()> {
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

/// A bridge `<prefix><pid>` and a /24 of 10.91.0.0/16 no address of this machine is in, so
/// that nothing else's pod network is touched. No masquerade: nothing leaves the node.
pub fn own_network(root: &Path, prefix: &str) -> Result<NetworkConfig> {
    let addrs = Command::new("ip")
        .args(["-o", "-4", "addr"])
        .output()
        .context("running ip -o -4 addr")?;
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    let first = std::process::id() % 250;
    let n = (0..250)
        .map(|k| (first + k) % 250 + 1)
        .find(|n| !addrs.contains(&format!(" 10.91.{n}.")))
        .ok_or_else(|| anyhow!("no free /24 in 10.91.0.0/16"))?;
    Ok(NetworkConfig {
        bridge: format!("{prefix}{}", std::process::id() % 1_000_000),
        pod_cidrs: vec![runtime::builtin::parse_pod_cidr(&format!(
            "10.91.{n}.0/24"
        ))?],
        ipam_dir: root.join("ipam"),
        masquerade: false,
        cluster_cidrs: Vec::new(),
    })
}

/// Stops and removes every sandbox of `rt` (what a failure left).
pub async fn remove_all_sandboxes(rt: &dyn RuntimeService) {
    let Ok(list) = rt.list_pod_sandbox(Default::default()).await else {
        return;
    };
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

/// Deletes the manifests and waits until the runtime lists no sandbox of the pods (the kubelet
/// kills them, its housekeeping removes them); how long that took.
pub async fn remove_pods(
    rt: &dyn RuntimeService,
    manifests: &Path,
    uids: &[String],
) -> Result<Duration> {
    let start = Instant::now();
    let files: Vec<PathBuf> = std::fs::read_dir(manifests)
        .with_context(|| format!("listing {}", manifests.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    for f in files {
        std::fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
    }
    let timeout = Duration::from_secs(120 + uids.len() as u64);
    loop {
        let left = rt
            .list_pod_sandbox(Default::default())
            .await
            .context("ListPodSandbox")?
            .items
            .into_iter()
            .filter(|s| {
                s.labels
                    .get(LABEL_POD_UID)
                    .is_some_and(|u| uids.contains(u))
            })
            .count();
        if left == 0 {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < timeout,
            "{left} sandboxes left {timeout:?} after the manifests were deleted"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// No sandbox or container in the runtime, no sandbox process or shim, no mount.
pub async fn check_nothing_left(rt: &dyn RuntimeService, kind: &Kind) -> Result<()> {
    let sandboxes = rt
        .list_pod_sandbox(Default::default())
        .await
        .context("ListPodSandbox")?
        .items;
    ensure!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    let containers = rt
        .list_containers(Default::default())
        .await
        .context("ListContainers")?
        .containers;
    ensure!(containers.is_empty(), "containers left: {containers:?}");
    let dir = match kind {
        Kind::Builtin { root } => root,
        Kind::Containerd { dir, .. } => dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let procs = procs::group_processes(kind, |_| false)?;
        let extra: Vec<String> = procs
            .group
            .iter()
            .skip(1)
            .chain(&procs.apps)
            .map(|p| format!("{} {}", p.pid, p.cmdline.replace('\0', " ")))
            .collect();
        let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
        let mounts: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(dir.as_str()))
            .collect();
        if extra.is_empty() && mounts.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "left after removing the pods: processes {extra:?}, mounts {mounts:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}
