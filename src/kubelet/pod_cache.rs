//! The pod cache (upstream's `kubecontainer.Cache`): what the runtime last showed of each pod,
//! with the time it was read. The PLEG writes it (on runtime events, relists and refresh
//! requests); pod syncs read it with [`PodCache::get_newer_than`], which waits until the
//! cache holds a view of the pod read after the given time, so a sync never acts on a view
//! older than its own last actions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::pod::sync::RuntimeSnapshot;
use crate::util::lock;

/// One pod's entry: the view (or the error reading it) and when the read began.
#[derive(Debug, Clone)]
struct Entry {
    view: Result<Arc<RuntimeSnapshot>, Arc<runtime::Error>>,
    at: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    pods: HashMap<String, Entry>,
    /// Every pod not in `pods` was known to have nothing in the runtime as of this time.
    global: Option<Instant>,
}

/// The runtime's view of every pod, as the PLEG last read it.
#[derive(Debug)]
pub struct PodCache {
    inner: Mutex<Inner>,
    changed: watch::Sender<()>,
}

impl Default for PodCache {
    fn default() -> Self {
        PodCache {
            inner: Mutex::new(Inner::default()),
            changed: watch::channel(()).0,
        }
    }
}

impl PodCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the view of `uid` read from `at` on (or the error of reading it). An older
    /// view never replaces a newer one; returns whether this one was kept.
    pub fn set(&self, uid: &str, view: runtime::Result<RuntimeSnapshot>, at: Instant) -> bool {
        {
            let mut inner = lock(&self.inner);
            if inner.pods.get(uid).is_some_and(|e| e.at > at) {
                return false;
            }
            inner.pods.insert(
                uid.to_string(),
                Entry {
                    view: view.map(Arc::new).map_err(Arc::new),
                    at,
                },
            );
        }
        self.changed.send_replace(());
        true
    }

    /// The last view of `uid` read without an error, however old.
    pub fn latest(&self, uid: &str) -> Option<Arc<RuntimeSnapshot>> {
        lock(&self.inner)
            .pods
            .get(uid)
            .and_then(|e| e.view.as_ref().ok().cloned())
    }

    /// Records that a full relist begun at `at` saw every pod: those without an entry have
    /// nothing in the runtime as of then.
    pub fn update_time(&self, at: Instant) {
        {
            let mut inner = lock(&self.inner);
            if inner.global.is_some_and(|g| g >= at) {
                return;
            }
            inner.global = Some(at);
        }
        self.changed.send_replace(());
    }

    /// Forgets a pod (it is gone from the runtime and from the kubelet).
    pub fn delete(&self, uid: &str) {
        lock(&self.inner).pods.remove(uid);
    }

    /// The view of `uid` if one read after `min` is there (an empty one when a relist after
    /// `min` found nothing of the pod); `None` while there is none.
    pub fn newer_than(
        &self,
        uid: &str,
        min: Option<Instant>,
    ) -> Option<Result<Arc<RuntimeSnapshot>, Arc<runtime::Error>>> {
        let inner = lock(&self.inner);
        // A read that began when the sync's actions had ended sees them (the clock may not
        // have moved in between: a coarse clock, or a paused one in tests).
        let fresh = |at: Instant| min.is_none_or(|m| at >= m);
        match inner.pods.get(uid) {
            Some(e) if fresh(e.at) => Some(e.view.clone()),
            Some(e) if inner.global.is_some_and(fresh) => Some(e.view.clone()),
            Some(_) => None,
            None if inner.global.is_some_and(fresh) => {
                Some(Ok(Arc::new(RuntimeSnapshot::default())))
            }
            None => None,
        }
    }

    /// Waits for a view of `uid` read after `min` (upstream's `GetNewerThan`).
    pub async fn get_newer_than(
        &self,
        uid: &str,
        min: Option<Instant>,
    ) -> runtime::Result<Arc<RuntimeSnapshot>> {
        let mut changed = self.changed.subscribe();
        loop {
            if let Some(v) = self.newer_than(uid, min) {
                // The read's error, its code and message kept (its cause is the reader's).
                return v.map_err(|e| runtime::Error::new(e.code(), e.message()));
            }
            if changed.changed().await.is_err() {
                return Err(runtime::Error::unavailable("the pod cache is closed"));
            }
        }
    }

    /// The UIDs with an entry.
    pub fn uids(&self) -> Vec<String> {
        lock(&self.inner).pods.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn view(sandbox: &str) -> RuntimeSnapshot {
        let mut s = RuntimeSnapshot::default();
        s.status.sandboxes.push(crate::pod::SandboxInfo {
            id: sandbox.into(),
            ..Default::default()
        });
        s
    }

    #[tokio::test(start_paused = true)]
    async fn get_newer_than_waits_for_a_fresh_view() {
        let cache = Arc::new(PodCache::new());
        let t0 = Instant::now();
        cache.set("p", Ok(view("old")), t0);
        assert!(cache.newer_than("p", None).is_some());
        tokio::time::advance(Duration::from_millis(10)).await;
        let synced = Instant::now();
        assert!(cache.newer_than("p", Some(synced)).is_none());
        assert!(
            cache.newer_than("p", Some(t0)).is_some(),
            "a read at the sync's end is fresh"
        );
        let c2 = cache.clone();
        let waiter = tokio::spawn(async move { c2.get_newer_than("p", Some(synced)).await });
        tokio::time::advance(Duration::from_millis(10)).await;
        // An older read never replaces a newer one.
        cache.set("p", Ok(view("stale")), t0);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        cache.set("p", Ok(view("new")), Instant::now());
        let got = waiter.await.unwrap().unwrap();
        assert_eq!(got.status.sandboxes[0].id, "new");
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_answers_for_pods_it_did_not_see() {
        let cache = PodCache::new();
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(cache.newer_than("nobody", Some(before)).is_none());
        cache.update_time(Instant::now());
        let v = cache.newer_than("nobody", Some(before)).unwrap().unwrap();
        assert!(v.status.sandboxes.is_empty());
        cache.set(
            "err",
            Err(runtime::Error::unavailable("runtime down")),
            Instant::now(),
        );
        assert_eq!(
            cache
                .newer_than("err", Some(before))
                .unwrap()
                .unwrap_err()
                .message(),
            "runtime down"
        );
        cache.delete("err");
        assert!(cache.uids().is_empty());
    }
}
