//! Exec in a running container: the sandbox process starts the exec's process straight into the
//! container, as a vfork-style child (sharing the sandbox's memory until it executes the
//! command, so no page table is copied). The child lands in the container's PID namespace (the
//! sandbox points its children's PID namespace there for the clone and back), joins the container's
//! cgroups and its other namespaces (the user namespace first, the mount namespace last),
//! takes a terminal made in the container or the given stdio, becomes the container's user
//! with its groups, rlimits, capabilities, no_new_privs and seccomp filter, changes to its
//! working directory and executes the command with the container's environment: the
//! container's own OCI process with other arguments, as containerd execs it.
//!
//! What this needs of a container (descriptors of its namespaces and of the files that move a
//! process into its cgroups, its OCI process) is gathered at its first exec and kept until it exits
//! ([`Target`]), so an exec costs one clone and the command's own exec. libcontainer's tenant
//! builder, used before, loaded the container's state and OCI spec from disk for every exec,
//! wrote a process file, forked an intermediate and an init process and, on cgroup v1, parsed
//! the mount table once per controller: about 12 ms of CPU per exec probe (docs/BENCHMARKS.md).
//!
//! A command that cannot be executed (not found, not executable, no interpreter) is the exec's
//! error, in runc's words, reported by the child on a close-on-exec pipe as the container's own
//! start reports it ([`payload`](super::payload)).
#![allow(unsafe_code)] // clone, fork, ptrace, _exit, the id, seccomp and close_range system calls and the TIOCSCTTY ioctl in the child

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use libcontainer::capabilities::{drop_privileges, reset_effective};
use libcontainer::seccomp::initialize_seccomp;
use libcontainer::syscall::syscall::create_syscall;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::unistd::{Pid, pipe2};

use super::containers::{Ctr, internal, output_pipe, receive_terminal};
use super::ns::pidfd_open;
use super::payload::{self, errno_text, look_path};
use crate::spec::State;
use crate::{Error, Kind, Result};

mod seccomp;
mod target;
pub use target::Target;
use target::with_sys_admin;

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
    /// Pipes whose output the server collects (ExecSync); stdin is /dev/null.
    Capture,
    /// The caller's descriptors: stdin, stdout, stderr.
    Fds([OwnedFd; 3]),
    /// A new terminal made inside the container; its master side is returned.
    Tty,
}

/// The stdio a forked exec takes.
enum ChildIo {
    Files([OwnedFd; 3]),
    /// A terminal made in the container, its master sent back on this socket.
    Tty(OwnedFd),
}

/// Starts `args` in the running container `c`. With [`ExecIo::Capture`] the server collects its
/// output; with [`ExecIo::Tty`] the terminal's master side comes back with it.
pub fn exec(
    c: &mut Ctr,
    args: &[String],
    timeout_ms: u64,
    io: ExecIo,
) -> Result<(Exec, Option<OwnedFd>)> {
    let id = c.status.id.clone();
    if c.status.state != State::Running {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!("container {id} is not running"),
        ));
    }
    if args.is_empty() {
        return Err(Error::new(Kind::InvalidArgument, "exec needs a command"));
    }
    let argv = args
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| {
            Error::new(
                Kind::InvalidArgument,
                format!("exec {args:?}: an argument holds a NUL byte"),
            )
        })?;
    let target = match c.exec_target.take() {
        Some(t) => t,
        None => Box::new(Target::open(c)?),
    };
    let t = &**c.exec_target.insert(target);
    let (report_r, report_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", e))?;
    let mut out = [None, None];
    let mut tty = None;
    let child_io = match io {
        ExecIo::Capture => {
            let null = std::fs::File::open("/dev/null")
                .map_err(|e| Error::io("opening", Path::new("/dev/null"), e))?;
            let (out_r, out_w) = output_pipe()?;
            let (err_r, err_w) = output_pipe()?;
            out = [Some(out_r), Some(err_r)];
            ChildIo::Files([null.into(), out_w, err_w])
        }
        ExecIo::Fds(fds) => ChildIo::Files(fds),
        ExecIo::Tty => {
            let (ours, theirs) = socketpair(
                AddressFamily::Unix,
                SockType::Stream,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .map_err(|e| internal("socketpair", e))?;
            tty = Some(ours);
            ChildIo::Tty(theirs)
        }
    };
    if let Some(ns) = &t.pid_ns {
        nix::sched::setns(ns, CloneFlags::CLONE_NEWPID)
            .map_err(|e| internal(&format!("joining the PID namespace of container {id}"), e))?;
    }
    // The child shares this process's memory and this process waits until it has executed
    // its command or exited (vfork's semantics through clone): no page table is copied at the
    // start and none torn down at the exec, which was most of what an exec cost the sandbox
    // beyond the command itself. The child has its own descriptor table, working directory,
    // signal handlers and credentials (no CLONE_FILES, CLONE_FS, CLONE_SIGHAND), so what it
    // changes there stays its own; what it writes to memory (what it allocates) is this
    // process's, which is not running meanwhile, and the sandbox process is single-threaded.
    let (report, io, cmd) = (&report_w, &child_io, &argv);
    let child = Box::new(move || -> isize {
        let Err(why) = enter(t, cmd, io);
        let _ = nix::unistd::write(report, why.as_bytes());
        // SAFETY: ends the child without running anything of the sandbox's (no destructor,
        // no atexit handler: its memory is the sandbox's).
        unsafe { libc::_exit(payload::START_ERROR_EXIT_CODE) }
    });
    let cloned = CHILD_STACK.with_borrow_mut(|stack| {
        // SAFETY: the stack is this thread's own, used by one child at a time (this thread
        // waits for it); the callback never returns into the sandbox's code.
        unsafe {
            nix::sched::clone(
                child,
                stack,
                CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
                Some(libc::SIGCHLD),
            )
        }
    });
    if t.pid_ns.is_some() {
        restore_pid_namespace();
    }
    let pid = cloned.map_err(|e| internal("clone", e))?;
    drop(report_w);
    drop(child_io);
    if let Some(why) = payload::read_report(&report_r) {
        let _ = nix::sys::wait::waitpid(pid, None);
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("exec {args:?} in container {id}: {why}"),
        ));
    }
    let master = match &tty {
        Some(sock) => Some(receive_terminal(
            sock.as_fd(),
            "terminal exec",
            "the exec's process sent no terminal",
        )?),
        None => None,
    };
    let deadline = (timeout_ms > 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms));
    let exec = Exec {
        pid,
        container_id: id,
        out,
        buf: [Vec::new(), Vec::new()],
        pidfd: pidfd_open(pid).ok(),
        deadline,
        exit_code: None,
        timed_out: false,
    };
    Ok((exec, master))
}

