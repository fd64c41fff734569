//! What the built-in runtime settles at start, before it serves anything: sandboxes a previous
//! agent started are adopted (the rootfs of their containers that exited meanwhile unmounted),
//! what records found unreadable described is stopped, rootfs records the image store set
//! aside are restored, and (when this agent is alone on the root dir, see [`lock_agents`]) what
//! a creation or stop cut short by the agent's death left without a record is removed.

use super::BuiltinRuntime;
use super::store::SandboxRecord;
use crate::{Error, Result, cri};

/// The exit code of a container whose state was lost, as containerd's for a container whose
/// task is gone.
const LOST_EXIT_CODE: i32 = 255;

impl BuiltinRuntime {
    /// Re-attaches to the sandboxes a previous agent started: live ones get their event
    /// subscription back; what is left of those whose process died is reaped
    /// ([`Self::reap_if_dead`]). Then every container that has exited has its rootfs unmounted
    /// ([`Self::unmount_exited_in`]).
    pub(super) async fn adopt(&self, alone: bool) {
        for mut rec in self.inner.records.all_sandboxes() {
            if rec.stopped {
                continue;
            }
            if !self.sandbox_dir(&rec.id).exists() {
                self.settle_lost(rec).await;
                continue;
            }
            if alone && self.client(&rec.id).is_stopped() {
                // A StopPodSandbox the agent's death cut short after the sandbox had shut
                // down: finish it, so that the pod's address is not held by nobody.
                tracing::info!(sandbox = %rec.id, "finishing a stop that was cut short");
                self.teardown_cni_logged(&mut rec).await;
                rec.stopped = true;
                if let Err(e) = self.inner.records.save_sandbox(&rec) {
                    tracing::error!(sandbox = %rec.id, "{e}");
                }
                self.release_address(&rec.id, rec.bridge_ips());
                continue;
            }
            self.watch_sandbox(&rec.id).await;
        }
        // Containers that exited while no agent ran (or whose exits an agent killed did not
        // get to handle) still have their rootfs mounted; the adoption above stopped others.
        for rec in self.inner.records.all_sandboxes() {
            self.unmount_exited_in(&rec.id).await;
        }
    }

    /// A sandbox whose state dir is gone though its record says it runs: the dir was on a
    /// tmpfs that a reboot emptied (or somebody removed it). Nothing of it can be reached any
    /// more: what may be left in its cgroups is killed, its containers are recorded as exited
    /// with an unknown code (255, reason `Unknown`, as containerd reports a container whose
    /// task is gone), and it is marked stopped, so that the kubelet makes the pod again.
    async fn settle_lost(&self, mut rec: SandboxRecord) {
        tracing::warn!(sandbox = %rec.id, "its state dir is gone (the node restarted?): reporting it stopped and its containers exited");
        let now = sandbox::now_ns();
        let lost: Vec<sandbox::ContainerStatus> = self
            .inner
            .records
            .all_containers()
            .into_iter()
            .filter(|c| c.sandbox_id == rec.id)
            .map(|c| sandbox::ContainerStatus {
                state: sandbox::State::Exited,
                pid: 0,
                created_at: c.created_at,
                started_at: 0,
                finished_at: now,
                exit_code: LOST_EXIT_CODE,
                reason: "Unknown".to_string(),
                message: "the container's state was lost (the node restarted?)".to_string(),
                log_path: (!c.log_path.is_empty()).then(|| c.log_path.clone().into()),
                cgroup_path: super::spec::cgroups_path(&rec.cgroup_parent, &c.id)
                    .ok()
                    .flatten()
                    .map(|p| p.to_string_lossy().into_owned()),
                id: c.id,
            })
            .collect();
        let id = rec.id.clone();
        if let Err(e) = self.client(&id).restore_lost(&lost) {
            tracing::error!(sandbox = %id, "{e}");
        }
        if let Err(e) = self.kill_pod(&id, Some(&rec.cgroup_parent)).await {
            tracing::warn!(sandbox = %id, "reaping it: {e}");
        }
        self.teardown_cni_logged(&mut rec).await;
        rec.stopped = true;
        if let Err(e) = self.inner.records.save_sandbox(&rec) {
            tracing::error!(sandbox = %id, "{e}");
        }
        self.release_address(&id, rec.bridge_ips());
        for c in &lost {
            self.emit(&c.id, cri::ContainerEventType::ContainerStoppedEvent);
        }
        self.emit(&id, cri::ContainerEventType::ContainerStoppedEvent);
    }

