//! nodelet on a systemd host: a Debian machine (scripts/build-systemd-image.sh: systemd as
//! PID 1, systemd-logind, D-Bus, deploy/systemd/nodelet.service) booted under qemu, its agent
//! registered with the project's test API server on this machine (reached at qemu's user
//! network address for the host, 10.0.2.2).
//!
//! Graceful node shutdown through logind: with `shutdownGracePeriod: 20s` the agent raises
//! logind's `InhibitDelayMaxSec` (5 s by default) and holds a delay inhibitor lock. When the
//! machine is told to power off (logind's `PowerOff`, as the power key or `systemctl poweroff`
//! do), the pod's container, which ignores SIGTERM, is killed at the end of its own 12 s grace
//! period; the pod ends Failed/`Terminated` in the API with the `DisruptionTarget` condition, and
//! only then does the machine go down. Without the raised delay logind would have gone on after
//! 5 s, and the pod would have stayed Running in the API.
//!
//! Ignored in plain `cargo test`: it boots a whole Debian system (under software emulation
//! here: /dev/kvm does not run guests on this machine, see docs/BENCHMARKS.md) and needs a
//! nodelet binary small enough for the image. scripts/test.sh runs it with
//! `NODELET_BIN=<static nodelet> cargo test --test systemd_node -- --ignored`.
//! `BOOT_ACCEL=kvm` boots under KVM where it works.

mod apiserver;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use common::KillOnDrop;
use common::api_node::{NS, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::Api;
use kube::api::PostParams;

/// The guest's host name, its Node's name.
const NODE: &str = "nodelet-systemd";

/// The files the test adds to the machine, as `(path, mode, text)`.
fn guest_files(kubeconfig: &str) -> Vec<(&'static str, u32, String)> {
    let config = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
        shutdownGracePeriod: 20s\nshutdownGracePeriodCriticalPods: 5s\n\
        nodeStatusUpdateFrequency: 2s\nfileCheckFrequency: 5s\n\
        authentication: {webhook: {enabled: false}}\nauthorization: {mode: AlwaysAllow}\n";
    let drop_in = format!(
        "[Service]\nExecStart=\nExecStart=/usr/local/bin/nodelet --root-dir /var/lib/nodelet run-node \
         --config /etc/nodelet/config.yaml --kubeconfig /etc/nodelet/kubeconfig \
         --hostname-override {NODE}\n"
    );
    // Powers the machine off through logind once the pod's container said it is ready, and
    // shows what logind holds first.
    let trigger = "[Unit]\nDescription=test: power off once the pod is ready\nAfter=nodelet.service\n\n\
        [Service]\nType=oneshot\nStandardOutput=journal+console\n\
        ExecStart=/bin/sh -c 'until grep -qs ready /var/log/pods/*/*/*.log; do sleep 1; done; \
        echo test-guest: pod ready on $(stat -fc %%T /sys/fs/cgroup); \
        echo test-guest: $(busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec); \
        systemd-inhibit --list --no-pager | sed \"s/^/test-guest: /\"; \
        echo test-guest: powering off; \
        busctl call org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager PowerOff b false'\n"
        .to_string();
    vec![
        ("etc/nodelet/config.yaml", 0o644, config.to_string()),
        ("etc/nodelet/kubeconfig", 0o600, kubeconfig.to_string()),
        (
            "etc/systemd/system/nodelet.service.d/10-test.conf",
            0o644,
            drop_in,
        ),
        (
            "etc/systemd/system/poweroff-when-ready.service",
            0o644,
            trigger,
        ),
    ]
}

/// The image (built when missing, the Debian root kept between runs): `(vmlinuz, initramfs)`.
fn image(bin: &Path) -> (PathBuf, PathBuf) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("systemd-image");
    let out = Command::new("bash")
        .arg(repo.join("scripts/build-systemd-image.sh"))
        .arg(&dir)
        .env("NODELET_BIN", bin)
        .stderr(Stdio::inherit())
        .output()
        .expect("running build-systemd-image.sh");
    assert!(out.status.success(), "build-systemd-image.sh failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let mut parts = last.split_whitespace().map(PathBuf::from);
    match (parts.next(), parts.next()) {
        (Some(k), Some(i)) => (k, i),
        _ => panic!("build-systemd-image.sh printed no image: {stdout}"),
    }
}

/// The image's initramfs with `files` added as a second archive.
fn with_files(initramfs: &Path, files: &[(&str, u32, String)], dir: &Path) -> PathBuf {
    let tree = dir.join("extra");
    let mut names = Vec::new();
    for (path, mode, text) in files {
        let p = tree.join(path);
        std::fs::create_dir_all(p.parent().expect("a file in a dir")).expect("mkdir");
        std::fs::write(&p, text).expect("writing a guest file");
        std::fs::set_permissions(
            &p,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(*mode),
        )
        .expect("chmod");
        names.push(path.to_string());
    }
    // The trigger unit enabled.
    let wants = tree.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).expect("mkdir");
    std::os::unix::fs::symlink(
        "/etc/systemd/system/poweroff-when-ready.service",
        wants.join("poweroff-when-ready.service"),
    )
    .expect("symlink");
    let out = dir.join("initramfs-test.img");
    let list = Command::new("sh")
        .arg("-c")
        .arg("find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0")
        .current_dir(&tree)
        .output()
        .expect("cpio");
    assert!(list.status.success(), "cpio failed");
    // The plain archive first, as early microcode goes before a compressed initramfs: the
    // kernel finds the compressed one after it (the other way round it stops at the end of
    // the compressed stream).
    let mut bytes = list.stdout;
    bytes.extend(std::fs::read(initramfs).expect("reading the initramfs"));
    std::fs::write(&out, bytes).expect("writing the initramfs");
    out
}

