//! An image archive (an OCI archive or a `docker save` tarball, plain or gzip) imported into
//! a fresh image store through `images::Store::import`, as `nodelet images import` does:
//! extraction of the archive, its index or manifest.json, manifests, configs, blob digests and
//! each layer's unpacking. Any bytes give images or an error, never a panic, and nothing
//! outside the store appears or changes (the store directory sits next to a canary).
#![no_main]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"the import must never touch this\n";

struct Fixture {
    _root: tempfile::TempDir,
    /// Holds `archive`, `canary.txt` and `store/`, nothing else.
    root: PathBuf,
    archive: PathBuf,
    store: images::Store,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().canonicalize().expect("canonical temp dir");
        std::fs::write(root.join("canary.txt"), CANARY).expect("canary file");
        let store = images::Store::open(root.join("store")).expect("opening the store");
        Fixture {
            archive: root.join("archive"),
            root,
            store,
            _root: dir,
        }
    })
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn stat(path: &Path) -> (u32, u32, u32, u64, u64, i64) {
    let m = std::fs::symlink_metadata(path).expect("stat");
    (m.mode(), m.uid(), m.gid(), m.nlink(), m.size(), m.mtime())
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    std::fs::write(&f.archive, data).expect("writing the archive");
    let before = stat(&f.root.join("canary.txt"));
    let before_root = stat(&f.root);

    if let Ok(imported) = f.store.import(&f.archive) {
        // Start the next input from an empty store again.
        for image in imported {
            f.store
                .remove(&image.id)
                .expect("removing an imported image");
        }
    }

    assert_eq!(
        names(&f.root),
        ["archive", "canary.txt", "store"],
        "something was created next to the store"
    );
    assert_eq!(
        std::fs::read(f.root.join("canary.txt")).expect("canary"),
        CANARY
    );
    assert_eq!(
        stat(&f.root.join("canary.txt")),
        before,
        "the canary changed"
    );
    assert_eq!(stat(&f.root), before_root, "the store's parent changed");
});
