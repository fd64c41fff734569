//! Mirror pods: a read-only copy in the API server of each static pod, so that the cluster sees
//! what the node runs (upstream's `pod.MirrorClient` and the mirror handling of `SyncPod`). A
//! mirror carries `kubernetes.io/config.mirror: <static pod hash>` and is owned by the Node.
//! A missing mirror is created; a mirror of an older version of the manifest, or one being
//! deleted, is deleted (and created again at the next pass); a mirror whose static pod is gone
//! is deleted. Deleting a mirror therefore never stops its static pod.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};

use crate::sources::api::{CONFIG_MIRROR_ANNOTATION, MirrorPods};
use crate::sources::{CONFIG_HASH_ANNOTATION, annotation, pod_full_name};

/// What one pass decided for the mirrors.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MirrorPlan {
    /// Static pods (by full name) whose mirror must be created.
    pub create: Vec<String>,
    /// Mirror pods to delete: `(namespace/name, uid)`.
    pub delete: Vec<(String, String)>,
}

fn hash_of(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_HASH_ANNOTATION)
}

fn mirror_hash_of(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_MIRROR_ANNOTATION)
}

/// Decides which mirrors to create and delete, from the static pods the kubelet runs and the
/// mirrors the API server holds. A pure function.
pub fn plan(static_pods: &[Pod], mirrors: &MirrorPods) -> MirrorPlan {
    let mut plan = MirrorPlan::default();
    let mut wanted = HashSet::new();
    for pod in static_pods {
        let name = pod_full_name(pod);
        wanted.insert(name.clone());
        match mirrors.get(&name) {
            None => plan.create.push(name),
            Some(m) => {
                let stale = mirror_hash_of(m) != hash_of(pod);
                if stale || m.metadata.deletion_timestamp.is_some() {
                    plan.delete
                        .push((name, m.metadata.uid.clone().unwrap_or_default()));
                }
            }
        }
    }
    for (name, m) in mirrors {
        if !wanted.contains(name) {
            plan.delete
                .push((name.clone(), m.metadata.uid.clone().unwrap_or_default()));
        }
    }
    plan
}

/// The mirror pod of a static pod: its metadata and spec, the mirror annotation, and the Node
/// as owner when its UID is known.
pub fn mirror_pod(static_pod: &Pod, node_name: &str, node_uid: Option<&str>) -> Pod {
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    let hash = hash_of(static_pod).unwrap_or_default().to_string();
    annotations.insert(CONFIG_MIRROR_ANNOTATION.to_string(), hash);
    let owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node_name.to_string(),
            uid: uid.to_string(),
            controller: Some(true),
            ..Default::default()
        }]
    });
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references,
            ..Default::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

/// Creates and deletes mirror pods through the API server.
pub struct MirrorManager {
    client: Client,
    node_name: String,
}

impl MirrorManager {
    pub fn new(client: Client, node_name: String) -> Self {
        MirrorManager { client, node_name }
    }

    /// One pass: carries out [`plan`]. Failures are logged; the next pass tries again.
    pub async fn sync(&self, static_pods: &[Pod], mirrors: &MirrorPods, node_uid: Option<&str>) {
        let plan = plan(static_pods, mirrors);
        let by_name: BTreeMap<String, &Pod> =
            static_pods.iter().map(|p| (pod_full_name(p), p)).collect();
        for (name, uid) in plan.delete {
            let Some((ns, pod_name)) = name.split_once('/') else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(pod_name, &params).await {
                Ok(_) => tracing::info!(pod = %name, "deleted an outdated mirror pod"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => tracing::warn!(pod = %name, "deleting a mirror pod: {e}"),
            }
        }
        for name in plan.create {
            let Some(pod) = by_name.get(&name) else {
                continue;
            };
            let mirror = mirror_pod(pod, &self.node_name, node_uid);
            let ns = mirror.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            match api.create(&PostParams::default(), &mirror).await {
                Ok(_) => tracing::info!(pod = %name, "created the mirror pod"),
                // The watch has not shown it yet; or an API pod of that name exists.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => tracing::warn!(pod = %name, "creating the mirror pod: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_pod(name: &str, hash: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                uid: Some(hash.into()),
                annotations: Some(BTreeMap::from([(
                    CONFIG_HASH_ANNOTATION.to_string(),
                    hash.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(Default::default()),
            ..Default::default()
        }
    }

    fn mirror(name: &str, hash: &str, uid: &str) -> (String, Pod) {
        let mut m = mirror_pod(&static_pod(name, hash), "node1", None);
        m.metadata.uid = Some(uid.into());
        (format!("kube-system/{name}"), m)
    }

    #[test]
    fn missing_mirrors_are_created_and_current_ones_kept() {
        let pods = [static_pod("a", "h1"), static_pod("b", "h2")];
        let mirrors = MirrorPods::from([mirror("a", "h1", "m1")]);
        let p = plan(&pods, &mirrors);
        assert_eq!(p.create, vec!["kube-system/b".to_string()]);
        assert!(p.delete.is_empty());
    }

    #[test]
    fn stale_deleted_and_orphaned_mirrors_are_deleted() {
        let pods = [static_pod("a", "h1-new"), static_pod("b", "h2")];
        let (bn, mut b) = mirror("b", "h2", "m2");
        b.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        let mirrors = MirrorPods::from([mirror("a", "h1", "m1"), (bn, b), mirror("c", "h3", "m3")]);
        let p = plan(&pods, &mirrors);
        assert!(p.create.is_empty());
        assert_eq!(
            p.delete,
            vec![
                ("kube-system/a".to_string(), "m1".to_string()),
                ("kube-system/b".to_string(), "m2".to_string()),
                ("kube-system/c".to_string(), "m3".to_string()),
            ]
        );
    }

    #[test]
    fn a_mirror_copies_the_static_pod_and_names_its_owner() {
        let m = mirror_pod(&static_pod("a", "h1"), "node1", Some("node-uid"));
        let ann = m.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_MIRROR_ANNOTATION], "h1");
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], "h1");
        assert_eq!(m.metadata.uid, None);
        assert_eq!(m.metadata.name.as_deref(), Some("a"));
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "node1", "node-uid")
        );
        assert!(
            mirror_pod(&static_pod("a", "h1"), "node1", None)
                .metadata
                .owner_references
                .is_none()
        );
    }
}
