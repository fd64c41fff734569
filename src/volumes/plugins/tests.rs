//! Tests of [`super`] (`pod::volumes`): the hostPath type checks on real files (directories,
//! files, a unix socket, `/dev/null`), emptyDir directories, the refusal of the other types, and
//! subPaths kept in their volume.

use crate::api::events::Recorded;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::model::pod_uid;
use crate::pod::spec::tests::pod;
use crate::volumes::VolumeError;
use serde_json::json;

/// [`super::check_host_path`], its error as the text the events show.
fn check_host_path(path: &str, type_: &str) -> Result<(), String> {
    super::check_host_path(path, type_).map_err(|e| e.to_string())
}

/// [`super::sub_path`], its error as the text the container's error shows.
fn sub_path(root: &Path, sub: &Path) -> Result<rustix::fd::OwnedFd, String> {
    super::sub_path(root, sub).map_err(|e| e.to_string())
}

/// A pod with `volumes`, its one container mounting each of `mounted`.
fn pod_with(volumes: serde_json::Value, mounted: &[&str]) -> Pod {
    let mounts: Vec<_> = mounted
        .iter()
        .map(|n| json!({"name": n, "mountPath": format!("/v/{n}")}))
        .collect();
    pod(json!({"volumes": volumes,
        "containers": [{"name": "app", "image": "x", "volumeMounts": mounts}]}))
}

#[test]
fn source_names_every_type() {
    let v = |j: serde_json::Value| -> Volume { serde_json::from_value(j).expect("a volume") };
    assert_eq!(
        source(&v(json!({"name": "a", "emptyDir": {}}))),
        Source::EmptyDir { medium: "" }
    );
    assert_eq!(
        source(&v(json!({"name": "a", "emptyDir": {"medium": "Memory"}}))),
        Source::EmptyDir { medium: "Memory" }
    );
    // No source at all: the API server's defaulting makes it an emptyDir.
    assert_eq!(
        source(&v(json!({"name": "a"}))),
        Source::EmptyDir { medium: "" }
    );
    assert!(matches!(
        source(&v(json!({"name": "a", "hostPath": {"path": "/x"}}))),
        Source::HostPath(h) if h.path == "/x"
    ));
    let written = [
        (
            json!({"configMap": {"name": "c"}}),
            "kubernetes.io~configmap",
            false,
        ),
        (
            json!({"secret": {"secretName": "s"}}),
            "kubernetes.io~secret",
            true,
        ),
        (
            json!({"downwardAPI": {"items": []}}),
            "kubernetes.io~downward-api",
            false,
        ),
        (
            json!({"projected": {"sources": []}}),
            "kubernetes.io~projected",
            true,
        ),
    ];
    for (mut j, plugin, tmpfs) in written {
        j["name"] = json!("a");
        let vol = v(j);
        assert_eq!(written_plugin(&source(&vol)), Some((plugin, tmpfs)));
        assert!(read_only(&vol));
    }
    assert!(!read_only(&v(json!({"name": "a", "emptyDir": {}}))));
    assert!(matches!(
        source(&v(json!({"name": "a", "persistentVolumeClaim": {"claimName": "p"}}))),
        Source::Claim(c) if c.claim_name == "p"
    ));
    let others = [
        (json!({"nfs": {"server": "s", "path": "/"}}), "nfs"),
        (json!({"csi": {"driver": "d"}}), "csi"),
        (json!({"ephemeral": {}}), "ephemeral"),
    ];
    for (mut j, name) in others {
        j["name"] = json!("a");
        assert_eq!(source(&v(j)), Source::Unsupported(name.to_string()));
    }
}

