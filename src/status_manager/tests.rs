use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::model::{API_SOURCE, CONFIG_SOURCE_ANNOTATION};

fn pod(uid: &str, source: &str) -> Pod {
    let annotations = BTreeMap::from([
        (CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string()),
        (CONFIG_HASH_ANNOTATION.to_string(), uid.to_string()),
    ]);
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

fn status(phase: &str) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn versions(m: &StatusManager, uid: &str) -> (u64, u64) {
    let e = lock(&m.entries);
    let e = &e[uid];
    (e.version, e.written)
}

#[test]
fn a_write_is_due_only_when_the_status_changes() {
    let m = StatusManager::new(None);
    let p = pod("a", API_SOURCE);
    m.set_status(&p, status("Pending"));
    assert_eq!(versions(&m, "a"), (1, 0));
    m.set_status(&p, status("Pending"));
    assert_eq!(
        versions(&m, "a"),
        (1, 0),
        "the same status again is no change"
    );
    m.set_status(&p, status("Running"));
    assert_eq!(versions(&m, "a"), (2, 0));
    assert_eq!(m.status("a").unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(m.statuses().len(), 1);
}

#[test]
fn static_pods_write_to_their_mirror_and_api_pods_to_themselves() {
    let m = StatusManager::new(None);
    m.set_status(&pod("s", "file"), status("Running"));
    m.set_status(&pod("a", API_SOURCE), status("Running"));
    let entries = lock(&m.entries);
    assert_eq!(entries["s"].mirror_hash.as_deref(), Some("s"));
    assert_eq!(entries["a"].mirror_hash, None);
}

#[test]
fn pods_without_a_uid_are_ignored() {
    let m = StatusManager::new(None);
    let mut p = pod("a", API_SOURCE);
    p.metadata.uid = None;
    m.set_status(&p, status("Running"));
    assert!(m.statuses().is_empty());
}

#[test]
fn a_written_status_that_the_api_lost_is_written_again() {
    let m = StatusManager::new(None);
    let p = pod("a", API_SOURCE);
    m.set_status(&p, status("Running"));
    lock(&m.entries).get_mut("a").unwrap().written = 1;
    let mut api = p.clone();
    api.status = Some(status("Running"));
    m.reconcile(&api);
    assert_eq!(versions(&m, "a"), (1, 1), "same status: nothing to do");
    api.status = Some(status("Pending"));
    m.reconcile(&api);
    assert_eq!(versions(&m, "a"), (1, 0), "different status: due again");
}

#[test]
fn owned_status_comparison_ignores_conditions_of_other_writers() {
    let ours = status("Running");
    let mut api = status("Running");
    api.conditions.as_mut().unwrap().push(PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        ..Default::default()
    });
    assert!(same_owned_status(Some(&api), &ours));
    assert!(!same_owned_status(None, &ours));
    api.conditions.as_mut().unwrap()[0].status = "True".into();
    assert!(!same_owned_status(Some(&api), &ours));
}

#[test]
fn standalone_forgets_terminated_pods() {
    let m = StatusManager::new(None);
    let p = pod("a", API_SOURCE);
    m.set_status(&p, status("Running"));
    m.terminated(&p);
    assert!(m.status("a").is_none());

    assert!(is_api_pod(&p));
    assert!(!is_api_pod(&pod("s", "file")));
}

#[test]
fn a_static_pods_status_goes_to_its_current_mirror() {
    let m = StatusManager::new(None);
    assert_eq!(
        m.mirror_uid("default", "p-s", "s"),
        None,
        "no mirrors known yet"
    );
    let mut mirror = pod("mirror-uid", API_SOURCE);
    mirror.metadata.name = Some("p-s".into());
    mirror
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(CONFIG_MIRROR_ANNOTATION.to_string(), "s".to_string());
    let (tx, rx) = tokio::sync::watch::channel(MirrorPods::new());
    m.set_mirrors(rx);
    tx.send_replace(MirrorPods::from([("default/p-s".to_string(), mirror)]));
    assert_eq!(
        m.mirror_uid("default", "p-s", "s").as_deref(),
        Some("mirror-uid")
    );
    // A mirror of another version of the manifest is not this pod's.
    assert_eq!(m.mirror_uid("default", "p-s", "other-hash"), None);
    assert_eq!(m.mirror_uid("default", "missing", "s"), None);
}

#[test]
fn the_patch_clears_stale_condition_fields_and_ended_resize_conditions() {
    let status = PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let patch = status_patch(&status);
    let conds = patch["conditions"].as_array().unwrap();
    assert_eq!(conds[0]["type"], "Ready");
    // Null, so that the merge removes a reason or message from when it was not ready.
    assert!(conds[0]["reason"].is_null() && conds[0].get("reason").is_some());
    assert!(
        conds[0]
            .get("message")
            .is_some_and(serde_json::Value::is_null)
    );
    let deleted: Vec<&str> = conds
        .iter()
        .filter(|c| c["$patch"] == "delete")
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(deleted, vec!["PodResizePending", "PodResizeInProgress"]);
}

#[test]
fn the_patch_clears_a_stopped_containers_resources() {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, ResourceRequirements,
    };
    let container = |resources: Option<ResourceRequirements>| ContainerStatus {
        name: "app".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                ..Default::default()
            }),
            ..Default::default()
        }),
        resources,
        ..Default::default()
    };
    let status = PodStatus {
        container_statuses: Some(vec![container(None)]),
        ..Default::default()
    };
    let patch = status_patch(&status);
    let c = &patch["containerStatuses"][0];
    assert!(
        c.get("resources").is_some_and(serde_json::Value::is_null),
        "{c}"
    );
    // A running container's are sent as they are.
    let running = PodStatus {
        container_statuses: Some(vec![container(Some(ResourceRequirements::default()))]),
        ..Default::default()
    };
    let patch = status_patch(&running);
    assert!(patch["containerStatuses"][0]["resources"].is_object());
}

#[test]
fn the_patch_replaces_the_pod_ips_whole() {
    use k8s_openapi::api::core::v1::{HostIP, PodIP};
    let status = PodStatus {
        pod_ip: Some("10.0.0.9".into()),
        pod_ips: Some(vec![
            PodIP {
                ip: "10.0.0.9".into(),
            },
            PodIP {
                ip: "fd00::9".into(),
            },
        ]),
        host_ips: Some(vec![HostIP {
            ip: "192.168.1.2".into(),
        }]),
        ..Default::default()
    };
    let patch = status_patch(&status);
    assert_eq!(
        patch["podIPs"],
        serde_json::json!([{"$patch": "replace"}, {"ip": "10.0.0.9"}, {"ip": "fd00::9"}])
    );
    assert_eq!(
        patch["hostIPs"],
        serde_json::json!([{"$patch": "replace"}, {"ip": "192.168.1.2"}])
    );
}
