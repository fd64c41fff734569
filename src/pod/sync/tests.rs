//! Table tests of [`super`] (`pod::sync`).

use std::sync::Arc;

use super::*;
use crate::api::events::Recorded;
use crate::model::WaitingReason;
use crate::pod::Backoff;
use crate::pod::compute_pod_actions;
use crate::pod::images::ImageManager;
use crate::pod::spec::tests::pod;
use runtime::RuntimeService;
use runtime::fake::FakeRuntime;
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(2_000_000_000 + secs)
}

/// A runtime manager over a fake runtime, its events recorded.
struct Harness {
    rt: Arc<FakeRuntime>,
    events: Arc<Recorded>,
    m: RuntimeManager,
}

fn harness() -> Harness {
    let rt = Arc::new(FakeRuntime::new());
    let events = Arc::new(Recorded::default());
    let images = ImageManager::new(rt.clone(), ImagePulls::default());
    let m = RuntimeManager::new(rt.clone(), images, events.clone(), Backoff::default());
    Harness { rt, events, m }
}

impl Harness {
    async fn step(&self, p: &Pod, now: SystemTime) -> (PodActions, SyncResult) {
        self.step_with(p, now, &ContainerOptions::default()).await
    }

    /// One sync with the given options (the pods dir is made here).
    async fn step_with(
        &self,
        p: &Pod,
        now: SystemTime,
        opts: &ContainerOptions,
    ) -> (PodActions, SyncResult) {
        let snapshot = runtime_pod_status(self.rt.as_ref(), "u-1")
            .await
            .expect("status");
        let actions =
            compute_pod_actions(p, &PodRef::of(p), &snapshot.status, &self.m.backoff(), now);
        self.rt.clear_calls();
        // Containers get termination message files under the pods dir: a temporary one.
        let pods = tempfile::tempdir().expect("pods dir");
        let opts = ContainerOptions {
            pods_dir: pods.path().to_path_buf(),
            ..opts.clone()
        };
        let who = PodRef::of(p);
        let sync = PodSync {
            pod: p,
            who: &who,
            snapshot: &snapshot,
            actions: &actions,
            opts: &opts,
            now,
        };
        let res = self.m.sync_pod(&sync).await.expect("sync");
        (actions, res)
    }
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
    let h = harness();
    let rt = &h.rt;
    let p = pod(
        json!({"initContainers": [{"name": "init", "image": "busybox:1.36"}],
        "containers": [{"name": "app", "image": "busybox:1.36"}]}),
    );

    // New pod: sandbox + first init container.
    let (a, res) = h.step(&p, t(0)).await;
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
    let (a, _) = h.step(&p, t(1)).await;
    assert!(a.start_init.is_empty());
    rt.assert_calls(&[]).expect("no calls");

    // Init done: app container; the image is present now.
    rt.set_container_exited(&init_id, 0, "Completed")
        .expect("exit");
    let (_, res) = h.step(&p, t(2)).await;
    assert_eq!(res.started, ["app"]);
    rt.assert_calls(&["ImageStatus", "CreateContainer", "StartContainer"])
        .expect("calls");

    // App crashes: restarted at once (attempt 1), then held back 10 s.
    let app_id = |rt: &FakeRuntime| rt.containers().last().map(|c| c.id.clone()).expect("app");
    rt.set_container_exited(&app_id(rt), 1, "Error")
        .expect("exit");
    let (_, res) = h.step(&p, t(3)).await;
    assert_eq!(res.started, ["app"]);
    let snap = runtime_pod_status(rt.as_ref(), "u-1")
        .await
        .expect("status");
    assert_eq!(snap.status.latest("app").map(|c| c.attempt), Some(1));
    rt.set_container_exited(&app_id(rt), 1, "Error")
        .expect("exit");
    let snap = runtime_pod_status(rt.as_ref(), "u-1")
        .await
        .expect("status");
    let finished = snap
        .status
        .latest("app")
        .and_then(|c| c.finished_at)
        .expect("finished");
    let a = compute_pod_actions(
        &p,
        &PodRef::of(&p),
        &snap.status,
        &h.m.backoff(),
        finished + Duration::from_secs(4),
    );
    assert_eq!(
        (a.start_containers.len(), a.wait),
        (0, Some(Duration::from_secs(6)))
    );

