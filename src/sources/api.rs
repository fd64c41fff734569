//! The API server source: the pods bound to this node (`fieldSelector=spec.nodeName=NODE`),
//! kept by kube-rs's watcher. The watcher streams the initial list (`sendInitialEvents`, the
//! WatchList protocol) where the API server offers it and falls back to a paginated list then
//! watch where it does not; it resumes watches from the last resourceVersion, uses bookmarks and
//! relists after 410 Gone. Every change becomes a complete snapshot ([`PodOp::Set`]) for the
//! merger, so a relist that misses a deletion still removes the pod.
//!
//! Mirror pods (the API's read-only copies of static pods, annotated
//! `kubernetes.io/config.mirror`) are not pods to run: they are kept apart in [`MirrorPods`]
//! for the mirror pod manager.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::{API_SOURCE, CONFIG_SOURCE_ANNOTATION, PodOp, PodUpdate, pod_full_name};

/// Annotation marking a mirror pod; its value is the static pod's hash.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The mirror pods the API server holds for this node, by `namespace/name`.
pub type MirrorPods = BTreeMap<String, Pod>;

/// True when the pod is a mirror pod.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    super::annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// Watches the pods bound to one node.
pub struct ApiSource {
    client: Client,
    node_name: String,
    mirrors: watch::Sender<MirrorPods>,
}

impl ApiSource {
    /// A source for `node_name`; the mirror pods it sees are published on `mirrors`.
    pub fn new(client: Client, node_name: String, mirrors: watch::Sender<MirrorPods>) -> Self {
        ApiSource {
            client,
            node_name,
            mirrors,
        }
    }

    /// Sends a snapshot of the node's pods after the initial list and after every change, until
    /// `tx` closes. Errors are logged and retried with back-off; they never end the source.
    pub async fn run(self, tx: mpsc::Sender<PodUpdate>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let fields = format!("spec.nodeName={}", self.node_name);
        let mut streaming = true;
        loop {
            let mut config = watcher::Config::default().fields(&fields);
            if streaming {
                config = config.streaming_lists();
            }
            match self.watch(api.clone(), config, &tx).await {
                Outcome::Closed => return,
                Outcome::NoStreamingList(e) => {
                    tracing::info!(
                        "the API server does not stream initial lists ({e}); listing then watching"
                    );
                    streaming = false;
                }
            }
        }
    }

    async fn watch(
        &self,
        api: Api<Pod>,
        config: watcher::Config,
        tx: &mpsc::Sender<PodUpdate>,
    ) -> Outcome {
        let mut stream = watcher::watcher(api, config).boxed();
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut initial: Option<BTreeMap<String, Pod>> = None;
        let mut synced = false;
        let mut backoff = Duration::from_millis(200);
        while let Some(item) = stream.next().await {
            let changed = match item {
                Ok(Event::Init) => {
                    initial = Some(BTreeMap::new());
                    false
                }
                Ok(Event::InitApply(pod)) => {
                    if let Some(init) = initial.as_mut() {
                        insert(init, pod);
                    }
                    false
                }
                Ok(Event::InitDone) => {
                    pods = initial.take().unwrap_or_default();
                    synced = true;
                    true
                }
                Ok(Event::Apply(pod)) => {
                    insert(&mut pods, pod);
                    true
                }
                Ok(Event::Delete(pod)) => {
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        pods.remove(uid);
                        // Gone from the API (mirror pods included): no start to observe.
                        crate::metrics::get().pod_startup.forget(uid);
                    }
                    true
                }
                Err(e) => {
                    if !synced && refuses_streaming(&e) {
                        return Outcome::NoStreamingList(e.to_string());
                    }
                    tracing::warn!(node = %self.node_name, "watching pods: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            backoff = Duration::from_millis(200);
            if !changed || !synced {
                continue;
            }
            // Every pod of every snapshot goes through the startup tracker, as upstream's
            // source observes each pod the reflector delivers.
            crate::metrics::get()
                .pods_observed_on_watch(pods.values(), std::time::SystemTime::now());
            let (mirrors, regular): (Vec<&Pod>, Vec<&Pod>) =
                pods.values().partition(|p| is_mirror_pod(p));
            self.mirrors.send_replace(
                mirrors
                    .into_iter()
                    .map(|p| (pod_full_name(p), p.clone()))
                    .collect(),
            );
            let update = PodUpdate {
                op: PodOp::Set,
                pods: regular.into_iter().cloned().collect(),
                source: API_SOURCE,
            };
            if tx.send(update).await.is_err() {
                return Outcome::Closed;
            }
        }
        Outcome::Closed
    }
}

enum Outcome {
    Closed,
    NoStreamingList(String),
}

/// Keeps a pod by UID, marked as coming from the API server.
fn insert(pods: &mut BTreeMap<String, Pod>, mut pod: Pod) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_SOURCE_ANNOTATION.to_string(), API_SOURCE.to_string());
    pods.insert(uid, pod);
}

/// True when the API server rejected the streaming list request itself (an older API server
/// without the WatchList feature answers 400, 403 or 422 to `sendInitialEvents`).
fn refuses_streaming(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return false,
    };
    matches!(status.code, 400 | 403 | 422) || status.message.contains("sendInitialEvents")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str, mirror: bool) -> Pod {
        let mut annotations = BTreeMap::new();
        if mirror {
            annotations.insert(CONFIG_MIRROR_ANNOTATION.to_string(), "h".to_string());
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("p-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn insert_marks_the_source_and_drops_pods_without_uid() {
        let mut pods = BTreeMap::new();
        insert(&mut pods, pod("a", false));
        let mut no_uid = pod("b", false);
        no_uid.metadata.uid = None;
        insert(&mut pods, no_uid);
        assert_eq!(pods.len(), 1);
        let a = &pods["a"];
        assert_eq!(
            a.metadata.annotations.as_ref().unwrap()[CONFIG_SOURCE_ANNOTATION],
            API_SOURCE
        );
    }

    #[test]
    fn mirror_pods_are_recognised() {
        assert!(is_mirror_pod(&pod("a", true)));
        assert!(!is_mirror_pod(&pod("a", false)));
        let mut bare = pod("c", false);
        bare.metadata.annotations = None;
        assert!(!is_mirror_pod(&bare));
    }

    #[test]
    fn streaming_refusals_are_told_from_other_errors() {
        let status = |code: u16, message: &str| kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        };
        let refused = watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status(
            422,
            "sendInitialEvents is forbidden",
        ))));
        assert!(refuses_streaming(&refused));
        let gone = watcher::Error::WatchError(Box::new(status(410, "too old")));
        assert!(!refuses_streaming(&gone));
        let down = watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status(
            503,
            "unavailable",
        ))));
        assert!(!refuses_streaming(&down));
    }
}
