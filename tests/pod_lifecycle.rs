//! The kubelet's real sync loop, pod workers, PLEG and pod cache against the fake runtime, in
//! paused tokio time (so minutes of back-off pass at once, and every delay is counted exactly on
//! the virtual clock): CrashLoopBackOff delays and their waiting reasons, ImagePullBackOff, pods
//! syncing concurrently while one image pull hangs, sidecars' start and termination order, and
//! app containers stopped at once within one grace period. No root needed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use nodelet::config::KubeletConfig;
use nodelet::kubelet::{self, Kubelet};
use runtime::cri;
use runtime::fake::FakeRuntime;
use tokio::time::Instant;

const BUSYBOX: &str = "docker.io/library/busybox:latest";

struct Node {
    _dir: tempfile::TempDir,
    manifests: std::path::PathBuf,
    kubelet: Option<Kubelet>,
    fake: Arc<FakeRuntime>,
}

impl Node {
    async fn start(pods: &[(&str, String)]) -> Node {
        let fake = Arc::new(FakeRuntime::new());
        fake.set_fake_images(&[BUSYBOX]);
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).expect("mkdir");
        for (file, manifest) in pods {
            std::fs::write(manifests.join(file), manifest).expect("write");
        }
        let cfg = KubeletConfig {
            server: nodelet::config::ServerConfig::loopback_any_port(),
            static_pod_path: manifests.clone(),
            root_dir: dir.path().join("root"),
            pod_logs_dir: dir.path().join("logs"),
            node_name: "n1".into(),
            node_ips: vec!["127.0.0.1".parse().expect("ip")],
            file_check_frequency: Duration::from_secs(1),
            // The default resync: back-off must not wait for it.
            sync_frequency: Duration::from_secs(60),
            // The fake runtime's node is not this machine: this machine's disk or memory
            // pressure must not make the eviction manager reclaim (remove) the fake's dead
            // containers under the tests.
            eviction_hard: Default::default(),
            // The fake runtime runs nothing: no cgroup tree on the machine for it.
            cgroups: nodelet::config::Cgroups {
                per_qos: false,
                enforce_node_allocatable: Vec::new(),
                ..Default::default()
            },
            ..Default::default()
        };
        let rt = kubelet::Runtime {
            runtime: fake.clone(),
            images: fake.clone(),
        };
        let kubelet = Kubelet::start(cfg, rt, None).await.expect("kubelet");
        Node {
            _dir: dir,
            manifests,
            kubelet: Some(kubelet),
            fake,
        }
    }

    fn kubelet(&self) -> &Kubelet {
        self.kubelet.as_ref().expect("running")
    }

    fn uid_of(&self, pod: &str) -> Option<String> {
        self.fake
            .sandboxes()
            .iter()
            .find(|s| s.metadata.name == format!("{pod}-n1"))
            .map(|s| s.metadata.uid.clone())
    }

    fn status(&self, pod: &str) -> Option<PodStatus> {
        self.kubelet().pod_status(&self.uid_of(pod)?)
    }

    /// The newest container named `name` of `pod`, if its state is `state`.
    fn container(&self, pod: &str, name: &str, state: cri::ContainerState) -> Option<String> {
        let sandboxes: Vec<String> = self
            .fake
            .sandboxes()
            .iter()
            .filter(|s| s.metadata.name == format!("{pod}-n1"))
            .map(|s| s.id.clone())
            .collect();
        self.fake
            .containers()
            .into_iter()
            .filter(|c| sandboxes.contains(&c.pod_sandbox_id) && c.metadata.name == name)
            .max_by_key(|c| (c.created_at, c.metadata.attempt))
            .filter(|c| c.state == state)
            .map(|c| c.id)
    }

    async fn stop(mut self) {
        if let Some(k) = self.kubelet.take() {
            k.stop().await;
        }
    }
}

/// Waits (virtual time, in 10 ms steps, at most `limit`) for `f` to give something.
async fn wait_for<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(what, limit, f, String::new).await
}

/// [`wait_for`], saying what `seen` tells when it times out.
async fn wait_for_or<T>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Option<T>,
    seen: impl Fn() -> String,
) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what} {}",
            seen()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn manifest(name: &str, body: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{body}"
    )
}

fn app(image: &str) -> String {
    format!("  containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: IfNotPresent\n")
}

fn app_status(st: &PodStatus) -> Option<ContainerStatus> {
    st.container_statuses.as_ref()?.first().cloned()
}

