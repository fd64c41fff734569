//! End-to-end tests of the image store on a real image: the dynamic busybox image built by
//! scripts/build-busybox-image.sh in both archive formats, imported, resolved, mounted as an
//! overlay rootfs (and run), released; and pulled back from Debian's docker-registry after
//! pushing it there with oci-client.

mod common;

use common::{
    client_index_digest, free_port, manifest_digest_and_size, push_archive, push_client,
    sha256_hex, start_registry,
};
use images::{Kind, RegistryAuth, RegistryConfig, Store};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Builds the busybox image with the project's script.
fn build_image(out: &Path, format: &str, name: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-busybox-image.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(out)
        .args(["--format", format, "--name", name])
        .status()
        .expect("running build-busybox-image.sh");
    assert!(status.success(), "build-busybox-image.sh failed: {status}");
}

/// The mount lines of this process mentioning `path`.
fn mountinfo_mentions(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let needle = path.display().to_string();
    text.lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

#[test]
fn imports_both_formats_resolves_and_mounts_a_working_rootfs() {
    let dir = tempfile::tempdir().unwrap();
    let oci = dir.path().join("busybox-oci.tar");
    let docker = dir.path().join("busybox-docker.tar");
    build_image(&oci, "oci", "docker.io/library/busybox:latest");
    build_image(&docker, "docker", "docker.io/library/busybox:docker");
    let store = Store::open(dir.path().join("store")).unwrap();

    let from_oci = store.import(&oci).unwrap();
    assert_eq!(from_oci.len(), 1);
    let image = from_oci[0].clone();
    assert!(
        image.id.starts_with("sha256:") && image.id.len() == 71,
        "{}",
        image.id
    );
    assert_eq!(image.repo_tags, vec!["docker.io/library/busybox:latest"]);
    assert_eq!(image.config.cmd, vec!["sh"]);
    assert_eq!(image.config.env, vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
    assert_eq!(image.layers.len(), 1);
    assert!(
        image.size > 500_000,
        "busybox and libc are in the layer: {}",
        image.size
    );

    // The docker archive holds the same config (same id): one image, both names.
    let from_docker = store.import(&docker).unwrap();
    assert_eq!(from_docker.len(), 1);
    assert_eq!(from_docker[0].id, image.id);
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 1);
    let mut tags = listed[0].repo_tags.clone();
    tags.sort();
    assert_eq!(
        tags,
        vec![
            "docker.io/library/busybox:docker",
            "docker.io/library/busybox:latest"
        ]
    );
    assert_eq!(
        listed[0].repo_digests.len(),
        2,
        "an OCI and a docker manifest: {listed:?}"
    );

    let hex = image.id.trim_start_matches("sha256:");
    for reference in [
        "busybox",
        "docker.io/library/busybox:latest",
        "busybox:docker",
        &image.id,
        hex,
        &hex[..12],
        &image.repo_digests[0],
    ] {
        let found = store.resolve(reference).unwrap();
        assert_eq!(
            found.map(|i| i.id),
            Some(image.id.clone()),
            "resolving {reference}"
        );
    }
    assert!(store.resolve("busybox:nope").unwrap().is_none());

    let info = store.fs_info().unwrap();
    assert_eq!(info.mountpoint, store.root());
    assert!(info.used_bytes > image.size, "{info:?}");
    assert!(info.inodes_used > 10, "{info:?}");

    if !is_root() {
        eprintln!("SKIP (needs root): overlay rootfs part of the busybox test");
        return;
    }
    let target = dir.path().join("rootfs");
    let _unmount = UnmountOnDrop(target.clone());
    store.prepare_rootfs(&image.id, "ctr1", &target).unwrap();
    store.prepare_rootfs(&image.id, "ctr1", &target).unwrap();
    assert_eq!(store.rootfs_keys().unwrap(), vec!["ctr1"]);
    let sh = target.join("bin/sh");
    assert!(sh.exists(), "/bin/sh in the rootfs");
    assert!(target.join("tmp").is_dir());
    assert_eq!(
        mountinfo_mentions(&target.canonicalize().unwrap()).len(),
        1,
        "one overlay mounted at the target"
    );
    assert_eq!(store.remove("busybox").unwrap_err().kind(), Kind::InUse);

    // The rootfs runs: the dynamic busybox finds its loader and libc.
    if Path::new("/usr/sbin/chroot").exists() {
        let out = Command::new("/usr/sbin/chroot")
            .arg(&target)
            .args(["/bin/sh", "-c", "echo hello from $(id -un)"])
            .env_clear()
            .env("PATH", "/bin")
            .output()
            .unwrap();
        assert!(out.status.success(), "chroot sh failed: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "hello from root"
        );
    }

    // Writes go to the container's upper dir, never to the shared snapshot.
    let snapshot = find_snapshot_with(store.root(), "etc/passwd");
    let passwd_before = std::fs::read(snapshot.join("etc/passwd")).unwrap();
    std::fs::write(target.join("etc/passwd"), b"changed\n").unwrap();
    std::fs::write(target.join("tmp/new-file"), b"new").unwrap();
    std::fs::remove_file(target.join("bin/ls")).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join("etc/passwd")).unwrap(),
        passwd_before
    );
    assert!(!snapshot.join("tmp/new-file").exists());
    assert!(snapshot.join("bin/ls").exists());
    let upper = store.root().join("containers/ctr1/upper");
    assert_eq!(
        std::fs::read(upper.join("etc/passwd")).unwrap(),
        b"changed\n"
    );
    assert!(upper.join("tmp/new-file").exists());

    store.release_rootfs("ctr1", &target).unwrap();
    store.release_rootfs("ctr1", &target).unwrap();
    assert!(mountinfo_mentions(&target.canonicalize().unwrap()).is_empty());
    assert!(
        mountinfo_mentions(store.root()).is_empty(),
        "no trace of the store in mountinfo"
    );
    assert!(!store.root().join("containers/ctr1").exists());
    assert!(store.rootfs_keys().unwrap().is_empty());
    assert!(
        !target.join("bin/sh").exists(),
        "target is an empty dir again"
    );

    store.remove("busybox:docker").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert_eq!(
        std::fs::read_dir(store.root().join("snapshots"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(store.root().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
}

/// Detaches whatever is mounted at the path when dropped, so a failing test leaves no mount.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The snapshot fs dir holding `rel`.
fn find_snapshot_with(root: &Path, rel: &str) -> PathBuf {
    for entry in std::fs::read_dir(root.join("snapshots")).unwrap() {
        let fs = entry.unwrap().path().join("fs");
        if fs.join(rel).exists() {
            return fs;
        }
    }
    panic!("no snapshot holds {rel}");
}

#[tokio::test]
async fn pulls_from_a_local_registry() {
    let Some(registry) = start_registry() else {
        return;
    };
    let host = registry.host.clone();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    build_image(&archive, "oci", "busybox:latest");
    let client = push_client(&host);
    let config_digest = push_archive(&client, &archive, &host, "test/busybox", "v1").await;

    // A multi-arch index: the host's manifest and one for another architecture.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let other_arch = if arch == "arm64" { "amd64" } else { "arm64" };
    let other_config = serde_json::to_vec(&json!({
        "architecture": other_arch, "os": "linux", "config": {"Cmd": ["other"]},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let other_config_digest = format!("sha256:{}", sha256_hex(&other_config));
    let multi_ref =
        oci_client::Reference::with_tag(host.clone(), "test/busybox".into(), "multi".into());
    client
        .push_blob(&multi_ref, other_config.clone(), &other_config_digest)
        .await
        .unwrap();
    let other_manifest: oci_client::manifest::OciImageManifest = serde_json::from_value(json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": other_config_digest, "size": other_config.len()},
        "layers": [],
    }))
    .unwrap();
    // Pushed by tag, then read back: the registry's bytes define the digests the index uses.
    let other_ref =
        oci_client::Reference::with_tag(host.clone(), "test/busybox".into(), "other".into());
    client
        .push_manifest(&other_ref, &other_manifest.into())
        .await
        .unwrap();
    let (other_digest, other_size) = manifest_digest_and_size(&client, &other_ref).await;
    let v1_ref = oci_client::Reference::with_tag(host.clone(), "test/busybox".into(), "v1".into());
    let (host_digest, host_size) = manifest_digest_and_size(&client, &v1_ref).await;
    let index: oci_client::manifest::OciImageIndex = serde_json::from_value(json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": other_digest, "size": other_size,
             "platform": {"architecture": other_arch, "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": host_digest,
             "size": host_size, "platform": {"architecture": arch, "os": "linux"}},
        ],
    }))
    .unwrap();
    client
        .push_manifest_list(
            &multi_ref,
            &oci_client::secrets::RegistryAuth::Anonymous,
            index,
        )
        .await
        .unwrap();

    let store = Store::open(dir.path().join("store")).unwrap();
    let config = RegistryConfig {
        insecure: vec![host.clone()],
        ..Default::default()
    };
    let auth = RegistryAuth::default();
    let reference = format!("{host}/test/busybox:v1");
    let image = store.pull(&reference, &auth, &config).await.unwrap();
    assert_eq!(image.id, config_digest);
    assert_eq!(image.repo_tags, vec![reference.clone()]);
    assert_eq!(
        image.repo_digests,
        vec![format!("{host}/test/busybox@{}", image.manifest_digest)]
    );
    assert_eq!(image.config.cmd, vec!["sh"]);
    assert_eq!(
        store.resolve(&reference).unwrap().map(|i| i.id),
        Some(config_digest.clone())
    );
    assert_eq!(
        store.resolve(&image.repo_digests[0]).unwrap().map(|i| i.id),
        Some(config_digest.clone())
    );
    // Pulling again, and by digest, finds the same image.
    let again = store
        .pull(&image.repo_digests[0], &auth, &config)
        .await
        .unwrap();
    assert_eq!(again.id, image.id);
    assert_eq!(store.list().unwrap().len(), 1);

    // The index resolves to this host's manifest.
    let multi = store
        .pull(&format!("{host}/test/busybox:multi"), &auth, &config)
        .await
        .unwrap();
    assert_eq!(multi.id, config_digest, "picked {arch}, not {other_arch}");
    assert_eq!(multi.manifest_digest, image.manifest_digest);
    let index_digest = client_index_digest(&client, &multi_ref).await;
    assert_eq!(multi.repo_digests.len(), 2, "{multi:?}");
    assert!(
        multi
            .repo_digests
            .contains(&format!("{host}/test/busybox@{index_digest}")),
        "the repo digest of the multi tag is the index's: {multi:?}"
    );

    // A missing tag is NotFound; nothing is left in the staging area.
    let err = store
        .pull(&format!("{host}/test/busybox:missing"), &auth, &config)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Kind::NotFound, "{err}");
    let err = store
        .pull(&format!("{host}/test/nothing:v1"), &auth, &config)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Kind::NotFound, "{err}");
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0
    );

    // A registry nobody listens on is Unavailable.
    let closed = format!("127.0.0.1:{}", free_port());
    let config = RegistryConfig {
        insecure: vec![closed.clone()],
        ..Default::default()
    };
    let err = store
        .pull(&format!("{closed}/x/y:1"), &auth, &config)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Kind::Unavailable, "{err}");

    // A mirror that is down is skipped in favour of the registry itself.
    let config = RegistryConfig {
        insecure: vec![host.clone(), closed.clone()],
        mirrors: [(host.clone(), vec![closed.clone()])].into_iter().collect(),
    };
    let via = store.pull(&reference, &auth, &config).await.unwrap();
    assert_eq!(via.id, config_digest);

    // A layer corrupted in the registry's storage is refused, leaving nothing behind.
    assert_eq!(image.layers.len(), 1);
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(
            store
                .root()
                .join("blobs/sha256")
                .join(image.manifest_digest.trim_start_matches("sha256:")),
        )
        .unwrap(),
    )
    .unwrap();
    let layer_hex = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let stored = registry
        .data
        .join("docker/registry/v2/blobs/sha256")
        .join(&layer_hex[..2])
        .join(&layer_hex)
        .join("data");
    let mut bytes = std::fs::read(&stored).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&stored, &bytes).unwrap();
    let fresh = Store::open(dir.path().join("fresh")).unwrap();
    let config = RegistryConfig {
        insecure: vec![host.clone()],
        ..Default::default()
    };
    let err = fresh.pull(&reference, &auth, &config).await.unwrap_err();
    assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
    assert!(matches!(err, images::Error::DigestMismatch { .. }), "{err}");
    assert!(fresh.list().unwrap().is_empty());
    assert_eq!(
        std::fs::read_dir(fresh.root().join("tmp")).unwrap().count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(fresh.root().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );

    if is_root() {
        let target = dir.path().join("pulled-rootfs");
        let _unmount = UnmountOnDrop(target.clone());
        store.prepare_rootfs(&image.id, "pulled", &target).unwrap();
        assert!(target.join("bin/sh").exists());
        store.release_rootfs("pulled", &target).unwrap();
    } else {
        eprintln!("SKIP (needs root): mounting the pulled image");
    }
    drop(registry);
}
