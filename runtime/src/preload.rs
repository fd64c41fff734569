//! The preload dir (as k3s's `agent/images`), for nodes without a registry: every file or
//! directory in it is an image to import (an OCI layout, an OCI archive or a `docker save`
//! tar, plain, gzip or zstd) into the built-in store or, on a node whose runtime is
//! containerd, into containerd's `k8s.io` namespace through containerd's own API
//! ([`crate::remote::containerd`]), and every `*.txt` a list of
//! references to pull (one a line, `#` comments) once a registry answers. The dir is scanned
//! at start and every [`SCAN_INTERVAL`]; a file is imported when it is new or changed (its
//! size, modification time or inode differ from what `preload.json` in the root dir
//! remembers, so a restart imports nothing again), once it has not changed for
//! [`SETTLE`] (a file being copied in is not read half-written). What a file brought is
//! pinned (never garbage collected) and unpinned once the file is gone. A file that cannot be
//! imported is logged with its name and the reason, and tried again when it changes; the store
//! keeps nothing of a failed import, and every other file is still imported.
//!
//! At start, [`Preload::scan_files`] imports the files before the node runs any pod (as k3s
//! imports `agent/images` before its kubelet starts), so a pod whose image came only through
//! the dir does not fail its first sync; the lists, which need a registry and may wait for
//! one, are left to the scans that follow.
//!
//! In containerd, pinning is the `io.cri-containerd.pinned` label on the image records, which
//! containerd reports as CRI `Image.pinned` from 1.7 on; for older ones, [`PinnedImages`]
//! adds what the preload pinned to the `pinned` the runtime reports, so the kubelet's image
//! garbage collection keeps them all the same.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

#[cfg(feature = "builtin")]
use crate::builtin::BuiltinRuntime;
#[cfg(feature = "remote")]
use crate::remote::{RemoteRuntime, containerd::Containerd};
use crate::{ImageService, cri};

/// How often the dir is scanned.
pub const SCAN_INTERVAL: Duration = Duration::from_secs(10);
/// How long a file must stay unchanged before it is imported.
pub const SETTLE: Duration = Duration::from_secs(2);
/// The record of what was imported, in the root dir.
const STATE_FILE: &str = "preload.json";

/// What the preload dir's scanner remembers of one entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// Size, modification time and inode when it was last tried (for a layout dir: its
    /// `index.json`'s).
    fingerprint: String,
    /// The images it brought, pinned: ids in the built-in store, image record names
    /// (`repo:tag`, `repo@digest`) in containerd.
    images: Vec<String>,
    /// Why its last import failed (tried again once it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What one scan did, file by file (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Files imported (or lists fully pulled) now, with the references they brought.
    pub imported: Vec<(String, Vec<String>)>,
    /// Files unchanged since they were imported.
    pub unchanged: Vec<String>,
    /// Files that failed now, or failed before and have not changed: the file and why.
    pub failed: Vec<(String, String)>,
    /// Files gone since the last scan, whose images were unpinned.
    pub removed: Vec<String>,
    /// Files still being written (changed within [`SETTLE`]).
    pub settling: Vec<String>,
}

/// Where the images go.
enum Target {
    #[cfg(feature = "builtin")]
    Builtin(BuiltinRuntime),
    #[cfg(feature = "remote")]
    Containerd(Box<ContainerdTarget>),
}

/// What the preload needs of containerd.
#[cfg(feature = "remote")]
struct ContainerdTarget {
    ctd: Containerd,
    /// containerd's CRI service, for the lists' pulls and to see the imports arrive.
    cri: RemoteRuntime,
    /// Where archives are staged.
    scratch: PathBuf,
}

/// The image names (containerd's records) the preload pinned, shared with [`PinnedImages`].
pub type Pins = Arc<RwLock<BTreeSet<String>>>;

