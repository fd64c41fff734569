//! A layer blob (a tar, plain, gzip or zstd) unpacked as the image store unpacks every layer,
//! into a fresh snapshot directory inside a parent directory that also holds canaries: an
//! empty directory and a file. Whatever the bytes (`../` paths, absolute paths, a symlink
//! then a write through it, hard links to outside, device nodes, huge or PAX headers), the
//! unpack may fail but must never create, change or link anything outside the snapshot: the
//! target panics when the parent holds anything new or a canary changed.
#![no_main]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"the unpacker must never touch this\n";

struct Fixture {
    _root: tempfile::TempDir,
    /// `<root>`: holds `blob`, `canary/`, `canary.txt` and `parent/`, nothing else.
    root: PathBuf,
    /// `<root>/parent`: holds only `snapshot/`.
    parent: PathBuf,
    blob: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().canonicalize().expect("canonical temp dir");
        std::fs::create_dir(root.join("canary")).expect("canary dir");
        std::fs::write(root.join("canary.txt"), CANARY).expect("canary file");
        std::fs::create_dir(root.join("parent")).expect("parent dir");
        Fixture {
            parent: root.join("parent"),
            blob: root.join("blob"),
            root,
            _root: dir,
        }
    })
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// What must not change about a path outside the snapshot.
fn stat(path: &Path) -> (u32, u32, u32, u64, u64, i64) {
    let m = std::fs::symlink_metadata(path).expect("stat");
    (m.mode(), m.uid(), m.gid(), m.nlink(), m.size(), m.mtime())
}

/// Removes a snapshot whatever its modes (a layer may leave 0000 directories).
fn remove_snapshot(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() {
        return;
    }
    make_writable(path);
    std::fs::remove_dir_all(path).expect("removing the snapshot");
}

/// Gives every directory under `path` mode 0700.
fn make_writable(path: &Path) {
    let mut out = vec![path.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        i += 1;
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            let _ =
                std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o700));
            if let Ok(entries) = std::fs::read_dir(&p) {
                out.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    std::fs::write(&f.blob, data).expect("writing the blob");
    let snapshot = f.parent.join("snapshot");
    std::fs::create_dir(&snapshot).expect("snapshot dir");
    let before_root = stat(&f.root);
    let before_parent = stat(&f.parent);
    let before_canary = stat(&f.root.join("canary"));
    let before_file = stat(&f.root.join("canary.txt"));

    let _ = images::fuzzing::unpack_layer(&f.blob, &snapshot);

    assert_eq!(
        names(&f.root),
        ["blob", "canary", "canary.txt", "parent"],
        "something was created next to the snapshot's parent"
    );
    assert_eq!(
        names(&f.parent),
        ["snapshot"],
        "something was created next to the snapshot"
    );
    assert!(
        names(&f.root.join("canary")).is_empty(),
        "something was created in the canary directory"
    );
    assert_eq!(
        std::fs::read(f.root.join("canary.txt")).expect("canary"),
        CANARY,
        "the canary file was written"
    );
    assert_eq!(stat(&f.root), before_root, "the root changed");
    assert_eq!(
        stat(&f.parent),
        before_parent,
        "the snapshot's parent changed"
    );
    assert_eq!(
        stat(&f.root.join("canary")),
        before_canary,
        "the canary directory changed"
    );
    assert_eq!(
        stat(&f.root.join("canary.txt")),
        before_file,
        "the canary file changed (or was linked)"
    );
    assert!(
        std::fs::symlink_metadata(&snapshot).is_ok_and(|m| m.is_dir()),
        "the snapshot directory itself was replaced"
    );
    remove_snapshot(&snapshot);
});
