//! The sandbox's containers: creating, starting, killing, exec'ing and deleting them through
//! libcontainer, and keeping each one's status on disk.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use libcontainer::capabilities::drop_privileges;
use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::seccomp::initialize_seccomp;
use libcontainer::syscall::syscall::{SyscallType, create_syscall};
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::unistd::{Pid, pipe2};
use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxSeccomp, Process, Spec};

use super::ns::pidfd_open;
use crate::logs::{LogWriter, Stream};
use crate::protocol::{ATTACH_STDERR, ATTACH_STDOUT};
use crate::spec::{ContainerSpec, ContainerStatus, Layout, State, now_ns};
use crate::{Error, Kind, Result, cgroup};

/// A container's live bookkeeping in the sandbox process.
pub struct Ctr {
    pub status: ContainerStatus,
    /// Read ends of the container's stdout and stderr pipes, until they reach end of file.
    pub out: [Option<OwnedFd>; 2],
    pub log: LogWriter,
    pub pidfd: Option<OwnedFd>,
    /// The write end of the container's stdin pipe, when it has one; for a container with a
    /// terminal, the terminal's master (non-blocking, shared with the output reader).
    pub stdin: Option<OwnedFd>,
    pub stdin_once: bool,
    /// Connections following its output.
    pub attached: Vec<Attacher>,
}

/// An attach connection (non-blocking).
pub struct Attacher {
    pub conn: UnixStream,
    /// It took a descriptor of the container's stdin.
    pub stdin: bool,
    /// The peer has shut down its side: its stdin is done (it may still read output).
    pub eof: bool,
}

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

/// A pipe whose read end does not block.
fn output_pipe() -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", e))?;
    fcntl(r.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| internal("fcntl", e))?;
    Ok((r, w))
}

fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what}: {e}"))
}

fn lc_error(what: &str, id: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what} container {id}: {e}"))
}

/// Reads the cgroup path a bundle's OCI spec asks for, and whether its process wants a terminal.
fn bundle_cgroup(bundle: &Path) -> Result<(Option<String>, bool)> {
    let path = bundle.join("config.json");
    let spec = oci_spec::runtime::Spec::load(&path).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("loading OCI spec {}: {e}", path.display()),
        )
    })?;
    let terminal = spec
        .process()
        .as_ref()
        .and_then(|p| p.terminal())
        .unwrap_or(false);
    let cgroup = spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| p.to_string_lossy().into_owned());
    Ok((cgroup, terminal))
}

/// Creates a container whose init waits for `start`.
pub fn create(layout: &Layout, spec: &ContainerSpec) -> Result<Ctr> {
    if spec.id.is_empty() || spec.id.contains('/') || spec.id.starts_with('.') {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("invalid container id {:?}", spec.id),
        ));
    }
    let (cgroup_path, terminal) = bundle_cgroup(&spec.bundle)?;
    let log = LogWriter::open(spec.log_path.as_deref()).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("opening log file {:?}: {e}", spec.log_path),
        )
    })?;
    let mut builder = ContainerBuilder::new(spec.id.clone(), SyscallType::default())
        .with_root_path(layout.container_root())
        .and_then(|b| b.validate_id())
        .map_err(|e| Error::new(Kind::InvalidArgument, e.to_string()))?;
    let mut out = [None, None];
    let mut stdin = None;
    let mut console = None;
    if terminal {
        // libcontainer makes the terminal inside the container and sends its master to a
        // console socket: the master is the container's output and its stdin.
        let path = layout.console_socket();
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).map_err(|e| Error::io("binding", &path, e))?;
        console = Some(l);
        builder = builder.with_console_socket(Some(&path));
    } else {
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        out = [Some(out_r), Some(err_r)];
        builder = builder.with_stdout(out_w).with_stderr(err_w);
        if spec.stdin {
            let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", e))?;
            builder = builder.with_stdin(r);
            stdin = Some(w);
        }
    }
    let container = builder
        .as_init(&spec.bundle)
        .with_systemd(false)
        .with_detach(true)
        .build();
    if let Some(l) = console {
        let _ = std::fs::remove_file(layout.console_socket());
        if container.is_ok() {
            let master = receive_master(&l)?;
            let reader = master.try_clone().map_err(|e| internal("dup", e))?;
            fcntl(reader.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                .map_err(|e| internal("fcntl", e))?;
            out[0] = Some(reader);
            stdin = Some(master);
        }
    }
    let container = match container {
        Ok(c) => c,
        Err(e) => {
            // libcontainer may leave its state dir behind on failure.
            let _ = std::fs::remove_dir_all(layout.container_root().join(&spec.id));
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("creating container {}: {e}", spec.id),
            ));
        }
    };
    let pid = container
        .pid()
        .ok_or_else(|| lc_error("no init pid for", &spec.id, "libcontainer reported none"))?;
    let status = ContainerStatus {
        id: spec.id.clone(),
        state: State::Created,
        pid: pid.as_raw(),
        created_at: now_ns(),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        log_path: spec.log_path.clone(),
        cgroup_path,
    };
    Ok(Ctr {
        status,
        out,
        log,
        pidfd: pidfd_open(pid).ok(),
        stdin,
        stdin_once: spec.stdin_once && !terminal,
        attached: Vec::new(),
    })
}

