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
        common::skip("needs root", "overlay rootfs part of the busybox test");
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
        ..Default::default()
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
        common::skip("needs root", "mounting the pulled image");
    }
    drop(registry);
}

/// A process in a fresh user namespace mapping IDs 0..65536 to 100000..165536, killed on drop.
struct UserNamespace(std::process::Child);

impl UserNamespace {
    fn new() -> Self {
        let child = Command::new("unshare")
            .args(["--user", "sleep", "300"])
            .spawn()
            .expect("running unshare");
        let ns = UserNamespace(child);
        let pid = ns.0.id();
        let own = std::fs::read_link("/proc/self/ns/user").unwrap();
        for _ in 0..200 {
            if std::fs::read_link(format!("/proc/{pid}/ns/user")).is_ok_and(|l| l != own) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::fs::write(format!("/proc/{pid}/uid_map"), "0 100000 65536\n").unwrap();
        std::fs::write(format!("/proc/{pid}/setgroups"), "deny").unwrap();
        std::fs::write(format!("/proc/{pid}/gid_map"), "0 100000 65536\n").unwrap();
        ns
    }

    /// Runs a shell command as the namespace's root.
    fn sh(&self, script: &str) -> String {
        let out = Command::new("nsenter")
            .args([
                "--user",
                "--target",
                &self.0.id().to_string(),
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for UserNamespace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn owner(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn an_id_mapped_rootfs_belongs_to_the_namespace_root() {
    if !is_root() {
        common::skip("needs root", "ID-mapped rootfs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let oci = dir.path().join("busybox-oci.tar");
    build_image(&oci, "oci", "docker.io/library/busybox:latest");
    let store = Store::open(dir.path().join("store")).unwrap();
    let image = store.import(&oci).unwrap().remove(0);
    let ns = UserNamespace::new();
    let userns = std::fs::File::open(format!("/proc/{}/ns/user", ns.0.id())).unwrap();
    let target = dir.path().join("rootfs");
    let _unmount = UnmountOnDrop(target.clone());
    let idmap = images::RootfsIdMap {
        userns: std::os::fd::AsFd::as_fd(&userns),
        root_uid: 100_000,
        root_gid: 100_000,
    };
    store
        .prepare_rootfs_mapped(&image.id, "mapped", &target, &idmap)
        .unwrap();
    // Idempotent, as for a plain rootfs.
    store
        .prepare_rootfs_mapped(&image.id, "mapped", &target, &idmap)
        .unwrap();
    // The node sees the image's files, and the root dir, as the namespace root's...
    assert_eq!(owner(&target.join("bin/busybox")), (100_000, 100_000));
    assert_eq!(owner(&target), (100_000, 100_000));
    // ... while the shared snapshot keeps them the node root's.
    let snapshot = find_snapshot_with(store.root(), "bin/busybox");
    assert_eq!(owner(&snapshot.join("bin/busybox")), (0, 0));
    // Inside, they are root's, and root can change them (a copy-up) and add files.
    let t = target.display();
    let out = ns.sh(&format!(
        "stat -c %u:%g {t}/bin/busybox {t}/etc/passwd && echo x >> {t}/etc/passwd && \
         mkdir {t}/new && echo y > {t}/new/file && stat -c %u {t}/new/file"
    ));
    assert_eq!(out, "0:0\n0:0\n0\n", "{out}");
    let upper = store.root().join("containers/mapped/upper");
    assert_eq!(owner(&upper.join("etc/passwd")), (100_000, 100_000));
    assert_eq!(owner(&upper.join("new/file")), (100_000, 100_000));
    assert_eq!(owner(&snapshot.join("etc/passwd")), (0, 0));
    // The ID-mapped layers are attached only while the overlay is being mounted (it keeps its
    // own references to them): the one mount left is the rootfs.
    assert!(!store.root().join("containers/mapped/idmapped").exists());
    let mentions = mountinfo_mentions(store.root());
    let points: Vec<&str> = mentions
        .iter()
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    assert_eq!(points, [target.canonicalize().unwrap().to_str().unwrap()]);
    store.release_rootfs("mapped", &target).unwrap();
    assert!(mountinfo_mentions(&target.canonicalize().unwrap()).is_empty());
    assert!(mountinfo_mentions(store.root()).is_empty());
    // A namespace that cannot map (the node's own) is an error, not a plain mount.
    let node_ns = std::fs::File::open("/proc/self/ns/user").unwrap();
    let node = images::RootfsIdMap {
        userns: std::os::fd::AsFd::as_fd(&node_ns),
        ..idmap
    };
    let err = store
        .prepare_rootfs_mapped(&image.id, "gone", &target, &node)
        .unwrap_err();
    assert!(err.to_string().contains("ID-mapping"), "{err}");
    assert!(mountinfo_mentions(store.root()).is_empty());
    assert!(!store.root().join("containers/gone").exists());
}

/// A relay to `upstream` on 127.0.0.1 that, while `cut` is set, drops each connection once it
/// has carried 32 KiB from the registry: the registry dying in the middle of a layer (the
/// manifest and the config are smaller). Returns its address.
async fn cutting_relay(
    upstream: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> String {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CUT_AFTER: usize = 32 * 1024;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let cut = cut.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut buf = vec![0u8; 8192];
                let mut carried = 0;
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if cut.load(Ordering::SeqCst) && carried + n > CUT_AFTER {
                        let _ = cw.write_all(&buf[..CUT_AFTER - carried]).await;
                        break;
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    carried += n;
                }
                up.abort();
            });
        }
    });
    addr
}

/// Every file under `dir` (recursively).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The registry goes away in the middle of a layer: the pull fails with an error, nothing of
/// it is kept (no blob, no staging file, no image), and the next pull works and gives the
/// whole image.
#[tokio::test]
async fn a_registry_that_dies_mid_pull_leaves_nothing_and_the_next_pull_works() {
    let Some(registry) = start_registry() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    build_image(&archive, "oci", "busybox:latest");
    let client = push_client(&registry.host);
    let config_digest = push_archive(&client, &archive, &registry.host, "test/busybox", "v1").await;
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let relay = cutting_relay(registry.host.clone(), cut.clone()).await;

    let store = Store::open(dir.path().join("store")).unwrap();
    let config = RegistryConfig {
        insecure: vec![relay.clone()],
        ..Default::default()
    };
    let reference = format!("{relay}/test/busybox:v1");
    let err = store
        .pull(&reference, &RegistryAuth::default(), &config)
        .await
        .expect_err("a pull whose layer is cut off fails");
    // As an unreachable registry: Unavailable, with the registry named.
    assert_eq!(err.kind(), Kind::Unavailable, "{err}");
    assert!(err.to_string().contains(&relay), "{err}");
    let kept: Vec<PathBuf> = files_under(&dir.path().join("store"))
        .into_iter()
        .filter(|p| !p.ends_with("lock") && !p.ends_with("images.json"))
        .collect();
    assert!(
        kept.is_empty(),
        "nothing of the failed pull is kept: {kept:?}"
    );
    assert!(store.list().unwrap().is_empty(), "no image");

    cut.store(false, std::sync::atomic::Ordering::SeqCst);
    let image = store
        .pull(&reference, &RegistryAuth::default(), &config)
        .await
        .expect("the next pull works");
    assert_eq!(image.id, config_digest);
    let layers = files_under(&dir.path().join("store/blobs"));
    assert!(
        layers.len() >= 3,
        "manifest, config and layer blobs: {layers:?}"
    );
}
