//! The steps of CreateContainer: checking the request and resolving what it names (the
//! sandbox as it was created, the image, the stop signal, the log path), reserving the
//! container's name, finding the live sandbox and the container whose PID namespace it joins,
//! staging the rootfs, writing the OCI spec (with what it needs made on the node: bind sources,
//! the working directory) and having the sandbox create the container. The RPC body that runs
//! them in order, and undoes what a failed one left, is the parent's `create`.

use std::path::{Component, Path, PathBuf};

use crate::builtin::store::{ContainerRecord, SandboxRecord};
use crate::builtin::{
    ANNOTATION_STOP_SIGNAL, BuiltinRuntime, Reservation, cdi, image_error, pod, sandbox_error,
    spec, userns,
};
use crate::{Error, Result, cri};

/// Joins the sandbox's log directory and the container's relative log path, refusing escapes.
fn log_path(dir: &str, rel: &str) -> Result<String> {
    if rel.is_empty() || dir.is_empty() {
        return Ok(String::new());
    }
    let relp = Path::new(rel);
    if relp.is_absolute()
        || relp
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(Error::invalid_argument(format!(
            "log path {rel:?} must be relative to the sandbox log directory, without '..'"
        )));
    }
    Ok(Path::new(dir).join(relp).to_string_lossy().into_owned())
}

/// The user a container runs as: UID, GID and supplementary groups (sorted, without repeats).
type ContainerUser = (u32, u32, Vec<u32>);

/// A CreateContainer request, checked, with what it names resolved.
pub(super) struct Creation {
    pub config: cri::ContainerConfig,
    pub meta: cri::ContainerMetadata,
    /// The sandbox's record: its config as it was created with.
    pub sandbox: SandboxRecord,
    image_name: String,
    pub image: images::Image,
    /// The container's own stop signal, which wins over the image's.
    own_stop_signal: Option<i32>,
    log: String,
    /// The CDI devices it asks for, found in the spec dirs.
    cdi: cdi::Devices,
}

impl Creation {
    /// The record of the container created as `id`, running as `user`.
    pub(super) fn record(&self, id: &str, user: Option<ContainerUser>) -> ContainerRecord {
        let image = &self.image;
        ContainerRecord {
            id: id.to_string(),
            sandbox_id: self.sandbox.id.clone(),
            image_ref: self.image_name.clone(),
            image_id: image.id.clone(),
            image_digest: image.repo_digests.first().cloned().unwrap_or_default(),
            created_at: sandbox::now_ns(),
            log_path: self.log.clone(),
            stop_signal: self.own_stop_signal.or_else(|| {
                image
                    .config
                    .stop_signal
                    .as_deref()
                    .and_then(spec::parse_signal)
            }),
            config: self.config.clone(),
            user,
        }
    }
}

/// Where and how a container's OCI spec is written: its id and bundle, the live sandbox, the
/// container whose PID namespace it joins, the pod's user namespace.
pub(super) struct SpecPlace<'a> {
    pub id: &'a str,
    pub bundle: &'a Path,
    pub live: &'a sandbox::SandboxState,
    pub target_pid: Option<i32>,
    pub userns: Option<&'a userns::PodUserns>,
}

/// The container's own stop signal (the pod's lifecycle.stopSignal, which CRI v1 as spoken
/// here carries only as this annotation), which wins over the image's STOPSIGNAL.
fn own_stop_signal(config: &cri::ContainerConfig) -> Result<Option<i32>> {
    match config.annotations.get(ANNOTATION_STOP_SIGNAL) {
        Some(s) => Ok(Some(spec::parse_signal(s).ok_or_else(|| {
            Error::invalid_argument(format!(
                "annotation {}: {s:?} is not a signal",
                ANNOTATION_STOP_SIGNAL
            ))
        })?)),
        None => Ok(None),
    }
}

/// The pod's user namespace, held by the sandbox's holder process, when the pod has one.
pub(super) fn pod_userns(
    sandbox_config: &cri::PodSandboxConfig,
    live: &sandbox::SandboxState,
) -> Result<Option<userns::PodUserns>> {
    let opts = pod::namespace_options(sandbox_config);
    Ok(match (live.userns_holder, pod::user_namespace(&opts)?) {
        (Some(holder), Some(maps)) => Some(userns::PodUserns::of_holder(holder, &maps)?),
        _ => None,
    })
}

