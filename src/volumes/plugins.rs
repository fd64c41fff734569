//! A pod's volumes, set up before its sandbox (upstream's volume manager `WaitForAttachAndMount`
//! with the emptyDir and hostPath plugins' `SetUp`).
//!
//! Only the volumes some container mounts are set up (as upstream, an unused volume is
//! ignored). Two types are set up here:
//!
//! - **emptyDir** on disk: the directory `<pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<name>`
//!   (mode 0777, as upstream), removed when the pod terminated. `sizeLimit` is not enforced
//!   here (that is the eviction manager's job). `medium: Memory` (a tmpfs in the same directory) is the
//!   volume manager's ([`super::VolumeManager`]); huge pages are refused.
//! - **hostPath** with upstream's type checks ([`check_host_path`]): `DirectoryOrCreate` makes
//!   the directory (0755, with its parents), `FileOrCreate` an empty file (0644; its parent must
//!   exist), the other types check what is there; unset or `""` checks nothing.
//!
//! configMap, secret, downwardAPI and projected volumes, whose content the kubelet writes, are
//! set up by [`super::VolumeManager`] in `<pods dir>/<uid>/volumes/<plugin>/<name>`
//! ([`plugin_dir`]); it also resolves persistentVolumeClaims to their PersistentVolume's path
//! (`hostPath` and `local` ones). Every other type (nfs, csi, ...) is refused rather than
//! handed to the runtime as an empty directory. A volume that cannot be set up is a
//! Warning `FailedMount` event on the pod (`MountVolume.SetUp failed for volume "cfg" : ...`)
//! and a [`VolumeError`] ([`report`]): the pod stays Pending with its containers waiting
//! in `ContainerCreating`, nothing of it is created in the runtime, and its worker tries again.

use std::collections::BTreeSet;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, DownwardAPIVolumeSource, HostPathVolumeSource,
    PersistentVolumeClaimVolumeSource, Pod, ProjectedVolumeSource, SecretVolumeSource, Volume,
};

use super::{PluginError, VolumeError};
use crate::api::events::{EventType, PodEvents, Reason};

