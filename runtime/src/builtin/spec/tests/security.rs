//! Whole-spec tests of the security settings, resources, annotations, user and environment.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxSeccompAction, LinuxSeccompOperator};

use super::*;

#[test]
fn privileged_container_needs_privileged_sandbox() {
    let mut f = Fixture::new();
    f.sc().privileged = true;
    assert!(invalid_message(f.spec()).contains("no privileged container allowed in sandbox"));
}

#[test]
fn privileged_container_is_unconfined() {
    let profile = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(profile.path(), r#"{"defaultAction": "SCMP_ACT_ERRNO"}"#).unwrap();
    let mut f = Fixture::new();
    f.pod_sc().privileged = true;
    f.sc().privileged = true;
    f.sc().masked_paths = vec!["/proc/kcore".into()];
    f.sc().capabilities = Some(cri::Capability {
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: profile.path().to_string_lossy().into_owned(),
    });
    let spec = f.spec().unwrap();
    let linux = spec.linux().clone().unwrap();
    assert!(
        linux.seccomp().is_none(),
        "privileged ignores even a Localhost profile"
    );
    assert_eq!(
        linux.masked_paths().clone().unwrap_or_default(),
        Vec::<String>::new()
    );
    assert_eq!(
        linux.readonly_paths().clone().unwrap_or_default(),
        Vec::<String>::new()
    );
    let caps = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .clone()
        .unwrap();
    assert_eq!(caps.bounding().as_ref().map(|b| b.len()), Some(41));
    for dest in ["/sys", "/sys/fs/cgroup"] {
        let opts = mount_at(&spec, dest).unwrap().options().clone().unwrap();
        assert!(
            opts.contains(&"rw".into()) && !opts.contains(&"ro".into()),
            "{dest}: {opts:?}"
        );
    }
    let rules = linux
        .resources()
        .clone()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow());
    let devices = linux.devices().clone().unwrap();
    assert!(devices.iter().any(|d| d.path() == Path::new("/dev/null")));
}

#[test]
fn capabilities_reach_the_process() {
    let mut f = Fixture::new();
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["NET_ADMIN".into()],
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let spec = f.spec().unwrap();
    let caps = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .clone()
        .unwrap();
    let want: std::collections::HashSet<_> = [oci_spec::runtime::Capability::NetAdmin]
        .into_iter()
        .collect();
    assert_eq!(caps.bounding().clone().unwrap(), want);
    assert_eq!(caps.effective().clone().unwrap(), want);
    assert_eq!(caps.permitted().clone().unwrap(), want);
    assert!(caps.ambient().clone().unwrap_or_default().is_empty());
}

#[test]
fn no_new_privs_false_is_absent_not_false() {
    // libcontainer loads a seccomp filter after dropping capabilities when the field is
    // present at all, which fails without no_new_privs: false must be written as absent.
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let nnp = |f: &Fixture| {
        f.spec()
            .unwrap()
            .process()
            .as_ref()
            .unwrap()
            .no_new_privileges()
    };
    assert_eq!(nnp(&f), None);
    let json = serde_json::to_string(f.spec().unwrap().process()).unwrap();
    assert!(!json.contains("noNewPrivileges"), "{json}");
    f.sc().no_new_privs = true;
    assert_eq!(nnp(&f), Some(true));
}

#[test]
fn privileged_gets_the_hosts_capabilities() {
    let mut f = Fixture::new();
    f.pod_sc().privileged = true;
    f.sc().privileged = true;
    f.host.capabilities = Some(((1u64 << 41) - 1) & !(1u64 << 24));
    let spec = f.spec().unwrap();
    let caps = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .clone()
        .unwrap();
    let bounding = caps.bounding().clone().unwrap();
    assert_eq!(bounding.len(), 40);
    assert!(!bounding.contains(&oci_spec::runtime::Capability::SysResource));
    assert_eq!(caps.effective().clone().unwrap(), bounding);
}

fn seccomp_of(f: &Fixture) -> Option<oci_spec::runtime::LinuxSeccomp> {
    f.spec()
        .unwrap()
        .linux()
        .as_ref()
        .unwrap()
        .seccomp()
        .clone()
}

fn blocked(profile: &oci_spec::runtime::LinuxSeccomp, name: &str) -> Option<u32> {
    profile
        .syscalls()
        .iter()
        .flatten()
        .find(|s| s.names().iter().any(|n| n == name) && s.args().is_none())
        .filter(|s| s.action() == LinuxSeccompAction::ScmpActErrno)
        .and_then(|s| s.errno_ret())
}

