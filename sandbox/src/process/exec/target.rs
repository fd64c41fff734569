//! What an exec needs of a container, gathered at its first exec: descriptors of its
//! namespaces and of the files that move a process into its cgroups, its OCI process, and its
//! seccomp filter compiled ([`Program`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use oci_spec::runtime::{
    Capability, LinuxCapabilities, LinuxNamespaceType, LinuxSeccomp, Process, Spec,
};

use super::super::containers::{Ctr, internal};
use super::seccomp::Program;
use crate::{Error, Kind, Result};

/// What an exec in one running container needs, gathered at its first exec from its OCI spec
/// and its init's `/proc` entries, and kept until the container exits.
pub struct Target {
    /// The container's PID namespace, when it has one: the exec is forked into it.
    pub(super) pid_ns: Option<OwnedFd>,
    /// Its user namespace, joined before the others.
    pub(super) user_ns: Option<OwnedFd>,
    /// Its other namespaces, joined in this order (the mount namespace last).
    pub(super) namespaces: Vec<(CloneFlags, OwnedFd)>,
    /// The file moving a process into each of its cgroups: `cgroup.procs` on cgroup v2, `tasks`
    /// of each hierarchy on v1 (see [`cgroup_procs`]).
    pub(super) cgroups: Vec<OwnedFd>,
    /// Its OCI process: user, groups, capabilities, rlimits, no_new_privs, working directory.
    pub(super) process: Process,
    pub(super) env: Vec<CString>,
    /// The `PATH` of its environment, where a command without a slash is looked up.
    pub(super) path_var: Option<String>,
    pub(super) seccomp: Option<LinuxSeccomp>,
    /// That filter compiled once, when the kernel allows reading it back ([`Program`]); an
    /// exec without it compiles the filter itself.
    pub(super) seccomp_program: Option<Program>,
    /// The exec holds CAP_SYS_ADMIN until its seccomp filter is loaded (see [`lends_sys_admin`]).
    pub(super) lend_sys_admin: bool,
}

impl Target {
    /// Gathers what an exec in `c` (running, its init alive) needs.
    pub fn open(c: &Ctr) -> Result<Target> {
        let id = &c.status.id;
        let config = c.bundle.join("config.json");
        let oci = Spec::load(&config)
            .map_err(|e| internal(&format!("loading the OCI spec of container {id}"), e))?;
        let process = oci.process().clone().ok_or_else(|| {
            Error::new(
                Kind::InvalidArgument,
                format!("the OCI spec of container {id} has no process"),
            )
        })?;
        if process
            .selinux_label()
            .as_deref()
            .is_some_and(|l| !l.is_empty())
        {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!(
                    "container {id} has an SELinux label, which this runtime cannot apply to an exec"
                ),
            ));
        }
        let pid = c.status.pid;
        let (mut pid_ns, mut user_ns, mut namespaces) = (None, None, Vec::new());
        let listed = oci.linux().as_ref().and_then(|l| l.namespaces().as_ref());
        for ns in listed.into_iter().flatten() {
            let typ = ns.typ();
            let path = format!("/proc/{pid}/ns/{}", namespace_file(typ));
            let fd: OwnedFd = std::fs::File::open(&path)
                .map_err(|e| Error::io("opening", Path::new(&path), e))?
                .into();
            match typ {
                LinuxNamespaceType::Pid => pid_ns = Some(fd),
                LinuxNamespaceType::User => user_ns = Some(fd),
                _ => namespaces.push((CloneFlags::from_bits_retain(typ as i32), fd)),
            }
        }
        // Stable: the others keep the spec's order.
        namespaces.sort_by_key(|(flag, _)| *flag == CloneFlags::CLONE_NEWNS);
        let env = process
            .env()
            .iter()
            .flatten()
            .filter_map(|v| CString::new(v.as_bytes()).ok())
            .collect();
        let path_var = process
            .env()
            .iter()
            .flatten()
            .rev()
            .find_map(|v| v.strip_prefix("PATH="))
            .map(str::to_string);
        let seccomp = oci.linux().as_ref().and_then(|l| l.seccomp().clone());
        let seccomp_program = seccomp.as_ref().and_then(Program::compile);
        Ok(Target {
            pid_ns,
            user_ns,
            namespaces,
            cgroups: cgroup_procs(pid)?,
            lend_sys_admin: lends_sys_admin(&process, seccomp.is_some()),
            process,
            env,
            path_var,
            seccomp,
            seccomp_program,
        })
    }
}

