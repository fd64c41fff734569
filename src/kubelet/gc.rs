//! Garbage collection of dead containers, dead sandboxes, pod directories and pod log
//! directories, with upstream's default policy (`MinAge` 0, `MaxPerPodContainer` 1,
//! `MaxContainers` -1): see `pkg/kubelet/kuberuntime/kuberuntime_gc.go` and
//! `cleanupOrphanedPodDirs` in `pkg/kubelet/kubelet_pods.go`.
//!
//! One pass ([`GarbageCollector::collect`]) runs four steps, each on a fresh listing of the
//! runtime:
//!
//! 1. **Containers.** A container is ours when it carries the pod UID label; others are left
//!    alone. It is evictable when it is EXITED, or CREATED (never started). Evictable
//!    containers are grouped by (pod UID, container name) and ordered newest first (creation
//!    time, then attempt). Of a pod that is [`PodState::Active`] or [`PodState::Terminated`]
//!    the newest of each group is kept, so `kubectl logs --previous` works and a CREATED
//!    container the kubelet is about to start stays; of a [`PodState::Gone`] pod every
//!    evictable container goes. RUNNING and UNKNOWN containers are never removed (stopping
//!    them is the pod workers' job). Removing a container removes its log file first (the
//!    kubelet owns logs; only a file below the pod logs directory is touched), then the
//!    container.
//! 2. **Sandboxes.** A sandbox is removable when it is NOTREADY and no container (in any
//!    state) is left in it. Sandboxes are grouped by pod UID, newest first; of an Active or
//!    Terminated pod the newest sandbox is kept, of a Gone pod every removable one goes. A
//!    READY sandbox is never removed. Removal is StopPodSandbox (to let the runtime release
//!    what it still holds, as upstream does) then RemovePodSandbox.
//! 3. **Pod directories** `<pods_dir>/<uid>` of Gone pods with no container and no sandbox
//!    left in the runtime are removed — unless something is mounted at or below them
//!    (`/proc/self/mountinfo`), which is reported as an error and skips that directory.
//!    Symbolic links (and anything else that is not a directory) are never followed or
//!    removed.
//! 4. **Pod log directories** `<pod_logs_dir>/<namespace>_<name>_<uid>` of Gone pods with no
//!    container left in the runtime are removed (same checks). Entries whose name does not
//!    have that shape are left alone.
//!
//! ## Terminated pods
//!
//! Upstream's periodic collection (`evictNonDeletedPods` false) treats a pod that has
//! terminated but is not deleted like a running one: its newest dead container per name and
//! its newest sandbox are kept, and its directories stay (the pod may still be shown, its
//! logs read, and it may be wanted again by its source). [`PodState::Terminated`] therefore
//! keeps exactly what [`PodState::Active`] keeps; the difference is left to a future
//! "free everything unused" mode (upstream's `DeleteAllUnusedContainers`, run under disk
//! pressure), which would treat Terminated like Gone for runtime objects.
//!
//! Everything is driven by what the runtime and the disk hold, so pods left over from before
//! a kubelet restart are collected like any other (the caller's closure calls them Gone).
//! Single failures are collected in [`GcReport::errors`] and the pass goes on; a listing that
//! fails ends the steps that depend on it (nothing is removed on a guess).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use runtime::{Code, RuntimeService, cri};

use crate::pod::{LABEL_CONTAINER_NAME, LABEL_POD_UID};

/// Where the kernel lists the mounts this process sees.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// What the kubelet knows of a pod UID, asked by the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// A source wants the pod, or its worker is syncing or terminating it: its newest dead
    /// container per name and its newest sandbox are kept, its directories too.
    Active,
    /// Its worker finished terminating it, but a source may still want it (e.g. a Succeeded
    /// pod not yet deleted). Kept like [`PodState::Active`] (upstream's periodic collection
    /// does the same): the newest dead container per name, the newest sandbox, the
    /// directories.
    Terminated,
    /// No source wants it and no worker knows it: every dead container, every NOTREADY
    /// sandbox and, once nothing of it is left in the runtime, its directories go.
    Gone,
}