/// What a volume is, as far as this kubelet is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Source<'a> {
    /// An emptyDir (also a volume that names no source: the API server defaults it to one).
    EmptyDir {
        medium: &'a str,
    },
    HostPath(&'a HostPathVolumeSource),
    ConfigMap(&'a ConfigMapVolumeSource),
    Secret(&'a SecretVolumeSource),
    DownwardApi(&'a DownwardAPIVolumeSource),
    Projected(&'a ProjectedVolumeSource),
    /// A claim, resolved by the volume manager to its PersistentVolume's path.
    Claim(&'a PersistentVolumeClaimVolumeSource),
    /// Any other type, by its API field name (`configMap`, `persistentVolumeClaim`, ...).
    Unsupported(String),
}

/// The volume's source.
pub fn source(v: &Volume) -> Source<'_> {
    if let Some(h) = &v.host_path {
        return Source::HostPath(h);
    }
    if let Some(e) = &v.empty_dir {
        return Source::EmptyDir {
            medium: e.medium.as_deref().unwrap_or(""),
        };
    }
    if let Some(c) = &v.config_map {
        return Source::ConfigMap(c);
    }
    if let Some(s) = &v.secret {
        return Source::Secret(s);
    }
    if let Some(d) = &v.downward_api {
        return Source::DownwardApi(d);
    }
    if let Some(p) = &v.projected {
        return Source::Projected(p);
    }
    if let Some(c) = &v.persistent_volume_claim {
        return Source::Claim(c);
    }
    // Which other field is set, by its API name: read from the volume's API form, so that no
    // type (nor one newer than this kubelet) goes unnamed.
    let fields = serde_json::to_value(v).ok();
    let set = fields
        .as_ref()
        .and_then(|f| f.as_object())
        .and_then(|o| o.keys().find(|k| *k != "name").cloned());
    match set {
        Some(t) => Source::Unsupported(t),
        None => Source::EmptyDir { medium: "" },
    }
}

/// `<pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<name>`.
pub fn empty_dir_path(pods_dir: &Path, uid: &str, name: &str) -> PathBuf {
    plugin_dir(pods_dir, uid, "kubernetes.io~empty-dir").join(name)
}

/// `<pods dir>/<uid>/volumes/<plugin>`: the directory of a pod's volumes of one type
/// (`kubernetes.io~configmap`, ...), as upstream names it.
pub fn plugin_dir(pods_dir: &Path, uid: &str, plugin: &str) -> PathBuf {
    pods_dir.join(uid).join("volumes").join(plugin)
}

/// The plugin directory name of a volume type whose content the kubelet writes, and whether
/// it is kept on a tmpfs (secrets and projected volumes, which hold tokens, as upstream).
pub fn written_plugin(s: &Source<'_>) -> Option<(&'static str, bool)> {
    match s {
        Source::ConfigMap(_) => Some(("kubernetes.io~configmap", false)),
        Source::Secret(_) => Some(("kubernetes.io~secret", true)),
        Source::DownwardApi(_) => Some(("kubernetes.io~downward-api", false)),
        Source::Projected(_) => Some(("kubernetes.io~projected", true)),
        _ => None,
    }
}

/// Every plugin directory of [`written_plugin`].
pub const WRITTEN_PLUGINS: [&str; 4] = [
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~downward-api",
    "kubernetes.io~projected",
];

/// The host directory (or file) a mount of `v`, a volume of pod `uid`, binds: the hostPath's
/// path, the emptyDir's directory or the directory the kubelet writes. `Err` names the volume
/// type this kubelet does not support, or a claim (resolved by the volume manager).
pub fn host_path(pods_dir: &Path, uid: &str, v: &Volume) -> Result<PathBuf, PluginError> {
    match source(v) {
        Source::HostPath(h) => Ok(PathBuf::from(&h.path)),
        Source::EmptyDir { .. } => Ok(empty_dir_path(pods_dir, uid, &v.name)),
        Source::Unsupported(t) => Err(PluginError::Unsupported(t)),
        Source::Claim(c) => Err(PluginError::ClaimNotResolved(c.claim_name.clone())),
        written => match written_plugin(&written) {
            Some((plugin, _)) => Ok(plugin_dir(pods_dir, uid, plugin).join(&v.name)),
            None => Err(PluginError::Unsupported(v.name.clone())),
        },
    }
}

/// Whether a mount of the volume is always read-only: the types whose content the kubelet
/// writes (upstream's `mustMountRO`).
pub fn read_only(v: &Volume) -> bool {
    written_plugin(&source(v)).is_some()
}

/// A volume set up for a sync: the host path its mounts bind, and whether every mount of it is
/// read-only (one the kubelet writes, or a claim the pod asks for read-only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    pub path: PathBuf,
    pub read_only: bool,
}

/// The [`MountedVolume`] of `v`, a volume of pod `uid` set up here or by the volume manager
/// (a claim aside, which the volume manager resolves).
pub fn mounted(pods_dir: &Path, uid: &str, v: &Volume) -> Result<MountedVolume, PluginError> {
    Ok(MountedVolume {
        path: host_path(pods_dir, uid, v)?,
        read_only: read_only(v),
    })
}

/// Why `v`, which a container mounts, is not among the volumes its sync set up.
pub fn not_set_up(v: &Volume) -> PluginError {
    match source(v) {
        Source::Claim(c) => PluginError::ClaimNotResolved(c.claim_name.clone()),
        Source::Unsupported(t) => PluginError::Unsupported(t),
        _ => PluginError::NotSetUp(v.name.clone()),
    }
}

/// A volume that could not be set up, and why (the [`PluginError`]'s text: the event's reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub volume: String,
    pub message: String,
}

impl Failure {
    /// The failure of `volume` for `error`.
    pub fn new(volume: &str, error: &PluginError) -> Self {
        Failure {
            volume: volume.to_string(),
            message: error.to_string(),
        }
    }

    /// The `FailedMount` event's message, as upstream's operation generator words it.
    pub fn event_message(&self) -> String {
        format!(
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume, self.message
        )
    }
}

/// The names of the volumes the pod's containers (init, app and ephemeral) mount or use as
/// devices.
pub fn used_volumes(pod: &Pod) -> BTreeSet<&str> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeSet::new();
    };
    let regular = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .flat_map(|c| {
            let mounts = c.volume_mounts.iter().flatten().map(|m| m.name.as_str());
            let devices = c.volume_devices.iter().flatten().map(|d| d.name.as_str());
            mounts.chain(devices)
        });
    let ephemeral = spec.ephemeral_containers.iter().flatten().flat_map(|c| {
        let mounts = c.volume_mounts.iter().flatten().map(|m| m.name.as_str());
        let devices = c.volume_devices.iter().flatten().map(|d| d.name.as_str());
        mounts.chain(devices)
    });
    regular.chain(ephemeral).collect()
}

