//! nodelet on a systemd host: a Debian machine (scripts/build-systemd-image.sh: systemd as
//! PID 1, systemd-logind, D-Bus, deploy/systemd/nodelet.service, Debian's containerd) booted
//! under qemu, its agent registered with the project's test API server on this machine
//! (reached at qemu's user network address for the host, 10.0.2.2), once with the built-in
//! runtime and once driving the guest's containerd, each with the cgroupfs and the systemd
//! cgroup driver (`cgroupDriver: systemd`: the pods' tree made of systemd slices, each pod in a
//! delegated scope, or each container in runc's scope with containerd's `SystemdCgroup`), and
//! with the systemd driver again on cgroup v1 (systemd's legacy hierarchy, chosen on the
//! kernel's command line): six machines, one at a time.
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
use common::api_node::{NS, busybox};
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::Api;
use kube::api::PostParams;

/// The guest's host name, its Node's name.
const NODE: &str = "nodelet-systemd";
/// The pods: one of each QoS class, as `(name, script, resources)`. The guaranteed one ignores
/// SIGTERM.
const POD_SPECS: [(&str, &str, &str); 3] = [
    (
        "stubborn",
        "trap '' TERM; echo ready; while true; do sleep 1; done",
        "{limits: {cpu: 200m, memory: 64Mi}}",
    ),
    (
        "burstable",
        "trap 'exit 0' TERM; echo ready; while true; do sleep 1; done",
        "{requests: {cpu: 100m, memory: 16Mi}, limits: {memory: 128Mi}}",
    ),
    (
        "besteffort",
        "trap 'exit 0' TERM; echo ready; while true; do sleep 1; done",
        "{}",
    ),
];
const PODS: usize = POD_SPECS.len();

/// Which runtime the guest's agent drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Builtin,
    /// The built-in runtime with `cgroupDriver: systemd`: the pods' tree made of systemd
    /// slices, each pod's cgroups in a delegated scope.
    BuiltinSystemdCgroups,
    /// The guest's containerd with runc's `SystemdCgroup` and `cgroupDriver: systemd`.
    ContainerdSystemdCgroups,
    /// The guest's containerd (Debian's), its images imported from nodelet's preload dir.
    Containerd,
}

impl Backend {
    fn containerd(self) -> bool {
        matches!(
            self,
            Backend::Containerd | Backend::ContainerdSystemdCgroups
        )
    }
}

