//! The `cgroup` mount of a container that joins a PID namespace on a cgroup v1 node, spelled
//! out as the mounts libcontainer would make of it (see [`spell_out_cgroup_v1`]).

use std::path::{Path, PathBuf};

use oci_spec::runtime::Mount;

use super::invalid;
use super::mounts::mount;
use crate::Result;

/// A cgroup v1 hierarchy of the node: where it is mounted and the controllers it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupHierarchy {
    pub mount_point: PathBuf,
    pub controllers: Vec<String>,
}

/// The controllers libcontainer's v1 manager puts a container in (a directory each).
const MANAGED_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
];

/// The node's cgroup v1 hierarchies under /sys/fs/cgroup, from mountinfo text.
pub(crate) fn cgroup_v1_hierarchies(mountinfo: &str) -> Vec<CgroupHierarchy> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            if fields.get(sep + 1) != Some(&"cgroup") {
                return None;
            }
            let mount_point = PathBuf::from(fields.get(4)?);
            if !mount_point.starts_with("/sys/fs/cgroup/") {
                return None;
            }
            let controllers = fields
                .get(sep + 3)?
                .split(',')
                .filter(|o| MANAGED_CONTROLLERS.contains(o) || o.starts_with("name="))
                .map(str::to_string)
                .collect();
            Some(CgroupHierarchy {
                mount_point,
                controllers,
            })
        })
        .collect()
}

/// The node's cgroup v1 hierarchies, read from mountinfo once: they do not change under a
/// running node, and every CreateContainer would otherwise read and parse the mount table.
pub(crate) fn node_hierarchies() -> &'static [CgroupHierarchy] {
    static HIERARCHIES: std::sync::OnceLock<Vec<CgroupHierarchy>> = std::sync::OnceLock::new();
    HIERARCHIES.get_or_init(|| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|text| cgroup_v1_hierarchies(&text))
            .unwrap_or_default()
    })
}

/// Spells out the `cgroup` mount of a v1 node as the mounts libcontainer would make of it: a
/// tmpfs at /sys/fs/cgroup and, for each hierarchy of controllers, a bind of the container's own
/// cgroup (under each of its controllers' names when they are co-mounted). Named hierarchies
/// (`name=systemd`) are left out: the container has no cgroup of its own there.
///
/// Done for a container that joins a PID namespace (the pod's, or a target container's):
/// libcontainer looks its init's cgroups up by the PID the init has in its namespace, in the
/// node's /proc, where that PID is another process or none, and the container then fails with
/// "failed to prepare rootfs".
pub(super) fn spell_out_cgroup_v1(
    mounts: &mut Vec<Mount>,
    hierarchies: &[CgroupHierarchy],
    cgroups_path: &Path,
    privileged: bool,
) -> Result<()> {
    let Some(at) = mounts.iter().position(|m| {
        m.destination() == Path::new("/sys/fs/cgroup") && m.typ().as_deref() == Some("cgroup")
    }) else {
        return Ok(());
    };
    let mode = if privileged { "rw" } else { "ro" };
    let own = cgroups_path.strip_prefix("/").unwrap_or(cgroups_path);
    let mut spelled = vec![mount(
        "/sys/fs/cgroup",
        "tmpfs",
        "tmpfs",
        &["nosuid", "noexec", "nodev", "mode=755"],
    )?];
    for h in hierarchies {
        let managed = !h.controllers.is_empty()
            && h.controllers
                .iter()
                .all(|c| MANAGED_CONTROLLERS.contains(&c.as_str()));
        let Some(dir) = h.mount_point.file_name().and_then(|d| d.to_str()) else {
            continue;
        };
        if !managed {
            continue;
        }
        let source = h.mount_point.join(own);
        let source = source
            .to_str()
            .ok_or_else(|| invalid(format!("cgroup path {source:?} is not UTF-8")))?;
        let mut names = vec![dir.to_string()];
        if dir.contains(',') {
            names.extend(h.controllers.iter().cloned());
        }
        for name in names {
            spelled.push(mount(
                &format!("/sys/fs/cgroup/{name}"),
                "bind",
                source,
                &["bind", "nosuid", "noexec", "nodev", mode],
            )?);
        }
    }
    mounts.splice(at..=at, spelled);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::spec::mounts::default_mounts;

    #[test]
    fn cgroup_v1_mounts_are_spelled_out() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:13 - cgroup cgroup rw,memory
35 25 0:31 / /mnt/elsewhere rw shared:14 - cgroup cgroup rw,pids
";
        let hierarchies = cgroup_v1_hierarchies(mountinfo);
        let names: Vec<(&str, Vec<&str>)> = hierarchies
            .iter()
            .map(|h| {
                (
                    h.mount_point.to_str().unwrap(),
                    h.controllers.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("/sys/fs/cgroup/systemd", vec!["name=systemd"]),
                ("/sys/fs/cgroup/cpu,cpuacct", vec!["cpu", "cpuacct"]),
                ("/sys/fs/cgroup/memory", vec!["memory"]),
            ]
        );
        let mut mounts = default_mounts(false).unwrap();
        let before = mounts.len();
        spell_out_cgroup_v1(&mut mounts, &hierarchies, Path::new("/pods/p1/c1"), false).unwrap();
        let cgroup: Vec<(String, String, String)> = mounts
            .iter()
            .filter(|m| m.destination().starts_with("/sys/fs/cgroup"))
            .map(|m| {
                (
                    m.destination().display().to_string(),
                    m.typ().clone().unwrap_or_default(),
                    m.source().as_ref().unwrap().display().to_string(),
                )
            })
            .collect();
        let bind = |dest: &str, src: &str| (dest.to_string(), "bind".to_string(), src.to_string());
        assert_eq!(
            cgroup,
            [
                (
                    "/sys/fs/cgroup".to_string(),
                    "tmpfs".to_string(),
                    "tmpfs".to_string()
                ),
                bind(
                    "/sys/fs/cgroup/cpu,cpuacct",
                    "/sys/fs/cgroup/cpu,cpuacct/pods/p1/c1"
                ),
                bind(
                    "/sys/fs/cgroup/cpu",
                    "/sys/fs/cgroup/cpu,cpuacct/pods/p1/c1"
                ),
                bind(
                    "/sys/fs/cgroup/cpuacct",
                    "/sys/fs/cgroup/cpu,cpuacct/pods/p1/c1"
                ),
                bind("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/pods/p1/c1"),
            ]
        );
        assert_eq!(mounts.len(), before + 4);
        assert!(
            mounts
                .iter()
                .filter(|m| m.typ().as_deref() == Some("bind"))
                .all(|m| m.options().as_ref().unwrap().contains(&"ro".to_string()))
        );
        // Once spelled out there is no cgroup mount left to spell.
        let again = mounts.clone();
        spell_out_cgroup_v1(&mut mounts, &hierarchies, Path::new("/x"), false).unwrap();
        assert_eq!(mounts, again);
    }
}
