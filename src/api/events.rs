//! Events the kubelet records in the API server (core/v1 `Event`), like upstream's event
//! recorder: about the Node (problems that belong to no pod, such as a broken static pod
//! manifest) or about a pod. Recording is best effort: a failure is logged, never retried.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

/// The `reason` of an event about a static pod manifest that cannot be used.
pub const FAILED_VALIDATION: &str = "FailedValidation";

/// Records events as the kubelet of one node.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    node_name: String,
}

impl Recorder {
    pub fn new(client: Client, node_name: String) -> Self {
        Recorder { client, node_name }
    }

    /// The reference to this node that node events name (upstream uses the node name as UID).
    pub fn node_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node_name.clone()),
            uid: Some(self.node_name.clone()),
            ..Default::default()
        }
    }

    /// Posts a Warning event about `object`.
    pub async fn warning(&self, object: ObjectReference, reason: &str, message: &str) {
        let event = build_event(&self.node_name, object, "Warning", reason, message);
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(reason, "recording an event failed: {e}");
        }
    }
}

/// The Event object: named `<object>.<unique suffix>` like upstream, in the object's
/// namespace (`default` for cluster-scoped objects such as the Node).
pub fn build_event(
    node_name: &str,
    object: ObjectReference,
    type_: &str,
    reason: &str,
    message: &str,
) -> Event {
    let now = Timestamp::now();
    let namespace = object
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let nanos = now.as_nanosecond();
    let name = format!(
        "{}.{:x}",
        object.name.as_deref().unwrap_or("unknown"),
        nanos
    );
    let time = Some(Time(now));
    Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: object,
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(type_.to_string()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node_name.to_string()),
        }),
        first_timestamp: time.clone(),
        last_timestamp: time,
        count: Some(1),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node_name.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_events_live_in_default_and_name_the_kubelet() {
        let object = ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            uid: Some("n1".into()),
            ..Default::default()
        };
        let e = build_event("n1", object, "Warning", FAILED_VALIDATION, "bad manifest");
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert!(e.metadata.name.as_deref().unwrap().starts_with("n1."));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some(FAILED_VALIDATION));
        assert_eq!(e.source.unwrap().host.as_deref(), Some("n1"));
        assert!(e.first_timestamp.is_some());
        assert_eq!(e.count, Some(1));
    }

    #[test]
    fn pod_events_live_in_the_pods_namespace() {
        let object = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("web".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        };
        let e = build_event("n1", object, "Warning", "Failed", "x");
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
    }
}
