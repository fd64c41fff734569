//! The container manager (upstream `pkg/kubelet/cm`): the cgroup tree the kubelet owns, the
//! same on every runtime. With `cgroupsPerQOS` (the default) it makes, under `cgroupRoot`:
//!
//! ```text
//! <cgroupRoot>/kubepods                      capped at capacity - reserved (enforceNodeAllocatable: pods)
//!              kubepods/pod<uid>             Guaranteed pods
//!              kubepods/burstable            shares: the sum of its pods' CPU requests
//!              kubepods/burstable/pod<uid>
//!              kubepods/besteffort           shares: 2
//!              kubepods/besteffort/pod<uid>
//! ```
//!
//! A pod's cgroup is made (with [`resources::for_pod`]'s values) before its sandbox and handed
//! to the runtime as CRI `cgroup_parent`, so its sandbox and containers go below it on the
//! built-in runtime and containerd alike; housekeeping destroys the cgroups of pods no longer
//! running ([`ContainerManager::orphans`], [`ContainerManager::destroy_pods`]). The QoS cgroups are updated when a pod
//! cgroup is made and every minute. With `cgroupDriver: systemd` ([`systemd`]) the same tree
//! is made of systemd slices (`kubepods.slice/kubepods-burstable.slice/...`), on cgroup v1 and v2.

pub mod cgroupfs;
pub mod resources;
pub mod systemd;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use self::cgroupfs::Cgroupfs;
use self::resources::{MIN_SHARES, ResourceConfig, milli_cpu_to_shares};
use self::systemd::{Systemd, SystemdError};
use crate::config::{CgroupDriver, Cgroups};
use crate::util::lock;

/// How often the QoS cgroups are written again (upstream's `periodicQOSCgroupUpdateInterval`).
pub const QOS_UPDATE_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// The kubelet's own `oom_score_adj` (upstream's `KubeletOOMScoreAdj`).
pub const KUBELET_OOM_SCORE_ADJ: i32 = -999;

/// Why the kubelet's cgroups could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no cgroup filesystem is mounted (neither cgroup v1 controllers nor cgroup2)")]
    NotMounted,
    #[error("the cgroup controller {0:?} is not mounted")]
    NoController(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup {path} still holds processes {pids:?} after SIGKILL")]
    Busy { path: String, pids: Vec<i32> },
    #[error(transparent)]
    Systemd(Box<SystemdError>),
}

/// A pod's QoS class, as its cgroup's place in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl From<SystemdError> for Error {
    fn from(e: SystemdError) -> Self {
        Error::Systemd(Box::new(e))
    }
}

impl Qos {
    pub fn of(pod: &Pod) -> Qos {
        match crate::pod::qos_class(pod) {
            "Guaranteed" => Qos::Guaranteed,
            "Burstable" => Qos::Burstable,
            _ => Qos::BestEffort,
        }
    }
}

/// The tree under `kubepods` and what the manager knows of the pods in it.
struct Tree {
    fs: Cgroupfs,
    /// The systemd driver's connection; `None`: the cgroupfs driver.
    systemd: Option<Systemd>,
    /// `cgroupRoot`'s parts (none for `/`).
    root: Vec<String>,
    /// `<cgroupRoot>/kubepods` (with systemd, its slice's cgroupfs path).
    kubepods: String,
    /// What `kubepods` is set to.
    node: ResourceConfig,
    cpu_cfs_quota: bool,
    pod_pids_limit: i64,
    /// The pods whose cgroup was made or found and which have not terminated.
    pods: Mutex<HashMap<String, PodEntry>>,
    /// Held while the QoS cgroups are computed and written, so that of two updates racing
    /// (pods started at once, each by its worker) the one written last saw every pod counted
    /// before it began (upstream's `qosContainerManager` holds its lock the same way).
    qos_update: Mutex<()>,
}

