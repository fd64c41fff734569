//! Observing the node's signals, as upstream's summary provider feeds its eviction manager:
//! - `memory.available`: capacity less the root memory cgroup's working set (usage less
//!   inactive file pages; from `/proc/meminfo` where the root cgroup has no memory files, v2);
//! - `allocatableMemory.available`: the pods' allocatable memory less `kubepods`' working set;
//! - `nodefs.*`: the filesystem of the root dir; `imagefs.*` (and `containerfs.*`, which
//!   nodelet does not split): the filesystem the runtime's `ImageFsInfo` names, the root
//!   dir's when it names none;
//! - `pid.available`: the smaller of `pid_max` and `threads-max`, less the tasks running.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runtime::{ImageService, cri};

use super::Signal;
use super::thresholds::{Observation, Observations};
use crate::cm::ContainerManager;

/// Where the signals are read from.
pub struct NodeSignals {
    /// `MemTotal`.
    pub memory_capacity: i64,
    /// The memory pods may hold together (capacity less the reservations), when the kubepods
    /// cgroup exists to measure them.
    pub allocatable_memory: Option<i64>,
    pub root_dir: PathBuf,
    pub cm: Arc<ContainerManager>,
    pub images: Arc<dyn ImageService>,
    /// The image filesystem's mount point, once the runtime named it (it does not move; asking
    /// each cycle made the built-in runtime walk its whole store for its usage).
    image_fs: std::sync::Mutex<Option<PathBuf>>,
}

impl NodeSignals {
    pub fn new(
        memory_capacity: i64,
        allocatable_memory: Option<i64>,
        root_dir: PathBuf,
        cm: Arc<ContainerManager>,
        images: Arc<dyn ImageService>,
    ) -> Self {
        NodeSignals {
            memory_capacity,
            allocatable_memory,
            root_dir,
            cm,
            images,
            image_fs: std::sync::Mutex::new(None),
        }
    }

