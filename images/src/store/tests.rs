//! Store tests on hand-built OCI layouts: import and resolve, refused inputs leaving the store
//! untouched, multi-arch selection, retagging, removal and garbage collection.

use super::*;
use crate::Kind;
use crate::digest::sha256_bytes;
use crate::platform::host;
use crate::testutil::{Oci, is_root, layer, tree};
use serde_json::json;
use std::path::PathBuf;

fn other_arch() -> &'static str {
    if host().architecture == "arm64" {
        "amd64"
    } else {
        "arm64"
    }
}

/// Detaches whatever is mounted at the path when dropped, so a failing test leaves no mount.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    (dir, store)
}

/// A one-image layout named `name`.
fn simple(name: &str, files: &[(&str, &[u8])]) -> (Oci, crate::testutil::Built) {
    let mut oci = Oci::default();
    let built = oci.image(&[layer(files)], host().architecture, "sh", None);
    oci.entry(built.manifest.clone(), Some(name));
    (oci, built)
}

#[test]
fn imports_and_resolves_every_way() {
    let (dir, store) = store();
    let (oci, built) = simple("docker.io/library/busybox:latest", &[("bin/sh", b"#!")]);
    let archive = dir.path().join("img.tar");
    oci.write_tar(&archive);
    let images = store.import(&archive).unwrap();
    assert_eq!(images.len(), 1);
    let img = &images[0];
    assert_eq!(img.id, built.config_digest);
    assert_eq!(img.repo_tags, vec!["docker.io/library/busybox:latest"]);
    let manifest_digest = built.manifest["digest"].as_str().unwrap();
    assert_eq!(
        img.repo_digests,
        vec![format!("docker.io/library/busybox@{manifest_digest}")]
    );
    assert_eq!(img.manifest_digest, manifest_digest);
    assert_eq!(img.config.cmd, vec!["sh"]);
    assert_eq!(img.layers.len(), 1);
    let blob_sizes: u64 = oci
        .blobs
        .iter()
        .filter(|(d, _)| **d == built.config_digest || built.layer_digests.contains(d))
        .map(|(_, b)| b.len() as u64)
        .sum();
    assert_eq!(img.size, blob_sizes);

    let hex = img.id.strip_prefix("sha256:").unwrap();
    for reference in [
        "busybox",
        "busybox:latest",
        "docker.io/library/busybox:latest",
        img.id.as_str(),
        hex,
        &hex[..12],
        &format!("sha256:{}", &hex[..16]),
        &format!("busybox@{manifest_digest}"),
    ] {
        let found = store.resolve(reference).unwrap();
        assert_eq!(
            found.as_ref().map(|i| &i.id),
            Some(&img.id),
            "resolving {reference}"
        );
    }
    assert_eq!(store.resolve("busybox:other").unwrap(), None);
    assert_eq!(
        store.resolve(&hex[..11]).unwrap(),
        None,
        "prefixes shorter than 12 do not match"
    );
    assert_eq!(
        store.resolve("Bad Ref").unwrap_err().kind(),
        Kind::InvalidArgument
    );
    assert_eq!(store.list().unwrap(), images);
    // Every blob of the image is in the store, verified.
    for d in oci.blobs.keys() {
        let path = store
            .root()
            .join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap());
        assert_eq!(sha256_bytes(&std::fs::read(&path).unwrap()), *d);
    }
    // Importing again changes nothing.
    let before = tree(store.root());
    assert_eq!(store.import(&archive).unwrap(), images);
    assert_eq!(tree(store.root()), before);
    // So does a gzip-compressed archive.
    let gz = dir.path().join("img.tar.gz");
    std::fs::write(
        &gz,
        crate::testutil::gzip(&std::fs::read(&archive).unwrap()),
    )
    .unwrap();
    assert_eq!(store.import(&gz).unwrap(), images);
    assert_eq!(tree(store.root()), before);
    // The directory form imports the same image.
    let layout = dir.path().join("layout");
    oci.write_dir(&layout);
    assert_eq!(store.import(&layout).unwrap(), images);
}

