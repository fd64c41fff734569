//! The built-in runtime's security settings end to end, as root: the OCI spec generated from
//! CRI requests must actually take effect, so every test asserts what a process inside the
//! container observes (its own output, or an ExecSync probe).

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use runtime::{Code, RuntimeService, cri};

/// Runs `script` with `sh -c` in a running container: (exit code, stdout, stderr).
async fn sh(node: &Node, id: &str, script: &str) -> (i32, String, String) {
    let r = node.exec(id, &["sh", "-c", script]).await;
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// A busybox container running `sh -c script`.
fn shell(name: &str, script: &str) -> cri::ContainerConfig {
    container_config(name, &["sh", "-c", script])
}

/// A busybox container that sleeps, for exec probes.
fn sleeper(name: &str) -> cri::ContainerConfig {
    container_config(name, &["sleep", "600"])
}

/// `cfg` with its security context changed by `f`.
fn secure(
    mut cfg: cri::ContainerConfig,
    f: impl FnOnce(&mut cri::LinuxContainerSecurityContext),
) -> cri::ContainerConfig {
    f(cfg
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default));
    cfg
}

/// A pod sandbox config tweak: the pod's security context changed by `f`.
fn pod_security(
    f: impl FnOnce(&mut cri::LinuxSandboxSecurityContext),
) -> impl FnOnce(&mut cri::PodSandboxConfig) {
    move |cfg| {
        f(cfg
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default))
    }
}

fn namespaces(network: cri::NamespaceMode, pid: cri::NamespaceMode) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: network as i32,
        pid: pid as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn caps(add: &[&str], drop: &[&str]) -> Option<cri::Capability> {
    Some(cri::Capability {
        add_capabilities: add.iter().map(|s| s.to_string()).collect(),
        drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

fn seccomp(
    profile: cri::security_profile::ProfileType,
    localhost_ref: &str,
) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: profile as i32,
        localhost_ref: localhost_ref.into(),
    }
}

/// The value of `field` (e.g. `CapEff`) in a /proc/<pid>/status text.
fn status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in {status:?}"))
        .trim()
}

fn hex_mask(s: &str) -> u64 {
    u64::from_str_radix(s.trim(), 16).unwrap_or_else(|e| panic!("capability mask {s:?}: {e}"))
}

/// Linux capability numbers (linux/capability.h), in order.
const CAPABILITY_NUMBERS: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capability mask of `names` (with or without the `CAP_` prefix).
fn cap_mask<S: AsRef<str>>(names: &[S]) -> u64 {
    names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            let bare = n.strip_prefix("CAP_").unwrap_or(n);
            let bit = CAPABILITY_NUMBERS
                .iter()
                .position(|c| *c == bare)
                .unwrap_or_else(|| panic!("unknown capability {n}"));
            1u64 << bit
        })
        .fold(0, |a, b| a | b)
}

/// (CapEff, CapPrm, CapBnd, CapInh, CapAmb) of the probing process in a container.
async fn cap_sets(node: &Node, id: &str) -> [u64; 5] {
    let (code, status, err) = sh(node, id, "cat /proc/self/status").await;
    assert_eq!(code, 0, "{err}");
    ["CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"].map(|f| hex_mask(status_field(&status, f)))
}

fn host_status(field: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status_field(&status, field).to_string()
}

