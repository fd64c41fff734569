//! CRI `ContainerConfig` + image config → OCI runtime spec.
//!
//! [`container_spec`] turns one `CreateContainer` request into the `config.json` that the
//! sandbox process hands to libcontainer. It follows what containerd's CRI plugin produces on
//! Linux (`internal/cri/server/container_create*.go`, `internal/cri/opts/spec_linux*.go`), with
//! the deviations noted where they happen (mostly: libcontainer instead of runc, and a pod whose
//! namespaces are held by nodelet's sandbox process instead of a pause container).
//!
//! The function is pure apart from reading a few things it cannot be handed sensibly:
//! `<rootfs>/etc/passwd` and `<rootfs>/etc/group` (resolved without leaving the rootfs), the
//! host device nodes named by the request, a Localhost seccomp profile, and some host facts
//! (cgroup v1 or v2, our own `oom_score_adj`, the host name). It creates nothing: the caller
//! creates missing bind-mount sources, as containerd does for CRI mounts.
//!
//! Not in the container spec on purpose:
//! * sysctls: the pod's `linux.sysctls` are namespaced and applied once by the sandbox process
//!   in the pod's own namespaces, which every container joins (containerd likewise sets them
//!   only on the pause container);
//! * hostname: UTS is joined from the sandbox (or is the node's), so the spec must not set one;
//! * AppArmor and SELinux: this kernel has neither enabled; profiles and labels are ignored;
//! * rlimits: left to the runtime's defaults (containerd removes the OCI default rlimits too).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxBuilder, LinuxNamespaceType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::{Error, Result, cri};

mod caps;
mod cgroups;
mod devices;
mod mounts;
mod namespaces;
mod process;
mod resources;
mod seccomp;
mod user;

#[cfg(test)]
mod tests;

pub use caps::default_capabilities;
pub use mounts::{DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS};
pub use process::parse_signal;
pub use resources::linux_resources;
pub use seccomp::runtime_default_seccomp;
pub(crate) use user::resolve_in_root;

/// Annotation: `"container"` for application containers (`"sandbox"` would be the pause one).
pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// Annotation: the id of the pod sandbox the container belongs to.
pub const ANNOTATION_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// Annotation: the pod's name.
pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
/// Annotation: the pod's namespace.
pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// Annotation: the pod's UID.
pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
/// Annotation: the container's name from its CRI metadata.
pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
/// Annotation: the image the container was created from, as the kubelet named it.
pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

/// Everything needed to build one container's OCI spec.
pub struct SpecInput<'a> {
    pub container_id: &'a str,
    pub config: &'a cri::ContainerConfig,
    pub sandbox: &'a cri::PodSandboxConfig,
    pub image: &'a images::ImageConfig,
    /// The container's mounted root filesystem (its /etc/passwd and /etc/group are read).
    pub rootfs: &'a Path,
    /// PID of the sandbox process: the pod's network/IPC/UTS namespaces are
    /// `/proc/<pid>/ns/{net,ipc,uts}`.
    pub sandbox_pid: i32,
    /// PID of the pod's PID-namespace holder when the pod shares one (`NamespaceMode::Pod`).
    pub pid_ns_holder: Option<i32>,
    /// PID of the holder of the pod's user namespace, when the pod has one.
    pub userns_holder: Option<i32>,
    /// For `NamespaceMode::Target`: the target container's init PID.
    pub target_pid: Option<i32>,
    /// The pod cgroup; the container's `cgroupsPath` is `<cgroup_parent>/<container_id>`.
    pub cgroup_parent: &'a str,
    /// The pod's generated files, bind-mounted into the container unless it mounts its own
    /// file at that path (read-only when the root filesystem is, like containerd).
    pub etc_hosts: &'a Path,
    pub etc_hostname: &'a Path,
    pub etc_resolv_conf: &'a Path,
}

/// Builds the OCI runtime spec of a container. Every rejection of the request is an
/// `InvalidArgument` error naming the offending field and value.
///
/// The `io.kubernetes.cri.sandbox-id` annotation is not known here; add it with
/// [`annotate_sandbox_id`].
pub fn container_spec(input: &SpecInput) -> Result<Spec> {
    build(input, &Host::current())
}

