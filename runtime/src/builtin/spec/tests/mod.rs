//! Tests of the whole spec. This file: the fixture, the default spec, namespaces and mounts;
//! `security.rs`: privileged, capabilities, seccomp, resources, annotations, user and env.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Mount, Spec};

use super::*;
use crate::Code;

mod security;

/// A request, a rootfs and the pod's /etc files; tweak the fields, then `spec()`.
struct Fixture {
    rootfs: tempfile::TempDir,
    config: cri::ContainerConfig,
    sandbox: cri::PodSandboxConfig,
    image: images::ImageConfig,
    pid_ns_holder: Option<i32>,
    userns_holder: Option<i32>,
    target_pid: Option<i32>,
    host: Host,
}

impl Fixture {
    fn new() -> Fixture {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(rootfs.path().join("etc")).unwrap();
        std::fs::write(
            rootfs.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/false\n",
        )
        .unwrap();
        Fixture {
            rootfs,
            config: cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "docker.io/library/busybox:latest".into(),
                    ..Default::default()
                }),
                command: vec!["/bin/sh".into()],
                ..Default::default()
            },
            sandbox: cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "pod".into(),
                    uid: "uid-1".into(),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                hostname: "pod-host".into(),
                ..Default::default()
            },
            image: images::ImageConfig::default(),
            pid_ns_holder: Some(4321),
            userns_holder: None,
            target_pid: None,
            host: Host {
                cgroup_v2: true,
                oom_score_adj: Some(0),
                hostname: "node".into(),
                dev_dir: PathBuf::from("/dev"),
                capabilities: None,
                cgroup_v1: &[],
            },
        }
    }

    fn spec(&self) -> Result<Spec> {
        build(
            &SpecInput {
                container_id: "c1",
                config: &self.config,
                sandbox: &self.sandbox,
                image: &self.image,
                rootfs: self.rootfs.path(),
                sandbox_pid: 1234,
                pid_ns_holder: self.pid_ns_holder,
                userns_holder: self.userns_holder,
                target_pid: self.target_pid,
                cgroup_parent: "/kubepods/pod-uid-1",
                etc_hosts: Path::new("/var/lib/nodelet/sb/etc/hosts"),
                etc_hostname: Path::new("/var/lib/nodelet/sb/etc/hostname"),
                etc_resolv_conf: Path::new("/var/lib/nodelet/sb/etc/resolv.conf"),
            },
            &self.host,
        )
    }

    fn sc(&mut self) -> &mut cri::LinuxContainerSecurityContext {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    fn pod_sc(&mut self) -> &mut cri::LinuxSandboxSecurityContext {
        self.sandbox
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }
}

fn invalid_message(r: Result<Spec>) -> String {
    let err = r.expect_err("the request should be rejected");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    err.message().to_string()
}

fn namespaces(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<String>)> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default()
        .iter()
        .map(|n| (n.typ(), n.path().as_ref().map(|p| p.display().to_string())))
        .collect()
}

fn mounts(spec: &Spec) -> Vec<Mount> {
    spec.mounts().clone().unwrap_or_default()
}

fn destinations(spec: &Spec) -> Vec<String> {
    mounts(spec)
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect()
}

fn mount_at(spec: &Spec, dest: &str) -> Option<Mount> {
    mounts(spec)
        .into_iter()
        .find(|m| m.destination() == Path::new(dest))
}

#[test]
fn default_container_spec() {
    let f = Fixture::new();
    let spec = f.spec().unwrap();
    let process = spec.process().clone().unwrap();
    assert_eq!(process.args().clone().unwrap(), ["/bin/sh"]);
    assert_eq!(process.cwd(), Path::new("/"));
    assert_eq!(process.user().uid(), 0);
    assert_eq!(process.user().additional_gids().clone().unwrap(), [0]);
    let env = process.env().clone().unwrap();
    assert!(env.contains(&"HOSTNAME=pod-host".to_string()), "{env:?}");
    assert!(env.contains(&"HOME=/root".to_string()), "{env:?}");
    assert_eq!(process.terminal(), Some(false));
    // false is left out, not written (see `build`): libcontainer treats the two differently.
    assert_eq!(process.no_new_privileges(), None);
    assert_eq!(process.oom_score_adj(), None);
    assert!(process.rlimits().is_none());
    assert!(spec.hostname().is_none());
    let root = spec.root().clone().unwrap();
    assert_eq!(
        (root.path().as_path(), root.readonly()),
        (f.rootfs.path(), Some(false))
    );
    let linux = spec.linux().clone().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/kubepods/pod-uid-1/c1"))
    );
    assert!(
        linux.seccomp().is_none(),
        "no profile in the request means unconfined"
    );
    assert!(linux.sysctl().is_none());
    assert_eq!(linux.masked_paths().clone().unwrap(), DEFAULT_MASKED_PATHS);
    assert_eq!(
        linux.readonly_paths().clone().unwrap(),
        DEFAULT_READONLY_PATHS
    );
    // The spec survives a JSON round trip, as it must to reach the sandbox.
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<Spec>(&json).unwrap(), spec);
}

