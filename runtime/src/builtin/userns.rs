//! The file side of a pod's user namespace. Its processes run as the namespace's IDs, so the
//! files they see are ID-mapped through it, as Kubernetes expects of a runtime that advertises
//! user namespaces: the image's layers (by the image store), and every bind mount (volumes, the
//! pod's /etc files), which gets an ID-mapped clone of its source staged in the bundle for
//! libcontainer to bind (libcontainer refuses ID-mapped mounts itself). Files the node's root
//! owns are the container root's, and what the container's root writes lands as the node's
//! root, exactly as in a pod without a user namespace.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use oci_spec::runtime::Spec;

use crate::{Error, Result};

/// Where the ID-mapped clones of a container's bind sources are attached until libcontainer has
/// bound them into the container.
const STAGED: &str = "idmapped";

/// A pod's user namespace, held open through its holder process.
pub(super) struct PodUserns {
    ns: File,
    root_uid: u32,
    root_gid: u32,
}

impl PodUserns {
    /// The user namespace of the sandbox's holder process, which RunPodSandbox made with
    /// `maps` (each starting at container ID 0: its host ID is the container root's).
    pub fn of_holder(pid: i32, maps: &sandbox::IdMappings) -> Result<Self> {
        let path = format!("/proc/{pid}/ns/user");
        let ns = File::open(&path).map_err(|e| {
            Error::failed_precondition(format!("the pod's user namespace ({path}): {e}"))
        })?;
        Ok(PodUserns {
            ns,
            root_uid: maps.uids.host,
            root_gid: maps.gids.host,
        })
    }

    pub fn rootfs_idmap(&self) -> images::RootfsIdMap<'_> {
        images::RootfsIdMap {
            userns: self.ns.as_fd(),
            root_uid: self.root_uid,
            root_gid: self.root_gid,
        }
    }

    /// Gives a path the runtime created in the rootfs (on the upper dir, which is not
    /// ID-mapped) to the container's root.
    pub fn give_to_root(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::lchown(path, Some(self.root_uid), Some(self.root_gid)).map_err(|e| {
            Error::internal(format!("giving {} to the pod's root: {e}", path.display()))
        })
    }

    /// Replaces the source of every bind mount of `oci` (but binds of /sys and /proc) by an
    /// ID-mapped clone of it, attached under `bundle/idmapped/`. [`unstage`] detaches them once the container exists.
    pub fn stage_binds(&self, oci: &mut Spec, bundle: &Path) -> Result<()> {
        let Some(mut mounts) = oci.mounts().clone() else {
            return Ok(());
        };
        let staged = bundle.join(STAGED);
        std::fs::create_dir_all(&staged)
            .map_err(|e| Error::internal(format!("creating {}: {e}", staged.display())))?;
        for (i, m) in mounts.iter_mut().enumerate() {
            let options = m.options().clone().unwrap_or_default();
            let recursive = options.iter().any(|o| o == "rbind");
            if !recursive && !options.iter().any(|o| o == "bind") {
                continue;
            }
            let Some(source) = m.source().clone() else {
                continue;
            };
            // The kernel's own views (cgroups, for one) have no owners to map.
            if source.starts_with("/sys") || source.starts_with("/proc") {
                continue;
            }
            let at = staged.join(i.to_string());
            let made = if source.is_dir() {
                std::fs::create_dir(&at)
            } else {
                File::create(&at).map(drop)
            };
            made.map_err(|e| Error::internal(format!("staging mount {}: {e}", at.display())))?;
            images::idmap::bind_mapped(&source, &at, self.ns.as_fd(), recursive).map_err(|e| {
                Error::invalid_argument(format!(
                    "mount {} -> {}: cannot be ID-mapped into the pod's user namespace: {e}",
                    source.display(),
                    m.destination().display()
                ))
            })?;
            m.set_source(Some(at));
        }
        oci.set_mounts(Some(mounts));
        Ok(())
    }
}

/// Detaches and removes what [`PodUserns::stage_binds`] attached in `bundle`. Idempotent.
pub(super) fn unstage(bundle: &Path) {
    let staged = bundle.join(STAGED);
    let Ok(entries) = std::fs::read_dir(&staged) else {
        return;
    };
    for entry in entries.flatten() {
        if let Err(e) = images::idmap::detach(&entry.path()) {
            tracing::warn!("{e}");
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&staged) {
        tracing::warn!(dir = %staged.display(), "removing staged mounts: {e}");
    }
}
