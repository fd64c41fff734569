//! A process moving itself into its cgroup without the kernel's grace-period wait (cgroup v1's
//! `tasks` files).

use std::path::{Path, PathBuf};

use super::join;
use crate::{Error, Kind, Result};

/// The cgroup v1 controllers libcgroups' manager moves a process into (its subsystems), where
/// mounted.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// Moves the calling process into `path` (absolute, below the cgroup root; created where
/// missing), as [`join`] does, in the cgroups [`join`] would. On cgroup v1, when the process
/// has one thread, it writes `0` to each hierarchy's `tasks`: that moves the writing thread
/// alone, and the kernel then skips the lock that keeps thread groups still during a move,
/// whose write side first waits for an RCU grace period (5-35 ms on a busy machine, paid by
/// every pod start through `cgroup.procs`). Otherwise, and on v2 (where a thread cannot leave
/// its domain), it is [`join`].
pub fn join_self(path: &str) -> Result<()> {
    let one_thread = procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.num_threads == 1);
    if Path::new("/sys/fs/cgroup/cgroup.procs").exists() || !one_thread {
        return join(path, nix::unistd::getpid());
    }
    let fail = |what: &str, file: &Path, e: std::io::Error| {
        Error::new(
            Kind::Internal,
            format!("joining cgroup {path}: {what} {}: {e}", file.display()),
        )
    };
    let mounts = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(|e| {
            Error::new(
                Kind::Internal,
                format!("joining cgroup {path}: reading the mount table: {e}"),
            )
        })?;
    let rel = Path::new(path.trim_start_matches('/'));
    let mut joined = std::collections::HashSet::new();
    for m in &mounts.0 {
        let controllers: Vec<&str> = V1_CONTROLLERS
            .iter()
            .copied()
            .filter(|c| m.super_options.contains_key(*c))
            .collect();
        if m.fs_type != "cgroup" || controllers.is_empty() || !joined.insert(&m.mount_point) {
            continue;
        }
        let dir = m.mount_point.join(rel);
        std::fs::create_dir_all(&dir).map_err(|e| fail("creating", &dir, e))?;
        if controllers.contains(&"cpuset") {
            inherit_cpuset(&m.mount_point, rel).map_err(|(f, e)| fail("filling", &f, e))?;
        }
        let tasks = dir.join("tasks");
        std::fs::write(&tasks, "0").map_err(|e| fail("writing", &tasks, e))?;
    }
    Ok(())
}

/// Gives every cgroup from the cpuset hierarchy at `mount` down to `rel` that has no CPUs or
/// memory nodes its parent's (a task cannot join an empty cpuset), as libcgroups does.
fn inherit_cpuset(mount: &Path, rel: &Path) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    let mut dir = mount.to_path_buf();
    for part in rel.components() {
        let parent = dir.clone();
        dir.push(part);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = dir.join(file);
            let current = std::fs::read_to_string(&own).map_err(|e| (own.clone(), e))?;
            if current.trim().is_empty() {
                let from = parent.join(file);
                let value = std::fs::read_to_string(&from).map_err(|e| (from, e))?;
                std::fs::write(&own, value.trim()).map_err(|e| (own, e))?;
            }
        }
    }
    Ok(())
}
