use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceType, LinuxNamespaceBuilder, LinuxNamespaceType, Spec};

use super::*;
use crate::Code;

fn names(list: &[&str]) -> Vec<QualifiedName> {
    list.iter()
        .map(|n| QualifiedName::parse(n).unwrap())
        .collect()
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

/// A JSON spec of kind `kind` whose devices each set `DEV=<file tag>` (and the spec `SPEC=...`).
fn spec_json(kind: &str, tag: &str, devices: &[&str]) -> String {
    let devices: Vec<String> = devices
        .iter()
        .map(|d| format!(r#"{{"name": "{d}", "containerEdits": {{"env": ["DEV_{d}={tag}"]}}}}"#))
        .collect();
    format!(
        r#"{{"cdiVersion": "0.6.0", "kind": "{kind}", "devices": [{}],
            "containerEdits": {{"env": ["SPEC={tag}"]}}}}"#,
        devices.join(",")
    )
}

fn envs(parts: &Devices) -> Vec<String> {
    parts
        .parts
        .iter()
        .flat_map(|p| p.edits.env.clone())
        .collect()
}

#[test]
fn later_dirs_win_and_spec_edits_come_once_first() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(
        a.path(),
        "x.json",
        &spec_json("example.com/dev", "a", &["one", "two"]),
    );
    write(
        b.path(),
        "x.yaml",
        &spec_json("example.com/dev", "b", &["one"]),
    );
    // Not spec files: another extension, a directory.
    write(a.path(), "notes.txt", "{");
    std::fs::create_dir(a.path().join("sub.json")).unwrap();
    let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
    let d = Devices::resolve(
        &dirs,
        &names(&["example.com/dev=one", "example.com/dev=two"]),
    )
    .unwrap();
    assert_eq!(envs(&d), ["SPEC=b", "DEV_one=b", "SPEC=a", "DEV_two=a"]);
    assert!(
        d.parts[1].origin.contains("CDI device example.com/dev=one"),
        "{:?}",
        d.parts[1]
    );
    assert!(d.parts[1].origin.contains("x.yaml"), "{:?}", d.parts[1]);
    // Reversed, the first dir wins.
    let dirs: Vec<PathBuf> = dirs.into_iter().rev().collect();
    let d = Devices::resolve(&dirs, &names(&["example.com/dev=one"])).unwrap();
    assert_eq!(envs(&d), ["SPEC=a", "DEV_one=a"]);
}

#[test]
fn a_device_defined_twice_in_one_dir_is_an_error_for_it_alone() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(
        a.path(),
        "1.json",
        &spec_json("example.com/dev", "1", &["one", "two"]),
    );
    write(
        a.path(),
        "2.json",
        &spec_json("example.com/dev", "2", &["one", "three"]),
    );
    let dirs = vec![a.path().to_path_buf()];
    let err = Devices::resolve(&dirs, &names(&["example.com/dev=one"])).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("CDI device example.com/dev=one is defined by more than one spec")
            && msg.contains("1.json")
            && msg.contains("2.json"),
        "{msg}"
    );
    assert_eq!(crate::Error::from(err).code(), Code::FailedPrecondition);
    let d = Devices::resolve(
        &dirs,
        &names(&["example.com/dev=two", "example.com/dev=three"]),
    )
    .unwrap();
    assert_eq!(envs(&d), ["SPEC=1", "DEV_two=1", "SPEC=2", "DEV_three=2"]);
    // A dir of higher priority settles it.
    write(
        b.path(),
        "3.json",
        &spec_json("example.com/dev", "3", &["one"]),
    );
    let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
    let d = Devices::resolve(&dirs, &names(&["example.com/dev=one"])).unwrap();
    assert_eq!(envs(&d), ["SPEC=3", "DEV_one=3"]);
}