/// Exactly one of waiting, running and terminated.
fn one_state(c: &ContainerStatus) -> bool {
    let s = c.state.clone().unwrap_or_default();
    [
        s.waiting.is_some(),
        s.running.is_some(),
        s.terminated.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count()
        == 1
}

#[tokio::test(start_paused = true)]
async fn crash_loop_back_off_doubles_to_the_cap_and_restarts_at_expiry() {
    let node = Node::start(&[("crash.yaml", manifest("crash", &app(BUSYBOX)))]).await;
    let running = cri::ContainerState::ContainerRunning;
    let mut delays = Vec::new();
    let mut exited_at = None;
    for round in 0..9 {
        let id = wait_for("the app running", Duration::from_secs(400), || {
            node.container("crash", "app", running)
        })
        .await;
        if let Some(t) = exited_at {
            delays.push(Instant::now().duration_since(t));
        }
        if round >= 2 {
            // While it waited, the status said why, as upstream.
            let st = node.status("crash").expect("status");
            let c = app_status(&st).expect("app status");
            assert!(one_state(&c), "{c:?}");
        }
        node.fake
            .set_container_exited(&id, 1, "Error")
            .expect("exit");
        exited_at = Some(Instant::now());
        if round == 3 {
            // Third restart pending: 40 s back-off; the status shows it with the message.
            let uid = node.uid_of("crash").expect("uid");
            let want =
                format!("back-off 40s restarting failed container=app pod=crash-n1_default({uid})");
            let seen = std::cell::RefCell::new(None);
            let c = wait_for_or(
                "CrashLoopBackOff",
                Duration::from_secs(5),
                || {
                    let c = app_status(&node.status("crash")?)?;
                    *seen.borrow_mut() = Some(c.clone());
                    let w = c.state.as_ref()?.waiting.as_ref()?;
                    (w.reason.as_deref() == Some("CrashLoopBackOff")
                        && w.message.as_deref() == Some(want.as_str()))
                    .then_some(c)
                },
                || {
                    format!(
                        "the app's last status: {:?}; the last runtime calls: {:?}; containers: {:?}",
                        seen.borrow(),
                        node.fake.called().iter().rev().take(30).collect::<Vec<_>>(),
                        node.fake.containers()
                    )
                },
            )
            .await;
            assert!(one_state(&c), "{c:?}");
            let last = c.last_state.and_then(|l| l.terminated).expect("lastState");
            assert_eq!(last.exit_code, 1);
            assert_eq!(c.restart_count, 3);
        }
    }
    let secs: Vec<u64> = delays.iter().map(|d| d.as_secs()).collect();
    // The first restart at once, then 10 s doubling to the 300 s cap, each at its expiry
    // (well before the 60 s resync for the short ones).
    assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300], "{delays:?}");
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn image_pull_failures_back_off_with_their_reasons() {
    let node = Node::start(&[]).await;
    for _ in 0..3 {
        node.fake.inject_error(
            "PullImage",
            runtime::Error::not_found("manifest unknown: registry.local/missing:1"),
        );
    }
    std::fs::write(
        node.manifests.join("pull.yaml"),
        manifest("pull", &app("registry.local/missing:1")),
    )
    .expect("write");
    let reason = |node: &Node| {
        let c = app_status(&node.status("pull")?)?;
        let w = c.state?.waiting?;
        Some((w.reason?, w.message.unwrap_or_default()))
    };
    // The failed pull's reason, or (a sync later, which may come at once) the back-off's.
    let (r, m) = wait_for("a pull failure", Duration::from_secs(5), || {
        reason(&node).filter(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
    })
    .await;
    if r == "ErrImagePull" {
        assert!(m.contains("manifest unknown"), "{m}");
    }
    let (_, m) = wait_for("ImagePullBackOff", Duration::from_secs(5), || {
        reason(&node).filter(|(r, _)| r == "ImagePullBackOff")
    })
    .await;
    assert_eq!(m, "Back-off pulling image \"registry.local/missing:1\"");
    // Pulls are tried again only when their back-off ends: 10 s, then 20 s.
    let pulls = |node: &Node| {
        node.fake
            .called()
            .iter()
            .filter(|c| *c == "PullImage")
            .count()
    };
    let first = wait_for("a third pull", Duration::from_secs(60), || {
        (pulls(&node) >= 3).then(Instant::now)
    })
    .await;
    assert_eq!(pulls(&node), 3);
    // The fourth pull succeeds and the pod runs.
    wait_for("the pod running", Duration::from_secs(120), || {
        node.container("pull", "app", cri::ContainerState::ContainerRunning)
    })
    .await;
    assert!(Instant::now().duration_since(first) >= Duration::from_secs(40));
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn fifty_pods_run_while_one_pull_hangs() {
    let mut pods = vec![(
        "slow.yaml".to_string(),
        manifest("slow", &app("registry.local/slow:1")),
    )];
    for i in 0..50 {
        pods.push((
            format!("p{i}.yaml"),
            manifest(&format!("p{i}"), &app(BUSYBOX)),
        ));
    }
    let fake_pods: Vec<(&str, String)> =
        pods.iter().map(|(f, m)| (f.as_str(), m.clone())).collect();
    // The slow pull is held from the start; pulls are serialised (the default) but pods whose
    // image is present never wait for it.
    let node = {
        let n = Node::start(&[]).await;
        n.fake.hold_pulls("registry.local/slow:1");
        for (file, m) in &fake_pods {
            std::fs::write(n.manifests.join(file), m).expect("write");
        }
        n
    };
    wait_for("50 pods running", Duration::from_secs(30), || {
        let running = (0..50)
            .filter(|i| {
                node.status(&format!("p{i}"))
                    .is_some_and(|s| s.phase.as_deref() == Some("Running"))
            })
            .count();
        (running == 50).then_some(())
    })
    .await;
    let slow = node.status("slow").expect("slow status");
    assert_eq!(slow.phase.as_deref(), Some("Pending"));
    assert!(
        node.container("slow", "app", cri::ContainerState::ContainerRunning)
            .is_none()
    );
    node.fake.release_pulls("registry.local/slow:1");
    wait_for("the slow pod running", Duration::from_secs(30), || {
        node.container("slow", "app", cri::ContainerState::ContainerRunning)
    })
    .await;
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn sidecars_start_first_and_stop_last_and_apps_stop_together() {
    let body = format!(
        "  terminationGracePeriodSeconds: 30\n  initContainers:\n  - name: side1\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    restartPolicy: Always\n  - name: init\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n  - name: side2\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    restartPolicy: Always\n  containers:\n  - name: a\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n  - name: b\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n"
    );
    let node = Node::start(&[("web.yaml", manifest("web", &body))]).await;
    let running = cri::ContainerState::ContainerRunning;
    let init = wait_for("init running", Duration::from_secs(10), || {
        node.container("web", "init", running)
    })
    .await;
    // side1 runs before init; side2 and the apps wait for init to complete.
    assert!(node.container("web", "side1", running).is_some());
    assert!(node.container("web", "side2", running).is_none());
    assert!(node.container("web", "a", running).is_none());
    node.fake
        .set_container_exited(&init, 0, "Completed")
        .expect("exit");
    wait_for("the apps running", Duration::from_secs(10), || {
        node.container("web", "a", running)
            .and(node.container("web", "b", running))
    })
    .await;
    let order: Vec<String> = node
        .fake
        .containers()
        .iter()
        .map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(order, ["side1", "init", "side2", "a", "b"]);
    let st = node.status("web").expect("status");
    let side = st.init_container_statuses.clone().expect("init statuses");
    wait_for("Ready", Duration::from_secs(10), || {
        let st = node.status("web")?;
        st.conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    assert_eq!(side.len(), 3);

    // A sidecar that exits is restarted although it "completed".
    let s1 = node.container("web", "side1", running).expect("side1");
    node.fake
        .set_container_exited(&s1, 0, "Completed")
        .expect("exit");
    wait_for("side1 restarted", Duration::from_secs(5), || {
        node.container("web", "side1", running)
            .filter(|id| *id != s1)
    })
    .await;

    // Termination: each stop takes 5 s; the apps are stopped together, then side2, then side1.
    // The containers' names are taken now: once the pod has terminated, housekeeping's garbage
    // collection may remove its containers before the stops are looked at.
    let names: std::collections::HashMap<String, String> = node
        .fake
        .containers()
        .into_iter()
        .map(|c| (c.id, c.metadata.name))
        .collect();
    node.fake.set_stop_delay(Duration::from_secs(5));
    std::fs::remove_file(node.manifests.join("web.yaml")).expect("rm");
    wait_for("everything stopped", Duration::from_secs(60), || {
        (node.fake.stops().len() == 4).then_some(())
    })
    .await;
    let stops = node.fake.stops();
    let name = |id: &str| names.get(id).cloned().unwrap_or_default();
    let by_name = |n: &str| {
        stops
            .iter()
            .find(|(id, _, _)| name(id) == n)
            .map(|(_, b, e)| (*b, *e))
            .unwrap_or_else(|| panic!("{n} was not stopped: {stops:?}"))
    };
    let (a, b, s2, s1) = (
        by_name("a"),
        by_name("b"),
        by_name("side2"),
        by_name("side1"),
    );
    // a and b overlap: stopped concurrently.
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "apps stopped one after another: {a:?} {b:?}"
    );
    // side2 after both apps, side1 after side2.
    assert!(s2.0 >= a.1 && s2.0 >= b.1, "side2 before the apps ended");
    assert!(s1.0 >= s2.1, "side1 before side2 ended");
    node.stop().await;
}