#[test]
fn unsupported_types_are_refused_and_unused_volumes_ignored() {
    let dir = tempfile::tempdir().expect("pods dir");
    let p = pod_with(
        json!([
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "unused", "secret": {"secretName": "s"}},
            {"name": "token", "projected": {"sources": []}},
            {"name": "claim", "nfs": {"server": "s", "path": "/"}},
            {"name": "scratch", "emptyDir": {}}
        ]),
        &["cfg", "token", "claim", "scratch"],
    );
    let failed = set_up_volumes(dir.path(), pod_uid(&p), &p);
    let got: Vec<(&str, &str)> = failed
        .iter()
        .map(|f| (f.volume.as_str(), f.message.as_str()))
        .collect();
    // The configMap and projected volumes are the volume manager's.
    assert_eq!(
        got,
        [("claim", "volume type nfs is not supported by nodelet yet")]
    );
    // What can be set up still is.
    assert!(empty_dir_path(dir.path(), pod_uid(&p), "scratch").is_dir());
    // Nothing is made for the refused ones.
    let plugins: Vec<String> = std::fs::read_dir(dir.path().join("u-1/volumes"))
        .expect("volumes dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(plugins, ["kubernetes.io~empty-dir"]);

    // As an event per volume and one sync error naming them.
    let events = Recorded::default();
    let mut failed = set_up_volumes(dir.path(), pod_uid(&p), &p);
    failed.insert(
        0,
        Failure {
            volume: "cfg".into(),
            message: "configmap \"c\" not found".into(),
        },
    );
    let err = report(&p, &failed, &events).expect_err("refused");
    let VolumeError(text) = &err;
    assert!(
        text.starts_with("unmounted volumes=[cfg claim]: "),
        "{text}"
    );
    let recorded = events.all();
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    let (container, kind, reason, message) = &recorded[0];
    assert_eq!(container, &None);
    assert_eq!(*kind, EventType::Warning);
    assert_eq!(reason.as_str(), "FailedMount");
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"c\" not found"
    );
}

#[test]
fn empty_dir_on_disk_is_made_0777_and_huge_pages_are_refused() {
    let dir = tempfile::tempdir().expect("pods dir");
    let p = pod_with(
        json!([
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "ram", "emptyDir": {"medium": "Memory"}},
            {"name": "huge", "emptyDir": {"medium": "HugePages-2Mi"}},
            {"name": "odd", "emptyDir": {"medium": "Tape"}}
        ]),
        &["scratch", "ram", "huge", "odd"],
    );
    let events = Recorded::default();
    let err =
        report(&p, &set_up_volumes(dir.path(), pod_uid(&p), &p), &events).expect_err("huge pages");
    assert!(
        err.to_string()
            .starts_with("unable to attach or mount volumes: "),
        "{err:?}"
    );
    let scratch = empty_dir_path(dir.path(), pod_uid(&p), "scratch");
    assert_eq!(
        scratch,
        dir.path()
            .join("u-1/volumes/kubernetes.io~empty-dir/scratch")
    );
    let mode = std::fs::metadata(&scratch)
        .expect("made")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o777, "{mode:o}");
    // Memory-backed: the volume manager's (a tmpfs), not made here.
    assert!(!empty_dir_path(dir.path(), pod_uid(&p), "ram").exists());
    let messages: Vec<String> = events.all().into_iter().map(|e| e.3).collect();
    assert_eq!(
        messages,
        [
            "MountVolume.SetUp failed for volume \"huge\" : emptyDir medium HugePages-2Mi is \
             not supported by nodelet yet (only the node's disk and memory)",
            "MountVolume.SetUp failed for volume \"odd\" : unknown storage medium \"Tape\"",
        ]
    );
    // Set up again: the same directory, nothing fails for it.
    std::fs::write(scratch.join("kept"), "x").expect("a file in it");
    let only = pod_with(json!([{"name": "scratch", "emptyDir": {}}]), &["scratch"]);
    assert_eq!(set_up_volumes(dir.path(), pod_uid(&only), &only), []);
    assert!(scratch.join("kept").is_file());
}

