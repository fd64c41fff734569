//! Exec in a running container: a process started in the container's namespaces and cgroup
//! through libcontainer's tenant builder, with pipes (ExecSync), the caller's descriptors, or a
//! terminal made in the container, and the container's seccomp filter applied last.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;

use libcontainer::capabilities::drop_privileges;
use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::seccomp::initialize_seccomp;
use libcontainer::syscall::syscall::{SyscallType, create_syscall};
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::Pid;
use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxSeccomp, Process, Spec};

use super::containers::{Ctr, internal, lc_error, output_pipe};
use super::ns::pidfd_open;
use crate::spec::{Layout, State};
use crate::{Error, Kind, Result};

/// A running exec and what it has written so far.
pub struct Exec {
    pub pid: Pid,
    pub container_id: String,
    pub out: [Option<OwnedFd>; 2],
    pub buf: [Vec<u8>; 2],
    pub pidfd: Option<OwnedFd>,
    pub deadline: Option<std::time::Instant>,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
}

/// Where an exec's stdio goes.
pub enum ExecIo {
    /// Pipes whose output the server collects (ExecSync).
    Capture,
    /// The caller's descriptors: stdin, stdout, stderr.
    Fds([OwnedFd; 3]),
    /// A new terminal made inside the container; its master side is returned.
    Tty,
}

/// Starts a process in a running container. With [`ExecIo::Capture`] the server collects its
/// output; with [`ExecIo::Tty`] the terminal's master side comes back with it.
///
/// The process is the container's own OCI process with the exec's arguments, as containerd
/// execs it: same user and groups, working directory, environment, capabilities,
/// no_new_privs and rlimits. The container's seccomp filter is loaded too ([`ExecSeccomp`]):
/// libcontainer's exec builds a `linux` section of its own without it.
pub fn exec(
    layout: &Layout,
    c: &Ctr,
    args: &[String],
    timeout_ms: u64,
    io: ExecIo,
) -> Result<(Exec, Option<OwnedFd>)> {
    if c.status.state != State::Running {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!("container {} is not running", c.status.id),
        ));
    }
    if args.is_empty() {
        return Err(Error::new(Kind::InvalidArgument, "exec needs a command"));
    }
    let state_dir = layout.container_root().join(&c.status.id);
    let container =
        Container::load(state_dir.clone()).map_err(|e| lc_error("loading", &c.status.id, e))?;
    let config = container.bundle().join("config.json");
    let oci = Spec::load(&config).map_err(|e| {
        internal(
            &format!("loading the OCI spec of container {}", c.status.id),
            e,
        )
    })?;
    let tty = matches!(io, ExecIo::Tty);
    let (process, executor) = exec_process(&oci, args, tty)?;
    let process_file = state_dir.join("exec-process.json");
    let text = serde_json::to_vec(&process)?;
    std::fs::write(&process_file, text).map_err(|e| Error::io("writing", &process_file, e))?;
    let console_path = layout.console_socket();
    // Bound (and handed to libcontainer) through its directory when too long for sun_path;
    // alive until the exec's process exists (see `sockpath`).
    let console_short = match io {
        ExecIo::Tty => Some(
            crate::sockpath::SocketPath::new(&console_path)
                .map_err(|e| Error::io("binding", &console_path, e))?,
        ),
        _ => None,
    };
    let console = console_short
        .as_ref()
        .map_or(console_path.clone(), |s| s.path().to_path_buf());
    let mut out = [None, None];
    let mut console_listener = None;
    let built = ContainerBuilder::new(c.status.id.clone(), SyscallType::default())
        .with_root_path(layout.container_root())
        .map_err(|e| lc_error("exec in", &c.status.id, e))
        .and_then(|b| {
            let b = match io {
                ExecIo::Capture => {
                    let (out_r, out_w) = output_pipe()?;
                    let (err_r, err_w) = output_pipe()?;
                    out = [Some(out_r), Some(err_r)];
                    b.with_stdout(out_w).with_stderr(err_w)
                }
                ExecIo::Fds([i, o, e]) => b.with_stdin(i).with_stdout(o).with_stderr(e),
                ExecIo::Tty => {
                    let _ = std::fs::remove_file(&console_path);
                    let l = UnixListener::bind(&console)
                        .map_err(|e| Error::io("binding", &console_path, e))?;
                    console_listener = Some(l);
                    b.with_console_socket(Some(&console))
                }
            };
            b.with_executor(executor)
                .as_tenant()
                .with_process(Some(&process_file))
                .with_detach(true)
                .build()
                .map_err(|e| {
                    Error::new(
                        Kind::Internal,
                        format!("exec {args:?} in container {}: {e}", c.status.id),
                    )
                })
        });
    let _ = std::fs::remove_file(&process_file);
    let master = match console_listener {
        Some(l) => {
            let _ = std::fs::remove_file(&console_path);
            match &built {
                Ok(_) => Some(receive_master(&l)?),
                Err(_) => None,
            }
        }
        None => None,
    };
    let pid = built?;
    let deadline = (timeout_ms > 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms));
    let exec = Exec {
        pid,
        container_id: c.status.id.clone(),
        out,
        buf: [Vec::new(), Vec::new()],
        pidfd: pidfd_open(pid).ok(),
        deadline,
        exit_code: None,
        timed_out: false,
    };
    Ok((exec, master))
}