/// The scanner of one preload dir for one runtime.
pub struct Preload {
    target: Target,
    pins: Pins,
    dir: PathBuf,
    state_path: PathBuf,
    entries: BTreeMap<String, Entry>,
    /// What the record on disk holds (written again only when it changes).
    saved: BTreeMap<String, Entry>,
    scans: u64,
}

#[cfg(feature = "builtin")]
impl BuiltinRuntime {
    /// The scanner of `dir` (see the module's doc); its record lives in the root dir.
    pub fn preload(&self, dir: &Path) -> Preload {
        Preload::new(Target::Builtin(self.clone()), self.root_dir(), dir)
    }
}

impl Preload {
    /// The scanner of `dir` importing into containerd (`ctd`, whose CRI service is `cri`);
    /// its record and its scratch space live in `root_dir`.
    #[cfg(feature = "remote")]
    pub fn containerd(ctd: Containerd, cri: RemoteRuntime, root_dir: &Path, dir: &Path) -> Preload {
        let target = Target::Containerd(Box::new(ContainerdTarget {
            ctd,
            cri,
            scratch: crate::remote::containerd::scratch_dir(root_dir),
        }));
        Preload::new(target, root_dir, dir)
    }

    fn new(target: Target, root_dir: &Path, dir: &Path) -> Preload {
        let state_path = root_dir.join(STATE_FILE);
        let entries: BTreeMap<String, Entry> = std::fs::read(&state_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        // What earlier runs pinned stays pinned (in containerd, the labels stayed too).
        let pinned: BTreeSet<String> = entries
            .values()
            .filter(|e| e.error.is_none())
            .flat_map(|e| e.images.iter().cloned())
            .collect();
        Preload {
            target,
            pins: Arc::new(RwLock::new(pinned)),
            dir: dir.to_path_buf(),
            state_path,
            saved: entries.clone(),
            entries,
            scans: 0,
        }
    }

    /// What this preload pinned, kept current (see [`PinnedImages`]).
    pub fn pins(&self) -> Pins {
        self.pins.clone()
    }
}

/// A file's identity for "has it changed": size, modification time (ns) and inode.
fn fingerprint(path: &Path) -> Option<(String, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    let meta = if meta.is_dir() {
        std::fs::metadata(path.join("index.json")).ok()?
    } else {
        meta
    };
    let modified = meta.modified().ok()?;
    let ns = modified
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Some((format!("{}-{ns}-{}", meta.len(), meta.ino()), modified))
}

/// The references of a `*.txt` list: one a line, blank lines and `#` comments skipped.
pub fn references(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

impl Preload {
    /// Scans every [`SCAN_INTERVAL`] until `stop` completes.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            self.scan().await;
            tokio::select! {
                _ = tokio::time::sleep(SCAN_INTERVAL) => {}
                _ = &mut stop => return,
            }
        }
    }

    /// One scan of the dir: imports what is new or changed, pulls the lists' references,
    /// unpins what a gone file brought, and logs a line per file.
    pub async fn scan(&mut self) -> Scan {
        self.scan_with(true).await
    }

    /// One scan that imports the files and leaves the `*.txt` lists for later: what the node
    /// waits for at start.
    pub async fn scan_files(&mut self) -> Scan {
        self.scan_with(false).await
    }

