//! Table tests of [`super`] (`pod::container`).

use super::*;
use crate::pod::spec::tests::pod;
use serde_json::json;

/// The container config of `c` in `p`, with `p`'s volumes (claims aside) mounted from where
/// the volume manager sets them up under `opts.pods_dir`.
fn config_of(
    p: &Pod,
    c: &Container,
    restart: u32,
    opts: &ContainerOptions,
) -> Result<cri::ContainerConfig> {
    let who = PodRef::of(p);
    let mut opts = opts.clone();
    let volumes = p.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for v in volumes.into_iter().flatten() {
        if let Ok(m) = volumes::mounted(&opts.pods_dir, &who.uid, v) {
            opts.volumes.insert(v.name.clone(), m);
        }
    }
    container_config(p, &who, c, restart, &opts)
}

fn config(spec: serde_json::Value, restart: u32) -> Result<cri::ContainerConfig> {
    let p = pod(spec);
    let c = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .cloned()
        .expect("a container");
    // The termination message file is made under the pods dir: a temporary one, shown as
    // `/root/pods` in the host paths returned.
    let dir = tempfile::tempdir().expect("pods dir");
    let opts = ContainerOptions {
        pods_dir: dir.path().join("pods"),
        node_name: "node-1".into(),
        pod_ips: vec!["10.1.0.5".into()],
        host_ips: vec!["192.168.1.2".into()],
        node_memory_bytes: 8 << 30,
        ..Default::default()
    };
    let cfg = config_of(&p, &c, restart, &opts);
    // subPath binds were made under the temporary pods dir: undone before it goes.
    unbind_all(&opts.pods_dir);
    let mut cfg = cfg?;
    for m in &mut cfg.mounts {
        if let Ok(rest) = Path::new(&m.host_path).strip_prefix(&opts.pods_dir) {
            m.host_path = Path::new("/root/pods").join(rest).display().to_string();
        }
    }
    Ok(cfg)
}

/// Unmounts every mount under `dir` (the subPath binds a config made there).
fn unbind_all(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Ok(real) = dir.canonicalize() else { return };
    for m in crate::util::mounts_under(&info, &real) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Whether this test may mount (subPaths are bound): as root. Elsewhere it says so loudly,
/// and under CI fails.
fn may_mount(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run as root: {test}"
    );
    eprintln!("SKIP (needs root to bind subPaths): {test}");
    false
}

