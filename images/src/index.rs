//! The store's persistent index: which images exist (with their names, config and blobs) and
//! which layer snapshots are unpacked. Kept as one JSON file written atomically, guarded by a
//! mutex within the process and an flock on `root/lock` across processes. Reads are cached
//! until the file changes.

use crate::error::{Error, Result};
use crate::paths::{Paths, write_atomic};
use crate::types::Image;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, MutexGuard};

pub(crate) const VERSION: u32 = 1;

/// The operation named by the error of an index that does not parse.
pub(crate) const PARSING: &str = "parsing index";

/// Everything the index records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct State {
    pub version: u32,
    /// Images by id.
    pub images: BTreeMap<String, ImageRecord>,
    /// diff_id → snapshot number (root/snapshots/<n>).
    pub snapshots: BTreeMap<String, u64>,
    pub next_snapshot: u64,
}

/// An image and the blobs it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub image: Image,
    /// Digests of every blob of the image: index (if any), manifest, config, layers.
    pub blobs: BTreeSet<String>,
}

impl State {
    /// All blobs some image needs.
    pub fn referenced_blobs(&self) -> BTreeSet<String> {
        self.images
            .values()
            .flat_map(|r| r.blobs.iter().cloned())
            .collect()
    }

    /// All diff_ids some image needs.
    pub fn referenced_layers(&self) -> BTreeSet<String> {
        self.images
            .values()
            .flat_map(|r| r.image.layers.iter().cloned())
            .collect()
    }

    /// Takes `tags` away from every image but `except` (a tag names one image).
    pub fn untag_others(&mut self, tags: &[String], except: &str) {
        for (id, record) in self.images.iter_mut() {
            if id != except {
                record.image.repo_tags.retain(|t| !tags.contains(t));
            }
        }
    }
}

/// Identity of the index file version we cached.
type FileStamp = (u64, u64, u64, i64, i64);

#[derive(Default)]
struct Cache {
    stamp: Option<FileStamp>,
    state: State,
}

/// The index of a store.
pub(crate) struct Index {
    paths: Paths,
    cache: Mutex<Cache>,
}

/// Holds the index locked (in-process and across processes) while alive.
pub(crate) struct Txn<'a> {
    index: &'a Index,
    cache: MutexGuard<'a, Cache>,
    _flock: Flock<File>,
}

impl Index {
    pub fn new(paths: Paths) -> Index {
        Index {
            paths,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// Locks the index. `exclusive` for writers, shared for readers.
    pub fn lock(&self, exclusive: bool) -> Result<Txn<'_>> {
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let path = self.paths.lock();
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("opening lock file", &path, e))?;
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        let flock = Flock::lock(file, arg).map_err(|(_, e)| Error::sys("locking", &path, e))?;
        Ok(Txn {
            index: self,
            cache,
            _flock: flock,
        })
    }
}

impl Txn<'_> {
    /// The current state, re-read when the file changed since the last read.
    pub fn state(&mut self) -> Result<&State> {
        let path = self.index.paths.index();
        let stamp = match std::fs::metadata(&path) {
            Ok(m) => Some((m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io("reading index", &path, e)),
        };
        if stamp.is_none() {
            self.cache.stamp = None;
            self.cache.state = State {
                version: VERSION,
                next_snapshot: 1,
                ..State::default()
            };
        } else if stamp != self.cache.stamp {
            let data = std::fs::read(&path).map_err(|e| Error::io("reading index", &path, e))?;
            let state: State = serde_json::from_slice(&data).map_err(|source| Error::Json {
                op: PARSING,
                path: path.clone(),
                source,
            })?;
            self.cache.state = state;
            self.cache.stamp = stamp;
        }
        Ok(&self.cache.state)
    }

    /// Writes `state` atomically and caches it.
    pub fn save(&mut self, state: State) -> Result<()> {
        let path = self.index.paths.index();
        let data = serde_json::to_vec_pretty(&state).map_err(|source| Error::Json {
            op: "serialising index",
            path: path.clone(),
            source,
        })?;
        // The generation being replaced stays as `images.json.prev` (a link, no copy): if the
        // index is ever found unreadable, the rebuild takes the images' names from it.
        let prev = self.index.paths.index_prev();
        if path.exists() {
            let _ = std::fs::remove_file(&prev);
            let _ = std::fs::hard_link(&path, &prev);
        }
        write_atomic(&path, &data)?;
        // Force a re-read check next time (the stamp of the new file is not taken here, the
        // rename made a new inode; reading it back once is cheap).
        self.cache.stamp = None;
        self.cache.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_reloads_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths {
            root: dir.path().to_path_buf(),
        };
        paths.create().unwrap();
        let index = Index::new(paths.clone());
        let mut txn = index.lock(true).unwrap();
        let mut state = txn.state().unwrap().clone();
        assert!(state.images.is_empty());
        assert_eq!(state.next_snapshot, 1);
        state.snapshots.insert("sha256:x".into(), 7);
        txn.save(state.clone()).unwrap();
        drop(txn);
        // A second index (as another process would) sees the change.
        let other = Index::new(paths.clone());
        let mut txn = other.lock(false).unwrap();
        assert_eq!(txn.state().unwrap(), &state);
        // No temp files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
    }
}