#[test]
fn refused_archives_leave_the_store_unchanged() {
    let (dir, store) = store();
    // Something already in the store, so "unchanged" means more than "empty".
    let (good, _) = simple("a:1", &[("a", b"a")]);
    good.write_tar(&dir.path().join("good.tar"));
    store.import(&dir.path().join("good.tar")).unwrap();
    let before = tree(store.root());

    let mut cases: Vec<(&str, std::path::PathBuf)> = Vec::new();
    // A layer whose content does not match its descriptor.
    let (mut bad, built) = simple("b:1", &[("b", b"b")]);
    let layer_digest = &built.layer_digests[0];
    let blob = bad.blobs.get_mut(layer_digest).unwrap();
    let last = blob.len() - 1;
    blob[last] ^= 0xff;
    bad.write_tar(&dir.path().join("digest.tar"));
    cases.push(("digest mismatch", dir.path().join("digest.tar")));
    // A config promising another diff_id.
    let mut oci = Oci::default();
    let built = oci.image(
        &[layer(&[("c", b"c")])],
        host().architecture,
        "sh",
        Some(vec![sha256_bytes(b"other")]),
    );
    oci.entry(built.manifest, Some("c:1"));
    oci.write_tar(&dir.path().join("diffid.tar"));
    cases.push(("diff_id mismatch", dir.path().join("diffid.tar")));
    // A truncated archive.
    let (t, _) = simple("d:1", &[("d", &[7u8; 100_000])]);
    t.write_tar(&dir.path().join("full.tar"));
    let full = std::fs::read(dir.path().join("full.tar")).unwrap();
    std::fs::write(dir.path().join("truncated.tar"), &full[..full.len() / 2]).unwrap();
    cases.push(("truncated", dir.path().join("truncated.tar")));
    // Garbage.
    std::fs::write(dir.path().join("garbage.tar"), vec![0x42u8; 4096]).unwrap();
    cases.push(("garbage", dir.path().join("garbage.tar")));
    // A missing blob.
    let (mut missing, built) = simple("e:1", &[("e", b"e")]);
    missing.blobs.remove(&built.layer_digests[0]);
    missing.write_tar(&dir.path().join("missing.tar"));
    cases.push(("missing blob", dir.path().join("missing.tar")));

    for (name, path) in cases {
        let err = store.import(&path).expect_err(name);
        assert_eq!(err.kind(), Kind::InvalidArgument, "{name}: {err}");
        assert_eq!(tree(store.root()), before, "{name} left something behind");
    }
    let err = store.import(&dir.path().join("nope.tar")).unwrap_err();
    assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
}

#[test]
fn multi_arch_index_picks_the_host_platform() {
    let (dir, store) = store();
    let mut oci = Oci::default();
    let theirs = oci.image(
        &[layer(&[("which", b"other")])],
        other_arch(),
        "other",
        None,
    );
    let ours = oci.image(
        &[layer(&[("which", b"host")])],
        host().architecture,
        "host",
        None,
    );
    let index = oci.index(vec![theirs.manifest.clone(), ours.manifest.clone()]);
    oci.entry(index.clone(), Some("multi:1"));
    oci.write_tar(&dir.path().join("multi.tar"));
    let images = store.import(&dir.path().join("multi.tar")).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].id, ours.config_digest);
    assert_eq!(images[0].config.cmd, vec!["host"]);
    assert_eq!(
        images[0].manifest_digest,
        ours.manifest["digest"].as_str().unwrap()
    );
    // The name points at the index, as a registry would report it.
    assert_eq!(
        images[0].repo_digests,
        vec![format!(
            "docker.io/library/multi@{}",
            index["digest"].as_str().unwrap()
        )]
    );
    // The other platform's blobs were not taken.
    let theirs_config = store
        .root()
        .join("blobs/sha256")
        .join(theirs.config_digest.strip_prefix("sha256:").unwrap());
    assert!(!theirs_config.exists());

    // Only other platforms: NotFound, nothing stored.
    let before = tree(store.root());
    let mut only = Oci::default();
    let built = only.image(&[layer(&[("x", b"x")])], other_arch(), "x", None);
    let index = only.index(vec![built.manifest]);
    only.entry(index, Some("only:1"));
    only.write_tar(&dir.path().join("only.tar"));
    let err = store.import(&dir.path().join("only.tar")).unwrap_err();
    assert_eq!(err.kind(), Kind::NotFound, "{err}");
    assert_eq!(tree(store.root()), before);
}