fn ids(s: &str) -> BTreeSet<u32> {
    s.split_whitespace()
        .map(|x| x.parse().unwrap_or_else(|e| panic!("id {x:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn user_and_groups() {
    if !root_or_skip("user_and_groups") {
        return;
    }
    let node = Node::new("user").await;
    let sb = node.sandbox("user").await;
    let probe = "id -u; id -g; id -G; echo $HOME";

    // The image's default user is root.
    let (code, out, err) = node.run_to_exit(&sb, shell("default", probe)).await;
    assert_eq!((code, out.as_str()), (0, "0\n0\n0\n/root\n"), "{err}");

    // run_as_user, with supplemental groups, and the primary group from the image's passwd.
    let as_uid = secure(shell("uid", probe), |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 65534 });
        sc.supplemental_groups = vec![1234, 5678];
    });
    let (code, out, err) = node.run_to_exit(&sb, as_uid).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines[..2], ["65534", "65534"], "{out}");
    assert_eq!(ids(lines[2]), ids("65534 1234 5678"), "{out}");
    assert_eq!(lines[3], "/nonexistent");

    // run_as_username and run_as_group.
    let as_name = secure(shell("name", probe), |sc| {
        sc.run_as_username = "nobody".into();
        sc.run_as_group = Some(cri::Int64Value { value: 4321 });
    });
    let (code, out, err) = node.run_to_exit(&sb, as_name).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines[..2], ["65534", "4321"], "{out}");
    assert_eq!(ids(lines[2]), ids("4321"), "{out}");

    // ExecSync runs as the container's user too (containerd execs the container's process
    // spec with the args replaced), not as root.
    let running = secure(sleeper("uid-exec"), |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 65534 });
        sc.supplemental_groups = vec![1234];
    });
    let id = node.container_with(&sb, running).await;
    let (code, out, err) = sh(&node, &id, "id -u; id -G").await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        lines.first(),
        Some(&"65534"),
        "exec as the container's user: {out}"
    );
    assert_eq!(ids(lines[1]), ids("65534 1234"), "{out}");
    // ContainerStatus.user reports that identity (critest's SupplementalGroupsPolicy specs
    // compare it with `id -G`), for Merge and for Strict.
    let user = |s: &cri::ContainerStatus| {
        s.user
            .as_ref()
            .and_then(|u| u.linux.clone())
            .map(|l| (l.uid, l.gid, l.supplemental_groups))
    };
    assert_eq!(
        user(&node.status(&id).await),
        Some((65534, 65534, vec![1234, 65534]))
    );
    let strict = secure(sleeper("uid-strict"), |sc| {
        sc.run_as_user = Some(cri::Int64Value { value: 65534 });
        sc.supplemental_groups = vec![4321];
        sc.supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
    });
    let strict = node.container_with(&sb, strict).await;
    assert_eq!(
        user(&node.status(&strict).await),
        Some((65534, 65534, vec![4321, 65534]))
    );
    let (code, out, err) = sh(&node, &strict, "id -G").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(out.trim()), ids("65534 4321"), "{out}");
    // The runtime says it honours the policy, that it can make mounts recursively read-only,
    // and that it runs pods in user namespaces (ID-mapped rootfs and volumes included).
    let st = node
        .rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap();
    assert!(st.features.is_some_and(|f| f.supplemental_groups_policy));
    let default = st.runtime_handlers.iter().find(|h| h.name.is_empty());
    assert!(
        default
            .and_then(|h| h.features.as_ref())
            .is_some_and(|f| f.recursive_read_only_mounts && f.user_namespaces),
        "{:?}",
        st.runtime_handlers
    );
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_user_is_rejected_and_leaves_nothing() {
    if !root_or_skip("unknown_user_is_rejected_and_leaves_nothing") {
        return;
    }
    let node = Node::new("nouser").await;
    let sb = node.sandbox("nouser").await;
    let cfg = secure(sleeper("ghost"), |sc| sc.run_as_username = "ghost".into());
    let err = node.try_create(&sb, cfg).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("ghost"), "{err}");
    let list = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert!(list.containers.is_empty(), "{:?}", list.containers);
    assert!(node.rt.image_store().rootfs_keys().unwrap().is_empty());
    let bundles = common::state_entries(node.root.path(), "containers");
    assert!(
        bundles.is_empty(),
        "no bundle directory is left: {bundles:?}"
    );
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readonly_rootfs_keeps_volumes_writable() {
    if !root_or_skip("readonly_rootfs_keeps_volumes_writable") {
        return;
    }
    let node = Node::new("rorootfs").await;
    let sb = node.sandbox("rorootfs").await;
    let volume = tempfile::tempdir().unwrap();
    let mut cfg = secure(sleeper("ro"), |sc| sc.readonly_rootfs = true);
    cfg.mounts = vec![cri::Mount {
        container_path: "/data".into(),
        host_path: volume.path().to_string_lossy().into_owned(),
        ..Default::default()
    }];
    let id = node.container_with(&sb, cfg).await;
    for path in ["/x", "/tmp/x", "/etc/hosts"] {
        let (code, _, err) = sh(&node, &id, &format!("echo x >> {path}")).await;
        assert_ne!(code, 0, "writing {path} on a read-only rootfs succeeded");
        assert!(err.contains("Read-only file system"), "{path}: {err}");
    }
    let (code, out, err) = sh(
        &node,
        &id,
        "echo hi > /data/f && cat /data/f && touch /dev/shm/s",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hi\n"), "{err}");
    assert_eq!(
        std::fs::read_to_string(volume.path().join("f")).unwrap(),
        "hi\n"
    );

    // The same image with a writable rootfs, for contrast.
    let rw = node.container_with(&sb, sleeper("rw")).await;
    let (code, _, err) = sh(&node, &rw, "touch /x /tmp/x").await;
    assert_eq!(code, 0, "{err}");
    node.teardown().await;
}

/// The line of /proc/self/mountinfo (as `out`) whose mount point is `path`.
fn mountinfo_line<'a>(out: &'a str, path: &str) -> &'a str {
    out.lines()
        .find(|l| l.split(' ').nth(4) == Some(path))
        .unwrap_or_else(|| panic!("no mount at {path} in {out}"))
}

/// A tmpfs on the host made shared (as systemd makes every mount), unmounted when dropped.
struct SharedHostMount {
    dir: tempfile::TempDir,
    below: Vec<std::path::PathBuf>,
}

fn run_host(args: &[&str]) {
    let st = std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(st.success(), "{args:?}: {st}");
}

impl SharedHostMount {
    fn new() -> SharedHostMount {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        run_host(&["mount", "-t", "tmpfs", "nodelet-e2e", path]);
        run_host(&["mount", "--make-shared", path]);
        SharedHostMount {
            dir,
            below: Vec::new(),
        }
    }

    /// Mounts another tmpfs at `<dir>/<name>`, on the host.
    fn mount_below(&mut self, name: &str) {
        let p = self.dir.path().join(name);
        std::fs::create_dir(&p).unwrap();
        run_host(&["mount", "-t", "tmpfs", "nodelet-e2e", p.to_str().unwrap()]);
        self.below.push(p);
    }
}