impl PodState {
    /// How many of the newest dead objects (per container name, or of the sandboxes) stay.
    fn keep(self) -> usize {
        match self {
            PodState::Active | PodState::Terminated => 1,
            PodState::Gone => 0,
        }
    }
}

/// What one pass removed and what failed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Ids of the removed containers.
    pub removed_containers: Vec<String>,
    /// Ids of the removed sandboxes.
    pub removed_sandboxes: Vec<String>,
    /// UIDs whose `<pods_dir>/<uid>` was removed.
    pub removed_pod_dirs: Vec<String>,
    /// The removed pod log directories.
    pub removed_log_dirs: Vec<PathBuf>,
    /// One line per failure (a removal, a listing, a directory skipped because of a mount).
    pub errors: Vec<String>,
}

/// Why something the collector would remove was not.
#[derive(Debug, thiserror::Error)]
enum RemoveError {
    #[error("log file {}: {source}", path.display())]
    LogFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("log file {} is a directory", .0.display())]
    LogIsDir(PathBuf),
    #[error("removing log file {}: {source}", path.display())]
    RemoveLog {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no longer a directory; left alone")]
    NotADir,
    #[error("not removed: {} is mounted at or below it", .0.display())]
    Mounted(PathBuf),
    #[error("{0}")]
    Io(std::io::Error),
}

/// Collects dead containers and sandboxes and the directories of pods that are gone.
pub struct GarbageCollector {
    rt: Arc<dyn RuntimeService>,
    pods_dir: PathBuf,
    pod_logs_dir: PathBuf,
    mountinfo: PathBuf,
}

/// The closure's answers, asked once per UID and pass.
struct States<'a> {
    ask: &'a (dyn Fn(&str) -> PodState + Send + Sync),
    known: HashMap<String, PodState>,
}

impl States<'_> {
    fn get(&mut self, uid: &str) -> PodState {
        if let Some(s) = self.known.get(uid) {
            return *s;
        }
        let s = (self.ask)(uid);
        self.known.insert(uid.to_string(), s);
        s
    }
}

/// What the runtime holds of which pod, after the runtime passes.
struct Leftovers {
    /// UIDs with at least one container.
    with_containers: HashSet<String>,
    /// UIDs with at least one container or sandbox.
    with_anything: HashSet<String>,
}

impl GarbageCollector {
    /// A collector over `rt` for the pod directories under `pods_dir` (`<root>/pods`) and
    /// the pod log directories under `pod_logs_dir`.
    pub fn new(rt: Arc<dyn RuntimeService>, pods_dir: PathBuf, pod_logs_dir: PathBuf) -> Self {
        GarbageCollector {
            rt,
            pods_dir,
            pod_logs_dir,
            mountinfo: PathBuf::from(MOUNTINFO),
        }
    }

    /// Reads the mount table from `path` instead of `/proc/self/mountinfo`.
    #[cfg(test)]
    pub(crate) fn with_mountinfo(mut self, path: PathBuf) -> Self {
        self.mountinfo = path;
        self
    }

    /// One collection pass. Never panics; errors of single removals are collected and the
    /// pass goes on.
    pub async fn collect(&self, pod_state: &(dyn Fn(&str) -> PodState + Send + Sync)) -> GcReport {
        let mut report = GcReport::default();
        let mut states = States {
            ask: pod_state,
            known: HashMap::new(),
        };
        if self
            .collect_containers(&mut states, &mut report)
            .await
            .is_none()
        {
            return report;
        }
        if self
            .collect_sandboxes(&mut states, &mut report)
            .await
            .is_none()
        {
            return report;
        }
        let Some(left) = self.leftovers(&mut report).await else {
            return report;
        };
        self.collect_dirs(&mut states, &left, &mut report).await;
        report
    }

    async fn list_containers(&self, report: &mut GcReport) -> Option<Vec<cri::Container>> {
        match self
            .rt
            .list_containers(cri::ListContainersRequest::default())
            .await
        {
            Ok(r) => Some(r.containers),
            Err(e) => {
                report.errors.push(format!("listing containers: {e}"));
                None
            }
        }
    }

