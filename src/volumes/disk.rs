//! The volumes' directories on disk: making them, mounting a tmpfs on them, and tearing a
//! pod's volumes down.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::plugins as local;
use super::{EMPTY_DIR_PLUGIN, MOUNTINFO, PluginError};
use crate::util::quantity;

/// Whether something is mounted at `dir` itself.
pub(crate) fn is_mount_point(dir: &Path) -> Result<bool, PluginError> {
    let info = std::fs::read_to_string(MOUNTINFO).map_err(PluginError::MountInfo)?;
    let real = std::fs::canonicalize(dir).map_err(|source| PluginError::Resolve {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(crate::util::mounts_under(&info, &real).contains(&real))
}

/// Mounts a tmpfs of `size` bytes (the kernel's default when `None`) at `dir`.
pub(super) fn mount_tmpfs(dir: &Path, size: Option<i64>) -> Result<(), PluginError> {
    use nix::mount::{MsFlags, mount};
    let options = size.filter(|s| *s > 0).map(|s| format!("size={s}"));
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        options.as_deref(),
    )
    .map_err(|source| PluginError::MountTmpfs {
        path: dir.to_path_buf(),
        source,
    })
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

/// Unmounts `path` (`flags`: `MNT_DETACH` or none).
fn unmount(path: &Path, flags: nix::mount::MntFlags) -> Result<(), PluginError> {
    nix::mount::umount2(path, flags).map_err(|source| PluginError::Unmount {
        path: path.to_path_buf(),
        source,
    })
}

/// The error of removing `path`, for `map_err`.
fn removing(path: &Path) -> impl Fn(std::io::Error) -> PluginError + '_ {
    move |source| PluginError::Remove {
        path: path.to_path_buf(),
        source,
    }
}

/// The entries of directory `p` (none when it cannot be read).
fn entries(p: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Unmounts (when mounted) and removes every written volume directory and every emptyDir of
/// pod `uid`, after its subPath binds (while one of those stays, the emptyDirs' contents stay
/// too: removing them could reach through it).
pub(super) fn tear_down_dirs(pods_dir: &Path, uid: &str) -> Result<(), PluginError> {
    let mut errors = tear_down_sub_paths(pods_dir, uid);
    let binds_left = !errors.is_empty();
    // An emptyDir goes with its pod's termination, as upstream's TearDown removes it: a
    // memory-backed one unmounted first; a disk one's space given back (an evicted pod's
    // above all).
    for path in entries(&local::plugin_dir(pods_dir, uid, EMPTY_DIR_PLUGIN)) {
        let r = is_mount_point(&path).and_then(|mounted| {
            if mounted {
                unmount(&path, nix::mount::MntFlags::empty())?;
            }
            if binds_left {
                return Ok(());
            }
            std::fs::remove_dir_all(&path).map_err(removing(&path))
        });
        errors.extend(r.err());
    }
    for plugin in local::WRITTEN_PLUGINS {
        let dir = local::plugin_dir(pods_dir, uid, plugin);
        let Ok(list) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in list.flatten().map(|e| e.path()) {
            let r = is_mount_point(&path).and_then(|mounted| {
                if mounted {
                    unmount(&path, nix::mount::MntFlags::empty())?;
                }
                std::fs::remove_dir_all(&path).map_err(removing(&path))
            });
            errors.extend(r.err());
        }
        errors.extend(std::fs::remove_dir(&dir).map_err(removing(&dir)).err());
    }
    match errors.is_empty() {
        true => Ok(()),
        false => Err(PluginError::TearDown(errors)),
    }
}

/// Undoes the subPath binds of pod `uid` (`volume-subpaths/<volume>/<container>/<index>`), then
/// removes their tree; what failed.
fn tear_down_sub_paths(pods_dir: &Path, uid: &str) -> Vec<PluginError> {
    let mut errors = Vec::new();
    let subpaths = pods_dir.join(uid).join(super::plugins::VOLUME_SUBPATHS);
    for volume in entries(&subpaths) {
        for container in entries(&volume) {
            for target in entries(&container) {
                // Removing the tree through a bind would delete the volume's files: any doubt
                // (an error) keeps the tree.
                let r = is_mount_point(&target).and_then(|mounted| match mounted {
                    true => unmount(&target, nix::mount::MntFlags::MNT_DETACH),
                    false => Ok(()),
                });
                errors.extend(r.err());
            }
        }
    }
    if errors.is_empty() && subpaths.exists() {
        errors.extend(
            std::fs::remove_dir_all(&subpaths)
                .map_err(removing(&subpaths))
                .err(),
        );
    }
    errors
}