    async fn scan_with(&mut self, lists: bool) -> Scan {
        let first = self.scans == 0;
        self.scans += 1;
        let mut scan = Scan::default();
        let names = match std::fs::read_dir(&self.dir) {
            Ok(rd) => {
                let mut names: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect();
                names.sort();
                names
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "image preload: reading the dir: {e}");
                return scan;
            }
        };
        for name in &names {
            if !lists && name.ends_with(".txt") {
                continue;
            }
            self.scan_one(name, first, &mut scan).await;
        }
        let gone: Vec<String> = self
            .entries
            .keys()
            .filter(|k| !names.contains(k))
            .cloned()
            .collect();
        for name in gone {
            if let Some(entry) = self.entries.remove(&name) {
                self.unpin(&entry.images).await;
                tracing::info!(file = %name, "image preload: file gone; its images unpinned");
                scan.removed.push(name);
            }
        }
        self.save();
        scan
    }

    async fn scan_one(&mut self, name: &str, first: bool, scan: &mut Scan) {
        let path = self.dir.join(name);
        let Some((print, modified)) = fingerprint(&path) else {
            return;
        };
        let known = self.entries.get(name).cloned();
        if let Some(e) = known.as_ref().filter(|e| e.fingerprint == print) {
            match &e.error {
                Some(why) => scan.failed.push((name.to_string(), why.clone())),
                None => {
                    if first {
                        tracing::info!(file = %name, "image preload: unchanged");
                    }
                    scan.unchanged.push(name.to_string());
                }
            }
            return;
        }
        let age = SystemTime::now()
            .duration_since(modified)
            .unwrap_or(Duration::ZERO);
        if age < SETTLE {
            scan.settling.push(name.to_string());
            return;
        }
        let outcome = if name.ends_with(".txt") {
            self.pull_list(&path).await
        } else {
            self.import(&path).await
        };
        let old_images = known.map(|e| e.images).unwrap_or_default();
        match outcome {
            Ok((images, refs)) => {
                tracing::info!(file = %name, images = ?refs, "image preload: imported");
                let dropped: Vec<String> = old_images
                    .into_iter()
                    .filter(|i| !images.contains(i))
                    .collect();
                self.entries.insert(
                    name.to_string(),
                    Entry {
                        fingerprint: print,
                        images,
                        error: None,
                    },
                );
                self.unpin(&dropped).await;
                scan.imported.push((name.to_string(), refs));
            }
            Err(Failure::Retry(why)) => {
                tracing::warn!(file = %name, "image preload: {why}; trying again in {SCAN_INTERVAL:?}");
                scan.failed.push((name.to_string(), why));
            }
            Err(Failure::UntilChanged(why)) => {
                tracing::error!(file = %name, "image preload: {why}; tried again when the file changes");
                self.entries.insert(
                    name.to_string(),
                    Entry {
                        fingerprint: print,
                        images: old_images,
                        error: Some(why.clone()),
                    },
                );
                scan.failed.push((name.to_string(), why));
            }
        }
    }

    /// Imports an archive or layout and pins its images: what [`Entry::images`] holds, and
    /// their references.
    async fn import(&self, path: &Path) -> Result<(Vec<String>, Vec<String>), Failure> {
        match &self.target {
            #[cfg(feature = "builtin")]
            Target::Builtin(rt) => {
                let store = rt.image_store().clone();
                let p = path.to_path_buf();
                let imported = tokio::task::spawn_blocking(move || store.import(&p))
                    .await
                    .map_err(|e| Failure::Retry(format!("importing: {e}")))?
                    .map_err(|e| Failure::UntilChanged(e.to_string()))?;
                let mut ids = Vec::new();
                let mut refs = Vec::new();
                for img in imported {
                    self.pin(&img.id).await?;
                    refs.extend(img.repo_tags.iter().cloned());
                    if img.repo_tags.is_empty() {
                        refs.push(img.id.clone());
                    }
                    ids.push(img.id);
                }
                Ok((ids, refs))
            }
            #[cfg(feature = "remote")]
            Target::Containerd(t) => {
                let (ctd, cri, scratch) = (&t.ctd, &t.cri, &t.scratch);
                let imported = ctd.import(path, scratch, true).await.map_err(|e| {
                    if e.code() == crate::Code::InvalidArgument {
                        Failure::UntilChanged(e.message().to_string())
                    } else {
                        Failure::Retry(e.to_string())
                    }
                })?;
                let mut records = Vec::new();
                let mut refs = Vec::new();
                for img in imported {
                    if let Some(name) = img.names.first() {
                        wait_listed(cri, name).await?;
                    }
                    self.pins
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(img.records.iter().cloned());
                    refs.extend(img.names);
                    records.extend(img.records);
                }
                Ok((records, refs))
            }
        }
    }

    /// Pulls the references a list names that the runtime lacks, and pins them all. A
    /// reference that cannot be pulled (no registry yet) is tried again at the next scan.
    async fn pull_list(&self, path: &Path) -> Result<(Vec<String>, Vec<String>), Failure> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::UntilChanged(format!("reading the list: {e}")))?;
        let refs = references(&text);
        let mut keys = Vec::new();
        for r in &refs {
            for key in self.pull_one(r).await? {
                self.pin(&key).await?;
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        Ok((keys, refs))
    }

    /// Pulls `reference` unless the runtime has it; what to pin for it.
    async fn pull_one(&self, reference: &str) -> Result<Vec<String>, Failure> {
        match &self.target {
            #[cfg(feature = "builtin")]
            Target::Builtin(rt) => match rt.image_store().resolve(reference).ok().flatten() {
                Some(img) => Ok(vec![img.id]),
                None => Ok(vec![pull(rt, reference).await?]),
            },
            #[cfg(feature = "remote")]
            Target::Containerd(t) => {
                let cri = &t.cri;
                let image = match image_status(cri, reference).await? {
                    Some(img) => img,
                    None => {
                        let id = pull(cri, reference).await?;
                        image_status(cri, &id).await?.ok_or_else(|| {
                            Failure::Retry(format!("{reference} was pulled but is not listed"))
                        })?
                    }
                };
                Ok(image
                    .repo_tags
                    .into_iter()
                    .chain(image.repo_digests)
                    .collect())
            }
        }
    }

    async fn pin(&self, key: &str) -> Result<(), Failure> {
        match &self.target {
            #[cfg(feature = "builtin")]
            Target::Builtin(rt) => rt
                .image_store()
                .set_pinned(key, true)
                .map(|_| ())
                .map_err(|e| Failure::Retry(format!("pinning {key}: {e}"))),
            #[cfg(feature = "remote")]
            Target::Containerd(t) => {
                let ctd = &t.ctd;
                ctd.set_pinned(key, true)
                    .await
                    .map_err(|e| Failure::Retry(format!("pinning {key}: {e}")))?;
                self.pins
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.to_string());
                Ok(())
            }
        }
    }

    /// Unpins `images` unless another file still brings them.
    async fn unpin(&self, images: &[String]) {
        for key in images {
            if self.entries.values().any(|e| e.images.contains(key)) {
                continue;
            }
            match &self.target {
                #[cfg(feature = "builtin")]
                Target::Builtin(rt) => match rt.image_store().set_pinned(key, false) {
                    Ok(_) | Err(images::Error::ImageNotFound { .. }) => {}
                    Err(e) => tracing::warn!("image preload: unpinning {key}: {e}"),
                },
                #[cfg(feature = "remote")]
                Target::Containerd(t) => {
                    let ctd = &t.ctd;
                    self.pins
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(key);
                    if let Err(e) = ctd.set_pinned(key, false).await {
                        tracing::warn!("image preload: unpinning {key}: {e}");
                    }
                }
            }
        }
    }

    /// Writes the record (atomically) when it changed; a failure is logged (the next start
    /// imports again).
    fn save(&mut self) {
        if self.entries == self.saved {
            return;
        }
        self.saved = self.entries.clone();
        let tmp = self.state_path.with_extension("json.tmp");
        let write = serde_json::to_vec_pretty(&self.entries)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &self.state_path));
        if let Err(e) = write {
            tracing::warn!(path = %self.state_path.display(), "image preload: saving its record: {e}");
        }
    }
}

