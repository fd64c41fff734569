//! The volumes whose content the kubelet writes (configMap, secret, downwardAPI, projected with
//! service account tokens), end to end: the real binary (`nodelet run-node`) against the
//! project's test API server on the built-in runtime (the volumes and tokens tests on
//! containerd too), what each container sees read through CRI exec:
//!
//! - content and file modes of configMap (`data`, `binaryData`, `items`, `defaultMode`, an
//!   optional missing one), secret (on a tmpfs) and downwardAPI volumes (fields, labels,
//!   resources with divisors), a memory-backed emptyDir (a tmpfs of its `sizeLimit`); mounts read-only; a ConfigMap update, a Secret update and a
//!   label change reaching the running container through the `..data` swap, a subPath mount
//!   keeping its file; objects watched one by one (`fieldSelector=metadata.name=...`), never
//!   listed; after the pod's deletion no mount and no directory left;
//! - a pod whose ConfigMap is missing waits with upstream's `FailedMount` message and starts
//!   once the ConfigMap is created;
//! - the `kube-api-access` projected volume every admitted pod has: the token file equal to the
//!   token the API server issued for the pod (bound to it, with its audience), refreshed as it
//!   nears its end (the server caps lifetimes at a few seconds), `ca.crt` and `namespace`;
//! - a container's environment from ConfigMaps and Secrets (`envFrom` with a prefix, key refs,
//!   optional ones left out, invalid names skipped with an event), fields and resources; a
//!   missing ConfigMap as CreateContainerConfigError until it is created; the service variables
//!   (`KUBERNETES_SERVICE_HOST`, ...); a `subPathExpr`
//!   expanded from that environment;
//! - a pod's `fsGroup` owning its emptyDirs and written volumes, with upstream's modes.
//!
//! Needs root (real containers); skips loudly otherwise.

mod apiserver;
mod common;

use std::collections::BTreeMap;
use std::path::Path;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, wait_for};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, Service, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use runtime::cri;

const SETUP: Setup = Setup {
    name: "object-volumes-node",
    config: "syncFrequency: 2s\n",
    cri_listen: false,
};

fn config_map(name: &str, data: &[(&str, &str)], binary: &[(&str, &[u8])]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    if !binary.is_empty() {
        cm.binary_data = Some(
            binary
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        );
    }
    cm
}

/// The id of the pod's running `app` container.
async fn running_app(node: &ApiNode, uid: &str) -> String {
    wait_for("the app container running", 120, async || {
        node.containers_of(uid)
            .await
            .into_iter()
            .find(|(_, name, state)| {
                name == "app" && *state == cri::ContainerState::ContainerRunning as i32
            })
            .map(|(id, _, _)| id)
    })
    .await
}

/// `sh -c script` in the container: exit code, stdout, stderr.
async fn sh(node: &ApiNode, id: &str, script: &str) -> (i32, String, String) {
    let r = node
        .runtime()
        .await
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync");
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// The output of `script`, which must succeed.
async fn out(node: &ApiNode, id: &str, script: &str) -> String {
    let (code, stdout, stderr) = sh(node, id, script).await;
    assert_eq!(code, 0, "{script}: {stdout}{stderr}");
    stdout
}

/// Waits until `script` prints `want` in the container.
async fn wait_output(node: &ApiNode, id: &str, script: &str, want: &str, secs: u64) {
    wait_for(&format!("{script:?} to print {want:?}"), secs, async || {
        (sh(node, id, script).await.1 == want).then_some(())
    })
    .await;
}

/// The mount points of this process at or below `dir`, with their filesystem types.
fn mounts_under(dir: &Path) -> Vec<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = dir.display().to_string();
    info.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = *fields.get(4)?;
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = *fields.get(sep + 1)?;
            (point == dir || point.starts_with(&format!("{dir}/")))
                .then(|| (point.to_string(), fstype.to_string()))
        })
        .collect()
}