/// The files the test adds to the machine, as `(path, mode, contents)`.
fn guest_files(kubeconfig: &str, backend: Backend) -> Vec<(&'static str, u32, Vec<u8>)> {
    let runtime = match backend {
        Backend::Builtin => "",
        Backend::BuiltinSystemdCgroups => "cgroupDriver: systemd\n",
        Backend::Containerd => "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n",
        Backend::ContainerdSystemdCgroups => {
            "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\ncgroupDriver: systemd\n"
        }
    };
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{runtime}\
        shutdownGracePeriod: 20s\nshutdownGracePeriodCriticalPods: 5s\n\
        nodeStatusUpdateFrequency: 2s\nfileCheckFrequency: 5s\n\
        authentication: {{webhook: {{enabled: false}}}}\nauthorization: {{mode: AlwaysAllow}}\n"
    );
    let drop_in = format!(
        "[Unit]\nAfter=containerd.service\n\n\
         [Service]\nExecStart=\nExecStart=/usr/local/bin/nodelet --root-dir /var/lib/nodelet run-node \
         --config /etc/nodelet/config.yaml --kubeconfig /etc/nodelet/kubeconfig \
         --hostname-override {NODE}\n"
    );
    // Once every pod's container said it is ready: the cgroup files of the pods' tree, what
    // logind holds, then the power-off through logind.
    let unit =
        "[Unit]\nDescription=test: power off once the pods are ready\nAfter=nodelet.service\n\n\
        [Service]\nType=oneshot\nStandardOutput=journal+console\n\
        ExecStart=/usr/local/bin/test-poweroff\n"
            .to_string();
    let script = format!(
        r#"#!/bin/sh
until [ "$(grep -ls ready /var/log/pods/*/*/*.log | wc -l)" -ge {PODS} ]; do sleep 1; done
echo "test-guest: pods ready on $(stat -fc %T /sys/fs/cgroup)"
cd /sys/fs/cgroup
echo "test-guest: units $(systemctl list-units --no-legend --plain --all 'kubepods*' 'nodelet-*' 'cri-containerd-*' | awk '{{print $1 "=" $3}}' | tr '\n' ' ')"
# The files of each cgroup of the pods' tree: v2's, or v1's from each controller's hierarchy
# (the tree's dirs found in the memory one).
v1=; [ -f cgroup.controllers ] || {{ v1=1; cd memory; }}
for d in kubepods kubepods/burstable kubepods/besteffort kubepods/pod* kubepods/*/pod* \
  kubepods.slice kubepods.slice/kubepods-burstable.slice kubepods.slice/kubepods-besteffort.slice \
  kubepods.slice/kubepods-pod*.slice kubepods.slice/*/kubepods-*-pod*.slice; do
  [ -d "$d" ] || continue
  if [ -n "$v1" ]; then
    for f in cpu/cpu.shares cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us memory/memory.limit_in_bytes \
      pids/pids.max cpuset/cpuset.cpus; do
      echo "test-guest: cg $d ${{f#*/}} $(cat ../${{f%%/*}}/$d/${{f#*/}})"
    done
  else
    for f in cpu.weight cpu.max memory.max pids.max; do
      echo "test-guest: cg $d $f $(cat $d/$f)"
    done
  fi
done
# The cgroups processes run in, below the pods' tree.
find kubepods kubepods.slice -name cgroup.procs 2>/dev/null | while read -r f; do
  [ -n "$(cat "$f")" ] && echo "test-guest: procs ${{f%/cgroup.procs}}"
done
echo "test-guest: $(busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec)"
systemd-inhibit --list --no-pager | sed "s/^/test-guest: /"
echo "test-guest: powering off"
busctl call org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager PowerOff b false
"#
    );
    let mut files = vec![
        ("etc/nodelet/config.yaml", 0o644, config.into_bytes()),
        (
            "etc/nodelet/kubeconfig",
            0o600,
            kubeconfig.as_bytes().to_vec(),
        ),
        (
            "etc/systemd/system/nodelet.service.d/10-test.conf",
            0o644,
            drop_in.into_bytes(),
        ),
        (
            "etc/systemd/system/poweroff-when-ready.service",
            0o644,
            unit.into_bytes(),
        ),
        ("usr/local/bin/test-poweroff", 0o755, script.into_bytes()),
    ];
    if backend == Backend::ContainerdSystemdCgroups {
        // The image's containerd config imports this dir; the CRI plugin's section replaces
        // the image's whole (containerd merges imports per plugin).
        let drop_in = r#"version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:nodelet-busybox"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"#;
        files.push((
            "etc/containerd/conf.d/10-systemd-cgroup.toml",
            0o644,
            drop_in.as_bytes().to_vec(),
        ));
    }
    if backend.containerd() {
        // containerd's sandbox image (its config names it), imported with busybox from the
        // preload dir.
        let pause =
            std::env::temp_dir().join(format!("nl-systemd-pause-{}.tar", std::process::id()));
        common::containerd::pause_archive(&common::busybox_archive(), &pause);
        let bytes = std::fs::read(&pause).expect("reading the pause archive");
        let _ = std::fs::remove_file(&pause);
        files.push(("var/lib/nodelet/images-preload/pause.tar", 0o644, bytes));
    }
    files
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
fn with_files(initramfs: &Path, files: &[(&str, u32, Vec<u8>)], dir: &Path) -> PathBuf {
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

/// The cgroup hierarchy systemd mounts in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hierarchy {
    /// cgroup v2 (systemd's default).
    Unified,
    /// cgroup v1 only (systemd's legacy hierarchy, chosen on the kernel's command line).
    Legacy,
}

