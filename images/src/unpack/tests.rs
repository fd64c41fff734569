//! Unpack tests on hand-built tars: whiteouts, opaque dirs, hard links, devices, xattrs,
//! ownership, modes, mtimes, compression and refused escapes.

use super::*;
use crate::error::Kind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use tar::{Builder, Header};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A tar under construction with raw control over names.
struct Tar(Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(Builder::new(Vec::new()))
    }

    fn header(kind: EntryType, name: &str, mode: u32) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        // Raw bytes, so tests can write names the tar crate itself would refuse.
        let bytes = name.as_bytes();
        let old = h.as_old_mut();
        old.name[..bytes.len()].copy_from_slice(bytes);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_000_000);
        h.set_size(0);
        h
    }

    fn add(&mut self, mut h: Header, data: &[u8]) -> &mut Self {
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.add(Self::header(EntryType::Directory, name, mode), b"")
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.add(Self::header(EntryType::Regular, name, mode), data)
    }

    fn link(&mut self, kind: EntryType, name: &str, target: &str) -> &mut Self {
        let mut h = Self::header(kind, name, 0o777);
        let bytes = target.as_bytes();
        h.as_old_mut().linkname[..bytes.len()].copy_from_slice(bytes);
        self.add(h, b"")
    }

    /// A PAX extended header applying to the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (key, value) in records {
            let body_len = key.len() + value.len() + 3; // ' ', '=', '\n'
            let mut len = body_len + 1;
            while len.to_string().len() + body_len != len {
                len = len.to_string().len() + body_len;
            }
            data.extend_from_slice(format!("{len} {key}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        self.add(Self::header(EntryType::XHeader, "PaxHeader", 0o644), &data)
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn unpack(tar: &[u8]) -> (tempfile::TempDir, Result<String>) {
    let dir = tempfile::tempdir().unwrap();
    let result = unpack_stream(tar, "test-layer", dir.path());
    (dir, result)
}

#[test]
fn hardlinks_symlinks_and_metadata() {
    let mut t = Tar::new();
    t.dir("./", 0o755)
        .dir("./a/", 0o750)
        .pax(&[
            ("uid", b"1000"),
            ("gid", b"1001"),
            ("SCHILY.xattr.user.note", b"hello"),
        ])
        .file("./a/f", 0o4755, b"content")
        .link(EntryType::Link, "./a/hl", "./a/f")
        .link(EntryType::Symlink, "./a/sl", "/etc/passwd")
        // Implicit parent dirs are created.
        .file("./deep/er/file", 0o644, b"d")
        // A later entry of the same name wins.
        .file("./a/dup", 0o644, b"one")
        .file("./a/dup", 0o644, b"two");
    let data = t.bytes();
    let (dir, result) = unpack(&data);
    let diff_id = result.unwrap();
    assert_eq!(diff_id, crate::digest::sha256_bytes(&data));
    let root = dir.path();

    let f = root.join("a/f");
    assert_eq!(std::fs::read(&f).unwrap(), b"content");
    let m = std::fs::metadata(&f).unwrap();
    if is_root() {
        assert_eq!((m.uid(), m.gid()), (1000, 1001), "PAX uid/gid applied");
    }
    assert_eq!(m.mode() & 0o7777, 0o4755, "setuid kept after chown");
    assert_eq!(m.mtime(), 1_000_000);
    assert_eq!(m.nlink(), 2);
    assert_eq!(std::fs::metadata(root.join("a/hl")).unwrap().ino(), m.ino());
    match xattr::get(&f, "user.note") {
        Ok(v) => assert_eq!(v.as_deref(), Some(&b"hello"[..])),
        Err(e) => eprintln!("user xattrs unsupported here: {e}"),
    }

    let sl = root.join("a/sl");
    assert!(
        std::fs::symlink_metadata(&sl)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_link(&sl).unwrap(), Path::new("/etc/passwd"));

    let dm = std::fs::metadata(root.join("a")).unwrap();
    assert_eq!(dm.mode() & 0o7777, 0o750);
    assert_eq!(
        dm.mtime(),
        1_000_000,
        "directory mtime set after its children"
    );

    assert_eq!(std::fs::read(root.join("a/dup")).unwrap(), b"two");
    assert_eq!(std::fs::read(root.join("deep/er/file")).unwrap(), b"d");
}

#[test]
fn whiteouts_and_opaque_dirs() {
    if !is_root() {
        crate::testutil::skip(
            "needs root",
            "whiteouts are 0:0 device nodes, opaque dirs trusted xattrs",
        );
        return;
    }
    let mut t = Tar::new();
    t.dir("a/", 0o755)
        .file("a/.wh.gone", 0o644, b"")
        .dir("b/", 0o755)
        .file("b/.wh..wh..opq", 0o644, b"")
        .file("b/kept", 0o600, b"x")
        .file("c/.wh..wh.plnk", 0o644, b"")
        .file(".wh.top", 0o644, b"");
    let (dir, result) = unpack(&t.bytes());
    result.unwrap();
    let root = dir.path();
    assert!(!root.join("a/.wh.gone").exists());
    assert!(!root.join("b/.wh..wh..opq").exists());
    assert!(
        !root.join("c/.wh..wh.plnk").exists(),
        "aufs metadata is dropped"
    );
    for whiteout in ["a/gone", "top"] {
        let wh = std::fs::symlink_metadata(root.join(whiteout)).unwrap();
        assert!(
            wh.file_type().is_char_device(),
            "{whiteout} is a char device"
        );
        assert_eq!(wh.rdev(), 0, "{whiteout} is 0:0");
    }
    let opaque = xattr::get(root.join("b"), OPAQUE_XATTR).unwrap();
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(xattr::get(root.join("a"), OPAQUE_XATTR).unwrap(), None);
    assert_eq!(std::fs::read(root.join("b/kept")).unwrap(), b"x");
}

#[test]
fn devices_and_fifos() {
    if !is_root() {
        crate::testutil::skip("needs root", "mknod of device nodes");
        return;
    }
    let mut t = Tar::new();
    let mut null = Tar::header(EntryType::Char, "dev/null", 0o666);
    null.set_device_major(1).unwrap();
    null.set_device_minor(3).unwrap();
    let mut loop0 = Tar::header(EntryType::Block, "dev/loop0", 0o660);
    loop0.set_device_major(7).unwrap();
    loop0.set_device_minor(0).unwrap();
    t.dir("dev/", 0o755)
        .add(null, b"")
        .add(loop0, b"")
        .add(Tar::header(EntryType::Fifo, "run/fifo", 0o640), b"");
    let (dir, result) = unpack(&t.bytes());
    result.unwrap();
    let null = std::fs::symlink_metadata(dir.path().join("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), makedev(1, 3));
    assert_eq!(null.mode() & 0o777, 0o666);
    let blk = std::fs::symlink_metadata(dir.path().join("dev/loop0")).unwrap();
    assert!(blk.file_type().is_block_device());
    assert_eq!(blk.rdev(), makedev(7, 0));
    let fifo = std::fs::symlink_metadata(dir.path().join("run/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.mode() & 0o777, 0o640);
}

#[test]
fn trusted_overlay_xattrs_from_the_layer_are_ignored() {
    if !is_root() {
        crate::testutil::skip("needs root", "trusted xattrs");
        return;
    }
    let mut t = Tar::new();
    t.pax(&[("SCHILY.xattr.trusted.overlay.opaque", b"y")])
        .dir("d/", 0o755);
    let (dir, result) = unpack(&t.bytes());
    result.unwrap();
    assert_eq!(
        xattr::get(dir.path().join("d"), OPAQUE_XATTR).unwrap(),
        None
    );
}

#[test]
fn escapes_are_refused() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot", {
            let mut t = Tar::new();
            t.file("../evil", 0o644, b"x");
            t.bytes()
        }),
        ("nested dotdot", {
            let mut t = Tar::new();
            t.file("a/../../evil", 0o644, b"x");
            t.bytes()
        }),
        ("through symlink", {
            let mut t = Tar::new();
            t.link(EntryType::Symlink, "x", "/tmp")
                .file("x/evil", 0o644, b"x");
            t.bytes()
        }),
        ("through relative symlink", {
            let mut t = Tar::new();
            t.link(EntryType::Symlink, "x", "../..")
                .file("x/evil", 0o644, b"x");
            t.bytes()
        }),
        ("hard link out", {
            let mut t = Tar::new();
            t.link(EntryType::Link, "hl", "../../etc/passwd");
            t.bytes()
        }),
        ("hard link to absolute host file", {
            let mut t = Tar::new();
            t.link(EntryType::Link, "hl", "/etc/passwd");
            t.bytes()
        }),
        ("hard link through symlink", {
            let mut t = Tar::new();
            t.link(EntryType::Symlink, "s", "/etc")
                .link(EntryType::Link, "hl", "s/passwd");
            t.bytes()
        }),
    ];
    for (name, data) in cases {
        let outside = tempfile::tempdir().unwrap();
        let dir = outside.path().join("a/b");
        std::fs::create_dir_all(&dir).unwrap();
        let err = unpack_stream(&data[..], "l", &dir).expect_err(name);
        assert_eq!(err.kind(), Kind::InvalidArgument, "{name}: {err}");
        assert!(
            matches!(err, Error::UnsafeLayerEntry { .. }),
            "{name}: {err}"
        );
        assert!(!outside.path().join("a/evil").exists(), "{name}");
        assert!(!outside.path().join("evil").exists(), "{name}");
    }
    // An absolute entry name is taken relative to the layer root, as docker does.
    let mut t = Tar::new();
    t.file("/etc/hostname", 0o644, b"h");
    let (dir, result) = unpack(&t.bytes());
    result.unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("etc/hostname")).unwrap(),
        b"h"
    );
}