/// What the manager knows of one pod: its QoS class and CPU request (millicores, for the
/// `burstable` cgroup's shares), and the values last written to its cgroup (`None`: adopted,
/// not written by this agent).
#[derive(Debug, Clone)]
struct PodEntry {
    qos: Qos,
    cpu: i64,
    applied: Option<ResourceConfig>,
    /// What the cgroup takes once the pod's containers were resized.
    pending: Option<ResourceConfig>,
}

/// The kubelet's cgroup tree; without `cgroupsPerQOS`, nothing (the runtime places pods).
pub struct ContainerManager {
    tree: Option<Tree>,
}

impl ContainerManager {
    /// A manager that makes no cgroup (`cgroupsPerQOS: false`).
    pub fn disabled() -> Self {
        ContainerManager { tree: None }
    }

    /// The manager of `cfg`'s tree, `kubepods` to be set to `node` (its CPU shares and, when
    /// node allocatable is enforced, its memory limit); `pod_pids_limit` caps each pod.
    pub fn new(cfg: &Cgroups, node: ResourceConfig, pod_pids_limit: i64) -> Result<Self, Error> {
        if !cfg.per_qos {
            return Ok(Self::disabled());
        }
        let fs = Cgroupfs::detect()?;
        let systemd = match cfg.driver {
            CgroupDriver::Cgroupfs => None,
            CgroupDriver::Systemd => Some(Systemd::connect(!fs.is_v2())?),
        };
        let root: Vec<String> = cfg
            .root
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let mut tree = Tree {
            fs,
            systemd,
            root,
            kubepods: String::new(),
            node,
            cpu_cfs_quota: cfg.cpu_cfs_quota,
            pod_pids_limit,
            pods: Mutex::new(HashMap::new()),
            qos_update: Mutex::new(()),
        };
        tree.kubepods = tree.path(&["kubepods"]);
        Ok(ContainerManager { tree: Some(tree) })
    }

    /// Makes `kubepods` (set to the node's values) and the QoS cgroups, and the pod cgroups
    /// already there known (after a restart, their pods are adopted); gives the agent its own
    /// `oom_score_adj`.
    pub fn start(&self) -> Result<(), Error> {
        set_own_oom_score_adj();
        let Some(t) = &self.tree else {
            return Ok(());
        };
        t.make(&t.kubepods, &t.node)?;
        for qos in [Qos::Burstable, Qos::BestEffort] {
            t.make(&t.qos_path(qos), &ResourceConfig::default())?;
        }
        self.update_qos()?;
        tracing::info!(
            kubepods = %t.kubepods,
            version = if t.fs.is_v2() { "v2" } else { "v1" },
            driver = if t.systemd.is_some() { "systemd" } else { "cgroupfs" },
            "the pods' cgroup tree is ready"
        );
        Ok(())
    }

