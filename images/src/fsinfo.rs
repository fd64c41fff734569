//! Disk usage of the store: a walk of the root on its own filesystem (mounted container rootfs
//! are not entered), counting allocated bytes and inodes once per hard-linked inode. The result
//! is reused for a few seconds unless the store changed in this process.

use crate::error::{Error, Result};
use crate::store::Store;
use crate::types::FsInfo;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a walk's result is reused.
const CACHE_FOR: Duration = Duration::from_secs(5);

pub(crate) fn fs_info(store: &Store) -> Result<FsInfo> {
    if let Ok(cache) = store.inner.fs_cache.lock() {
        if let Some((at, info)) = cache.as_ref() {
            if at.elapsed() < CACHE_FOR {
                return Ok(info.clone());
            }
        }
    }
    let root = &store.inner.paths.root;
    let info = walk(root)?;
    if let Ok(mut cache) = store.inner.fs_cache.lock() {
        *cache = Some((Instant::now(), info.clone()));
    }
    Ok(info)
}

/// Walks `root`, staying on its device.
pub(crate) fn walk(root: &Path) -> Result<FsInfo> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| Error::io("inspecting", root, e))?;
    let dev = meta.dev();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut used_bytes = meta.blocks() * 512;
    let mut inodes_used = 1u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Removed while we walk (a concurrent GC or release): skip it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("reading directory", &dir, e)),
        };
        for entry in entries.flatten() {
            let Ok(m) = entry.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            if m.nlink() > 1 && !m.is_dir() && !seen.insert(m.ino()) {
                continue;
            }
            used_bytes += m.blocks() * 512;
            inodes_used += 1;
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(FsInfo {
        mountpoint: root.to_path_buf(),
        used_bytes,
        inodes_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        let before = walk(dir.path()).unwrap();
        assert_eq!(before.inodes_used, 1);
        std::fs::write(dir.path().join("a"), vec![1u8; 100_000]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let after = walk(dir.path()).unwrap();
        assert_eq!(after.inodes_used, 3, "root, a (= b), d");
        assert!(after.used_bytes >= before.used_bytes + 100_000, "{after:?}");
        assert!(
            after.used_bytes < before.used_bytes + 200_000,
            "hard link counted once: {after:?}"
        );
        assert_eq!(after.mountpoint, dir.path());
    }
}