#[test]
fn host_path_type_checks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let at = |name: &str| dir.path().join(name).display().to_string();
    std::fs::create_dir(dir.path().join("dir")).expect("dir");
    std::fs::write(dir.path().join("file"), "data").expect("file");
    let _listener =
        std::os::unix::net::UnixListener::bind(dir.path().join("sock")).expect("a socket");
    std::os::unix::fs::symlink(dir.path().join("dir"), dir.path().join("link")).expect("link");

    let ok = [
        ("dir", "Directory"),
        ("dir", "DirectoryOrCreate"),
        ("link", "Directory"),
        ("file", "File"),
        ("file", "FileOrCreate"),
        // Upstream's "file" is whatever exists and is not a directory.
        ("sock", "File"),
        ("sock", "Socket"),
        ("missing", ""),
    ];
    for (name, t) in ok {
        assert_eq!(check_host_path(&at(name), t), Ok(()), "{name} {t:?}");
    }
    assert_eq!(check_host_path("/dev/null", "CharDevice"), Ok(()));
    assert_eq!(check_host_path("/dev/null", "File"), Ok(()));
    // An unset type checks and makes nothing.
    assert!(!dir.path().join("missing").exists());

    let failing = [
        ("file", "Directory", "is not a directory"),
        ("missing", "Directory", "is not a directory"),
        ("file", "DirectoryOrCreate", "is not a directory"),
        ("dir", "File", "is not a file"),
        ("missing", "File", "is not a file"),
        ("dir", "FileOrCreate", "is not a file"),
        ("file", "Socket", "is not a socket file"),
        ("missing", "Socket", "is not a socket file"),
        ("file", "CharDevice", "is not a character device"),
        ("dir", "BlockDevice", "is not a block device"),
    ];
    for (name, t, what) in failing {
        assert_eq!(
            check_host_path(&at(name), t),
            Err(format!("hostPath type check failed: {} {what}", at(name))),
            "{name} {t:?}"
        );
    }
    assert_eq!(
        check_host_path("/dev/null", "BlockDevice"),
        Err("hostPath type check failed: /dev/null is not a block device".to_string())
    );
    // A missing File is never made, as a file or a directory.
    assert!(!dir.path().join("missing").exists());

    assert_eq!(
        check_host_path(&at("dir"), "Pipe"),
        Err("Pipe is an invalid volume type".to_string())
    );
    let back = format!("{}/../x", at("dir"));
    assert_eq!(
        check_host_path(&back, ""),
        Err(format!("invalid HostPath `{back}`: must not contain '..'"))
    );
    assert!(
        check_host_path("rel/x", "")
            .expect_err("relative")
            .contains("must be an absolute path")
    );
}

#[test]
fn host_path_or_create_types_make_what_is_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let made_dir = dir.path().join("a/b/c");
    assert_eq!(
        check_host_path(&made_dir.display().to_string(), "DirectoryOrCreate"),
        Ok(())
    );
    assert!(made_dir.is_dir(), "made with its parents");

    let made_file = dir.path().join("a/new.txt");
    assert_eq!(
        check_host_path(&made_file.display().to_string(), "FileOrCreate"),
        Ok(())
    );
    let meta = std::fs::metadata(&made_file).expect("made");
    assert!(meta.is_file() && meta.len() == 0, "{meta:?}");
    // An existing file is kept as it is.
    std::fs::write(&made_file, "kept").expect("write");
    assert_eq!(
        check_host_path(&made_file.display().to_string(), "FileOrCreate"),
        Ok(())
    );
    assert_eq!(std::fs::read_to_string(&made_file).expect("read"), "kept");

    // As upstream, FileOrCreate makes no parent directory.
    let orphan = dir.path().join("nope/new.txt");
    let err =
        check_host_path(&orphan.display().to_string(), "FileOrCreate").expect_err("no parent");
    assert!(err.starts_with("creating file "), "{err}");
    assert!(!dir.path().join("nope").exists());
}

#[test]
fn host_path_volume_failures_are_per_volume() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.conf").display().to_string();
    let p = pod_with(
        json!([
            {"name": "conf", "hostPath": {"path": missing, "type": "File"}},
            {"name": "any", "hostPath": {"path": "/dev/null"}}
        ]),
        &["conf", "any"],
    );
    let failed = set_up_volumes(dir.path(), pod_uid(&p), &p);
    assert_eq!(
        failed,
        [Failure {
            volume: "conf".into(),
            message: format!("hostPath type check failed: {missing} is not a file"),
        }]
    );
    assert!(!Path::new(&missing).exists());
}