/// Sets the `io.kubernetes.cri.sandbox-id` annotation on a spec built by [`container_spec`].
pub fn annotate_sandbox_id(spec: &mut Spec, sandbox_id: &str) {
    spec.annotations_mut()
        .get_or_insert_with(HashMap::new)
        .insert(ANNOTATION_SANDBOX_ID.to_string(), sandbox_id.to_string());
}

/// Facts about the host the spec depends on; read once per spec, replaced in tests.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// Whether /sys/fs/cgroup is the unified (v2) hierarchy.
    pub cgroup_v2: bool,
    /// Our own `oom_score_adj`: a container's may not be lower (lowering it needs
    /// CAP_SYS_RESOURCE, which nodelet does not have everywhere). `None` when unreadable.
    pub oom_score_adj: Option<i32>,
    /// The node's host name, for `HOSTNAME` when the pod has none.
    pub hostname: String,
    /// Where the host's device nodes are (privileged containers get all of them).
    pub dev_dir: PathBuf,
    /// Our own effective capabilities (`CapEff`, bit n = capability n): what "ALL" and
    /// privileged grant. `None` when unreadable: every capability known.
    pub capabilities: Option<u64>,
    /// The cgroup v1 hierarchies (none on a v2 node).
    pub cgroup_v1: &'static [cgroups::CgroupHierarchy],
}

impl Host {
    pub(crate) fn current() -> Host {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let cgroup_v2 = sandbox::cgroup::unified();
        Host {
            cgroup_v2,
            oom_score_adj: read("/proc/self/oom_score_adj").and_then(|s| s.trim().parse().ok()),
            hostname: read("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            dev_dir: PathBuf::from("/dev"),
            capabilities: read("/proc/self/status").and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            }),
            cgroup_v1: if cgroup_v2 {
                &[]
            } else {
                cgroups::node_hierarchies()
            },
        }
    }
}

/// An `InvalidArgument` error.
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::invalid_argument(message)
}

/// An error from an oci-spec builder; they only fail on inconsistent input we produced.
fn oci_error(what: &str) -> impl FnOnce(oci_spec::OciSpecError) -> Error + '_ {
    move |e| Error::internal(format!("building the OCI {what}: {e}"))
}

/// The container's security context, or an empty one.
fn security_context(config: &cri::ContainerConfig) -> cri::LinuxContainerSecurityContext {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.clone())
        .unwrap_or_default()
}

fn sandbox_security_context(
    sandbox: &cri::PodSandboxConfig,
) -> Option<&cri::LinuxSandboxSecurityContext> {
    sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
}

fn check_container_id(id: &str) -> Result<()> {
    if id.is_empty() || id.contains('/') || id.contains('\0') || id == "." || id == ".." {
        return Err(invalid(format!("invalid container id {id:?}")));
    }
    Ok(())
}

/// `<cgroup_parent>/<container_id>`, absolute; `None` without a parent (containerd leaves the
/// path to the runtime then).
pub(crate) fn cgroups_path(parent: &str, id: &str) -> Result<Option<PathBuf>> {
    let parent = parent.trim_end_matches('/');
    if parent.is_empty() {
        return Ok(None);
    }
    if parent.split('/').any(|c| c == "..") || parent.contains('\0') {
        return Err(invalid(format!("invalid cgroup parent {parent:?}")));
    }
    let parent = if parent.starts_with('/') {
        parent.to_string()
    } else {
        format!("/{parent}")
    };
    Ok(Some(PathBuf::from(format!("{parent}/{id}"))))
}

fn annotations(input: &SpecInput) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = input
        .config
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let meta = input.sandbox.metadata.clone().unwrap_or_default();
    let image = input
        .config
        .image
        .as_ref()
        .map(|i| {
            if i.user_specified_image.is_empty() {
                i.image.clone()
            } else {
                i.user_specified_image.clone()
            }
        })
        .unwrap_or_default();
    let name = input
        .config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    for (k, v) in [
        (ANNOTATION_CONTAINER_TYPE, "container".to_string()),
        (ANNOTATION_SANDBOX_NAME, meta.name),
        (ANNOTATION_SANDBOX_NAMESPACE, meta.namespace),
        (ANNOTATION_SANDBOX_UID, meta.uid),
        (ANNOTATION_CONTAINER_NAME, name),
        (ANNOTATION_IMAGE_NAME, image),
    ] {
        out.insert(k.to_string(), v);
    }
    out
}