/// Whether the volume manager sets the volume up: those whose content the kubelet writes
/// ([`written_plugin`]), memory-backed emptyDirs (a tmpfs it mounts) and claims.
pub fn managed(s: &Source<'_>) -> bool {
    written_plugin(s).is_some()
        || *s == (Source::EmptyDir { medium: "Memory" })
        || matches!(s, Source::Claim(_))
}

/// Sets up the volumes the containers of `pod` (whose UID is `uid`) use but the [`managed`]
/// ones; the ones that failed, in spec order.
pub fn set_up_volumes(pods_dir: &Path, uid: &str, pod: &Pod) -> Vec<Failure> {
    let used = used_volumes(pod);
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter(|v| used.contains(v.name.as_str()))
        .filter(|v| !managed(&source(v)))
        .filter_map(|v| {
            let e = set_up_one(pods_dir, uid, pod, v).err()?;
            Some(Failure::new(&v.name, &e))
        })
        .collect()
}

/// Sets up an emptyDir or hostPath volume; refuses the types not supported.
pub fn set_up_one(pods_dir: &Path, uid: &str, pod: &Pod, v: &Volume) -> Result<(), PluginError> {
    match source(v) {
        Source::EmptyDir { medium: "" } => {
            make_empty_dir(&empty_dir_path(pods_dir, uid, &v.name), fs_group(pod)?)
        }
        Source::EmptyDir { medium } if medium.starts_with("HugePages") => {
            Err(PluginError::HugePages(medium.to_string()))
        }
        Source::EmptyDir { medium } => Err(PluginError::UnknownMedium(medium.to_string())),
        Source::HostPath(h) => check_host_path(&h.path, h.type_.as_deref().unwrap_or("")),
        Source::Unsupported(t) => Err(PluginError::Unsupported(t)),
        _ => Err(PluginError::Managed(v.name.clone())),
    }
}

/// The pod's `fsGroup`, the group its volumes are given.
pub fn fs_group(pod: &Pod) -> Result<Option<u32>, PluginError> {
    let g = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.fs_group);
    g.map(|g| u32::try_from(g).map_err(|_| PluginError::InvalidFsGroup(g)))
        .transpose()
}

/// What an `fsGroup` adds to a writable volume's directory (upstream's `SetVolumeOwnership`):
/// `0660 | 0110` and setgid, owned by the group.
const GROUP_RW_DIR_BITS: u32 = 0o2770;

