//! Table tests of [`super`] (`pod::sync`).

use super::*;
use crate::pod::compute_pod_actions;
use crate::pod::spec::tests::pod;
use crate::pod::types::WaitingReason;
use runtime::fake::FakeRuntime;
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000 + secs)
}

async fn step(
    rt: &FakeRuntime,
    p: &Pod,
    backoff: &Mutex<Backoff>,
    now: SystemTime,
) -> (PodActions, SyncResult) {
    step_with(rt, p, backoff, &Mutex::new(Backoff::default()), now).await
}

async fn step_with(
    rt: &FakeRuntime,
    p: &Pod,
    backoff: &Mutex<Backoff>,
    image_backoff: &Mutex<Backoff>,
    now: SystemTime,
) -> (PodActions, SyncResult) {
    let snap = runtime_pod_status(rt, "u-1").await.expect("status");
    let actions = compute_pod_actions(p, &snap.status, &lock(backoff), now);
    rt.clear_calls();
    // Containers get termination message files under the pods dir: a temporary one.
    let pods = tempfile::tempdir().expect("pods dir");
    let opts = ContainerOptions {
        pods_dir: pods.path().to_path_buf(),
        ..Default::default()
    };
    let cx = SyncContext {
        rt,
        images: rt,
        opts: &opts,
        backoff,
        image_backoff,
        pulls: &ImagePulls::default(),
        events: &NoEvents,
        now,
    };
    let res = sync_pod(&cx, p, &snap, &actions).await.expect("sync");
    (actions, res)
}

#[test]
fn pull_policy_defaults() {
    let c = |image: &str, policy: Option<&str>| Container {
        name: "a".into(),
        image: Some(image.into()),
        image_pull_policy: policy.map(str::to_string),
        ..Default::default()
    };
    use PullPolicy::*;
    assert_eq!(pull_policy(&c("busybox", None)), Always);
    assert_eq!(pull_policy(&c("busybox:latest", None)), Always);
    assert_eq!(pull_policy(&c("localhost:5000/busybox", None)), Always);
    assert_eq!(pull_policy(&c("busybox:1.36", None)), IfNotPresent);
    assert_eq!(pull_policy(&c("busybox@sha256:abc", None)), IfNotPresent);
    assert_eq!(pull_policy(&c("busybox", Some("Never"))), Never);
}

#[tokio::test]
async fn lifecycle_against_the_fake() {
    let rt = FakeRuntime::new();
    let p = pod(
        json!({"initContainers": [{"name": "init", "image": "busybox:1.36"}],
        "containers": [{"name": "app", "image": "busybox:1.36"}]}),
    );
    let backoff = Mutex::new(Backoff::default());

    // New pod: sandbox + first init container.
    let (a, res) = step(&rt, &p, &backoff, t(0)).await;
    assert!(a.create_sandbox);
    rt.assert_calls(&[
        "RunPodSandbox",
        "PodSandboxStatus",
        "ImageStatus",
        "PullImage",
        "CreateContainer",
        "StartContainer",
    ])
    .expect("calls");
    assert_eq!(res.started, ["init"]);
    let init_id = rt.containers().first().map(|c| c.id.clone()).expect("init");

    // Init running: nothing to do but look.
    let (a, _) = step(&rt, &p, &backoff, t(1)).await;
    assert!(a.start_init.is_empty());
    rt.assert_calls(&[]).expect("no calls");

    // Init done: app container; the image is present now.
    rt.set_container_exited(&init_id, 0, "Completed")
        .expect("exit");
    let (_, res) = step(&rt, &p, &backoff, t(2)).await;
    assert_eq!(res.started, ["app"]);
    rt.assert_calls(&["ImageStatus", "CreateContainer", "StartContainer"])
        .expect("calls");

    // App crashes: restarted at once (attempt 1), then held back 10 s.
    let app_id = |rt: &FakeRuntime| rt.containers().last().map(|c| c.id.clone()).expect("app");
    rt.set_container_exited(&app_id(&rt), 1, "Error")
        .expect("exit");
    let (_, res) = step(&rt, &p, &backoff, t(3)).await;
    assert_eq!(res.started, ["app"]);
    let snap = runtime_pod_status(&rt, "u-1").await.expect("status");
    assert_eq!(snap.status.latest("app").map(|c| c.attempt), Some(1));
    rt.set_container_exited(&app_id(&rt), 1, "Error")
        .expect("exit");
    let snap = runtime_pod_status(&rt, "u-1").await.expect("status");
    let finished = snap
        .status
        .latest("app")
        .and_then(|c| c.finished_at)
        .expect("finished");
    let a = compute_pod_actions(
        &p,
        &snap.status,
        &lock(&backoff),
        finished + Duration::from_secs(4),
    );
    assert_eq!(
        (a.start_containers.len(), a.wait),
        (0, Some(Duration::from_secs(6)))
    );

    // Image pull failure becomes a waiting reason.
    let rt2 = FakeRuntime::new();
    for _ in 0..2 {
        rt2.inject_error("PullImage", runtime::Error::not_found("no such image"));
    }
    let fresh = Mutex::new(Backoff::default());
    let image_backoff = Mutex::new(Backoff::default());
    let (_, res) = step_with(&rt2, &p, &fresh, &image_backoff, t(0)).await;
    assert_eq!(
        res.waiting.get("init").map(|w| w.reason),
        Some(WaitingReason::ErrImagePull)
    );
    assert!(res.started.is_empty());
    assert_eq!(res.requeue_after, Some(Duration::from_secs(10)));
    // Within the pull's back-off: ImagePullBackOff, and no pull.
    let (_, res) = step_with(&rt2, &p, &fresh, &image_backoff, t(4)).await;
    assert_eq!(
        res.waiting
            .get("init")
            .map(|w| (w.reason, w.message.as_str())),
        Some((
            WaitingReason::ImagePullBackOff,
            "Back-off pulling image \"busybox:1.36\""
        ))
    );
    assert_eq!(res.requeue_after, Some(Duration::from_secs(6)));
    assert!(!rt2.called().iter().any(|c| c == "PullImage"));
    // After it: pulled again (and failing again, the back-off doubles).
    let (_, res) = step_with(&rt2, &p, &fresh, &image_backoff, t(11)).await;
    assert!(rt2.called().iter().any(|c| c == "PullImage"));
    assert_eq!(res.requeue_after, Some(Duration::from_secs(20)));
}

#[tokio::test]
async fn dead_sandbox_is_replaced() {
    let rt = FakeRuntime::new();
    let p = pod(json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}));
    let backoff = Mutex::new(Backoff::default());
    let (_, res) = step(&rt, &p, &backoff, t(0)).await;
    let first = res.sandbox_id.expect("sandbox");
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: first.clone(),
    })
    .await
    .expect("stop");
    let (a, res) = step(&rt, &p, &backoff, t(1)).await;
    assert!(a.kill_pod && a.create_sandbox && a.sandbox_attempt == 1);
    rt.assert_calls(&[
        "StopPodSandbox",
        "RunPodSandbox",
        "PodSandboxStatus",
        "ImageStatus",
        "CreateContainer",
        "StartContainer",
    ])
    .expect("calls");
    assert_ne!(res.sandbox_id, Some(first));
}
