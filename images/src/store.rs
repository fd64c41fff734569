//! The image store: opening it, importing archives, committing staged images, listing,
//! resolving references, and removing images with garbage collection of the blobs and snapshots
//! no image needs any more.

use crate::error::{Error, Result};
use crate::index::{ImageRecord, Index, State, Txn};
use crate::paths::Paths;
use crate::source::Source;
use crate::stage::{Candidate, Stage};
use crate::types::{FsInfo, Image};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// An image store rooted at a directory. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub paths: Paths,
    pub index: Index,
    /// The last disk-usage walk, reused for a few seconds unless the store changed.
    pub fs_cache: Mutex<Option<(Instant, FsInfo)>>,
    /// Rootfs keys whose records were set aside at open and not restored since.
    pub unrecorded: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.inner.paths.root)
            .finish()
    }
}

impl Store {
    /// Opens (creating if missing) the store at `root`, e.g. `/var/lib/nodelet/images`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| Error::io("creating store root", &root, e))?;
        // Absolute and symlink-free: overlay options and mountinfo comparisons rely on it.
        let root = root
            .canonicalize()
            .map_err(|e| Error::io("resolving store root", &root, e))?;
        let paths = Paths { root };
        paths.create()?;
        let store = Store {
            inner: Arc::new(Inner {
                index: Index::new(paths.clone()),
                paths,
                fs_cache: Mutex::new(None),
                unrecorded: Mutex::new(Vec::new()),
            }),
        };
        {
            let mut txn = store.inner.index.lock(true)?;
            store.inner.paths.clean_stale_staging();
            store.recover_unreadable(&mut txn)?;
        }
        Ok(store)
    }

    /// At open, with the index locked: an unreadable index is set aside and rebuilt from the
    /// content on disk, unreadable rootfs records are set aside (their keys kept for
    /// [`Store::unrecorded_rootfs`]), and snapshots get the markers a rebuild needs.
    fn recover_unreadable(&self, txn: &mut Txn<'_>) -> Result<()> {
        let paths = &self.inner.paths;
        match txn.state() {
            Ok(state) => crate::recover::mark_snapshots(paths, &state.clone()),
            Err(Error::Json { op, source, .. }) if op == crate::index::PARSING => {
                crate::recover::set_aside(
                    paths,
                    &paths.index(),
                    "images.json",
                    &source.to_string(),
                );
                let state = crate::recover::rebuild(paths, crate::index::VERSION);
                tracing::warn!(
                    images = state.images.len(),
                    snapshots = state.snapshots.len(),
                    "rebuilt the image index from the store's content"
                );
                txn.save(state)?;
            }
            Err(e) => return Err(e),
        }
        let unreadable = crate::rootfs::set_aside_unreadable(paths);
        *self
            .inner
            .unrecorded
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = unreadable;
        Ok(())
    }

    /// The rootfs keys whose records were unreadable at open and set aside: their dirs (and
    /// mounts) are still there, but the store no longer knows which image they hold until the
    /// owner says so again ([`Store::restore_rootfs_record`]) or releases them.
    pub fn unrecorded_rootfs(&self) -> Vec<String> {
        self.inner
            .unrecorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.inner.paths.root
    }

    /// Imports an OCI image layout directory, an OCI archive (tar, optionally gzip) or a
    /// `docker save` archive. Returns the images imported. Nothing of a refused input stays in
    /// the store.
    pub fn import(&self, path: &Path) -> Result<Vec<Image>> {
        let mut stage = Stage::new(&self.inner.paths, "import")?;
        let scratch = stage.scratch("archive");
        let src = Source::open(path, &scratch)?;
        let candidates = crate::import::read_source(&src, &mut stage)?;
        self.commit(&mut stage, candidates)
    }

    /// All images, ordered by id.
    pub fn list(&self) -> Result<Vec<Image>> {
        let mut txn = self.inner.index.lock(false)?;
        let state = txn.state()?;
        Ok(state.images.values().map(|r| r.image.clone()).collect())
    }

    /// Finds an image by name (normalised), by id (`sha256:<hex>`, the hex, or a unique hex
    /// prefix of at least 12 characters) or by repo digest (`name@sha256:...`).
    pub fn resolve(&self, reference: &str) -> Result<Option<Image>> {
        let mut txn = self.inner.index.lock(false)?;
        let state = txn.state()?;
        Ok(find(state, reference)?.map(|r| r.image.clone()))
    }

    /// Pins (or unpins) the image `reference` resolves to: a pinned image is never garbage
    /// collected (CRI `Image.pinned`). Returns the image.
    pub fn set_pinned(&self, reference: &str, pinned: bool) -> Result<Image> {
        let mut txn = self.inner.index.lock(true)?;
        let mut state = txn.state()?.clone();
        let Some(id) = find(&state, reference)?.map(|r| r.image.id.clone()) else {
            return Err(Error::ImageNotFound {
                reference: reference.to_string(),
            });
        };
        let Some(record) = state.images.get_mut(&id) else {
            return Err(Error::ImageNotFound {
                reference: reference.to_string(),
            });
        };
        let image = if record.image.pinned == pinned {
            record.image.clone()
        } else {
            record.image.pinned = pinned;
            let image = record.image.clone();
            txn.save(state)?;
            image
        };
        Ok(image)
    }

    /// Removes the image `reference` resolves to, with all its tags; then deletes the blobs and
    /// snapshots no image needs. Refused (InUse) while a prepared rootfs uses the image.
    pub fn remove(&self, reference: &str) -> Result<()> {
        let mut txn = self.inner.index.lock(true)?;
        let mut state = txn.state()?.clone();
        let Some(id) = find(&state, reference)?.map(|r| r.image.id.clone()) else {
            return Err(Error::ImageNotFound {
                reference: reference.to_string(),
            });
        };
        let mut users: Vec<String> = crate::rootfs::records(&self.inner.paths)?
            .into_iter()
            .filter(|(_, r)| r.image_id == id)
            .map(|(key, _)| key)
            .collect();
        // A rootfs whose record was set aside may hold this image: keep every image until its
        // owner restores or releases it.
        users.extend(self.unrecorded_rootfs());
        if !users.is_empty() {
            return Err(Error::InUse {
                image: id,
                keys: users,
            });
        }
        state.images.remove(&id);
        let layers = state.referenced_layers();
        let dead_snapshots: Vec<u64> = state
            .snapshots
            .iter()
            .filter(|(diff_id, _)| !layers.contains(*diff_id))
            .map(|(_, n)| *n)
            .collect();
        state
            .snapshots
            .retain(|diff_id, _| layers.contains(diff_id));
        txn.save(state.clone())?;
        for n in dead_snapshots {
            remove_tree(&self.inner.paths.snapshot(n));
        }
        self.sweep(&state);
        self.invalidate_fs_cache();
        Ok(())
    }

    /// Deletes blobs and snapshot dirs the index does not mention (the rest of a crash, or of
    /// a removed image). Called with the index locked exclusively.
    fn sweep(&self, state: &State) {
        let blobs = state.referenced_blobs();
        if let Ok(entries) = std::fs::read_dir(self.inner.paths.blobs()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !blobs.contains(&format!("sha256:{name}")) {
                    let path = entry.path();
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!(path = %path.display(), error = %e, "removing blob");
                    }
                }
            }
        }
        let live: BTreeSet<String> = state.snapshots.values().map(u64::to_string).collect();
        if let Ok(entries) = std::fs::read_dir(self.inner.paths.snapshots()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !live.contains(&name) {
                    remove_tree(&entry.path());
                }
            }
        }
    }

    /// Unpacks what the candidates still need and moves their blobs, snapshots and records into
    /// the store. Layers are unpacked outside the exclusive lock; moving in happens under it.
    pub(crate) fn commit(
        &self,
        stage: &mut Stage,
        candidates: Vec<Candidate>,
    ) -> Result<Vec<Image>> {
        let existing: BTreeSet<String> = {
            let mut txn = self.inner.index.lock(false)?;
            txn.state()?.snapshots.keys().cloned().collect()
        };
        for candidate in &candidates {
            stage.unpack_missing(candidate, &existing)?;
        }
        let mut txn = self.inner.index.lock(true)?;
        let mut state = txn.state()?.clone();
        stage.commit_blobs()?;
        // A blob found in the store while staging may have been removed since by another
        // process's garbage collection: refuse rather than record an incomplete image.
        for candidate in &candidates {
            for digest in &candidate.blobs {
                let path = self
                    .inner
                    .paths
                    .blob(crate::digest::hex_of(digest, "blob")?);
                if !path.exists() {
                    return Err(Error::io(
                        "committing image (a blob was removed concurrently; retry)",
                        path,
                        std::io::Error::from(std::io::ErrorKind::NotFound),
                    ));
                }
            }
        }
        for candidate in &candidates {
            for layer in &candidate.layers {
                if state.snapshots.contains_key(&layer.diff_id) {
                    continue;
                }
                let staged = match stage.snapshots.remove(&layer.diff_id) {
                    Some(dir) => dir,
                    // Removed by another process since we looked: unpack it now.
                    None => {
                        let dir = stage.unpack(layer)?;
                        stage.snapshots.remove(&layer.diff_id);
                        dir
                    }
                };
                let n = state.next_snapshot.max(1);
                state.next_snapshot = n + 1;
                let dest = self.inner.paths.snapshot(n);
                // Left by a commit that crashed before saving the index.
                remove_tree(&dest);
                std::fs::rename(&staged, &dest)
                    .map_err(|e| Error::io("committing snapshot", &dest, e))?;
                state.snapshots.insert(layer.diff_id.clone(), n);
            }
        }
        let mut ids = Vec::new();
        for candidate in &candidates {
            let record = candidate.record();
            let id = record.image.id.clone();
            state.untag_others(&record.image.repo_tags, &id);
            match state.images.get_mut(&id) {
                Some(existing) => merge(existing, record),
                None => {
                    state.images.insert(id.clone(), record);
                }
            }
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let images = ids
            .iter()
            .filter_map(|id| state.images.get(id).map(|r| r.image.clone()))
            .collect();
        // An import or pull of what is there already changes nothing: no write, no fsync.
        if state != *txn.state()? {
            txn.save(state)?;
        }
        self.invalidate_fs_cache();
        Ok(images)
    }

    pub(crate) fn invalidate_fs_cache(&self) {
        if let Ok(mut cache) = self.inner.fs_cache.lock() {
            *cache = None;
        }
    }

    /// Bytes and inodes used under the store root.
    pub fn fs_info(&self) -> Result<FsInfo> {
        crate::fsinfo::fs_info(self)
    }
}