    /// The recorded sandboxes that run, each with its process's answer to State.
    async fn live_sandbox_states(&self) -> Vec<(sandbox::Client, sandbox::SandboxState)> {
        let mut live = Vec::new();
        for rec in self.inner.records.all_sandboxes() {
            let client = self.client(&rec.id);
            if rec.stopped || client.is_stopped() {
                continue;
            }
            if let Ok(state) = client.state().await {
                live.push((client, state));
            }
        }
        live
    }

    /// What records found unreadable at load (set aside) described must not run on unseen, nor
    /// be adopted half: a container is deleted in the live sandbox that has it (killed) and its
    /// rootfs released; a sandbox's process is shut down (or what is left of a dead one reaped,
    /// from the spec in its state dir) and the containers recorded in it are discarded. The
    /// kubelet then makes those pods again.
    pub(super) async fn discard_set_aside(&self) {
        let set_aside = &self.inner.records.set_aside;
        for id in &set_aside.containers {
            tracing::error!(container = %id, "its record was unreadable: killing and removing it");
            for (client, state) in self.live_sandbox_states().await {
                if state.containers.iter().any(|c| &c.id == id) {
                    delete_in_sandbox(&client, id).await;
                }
            }
            self.release(id);
        }
        for id in &set_aside.sandboxes {
            tracing::error!(sandbox = %id, "its record was unreadable: stopping it");
            self.discard_sandbox_remains(id).await;
        }
    }

    /// What a creation that an agent's death cut short left without a record: a sandbox state
    /// dir (and its process), a container in a live sandbox, a bundle or a rootfs. Nothing
    /// lists them, so nothing would ever remove them: they go now, before anything is served.
    pub(super) async fn discard_orphans(&self) {
        let listed = |dir: &str| -> Vec<String> {
            let mut ids: Vec<String> = std::fs::read_dir(self.inner.state_dir.join(dir))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default();
            let legacy = match dir {
                "sandboxes" => &self.inner.legacy.sandboxes,
                _ => &self.inner.legacy.containers,
            };
            ids.extend(legacy.iter().cloned());
            ids
        };
        let set_aside = &self.inner.records.set_aside;
        for id in listed("sandboxes") {
            if self.inner.records.sandbox(&id).is_none() && !set_aside.sandboxes.contains(&id) {
                tracing::warn!(sandbox = %id, "a sandbox without a record (its creation was cut short): removing it");
                self.discard_sandbox_remains(&id).await;
            }
        }
        for (client, state) in self.live_sandbox_states().await {
            for c in state.containers {
                if self.inner.records.container(&c.id).is_none() {
                    tracing::warn!(container = %c.id, sandbox = %state.id, "a container without a record (its creation was cut short): removing it");
                    delete_in_sandbox(&client, &c.id).await;
                }
            }
        }
        let mut bundles = listed("containers");
        bundles.extend(self.inner.images.rootfs_keys().unwrap_or_default());
        bundles.sort();
        bundles.dedup();
        for id in bundles {
            if self.inner.records.container(&id).is_none() {
                tracing::warn!(container = %id, "a bundle or rootfs without a record: releasing it");
                self.release(&id);
            }
        }
        self.discard_orphan_cgroups().await;
    }

    /// Sandbox cgroups under the runtime's own cgroup root (`<cgroupRoot>/<sandbox id>`, made
    /// for a sandbox CRI gave no parent) that nothing describes: no record, nothing set aside,
    /// no state dir (a launch cut short whose state dir went without a spec naming them).
    /// Nothing else would ever remove them. Only empty ones go, and nothing is killed: another
    /// runtime on another root dir may share the cgroup root. Names that are not sandbox ids
    /// are left alone.
    async fn discard_orphan_cgroups(&self) {
        let root = self.inner.cfg.cgroup_root.trim_end_matches('/').to_string();
        if root.is_empty() {
            return;
        }
        let set_aside = &self.inner.records.set_aside;
        for id in sandbox::cgroup::children(&root) {
            let sandbox_id = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
            if !sandbox_id
                || self.inner.records.sandbox(&id).is_some()
                || set_aside.sandboxes.contains(&id)
                || self.sandbox_dir(&id).exists()
            {
                continue;
            }
            let path = format!("{root}/{id}");
            let removed =
                tokio::task::spawn_blocking(move || sandbox::cgroup::remove_empty_tree(&path))
                    .await
                    .unwrap_or(false);
            if removed {
                tracing::warn!(sandbox = %id, "removed the empty cgroups of a sandbox without a record (its creation was cut short)");
            }
        }
    }

