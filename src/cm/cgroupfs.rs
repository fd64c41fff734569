//! The cgroupfs driver: the kubelet's own cgroups made, set, listed and removed straight in
//! the cgroup filesystem, on cgroup v1 (one directory per controller hierarchy) or v2 (one
//! unified tree, the controllers enabled down the path). Paths are cgroupfs names such as
//! `/kubepods/burstable/pod<uid>`, absolute from the hierarchy's root.
//!
//! On v2 the CPU weight is converted from shares with [`shares_to_weight`], the same mapping
//! youki's libcgroups (and runc) use for containers, so a pod and its containers agree.

use std::path::{Path, PathBuf};

use super::Error;
use super::resources::ResourceConfig;

/// The v1 controllers the kubelet makes its cgroups in (named hierarchies such as
/// `name=systemd` are left alone).
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "pids",
    "hugetlb",
    "net_cls",
    "net_prio",
    "perf_event",
    "rdma",
    "misc",
];

/// The v2 controllers enabled for the kubelet's cgroups' children.
const V2_CONTROLLERS: [&str; 6] = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"];

/// Where the cgroup filesystem is mounted, and which version it is.
#[derive(Debug, Clone)]
pub enum Cgroupfs {
    /// v1 (or hybrid): the mount point of each controller hierarchy, by its controllers.
    V1 {
        hierarchies: Vec<(Vec<String>, PathBuf)>,
    },
    /// v2: the unified hierarchy's mount point.
    V2 { root: PathBuf },
}

