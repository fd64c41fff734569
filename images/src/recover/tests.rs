//! Unreadable state at open: the index rebuilt from content, snapshot markers, rootfs records
//! set aside until their owner restores them.

use crate::platform::host;
use crate::testutil::{Oci, is_root, layer, tree};
use crate::{Kind, Store};
use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn tear(path: &Path) {
    let data = std::fs::read(path).unwrap();
    std::fs::write(path, &data[..data.len() / 2]).unwrap();
}

#[test]
fn an_unreadable_index_is_set_aside_and_rebuilt_from_content() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    // A: two layers, imported first. B: behind a multi-arch index, sharing A's bottom layer.
    let mut a = Oci::default();
    let shared = layer(&[("bin/sh", b"sh")]);
    let built_a = a.image(
        &[shared.clone(), layer(&[("a", b"a")])],
        host().architecture,
        "a",
        None,
    );
    a.entry(built_a.manifest.clone(), Some("a:1"));
    a.write_tar(&dir.path().join("a.tar"));
    store.import(&dir.path().join("a.tar")).unwrap();
    let mut b = Oci::default();
    let built_b = b.image(
        &[shared, layer(&[("b", b"b")])],
        host().architecture,
        "b",
        None,
    );
    let index = b.index(vec![built_b.manifest.clone()]);
    b.entry(index.clone(), Some("b:1"));
    b.write_tar(&dir.path().join("b.tar"));
    store.import(&dir.path().join("b.tar")).unwrap();
    let before = store.list().unwrap();
    let snapshots = tree(&root.join("snapshots"));
    drop(store);

    tear(&root.join("images.json"));
    let store = Store::open(&root).unwrap();
    let after = store.list().unwrap();
    assert_eq!(after.len(), 2, "{after:?}");
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old.id, new.id);
        assert_eq!(old.layers, new.layers);
        assert_eq!(old.config, new.config);
        assert_eq!(old.manifest_digest, new.manifest_digest);
        assert_eq!(old.size, new.size);
    }
    // Names come from the previous generation, which knew A but not B yet.
    let a_id = &built_a.config_digest;
    let b_id = &built_b.config_digest;
    let named = |id: &str| after.iter().find(|i| i.id == id).unwrap().repo_tags.clone();
    assert_eq!(named(a_id), vec!["docker.io/library/a:1"]);
    assert!(named(b_id).is_empty());
    assert_eq!(store.resolve(b_id).unwrap().unwrap().id, *b_id);
    // The torn file is kept for inspection; nothing was unpacked again.
    let aside = files(&root.join("corrupt"));
    assert!(
        aside.len() == 1 && aside[0].starts_with("images.json."),
        "{aside:?}"
    );
    assert_eq!(tree(&root.join("snapshots")), snapshots);

    // Importing B again names it, with no new snapshot.
    store.import(&dir.path().join("b.tar")).unwrap();
    assert_eq!(named_now(&store, b_id), vec!["docker.io/library/b:1"]);
    assert_eq!(tree(&root.join("snapshots")), snapshots);
    // Removing A sweeps what only A needed and keeps all of B, its index blob included.
    store.remove(a_id).unwrap();
    let blob = |d: &str| {
        root.join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap())
    };
    assert!(blob(index["digest"].as_str().unwrap()).exists());
    assert!(blob(built_b.manifest["digest"].as_str().unwrap()).exists());
    assert!(!blob(built_a.manifest["digest"].as_str().unwrap()).exists());
    assert!(!blob(&built_a.layer_digests[1]).exists());
    assert!(blob(&built_a.layer_digests[0]).exists(), "shared with B");
    assert_eq!(files(&root.join("snapshots")).len(), 2);
}

fn named_now(store: &Store, id: &str) -> Vec<String> {
    store.resolve(id).unwrap().unwrap().repo_tags
}