#[test]
fn unknown_devices_name_the_dirs_and_the_broken_files() {
    let a = tempfile::tempdir().unwrap();
    let missing = a.path().join("missing");
    write(
        a.path(),
        "good.json",
        &spec_json("example.com/dev", "g", &["one"]),
    );
    write(
        a.path(),
        "broken.yaml",
        "cdiVersion: 9.9.9\nkind: example.com/dev\n",
    );
    let dirs = vec![missing.clone(), a.path().to_path_buf()];
    let err = Devices::resolve(
        &dirs,
        &names(&[
            "example.com/dev=one",
            "example.com/dev=nope",
            "other.com/x=y",
        ]),
    )
    .unwrap_err();
    let msg = err.to_string();
    for part in [
        "unresolvable CDI devices example.com/dev=nope, other.com/x=y: not found in the CDI spec dirs",
        &missing.display().to_string(),
        &a.path().display().to_string(),
        "broken.yaml",
        "missing field `devices`",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert!(!msg.contains("good.json"), "{msg}");
    assert_eq!(crate::Error::from(err).code(), Code::NotFound);
    let err = Devices::resolve(&[], &names(&["a.com/b=c"])).unwrap_err();
    assert!(
        err.to_string().contains("nodeletCDISpecDirs is empty"),
        "{err}"
    );
    // Nothing asked, nothing read.
    assert!(Devices::resolve(&[missing], &[]).unwrap().parts.is_empty());
}

#[test]
fn a_spec_written_later_is_seen() {
    let a = tempfile::tempdir().unwrap();
    let dirs = vec![a.path().to_path_buf()];
    let want = names(&["example.com/dev=one"]);
    assert!(Devices::resolve(&dirs, &want).is_err());
    write(
        a.path(),
        "late.json",
        &spec_json("example.com/dev", "late", &["one"]),
    );
    assert_eq!(
        envs(&Devices::resolve(&dirs, &want).unwrap()),
        ["SPEC=late", "DEV_one=late"]
    );
}

#[test]
fn requested_devices_come_from_the_config_and_both_annotations() {
    let config = cri::ContainerConfig {
        cdi_devices: vec![
            cri::CdiDevice {
                name: "vendor.com/gpu=0".into(),
            },
            cri::CdiDevice {
                name: "vendor.com/gpu=1".into(),
            },
        ],
        annotations: HashMap::from([
            (
                "cdi.k8s.io/b".to_string(),
                "vendor.com/gpu=1,vendor.com/nic=a".to_string(),
            ),
            ("cdi.k8s.io/a".to_string(), "vendor.com/fpga=x".to_string()),
            ("other.io/cdi".to_string(), "not a name".to_string()),
        ]),
        ..Default::default()
    };
    let pod = cri::PodSandboxConfig {
        annotations: HashMap::from([(
            "cdi.k8s.io/pod".to_string(),
            "vendor.com/gpu=0,vendor.com/cam=c".to_string(),
        )]),
        ..Default::default()
    };
    let got: Vec<String> = requested(&config, &pod)
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        got,
        [
            "vendor.com/gpu=0",
            "vendor.com/gpu=1",
            "vendor.com/fpga=x",
            "vendor.com/nic=a",
            "vendor.com/cam=c"
        ]
    );
    assert!(
        requested(&Default::default(), &Default::default())
            .unwrap()
            .is_empty()
    );

    let bad = cri::PodSandboxConfig {
        annotations: HashMap::from([(
            "cdi.k8s.io/x".to_string(),
            "vendor.com/gpu=0, b/c=d".to_string(),
        )]),
        ..Default::default()
    };
    let err = requested(&Default::default(), &bad).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("pod annotation cdi.k8s.io/x") && msg.contains("\" b/c=d\""),
        "{msg}"
    );
    assert_eq!(crate::Error::from(err).code(), Code::InvalidArgument);
    let bad = cri::ContainerConfig {
        cdi_devices: vec![cri::CdiDevice {
            name: "gpu0".into(),
        }],
        ..Default::default()
    };
    let err = requested(&bad, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("CDI_devices: \"gpu0\" is not a qualified CDI device name"),
        "{err}"
    );
}

