//! CDI devices on the built-in runtime, as root: spec files the test writes into the runtime's
//! spec dir after it started give containers their device nodes (allowed in the device
//! cgroup), env and hooks, asked for through CRI `CDI_devices`, a container annotation or a pod
//! annotation; an unknown device or an edit the runtime refuses fails CreateContainer clearly.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{Code, RuntimeService, cri};

/// A node whose built-in runtime reads CDI specs from `specs` only.
async fn cdi_node(name: &str, specs: &Path) -> Node {
    let root = tempfile::Builder::new()
        .prefix("nl")
        .tempdir()
        .expect("tempdir");
    let cgroup_root = format!("/nodelet-e2e-{name}-{}", std::process::id());
    let mut cfg = config(root.path(), &cgroup_root);
    cfg.cdi_spec_dirs = vec![specs.to_path_buf()];
    let network = cfg.network.clone();
    let rt = BuiltinRuntime::new(cfg).await.expect("runtime");
    rt.image_store()
        .import(&busybox_archive())
        .expect("import busybox");
    Node {
        rt,
        root,
        cgroup_root,
        network,
    }
}

/// A character device node at `path` with the numbers of /dev/null (1:3).
fn null_copy(path: &Path) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )
    .expect("mknod");
}

/// The YAML spec of `nodelet.test/dev`: device `one` is the /dev/null copy at `/dev/xyz`
/// (its type and numbers read from the host node) and an unused character device number
/// (240:7, in the range for local use: no driver answers it) at `/dev/cdi-probe`, with
/// `CDI_DEVICE=<tag>`; the spec adds `CDI_VENDOR=nodelet`. Device `late-hook` has a
/// poststart hook, which the runtime refuses.
fn dev_spec(host_node: &Path, tag: &str) -> String {
    format!(
        r#"---
cdiVersion: "0.6.0"
kind: nodelet.test/dev
devices:
  - name: one
    containerEdits:
      env: ["CDI_DEVICE={tag}"]
      deviceNodes:
        - path: /dev/xyz
          hostPath: {host}
          permissions: rw
        - path: /dev/cdi-probe
          type: c
          major: 240
          minor: 7
  - name: late-hook
    containerEdits:
      hooks:
        - hookName: poststart
          path: /bin/true
containerEdits:
  env: ["CDI_VENDOR=nodelet"]
"#,
        host = host_node.display()
    )
}

/// Writes `text` to `dir/name` the way a driver should: a temp file renamed into place.
fn write_spec(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("writing the spec");
    std::fs::rename(&tmp, dir.join(name)).expect("renaming the spec");
}

/// What a container sees of the device: the node, a write to it, the env, and whether the
/// device cgroup lets it open the probe (allowed: no driver answers, ENXIO) and a node of its
/// own with the next number (denied: EPERM).
const CHECK: &str = "test -c /dev/xyz && stat -c '%t:%T' /dev/xyz && echo hi > /dev/xyz && \
     echo \"dev=$CDI_DEVICE vendor=$CDI_VENDOR\"; cat /dev/cdi-probe; \
     mknod /tmp/other c 240 8 && cat /tmp/other; true";

async fn run_check(
    node: &Node,
    sandbox: &(String, cri::PodSandboxConfig),
    name: &str,
    tweak: impl FnOnce(&mut cri::ContainerConfig),
) -> (String, String) {
    let mut cfg = container_config(name, &["sh", "-c", CHECK]);
    tweak(&mut cfg);
    let (code, out, err) = node.run_to_exit(sandbox, cfg).await;
    assert_eq!(code, 0, "{name}: {out} {err}");
    (out, err)
}

