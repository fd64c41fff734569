//! Tests of the status manager's pure parts: what to report and when to write.

use super::*;
use crate::node::conditions::RUNTIME_DOWN;
use crate::node::tests::facts;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn base() -> NodeStatus {
    build_node(&facts(), &KubeletConfig::default())
        .status
        .unwrap()
}

fn image(id: &str, size: u64, tags: &[&str], digests: &[&str]) -> cri::Image {
    cri::Image {
        id: id.into(),
        size,
        repo_tags: tags.iter().map(|s| s.to_string()).collect(),
        repo_digests: digests.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn images_largest_first_digests_then_tags() {
    let list = [
        image("a", 10, &["small:1"], &[]),
        image("b", 300, &["big:1", "big:latest"], &["big@sha256:1"]),
        image("c", 20, &[], &["mid@sha256:2"]),
    ];
    let got = node_images(&list);
    let names: Vec<_> = got.iter().map(|i| i.names.clone().unwrap()).collect();
    assert_eq!(
        names,
        [
            vec!["big@sha256:1", "big:1", "big:latest"],
            vec!["mid@sha256:2"],
            vec!["small:1"],
        ]
    );
    let sizes: Vec<_> = got.iter().map(|i| i.size_bytes.unwrap()).collect();
    assert_eq!(sizes, [300, 20, 10]);
}

#[test]
fn images_capped() {
    let many: Vec<_> = (0..60u64)
        .map(|i| {
            let tags: Vec<String> = (0..7).map(|t| format!("img{i}:{t}")).collect();
            let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
            image(&format!("id{i}"), i, &tags, &[])
        })
        .collect();
    let got = node_images(&many);
    assert_eq!(got.len(), MAX_IMAGES);
    assert_eq!(got[0].size_bytes, Some(59));
    assert_eq!(got[49].size_bytes, Some(10));
    assert!(
        got.iter()
            .all(|i| i.names.as_ref().unwrap().len() == MAX_NAMES_PER_IMAGE)
    );
}

#[test]
fn desired_status_keeps_previous_images_when_unknown() {
    let imgs = node_images(&[image("a", 1, &["a:1"], &[])]);
    let first = desired_status(&base(), None, &Health::ready(), Some(imgs.clone()), at(0));
    assert_eq!(first.images.as_ref(), Some(&imgs));
    let second = desired_status(&base(), Some(&first), &Health::ready(), None, at(10));
    assert_eq!(second.images, Some(imgs));
    assert_eq!(second.capacity, base().capacity);
    assert_eq!(second.conditions.as_ref().unwrap().len(), 4);
}

#[test]
fn changed_ignores_heartbeats_only() {
    let ready = Health::ready();
    let s0 = desired_status(&base(), None, &ready, None, at(0));
    // Same health later: only heartbeat times differ.
    let s1 = desired_status(&base(), Some(&s0), &ready, None, at(10));
    assert_ne!(s0, s1);
    assert!(!status_changed(&s0, &s1));
    // Ready flips.
    let s2 = desired_status(
        &base(),
        Some(&s1),
        &Health::not_ready([RUNTIME_DOWN]),
        None,
        at(20),
    );
    assert!(status_changed(&s1, &s2));
    // Capacity changes.
    let mut other = base();
    other
        .capacity
        .as_mut()
        .unwrap()
        .insert("pods".into(), Quantity("5".into()));
    let s3 = desired_status(&other, Some(&s1), &ready, None, at(30));
    assert!(status_changed(&s1, &s3));
    // Images change.
    let imgs = node_images(&[image("a", 1, &["a:1"], &[])]);
    let s4 = desired_status(&base(), Some(&s1), &ready, Some(imgs), at(40));
    assert!(status_changed(&s1, &s4));
    // A field another writer owns is not our change.
    let mut s5 = s1.clone();
    s5.volumes_in_use = Some(vec!["v".into()]);
    assert!(!status_changed(&s1, &s5));
    // The API server returning conditions in another order is no change.
    let mut s6 = s1.clone();
    s6.conditions.as_mut().unwrap().reverse();
    assert!(!status_changed(&s1, &s6));
}

#[test]
fn write_decision() {
    let t0 = Instant::now();
    let report = Duration::from_secs(300);
    let s = Duration::from_secs;
    // (changed, last write, now, expected)
    let cases = [
        (false, None, t0, true),
        (false, Some(t0), t0 + s(10), false),
        (false, Some(t0), t0 + s(299), false),
        (true, Some(t0), t0 + s(10), true),
        (false, Some(t0), t0 + s(300), true),
        (false, Some(t0), t0 + s(400), true),
        (true, None, t0, true),
    ];
    for (i, (changed, last, now, want)) in cases.into_iter().enumerate() {
        assert_eq!(should_write(changed, last, now, report), want, "case {i}");
    }
}

#[test]
fn runtime_handlers_and_features_from_health() {
    use k8s_openapi::api::core::v1::{NodeFeatures, NodeRuntimeHandler};
    let s0 = desired_status(&base(), None, &Health::ready(), None, at(0));
    assert_eq!(s0.runtime_handlers, None);
    let mut health = Health::ready();
    health.runtime_handlers = Some(vec![NodeRuntimeHandler {
        name: Some(String::new()),
        features: None,
    }]);
    health.features = Some(NodeFeatures {
        supplemental_groups_policy: Some(true),
    });
    let s1 = desired_status(&base(), Some(&s0), &health, None, at(10));
    assert_eq!(s1.runtime_handlers, health.runtime_handlers);
    assert_eq!(s1.features, health.features);
    assert!(status_changed(&s0, &s1));
    // Unknown later (runtime down): the last known stay.
    let s2 = desired_status(&base(), Some(&s1), &Health::ready(), None, at(20));
    assert_eq!(s2.runtime_handlers, health.runtime_handlers);
    assert!(!status_changed(&s1, &s2));
}

#[test]
fn condition_changes_become_node_events() {
    let c = |t: &str, s: &str| k8s_openapi::api::core::v1::NodeCondition {
        type_: t.into(),
        status: s.into(),
        ..Default::default()
    };
    let first = [
        c("MemoryPressure", "False"),
        c("DiskPressure", "False"),
        c("PIDPressure", "False"),
        c("Ready", "False"),
    ];
    let names = |r: Vec<crate::api::events::Reason>| -> Vec<&str> {
        r.into_iter().map(|r| r.as_str()).collect()
    };
    assert_eq!(
        names(condition_events(&[], &first)),
        [
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID",
            "NodeNotReady"
        ]
    );
    assert!(condition_events(&first, &first).is_empty());
    let mut next = first.clone();
    next[3] = c("Ready", "True");
    next[1] = c("DiskPressure", "True");
    assert_eq!(
        names(condition_events(&first, &next)),
        ["NodeHasDiskPressure", "NodeReady"]
    );
}