#[test]
fn names_move_between_images_and_bare_tags_name_nothing() {
    let (dir, store) = store();
    let (one, b1) = simple("app:v1", &[("f", b"1")]);
    one.write_tar(&dir.path().join("1.tar"));
    store.import(&dir.path().join("1.tar")).unwrap();
    let (two, b2) = simple("app:v1", &[("f", b"2")]);
    two.write_tar(&dir.path().join("2.tar"));
    store.import(&dir.path().join("2.tar")).unwrap();
    assert_eq!(
        store.resolve("app:v1").unwrap().unwrap().id,
        b2.config_digest
    );
    let old = store.resolve(&b1.config_digest).unwrap().unwrap();
    assert!(old.repo_tags.is_empty(), "the tag moved: {old:?}");

    let mut oci = Oci::default();
    let built = oci.image(&[layer(&[("g", b"g")])], host().architecture, "sh", None);
    let mut d = built.manifest.clone();
    d["annotations"] = json!({"org.opencontainers.image.ref.name": "latest"});
    oci.entries.push(d);
    let mut named = built.manifest.clone();
    named["annotations"] = json!({"org.opencontainers.image.ref.name": "quay.io/x/y:2"});
    oci.entries.push(named);
    oci.write_dir(&dir.path().join("refname"));
    let images = store.import(&dir.path().join("refname")).unwrap();
    assert_eq!(images.len(), 1, "two entries of one manifest are one image");
    assert_eq!(images[0].repo_tags, vec!["quay.io/x/y:2"]);
}

