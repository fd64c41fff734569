//! Image garbage collection (upstream `realImageGCManager`), through CRI so that it works on
//! every runtime. Every period the collector lists the images and the containers (an image is
//! in use while any container, running or not, was made from it), remembers when each image was
//! first seen and last in use (kept in `<root>/image-gc.json`, so that a restarted kubelet still
//! knows what was least recently used), then:
//! - with `imageMaximumGCAge`, removes the unused images not used for longer than that;
//! - when the image filesystem (the `ImageFsInfo` mount point, measured with statvfs) is at or
//!   above `imageGCHighThresholdPercent`, removes unused images, least recently used first,
//!   until it would be below `imageGCLowThresholdPercent`; not enough is a `FreeDiskSpaceFailed`
//!   event on the Node.
//!
//! Never removed: an image in use, the runtime's sandbox image (its verbose `Status` config's
//! `sandboxImage`), a pinned one (CRI `Image.pinned`: `nodelet images pin` on the built-in
//! runtime), or one first seen less than `imageMinimumGCAge` ago.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runtime::{ImageService, RuntimeService, cri};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::api::events::{EventRecorder, EventType, Reason};
use crate::config::ImageGcConfig;
use crate::util::lock;

/// Why a collection did not do what the policy asks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error("the runtime reports no image filesystem")]
    NoImageFs,
    #[error("statvfs {}: {source}", path.display())]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("invalid capacity 0 on image filesystem {}", .0.display())]
    ZeroCapacity(PathBuf),
    /// Upstream's words.
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, \
         but only found {freed} bytes eligible to free."
    )]
    NotEnough { wanted: u64, freed: u64 },
}

/// What the collector knows of one image: seen first, last in use (seconds since the epoch),
/// its size as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    first_detected: u64,
    last_used: Option<u64>,
    size: u64,
}

/// One collection's outcome: the images removed (by id) and the bytes their sizes add to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub removed: Vec<String>,
    pub freed: u64,
}

/// The image garbage collector.
pub struct ImageGc {
    rt: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    policy: ImageGcConfig,
    /// Where the records are kept across restarts.
    state_file: PathBuf,
    records: Mutex<BTreeMap<String, Record>>,
    /// Measures the image filesystem (statvfs; the tests' own).
    space: SpaceFn,
    /// References never collected besides the pinned images (`--pod-infra-container-image`).
    kept: Vec<String>,
}

/// The capacity and available bytes of the filesystem holding a path.
type SpaceFn = Box<dyn Fn(&Path) -> Result<(u64, u64), Error> + Send + Sync>;

