//! Container RPCs: CreateContainer, StartContainer, StopContainer, RemoveContainer,
//! ContainerStatus, ListContainers, UpdateContainerResources, ReopenContainerLog, ExecSync;
//! and the lifecycle of a container's rootfs (unmounted at its exit, released at its removal).
//! The steps CreateContainer runs are in `create`.

mod create;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::store::ContainerRecord;
use super::{BuiltinRuntime, new_id, pod, sandbox_error, spec, userns};
use crate::{Error, Result, cri};
use create::{SpecPlace, pod_userns};

/// The live or last known status of each container, by id.
pub(super) type Statuses = BTreeMap<String, sandbox::ContainerStatus>;

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
        let recs: Vec<ContainerRecord> = self.inner.records.containers_where(|r| {
            r.id.starts_with(id)
                && r.sandbox_id.starts_with(sandbox_id)
                && pod::labels_match(&r.config.labels, labels)
        });
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
            self.create_in_sandbox(&want, &id, &bundle).await?;
            self.inner.records.save_container(&want.record(&id, user))
        }
        .await;
        if let Err(e) = result {
            let _ = self.client(&sandbox_id).delete(&id).await;
            self.release(&id);
            return Err(e);
        }
        // Told now that the record is there (the sandbox's own event for it is not passed on),
        // with the sandbox's containers as they are now.
        let at = sandbox::now_ns();
        let statuses = self.client(&sandbox_id).state().await.map(|s| s.containers);
        let taken = statuses.ok().map(|s| (s, at));
        self.emit_in(
            Some(&sandbox_id),
            &id,
            cri::ContainerEventType::ContainerCreatedEvent,
            taken,
        );
        Ok(id)
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
        // The deletion's event carries the pod's status, as the others do.
        let sandbox_id = self.inner.records.sandbox_of(id);
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
        self.emit_in(
            sandbox_id.as_deref(),
            id,
            cri::ContainerEventType::ContainerDeletedEvent,
            None,
        );
    }

    pub(super) async fn start(&self, id: &str) -> Result<()> {
        let rec = self.inner.records.need_container(id)?;
        let started = self.client(&rec.sandbox_id).start(&rec.id).await;
        // The container has its binds now (libcontainer made it at its start, or failed to):
        // the ID-mapped clones staged for a pod user namespace are not needed any more.
        userns::unstage(&self.bundle_dir(&rec.id));
        started.map_err(sandbox_error)?;
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