fn boot(kernel: &Path, initramfs: &Path, console: &Path) -> KillOnDrop {
    let accel = std::env::var("BOOT_ACCEL").unwrap_or_else(|_| "tcg".into());
    let cpu = if accel == "kvm" { "host" } else { "max" };
    KillOnDrop(
        Command::new("qemu-system-x86_64")
            .args(["-accel", &accel, "-cpu", cpu, "-smp", "2", "-m", "2048"])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-no-reboot",
            ])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 panic=-1"])
            .args([
                "-netdev",
                "user,id=net0",
                "-device",
                "virtio-net-pci,netdev=net0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting qemu-system-x86_64 (scripts/setup.sh installs it)"),
    )
}

/// The console's last lines, for the assertion messages.
fn console_tail(console: &Path) -> String {
    let text = std::fs::read_to_string(console).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down() {
    let test = "logind_shutdown_stops_the_pods_before_the_machine_goes_down";
    if !common::root_or_skip(test) {
        return;
    }
    let Some(bin) = std::env::var_os("NODELET_BIN").filter(|b| !b.is_empty()) else {
        panic!("NODELET_BIN must name a nodelet binary for the image (scripts/build-static.sh)");
    };
    let (kernel, initramfs) = image(Path::new(&bin));
    let dir = tempfile::Builder::new()
        .prefix("nl-systemd")
        .tempdir()
        .expect("temp dir");

    let api = ApiServer::start().await;
    let kubeconfig = std::fs::read_to_string(api.write_kubeconfig(dir.path()))
        .expect("reading the kubeconfig")
        .replace("127.0.0.1", "10.0.2.2");
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let pod: Pod = serde_norway::from_str(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: stubborn\n  namespace: {NS}\nspec:\n  nodeName: {NODE}\n  terminationGracePeriodSeconds: 12\n  containers:\n{}",
        busybox(
            "app",
            "trap '' TERM; echo ready; while true; do sleep 1; done"
        )
    ))
    .expect("a valid pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");

    let initramfs = with_files(&initramfs, &guest_files(&kubeconfig), dir.path());
    let console = dir.path().join("console.log");
    let mut vm = boot(&kernel, &initramfs, &console);

    wait_for("the pod Running on the systemd machine", 480, async || {
        let st = status(&pods, "stubborn").await?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let nodes: Api<Node> = Api::all(api.client());
    let mut saw_not_ready = false;
    let (failed, powered_off_at) = {
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut failed = None;
        loop {
            if failed.is_none()
                && let Some(st) = status(&pods, "stubborn").await
                && st.phase.as_deref() == Some("Failed")
            {
                failed = Some((st, Instant::now()));
            }
            if !saw_not_ready && let Ok(n) = nodes.get(NODE).await {
                saw_not_ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.type_ == "Ready"
                            && c.status == "False"
                            && c.message.as_deref() == Some("node is shutting down")
                    });
            }
            if let Some(code) = vm.0.try_wait().expect("waiting for qemu") {
                assert!(code.success(), "qemu: {code:?}");
                break (failed, Instant::now());
            }
            assert!(
                Instant::now() < deadline,
                "the machine did not power off; its console:\n{}",
                console_tail(&console)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let console_text = std::fs::read_to_string(&console).unwrap_or_default();
    let Some((st, failed_at)) = failed else {
        panic!(
            "the pod never ended Failed in the API; its status: {:?}\nconsole:\n{}",
            status(&pods, "stubborn").await,
            console_tail(&console)
        );
    };
    assert!(failed_at <= powered_off_at);
    assert_eq!(st.reason.as_deref(), Some("Terminated"), "{st:?}");
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was terminated in response to imminent node shutdown.")
    );
    let disruption = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget in {:?}", st.conditions));
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    // The container ignored SIGTERM: it was killed at the end of its 12 s, beyond logind's
    // default 5 s delay.
    let c = st
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .expect("a container status");
    let term = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .unwrap_or_else(|| panic!("not terminated: {c:?}"));
    assert_eq!(term.exit_code, 137, "{term:?}");
    assert!(saw_not_ready, "the Node never said 'node is shutting down'");
    // What the guest said: logind's delay raised to the grace period (in microseconds) and
    // nodelet's delay lock, before the power-off; the lock released after the pods.
    for marker in [
        // systemd's own cgroup v2 hierarchy (`%T` doubled for systemd): the pod ran on it.
        "test-guest: pod ready on cgroup2fs",
        "test-guest: t 20000000",
        "raised logind's InhibitDelayMaxSec",
        "holding a delay inhibitor lock",
        "logind announced the node's shutdown",
        "released the shutdown inhibitor lock",
    ] {
        assert!(
            console_text.contains(marker),
            "no {marker:?} on the console:\n{}",
            console_tail(&console)
        );
    }
    // What happened, for the log.
    for line in console_text.lines().filter(|l| {
        l.contains("test-guest:")
            || [
                "logind",
                "inhibitor",
                "shutting down",
                "shutdown",
                "pod running",
            ]
            .iter()
            .any(|m| l.contains("nodelet[") && l.contains(m))
    }) {
        eprintln!("guest: {line}");
    }
    let inhibit = console_text
        .lines()
        .find(|l| l.contains("test-guest:") && l.contains("nodelet") && l.contains("delay"))
        .unwrap_or_else(|| panic!("nodelet's lock not listed:\n{}", console_tail(&console)));
    assert!(inhibit.contains("shutdown"), "{inhibit}");
}