    /// Every signal the node offers now.
    pub async fn observe(&self) -> Observations {
        let mut out = Observations::new();
        let meminfo = || {
            let text = std::fs::read_to_string("/proc/meminfo").ok()?;
            crate::server::resource::node_working_set(&text)
        };
        if let Some(ws) = ContainerManager::node_memory_working_set().or_else(meminfo) {
            out.insert(
                Signal::MemoryAvailable,
                Observation {
                    available: self.memory_capacity - clamp(ws),
                    capacity: self.memory_capacity,
                },
            );
        }
        if let (Some(allocatable), Some(ws)) =
            (self.allocatable_memory, self.cm.pods_memory_working_set())
        {
            out.insert(
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: allocatable - clamp(ws),
                    capacity: allocatable,
                },
            );
        }
        if let Some((bytes, inodes)) = fs_observations(&self.root_dir) {
            out.insert(Signal::NodeFsAvailable, bytes);
            out.insert(Signal::NodeFsInodesFree, inodes);
        }
        let image_fs = self
            .image_fs()
            .await
            .unwrap_or_else(|| self.root_dir.clone());
        if let Some((bytes, inodes)) = fs_observations(&image_fs) {
            out.insert(Signal::ImageFsAvailable, bytes);
            out.insert(Signal::ImageFsInodesFree, inodes);
            out.insert(Signal::ContainerFsAvailable, bytes);
            out.insert(Signal::ContainerFsInodesFree, inodes);
        }
        if let Some(pids) = pid_observation() {
            out.insert(Signal::PidAvailable, pids);
        }
        out
    }

    /// Whether the runtime's images are on a filesystem of their own, not the root dir's
    /// (upstream's `HasDedicatedImageFs`: another device). Unknown (the runtime named none)
    /// is not.
    pub async fn dedicated_image_fs(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(image_fs) = self.image_fs().await else {
            return false;
        };
        match (
            std::fs::metadata(&self.root_dir),
            std::fs::metadata(&image_fs),
        ) {
            (Ok(root), Ok(images)) => root.dev() != images.dev(),
            _ => false,
        }
    }

    /// The mount point of the runtime's image filesystem (`ImageFsInfo`, asked until it names
    /// one).
    async fn image_fs(&self) -> Option<PathBuf> {
        if let Some(known) = crate::util::lock(&self.image_fs).clone() {
            return Some(known);
        }
        let info = self
            .images
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await
            .ok()?;
        let mount = info
            .image_filesystems
            .first()?
            .fs_id
            .as_ref()?
            .mountpoint
            .clone();
        let mount = (!mount.is_empty()).then(|| PathBuf::from(mount))?;
        *crate::util::lock(&self.image_fs) = Some(mount.clone());
        Some(mount)
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The space and inodes available on the filesystem holding `path` (to unprivileged users, as
/// `df` shows it).
pub fn fs_observations(path: &Path) -> Option<(Observation, Observation)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = st.fragment_size() as i64;
    let bytes = Observation {
        available: (st.blocks_available() as i64).saturating_mul(frsize),
        capacity: (st.blocks() as i64).saturating_mul(frsize),
    };
    let inodes = Observation {
        available: st.files_free() as i64,
        capacity: st.files() as i64,
    };
    Some((bytes, inodes))
}

/// `pid.available`: the most tasks the kernel allows less those there are.
fn pid_observation() -> Option<Observation> {
    let read = |p: &str| -> Option<i64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let pid_max = read("/proc/sys/kernel/pid_max")?;
    let capacity = read("/proc/sys/kernel/threads-max").map_or(pid_max, |t| t.min(pid_max));
    let running = i64::from(nix::sys::sysinfo::sysinfo().ok()?.process_count());
    Some(Observation {
        available: capacity - running,
        capacity,
    })
}

/// A notice from the kernel that a memory cgroup's usage crossed a threshold (cgroup v1's
/// `cgroup.event_control` memory thresholds, upstream's memory threshold notifier): the
/// eviction manager runs a cycle at once instead of at its next period. Dropping it closes the
/// eventfd, which unregisters the threshold.
pub struct MemoryNotifier {
    efd: tokio::io::unix::AsyncFd<nix::sys::eventfd::EventFd>,
    /// The `memory.usage_in_bytes` the threshold is on (open while it is registered).
    _usage: std::fs::File,
}

/// The root memory cgroup on v1.
const V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

impl MemoryNotifier {
    /// Asks to be told when the node's `memory.available` falls below `threshold` bytes (of
    /// `capacity`): when the root memory cgroup's usage passes capacity - threshold + its
    /// inactive file pages now (re-armed every cycle, as those move). `None` where the kernel
    /// offers no such notice (cgroup v2).
    pub fn arm(capacity: i64, threshold: i64) -> Option<MemoryNotifier> {
        Self::arm_in(Path::new(V1_MEMORY_ROOT), capacity, threshold)
    }

    /// [`MemoryNotifier::arm`] on the memory cgroup directory `dir`.
    pub fn arm_in(dir: &Path, capacity: i64, threshold: i64) -> Option<MemoryNotifier> {
        use std::os::fd::AsRawFd;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        let inactive: i64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let at = capacity - threshold + inactive;
        if at <= 0 {
            return None;
        }
        let usage = std::fs::File::open(dir.join("memory.usage_in_bytes")).ok()?;
        let flags =
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK;
        let efd = nix::sys::eventfd::EventFd::from_value_and_flags(0, flags).ok()?;
        let control = format!("{} {} {at}", efd.as_raw_fd(), usage.as_raw_fd());
        if let Err(e) = std::fs::write(dir.join("cgroup.event_control"), control) {
            tracing::debug!(dir = %dir.display(), "no memory threshold notices: {e}");
            return None;
        }
        // `AsyncFd::new` is deprecated for types whose `as_raw_fd` could change or close under
        // it; an `EventFd` owns its descriptor for its whole life, which is what the
        // replacement (`register`, unsafe) asks the caller to promise.
        #[allow(deprecated)]
        let efd = tokio::io::unix::AsyncFd::new(efd).ok()?;
        Some(MemoryNotifier { efd, _usage: usage })
    }

    /// Waits for the next notice (the usage crossed the threshold, either way).
    pub async fn fired(&self) {
        loop {
            let Ok(mut ready) = self.efd.readable().await else {
                return std::future::pending().await;
            };
            match ready.try_io(|fd| fd.get_ref().read().map_err(std::io::Error::from)) {
                Ok(_) => return,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Waits for `notifier`'s next notice; for ever without one.
pub async fn notified(notifier: &Option<MemoryNotifier>) {
    match notifier {
        Some(n) => n.fired().await,
        None => std::future::pending().await,
    }
}
