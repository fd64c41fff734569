//! Container root filesystems: an overlay of an image's layer snapshots under a fresh upper and
//! work dir in `root/containers/<key>/`, with a small `rootfs.json` recording which image the key
//! holds, so that images in use are not removed. A key's overlay may be unmounted before it is
//! released (its container exited): its upper dir and record stay until the release.

use crate::error::{Error, Result};
use crate::idmap;
use crate::mounts;
use crate::paths::{Paths, write_atomic_volatile};
use crate::store::{Store, find};
use serde::{Deserialize, Serialize};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

const RECORD: &str = "rootfs.json";

/// What a rootfs key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RootfsRecord {
    pub image_id: String,
    pub target: PathBuf,
}

/// Every key's record, by key.
pub(crate) fn records(paths: &Paths) -> Result<Vec<(String, RootfsRecord)>> {
    let dir = paths.containers();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("listing rootfs", &dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing rootfs", &dir, e))?;
        let Some(key) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if let Some(record) = read_record(&entry.path().join(RECORD))? {
            out.push((key, record));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn read_record(path: &Path) -> Result<Option<RootfsRecord>> {
    match std::fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|source| Error::Json {
                op: "parsing rootfs record",
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("reading rootfs record", path, e)),
    }
}

/// Records at `path` that the rootfs mounted (or to be mounted) at `target` holds image
/// `image_id`; returns `target` resolved, as recorded.
fn write_record(path: &Path, image_id: String, target: &Path) -> Result<PathBuf> {
    let target = target
        .canonicalize()
        .map_err(|e| Error::io("resolving rootfs target", target, e))?;
    let data = serde_json::to_vec(&RootfsRecord {
        image_id,
        target: target.clone(),
    })
    .map_err(|source| Error::Json {
        op: "serialising rootfs record",
        path: path.to_path_buf(),
        source,
    })?;
    // The record matters while the node runs: after a crash its containers are gone.
    write_atomic_volatile(path, &data)?;
    Ok(target)
}

/// Sets aside every rootfs record that cannot be read (torn or corrupt) as
/// `corrupt/rootfs-<key>.json.<time>`, returning those keys. Their dirs and mounts stay.
pub(crate) fn set_aside_unreadable(paths: &Paths) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(paths.containers()) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for entry in entries.flatten() {
        let Some(key) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path = entry.path().join(RECORD);
        if let Err(e) = read_record(&path) {
            crate::recover::set_aside(paths, &path, &format!("rootfs-{key}.json"), &e.to_string());
            keys.push(key);
        }
    }
    keys.sort();
    keys
}

/// Keys become directory names: keep them plain.
fn check_key(key: &str) -> Result<()> {
    let invalid = |reason: &str| Error::InvalidKey {
        key: key.to_string(),
        reason: reason.to_string(),
    };
    if key.is_empty() || key.len() > 128 {
        return Err(invalid("must be 1 to 128 characters"));
    }
    if key.starts_with('.') {
        return Err(invalid("must not start with '.'"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid("may only contain [A-Za-z0-9_.-]"));
    }
    Ok(())
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io("creating", path, e))
}

/// The user namespace a rootfs is ID-mapped through, and the host IDs its root has.
#[derive(Debug, Clone, Copy)]
pub struct RootfsIdMap<'a> {
    /// A `/proc/<pid>/ns/user` of a process in the namespace.
    pub userns: BorrowedFd<'a>,
    pub root_uid: u32,
    pub root_gid: u32,
}