#[test]
fn namespace_modes() {
    use LinuxNamespaceType as T;
    use cri::NamespaceMode::{Container, Node, Pod, Target};
    let p = |s: &str| Some(s.to_string());
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        (cri::NamespaceMode, cri::NamespaceMode, cri::NamespaceMode),
        Vec<(T, Option<String>)>,
    )> = vec![
        (
            (Pod, Pod, Container),
            vec![
                (T::Mount, None),
                (T::Network, p("/proc/1234/ns/net")),
                (T::Uts, p("/proc/1234/ns/uts")),
                (T::Ipc, p("/proc/1234/ns/ipc")),
                (T::Pid, None),
                (T::Cgroup, None),
            ],
        ),
        (
            (Node, Node, Node),
            vec![(T::Mount, None), (T::Cgroup, None)],
        ),
        (
            (Node, Pod, Pod),
            vec![
                (T::Mount, None),
                (T::Ipc, p("/proc/1234/ns/ipc")),
                (T::Pid, p("/proc/4321/ns/pid")),
                (T::Cgroup, None),
            ],
        ),
        (
            (Pod, Node, Target),
            vec![
                (T::Mount, None),
                (T::Network, p("/proc/1234/ns/net")),
                (T::Uts, p("/proc/1234/ns/uts")),
                (T::Pid, p("/proc/777/ns/pid")),
                (T::Cgroup, None),
            ],
        ),
    ];
    for ((network, ipc, pid), want) in cases {
        let mut f = Fixture::new();
        f.target_pid = Some(777);
        let opts = cri::NamespaceOption {
            network: network as i32,
            ipc: ipc as i32,
            pid: pid as i32,
            ..Default::default()
        };
        f.pod_sc().namespace_options = Some(opts.clone());
        f.sc().namespace_options = Some(opts);
        assert_eq!(
            namespaces(&f.spec().unwrap()),
            want,
            "{network:?} {ipc:?} {pid:?}"
        );
    }
}