/// Pulls `reference`; the image reference the runtime returns.
async fn pull(rt: &dyn ImageService, reference: &str) -> Result<String, Failure> {
    let req = cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: reference.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    rt.pull_image(req)
        .await
        .map(|r| r.image_ref)
        .map_err(|e| Failure::Retry(format!("pulling {reference}: {e}")))
}

/// The image `reference` names in a CRI runtime, if any.
#[cfg(feature = "remote")]
async fn image_status(rt: &RemoteRuntime, reference: &str) -> Result<Option<cri::Image>, Failure> {
    let req = cri::ImageStatusRequest {
        image: Some(cri::ImageSpec {
            image: reference.to_string(),
            ..Default::default()
        }),
        verbose: false,
    };
    rt.image_status(req)
        .await
        .map(|r| r.image)
        .map_err(|e| Failure::Retry(format!("image status of {reference}: {e}")))
}

/// How long an imported image may take to appear in containerd's CRI service (which learns of
/// new images from containerd's events).
#[cfg(feature = "remote")]
const LISTED_WITHIN: Duration = Duration::from_secs(10);

/// Waits until containerd's CRI service lists `name`, so a pod synced right after the import
/// finds its image.
#[cfg(feature = "remote")]
async fn wait_listed(rt: &RemoteRuntime, name: &str) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + LISTED_WITHIN;
    loop {
        if image_status(rt, name).await?.is_some() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Failure::Retry(format!(
                "{name} was imported but containerd's CRI service does not list it after {LISTED_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An image service that also reports as pinned the images a preload pinned in containerd
/// (containerd reports its pinned label from 1.7 on only), so the kubelet's image garbage
/// collection keeps them on any containerd.
pub struct PinnedImages {
    inner: Arc<dyn ImageService>,
    pins: Pins,
}

impl PinnedImages {
    pub fn new(inner: Arc<dyn ImageService>, pins: Pins) -> PinnedImages {
        PinnedImages { inner, pins }
    }

    fn mark(&self, img: &mut cri::Image) {
        let pins = self.pins.read().unwrap_or_else(|p| p.into_inner());
        if img
            .repo_tags
            .iter()
            .chain(&img.repo_digests)
            .any(|n| pins.contains(n))
        {
            img.pinned = true;
        }
    }
}

#[async_trait::async_trait]
impl ImageService for PinnedImages {
    async fn list_images(
        &self,
        req: cri::ListImagesRequest,
    ) -> crate::Result<cri::ListImagesResponse> {
        let mut resp = self.inner.list_images(req).await?;
        for img in &mut resp.images {
            self.mark(img);
        }
        Ok(resp)
    }

    async fn image_status(
        &self,
        req: cri::ImageStatusRequest,
    ) -> crate::Result<cri::ImageStatusResponse> {
        let mut resp = self.inner.image_status(req).await?;
        if let Some(img) = resp.image.as_mut() {
            self.mark(img);
        }
        Ok(resp)
    }

    async fn pull_image(
        &self,
        req: cri::PullImageRequest,
    ) -> crate::Result<cri::PullImageResponse> {
        self.inner.pull_image(req).await
    }

    async fn remove_image(
        &self,
        req: cri::RemoveImageRequest,
    ) -> crate::Result<cri::RemoveImageResponse> {
        self.inner.remove_image(req).await
    }

    async fn image_fs_info(
        &self,
        req: cri::ImageFsInfoRequest,
    ) -> crate::Result<cri::ImageFsInfoResponse> {
        self.inner.image_fs_info(req).await
    }
}

/// Why a file could not be preloaded, and when to try again.
enum Failure {
    /// At the next scan (a registry not reachable yet, a store busy).
    Retry(String),
    /// Once the file changes (it is not an image).
    UntilChanged(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_has_one_reference_a_line_and_comments() {
        assert_eq!(
            references("# images for site 7\nbusybox:1.36\n\n  registry.local/app:v2  # the app\n"),
            ["busybox:1.36", "registry.local/app:v2"]
        );
        assert!(references("").is_empty());
    }
}
