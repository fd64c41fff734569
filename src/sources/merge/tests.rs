//! Unit tests for the merger: snapshots in, Add/Update/Delete/Remove/Reconcile out.

use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;

fn pod(uid: &str, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            annotations: Some(BTreeMap::from([(
                CONFIG_SEEN_ANNOTATION.to_string(),
                "t0".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some(image.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn set(pods: Vec<Pod>) -> PodUpdate {
    PodUpdate {
        op: PodOp::Set,
        pods,
        source: "file",
    }
}

/// (op, uids) of each change.
fn summary(changes: &[PodUpdate]) -> Vec<(PodOp, Vec<String>)> {
    changes
        .iter()
        .map(|u| {
            assert_eq!(u.source, "file");
            (
                u.op,
                u.pods.iter().map(|p| pod_uid(p).to_string()).collect(),
            )
        })
        .collect()
}

fn uids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn snapshots_become_changes() {
    let mut m = Merger::new();
    assert!(!m.seen_source("file"));
    assert!(m.merge(set(vec![])).is_empty());
    assert!(m.seen_source("file"));

    let c = m.merge(set(vec![pod("a", "i:1"), pod("b", "i:1")]));
    assert_eq!(summary(&c), vec![(PodOp::Add, uids(&["a", "b"]))]);

    // The same snapshot again, with a new seen time: nothing.
    let mut again = pod("a", "i:1");
    again.metadata.annotations = Some(BTreeMap::from([(
        CONFIG_SEEN_ANNOTATION.to_string(),
        "t1".to_string(),
    )]));
    assert!(m.merge(set(vec![again, pod("b", "i:1")])).is_empty());

    // b changes, c appears, a goes.
    let c = m.merge(set(vec![pod("b", "i:2"), pod("c", "i:1")]));
    assert_eq!(
        summary(&c),
        vec![
            (PodOp::Remove, uids(&["a"])),
            (PodOp::Add, uids(&["c"])),
            (PodOp::Update, uids(&["b"])),
        ]
    );
    assert_eq!(m.source_pods("file").len(), 2);
    assert_eq!(m.pods().len(), 2);

    // A label change is an update too.
    let mut b = pod("b", "i:2");
    b.metadata.labels = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
    let c = m.merge(set(vec![b, pod("c", "i:1")]));
    assert_eq!(summary(&c), vec![(PodOp::Update, uids(&["b"]))]);

    let c = m.merge(set(vec![]));
    assert_eq!(summary(&c), vec![(PodOp::Remove, uids(&["b", "c"]))]);
    assert!(m.pods().is_empty());
}

#[test]
fn first_seen_time_is_kept() {
    let mut m = Merger::new();
    m.merge(set(vec![pod("a", "i:1")]));
    let mut changed = pod("a", "i:2");
    changed
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(CONFIG_SEEN_ANNOTATION.into(), "t9".into());
    let c = m.merge(set(vec![changed]));
    let seen = &c[0].pods[0].metadata.annotations.as_ref().unwrap()[CONFIG_SEEN_ANNOTATION];
    assert_eq!(seen, "t0");
}

#[test]
fn status_only_is_reconcile_and_deletion_is_delete() {
    let mut m = Merger::new();
    m.merge(set(vec![pod("a", "i:1"), pod("b", "i:1")]));
    let mut a = pod("a", "i:1");
    a.status = Some(PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    // A status write through the API server also moves the resourceVersion.
    a.metadata.resource_version = Some("42".into());
    let mut b = pod("b", "i:1");
    b.metadata.deletion_timestamp = Some(Time(Default::default()));
    let c = m.merge(set(vec![a, b.clone()]));
    assert_eq!(
        summary(&c),
        vec![
            (PodOp::Delete, uids(&["b"])),
            (PodOp::Reconcile, uids(&["a"]))
        ]
    );
    // Still deleting, now with a grace period change: an update.
    b.metadata.deletion_grace_period_seconds = Some(3);
    let c = m.merge(set(vec![m.source_pods("file")[0].clone(), b]));
    assert_eq!(summary(&c), vec![(PodOp::Update, uids(&["b"]))]);
}

#[test]
fn incremental_ops_sources_and_bad_uids() {
    let mut m = Merger::new();
    let add = |pods| PodUpdate {
        op: PodOp::Add,
        pods,
        source: "file",
    };
    let c = m.merge(add(vec![pod("a", "i:1")]));
    assert_eq!(summary(&c), vec![(PodOp::Add, uids(&["a"]))]);
    // An incremental add keeps the other pods.
    let c = m.merge(add(vec![pod("b", "i:1"), pod("a", "i:3")]));
    assert_eq!(
        summary(&c),
        vec![(PodOp::Add, uids(&["b"])), (PodOp::Update, uids(&["a"]))]
    );
    let c = m.merge(PodUpdate {
        op: PodOp::Remove,
        pods: vec![pod("a", "x"), pod("zzz", "x")],
        source: "file",
    });
    assert_eq!(summary(&c), vec![(PodOp::Remove, uids(&["a"]))]);

    // No UID, duplicate UID: dropped.
    let c = m.merge(set(vec![pod("", "i"), pod("b", "i:1"), pod("b", "i:2")]));
    assert!(c.is_empty(), "{c:?}");

    // Sources are independent.
    let c = m.merge(PodUpdate {
        op: PodOp::Set,
        pods: vec![],
        source: "http",
    });
    assert!(c.is_empty());
    assert!(m.seen_source("http"));
    assert_eq!(m.pods().len(), 1);
}

#[test]
fn a_pod_is_found_by_uid_in_any_source() {
    let mut m = Merger::new();
    m.merge(set(vec![pod("a", "i:1")]));
    m.merge(PodUpdate {
        op: PodOp::Set,
        pods: vec![pod("b", "i:1")],
        source: "http",
    });
    assert_eq!(
        m.pod("a").and_then(|p| p.metadata.uid.clone()).as_deref(),
        Some("a")
    );
    assert_eq!(
        m.pod("b").and_then(|p| p.metadata.uid.clone()).as_deref(),
        Some("b")
    );
    assert!(m.pod("c").is_none());
}