/// The overlay over ID-mapped clones of the layers. The clones are attached under
/// `dir/idmapped/` only while the overlay is mounted (it keeps its own references), as
/// overlayfs itself cannot be ID-mapped; the upper dir is given to the namespace's root.
fn mount_mapped(
    dir: &Path,
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
    idmap: &RootfsIdMap<'_>,
    force_fds: bool,
) -> Result<()> {
    let staged = dir.join("idmapped");
    let mut attached = Vec::new();
    let result = (|| {
        for (i, layer) in lower.iter().enumerate() {
            let at = staged.join(i.to_string());
            mkdir(&at)?;
            idmap::bind_mapped(layer, &at, idmap.userns, false)?;
            attached.push(at);
        }
        std::os::unix::fs::chown(upper, Some(idmap.root_uid), Some(idmap.root_gid))
            .map_err(|e| Error::io("giving the upper dir to the namespace's root", upper, e))?;
        mounts::mount_overlay(&attached, upper, work, target, force_fds)
    })();
    for at in &attached {
        if let Err(e) = idmap::detach(at) {
            tracing::warn!(error = %e, "leaving an ID-mapped layer attached");
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&staged) {
        tracing::warn!(dir = %staged.display(), error = %e, "removing the ID-mapped layers' dir");
    }
    result
}

/// Unmounts the rootfs of the key whose dir is `dir`: at `target`, and where its record says
/// it was mounted, if elsewhere. Not mounted is fine. Called with the index locked.
fn unmount_targets(dir: &Path, key: &str, target: &Path) -> Result<()> {
    // A record that cannot be read still names nothing the caller's target does not.
    let held = read_record(&dir.join(RECORD)).unwrap_or_else(|e| {
        tracing::warn!(key, error = %e, "unmounting a rootfs whose record is unreadable");
        None
    });
    let mut targets = Vec::new();
    if let Ok(t) = target.canonicalize() {
        targets.push(t);
    }
    if let Some(record) = held {
        if !targets.contains(&record.target) {
            targets.push(record.target);
        }
    }
    for t in &targets {
        mounts::unmount_all(t)?;
    }
    Ok(())
}

impl Store {
    /// Mounts an overlay rootfs for container `key` at `target` (created if missing): the
    /// image's layer snapshots under a fresh upper/work dir in `root/containers/<key>/`.
    /// Idempotent for the same key and image. While it exists, the image cannot be removed.
    pub fn prepare_rootfs(&self, image_id: &str, key: &str, target: &Path) -> Result<()> {
        self.prepare_rootfs_with(image_id, key, target, None, false)
    }

    /// [`Store::prepare_rootfs`] for a container in a user namespace: the layers are ID-mapped
    /// through it, so the image's files belong to the namespace's own IDs, and the upper dir
    /// belongs to the namespace's root, so what the container writes does too.
    pub fn prepare_rootfs_mapped(
        &self,
        image_id: &str,
        key: &str,
        target: &Path,
        idmap: &RootfsIdMap<'_>,
    ) -> Result<()> {
        self.prepare_rootfs_with(image_id, key, target, Some(idmap), false)
    }

    pub(crate) fn prepare_rootfs_with(
        &self,
        image_id: &str,
        key: &str,
        target: &Path,
        idmap: Option<&RootfsIdMap<'_>>,
        force_fds: bool,
    ) -> Result<()> {
        check_key(key)?;
        let paths = &self.inner.paths;
        let mut txn = self.inner.index.lock(true)?;
        let state = txn.state()?;
        let record = find(state, image_id)?.ok_or_else(|| Error::ImageNotFound {
            reference: image_id.to_string(),
        })?;
        let id = record.image.id.clone();
        let mut lower = Vec::new();
        for diff_id in record.image.layers.iter().rev() {
            let n = state.snapshots.get(diff_id).ok_or_else(|| {
                Error::io(
                    "finding snapshot",
                    paths.snapshots(),
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no snapshot of layer {diff_id}"),
                    ),
                )
            })?;
            lower.push(paths.snapshot_fs(*n));
        }
        let dir = paths.container(key);
        let record_path = dir.join(RECORD);
        let held = read_record(&record_path)?;
        let fresh = held.is_none();
        if let Some(held) = held {
            if held.image_id != id {
                return Err(Error::KeyConflict {
                    key: key.to_string(),
                    held: held.image_id,
                    requested: id,
                });
            }
        }
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        mkdir(&upper)?;
        mkdir(&work)?;
        if lower.is_empty() {
            // overlay needs a lower layer: an image without layers gets an empty one.
            let empty = dir.join("empty");
            mkdir(&empty)?;
            lower.push(empty);
        }
        mkdir(target)?;
        let target = write_record(&record_path, id, target)?;
        if mounts::is_mountpoint(&target)? {
            return Ok(());
        }
        let mounted = match idmap {
            None => mounts::mount_overlay(&lower, &upper, &work, &target, force_fds),
            Some(idmap) => mount_mapped(&dir, &lower, &upper, &work, &target, idmap, force_fds),
        };
        if let Err(e) = mounted {
            if fresh {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(e);
        }
        self.invalidate_fs_cache();
        Ok(())
    }

    /// Records again which image the rootfs of `key`, mounted at `target`, holds, after its
    /// record was set aside at open ([`Store::unrecorded_rootfs`]): the owner (who knows) says
    /// so. Nothing is mounted; the image must still be in the store.
    pub fn restore_rootfs_record(&self, image_id: &str, key: &str, target: &Path) -> Result<()> {
        check_key(key)?;
        let paths = &self.inner.paths;
        let mut txn = self.inner.index.lock(true)?;
        let id = find(txn.state()?, image_id)?
            .ok_or_else(|| Error::ImageNotFound {
                reference: image_id.to_string(),
            })?
            .image
            .id
            .clone();
        let dir = paths.container(key);
        let record_path = dir.join(RECORD);
        if !dir.is_dir() {
            return Err(Error::io(
                "restoring rootfs record",
                &dir,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        write_record(&record_path, id, target)?;
        self.inner
            .unrecorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k| k != key);
        Ok(())
    }

    /// What the key's container has written to its rootfs: the disk usage (allocated blocks)
    /// and the inode count of its overlay upper dir, hard links counted once, as containerd's
    /// snapshotter counts a writable layer. Walks the dir: the cost grows with what it wrote.
    pub fn rootfs_usage(&self, key: &str) -> Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        check_key(key)?;
        let upper = self.inner.paths.container(key).join("upper");
        let mut seen = std::collections::HashSet::new();
        let (mut bytes, mut inodes) = (0u64, 0u64);
        let mut dirs = vec![upper.clone()];
        while let Some(dir) = dirs.pop() {
            let meta = std::fs::symlink_metadata(&dir)
                .map_err(|e| Error::io("reading the writable layer", &dir, e))?;
            if seen.insert((meta.dev(), meta.ino())) {
                bytes += meta.blocks() * 512;
                inodes += 1;
            }
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| Error::io("reading the writable layer", &dir, e))?;
            for entry in entries.flatten() {
                let Ok(m) = entry.metadata() else { continue };
                if m.is_dir() {
                    dirs.push(entry.path());
                } else if seen.insert((m.dev(), m.ino())) {
                    bytes += m.blocks() * 512;
                    inodes += 1;
                }
            }
        }
        Ok((bytes, inodes))
    }

    /// Unmounts `target` (detaching lazily when busy) and deletes the key's upper and work
    /// dirs. Idempotent; an unknown key is fine. The deletion, slow on a busy disk, runs after
    /// the store's lock is given up (the dirs are moved into the staging dir first, which the
    /// next open cleans if this process dies meanwhile), so other containers' rootfs are
    /// prepared meanwhile.
    pub fn release_rootfs(&self, key: &str, target: &Path) -> Result<()> {
        check_key(key)?;
        let txn = self.inner.index.lock(true)?;
        let dir = self.inner.paths.container(key);
        unmount_targets(&dir, key, target)?;
        let doomed = self
            .inner
            .paths
            .tmp()
            .join(format!("{}-released-{key}", std::process::id()));
        let doomed = match std::fs::rename(&dir, &doomed) {
            Ok(()) => doomed,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.forget_unrecorded(key);
                return Ok(());
            }
            // Not movable (a leftover of the same name): deleted in place, under the lock.
            Err(_) => dir,
        };
        let deleted = if doomed.starts_with(self.inner.paths.tmp()) {
            self.forget_unrecorded(key);
            drop(txn);
            std::fs::remove_dir_all(&doomed)
        } else {
            let deleted = std::fs::remove_dir_all(&doomed);
            if deleted.is_ok() {
                self.forget_unrecorded(key);
            }
            deleted
        };
        match deleted {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("removing rootfs dirs", &doomed, e)),
        }
    }

    /// Unmounts the key's rootfs at `target` (and where its record says it was mounted),
    /// detaching lazily when busy, and keeps the rest: its upper dir (what the container wrote,
    /// still counted by [`Store::rootfs_usage`]) and its record (the image stays in use) until
    /// [`Store::release_rootfs`]. For a container that has exited, as containerd unmounts a
    /// task's rootfs when it exits. Idempotent; an unknown key is fine.
    pub fn unmount_rootfs(&self, key: &str, target: &Path) -> Result<()> {
        check_key(key)?;
        let _txn = self.inner.index.lock(true)?;
        unmount_targets(&self.inner.paths.container(key), key, target)
    }

    /// After the key's dirs are gone (or out of the way): it holds nothing the store reports.
    fn forget_unrecorded(&self, key: &str) {
        self.inner
            .unrecorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k| k != key);
        self.invalidate_fs_cache();
    }

    /// Keys (containers) currently holding a rootfs.
    pub fn rootfs_keys(&self) -> Result<Vec<String>> {
        let _txn = self.inner.index.lock(false)?;
        Ok(records(&self.inner.paths)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        for good in ["abc", "0123456789abcdef", "a-b_c.d"] {
            check_key(good).unwrap();
        }
        let long = "k".repeat(129);
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", long.as_str()] {
            assert_eq!(
                check_key(bad).unwrap_err().kind(),
                crate::Kind::InvalidArgument,
                "{bad:?}"
            );
        }
    }
}