impl Drop for SharedHostMount {
    fn drop(&mut self) {
        for p in self
            .below
            .iter()
            .rev()
            .map(|p| p.as_path())
            .chain([self.dir.path()])
        {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(p)
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_mounts() {
    if !root_or_skip("bind_mounts") {
        return;
    }
    let node = Node::new("mounts").await;
    let sb = node.sandbox("mounts").await;
    let host = tempfile::tempdir().unwrap();
    let (rw, ro, shared) = (
        host.path().join("rw"),
        host.path().join("ro"),
        host.path().join("shared"),
    );
    for d in [&rw, &ro, &shared] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(ro.join("file"), "read me\n").unwrap();
    let file = host.path().join("config.txt");
    std::fs::write(&file, "file mount\n").unwrap();
    let mount = |container: &str, host: &Path, readonly: bool, propagation| cri::Mount {
        container_path: container.into(),
        host_path: host.to_string_lossy().into_owned(),
        readonly,
        propagation: propagation as i32,
        ..Default::default()
    };
    use cri::MountPropagation as P;
    let mut cfg = sleeper("c");
    cfg.mounts = vec![
        mount("/rw", &rw, false, P::PropagationPrivate),
        mount("/ro", &ro, true, P::PropagationPrivate),
        mount("/etc/config.txt", &file, true, P::PropagationPrivate),
    ];
    let id = node.container_with(&sb, cfg).await;

    let (code, _, err) = sh(&node, &id, "echo from-container > /rw/out").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(rw.join("out")).unwrap(),
        "from-container\n",
        "a read-write bind mount writes through to the host"
    );
    std::fs::write(rw.join("in"), "from-host\n").unwrap();
    let (_, out, _) = sh(&node, &id, "cat /rw/in").await;
    assert_eq!(out, "from-host\n");

    let (code, out, err) = sh(&node, &id, "cat /ro/file; touch /ro/new").await;
    assert_eq!(out, "read me\n");
    assert_ne!(code, 0, "writing into a read-only bind mount succeeded");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!ro.join("new").exists());

    let (code, out, err) = sh(&node, &id, "cat /etc/config.txt; echo x >> /etc/config.txt").await;
    assert_eq!(out, "file mount\n");
    assert_ne!(code, 0, "the read-only file mount was writable: {err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "file mount\n");

    // Propagation: private by default (no shared/master peer group), shared when asked.
    let (_, info, _) = sh(&node, &id, "cat /proc/self/mountinfo").await;
    for private in ["/rw", "/ro", "/etc/config.txt"] {
        let line = mountinfo_line(&info, private);
        assert!(
            !line.contains("shared:") && !line.contains("master:"),
            "{private} is not private: {line}"
        );
    }
    for (path, ro) in [("/rw", false), ("/ro", true), ("/etc/config.txt", true)] {
        let opts = mountinfo_line(&info, path).split(' ').nth(5).unwrap();
        assert_eq!(opts.split(',').any(|o| o == "ro"), ro, "{path}: {opts}");
    }
    // Against a shared host mount: a private mount receives nothing from the host, a
    // host-to-container one gets the host's later mounts below it.
    let mut host_mount = SharedHostMount::new();
    let mut ids = Vec::new();
    for (name, propagation) in [
        ("private-of-shared", P::PropagationPrivate),
        ("host-to-container", P::PropagationHostToContainer),
    ] {
        let mut cfg = sleeper(name);
        cfg.mounts = vec![mount("/vol", host_mount.dir.path(), false, propagation)];
        ids.push(node.container_with(&sb, cfg).await);
    }
    host_mount.mount_below("later");
    let probe = "grep ' /vol ' /proc/self/mountinfo; grep -c ' /vol/later ' /proc/self/mountinfo";
    let (_, out, err) = sh(&node, &ids[0], probe).await;
    let line = out.lines().next().unwrap_or_default();
    assert!(
        !line.contains("master:") && !line.contains("shared:"),
        "a private mount of a shared host mount: {out}{err}"
    );
    assert_eq!(
        out.lines().nth(1),
        Some("0"),
        "the host's later mount leaked in: {out}"
    );
    let (_, out, err) = sh(&node, &ids[1], probe).await;
    assert!(
        out.lines().next().unwrap_or_default().contains("master:"),
        "{out}{err}"
    );
    assert_eq!(
        out.lines().nth(1),
        Some("1"),
        "host-to-container propagation: {out}"
    );

    // Bidirectional: the mount is shared (a peer group of its own, the host's dir is private).
    let mut cfg = sleeper("bidirectional");
    cfg.mounts = vec![mount(
        "/shared",
        &shared,
        false,
        P::PropagationBidirectional,
    )];
    let id = node.container_with(&sb, cfg).await;
    let (_, info, _) = sh(&node, &id, "cat /proc/self/mountinfo").await;
    let line = mountinfo_line(&info, "/shared");
    assert!(line.contains("shared:"), "bidirectional is shared: {line}");

    // A mount the container's init cannot make (a file over the image's /bin directory)
    // fails the start (the container is made then, as containerd makes its task), with the
    // init's own reason, not just libcontainer's "failed to prepare rootfs"; the container
    // has exited without having started, as containerd reports it.
    let mut cfg = sleeper("file-over-dir");
    cfg.mounts = vec![mount("/bin", &file, true, P::PropagationPrivate)];
    let id = node.try_create(&sb, cfg).await.expect("created");
    let err = node
        .rt
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert!(
        err.message().contains("failed to prepare rootfs: ")
            && err.message().contains("libcontainer::rootfs"),
        "{err}"
    );
    let st = node.status(&id).await;
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
    assert!(st.message.contains("failed to prepare rootfs"), "{st:?}");
    assert_eq!(st.started_at, 0);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities() {
    if !root_or_skip("capabilities") {
        return;
    }
    let node = Node::new("caps").await;
    let sb = node.sandbox("caps").await;
    let default_mask = cap_mask(&runtime::builtin::spec::default_capabilities());
    assert_eq!(default_mask, 0xa80425fb, "the CRI (Docker) default set");
    let net_admin = 1u64 << 12;

    let cases = [
        ("default", None, default_mask),
        ("drop-all", caps(&[], &["ALL"]), 0),
        (
            "add-net-admin",
            caps(&["NET_ADMIN"], &[]),
            default_mask | net_admin,
        ),
        (
            "only-net-admin",
            caps(&["CAP_NET_ADMIN"], &["ALL"]),
            net_admin,
        ),
        (
            "drop-chown",
            caps(&[], &["CHOWN", "NET_RAW"]),
            default_mask & !cap_mask(&["CHOWN", "NET_RAW"]),
        ),
    ];
    for (name, capability, want) in cases {
        let id = node
            .container_with(
                &sb,
                secure(sleeper(name), |sc| sc.capabilities = capability),
            )
            .await;
        let [eff, prm, bnd, inh, amb] = cap_sets(&node, &id).await;
        assert_eq!(eff, want, "{name}: CapEff {eff:#x}, want {want:#x}");
        assert_eq!((prm, bnd), (want, want), "{name}: permitted and bounding");
        assert_eq!((inh, amb), (0, 0), "{name}: inheritable and ambient");
    }
    // The container's own process, not only exec'd ones.
    let (code, out, err) = node
        .run_to_exit(
            &sb,
            secure(shell("init", "grep CapEff /proc/self/status"), |sc| {
                sc.capabilities = caps(&["NET_ADMIN"], &["ALL"])
            }),
        )
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(hex_mask(status_field(&out, "CapEff")), net_admin, "{out}");
    // And they are enforced: CHOWN dropped means chown fails even for root.
    let id = node
        .container_with(
            &sb,
            secure(sleeper("no-chown"), |sc| {
                sc.capabilities = caps(&[], &["CHOWN"])
            }),
        )
        .await;
    let (code, _, err) = sh(&node, &id, "touch /tmp/f && chown 1:1 /tmp/f").await;
    assert_ne!(code, 0, "chown without CAP_CHOWN succeeded");
    assert!(err.contains("Operation not permitted"), "{err}");

    // Privileged (in a privileged pod): every capability the host has.
    let psb = node
        .sandbox_with("caps-priv", pod_security(|s| s.privileged = true))
        .await;
    let id = node
        .container_with(
            &psb,
            secure(sleeper("privileged"), |sc| sc.privileged = true),
        )
        .await;
    let host_bounding = hex_mask(&host_status("CapBnd"));
    let [eff, prm, bnd, _, _] = cap_sets(&node, &id).await;
    assert_eq!(
        (eff, prm, bnd),
        (host_bounding, host_bounding, host_bounding),
        "privileged: CapEff {eff:#x}, host CapBnd {host_bounding:#x}"
    );
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_new_privs() {
    if !root_or_skip("no_new_privs") {
        return;
    }
    let node = Node::new("nnp").await;
    let sb = node.sandbox("nnp").await;
    let probe = "grep NoNewPrivs /proc/self/status";
    let (_, out, err) = node.run_to_exit(&sb, shell("default", probe)).await;
    assert_eq!(
        status_field(&out, "NoNewPrivs"),
        "0",
        "CRI default is false: {out}{err}"
    );
    let (_, out, err) = node
        .run_to_exit(
            &sb,
            secure(shell("nnp", probe), |sc| sc.no_new_privs = true),
        )
        .await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "1", "{out}{err}");
    let id = node
        .container_with(
            &sb,
            secure(sleeper("nnp-exec"), |sc| sc.no_new_privs = true),
        )
        .await;
    let (_, out, err) = sh(&node, &id, probe).await;
    assert_eq!(
        status_field(&out, "NoNewPrivs"),
        "1",
        "exec too: {out}{err}"
    );
    let id = node.container_with(&sb, sleeper("default-exec")).await;
    let (_, out, err) = sh(&node, &id, probe).await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "0", "{out}{err}");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn masked_and_readonly_paths() {
    if !root_or_skip("masked_and_readonly_paths") {
        return;
    }
    // A masked file this kernel has (/proc/kcore needs CONFIG_PROC_KCORE).
    let masked = runtime::builtin::spec::DEFAULT_MASKED_PATHS
        .iter()
        .copied()
        .find(|p| p.starts_with("/proc/") && std::fs::read(p).is_ok_and(|b| !b.is_empty()))
        .expect("a readable, non-empty default masked /proc file on the host");
    let sysctl = "/proc/sys/kernel/shm_rmid_forced"; // IPC-namespaced: the pod's own
    let probe = format!(
        "wc -c < {masked}; grep -c ' {masked} ' /proc/self/mountinfo; \
         echo 1 > {sysctl} && echo written"
    );

    let node = Node::new("masked").await;
    let sb = node.sandbox("masked").await;
    let id = node.container_with(&sb, sleeper("default")).await;
    let (_, out, err) = sh(&node, &id, &probe).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.first().map(|s| s.trim()),
        Some("0"),
        "{masked} reads empty: {out}"
    );
    assert_eq!(lines.get(1), Some(&"1"), "{masked} is a mount: {out}");
    assert!(!out.contains("written"), "/proc/sys is read-only: {out}");
    assert!(err.contains("Read-only file system"), "{err}");
    let (_, out, _) = sh(&node, &id, "grep ' /proc/sys ' /proc/self/mountinfo").await;
    assert!(
        out.split(' ')
            .nth(5)
            .unwrap_or("")
            .split(',')
            .any(|o| o == "ro"),
        "{out}"
    );

    // Privileged: nothing masked, /proc/sys writable.
    let psb = node
        .sandbox_with("masked-priv", pod_security(|s| s.privileged = true))
        .await;
    let id = node
        .container_with(
            &psb,
            secure(sleeper("privileged"), |sc| sc.privileged = true),
        )
        .await;
    let (_, out, err) = sh(&node, &id, &probe).await;
    let lines: Vec<&str> = out.lines().collect();
    let size: usize = lines.first().unwrap_or(&"").trim().parse().unwrap_or(0);
    assert!(size > 0, "privileged reads the real {masked}: {out}{err}");
    assert_eq!(lines.get(1), Some(&"0"), "{out}");
    assert!(out.contains("written"), "{out}{err}");
    node.teardown().await;
}

/// An OCI seccomp profile allowing everything but `denied`, which fail with EPERM.
fn deny_profile(denied: &[&str]) -> String {
    let arches = if cfg!(target_arch = "aarch64") {
        r#"["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]"#
    } else {
        r#"["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]"#
    };
    let names: Vec<String> = denied.iter().map(|n| format!("{n:?}")).collect();
    format!(
        r#"{{"defaultAction": "SCMP_ACT_ALLOW", "architectures": {arches},
            "syscalls": [{{"names": [{}], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}}]}}"#,
        names.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn seccomp_profiles() {
    if !root_or_skip("seccomp_profiles") {
        return;
    }
    use cri::security_profile::ProfileType;
    let node = Node::new("seccomp").await;
    let sb = node.sandbox("seccomp").await;
    // A user namespace needs no capability, so only seccomp can refuse `unshare -U`; a network
    // namespace needs CAP_SYS_ADMIN.
    let probe = "grep Seccomp: /proc/self/status; \
                 unshare -U true; echo userns=$?; unshare -n true; echo netns=$?";
    let run = |name: &str, profile: Option<cri::SecurityProfile>, capability| {
        secure(shell(name, probe), |sc| {
            sc.seccomp = profile;
            sc.capabilities = capability;
        })
    };

    let (_, out, err) = node
        .run_to_exit(
            &sb,
            run(
                "default",
                Some(seccomp(ProfileType::RuntimeDefault, "")),
                None,
            ),
        )
        .await;
    assert!(
        out.contains("Seccomp:\t2"),
        "RuntimeDefault filters: {out}{err}"
    );
    assert!(
        out.contains("userns=1") && out.contains("netns=1"),
        "{out}{err}"
    );
    assert!(err.contains("Operation not permitted"), "{err}");

    let (_, out, err) = node
        .run_to_exit(
            &sb,
            run(
                "unconfined",
                Some(seccomp(ProfileType::Unconfined, "")),
                None,
            ),
        )
        .await;
    assert!(out.contains("Seccomp:\t0"), "{out}{err}");
    assert!(
        out.contains("userns=0"),
        "Unconfined allows unshare: {out}{err}"
    );
    assert!(
        out.contains("netns=1"),
        "but CAP_SYS_ADMIN is still needed: {out}{err}"
    );

    let (_, out, err) = node.run_to_exit(&sb, run("none", None, None)).await;
    assert!(
        out.contains("Seccomp:\t0") && out.contains("userns=0"),
        "no profile is unconfined: {out}{err}"
    );

    let (_, out, err) = node
        .run_to_exit(
            &sb,
            run(
                "unconfined-admin",
                Some(seccomp(ProfileType::Unconfined, "")),
                caps(&["SYS_ADMIN"], &[]),
            ),
        )
        .await;
    assert!(
        out.contains("userns=0") && out.contains("netns=0"),
        "{out}{err}"
    );

    // RuntimeDefault with no_new_privs (the filter is loaded at another point of the start).
    let (_, out, err) = node
        .run_to_exit(
            &sb,
            secure(
                run(
                    "default-nnp",
                    Some(seccomp(ProfileType::RuntimeDefault, "")),
                    None,
                ),
                |sc| sc.no_new_privs = true,
            ),
        )
        .await;
    assert!(
        out.contains("Seccomp:\t2") && out.contains("userns=1"),
        "{out}{err}"
    );

    // Localhost: a profile file on the node.
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("no-mkdir.json");
    std::fs::write(&profile, deny_profile(&["mkdir", "mkdirat"])).unwrap();
    let profile = profile.to_string_lossy().into_owned();
    let cfg = secure(
        shell(
            "localhost",
            "touch /tmp/file && echo touched; mkdir /tmp/dir && echo made",
        ),
        |sc| sc.seccomp = Some(seccomp(ProfileType::Localhost, &profile)),
    );
    let (code, out, err) = node.run_to_exit(&sb, cfg).await;
    assert_eq!(out, "touched\n", "mkdir is denied, the rest allowed: {err}");
    assert_ne!(code, 0);
    assert!(err.contains("Operation not permitted"), "{err}");

    // Exec'd processes are confined like the container's own, with the container's exact
    // capabilities and no_new_privs (the filter is loaded with a CAP_SYS_ADMIN lent for it).
    let id = node
        .container_with(
            &sb,
            secure(sleeper("default-exec"), |sc| {
                sc.seccomp = Some(seccomp(ProfileType::RuntimeDefault, ""))
            }),
        )
        .await;
    let (_, out, err) = sh(&node, &id, &format!("cat /proc/self/status; {probe}")).await;
    assert_eq!(status_field(&out, "Seccomp"), "2", "{err}");
    assert_eq!(status_field(&out, "NoNewPrivs"), "0");
    let default_mask = cap_mask(&runtime::builtin::spec::default_capabilities());
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(hex_mask(status_field(&out, set)), default_mask, "{set}");
    }
    assert!(
        out.contains("userns=1") && out.contains("netns=1"),
        "{out}{err}"
    );
    let (code, out, err) = sh(&node, &id, "id -u && grep Seccomp: /proc/self/status").await;
    assert_eq!((code, out.as_str()), (0, "0\nSeccomp:\t2\n"), "{err}");
    let id = node
        .container_with(
            &sb,
            secure(sleeper("exec"), |sc| {
                sc.seccomp = Some(seccomp(ProfileType::Localhost, &profile))
            }),
        )
        .await;
    let (code, out, err) = sh(&node, &id, "grep Seccomp: /proc/self/status; mkdir /tmp/d").await;
    assert!(out.contains("Seccomp:\t2"), "exec is filtered: {out}{err}");
    assert_ne!(code, 0, "mkdir in an exec'd process: {err}");

    // A missing Localhost profile is the request's fault, and leaves nothing behind.
    let before = node.rt.image_store().rootfs_keys().unwrap();
    let missing = dir.path().join("missing.json");
    let cfg = secure(sleeper("missing"), |sc| {
        sc.seccomp = Some(seccomp(ProfileType::Localhost, &missing.to_string_lossy()))
    });
    let err = node.try_create(&sb, cfg).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("missing.json"), "{err}");
    assert_eq!(node.rt.image_store().rootfs_keys().unwrap(), before);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn devices() {
    if !root_or_skip("devices") {
        return;
    }
    let node = Node::new("devices").await;
    let sb = node.sandbox("devices").await;
    let mut cfg = sleeper("dev");
    cfg.devices = vec![cri::Device {
        host_path: "/dev/null".into(),
        container_path: "/dev/mynull".into(),
        permissions: "rwm".into(),
    }];
    let id = node.container_with(&sb, cfg).await;
    let (code, out, err) = sh(
        &node,
        &id,
        "echo hi > /dev/mynull && stat -c '%F %t:%T' /dev/mynull && wc -c < /dev/mynull",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"character special file 1:3"), "{out}");
    assert_eq!(lines.get(1).map(|s| s.trim()), Some("0"), "{out}");
    // A device node the device cgroup does not allow cannot be opened, even when it exists.
    let (code, _, err) = sh(&node, &id, "mknod /tmp/mem c 1 1 && head -c 1 /tmp/mem").await;
    assert_ne!(code, 0, "/dev/mem (1:1) was readable");
    assert!(err.contains("Operation not permitted"), "{err}");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_sysctls() {
    if !root_or_skip("pod_sysctls") {
        return;
    }
    let read = |p: &str| std::fs::read_to_string(p).unwrap();
    let (shm, port) = (
        "/proc/sys/kernel/shm_rmid_forced",
        "/proc/sys/net/ipv4/ip_unprivileged_port_start",
    );
    let host_before = (read(shm), read(port));
    let node = Node::new("sysctl").await;
    let sb = node
        .sandbox_with("sysctl", |cfg| {
            cfg.linux.get_or_insert_with(Default::default).sysctls = [
                ("kernel.shm_rmid_forced".to_string(), "1".to_string()),
                (
                    "net.ipv4.ip_unprivileged_port_start".to_string(),
                    "80".to_string(),
                ),
            ]
            .into();
        })
        .await;
    let id = node.container_with(&sb, sleeper("c")).await;
    let (_, out, err) = sh(&node, &id, &format!("cat {shm} {port}")).await;
    assert_eq!(out, "1\n80\n", "{err}");
    assert_eq!(
        (read(shm), read(port)),
        host_before,
        "the host's values are unchanged"
    );

    // Bad sysctls: unknown, not namespaced (would change the node), or net.* on the node's
    // network. Each is refused with the name in the message, and nothing is left. The values
    // asked for are the host's own, so nothing changes even if one got through.
    let swappiness = read("/proc/sys/vm/swappiness").trim().to_string();
    let cases: [(&str, String, bool); 3] = [
        ("net.ipv4.no_such_sysctl", "1".into(), false),
        ("vm.swappiness", swappiness, false),
        (
            "net.ipv4.ip_unprivileged_port_start",
            host_before.1.trim().into(),
            true,
        ),
    ];
    for (key, value, host_network) in cases {
        let mut cfg = sandbox_config("bad-sysctl", &node.log_dir());
        let linux = cfg.linux.get_or_insert_with(Default::default);
        linux.sysctls = [(key.to_string(), value)].into();
        if host_network {
            linux.security_context = Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(
                    cri::NamespaceMode::Node,
                    cri::NamespaceMode::Container,
                )),
                ..Default::default()
            });
        }
        let err = node.try_sandbox(cfg).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{key}: {err}");
        assert!(err.message().contains(key), "{key}: {err}");
        let list = node
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .unwrap();
        assert_eq!(list.items.len(), 1, "{key}: only the good pod is left");
        let dirs = common::state_entries(node.root.path(), "sandboxes");
        assert_eq!(
            dirs.len(),
            1,
            "{key}: no sandbox directory is left: {dirs:?}"
        );
    }
    assert_eq!((read(shm), read(port)), host_before);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_network() {
    if !root_or_skip("host_network") {
        return;
    }
    let node = Node::new("hostnet").await;
    let sb = node
        .sandbox_with(
            "hostnet",
            pod_security(|s| {
                s.namespace_options = Some(namespaces(
                    cri::NamespaceMode::Node,
                    cri::NamespaceMode::Container,
                ))
            }),
        )
        .await;
    let id = node.container_with(&sb, sleeper("c")).await;
    let (_, out, err) = sh(
        &node,
        &id,
        "readlink /proc/self/ns/net; readlink /proc/self/ns/uts; hostname",
    )
    .await;
    let ns = |n: &str| std::fs::read_link(format!("/proc/self/ns/{n}")).unwrap();
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        out,
        format!(
            "{}\n{}\n{}",
            ns("net").display(),
            ns("uts").display(),
            host_name
        ),
        "{err}"
    );
    // A pod network for contrast.
    let other = node.sandbox("podnet").await;
    let id = node.container_with(&other, sleeper("c")).await;
    let (_, out, _) = sh(&node, &id, "readlink /proc/self/ns/net; hostname").await;
    assert_ne!(out.lines().next().unwrap(), ns("net").to_string_lossy());
    assert_eq!(out.lines().nth(1), Some("podnet"));
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pid_namespace_sharing() {
    if !root_or_skip("pid_namespace_sharing") {
        return;
    }
    let node = Node::new("pidns").await;
    for (mode, shared) in [
        (cri::NamespaceMode::Pod, true),
        (cri::NamespaceMode::Container, false),
    ] {
        let name = format!("pid-{}", mode.as_str_name().to_lowercase());
        let sb = node
            .sandbox_with(
                &name,
                pod_security(|s| {
                    s.namespace_options = Some(namespaces(cri::NamespaceMode::Pod, mode))
                }),
            )
            .await;
        let with_mode = |cfg| {
            secure(cfg, |sc| {
                sc.namespace_options = Some(namespaces(cri::NamespaceMode::Pod, mode))
            })
        };
        node.container_with(&sb, with_mode(container_config("a", &["sleep", "4242"])))
            .await;
        let b = node.container_with(&sb, with_mode(sleeper("b"))).await;
        let (_, out, err) = sh(&node, &b, "ps -o pid,args").await;
        assert_eq!(
            out.contains("sleep 4242"),
            shared,
            "{name}: container a's process seen from b: {out}{err}"
        );
        assert!(out.contains("sleep 600"), "{out}");
        if !shared {
            let (_, out, _) = sh(&node, &b, "cat /proc/1/cmdline | tr '\\0' ' '").await;
            assert_eq!(out, "sleep 600 ", "b's own init is PID 1");
            continue;
        }
        // A container whose PID in the pod's namespace no process of the node has: on a
        // cgroup v1 node libcontainer used to look its cgroups up by that PID in the node's
        // /proc and fail the start. Its own cgroups are still what /sys/fs/cgroup shows.
        let a_pid = host_pid_of("sleep\u{0}4242", |_| true);
        let next = (500..4_000_000)
            .find(|p| !Path::new(&format!("/proc/{p}")).exists())
            .expect("a free PID");
        let set = std::process::Command::new("nsenter")
            .args(["--pid", &format!("--target={a_pid}"), "--", "sh", "-c"])
            .arg(format!("echo {} > /proc/sys/kernel/ns_last_pid", next - 1))
            .status()
            .unwrap();
        assert!(set.success());
        let mut c = shell(
            "c",
            "echo pid $$; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || \
             cat /sys/fs/cgroup/memory.max; sleep 600",
        );
        c.linux.get_or_insert_with(Default::default).resources =
            Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 96 << 20,
                ..Default::default()
            });
        let c = node.container_with(&sb, with_mode(c)).await;
        let log = node.status(&c).await.log_path;
        let mut seen = String::new();
        for _ in 0..100 {
            seen = log_output(Path::new(&log)).0;
            if seen.lines().count() >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(seen, format!("pid {next}\n{}\n", 96 << 20));
    }
    node.teardown().await;
}