/// An OCI spec as the built-in runtime writes one, in short: a user, an env, the deny-all
/// device rule, a few mounts.
fn oci(uid: u32) -> Spec {
    let mut s = Spec::default();
    let process = s.process_mut().as_mut().unwrap();
    process.set_env(Some(vec!["PATH=/bin".into(), "A=old".into()]));
    process.user_mut().set_uid(uid);
    process.user_mut().set_gid(uid);
    let linux = s.linux_mut().as_mut().unwrap();
    let mut deny = oci_spec::runtime::LinuxDeviceCgroup::default();
    deny.set_allow(false);
    deny.set_access(Some("rwm".into()));
    let mut resources = oci_spec::runtime::LinuxResources::default();
    resources.set_devices(Some(vec![deny]));
    linux.set_resources(Some(resources));
    s
}

/// The devices of one device whose edits are `edits` (JSON), from a spec of version 0.8.0.
fn device(edits: &str) -> (tempfile::TempDir, Devices) {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "d.json",
        &format!(
            r#"{{"cdiVersion": "0.8.0", "kind": "example.com/dev",
                "devices": [{{"name": "x", "containerEdits": {edits}}}]}}"#
        ),
    );
    let d = Devices::resolve(&[dir.path().to_path_buf()], &names(&["example.com/dev=x"])).unwrap();
    (dir, d)
}

fn apply_err(edits: &str, spec: &mut Spec) -> (Code, String) {
    let (_dir, d) = device(edits);
    let err = crate::Error::from(d.apply(spec).unwrap_err());
    (err.code(), err.message().to_string())
}

#[test]
fn device_nodes_env_and_groups_are_applied() {
    let (_dir, d) = device(
        r#"{"env": ["A=new", "B=1"],
            "deviceNodes": [
              {"path": "/dev/xyz", "hostPath": "/dev/null", "permissions": "rw"},
              {"path": "/dev/given", "hostPath": "/nonexistent", "type": "b", "major": 8, "minor": 1, "uid": 0},
              {"path": "/dev/quiet", "hostPath": "/dev/zero", "permissions": "none"}
            ],
            "additionalGids": [0, 44, 44]}"#,
    );
    let mut s = oci(1000);
    d.apply(&mut s).unwrap();
    let p = s.process().as_ref().unwrap();
    assert_eq!(p.env().as_ref().unwrap(), &["PATH=/bin", "A=new", "B=1"]);
    assert_eq!(p.user().additional_gids().as_deref(), Some(&[44][..]));
    let linux = s.linux().as_ref().unwrap();
    let devs = linux.devices().as_ref().unwrap();
    let xyz = devs
        .iter()
        .find(|d| d.path() == Path::new("/dev/xyz"))
        .unwrap();
    assert_eq!(
        (xyz.typ(), xyz.major(), xyz.minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    assert_eq!((xyz.uid(), xyz.gid()), (Some(1000), Some(1000)));
    assert_eq!(xyz.file_mode(), Some(0o666));
    let given = devs
        .iter()
        .find(|d| d.path() == Path::new("/dev/given"))
        .unwrap();
    assert_eq!(
        (given.typ(), given.major(), given.minor()),
        (LinuxDeviceType::B, 8, 1)
    );
    assert_eq!(given.uid(), Some(0));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap();
    let allowed: Vec<_> = rules
        .iter()
        .filter(|r| r.allow())
        .map(|r| (r.typ(), r.major(), r.minor(), r.access().clone()))
        .collect();
    assert_eq!(
        allowed,
        [
            (
                Some(LinuxDeviceType::C),
                Some(1),
                Some(3),
                Some("rw".to_string())
            ),
            (
                Some(LinuxDeviceType::B),
                Some(8),
                Some(1),
                Some("rwm".to_string())
            ),
        ]
    );
    // Applied again, a node replaces the one at its path.
    d.apply(&mut s).unwrap();
    let linux = s.linux().as_ref().unwrap();
    assert_eq!(linux.devices().as_ref().unwrap().len(), 3);
}

#[test]
fn bad_device_nodes_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, "").unwrap();
    let file = file.display();
    for (edits, code, why) in [
        (
            r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "/nonexistent/a"}]}"#.to_string(),
            Code::InvalidArgument,
            "CDI device example.com/dev=x (",
        ),
        (
            r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "/nonexistent/a"}]}"#.to_string(),
            Code::InvalidArgument,
            "host device \"/nonexistent/a\": No such file",
        ),
        (
            format!(r#"{{"deviceNodes": [{{"path": "/dev/a", "hostPath": "{file}"}}]}}"#),
            Code::InvalidArgument,
            "is not a device node",
        ),
        (
            r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/null", "type": "b"}]}"#
                .to_string(),
            Code::InvalidArgument,
            "type \"b\", but host path \"/dev/null\" is of type \"c\"",
        ),
        (
            r#"{"deviceNodes": [{"path": "/tmp/a", "hostPath": "/dev/null"}]}"#.to_string(),
            Code::InvalidArgument,
            "must be an absolute path under /dev",
        ),
        (
            r#"{"deviceNodes": [{"path": "/dev/../etc/a", "hostPath": "/dev/null"}]}"#.to_string(),
            Code::InvalidArgument,
            "must be an absolute path under /dev",
        ),
        (
            r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "dev/null"}]}"#.to_string(),
            Code::InvalidArgument,
            "hostPath \"dev/null\" must be an absolute path",
        ),
        (
            r#"{"intelRdt": {"closID": "x"}}"#.to_string(),
            Code::InvalidArgument,
            "intelRdt (a resctrl class of service) is not supported",
        ),
    ] {
        let (c, msg) = apply_err(&edits, &mut oci(0));
        assert_eq!(c, code, "{edits}: {msg}");
        assert!(msg.contains(why), "{edits}: {msg}");
    }
    // In a pod user namespace the node is bound from its own path on the host.
    let mut s = oci(0);
    let linux = s.linux_mut().as_mut().unwrap();
    let mut ns = linux.namespaces().clone().unwrap_or_default();
    ns.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::User)
            .build()
            .unwrap(),
    );
    linux.set_namespaces(Some(ns));
    let (_, msg) = apply_err(
        r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/null"}]}"#,
        &mut s,
    );
    assert!(msg.contains("in a pod user namespace"), "{msg}");
    let (_dir, d) = device(r#"{"deviceNodes": [{"path": "/dev/null"}]}"#);
    d.apply(&mut s).unwrap();
}