/// The terminal master libcontainer sends to the console socket while starting a terminal exec.
pub(super) fn receive_master(listener: &UnixListener) -> Result<OwnedFd> {
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(5000u16)).map_err(|e| internal("poll", e))?;
    if ready == 0 {
        return Err(internal(
            "terminal exec",
            "no terminal came back from the container",
        ));
    }
    let (conn, _) = listener
        .accept()
        .map_err(|e| internal("accepting the console socket", e))?;
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let mut buf = [0u8; 4096];
    let mut fds = Vec::new();
    loop {
        let n = crate::fdpass::recv(&conn, &mut buf, &mut fds)
            .map_err(|e| internal("receiving the terminal", e))?;
        if let Some(fd) = fds.pop() {
            return Ok(fd);
        }
        if n == 0 {
            return Err(internal(
                "terminal exec",
                "the console socket closed without a terminal",
            ));
        }
    }
}

/// The process of an exec in a container whose OCI spec is `oci`, and the executor that
/// confines it with the container's seccomp filter.
///
/// The kernel loads a filter only for a process with no_new_privs or CAP_SYS_ADMIN, and the
/// executor runs after libcontainer dropped the capabilities. runc loads the filter before
/// dropping them; to do the same here, a container process without no_new_privs and without
/// CAP_SYS_ADMIN gets CAP_SYS_ADMIN in its permitted set only (never bounding or effective),
/// and the executor raises it, loads the filter and restores the container's exact sets before
/// exec'ing the command.
fn exec_process(oci: &Spec, args: &[String], tty: bool) -> Result<(Process, ExecSeccomp)> {
    let mut process = oci.process().clone().ok_or_else(|| {
        Error::new(
            Kind::InvalidArgument,
            "the container's OCI spec has no process",
        )
    })?;
    process.set_args(Some(args.to_vec()));
    process.set_terminal(Some(tty));
    process.set_console_size(None);
    let seccomp = oci.linux().as_ref().and_then(|l| l.seccomp().clone());
    let caps = process.capabilities().clone();
    // A container in the pod's user namespace: libcontainer's exec joins all its namespaces but
    // that one, so the executor joins it (see `ExecSeccomp::exec`), with CAP_SYS_ADMIN lent.
    let userns = match user_namespace_path(oci) {
        Some(path) => Some(std::sync::Arc::new(
            std::fs::File::open(&path).map_err(|e| Error::io("opening", &path, e))?,
        )),
        None => None,
    };
    let has_admin = caps
        .as_ref()
        .and_then(|c| c.effective().as_ref())
        .is_some_and(|e| e.contains(&Capability::SysAdmin));
    let lend_sys_admin = userns.is_some()
        || (seccomp.is_some() && process.no_new_privileges() != Some(true) && !has_admin);
    let restore = if lend_sys_admin {
        let original = caps.clone().unwrap_or_default();
        let mut lent = original.clone();
        let mut permitted = lent.permitted().clone().unwrap_or_default();
        permitted.insert(Capability::SysAdmin);
        lent.set_permitted(Some(permitted));
        process.set_capabilities(Some(lent));
        Some(original)
    } else {
        None
    };
    let user = userns.as_ref().map(|_| {
        let u = process.user();
        (
            u.uid(),
            u.gid(),
            u.additional_gids().clone().unwrap_or_default(),
        )
    });
    Ok((
        process,
        ExecSeccomp {
            seccomp,
            restore,
            userns,
            user,
        },
    ))
}