    /// The pod's cgroup, made (with its values) when missing, after the QoS cgroups were
    /// updated for it: the CRI `cgroup_parent` of its sandbox (with systemd, its slice's name).
    /// Empty without the tree. When
    /// the pod's resources changed since its cgroup was written (a resize), the cgroup (and the
    /// `burstable` shares) are written again in two steps around the containers' own resize:
    /// here what grows ([`resources::widest`]), in [`ContainerManager::finish_pod_resize`] what
    /// shrinks. A value the kernel refuses (a memory limit below what the pod still uses) is a
    /// warning, tried again on the next sync.
    pub fn ensure_pod(&self, pod: &Pod, uid: &str) -> Result<String, Error> {
        let Some(t) = &self.tree else {
            return Ok(String::new());
        };
        let qos = Qos::of(pod);
        let cpu = crate::admission::pod_requests(pod).get("cpu");
        let config = resources::for_pod(pod, t.cpu_cfs_quota, t.pod_pids_limit);
        let before = lock(&t.pods).insert(
            uid.to_string(),
            PodEntry {
                qos,
                cpu,
                applied: None,
                pending: None,
            },
        );
        let path = t.pod_path(qos, uid);
        if !t.fs.exists(&path) {
            self.update_qos()?;
            t.make(&path, &config)?;
            tracing::debug!(pod_cgroup = %path, ?config, "pod cgroup made");
            self.applied(uid, config);
            return Ok(t.runtime_parent(&path));
        }
        // Adopted after a restart (`None`): written by an earlier agent, perhaps for other
        // values; write them again.
        let before = before.and_then(|b| b.applied.map(|a| (b.cpu, a)));
        if let Some((old_cpu, old)) = &before
            && *old == config
            && *old_cpu == cpu
        {
            self.applied(uid, config);
            return Ok(t.runtime_parent(&path));
        }
        if before.as_ref().is_none_or(|(old_cpu, _)| *old_cpu != cpu) {
            self.update_qos()?;
        }
        let (write, first) = match &before {
            Some((_, old)) => {
                let first = resources::widest(old, &config);
                (resources::replacing(old, &first), first)
            }
            None => (config.clone(), config.clone()),
        };
        let old = before.map(|(_, old)| old);
        match t.set(&path, &write) {
            Ok(()) => {
                tracing::info!(pod_cgroup = %path, ?config, "pod cgroup resized");
                self.applied(uid, first.clone());
                if first != config {
                    self.pending(uid, Some(config));
                }
            }
            Err(e) => {
                tracing::warn!(pod_cgroup = %path, "resizing the pod cgroup: {e}; trying again");
                if let Some(old) = old {
                    self.applied(uid, old);
                }
            }
        }
        Ok(t.runtime_parent(&path))
    }

    /// The second step of a pod cgroup's resize, once its containers were resized: what
    /// shrinks (see [`ContainerManager::ensure_pod`]). Nothing when nothing waits.
    pub fn finish_pod_resize(&self, uid: &str) {
        let Some(t) = &self.tree else {
            return;
        };
        let (qos, applied, target) = {
            let mut pods = lock(&t.pods);
            let Some(e) = pods.get_mut(uid) else {
                return;
            };
            let Some(target) = e.pending.take() else {
                return;
            };
            (e.qos, e.applied.clone(), target)
        };
        let path = t.pod_path(qos, uid);
        // A memory limit below what the pod uses would be refused (v1) or OOM-kill it (v2):
        // it waits, as upstream's check before a pod's memory decrease.
        if let Some(limit) = target.memory_limit.and_then(|l| u64::try_from(l).ok())
            && limit > 0
            && let Some(usage) = t.fs.memory_working_set(&path)
            && usage >= limit
        {
            tracing::warn!(pod_cgroup = %path, usage, limit, "not shrinking the pod cgroup's memory limit below its usage; trying again");
            return;
        }
        let write = match &applied {
            Some(old) => resources::replacing(old, &target),
            None => target.clone(),
        };
        match t.set(&path, &write) {
            Ok(()) => {
                tracing::info!(pod_cgroup = %path, config = ?target, "pod cgroup shrunk after its containers");
                self.applied(uid, target);
            }
            Err(e) => {
                // `applied` still differs from the pod's values: the next sync tries again.
                tracing::warn!(pod_cgroup = %path, "shrinking the pod cgroup: {e}; trying again");
            }
        }
    }

    /// Records the values the pod's cgroup is to take after its containers.
    fn pending(&self, uid: &str, config: Option<ResourceConfig>) {
        if let Some(t) = &self.tree
            && let Some(e) = lock(&t.pods).get_mut(uid)
        {
            e.pending = config;
        }
    }

    /// Records what the pod's cgroup holds.
    fn applied(&self, uid: &str, config: ResourceConfig) {
        if let Some(t) = &self.tree
            && let Some(e) = lock(&t.pods).get_mut(uid)
        {
            e.applied = Some(config);
        }
    }

    /// The pod `uid` terminated: it no longer counts in its QoS cgroup.
    pub fn forget_pod(&self, uid: &str) {
        if let Some(t) = &self.tree {
            lock(&t.pods).remove(uid);
        }
    }

