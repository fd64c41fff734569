//! Tests of [`super`] (the atomic writer) on real directories.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn file(data: &str, mode: u32) -> FileProjection {
    FileProjection {
        data: data.as_bytes().to_vec(),
        mode,
    }
}

fn payload(files: &[(&str, &str, u32)]) -> Payload {
    files
        .iter()
        .map(|(p, d, m)| (p.to_string(), file(d, *m)))
        .collect()
}

fn data_dir(dir: &Path) -> String {
    std::fs::read_link(dir.join(DATA_DIR))
        .expect("..data is a link")
        .to_string_lossy()
        .into_owned()
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

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o7777
}

#[test]
fn first_write_makes_the_layout_with_modes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let p = payload(&[
        ("app.conf", "a=1\n", 0o644),
        ("secret/key", "k", 0o400),
        ("./x//y", "y", 0o600),
    ]);
    assert!(write(dir, &p).expect("write"));
    let ts = data_dir(dir);
    assert!(ts.starts_with("..20"), "{ts}");
    assert_eq!(
        names(dir),
        vec![
            ts.clone(),
            "..data".to_string(),
            "app.conf".into(),
            "secret".into(),
            "x".into()
        ]
    );
    assert_eq!(mode(&dir.join(&ts)), 0o755);
    for (name, target) in [
        ("app.conf", "..data/app.conf"),
        ("secret", "..data/secret"),
        ("x", "..data/x"),
    ] {
        assert_eq!(
            std::fs::read_link(dir.join(name)).expect("a link"),
            PathBuf::from(target)
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("app.conf")).expect("read"),
        "a=1\n"
    );
    assert_eq!(mode(&dir.join("app.conf")), 0o644);
    assert_eq!(mode(&dir.join("secret/key")), 0o400);
    assert_eq!(mode(&dir.join("secret")), 0o755);
    assert_eq!(std::fs::read_to_string(dir.join("x/y")).expect("read"), "y");
    assert_eq!(mode(&dir.join("x/y")), 0o600);
}

#[test]
fn an_update_swaps_data_and_removes_what_is_gone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    write(dir, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)])).expect("write");
    let first = data_dir(dir);
    // A reader that resolved `..data` before the update keeps a consistent old set until the
    // old directory goes; after the update, `..data` names the new one.
    assert!(write(dir, &payload(&[("a", "10", 0o644), ("c", "3", 0o640)])).expect("update"));
    let second = data_dir(dir);
    assert_ne!(first, second);
    assert!(
        !dir.join(&first).exists(),
        "the old data directory is removed"
    );
    assert_eq!(
        names(dir),
        vec![second.clone(), "..data".into(), "a".into(), "c".into()]
    );
    assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "10");
    assert_eq!(std::fs::read_to_string(dir.join("c")).expect("c"), "3");
    assert_eq!(mode(&dir.join("c")), 0o640);
    // A mode change alone is an update too.
    assert!(write(dir, &payload(&[("a", "10", 0o600), ("c", "3", 0o640)])).expect("mode"));
    assert_eq!(mode(&dir.join("a")), 0o600);
    // The empty payload leaves only `..data` and its empty directory.
    assert!(write(dir, &Payload::new()).expect("empty"));
    let last = data_dir(dir);
    assert_eq!(names(dir), vec![last.clone(), "..data".into()]);
    assert_eq!(names(&dir.join(last)), Vec::<String>::new());
}

#[test]
fn an_equal_payload_writes_nothing_but_restores_links() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let p = payload(&[("a", "1", 0o644), ("d/e", "2", 0o644)]);
    assert!(write(dir, &p).expect("write"));
    let ts = data_dir(dir);
    assert!(!write(dir, &p).expect("again"), "nothing to write");
    assert_eq!(data_dir(dir), ts);
    std::fs::remove_file(dir.join("a")).expect("removing a link");
    assert!(!write(dir, &p).expect("again"));
    assert_eq!(data_dir(dir), ts);
    assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1");
}

#[test]
fn bad_paths_and_modes_are_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    for (path, why) in [
        ("", "must not be empty"),
        ("/etc/passwd", "must be relative"),
        ("../x", "must not contain '..'"),
        ("a/../../x", "must not contain '..'"),
        ("..data", "must not start with '..'"),
        ("..x/y", "must not start with '..'"),
        (".", "names the volume itself"),
    ] {
        let e = write(dir, &payload(&[(path, "x", 0o644)]))
            .expect_err(path)
            .to_string();
        assert!(e.contains(why), "{path}: {e}");
    }
    let long = "x".repeat(256);
    let e = write(dir, &payload(&[(&long, "x", 0o644)]))
        .expect_err("long")
        .to_string();
    assert!(
        e.contains("filenames must be less than or equal to 255"),
        "{e}"
    );
    let e = write(dir, &payload(&[("a", "x", 0o4755)]))
        .expect_err("setuid")
        .to_string();
    assert!(e.contains("invalid mode"), "{e}");
    let e = write(dir, &payload(&[("a", "x", 0o644), ("a/b", "y", 0o644)]))
        .expect_err("both")
        .to_string();
    assert!(e.contains("is a file and a directory"), "{e}");
    assert_eq!(names(dir), Vec::<String>::new());
}

#[test]
fn a_failed_write_keeps_the_current_data() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    write(dir, &payload(&[("a", "1", 0o644)])).expect("write");
    let ts = data_dir(dir);
    // A path the payload allows (4090 characters) but too long once under the volume's
    // directory: the write fails, `..data` stays.
    let mut long = String::new();
    while long.len() < 4000 {
        long.push_str(&"f".repeat(200));
        long.push('/');
    }
    long.push_str(&"z".repeat(4090 - long.len()));
    let r = write(dir, &payload(&[(&long, "x", 0o644)]));
    assert!(r.is_err(), "{r:?}");
    assert_eq!(data_dir(dir), ts);
    assert_eq!(names(dir), vec![ts, "..data".into(), "a".into()]);
}

#[test]
fn an_fs_group_owns_the_volume() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("0777");
    let p = payload(&[
        ("a", "1", 0o644),
        ("s/key", "k", 0o400),
        ("t", "tok", 0o600),
    ]);
    assert!(write_owned(dir, &p, Some(2000)).expect("write"));
    let ts = data_dir(dir);
    let meta = |p: &Path| std::fs::symlink_metadata(p).expect("metadata");
    for (path, mode) in [
        (dir.to_path_buf(), 0o2777),
        (dir.join(&ts), 0o2755),
        (dir.join(&ts).join("s"), 0o2755),
        (dir.join(&ts).join("a"), 0o644),
        (dir.join(&ts).join("s/key"), 0o440),
        (dir.join(&ts).join("t"), 0o640),
    ] {
        let m = meta(&path);
        assert_eq!(
            (m.gid(), m.mode() & 0o7777),
            (2000, mode),
            "{}",
            path.display()
        );
    }
    for link in ["..data", "a", "s", "t"] {
        assert_eq!(meta(&dir.join(link)).gid(), 2000, "{link}");
    }
    // Written again unchanged: nothing to do (the group's bits are part of the comparison).
    assert!(!write_owned(dir, &p, Some(2000)).expect("again"));
}
