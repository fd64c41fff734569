//! The kubelet's view of a pod, as upstream's `pkg/kubelet/container` holds it: who a pod is
//! ([`PodRef`], derived once per sync), the labels and annotations the kubelet puts on or reads
//! from what it runs, what the runtime reports of a pod ([`RuntimePodStatus`]), and the typed
//! policies, phases and waiting reasons. A leaf:
//! it imports nothing from the rest of the crate, so every subsystem may use it.

mod status;
mod types;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod};

pub use status::{ContainerInfo, RunState, RuntimePodStatus, SandboxInfo};
pub use types::{Phase, PullPolicy, RestartPolicy, Waiting, WaitingReason};

/// Label carrying the pod name on sandboxes and containers.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label carrying the pod namespace on sandboxes and containers.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label carrying the pod UID on sandboxes and containers.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Label carrying the container name on containers.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation carrying the hash of the spec a container was created from.
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation carrying the restart count a container was created with.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation carrying the container's termination message path.
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";

/// The source name of pods from the API server.
pub const API_SOURCE: &str = "api";
/// Annotation naming the source a pod came from.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// Who a pod is: its UID, name and namespace, read once from its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodRef {
    /// The UID ("" when unset).
    pub uid: String,
    /// The name ("" when unset).
    pub name: String,
    /// The namespace (`default` when unset).
    pub namespace: String,
}

impl PodRef {
    /// The identity of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let (uid, name, namespace) = pod_identity(pod);
        PodRef {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
        }
    }

    /// `namespace/name`, for messages and log lines.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `name_namespace(uid)`, as upstream's messages name a pod.
    pub fn desc(&self) -> String {
        format!("{}_{}({})", self.name, self.namespace, self.uid)
    }
}

/// The pod's UID, name and namespace (empty strings when unset; namespace `default`).
pub fn pod_identity(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.uid.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or(""),
        m.namespace.as_deref().unwrap_or("default"),
    )
}

/// The pod's UID, or "" when it has none.
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `namespace/name` of a pod as its metadata spells it, for messages.
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The value of one of the pod's annotations.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// True when the pod came from the API server (not a static pod).
pub fn is_api_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_none_or(|s| s == API_SOURCE)
}

/// Whether the container is a sidecar: an init container that keeps running
/// (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's restart policy (`Always` when unset, as the API server defaults it).
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    RestartPolicy::parse(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()))
}

/// Whether the pod uses the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The names of the ConfigMaps and Secrets the environments of `pod`'s containers (init, app
/// and ephemeral) reference.
pub fn env_references(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    let Some(spec) = pod.spec.as_ref() else {
        return (cms, secrets);
    };
    let regular = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (c.env.as_ref(), c.env_from.as_ref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| (c.env.as_ref(), c.env_from.as_ref()));
    for (env, env_from) in regular.chain(ephemeral) {
        for e in env.into_iter().flatten() {
            let from = e.value_from.as_ref();
            if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                cms.insert(r.name.clone());
            }
            if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                secrets.insert(r.name.clone());
            }
        }
        for f in env_from.into_iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    (cms, secrets)
}