    /// Stops what is left of a sandbox the records do not (or no longer readably) describe:
    /// its process is shut down, or what is left of a dead one reaped from the spec in its
    /// state dir; the containers recorded in it are discarded; its cgroups and state dir go.
    async fn discard_sandbox_remains(&self, id: &str) {
        let client = self.client(id);
        // Its spec (in its state dir) names its cgroups: read once, for both steps.
        let spec = client.spec();
        if let Err(e) = &spec {
            tracing::warn!(sandbox = %id, "reading its spec: {e}");
        }
        if self.sandbox_dir(id).exists() && !client.is_stopped() {
            if client.process_alive() {
                if let Err(e) = client.shutdown().await {
                    tracing::warn!(sandbox = %id, "shutting it down: {e}");
                }
            }
            // Whatever still serves its state dir (one that had not written its pid file, would
            // not shut down, or is still exiting) is killed; then, unless it shut down, what is
            // left in its cgroups.
            let parent = spec
                .as_ref()
                .ok()
                .filter(|_| !client.is_stopped())
                .map(|s| s.cgroup_parent.as_str());
            if let Err(e) = self.kill_pod(id, parent).await {
                tracing::warn!(sandbox = %id, "reaping it: {e}");
            }
        }
        for c in self.inner.records.all_containers() {
            if c.sandbox_id == id {
                self.discard_container(&c.id).await;
            }
        }
        // Then what remove_sandbox removes: its cgroups and its state dir. Cgroups that will
        // not go keep the state dir, which names them for the next start to try again.
        if let Ok(spec) = &spec {
            if let Err(e) =
                Self::remove_sandbox_cgroups(&spec.cgroup_parent, spec.owns_cgroup_parent).await
            {
                tracing::error!(sandbox = %id, "removing what is left of it: {e}");
                return;
            }
        }
        // Whatever served it was killed above; a launch cut short before its pid file was
        // written leaves a dir that `process_alive` would still count as setting up.
        if !client.served() {
            let _ = std::fs::remove_dir_all(self.sandbox_dir(id));
        }
    }

    /// The image store set aside rootfs records it could not read: each container that still
    /// has a record here says again which image its rootfs holds; a rootfs no container owns is
    /// released.
    pub(super) fn restore_rootfs_records(&self) {
        for key in self.inner.images.unrecorded_rootfs() {
            match self.inner.records.container(&key) {
                Some(rec) => {
                    let target = self.bundle_dir(&key).join("rootfs");
                    match self
                        .inner
                        .images
                        .restore_rootfs_record(&rec.image_id, &key, &target)
                    {
                        Ok(()) => tracing::info!(container = %key, "restored its rootfs record"),
                        Err(e) => {
                            tracing::error!(container = %key, "restoring its rootfs record: {e}")
                        }
                    }
                }
                None => {
                    tracing::warn!(key = %key, "a rootfs with an unreadable record and no container: releasing it");
                    self.release(&key);
                }
            }
        }
    }
}

/// Takes the agents' lock of a root dir: exclusively if no other agent holds it (then the
/// caller is alone), else shared, waiting for one that is starting to finish its start.
pub(super) async fn lock_agents(
    path: &std::path::Path,
) -> Result<(nix::fcntl::Flock<std::fs::File>, bool)> {
    use nix::fcntl::{Flock, FlockArg};
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::internal(format!("opening {}: {e}", path.display())))
    };
    match Flock::lock(open()?, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok((lock, true)),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            let shown = path.display().to_string();
            let lock = tokio::task::spawn_blocking(move || Flock::lock(file, FlockArg::LockShared))
                .await
                .map_err(|e| Error::internal(format!("locking {shown}: {e}")))?
                .map_err(|(_, e)| Error::internal(format!("locking {shown}: {e}")))?;
            Ok((lock, false))
        }
        Err((_, e)) => Err(Error::internal(format!("locking {}: {e}", path.display()))),
    }
}

/// Deletes container `id` in the live sandbox `client` serves (killing it) and the status it
/// persisted there: for a container no record describes.
async fn delete_in_sandbox(client: &sandbox::Client, id: &str) {
    if let Err(e) = client.delete(id).await {
        tracing::warn!(container = %id, "deleting it in its sandbox: {e}");
    }
    let status = client.layout().status_dir().join(format!("{id}.json"));
    let _ = std::fs::remove_file(status);
}
