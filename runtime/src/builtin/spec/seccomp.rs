//! Seccomp: the `RuntimeDefault` profile, `Localhost` profiles, and when there is none.
//!
//! * no profile in the request, or `Unconfined`: no seccomp (CRI: "nil is unconfined");
//! * privileged: no seccomp whatever the request says, like containerd (the upstream CRI
//!   validation suite expects a privileged container to ignore a Localhost profile);
//! * `Localhost`: the OCI `LinuxSeccomp` JSON at `localhost_ref` (an absolute host path);
//! * `RuntimeDefault`: [`runtime_default_seccomp`];
//! * the deprecated `seccomp_profile_path` (what older clients, critest 1.26 among them, still
//!   send) when `seccomp` is absent: `unconfined`, `runtime/default` or `docker/default`, and
//!   `localhost/<absolute path>`, as containerd reads it.
//!
//! The default profile is a deny list over an allow-by-default filter, not containerd's
//! allow list: it returns `EPERM` for the syscalls Docker's default profile keeps from an
//! ordinary container: kernel modules, kexec, reboot, swap, mounting and namespace
//! manipulation, keyrings, BPF, perf, ptrace and other process inspection, clock setting,
//! accounting, raw I/O ports, obsolete syscalls, io_uring. As in Docker, most of them are
//! allowed when the container holds the capability that governs them (e.g. CAP_SYS_ADMIN
//! allows mount and unshare); `clone` creating namespaces is refused without CAP_SYS_ADMIN by
//! flag checks, and `clone3`, whose flags a filter cannot read, fails with `ENOSYS` so that
//! the C library falls back to `clone`. Syscalls unknown to the running kernel or libseccomp
//! are skipped by libcontainer.

use std::io::Read;

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompOperator,
    LinuxSyscall,
};

use super::caps::Caps;
use super::invalid;
use crate::{Result, cri};

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// Syscalls refused unless the container has one of the capabilities (none: always refused).
const BLOCKED: &[(&[&str], &[&str])] = &[
    (
        &[
            "add_key",
            "keyctl",
            "request_key",
            "nfsservctl",
            "get_kernel_syms",
            "query_module",
            "create_module",
            "uselib",
            "ustat",
            "sysfs",
            "_sysctl",
            "vm86",
            "vm86old",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
        ],
        &[],
    ),
    (
        &[
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "unshare",
            "setns",
            "sethostname",
            "setdomainname",
            "swapon",
            "swapoff",
            "quotactl",
            "quotactl_fd",
            "fanotify_init",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "name_to_handle_at",
            "lookup_dcookie",
        ],
        &["CAP_SYS_ADMIN"],
    ),
    (&["bpf"], &["CAP_SYS_ADMIN", "CAP_BPF"]),
    (&["perf_event_open"], &["CAP_SYS_ADMIN", "CAP_PERFMON"]),
    (
        &["init_module", "finit_module", "delete_module"],
        &["CAP_SYS_MODULE"],
    ),
    (
        &["reboot", "kexec_load", "kexec_file_load"],
        &["CAP_SYS_BOOT"],
    ),
    (
        &[
            "settimeofday",
            "stime",
            "clock_settime",
            "clock_settime64",
            "clock_adjtime",
            "clock_adjtime64",
        ],
        &["CAP_SYS_TIME"],
    ),
    (
        &[
            "ptrace",
            "kcmp",
            "process_vm_readv",
            "process_vm_writev",
            "pidfd_getfd",
            "userfaultfd",
        ],
        &["CAP_SYS_PTRACE"],
    ),
    (&["iopl", "ioperm"], &["CAP_SYS_RAWIO"]),
    (&["acct"], &["CAP_SYS_PACCT"]),
    (&["syslog"], &["CAP_SYSLOG"]),
    (&["open_by_handle_at"], &["CAP_DAC_READ_SEARCH"]),
];

/// The `clone` flags that create namespaces: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
/// NEWPID, NEWNET.
const CLONE_NAMESPACE_FLAGS: [u64; 7] = [
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// The ABIs the filter covers: the native one and the 32-bit ones a 64-bit kernel also runs
/// (a syscall from an ABI the filter does not list would kill the process).
fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else {
        vec![Arch::ScmpArchNative]
    }
}

fn errno(names: &[&str], errno: u32) -> LinuxSyscall {
    let mut s = LinuxSyscall::default();
    s.set_names(names.iter().map(|n| n.to_string()).collect());
    s.set_action(LinuxSeccompAction::ScmpActErrno);
    s.set_errno_ret(Some(errno));
    s
}