    /// Writes the QoS cgroups' values again: `burstable` gets the shares of its pods' CPU
    /// requests together, `besteffort` the minimum.
    pub fn update_qos(&self) -> Result<(), Error> {
        let Some(t) = &self.tree else {
            return Ok(());
        };
        let _one_at_a_time = lock(&t.qos_update);
        let burstable: i64 = lock(&t.pods)
            .values()
            .filter(|e| e.qos == Qos::Burstable)
            .map(|e| e.cpu)
            .fold(0, i64::saturating_add);
        let shares = |s| ResourceConfig {
            cpu_shares: Some(s),
            ..Default::default()
        };
        t.set(
            &t.qos_path(Qos::Burstable),
            &shares(milli_cpu_to_shares(burstable)),
        )?;
        t.set(&t.qos_path(Qos::BestEffort), &shares(MIN_SHARES))?;
        Ok(())
    }

    /// The memory working set of `kubepods` (what every pod holds together); `None` without
    /// the tree.
    pub fn pods_memory_working_set(&self) -> Option<u64> {
        let t = self.tree.as_ref()?;
        t.fs.memory_working_set(&t.kubepods)
    }

    /// The memory working set of the whole node when the root cgroup reports one (v1). The
    /// hierarchies are found once (parsing the mount table cost about 1 ms a call with 100
    /// pods' mounts).
    pub fn node_memory_working_set() -> Option<u64> {
        static FS: std::sync::OnceLock<Option<Cgroupfs>> = std::sync::OnceLock::new();
        FS.get_or_init(|| Cgroupfs::detect().ok())
            .as_ref()?
            .memory_working_set("/")
    }

    /// The pod cgroups in the tree, by pod UID.
    pub fn pod_cgroups(&self) -> Result<Vec<(String, String)>, Error> {
        let Some(t) = &self.tree else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            let dir = t.qos_path(qos);
            for name in t.fs.children(&dir)? {
                if let Some(uid) = t.pod_uid(&name) {
                    out.push((uid, join(&dir, &name)));
                }
            }
        }
        Ok(out)
    }

    /// The cgroups of the pods `keep` does not name: (pod UID, cgroup).
    pub fn orphans(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<(String, String)>, Error> {
        Ok(self
            .pod_cgroups()?
            .into_iter()
            .filter(|(uid, _)| !keep(uid))
            .collect())
    }

    /// Destroys the pod cgroups `orphans` names (killing what still runs in them), as
    /// upstream's `cleanupOrphanedPodCgroups`, then updates the QoS cgroups; returns what could
    /// not be done. Blocking: a process killed may take a moment to leave.
    pub fn destroy_pods(&self, orphans: Vec<(String, String)>) -> Vec<Error> {
        let Some(t) = &self.tree else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        for (uid, path) in &orphans {
            let running = t.fs.pids(path).len();
            if running > 0 {
                tracing::info!(pod_cgroup = %path, running, "killing what runs in the cgroup of a pod gone");
            }
            match t.destroy(path) {
                Ok(()) => {
                    tracing::debug!(pod_cgroup = %path, "pod cgroup removed");
                    lock(&t.pods).remove(uid);
                }
                Err(e) => errors.push(e),
            }
        }
        if !orphans.is_empty() {
            if let Err(e) = self.update_qos() {
                errors.push(e);
            }
        }
        errors
    }
}

impl Tree {
    /// The cgroupfs path of the cgroup `parts` below `cgroupRoot`.
    fn path(&self, parts: &[&str]) -> String {
        let mut all: Vec<&str> = self.root.iter().map(String::as_str).collect();
        all.extend_from_slice(parts);
        if self.systemd.is_some() {
            systemd::slice_path(&all)
        } else {
            format!("/{}", all.join("/"))
        }
    }

    fn qos_path(&self, qos: Qos) -> String {
        match qos {
            Qos::Guaranteed => self.kubepods.clone(),
            Qos::Burstable => self.path(&["kubepods", "burstable"]),
            Qos::BestEffort => self.path(&["kubepods", "besteffort"]),
        }
    }