/// Points this process's new children back to its own PID namespace after a fork into a
/// container's.
fn restore_pid_namespace() {
    static OWN: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    let own = OWN.get_or_init(|| {
        std::fs::File::open("/proc/self/ns/pid")
            .ok()
            .map(Into::into)
    });
    let restored = own
        .as_ref()
        .map(|fd| nix::sched::setns(fd, CloneFlags::CLONE_NEWPID));
    if !matches!(restored, Some(Ok(()))) {
        tracing::error!(
            "cannot point new children back to the sandbox's PID namespace: {restored:?}"
        );
    }
}

/// The forked child: joins the container and executes the command; returns only why it could
/// not.
fn enter(t: &Target, argv: &[CString], io: &ChildIo) -> std::result::Result<Infallible, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("exec: {what}: {e}");
    reset_signals();
    for fd in &t.cgroups {
        nix::unistd::write(fd, b"0").map_err(|e| fail("joining the container's cgroup", &e))?;
    }
    if let Some(adj) = t.process.oom_score_adj() {
        std::fs::write("/proc/self/oom_score_adj", adj.to_string())
            .map_err(|e| fail("setting oom_score_adj", &e))?;
    }
    if let Some(profile) = t.process.apparmor_profile() {
        libcontainer::apparmor::apply_profile(profile)
            .map_err(|e| fail("applying the AppArmor profile", &e))?;
    }
    if let Some(ns) = &t.user_ns {
        nix::sched::setns(ns, CloneFlags::CLONE_NEWUSER)
            .map_err(|e| fail("joining the user namespace", &e))?;
    }
    for (flag, ns) in &t.namespaces {
        nix::sched::setns(ns, *flag)
            .map_err(|e| fail(&format!("joining namespace {flag:?}"), &e))?;
    }
    match io {
        ChildIo::Files(fds) => stdio(fds).map_err(|e| fail("setting up stdio", &e))?,
        ChildIo::Tty(sock) => terminal(sock).map_err(|e| fail("making the terminal", &e))?,
    }
    let syscall = create_syscall();
    let user = t.process.user();
    nix::sys::prctl::set_keepcaps(true).map_err(|e| fail("keeping capabilities", &e))?;
    let groups: Vec<libc::gid_t> = user.additional_gids().iter().flatten().copied().collect();
    set_ids(&groups, user.gid(), user.uid())?;
    reset_effective(&*syscall).map_err(|e| fail("keeping capabilities", &e))?;
    for limit in t.process.rlimits().iter().flatten() {
        syscall
            .set_rlimit(limit)
            .map_err(|e| fail("setting an rlimit", &e))?;
    }
    let caps = t.process.capabilities().as_ref();
    if let Some(caps) = caps {
        let first = if t.lend_sys_admin {
            with_sys_admin(caps)
        } else {
            caps.clone()
        };
        drop_privileges(&first, &*syscall).map_err(|e| fail("setting the capabilities", &e))?;
    }
    let cwd = t.process.cwd();
    nix::unistd::chdir(cwd).map_err(|e| {
        format!(
            "exec: chdir to cwd ({:?}) set in config.json failed: {}",
            cwd,
            errno_text(e)
        )
    })?;
    if t.process.no_new_privileges() == Some(true) {
        nix::sys::prctl::set_no_new_privs().map_err(|e| fail("setting no_new_privs", &e))?;
    }
    if let Some(program) = &t.seccomp_program {
        program
            .load()
            .map_err(|e| fail("loading the seccomp filter", &e))?;
    } else if let Some(filter) = &t.seccomp {
        let notify =
            initialize_seccomp(filter).map_err(|e| fail("loading the seccomp filter", &e))?;
        if let Some(fd) = notify {
            // Nobody listens for an exec's notifications; the kernel answers ENOSYS.
            let _ = nix::unistd::close(fd);
        }
    }
    if let (true, Some(caps)) = (t.lend_sys_admin, caps) {
        drop_privileges(caps, &*syscall).map_err(|e| fail("restoring the capabilities", &e))?;
    }
    // Nothing of the sandbox's reaches the command: every descriptor above stdio closes at exec.
    // SAFETY: a plain system call on this process's descriptor table.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    let Some(name) = argv.first().and_then(|a| a.to_str().ok()) else {
        return Err("exec: the command's name is not UTF-8".into());
    };
    let path = look_path(name, t.path_var.as_deref())?;
    let prog = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("exec: {name:?}: contains a NUL byte"))?;
    match nix::unistd::execve(&prog, argv, &t.env) {
        Ok(never) => match never {},
        Err(e) => Err(format!("exec {}: {}", path.display(), errno_text(e))),
    }
}

