//! The static pod directory (`staticPodPath`): every `*.yaml`, `*.yml` and `*.json` file
//! directly in it (hidden files and subdirectories are skipped, other files ignored) holds one
//! Pod. The directory is scanned at start and every `fileCheckFrequency`, and each scan is
//! sent as a complete snapshot ([`PodOp::Set`]); the merger works out what changed. As
//! upstream, a manifest that fails to decode or validate is reported and left out of the
//! snapshot, so a pod whose file became invalid is removed; the other pods are untouched. The
//! path may also name a single manifest file.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc::Sender;

use super::{Error, FILE_SOURCE, PodOp, PodUpdate, pod};

/// One scan of the directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScanResult {
    /// The valid, defaulted pods, in file name order.
    pub pods: Vec<Pod>,
    /// One line per skipped manifest: `file <path>: <what is wrong>`.
    pub errors: Vec<String>,
    /// False when the directory could not be listed (other than not existing): the pods are
    /// then unknown and no snapshot should be sent.
    pub listed: bool,
}

/// The static pod directory source.
#[derive(Debug)]
pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    check_every: Duration,
    /// Per file: its content and the pod it gave, so an unchanged file keeps its pod (and its
    /// seen time) without being decoded again.
    cache: HashMap<PathBuf, (String, Pod)>,
    /// Errors of the previous scan, to warn only about new ones.
    last_errors: HashSet<String>,
    /// Where new errors are also sent (the kubelet records them as events).
    problems: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl FileSource {
    pub fn new(
        dir: impl Into<PathBuf>,
        node_name: impl Into<String>,
        check_every: Duration,
    ) -> Self {
        FileSource {
            dir: dir.into(),
            node_name: node_name.into(),
            check_every,
            cache: HashMap::new(),
            last_errors: HashSet::new(),
            problems: None,
        }
    }

    /// Also sends each new error to `tx`.
    pub fn report_to(mut self, tx: tokio::sync::mpsc::UnboundedSender<String>) -> Self {
        self.problems = Some(tx);
        self
    }

    /// Reads the directory once. Logs each new error with `tracing::warn!`.
    pub fn scan(&mut self) -> ScanResult {
        let mut result = ScanResult {
            listed: true,
            ..Default::default()
        };
        let files = match self.manifest_files() {
            Ok(files) => files,
            Err(e) => {
                result.errors.push(e.to_string());
                result.listed = false;
                self.report(&result.errors);
                return result;
            }
        };
        let mut cache = HashMap::new();
        let mut names = HashSet::new();
        for path in files {
            // An empty file is one being written (an editor or `cp` truncates first): it keeps
            // the pod it had, if any, without an error; the write's own event brings the rest.
            if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
                if let Some((text, pod)) = self.cache.get(&path) {
                    result.pods.push(pod.clone());
                    cache.insert(path.clone(), (text.clone(), pod.clone()));
                }
                continue;
            }
            match self.load(&path) {
                Ok((text, pod)) => {
                    let key = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
                    if !names.insert(key) {
                        result.errors.push(format!(
                            "file {}: duplicate pod {}, already defined by another manifest",
                            path.display(),
                            super::pod_full_name(&pod)
                        ));
                        continue;
                    }
                    result.pods.push(pod.clone());
                    cache.insert(path, (text, pod));
                }
                Err(e) => result.errors.push(format!("file {}: {e}", path.display())),
            }
        }
        self.cache = cache;
        self.report(&result.errors);
        result
    }

    /// Scans now, every `check_every` and whenever inotify reports a change in the directory,
    /// sending each snapshot that differs from the last one sent (the first always) as a
    /// [`PodOp::Set`] from source `file`. Returns when the receiver is gone.
    pub async fn run(self, tx: Sender<PodUpdate>) {
        let mut interval = tokio::time::interval(self.check_every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = DirWatch::new(self.dir.clone());
        let mut source = Some(self);
        let mut last: Option<Vec<Pod>> = None;
        loop {
            tokio::select! {
                _ = interval.tick() => changes.ensure(),
                _ = changes.next() => {
                    // Let a burst of events (an editor's save) settle into one scan.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    changes.drain();
                }
                _ = tx.closed() => return,
            }
            let Some(mut s) = source.take() else { return };
            let joined = tokio::task::spawn_blocking(move || {
                let r = s.scan();
                (s, r)
            })
            .await;
            let Ok((s, result)) = joined else {
                tracing::error!("static pod directory scan panicked");
                return;
            };
            source = Some(s);
            if !result.listed || last.as_ref() == Some(&result.pods) {
                continue;
            }
            last = Some(result.pods.clone());
            let update = PodUpdate {
                op: PodOp::Set,
                pods: result.pods,
                source: FILE_SOURCE,
            };
            if tx.send(update).await.is_err() {
                return;
            }
        }
    }

    /// The manifest files to read, sorted; an absent directory has none.
    fn manifest_files(&self) -> Result<Vec<PathBuf>, Error> {
        let unreadable = |source| Error::ListDirectory {
            path: self.dir.clone(),
            source,
        };
        let meta = match std::fs::metadata(&self.dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(unreadable(e)),
        };
        if meta.is_file() {
            return Ok(vec![self.dir.clone()]);
        }
        let entries = std::fs::read_dir(&self.dir).map_err(unreadable)?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(unreadable)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !is_manifest_name(&name) {
                continue;
            }
            // Follows symlinks (as upstream); subdirectories are not recursed into.
            let path = entry.path();
            if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Reads, decodes, validates and defaults one manifest (or reuses the cached pod).
    fn load(&self, path: &Path) -> Result<(String, Pod), Error> {
        let text = std::fs::read_to_string(path).map_err(Error::ReadManifest)?;
        if let Some((cached, pod)) = self.cache.get(path) {
            if *cached == text {
                return Ok((text, pod.clone()));
            }
        }
        let mut p = pod::decode(&text)?;
        pod::validate(&p)?;
        let seen = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let origin = path.to_string_lossy();
        pod::apply_defaults(&mut p, &origin, &self.node_name, FILE_SOURCE, &seen);
        pod::validate(&p)?;
        Ok((text, p))
    }

    fn report(&mut self, errors: &[String]) {
        let now: HashSet<String> = errors.iter().cloned().collect();
        for e in errors {
            if !self.last_errors.contains(e) {
                tracing::warn!("static pod manifest skipped: {e}");
                if let Some(tx) = &self.problems {
                    let _ = tx.send(format!("static pod manifest skipped: {e}"));
                }
            }
        }
        self.last_errors = now;
    }
}

/// Change notifications for the static pod directory (inotify). Best effort: where the
/// directory does not exist yet or inotify is unavailable, polling alone finds the changes,
/// and each poll tries to set up the watch again.
struct DirWatch {
    dir: PathBuf,
    stream: Option<inotify::EventStream<Vec<u8>>>,
}

impl DirWatch {
    fn new(dir: PathBuf) -> Self {
        let mut w = DirWatch { dir, stream: None };
        w.ensure();
        w
    }

    /// Sets up the watch if there is none.
    fn ensure(&mut self) {
        if self.stream.is_some() || !self.dir.is_dir() {
            return;
        }
        use inotify::{Inotify, WatchMask};
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        let watched = Inotify::init().and_then(|ino| {
            ino.watches().add(&self.dir, mask)?;
            ino.into_event_stream(vec![0u8; 4096])
        });
        match watched {
            Ok(stream) => self.stream = Some(stream),
            Err(e) => {
                tracing::debug!(dir = %self.dir.display(), "no inotify watch, polling only: {e}")
            }
        }
    }

    /// Waits for the next change; never returns while there is no watch.
    async fn next(&mut self) {
        use futures::StreamExt;
        let Some(stream) = self.stream.as_mut() else {
            return std::future::pending().await;
        };
        match stream.next().await {
            Some(Ok(ev)) if !gone(&ev) => {}
            // The directory itself went away (the next poll watches its successor), or
            // inotify failed.
            _ => self.stream = None,
        }
    }

    /// Discards events already queued (the scan that follows sees their effect).
    fn drain(&mut self) {
        use futures::FutureExt;
        while let Some(stream) = self.stream.as_mut() {
            match futures::StreamExt::next(stream).now_or_never() {
                Some(Some(Ok(ev))) if !gone(&ev) => continue,
                Some(_) => self.stream = None,
                None => break,
            }
        }
    }
}

/// True for the events saying the watched directory itself is gone.
fn gone(ev: &inotify::Event<std::ffi::OsString>) -> bool {
    ev.mask.intersects(
        inotify::EventMask::DELETE_SELF
            | inotify::EventMask::MOVE_SELF
            | inotify::EventMask::IGNORED,
    )
}

/// `*.yaml`, `*.yml` or `*.json`.
fn is_manifest_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".yaml", ".yml", ".json"]
        .iter()
        .any(|ext| lower.len() > ext.len() && lower.ends_with(ext))
}

#[cfg(test)]
mod tests;
