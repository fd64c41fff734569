//! Helpers for the registry tests: running Debian's docker-registry on a free local port (killed
//! on drop) and pushing images to it with oci-client.

use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY: &str = "/usr/bin/docker-registry";

/// A docker-registry child process, killed when dropped.
pub struct Registry {
    child: Child,
    pub host: String,
    /// The registry's storage root.
    pub data: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start_registry() -> Option<Registry> {
    if !Path::new(REGISTRY).exists() {
        skip(
            &format!("needs {REGISTRY}; apt-get install docker-registry"),
            "registry pull tests",
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let host = format!("127.0.0.1:{port}");
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {host}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting docker-registry");
    let registry = Registry {
        child,
        host: host.clone(),
        data: dir.path().join("data"),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&host).is_err() {
        assert!(
            Instant::now() < deadline,
            "docker-registry did not listen on {host}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(registry)
}

pub fn push_client(host: &str) -> oci_client::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::HttpsExcept(vec![host.to_string()]),
        ..Default::default()
    })
}

/// Pushes the OCI archive at `archive` as `repo:tag`; returns the config digest.
pub async fn push_archive(
    client: &oci_client::Client,
    archive: &Path,
    host: &str,
    repo: &str,
    tag: &str,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    tar::Archive::new(std::fs::File::open(archive).unwrap())
        .unpack(dir.path())
        .unwrap();
    let blob = |d: &str| {
        std::fs::read(
            dir.path()
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: Value = serde_json::from_slice(&blob(manifest_digest)).unwrap();
    let reference =
        oci_client::Reference::with_tag(host.to_string(), repo.to_string(), tag.to_string());
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    client
        .auth(&reference, &auth, oci_client::RegistryOperation::Push)
        .await
        .unwrap();
    let mut digests = vec![manifest["config"]["digest"].as_str().unwrap().to_string()];
    digests.extend(
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string()),
    );
    for d in &digests {
        client.push_blob(&reference, blob(d), d).await.unwrap();
    }
    let parsed: oci_client::manifest::OciImageManifest = serde_json::from_value(manifest).unwrap();
    client
        .push_manifest(&reference, &parsed.into())
        .await
        .unwrap();
    digests[0].clone()
}

pub async fn manifest_digest_and_size(
    client: &oci_client::Client,
    reference: &oci_client::Reference,
) -> (String, usize) {
    let (bytes, digest) = client
        .pull_manifest_raw(
            reference,
            &oci_client::secrets::RegistryAuth::Anonymous,
            &["application/vnd.oci.image.manifest.v1+json"],
        )
        .await
        .unwrap();
    (digest, bytes.len())
}

pub async fn client_index_digest(
    client: &oci_client::Client,
    reference: &oci_client::Reference,
) -> String {
    client
        .fetch_manifest_digest(reference, &oci_client::secrets::RegistryAuth::Anonymous)
        .await
        .unwrap()
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// Says that `test` cannot run on this machine because of `why`: a loud `SKIP (why): test` line
/// on stderr, and the test passes. Under CI (`CI` set to `true` or `1`) the test fails with that
/// line instead: CI never passes a test it did not run.
pub fn skip(why: &str, test: &str) {
    let line = format!("SKIP ({why}): {test}");
    if std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        panic!("{line}");
    }
    eprintln!("{line}");
}