impl Cgroupfs {
    /// The cgroup filesystem of this machine: v1 hierarchies where the controllers are
    /// mounted, else the unified hierarchy at `/sys/fs/cgroup`.
    pub fn detect() -> Result<Cgroupfs, Error> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| Error::Io {
            path: PathBuf::from("/proc/self/mountinfo"),
            source,
        })?;
        Self::from_mountinfo(&info)
    }

    /// As [`Cgroupfs::detect`], from the text of a `mountinfo` file.
    pub fn from_mountinfo(info: &str) -> Result<Cgroupfs, Error> {
        let mut hierarchies: Vec<(Vec<String>, PathBuf)> = Vec::new();
        let mut unified = None;
        for line in info.lines() {
            // `... mountpoint options - fstype source superoptions`
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mount = pre.split(' ').nth(4).map(crate::util::unescape_octal);
            let mut post = post.split(' ');
            let (fstype, options) = (post.next(), post.nth(1));
            let (Some(mount), Some(fstype)) = (mount, fstype) else {
                continue;
            };
            match fstype {
                "cgroup" => {
                    let controllers: Vec<String> = options
                        .unwrap_or_default()
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o))
                        .map(str::to_string)
                        .collect();
                    if !controllers.is_empty() && !hierarchies.iter().any(|(_, m)| *m == mount) {
                        hierarchies.push((controllers, mount));
                    }
                }
                "cgroup2" if unified.is_none() => unified = Some(mount),
                _ => {}
            }
        }
        if !hierarchies.is_empty() {
            return Ok(Cgroupfs::V1 { hierarchies });
        }
        match unified {
            Some(root) => Ok(Cgroupfs::V2 { root }),
            None => Err(Error::NotMounted),
        }
    }

    /// Whether this is cgroup v2.
    pub fn is_v2(&self) -> bool {
        matches!(self, Cgroupfs::V2 { .. })
    }

    /// Every directory `path` is in: one per v1 hierarchy, or the one on v2.
    fn dirs(&self, path: &str) -> Vec<PathBuf> {
        let rel = path.trim_start_matches('/');
        match self {
            Cgroupfs::V1 { hierarchies } => hierarchies.iter().map(|(_, m)| m.join(rel)).collect(),
            Cgroupfs::V2 { root } => vec![root.join(rel)],
        }
    }

    /// The directory of `path` in the hierarchy of `controller` (v1), or the unified one.
    pub fn dir(&self, controller: &str, path: &str) -> Option<PathBuf> {
        let rel = path.trim_start_matches('/');
        match self {
            Cgroupfs::V1 { hierarchies } => hierarchies
                .iter()
                .find(|(c, _)| c.iter().any(|c| c == controller))
                .map(|(_, m)| m.join(rel)),
            Cgroupfs::V2 { root } => Some(root.join(rel)),
        }
    }

    /// The memory working set of the cgroup `path`: its usage less its inactive file pages, as
    /// cAdvisor and upstream's eviction manager count it (v1 `memory.usage_in_bytes` and the
    /// hierarchical `total_inactive_file`; v2 `memory.current` and `inactive_file`). `None` when
    /// the files cannot be read (the root cgroup on v2 has none).
    pub fn memory_working_set(&self, path: &str) -> Option<u64> {
        let dir = self.dir("memory", path)?;
        let (usage_file, inactive_key) = if self.is_v2() {
            ("memory.current", "inactive_file")
        } else {
            ("memory.usage_in_bytes", "total_inactive_file")
        };
        let usage: u64 = std::fs::read_to_string(dir.join(usage_file))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        let inactive = stat
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == inactive_key)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Some(usage.saturating_sub(inactive))
    }

    /// Whether the cgroup `path` exists (in the memory hierarchy on v1).
    pub fn exists(&self, path: &str) -> bool {
        self.dir("memory", path).is_some_and(|d| d.is_dir())
    }

    /// Makes the cgroup `path` and its parents in every hierarchy. On v1 a new cpuset cgroup
    /// gets its parent's CPUs and memory nodes (else no task could join it); on v2 each
    /// parent delegates the controllers to its children.
    pub fn create(&self, path: &str) -> Result<(), Error> {
        match self {
            Cgroupfs::V1 { .. } => {
                for dir in self.dirs(path) {
                    mkdir_all(&dir)?;
                }
                if let Some(dir) = self.dir("cpuset", path) {
                    let root = self.dir("cpuset", "/").unwrap_or_default();
                    inherit_cpuset(&root, &dir)?;
                }
                Ok(())
            }
            Cgroupfs::V2 { root } => {
                let mut dir = root.clone();
                for part in path.split('/').filter(|p| !p.is_empty()) {
                    enable_controllers(&dir);
                    dir.push(part);
                    if !dir.is_dir() {
                        mkdir(&dir)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Sets `config`'s values on the cgroup `path` (what it leaves `None` is not touched).
    pub fn apply(&self, path: &str, config: &ResourceConfig) -> Result<(), Error> {
        let write = |controller: &str, file: &str, value: String| -> Result<(), Error> {
            let Some(dir) = self.dir(controller, path) else {
                return Err(Error::NoController(controller.to_string()));
            };
            write(&dir.join(file), &value)
        };
        let v2 = self.is_v2();
        if let Some(shares) = config.cpu_shares {
            if v2 {
                write("cpu", "cpu.weight", shares_to_weight(shares).to_string())?;
            } else {
                write("cpu", "cpu.shares", shares.to_string())?;
            }
        }
        if config.cpu_quota.is_some() || config.cpu_period.is_some() {
            let period = config.cpu_period.unwrap_or(super::resources::CFS_PERIOD_US);
            let quota = config.cpu_quota.filter(|q| *q > 0);
            if v2 {
                let quota = quota.map_or("max".to_string(), |q| q.to_string());
                write("cpu", "cpu.max", format!("{quota} {period}"))?;
            } else {
                write("cpu", "cpu.cfs_period_us", period.to_string())?;
                write("cpu", "cpu.cfs_quota_us", quota.unwrap_or(-1).to_string())?;
            }
        }
        if let Some(limit) = config.memory_limit {
            let limit = (limit > 0).then_some(limit);
            if v2 {
                let value = limit.map_or("max".to_string(), |l| l.to_string());
                write("memory", "memory.max", value)?;
            } else {
                write(
                    "memory",
                    "memory.limit_in_bytes",
                    limit.unwrap_or(-1).to_string(),
                )?;
            }
        }
        if let Some(limit) = config.pids_limit {
            let value = if limit > 0 {
                limit.to_string()
            } else {
                "max".to_string()
            };
            write("pids", "pids.max", value)?;
        }
        Ok(())
    }

    /// The names of the child cgroups of `path` (in the memory hierarchy on v1).
    pub fn children(&self, path: &str) -> Result<Vec<String>, Error> {
        let Some(dir) = self.dir("memory", path) else {
            return Ok(Vec::new());
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Io { path: dir, source }),
        };
        Ok(entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect())
    }

    /// The processes in the cgroup `path` and below it, in any hierarchy.
    pub fn pids(&self, path: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for dir in self.dirs(path) {
            collect_pids(&dir, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Removes the cgroup `path` and every cgroup below it from every hierarchy, killing
    /// what still runs in them first (as upstream's pod cgroup `Destroy`). Missing is fine.
    pub fn destroy(&self, path: &str) -> Result<(), Error> {
        for attempt in 0..50 {
            let pids = self.pids(path);
            if pids.is_empty() {
                break;
            }
            if attempt == 49 {
                return Err(Error::Busy {
                    path: path.to_string(),
                    pids,
                });
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for dir in self.dirs(path) {
            rmdir_tree(&dir)?;
        }
        Ok(())
    }
}

/// cgroup v1 CPU shares as a v2 `cpu.weight`: the quadratic mapping in the log of the
/// shares that youki's libcgroups and runc use, which takes the minimum 2 shares to weight 1,
/// the default 1024 to weight 100 (v2's default) and the maximum 262144 to 10000. (The
/// linear mapping it replaced took 1024 shares to weight 39, below an unconfigured cgroup.)
pub fn shares_to_weight(shares: u64) -> u64 {
    const MAX_WEIGHT: u64 = 10_000;
    if shares == 0 {
        return 0;
    }
    if shares <= 2 {
        return 1;
    }
    if shares >= 262_144 {
        return MAX_WEIGHT;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    (10f64.powf(exponent).ceil() as u64).clamp(1, MAX_WEIGHT)
}

fn mkdir(dir: &Path) -> Result<(), Error> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(Error::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

fn mkdir_all(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })
}

fn write(file: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(file, value).map_err(|source| Error::Write {
        path: file.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Gives each empty `cpuset.cpus` / `cpuset.mems` from `root` down to `dir` its parent's.
fn inherit_cpuset(root: &Path, dir: &Path) -> Result<(), Error> {
    let Ok(rel) = dir.strip_prefix(root) else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mut current = root.to_path_buf();
        for part in rel.components() {
            let parent = std::fs::read_to_string(current.join(file)).unwrap_or_default();
            current.push(part);
            let own = current.join(file);
            let value = std::fs::read_to_string(&own).unwrap_or_default();
            if value.trim().is_empty() && !parent.trim().is_empty() {
                write(&own, parent.trim())?;
            }
        }
    }
    Ok(())
}

/// Delegates the v2 controllers `dir` has to its children (those it cannot are left out:
/// a controller missing from the kernel, or one a parent does not delegate).
fn enable_controllers(dir: &Path) {
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in V2_CONTROLLERS {
        let has = |list: &str| list.split_whitespace().any(|x| x == c);
        if has(&available) && !has(&enabled) {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
        }
    }
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out);
            }
        }
    }
}

/// Removes the empty cgroup `dir` and its children, deepest first (a cgroup directory is
/// removed with rmdir; its files go with it). A cgroup emptied only now may take a moment to
/// be removable.
fn rmdir_tree(dir: &Path) -> Result<(), Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Io {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&e.path())?;
        }
    }
    let mut last = None;
    for _ in 0..10 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(Error::Io {
        path: dir.to_path_buf(),
        source: last.unwrap_or_else(|| std::io::Error::other("not removed")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_hierarchies_and_v2_from_mountinfo() {
        let hybrid = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids
";
        let fs = Cgroupfs::from_mountinfo(hybrid).unwrap();
        assert!(!fs.is_v2());
        let dir = |c: &str| fs.dir(c, "/kubepods/pod1").map(|p| p.display().to_string());
        assert_eq!(
            dir("cpuacct").as_deref(),
            Some("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1")
        );
        assert_eq!(
            dir("pids").as_deref(),
            Some("/sys/fs/cgroup/my pids/kubepods/pod1")
        );
        assert_eq!(dir("blkio"), None);
        assert_eq!(fs.dirs("/x").len(), 3, "named hierarchies are left alone");

        let unified = "40 25 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        let fs = Cgroupfs::from_mountinfo(unified).unwrap();
        assert!(fs.is_v2());
        assert_eq!(
            fs.dir("memory", "/kubepods"),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods"))
        );
        assert!(matches!(
            Cgroupfs::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/sda rw\n"),
            Err(Error::NotMounted)
        ));
    }

    #[test]
    fn weights_follow_libcgroups_mapping() {
        for (shares, weight) in [
            (0, 0),
            (2, 1),
            (3, 2),
            (102, 17),
            (1024, 100),
            (2048, 174),
            (262_144, 10_000),
        ] {
            assert_eq!(shares_to_weight(shares), weight, "{shares} shares");
        }
    }
}