    fn pod_path(&self, qos: Qos, uid: &str) -> String {
        let pod = format!("pod{uid}");
        match qos {
            Qos::Guaranteed => self.path(&["kubepods", &pod]),
            Qos::Burstable => self.path(&["kubepods", "burstable", &pod]),
            Qos::BestEffort => self.path(&["kubepods", "besteffort", &pod]),
        }
    }

    /// The pod UID of a child cgroup of a QoS cgroup, when it is a pod's.
    fn pod_uid(&self, name: &str) -> Option<String> {
        if self.systemd.is_some() {
            systemd::pod_uid(name)
        } else {
            name.strip_prefix("pod").map(str::to_string)
        }
    }

    /// What the runtime is given for the cgroup `path`: the path itself, or with systemd the
    /// slice's name (its last part).
    fn runtime_parent(&self, path: &str) -> String {
        match &self.systemd {
            Some(_) => unit_of(path).to_string(),
            None => path.to_string(),
        }
    }

    /// Makes the cgroup `path` with `config`'s values: in the cgroup filesystem, or as a
    /// systemd slice (waiting for systemd to make its cgroup) whose files are then written.
    fn make(&self, path: &str, config: &ResourceConfig) -> Result<(), Error> {
        let Some(sd) = &self.systemd else {
            self.fs.create(path)?;
            return self.fs.apply(path, config);
        };
        let unit = unit_of(path);
        sd.start_slice(unit, config)?;
        let deadline = std::time::Instant::now() + systemd::UNIT_WAIT;
        while !self.fs.exists(path) {
            if std::time::Instant::now() > deadline {
                return Err(SystemdError::NotRealized {
                    unit: unit.to_string(),
                    path: path.to_string(),
                }
                .into());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if !self.fs.is_v2() {
            // systemd made it in the hierarchies it manages (cpu, memory, pids, ...); the
            // others (cpuset, hugetlb, ...) get it here, as runc's v1 systemd manager does.
            self.fs.create(path)?;
        }
        self.fs.apply(path, config)
    }

    /// Sets `config`'s values on the cgroup `path` (with systemd, as the slice's properties
    /// first).
    fn set(&self, path: &str, config: &ResourceConfig) -> Result<(), Error> {
        if let Some(sd) = &self.systemd {
            sd.set(unit_of(path), config)?;
        }
        self.fs.apply(path, config)
    }

    /// Removes the cgroup `path` and what runs in it (with systemd, by stopping the slice;
    /// what systemd leaves is removed from the filesystem).
    fn destroy(&self, path: &str) -> Result<(), Error> {
        if let Some(sd) = &self.systemd {
            sd.stop(unit_of(path))?;
            let deadline = std::time::Instant::now() + systemd::UNIT_WAIT;
            while self.fs.exists(path) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        self.fs.destroy(path)
    }
}

/// The last part of a cgroup path (with systemd, the unit's name).
fn unit_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `parent/name` as a cgroupfs path (`/` + `kubepods` is `/kubepods`).
fn join(parent: &str, name: &str) -> String {
    format!("{}/{name}", parent.trim_end_matches('/'))
}

/// Gives the agent upstream's `oom_score_adj` (-999), so the kernel's OOM killer takes
/// anything but the agent; where the kernel refuses (no CAP_SYS_RESOURCE), it keeps its own,
/// with one warning.
fn set_own_oom_score_adj() {
    const FILE: &str = "/proc/self/oom_score_adj";
    if let Err(e) = std::fs::write(FILE, KUBELET_OOM_SCORE_ADJ.to_string()) {
        let own = std::fs::read_to_string(FILE).unwrap_or_default();
        tracing::warn!(
            "the kubelet's oom_score_adj stays {} (setting {KUBELET_OOM_SCORE_ADJ}: {e})",
            own.trim()
        );
    }
}

#[cfg(test)]
mod tests;
