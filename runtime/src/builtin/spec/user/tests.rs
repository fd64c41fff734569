//! Tests of the user resolution against a temporary rootfs.

use super::*;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
    # comment\n\
    daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
    alice:x:1000:1000:Alice:/home/alice:/bin/sh\n\
    broken:x:notanumber:1\n\
    nohome:x:1001:100\n";
const GROUP: &str = "root:x:0:\n\
    users:x:100:alice, nohome\n\
    alice:x:1000:\n\
    wheel:x:10:root,alice\n\
    audio:x:29:daemon\n";

fn rootfs(passwd: Option<&str>, group: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    if let Some(p) = passwd {
        std::fs::write(dir.path().join("etc/passwd"), p).unwrap();
    }
    if let Some(g) = group {
        std::fs::write(dir.path().join("etc/group"), g).unwrap();
    }
    dir
}

fn sc() -> cri::LinuxContainerSecurityContext {
    Default::default()
}

fn image_user(u: &str) -> images::ImageConfig {
    images::ImageConfig {
        user: Some(u.into()),
        ..Default::default()
    }
}

fn user(uid: u32, gid: u32, gids: &[u32], home: Option<&str>) -> User {
    User {
        uid,
        gid,
        additional_gids: gids.to_vec(),
        home: home.map(String::from),
    }
}

#[test]
fn image_user_forms() {
    let root = rootfs(Some(PASSWD), Some(GROUP));
    let cases = [
        ("", user(0, 0, &[0, 10], Some("/root"))),
        (
            "alice",
            user(1000, 1000, &[10, 100, 1000], Some("/home/alice")),
        ),
        (
            "1000",
            user(1000, 1000, &[10, 100, 1000], Some("/home/alice")),
        ),
        (
            "alice:wheel",
            user(1000, 10, &[10, 100], Some("/home/alice")),
        ),
        (
            "alice:29",
            user(1000, 29, &[10, 29, 100], Some("/home/alice")),
        ),
        ("4242", user(4242, 0, &[0], None)),
        ("4242:4343", user(4242, 4343, &[4343], None)),
        ("daemon", user(1, 1, &[1, 29], Some("/usr/sbin"))),
        ("nohome", user(1001, 100, &[100], None)),
    ];
    for (u, want) in cases {
        let got = resolve(root.path(), &sc(), &image_user(u)).unwrap();
        assert_eq!(got, want, "image user {u:?}");
    }
}

#[test]
fn unknown_names_are_invalid() {
    let root = rootfs(Some(PASSWD), Some(GROUP));
    let cases = [
        ("bob", "user \"bob\" not found"),
        ("alice:nogroup", "group \"nogroup\" not found"),
        ("broken", "user \"broken\" not found"),
        (":10", "not of the form"),
        ("alice:", "not of the form"),
    ];
    for (u, msg) in cases {
        let err = resolve(root.path(), &sc(), &image_user(u)).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains(msg), "{u:?}: {err}");
    }
    let bare = rootfs(None, None);
    let err = resolve(bare.path(), &sc(), &image_user("alice")).unwrap_err();
    assert!(err.message().contains("no /etc/passwd"), "{err}");
    let err = resolve(bare.path(), &sc(), &image_user("0:wheel")).unwrap_err();
    assert!(err.message().contains("no /etc/group"), "{err}");
    // Numbers need no files.
    assert_eq!(
        resolve(bare.path(), &sc(), &image_user("5:6")).unwrap(),
        user(5, 6, &[6], None)
    );
}

#[test]
fn security_context_overrides_the_image() {
    let root = rootfs(Some(PASSWD), Some(GROUP));
    let img = image_user("daemon");
    let mut s = sc();
    s.run_as_user = Some(cri::Int64Value { value: 1000 });
    assert_eq!(resolve(root.path(), &s, &img).unwrap().uid, 1000);
    s.run_as_group = Some(cri::Int64Value { value: 29 });
    let got = resolve(root.path(), &s, &img).unwrap();
    assert_eq!((got.uid, got.gid), (1000, 29));
    s.run_as_username = "root".into();
    let got = resolve(root.path(), &s, &img).unwrap();
    assert_eq!((got.uid, got.gid), (0, 29));
    s.run_as_username.clear();
    s.run_as_user = None;
    let err = resolve(root.path(), &s, &img).unwrap_err();
    assert!(
        err.message()
            .contains("run_as_group 29 is specified without"),
        "{err}"
    );
    s.run_as_group = None;
    s.run_as_user = Some(cri::Int64Value { value: -1 });
    let err = resolve(root.path(), &s, &img).unwrap_err();
    assert!(
        err.message().contains("run_as_user -1 is out of range"),
        "{err}"
    );
}

#[test]
fn supplemental_groups_merge_or_strict() {
    let root = rootfs(Some(PASSWD), Some(GROUP));
    let mut s = sc();
    s.run_as_user = Some(cri::Int64Value { value: 1000 });
    s.supplemental_groups = vec![5678, 1234, 10];
    let got = resolve(root.path(), &s, &Default::default()).unwrap();
    assert_eq!(got.additional_gids, [10, 100, 1000, 1234, 5678]);
    s.supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
    let got = resolve(root.path(), &s, &Default::default()).unwrap();
    assert_eq!(got.additional_gids, [10, 1000, 1234, 5678]);
    s.supplemental_groups_policy = 7;
    assert!(resolve(root.path(), &s, &Default::default()).is_err());
    s.supplemental_groups_policy = 0;
    s.supplemental_groups = vec![-3];
    assert!(resolve(root.path(), &s, &Default::default()).is_err());
}

#[test]
fn symlinks_stay_inside_the_rootfs() {
    let root = rootfs(None, Some(GROUP));
    // An absolute symlink resolves inside the rootfs, not on the host.
    std::os::unix::fs::symlink("/srv/passwd", root.path().join("etc/passwd")).unwrap();
    std::fs::create_dir_all(root.path().join("srv")).unwrap();
    std::fs::write(root.path().join("srv/passwd"), "zed:x:77:77::/z:/bin/sh\n").unwrap();
    assert_eq!(
        resolve(root.path(), &sc(), &image_user("zed")).unwrap().uid,
        77
    );
    // Escaping with .. stops at the root.
    std::fs::remove_file(root.path().join("etc/passwd")).unwrap();
    std::os::unix::fs::symlink("../../../../srv/passwd", root.path().join("etc/passwd")).unwrap();
    assert_eq!(
        resolve(root.path(), &sc(), &image_user("zed")).unwrap().uid,
        77
    );
    // A loop is an error, not a hang.
    std::fs::remove_file(root.path().join("etc/passwd")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.path().join("etc/passwd")).unwrap();
    assert!(resolve(root.path(), &sc(), &image_user("zed")).is_err());
    // A directory where a file should be is an error.
    std::fs::remove_file(root.path().join("etc/passwd")).unwrap();
    std::fs::create_dir(root.path().join("etc/passwd")).unwrap();
    assert!(resolve(root.path(), &sc(), &image_user("zed")).is_err());
}