/// The node's PID of a process whose command line starts with `cmdline` (NUL-separated) and
/// that `also` accepts.
fn host_pid_of(cmdline: &str, also: impl Fn(u32) -> bool) -> u32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(cmdline))
                && also(pid)
        })
        .unwrap_or_else(|| panic!("no process {cmdline:?} on the node"))
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_working_dir_and_command() {
    if !root_or_skip("environment_working_dir_and_command") {
        return;
    }
    let node = Node::new("env").await;
    let sb = node.sandbox("env").await;
    let kv = |k: &str, v: &str| cri::KeyValue {
        key: k.into(),
        value: v.into(),
    };
    let mut cfg = shell("env", "echo $FOO:$BAR; pwd; echo $PATH; echo $HOSTNAME");
    cfg.envs = vec![kv("FOO", "foo value"), kv("BAR", "")];
    cfg.working_dir = "/tmp".into();
    let (code, out, err) = node.run_to_exit(&sb, cfg).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, "foo value:\n/tmp\n/usr/sbin:/usr/bin:/sbin:/bin\nenv\n",
        "request env, working dir, the image's PATH, the pod's hostname"
    );

    // The image's cmd is `sh`: args alone replace it; command replaces it and takes the args.
    let mut cfg = container_config("args", &[]);
    cfg.args = vec!["echo".into(), "from".into(), "args".into()];
    let (_, out, _) = node.run_to_exit(&sb, cfg).await;
    assert_eq!(out, "from args\n");
    let mut cfg = container_config("cmd", &["echo", "cmd"]);
    cfg.args = vec!["and".into(), "args".into()];
    let (_, out, _) = node.run_to_exit(&sb, cfg).await;
    assert_eq!(out, "cmd and args\n");
    // A working dir the image lacks is created.
    let mut cfg = container_config("newdir", &["pwd"]);
    cfg.working_dir = "/work/dir".into();
    let (code, out, err) = node.run_to_exit(&sb, cfg).await;
    assert_eq!((code, out.as_str()), (0, "/work/dir\n"), "{err}");

    // ExecSync sees the container's environment and working directory.
    let mut cfg = sleeper("exec");
    cfg.envs = vec![kv("FOO", "exec-foo")];
    cfg.working_dir = "/tmp".into();
    let id = node.container_with(&sb, cfg).await;
    let (_, out, err) = sh(&node, &id, "echo $FOO; pwd").await;
    assert_eq!(out, "exec-foo\n/tmp\n", "{err}");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_resources() {
    if !root_or_skip("cpu_resources") {
        return;
    }
    let node = Node::new("cpu").await;
    let sb = node.sandbox("cpu").await;
    let mut cfg = sleeper("c");
    cfg.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpuset_cpus: "0".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = node.container_with(&sb, cfg).await;
    let (_, out, err) = sh(
        &node,
        &id,
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us \
         /sys/fs/cgroup/cpuset/cpuset.cpus; grep Cpus_allowed_list /proc/self/status",
    )
    .await;
    assert_eq!(out, "50000\n100000\n0\nCpus_allowed_list:\t0\n", "{err}");
    node.teardown().await;
}