fn assert_sees_device(name: &str, (out, err): &(String, String), tag: &str) {
    assert!(out.contains("1:3\n"), "{name}: {out} {err}");
    assert!(
        out.contains(&format!("dev={tag} vendor=nodelet")),
        "{name}: {out} {err}"
    );
    assert!(
        err.contains("/dev/cdi-probe': No such device or address"),
        "{name}: the device cgroup refused the CDI node: {err}"
    );
    assert!(
        err.contains("/tmp/other': Operation not permitted"),
        "{name}: a device the spec does not name was allowed: {err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cdi_devices_from_specs_written_after_start() {
    if !root_or_skip("cdi_devices_from_specs_written_after_start") {
        return;
    }
    let specs = tempfile::tempdir().expect("tempdir");
    let host = tempfile::tempdir().expect("tempdir");
    let node = cdi_node("cdi", specs.path()).await;
    // Written once the runtime runs: read when a container asks.
    let host_node = host.path().join("nulldev");
    null_copy(&host_node);
    write_spec(specs.path(), "dev.yaml", &dev_spec(&host_node, "one"));

    let sb = node.sandbox("cdi").await;
    let by_field = run_check(&node, &sb, "field", |c| {
        c.cdi_devices = vec![cri::CdiDevice {
            name: "nodelet.test/dev=one".into(),
        }]
    })
    .await;
    assert_sees_device("CDI_devices", &by_field, "one");
    let by_annotation = run_check(&node, &sb, "annotation", |c| {
        c.annotations
            .insert("cdi.k8s.io/test_dev".into(), "nodelet.test/dev=one".into());
    })
    .await;
    assert_sees_device("container annotation", &by_annotation, "one");
    // Without asking, nothing of it.
    let (code, out, _) = node
        .run_to_exit(
            &sb,
            container_config(
                "plain",
                &["sh", "-c", "test -e /dev/xyz || echo none $CDI_DEVICE"],
            ),
        )
        .await;
    assert_eq!((code, out.as_str()), (0, "none\n"));

    // The spec changed: the next container sees the change (no stale copy).
    write_spec(specs.path(), "dev.yaml", &dev_spec(&host_node, "two"));
    let pod = node
        .sandbox_with("cdi-pod", |c| {
            c.annotations
                .insert("cdi.k8s.io/pod_dev".into(), "nodelet.test/dev=one".into());
        })
        .await;
    let by_pod = run_check(&node, &pod, "pod", |_| {}).await;
    assert_sees_device("pod annotation", &by_pod, "two");

    // An unknown device, and one whose edits the runtime refuses, fail CreateContainer.
    let mut unknown = container_config("unknown", &["true"]);
    unknown.cdi_devices = vec![cri::CdiDevice {
        name: "nodelet.test/dev=nope".into(),
    }];
    let err = node.try_create(&sb, unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(
        err.message().contains("nodelet.test/dev=nope")
            && err.message().contains(&specs.path().display().to_string()),
        "{err}"
    );
    let mut refused = container_config("refused", &["true"]);
    refused
        .annotations
        .insert("cdi.k8s.io/x".into(), "nodelet.test/dev=late-hook".into());
    let err = node.try_create(&sb, refused).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("poststart hook"), "{err}");
    let mut bad = container_config("bad", &["true"]);
    bad.cdi_devices = vec![cri::CdiDevice { name: "xyz".into() }];
    let err = node.try_create(&sb, bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("not a qualified CDI device name"),
        "{err}"
    );
    node.teardown().await;
}

/// A JSON spec whose device has a createRuntime, a createContainer and a poststop hook writing
/// the container state they are given to `<out>/<hook>.json`, and a startContainer hook (a path
/// in the container) leaving a file the container prints.
fn hook_spec(out: &Path) -> String {
    let host_hook = |name: &str| {
        serde_json::json!({
            "hookName": name,
            "path": "/bin/sh",
            "args": ["sh", "-c", format!("cat > {}/{name}.json", out.display())],
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        })
    };
    serde_json::json!({
        "cdiVersion": "0.8.0",
        "kind": "nodelet.test/hooked",
        "devices": [{
            "name": "h",
            "containerEdits": {
                "hooks": [
                    host_hook("createRuntime"),
                    host_hook("createContainer"),
                    {
                        "hookName": "startContainer",
                        "path": "/bin/sh",
                        "args": ["sh", "-c", "echo started-by-hook > /hook-started"],
                        "timeout": 5,
                    },
                    host_hook("poststop"),
                ],
            },
        }],
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn cdi_hooks_run_at_their_points() {
    if !root_or_skip("cdi_hooks_run_at_their_points") {
        return;
    }
    let specs = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let node = cdi_node("cdihook", specs.path()).await;
    write_spec(specs.path(), "hooked.json", &hook_spec(out.path()));
    let sb = node.sandbox("cdihook").await;
    let mut cfg = container_config("hooked", &["cat", "/hook-started"]);
    cfg.cdi_devices = vec![cri::CdiDevice {
        name: "nodelet.test/hooked=h".into(),
    }];
    let id = node.container_with(&sb, cfg).await;
    let s = node.wait_exited(&id).await;
    let (stdout, stderr) = log_output(Path::new(&s.log_path));
    assert_eq!(
        (s.exit_code, stdout.as_str()),
        (0, "started-by-hook\n"),
        "{stderr}"
    );
    let state = |hook: &str| -> serde_json::Value {
        let path: PathBuf = out.path().join(format!("{hook}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{hook} hook did not run ({}: {e})", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{hook}: {text:?}: {e}"))
    };
    for hook in ["createRuntime", "createContainer"] {
        assert_eq!(state(hook)["id"], id.as_str(), "{hook}");
    }
    assert!(!out.path().join("poststop.json").exists());
    node.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer");
    // The sandbox deletes the container in libcontainer (running the poststop hooks) right
    // after it answered.
    settle(|| out.path().join("poststop.json").exists()).await;
    assert_eq!(state("poststop")["id"], id.as_str());
    node.teardown().await;
}