    // Image pull failure becomes a waiting reason.
    let h2 = harness();
    let rt2 = &h2.rt;
    for _ in 0..2 {
        rt2.inject_error("PullImage", runtime::Error::not_found("no such image"));
    }
    let (_, res) = h2.step(&p, t(0)).await;
    assert_eq!(
        res.waiting.get("init").map(|w| w.reason),
        Some(WaitingReason::ErrImagePull)
    );
    assert!(res.started.is_empty());
    assert_eq!(res.requeue_after, Some(Duration::from_secs(10)));
    // Within the pull's back-off: ImagePullBackOff, and no pull.
    let (_, res) = h2.step(&p, t(4)).await;
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
    let (_, res) = h2.step(&p, t(11)).await;
    assert!(rt2.called().iter().any(|c| c == "PullImage"));
    assert_eq!(res.requeue_after, Some(Duration::from_secs(20)));
}

#[tokio::test]
async fn dead_sandbox_is_replaced() {
    let h = harness();
    let rt = &h.rt;
    let p = pod(json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}));
    let (_, res) = h.step(&p, t(0)).await;
    let first = res.sandbox_id.expect("sandbox");
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: first.clone(),
    })
    .await
    .expect("stop");
    let (a, res) = h.step(&p, t(1)).await;
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