#[test]
fn an_image_missing_content_is_not_rebuilt_and_snapshots_are_numbered_past_every_dir() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let mut oci = Oci::default();
    let whole = oci.image(&[layer(&[("w", b"w")])], host().architecture, "w", None);
    oci.entry(whole.manifest.clone(), Some("whole:1"));
    let broken = oci.image(&[layer(&[("x", b"x")])], host().architecture, "x", None);
    oci.entry(broken.manifest.clone(), Some("broken:1"));
    oci.write_dir(&dir.path().join("layout"));
    store.import(&dir.path().join("layout")).unwrap();
    drop(store);
    // Garbage for an index; the broken image loses its layer blob.
    std::fs::write(root.join("images.json"), b"\0\0\0").unwrap();
    let _ = std::fs::remove_file(root.join("images.json.prev"));
    let hex = broken.layer_digests[0].strip_prefix("sha256:").unwrap();
    std::fs::remove_file(root.join("blobs/sha256").join(hex)).unwrap();
    let highest: u64 = files(&root.join("snapshots"))
        .iter()
        .map(|n| n.parse::<u64>().unwrap())
        .max()
        .unwrap();

    let store = Store::open(&root).unwrap();
    let ids: Vec<String> = store.list().unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec![whole.config_digest.clone()]);
    assert!(
        store.resolve("whole:1").unwrap().is_none(),
        "no names without .prev"
    );
    // A new layer gets a snapshot number no dir on disk has.
    let mut more = Oci::default();
    let new = more.image(&[layer(&[("n", b"n")])], host().architecture, "n", None);
    more.entry(new.manifest, Some("new:1"));
    more.write_dir(&dir.path().join("more"));
    store.import(&dir.path().join("more")).unwrap();
    let numbers: Vec<u64> = files(&root.join("snapshots"))
        .iter()
        .map(|n| n.parse::<u64>().unwrap())
        .collect();
    assert!(
        numbers.contains(&(highest + 1)),
        "{numbers:?} after {highest}"
    );
}

#[test]
fn snapshots_without_a_marker_get_one_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let mut oci = Oci::default();
    let built = oci.image(&[layer(&[("m", b"m")])], host().architecture, "m", None);
    oci.entry(built.manifest, Some("m:1"));
    oci.write_dir(&dir.path().join("layout"));
    let image = store.import(&dir.path().join("layout")).unwrap().remove(0);
    drop(store);
    let snapshot = root
        .join("snapshots")
        .join(&files(&root.join("snapshots"))[0]);
    let marker = snapshot.join(super::MARKER);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), image.layers[0]);
    std::fs::remove_file(&marker).unwrap();
    Store::open(&root).unwrap();
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), image.layers[0]);
}

/// Detaches whatever is mounted at the path when dropped.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn an_unreadable_rootfs_record_holds_every_image_until_its_owner_restores_it() {
    if !is_root() {
        crate::testutil::skip("needs root", "mounts an overlay");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root).unwrap();
    let mut oci = Oci::default();
    let used = oci.image(&[layer(&[("u", b"u")])], host().architecture, "u", None);
    oci.entry(used.manifest, Some("used:1"));
    let idle = oci.image(&[layer(&[("i", b"i")])], host().architecture, "i", None);
    oci.entry(idle.manifest, Some("idle:1"));
    oci.write_dir(&dir.path().join("layout"));
    store.import(&dir.path().join("layout")).unwrap();
    let target = dir.path().join("rootfs");
    let _unmount = UnmountOnDrop(target.clone());
    store.prepare_rootfs("used:1", "c1", &target).unwrap();
    drop(store);
    let record = root.join("containers/c1/rootfs.json");
    tear(&record);

    let store = Store::open(&root).unwrap();
    assert_eq!(store.unrecorded_rootfs(), vec!["c1"]);
    assert!(!record.exists());
    let aside = files(&root.join("corrupt"));
    assert!(
        aside.len() == 1 && aside[0].starts_with("rootfs-c1.json."),
        "{aside:?}"
    );
    // Which image it holds is unknown: no image may go.
    let err = store.remove("idle:1").unwrap_err();
    assert_eq!(err.kind(), Kind::InUse, "{err}");
    assert_eq!(
        std::fs::read(target.join("u")).unwrap(),
        b"u",
        "still mounted"
    );
    // The owner says which: the other image may go, this one not.
    store
        .restore_rootfs_record(&used.config_digest, "c1", &target)
        .unwrap();
    assert!(store.unrecorded_rootfs().is_empty());
    assert_eq!(store.rootfs_keys().unwrap(), vec!["c1"]);
    store.remove("idle:1").unwrap();
    assert_eq!(store.remove("used:1").unwrap_err().kind(), Kind::InUse);
    // A record torn while open does not stop the release.
    tear(&record);
    store.release_rootfs("c1", &target).unwrap();
    assert!(!crate::mounts::is_mountpoint(&target.canonicalize().unwrap()).unwrap());
    store.remove("used:1").unwrap();
}