fn boot(kernel: &Path, initramfs: &Path, console: &Path, hierarchy: Hierarchy) -> KillOnDrop {
    let mut cmdline = "console=ttyS0 panic=-1".to_string();
    if hierarchy == Hierarchy::Legacy {
        cmdline.push_str(
            " systemd.unified_cgroup_hierarchy=0 systemd.legacy_systemd_cgroup_controller=1",
        );
    }
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
            .arg("-append")
            .arg(&cmdline)
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

/// One machine at a time: two guests under software emulation would starve each other.
static ONE_MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_builtin() {
    logind_shutdown(
        Backend::Builtin,
        Hierarchy::Unified,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd() {
    logind_shutdown(
        Backend::Containerd,
        Hierarchy::Unified,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd_systemd_cgroups() {
    logind_shutdown(
        Backend::ContainerdSystemdCgroups,
        Hierarchy::Unified,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd_systemd_cgroups",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_systemd_cgroups() {
    logind_shutdown(
        Backend::BuiltinSystemdCgroups,
        Hierarchy::Unified,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_systemd_cgroups",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_systemd_cgroups_v1() {
    logind_shutdown(
        Backend::BuiltinSystemdCgroups,
        Hierarchy::Legacy,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_systemd_cgroups_v1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian machine under qemu: scripts/test.sh runs it with NODELET_BIN and --ignored"]
async fn logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd_systemd_cgroups_v1()
{
    logind_shutdown(
        Backend::ContainerdSystemdCgroups,
        Hierarchy::Legacy,
        "logind_shutdown_stops_the_pods_before_the_machine_goes_down_containerd_systemd_cgroups_v1",
    )
    .await;
}

async fn logind_shutdown(backend: Backend, hierarchy: Hierarchy, test: &str) {
    let _one = ONE_MACHINE.lock().await;
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
    let mut uids = std::collections::HashMap::new();
    for (name, script, resources) in POD_SPECS {
        let pod: Pod = serde_norway::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  nodeName: {NODE}\n  terminationGracePeriodSeconds: 12\n  containers:\n{}    resources: {resources}\n",
            busybox("app", script)
        ))
        .expect("a valid pod");
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .expect("creating the pod");
        uids.insert(name, created.metadata.uid.expect("a uid"));
    }

    let initramfs = with_files(&initramfs, &guest_files(&kubeconfig, backend), dir.path());
    let console = dir.path().join("console.log");
    let mut vm = boot(&kernel, &initramfs, &console, hierarchy);

    for (name, _, _) in POD_SPECS {
        let deadline = Instant::now() + Duration::from_secs(480);
        loop {
            let st = status(&pods, name).await;
            if st.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} not Running on the systemd machine after 480s; its status: {st:?}\nconsole:\n{}",
                console_tail(&console)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let node = Api::<Node>::all(api.client())
        .get(NODE)
        .await
        .expect("the Node");
    let runtime = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.container_runtime_version.clone())
        .unwrap_or_default();
    assert_eq!(
        runtime.starts_with("containerd://"),
        backend.containerd(),
        "the Node's runtime: {runtime}"
    );
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
        // The hierarchy systemd mounted: the pods ran on it.
        if hierarchy == Hierarchy::Legacy {
            "test-guest: pods ready on tmpfs"
        } else {
            "test-guest: pods ready on cgroup2fs"
        },
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
    // The other pods ended the same way.
    for name in ["burstable", "besteffort"] {
        let st = status(&pods, name).await.expect("the pod's status");
        assert_eq!(st.phase.as_deref(), Some("Failed"), "{name}: {st:?}");
        assert_eq!(st.reason.as_deref(), Some("Terminated"), "{name}");
    }

    // The pods' cgroup tree, as the guest read it while they ran (`cgroupRoot`
    // "/", the cgroupfs or the systemd driver): the QoS cgroups and each pod's values.
    let cg: std::collections::HashMap<(String, String), String> = console_text
        .lines()
        .filter_map(|l| l.split_once("test-guest: cg ").map(|(_, rest)| rest))
        .filter_map(|rest| {
            let mut parts = rest.splitn(3, ' ');
            let (dir, file, value) = (parts.next()?, parts.next()?, parts.next()?);
            Some((
                (dir.to_string(), file.to_string()),
                value.trim().to_string(),
            ))
        })
        .collect();
    let value = |dir: &str, file: &str| {
        cg.get(&(dir.to_string(), file.to_string()))
            .cloned()
            .unwrap_or_else(|| panic!("{dir}/{file} not read by the guest: {cg:?}"))
    };
    let weight = |shares: u64| nodelet::cm::cgroupfs::shares_to_weight(shares).to_string();
    let systemd = matches!(
        backend,
        Backend::BuiltinSystemdCgroups | Backend::ContainerdSystemdCgroups
    );
    let slice_uid = |name: &str| uids[name].replace('-', "_");
    let (kubepods, qos_burstable, qos_besteffort, guaranteed, burstable, besteffort) = if systemd {
        (
            "kubepods.slice".to_string(),
            "kubepods.slice/kubepods-burstable.slice".to_string(),
            "kubepods.slice/kubepods-besteffort.slice".to_string(),
            format!("kubepods.slice/kubepods-pod{}.slice", slice_uid("stubborn")),
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
                slice_uid("burstable")
            ),
            format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
                slice_uid("besteffort")
            ),
        )
    } else {
        (
            "kubepods".to_string(),
            "kubepods/burstable".to_string(),
            "kubepods/besteffort".to_string(),
            format!("kubepods/pod{}", uids["stubborn"]),
            format!("kubepods/burstable/pod{}", uids["burstable"]),
            format!("kubepods/besteffort/pod{}", uids["besteffort"]),
        )
    };
    // With systemd, the slices are systemd's units (active), each pod's sandbox in a scope
    // of its own; with cgroupfs, systemd knows none of them.
    let units = console_text
        .lines()
        .find_map(|l| {
            l.split_once("test-guest: units ")
                .map(|(_, u)| u.to_string())
        })
        .unwrap_or_default();
    for slice in [&guaranteed, &burstable, &besteffort] {
        let unit = slice.rsplit('/').next().unwrap_or_default();
        assert_eq!(
            units.contains(&format!("{unit}=active")),
            systemd,
            "{unit} among systemd's units: {units}"
        );
    }
    // The built-in runtime's scope per pod; containerd's (runc's) per container, the pause
    // one included.
    let (own, want) = match backend {
        Backend::BuiltinSystemdCgroups => ("nodelet-", PODS),
        Backend::ContainerdSystemdCgroups => ("cri-containerd-", 2 * PODS),
        _ => ("nodelet-", 0),
    };
    assert_eq!(
        units.matches(own).count(),
        want,
        "the pods' scopes: {units}"
    );
    // The values, in v2's files or v1's.
    let legacy = hierarchy == Hierarchy::Legacy;
    let cpu = |dir: &str, shares: u64| {
        if legacy {
            assert_eq!(value(dir, "cpu.shares"), shares.to_string(), "{dir}");
        } else {
            assert_eq!(value(dir, "cpu.weight"), weight(shares), "{dir}");
        }
    };
    let quota = |dir: &str, quota: Option<u64>| {
        if legacy {
            let q = quota.map_or("-1".to_string(), |q| q.to_string());
            assert_eq!(value(dir, "cpu.cfs_quota_us"), q, "{dir}");
            assert_eq!(value(dir, "cpu.cfs_period_us"), "100000", "{dir}");
        } else {
            let q = quota.map_or("max".to_string(), |q| q.to_string());
            assert_eq!(value(dir, "cpu.max"), format!("{q} 100000"), "{dir}");
        }
    };
    let memory = |dir: &str, limit: Option<u64>| {
        let unlimited = if legacy {
            // v1's "no limit": the largest i64, in whole pages.
            (i64::MAX as u64 / 4096 * 4096).to_string()
        } else {
            "max".to_string()
        };
        let file = if legacy {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        let want = limit.map_or(unlimited, |l| l.to_string());
        assert_eq!(value(dir, file), want, "{dir}");
    };
    // Guaranteed: 200m (204 shares) and its CFS quota, 64Mi.
    cpu(&guaranteed, 204);
    quota(&guaranteed, Some(20_000));
    memory(&guaranteed, Some(64 << 20));
    // Burstable: its 100m request, no CPU limit, its one container's memory limit.
    cpu(&burstable, 102);
    quota(&burstable, None);
    memory(&burstable, Some(128 << 20));
    cpu(&qos_burstable, 102);
    // BestEffort: the minimum.
    cpu(&besteffort, 2);
    memory(&besteffort, None);
    cpu(&qos_besteffort, 2);
    // kubepods: the node's capacity (nothing reserved), whole pages of memory.
    let capacity = node
        .status
        .and_then(|s| s.capacity)
        .expect("the Node's capacity");
    let node_memory = nodelet::util::quantity::parse_bytes(&capacity["memory"].0).expect("memory");
    let node_cpu = nodelet::util::quantity::parse_cpu_millis(&capacity["cpu"].0).expect("cpu");
    memory(
        &kubepods,
        Some(u64::try_from(node_memory / 4096 * 4096).expect("positive")),
    );
    cpu(
        &kubepods,
        u64::try_from(node_cpu * 1024 / 1000).expect("positive"),
    );
    if legacy {
        // The hierarchies systemd does not manage have the tree too (cpuset: the machine's
        // CPUs, inherited, else no process could join).
        for dir in [&kubepods, &guaranteed, &besteffort] {
            assert_eq!(value(dir, "cpuset.cpus"), "0-1", "{dir}");
        }
    }
    // Where the processes run: below each pod's cgroup, in the runtime's own cgroups (with
    // the systemd driver, the built-in runtime's sandbox in `sandbox` below the pod's scope).
    let procs: Vec<&str> = console_text
        .lines()
        .filter_map(|l| l.split_once("test-guest: procs ").map(|(_, p)| p.trim()))
        .collect();
    for pod in [&guaranteed, &burstable, &besteffort] {
        let below: Vec<&&str> = procs
            .iter()
            .filter(|p| p.starts_with(&format!("{pod}/")))
            .collect();
        assert!(
            below.len() >= 2,
            "processes below {pod}: {below:?} (all: {procs:?})"
        );
        if backend == Backend::BuiltinSystemdCgroups {
            assert!(
                below
                    .iter()
                    .any(|p| p.contains("/nodelet-") && p.ends_with(".scope/sandbox")),
                "no sandbox process in a scope below {pod}: {below:?}"
            );
        }
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
