//! The nodelet binary's node-local commands: importing images (good and broken archives),
//! listing and removing them, and `nodelet run` (the README's main job) printing a container's
//! output and exiting with its code.

mod common;

use std::process::Command;

use common::*;

fn nodelet(root: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .output()
        .expect("running nodelet")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn import_list_remove_and_broken_archives() {
    if !root_or_skip("import_list_remove_and_broken_archives") {
        return;
    }
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let docker = work.path().join("busybox-docker.tar");
    let st = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/build-busybox-image.sh"
        ))
        .arg(&docker)
        .args([
            "--format",
            "docker",
            "--name",
            "example.com/tools/busybox:1",
        ])
        .status()
        .unwrap();
    assert!(st.success());

    // Broken archives are refused with a message and leave nothing behind.
    let garbage = work.path().join("garbage.tar");
    std::fs::write(&garbage, b"this is not a tar archive at all").unwrap();
    let truncated = work.path().join("truncated.tar");
    let bytes = std::fs::read(busybox_archive()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    for bad in [&garbage, &truncated] {
        let out = nodelet(root.path(), &["images", "import", bad.to_str().unwrap()]);
        assert!(
            !out.status.success(),
            "importing {} must fail",
            bad.display()
        );
        let err = text(&out.stderr);
        assert!(err.contains("importing"), "clear message: {err}");
    }
    let out = nodelet(root.path(), &["images", "list"]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "only the header: {}",
        text(&out.stdout)
    );

    // Both formats import; names come from the archive.
    let out = nodelet(
        root.path(),
        &[
            "images",
            "import",
            busybox_archive().to_str().unwrap(),
            docker.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = nodelet(root.path(), &["images", "list"]);
    let list = text(&out.stdout);
    assert!(list.contains("docker.io/library/busybox:latest"), "{list}");
    assert!(list.contains("example.com/tools/busybox:1"), "{list}");

    let out = nodelet(
        root.path(),
        &["images", "remove", "example.com/tools/busybox:1"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = nodelet(
        root.path(),
        &["images", "remove", "example.com/tools/busybox:1"],
    );
    assert!(
        !out.status.success(),
        "removing again says there is nothing to remove"
    );
    let list = text(&nodelet(root.path(), &["images", "list"]).stdout);
    assert!(!list.contains("example.com/tools/busybox:1"), "{list}");
}

#[test]
fn run_prints_output_and_exits_with_the_container_code() {
    if !root_or_skip("run_prints_output_and_exits_with_the_container_code") {
        return;
    }
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let out = nodelet(
        root.path(),
        &["images", "import", busybox_archive().to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = nodelet(
        root.path(),
        &[
            "run",
            "--name",
            "hello",
            BUSYBOX,
            "--",
            "sh",
            "-c",
            "echo hello from $(hostname); echo to-stderr >&2; exit 7",
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello from hello\n");
    assert!(text(&out.stderr).contains("to-stderr"));
    // Without --keep the pod is gone afterwards: no sandbox dirs, no mounts.
    let sandboxes = common::state_entries(root.path(), "sandboxes");
    assert!(sandboxes.is_empty(), "{sandboxes:?}");
    assert_no_leaks(root.path(), "/nodelet-none");

    let out = nodelet(root.path(), &["run", "no/such:image", "--", "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        common::state_entries(root.path(), "sandboxes"),
        Vec::<String>::new(),
        "failed run cleans up"
    );
}

#[test]
fn cri_serve_refuses_the_systemd_driver_on_a_machine_without_systemd() {
    if std::path::Path::new("/run/systemd/system").is_dir() {
        eprintln!(
            "SKIP: systemd runs this machine (tests/systemd_node.rs covers the driver there)"
        );
        return;
    }
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let sock = root.path().join("cri.sock");
    let out = nodelet(
        root.path(),
        &[
            "cri",
            "serve",
            "--listen",
            &format!("unix://{}", sock.display()),
            "--cgroup-driver",
            "systemd",
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("the systemd cgroup driver needs systemd as this machine's init system"),
        "{err}"
    );
    assert!(!sock.exists(), "nothing was served");
}

#[test]
fn run_node_refuses_cni_mode_with_a_remote_runtime() {
    if !root_or_skip("run_node_refuses_cni_mode_with_a_remote_runtime") {
        return;
    }
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let config = root.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerRuntimeEndpoint: unix://{}/containerd.sock\ncgroupRoot: /nl-e2e-climode\n\
             nodeletNetwork: {{mode: cni}}\n",
            root.path().display()
        ),
    )
    .unwrap();
    let out = nodelet(
        root.path(),
        &[
            "run-node",
            "--config",
            config.to_str().unwrap(),
            "--node-ip",
            "127.0.0.1",
        ],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("nodeletNetwork.mode: cni is the built-in runtime's"),
        "{err}"
    );
    remove_cgroup_root("/nl-e2e-climode");
}