/// A namespace's file under `/proc/<pid>/ns`.
fn namespace_file(typ: LinuxNamespaceType) -> &'static str {
    match typ {
        LinuxNamespaceType::Mount => "mnt",
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::Network => "net",
        LinuxNamespaceType::Time => "time",
    }
}

/// Opens the file that moves a process into each cgroup `pid` is in that this process is not
/// in too (a child starts in this process's cgroups), through this process's cgroup mounts: the
/// unified hierarchy, and each v1 hierarchy with controllers (named ones such as `name=systemd`
/// hold no container: libcontainer moves its processes into none of them). Writing `0` to each
/// moves the writer. On v1 that file is `tasks`, which moves the writing thread alone: the
/// exec's child is a single thread, and the kernel then skips the lock that keeps thread groups
/// still during a move (a per-CPU semaphore whose write side waits for an RCU grace period, a
/// wait of milliseconds on every exec). On v2 a thread cannot leave its domain, so it is
/// `cgroup.procs`.
fn cgroup_procs(pid: i32) -> Result<Vec<OwnedFd>> {
    let read = |p: procfs::ProcResult<procfs::process::Process>| {
        p.and_then(|p| p.cgroups())
            .map_err(|e| internal(&format!("reading the cgroups of process {pid}"), e))
    };
    let groups = read(procfs::process::Process::new(pid))?;
    let own = read(procfs::process::Process::myself())?;
    let mounts = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(|e| internal("reading the mount table", e))?;
    let mut out = Vec::new();
    for g in groups.0 {
        if own
            .0
            .iter()
            .any(|o| o.hierarchy == g.hierarchy && o.pathname == g.pathname)
        {
            continue;
        }
        let v2 = g.controllers.is_empty() && g.hierarchy == 0;
        let mount = if v2 {
            mounts.0.iter().find(|m| m.fs_type == "cgroup2")
        } else if g.controllers.is_empty() || g.controllers.iter().any(|c| c.starts_with("name=")) {
            continue;
        } else {
            mounts.0.iter().find(|m| {
                m.fs_type == "cgroup"
                    && g.controllers
                        .iter()
                        .all(|c| m.super_options.contains_key(c))
            })
        };
        // A hierarchy not mounted here has nothing to join.
        let Some(m) = mount else { continue };
        let rel = Path::new(&g.pathname).strip_prefix(&m.root).map_err(|_| {
            internal(
                &format!("joining cgroup {}", g.pathname),
                format!(
                    "outside the mount of its hierarchy at {}",
                    m.mount_point.display()
                ),
            )
        })?;
        let file: PathBuf = m
            .mount_point
            .join(rel)
            .join(if v2 { "cgroup.procs" } else { "tasks" });
        let fd = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .map_err(|e| Error::io("opening", &file, e))?;
        out.push(fd.into());
    }
    Ok(out)
}

/// Whether an exec of `process` holds CAP_SYS_ADMIN until its seccomp filter is loaded: the
/// kernel loads a filter only for a process with no_new_privs or CAP_SYS_ADMIN, and runc loads
/// it before the last capabilities are dropped. A process without either gets CAP_SYS_ADMIN
/// added to its effective and permitted sets for that moment (never to the bounding set), and
/// its exact sets once the filter is in.
fn lends_sys_admin(process: &Process, seccomp: bool) -> bool {
    let has_admin = process
        .capabilities()
        .as_ref()
        .and_then(|c| c.effective().as_ref())
        .is_some_and(|e| e.contains(&Capability::SysAdmin));
    seccomp && process.no_new_privileges() != Some(true) && !has_admin
}