/// [`container_spec`] against the given host facts.
pub(crate) fn build(input: &SpecInput, host: &Host) -> Result<Spec> {
    check_container_id(input.container_id)?;
    let config = input.config;
    let sc = security_context(config);
    let privileged = sc.privileged;
    if privileged && !sandbox_security_context(input.sandbox).is_some_and(|s| s.privileged) {
        return Err(invalid(
            "no privileged container allowed in sandbox: the container asks for privileged \
             but its pod sandbox is not privileged",
        ));
    }

    let namespaces = namespaces::namespaces(input, &sc, host.cgroup_v2)?;
    let user = user::resolve(input.rootfs, &sc, input.image)?;
    let args = process::args(config, input.image)?;
    let hostname = if input.sandbox.hostname.is_empty() {
        host.hostname.as_str()
    } else {
        input.sandbox.hostname.as_str()
    };
    let env = process::env(
        hostname,
        &input.image.env,
        &config.envs,
        user.home.as_deref(),
    )?;
    let cwd = process::cwd(config, input.image)?;
    let capabilities = caps::capabilities(sc.capabilities.as_ref(), privileged, host.capabilities)?;
    let seccomp = seccomp::of_context(&sc, &capabilities)?;
    let (mut mounts, rootfs_propagation) = mounts::mounts(input, &sc)?;
    let cgroups_path = cgroups_path(input.cgroup_parent, input.container_id)?;
    let joins_pid_namespace = namespaces
        .iter()
        .any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_some());
    if let (false, true, Some(path)) = (host.cgroup_v2, joins_pid_namespace, &cgroups_path) {
        cgroups::spell_out_cgroup_v1(&mut mounts, host.cgroup_v1, path, privileged)?;
    }
    let (devices, device_rules) = devices::devices(&config.devices, privileged, &host.dev_dir)?;

    let mut resources = config
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .map(linux_resources)
        .unwrap_or_default();
    resources.set_devices(Some(device_rules));

    let (masked, readonly) = mounts::masked_and_readonly_paths(&sc);

    let mut process = ProcessBuilder::default()
        .terminal(config.tty)
        .user(
            UserBuilder::default()
                .uid(user.uid)
                .gid(user.gid)
                .additional_gids(user.additional_gids)
                .build()
                .map_err(oci_error("user"))?,
        )
        .args(args)
        .env(env)
        .cwd(cwd)
        .capabilities(capabilities.to_oci()?)
        .build()
        .map_err(oci_error("process"))?;
    // `noNewPrivileges: false` is left out rather than written: libcontainer loads the seccomp
    // filter early (while the init still has CAP_SYS_ADMIN) only when the field is absent, and
    // after dropping capabilities whenever it is present, even false, where loading a filter
    // without no_new_privs fails with EACCES. Absent and false mean the same to the kernel.
    process.set_no_new_privileges(sc.no_new_privs.then_some(true));
    // Whatever the builder's defaults, CRI containers get no default rlimits (containerd's
    // WithoutDefaultSecuritySettings) and no AppArmor/SELinux.
    process.set_rlimits(None);
    process.set_apparmor_profile(None);
    process.set_selinux_label(None);
    process.set_oom_score_adj(process::oom_score_adj(config, host.oom_score_adj));

    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .devices(devices)
        .resources(resources)
        .masked_paths(masked)
        .readonly_paths(readonly)
        .build()
        .map_err(oci_error("linux section"))?;
    linux.set_cgroups_path(cgroups_path);
    linux.set_seccomp(seccomp);
    linux.set_rootfs_propagation(rootfs_propagation);
    linux.set_sysctl(None);
    linux.set_uid_mappings(None);
    linux.set_gid_mappings(None);
    linux.set_mount_label(None);

    let mut spec = SpecBuilder::default()
        .version("1.0.2-dev")
        .root(
            RootBuilder::default()
                .path(input.rootfs)
                .readonly(sc.readonly_rootfs)
                .build()
                .map_err(oci_error("root"))?,
        )
        .mounts(mounts)
        .process(process)
        .annotations(annotations(input))
        .linux(linux)
        .build()
        .map_err(oci_error("spec"))?;
    spec.set_hostname(None);
    spec.set_domainname(None);
    spec.set_hooks(None);
    Ok(spec)
}
