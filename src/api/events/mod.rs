//! Events the kubelet records in the API server (core/v1 `Event`) about its Node and its
//! pods, like upstream's EventRecorder, EventBroadcaster and EventCorrelator together.
//!
//! [`EventRecorder::event`] never waits: it queues the event (a bounded queue; when full the
//! event is dropped and logged) for the sink task that [`EventRecorder::new`] returns. The
//! sink passes each event through the [`Correlator`] (aggregation of similar events, one
//! Event object with a growing count for identical ones, a rate limit per involved object)
//! and writes the result, one write at a time. Without an API server (a standalone node)
//! events are only logged.

pub mod correlator;
mod pod;
mod reasons;
mod sink;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tokio::sync::mpsc;

pub use correlator::{Correlator, Decision};
#[cfg(test)]
pub use pod::Recorded;
pub use pod::{NoEvents, PodEvents};
pub use reasons::Reason;

/// The component named as the events' source and reporter.
pub const COMPONENT: &str = "kubelet";
/// Events waiting for the sink; more are dropped (upstream's broadcaster queue length).
pub const QUEUE_LENGTH: usize = 1000;

/// An event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

struct Inner {
    node_name: String,
    /// `None` on a standalone node: events are logged, not queued.
    tx: Option<mpsc::Sender<sink::Recorded>>,
    /// Events dropped because the queue was full.
    dropped: AtomicU64,
}

/// Records events as the kubelet of one node, from anywhere, without waiting. Cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Inner>,
}

impl EventRecorder {
    /// The recorder and its sink task, which the caller spawns. The sink ends once every
    /// clone of the recorder is dropped and the queued events are written (within a few
    /// seconds); dropping the future cancels it. With `client` `None` (a standalone node)
    /// events are only logged: Normal ones at info, Warnings at warn.
    pub fn new(
        client: Option<Client>,
        node_name: String,
    ) -> (EventRecorder, impl Future<Output = ()> + Send + 'static) {
        Self::with_queue(client, node_name, QUEUE_LENGTH)
    }

    fn with_queue(
        client: Option<Client>,
        node_name: String,
        queue: usize,
    ) -> (EventRecorder, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let inner = Inner {
            node_name,
            tx: client.is_some().then_some(tx),
            dropped: AtomicU64::new(0),
        };
        let recorder = EventRecorder {
            inner: Arc::new(inner),
        };
        (recorder, sink::run(client, rx))
    }

    /// Records an event about `object`. Never waits and never fails: an event that cannot be
    /// queued is dropped with a log line.
    pub fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: Reason,
        message: impl Into<String>,
    ) {
        let message = message.into();
        let reason = reason.as_str();
        let kind = object.kind.as_deref().unwrap_or("");
        let namespace = object.namespace.as_deref().unwrap_or("");
        let name = object.name.as_deref().unwrap_or("");
        let Some(tx) = &self.inner.tx else {
            match type_ {
                EventType::Normal => {
                    tracing::info!(kind, namespace, name, reason, "event: {message}")
                }
                EventType::Warning => {
                    tracing::warn!(kind, namespace, name, reason, "event: {message}")
                }
            }
            return;
        };
        tracing::debug!(kind, namespace, name, reason, %type_, "event: {message}");
        let now = Timestamp::now();
        let event = build_event(
            &self.inner.node_name,
            object.clone(),
            type_,
            reason,
            &message,
            now,
        );
        match tx.try_send(sink::Recorded { event, at: now }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::debug!(kind, namespace, name, reason, "event queue full: dropped");
                if n.is_power_of_two() {
                    tracing::warn!(
                        "the event queue is full ({QUEUE_LENGTH}): {n} events dropped so far"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!(kind, namespace, name, reason, "event sink stopped: dropped");
            }
        }
    }

    /// The reference to this node that node events name (upstream uses the node name as UID).
    pub fn node_ref(&self) -> ObjectReference {
        node_ref(&self.inner.node_name)
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

fn node_ref(node_name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.to_string()),
        uid: Some(node_name.to_string()),
        ..Default::default()
    }
}

/// The reference to a pod that its events name.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    let m = &pod.metadata;
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        ..Default::default()
    }
}

/// The reference to one of a pod's containers: the pod's, with the container's field path
/// (`spec.containers{name}`, `spec.initContainers{name}`, `spec.ephemeralContainers{name}`),
/// or, for a container not in the spec, upstream's `implicitly required container <name>`.
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    let spec = pod.spec.as_ref();
    let named = |c: &str| c == container;
    let in_main = spec.is_some_and(|s| s.containers.iter().any(|c| named(&c.name)));
    let in_init = spec.is_some_and(|s| s.init_containers.iter().flatten().any(|c| named(&c.name)));
    let in_ephemeral = spec.is_some_and(|s| {
        s.ephemeral_containers
            .iter()
            .flatten()
            .any(|c| named(&c.name))
    });
    let field_path = if in_main {
        format!("spec.containers{{{container}}}")
    } else if in_init {
        format!("spec.initContainers{{{container}}}")
    } else if in_ephemeral {
        format!("spec.ephemeralContainers{{{container}}}")
    } else {
        format!("implicitly required container {container}")
    };
    ObjectReference {
        field_path: Some(field_path),
        ..pod_ref(pod)
    }
}

/// A name suffix no other event of this process has: the time in nanoseconds as upstream,
/// made strictly increasing.
fn unique_suffix(now: Timestamp) -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let nanos = u64::try_from(now.as_nanosecond()).unwrap_or(0);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = nanos.max(last.wrapping_add(1));
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// A new Event's name (`<object>.<unique hex suffix>`) and namespace (the object's, `default`
/// for cluster-scoped objects such as the Node).
fn event_meta(object: &ObjectReference, now: Timestamp) -> ObjectMeta {
    let namespace = object
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let object_name = object.name.as_deref().filter(|n| !n.is_empty());
    let name = format!(
        "{}.{:x}",
        object_name.unwrap_or("unknown"),
        unique_suffix(now)
    );
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace),
        ..Default::default()
    }
}