/// Recursive read-only mounts (CRI `recursive_read_only`, as critest's "Container Mount
/// Readonly" specs check them): a read-only bind of a directory with a tmpfs mounted inside
/// leaves that tmpfs writable unless the mount is recursively read-only; a recursive read-only
/// mount that is not read-only, or does not have private propagation, is refused.
#[tokio::test(flavor = "multi_thread")]
async fn recursive_read_only_mounts() {
    if !root_or_skip("recursive_read_only_mounts") {
        return;
    }
    let node = Node::new("rro").await;
    let sb = node.sandbox("rro").await;
    let host = tempfile::tempdir().unwrap();
    let sub = host.path().join("tmpfs");
    std::fs::create_dir(&sub).unwrap();
    nix::mount::mount(
        Some("none"),
        &sub,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount a tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(sub.clone());
    let with_mount = |name: &str, readonly: bool, rro: bool, propagation: cri::MountPropagation| {
        let mut cfg = sleeper(name);
        cfg.mounts = vec![cri::Mount {
            container_path: "/mnt".into(),
            host_path: host.path().to_string_lossy().into_owned(),
            readonly,
            recursive_read_only: rro,
            propagation: propagation as i32,
            ..Default::default()
        }];
        cfg
    };
    use cri::MountPropagation as P;
    let plain = node
        .container_with(&sb, with_mount("ro", true, false, P::PropagationPrivate))
        .await;
    let (code, _, err) = sh(&node, &plain, "touch /mnt/tmpfs/a").await;
    assert_eq!(
        code, 0,
        "a read-only mount leaves its submounts writable: {err}"
    );
    let (code, _, err) = sh(&node, &plain, "touch /mnt/b").await;
    assert_ne!(code, 0, "but not itself");
    assert!(err.contains("Read-only file system"), "{err}");
    let rro = node
        .container_with(&sb, with_mount("rro", true, true, P::PropagationPrivate))
        .await;
    let (code, _, err) = sh(&node, &rro, "touch /mnt/tmpfs/c").await;
    assert_ne!(
        code, 0,
        "a recursive read-only mount makes its submounts read-only"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!sub.join("c").exists());
    for (name, readonly, prop, why) in [
        ("rw", false, P::PropagationPrivate, "needs readonly"),
        (
            "slave",
            true,
            P::PropagationHostToContainer,
            "private propagation",
        ),
        (
            "shared",
            true,
            P::PropagationBidirectional,
            "private propagation",
        ),
    ] {
        let e = node
            .try_create(&sb, with_mount(name, readonly, true, prop))
            .await
            .expect_err(name);
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e}");
        assert!(e.message().contains(why), "{name}: {e}");
    }
    node.teardown().await;
}