/// Gives the directory `dir` to `group` as upstream's `SetVolumeOwnership` does for a writable
/// volume (its mode plus [`GROUP_RW_DIR_BITS`]).
pub fn own_by_group(dir: &Path, group: u32) -> Result<(), PluginError> {
    let fail = |source| PluginError::Own {
        path: dir.to_path_buf(),
        group,
        source,
    };
    let meta = std::fs::metadata(dir).map_err(fail)?;
    std::os::unix::fs::chown(dir, None, Some(group)).map_err(fail)?;
    let mode = meta.permissions().mode() & 0o7777 | GROUP_RW_DIR_BITS;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// Makes an emptyDir's directory, mode 0777 whatever the umask (upstream's `setupDir`), given
/// to the pod's `fsGroup` when it has one; its parents as the kubelet's other pod directories
/// (0750). An existing directory is left as it is (its container may have changed its mode).
pub fn make_empty_dir(dir: &Path, group: Option<u32>) -> Result<(), PluginError> {
    let fail = |source| PluginError::CreateDir {
        path: dir.to_path_buf(),
        source,
    };
    if let Some(parent) = dir.parent() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(fail)?;
    }
    match DirBuilder::new().mode(0o777).create(dir) {
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(fail)?;
            if let Some(g) = group {
                own_by_group(dir, g)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir).map_err(fail)?;
            if !meta.is_dir() {
                return Err(PluginError::NotADirectory(dir.to_path_buf()));
            }
            Ok(())
        }
        Err(e) => Err(fail(e)),
    }
}

/// Upstream's hostPath `SetUp`: the path has no `..`, then what `type` asks is checked, and
/// made for the `...OrCreate` types. As upstream, the checks follow symbolic links, a "file" is
/// anything that exists and is not a directory, and an existing path is never replaced.
pub fn check_host_path(path: &str, type_: &str) -> Result<(), PluginError> {
    let p = Path::new(path);
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(PluginError::HostPathClimbs(path.to_string()));
    }
    if !p.is_absolute() {
        return Err(PluginError::HostPathRelative(path.to_string()));
    }
    let meta = std::fs::metadata(p).ok();
    let ft = meta.as_ref().map(|m| m.file_type());
    let fail = |expected| {
        Err(PluginError::HostPathType {
            path: path.to_string(),
            expected,
        })
    };
    let create = |what| {
        move |source| PluginError::HostPathCreate {
            what,
            path: path.to_string(),
            source,
        }
    };
    match type_ {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_none() => DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(p)
            .map_err(create("directory")),
        "DirectoryOrCreate" | "Directory" if ft.is_some_and(|t| t.is_dir()) => Ok(()),
        "DirectoryOrCreate" | "Directory" => fail("a directory"),
        // As upstream's `makeFile`: O_CREAT without O_EXCL or O_TRUNC, no parents made.
        "FileOrCreate" if meta.is_none() => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(p)
            .map(drop)
            .map_err(create("file")),
        "FileOrCreate" | "File" if ft.is_some_and(|t| !t.is_dir()) => Ok(()),
        "FileOrCreate" | "File" => fail("a file"),
        "Socket" if ft.is_some_and(|t| t.is_socket()) => Ok(()),
        "Socket" => fail("a socket file"),
        "CharDevice" if ft.is_some_and(|t| t.is_char_device()) => Ok(()),
        "CharDevice" => fail("a character device"),
        "BlockDevice" if ft.is_some_and(|t| t.is_block_device()) => Ok(()),
        "BlockDevice" => fail("a block device"),
        other => Err(PluginError::HostPathTypeUnknown(other.to_string())),
    }
}