#[test]
fn remove_deletes_all_tags_and_unreferenced_content() {
    let (dir, store) = store();
    let base = layer(&[("base", b"shared")]);
    let mut oci = Oci::default();
    let a = oci.image(
        &[base.clone(), layer(&[("a", b"only a")])],
        host().architecture,
        "a",
        None,
    );
    oci.entry(a.manifest.clone(), Some("a:1"))
        .entry(a.manifest.clone(), Some("a:2"));
    let b = oci.image(
        &[base.clone(), layer(&[("b", b"only b")])],
        host().architecture,
        "b",
        None,
    );
    oci.entry(b.manifest.clone(), Some("b:1"));
    oci.write_tar(&dir.path().join("ab.tar"));
    store.import(&dir.path().join("ab.tar")).unwrap();
    let img_a = store.resolve("a:1").unwrap().unwrap();
    assert_eq!(img_a.repo_tags.len(), 2);
    let snapshots = |s: &Store| {
        std::fs::read_dir(s.root().join("snapshots"))
            .unwrap()
            .count()
    };
    assert_eq!(snapshots(&store), 3, "the shared base is unpacked once");

    assert_eq!(
        store.remove("nothing:here").unwrap_err().kind(),
        Kind::NotFound
    );
    store.remove("a:2").unwrap();
    assert_eq!(store.resolve("a:1").unwrap(), None, "every tag went");
    assert_eq!(store.resolve(&img_a.id).unwrap(), None);
    let blob = |d: &str| {
        store
            .root()
            .join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap())
    };
    assert!(!blob(&a.config_digest).exists());
    assert!(!blob(a.manifest["digest"].as_str().unwrap()).exists());
    assert!(!blob(&a.layer_digests[1]).exists());
    assert!(
        blob(&a.layer_digests[0]).exists(),
        "shared layer kept for b"
    );
    assert!(blob(&b.config_digest).exists());
    assert_eq!(snapshots(&store), 2);
    store.remove("b:1").unwrap();
    assert_eq!(snapshots(&store), 0);
    assert_eq!(
        std::fs::read_dir(store.root().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn remove_is_refused_while_a_rootfs_uses_the_image() {
    if !is_root() {
        crate::testutil::skip("needs root", "remove while in use mounts an overlay");
        return;
    }
    let (dir, store) = store();
    let (oci, _) = simple("busy:1", &[("bin/sh", b"sh")]);
    oci.write_tar(&dir.path().join("busy.tar"));
    let id = store.import(&dir.path().join("busy.tar")).unwrap()[0]
        .id
        .clone();
    let target = dir.path().join("rootfs");
    let _unmount = UnmountOnDrop(target.clone());
    store.prepare_rootfs(&id, "c1", &target).unwrap();
    // Idempotent, and the key is recorded.
    store.prepare_rootfs(&id, "c1", &target).unwrap();
    assert_eq!(store.rootfs_keys().unwrap(), vec!["c1"]);
    let err = store.remove("busy:1").unwrap_err();
    assert_eq!(err.kind(), Kind::InUse, "{err}");
    assert!(store.resolve("busy:1").unwrap().is_some());
    assert_eq!(std::fs::read(target.join("bin/sh")).unwrap(), b"sh");
    std::fs::write(target.join("written"), b"by the container").unwrap();
    store.release_rootfs("c1", &target).unwrap();
    store.release_rootfs("c1", &target).unwrap();
    store.release_rootfs("never", &target).unwrap();
    assert!(store.rootfs_keys().unwrap().is_empty());
    // The writable layer is gone, whether deleted in place or out of the way in tmp/.
    for dir in ["containers", "tmp"] {
        let left: Vec<_> = std::fs::read_dir(store.root().join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{dir}: {left:?}");
    }
    store.remove("busy:1").unwrap();
}

/// A container that exited has its rootfs unmounted at once, as containerd unmounts a task's:
/// what it wrote stays in its upper dir (counted as its writable layer) and the image stays in
/// use until the rootfs is released, which still deletes everything.
#[test]
fn an_unmounted_rootfs_keeps_its_writable_layer_until_released() {
    if !is_root() {
        crate::testutil::skip("needs root", "unmounting a rootfs mounts an overlay");
        return;
    }
    let (dir, store) = store();
    let (oci, _) = simple("done:1", &[("bin/sh", b"sh")]);
    oci.write_tar(&dir.path().join("done.tar"));
    let id = store.import(&dir.path().join("done.tar")).unwrap()[0]
        .id
        .clone();
    let target = dir.path().join("rootfs");
    let _unmount = UnmountOnDrop(target.clone());
    store.prepare_rootfs(&id, "c1", &target).unwrap();
    std::fs::write(target.join("written"), vec![7u8; 10_000]).unwrap();
    let usage = store.rootfs_usage("c1").unwrap();
    let canonical = target.canonicalize().unwrap();
    for _ in 0..2 {
        store.unmount_rootfs("c1", &target).unwrap();
        assert!(!crate::mounts::is_mountpoint(&canonical).unwrap());
    }
    store.unmount_rootfs("never", &target).unwrap();
    assert!(!target.join("written").exists());
    assert_eq!(
        std::fs::read(store.root().join("containers/c1/upper/written")).unwrap(),
        vec![7u8; 10_000]
    );
    assert_eq!(store.rootfs_usage("c1").unwrap(), usage);
    assert_eq!(store.rootfs_keys().unwrap(), vec!["c1"]);
    assert_eq!(store.remove("done:1").unwrap_err().kind(), Kind::InUse);
    store.release_rootfs("c1", &target).unwrap();
    assert!(store.rootfs_keys().unwrap().is_empty());
    assert!(!store.root().join("containers/c1").exists());
    store.remove("done:1").unwrap();
}

/// A rootfs whose release was cut short after its dirs were moved out of the way (into tmp/,
/// to be deleted without the store's lock) is deleted at the next open.
#[test]
fn a_release_cut_short_is_finished_at_open() {
    let (dir, store) = store();
    // What a release moved aside before its process died (no process has this pid).
    let doomed = store.root().join("tmp").join("4194304999-released-k");
    std::fs::create_dir_all(doomed.join("upper/etc")).unwrap();
    std::fs::write(doomed.join("upper/etc/hosts"), b"x").unwrap();
    drop(store);
    let store = Store::open(dir.path().join("store")).unwrap();
    assert!(!doomed.exists());
    assert!(store.rootfs_keys().unwrap().is_empty());
}

#[test]
fn rootfs_through_fd_paths_and_conflicting_keys() {
    if !is_root() {
        crate::testutil::skip("needs root", "mounts overlays");
        return;
    }
    let (dir, store) = store();
    let mut oci = Oci::default();
    let built = oci.image(
        &[layer(&[("x", b"lower")]), layer(&[("y", b"upper")])],
        host().architecture,
        "sh",
        None,
    );
    oci.entry(built.manifest, Some("fds:1"));
    let other = oci.image(&[layer(&[("z", b"z")])], host().architecture, "other", None);
    oci.entry(other.manifest, Some("other:1"));
    oci.write_dir(&dir.path().join("layout"));
    store.import(&dir.path().join("layout")).unwrap();
    let target = dir.path().join("t");
    let _unmount = UnmountOnDrop(target.clone());
    store
        .prepare_rootfs_with("fds:1", "k", &target, None, true)
        .unwrap();
    assert_eq!(std::fs::read(target.join("x")).unwrap(), b"lower");
    assert_eq!(std::fs::read(target.join("y")).unwrap(), b"upper");
    let err = store.prepare_rootfs("other:1", "k", &target).unwrap_err();
    assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
    assert_eq!(
        store
            .prepare_rootfs("missing:1", "k2", &target)
            .unwrap_err()
            .kind(),
        Kind::NotFound
    );
    store.release_rootfs("k", &target).unwrap();
    assert!(!crate::mounts::is_mountpoint(&target.canonicalize().unwrap()).unwrap());
}

#[test]
fn concurrent_imports_of_one_archive_agree() {
    let (dir, store) = store();
    let (oci, built) = simple("same:1", &[("f", &[3u8; 50_000])]);
    oci.write_tar(&dir.path().join("same.tar"));
    let archive = dir.path().join("same.tar");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let store = Store::open(store.root()).unwrap();
            let archive = archive.clone();
            std::thread::spawn(move || store.import(&archive).unwrap())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap()[0].id, built.config_digest);
    }
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(
        std::fs::read_dir(store.root().join("snapshots"))
            .unwrap()
            .count(),
        1
    );
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0,
        "staging cleaned up"
    );
}

