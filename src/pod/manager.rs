//! The pod runtime manager (upstream's `kuberuntime` manager): what the kubelet does to pods
//! through the CRI traits, with what it owns for that: the runtime, the [`ImageManager`], the
//! event sink and the CrashLoopBackOff state. Its work is split by verb as upstream's is:
//! reading a pod from the runtime (here: [`RuntimeManager::read`], [`runtime_pod_status`]),
//! carrying out a sync's actions (`sync.rs`) and stopping a pod (`kill.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use runtime::{Result, RuntimeService, cri};

use super::LABEL_POD_UID;
use super::backoff::Backoff;
use super::images::ImageManager;
use super::termination;
use crate::api::events::PodEvents;
use crate::model::RuntimePodStatus;
use crate::util::lock;

/// Runs the pods' sandboxes and containers; shared by every pod worker (nothing is held
/// across pods: the back-off is behind a lock taken for a lookup, pulls wait for their own
/// limiter).
pub struct RuntimeManager {
    pub(super) rt: Arc<dyn RuntimeService>,
    pub(super) images: ImageManager,
    pub(super) events: Arc<dyn PodEvents>,
    /// CrashLoopBackOff per container.
    pub(super) backoff: Mutex<Backoff>,
}

impl RuntimeManager {
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        images: ImageManager,
        events: Arc<dyn PodEvents>,
        backoff: Backoff,
    ) -> Self {
        RuntimeManager {
            rt,
            images,
            events,
            backoff: Mutex::new(backoff),
        }
    }

    /// The runtime underneath.
    pub fn runtime(&self) -> &dyn RuntimeService {
        self.rt.as_ref()
    }

    /// Where the manager reports what it does to pods.
    pub fn events(&self) -> &dyn PodEvents {
        self.events.as_ref()
    }

    /// The CrashLoopBackOff state, for the sync's decisions.
    pub fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        lock(&self.backoff)
    }

    /// Reads what the runtime knows about the pod `uid` now.
    pub async fn read(&self, uid: &str) -> runtime::Result<RuntimeSnapshot> {
        runtime_pod_status(self.rt.as_ref(), uid).await
    }

    /// Forgets the back-offs of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.backoff().forget_pod(uid);
        self.images.forget_pod(uid);
    }

    /// Drops the back-off entries nobody needs any more (housekeeping).
    pub fn gc(&self, now: SystemTime) {
        self.backoff().gc(now);
        self.images.gc(now);
    }
}

/// What the runtime knows about one pod.
#[derive(Debug, Clone, Default)]
pub struct RuntimeSnapshot {
    /// The digest [`super::compute_pod_actions`] works on.
    pub status: RuntimePodStatus,
    /// CRI statuses of the pod's sandboxes, newest first.
    pub sandboxes: Vec<cri::PodSandboxStatus>,
    /// CRI statuses of all the pod's containers.
    pub containers: Vec<cri::ContainerStatus>,
}

/// Lists the sandboxes and containers labelled with `pod_uid` and reads their statuses.
/// Objects that vanish between the list and the status call are skipped. An exited container's
/// status `message` gets its termination message ([`termination::fill_messages`]).
pub async fn runtime_pod_status(rt: &dyn RuntimeService, pod_uid: &str) -> Result<RuntimeSnapshot> {
    let selector: HashMap<String, String> =
        [(LABEL_POD_UID.to_string(), pod_uid.to_string())].into();
    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        })
        .await?;
    let mut sandboxes = Vec::new();
    for sb in listed.items {
        match rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sb.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => sandboxes.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await?;
    let mut containers = Vec::new();
    for c in listed.containers {
        match rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => containers.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    // Exited containers: what they left in their termination message file (or log).
    termination::fill_messages(&mut containers);
    Ok(RuntimeSnapshot {
        status: RuntimePodStatus::from_cri(&sandboxes, &containers),
        sandboxes,
        containers,
    })
}
