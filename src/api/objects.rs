//! The ConfigMaps and Secrets the node's pods reference, each watched by itself (upstream's
//! watch-based `manager.NewWatchBasedManager`, behaviour only): a pod registers the objects it
//! references; the first reference of an object starts a list+watch of it alone
//! (`fieldSelector=metadata.name=<name>` in its namespace), the last one going stops it. The
//! node never lists every secret of the cluster.
//!
//! [`ObjectManager::get`] answers from the watch: the object, or none once the watch's initial
//! list is done and it does not exist; while the list is not done within [`SYNC_TIMEOUT`], an
//! [`ObjectError`] saying so. Without an API server (a standalone node) every get fails with a
//! clear error.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a get waits for an object's first list (upstream waits a second; the first list of
/// a new watch on a busy node may take longer).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// Namespace and name.
pub type ObjectKey = (String, String);

/// Why an object could not be read from its watch. `kind` is as upstream's messages name it
/// (`configmap`, `secret`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The node has no API server to read objects from.
    #[error("cannot get {kind} {name:?}: the node has no API server (standalone)")]
    Standalone { kind: &'static str, name: String },
    /// No pod registered the object, so nothing watches it.
    #[error("object {namespace:?}/{name:?} not registered")]
    NotRegistered { namespace: String, name: String },
    /// The object's watch stopped (its last pod went meanwhile).
    #[error("the watch of {kind} {name:?} ended")]
    WatchEnded { kind: &'static str, name: String },
    /// The watch's first list did not finish within [`SYNC_TIMEOUT`] (upstream's message).
    #[error("failed to sync {kind} cache: timed out waiting for the condition")]
    SyncTimeout { kind: &'static str },
}

/// What a watch knows of its object.
#[derive(Debug)]
enum Known<K> {
    /// The initial list is not done yet.
    Unsynced,
    /// The object, or `None` when it does not exist.
    Synced(Option<Arc<K>>),
}

impl<K> Clone for Known<K> {
    fn clone(&self) -> Self {
        match self {
            Known::Unsynced => Known::Unsynced,
            Known::Synced(o) => Known::Synced(o.clone()),
        }
    }
}

struct Entry<K> {
    /// The pods referencing the object.
    pods: BTreeSet<String>,
    known: watch::Receiver<Known<K>>,
    task: JoinHandle<()>,
}

struct Inner<K> {
    entries: HashMap<ObjectKey, Entry<K>>,
    /// The objects each pod registered.
    pods: HashMap<String, BTreeSet<ObjectKey>>,
}

/// The watched objects of one kind (`K` is `ConfigMap` or `Secret`).
pub struct ObjectManager<K> {
    client: Option<Client>,
    /// The kind as upstream's messages name it: `configmap`, `secret`.
    kind: &'static str,
    inner: Mutex<Inner<K>>,
}

impl<K> ObjectManager<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    /// A manager for objects of `kind` (`configmap`, `secret`) read through `client` (`None` on
    /// a standalone node).
    pub fn new(client: Option<Client>, kind: &'static str) -> Self {
        ObjectManager {
            client,
            kind,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                pods: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        crate::util::lock(&self.inner)
    }

    /// Sets the objects pod `uid` references (replacing what it registered before): watches
    /// start for objects newly referenced and stop for objects no pod references any more.
    pub fn register(&self, uid: &str, refs: BTreeSet<ObjectKey>) {
        let mut inner = self.lock();
        let old = inner.pods.remove(uid).unwrap_or_default();
        for key in old.difference(&refs) {
            release(&mut inner, uid, key);
        }
        for key in &refs {
            if let Some(e) = inner.entries.get_mut(key) {
                e.pods.insert(uid.to_string());
                continue;
            }
            let Some(client) = self.client.clone() else {
                continue;
            };
            let (tx, rx) = watch::channel(Known::Unsynced);
            let task = tokio::spawn(Self::watch_one(client, key.clone(), tx, self.kind));
            inner.entries.insert(
                key.clone(),
                Entry {
                    pods: [uid.to_string()].into(),
                    known: rx,
                    task,
                },
            );
        }
        if !refs.is_empty() {
            inner.pods.insert(uid.to_string(), refs);
        }
    }

    /// Forgets pod `uid`'s references (its watches stop when no other pod has them).
    pub fn unregister(&self, uid: &str) {
        self.register(uid, BTreeSet::new());
    }

    /// How many objects are watched (for tests and logs).
    pub fn watched(&self) -> usize {
        self.lock().entries.len()
    }

    /// The object `namespace/name`, which a pod must have registered: `Ok(None)` when it does
    /// not exist.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<Arc<K>>, ObjectError> {
        let kind = self.kind;
        if self.client.is_none() {
            let name = name.to_string();
            return Err(ObjectError::Standalone { kind, name });
        }
        let key = (namespace.to_string(), name.to_string());
        let rx = self.lock().entries.get(&key).map(|e| e.known.clone());
        let Some(mut rx) = rx else {
            let (namespace, name) = key;
            return Err(ObjectError::NotRegistered { namespace, name });
        };
        let synced = tokio::time::timeout(SYNC_TIMEOUT, async {
            loop {
                if let Known::Synced(o) = &*rx.borrow_and_update() {
                    return Some(o.clone());
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match synced {
            Ok(Some(o)) => Ok(o),
            Ok(None) => Err(ObjectError::WatchEnded {
                kind,
                name: name.to_string(),
            }),
            Err(_) => Err(ObjectError::SyncTimeout { kind }),
        }
    }

    /// Lists then watches the one object `key`, publishing what is known of it; errors are logged
    /// and retried with back-off (the watcher relists after 410).
    async fn watch_one(
        client: Client,
        key: ObjectKey,
        tx: watch::Sender<Known<K>>,
        kind: &'static str,
    ) {
        let (ns, name) = key;
        let api: Api<K> = Api::namespaced(client, &ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut stream = watcher::watcher(api, config).boxed();
        let mut initial: Option<Option<Arc<K>>> = None;
        let mut backoff = Duration::from_millis(200);
        let named = |o: &K| o.meta().name.as_deref() == Some(name.as_str());
        while let Some(item) = stream.next().await {
            match item {
                Ok(Event::Init) => initial = Some(None),
                Ok(Event::InitApply(o)) => {
                    if named(&o) {
                        initial = Some(Some(Arc::new(o)));
                    }
                }
                Ok(Event::InitDone) => {
                    tx.send_replace(Known::Synced(initial.take().flatten()));
                }
                Ok(Event::Apply(o)) => {
                    if named(&o) {
                        tx.send_replace(Known::Synced(Some(Arc::new(o))));
                    }
                }
                Ok(Event::Delete(o)) => {
                    if named(&o) {
                        tx.send_replace(Known::Synced(None));
                    }
                }
                Err(e) => {
                    tracing::warn!(%ns, %name, "watching {kind}: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
            backoff = Duration::from_millis(200);
        }
    }
}

fn release<K>(inner: &mut Inner<K>, uid: &str, key: &ObjectKey) {
    let Some(e) = inner.entries.get_mut(key) else {
        return;
    };
    e.pods.remove(uid);
    if e.pods.is_empty() {
        if let Some(e) = inner.entries.remove(key) {
            e.task.abort();
        }
    }
}

impl<K> Drop for ObjectManager<K> {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        for e in inner.entries.values() {
            e.task.abort();
        }
    }
}