#[test]
fn mounts_are_added_replaced_and_sorted() {
    let src = tempfile::tempdir().unwrap();
    let src = src.path().display().to_string();
    let (_dir, d) = device(&format!(
        r#"{{"mounts": [
            {{"hostPath": "{src}", "containerPath": "/opt/vendor/lib", "options": ["ro", "rbind"]}},
            {{"hostPath": "{src}", "containerPath": "/proc", "type": "bind"}},
            {{"hostPath": "tmpfs", "containerPath": "/vendor", "type": "tmpfs", "options": ["size=1m"]}}
        ]}}"#
    ));
    let mut s = oci(0);
    let before = s.mounts().as_ref().unwrap().len();
    d.apply(&mut s).unwrap();
    let mounts = s.mounts().as_ref().unwrap();
    assert_eq!(mounts.len(), before + 2, "/proc replaced: {mounts:?}");
    let depths: Vec<usize> = mounts
        .iter()
        .map(|m| m.destination().components().count())
        .collect();
    assert!(depths.windows(2).all(|w| w[0] <= w[1]), "{mounts:?}");
    let lib = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/opt/vendor/lib"))
        .unwrap();
    assert_eq!(lib.typ().as_deref(), Some("bind"));
    assert_eq!(
        lib.options().as_deref(),
        Some(&["ro".to_string(), "rbind".to_string()][..])
    );
    let proc = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/proc"))
        .unwrap();
    assert_eq!(proc.source().as_deref(), Some(Path::new(&src)));
    assert_eq!(proc.options().as_deref(), Some(&["bind".to_string()][..]));
    let tmpfs = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/vendor"))
        .unwrap();
    assert_eq!(tmpfs.typ().as_deref(), Some("tmpfs"));

    for (edits, why) in [
        (
            r#"{"mounts": [{"hostPath": "/nonexistent/lib", "containerPath": "/lib", "options": ["bind"]}]}"#,
            "\"/nonexistent/lib\" -> \"/lib\": the host path: No such file",
        ),
        (
            r#"{"mounts": [{"hostPath": "/tmp", "containerPath": "/x", "options": ["ro"]}]}"#,
            "is neither a bind mount",
        ),
        (
            r#"{"mounts": [{"hostPath": "/tmp", "containerPath": "x", "options": ["bind"]}]}"#,
            "containerPath \"x\" must be an absolute path",
        ),
        (
            r#"{"mounts": [{"hostPath": "tmp", "containerPath": "/x", "options": ["bind"]}]}"#,
            "hostPath \"tmp\" must be an absolute path",
        ),
    ] {
        let (code, msg) = apply_err(edits, &mut oci(0));
        assert_eq!(code, Code::InvalidArgument, "{msg}");
        assert!(msg.contains(why), "{edits}: {msg}");
    }
}