/// What a hook printed (here a token) stays out of events and log lines: the events say only
/// that the hook failed, as upstream's; the container's status keeps the whole message.
#[tokio::test]
async fn a_failed_post_start_hook_keeps_its_output_out_of_events_and_logs() {
    let h = harness();
    let rt = &h.rt;
    rt.set_exec_sync_response(cri::ExecSyncResponse {
        stdout: b"token=s3cret\n".to_vec(),
        stderr: Vec::new(),
        exit_code: 3,
    });
    let p = pod(
        json!({"containers": [{"name": "app", "image": "busybox:1.36",
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo token=s3cret; exit 3"]}}}}]}),
    );
    let (_, res) = h.step(&p, t(0)).await;
    let waiting = res.waiting.get("app").expect("app waits");
    assert_eq!(waiting.reason, WaitingReason::PostStartHookError);
    assert!(waiting.message.contains("s3cret"), "{waiting:?}");
    let lines = h.events.lines();
    assert!(
        lines
            .iter()
            .any(|l| l == "FailedPostStartHook: PostStartHook failed"),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == "Killing: FailedPostStartHook"),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("s3cret")), "{lines:?}");
    let logged = res.into_error().expect("an error").to_string();
    assert!(
        logged.contains("PostStartHookError") && !logged.contains("s3cret"),
        "{logged}"
    );
    assert!(
        rt.called().iter().any(|c| c == "StopContainer"),
        "killed after the hook"
    );
}

#[tokio::test]
async fn a_failed_pre_stop_hook_keeps_its_output_out_of_events() {
    let h = harness();
    let rt = &h.rt;
    let p = pod(
        json!({"containers": [{"name": "app", "image": "busybox:1.36",
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo token=s3cret; exit 3"]}}}}]}),
    );
    h.step(&p, t(0)).await;
    rt.set_exec_sync_response(cri::ExecSyncResponse {
        stdout: b"token=s3cret\n".to_vec(),
        stderr: Vec::new(),
        exit_code: 3,
    });
    let snap = runtime_pod_status(rt.as_ref(), "u-1")
        .await
        .expect("status");
    let app = snap.status.latest("app").expect("app");
    let events = crate::api::events::Recorded::default();
    super::super::kill::stop_one(rt.as_ref(), &events, &p, app, 5, None, "")
        .await
        .expect("stopped");
    let lines = events.lines();
    assert!(
        lines
            .iter()
            .any(|l| l == "FailedPreStopHook: PreStopHook failed"),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("s3cret")), "{lines:?}");
}

/// A pod on the node's network gets the node's address as `status.podIP` in its env
/// (NodeConformance: "should provide host IP and pod IP as an env var if pod uses host
/// network").
#[tokio::test]
async fn a_host_network_pods_env_has_the_nodes_ip_as_its_pod_ip() {
    let h = harness();
    let rt = &h.rt;
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let p = pod(
        json!({"hostNetwork": true, "containers": [{"name": "app", "image": "busybox:1.36",
        "env": [{"name": "POD_IP", "valueFrom": field("status.podIP")},
                {"name": "POD_IPS", "valueFrom": field("status.podIPs")},
                {"name": "HOST_IP", "valueFrom": field("status.hostIP")}]}]}),
    );
    let opts = ContainerOptions {
        host_ips: vec!["192.0.2.7".into()],
        ..Default::default()
    };
    let (_, res) = h.step_with(&p, t(0), &opts).await;
    assert_eq!(res.started, ["app"]);
    let envs: Vec<(String, String)> = rt.containers()[0]
        .config
        .envs
        .iter()
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect();
    for name in ["POD_IP", "POD_IPS", "HOST_IP"] {
        assert!(
            envs.contains(&(name.into(), "192.0.2.7".into())),
            "{name}: {envs:?}"
        );
    }
}

/// What is wrong with a pod's DNS or name is said in its events, as upstream says it.
#[tokio::test]
async fn sandbox_config_problems_are_events() {
    // A ClusterFirst pod on a kubelet without clusterDNS: MissingClusterDNS, then the node's
    // resolv.conf; the sandbox is made.
    let h = harness();
    let p = pod(json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}));
    h.step(&p, t(0)).await;
    let lines = h.events.lines();
    assert!(
        lines.iter().any(|l| l.starts_with("MissingClusterDNS: ")
            && l.ends_with("Falling back to \"Default\" policy.")),
        "{lines:?}"
    );
    assert_eq!(h.rt.sandboxes().len(), 1);
    // Four nameservers: three kept, DNSConfigForming.
    let h = harness();
    let opts = ContainerOptions {
        sandbox: crate::pod::SandboxOptions {
            cluster_dns: ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        },
        ..Default::default()
    };
    h.step_with(&p, t(0), &opts).await;
    let lines = h.events.lines();
    assert!(
        lines.contains(&"DNSConfigForming: Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.0.0.1 10.0.0.2 10.0.0.3".to_string()),
        "{lines:?}"
    );
    // An FQDN longer than the kernel's 64 characters: no sandbox, FailedCreatePodSandBox.
    let h = harness();
    let long = pod(json!({"hostname": "a".repeat(50), "subdomain": "web",
        "setHostnameAsFQDN": true, "containers": [{"name": "app", "image": "busybox:1.36"}]}));
    let snapshot = runtime_pod_status(h.rt.as_ref(), "u-1")
        .await
        .expect("status");
    let who = PodRef::of(&long);
    let actions = compute_pod_actions(&long, &who, &snapshot.status, &h.m.backoff(), t(0));
    let opts = ContainerOptions::default();
    let sync = PodSync {
        pod: &long,
        who: &who,
        snapshot: &snapshot,
        actions: &actions,
        opts: &opts,
        now: t(0),
    };
    let err =
        h.m.sync_pod(&sync)
            .await
            .expect_err("no sandbox for that name");
    assert!(err.to_string().contains("FQDN"), "{err}");
    let lines = h.events.lines();
    assert!(
        lines.iter().any(|l| l.starts_with("FailedCreatePodSandBox: Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN aaaa")
            && l.ends_with("is too long (64 characters is the max, 77 characters requested)")),
        "{lines:?}"
    );
    assert!(h.rt.sandboxes().is_empty());
}