async fn delete_and_wait_gone(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("deleting the pod");
    wait_for(&format!("{name} deleted from the API"), 90, async || {
        pods.get_opt(name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_with_updates_builtin() {
    volumes_with_updates(Backend::Builtin, "volumes_with_updates_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_with_updates_containerd() {
    volumes_with_updates(Backend::Containerd, "volumes_with_updates_containerd").await;
}

/// configMap, secret, downwardAPI and memory-backed emptyDir volumes, their updates and their
/// removal, on `backend`.
async fn volumes_with_updates(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let client = api.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &config_map(
            "app-config",
            &[("app.conf", "v=1\n"), ("other", "x")],
            &[("blob", &[0, 1, 2, 255])],
        ),
    )
    .await
    .expect("creating the configmap");
    let mut secret = Secret::default();
    secret.metadata.name = Some("app-secret".into());
    secret.string_data = Some(BTreeMap::from([("password".into(), "s3cr3t".into())]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the secret");

    let spec = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    resources:
      limits: {cpu: 500m, memory: 64Mi}
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: cfgitems, mountPath: /etc/cfgitems}
    - {name: cfg, mountPath: /etc/sub.conf, subPath: app.conf}
    - {name: sec, mountPath: /etc/sec}
    - {name: opt, mountPath: /etc/opt}
    - {name: podinfo, mountPath: /etc/podinfo}
    - {name: ram, mountPath: /ram}
  volumes:
  - {name: ram, emptyDir: {medium: Memory, sizeLimit: 16Mi}}
  - {name: cfg, configMap: {name: app-config, defaultMode: 416}}
  - name: cfgitems
    configMap:
      name: app-config
      items: [{key: app.conf, path: conf/app.conf, mode: 384}]
  - {name: sec, secret: {secretName: app-secret, defaultMode: 256}}
  - {name: opt, configMap: {name: not-there, optional: true}}
  - name: podinfo
    downwardAPI:
      items:
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: cpu, resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}}
      - {path: mem, resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}}
"#;
    let mut pod = node.pod("vols", spec);
    pod.metadata.labels = Some(BTreeMap::from([("app".into(), "vols".into())]));
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod")
        .metadata
        .uid
        .expect("a uid");
    let agent = node.start();
    let id = running_app(&node, &uid).await;

    // configMap: every key with the default mode, binary data as bytes, links into ..data.
    assert_eq!(out(&node, &id, "cat /etc/cfg/app.conf").await, "v=1\n");
    assert_eq!(out(&node, &id, "cat /etc/cfg/other").await, "x");
    assert_eq!(
        out(&node, &id, "od -An -tu1 /etc/cfg/blob | tr -s ' '").await,
        " 0 1 2 255\n"
    );
    assert_eq!(
        out(&node, &id, "stat -L -c %a /etc/cfg/app.conf /etc/cfg/blob").await,
        "640\n640\n"
    );
    assert_eq!(
        out(
            &node,
            &id,
            "readlink /etc/cfg/app.conf; readlink /etc/cfg/..data | cut -c1-4"
        )
        .await,
        "..data/app.conf\n..20\n"
    );
    // Items: only the key asked for, at its path, with its mode.
    assert_eq!(
        out(
            &node,
            &id,
            "cat /etc/cfgitems/conf/app.conf; ls /etc/cfgitems"
        )
        .await,
        "v=1\nconf\n"
    );
    assert_eq!(
        out(&node, &id, "stat -L -c %a /etc/cfgitems/conf/app.conf").await,
        "600\n"
    );
    assert_eq!(out(&node, &id, "cat /etc/sub.conf").await, "v=1\n");
    // Secret: on a tmpfs, its mode.
    assert_eq!(out(&node, &id, "cat /etc/sec/password").await, "s3cr3t");
    assert_eq!(
        out(&node, &id, "stat -L -c %a /etc/sec/password").await,
        "400\n"
    );
    assert_eq!(
        out(
            &node,
            &id,
            "awk '$2 == \"/etc/sec\" {print $3}' /proc/mounts"
        )
        .await,
        "tmpfs\n"
    );
    let pod_dir = node.pod_dir(&uid);
    let secret_dir = pod_dir.join("volumes/kubernetes.io~secret/sec");
    let ram_dir = pod_dir.join("volumes/kubernetes.io~empty-dir/ram");
    let mut mounted = mounts_under(&pod_dir);
    mounted.sort();
    // The subPath is bound, as resolved, at upstream's place (`volume-subpaths/<volume>/
    // <container>/<mount index>`) for the runtime.
    let subpaths = pod_dir.join("volume-subpaths");
    let (binds, kubelet_mounts): (Vec<_>, Vec<_>) = mounted
        .into_iter()
        .partition(|(p, _)| std::path::Path::new(p).starts_with(&subpaths));
    assert_eq!(
        kubelet_mounts,
        [
            (ram_dir.display().to_string(), "tmpfs".to_string()),
            (secret_dir.display().to_string(), "tmpfs".to_string()),
        ],
        "the secret and the memory-backed emptyDir are the kubelet's mounts"
    );
    assert_eq!(binds.len(), 1, "the one subPath: {binds:?}");
    assert!(
        binds[0]
            .0
            .starts_with(&subpaths.join("cfg/app/").display().to_string()),
        "{binds:?}"
    );
    // The memory-backed emptyDir: a tmpfs of its sizeLimit (below the pod's 64Mi), writable.
    let ram = out(
        &node,
        &id,
        "awk '$2 == \"/ram\" {print $1, $3, $4}' /proc/mounts",
    )
    .await;
    assert!(ram.starts_with("tmpfs tmpfs rw,"), "{ram}");
    assert!(ram.contains("size=16384k"), "{ram}");
    assert_eq!(
        out(&node, &id, "echo x > /ram/f && cat /ram/f").await,
        "x\n"
    );
    // An optional configMap that does not exist: an empty volume.
    assert_eq!(out(&node, &id, "ls /etc/opt").await, "");
    // downwardAPI: fields, labels as upstream formats them, resources by divisor.
    assert_eq!(out(&node, &id, "cat /etc/podinfo/name").await, "vols");
    assert_eq!(
        out(&node, &id, "cat /etc/podinfo/labels").await,
        "app=\"vols\""
    );
    assert_eq!(out(&node, &id, "cat /etc/podinfo/cpu").await, "500");
    assert_eq!(out(&node, &id, "cat /etc/podinfo/mem").await, "64");
    assert_eq!(
        out(&node, &id, "stat -L -c %a /etc/podinfo/name").await,
        "644\n"
    );
    // Read-only, whatever the mount asked.
    let (code, _, err) = sh(&node, &id, "touch /etc/cfg/new").await;
    assert_ne!(code, 0, "a configMap volume is read-only");
    assert!(err.contains("Read-only file system"), "{err}");

    // Updates reach the running container through the ..data swap; the subPath keeps its file.
    let before = out(&node, &id, "readlink /etc/cfg/..data").await;
    cms.patch(
        "app-config",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"app.conf": "v=2\n", "other": null}})),
    )
    .await
    .expect("updating the configmap");
    wait_output(&node, &id, "cat /etc/cfg/app.conf", "v=2\n", 60).await;
    assert_ne!(out(&node, &id, "readlink /etc/cfg/..data").await, before);
    assert_eq!(
        out(&node, &id, "ls /etc/cfg").await,
        "app.conf\nblob\n",
        "a key gone is gone"
    );
    wait_output(&node, &id, "cat /etc/cfgitems/conf/app.conf", "v=2\n", 30).await;
    assert_eq!(out(&node, &id, "cat /etc/sub.conf").await, "v=1\n");
    secrets
        .patch(
            "app-secret",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"password": "n3w"}})),
        )
        .await
        .expect("updating the secret");
    wait_output(&node, &id, "cat /etc/sec/password", "n3w", 60).await;
    pods.patch(
        "vols",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": "web"}}})),
    )
    .await
    .expect("labelling the pod");
    wait_output(
        &node,
        &id,
        "cat /etc/podinfo/labels",
        "app=\"vols\"\ntier=\"web\"",
        60,
    )
    .await;

    // The objects were watched one by one, never listed or watched all at once.
    for r in api.requests() {
        let collection = ["/configmaps", "/secrets"]
            .iter()
            .any(|c| r.contains(&format!("{c}?")) || r.ends_with(c));
        if r.starts_with("GET ") && collection {
            assert!(r.contains("fieldSelector=metadata.name%3D"), "{r}");
        }
    }
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/default/secrets?")
                && r.contains("watch=true")
                && r.contains("fieldSelector=metadata.name%3Dapp-secret")),
        "a watch of the one secret"
    );

    // Deleted: no mount and no directory left.
    delete_and_wait_gone(&pods, "vols").await;
    wait_for("the pod's directory removed", 60, async || {
        (!pod_dir.exists()).then_some(())
    })
    .await;
    assert_eq!(mounts_under(&pod_dir), Vec::<(String, String)>::new());
    assert_eq!(
        mounts_under(&node.root.join("pods")),
        Vec::<(String, String)>::new()
    );
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_config_map_holds_the_pod_until_it_is_created() {
    let test = "a_missing_config_map_holds_the_pod_until_it_is_created";
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let spec = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts: [{name: settings, mountPath: /etc/app}]
  volumes: [{name: settings, configMap: {name: late}}]
"#;
    let uid = pods
        .create(&PostParams::default(), &node.pod("waits", spec))
        .await
        .expect("creating the pod")
        .metadata
        .uid
        .expect("a uid");
    let agent = node.start();
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let ev = wait_for("a FailedMount event", 60, async || {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.involved_object.uid.as_deref() == Some(uid.as_str())
                    && e.reason.as_deref() == Some("FailedMount")
            })
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(
        ev.message.as_deref(),
        Some("MountVolume.SetUp failed for volume \"settings\" : configmap \"late\" not found")
    );
    let st = pods
        .get("waits")
        .await
        .expect("the pod")
        .status
        .expect("a status");
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let waiting = st.container_statuses.iter().flatten().next().and_then(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
    });
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    assert_eq!(node.containers_of(&uid).await, []);

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &config_map("late", &[("k", "here")], &[]),
    )
    .await
    .expect("creating the configmap");
    let id = running_app(&node, &uid).await;
    assert_eq!(out(&node, &id, "cat /etc/app/k").await, "here");
    delete_and_wait_gone(&pods, "waits").await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_builtin() {
    service_account_tokens(Backend::Builtin, "service_account_tokens_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_containerd() {
    service_account_tokens(Backend::Containerd, "service_account_tokens_containerd").await;
}

/// The kube-api-access volume's token issued for the pod and refreshed, on `backend`.
async fn service_account_tokens(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    // Tokens live 20 seconds: refreshed within their last 4 (less a jitter of up to 10).
    api.set_max_token_expiration(20);
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let client = api.client();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("builder".into());
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("creating the service account");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &config_map("kube-root-ca.crt", &[("ca.crt", "CERT\n")], &[]),
    )
    .await
    .expect("creating kube-root-ca.crt");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // The volume the ServiceAccount admission plugin adds to every pod, and a second token
    // for another audience.
    let spec = r#"  serviceAccountName: builder
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts:
    - {name: kube-api-access-x7k2p, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
    - {name: vault, mountPath: /var/run/vault}
  volumes:
  - name: kube-api-access-x7k2p
    projected:
      defaultMode: 420
      sources:
      - serviceAccountToken: {expirationSeconds: 3607, path: token}
      - configMap:
          name: kube-root-ca.crt
          items: [{key: ca.crt, path: ca.crt}]
      - downwardAPI:
          items:
          - path: namespace
            fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}
  - name: vault
    projected:
      defaultMode: 384
      sources:
      - serviceAccountToken: {audience: vault, expirationSeconds: 7200, path: vault-token}
"#;
    let created = pods
        .create(&PostParams::default(), &node.pod("tokens", spec))
        .await
        .expect("creating the pod");
    let uid = created.metadata.uid.expect("a uid");
    let agent = node.start();
    let id = running_app(&node, &uid).await;
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        out(&node, &id, &format!("ls {sa_dir}")).await,
        "ca.crt\nnamespace\ntoken\n"
    );
    assert_eq!(
        out(
            &node,
            &id,
            &format!("cat {sa_dir}/ca.crt {sa_dir}/namespace")
        )
        .await,
        "CERT\ndefault"
    );
    assert_eq!(
        out(
            &node,
            &id,
            &format!("stat -L -c %a {sa_dir}/token /var/run/vault/vault-token")
        )
        .await,
        "644\n600\n"
    );
    assert_eq!(
        out(
            &node,
            &id,
            &format!("awk '$2 == \"{sa_dir}\" {{print $3}}' /proc/mounts")
        )
        .await,
        "tmpfs\n"
    );

    // Each file holds a token the API server issued for this pod, with its audience.
    let issued_for = |token: &str| {
        api.issued_tokens()
            .into_iter()
            .find(|t| t.token == token)
            .unwrap_or_else(|| panic!("a token the API server issued: {token:?}"))
    };
    let first = out(&node, &id, &format!("cat {sa_dir}/token")).await;
    let t = issued_for(&first);
    assert_eq!(t.service_account, "builder");
    assert_eq!(t.namespace, NS);
    assert_eq!(t.pod, Some(("tokens".to_string(), uid.clone())));
    assert_eq!(t.audiences, [apiserver::DEFAULT_AUDIENCE]);
    assert_eq!(t.expiration_seconds, 20, "capped by the server");
    let claims = apiserver::claims(&first).expect("a JWT");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], uid.as_str());
    let vault = out(&node, &id, "cat /var/run/vault/vault-token").await;
    let v = issued_for(&vault);
    assert_eq!(v.audiences, ["vault"]);
    assert_eq!(v.pod, Some(("tokens".to_string(), uid.clone())));

    // Refreshed before it expires: a new token in the file, issued for the pod.
    let refreshed = wait_for("the token refreshed", 60, async || {
        let now = sh(&node, &id, &format!("cat {sa_dir}/token")).await.1;
        (now != first && !now.is_empty()).then_some(now)
    })
    .await;
    let r = issued_for(&refreshed);
    assert_eq!(r.pod, Some(("tokens".to_string(), uid.clone())));
    assert!(r.issued_at > t.issued_at);
    assert!(
        r.issued_at < t.issued_at + chrono::Duration::seconds(20),
        "refreshed before the first expired: {:?} then {:?}",
        t.issued_at,
        r.issued_at
    );

    delete_and_wait_gone(&pods, "tokens").await;
    let pod_dir = node.pod_dir(&uid);
    wait_for("the pod's directory removed", 60, async || {
        (!pod_dir.exists()).then_some(())
    })
    .await;
    assert_eq!(mounts_under(&pod_dir), Vec::<(String, String)>::new());
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_from_config_maps_secrets_and_fields_builtin() {
    environment_from_config_maps_secrets_and_fields(
        Backend::Builtin,
        "environment_from_config_maps_secrets_and_fields_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_from_config_maps_secrets_and_fields_containerd() {
    environment_from_config_maps_secrets_and_fields(
        Backend::Containerd,
        "environment_from_config_maps_secrets_and_fields_containerd",
    )
    .await;
}

async fn environment_from_config_maps_secrets_and_fields(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let client = api.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &config_map("env-cfg", &[("mode", "fast"), ("1st", "one")], &[]),
    )
    .await
    .expect("creating the configmap");
    let mut secret = Secret::default();
    secret.metadata.name = Some("env-secret".into());
    secret.string_data = Some(BTreeMap::from([
        ("password".into(), "s3cr3t".into()),
        ("1bad".into(), "skipped".into()),
    ]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the secret");
    // The master service kube-apiserver makes, and one of the pod's namespace.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let service = |name: &str, ip: Option<&str>, port: serde_json::Value| -> Service {
        let mut spec = serde_json::json!({"ports": [port]});
        if let Some(ip) = ip {
            spec["clusterIP"] = serde_json::json!(ip);
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec}))
            .expect("a service")
    };
    services
        .create(
            &PostParams::default(),
            &service(
                "kubernetes",
                Some("10.96.0.1"),
                serde_json::json!({"name": "https", "port": 443}),
            ),
        )
        .await
        .expect("creating the kubernetes service");
    let web_ip = services
        .create(
            &PostParams::default(),
            &service("web-api", None, serde_json::json!({"port": 80})),
        )
        .await
        .expect("creating a service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("an allocated cluster IP");
    let spec = r#"  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "env > /tmp/env; echo hi > /logs/hi; sleep 3600"]
    resources:
      limits: {memory: 64Mi}
    volumeMounts: [{name: logs, mountPath: /logs, subPathExpr: "$(TIER)"}]
    envFrom:
    - {configMapRef: {name: env-cfg}, prefix: CFG_}
    - {secretRef: {name: env-secret}}
    - {configMapRef: {name: absent, optional: true}}
    env:
    - {name: MODE, valueFrom: {configMapKeyRef: {name: env-cfg, key: mode}}}
    - {name: LATE, valueFrom: {configMapKeyRef: {name: late-cfg, key: k}}}
    - {name: OPT, valueFrom: {secretKeyRef: {name: absent, key: k, optional: true}}}
    - {name: MEM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: TIER, valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}}
    - {name: COPY, value: "$(MODE)-$(password)"}
  volumes: [{name: logs, emptyDir: {}}]