/// The Event object for one occurrence at `now`, with count 1.
pub fn build_event(
    node_name: &str,
    object: ObjectReference,
    type_: EventType,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Event {
    let time = Some(Time(now));
    Event {
        metadata: event_meta(&object, now),
        involved_object: object,
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(type_.as_str().to_string()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node_name.to_string()),
        }),
        first_timestamp: time.clone(),
        last_timestamp: time,
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node_name.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EphemeralContainer, PodSpec};
    use std::sync::Mutex;

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).expect("a valid timestamp")
    }

    fn web() -> Pod {
        let c = |name: &str| Container {
            name: name.into(),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                resource_version: Some("17".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![c("app"), c("side")],
                init_containers: Some(vec![c("setup")]),
                ephemeral_containers: Some(vec![EphemeralContainer {
                    name: "debug".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_events_live_in_default_and_name_the_kubelet() {
        let object = node_ref("n1");
        let e = build_event(
            "n1",
            object,
            EventType::Warning,
            Reason::FailedValidation.as_str(),
            "bad",
            now(),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert!(e.metadata.name.as_deref().unwrap_or("").starts_with("n1."));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("FailedValidation"));
        let source = e.source.clone().unwrap_or_default();
        assert_eq!(source.component.as_deref(), Some("kubelet"));
        assert_eq!(source.host.as_deref(), Some("n1"));
        assert_eq!(e.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(e.reporting_instance.as_deref(), Some("n1"));
        assert_eq!(e.first_timestamp, Some(Time(now())));
        assert_eq!(e.last_timestamp, Some(Time(now())));
        assert_eq!(e.count, Some(1));
    }

    #[test]
    fn pod_events_live_in_the_pods_namespace_under_unique_names() {
        let a = build_event("n1", pod_ref(&web()), EventType::Normal, "x", "m", now());
        let b = build_event("n1", pod_ref(&web()), EventType::Normal, "x", "m", now());
        assert_eq!(a.metadata.namespace.as_deref(), Some("shop"));
        assert_ne!(a.metadata.name, b.metadata.name);
        let suffix = |e: &Event| {
            let name = e.metadata.name.clone().unwrap_or_default();
            let hex = name.strip_prefix("web.").map(str::to_string);
            hex.and_then(|h| u64::from_str_radix(&h, 16).ok())
        };
        assert!(suffix(&a).is_some() && suffix(&a) < suffix(&b));
    }

    #[test]
    fn pod_and_container_references() {
        let pod = web();
        let r = pod_ref(&pod);
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.namespace.as_deref(), Some("shop"));
        assert_eq!(r.uid.as_deref(), Some("u-1"));
        assert_eq!(r.resource_version.as_deref(), Some("17"));
        assert_eq!(r.field_path, None);
        let path = |c: &str| container_ref(&pod, c).field_path.unwrap_or_default();
        assert_eq!(path("side"), "spec.containers{side}");
        assert_eq!(path("setup"), "spec.initContainers{setup}");
        assert_eq!(path("debug"), "spec.ephemeralContainers{debug}");
        assert_eq!(path("ghost"), "implicitly required container ghost");
        let c = container_ref(&pod, "app");
        assert_eq!(c.uid.as_deref(), Some("u-1"));
        assert_eq!(c.name.as_deref(), Some("web"));
    }

    /// A log writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn standalone_events_are_logged_and_the_sink_ends_with_the_recorders() {
        let (recorder, sink) = EventRecorder::new(None, "n1".into());
        let sink = tokio::spawn(sink);
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let pod = web();
        tracing::subscriber::with_default(subscriber, || {
            let other = recorder.clone();
            other.event(
                &container_ref(&pod, "app"),
                EventType::Warning,
                Reason::BackOff,
                "Back-off restarting failed container app",
            );
            recorder.event(
                &recorder.node_ref(),
                EventType::Normal,
                Reason::StartingKubelet,
                "Starting kubelet.",
            );
        });
        let text =
            String::from_utf8_lossy(&log.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        let warn = text.lines().find(|l| l.contains("BackOff")).unwrap_or("");
        assert!(warn.contains("WARN"), "{text}");
        assert!(warn.contains("Back-off restarting failed container app"));
        let info = text.lines().find(|l| l.contains("Starting")).unwrap_or("");
        assert!(info.contains("INFO") && info.contains("Node"), "{text}");

        assert!(!sink.is_finished());
        drop(recorder);
        tokio::time::timeout(std::time::Duration::from_secs(5), sink)
            .await
            .expect("the sink ends once every recorder is dropped")
            .expect("the sink does not panic");
    }

    #[tokio::test]
    async fn a_full_queue_drops_events_without_waiting() {
        crate::api::install_crypto_provider();
        let uri = "http://127.0.0.1:9".parse().expect("a valid URI");
        let client = Client::try_from(kube::Config::new(uri)).expect("a client");
        // The sink is never run, so nothing leaves the queue.
        let (recorder, _sink) = EventRecorder::with_queue(Some(client), "n1".into(), 2);
        let node = recorder.node_ref();
        for i in 0..5 {
            recorder.event(
                &node,
                EventType::Normal,
                Reason::StartingKubelet,
                format!("m{i}"),
            );
        }
        assert_eq!(recorder.dropped(), 3);
    }
}