/// Folds a newly committed record of an existing image into it.
fn merge(existing: &mut ImageRecord, new: ImageRecord) {
    for tag in new.image.repo_tags {
        if !existing.image.repo_tags.contains(&tag) {
            existing.image.repo_tags.push(tag);
        }
    }
    for digest in new.image.repo_digests {
        if !existing.image.repo_digests.contains(&digest) {
            existing.image.repo_digests.push(digest);
        }
    }
    existing.blobs.extend(new.blobs);
    existing.image.manifest_digest = new.image.manifest_digest;
    existing.image.size = new.image.size;
    existing.image.config = new.image.config;
}

fn remove_tree(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "removing");
        }
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Looks a reference up in the index (see [`Store::resolve`]).
pub(crate) fn find<'a>(state: &'a State, reference: &str) -> Result<Option<&'a ImageRecord>> {
    // Image ids, in full.
    let hex = reference.strip_prefix("sha256:").unwrap_or(reference);
    if hex.len() == 64 && is_hex(hex) {
        return Ok(state.images.get(&format!("sha256:{hex}")));
    }
    // Names and repo digests.
    let parsed = crate::reference::parse(reference);
    if let Ok(r) = &parsed {
        let found = match &r.digest {
            Some(digest) => {
                let repo = r.name();
                let wanted = format!("{repo}@{digest}");
                state.images.values().find(|rec| {
                    rec.image.repo_digests.contains(&wanted)
                        || (&rec.image.manifest_digest == digest
                            && rec
                                .image
                                .repo_digests
                                .iter()
                                .any(|d| d.split('@').next() == Some(repo.as_str())))
                })
            }
            None => {
                let full = r.to_string();
                state
                    .images
                    .values()
                    .find(|rec| rec.image.repo_tags.contains(&full))
            }
        };
        if found.is_some() {
            return Ok(found);
        }
    }
    // Unique id prefixes of at least 12 hex characters.
    if hex.len() >= 12 && is_hex(hex) {
        let prefix = format!("sha256:{hex}");
        let mut matches = state
            .images
            .values()
            .filter(|r| r.image.id.starts_with(&prefix));
        let first = matches.next();
        if first.is_some() && matches.next().is_some() {
            return Err(Error::InvalidReference {
                reference: reference.to_string(),
                reason: "id prefix matches more than one image".to_string(),
            });
        }
        if first.is_some() {
            return Ok(first);
        }
    }
    match parsed {
        Ok(_) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
