//! The kubelet in standalone mode with the built-in runtime, driving the real binary: static
//! pods from a manifest directory are started, survive a SIGKILL of the kubelet (adopted, not
//! restarted), are replaced when their manifest changes, restarted per restartPolicy with
//! CrashLoopBackOff, stopped and removed when their manifest goes; a broken manifest beside
//! good ones is skipped without disturbing them; volumes needing an API server fail without
//! harming the others; reservations over the node's capacity stop the agent at start.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{RuntimeService, cri};

fn manifest(name: &str, policy: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// (pod name label, container id, state, attempt) of every container, read afresh from disk.
async fn containers(root: &Path) -> Vec<(String, String, i32, u32)> {
    let rt = BuiltinRuntime::new(config(root, "/nodelet-e2e-unused"))
        .await
        .expect("open runtime");
    let list = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("list");
    list.containers
        .into_iter()
        .map(|c| {
            (
                c.labels
                    .get("io.kubernetes.pod.name")
                    .cloned()
                    .unwrap_or_default(),
                c.id,
                c.state,
                c.metadata.map(|m| m.attempt).unwrap_or(0),
            )
        })
        .collect()
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn running(list: &[(String, String, i32, u32)], pod: &str) -> Option<String> {
    list.iter()
        .find(|c| c.0 == pod && c.2 == cri::ContainerState::ContainerRunning as i32)
        .map(|c| c.1.clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn static_pods_lifecycle() {
    if !root_or_skip("static_pods_lifecycle") {
        return;
    }
    let node = standalone::Standalone::new(
        "nodeletTesting:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 2s\n",
    );
    let (root, manifests, logs) = (&node.root, &node.manifests, &node.logs);
    std::fs::write(
        manifests.join("ticker.yaml"),
        manifest(
            "ticker",
            "Always",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done",
        ),
    )
    .unwrap();
    std::fs::write(
        manifests.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [oops\n",
    )
    .unwrap();
    std::fs::write(
        manifests.join("crasher.yaml"),
        manifest("crasher", "Always", "echo run; exit 1"),
    )
    .unwrap();
    let mut agent = node.start();

    let ticker = wait_for("ticker running", async || {
        running(&containers(root).await, "ticker-e2e-node")
    })
    .await;
    // Logs live where the upstream kubelet puts them.
    let pod_dirs: Vec<PathBuf> = std::fs::read_dir(logs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let ticker_log_dir = pod_dirs
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("default_ticker-e2e-node_")
        })
        .expect("pod log dir <ns>_<name>_<uid>");
    assert!(ticker_log_dir.join("main/0.log").exists());

    // restartPolicy Always: the crasher is restarted (attempt 1 and more), with back-off.
    wait_for("crasher restarted", async || {
        containers(root)
            .await
            .iter()
            .any(|c| c.0 == "crasher-e2e-node" && c.3 >= 1)
            .then_some(())
    })
    .await;

    // SIGKILL the kubelet and start it again: the ticker is adopted, not restarted.
    agent.0.kill().unwrap();
    let _ = agent.0.wait();
    drop(agent);
    let agent = node.start();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let list = containers(root).await;
    assert_eq!(
        running(&list, "ticker-e2e-node"),
        Some(ticker.clone()),
        "same container after the restart"
    );
    assert_eq!(
        list.iter().filter(|c| c.0 == "ticker-e2e-node").count(),
        1,
        "no second ticker container"
    );

    // Editing the manifest replaces the pod.
    std::fs::write(
        manifests.join("ticker.yaml"),
        manifest(
            "ticker",
            "Always",
            "while true; do echo edited; sleep 0.2; done",
        ),
    )
    .unwrap();
    let edited = wait_for("edited ticker running", async || {
        running(&containers(root).await, "ticker-e2e-node").filter(|id| *id != ticker)
    })
    .await;
    assert_ne!(edited, ticker);

    // Deleting the manifest stops and removes the pod; the crasher is untouched by it.
    std::fs::remove_file(manifests.join("ticker.yaml")).unwrap();
    wait_for("ticker removed", async || {
        (!containers(root)
            .await
            .iter()
            .any(|c| c.0 == "ticker-e2e-node"))
        .then_some(())
    })
    .await;
    assert!(
        containers(root)
            .await
            .iter()
            .any(|c| c.0 == "crasher-e2e-node")
    );
    std::fs::remove_file(manifests.join("crasher.yaml")).unwrap();
    wait_for("crasher removed", async || {
        containers(root).await.is_empty().then_some(())
    })
    .await;
    // The sandboxes go after their containers, on a later pass of the garbage collection.
    node.wait_all_removed().await;
    drop(agent);
    node.assert_all_gone().await;
}

/// Without an API server, configMap and service-account-token volumes cannot be set up: their
/// pods get nothing created (the reason is a FailedMount event in the kubelet's log) while a pod
/// with a downwardAPI volume and a memory-backed emptyDir runs beside them, and the kubelet
/// keeps running; removed, they leave no mount behind.
#[tokio::test(flavor = "multi_thread")]
async fn standalone_volumes_without_an_api_server() {
    if !root_or_skip("standalone_volumes_without_an_api_server") {
        return;
    }
    let node = common::standalone::Standalone::new("");
    let pod = |name: &str, volume: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  serviceAccountName: default\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts: [{{name: v, mountPath: /v}}, {{name: ram, mountPath: /ram}}]\n  volumes:\n  - {{name: ram, emptyDir: {{medium: Memory}}}}\n  - name: v\n{volume}"
        )
    };
    let manifests = [
        (
            "info",
            pod(
                "info",
                "    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}\n",
                "sleep 3600",
            ),
        ),
        (
            "cfg",
            pod("cfg", "    configMap: {name: settings}\n", "sleep 3600"),
        ),
        (
            "tok",
            pod(
                "tok",
                "    projected: {sources: [{serviceAccountToken: {path: token}}]}\n",
                "sleep 3600",
            ),
        ),
    ];
    for (name, text) in &manifests {
        std::fs::write(node.manifests.join(format!("{name}.yaml")), text).expect("a manifest");
    }
    let mut agent = node.start();
    let id = wait_for("the downwardAPI pod running", async || {
        running(&containers(&node.root).await, "info-e2e-node")
    })
    .await;
    let rt = node.runtime().await;
    let out = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id,
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "cat /v/labels; echo; awk '$2 == \"/ram\" {print $3}' /proc/mounts".into(),
            ],
            timeout: 10,
        })
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "app=\"info\"\ntmpfs\n"
    );
    // The others were tried (every sync) and got nothing; the kubelet still runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sandboxes = node
        .runtime()
        .await
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("list sandboxes");
    let names: Vec<String> = sandboxes
        .items
        .iter()
        .filter_map(|s| s.metadata.as_ref().map(|m| m.name.clone()))
        .collect();
    assert_eq!(names, ["info-e2e-node"]);
    assert!(
        agent.0.try_wait().expect("the agent's state").is_none(),
        "the kubelet keeps running"
    );
    for (name, _) in &manifests {
        std::fs::remove_file(node.manifests.join(format!("{name}.yaml"))).expect("removing");
    }
    node.wait_all_removed().await;
    // The memory-backed emptyDir's tmpfs is unmounted once the pod is gone.
    wait_for("no mount left under the pods dir", async || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let pods = node.root.join("pods").display().to_string();
        (!info.contains(&pods)).then_some(())
    })
    .await;
    drop(agent);
    node.assert_all_gone().await;
}

/// `kubeReserved` and `systemReserved` over the node's capacity stop the agent at start with
/// upstream's message, before it runs anything.
#[test]
fn reservations_over_capacity_stop_the_agent_at_start() {
    if !root_or_skip("reservations_over_capacity_stop_the_agent_at_start") {
        return;
    }
    let node = standalone::Standalone::new(
        "kubeReserved: {memory: 1Ei}\nsystemReserved: {cpu: '100000'}\n",
    );
    let child = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(&node.root)
        .args(["run-node", "--hostname-override", "e2e-node", "--config"])
        .arg(&node.config_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nodelet run-node");
    let mut child = KillOnDrop(child);
    let mut status = None;
    for _ in 0..600 {
        status = child.0.try_wait().expect("waiting for nodelet");
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = status.expect("the agent should stop at start, not run");
    let mut stderr = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("reading stderr");
    }
    assert!(!status.success(), "{stderr}");
    for want in [
        "invalid Node Allocatable configuration.",
        "Resource \"cpu\" has a reservation of 100000 but capacity of",
        "Resource \"memory\" has a reservation of",
        "Expected capacity >= reservation.",
    ] {
        assert!(stderr.contains(want), "{want:?} not in {stderr}");
    }
}