/// The container's capability sets with CAP_SYS_ADMIN added to the effective and permitted
/// ones (not the bounding set).
pub(super) fn with_sys_admin(original: &LinuxCapabilities) -> LinuxCapabilities {
    let with_admin = |set: &Option<HashSet<Capability>>| {
        let mut set = set.clone().unwrap_or_default();
        set.insert(Capability::SysAdmin);
        Some(set)
    };
    let mut raised = LinuxCapabilities::default();
    raised.set_bounding(original.bounding().clone());
    raised.set_effective(with_admin(original.effective()));
    raised.set_permitted(with_admin(original.permitted()));
    raised.set_inheritable(None);
    raised.set_ambient(None);
    raised
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxCapabilitiesBuilder, ProcessBuilder};

    use super::*;

    fn process(nnp: Option<bool>, effective: &[Capability]) -> Process {
        let set: HashSet<Capability> = effective.iter().copied().collect();
        let mut process = ProcessBuilder::default()
            .args(vec!["sleep".to_string(), "600".to_string()])
            .capabilities(
                LinuxCapabilitiesBuilder::default()
                    .bounding(set.clone())
                    .effective(set.clone())
                    .permitted(set)
                    .inheritable(HashSet::new())
                    .ambient(HashSet::new())
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        process.set_no_new_privileges(nnp);
        process
    }

    #[test]
    fn sys_admin_is_lent_only_to_load_a_filter_that_needs_it() {
        // A filter, no no_new_privs, no CAP_SYS_ADMIN: lent.
        assert!(lends_sys_admin(&process(None, &[Capability::Chown]), true));
        assert!(lends_sys_admin(
            &process(Some(false), &[Capability::Chown]),
            true
        ));
        // No filter; no_new_privs; CAP_SYS_ADMIN already: nothing lent.
        assert!(!lends_sys_admin(
            &process(None, &[Capability::Chown]),
            false
        ));
        assert!(!lends_sys_admin(
            &process(Some(true), &[Capability::Chown]),
            true
        ));
        assert!(!lends_sys_admin(
            &process(None, &[Capability::SysAdmin]),
            true
        ));
    }

    #[test]
    fn lent_sys_admin_never_reaches_the_bounding_set() {
        let original = process(None, &[Capability::Chown])
            .capabilities()
            .clone()
            .unwrap();
        let raised = with_sys_admin(&original);
        for set in [raised.effective(), raised.permitted()] {
            let set = set.as_ref().unwrap();
            assert!(set.contains(&Capability::SysAdmin) && set.contains(&Capability::Chown));
        }
        assert_eq!(raised.bounding(), original.bounding());
        assert!(
            !raised
                .bounding()
                .as_ref()
                .unwrap()
                .contains(&Capability::SysAdmin)
        );
    }

    #[test]
    fn namespaces_are_named_as_proc_names_them() {
        for (typ, file) in [
            (LinuxNamespaceType::Mount, "mnt"),
            (LinuxNamespaceType::Network, "net"),
            (LinuxNamespaceType::Pid, "pid"),
            (LinuxNamespaceType::Ipc, "ipc"),
            (LinuxNamespaceType::Uts, "uts"),
            (LinuxNamespaceType::User, "user"),
            (LinuxNamespaceType::Cgroup, "cgroup"),
            (LinuxNamespaceType::Time, "time"),
        ] {
            assert_eq!(namespace_file(typ), file);
            assert!(
                Path::new("/proc/self/ns").join(file).exists(),
                "{file} in /proc/self/ns"
            );
        }
        // The spec's type is the clone flag setns takes.
        assert_eq!(
            CloneFlags::from_bits_retain(LinuxNamespaceType::Mount as i32),
            CloneFlags::CLONE_NEWNS
        );
        assert_eq!(
            CloneFlags::from_bits_retain(LinuxNamespaceType::Network as i32),
            CloneFlags::CLONE_NEWNET
        );
    }

    #[test]
    fn a_fork_joins_only_the_cgroups_it_is_not_in() {
        // This process's own cgroups: a fork is in every one of them already.
        let fds = cgroup_procs(std::process::id() as i32).expect("cgroup.procs");
        assert!(fds.is_empty());
    }
}