"#;
    let mut pod = node.pod("envs", spec);
    pod.metadata.labels = Some(BTreeMap::from([("tier".into(), "web".into())]));
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod")
        .metadata
        .uid
        .expect("a uid");
    let agent = node.start();

    // A required key of a ConfigMap that does not exist: CreateContainerConfigError with
    // upstream's message, nothing created.
    let waiting = wait_for("CreateContainerConfigError", 90, async || {
        let st = pods.get("envs").await.ok()?.status?;
        let w = st.container_statuses?.into_iter().next()?.state?.waiting?;
        (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some(w)
    })
    .await;
    assert_eq!(
        waiting.message.as_deref(),
        Some("configmap \"late-cfg\" not found")
    );
    assert_eq!(node.containers_of(&uid).await, []);
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let of_pod = |reason: &'static str| {
        let events = events.clone();
        let uid = uid.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.involved_object.uid.as_deref() == Some(uid.as_str())
                        && e.reason.as_deref() == Some(reason)
                })
        }
    };
    let failed = wait_for("a Failed event", 30, async || of_pod("Failed").await).await;
    assert_eq!(
        failed.message.as_deref(),
        Some("Error: configmap \"late-cfg\" not found")
    );

    cms.create(
        &PostParams::default(),
        &config_map("late-cfg", &[("k", "arrived")], &[]),
    )
    .await
    .expect("creating the late configmap");
    let id = running_app(&node, &uid).await;
    wait_for("the env file", 30, async || {
        (sh(&node, &id, "test -s /tmp/env").await.0 == 0).then_some(())
    })
    .await;
    let env: BTreeMap<String, String> = out(&node, &id, "cat /tmp/env")
        .await
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| env.get(k).map(String::as_str);
    assert_eq!(get("CFG_mode"), Some("fast"));
    assert_eq!(get("CFG_1st"), Some("one"));
    assert_eq!(get("password"), Some("s3cr3t"));
    assert_eq!(get("1bad"), None, "not a variable name: skipped");
    assert_eq!(get("MODE"), Some("fast"));
    assert_eq!(get("LATE"), Some("arrived"));
    assert_eq!(get("OPT"), None, "optional and missing: left out");
    assert_eq!(get("MEM"), Some("64"));
    assert_eq!(get("NODE"), Some(SETUP.name));
    assert_eq!(get("TIER"), Some("web"));
    assert_eq!(get("COPY"), Some("fast-s3cr3t"));
    // Service variables: the master service's, and those of the namespace's services.
    assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
    assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
    assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
    assert_eq!(get("WEB_API_SERVICE_HOST"), Some(web_ip.as_str()));
    assert_eq!(
        get("WEB_API_PORT").map(String::from),
        Some(format!("tcp://{web_ip}:80"))
    );
    // A subPathExpr expanded from the environment.
    let hi = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/logs/web/hi");
    wait_for("the file in the subPathExpr directory", 30, async || {
        (std::fs::read_to_string(&hi).ok()? == "hi\n").then_some(())
    })
    .await;
    let invalid = wait_for("an InvalidEnvironmentVariableNames event", 30, async || {
        of_pod("InvalidEnvironmentVariableNames").await
    })
    .await;
    assert_eq!(invalid.type_.as_deref(), Some("Warning"));
    assert_eq!(
        invalid.message.as_deref(),
        Some(
            "Keys [1bad] from the EnvFrom secret default/env-secret were skipped since they \
             are considered invalid environment variable names."
        )
    );
    delete_and_wait_gone(&pods, "envs").await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_fs_group_owns_the_pods_volumes_builtin() {
    an_fs_group_owns_the_pods_volumes(
        Backend::Builtin,
        "an_fs_group_owns_the_pods_volumes_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_fs_group_owns_the_pods_volumes_containerd() {
    an_fs_group_owns_the_pods_volumes(
        Backend::Containerd,
        "an_fs_group_owns_the_pods_volumes_containerd",
    )
    .await;
}

async fn an_fs_group_owns_the_pods_volumes(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let client = api.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    cms.create(
        &PostParams::default(),
        &config_map("grouped", &[("app.conf", "x")], &[]),
    )
    .await
    .expect("creating the configmap");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let mut secret = Secret::default();
    secret.metadata.name = Some("grouped".into());
    secret.string_data = Some(BTreeMap::from([("key".into(), "k".into())]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the secret");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("default".into());
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("creating the service account");
    let spec = r#"  serviceAccountName: default
  securityContext: {fsGroup: 2000}
  containers:
  - name: app
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: ram, mountPath: /ram}
    - {name: cfg, mountPath: /etc/cfg}
    - {name: sec, mountPath: /etc/sec}
    - {name: token, mountPath: /var/run/token}
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: ram, emptyDir: {medium: Memory}}
  - {name: cfg, configMap: {name: grouped}}
  - {name: sec, secret: {secretName: grouped, defaultMode: 256}}
  - {name: token, projected: {sources: [{serviceAccountToken: {path: token}}]}}
"#;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let uid = pods
        .create(&PostParams::default(), &node.pod("grouped", spec))
        .await
        .expect("creating the pod")
        .metadata
        .uid
        .expect("a uid");
    let agent = node.start();
    let id = running_app(&node, &uid).await;
    let stat = "stat -L -c '%n %g %a' /scratch /ram /etc/cfg /etc/cfg/app.conf /etc/sec/key \
                /var/run/token/token";
    assert_eq!(
        out(&node, &id, stat).await,
        "/scratch 2000 2777\n/ram 2000 3777\n/etc/cfg 2000 2777\n/etc/cfg/app.conf 2000 644\n\
         /etc/sec/key 2000 440\n/var/run/token/token 2000 640\n"
    );
    delete_and_wait_gone(&pods, "grouped").await;
    drop(agent);
}