/// Resolves a mount's `subPath` (relative and without `..`, as the caller checked) in the
/// volume at `root` without leaving it, and makes the directories it lacks (with the mode of the
/// volume's root, whatever the umask), as upstream's `SafeMakeDir`. Every lookup is an
/// `openat2` from the volume's root with `RESOLVE_BENEATH`, so a symbolic link in the volume
/// (one a container made, say) cannot lead outside it: an absolute link, or one climbing out
/// with `..`, is refused.
///
/// Returns a descriptor (`O_PATH`) of what it resolved: [`bind_sub_path`] binds that very file
/// or directory, so a container that swaps a component for a link afterwards changes nothing.
pub fn sub_path(root: &Path, sub: &Path) -> Result<rustix::fd::OwnedFd, PluginError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use rustix::io::Errno;
    let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let why = |source: Errno| PluginError::SubPath {
        sub: sub.to_path_buf(),
        source,
    };
    let resolve = |at: &rustix::fd::OwnedFd, p: &Path, flags: OFlags| {
        rustix::fs::openat2(at, p, flags | OFlags::CLOEXEC, Mode::empty(), beneath)
    };
    let root_fd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(PluginError::OpenVolume)?;
    match resolve(&root_fd, sub, OFlags::PATH) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(why(e)),
    }
    let mode = rustix::fs::fstat(&root_fd)
        .map(|st| Mode::from_raw_mode(st.st_mode & 0o7777))
        .map_err(PluginError::VolumeMode)?;
    // Each prefix of the path in turn, resolved from the root; a missing one is made in the
    // one before it.
    let mut parent: Option<rustix::fd::OwnedFd> = None;
    let mut at = PathBuf::new();
    for comp in sub.components() {
        let Component::Normal(name) = comp else {
            continue;
        };
        at.push(name);
        let dir = match resolve(&root_fd, &at, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(parent.as_ref().unwrap_or(&root_fd), name, mode) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(why(e)),
                }
                // Its mode as the volume's, not the umask's: through a real descriptor of it.
                let made =
                    resolve(&root_fd, &at, OFlags::RDONLY | OFlags::DIRECTORY).map_err(why)?;
                rustix::fs::fchmod(&made, mode).map_err(why)?;
                made
            }
            Err(e) => return Err(why(e)),
        };
        parent = Some(dir);
    }
    // The path named only directories: the last one made or found is it.
    match parent {
        Some(fd) => Ok(fd),
        None => resolve(&root_fd, sub, OFlags::PATH).map_err(why),
    }
}

/// Where the subPath of mount `index` of `container` in volume `volume` of pod `uid` is bound
/// for the runtime (upstream's layout): `<pods dir>/<uid>/volume-subpaths/<volume>/<container>/
/// <index>`.
pub fn sub_path_target(
    pods_dir: &Path,
    uid: &str,
    volume: &str,
    container: &str,
    index: usize,
) -> PathBuf {
    pods_dir
        .join(uid)
        .join(VOLUME_SUBPATHS)
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// The directory of a pod's subPath binds, under its pod directory.
pub const VOLUME_SUBPATHS: &str = "volume-subpaths";

/// Binds what `resolved` (from [`sub_path`]) is onto `target` (made as a file or a directory
/// like it), through `/proc/self/fd`, as upstream's kubelet does: the runtime binds `target`,
/// which is that file whatever has been renamed or linked in the volume since. A bind left at
/// `target` by an earlier sync is replaced.
pub fn bind_sub_path(resolved: &rustix::fd::OwnedFd, target: &Path) -> Result<(), PluginError> {
    use std::os::fd::AsRawFd;
    let st = rustix::fs::fstat(resolved).map_err(PluginError::ReadResolved)?;
    let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
    let making = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PluginError::MakeTarget { path, source }
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(making(parent))?;
    }
    // A bind of an earlier sync: undone first (the running container keeps its own).
    if let Ok(true) = super::is_mount_point(target) {
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).map_err(|source| {
            PluginError::Unmount {
                path: target.to_path_buf(),
                source,
            }
        })?;
    }
    let made = if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(|_| ())
    };
    match made {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(making(target)(e)),
    }
    let source = format!("/proc/self/fd/{}", resolved.as_raw_fd());
    nix::mount::mount(
        Some(source.as_str()),
        target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| PluginError::Bind {
        path: target.to_path_buf(),
        source,
    })
}

/// Reports the volumes of `pod` that could not be set up (see the module docs): each is a
/// `FailedMount` event on the pod, and the sync ends with a [`VolumeError`] naming them.
pub fn report(pod: &Pod, failed: &[Failure], events: &dyn PodEvents) -> Result<(), VolumeError> {
    if failed.is_empty() {
        return Ok(());
    }
    for f in failed {
        events.event(
            pod,
            None,
            EventType::Warning,
            Reason::FailedMountVolume,
            f.event_message(),
        );
    }
    let names: Vec<&str> = failed.iter().map(|f| f.volume.as_str()).collect();
    let why: Vec<String> = failed.iter().map(Failure::event_message).collect();
    Err(VolumeError(format!(
        "unmounted volumes=[{}]: {}",
        names.join(" "),
        why.join("; ")
    )))
}

#[cfg(test)]
mod tests;