#[test]
fn a_dotdot_entry_says_why_it_is_refused() {
    let mut t = Tar::new();
    t.file("a/../../evil", 0o644, b"x");
    let outside = tempfile::tempdir().unwrap();
    let dir = outside.path().join("a");
    std::fs::create_dir_all(&dir).unwrap();
    let err = unpack_stream(&t.bytes()[..], "l", &dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"unpacking layer l: entry "a/../../evil": path contains '..'"#
    );
}

#[test]
fn compressed_layers_give_the_same_diff_id() {
    let mut t = Tar::new();
    t.dir("d/", 0o755).file("d/f", 0o644, &[7u8; 10_000]);
    let plain = t.bytes();
    let dir = tempfile::tempdir().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::stream::encode_all(&plain[..], 3).unwrap();
    let want = crate::digest::sha256_bytes(&plain);
    for (name, blob) in [("plain", &plain), ("gzip", &gz), ("zstd", &zst)] {
        let path = dir.path().join(name);
        std::fs::write(&path, blob).unwrap();
        let dest = dir.path().join(format!("{name}.fs"));
        std::fs::create_dir(&dest).unwrap();
        assert_eq!(unpack_layer(&path, name, &dest).unwrap(), want, "{name}");
        assert_eq!(
            std::fs::read(dest.join("d/f")).unwrap().len(),
            10_000,
            "{name}"
        );
    }
}

#[test]
fn truncated_layers_are_corrupt() {
    let mut t = Tar::new();
    t.file("f", 0o644, &[1u8; 50_000]);
    let plain = t.bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let gz = gz.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
    let dest = dir.path().join("fs");
    std::fs::create_dir(&dest).unwrap();
    let err = unpack_layer(&path, "l", &dest).unwrap_err();
    assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
    assert!(matches!(err, Error::CorruptLayer { .. }), "{err}");
}

#[test]
fn detects_compression() {
    assert_eq!(
        detect_compression(&[0x1f, 0x8b, 8]).unwrap(),
        Compression::Gzip
    );
    assert_eq!(
        detect_compression(&[0x28, 0xb5, 0x2f, 0xfd]).unwrap(),
        Compression::Zstd
    );
    assert_eq!(detect_compression(b"hello").unwrap(), Compression::None);
    let bzip2 = detect_compression(b"BZh91AY").unwrap_err();
    assert_eq!(bzip2.to_string(), "bzip2 layers are not supported");
    let xz = detect_compression(&[0xfd, b'7', b'z', b'X', b'Z', 0]).unwrap_err();
    assert_eq!(xz.to_string(), "xz layers are not supported");
}
