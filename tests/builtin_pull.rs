//! PullImage through the built-in runtime's `ImageService`, from Debian's docker-registry on
//! 127.0.0.1: plain pulls of an insecure registry, pulls through a mirror, the errors for a
//! missing tag and an unreachable registry, a container run from the pulled image, a pull by
//! `nodelet images pull` on a node with no CA certificates, and the registries config: mirrors
//! in order past a dead one, a rewrite, credentials, and TLS with a CA the test makes.

mod common;

use common::containerd::registry;
use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{Code, ImageService, cri};

fn spec(image: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_run_mirror_and_errors() {
    if !root_or_skip("pull_run_mirror_and_errors") {
        return;
    }
    let Some(reg) = registry::start_registry() else {
        return;
    };
    let client = registry::push_client(&reg.host);
    let config_digest = registry::push_archive(
        &client,
        &busybox_archive(),
        &reg.host,
        "library/busybox",
        "1.0",
    )
    .await;

    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let cgroup_root = format!("/nodelet-e2e-pull-{}", std::process::id());
    let mut cfg = config(root.path(), &cgroup_root);
    cfg.registry.insecure = vec![reg.host.clone()];
    let rt = BuiltinRuntime::new(cfg.clone()).await.unwrap();

    let reference = format!("{}/library/busybox:1.0", reg.host);
    let image_ref = rt
        .pull_image(cri::PullImageRequest {
            image: spec(&reference),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("pull")
        .image_ref;
    assert_eq!(image_ref, config_digest, "PullImage returns the image id");
    let st = rt
        .image_status(cri::ImageStatusRequest {
            image: spec(&reference),
            verbose: false,
        })
        .await
        .unwrap();
    let img = st.image.expect("pulled image is present");
    assert!(img.repo_tags.contains(&reference));
    assert!(img.repo_digests.iter().any(|d| d.contains("@sha256:")));

    // The pulled image runs.
    let node = Node {
        rt,
        root,
        cgroup_root,
        network: Some(Default::default()),
    };
    let sb = node.sandbox("pulled").await;
    let mut c = container_config("c", &["sh", "-c", "echo pulled-ok"]);
    c.image = spec(&reference);
    let id = node.container_with(&sb, c).await;
    let s = node.wait_exited(&id).await;
    assert_eq!(s.exit_code, 0);
    let recs = log_records(std::path::Path::new(&s.log_path));
    assert!(recs.iter().any(|r| r.2 == "pulled-ok"), "{recs:?}");
    // One image identifier across the APIs (critest's image_id consistency specs): PullImage's
    // image_ref, Image.id, ContainerStatus.image_id and Container.image_id.
    assert_eq!(img.id, image_ref);
    assert_eq!(s.image_id, image_ref);
    let listed = runtime::RuntimeService::list_containers(
        &node.rt,
        cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: id.clone(),
                ..Default::default()
            }),
        },
    )
    .await
    .unwrap()
    .containers;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].image_id, image_ref);

    // A missing tag is NotFound and changes nothing.
    let before = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .images
        .len();
    let err = node
        .rt
        .pull_image(cri::PullImageRequest {
            image: spec(&format!("{}/library/busybox:nope", reg.host)),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let after = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .images
        .len();
    assert_eq!(before, after);

    // An unreachable registry is Unavailable.
    let dead = format!("127.0.0.1:{}", registry::free_port());
    let mut cfg2 = config(node.root.path(), &node.cgroup_root);
    cfg2.registry.insecure = vec![dead.clone()];
    let rt2 = BuiltinRuntime::new(cfg2).await.unwrap();
    let err = rt2
        .pull_image(cri::PullImageRequest {
            image: spec(&format!("{dead}/x/y:1")),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // A mirror for docker.io serves short names.
    let mirror_root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let mut cfg3 = config(mirror_root.path(), &node.cgroup_root);
    cfg3.registry.insecure = vec![reg.host.clone()];
    cfg3.registry
        .mirrors
        .insert("docker.io".into(), vec![reg.host.clone()]);
    let rt3 = BuiltinRuntime::new(cfg3).await.unwrap();
    let id3 = rt3
        .pull_image(cri::PullImageRequest {
            image: spec("busybox:1.0"),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("pull through mirror")
        .image_ref;
    // The same image under another name (another registry's) has the same id.
    assert_eq!(id3, config_digest);
    let st = rt3
        .image_status(cri::ImageStatusRequest {
            image: spec("docker.io/library/busybox:1.0"),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(st.image.is_some());

    // A node with no CA certificates at all (a minimal OS image: no /etc/ssl/certs) still
    // pulls from a plain-HTTP registry; HTTPS ones are verified against the built-in roots.
    let bare = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let no_certs = bare.path().join("no-certs.pem");
    std::fs::write(&no_certs, "").unwrap();
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(bare.path().join("root"))
        .args([
            "images",
            "pull",
            "--insecure-registry",
            &reg.host,
            &reference,
        ])
        .env("SSL_CERT_FILE", &no_certs)
        .env("SSL_CERT_DIR", bare.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pull with no CA certificates: {stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&config_digest),
        "{stderr}"
    );
    assert!(
        stderr.contains("Mozilla roots built into nodelet"),
        "no warning about the missing CA certificates: {stderr}"
    );

    // The registries config: docker.io's mirrors are a dead endpoint, then the registry, which
    // holds the repository only under another path (a rewrite). The pull falls back past the
    // dead one, naming it, and asks for the rewritten path.
    let hello = registry::push_archive(
        &client,
        &busybox_archive(),
        &reg.host,
        "mirrored/library/hello",
        "2.0",
    )
    .await;
    let dead = format!("127.0.0.1:{}", registry::free_port());
    let registries = bare.path().join("registries.yaml");
    std::fs::write(
        &registries,
        format!(
            "mirrors:\n  docker.io:\n    endpoint:\n      - http://{dead}\n      - http://{}\n    \
             rewrite:\n      \"^library/(.*)\": \"mirrored/library/$1\"\n",
            reg.host
        ),
    )
    .unwrap();
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(bare.path().join("root-mirrors"))
        .args(["images", "pull", "--registries-config"])
        .arg(&registries)
        .arg("hello:2.0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull through the mirrors: {stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&hello),
        "{stderr}"
    );
    assert!(
        stderr.contains(&dead) && stderr.contains("trying the next endpoint"),
        "the failed mirror is not named: {stderr}"
    );
    // The same through a registry hosts dir (containerd's certs.d layout): docker.io's hosts
    // are the dead endpoint, then its `server`, the local registry, which stands for docker.io
    // itself (docker.io is never asked).
    let hosted = registry::push_archive(
        &client,
        &busybox_archive(),
        &reg.host,
        "library/hosted",
        "3.0",
    )
    .await;
    let certs_d = bare.path().join("certs.d");
    std::fs::create_dir_all(certs_d.join("docker.io")).unwrap();
    std::fs::write(
        certs_d.join("docker.io/hosts.toml"),
        format!(
            "server = \"http://{}\"\n\n[host.\"http://{dead}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            reg.host
        ),
    )
    .unwrap();
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(bare.path().join("root-hosts"))
        .args(["images", "pull", "--registry-hosts-dir"])
        .arg(&certs_d)
        .arg("hosted:3.0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull through the hosts dir: {stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&hosted),
        "{stderr}"
    );
    assert!(
        stderr.contains(&dead) && stderr.contains("trying the next endpoint"),
        "the failed host is not named: {stderr}"
    );
    // Both a config file and a hosts dir: refused, naming both.
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(bare.path().join("root-hosts"))
        .args(["images", "pull", "--registry-hosts-dir"])
        .arg(&certs_d)
        .arg("--registries-config")
        .arg(&registries)
        .arg("hosted:3.0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("use one"), "{stderr}");

    // A broken config is refused before anything is pulled, naming the file and the field.
    std::fs::write(
        &registries,
        "mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(bare.path().join("root-mirrors"))
        .args(["images", "pull", "--registries-config"])
        .arg(&registries)
        .arg("hello:2.0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("registries.yaml") && stderr.contains("only http:// and https://"),
        "{stderr}"
    );

    // Over TLS with a certificate from a CA the test makes: the same storage served by a second
    // registry with TLS on another port.
    let pki = bare.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "nodelet test registry CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(pki.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(pki.join("registry.pem"), cert.pem()).unwrap();
    std::fs::write(pki.join("registry-key.pem"), key.serialize_pem()).unwrap();
    let tls_host = format!("127.0.0.1:{}", registry::free_port());
    let tls_config = pki.join("config.yml");
    std::fs::write(
        &tls_config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {tls_host}\n  tls:\n    certificate: {}\n    key: {}\n",
            reg.data.display(),
            pki.join("registry.pem").display(),
            pki.join("registry-key.pem").display()
        ),
    )
    .unwrap();
    let _tls_registry = KillOnDrop(
        std::process::Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&tls_config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..200 {
        if std::net::TcpStream::connect(&tls_host).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let tls_ref = format!("{tls_host}/library/busybox:1.0");
    let registries_yaml = |yaml: String| {
        let file = pki.join("registries.yaml");
        std::fs::write(&file, yaml).unwrap();
        runtime::builtin::RegistryConfig::from_file(&file, &[]).unwrap()
    };
    let pull_with = |registry: Option<runtime::builtin::RegistryConfig>| {
        let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
        let mut cfg = config(root.path(), &node.cgroup_root);
        if let Some(registry) = registry {
            cfg.registry = registry;
        }
        let reference = tls_ref.clone();
        async move {
            let rt = BuiltinRuntime::new(cfg).await.unwrap();
            let r = rt
                .pull_image(cri::PullImageRequest {
                    image: spec(&reference),
                    auth: None,
                    sandbox_config: None,
                })
                .await;
            drop(root);
            r
        }
    };
    // The node's roots do not know the test's CA.
    let err = pull_with(None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains(&tls_host), "{err}");
    // The config's CA for that endpoint lets the pull through, verified.
    let ca_yaml = format!(
        "configs:\n  \"{tls_host}\":\n    tls:\n      ca_file: {}\n",
        pki.join("ca.pem").display()
    );
    let id = pull_with(Some(registries_yaml(ca_yaml)))
        .await
        .expect("pull with the CA")
        .image_ref;
    assert_eq!(id, config_digest);
    // As does insecure_skip_verify, without any CA.
    let skip_yaml =
        format!("configs:\n  \"{tls_host}\":\n    tls:\n      insecure_skip_verify: true\n");
    let id = pull_with(Some(registries_yaml(skip_yaml)))
        .await
        .expect("pull with insecure_skip_verify")
        .image_ref;
    assert_eq!(id, config_digest);
    // The same CA from a registry hosts dir (containerd's certs.d layout), a path relative to
    // the registry's own dir.
    let certs_d = pki.join("certs.d");
    let own = certs_d.join(&tls_host);
    std::fs::create_dir_all(&own).unwrap();
    std::fs::copy(pki.join("ca.pem"), own.join("registry-ca.pem")).unwrap();
    std::fs::write(
        own.join("hosts.toml"),
        format!("server = \"https://{tls_host}\"\nca = \"registry-ca.pem\"\n"),
    )
    .unwrap();
    let hosts = runtime::builtin::RegistryConfig::from_hosts_dir(&certs_d, &[]).unwrap();
    let id = pull_with(Some(hosts))
        .await
        .expect("pull with the hosts dir's CA")
        .image_ref;
    assert_eq!(id, config_digest);
    node.teardown().await;
}

/// A registry behind basic auth (htpasswd): the CRI AuthConfig's username/password, or its
/// base64 `auth` field, let the pull through; wrong or missing credentials are refused with
/// PermissionDenied and leave nothing in the store.
#[tokio::test(flavor = "multi_thread")]
async fn pull_with_basic_auth() {
    if !root_or_skip("pull_with_basic_auth") {
        return;
    }
    if !std::path::Path::new("/usr/bin/htpasswd").exists()
        || !std::path::Path::new("/usr/bin/docker-registry").exists()
    {
        skip(
            "needs htpasswd from apache2-utils and docker-registry; run scripts/setup.sh",
            "pull_with_basic_auth",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    let st = std::process::Command::new("/usr/bin/htpasswd")
        .args(["-Bbc"])
        .arg(&htpasswd)
        .args(["alice", "s3cret"])
        .output()
        .unwrap();
    assert!(st.status.success());
    let port = registry::free_port();
    let host = format!("127.0.0.1:{port}");
    let registry_config = dir.path().join("config.yml");
    std::fs::write(
        &registry_config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\nauth:\n  htpasswd:\n    realm: nodelet-test\n    path: {}\n",
            dir.path().join("data").display(),
            htpasswd.display()
        ),
    )
    .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _reg = Kill(
        std::process::Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&registry_config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..200 {
        if std::net::TcpStream::connect(&host).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Push with credentials.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::HttpsExcept(vec![host.clone()]),
        ..Default::default()
    });
    let reference =
        oci_client::Reference::with_tag(host.clone(), "private/busybox".into(), "1".into());
    let auth = oci_client::secrets::RegistryAuth::Basic("alice".into(), "s3cret".into());
    client
        .auth(&reference, &auth, oci_client::RegistryOperation::Push)
        .await
        .expect("push auth");
    let unpacked = tempfile::tempdir().unwrap();
    tar::Archive::new(std::fs::File::open(busybox_archive()).unwrap())
        .unpack(unpacked.path())
        .unwrap();
    let blob = |d: &str| {
        std::fs::read(
            unpacked
                .path()
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(unpacked.path().join("index.json")).unwrap())
            .unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let mut digests = vec![manifest["config"]["digest"].as_str().unwrap().to_string()];
    for l in manifest["layers"].as_array().unwrap() {
        digests.push(l["digest"].as_str().unwrap().to_string());
    }
    for d in &digests {
        client
            .push_blob(&reference, blob(d), d)
            .await
            .expect("push blob");
    }
    let parsed: oci_client::manifest::OciImageManifest = serde_json::from_value(manifest).unwrap();
    client
        .push_manifest(&reference, &parsed.into())
        .await
        .expect("push manifest");

    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let mut cfg = config(root.path(), "/nodelet-e2e-unused");
    cfg.registry.insecure = vec![host.clone()];
    let rt = BuiltinRuntime::new(cfg).await.unwrap();
    let image = format!("{host}/private/busybox:1");
    let pull = |auth: Option<cri::AuthConfig>| {
        let rt = rt.clone();
        let image = image.clone();
        async move {
            rt.pull_image(cri::PullImageRequest {
                image: spec(&image),
                auth,
                sandbox_config: None,
            })
            .await
        }
    };
    let err = pull(None).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "anonymous: {err}");
    let err = pull(Some(cri::AuthConfig {
        username: "alice".into(),
        password: "wrong".into(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "wrong password: {err}");
    assert!(
        rt.list_images(cri::ListImagesRequest { filter: None })
            .await
            .unwrap()
            .images
            .is_empty()
    );
    let id = pull(Some(cri::AuthConfig {
        username: "alice".into(),
        password: "s3cret".into(),
        ..Default::default()
    }))
    .await
    .expect("pull with username/password")
    .image_ref;
    assert_eq!(id, digests[0]);
    rt.remove_image(cri::RemoveImageRequest {
        image: spec(&image),
    })
    .await
    .unwrap();
    // base64("alice:s3cret") in the `auth` field, as a kubelet sends from an imagePullSecret.
    let id = pull(Some(cri::AuthConfig {
        auth: "YWxpY2U6czNjcmV0".into(),
        ..Default::default()
    }))
    .await
    .expect("pull with auth field")
    .image_ref;
    assert_eq!(id, digests[0]);

    // The credentials from the registries config, when the pull brings none.
    let file = dir.path().join("registries.yaml");
    std::fs::write(
        &file,
        format!(
            "configs:\n  \"{host}\":\n    auth:\n      username: alice\n      password: s3cret\n"
        ),
    )
    .unwrap();
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let mut cfg = config(root.path(), "/nodelet-e2e-unused");
    cfg.registry =
        runtime::builtin::RegistryConfig::from_file(&file, std::slice::from_ref(&host)).unwrap();
    let configured = BuiltinRuntime::new(cfg).await.unwrap();
    let id = configured
        .pull_image(cri::PullImageRequest {
            image: spec(&image),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("pull with the registries config's credentials")
        .image_ref;
    assert_eq!(id, digests[0]);
}
