//! The kubelet's volumes end to end, driving the real binary (`nodelet run-node`) against the
//! project's test API server on the built-in runtime (the set-up is the kubelet's, before any
//! runtime call):
//!
//! - a pod with an emptyDir runs, its container writing into the directory the kubelet made;
//! - a pod with an nfs volume (a type nodelet does not support yet) and a pod with a hostPath
//!   `type: File` naming a missing path stay Pending, their containers waiting in
//!   `ContainerCreating`, with a Warning `FailedMount` event naming the volume and the reason
//!   (one Event object counted up as the worker retries); nothing of them is created in the
//!   runtime and nothing is created at the missing path; deleted, such a pod goes.
//!
//! - persistentVolumeClaims bound to a hostPath PersistentVolume are its directory in the
//!   container (read-only where the pod says so), a local one is given to the pod's fsGroup;
//!   a pod with an unbound claim waits;
//! - a subPath through a link leading out of its volume (absolute, or climbing with `..`) is
//!   refused as CreateContainerConfigError while the pod's other containers run.
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
                "{}  volumes: [{{name: settings, nfs: {{server: nfs.example, path: /exports}}}}]\n",
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
            "MountVolume.SetUp failed for volume \"settings\" : volume type nfs is not \
             supported by nodelet yet"
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

