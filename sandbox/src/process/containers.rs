//! The sandbox's containers: creating, starting, killing and deleting them through
//! libcontainer, and keeping each one's status on disk.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::unistd::{Pid, pipe2};

use super::ns::pidfd_open;
use super::payload;
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
    /// Until `start`: the read end of the pipe on which its init reports a program it could
    /// not execute (see [`payload`](super::payload)).
    pub report: Option<OwnedFd>,
    /// Its bundle (the OCI spec in `config.json`).
    pub bundle: std::path::PathBuf,
    /// What its execs need, from its first exec until it exits (see [`exec`](super::exec)).
    pub exec_target: Option<Box<super::exec::Target>>,
}

/// An attach connection (non-blocking).
pub struct Attacher {
    pub conn: UnixStream,
    /// It took a descriptor of the container's stdin.
    pub stdin: bool,
    /// The peer has shut down its side: its stdin is done (it may still read output).
    pub eof: bool,
}

/// A pipe whose read end does not block.
pub(super) fn output_pipe() -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", e))?;
    fcntl(r.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| internal("fcntl", e))?;
    Ok((r, w))
}

/// The error lines a failed container init left on its stderr pipe, as `": line; line"`.
fn init_errors(stderr: &OwnedFd) -> String {
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while text.len() < 64 * 1024 {
        match nix::unistd::read(stderr.as_raw_fd(), &mut buf) {
            Ok(n) if n > 0 => text.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once(" ERROR ").map(|(_, msg)| msg.trim()))
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(": {}", lines.join("; "))
    }
}

pub(super) fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what}: {e}"))
}

pub(super) fn lc_error(what: &str, id: &str, e: impl std::fmt::Display) -> Error {
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
    let (report, payload) = payload::report_pipe()?;
    let mut builder = ContainerBuilder::new(spec.id.clone(), SyscallType::default())
        .with_root_path(layout.container_root())
        .and_then(|b| b.validate_id())
        .map_err(|e| Error::new(Kind::InvalidArgument, e.to_string()))?
        .with_executor(payload);
    let mut out = [None, None];
    let mut stdin = None;
    let mut console = None;
    // Alive until the container exists: a console socket path through its directory's
    // descriptor (see `sockpath`) must stay resolvable until libcontainer has connected.
    let mut _console_path = None;
    if terminal {
        // libcontainer makes the terminal inside the container and sends its master to a
        // console socket: the master is the container's output and its stdin.
        let path = layout.console_socket();
        let _ = std::fs::remove_file(&path);
        let short =
            crate::sockpath::SocketPath::new(&path).map_err(|e| Error::io("binding", &path, e))?;
        let l = UnixListener::bind(short.path()).map_err(|e| Error::io("binding", &path, e))?;
        console = Some(l);
        builder = builder.with_console_socket(Some(short.path()));
        _console_path = Some(short);
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
            // The init logs why it failed (libcontainer's message does not say) on its
            // stderr, which is ours to read.
            let why = out[1].as_ref().map(init_errors).unwrap_or_default();
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("creating container {}: {e}{why}", spec.id),
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
        report: Some(report),
        bundle: spec.bundle.clone(),
        exec_target: None,
    })
}

/// The terminal master libcontainer sends to the console socket while creating a container
/// with a terminal.
fn receive_master(listener: &UnixListener) -> Result<OwnedFd> {
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(5000u16)).map_err(|e| internal("poll", e))?;
    if ready == 0 {
        return Err(internal(
            "terminal container",
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
                "terminal container",
                "the console socket closed without a terminal",
            ));
        }
    }
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
    if let Some(why) = c.report.take().as_ref().and_then(payload::read_report) {
        start_failed(c, &why);
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("starting container {}: {why}", c.status.id),
        ));
    }
    c.status.state = State::Running;
    c.status.started_at = now_ns();
    Ok(())
}

/// Records that a container's init could not execute its program (it exits right after
/// saying why): exited without having started, with containerd's start-error code and reason
/// and `why` as the message.
fn start_failed(c: &mut Ctr, why: &str) {
    use nix::sys::wait::waitpid;
    // The init is exiting; reaped here, its exit is not recorded as the program's.
    let _ = waitpid(Pid::from_raw(c.status.pid), None);
    pump_output(c);
    c.attached.clear();
    c.stdin = None;
    c.pidfd = None;
    c.status.state = State::Exited;
    c.status.exit_code = payload::START_ERROR_EXIT_CODE;
    c.status.finished_at = now_ns();
    c.status.reason = payload::START_ERROR_REASON.into();
    c.status.message = why.into();
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
            // Failures are reported by the writer, once per episode.
            let _ = c.log.write(stream, data);
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
    let mut buf = [0u8; crate::protocol::MAX_ATTACH_FRAME];
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
    c.exec_target = None;
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
}
