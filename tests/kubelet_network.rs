//! The kubelet holds pods on the pod network back while the runtime reports its network not
//! ready (upstream's "network is not ready"), and starts them once it is; hostNetwork pods
//! start regardless. Runs the kubelet in-process on the fake runtime, standalone.

use std::sync::Arc;
use std::time::Duration;

use nodelet::config::KubeletConfig;
use nodelet::kubelet;
use runtime::cri;
use runtime::fake::FakeRuntime;

fn manifest(name: &str, host_network: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: {host_network}\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"3600\"]\n"
    )
}

fn network(ready: bool) -> Vec<cri::RuntimeCondition> {
    let cond = |t: &str, ok: bool, msg: &str| cri::RuntimeCondition {
        r#type: t.into(),
        status: ok,
        reason: if ok { "" } else { "NetworkPluginNotReady" }.into(),
        message: msg.into(),
    };
    vec![
        cond("RuntimeReady", true, ""),
        cond(
            "NetworkReady",
            ready,
            if ready { "" } else { "the bridge is gone" },
        ),
    ]
}

fn sandbox_of(fake: &FakeRuntime, pod: &str) -> bool {
    fake.sandboxes()
        .iter()
        .any(|s| s.metadata.name.starts_with(pod))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_the_pod_network_wait_for_the_runtimes_network() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("mkdir");
    std::fs::write(manifests.join("a.yaml"), manifest("on-pod-net", false)).expect("write");
    std::fs::write(manifests.join("b.yaml"), manifest("on-host-net", true)).expect("write");
    let cfg = KubeletConfig {
        static_pod_path: manifests,
        root_dir: dir.path().join("root"),
        pod_logs_dir: dir.path().join("logs"),
        node_name: "net-node".into(),
        node_ip: Some("127.0.0.1".parse().expect("ip")),
        file_check_frequency: Duration::from_secs(1),
        ..Default::default()
    };
    let fake = Arc::new(FakeRuntime::new());
    fake.set_fake_images(&["docker.io/library/busybox:latest"]);
    fake.set_runtime_conditions(network(false));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let rt = kubelet::Runtime {
        runtime: fake.clone(),
        images: fake.clone(),
    };
    let run = tokio::spawn(kubelet::run(cfg, rt, None, async move {
        let _ = stopped.await;
    }));

    // The hostNetwork pod starts; the other one gets no sandbox while the network is down.
    let mut started = false;
    for _ in 0..100 {
        if sandbox_of(&fake, "on-host-net") {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started,
        "the hostNetwork pod never started: {:?}",
        fake.called()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !sandbox_of(&fake, "on-pod-net"),
        "a pod got a sandbox while the runtime's network was not ready"
    );

    // Once the runtime reports its network ready (seen within a check period), it starts.
    fake.set_runtime_conditions(network(true));
    let mut started = false;
    for _ in 0..400 {
        if sandbox_of(&fake, "on-pod-net") {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started, "the pod never started once the network was ready");
    let _ = stop.send(());
    run.await.expect("join").expect("kubelet run");
}
