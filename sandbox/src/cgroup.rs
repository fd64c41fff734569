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

mod join;
mod systemd;
pub use join::join_self;
pub use systemd::{join_systemd_scope, systemd_booted, systemd_scope_path};

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
    let deadline = std::time::Instant::now() + wait;
    let mut killed = 0;
    loop {
        let frozen = m.freeze(FreezerState::Frozen).is_ok();
        let left = procs_below(path);
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

/// Kills everything in the cgroup at `path` and below it (as [`kill_tree`] does), then removes
/// it with every cgroup below it, deepest first, in every hierarchy it is in: a v1 tree left
/// half made or half removed (in some controllers only) goes too. Missing is fine.
pub fn remove_tree(path: &str, wait: std::time::Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + wait;
    if tree_dirs(path).is_empty() {
        return Ok(());
    }
    if exists(path) {
        kill_tree(path, wait)?;
    }
    // Listed after the kill: freezing a tree made in some controllers only makes its freezer
    // cgroup, which goes too. Reversed, every cgroup comes before its parent.
    for dir in tree_dirs(path).iter().rev() {
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => {
                    // Busy: a process still in it (in a controller the freezer did not
                    // reach), or one still exiting.
                    let procs =
                        std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.split_whitespace().filter_map(|p| p.parse().ok()) {
                        let _ = nix::sys::signal::kill(
                            Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(Error::new(
                            Kind::Internal,
                            format!("removing cgroup {}: {e}", dir.display()),
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
    Ok(())
}

/// The root of every mounted cgroup hierarchy: each v1 controller's (a link to a combined
/// mount, such as `cpu`, counts as its own; removing twice is harmless), or the unified one.
/// The processes in the cgroup at `path` and below it, in every hierarchy it is in: read from
/// the `cgroup.procs` files, so that a v1 tree made in some controllers only (a creation cut
/// short) is still read whole.
fn procs_below(path: &str) -> Vec<Pid> {
    let mut pids = Vec::new();
    for dir in tree_dirs(path) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|p| p.parse().ok()) {
            let pid = Pid::from_raw(pid);
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Removes the cgroup at `path` with every cgroup below it, in every hierarchy, only if no
/// process is in any of them: nothing is killed. Returns whether it is gone (missing counts);
/// a tree still in use is left as it is.
pub fn remove_empty_tree(path: &str) -> bool {
    let rel = path.trim_start_matches('/').trim_end_matches('/');
    // Never the root cgroup; never a tree with a process in it.
    if rel.is_empty() || !procs_below(path).is_empty() {
        return false;
    }
    tree_dirs(path)
        .iter()
        .rev()
        .all(|d| match std::fs::remove_dir(d) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        })
}

/// The directories of the cgroup at `path` and of every cgroup below it, in every hierarchy,
/// breadth first (each before those below it).
fn tree_dirs(path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/').trim_end_matches('/');
    let mut dirs: Vec<PathBuf> = hierarchies()
        .into_iter()
        .map(|h| h.join(rel))
        .filter(|d| d.is_dir())
        .collect();
    let mut next = 0;
    while next < dirs.len() {
        let below: Vec<PathBuf> = std::fs::read_dir(&dirs[next])
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.extend(below);
        next += 1;
    }
    dirs
}

/// The names of the cgroups right below `path`, in any hierarchy (a v1 cgroup made in some
/// controllers only counts).
pub fn children(path: &str) -> Vec<String> {
    let rel = path.trim_start_matches('/').trim_end_matches('/');
    let mut names: Vec<String> = hierarchies()
        .into_iter()
        .filter_map(|h| std::fs::read_dir(h.join(rel)).ok())
        .flat_map(|d| d.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.procs").exists() {
        return vec![base.to_path_buf()];
    }
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
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

/// Reads usage of the cgroup at `path`, straight from its files under `/sys/fs/cgroup` (v1
/// controllers, else the unified hierarchy). Called for every container and pod at every stats
/// scrape, so it does not go through a libcgroups manager, whose set-up on v1 parses the whole
/// mount table once per controller (about 5 ms a cgroup on a node with 100 pods).
pub fn stats(path: &str) -> Result<Usage> {
    let rel = path.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let read = |file: PathBuf| -> Result<String> {
        std::fs::read_to_string(&file).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::NotFound {
                Kind::NotFound
            } else {
                Kind::Internal
            };
            Error::new(
                kind,
                format!("reading cgroup {path}: {}: {e}", file.display()),
            )
        })
    };
    let number = |file: PathBuf| -> Result<u64> {
        let text = read(file.clone())?;
        text.trim().parse().map_err(|e| {
            Error::new(
                Kind::Internal,
                format!("reading cgroup {path}: {}: {e}", file.display()),
            )
        })
    };
    let field = |stat: &str, key: &str| -> Option<u64> {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    if root.join("memory").is_dir() {
        let memory = root.join("memory").join(rel);
        let stat = read(memory.join("memory.stat"))?;
        let usage = number(memory.join("memory.usage_in_bytes"))?;
        let inactive_file = field(&stat, "total_inactive_file").unwrap_or(0);
        Ok(Usage {
            cpu_usage_ns: number(root.join("cpuacct").join(rel).join("cpuacct.usage"))?,
            memory_usage_bytes: usage,
            memory_working_set_bytes: usage.saturating_sub(inactive_file),
            memory_rss_bytes: field(&stat, "total_rss").unwrap_or(0),
            pids: number(root.join("pids").join(rel).join("pids.current")).unwrap_or(0),
        })
    } else {
        let dir = root.join(rel);
        let stat = read(dir.join("memory.stat"))?;
        let usage = number(dir.join("memory.current"))?;
        let cpu = read(dir.join("cpu.stat"))?;
        Ok(Usage {
            cpu_usage_ns: field(&cpu, "usage_usec").unwrap_or(0) * 1000,
            memory_usage_bytes: usage,
            memory_working_set_bytes: usage
                .saturating_sub(field(&stat, "inactive_file").unwrap_or(0)),
            memory_rss_bytes: field(&stat, "anon").unwrap_or(0),
            pids: number(dir.join("pids.current")).unwrap_or(0),
        })
    }
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

/// Whether this machine has the unified cgroup hierarchy (cgroup v2) at `/sys/fs/cgroup`.
pub fn unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The files read directly say what libcgroups' manager says, for a cgroup holding a
    /// sleeping process (nothing changes while both read).
    #[test]
    fn stats_read_directly_match_libcgroups() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip("needs root", "stats_read_directly_match_libcgroups");
            return;
        }
        let name = format!("nodelet-cgstats-{}", std::process::id());
        let root = Path::new("/sys/fs/cgroup");
        let dirs: Vec<PathBuf> = if root.join("memory").is_dir() {
            // Every controller libcgroups reads stats from.
            ["memory", "cpu", "cpuacct", "pids", "blkio", "hugetlb"]
                .iter()
                .filter(|c| root.join(c).is_dir())
                .map(|c| root.join(c).join(&name))
                .collect()
        } else {
            vec![root.join(&name)]
        };
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        for d in &dirs {
            std::fs::create_dir_all(d).expect("a cgroup");
            std::fs::write(d.join("cgroup.procs"), sleeper.id().to_string()).expect("joining");
        }
        let path = format!("/{name}");
        // Until the sleeper is asleep (done exec'ing, charging no more CPU), nothing is still.
        let mut last = None;
        for _ in 0..100 {
            let now = stats(&path).ok().map(|u| u.cpu_usage_ns);
            if now.is_some() && now == last {
                break;
            }
            last = now;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let ours = stats(&path);
        let theirs = manager(&path).and_then(|m| {
            m.stats()
                .map_err(|e| Error::new(Kind::Internal, e.to_string()))
        });
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
        let (ours, theirs) = (ours.expect("our read"), theirs.expect("libcgroups' read"));
        assert_eq!(ours.cpu_usage_ns, theirs.cpu.usage.usage_total);
        assert_eq!(ours.memory_usage_bytes, theirs.memory.memory.usage);
        assert_eq!(ours.pids, 1);
        assert_eq!(theirs.pids.current, 1);
        assert!(ours.memory_working_set_bytes <= ours.memory_usage_bytes);
        assert_eq!(
            stats("/nodelet-no-such-cgroup").unwrap_err().kind(),
            Kind::NotFound
        );
    }

    /// A tree of cgroups with a process deep in it goes whole: the process killed, every
    /// cgroup removed in every hierarchy; a missing tree is fine.
    #[test]
    fn remove_tree_kills_and_removes_nested_cgroups() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip("needs root", "remove_tree_kills_and_removes_nested_cgroups");
            return;
        }
        let top = format!("/nodelet-cgtree-{}", std::process::id());
        let mut sleepers = Vec::new();
        for sub in ["a/b", "c"] {
            let sleeper = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("sleep");
            join(&format!("{top}/{sub}"), Pid::from_raw(sleeper.id() as i32)).expect("joining");
            sleepers.push(sleeper);
        }
        assert!(exists(&format!("{top}/a/b")));
        // On v1, a cgroup in one controller only (a tree made or removed half way).
        let cpu_only = Path::new("/sys/fs/cgroup/cpu").join(top.trim_start_matches('/'));
        if cpu_only.is_dir() {
            std::fs::create_dir_all(cpu_only.join("half/made")).expect("a cpu-only cgroup");
        }
        remove_tree(&top, std::time::Duration::from_secs(5)).expect("removing the tree");
        for mut sleeper in sleepers {
            let status = sleeper.wait().expect("wait");
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9),
                "a process in the tree was killed"
            );
        }
        let rel = top.trim_start_matches('/');
        for e in std::fs::read_dir("/sys/fs/cgroup")
            .expect("cgroup fs")
            .flatten()
        {
            assert!(
                !e.path().join(rel).exists(),
                "{} left",
                e.path().join(rel).display()
            );
        }
        remove_tree(&top, std::time::Duration::from_secs(1)).expect("a missing tree");
    }

    /// A v1 cgroup made in some controllers only (a creation killed half way: memory and cpu,
    /// not devices) with a process in it goes too: its processes are read from every
    /// hierarchy, not through a manager that needs them all.
    #[test]
    fn remove_tree_takes_a_cgroup_made_in_some_controllers_only() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip(
                "needs root",
                "remove_tree_takes_a_cgroup_made_in_some_controllers_only",
            );
            return;
        }
        let root = Path::new("/sys/fs/cgroup");
        if !root.join("memory").is_dir() || !root.join("devices").is_dir() {
            crate::skip(
                "needs cgroup v1 with memory and devices",
                "remove_tree_takes_a_cgroup_made_in_some_controllers_only",
            );
            return;
        }
        let name = format!("nodelet-cghalf-{}", std::process::id());
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        for c in ["memory", "cpu"] {
            let d = root.join(c).join(&name).join("sandbox");
            std::fs::create_dir_all(&d).expect("a cgroup");
            std::fs::write(d.join("cgroup.procs"), sleeper.id().to_string()).expect("joining");
        }
        let path = format!("/{name}");
        assert!(exists(&path) && !root.join("devices").join(&name).exists());
        let removed = remove_tree(&path, std::time::Duration::from_secs(5));
        let killed = sleeper.try_wait().ok().flatten().is_some() || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            sleeper.try_wait().ok().flatten().is_some()
        };
        if !killed {
            let _ = sleeper.kill();
            let _ = sleeper.wait();
        }
        for c in ["memory", "cpu"] {
            let _ = std::fs::remove_dir(root.join(c).join(&name).join("sandbox"));
            let _ = std::fs::remove_dir(root.join(c).join(&name));
        }
        removed.expect("removing a half-made tree");
        assert!(killed, "the process in it was killed");
    }

    /// Only an empty tree goes: one with a process in it (in any controller) stays whole and
    /// nothing is killed.
    #[test]
    fn remove_empty_tree_kills_nothing() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip("needs root", "remove_empty_tree_kills_nothing");
            return;
        }
        let top = format!("/nodelet-cgempty-{}", std::process::id());
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        join(
            &format!("{top}/busy/sandbox"),
            Pid::from_raw(sleeper.id() as i32),
        )
        .expect("joining");
        let idle = Path::new("/sys/fs/cgroup/memory").join(top.trim_start_matches('/'));
        let v1 = idle.is_dir();
        if v1 {
            std::fs::create_dir_all(idle.join("idle/sandbox")).expect("an empty cgroup");
        } else {
            join(
                &format!("{top}/idle/sandbox"),
                Pid::from_raw(sleeper.id() as i32),
            )
            .ok();
        }
        assert_eq!(children(&top), ["busy", "idle"]);
        assert!(!remove_empty_tree(&format!("{top}/busy")), "in use");
        assert!(sleeper.try_wait().unwrap().is_none(), "nothing killed");
        assert!(exists(&format!("{top}/busy/sandbox")));
        if v1 {
            assert!(remove_empty_tree(&format!("{top}/idle")));
            assert_eq!(children(&top), ["busy"]);
        }
        assert!(!remove_empty_tree("/"), "never the root");
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        remove_tree(&top, std::time::Duration::from_secs(5)).expect("cleaning up");
    }
}