    async fn list_sandboxes(&self, report: &mut GcReport) -> Option<Vec<cri::PodSandbox>> {
        match self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
        {
            Ok(r) => Some(r.items),
            Err(e) => {
                report.errors.push(format!("listing pod sandboxes: {e}"));
                None
            }
        }
    }

    /// Step 1: dead containers beyond the newest per (pod, name), all of them for Gone pods.
    async fn collect_containers(
        &self,
        states: &mut States<'_>,
        report: &mut GcReport,
    ) -> Option<()> {
        let containers = self.list_containers(report).await?;
        let mut groups: BTreeMap<(&str, &str), Vec<&cri::Container>> = BTreeMap::new();
        for c in &containers {
            let Some(uid) = pod_uid(&c.labels) else {
                continue;
            };
            if !evictable(c.state) {
                continue;
            }
            groups.entry((uid, container_name(c))).or_default().push(c);
        }
        for ((uid, _), mut group) in groups {
            group.sort_by_key(|c| {
                std::cmp::Reverse((c.created_at, c.metadata.as_ref().map_or(0, |m| m.attempt)))
            });
            for c in group.into_iter().skip(states.get(uid).keep()) {
                self.remove_container(&c.id, report).await;
            }
        }
        Some(())
    }

    /// Removes the log file of container `id`, then the container. A container that has
    /// meanwhile started, or whose log file cannot be removed, stays.
    async fn remove_container(&self, id: &str, report: &mut GcReport) {
        let status = match self
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
        {
            Ok(r) => r.status,
            // Removed by someone else since the listing.
            Err(e) if e.code() == Code::NotFound => return,
            Err(e) => {
                report
                    .errors
                    .push(format!("container {id}: status before removal: {e}"));
                return;
            }
        };
        if let Some(status) = status {
            if !evictable(status.state) {
                tracing::debug!(
                    container = id,
                    "not removing a container that is no longer dead"
                );
                return;
            }
            if let Err(e) = self.remove_log_file(&status.log_path) {
                report.errors.push(format!("container {id}: {e}"));
                return;
            }
        }
        match self
            .rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
        {
            Ok(_) => {
                tracing::debug!(container = id, "removed dead container");
                report.removed_containers.push(id.to_string());
            }
            Err(e) if e.code() == Code::NotFound => {}
            Err(e) => report.errors.push(format!("removing container {id}: {e}")),
        }
    }