#[test]
fn store_is_shareable_and_pull_futures_are_send() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<Store>();
    fn send<T: Send>(_: &T) {}
    let (_dir, store) = store();
    let auth = crate::RegistryAuth::default();
    let config = crate::RegistryConfig::default();
    let pull = store.pull("busybox", &auth, &config);
    send(&pull);
}

/// A pin survives a reopen and a re-import; an unknown image cannot be pinned.
#[test]
fn a_pin_survives_a_reopen_and_a_reimport() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let mut oci = Oci::default();
    let built = oci.image(&[layer(&[("a", b"a")])], host().architecture, "a", None);
    oci.entry(built.manifest.clone(), Some("a:1"));
    let archive = dir.path().join("a.tar");
    oci.write_tar(&archive);
    store.import(&archive).unwrap();
    assert!(!store.resolve("a:1").unwrap().unwrap().pinned);

    assert!(store.set_pinned("a:1", true).unwrap().pinned);
    drop(store);
    let store = Store::open(&root).unwrap();
    assert!(store.list().unwrap()[0].pinned, "kept in the index");
    store.import(&archive).unwrap();
    assert!(store.resolve(&built.config_digest).unwrap().unwrap().pinned);

    assert!(!store.set_pinned("a:1", false).unwrap().pinned);
    assert!(!store.resolve("a:1").unwrap().unwrap().pinned);
    let e = store.set_pinned("nothing:1", true).unwrap_err();
    assert_eq!(e.kind(), Kind::NotFound, "{e}");
}