/// The `RuntimeDefault` profile for a container with the given capabilities
/// (`CAP_`-prefixed names).
pub fn runtime_default_seccomp<S: AsRef<str>>(capabilities: &[S]) -> LinuxSeccomp {
    let has = |cap: &str| capabilities.iter().any(|c| c.as_ref() == cap);
    let mut syscalls = Vec::new();
    for (names, unless) in BLOCKED {
        if !unless.iter().any(|c| has(c)) {
            syscalls.push(errno(names, EPERM));
        }
    }
    if !has("CAP_SYS_ADMIN") {
        syscalls.push(errno(&["clone3"], ENOSYS));
        for flag in CLONE_NAMESPACE_FLAGS {
            let arg = LinuxSeccompArgBuilder::default()
                .index(0usize)
                .value(flag)
                .value_two(flag)
                .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                .build();
            let mut rule = errno(&["clone"], EPERM);
            rule.set_args(arg.ok().map(|a| vec![a]));
            syscalls.push(rule);
        }
    }
    let mut profile = LinuxSeccomp::default();
    profile.set_default_action(LinuxSeccompAction::ScmpActAllow);
    profile.set_architectures(Some(architectures()));
    profile.set_syscalls(Some(syscalls));
    profile
}

/// Reads a Localhost profile.
fn localhost(path: &str) -> Result<LinuxSeccomp> {
    if path.is_empty() {
        return Err(invalid(
            "seccomp profile type Localhost needs a localhost_ref",
        ));
    }
    if !path.starts_with('/') || path.contains('\0') {
        return Err(invalid(format!(
            "seccomp localhost_ref {path:?} must be an absolute path"
        )));
    }
    let meta =
        std::fs::metadata(path).map_err(|e| invalid(format!("seccomp profile {path:?}: {e}")))?;
    if !meta.is_file() {
        return Err(invalid(format!(
            "seccomp profile {path:?} is not a regular file"
        )));
    }
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(16 << 20).read_to_end(&mut buf))
        .map_err(|e| invalid(format!("seccomp profile {path:?}: {e}")))?;
    serde_json::from_slice::<LinuxSeccomp>(&buf).map_err(|e| {
        invalid(format!(
            "seccomp profile {path:?} is not an OCI seccomp profile: {e}"
        ))
    })
}

/// The profile named by the deprecated `seccomp_profile_path` field; `None` when it is empty.
pub(super) fn profile_from_path(path: &str) -> Result<Option<cri::SecurityProfile>> {
    use cri::security_profile::ProfileType;
    let profile = |t: ProfileType, localhost_ref: &str| cri::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: localhost_ref.to_string(),
    };
    Ok(Some(match path {
        "" => return Ok(None),
        "unconfined" => profile(ProfileType::Unconfined, ""),
        "runtime/default" | "docker/default" => profile(ProfileType::RuntimeDefault, ""),
        _ => match path.strip_prefix("localhost/") {
            Some(file) => profile(ProfileType::Localhost, file),
            None => {
                return Err(invalid(format!(
                    "seccomp profile path {path:?}: expected unconfined, runtime/default, \
                     docker/default or localhost/<path>"
                )));
            }
        },
    }))
}

/// The seccomp filter a container's security context asks for: its `seccomp` profile or, from
/// older clients (critest 1.26 among them) that still send only it, the deprecated
/// `seccomp_profile_path`.
pub(super) fn of_context(
    sc: &cri::LinuxContainerSecurityContext,
    caps: &Caps,
) -> Result<Option<LinuxSeccomp>> {
    #[allow(deprecated)]
    let deprecated_path = sc.seccomp_profile_path.as_str();
    let deprecated = match &sc.seccomp {
        Some(_) => None,
        None => profile_from_path(deprecated_path)?,
    };
    let profile = sc.seccomp.as_ref().or(deprecated.as_ref());
    seccomp(profile, sc.privileged, caps)
}

/// The seccomp filter of a container, if any.
pub(super) fn seccomp(
    profile: Option<&cri::SecurityProfile>,
    privileged: bool,
    caps: &Caps,
) -> Result<Option<LinuxSeccomp>> {
    use cri::security_profile::ProfileType;
    let Some(p) = profile.filter(|_| !privileged) else {
        return Ok(None);
    };
    match ProfileType::try_from(p.profile_type) {
        Ok(ProfileType::Unconfined) => Ok(None),
        Ok(ProfileType::RuntimeDefault) => {
            let names: Vec<&str> = caps.set.iter().copied().collect();
            Ok(Some(runtime_default_seccomp(&names)))
        }
        Ok(ProfileType::Localhost) => localhost(&p.localhost_ref).map(Some),
        Err(_) => Err(invalid(format!(
            "unknown seccomp profile type {}",
            p.profile_type
        ))),
    }
}
