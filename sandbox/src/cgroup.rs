//! Cgroup helpers over libcgroups: joining the pod cgroup, applying resources, reading stats and
//! OOM kills. Reading is safe from any process (the agent uses [`stats`]); nothing here clones.

use std::path::{Path, PathBuf};

use libcgroups::common::{
    AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt, FreezerState,
    create_cgroup_manager,
};
use nix::unistd::Pid;
use oci_spec::runtime::LinuxResources;

use crate::{Error, Kind, Result};

/// Resource usage of one cgroup, as the runtime reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Total CPU time in nanoseconds.
    pub cpu_usage_ns: u64,
    /// Memory in use, including page cache.
    pub memory_usage_bytes: u64,
    /// Memory in use minus inactive file cache (what the kubelet calls the working set).
    pub memory_working_set_bytes: u64,
    /// Resident anonymous memory.
    pub memory_rss_bytes: u64,
    /// Number of tasks.
    pub pids: u64,
}

fn manager(path: &str) -> Result<AnyCgroupManager> {
    create_cgroup_manager(CgroupConfig {
        cgroup_path: PathBuf::from(path),
        systemd_cgroup: false,
        container_name: String::new(),
    })
    .map_err(|e| Error::new(Kind::Internal, format!("cgroup {path}: {e}")))
}

/// Creates `path` (absolute, below the cgroup root) and moves `pid` into it.
pub fn join(path: &str, pid: Pid) -> Result<()> {
    manager(path)?
        .add_task(pid)
        .map_err(|e| Error::new(Kind::Internal, format!("joining cgroup {path}: {e}")))
}

/// Kills every process in the cgroup at `path` and below it: the cgroup is frozen first (where
/// the freezer is available) so that none forks meanwhile, each process gets SIGKILL, then it is
/// thawed so they die; again until none is left or `wait` has passed. Returns how many were
/// killed. A missing cgroup has none.
pub fn kill_tree(path: &str, wait: std::time::Duration) -> Result<usize> {
    if !exists(path) {
        return Ok(0);
    }
    let m = manager(path)?;
    let pids = |m: &AnyCgroupManager| {
        m.get_all_pids()
            .map_err(|e| Error::new(Kind::Internal, format!("listing cgroup {path}: {e}")))
    };
    let deadline = std::time::Instant::now() + wait;
    let mut killed = 0;
    loop {
        let frozen = m.freeze(FreezerState::Frozen).is_ok();
        let left = pids(&m)?;
        for pid in &left {
            if nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        if frozen {
            let _ = m.freeze(FreezerState::Thawed);
        }
        if left.is_empty() {
            return Ok(killed);
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::new(
                Kind::Internal,
                format!("cgroup {path} still holds processes {left:?} after SIGKILL"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Removes the cgroup at `path`, killing nothing: it must be empty. Missing is fine.
pub fn remove(path: &str) -> Result<()> {
    manager(path)?
        .remove()
        .map_err(|e| Error::new(Kind::Internal, format!("removing cgroup {path}: {e}")))
}

/// Applies `resources` to the cgroup at `path`.
pub fn apply(path: &str, resources: &LinuxResources) -> Result<()> {
    let opt = ControllerOpt {
        resources,
        disable_oom_killer: false,
        oom_score_adj: None,
        freezer_state: None,
    };
    manager(path)?
        .apply(&opt)
        .map_err(|e| Error::new(Kind::Internal, format!("updating cgroup {path}: {e}")))
}

/// Reads usage of the cgroup at `path`.
pub fn stats(path: &str) -> Result<Usage> {
    let s = manager(path)?
        .stats()
        .map_err(|e| Error::new(Kind::Internal, format!("reading cgroup {path}: {e}")))?;
    let inactive_file = s
        .memory
        .stats
        .get("total_inactive_file")
        .or_else(|| s.memory.stats.get("inactive_file"))
        .copied()
        .unwrap_or(0);
    let usage = s.memory.memory.usage;
    Ok(Usage {
        cpu_usage_ns: s.cpu.usage.usage_total,
        memory_usage_bytes: usage,
        memory_working_set_bytes: usage.saturating_sub(inactive_file),
        memory_rss_bytes: s
            .memory
            .stats
            .get("total_rss")
            .or_else(|| s.memory.stats.get("anon"))
            .copied()
            .unwrap_or(0),
        pids: s.pids.current,
    })
}

/// Whether the kernel's OOM killer has killed a process in the cgroup at `path`.
pub fn oom_killed(path: &str) -> bool {
    let rel = path.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory")
        .join(rel)
        .join("memory.oom_control");
    let v2 = Path::new("/sys/fs/cgroup").join(rel).join("memory.events");
    [v1, v2].iter().any(|f| {
        std::fs::read_to_string(f)
            .map(|text| {
                text.lines().any(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|n| n.trim().parse::<u64>().ok())
                        .is_some_and(|n| n > 0)
                })
            })
            .unwrap_or(false)
    })
}

/// Whether a cgroup exists at `path` (in the memory hierarchy on v1, the unified one on v2).
pub fn exists(path: &str) -> bool {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return true;
    }
    let v1 = Path::new("/sys/fs/cgroup/memory").join(rel);
    let v2 = Path::new("/sys/fs/cgroup").join(rel).join("cgroup.procs");
    v1.is_dir() || v2.is_file()
}