/// Sets this task's supplementary groups, gid and uid with the system calls themselves: the C
/// library's wrappers would apply them to every thread of the process they believe they are in,
/// which for a child sharing the sandbox's memory is the sandbox's.
fn set_ids(
    groups: &[libc::gid_t],
    gid: libc::gid_t,
    uid: libc::uid_t,
) -> std::result::Result<(), String> {
    let check = |what: &str, r: libc::c_long| {
        if r < 0 {
            Err(format!("exec: {what}: {}", std::io::Error::last_os_error()))
        } else {
            Ok(())
        }
    };
    // SAFETY: plain system calls; `groups` outlives the call and its length is passed.
    unsafe {
        check(
            "setting the groups",
            libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
        )?;
        check(
            "setting the gid",
            libc::syscall(libc::SYS_setresgid, gid, gid, gid),
        )?;
        check(
            "setting the uid",
            libc::syscall(libc::SYS_setresuid, uid, uid, uid),
        )
    }
}

thread_local! {
    /// The stack an exec's child runs on until it executes its command (1 MiB, touched only
    /// as deep as the child goes: the seccomp filter's compilation is the deepest).
    static CHILD_STACK: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 1 << 20]);
}

/// Default dispositions and an empty mask, as a new process has (the sandbox ignores SIGPIPE).
fn reset_signals() {
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installs the default disposition, no handler.
            let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
        }
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// Makes `fds` this process's stdin, stdout and stderr. Each is first copied above 2, so that
/// none is overwritten before it was copied.
fn stdio(fds: &[OwnedFd; 3]) -> nix::Result<()> {
    let mut high = [0 as RawFd; 3];
    for (h, fd) in high.iter_mut().zip(fds) {
        *h = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(3))?;
    }
    for (target, fd) in high.into_iter().enumerate() {
        nix::unistd::dup2(fd, target as RawFd)?;
    }
    Ok(())
}

/// Makes a terminal in the container (its devpts, through `/dev/ptmx`), sends its master on
/// `sock`, and makes its slave this process's controlling terminal and stdio.
fn terminal(sock: &OwnedFd) -> std::result::Result<(), String> {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .map_err(|e| format!("opening /dev/ptmx: {e}"))?;
    grantpt(&master).map_err(|e| format!("grantpt: {e}"))?;
    unlockpt(&master).map_err(|e| format!("unlockpt: {e}"))?;
    let name = ptsname_r(&master).map_err(|e| format!("ptsname: {e}"))?;
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&name)
        .map_err(|e| format!("opening {name}: {e}"))?
        .into();
    crate::fdpass::send(sock, b"t", &[master.as_fd()])
        .map_err(|e| format!("sending the master: {e}"))?;
    drop(master);
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    // SAFETY: TIOCSCTTY takes an int argument; the slave is a terminal this process opened.
    if unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSCTTY, 0) } < 0 {
        return Err(format!("TIOCSCTTY: {}", std::io::Error::last_os_error()));
    }
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup: {e}"));
    stdio(&[dup(&slave)?, dup(&slave)?, slave]).map_err(|e| format!("stdio: {e}"))
}
