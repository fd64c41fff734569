//! Container RPCs: CreateContainer, StartContainer, StopContainer, RemoveContainer,
//! ContainerStatus, ListContainers, UpdateContainerResources, ReopenContainerLog, ExecSync.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::store::{ContainerRecord, SandboxRecord};
use super::{BuiltinRuntime, Reservation, image_error, new_id, pod, sandbox_error, spec, userns};
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

/// The live or last known status of each container, by id.
pub(super) type Statuses = BTreeMap<String, sandbox::ContainerStatus>;

/// The user a container runs as: UID, GID and supplementary groups (sorted, without repeats).
type ContainerUser = (u32, u32, Vec<u32>);

/// A CreateContainer request, checked, with what it names resolved.
struct Creation {
    config: cri::ContainerConfig,
    meta: cri::ContainerMetadata,
    /// The sandbox's record: its config as it was created with.
    sandbox: SandboxRecord,
    image_name: String,
    image: images::Image,
    /// The container's own stop signal, which wins over the image's.
    own_stop_signal: Option<i32>,
    log: String,
}

impl Creation {
    /// The record of the container created as `id`, running as `user`.
    fn record(&self, id: &str, user: Option<ContainerUser>) -> ContainerRecord {
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
struct SpecPlace<'a> {
    id: &'a str,
    bundle: &'a Path,
    live: &'a sandbox::SandboxState,
    target_pid: Option<i32>,
    userns: Option<&'a userns::PodUserns>,
}

/// The container's own stop signal (the pod's lifecycle.stopSignal, which CRI v1 as spoken
/// here carries only as this annotation), which wins over the image's STOPSIGNAL.
fn own_stop_signal(config: &cri::ContainerConfig) -> Result<Option<i32>> {
    match config.annotations.get(super::ANNOTATION_STOP_SIGNAL) {
        Some(s) => Ok(Some(spec::parse_signal(s).ok_or_else(|| {
            Error::invalid_argument(format!(
                "annotation {}: {s:?} is not a signal",
                super::ANNOTATION_STOP_SIGNAL
            ))
        })?)),
        None => Ok(None),
    }
}

/// The pod's user namespace, held by the sandbox's holder process, when the pod has one.
fn pod_userns(
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
    /// Statuses of every container of the sandboxes named, from their processes or, for those
    /// that are gone, from what they persisted.
    pub(super) async fn statuses(&self, sandbox_ids: &[String]) -> Statuses {
        let mut out = Statuses::new();
        for id in sandbox_ids {
            let client = self.client(id);
            let list = match client.state().await {
                Ok(s) => s.containers,
                Err(_) => client.persisted(),
            };
            for s in list {
                out.insert(s.id.clone(), s);
            }
        }
        out
    }

    /// The records matching a CRI container filter (id and sandbox id by prefix, labels), with
    /// the statuses of their sandboxes' containers.
    pub(super) async fn matching(
        &self,
        id: &str,
        sandbox_id: &str,
        labels: &std::collections::HashMap<String, String>,
    ) -> (Vec<ContainerRecord>, Statuses) {
        let recs: Vec<ContainerRecord> = self
            .inner
            .records
            .all_containers()
            .into_iter()
            .filter(|r| r.id.starts_with(id) && r.sandbox_id.starts_with(sandbox_id))
            .filter(|r| pod::labels_match(&r.config.labels, labels))
            .collect();
        let mut sandboxes: Vec<String> = recs.iter().map(|r| r.sandbox_id.clone()).collect();
        sandboxes.sort();
        sandboxes.dedup();
        let statuses = self.statuses(&sandboxes).await;
        (recs, statuses)
    }

    pub(super) async fn status_of(
        &self,
        rec: &ContainerRecord,
    ) -> Option<sandbox::ContainerStatus> {
        self.statuses(std::slice::from_ref(&rec.sandbox_id))
            .await
            .remove(&rec.id)
    }

    /// CreateContainer: checks the request, then, with the sandbox held and the container's
    /// name reserved, stages the rootfs, writes the OCI spec, has the sandbox create the
    /// container and records it. What a failed step leaves is undone at the end.
    pub(super) async fn create(&self, req: cri::CreateContainerRequest) -> Result<String> {
        let want = self.creation(req)?;
        let sandbox_id = want.sandbox.id.clone();
        let lock = self.sandbox_lock(&sandbox_id);
        let _shared = lock.read().await;
        if self.inner.records.sandbox(&sandbox_id).is_none() {
            return Err(Error::not_found(format!(
                "pod sandbox {sandbox_id} is gone"
            )));
        }
        let _reserved = self.reserve_container_name(&sandbox_id, &want.meta)?;
        let live = self.ready_sandbox(&want.sandbox).await?;
        let target_pid = self.target_pid(&want.config, &live)?;
        let id = new_id()?;
        let bundle = self.bundle_dir(&id);
        let result = async {
            let userns = pod_userns(&want.sandbox.config, &live)?;
            self.stage_rootfs(&id, &want.image.id, &bundle, userns.as_ref())?;
            let spec = SpecPlace {
                id: &id,
                bundle: &bundle,
                live: &live,
                target_pid,
                userns: userns.as_ref(),
            };
            let user = self.write_spec(&want, &spec)?;
            self.create_in_sandbox(&want, &id, &bundle, userns.is_some())
                .await?;
            self.inner.records.save_container(&want.record(&id, user))
        }
        .await;
        if let Err(e) = result {
            let _ = self.client(&sandbox_id).delete(&id).await;
            self.release(&id);
            return Err(e);
        }
        Ok(id)
    }

    /// Checks a CreateContainer request and resolves what it names: the sandbox (as it was
    /// created), the image, the stop signal, the log path.
    fn creation(&self, req: cri::CreateContainerRequest) -> Result<Creation> {
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
        Ok(Creation {
            config,
            meta,
            sandbox,
            image_name,
            image,
            own_stop_signal,
            log,
        })
    }

    /// Reserves the name `meta` gives a container in sandbox `sandbox_id`: taken while another
    /// container of the sandbox has it.
    fn reserve_container_name(
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
    async fn ready_sandbox(&self, rec: &SandboxRecord) -> Result<sandbox::SandboxState> {
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
    fn target_pid(
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
    fn stage_rootfs(
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
    fn write_spec(&self, want: &Creation, at: &SpecPlace<'_>) -> Result<Option<ContainerUser>> {
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

    /// Has the sandbox create container `id` from its bundle; the ID-mapped binds staged for a
    /// pod user namespace (`staged`) go once it has.
    async fn create_in_sandbox(
        &self,
        want: &Creation,
        id: &str,
        bundle: &Path,
        staged: bool,
    ) -> Result<()> {
        let created = self
            .client(&want.sandbox.id)
            .create(sandbox::ContainerSpec {
                id: id.to_string(),
                bundle: bundle.to_path_buf(),
                log_path: (!want.log.is_empty()).then(|| PathBuf::from(&want.log)),
                stdin: want.config.stdin,
                stdin_once: want.config.stdin_once,
            })
            .await;
        // The container has its binds now; the staged clones are not needed.
        if staged {
            userns::unstage(bundle);
        }
        created.map_err(sandbox_error)?;
        Ok(())
    }

    /// Unmounts and deletes a container's rootfs and bundle.
    pub(super) fn release(&self, id: &str) {
        let bundle = self.bundle_dir(id);
        userns::unstage(&bundle);
        if let Err(e) = self.inner.images.release_rootfs(id, &bundle.join("rootfs")) {
            tracing::warn!(container = %id, "releasing rootfs: {e}");
        }
        let _ = std::fs::remove_dir_all(&bundle);
    }

    /// Unmounts the rootfs of container `id`, which has exited, as containerd unmounts a task's
    /// rootfs when it exits, so that a node does not hold a mount for each dead container it
    /// keeps for its logs (files, outside the rootfs). Its writable layer stays until
    /// [`Self::release`] (stats count it; RemoveContainer deletes it), with the bundle; so do
    /// the ID-mapped binds a creation in a pod user namespace may have left staged. Idempotent;
    /// a container already released is fine. Blocks (mountinfo, umount).
    fn unmount_exited(&self, id: &str) {
        let bundle = self.bundle_dir(id);
        userns::unstage(&bundle);
        if let Err(e) = self.inner.images.unmount_rootfs(id, &bundle.join("rootfs")) {
            tracing::warn!(container = %id, "unmounting the rootfs of an exited container: {e}");
        }
    }

    /// [`Self::unmount_exited`] for each of `ids`, off the async threads.
    pub(super) async fn unmount_rootfs_of(&self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let rt = self.clone();
        let unmounted = tokio::task::spawn_blocking(move || {
            for id in &ids {
                rt.unmount_exited(id);
            }
        })
        .await;
        if let Err(e) = unmounted {
            tracing::warn!("unmounting the rootfs of exited containers: {e}");
        }
    }

    /// Unmounts the rootfs of every container of sandbox `sandbox_id` that has exited, and of
    /// all of them once the sandbox is stopped (nothing of it runs): for exits not seen as
    /// events (while no agent ran, between two subscriptions, at a stop or a reap).
    pub(super) async fn unmount_exited_in(&self, sandbox_id: &str) {
        let Some(sandbox) = self.inner.records.sandbox(sandbox_id) else {
            return;
        };
        let stopped = sandbox.stopped || self.client(sandbox_id).is_stopped();
        let statuses = if stopped {
            Statuses::new()
        } else {
            self.statuses(std::slice::from_ref(&sandbox.id)).await
        };
        let exited = self
            .inner
            .records
            .all_containers()
            .into_iter()
            .filter(|c| c.sandbox_id == sandbox.id)
            .filter(|c| {
                stopped
                    || statuses
                        .get(&c.id)
                        .is_some_and(|s| s.state == sandbox::State::Exited)
            })
            .map(|c| c.id)
            .collect();
        self.unmount_rootfs_of(exited).await;
    }

    /// [`Self::release`] off the request path (RemoveContainer): the record is gone already, so
    /// an agent that dies first leaves an orphan its successor releases. Image removal and
    /// RemovePodSandbox wait for pending releases ([`Self::releases_done`]).
    fn release_later(&self, id: &str) {
        let releases = &self.inner.releases;
        releases.pending.fetch_add(1, Ordering::SeqCst);
        let (rt, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            let worker = rt.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || worker.release(&id)).await {
                tracing::warn!("releasing a removed container's rootfs: {e}");
            }
            let releases = &rt.inner.releases;
            if releases.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                releases.idle.notify_waiters();
            }
        });
    }

    /// Waits until no rootfs release is pending.
    pub(super) async fn releases_done(&self) {
        let releases = &self.inner.releases;
        loop {
            let idle = releases.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if releases.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Deletes a container everywhere: in its sandbox, its rootfs, its record.
    pub(super) async fn discard_container(&self, id: &str) {
        self.discard_container_then(id, false).await;
    }

    /// [`Self::discard_container`], its rootfs and bundle released in the background when
    /// `later`.
    async fn discard_container_then(&self, id: &str, later: bool) {
        if let Some(rec) = self.inner.records.container(id) {
            let client = self.client(&rec.sandbox_id);
            if !client.is_stopped() {
                if let Err(e) = client.delete(id).await {
                    tracing::debug!(container = %id, "sandbox delete: {e}");
                }
            }
            // A persisted status outlives a stopped sandbox; it goes with the container.
            let _ = std::fs::remove_file(client.layout().status_dir().join(format!("{id}.json")));
        }
        if later {
            self.inner.records.remove_container(id);
            self.release_later(id);
        } else {
            self.release(id);
            self.inner.records.remove_container(id);
        }
        self.emit(id, cri::ContainerEventType::ContainerDeletedEvent);
    }

    pub(super) async fn start(&self, id: &str) -> Result<()> {
        let rec = self.inner.records.need_container(id)?;
        self.client(&rec.sandbox_id)
            .start(&rec.id)
            .await
            .map_err(sandbox_error)?;
        Ok(())
    }

    pub(super) async fn stop(&self, id: &str, timeout: i64) -> Result<()> {
        let Some(rec) = self.inner.records.find_container(id)? else {
            return Ok(());
        };
        let client = self.client(&rec.sandbox_id);
        if client.is_stopped() {
            return Ok(());
        }
        let signal = rec.stop_signal.unwrap_or(libc_sigterm());
        let timeout = Duration::from_secs(u64::try_from(timeout.max(0)).unwrap_or(0));
        match client.stop(&rec.id, signal, timeout).await {
            // The sandbox answers once the container has exited: its rootfs goes before the
            // answer, as containerd's StopContainer waits for the exit to be handled.
            Ok(st) => {
                if st.state == sandbox::State::Exited {
                    self.unmount_rootfs_of(vec![rec.id]).await;
                }
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    sandbox::Kind::NotFound | sandbox::Kind::Unavailable
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(sandbox_error(e)),
        }
    }

    pub(super) async fn remove(&self, id: &str) -> Result<()> {
        let Some(id) = self.inner.records.resolve_container(id)? else {
            return Ok(());
        };
        let Some(rec) = self.inner.records.container(&id) else {
            return Ok(());
        };
        let lock = self.sandbox_lock(&rec.sandbox_id);
        let _shared = lock.read().await;
        // One removal at a time per container; a concurrent second one finds it gone.
        let Ok(_removing) = self.reserve(format!("remove {id}"), || Ok(())) else {
            return Ok(());
        };
        if self.inner.records.container(&id).is_some() {
            // discard_container_then tells watchers (the kubelet's PLEG), as CRI runtimes do.
            self.discard_container_then(&id, true).await;
        }
        Ok(())
    }

    pub(super) fn cri_status(
        &self,
        rec: &ContainerRecord,
        st: Option<&sandbox::ContainerStatus>,
    ) -> cri::ContainerStatus {
        let (state, created, started, finished, code, reason, message) = match st {
            Some(s) => (
                cri_state(s.state),
                s.created_at,
                s.started_at,
                s.finished_at,
                s.exit_code,
                s.reason.clone(),
                s.message.clone(),
            ),
            None => (
                cri::ContainerState::ContainerUnknown as i32,
                rec.created_at,
                0,
                0,
                0,
                "Unknown".to_string(),
                "the container's sandbox lost track of it".to_string(),
            ),
        };
        let mounts = rec
            .config
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
                selinux_relabel: m.selinux_relabel,
                propagation: m.propagation,
                ..Default::default()
            })
            .collect();
        cri::ContainerStatus {
            id: rec.id.clone(),
            metadata: rec.config.metadata.clone(),
            state,
            created_at: if created > 0 { created } else { rec.created_at },
            started_at: started,
            finished_at: finished,
            exit_code: code,
            image: Some(cri::ImageSpec {
                image: rec.image_ref.clone(),
                ..Default::default()
            }),
            image_ref: if rec.image_digest.is_empty() {
                rec.image_id.clone()
            } else {
                rec.image_digest.clone()
            },
            reason,
            message,
            labels: rec.config.labels.clone(),
            annotations: rec.config.annotations.clone(),
            mounts,
            log_path: rec.log_path.clone(),
            resources: rec
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|r| cri::ContainerResources {
                    linux: Some(r),
                    windows: None,
                }),
            image_id: rec.image_id.clone(),
            user: rec
                .user
                .as_ref()
                .map(|(uid, gid, groups)| cri::ContainerUser {
                    linux: Some(cri::LinuxContainerUser {
                        uid: i64::from(*uid),
                        gid: i64::from(*gid),
                        supplemental_groups: groups.iter().map(|&g| i64::from(g)).collect(),
                    }),
                }),
        }
    }

    pub(super) async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::ContainerStatusResponse> {
        let rec = self.inner.records.need_container(id)?;
        let st = self.status_of(&rec).await;
        let mut info = std::collections::HashMap::new();
        if verbose {
            let detail = serde_json::json!({
                "pid": st.as_ref().map(|s| s.pid),
                "sandboxID": rec.sandbox_id,
                "bundle": self.bundle_dir(&rec.id),
                "cgroupPath": st.as_ref().and_then(|s| s.cgroup_path.clone()),
            });
            info.insert("info".to_string(), detail.to_string());
        }
        Ok(cri::ContainerStatusResponse {
            status: Some(self.cri_status(&rec, st.as_ref())),
            info,
        })
    }

    pub(super) async fn list(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>> {
        let filter = filter.unwrap_or_default();
        let (recs, statuses) = self
            .matching(&filter.id, &filter.pod_sandbox_id, &filter.label_selector)
            .await;
        Ok(recs
            .iter()
            .filter_map(|r| {
                let s = self.cri_status(r, statuses.get(&r.id));
                if filter.state.as_ref().is_some_and(|f| f.state != s.state) {
                    return None;
                }
                Some(cri::Container {
                    id: r.id.clone(),
                    pod_sandbox_id: r.sandbox_id.clone(),
                    metadata: r.config.metadata.clone(),
                    image: s.image.clone(),
                    image_ref: s.image_ref.clone(),
                    state: s.state,
                    created_at: s.created_at,
                    labels: r.config.labels.clone(),
                    annotations: r.config.annotations.clone(),
                    image_id: r.image_id.clone(),
                })
            })
            .collect())
    }

    pub(super) async fn update_resources(
        &self,
        id: &str,
        linux: Option<cri::LinuxContainerResources>,
    ) -> Result<()> {
        let mut rec = self.inner.records.need_container(id)?;
        let Some(linux) = linux else {
            return Ok(());
        };
        let resources = spec::linux_resources(&linux);
        self.client(&rec.sandbox_id)
            .update_resources(&rec.id, &resources)
            .await
            .map_err(sandbox_error)?;
        if let Some(l) = rec.config.linux.as_mut() {
            l.resources = Some(linux);
        }
        self.inner.records.save_container(&rec)
    }

    pub(super) async fn reopen_log(&self, id: &str) -> Result<()> {
        let rec = self.inner.records.need_container(id)?;
        self.client(&rec.sandbox_id)
            .reopen_log(&rec.id)
            .await
            .map_err(sandbox_error)
    }

    pub(super) async fn exec_sync(
        &self,
        req: cri::ExecSyncRequest,
    ) -> Result<cri::ExecSyncResponse> {
        let rec = self.inner.records.need_container(&req.container_id)?;
        if req.cmd.is_empty() {
            return Err(Error::invalid_argument("ExecSync needs a command"));
        }
        let timeout_ms = u64::try_from(req.timeout.max(0))
            .unwrap_or(0)
            .saturating_mul(1000);
        let r = self
            .client(&rec.sandbox_id)
            .exec(sandbox::ExecSpec {
                container_id: rec.id.clone(),
                args: req.cmd,
                timeout_ms,
            })
            .await
            .map_err(sandbox_error)?;
        Ok(cri::ExecSyncResponse {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
        })
    }
}

pub(super) fn cri_state(s: sandbox::State) -> i32 {
    let state = match s {
        sandbox::State::Created => cri::ContainerState::ContainerCreated,
        sandbox::State::Running => cri::ContainerState::ContainerRunning,
        sandbox::State::Exited => cri::ContainerState::ContainerExited,
        sandbox::State::Unknown => cri::ContainerState::ContainerUnknown,
    };
    state as i32
}

fn libc_sigterm() -> i32 {
    15
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