#[test]
fn namespace_defaults_errors_and_cgroup_v1() {
    // No options anywhere: pod network and IPC, a PID namespace of its own.
    let mut f = Fixture::new();
    f.host.cgroup_v2 = false;
    let got = namespaces(&f.spec().unwrap());
    assert!(got.contains(&(LinuxNamespaceType::Pid, None)), "{got:?}");
    assert!(
        !got.iter().any(|(t, _)| *t == LinuxNamespaceType::Cgroup),
        "no cgroupns on v1"
    );

    // The container's PID mode wins over the pod's; POD needs a holder.
    let mut f = Fixture::new();
    f.pid_ns_holder = None;
    f.sc().namespace_options = Some(cri::NamespaceOption {
        pid: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    });
    assert!(invalid_message(f.spec()).contains("no shared PID namespace"));

    let mut f = Fixture::new();
    f.sc().namespace_options = Some(cri::NamespaceOption {
        pid: cri::NamespaceMode::Target as i32,
        target_id: "other".into(),
        ..Default::default()
    });
    assert!(invalid_message(f.spec()).contains("target container \"other\""));

    let mut f = Fixture::new();
    f.pod_sc().namespace_options = Some(cri::NamespaceOption {
        network: cri::NamespaceMode::Container as i32,
        ..Default::default()
    });
    assert!(invalid_message(f.spec()).contains("network namespace mode"));

    let mut f = Fixture::new();
    f.pod_sc().namespace_options = Some(cri::NamespaceOption {
        ipc: 42,
        ..Default::default()
    });
    assert!(invalid_message(f.spec()).contains("unknown namespace mode 42"));

    let mut f = Fixture::new();
    f.sc().namespace_options = Some(cri::NamespaceOption {
        userns_options: Some(cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(invalid_message(f.spec()).contains("differs from the pod's"));

    // A pod user namespace: containers join the holder's; without a holder, an error.
    let userns = || {
        Some(cri::NamespaceOption {
            userns_options: Some(cri::UserNamespace {
                mode: cri::NamespaceMode::Pod as i32,
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    let mut f = Fixture::new();
    f.pod_sc().namespace_options = userns();
    assert!(invalid_message(f.spec()).contains("has no user namespace"));
    f.userns_holder = Some(777);
    let got = namespaces(&f.spec().unwrap());
    assert!(
        got.iter()
            .any(|(t, p)| *t == LinuxNamespaceType::User
                && p.as_deref() == Some("/proc/777/ns/user")),
        "{got:?}"
    );

    // Privileged containers keep the host's cgroup namespace.
    let mut f = Fixture::new();
    f.pod_sc().privileged = true;
    f.sc().privileged = true;
    let got = namespaces(&f.spec().unwrap());
    assert!(
        !got.iter().any(|(t, _)| *t == LinuxNamespaceType::Cgroup),
        "{got:?}"
    );
}

fn cri_mount(container: &str, host: &str) -> cri::Mount {
    cri::Mount {
        container_path: container.into(),
        host_path: host.into(),
        ..Default::default()
    }
}

#[test]
fn mount_order_and_overrides() {
    let mut f = Fixture::new();
    f.config.mounts = vec![
        cri_mount("/data/sub/deeper", "/srv/c"),
        cri_mount("/data", "/srv/a"),
        cri_mount("/etc/resolv.conf", "/srv/resolv"),
        cri_mount("/dev/shm", "/srv/shm"),
        cri_mount("/data/sub", "/srv/b"),
    ];
    let spec = f.spec().unwrap();
    assert_eq!(
        destinations(&spec),
        [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup",
            "/data",
            "/etc/resolv.conf",
            "/dev/shm",
            "/data/sub",
            "/etc/hosts",
            "/etc/hostname",
            "/data/sub/deeper",
        ]
    );
    let shm = mount_at(&spec, "/dev/shm").unwrap();
    assert_eq!(shm.source().as_deref(), Some(Path::new("/srv/shm")));
    let resolv = mount_at(&spec, "/etc/resolv.conf").unwrap();
    assert_eq!(resolv.source().as_deref(), Some(Path::new("/srv/resolv")));
    let hosts = mount_at(&spec, "/etc/hosts").unwrap();
    assert_eq!(
        hosts.source().as_deref(),
        Some(Path::new("/var/lib/nodelet/sb/etc/hosts"))
    );
    assert_eq!(hosts.options().clone().unwrap(), ["bind", "private", "rw"]);
    assert_eq!(
        mount_at(&spec, "/sys")
            .unwrap()
            .options()
            .clone()
            .unwrap()
            .last()
            .unwrap(),
        "ro"
    );
    // Private (not left to libcontainer's slave default): bind mounts inherit it.
    assert_eq!(
        spec.linux()
            .as_ref()
            .unwrap()
            .rootfs_propagation()
            .as_deref(),
        Some("private")
    );

    // Mounting /dev drops every default mount below it.
    let mut f = Fixture::new();
    f.config.mounts = vec![cri_mount("/dev", "/srv/dev")];
    let d = destinations(&f.spec().unwrap());
    assert!(!d.iter().any(|d| d.starts_with("/dev/")), "{d:?}");
}

#[test]
fn mount_access_and_propagation() {
    let mut f = Fixture::new();
    f.sc().readonly_rootfs = true;
    let mut ro = cri_mount("/ro", "/srv/ro");
    ro.readonly = true;
    let mut slave = cri_mount("/slave", "/srv/slave");
    slave.propagation = cri::MountPropagation::PropagationHostToContainer as i32;
    f.config.mounts = vec![ro, slave];
    let spec = f.spec().unwrap();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    assert_eq!(
        mount_at(&spec, "/ro").unwrap().options().clone().unwrap(),
        ["rbind", "rprivate", "ro"]
    );
    assert_eq!(
        mount_at(&spec, "/etc/hostname")
            .unwrap()
            .options()
            .clone()
            .unwrap(),
        ["bind", "private", "ro"],
        "the pod's files are read-only with a read-only rootfs"
    );
    let linux = spec.linux().clone().unwrap();
    assert_eq!(linux.rootfs_propagation().as_deref(), Some("slave"));

    let mut shared = cri_mount("/shared", "/srv/shared");
    shared.propagation = cri::MountPropagation::PropagationBidirectional as i32;
    f.config.mounts.push(shared);
    let spec = f.spec().unwrap();
    assert_eq!(
        spec.linux()
            .as_ref()
            .unwrap()
            .rootfs_propagation()
            .as_deref(),
        Some("shared")
    );

    f.config.mounts = vec![cri_mount("relative", "/srv/x")];
    assert!(invalid_message(f.spec()).contains("container_path \"relative\""));
}
