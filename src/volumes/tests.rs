//! Tests of [`super::VolumeManager`] without an API server (a standalone node): the volumes
//! needing objects or tokens fail with a clear reason, the others are written.

use serde_json::json;

use super::*;
use crate::api::events::Recorded;

#[tokio::test]
async fn standalone_object_volumes_fail_clearly_and_downward_api_is_written() {
    let dir = tempfile::tempdir().expect("pods dir");
    let vm = VolumeManager::new(None, dir.path().to_path_buf(), Allocatable::default());
    let mounts: Vec<_> = ["cm", "sec", "token", "info"]
        .iter()
        .map(|n| json!({"name": n, "mountPath": format!("/{n}")}))
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"a": "b"}},
        "spec": {"serviceAccountName": "default", "containers": [{"name": "app", "image": "x",
            "volumeMounts": mounts}],
         "volumes": [
            {"name": "cm", "configMap": {"name": "c"}},
            {"name": "sec", "secret": {"secretName": "s", "optional": true}},
            {"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}]}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}
    }))
    .expect("a pod");
    let events = Recorded::default();
    let err = vm
        .set_up(&pod, &crate::model::PodRef::of(&pod), &events)
        .await
        .expect_err("no API server");
    assert!(
        err.to_string()
            .starts_with("unable to attach or mount volumes: "),
        "{err:?}"
    );
    let got = events.lines();
    assert_eq!(
        got,
        [
            "FailedMount: MountVolume.SetUp failed for volume \"cm\" : cannot get configmap \
             \"c\": the node has no API server (standalone)",
            "FailedMount: MountVolume.SetUp failed for volume \"sec\" : cannot get secret \
             \"s\": the node has no API server (standalone)",
            "FailedMount: MountVolume.SetUp failed for volume \"token\" : cannot request a \
             token for service account \"default\": the node has no API server (standalone)",
        ]
    );
    // Nothing is made for the failed ones; the downwardAPI volume is written.
    let volumes = dir.path().join("u-1/volumes");
    let mut plugins: Vec<String> = std::fs::read_dir(&volumes)
        .expect("volumes dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    plugins.sort();
    assert_eq!(plugins, ["kubernetes.io~downward-api"]);
    let info = volumes.join("kubernetes.io~downward-api/info");
    assert_eq!(
        std::fs::read_to_string(info.join("labels")).expect("labels"),
        "a=\"b\""
    );
    assert_eq!(vm.watched(), (0, 0));

    // Torn down: the written volumes are gone.
    vm.tear_down("u-1");
    assert!(!volumes.join("kubernetes.io~downward-api").exists());
}

#[test]
fn memory_volumes_take_the_smallest_size() {
    let gi = 1 << 30;
    assert_eq!(memory_size(Some(8 * gi), None, None), Some(8 * gi));
    assert_eq!(memory_size(Some(8 * gi), Some(gi), None), Some(gi));
    assert_eq!(
        memory_size(Some(8 * gi), Some(gi), Some(gi / 2)),
        Some(gi / 2)
    );
    // Larger than what the pod may use: the pod's limit.
    assert_eq!(memory_size(Some(8 * gi), Some(gi), Some(2 * gi)), Some(gi));
    assert_eq!(
        memory_size(Some(8 * gi), Some(0), Some(16 * gi)),
        Some(8 * gi)
    );
    assert_eq!(memory_size(None, None, None), None);
    let p: Pod = serde_json::from_value(json!({"spec": {
        "containers": [
            {"name": "a", "resources": {"limits": {"memory": "64Mi"}}},
            {"name": "b", "resources": {"limits": {"memory": "32Mi"}}}],
        "initContainers": [{"name": "i", "resources": {"limits": {"memory": "128Mi"}}}]}}))
    .expect("a pod");
    assert_eq!(pod_memory_limit(&p), Some(128 << 20));
    let unlimited: Pod = serde_json::from_value(json!({"spec": {
        "containers": [{"name": "a", "resources": {"limits": {"memory": "64Mi"}}}, {"name": "b"}]}}))
    .expect("a pod");
    assert_eq!(pod_memory_limit(&unlimited), None);
}