    /// Removes a container's log file if it is below the pod logs directory (the runtime
    /// reports the path; nothing else of the node is the kubelet's to delete). A missing file
    /// is fine.
    fn remove_log_file(&self, log_path: &str) -> Result<(), RemoveError> {
        if log_path.is_empty() {
            return Ok(());
        }
        let path = Path::new(log_path);
        if !is_below(path, &self.pod_logs_dir) {
            tracing::warn!(
                path = log_path,
                pod_logs_dir = %self.pod_logs_dir.display(),
                "not removing a container log outside the pod logs directory"
            );
            return Ok(());
        }
        let path_buf = path.to_path_buf();
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(RemoveError::LogFile {
                    path: path_buf,
                    source,
                });
            }
            Ok(m) if m.is_dir() => return Err(RemoveError::LogIsDir(path_buf)),
            Ok(_) => {}
        }
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(RemoveError::RemoveLog {
                path: path_buf,
                source,
            }),
        }
    }

    /// Step 2: NOTREADY sandboxes without containers, but the newest of a pod still wanted.
    async fn collect_sandboxes(
        &self,
        states: &mut States<'_>,
        report: &mut GcReport,
    ) -> Option<()> {
        let containers = self.list_containers(report).await?;
        let sandboxes = self.list_sandboxes(report).await?;
        let occupied: HashSet<&str> = containers
            .iter()
            .map(|c| c.pod_sandbox_id.as_str())
            .collect();
        let mut by_pod: BTreeMap<&str, Vec<&cri::PodSandbox>> = BTreeMap::new();
        for s in &sandboxes {
            if let Some(uid) = pod_uid(&s.labels) {
                by_pod.entry(uid).or_default().push(s);
            }
        }
        for (uid, mut group) in by_pod {
            group.sort_by_key(|s| {
                std::cmp::Reverse((s.created_at, s.metadata.as_ref().map_or(0, |m| m.attempt)))
            });
            for s in group.into_iter().skip(states.get(uid).keep()) {
                let not_ready = s.state == cri::PodSandboxState::SandboxNotready as i32;
                if not_ready && !occupied.contains(s.id.as_str()) {
                    self.remove_sandbox(&s.id, report).await;
                }
            }
        }
        Some(())
    }

    async fn remove_sandbox(&self, id: &str, report: &mut GcReport) {
        // The kubelet stopped it already; stopping again lets a runtime that did not finish
        // release what it holds (network) before the removal, as upstream does.
        match self
            .rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Code::NotFound => return,
            Err(e) => {
                report
                    .errors
                    .push(format!("stopping pod sandbox {id} before removal: {e}"));
                return;
            }
        }
        match self
            .rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            Ok(_) => {
                tracing::debug!(sandbox = id, "removed dead pod sandbox");
                report.removed_sandboxes.push(id.to_string());
            }
            Err(e) if e.code() == Code::NotFound => {}
            Err(e) => report
                .errors
                .push(format!("removing pod sandbox {id}: {e}")),
        }
    }

    /// The pods the runtime still holds something of. A container without the UID label
    /// counts for the pod of its sandbox, a sandbox without it for the UID in its metadata:
    /// when in doubt, a directory stays.
    async fn leftovers(&self, report: &mut GcReport) -> Option<Leftovers> {
        let containers = self.list_containers(report).await?;
        let sandboxes = self.list_sandboxes(report).await?;
        let sandbox_uid: HashMap<&str, &str> = sandboxes
            .iter()
            .filter_map(|s| Some((s.id.as_str(), sandbox_uid(s)?)))
            .collect();
        let with_containers: HashSet<String> = containers
            .iter()
            .filter_map(|c| {
                pod_uid(&c.labels).or_else(|| sandbox_uid.get(c.pod_sandbox_id.as_str()).copied())
            })
            .map(str::to_string)
            .collect();
        let mut with_anything = with_containers.clone();
        with_anything.extend(sandbox_uid.values().map(|u| u.to_string()));
        Some(Leftovers {
            with_containers,
            with_anything,
        })
    }

    /// Steps 3 and 4: the directories of Gone pods the runtime holds nothing of.
    async fn collect_dirs(&self, states: &mut States<'_>, left: &Leftovers, report: &mut GcReport) {
        let mut pod_dirs = Vec::new();
        for (name, path) in dir_entries(&self.pods_dir, report) {
            if states.get(&name) == PodState::Gone && !left.with_anything.contains(&name) {
                pod_dirs.push((name, path));
            }
        }
        let mut log_dirs = Vec::new();
        for (name, path) in dir_entries(&self.pod_logs_dir, report) {
            let Some(uid) = log_dir_uid(&name) else {
                tracing::debug!(path = %path.display(), "not a pod log directory");
                continue;
            };
            if states.get(uid) == PodState::Gone && !left.with_containers.contains(uid) {
                log_dirs.push(path);
            }
        }
        if pod_dirs.is_empty() && log_dirs.is_empty() {
            return;
        }
        let mountinfo = match std::fs::read(&self.mountinfo) {
            Ok(b) => Arc::new(String::from_utf8_lossy(&b).into_owned()),
            Err(e) => {
                report.errors.push(format!(
                    "reading {}: {e}; no pod directory removed",
                    self.mountinfo.display()
                ));
                return;
            }
        };
        for (uid, path) in pod_dirs {
            if remove_tree(path, mountinfo.clone(), report).await {
                report.removed_pod_dirs.push(uid);
            }
        }
        for path in log_dirs {
            if remove_tree(path.clone(), mountinfo.clone(), report).await {
                report.removed_log_dirs.push(path);
            }
        }
    }
}