/// `kubectl exec`-like: `sh -c script` in the pod's running `app` container; exit code and
/// output (stdout then stderr).
async fn sh_in_app(node: &ApiNode, uid: &str, script: &str) -> (i32, String) {
    let id = wait_for("the app container running", 120, async || {
        node.containers_of(uid)
            .await
            .into_iter()
            .find(|(_, name, state)| {
                name == "app" && *state == runtime::cri::ContainerState::ContainerRunning as i32
            })
            .map(|(id, _, _)| id)
    })
    .await;
    let r = node
        .runtime()
        .await
        .exec_sync(runtime::cri::ExecSyncRequest {
            container_id: id,
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync");
    (
        r.exit_code,
        format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_of_host_path_volumes_are_bound_and_unbound_ones_wait_builtin() {
    claims_of_host_path_volumes_are_bound_and_unbound_ones_wait(
        Backend::Builtin,
        "claims_of_host_path_volumes_are_bound_and_unbound_ones_wait_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_of_host_path_volumes_are_bound_and_unbound_ones_wait_containerd() {
    claims_of_host_path_volumes_are_bound_and_unbound_ones_wait(
        Backend::Containerd,
        "claims_of_host_path_volumes_are_bound_and_unbound_ones_wait_containerd",
    )
    .await;
}

async fn claims_of_host_path_volumes_are_bound_and_unbound_ones_wait(backend: Backend, test: &str) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams};
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let client = api.client();
    let host = tempfile::tempdir().expect("a host dir");
    std::fs::write(host.path().join("data.txt"), "stored\n").expect("a file");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claim = |name: &str| -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "local-pv",
                "resources": {"requests": {"storage": "1Gi"}}}}))
        .expect("a claim")
    };
    let data = claims
        .create(&PostParams::default(), &claim("data"))
        .await
        .expect("creating the claim");
    claims
        .create(&PostParams::default(), &claim("pending"))
        .await
        .expect("creating the unbound claim");
    // Bound as the PV controller binds: the claim's phase, the volume's claimRef.
    claims
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Bound"}})),
        )
        .await
        .expect("binding the claim");
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": host.path().display().to_string(), "type": "Directory"},
            "claimRef": {"namespace": NS, "name": "data", "uid": data.metadata.uid}}}))
    .expect("a volume");
    pvs.create(&PostParams::default(), &pv)
        .await
        .expect("creating the volume");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let bound = format!(
        "{}  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}\n  - {{name: ro, persistentVolumeClaim: {{claimName: data, readOnly: true}}}}\n",
        container(
            "sleep 3600",
            "[{name: data, mountPath: /data}, {name: ro, mountPath: /ro}]"
        )
    );
    let unbound = format!(
        "{}  volumes: [{{name: data, persistentVolumeClaim: {{claimName: pending}}}}]\n",
        container("sleep 3600", "[{name: data, mountPath: /data}]")
    );
    let mut uids = Vec::new();
    for (name, spec) in [("claims", &bound), ("unbound", &unbound)] {
        let created = pods
            .create(&PostParams::default(), &node.pod(name, spec))
            .await
            .expect("creating a pod");
        uids.push(created.metadata.uid.expect("a uid"));
    }
    let agent = node.start();

    // The claim's volume is the PersistentVolume's directory, read-only where asked.
    assert_eq!(
        sh_in_app(&node, &uids[0], "cat /data/data.txt").await,
        (0, "stored\n".to_string())
    );
    assert_eq!(
        sh_in_app(&node, &uids[0], "echo new > /data/new").await.0,
        0
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("new")).expect("written through the claim"),
        "new\n"
    );
    let (code, out) = sh_in_app(&node, &uids[0], "echo no > /ro/no").await;
    assert_ne!(code, 0);
    assert!(out.contains("Read-only file system"), "{out}");

    // A local PersistentVolume is given to the pod's fsGroup when it first mounts it.
    let local = tempfile::tempdir().expect("a local volume's dir");
    std::fs::set_permissions(
        local.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("0755");
    std::fs::write(local.path().join("old.txt"), "kept\n").expect("a file");
    std::fs::set_permissions(
        local.path().join("old.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("0644");
    let mut scratch = claim("scratch");
    scratch.spec.as_mut().expect("spec").volume_name = Some("local-pv2".into());
    let scratch = claims
        .create(&PostParams::default(), &scratch)
        .await
        .expect("creating the local claim");
    claims
        .patch_status(
            "scratch",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Bound"}})),
        )
        .await
        .expect("binding the local claim");
    let pv2: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-pv2"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": local.path().display().to_string()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [SETUP.name]}]}]}},
            "claimRef": {"namespace": NS, "name": "scratch", "uid": scratch.metadata.uid}}}))
    .expect("a local volume");
    pvs.create(&PostParams::default(), &pv2)
        .await
        .expect("creating the local volume");
    let grouped = format!(
        "  securityContext: {{fsGroup: 3000}}\n{}  volumes: [{{name: scratch, persistentVolumeClaim: {{claimName: scratch}}}}]\n",
        container("sleep 3600", "[{name: scratch, mountPath: /scratch}]")
    );
    let g_uid = pods
        .create(&PostParams::default(), &node.pod("grouped", &grouped))
        .await
        .expect("creating the fsGroup pod")
        .metadata
        .uid
        .expect("a uid");
    assert_eq!(
        sh_in_app(
            &node,
            &g_uid,
            "stat -c '%n %g %a' /scratch /scratch/old.txt; cat /scratch/old.txt"
        )
        .await,
        (
            0,
            "/scratch 3000 2775\n/scratch/old.txt 3000 664\nkept\n".to_string()
        )
    );

    // An unbound claim: the pod waits with the reason.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let ev = failed_mount(&events, &uids[1]).await;
    assert_eq!(
        ev.message.as_deref(),
        Some(
            "MountVolume.SetUp failed for volume \"data\" : error processing PVC \
             default/pending: PVC is not bound"
        )
    );
    assert_waiting_with_nothing_created(&node, &pods, "unbound", &uids[1]).await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sub_path_leading_out_of_its_volume_is_refused() {
    let test = "a_sub_path_leading_out_of_its_volume_is_refused";
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    // The init container plants links in the emptyDir: one absolute, one climbing out.
    let spec = r#"  initContainers:
  - name: plant
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "ln -s /etc /shared/abs; ln -s ../../../../../../../.. /shared/up; mkdir -p /shared/ok; echo in > /shared/ok/f"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /escape, subPath: abs}]
  - name: climb
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /escape, subPath: up/etc}]
  - name: fine
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "cat /ok/f; sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /ok, subPath: ok}]
  volumes: [{name: shared, emptyDir: {}}]
"#;
    pods.create(&PostParams::default(), &node.pod("links", spec))
        .await
        .expect("creating the pod");
    let agent = node.start();
    let waiting = |st: &PodStatus, name: &str| {
        st.container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state.as_ref()?.waiting.clone())
    };
    let st = wait_for(
        "both escapes refused, the other container running",
        120,
        async || {
            let st = status(&pods, "links").await?;
            let running =
                st.container_statuses.iter().flatten().any(|c| {
                    c.name == "fine" && c.state.as_ref().is_some_and(|s| s.running.is_some())
                });
            let refused = ["app", "climb"].iter().all(|n| {
                waiting(&st, n).and_then(|w| w.reason).as_deref()
                    == Some("CreateContainerConfigError")
            });
            (running && refused).then_some(st)
        },
    )
    .await;
    assert_eq!(
        waiting(&st, "app").and_then(|w| w.message).as_deref(),
        Some("spec.containers[app].volumeMounts[0].subPath: \"abs\" leads out of its volume")
    );
    assert_eq!(
        waiting(&st, "climb").and_then(|w| w.message).as_deref(),
        Some("spec.containers[climb].volumeMounts[0].subPath: \"up/etc\" leads out of its volume")
    );
    drop(agent);
}
