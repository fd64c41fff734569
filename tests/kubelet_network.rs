//! The kubelet holds pods back while the runtime cannot run them, and starts them once it can:
//! pods on the pod network while the runtime reports its network not ready (upstream's "network
//! is not ready"; hostNetwork pods start regardless), and `hostUsers: false` pods while its
//! handler offers no user namespaces. Runs the kubelet in-process on the fake runtime,
//! standalone.

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

/// A kubelet running in-process, standalone, on `fake` with the given static pods; stopped
/// (and checked to have ended well) by [`Kubelet::stop`].
struct Kubelet {
    _dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<Result<(), kubelet::Error>>,
}

impl Kubelet {
    fn start(fake: &Arc<FakeRuntime>, pods: &[(&str, String)]) -> Kubelet {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).expect("mkdir");
        for (file, manifest) in pods {
            std::fs::write(manifests.join(file), manifest).expect("write");
        }
        let cfg = KubeletConfig {
            server: nodelet::config::ServerConfig::loopback_any_port(),
            // The fake runtime's node is not this machine: this machine's disk or memory
            // pressure must not make the eviction manager reclaim (remove) the fake's dead
            // containers under the tests.
            eviction_hard: Default::default(),
            static_pod_path: manifests,
            root_dir: dir.path().join("root"),
            pod_logs_dir: dir.path().join("logs"),
            node_name: "test-node".into(),
            node_ips: vec!["127.0.0.1".parse().expect("ip")],
            file_check_frequency: Duration::from_secs(1),
            // The fake runtime runs nothing: no cgroup tree on the machine for it.
            cgroups: nodelet::config::Cgroups {
                per_qos: false,
                enforce_node_allocatable: Vec::new(),
                ..Default::default()
            },
            ..Default::default()
        };
        fake.set_fake_images(&["docker.io/library/busybox:latest"]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = kubelet::Runtime {
            runtime: fake.clone(),
            images: fake.clone(),
        };
        let run = tokio::spawn(kubelet::run(cfg, rt, None, async move {
            let _ = stopped.await;
        }));
        Kubelet {
            _dir: dir,
            stop,
            run,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.run.await.expect("join").expect("kubelet run");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_the_pod_network_wait_for_the_runtimes_network() {
    let fake = Arc::new(FakeRuntime::new());
    fake.set_runtime_conditions(network(false));
    let kubelet = Kubelet::start(
        &fake,
        &[
            ("a.yaml", manifest("on-pod-net", false)),
            ("b.yaml", manifest("on-host-net", true)),
        ],
    );

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
    kubelet.stop().await;
}

/// `hostUsers: false` needs a runtime whose default handler offers user namespaces: until the
/// runtime says it does, the pod gets no sandbox (upstream refuses it too); then its sandbox
/// asks for the pod's own user namespace, a block of 65536 host IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_users_false_waits_for_a_runtime_with_user_namespaces() {
    let fake = Arc::new(FakeRuntime::new());
    let handler = |user_namespaces: bool| {
        vec![cri::RuntimeHandler {
            name: String::new(),
            features: Some(cri::RuntimeHandlerFeatures {
                recursive_read_only_mounts: false,
                user_namespaces,
            }),
        }]
    };
    fake.set_runtime_handlers(handler(false));
    let pod = manifest("no-host-users", false).replace("spec:\n", "spec:\n  hostUsers: false\n");
    let kubelet = Kubelet::start(&fake, &[("a.yaml", pod)]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !sandbox_of(&fake, "no-host-users"),
        "a hostUsers: false pod got a sandbox from a runtime without user namespaces"
    );
    fake.set_runtime_handlers(handler(true));
    let mut sandbox = None;
    for _ in 0..400 {
        sandbox = fake
            .sandboxes()
            .into_iter()
            .find(|s| s.metadata.name.starts_with("no-host-users"));
        if sandbox.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sandbox = sandbox.expect("the pod never started once the runtime offered user namespaces");
    let userns = sandbox
        .config
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .and_then(|o| o.userns_options)
        .expect("the sandbox asks for a user namespace");
    assert_eq!(userns.mode, cri::NamespaceMode::Pod as i32);
    let one = |host_id| {
        vec![cri::IdMapping {
            container_id: 0,
            host_id,
            length: 65536,
        }]
    };
    // The first block of the kubelet's range (65536 up, unless /etc/subuid says otherwise).
    let (first, _) = nodelet::kubelet::userns::kubelet_range(
        std::path::Path::new("/etc/subuid"),
        std::path::Path::new("/etc/subgid"),
    )
    .expect("range");
    assert_eq!((userns.uids, userns.gids), (one(first), one(first)));
    kubelet.stop().await;
}