impl BuiltinRuntime {
    /// Checks a CreateContainer request and resolves what it names: the sandbox (as it was
    /// created), the image, the stop signal, the log path.
    pub(super) fn creation(&self, req: cri::CreateContainerRequest) -> Result<Creation> {
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("CreateContainer needs a config"))?;
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("container config needs metadata"))?;
        if meta.name.is_empty() || meta.name.contains('/') {
            return Err(Error::invalid_argument(format!(
                "container name {:?} is not valid",
                meta.name
            )));
        }
        // The kubelet sends the sandbox config again; the one it was created with is the truth.
        let sandbox = self.inner.records.need_sandbox(&req.pod_sandbox_id)?;
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if image_name.is_empty() {
            return Err(Error::invalid_argument("container config needs an image"));
        }
        let own_stop_signal = own_stop_signal(&config)?;
        let image = self
            .inner
            .images
            .resolve(&image_name)
            .map_err(image_error)?
            .ok_or_else(|| Error::not_found(format!("image {image_name:?} not found")))?;
        let log = log_path(&sandbox.config.log_directory, &config.log_path)?;
        // Asked for by the container or, through annotations, its pod (as it was created).
        let cdi_names = cdi::requested(&config, &sandbox.config)?;
        let cdi = cdi::Devices::resolve(&self.inner.cfg.cdi_spec_dirs, &cdi_names)?;
        Ok(Creation {
            config,
            meta,
            sandbox,
            image_name,
            image,
            own_stop_signal,
            log,
            cdi,
        })
    }

    /// Reserves the name `meta` gives a container in sandbox `sandbox_id`: taken while another
    /// container of the sandbox has it.
    pub(super) fn reserve_container_name(
        &self,
        sandbox_id: &str,
        meta: &cri::ContainerMetadata,
    ) -> Result<Reservation> {
        let key = format!("container {sandbox_id}/{}_{}", meta.name, meta.attempt);
        self.reserve(key, || {
            for other in self.inner.records.all_containers() {
                if other.sandbox_id == sandbox_id {
                    if let Some(m) = &other.config.metadata {
                        if m.name == meta.name && m.attempt == meta.attempt {
                            return Err(Error::already_exists(format!(
                                "container {}_{} already exists in sandbox {sandbox_id} as {}",
                                meta.name, meta.attempt, other.id
                            )));
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// The live state of the sandbox of `rec`, which must serve and not be stopped.
    pub(super) async fn ready_sandbox(&self, rec: &SandboxRecord) -> Result<sandbox::SandboxState> {
        let sandbox_id = &rec.id;
        let live = self.client(sandbox_id).state().await.map_err(|e| {
            Error::failed_precondition(format!("pod sandbox {sandbox_id} is not ready: {e}"))
        })?;
        if rec.stopped {
            return Err(Error::failed_precondition(format!(
                "pod sandbox {sandbox_id} is stopped"
            )));
        }
        Ok(live)
    }

    /// The PID of the running container whose PID namespace the container joins (namespace
    /// mode TARGET), `None` when it asks for none or that container does not run.
    pub(super) fn target_pid(
        &self,
        config: &cri::ContainerConfig,
        live: &sandbox::SandboxState,
    ) -> Result<Option<i32>> {
        let Some(target) = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .filter(|o| o.pid == cri::NamespaceMode::Target as i32)
            .map(|o| &o.target_id)
        else {
            return Ok(None);
        };
        let t = self
            .inner
            .records
            .resolve_container(target)?
            .ok_or_else(|| Error::not_found(format!("target container {target} not found")))?;
        Ok(live
            .containers
            .iter()
            .find(|c| c.id == t && c.state == sandbox::State::Running)
            .map(|c| c.pid))
    }

    /// Prepares container `id`'s rootfs from image `image_id` in its bundle, ID-mapped to the
    /// pod's user namespace when it has one.
    pub(super) fn stage_rootfs(
        &self,
        id: &str,
        image_id: &str,
        bundle: &Path,
        userns: Option<&userns::PodUserns>,
    ) -> Result<()> {
        let rootfs = bundle.join("rootfs");
        let images = &self.inner.images;
        match userns {
            None => images.prepare_rootfs(image_id, id, &rootfs),
            Some(ns) => images.prepare_rootfs_mapped(image_id, id, &rootfs, &ns.rootfs_idmap()),
        }
        .map_err(image_error)
    }

    /// Writes the container's OCI spec into its bundle, having made what it needs on the node
    /// (bind sources, the working directory; in a pod user namespace, ID-mapped binds). Returns
    /// the user it runs as: UID, GID and supplementary groups.
    pub(super) fn write_spec(
        &self,
        want: &Creation,
        at: &SpecPlace<'_>,
    ) -> Result<Option<ContainerUser>> {
        let sandbox_id = &want.sandbox.id;
        let rootfs = at.bundle.join("rootfs");
        let live = at.live;
        let etc = sandbox::Layout::new(self.sandbox_dir(sandbox_id));
        let mut oci = spec::container_spec(&spec::SpecInput {
            container_id: at.id,
            config: &want.config,
            sandbox: &want.sandbox.config,
            image: &want.image.config,
            rootfs: &rootfs,
            sandbox_pid: live.pid,
            pid_ns_holder: live.pid_ns_holder,
            userns_holder: live.userns_holder,
            target_pid: at.target_pid,
            cgroup_parent: &want.sandbox.cgroup_parent,
            etc_hosts: &etc.hosts(),
            etc_hostname: &etc.hostname(),
            etc_resolv_conf: &etc.resolv_conf(),
        })?;
        spec::annotate_sandbox_id(&mut oci, sandbox_id);
        want.cdi.apply(&mut oci)?;
        create_bind_sources(&oci)?;
        if let Some(process) = oci.process() {
            for made in create_working_dir(&rootfs, process.cwd())? {
                if let Some(ns) = at.userns {
                    ns.give_to_root(&made)?;
                }
            }
        }
        if let Some(ns) = at.userns {
            ns.stage_binds(&mut oci, at.bundle)?;
        }
        let user = oci.process().as_ref().map(|p| {
            let u = p.user();
            let mut groups = u.additional_gids().clone().unwrap_or_default();
            groups.sort_unstable();
            groups.dedup();
            (u.uid(), u.gid(), groups)
        });
        oci.save(at.bundle.join("config.json"))
            .map_err(|e| Error::internal(format!("writing OCI spec: {e}")))?;
        Ok(user)
    }

    /// Has the sandbox create container `id` from its bundle (libcontainer makes it at its
    /// start; the ID-mapped binds staged for a pod user namespace stay until then).
    pub(super) async fn create_in_sandbox(
        &self,
        want: &Creation,
        id: &str,
        bundle: &Path,
    ) -> Result<()> {
        self.client(&want.sandbox.id)
            .create(sandbox::ContainerSpec {
                id: id.to_string(),
                bundle: bundle.to_path_buf(),
                log_path: (!want.log.is_empty()).then(|| PathBuf::from(&want.log)),
                stdin: want.config.stdin,
                stdin_once: want.config.stdin_once,
            })
            .await
            .map_err(sandbox_error)?;
        Ok(())
    }
}

/// Creates missing source directories of bind mounts, as containerd does for CRI mounts.
fn create_bind_sources(oci: &oci_spec::runtime::Spec) -> Result<()> {
    for m in oci.mounts().iter().flatten() {
        let is_bind = m
            .options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"));
        if let (true, Some(src)) = (is_bind, m.source()) {
            // The container's own cgroups (spec::spell_out_cgroup_v1) are made by libcontainer.
            if !src.exists() && !src.starts_with("/sys/fs/cgroup") {
                std::fs::create_dir_all(src).map_err(|e| {
                    Error::invalid_argument(format!("creating mount source {}: {e}", src.display()))
                })?;
            }
        }
    }
    Ok(())
}

/// Creates the working directory in the rootfs when the image lacks it, as runc does (root's,
/// 0755) and containerd counts on; libcontainer would fail the start instead. The path is
/// resolved inside the rootfs, its symlinks included. Returns the directories it created.
fn create_working_dir(rootfs: &Path, cwd: &Path) -> Result<Vec<PathBuf>> {
    let dir = spec::resolve_in_root(rootfs, cwd).ok_or_else(|| {
        Error::invalid_argument(format!(
            "working directory {}: cannot be resolved in the image",
            cwd.display()
        ))
    })?;
    let mut made = Vec::new();
    let mut missing = Some(dir.as_path());
    while let Some(p) = missing.filter(|p| p.starts_with(rootfs) && !p.exists()) {
        made.push(p.to_path_buf());
        missing = p.parent();
    }
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(|e| {
            Error::invalid_argument(format!("creating working directory {}: {e}", cwd.display()))
        })?;
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_dir_is_created_inside_the_rootfs() {
        let rootfs = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let made = create_working_dir(rootfs.path(), Path::new("/work/dir")).unwrap();
        assert!(rootfs.path().join("work/dir").is_dir());
        // What it made, deepest first, so that a user namespace's root can be given it.
        assert_eq!(
            made,
            [rootfs.path().join("work/dir"), rootfs.path().join("work")]
        );
        assert!(
            create_working_dir(rootfs.path(), Path::new("/work"))
                .unwrap()
                .is_empty()
        );
        // An absolute symlink in the image points into the rootfs, not at the host.
        std::os::unix::fs::symlink(outside.path(), rootfs.path().join("link")).unwrap();
        create_working_dir(rootfs.path(), Path::new("/link/sub")).unwrap();
        let inside = rootfs
            .path()
            .join(outside.path().strip_prefix("/").unwrap());
        assert!(inside.join("sub").is_dir());
        assert!(!outside.path().join("sub").exists());
        // A file in the way is the request's fault.
        std::fs::write(rootfs.path().join("file"), "").unwrap();
        let err = create_working_dir(rootfs.path(), Path::new("/file/sub")).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
    }

    #[test]
    fn log_paths_stay_inside_the_log_directory() {
        assert_eq!(
            log_path("/var/log/pods/x", "c/0.log").unwrap(),
            "/var/log/pods/x/c/0.log"
        );
        assert_eq!(log_path("", "c/0.log").unwrap(), "");
        assert!(log_path("/var/log/pods/x", "../../etc/passwd").is_err());
        assert!(log_path("/var/log/pods/x", "/etc/passwd").is_err());
    }
}