#[test]
fn seccomp_runtime_default_blocks_namespace_syscalls() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile::default()); // RuntimeDefault is 0
    let profile = seccomp_of(&f).expect("RuntimeDefault yields a profile");
    assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActAllow);
    assert!(
        !profile
            .architectures()
            .clone()
            .unwrap_or_default()
            .is_empty()
    );
    for name in [
        "unshare",
        "setns",
        "mount",
        "sethostname",
        "kexec_load",
        "keyctl",
        "bpf",
        "ptrace",
    ] {
        assert_eq!(
            blocked(&profile, name),
            Some(1),
            "{name} should fail with EPERM"
        );
    }
    assert_eq!(
        blocked(&profile, "clone3"),
        Some(38),
        "clone3 fails with ENOSYS"
    );
    for name in ["read", "write", "chmod", "clone", "execve"] {
        assert_eq!(blocked(&profile, name), None, "{name} should be allowed");
    }
    // clone is refused only with a namespace flag, one rule per flag.
    let clone_rules: Vec<_> = profile
        .syscalls()
        .iter()
        .flatten()
        .filter(|s| s.names() == &["clone".to_string()])
        .collect();
    assert_eq!(clone_rules.len(), 7);
    let newuser = clone_rules
        .iter()
        .flat_map(|r| r.args().clone().unwrap_or_default())
        .find(|a| a.value() == 0x1000_0000)
        .expect("a CLONE_NEWUSER rule");
    assert_eq!(
        (newuser.index(), newuser.op(), newuser.value_two()),
        (0, LinuxSeccompOperator::ScmpCmpMaskedEq, Some(0x1000_0000))
    );

    // CAP_SYS_ADMIN and CAP_SYS_PTRACE lift their rules.
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["SYS_ADMIN".into(), "SYS_PTRACE".into()],
        ..Default::default()
    });
    let profile = seccomp_of(&f).unwrap();
    for name in ["unshare", "mount", "sethostname", "clone3", "ptrace", "bpf"] {
        assert_eq!(
            blocked(&profile, name),
            None,
            "{name} is allowed with the capability"
        );
    }
    assert_eq!(blocked(&profile, "keyctl"), Some(1));
    assert!(
        !profile
            .syscalls()
            .iter()
            .flatten()
            .any(|s| s.names() == &["clone".to_string()])
    );
}

#[test]
fn seccomp_unconfined_and_localhost() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert!(seccomp_of(&f).is_none());

    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("block-chmod.json");
    std::fs::write(
        &good,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["chmod", "fchmodat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"syscalls": 3}"#).unwrap();
    let localhost = |p: &Path| cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: p.to_string_lossy().into_owned(),
    };
    f.sc().seccomp = Some(localhost(&good));
    let profile = seccomp_of(&f).unwrap();
    assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActAllow);
    assert_eq!(profile.syscalls().as_ref().map(|s| s.len()), Some(1));

    for (path, msg) in [
        (dir.path().join("missing.json"), "missing.json"),
        (bad.clone(), "is not an OCI seccomp profile"),
        (dir.path().to_path_buf(), "is not a regular file"),
        (PathBuf::from("relative.json"), "must be an absolute path"),
        (PathBuf::new(), "needs a localhost_ref"),
    ] {
        f.sc().seccomp = Some(localhost(&path));
        let m = invalid_message(f.spec());
        assert!(m.contains(msg), "{path:?}: {m}");
    }
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: 9,
        localhost_ref: String::new(),
    });
    assert!(invalid_message(f.spec()).contains("unknown seccomp profile type 9"));
}

#[test]
fn resources_devices_and_oom_score() {
    let mut f = Fixture::new();
    f.host.oom_score_adj = Some(-500);
    f.config
        .linux
        .get_or_insert_with(Default::default)
        .resources = Some(cri::LinuxContainerResources {
        cpu_shares: 2,
        memory_limit_in_bytes: 1 << 30,
        oom_score_adj: -998,
        ..Default::default()
    });
    f.config.devices = vec![cri::Device {
        host_path: "/dev/null".into(),
        container_path: "/dev/xnull".into(),
        permissions: "r".into(),
    }];
    let spec = f.spec().unwrap();
    assert_eq!(spec.process().as_ref().unwrap().oom_score_adj(), Some(-500));
    let linux = spec.linux().clone().unwrap();
    let res = linux.resources().clone().unwrap();
    assert_eq!(res.cpu().as_ref().unwrap().shares(), Some(2));
    assert_eq!(res.memory().as_ref().unwrap().limit(), Some(1 << 30));
    let rules = res.devices().clone().unwrap();
    assert_eq!(rules.len(), 2);
    assert!(!rules[0].allow(), "deny everything first");
    assert_eq!((rules[1].major(), rules[1].minor()), (Some(1), Some(3)));
    assert_eq!(
        linux.devices().clone().unwrap()[0].path(),
        Path::new("/dev/xnull")
    );

    f.config.devices[0].host_path = "/dev/does-not-exist".into();
    assert!(invalid_message(f.spec()).contains("/dev/does-not-exist"));
}

