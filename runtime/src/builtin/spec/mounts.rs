//! Mounts, masked paths and read-only paths (containerd's `WithMounts` and the OCI defaults
//! it starts from).
//!
//! Order: the default mounts (minus those a request mount replaces, and everything under
//! `/dev` when the request mounts `/dev`), then the request's mounts together with the pod's
//! /etc/hosts, /etc/hostname and /etc/resolv.conf, sorted so that parents come before
//! children (by the number of path components, stable, as containerd and Docker do).
//!
//! A request mount is a recursive bind (`rbind`) with its propagation (`rprivate`, `rslave`,
//! `rshared`) and `rw`, `ro` or, for a recursive read-only mount, `rro` (libcontainer applies
//! it with `mount_setattr`). Bind sources are not checked or created here: the caller creates
//! missing ones, as containerd does.

use std::collections::HashSet;
use std::path::PathBuf;

use oci_spec::runtime::{Mount, MountBuilder};

use super::{SpecInput, invalid, oci_error};
use crate::{Result, cri};

/// Paths masked in every unprivileged container unless the request gives its own list.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths read-only in every unprivileged container unless the request gives its own list.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Masked and read-only paths: none for a privileged container; else the request's lists
/// where non-empty (CRI cannot tell an empty list from an absent one, so an empty list means
/// the defaults, not "nothing masked"), else the defaults.
pub(super) fn masked_and_readonly_paths(
    sc: &cri::LinuxContainerSecurityContext,
) -> (Vec<String>, Vec<String>) {
    if sc.privileged {
        return (Vec::new(), Vec::new());
    }
    let pick = |given: &[String], default: &[&str]| -> Vec<String> {
        if given.is_empty() {
            default.iter().map(|s| s.to_string()).collect()
        } else {
            given.to_vec()
        }
    };
    (
        pick(&sc.masked_paths, DEFAULT_MASKED_PATHS),
        pick(&sc.readonly_paths, DEFAULT_READONLY_PATHS),
    )
}

/// An absolute container path without `.` or empty components; `None` if it is relative,
/// contains `..` or a NUL byte.
fn clean(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

pub(super) fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount> {
    MountBuilder::default()
        .destination(PathBuf::from(dest))
        .typ(typ)
        .source(PathBuf::from(source))
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(oci_error("mount"))
}

/// The mounts every container starts from. `/dev/shm` is a private 64 MiB tmpfs per
/// container; containerd shares one per pod (or the host's with host IPC), which would need a
/// pod-level shm from the sandbox.
pub(super) fn default_mounts(privileged: bool) -> Result<Vec<Mount>> {
    let mode = if privileged { "rw" } else { "ro" };
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", mode],
        )?,
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", mode],
        )?,
    ])
}

/// A bind mount from the request or for the pod's /etc files, before sorting.
struct Bind {
    dest: String,
    mount: Mount,
}

/// Turns one CRI mount into a bind mount; also returns the root propagation it needs.
/// `pod_userns` is the pod's own user namespace, if it has one.
fn cri_mount(
    m: &cri::Mount,
    pod_userns: Option<&cri::UserNamespace>,
) -> Result<(Bind, Option<&'static str>)> {
    let dest = clean(&m.container_path).ok_or_else(|| {
        invalid(format!(
            "mount container_path {:?} must be an absolute path without \"..\"",
            m.container_path
        ))
    })?;
    if !m.host_path.starts_with('/') || m.host_path.contains('\0') {
        return Err(invalid(format!(
            "mount host_path {:?} (for {dest}) must be an absolute path",
            m.host_path
        )));
    }
    if m.image.is_some() {
        return Err(invalid(format!(
            "mount at {dest}: image volume mounts are not supported"
        )));
    }
    // Every bind of a pod in a user namespace is ID-mapped through it (the runtime's
    // userns::stage_binds); the kubelet says so by repeating the pod's mappings on each mount.
    if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
        let Some(ns) = pod_userns else {
            return Err(invalid(format!(
                "mount at {dest}: ID-mapped mounts need the pod to have its own user namespace"
            )));
        };
        if m.uid_mappings != ns.uids || m.gid_mappings != ns.gids {
            return Err(invalid(format!(
                "mount at {dest}: its ID mappings must be the pod's user namespace's (the only \
                 ones it can be mapped through)"
            )));
        }
    }
    let propagation = cri::MountPropagation::try_from(m.propagation).map_err(|_| {
        invalid(format!(
            "mount at {dest}: unknown propagation {}",
            m.propagation
        ))
    })?;
    // libcontainer knows "shared", "slave", "private" and "unbindable" for the root (it always
    // applies them recursively); containerd writes runc's "rshared"/"rslave".
    let (prop, root) = match propagation {
        cri::MountPropagation::PropagationPrivate => ("rprivate", None),
        cri::MountPropagation::PropagationHostToContainer => ("rslave", Some("slave")),
        cri::MountPropagation::PropagationBidirectional => ("rshared", Some("shared")),
    };
    let access = match (m.readonly, m.recursive_read_only) {
        (false, false) => "rw",
        (true, false) => "ro",
        (false, true) => {
            return Err(invalid(format!(
                "mount at {dest}: recursive_read_only needs readonly (host_path {:?})",
                m.host_path
            )));
        }
        (true, true) if propagation != cri::MountPropagation::PropagationPrivate => {
            return Err(invalid(format!(
                "mount at {dest}: recursive_read_only needs private propagation, got {}",
                propagation.as_str_name()
            )));
        }
        (true, true) => "rro",
    };
    let mount = mount(&dest, "bind", &m.host_path, &["rbind", prop, access])?;
    Ok((Bind { dest, mount }, root))
}

