//! The kubelet with an API server (the project's test API server) and the built-in runtime,
//! driving the real binary: pods bound to the node run and report Running and ready; init
//! containers run in order; a SIGKILLed kubelet adopts its pods without restarting them; a
//! deleted pod is stopped within its grace period and then deleted for good; a static pod (its
//! image only in the preload dir) gets a mirror pod that comes back when deleted; an invalid pod is reported and the others keep
//! running; with the API server away for a minute, pods keep running and their status catches
//! up afterwards.

mod apiserver;
mod common;

use std::path::Path;
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NODE: &str = "api-node";

const SETUP: Setup = Setup {
    name: NODE,
    config: "syncFrequency: 5s\nnodeLeaseDurationSeconds: 8\nnodeletTesting:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 2s\n",
    cri_listen: true,
};

/// A node ready to start, or `None` (with a SKIP line) when this machine cannot run it.
async fn prepare(api: &ApiServer, backend: Backend, test: &str) -> Option<ApiNode> {
    ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
}

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

fn ready(s: &PodStatus) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn container_id(s: &PodStatus, name: &str) -> Option<String> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)?
        .container_id
        .clone()
}

fn restarts(s: &PodStatus, name: &str) -> Option<i32> {
    Some(
        s.container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)?
            .restart_count,
    )
}

fn read_log(logs: &Path, pod: &str, container: &str) -> String {
    let Ok(dirs) = std::fs::read_dir(logs) else {
        return String::new();
    };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().to_string();
        if name.starts_with(&format!("default_{pod}_")) {
            return std::fs::read_to_string(d.path().join(container).join("0.log"))
                .unwrap_or_default();
        }
    }
    String::new()
}

