//! The kubelet's event recorder against the test API server: identical events become one Event
//! object with a count, similar ones are combined, an Event deleted meanwhile is created
//! again, the spam filter holds an object to its burst, a server away for a moment gets the
//! event once back, and callers never wait for any of it. No containers, no root.

mod apiserver;

use std::time::Duration;

use apiserver::ApiServer;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use nodelet::api::events::{EventRecorder, EventType, Reason, container_ref, pod_ref};
use serde_json::json;
use tokio::task::JoinHandle;

const NODE: &str = "node-a";
const NS: &str = "shop";
/// Bound on waiting for the sink; failing here means the events never came.
const WAIT: Duration = Duration::from_secs(15);

struct Setup {
    server: ApiServer,
    recorder: EventRecorder,
    sink: JoinHandle<()>,
    pod: Pod,
}

async fn setup() -> Setup {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "busybox:1.36"}]}}))
    .expect("a pod");
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");
    let (recorder, sink) = EventRecorder::new(Some(server.client()), NODE.to_string());
    let sink = tokio::spawn(sink);
    Setup {
        server,
        recorder,
        sink,
        pod,
    }
}

impl Setup {
    fn events(&self, ns: &str) -> Api<Event> {
        Api::namespaced(self.server.client(), ns)
    }

    /// Drops the recorder and waits for the sink to write what was queued and end.
    async fn finish(self) -> ApiServer {
        drop(self.recorder);
        tokio::time::timeout(WAIT, self.sink)
            .await
            .expect("the sink ends once the recorder is dropped")
            .expect("the sink does not panic");
        self.server
    }

    fn requests(&self, method: &str) -> usize {
        let prefix = format!("{method} /api/v1/namespaces/{NS}/events");
        self.server
            .requests()
            .iter()
            .filter(|r| r.starts_with(&prefix))
            .count()
    }
}

async fn list(api: &Api<Event>) -> Vec<Event> {
    api.list(&ListParams::default())
        .await
        .expect("listing events")
        .items
}

