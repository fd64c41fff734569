//! The volumes' directories on disk: making them, mounting a tmpfs on them, and tearing a
//! pod's volumes down.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::plugins as local;
use super::{EMPTY_DIR_PLUGIN, MOUNTINFO};
use crate::util::quantity;

/// Whether something is mounted at `dir` itself.
pub(crate) fn is_mount_point(dir: &Path) -> Result<bool, String> {
    let info =
        std::fs::read_to_string(MOUNTINFO).map_err(|e| format!("reading {MOUNTINFO}: {e}"))?;
    let real =
        std::fs::canonicalize(dir).map_err(|e| format!("resolving {}: {e}", dir.display()))?;
    Ok(crate::util::mounts_under(&info, &real).contains(&real))
}

/// Mounts a tmpfs of `size` bytes (the kernel's default when `None`) at `dir`.
pub(super) fn mount_tmpfs(dir: &Path, size: Option<i64>) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    let options = size.filter(|s| *s > 0).map(|s| format!("size={s}"));
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        options.as_deref(),
    )
    .map_err(|e| format!("mounting a tmpfs at {}: {e}", dir.display()))
}

/// A memory-backed volume's size (upstream's `calculateEmptyDirMemorySize`): the node's
/// allocatable memory, or the pod's limit, or the volume's own, whichever is smallest (a zero
/// one counting as none).
pub(super) fn memory_size(
    allocatable: Option<i64>,
    pod: Option<i64>,
    volume: Option<i64>,
) -> Option<i64> {
    let mut size = allocatable;
    for cand in [pod, volume].into_iter().flatten().filter(|c| *c > 0) {
        if size.is_none_or(|s| cand <= s) {
            size = Some(cand);
        }
    }
    size
}

/// The pod's memory limit as its cgroup gets it: the sum of its app containers' limits (or an
/// init container's, if larger), when every app container has one.
pub(super) fn pod_memory_limit(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| quantity::parse_bytes(&q.0).ok())
            .filter(|b| *b > 0)
    };
    let mut sum: i64 = 0;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    for c in spec.init_containers.iter().flatten() {
        if let Some(l) = limit(c) {
            sum = sum.max(l);
        }
    }
    Some(sum)
}

/// Unmounts (when mounted) and removes every written volume directory of pod `uid`, its subPath
/// binds, and unmounts its memory-backed emptyDirs (their directories go with the pod's).
pub(super) fn tear_down_dirs(pods_dir: &Path, uid: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    // `volume-subpaths/<volume>/<container>/<index>`: each a bind, then the tree.
    let subpaths = pods_dir.join(uid).join(super::plugins::VOLUME_SUBPATHS);
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    for volume in dirs(&subpaths) {
        for container in dirs(&volume) {
            for target in dirs(&container) {
                // Removing the tree through a bind would delete the volume's files: any doubt
                // (an error) keeps the tree.
                match is_mount_point(&target) {
                    Ok(false) => {}
                    Ok(true) => {
                        if let Err(e) =
                            nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH)
                        {
                            errors.push(format!("unmounting {}: {e}", target.display()));
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    if errors.is_empty() && subpaths.exists() {
        if let Err(e) = std::fs::remove_dir_all(&subpaths) {
            errors.push(format!("removing {}: {e}", subpaths.display()));
        }
    }
    let empty_dirs = local::plugin_dir(pods_dir, uid, EMPTY_DIR_PLUGIN);
    for e in std::fs::read_dir(&empty_dirs)
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = e.path();
        let r = is_mount_point(&path).and_then(|mounted| match mounted {
            true => nix::mount::umount2(&path, nix::mount::MntFlags::empty())
                .map_err(|e| format!("unmounting {}: {e}", path.display())),
            false => Ok(()),
        });
        if let Err(e) = r {
            errors.push(e);
        }
    }
    for plugin in local::WRITTEN_PLUGINS {
        let dir = local::plugin_dir(pods_dir, uid, plugin);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let r = is_mount_point(&path).and_then(|mounted| {
                if mounted {
                    nix::mount::umount2(&path, nix::mount::MntFlags::empty())
                        .map_err(|e| format!("unmounting {}: {e}", path.display()))?;
                }
                std::fs::remove_dir_all(&path)
                    .map_err(|e| format!("removing {}: {e}", path.display()))
            });
            if let Err(e) = r {
                errors.push(e);
            }
        }
        if let Err(e) = std::fs::remove_dir(&dir) {
            errors.push(format!("removing {}: {e}", dir.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