#[test]
fn annotations_and_ids() {
    let mut f = Fixture::new();
    f.config.annotations = [
        ("user.note".to_string(), "x".to_string()),
        (ANNOTATION_CONTAINER_TYPE.to_string(), "forged".to_string()),
    ]
    .into();
    let mut spec = f.spec().unwrap();
    annotate_sandbox_id(&mut spec, "sb-1");
    let a = spec.annotations().clone().unwrap();
    let get = |k: &str| a.get(k).map(String::as_str);
    assert_eq!(get("user.note"), Some("x"));
    assert_eq!(get(ANNOTATION_CONTAINER_TYPE), Some("container"));
    assert_eq!(get(ANNOTATION_SANDBOX_ID), Some("sb-1"));
    assert_eq!(get(ANNOTATION_SANDBOX_NAME), Some("pod"));
    assert_eq!(get(ANNOTATION_SANDBOX_NAMESPACE), Some("default"));
    assert_eq!(get(ANNOTATION_SANDBOX_UID), Some("uid-1"));
    assert_eq!(get(ANNOTATION_CONTAINER_NAME), Some("app"));
    assert_eq!(
        get(ANNOTATION_IMAGE_NAME),
        Some("docker.io/library/busybox:latest")
    );

    assert_eq!(
        cgroups_path("/a/b/", "c").unwrap(),
        Some(PathBuf::from("/a/b/c"))
    );
    assert_eq!(cgroups_path("a", "c").unwrap(), Some(PathBuf::from("/a/c")));
    assert_eq!(cgroups_path("", "c").unwrap(), None);
    assert!(cgroups_path("/a/../b", "c").is_err());
    for id in ["", "a/b", "..", "."] {
        assert!(check_container_id(id).is_err(), "{id:?}");
    }
}

#[test]
fn user_and_environment_reach_the_process() {
    let mut f = Fixture::new();
    f.image.user = Some("nobody".into());
    f.image.env = vec!["PATH=/opt/bin".into()];
    f.image.working_dir = Some("/work".into());
    f.config.envs = vec![cri::KeyValue {
        key: "MODE".into(),
        value: "test".into(),
    }];
    f.config.tty = true;
    f.sc().no_new_privs = true;
    f.sc().supplemental_groups = vec![1234];
    let spec = f.spec().unwrap();
    let p = spec.process().clone().unwrap();
    assert_eq!((p.user().uid(), p.user().gid()), (65534, 65534));
    assert_eq!(p.user().additional_gids().clone().unwrap(), [1234, 65534]);
    assert_eq!(
        p.env().clone().unwrap(),
        [
            "PATH=/opt/bin",
            "HOSTNAME=pod-host",
            "MODE=test",
            "HOME=/nonexistent"
        ]
    );
    assert_eq!(p.cwd(), Path::new("/work"));
    assert_eq!(
        (p.terminal(), p.no_new_privileges()),
        (Some(true), Some(true))
    );

    f.image.user = Some("ghost".into());
    assert!(invalid_message(f.spec()).contains("user \"ghost\" not found"));
    f.image.user = None;
    f.config.command.clear();
    assert!(invalid_message(f.spec()).contains("no command specified"));
}

#[test]
#[allow(deprecated)]
fn deprecated_seccomp_profile_path_is_read_when_seccomp_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("profile.json");
    std::fs::write(
        &local,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["chmod"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let with_path = |path: &str| {
        let mut f = Fixture::new();
        f.sc().seccomp_profile_path = path.to_string();
        f
    };
    let f = with_path("runtime/default");
    assert_eq!(blocked(&seccomp_of(&f).unwrap(), "unshare"), Some(1));
    let f = with_path("docker/default");
    assert!(seccomp_of(&f).is_some());
    assert!(seccomp_of(&with_path("unconfined")).is_none());
    assert!(seccomp_of(&with_path("")).is_none());
    let f = with_path(&format!("localhost/{}", local.display()));
    let profile = seccomp_of(&f).unwrap();
    assert_eq!(profile.syscalls().as_ref().unwrap()[0].names(), &["chmod"]);
    // Without the localhost/ prefix a profile is refused, as containerd refuses it.
    let err = with_path(local.to_str().unwrap()).spec().unwrap_err();
    assert_eq!(err.code(), crate::Code::InvalidArgument, "{err}");
    // The current field wins over the deprecated one.
    let mut f = with_path("runtime/default");
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert!(seccomp_of(&f).is_none());
}