/// Polls until `done` holds for the events in `api`'s namespace; panics after [`WAIT`].
async fn wait_for(api: &Api<Event>, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let items = list(api).await;
        if done(&items) {
            return items;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not in {WAIT:?}; events: {items:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn message(e: &Event) -> &str {
    e.message.as_deref().unwrap_or("")
}

#[tokio::test]
async fn the_same_event_five_times_is_one_event_counted_five() {
    let s = setup().await;
    // Recorded from a thread that has no runtime at all: nothing to await, nothing blocks.
    let (recorder, object) = (s.recorder.clone(), pod_ref(&s.pod));
    std::thread::spawn(move || {
        for _ in 0..5 {
            recorder.event(
                &object,
                EventType::Normal,
                Reason::SandboxChanged,
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
    })
    .join()
    .expect("the recording thread");

    let items = wait_for(&s.events(NS), "an event with count 5", |items| {
        items.iter().any(|e| e.count == Some(5))
    })
    .await;
    assert_eq!(items.len(), 1, "{items:#?}");
    let e = &items[0];
    assert_eq!(e.involved_object, pod_ref(&s.pod));
    assert_eq!(e.involved_object.uid, s.pod.metadata.uid);
    assert_eq!(e.reason.as_deref(), Some("SandboxChanged"));
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(
        message(e),
        "Pod sandbox changed, it will be killed and re-created."
    );
    let source = e.source.clone().unwrap_or_default();
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some(NODE));
    assert_eq!(e.reporting_component.as_deref(), Some("kubelet"));
    assert_eq!(e.reporting_instance.as_deref(), Some(NODE));
    assert_eq!(e.metadata.namespace.as_deref(), Some(NS));
    assert!(
        e.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("web.")),
        "{:?}",
        e.metadata.name
    );
    assert!(e.first_timestamp.is_some() && e.first_timestamp <= e.last_timestamp);
    // Created once, then patched.
    assert_eq!(s.requests("POST"), 1);
    assert_eq!(s.requests("PATCH"), 4);
    s.finish().await;
}

#[tokio::test]
async fn twelve_similar_events_are_combined_from_the_tenth_on() {
    let s = setup().await;
    let app = container_ref(&s.pod, "app");
    for i in 1..=12 {
        s.recorder.event(
            &app,
            EventType::Warning,
            Reason::Failed,
            format!("Error: failed {i}"),
        );
    }
    let items = wait_for(&s.events(NS), "the combined event counted 3", |items| {
        items.iter().any(|e| e.count == Some(3))
    })
    .await;
    let (combined, single): (Vec<&Event>, Vec<&Event>) = items
        .iter()
        .partition(|e| message(e).starts_with("(combined from similar events): "));
    assert_eq!(combined.len(), 1, "{items:#?}");
    let c = combined[0];
    assert_eq!(
        message(c),
        "(combined from similar events): Error: failed 12"
    );
    assert_eq!(c.reason.as_deref(), Some("Failed"));
    assert_eq!(c.type_.as_deref(), Some("Warning"));
    assert_eq!(
        c.involved_object.field_path.as_deref(),
        Some("spec.containers{app}")
    );
    let mut messages: Vec<&str> = single.iter().map(|e| message(e)).collect();
    messages.sort();
    let expected: Vec<String> = (1..=9).map(|i| format!("Error: failed {i}")).collect();
    assert_eq!(messages, expected);
    assert!(single.iter().all(|e| e.count == Some(1)));
    s.finish().await;
}

#[tokio::test]
async fn an_event_deleted_meanwhile_is_created_again_with_count_1() {
    let s = setup().await;
    let api = s.events(NS);
    let object = pod_ref(&s.pod);
    let record = || {
        s.recorder
            .event(&object, EventType::Normal, Reason::PulledImage, "pulled")
    };
    record();
    record();
    let items = wait_for(&api, "count 2", |i| i.iter().any(|e| e.count == Some(2))).await;
    let name = items[0].metadata.name.clone().expect("a name");
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the event");
    record();
    let items = wait_for(&api, "a new event", |i| !i.is_empty()).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].count, Some(1));
    assert_eq!(message(&items[0]), "pulled");
    assert_ne!(items[0].metadata.uid, None);
    // After the delete: the patch found nothing and the event was posted again.
    let log = s.server.requests();
    let writes: Vec<&str> = log
        .iter()
        .skip_while(|r| !r.starts_with("DELETE "))
        .filter(|r| r.contains("/events") && !r.starts_with("GET "))
        .filter_map(|r| r.split(' ').next())
        .collect();
    assert_eq!(writes, ["DELETE", "PATCH", "POST"], "{log:#?}");
    s.finish().await;
}

#[tokio::test]
async fn node_events_live_in_default_and_the_spam_filter_stops_at_25() {
    let s = setup().await;
    let node = s.recorder.node_ref();
    // 30 events none of which aggregates with another: a reason and a type of their own each.
    let kinds = [EventType::Normal, EventType::Warning];
    for (reason, kind) in Reason::ALL
        .iter()
        .flat_map(|r| kinds.map(|k| (*r, k)))
        .take(30)
    {
        s.recorder
            .event(&node, kind, reason, "something about the node");
    }
    // Another object is not held back by the node's bucket.
    s.recorder.event(
        &pod_ref(&s.pod),
        EventType::Normal,
        Reason::StartedContainer,
        "Started container app",
    );
    let api_default = s.events("default");
    let api_shop = s.events(NS);
    let server = s.finish().await;
    let node_events = list(&api_default).await;
    assert_eq!(node_events.len(), 25, "{node_events:#?}");
    assert!(node_events.iter().all(|e| {
        e.involved_object.kind.as_deref() == Some("Node")
            && e.involved_object.name.as_deref() == Some(NODE)
    }));
    assert_eq!(list(&api_shop).await.len(), 1);
    drop(server);
}

#[tokio::test]
async fn an_event_recorded_while_the_server_is_away_is_written_once_it_is_back() {
    let s = setup().await;
    s.server.stop().await;
    let began = std::time::Instant::now();
    s.recorder.event(
        &pod_ref(&s.pod),
        EventType::Warning,
        Reason::Failed,
        "Error: ErrImagePull",
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.server.restart().await;
    let items = wait_for(&s.events(NS), "the event", |i| !i.is_empty()).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].reason.as_deref(), Some("Failed"));
    // The first try found no server; the second, after the 500 ms back-off, wrote it.
    assert!(
        began.elapsed() >= Duration::from_millis(450),
        "{:?}",
        began.elapsed()
    );
    s.finish().await;
}

#[tokio::test]
async fn a_warning_about_the_node_twice_is_one_event_counted_twice() {
    let server = ApiServer::start().await;
    let (r, sink) = EventRecorder::new(Some(server.client()), NODE.to_string());
    tokio::spawn(sink);
    for _ in 0..2 {
        let node = r.node_ref();
        r.event(
            &node,
            EventType::Warning,
            Reason::FailedValidation,
            "bad manifest",
        );
    }
    let api: Api<Event> = Api::namespaced(server.client(), "default");
    let items = wait_for(&api, "count 2", |i| i.iter().any(|e| e.count == Some(2))).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].type_.as_deref(), Some("Warning"));
    assert_eq!(items[0].reason.as_deref(), Some("FailedValidation"));
}