/// The pod UID label, if set.
fn pod_uid(labels: &HashMap<String, String>) -> Option<&str> {
    labels
        .get(LABEL_POD_UID)
        .map(String::as_str)
        .filter(|u| !u.is_empty())
}

/// The pod UID of a sandbox: its label, else its metadata.
fn sandbox_uid(s: &cri::PodSandbox) -> Option<&str> {
    pod_uid(&s.labels).or_else(|| {
        s.metadata
            .as_ref()
            .map(|m| m.uid.as_str())
            .filter(|u| !u.is_empty())
    })
}

/// The container name label, else the name in the metadata.
fn container_name(c: &cri::Container) -> &str {
    c.labels
        .get(LABEL_CONTAINER_NAME)
        .map(String::as_str)
        .or_else(|| c.metadata.as_ref().map(|m| m.name.as_str()))
        .unwrap_or("")
}

/// EXITED, or CREATED and never started. RUNNING and UNKNOWN (and values this build does not
/// know) are not.
fn evictable(state: i32) -> bool {
    state == cri::ContainerState::ContainerExited as i32
        || state == cri::ContainerState::ContainerCreated as i32
}

/// Whether `path` is absolute, has no `..`, and lies strictly below `dir`.
fn is_below(path: &Path, dir: &Path) -> bool {
    path.is_absolute()
        && !path.components().any(|c| c == Component::ParentDir)
        && path != dir
        && path.starts_with(dir)
}

/// The UID of a pod log directory name `<namespace>_<name>_<uid>`: what follows the last
/// `_`, when namespace, name and UID are all non-empty.
pub(crate) fn log_dir_uid(name: &str) -> Option<&str> {
    let (rest, uid) = name.rsplit_once('_')?;
    let (ns, pod) = rest.split_once('_')?;
    (!ns.is_empty() && !pod.is_empty() && !uid.is_empty()).then_some(uid)
}

/// The directories directly in `dir` (not following symbolic links), by name, sorted. A
/// missing `dir` has none; names that are not UTF-8 are not the kubelet's.
fn dir_entries(dir: &Path, report: &mut GcReport) -> Vec<(String, PathBuf)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            report
                .errors
                .push(format!("reading {}: {e}", dir.display()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                report
                    .errors
                    .push(format!("reading {}: {e}", dir.display()));
                continue;
            }
        };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => out.push((name, path)),
            Ok(_) => tracing::debug!(path = %path.display(), "not a directory; left alone"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report.errors.push(format!("{}: {e}", path.display())),
        }
    }
    out.sort();
    out
}

/// Removes the directory `path` unless something is mounted at or below it (by its own path
/// or its resolved one). Runs on the blocking pool: a pod's volumes may be large. Whether it
/// was removed.
async fn remove_tree(path: PathBuf, mountinfo: Arc<String>, report: &mut GcReport) -> bool {
    let shown = path.display().to_string();
    let work = tokio::task::spawn_blocking(move || -> Result<(), RemoveError> {
        // Checked again: it may have been replaced since the listing.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(RemoveError::NotADir),
            Err(e) => return Err(RemoveError::Io(e)),
        }
        let mut mounts = crate::util::mounts_under(&mountinfo, &path);
        if let Ok(real) = std::fs::canonicalize(&path) {
            if real != path {
                mounts.extend(crate::util::mounts_under(&mountinfo, &real));
            }
        }
        if let Some(m) = mounts.first() {
            return Err(RemoveError::Mounted(m.clone()));
        }
        std::fs::remove_dir_all(&path).map_err(RemoveError::Io)
    });
    match work.await {
        Ok(Ok(())) => {
            tracing::debug!(path = %shown, "removed directory of a gone pod");
            true
        }
        Ok(Err(e)) => {
            report.errors.push(format!("{shown}: {e}"));
            false
        }
        Err(e) => {
            report.errors.push(format!("{shown}: removal failed: {e}"));
            false
        }
    }
}

#[cfg(test)]
mod tests;
