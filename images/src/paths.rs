//! Where things live under the store root: blobs, layer snapshots, container rootfs dirs, the
//! staging area and the index. Snapshot dirs are numbered to keep overlay lowerdir options short.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory layout of a store.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub root: PathBuf,
}

static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Paths {
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// The file of a blob; `hex` must be validated already (see `digest::hex_of`).
    pub fn blob(&self, hex: &str) -> PathBuf {
        self.blobs().join(hex)
    }

    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// A snapshot's directory (holding `fs`).
    pub fn snapshot(&self, id: u64) -> PathBuf {
        self.snapshots().join(id.to_string())
    }

    /// A snapshot's unpacked layer, used as an overlay lowerdir.
    pub fn snapshot_fs(&self, id: u64) -> PathBuf {
        self.snapshot(id).join("fs")
    }

    pub fn containers(&self) -> PathBuf {
        self.root.join("containers")
    }

    pub fn container(&self, key: &str) -> PathBuf {
        self.containers().join(key)
    }

    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn index(&self) -> PathBuf {
        self.root.join("images.json")
    }

    /// The index's previous generation.
    pub fn index_prev(&self) -> PathBuf {
        self.root.join("images.json.prev")
    }

    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// Where state files that could not be read are set aside.
    pub fn corrupt(&self) -> PathBuf {
        self.root.join("corrupt")
    }

    /// Creates the directory tree.
    pub fn create(&self) -> Result<()> {
        for dir in [
            self.blobs(),
            self.snapshots(),
            self.containers(),
            self.tmp(),
        ] {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating store dir", &dir, e))?;
        }
        Ok(())
    }

    /// A fresh directory under tmp/ named `<pid>-<n>-<purpose>`, so that stale ones left by a
    /// dead process can be recognised and removed.
    pub fn new_staging_dir(&self, purpose: &str) -> Result<PathBuf> {
        let n = STAGING_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .tmp()
            .join(format!("{}-{}-{}", std::process::id(), n, purpose));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating staging dir", &dir, e))?;
        Ok(dir)
    }

    /// Removes staging dirs whose owning process is gone.
    pub fn clean_stale_staging(&self) {
        let Ok(entries) = std::fs::read_dir(self.tmp()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists());
            if !alive {
                let path = entry.path();
                let result = match entry.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
                    _ => std::fs::remove_file(&path),
                };
                if let Err(e) = result {
                    tracing::warn!(path = %path.display(), error = %e, "removing stale staging entry");
                }
            }
        }
    }
}

/// A staging directory removed (recursively) when dropped.
#[derive(Debug)]
pub(crate) struct Staging {
    pub dir: PathBuf,
}

impl Staging {
    pub fn new(paths: &Paths, purpose: &str) -> Result<Staging> {
        Ok(Staging {
            dir: paths.new_staging_dir(purpose)?,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.dir.display(), error = %e, "removing staging dir");
            }
        }
    }
}

/// Writes `data` to `path` atomically: a temp file beside it, fsync, rename, fsync the dir.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_replacing(path, data, true)
}

/// [`write_atomic`] without the fsyncs, for what need not outlive a crash of the node: a reader
/// sees the old file or the new one, but after a crash possibly neither (set aside at open).
pub(crate) fn write_atomic_volatile(path: &Path, data: &[u8]) -> Result<()> {
    write_replacing(path, data, false)
}

fn write_replacing(path: &Path, data: &[u8], durable: bool) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = STAGING_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(data)?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io("writing", path, e))
}
