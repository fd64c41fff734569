//! The pod runtime manager (upstream's `kuberuntime` manager): what the kubelet does to pods
//! through the CRI traits, with what it owns for that: the runtime, the [`ImageManager`], the
//! event sink and the CrashLoopBackOff state. Its work is split by verb as upstream's is:
//! reading a pod from the runtime ([`RuntimeManager::read`], `sync.rs`'s
//! [`super::sync::runtime_pod_status`]), carrying out a sync's actions (`sync.rs`) and stopping
//! a pod (`kill.rs`).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use runtime::RuntimeService;

use super::backoff::Backoff;
use super::images::ImageManager;
use super::sync::RuntimeSnapshot;
use crate::api::events::PodEvents;
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
        super::sync::runtime_pod_status(self.rt.as_ref(), uid).await
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