#[tokio::test(flavor = "multi_thread")]
async fn api_pods_lifecycle_builtin() {
    api_pods_lifecycle(Backend::Builtin, "api_pods_lifecycle_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn api_pods_lifecycle_containerd() {
    api_pods_lifecycle(Backend::Containerd, "api_pods_lifecycle_containerd").await;
}

async fn api_pods_lifecycle(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // A static pod beside the API pods, whose image reached the node only through the preload
    // dir (on containerd: imported through containerd's own API).
    const PRELOADED: &str = "preload.local/site/app:v1";
    let preload = node.root.join("images-preload");
    std::fs::create_dir_all(&preload).unwrap();
    common::containerd::retagged_archive(
        &common::busybox_archive(),
        &preload.join("app.tar"),
        PRELOADED,
        &["sh"],
    );
    // Settled (a file written within the last 2 s waits for the next scan).
    std::fs::File::options()
        .write(true)
        .open(preload.join("app.tar"))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(10))
        .unwrap();
    std::fs::write(
        node.manifests.join("static.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\n  namespace: default\nspec:\n{}  terminationGracePeriodSeconds: 1\n  containers:\n{}",
            node.host_network(),
            busybox("main", "sleep 1000").replace("docker.io/library/busybox:latest", PRELOADED)
        ),
    )
    .unwrap();
    // What the main container writes on SIGTERM outlives the pod: its log directory is
    // collected as soon as the pod is gone.
    let web_out = node.root.join("web-out");
    std::fs::create_dir_all(&web_out).unwrap();
    let web_spec = format!(
        "  terminationGracePeriodSeconds: 20\n  initContainers:\n{}{}  containers:\n{}",
        busybox("init-a", "echo a >> /shared/order"),
        busybox("init-b", "echo b >> /shared/order"),
        busybox(
            "main",
            "cat /shared/order; trap 'echo got TERM; echo got TERM > /out/term; exit 0' TERM; while true; do sleep 0.1; done"
        )
    )
    .replace(
        "    command:",
        "    volumeMounts: [{name: shared, mountPath: /shared}, {name: out, mountPath: /out}]\n    command:",
    ) + &format!(
        "  volumes: [{{name: shared, emptyDir: {{}}}}, {{name: out, hostPath: {{path: {}}}}}]\n",
        web_out.display()
    );
    let web = node.pod("web", &web_spec);
    pods.create(&PostParams::default(), &web).await.unwrap();
    // Admission: a pod for another OS is rejected with the upstream reason, never run.
    let windows = node.pod(
        "windows",
        &format!(
            "  nodeSelector: {{kubernetes.io/os: windows}}\n  containers:\n{}",
            busybox("main", "sleep 1000")
        ),
    );
    pods.create(&PostParams::default(), &windows).await.unwrap();
    let bad = node.pod(
        "bad",
        "  containers:\n  - name: main\n    image: docker.io/library/no-such-image:1\n    imagePullPolicy: Never\n",
    );
    pods.create(&PostParams::default(), &bad).await.unwrap();

    std::fs::write(
        node.manifests.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [oops\n",
    )
    .unwrap();
    let mut agent = node.start();

    // The broken manifest is reported as a Warning event about the node.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let ev = wait_for(
        "a Warning event about the broken manifest",
        60,
        async || {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("broken.yaml"))
            })
        },
    )
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(ev.involved_object.name.as_deref(), Some(NODE));

    // The node is registered, Ready, and its Lease is renewed. On a containerd without a CNI
    // network the node is NotReady for the network, as upstream reports it (hostNetwork pods
    // still run).
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let want_ready = node.has_pod_network();
    let n = wait_for("node registered with its Ready condition", 60, async || {
        let n = nodes.get_opt(NODE).await.ok().flatten()?;
        let ready = n.status.as_ref()?.conditions.iter().flatten().any(|c| {
            c.type_ == "Ready"
                && if want_ready {
                    c.status == "True" && c.reason.as_deref() == Some("KubeletReady")
                } else {
                    c.status == "False"
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("NetworkReady=false"))
                }
        });
        ready.then_some(n)
    })
    .await;
    let info = n.status.as_ref().unwrap().node_info.clone().unwrap();
    let runtime_name = match backend {
        Backend::Builtin => "nodelet://",
        Backend::Containerd => "containerd://",
    };
    assert!(
        info.container_runtime_version.starts_with(runtime_name),
        "{info:?}"
    );
    assert_eq!(
        n.metadata.labels.as_ref().unwrap()["kubernetes.io/hostname"],
        NODE
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    let first = wait_for("lease", 30, async || {
        leases.get_opt(NODE).await.ok().flatten()?.spec?.renew_time
    })
    .await;
    wait_for("lease renewed", 30, async || {
        let t = leases
            .get_opt(NODE)
            .await
            .ok()
            .flatten()?
            .spec?
            .renew_time?;
        (t != first).then_some(())
    })
    .await;

    let st = wait_for("windows pod rejected", 30, async || {
        status(&pods, "windows")
            .await
            .filter(|s| s.phase.as_deref() == Some("Failed"))
    })
    .await;
    assert_eq!(st.reason.as_deref(), Some("NodeAffinity"));
    assert!(
        st.message
            .as_deref()
            .unwrap()
            .starts_with("Pod was rejected: ")
    );

    // web: init containers in order, then Running and Ready, written to pods/status.
    let st = wait_for("web running and ready", 90, async || {
        status(&pods, "web").await.filter(ready)
    })
    .await;
    assert_eq!(st.phase.as_deref(), Some("Running"));
    let inits = st.init_container_statuses.clone().unwrap();
    assert_eq!(inits.len(), 2);
    for c in &inits {
        let t = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    }
    assert!(st.host_ip.is_some());
    // On containerd's pod network, the pod IP the kubelet reports is from its private /24.
    if let Some(net) = node.containerd.as_ref().and_then(|c| c.pod_network()) {
        let ip = st.pod_ip.as_deref().and_then(|ip| ip.parse().ok());
        assert!(
            ip.is_some_and(|ip| net.contains(ip) && ip != net.gateway),
            "web's podIP {:?} is in {}/24",
            st.pod_ip,
            net.subnet
        );
    }
    let main_id = container_id(&st, "main").unwrap();
    let out = wait_for("web main log", 20, async || {
        Some(read_log(&node.logs, "web", "main")).filter(|l| l.contains(" b"))
    })
    .await;
    let order: Vec<&str> = out.lines().filter_map(|l| l.split(' ').nth(3)).collect();
    assert_eq!(order, ["a", "b"], "init containers ran in order: {out}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/default/pods/web/status")),
        "status was patched through the status subresource"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/pods?")
                && r.contains("sendInitialEvents=true")
                && r.contains("fieldSelector=spec.nodeName%3Dapi-node")),
        "the pod source streams its initial list of the node's pods: {:?}",
        api.requests()
    );

    // The agent serves its runtime over CRI for crictl: the same containers are seen there.
    let cri = runtime::remote::connect(
        &format!("unix://{}", node.cri_socket().display()),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let listed = runtime::RuntimeService::list_containers(
        &cri,
        runtime::cri::ListContainersRequest { filter: None },
    )
    .await
    .unwrap();
    assert!(
        listed.containers.iter().any(|c| main_id.ends_with(&c.id)),
        "the CRI socket lists web's main container {main_id}"
    );

    // bad: reported as waiting with a reason; web unaffected.
    let bad_st = wait_for("bad pod reports its error", 60, async || {
        status(&pods, "bad").await.filter(|s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    .is_some_and(|r| r == "ErrImageNeverPull")
            })
        })
    })
    .await;
    assert_eq!(bad_st.phase.as_deref(), Some("Pending"));

    // The static pod has a mirror pod with its status; deleting the mirror brings it back
    // without restarting the static pod.
    let mirror = wait_for("mirror pod running", 60, async || {
        let m = pods.get_opt("static-api-node").await.ok().flatten()?;
        let st = m.status.clone()?;
        (st.phase.as_deref() == Some("Running")).then_some(m)
    })
    .await;
    let ann = mirror.metadata.annotations.clone().unwrap();
    assert!(ann.contains_key("kubernetes.io/config.mirror"));
    let static_id = container_id(mirror.status.as_ref().unwrap(), "main").unwrap();
    pods.delete("static-api-node", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let again = wait_for("mirror pod recreated", 60, async || {
        let m = pods.get_opt("static-api-node").await.ok().flatten()?;
        (m.metadata.uid != mirror.metadata.uid).then_some(m)
    })
    .await;
    assert!(again.metadata.uid.is_some());
    let st = wait_for("recreated mirror has status", 60, async || {
        status(&pods, "static-api-node")
            .await
            .filter(|s| container_id(s, "main").is_some())
    })
    .await;
    assert_eq!(
        container_id(&st, "main").unwrap(),
        static_id,
        "static pod kept running"
    );

    // SIGKILL the kubelet and start it again: the pods are adopted, nothing restarts.
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    drop(agent);
    let agent = node.start();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let st = status(&pods, "web").await.unwrap();
    assert!(ready(&st));
    assert_eq!(container_id(&st, "main").unwrap(), main_id);
    assert_eq!(restarts(&st, "main"), Some(0));

    // Graceful deletion: the container gets SIGTERM, the kubelet deletes the pod object.
    pods.delete("web", &DeleteParams::default().grace_period(10))
        .await
        .unwrap();
    wait_for("web deleted from the API", 60, async || {
        pods.get_opt("web")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    let out = std::fs::read_to_string(web_out.join("term")).unwrap_or_default();
    assert!(out.contains("got TERM"), "graceful stop: {out:?}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("DELETE /api/v1/namespaces/default/pods/web")),
    );
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_outage_builtin() {
    api_server_outage(Backend::Builtin, "api_server_outage_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_outage_containerd() {
    api_server_outage(Backend::Containerd, "api_server_outage_containerd").await;
}

async fn api_server_outage(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let steady = node.pod(
        "steady",
        &format!("  containers:\n{}", busybox("main", "sleep 1000")),
    );
    let finisher = node.pod(
        "finisher",
        &format!(
            "  restartPolicy: Never\n  containers:\n{}",
            busybox("main", "sleep 20; exit 3")
        ),
    );
    pods.create(&PostParams::default(), &steady).await.unwrap();
    let _agent = node.start();
    let st = wait_for("steady running", 90, async || {
        status(&pods, "steady").await.filter(ready)
    })
    .await;
    let steady_id = container_id(&st, "main").unwrap();
    pods.create(&PostParams::default(), &finisher)
        .await
        .unwrap();
    wait_for("finisher running", 60, async || {
        status(&pods, "finisher")
            .await
            .filter(|s| s.phase.as_deref() == Some("Running"))
    })
    .await;

    // The API server goes away for a minute; the finisher exits meanwhile. Its watch history
    // is compacted too, so the pod source's resumed watch gets 410 Gone and must list again.
    api.stop().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    api.compact();
    let requests_before = api.requests().len();
    api.restart().await;

    let st = wait_for("finisher's status caught up", 60, async || {
        status(&pods, "finisher")
            .await
            .filter(|s| s.phase.as_deref() == Some("Failed"))
    })
    .await;
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(term.exit_code, 3);
    let st = status(&pods, "steady").await.unwrap();
    assert!(ready(&st));
    assert_eq!(container_id(&st, "main").unwrap(), steady_id, "no restart");
    assert_eq!(restarts(&st, "main"), Some(0));

    // After the 410 the source lists again and sees new pods.
    let late = node.pod(
        "late",
        &format!("  containers:\n{}", busybox("main", "sleep 1000")),
    );
    pods.create(&PostParams::default(), &late).await.unwrap();
    wait_for("a pod created after the outage runs", 60, async || {
        status(&pods, "late").await.filter(ready)
    })
    .await;
    let relisted = api.requests()[requests_before..]
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/pods?") && r.contains("spec.nodeName"))
        .count();
    assert!(
        relisted >= 1,
        "the pod source watched again after the outage"
    );
}