/// Lets a created container's init exec the user's process.
pub fn start(layout: &Layout, c: &mut Ctr) -> Result<()> {
    if c.status.state != State::Created {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!(
                "container {} is {:?}, not created",
                c.status.id, c.status.state
            ),
        ));
    }
    let mut container = Container::load(layout.container_root().join(&c.status.id))
        .map_err(|e| lc_error("loading", &c.status.id, e))?;
    container
        .start()
        .map_err(|e| lc_error("starting", &c.status.id, e))?;
    c.status.state = State::Running;
    c.status.started_at = now_ns();
    Ok(())
}

/// Sends `signal` to the container's init, if it is still alive.
pub fn signal(c: &Ctr, signal: Signal) {
    if matches!(c.status.state, State::Created | State::Running) && c.status.pid > 0 {
        let _ = kill(Pid::from_raw(c.status.pid), signal);
    }
}

/// True when `signal` sent to the container's process now would be dropped by the kernel
/// because the process is the init of its PID namespace and neither catches nor ignores it
/// (it has not installed its handler yet).
pub fn dropped_by_init(c: &Ctr, signal: Signal) -> bool {
    if !matches!(c.status.state, State::Created | State::Running) || c.status.pid <= 0 {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", c.status.pid)) else {
        return false;
    };
    init_without_handler(&status, signal as i32)
}

/// The test behind [`dropped_by_init`], on the text of `/proc/<pid>/status`.
pub fn init_without_handler(status: &str, signal: i32) -> bool {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let ns_init = field("NSpid:").and_then(|v| v.split_whitespace().last()) == Some("1");
    let bit = |name: &str| {
        field(name)
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .is_some_and(|mask| signal > 0 && mask & (1u64 << (signal - 1)) != 0)
    };
    ns_init && !bit("SigCgt:") && !bit("SigIgn:")
}

/// Reads what is available on a container's output pipes into its log.
/// Returns true when both pipes are closed.
pub fn pump_output(c: &mut Ctr) -> bool {
    for (i, stream) in [(0usize, Stream::Stdout), (1, Stream::Stderr)] {
        let Some(fd) = c.out[i].as_ref() else {
            continue;
        };
        let tag = if i == 0 { ATTACH_STDOUT } else { ATTACH_STDERR };
        match drain(fd, |data| {
            if let Err(e) = c.log.write(stream, data) {
                tracing::warn!(id = %c.status.id, "writing log: {e}");
            }
            // A follower too slow to take the output is dropped rather than block the pod.
            c.attached.retain(|a| send_frame(&a.conn, tag, data));
        }) {
            Drained::Open => {}
            Drained::Eof => {
                let _ = c.log.finish(stream);
                c.out[i] = None;
            }
        }
    }
    c.out.iter().all(Option::is_none)
}

