//! imagePullSecrets end to end: the real binary (`nodelet run-node`) against the project's test
//! API server on the built-in runtime, pulling from a private registry (Debian's
//! docker-registry behind htpasswd basic auth, plain HTTP on the loopback, which the node's
//! `nodeletInsecureRegistries` allows): a pod whose `kubernetes.io/dockerconfigjson` secret
//! holds the registry's credentials runs; a pod without it waits in ErrImagePull /
//! ImagePullBackOff; a pod naming a secret that does not exist gets a
//! `FailedToRetrieveImagePullSecret` warning and still tries (and fails) anonymously.
//!
//! Needs root (real containers), docker-registry and htpasswd; skips loudly otherwise.

mod apiserver;
mod common;

use std::collections::BTreeMap;
use std::io::Write;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, wait_for};
use common::{busybox_archive, free_port, skip};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::Api;
use kube::api::PostParams;

const SETUP: Setup = Setup {
    name: "pull-secrets-node",
    config: "syncFrequency: 2s\n",
    cri_listen: false,
};

/// A docker-registry process, killed when dropped.
struct Registry(std::process::Child);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a registry on `host` requiring `user`/`password`, and pushes the project's busybox
/// to it as `private/busybox:1` with those credentials.
async fn private_registry(
    dir: &std::path::Path,
    host: &str,
    user: &str,
    password: &str,
) -> Registry {
    let htpasswd = dir.join("htpasswd");
    let st = std::process::Command::new("/usr/bin/htpasswd")
        .args(["-Bbc"])
        .arg(&htpasswd)
        .args([user, password])
        .output()
        .expect("running htpasswd");
    assert!(st.status.success(), "htpasswd: {st:?}");
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {host}\nauth:\n  htpasswd:\n    realm: nodelet-test\n    path: {}\n",
            dir.join("data").display(),
            htpasswd.display()
        ),
    )
    .expect("writing the registry config");
    let registry = Registry(
        std::process::Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting docker-registry"),
    );
    wait_for("the registry listening", 20, async || {
        std::net::TcpStream::connect(host).ok().map(drop)
    })
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::HttpsExcept(vec![host.to_string()]),
        ..Default::default()
    });
    let reference =
        oci_client::Reference::with_tag(host.to_string(), "private/busybox".into(), "1".into());
    let auth = oci_client::secrets::RegistryAuth::Basic(user.into(), password.into());
    client
        .auth(&reference, &auth, oci_client::RegistryOperation::Push)
        .await
        .expect("push auth");
    let unpacked = tempfile::tempdir().expect("a temp dir");
    tar::Archive::new(std::fs::File::open(busybox_archive()).expect("the busybox archive"))
        .unpack(unpacked.path())
        .expect("unpacking busybox");
    let blob = |d: &str| {
        std::fs::read(
            unpacked
                .path()
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .expect("a blob")
    };
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(unpacked.path().join("index.json")).expect("index.json"),
    )
    .expect("an index");
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("a manifest");
    let manifest: serde_json::Value = serde_json::from_slice(&blob(digest)).expect("a manifest");
    let mut digests = vec![
        manifest["config"]["digest"]
            .as_str()
            .expect("config")
            .to_string(),
    ];
    for l in manifest["layers"].as_array().expect("layers") {
        digests.push(l["digest"].as_str().expect("a layer").to_string());
    }
    for d in &digests {
        client
            .push_blob(&reference, blob(d), d)
            .await
            .expect("pushing a blob");
    }
    let parsed: oci_client::manifest::OciImageManifest =
        serde_json::from_value(manifest).expect("an OCI manifest");
    client
        .push_manifest(&reference, &parsed.into())
        .await
        .expect("pushing the manifest");
    registry
}

fn pod_spec(image: &str, secret: Option<&str>) -> String {
    let secrets = secret
        .map(|s| format!("  imagePullSecrets: [{{name: {s}}}]\n"))
        .unwrap_or_default();
    format!(
        "{secrets}  containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: Always\n    command: [\"sh\", \"-c\", \"sleep 3600\"]\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_image_is_pulled_with_the_pods_pull_secret() {
    let test = "a_private_image_is_pulled_with_the_pods_pull_secret";
    for tool in ["/usr/bin/docker-registry", "/usr/bin/htpasswd"] {
        if !std::path::Path::new(tool).exists() {
            skip(
                &format!("needs {tool} (docker-registry, apache2-utils)"),
                test,
            );
            return;
        }
    }
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let host = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().expect("a temp dir");
    let _registry = private_registry(dir.path(), &host, "alice", "s3cret").await;
    // The node pulls from the loopback registry over plain HTTP.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&node.config)
        .and_then(|mut f| writeln!(f, "nodeletInsecureRegistries: [\"{host}\"]"))
        .expect("configuring the insecure registry");

    let client = api.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let mut regcred = Secret::default();
    regcred.metadata.name = Some("regcred".into());
    regcred.type_ = Some("kubernetes.io/dockerconfigjson".into());
    let config = serde_json::json!({"auths": {&host: {"username": "alice", "password": "s3cret"}}});
    regcred.string_data = Some(BTreeMap::from([(
        ".dockerconfigjson".to_string(),
        config.to_string(),
    )]));
    secrets
        .create(&PostParams::default(), &regcred)
        .await
        .expect("creating the pull secret");
    let image = format!("{host}/private/busybox:1");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut uids = BTreeMap::new();
    for (name, secret) in [
        ("private", Some("regcred")),
        ("anonymous", None),
        ("missing", Some("nope")),
    ] {
        let created = pods
            .create(
                &PostParams::default(),
                &node.pod(name, &pod_spec(&image, secret)),
            )
            .await
            .expect("creating a pod");
        uids.insert(name, created.metadata.uid.expect("a uid"));
    }
    let agent = node.start();

    wait_for("the private pod running", 120, async || {
        let st = pods.get("private").await.ok()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    for name in ["anonymous", "missing"] {
        let st = wait_for(&format!("{name} failing to pull"), 60, async || {
            let st = pods.get(name).await.ok()?.status?;
            let reason = st
                .container_statuses
                .iter()
                .flatten()
                .next()?
                .state
                .as_ref()?
                .waiting
                .as_ref()?
                .reason
                .clone()?;
            matches!(reason.as_str(), "ErrImagePull" | "ImagePullBackOff").then_some(st)
        })
        .await;
        assert_eq!(st.phase.as_deref(), Some("Pending"), "{name}: {st:?}");
    }
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let missing_uid = uids["missing"].clone();
    let ev = wait_for("a FailedToRetrieveImagePullSecret event", 30, async || {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.involved_object.uid.as_deref() == Some(missing_uid.as_str())
                    && e.reason.as_deref() == Some("FailedToRetrieveImagePullSecret")
            })
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(
        ev.message.as_deref(),
        Some(
            "Unable to retrieve some image pull secrets (nope); attempting to pull the image \
             may not succeed."
        )
    );
    drop(agent);
}