#[test]
fn hooks_run_by_libcontainer_are_added_with_a_bounded_timeout() {
    let (_dir, d) = device(
        r#"{"hooks": [
            {"hookName": "createContainer", "path": "/bin/sh", "args": ["sh", "-c", "true"], "env": ["A=1"]},
            {"hookName": "prestart", "path": "/bin/sh", "timeout": 3},
            {"hookName": "createRuntime", "path": "/bin/sh", "timeout": 3600},
            {"hookName": "startContainer", "path": "/in/the/container"},
            {"hookName": "poststop", "path": "/bin/sh", "timeout": 1}
        ]}"#,
    );
    let mut s = oci(0);
    d.apply(&mut s).unwrap();
    let hooks = s.hooks().as_ref().unwrap();
    let cc = hooks.create_container().as_ref().unwrap();
    assert_eq!(cc.len(), 1);
    assert_eq!(cc[0].path(), Path::new("/bin/sh"));
    assert_eq!(
        cc[0].args().as_deref(),
        Some(&["sh".to_string(), "-c".into(), "true".into()][..])
    );
    assert_eq!(cc[0].env().as_deref(), Some(&["A=1".to_string()][..]));
    assert_eq!(cc[0].timeout(), Some(apply::HOOK_TIMEOUT_MAX));
    let timeouts: Vec<_> = hooks
        .create_runtime()
        .as_ref()
        .unwrap()
        .iter()
        .map(|h| h.timeout())
        .collect();
    assert_eq!(timeouts, [Some(3), Some(apply::HOOK_TIMEOUT_MAX)]);
    assert_eq!(hooks.start_container().as_ref().unwrap().len(), 1);
    assert_eq!(hooks.poststop().as_ref().unwrap()[0].timeout(), Some(1));

    for (edits, why) in [
        (
            r#"{"hooks": [{"hookName": "poststart", "path": "/bin/sh"}]}"#,
            "poststart hook \"/bin/sh\": not run by nodelet's built-in runtime",
        ),
        (
            r#"{"hooks": [{"hookName": "createContainer", "path": "sh"}]}"#,
            "createContainer hook path \"sh\" must be an absolute path",
        ),
        (
            r#"{"hooks": [{"hookName": "createRuntime", "path": "/nonexistent/hook"}]}"#,
            "createRuntime hook \"/nonexistent/hook\" is not a file on the host",
        ),
        (
            r#"{"hooks": [{"hookName": "poststop", "path": "/bin/sh", "timeout": 0}]}"#,
            "timeout 0 must be greater than zero",
        ),
    ] {
        let (code, msg) = apply_err(edits, &mut oci(0));
        assert_eq!(code, Code::InvalidArgument, "{msg}");
        assert!(msg.contains(why), "{edits}: {msg}");
        assert!(msg.starts_with("CDI device example.com/dev=x ("), "{msg}");
    }
}