impl ImageGc {
    /// A collector with `policy`, its records in `state_file` (read now when there).
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        policy: ImageGcConfig,
        state_file: PathBuf,
    ) -> Self {
        let records = match std::fs::read(&state_file) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %state_file.display(), "image records unreadable, starting afresh: {e}");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        ImageGc {
            rt,
            images,
            policy,
            state_file,
            records: Mutex::new(records),
            space: Box::new(fs_space),
            kept: Vec::new(),
        }
    }

    /// Never collects the images these references name (upstream keeps
    /// `--pod-infra-container-image` for this alone).
    pub fn keeping(mut self, references: Vec<String>) -> Self {
        self.kept = references;
        self
    }

    /// Measures the image filesystem with `space` instead of statvfs.
    #[cfg(test)]
    fn with_space(
        mut self,
        space: impl Fn(&Path) -> Result<(u64, u64), Error> + Send + Sync + 'static,
    ) -> Self {
        self.space = Box::new(space);
        self
    }

    /// Collects every `period` until `cancel` fires, the first time one period after start
    /// (upstream's). A failure twice in a row is an `ImageGCFailed` event on the Node.
    pub async fn run(
        self: Arc<Self>,
        period: Duration,
        events: EventRecorder,
        cancel: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        let mut failed_before = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.collect(runtime::clock::now()).await {
                Ok(report) => {
                    if !report.removed.is_empty() {
                        tracing::info!(removed = ?report.removed, freed = report.freed, "image garbage collection");
                    }
                    failed_before = false;
                }
                Err(e) => {
                    if let Error::NotEnough { .. } = e {
                        let node = events.node_ref();
                        events.event(
                            &node,
                            EventType::Warning,
                            Reason::FreeDiskSpaceFailed,
                            e.to_string(),
                        );
                    }
                    if failed_before {
                        tracing::error!("image garbage collection failed again: {e}");
                        let node = events.node_ref();
                        events.event(
                            &node,
                            EventType::Warning,
                            Reason::ImageGcFailed,
                            e.to_string(),
                        );
                    } else {
                        tracing::warn!("image garbage collection failed: {e}");
                    }
                    failed_before = true;
                }
            }
        }
    }

    /// Removes every image that may go at `now` (upstream's `DeleteUnusedImages`, which the
    /// eviction manager calls under disk pressure): not in use, not pinned, not the sandbox
    /// image, seen at least the minimum age ago.
    pub async fn delete_unused(&self, now: SystemTime) -> Result<Report, Error> {
        let now = secs(now);
        let (images, in_use) = self.detect(now).await?;
        let mut report = Report::default();
        for (id, _) in self.candidates(&images, &in_use, now) {
            self.remove(&id, &mut report).await;
        }
        Ok(report)
    }

    /// One collection at `now` (see the module's documentation).
    pub async fn collect(&self, now: SystemTime) -> Result<Report, Error> {
        let now = secs(now);
        let (images, in_use) = self.detect(now).await?;
        let mut report = Report::default();
        if let Some(max) = self.policy.maximum_age {
            let old = |r: &Record| {
                now.saturating_sub(r.last_used.unwrap_or(r.first_detected)) > max.as_secs()
            };
            let candidates = self.candidates(&images, &in_use, now);
            for id in candidates
                .into_iter()
                .filter(|(_, r)| old(r))
                .map(|(id, _)| id)
            {
                self.remove(&id, &mut report).await;
            }
        }
        if self.policy.high_threshold_percent >= 100 {
            return Ok(report);
        }
        let (capacity, available) = self.image_fs().await?;
        let usage = 100 - available.saturating_mul(100) / capacity;
        if usage < u64::from(self.policy.high_threshold_percent) {
            return Ok(report);
        }
        let low = u64::from(self.policy.low_threshold_percent);
        let wanted = (capacity.saturating_mul(100 - low) / 100).saturating_sub(available);
        tracing::info!(
            usage,
            high = self.policy.high_threshold_percent,
            wanted,
            "image filesystem over the high threshold"
        );
        let before = report.freed;
        for (id, _) in self.candidates(&images, &in_use, now) {
            if report.freed - before >= wanted {
                break;
            }
            self.remove(&id, &mut report).await;
        }
        let freed = report.freed - before;
        if freed < wanted {
            return Err(Error::NotEnough { wanted, freed });
        }
        Ok(report)
    }

    /// Lists the images and containers; records each image (first seen now, or in use now)
    /// and forgets those gone; keeps the records on disk. Returns the images and the ids of
    /// those in use.
    async fn detect(&self, now: u64) -> Result<(Vec<cri::Image>, HashSet<String>), Error> {
        let images = self
            .images
            .list_images(cri::ListImagesRequest { filter: None })
            .await?
            .images;
        let containers = self
            .rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await?
            .containers;
        let mut in_use = HashSet::new();
        // The runtime's sandbox image is always in use, pinned or not (a containerd before 1.7
        // does not pin it; upstream's collector kept it the same way), and so are the images
        // the kubelet was told to keep.
        let kept = self
            .sandbox_image()
            .await
            .into_iter()
            .chain(self.kept.clone());
        for reference in kept {
            let full = normalize(&reference);
            for img in images.iter().filter(|i| {
                i.repo_tags
                    .iter()
                    .chain(&i.repo_digests)
                    .any(|t| *t == reference || *t == full)
            }) {
                in_use.insert(img.id.clone());
            }
        }
        for c in &containers {
            let named = c
                .image
                .as_ref()
                .map(|i| i.image.as_str())
                .unwrap_or_default();
            for img in &images {
                let names = img.repo_tags.iter().chain(&img.repo_digests);
                if img.id == c.image_ref
                    || img.id == named
                    || names.into_iter().any(|n| n == named || n == &c.image_ref)
                {
                    in_use.insert(img.id.clone());
                }
            }
        }
        let mut records = lock(&self.records);
        let before = records.clone();
        records.retain(|id, _| images.iter().any(|i| &i.id == id));
        for img in &images {
            let r = records.entry(img.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: img.size,
            });
            r.size = img.size;
            if in_use.contains(&img.id) {
                r.last_used = Some(now);
            }
        }
        if *records != before {
            self.save(&records);
        }
        Ok((images, in_use))
    }

    /// The runtime's sandbox (pause) image, as a verbose `Status` reports it in its `config`
    /// (containerd's `sandboxImage`); `None` for a runtime without one (the built-in runtime).
    async fn sandbox_image(&self) -> Option<String> {
        let status = self
            .rt
            .status(cri::StatusRequest { verbose: true })
            .await
            .ok()?;
        let config: serde_json::Value = serde_json::from_str(status.info.get("config")?).ok()?;
        let image = config.get("sandboxImage")?.as_str()?;
        (!image.is_empty()).then(|| image.to_string())
    }

    /// The images that may be removed at `now`, least recently used first (never used before
    /// used; then first seen first): not in use, not pinned, seen at least the minimum age ago.
    fn candidates(
        &self,
        images: &[cri::Image],
        in_use: &HashSet<String>,
        now: u64,
    ) -> Vec<(String, Record)> {
        let records = lock(&self.records);
        let min_age = self.policy.minimum_age.as_secs();
        let mut out: Vec<(String, Record)> = images
            .iter()
            .filter(|i| !i.pinned && !in_use.contains(&i.id))
            .filter_map(|i| Some((i.id.clone(), *records.get(&i.id)?)))
            .filter(|(_, r)| now.saturating_sub(r.first_detected) >= min_age)
            .collect();
        out.sort_by_key(|(id, r)| (r.last_used, r.first_detected, id.clone()));
        out
    }

    /// Removes image `id` through CRI; counts it in `report` when it went.
    async fn remove(&self, id: &str, report: &mut Report) {
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: id.to_string(),
                ..Default::default()
            }),
        };
        match self.images.remove_image(req).await {
            Ok(_) => {
                let size = lock(&self.records).remove(id).map_or(0, |r| r.size);
                tracing::info!(image = %id, size, "removed an unused image");
                report.removed.push(id.to_string());
                report.freed += size;
                self.save(&lock(&self.records));
            }
            Err(e) => tracing::warn!(image = %id, "removing an unused image: {e}"),
        }
    }

    /// The image filesystem's capacity and available bytes.
    async fn image_fs(&self) -> Result<(u64, u64), Error> {
        let info = self
            .images
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await?;
        let mount = info
            .image_filesystems
            .first()
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint))
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or(Error::NoImageFs)?;
        (self.space)(&mount)
    }

    /// Writes the records atomically; a failure is a warning (they are rebuilt by the next
    /// collections).
    fn save(&self, records: &BTreeMap<String, Record>) {
        let write = || -> std::io::Result<()> {
            let tmp = self.state_file.with_extension("tmp");
            std::fs::write(
                &tmp,
                serde_json::to_vec(records).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&tmp, &self.state_file)
        };
        if let Err(e) = write() {
            tracing::warn!(file = %self.state_file.display(), "keeping the image records: {e}");
        }
    }
}

/// Capacity and available bytes (for unprivileged users, as upstream's cadvisor reads them) of
/// the filesystem holding `path`.
fn fs_space(path: &Path) -> Result<(u64, u64), Error> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|source| Error::Statvfs {
        path: path.to_path_buf(),
        source,
    })?;
    let frsize = st.fragment_size();
    let capacity = st.blocks().saturating_mul(frsize);
    if capacity == 0 {
        return Err(Error::ZeroCapacity(path.to_path_buf()));
    }
    Ok((capacity, st.blocks_available().saturating_mul(frsize)))
}

/// A reference as runtimes list it: `pause:3.9` is `docker.io/library/pause:3.9`,
/// `me/app:1` is `docker.io/me/app:1`.
fn normalize(reference: &str) -> String {
    let first = reference.split('/').next().unwrap_or_default();
    let has_registry = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, reference.contains('/')) {
        (true, _) => reference.to_string(),
        (false, true) => format!("docker.io/{reference}"),
        (false, false) => format!("docker.io/library/{reference}"),
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