/// All mounts of the container and the root propagation they need: `shared` for a
/// bidirectional mount, else `slave` for a host-to-container one, else `private`.
///
/// libcontainer ignores the propagation options of bind mounts (it attaches each one with
/// `open_tree`/`move_mount` and sets no propagation): a bind mount keeps what its source has
/// in the container's mount namespace, which is what the root propagation made of the host's
/// mounts. So the root is `private` unless a mount needs more (runc, which containerd drives,
/// keeps the root `rslave` and makes each private bind mount `rprivate` itself); otherwise a
/// private mount of a directory on a shared host mount would still receive the host's mounts.
/// The rest of the host's mount tree is detached after `pivot_root` either way.
pub(super) fn mounts(
    input: &SpecInput,
    sc: &cri::LinuxContainerSecurityContext,
) -> Result<(Vec<Mount>, Option<String>)> {
    let mut binds = Vec::new();
    let mut root_propagation: Option<&'static str> = None;
    let pod_userns = super::sandbox_security_context(input.sandbox)
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|o| o.userns_options.as_ref())
        .filter(|u| u.mode == cri::NamespaceMode::Pod as i32);
    for m in &input.config.mounts {
        let (bind, root) = cri_mount(m, pod_userns)?;
        root_propagation = match (root_propagation, root) {
            (Some("shared"), _) | (_, Some("shared")) => Some("shared"),
            (a, b) => a.or(b),
        };
        binds.push(bind);
    }
    let requested: HashSet<String> = binds.iter().map(|b| b.dest.clone()).collect();
    let access = if sc.readonly_rootfs { "ro" } else { "rw" };
    for (dest, src) in [
        ("/etc/hosts", input.etc_hosts),
        ("/etc/hostname", input.etc_hostname),
        ("/etc/resolv.conf", input.etc_resolv_conf),
    ] {
        if requested.contains(dest) || src.as_os_str().is_empty() {
            continue;
        }
        let src = src
            .to_str()
            .ok_or_else(|| invalid(format!("the pod's {dest} file {src:?} is not a UTF-8 path")))?;
        // A plain bind: a file has no submounts, and a recursive one would make the kernel
        // walk (and race with) every mount under the host's root to find none.
        binds.push(Bind {
            dest: dest.to_string(),
            mount: mount(dest, "bind", src, &["bind", "private", access])?,
        });
    }
    binds.sort_by_key(|b| b.dest.matches('/').count());

    let replaces_dev = requested.contains("/dev");
    let mut out: Vec<Mount> = default_mounts(sc.privileged)?
        .into_iter()
        .filter(|m| {
            let dest = m.destination().to_string_lossy();
            let replaced =
                requested.contains(dest.as_ref()) || (replaces_dev && dest.starts_with("/dev/"));
            !replaced
        })
        .collect();
    out.extend(binds.into_iter().map(|b| b.mount));
    Ok((out, Some(root_propagation.unwrap_or("private").to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths() {
        let cases = [
            ("/", Some("/")),
            ("/a/b", Some("/a/b")),
            ("/a//b/./c/", Some("/a/b/c")),
            ("a/b", None),
            ("", None),
            ("/a/../b", None),
            ("/..", None),
            ("/a\0", None),
            ("/a/..b", Some("/a/..b")),
        ];
        for (p, want) in cases {
            assert_eq!(clean(p).as_deref(), want, "{p:?}");
        }
    }

    #[test]
    fn masked_and_readonly_defaults_overrides_and_privileged() {
        let mut sc = cri::LinuxContainerSecurityContext::default();
        let (m, r) = masked_and_readonly_paths(&sc);
        assert_eq!(m, DEFAULT_MASKED_PATHS);
        assert_eq!(r, DEFAULT_READONLY_PATHS);
        sc.masked_paths = vec!["/bin/ls".into()];
        let (m, r) = masked_and_readonly_paths(&sc);
        assert_eq!(m, ["/bin/ls"]);
        assert_eq!(r, DEFAULT_READONLY_PATHS);
        sc.readonly_paths = vec!["/tmp".into()];
        assert_eq!(masked_and_readonly_paths(&sc).1, ["/tmp"]);
        sc.privileged = true;
        let (m, r) = masked_and_readonly_paths(&sc);
        assert!(m.is_empty() && r.is_empty());
    }

    fn cri(container: &str, host: &str) -> cri::Mount {
        cri::Mount {
            container_path: container.into(),
            host_path: host.into(),
            ..Default::default()
        }
    }

    #[test]
    fn cri_mount_options() {
        use cri::MountPropagation as P;
        let cases = [
            (
                false,
                false,
                P::PropagationPrivate,
                ["rbind", "rprivate", "rw"],
                None,
            ),
            (
                true,
                false,
                P::PropagationPrivate,
                ["rbind", "rprivate", "ro"],
                None,
            ),
            (
                true,
                true,
                P::PropagationPrivate,
                ["rbind", "rprivate", "rro"],
                None,
            ),
            (
                false,
                false,
                P::PropagationHostToContainer,
                ["rbind", "rslave", "rw"],
                Some("slave"),
            ),
            (
                true,
                false,
                P::PropagationBidirectional,
                ["rbind", "rshared", "ro"],
                Some("shared"),
            ),
        ];
        for (ro, rro, prop, want, root) in cases {
            let mut m = cri("/data", "/srv/data");
            m.readonly = ro;
            m.recursive_read_only = rro;
            m.propagation = prop as i32;
            let (bind, got_root) = cri_mount(&m, None).unwrap();
            assert_eq!(
                bind.mount.options().clone().unwrap_or_default(),
                want,
                "{m:?}"
            );
            assert_eq!(bind.mount.typ().as_deref(), Some("bind"));
            assert_eq!(
                bind.mount.source().as_deref(),
                Some(std::path::Path::new("/srv/data"))
            );
            assert_eq!(got_root, root);
        }
    }

    #[test]
    fn root_propagation_is_private_unless_a_mount_needs_more() {
        use cri::MountPropagation as P;
        let cases: [(&[P], &str); 5] = [
            (&[], "private"),
            (&[P::PropagationPrivate], "private"),
            (
                &[P::PropagationPrivate, P::PropagationHostToContainer],
                "slave",
            ),
            (
                &[P::PropagationBidirectional, P::PropagationHostToContainer],
                "shared",
            ),
            (
                &[P::PropagationHostToContainer, P::PropagationBidirectional],
                "shared",
            ),
        ];
        for (props, want) in cases {
            let config = cri::ContainerConfig {
                mounts: props
                    .iter()
                    .enumerate()
                    .map(|(i, p)| cri::Mount {
                        propagation: *p as i32,
                        ..cri(&format!("/m{i}"), "/srv")
                    })
                    .collect(),
                ..Default::default()
            };
            let input = SpecInput {
                container_id: "c",
                config: &config,
                sandbox: &Default::default(),
                image: &Default::default(),
                rootfs: std::path::Path::new("/rootfs"),
                sandbox_pid: 1,
                pid_ns_holder: None,
                userns_holder: None,
                target_pid: None,
                cgroup_parent: "",
                etc_hosts: std::path::Path::new(""),
                etc_hostname: std::path::Path::new(""),
                etc_resolv_conf: std::path::Path::new(""),
            };
            let (_, root) = mounts(&input, &Default::default()).unwrap();
            assert_eq!(root.as_deref(), Some(want), "{props:?}");
        }
    }

    #[test]
    fn bad_cri_mounts_are_invalid() {
        let mut rro_rw = cri("/a", "/b");
        rro_rw.recursive_read_only = true;
        let mut rro_slave = cri("/a", "/b");
        rro_slave.readonly = true;
        rro_slave.recursive_read_only = true;
        rro_slave.propagation = cri::MountPropagation::PropagationHostToContainer as i32;
        let mut bad_prop = cri("/a", "/b");
        bad_prop.propagation = 9;
        let mut image = cri("/a", "/b");
        image.image = Some(Default::default());
        let mapping = |host_id| cri::IdMapping {
            container_id: 0,
            host_id,
            length: 65536,
        };
        let pod_userns = cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![mapping(100_000)],
            gids: vec![mapping(100_000)],
        };
        let mut idmap = cri("/a", "/b");
        idmap.uid_mappings = vec![mapping(100_000)];
        idmap.gid_mappings = vec![mapping(100_000)];
        // The pod's own mappings, as the kubelet sends them, are what the mount gets anyway.
        cri_mount(&idmap, Some(&pod_userns)).unwrap();
        let mut other = idmap.clone();
        other.gid_mappings = vec![mapping(200_000)];
        let err = cri_mount(&other, Some(&pod_userns)).err().unwrap();
        assert!(err.message().contains("must be the pod's"), "{err}");
        let cases = [
            (cri("rel/path", "/b"), "container_path \"rel/path\""),
            (cri("/a/../etc", "/b"), "container_path \"/a/../etc\""),
            (cri("", "/b"), "container_path \"\""),
            (cri("/a", "relative"), "host_path \"relative\""),
            (cri("/a", ""), "host_path \"\""),
            (rro_rw, "needs readonly"),
            (rro_slave, "needs private propagation"),
            (bad_prop, "unknown propagation 9"),
            (image, "image volume"),
            (idmap, "need the pod to have its own user namespace"),
        ];
        for (m, msg) in cases {
            let err = cri_mount(&m, None)
                .err()
                .unwrap_or_else(|| panic!("{m:?} accepted"));
            assert_eq!(err.code(), crate::Code::InvalidArgument);
            assert!(err.message().contains(msg), "{m:?}: {err}");
        }
    }
}