#[test]
fn sub_paths_stay_in_their_volume() {
    let host = tempfile::tempdir().expect("temp dir");
    let vol = host.path().join("vol");
    std::fs::create_dir(&vol).expect("volume");
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::create_dir(host.path().join("outside")).expect("outside");
    std::fs::create_dir(vol.join("in")).expect("in");
    std::fs::write(vol.join("in/file"), "x").expect("file");
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, vol.join(name)).expect("symlink");
    };
    link(Path::new("in"), "to-in");
    link(Path::new("../outside"), "climbs-out");
    link(&host.path().join("outside"), "absolute");
    link(Path::new("/etc"), "etc");

    // What the descriptor resolved names (links followed inside the volume).
    let named = |sub: &str| -> Result<std::path::PathBuf, String> {
        use std::os::fd::AsRawFd;
        let fd = sub_path(&vol, Path::new(sub))?;
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| e.to_string())
    };
    let real = vol.canonicalize().expect("volume");
    // What exists beneath the volume, through a link that stays in it too.
    for (sub, is) in [
        ("in", "in"),
        ("in/file", "in/file"),
        ("to-in", "in"),
        ("to-in/file", "in/file"),
    ] {
        assert_eq!(named(sub), Ok(real.join(is)), "{sub}");
    }
    // Missing directories are made, with the volume's mode whatever the umask.
    assert_eq!(named("new/deeper"), Ok(real.join("new/deeper")));
    for made in ["new", "new/deeper"] {
        let mode = std::fs::metadata(vol.join(made))
            .expect("made")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o777, "{made}: {mode:o}");
    }
    assert_eq!(named("to-in/made"), Ok(real.join("in/made")));
    assert!(
        vol.join("in/made").is_dir(),
        "made through the link, in the volume"
    );

    // Out of the volume through a link: refused, and nothing made outside.
    for sub in [
        "climbs-out",
        "climbs-out/x",
        "absolute/x",
        "etc",
        "etc/passwd",
    ] {
        let err = sub_path(&vol, Path::new(sub)).expect_err(sub);
        assert!(err.contains("leads out of its volume"), "{sub}: {err}");
    }
    assert_eq!(
        std::fs::read_dir(host.path().join("outside"))
            .expect("outside")
            .count(),
        0
    );
    let err = sub_path(&vol, Path::new("in/file/x")).expect_err("through a file");
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn a_sub_path_is_bound_as_resolved_whatever_is_swapped_after() {
    // Mounting needs root (CI runs as root); elsewhere this test has nothing to check.
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run as root: a_sub_path_is_bound_as_resolved_whatever_is_swapped_after"
        );
        eprintln!("SKIP (needs root): a_sub_path_is_bound_as_resolved_whatever_is_swapped_after");
        return;
    }
    let host = tempfile::tempdir().expect("tempdir");
    let vol = host.path().join("vol");
    std::fs::create_dir_all(vol.join("data")).expect("mkdir");
    std::fs::write(vol.join("data/secret-free"), "inside\n").expect("write");
    std::fs::write(host.path().join("outside"), "host file\n").expect("write");
    let pods = host.path().join("pods");
    let target = sub_path_target(&pods, "uid1", "vol", "app", 0);
    assert_eq!(
        target,
        pods.join("uid1/volume-subpaths/vol/app/0"),
        "upstream's layout"
    );
    let fd = sub_path(&vol, Path::new("data/secret-free")).expect("resolved");
    // The container swaps the path for a link out of the volume after the check...
    std::fs::rename(vol.join("data"), vol.join("moved")).expect("rename");
    std::os::unix::fs::symlink(host.path(), vol.join("data")).expect("symlink");
    std::fs::rename(host.path().join("outside"), host.path().join("secret-free"))
        .expect("rename outside");
    // ... the bind is still of what was resolved.
    bind_sub_path(&fd, &target).expect("bind");
    let seen = std::fs::read_to_string(&target).expect("read the bind");
    // Bound again on the next sync: replaced, not stacked.
    bind_sub_path(&fd, &target).expect("bind again");
    let stacked = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.contains(&*target.to_string_lossy()))
        .count();
    let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
    assert_eq!(seen, "inside\n");
    assert_eq!(stacked, 1, "one bind at the target");
}