/// The user namespace a container joined, from its OCI spec.
fn user_namespace_path(oci: &Spec) -> Option<std::path::PathBuf> {
    oci.linux()
        .as_ref()?
        .namespaces()
        .as_ref()?
        .iter()
        .find(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::User)
        .and_then(|n| n.path().clone())
}

/// The container's capability sets with CAP_SYS_ADMIN added to the effective and permitted
/// ones (not the bounding set): what an exec needs for a moment to load a seccomp filter or to
/// join a user namespace.
fn with_sys_admin(original: &LinuxCapabilities) -> LinuxCapabilities {
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

/// Runs an exec'd command under its container's seccomp filter (see [`exec_process`]).
#[derive(Clone)]
struct ExecSeccomp {
    seccomp: Option<LinuxSeccomp>,
    /// The container's capabilities, restored after CAP_SYS_ADMIN was lent to load the filter
    /// or join the user namespace; `None` when nothing was lent.
    restore: Option<LinuxCapabilities>,
    /// The container's user namespace, joined before anything else when it has one.
    userns: Option<std::sync::Arc<std::fs::File>>,
    /// The process's uid, gid and groups, taken again inside that namespace.
    user: Option<(u32, u32, Vec<u32>)>,
}

impl Executor for ExecSeccomp {
    fn exec(&self, spec: &Spec) -> std::result::Result<(), ExecutorError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            ExecutorError::Other(format!("exec: {what}: {e}"))
        };
        let syscall = create_syscall();
        let raise = |original: &LinuxCapabilities| {
            drop_privileges(&with_sys_admin(original), &*syscall)
                .map_err(|e| failed("raising CAP_SYS_ADMIN", &e))
        };
        if let Some(original) = &self.restore {
            raise(original)?;
        }
        if let (Some(ns), Some((uid, gid, groups)), Some(original)) =
            (&self.userns, &self.user, &self.restore)
        {
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWUSER)
                .map_err(|e| failed("joining the user namespace", &e))?;
            // Full capabilities in the namespace now; become the process's user there, keeping
            // them (KEEPCAPS) until the container's own sets are restored below.
            nix::sys::prctl::set_keepcaps(true).map_err(|e| failed("keeping capabilities", &e))?;
            let gids: Vec<nix::unistd::Gid> = groups
                .iter()
                .map(|&g| nix::unistd::Gid::from_raw(g))
                .collect();
            nix::unistd::setgroups(&gids).map_err(|e| failed("setting the groups", &e))?;
            let (g, u) = (
                nix::unistd::Gid::from_raw(*gid),
                nix::unistd::Uid::from_raw(*uid),
            );
            nix::unistd::setresgid(g, g, g).map_err(|e| failed("setting the gid", &e))?;
            nix::unistd::setresuid(u, u, u).map_err(|e| failed("setting the uid", &e))?;
            let _ = nix::sys::prctl::set_keepcaps(false);
            raise(original)?;
        }
        if let Some(filter) = &self.seccomp {
            let notify =
                initialize_seccomp(filter).map_err(|e| failed("loading the seccomp filter", &e))?;
            if let Some(fd) = notify {
                // Nobody listens for an exec's notifications; the kernel answers ENOSYS.
                let _ = nix::unistd::close(fd);
            }
        }
        if let Some(original) = &self.restore {
            drop_privileges(original, &*syscall)
                .map_err(|e| failed("restoring the capabilities", &e))?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> std::result::Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> std::result::Result<(), ExecutorSetEnvsError> {
        DefaultExecutor {}.setup_envs(envs)
    }
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxBuilder, LinuxCapabilitiesBuilder, ProcessBuilder, UserBuilder};

    use std::path::Path;

    use super::*;

    fn spec(nnp: Option<bool>, effective: &[Capability], seccomp: bool) -> Spec {
        let set: HashSet<Capability> = effective.iter().copied().collect();
        let mut process = ProcessBuilder::default()
            .args(vec!["sleep".to_string(), "600".to_string()])
            .cwd("/work")
            .env(vec!["A=b".to_string()])
            .user(
                UserBuilder::default()
                    .uid(65534u32)
                    .gid(65534u32)
                    .additional_gids(vec![1234u32])
                    .build()
                    .unwrap(),
            )
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
            .terminal(true)
            .build()
            .unwrap();
        process.set_no_new_privileges(nnp);
        let mut linux = LinuxBuilder::default().build().unwrap();
        linux.set_seccomp(seccomp.then(LinuxSeccomp::default));
        let mut spec = Spec::default();
        spec.set_process(Some(process)).set_linux(Some(linux));
        spec
    }

    fn args() -> Vec<String> {
        vec!["id".to_string(), "-u".to_string()]
    }

    #[test]
    fn exec_runs_the_containers_process_with_other_args() {
        let oci = spec(None, &[Capability::Chown], false);
        let (p, executor) = exec_process(&oci, &args(), false).unwrap();
        assert_eq!(p.args().as_deref(), Some(&args()[..]));
        assert_eq!(p.terminal(), Some(false));
        assert_eq!((p.user().uid(), p.user().gid()), (65534, 65534));
        assert_eq!(p.user().additional_gids().as_deref(), Some(&[1234u32][..]));
        assert_eq!(p.cwd(), Path::new("/work"));
        assert_eq!(p.env().as_deref(), Some(&["A=b".to_string()][..]));
        assert_eq!(
            p.capabilities(),
            oci.process().as_ref().unwrap().capabilities()
        );
        assert!(executor.seccomp.is_none() && executor.restore.is_none());
    }

    #[test]
    fn exec_seccomp_lends_sys_admin_only_when_needed() {
        // A filter, no no_new_privs, no CAP_SYS_ADMIN: lent in permitted, never effective or
        // bounding, and the original sets are restored.
        let oci = spec(None, &[Capability::Chown], true);
        let (p, executor) = exec_process(&oci, &args(), false).unwrap();
        assert!(executor.seccomp.is_some());
        let caps = p.capabilities().clone().unwrap();
        assert!(
            caps.permitted()
                .as_ref()
                .unwrap()
                .contains(&Capability::SysAdmin)
        );
        assert!(
            !caps
                .effective()
                .as_ref()
                .unwrap()
                .contains(&Capability::SysAdmin)
        );
        assert!(
            !caps
                .bounding()
                .as_ref()
                .unwrap()
                .contains(&Capability::SysAdmin)
        );
        assert_eq!(
            executor.restore.as_ref(),
            oci.process().as_ref().unwrap().capabilities().as_ref()
        );
        // With no_new_privs, or CAP_SYS_ADMIN already, nothing is lent.
        for oci in [
            spec(Some(true), &[Capability::Chown], true),
            spec(None, &[Capability::SysAdmin], true),
        ] {
            let (p, executor) = exec_process(&oci, &args(), false).unwrap();
            assert!(executor.seccomp.is_some() && executor.restore.is_none());
            assert_eq!(
                p.capabilities(),
                oci.process().as_ref().unwrap().capabilities()
            );
        }
    }
}