/// Sends one attach frame without blocking; false if the follower is gone or too slow.
fn send_frame(conn: &UnixStream, tag: u8, data: &[u8]) -> bool {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut frame = Vec::with_capacity(data.len() + 5);
    frame.push(tag);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(data);
    let mut rest = &frame[..];
    while !rest.is_empty() {
        match nix::sys::socket::send(
            conn.as_raw_fd(),
            rest,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => rest = &rest[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Notes the attach connections of `c` whose peer has shut down its side (its stdin is done;
/// a connection fully gone is dropped at the next output) and drops broken ones. Closes the
/// container's stdin when the follower that wrote to it is done and the container wants stdin
/// only once.
pub fn prune_attached(c: &mut Ctr) {
    let mut closed_stdin = false;
    c.attached.retain_mut(|a| {
        if a.eof {
            return true;
        }
        let mut buf = [0u8; 64];
        match nix::sys::socket::recv(a.conn.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => {
                a.eof = true;
                closed_stdin |= a.stdin;
                true
            }
            Ok(_) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => true,
            Err(_) => {
                closed_stdin |= a.stdin;
                false
            }
        }
    });
    if closed_stdin && c.stdin_once {
        c.stdin = None;
    }
}

pub enum Drained {
    Open,
    Eof,
}

/// Reads a non-blocking fd until it would block or reaches end of file.
pub fn drain(fd: &OwnedFd, mut sink: impl FnMut(&[u8])) -> Drained {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return Drained::Eof,
            Ok(n) => sink(&buf[..n]),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Drained::Open,
            Err(_) => return Drained::Eof,
        }
    }
}

/// Records the exit of a container's init.
pub fn exited(c: &mut Ctr, status: nix::sys::wait::WaitStatus) {
    use nix::sys::wait::WaitStatus;
    let (code, signalled) = match status {
        WaitStatus::Exited(_, code) => (code, None),
        WaitStatus::Signaled(_, sig, _) => (128 + sig as i32, Some(sig)),
        _ => return,
    };
    pump_output(c);
    // Followers see the end of the stream once the container has gone.
    c.attached.clear();
    c.stdin = None;
    let oom = signalled == Some(Signal::SIGKILL)
        && c.status
            .cgroup_path
            .as_deref()
            .is_some_and(cgroup::oom_killed);
    c.status.state = State::Exited;
    c.status.exit_code = code;
    c.status.finished_at = now_ns();
    c.status.reason = if oom {
        "OOMKilled".into()
    } else if code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    c.pidfd = None;
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
    let console = layout.console_socket();
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
                    let _ = std::fs::remove_file(&console);
                    let l = UnixListener::bind(&console)
                        .map_err(|e| Error::io("binding", &console, e))?;
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
            let _ = std::fs::remove_file(&console);
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
fn receive_master(listener: &UnixListener) -> Result<OwnedFd> {
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
    let lend_sys_admin = seccomp.is_some()
        && process.no_new_privileges() != Some(true)
        && !caps
            .as_ref()
            .and_then(|c| c.effective().as_ref())
            .is_some_and(|e| e.contains(&Capability::SysAdmin));
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
    Ok((process, ExecSeccomp { seccomp, restore }))
}

/// Runs an exec'd command under its container's seccomp filter (see [`exec_process`]).
#[derive(Clone)]
struct ExecSeccomp {
    seccomp: Option<LinuxSeccomp>,
    /// The container's capabilities, restored after loading the filter with a lent
    /// CAP_SYS_ADMIN; `None` when nothing was lent.
    restore: Option<LinuxCapabilities>,
}

impl Executor for ExecSeccomp {
    fn exec(&self, spec: &Spec) -> std::result::Result<(), ExecutorError> {
        if let Some(filter) = &self.seccomp {
            let syscall = create_syscall();
            let failed = |what: &str, e: &dyn std::fmt::Display| {
                ExecutorError::Other(format!("{what} for the exec's seccomp filter: {e}"))
            };
            if let Some(original) = &self.restore {
                let mut raised = LinuxCapabilities::default();
                let with_admin = |set: &Option<HashSet<Capability>>| {
                    let mut set = set.clone().unwrap_or_default();
                    set.insert(Capability::SysAdmin);
                    Some(set)
                };
                raised.set_bounding(original.bounding().clone());
                raised.set_effective(with_admin(original.effective()));
                raised.set_permitted(with_admin(original.permitted()));
                raised.set_inheritable(None);
                raised.set_ambient(None);
                drop_privileges(&raised, &*syscall)
                    .map_err(|e| failed("raising CAP_SYS_ADMIN", &e))?;
            }
            let notify = initialize_seccomp(filter).map_err(|e| failed("loading", &e))?;
            if let Some(fd) = notify {
                // Nobody listens for an exec's notifications; the kernel answers ENOSYS.
                let _ = nix::unistd::close(fd);
            }
            if let Some(original) = &self.restore {
                drop_privileges(original, &*syscall)
                    .map_err(|e| failed("restoring the capabilities", &e))?;
            }
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

/// Deletes a container: kills it if it still runs, then removes its libcontainer state and cgroup.
///
/// Returns the exits of other children reaped meanwhile (for the caller's bookkeeping): a
/// killed init of a PID namespace only finishes dying once every process of the namespace is
/// reaped, and the sandbox is the parent of those too (an exec's process, or the remains of an
/// exec that failed to start), so waiting for the init alone could wait forever.
pub fn delete(layout: &Layout, c: &mut Ctr) -> Vec<nix::sys::wait::WaitStatus> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut others = Vec::new();
    if matches!(c.status.state, State::Created | State::Running) && c.status.pid > 0 {
        let pid = Pid::from_raw(c.status.pid);
        let _ = kill(pid, Signal::SIGKILL);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                Ok(ws) => {
                    exited(c, ws);
                    break;
                }
                Err(_) => break,
            }
            while let Ok(ws) = waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                if ws == WaitStatus::StillAlive {
                    break;
                }
                if ws.pid() == Some(pid) {
                    exited(c, ws);
                } else {
                    others.push(ws);
                }
            }
            if c.status.state == State::Exited || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    let root = layout.container_root().join(&c.status.id);
    match Container::load(root.clone()) {
        Ok(mut container) => {
            if let Err(e) = container.delete(true) {
                tracing::warn!(id = %c.status.id, "libcontainer delete: {e}");
            }
        }
        Err(e) => tracing::debug!(id = %c.status.id, "no libcontainer state: {e}"),
    }
    let _ = std::fs::remove_dir_all(&root);
    if let Some(cg) = c.status.cgroup_path.as_deref() {
        let _ = cgroup::remove(cg);
    }
    others
}

/// Persists a container's status atomically under the sandbox's status dir.
pub fn persist(layout: &Layout, status: &ContainerStatus) {
    let dir = layout.status_dir();
    let path = dir.join(format!("{}.json", status.id));
    let tmp = dir.join(format!(".{}.tmp", status.id));
    let res = serde_json::to_vec(status)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = res {
        tracing::error!(id = %status.id, "persisting status: {e}");
    }
}

/// Removes a container's persisted status.
pub fn forget(layout: &Layout, id: &str) {
    let _ = std::fs::remove_file(layout.status_dir().join(format!("{id}.json")));
}

/// Reads every persisted container status of a sandbox (for one whose process is gone).
pub fn read_persisted(layout: &Layout) -> BTreeMap<String, ContainerStatus> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(layout.status_dir()) else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<ContainerStatus>(&b).ok())
        {
            Some(s) => {
                out.insert(s.id.clone(), s);
            }
            None => tracing::warn!("unreadable container status {}", path.display()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxBuilder, LinuxCapabilitiesBuilder, ProcessBuilder, UserBuilder};

    use super::*;

    #[test]
    fn a_namespace_init_without_a_handler_drops_the_signal() {
        let status = |nspid: &str, cgt: &str, ign: &str| {
            format!("Name:\ttop\nNSpid:\t{nspid}\nSigIgn:\t{ign}\nSigCgt:\t{cgt}\n")
        };
        let term = 15; // bit 14: 0x4000
        // PID 1 of its namespace, nothing caught yet: dropped.
        assert!(init_without_handler(
            &status("4242\t1", "0000000000000000", "0000000000000000"),
            term
        ));
        // The handler is installed: delivered.
        assert!(!init_without_handler(
            &status("4242\t1", "0000000000004000", "0000000000000000"),
            term
        ));
        // Ignored on purpose: resending is pointless.
        assert!(!init_without_handler(
            &status("4242\t1", "0000000000000000", "0000000000004000"),
            term
        ));
        // Not a namespace init: the default action applies.
        assert!(!init_without_handler(
            &status("4242\t7", "0000000000000000", "0000000000000000"),
            term
        ));
        assert!(!init_without_handler("garbage", term));
    }

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