/// A pod user namespace (CRI `userns_options` mode POD, as critest's UserNamespaces specs ask):
/// the containers see the mapping in /proc/self/uid_map and run as root inside, as the host's
/// unprivileged ID outside; the pod's network is theirs (owned by the namespace); bad mappings
/// and modes are refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn pod_user_namespace() {
    if !root_or_skip("pod_user_namespace") {
        return;
    }
    let node = Node::new("userns").await;
    let (mapping, userns) = (id_mapping, userns_config);
    let sb = node
        .sandbox_with(
            "userns",
            userns(cri::NamespaceMode::Pod, vec![mapping(0, 100_000, 65_536)]),
        )
        .await;
    let id = node.container(&sb, "c", &["sleep", "300"]).await;
    let (code, out, err) = sh(
        &node,
        &id,
        "cat /proc/self/uid_map /proc/self/gid_map; id -u",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["0", "100000", "65536"], "{out}");
    assert_eq!(lines[1], ["0", "100000", "65536"], "{out}");
    assert_eq!(lines[2], ["0"], "{out}");
    // The container's own process too (critest reads it from the container's log), and the
    // node sees it as the mapped ID.
    let (code, out, err) = node
        .run_to_exit(
            &sb,
            container_config(
                "log",
                &[
                    "sh",
                    "-c",
                    "cat /proc/self/uid_map; grep ^Uid: /proc/self/status",
                ],
            ),
        )
        .await;
    assert_eq!(code, 0, "{err}");
    let first: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(first, ["0", "100000", "65536"], "{out}");
    let sleeper_pid = host_pid_of("sleep\u{0}300", |pid| {
        std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()
            != std::fs::read_link("/proc/self/ns/user").ok()
    });
    let host_uid = std::fs::read_to_string(format!("/proc/{sleeper_pid}/status")).unwrap();
    assert!(
        host_uid
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains("100000")),
        "{host_uid}"
    );
    // The rootfs is ID-mapped: the image's files, and the rootfs itself, are the container
    // root's, and what that root writes the node sees as the pod's mapped root (upper dir).
    let (code, out, err) = sh(
        &node,
        &id,
        "stat -c %u:%g /bin/sh / /etc/passwd && echo x >> /etc/passwd && mkdir /made && \
         touch /made/inside && stat -c %u:%g /made/inside",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "0:0\n0:0\n0:0\n0:0\n"), "{err}");
    let rootfs = common::state_dir(node.root.path())
        .join("containers")
        .join(&id)
        .join("rootfs");
    let owner = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(owner(&rootfs.join("made/inside")), (100_000, 100_000));
    assert_eq!(owner(&rootfs.join("bin/busybox")), (100_000, 100_000));
    // Volumes are ID-mapped too: a directory and a file of the node's root are the
    // container root's, at mount points the image lacks, and what the container's root
    // writes there is the node root's, as without a user namespace. So are the pod's /etc files.
    let volume = tempfile::tempdir().unwrap();
    std::fs::write(volume.path().join("f"), "from the node\n").unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "a file\n").unwrap();
    let mut cfg = sleeper("volumes");
    cfg.mounts = vec![
        // As the kubelet sends it: with the pod's mappings repeated.
        cri::Mount {
            container_path: "/data/vol".into(),
            host_path: volume.path().to_string_lossy().into_owned(),
            uid_mappings: vec![mapping(0, 100_000, 65_536)],
            gid_mappings: vec![mapping(0, 100_000, 65_536)],
            ..Default::default()
        },
        cri::Mount {
            container_path: "/conf/file".into(),
            host_path: file.path().to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        },
    ];
    let vols = node.container_with(&sb, cfg).await;
    let (code, out, err) = sh(
        &node,
        &vols,
        "stat -c %u:%g /data/vol /data/vol/f /conf/file /etc/hosts && cat /conf/file && \
         echo new > /data/vol/new && echo '# ok' >> /etc/hosts && echo wrote",
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, "0:0\n0:0\n0:0\n0:0\na file\nwrote\n"),
        "{err}"
    );
    assert_eq!(owner(&volume.path().join("new")), (0, 0));
    assert_eq!(
        std::fs::read_to_string(volume.path().join("new")).unwrap(),
        "new\n"
    );
    // The staged ID-mapped clones are gone once the container exists.
    let bundle = common::state_dir(node.root.path())
        .join("containers")
        .join(&vols);
    assert!(!bundle.join("idmapped").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.lines().any(|l| l
            .split(' ')
            .nth(4)
            .is_some_and(|p| p.contains("/idmapped/"))),
        "{mounts}"
    );
    // The pod's network namespace belongs to its user namespace: CAP_NET_ADMIN there is
    // enough to change it.
    let admin = secure(sleeper("netadmin"), |sc| {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: vec!["NET_ADMIN".into()],
            ..Default::default()
        });
    });
    let admin = node.container_with(&sb, admin).await;
    let (code, out, err) = sh(
        &node,
        &admin,
        "ip link set lo mtu 1500 && echo owns-its-network",
    )
    .await;
    assert_eq!((code, out.trim()), (0, "owns-its-network"), "{err}");
    // Refusals, as critest expects them.
    for (name, tweak, why) in [
        (
            "two",
            userns(
                cri::NamespaceMode::Pod,
                vec![mapping(0, 100_000, 1000), mapping(1000, 200_000, 1000)],
            ),
            "exactly one",
        ),
        (
            "noroot",
            userns(cri::NamespaceMode::Pod, vec![mapping(1, 100_000, 65_536)]),
            "container ID 0",
        ),
        (
            "ctr",
            userns(cri::NamespaceMode::Container, vec![]),
            "only POD and NODE",
        ),
        (
            "target",
            userns(cri::NamespaceMode::Target, vec![]),
            "only POD and NODE",
        ),
    ] {
        let mut cfg = sandbox_config(name, &node.log_dir());
        tweak(&mut cfg);
        let e = node.try_sandbox(cfg).await.expect_err(name);
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e}");
        assert!(e.message().contains(why), "{name}: {e}");
    }
    node.teardown().await;
}
