//! The kubelet's [`PodSyncer`]: each pod worker's sync, terminating and terminated steps carried
//! out over the runtime traits with the decision functions of [`crate::pod`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use runtime::{ImageService, RuntimeService, cri};

use crate::pod::{self, Backoff, ContainerOptions, StatusContext};
use crate::pod_workers::{PodSyncer, SyncError, UpdateType};
use crate::status_manager::StatusManager;

/// Syncs pods against a runtime and hands each computed status to the status manager.
pub struct Syncer {
    pub rt: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    pub opts: ContainerOptions,
    pub runtime_name: String,
    backoff: tokio::sync::Mutex<Backoff>,
    status: Arc<StatusManager>,
    runtime_state: Arc<crate::node::RuntimeState>,
    userns: Arc<super::userns::UsernsManager>,
}

fn err(e: impl std::fmt::Display) -> SyncError {
    SyncError(e.to_string())
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl Syncer {
    pub fn new(
        rt: super::Runtime,
        opts: ContainerOptions,
        runtime_name: String,
        backoff: Backoff,
        status: Arc<StatusManager>,
        runtime_state: Arc<crate::node::RuntimeState>,
        userns: Arc<super::userns::UsernsManager>,
    ) -> Self {
        Syncer {
            rt: rt.runtime,
            images: rt.images,
            opts,
            runtime_name,
            backoff: tokio::sync::Mutex::new(backoff),
            status,
            runtime_state,
            userns,
        }
    }

    /// The options for syncing `pod`: with its user namespace when it asks for one
    /// (`hostUsers: false`), which the runtime must offer (upstream refuses the pod otherwise).
    fn pod_options(&self, pod: &Pod) -> Result<ContainerOptions, String> {
        let mut opts = self.opts.clone();
        if pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)
            && !self.runtime_state.supports_user_namespaces()
        {
            return Err(
                "the container runtime's handler \"\" does not support user namespaces \
                 (spec.hostUsers: false)"
                    .to_string(),
            );
        }
        opts.sandbox.user_namespace = self.userns.user_namespace(pod).map_err(|e| e.to_string())?;
        Ok(opts)
    }

    fn record_status(
        &self,
        pod: &Pod,
        snapshot: &pod::sync::RuntimeSnapshot,
        waiting: HashMap<String, (String, String)>,
    ) -> PodStatus {
        let ctx = StatusContext {
            now: SystemTime::now(),
            previous: self.status.status(&uid(pod)),
            host_ips: self.opts.host_ips.clone(),
            runtime_name: self.runtime_name.clone(),
            waiting,
            ..Default::default()
        };
        let sandbox = snapshot.sandboxes.first();
        let status = pod::pod_status(pod, sandbox, &snapshot.containers, &ctx);
        self.status.set_status(pod, status.clone());
        status
    }

    async fn stop_all(
        &self,
        pod: &Pod,
        grace: Duration,
    ) -> Result<pod::sync::RuntimeSnapshot, SyncError> {
        let snapshot = pod::sync::runtime_pod_status(self.rt.as_ref(), &uid(pod))
            .await
            .map_err(err)?;
        let timeout = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        let errors = pod::sync::kill_pod(self.rt.as_ref(), &snapshot.status, timeout).await;
        if !errors.is_empty() {
            return Err(SyncError(errors.join("; ")));
        }
        Ok(snapshot)
    }
}

#[async_trait::async_trait]
impl PodSyncer for Syncer {
    async fn sync_pod(&self, _update: UpdateType, pod: &Pod) -> Result<bool, SyncError> {
        let snapshot = pod::sync::runtime_pod_status(self.rt.as_ref(), &uid(pod))
            .await
            .map_err(err)?;
        // As upstream: a pod on the pod network waits (and its worker retries) while the
        // runtime reports its network not ready.
        if !pod::host_network(pod) {
            if let Some(e) = self.runtime_state.network_error() {
                self.record_status(pod, &snapshot, HashMap::new());
                return Err(SyncError(format!("network is not ready: {e}")));
            }
        }
        let opts = match self.pod_options(pod) {
            Ok(opts) => opts,
            Err(e) => {
                self.record_status(pod, &snapshot, HashMap::new());
                return Err(SyncError(e));
            }
        };
        let now = SystemTime::now();
        let mut backoff = self.backoff.lock().await;
        let actions = pod::compute_pod_actions(pod, &snapshot.status, &backoff, now);
        let result = pod::sync::sync_pod(
            self.rt.as_ref(),
            self.images.as_ref(),
            pod,
            &snapshot,
            &actions,
            &mut backoff,
            &opts,
            now,
        )
        .await
        .map_err(err)?;
        drop(backoff);
        // Status from what the runtime shows after the actions.
        let after = pod::sync::runtime_pod_status(self.rt.as_ref(), &uid(pod))
            .await
            .map_err(err)?;
        let status = self.record_status(pod, &after, result.waiting.clone());
        if !result.errors.is_empty() {
            return Err(SyncError(result.errors.join("; ")));
        }
        let phase = status.phase.as_deref().unwrap_or("Pending");
        Ok(matches!(phase, "Succeeded" | "Failed"))
    }

    async fn sync_terminating_pod(&self, pod: &Pod, grace: Duration) -> Result<(), SyncError> {
        let snapshot = self.stop_all(pod, grace).await?;
        self.record_status(pod, &snapshot, HashMap::new());
        Ok(())
    }

    async fn sync_terminated_pod(&self, pod: &Pod) -> Result<(), SyncError> {
        let snapshot = pod::sync::runtime_pod_status(self.rt.as_ref(), &uid(pod))
            .await
            .map_err(err)?;
        for c in &snapshot.containers {
            self.rt
                .remove_container(cri::RemoveContainerRequest {
                    container_id: c.id.clone(),
                })
                .await
                .map_err(err)?;
        }
        for sb in &snapshot.sandboxes {
            self.rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: sb.id.clone(),
                })
                .await
                .map_err(err)?;
        }
        self.userns.release(&uid(pod));
        self.status.terminated(pod);
        Ok(())
    }
}
