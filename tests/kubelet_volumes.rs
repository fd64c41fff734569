//! The kubelet's volumes end to end, driving the real binary (`nodelet run-node`) against the
//! project's test API server on the built-in runtime (the set-up is the kubelet's, before any
//! runtime call):
//!
//! - a pod with an emptyDir runs, its container writing into the directory the kubelet made;
//! - a pod with a persistentVolumeClaim volume (a type nodelet does not support yet) and a pod
//!   with a hostPath `type: File` naming a missing path stay Pending, their containers waiting in
//!   `ContainerCreating`, with a Warning `FailedMount` event naming the volume and the reason
//!   (one Event object counted up as the worker retries); nothing of them is created in the
//!   runtime and nothing is created at the missing path; deleted, such a pod goes.
//!
//! Needs root (real containers); skips loudly otherwise.

mod apiserver;
mod common;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, wait_for};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod, PodStatus};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NODE: &str = "volumes-node";

const SETUP: Setup = Setup {
    name: NODE,
    config: "syncFrequency: 2s\n",
    cri_listen: false,
};

/// A busybox container running `script` with `mounts` (a YAML flow list).
fn container(script: &str, mounts: &str) -> String {
    format!(
        "  containers:\n  - name: app\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts: {mounts}\n"
    )
}

fn app(st: &PodStatus) -> Option<&ContainerStatus> {
    st.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "app")
}

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

/// The pod's `FailedMount` event once the worker has retried (counted twice or more).
async fn failed_mount(events: &Api<Event>, uid: &str) -> Event {
    wait_for(
        &format!("a repeated FailedMount event of {uid}"),
        60,
        async || {
            let items = events.list(&Default::default()).await.ok()?.items;
            let of_pod: Vec<Event> = items
                .into_iter()
                .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
                .filter(|e| e.reason.as_deref() == Some("FailedMount"))
                .collect();
            assert!(
                of_pod.len() <= 1,
                "repeats of one FailedMount are one Event object: {of_pod:#?}"
            );
            of_pod.into_iter().find(|e| e.count.unwrap_or(0) >= 2)
        },
    )
    .await
}

/// Checks that the pod waits in ContainerCreating and has nothing in the runtime.
async fn assert_waiting_with_nothing_created(
    node: &ApiNode,
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
) {
    let st = wait_for(
        &format!("{name} waiting in ContainerCreating"),
        30,
        async || {
            let st = status(pods, name).await?;
            let waiting = app(&st)?.state.as_ref()?.waiting.as_ref()?;
            (waiting.reason.as_deref() == Some("ContainerCreating")).then_some(st)
        },
    )
    .await;
    assert_eq!(st.phase.as_deref(), Some("Pending"), "{st:?}");
    let app = app(&st).expect("app's status");
    assert!(!app.ready && app.started != Some(true), "{app:?}");
    assert_eq!(app.restart_count, 0);
    assert!(app.container_id.is_none(), "{app:?}");
    assert_eq!(node.sandboxes_of(uid).await, Vec::<String>::new());
    assert_eq!(node.containers_of(uid).await, []);
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_and_failed_volumes_keep_the_pod_waiting() {
    let test = "unsupported_and_failed_volumes_keep_the_pod_waiting";
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let host = tempfile::tempdir().expect("a host dir");
    let missing = host.path().join("missing.conf");
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let specs = [
        (
            "runs",
            format!(
                "{}  volumes: [{{name: scratch, emptyDir: {{}}}}]\n",
                container(
                    "echo hi > /scratch/hi; sleep 3600",
                    "[{name: scratch, mountPath: /scratch}]"
                )
            ),
        ),
        (
            "cfg",
            format!(
                "{}  volumes: [{{name: settings, persistentVolumeClaim: {{claimName: app-settings}}}}]\n",
                container("sleep 3600", "[{name: settings, mountPath: /etc/app}]")
            ),
        ),
        (
            "file",
            format!(
                "{}  volumes: [{{name: conf, hostPath: {{path: {}, type: File}}}}]\n",
                container("sleep 3600", "[{name: conf, mountPath: /etc/app.conf}]"),
                missing.display()
            ),
        ),
    ];
    let mut uids = Vec::new();
    for (name, spec) in &specs {
        let created = pods
            .create(&PostParams::default(), &node.pod(name, spec))
            .await
            .expect("creating a pod");
        uids.push(created.metadata.uid.clone().expect("a uid"));
    }
    let agent = node.start();

    // The emptyDir pod runs, and wrote into the directory the kubelet made for it.
    wait_for("runs running", 120, async || {
        let st = status(&pods, "runs").await?;
        app(&st)?.state.as_ref()?.running.as_ref()?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let scratch = node
        .pod_dir(&uids[0])
        .join("volumes/kubernetes.io~empty-dir/scratch");
    wait_for("the container's file in the emptyDir", 30, async || {
        (std::fs::read_to_string(scratch.join("hi")).ok()? == "hi\n").then_some(())
    })
    .await;

    let events: Api<Event> = Api::namespaced(api.client(), NS);
    let cfg = failed_mount(&events, &uids[1]).await;
    assert_eq!(cfg.type_.as_deref(), Some("Warning"));
    assert_eq!(cfg.involved_object.name.as_deref(), Some("cfg"));
    assert_eq!(
        cfg.message.as_deref(),
        Some(
            "MountVolume.SetUp failed for volume \"settings\" : volume type \
             persistentVolumeClaim is not supported by nodelet yet"
        )
    );
    assert_waiting_with_nothing_created(&node, &pods, "cfg", &uids[1]).await;

    let file = failed_mount(&events, &uids[2]).await;
    assert_eq!(file.type_.as_deref(), Some("Warning"));
    assert_eq!(
        file.message,
        Some(format!(
            "MountVolume.SetUp failed for volume \"conf\" : hostPath type check failed: {} is \
             not a file",
            missing.display()
        ))
    );
    assert_waiting_with_nothing_created(&node, &pods, "file", &uids[2]).await;
    // Retried more than once, and still nothing made at the path, as a file or a directory.
    assert!(
        std::fs::symlink_metadata(&missing).is_err(),
        "{} must not be created",
        missing.display()
    );

    // The pod that runs was never held up by the others.
    let st = status(&pods, "runs").await.expect("runs' status");
    assert_eq!(st.phase.as_deref(), Some("Running"), "{st:?}");

    // A pod that waits for its volumes is deleted like any other.
    pods.delete("cfg", &DeleteParams::default())
        .await
        .expect("graceful delete");
    wait_for("cfg deleted from the API", 60, async || {
        pods.get_opt("cfg")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    drop(agent);
}