/// Options with a temporary pods dir (kept while the returned guard lives).
fn temp_opts() -> (tempfile::TempDir, ContainerOptions) {
    let dir = tempfile::tempdir().expect("pods dir");
    let opts = ContainerOptions {
        pods_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    (dir, opts)
}

/// The termination message mount, if any (the last mount).
fn termination_mount(c: &cri::ContainerConfig) -> Option<&cri::Mount> {
    c.mounts
        .last()
        .filter(|m| m.host_path.starts_with("/root/pods/u-1/containers/"))
}

fn env(c: &cri::ContainerConfig) -> Vec<(String, String)> {
    c.envs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

#[test]
fn expansion_table() {
    let vars: HashMap<String, String> = [("A", "1"), ("B", "two")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cases = [
        ("$(A)", "1"),
        ("x$(A)y$(B)", "x1ytwo"),
        ("$$(A)", "$(A)"),
        ("$(C)", "$(C)"),
        ("$(A", "$(A"),
        ("$A", "$A"),
        ("cost $5", "cost $5"),
        ("end$", "end$"),
    ];
    for (input, want) in cases {
        assert_eq!(expand(input, &vars), want, "{input}");
    }
}

#[test]
fn basics() {
    let c = config(
        json!({"containers": [{"name": "app", "image": "busybox", "command": ["sh", "-c"], "args": ["echo $(GREETING) $(POD)"],
            "workingDir": "/w", "tty": true, "stdin": true,
            "env": [
                {"name": "GREETING", "value": "hi"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "MSG", "value": "$(GREETING) from $(POD) $(MISSING) $$(GREETING)"}
            ]}]}),
        3,
    )
    .expect("config");
    assert_eq!(
        c.metadata,
        Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 3
        })
    );
    assert_eq!(c.image.as_ref().map(|i| i.image.as_str()), Some("busybox"));
    assert_eq!(c.command, ["sh", "-c"]);
    assert_eq!(c.args, ["echo hi web"]);
    assert_eq!(c.working_dir, "/w");
    assert!(c.tty && c.stdin && !c.stdin_once);
    assert_eq!(c.log_path, "app/3.log");
    let want = [
        ("GREETING", "hi"),
        ("POD", "web"),
        ("NS", "prod"),
        ("UID", "u-1"),
        ("NODE", "node-1"),
        ("IP", "10.1.0.5"),
        ("HOST", "192.168.1.2"),
        ("LABEL", "web"),
        ("MSG", "hi from web $(MISSING) $(GREETING)"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(env(&c), want);
    assert_eq!(
        c.labels.get(LABEL_CONTAINER_NAME).map(String::as_str),
        Some("app")
    );
    assert_eq!(
        c.labels.get(LABEL_POD_NAMESPACE).map(String::as_str),
        Some("prod")
    );
    assert_eq!(
        c.annotations
            .get(ANNOTATION_RESTART_COUNT)
            .map(String::as_str),
        Some("3")
    );
    assert_eq!(
        c.annotations
            .get(ANNOTATION_CONTAINER_HASH)
            .map(String::len),
        Some(16)
    );
    assert_eq!(
        c.annotations
            .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
            .map(String::as_str),
        Some("/dev/termination-log")
    );
}

#[test]
fn mounts_table() {
    if !may_mount("mounts_table") {
        return;
    }
    let data = tempfile::tempdir().expect("a host dir");
    let data_path = data.path().display().to_string();
    let volumes = json!([
        {"name": "data", "hostPath": {"path": data_path}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "c"}},
        {"name": "pvc", "persistentVolumeClaim": {"claimName": "x"}}
    ]);
    let with = |mounts: serde_json::Value, privileged: bool| {
        config(
            json!({"volumes": volumes, "containers": [{"name": "app", "image": "x", "volumeMounts": mounts,
                "securityContext": {"privileged": privileged}}]}),
            0,
        )
    };
    let c = with(
        json!([
            {"name": "data", "mountPath": "/data", "readOnly": true, "subPath": "a/b"},
            {"name": "scratch", "mountPath": "/tmp/s", "mountPropagation": "HostToContainer"},
            {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": false}
        ]),
        false,
    )
    .expect("config");
    let got: Vec<_> = c
        .mounts
        .iter()
        .filter(|m| m.container_path != "/dev/termination-log")
        .map(|m| {
            (
                m.container_path.as_str(),
                m.host_path.as_str(),
                m.readonly,
                m.propagation,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "/data",
                "/root/pods/u-1/volume-subpaths/data/app/0",
                true,
                cri::MountPropagation::PropagationPrivate as i32
            ),
            (
                "/tmp/s",
                "/root/pods/u-1/volumes/kubernetes.io~empty-dir/scratch",
                false,
                cri::MountPropagation::PropagationHostToContainer as i32
            ),
            // A volume the kubelet writes: read-only whatever the mount says.
            (
                "/etc/cfg",
                "/root/pods/u-1/volumes/kubernetes.io~configmap/cfg",
                true,
                cri::MountPropagation::PropagationPrivate as i32
            ),
            // The pod's hosts file the kubelet writes (the pod has an address).
            (
                "/etc/hosts",
                "/root/pods/u-1/etc-hosts",
                false,
                cri::MountPropagation::PropagationPrivate as i32
            ),
        ]
    );
    // The subPath's directories are made in the volume.
    assert!(data.path().join("a/b").is_dir());
    let bidi = with(
        json!([{"name": "data", "mountPath": "/d", "mountPropagation": "Bidirectional"}]),
        true,
    )
    .expect("privileged");
    assert_eq!(
        bidi.mounts[0].propagation,
        cri::MountPropagation::PropagationBidirectional as i32
    );
    let errors = [
        (
            json!([{"name": "data", "mountPath": "/d", "subPath": "../etc"}]),
            runtime::Code::InvalidArgument,
            "subPath",
        ),
        (
            json!([{"name": "data", "mountPath": "/d", "subPath": "/etc"}]),
            runtime::Code::InvalidArgument,
            "subPath",
        ),
        (
            json!([{"name": "nope", "mountPath": "/d"}]),
            runtime::Code::InvalidArgument,
            "volumeMounts[0].name",
        ),
        (
            json!([{"name": "data", "mountPath": "/d", "mountPropagation": "Bidirectional"}]),
            runtime::Code::InvalidArgument,
            "mountPropagation",
        ),
        (
            json!([{"name": "pvc", "mountPath": "/d"}]),
            runtime::Code::Unimplemented,
            "spec.volumes[pvc]: persistentVolumeClaim \"x\" was not resolved for this sync",
        ),
    ];
    for (mounts, code, field) in errors {
        let err = with(mounts.clone(), false).expect_err("invalid");
        assert_eq!(err.code(), code, "{mounts}");
        assert!(err.message().contains(field), "{}", err.message());
    }
}

#[test]
fn resources_table() {
    let res = |r: serde_json::Value| {
        let c = config(
            json!({"containers": [{"name": "a", "image": "x", "resources": r}]}),
            0,
        )
        .expect("config");
        c.linux.and_then(|l| l.resources).expect("resources")
    };
    // (resources, shares, quota, period, memory, oom)
    let cases = [
        (json!({}), 2, 0, 0, 0, 1000),
        (
            json!({"limits": {"cpu": "500m", "memory": "128Mi"}}),
            512,
            50_000,
            100_000,
            128 << 20,
            -997,
        ),
        (json!({"requests": {"cpu": "1m"}}), 2, 0, 0, 0, 999),
        (
            json!({"requests": {"cpu": "250m", "memory": "4Gi"}}),
            256,
            0,
            0,
            0,
            500,
        ),
        (
            json!({"requests": {"memory": "8Gi"}, "limits": {"cpu": "5m"}}),
            5,
            1000,
            100_000,
            0,
            3,
        ),
    ];
    for (r, shares, quota, period, mem, oom) in cases {
        let got = res(r.clone());
        assert_eq!(
            (
                got.cpu_shares,
                got.cpu_quota,
                got.cpu_period,
                got.memory_limit_in_bytes,
                got.oom_score_adj
            ),
            (shares, quota, period, mem, oom),
            "{r}"
        );
    }
    let err = config(json!({"containers": [{"name": "a", "image": "x", "resources": {"limits": {"memory": "12Q"}}}]}), 0).expect_err("bad");
    assert_eq!(err.code(), runtime::Code::InvalidArgument);
    assert!(
        err.message().contains("resources.limits.memory"),
        "{}",
        err.message()
    );
}

#[test]
fn security_context() {
    let c = config(
        json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 10, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "a", "image": "x", "securityContext": {
                "runAsUser": 2000, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}, "seccompProfile": {"type": "Unconfined"}}}]}),
        0,
    )
    .expect("config");
    let sc = c.linux.and_then(|l| l.security_context).expect("sc");
    assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 2000 }));
    assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 10 }));
    assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
    let caps = sc.capabilities.expect("caps");
    assert_eq!(
        (caps.add_capabilities, caps.drop_capabilities),
        (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
    );
    assert_eq!(
        sc.seccomp.map(|s| s.profile_type),
        Some(cri::security_profile::ProfileType::Unconfined as i32)
    );

    let c = config(json!({"containers": [{"name": "a", "image": "x", "securityContext": {"privileged": true, "allowPrivilegeEscalation": false}}]}), 0).expect("config");
    let sc = c.linux.and_then(|l| l.security_context).expect("sc");
    assert!(sc.privileged && !sc.no_new_privs);

    let err = config(json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a", "image": "x", "securityContext": {"runAsUser": 0}}]}), 0).expect_err("root");
    assert_eq!(err.code(), runtime::Code::InvalidArgument);
}

#[test]
fn rejects_bad_input() {
    let err = config(json!({"containers": [{"name": "a"}]}), 0).expect_err("no image");
    assert!(err.message().contains("image"));
    let err = config(json!({"containers": [{"name": "a", "image": "x", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]}]}), 0).expect_err("bad fieldPath");
    assert_eq!(err.code(), runtime::Code::InvalidArgument);
    // A secret nobody read for the sync (the syncer reads every one referenced) is an error,
    // even for an optional reference: never a variable silently left out.
    let err = config(json!({"containers": [{"name": "a", "image": "x", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": true}}}]}]}), 0).expect_err("secret");
    assert_eq!(err.code(), runtime::Code::InvalidArgument);
    assert_eq!(err.message(), "secret \"s\" was not read for this sync");
    let p = pod(json!({"containers": [{"name": "a", "image": "x"}]}));
    let other = Container {
        name: "zzz".into(),
        image: Some("x".into()),
        ..Default::default()
    };
    assert!(config_of(&p, &other, 0, &ContainerOptions::default()).is_err());
}

#[test]
fn a_pod_user_namespace_reaches_the_container_and_its_mounts() {
    let p = pod(
        json!({"hostUsers": false, "containers": [{"name": "app", "image": "busybox",
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]}),
    );
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let map = |host_id| cri::IdMapping {
        container_id: 0,
        host_id,
        length: 65536,
    };
    let userns = cri::UserNamespace {
        mode: cri::NamespaceMode::Pod as i32,
        uids: vec![map(131072)],
        gids: vec![map(131072)],
    };
    let (_dir, mut opts) = temp_opts();
    opts.sandbox.user_namespace = Some(userns.clone());
    let cfg = config_of(&p, &c, 0, &opts).unwrap();
    let ns = cfg
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|o| o.userns_options.as_ref());
    assert_eq!(ns, Some(&userns));
    // As upstream, every volume mount carries the pod's mappings (the termination message
    // file, world-writable, needs none).
    assert_eq!(cfg.mounts.len(), 2);
    assert_eq!(cfg.mounts[0].uid_mappings, userns.uids);
    assert_eq!(cfg.mounts[0].gid_mappings, userns.gids);
    assert_eq!(cfg.mounts[1].container_path, "/dev/termination-log");
    // Without one, neither.
    let (_plain_dir, plain) = temp_opts();
    let cfg = config_of(&p, &c, 0, &plain).unwrap();
    assert!(cfg.mounts[0].uid_mappings.is_empty());
    let sb = crate::pod::sandbox_config(&p, &PodRef::of(&p), &opts.sandbox).unwrap();
    let sb_ns = sb
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .and_then(|o| o.userns_options);
    assert_eq!(sb_ns, Some(userns));
}

#[test]
fn a_stop_signal_goes_to_a_runtime_that_takes_it_and_is_refused_otherwise() {
    let p = crate::pod::spec::tests::pod(serde_json::json!({"containers": [
        {"name": "a", "image": "busybox", "lifecycle": {"stopSignal": "SIGUSR1"}}]}));
    let c = p.spec.as_ref().expect("spec").containers[0].clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = ContainerOptions {
        pods_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let err = config_of(&p, &c, 0, &opts)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains(
            "lifecycle.stopSignal \"SIGUSR1\" is not supported with this container runtime"
        ),
        "{err}"
    );
    opts.stop_signal_annotation = true;
    let cfg = config_of(&p, &c, 0, &opts).expect("config");
    assert_eq!(
        cfg.annotations
            .get(runtime::builtin::ANNOTATION_STOP_SIGNAL)
            .map(String::as_str),
        Some("SIGUSR1")
    );
    // Without one, no annotation: the image's STOPSIGNAL applies.
    let plain = crate::pod::spec::tests::pod(serde_json::json!({"containers": [
        {"name": "a", "image": "busybox"}]}));
    let c = plain.spec.as_ref().expect("spec").containers[0].clone();
    let cfg = config_of(&plain, &c, 0, &opts).expect("config");
    assert!(
        !cfg.annotations
            .contains_key(runtime::builtin::ANNOTATION_STOP_SIGNAL)
    );
}

#[test]
fn the_termination_message_file_is_mounted() {
    // The API default path, read-write and not relabeled, from a file under the pod's dir.
    let c = config(json!({"containers": [{"name": "app", "image": "x"}]}), 2).expect("config");
    let m = termination_mount(&c).expect("a termination message mount");
    assert_eq!(m.container_path, "/dev/termination-log");
    assert!(
        m.host_path.starts_with("/root/pods/u-1/containers/app/2-"),
        "{m:?}"
    );
    assert!(!m.readonly && !m.selinux_relabel, "{m:?}");
    let paths: Vec<&str> = c.mounts.iter().map(|m| m.container_path.as_str()).collect();
    assert_eq!(paths, ["/etc/hosts", "/dev/termination-log"]);
    assert_eq!(
        c.annotations
            .get(termination::ANNOTATION_TERMINATION_MESSAGE_POLICY)
            .map(String::as_str),
        Some("File")
    );
    // The spec's path and policy.
    let c = config(
        json!({"containers": [{"name": "app", "image": "x", "terminationMessagePath": "/tmp/why",
            "terminationMessagePolicy": "FallbackToLogsOnError"}]}),
        0,
    )
    .expect("config");
    let m = termination_mount(&c).expect("a termination message mount");
    assert_eq!(m.container_path, "/tmp/why");
    assert_eq!(
        c.annotations
            .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
            .map(String::as_str),
        Some("/tmp/why")
    );
    assert_eq!(
        c.annotations
            .get(termination::ANNOTATION_TERMINATION_MESSAGE_POLICY)
            .map(String::as_str),
        Some("FallbackToLogsOnError")
    );
    // An empty path: no file, no mount (the hosts file's is the only one).
    let c = config(
        json!({"containers": [{"name": "app", "image": "x", "terminationMessagePath": ""}]}),
        0,
    )
    .expect("config");
    assert!(termination_mount(&c).is_none(), "{:?}", c.mounts);
    assert_eq!(c.mounts.len(), 1, "{:?}", c.mounts);
    assert_eq!(
        c.annotations
            .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
            .map(String::as_str),
        Some("")
    );
}

#[test]
fn the_termination_message_file_exists_on_the_host() {
    let p = pod(json!({"containers": [{"name": "app", "image": "x"}]}));
    let c = p.spec.as_ref().expect("spec").containers[0].clone();
    let (dir, opts) = temp_opts();
    let cfg = config_of(&p, &c, 0, &opts).expect("config");
    let m = cfg.mounts.last().expect("a mount");
    let meta = std::fs::metadata(&m.host_path).expect("the file");
    assert!(meta.is_file() && meta.len() == 0);
    assert!(Path::new(&m.host_path).starts_with(dir.path().join("u-1/containers/app")));
    // A config that fails leaves no file behind.
    let bad_pod = pod(
        json!({"containers": [{"name": "app", "image": "x", "resources": {"limits": {"memory": "12Q"}}}]}),
    );
    let bad = bad_pod.spec.as_ref().expect("spec").containers[0].clone();
    let (bad_dir, opts) = temp_opts();
    assert!(config_of(&bad_pod, &bad, 0, &opts).is_err());
    assert!(!bad_dir.path().join("u-1").exists());
    // A file that cannot be made is a config error naming the field.
    let (dir, mut opts) = temp_opts();
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"").expect("a file");
    opts.pods_dir = blocker;
    let err = config_of(&p, &c, 0, &opts).expect_err("no dir");
    assert!(err.message().contains("terminationMessagePath"), "{err}");
}

#[test]
fn sub_path_expr_expands_from_the_env() {
    if !may_mount("sub_path_expr_expands_from_the_env") {
        return;
    }
    let data = tempfile::tempdir().expect("a host dir");
    let data_path = data.path().display().to_string();
    let with = |expr: &str| {
        config(
            json!({"volumes": [{"name": "data", "hostPath": {"path": data_path}}],
                "containers": [{"name": "app", "image": "x",
                    "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "EMPTY", "value": ""}],
                    "volumeMounts": [{"name": "data", "mountPath": "/d", "subPathExpr": expr}]}]}),
            0,
        )
    };
    let c = with("logs/$(POD)").expect("expanded");
    // Bound for the runtime at upstream's place, as the subPath resolved.
    let target = "/root/pods/u-1/volume-subpaths/data/app/0";
    assert_eq!(c.mounts[0].host_path, target);
    assert!(data.path().join("logs/web").is_dir());
    // `$$` escapes; an escaped reference is no variable.
    let c = with("a$$(NOPE)").expect("escaped");
    assert_eq!(c.mounts[0].host_path, target);
    assert!(data.path().join("a$(NOPE)").is_dir());
    for (expr, want) in [
        (
            "$(NOPE)/$(EMPTY)",
            "subPathExpr: missing value for EMPTY, NOPE",
        ),
        ("../$(POD)", "must be a relative path without '..'"),
    ] {
        let e = with(expr).expect_err(expr);
        assert_eq!(e.code(), runtime::Code::InvalidArgument);
        assert!(e.message().contains(want), "{expr}: {}", e.message());
    }
}
