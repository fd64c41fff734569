//! The sandbox's containers: creating, starting, killing and deleting them through
//! libcontainer, and keeping each one's status on disk.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use libcontainer::container::Container;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::MsgFlags;
use nix::unistd::{Pid, pipe2};

use super::payload;
use crate::logs::{LogWriter, Stream};
use crate::protocol::{ATTACH_STDERR, ATTACH_STDOUT};
use crate::spec::{ContainerSpec, ContainerStatus, Layout, State, now_ns};
use crate::{Error, Kind, Result, cgroup};

mod make;
pub use make::{build, register, update_bundle_resources};

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
    /// Until `start`: the container as asked for, made through libcontainer only then (as
    /// containerd makes a container's task at its start), so that creating it costs no
    /// process, namespace or cgroup yet.
    pub pending: Option<ContainerSpec>,
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

/// The terminal master a process sends on `sock` (a container's init on its console socket,
/// an exec's child on its socketpair); `what` and `none` name the failure when none comes.
pub(super) fn receive_terminal(
    sock: std::os::fd::BorrowedFd<'_>,
    what: &str,
    none: &str,
) -> Result<OwnedFd> {
    let mut buf = [0u8; 4096];
    let mut fds = Vec::new();
    loop {
        let n = crate::fdpass::recv(sock, &mut buf, &mut fds)
            .map_err(|e| internal(&format!("receiving the terminal ({what})"), e))?;
        if let Some(fd) = fds.pop() {
            return Ok(fd);
        }
        if n == 0 {
            return Err(internal(what, none));
        }
    }
}

pub(super) fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what}: {e}"))
}

pub(super) fn lc_error(what: &str, id: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what} container {id}: {e}"))
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
    if let Err(e) = build(layout, c) {
        // What libcontainer could not make fails the start, as containerd's task creation
        // does: the container has exited without having started.
        let why = e.to_string();
        ended_unstarted(c, &why);
        return Err(Error::new(
            e.kind(),
            format!("starting container {}: {why}", c.status.id),
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
    ended_unstarted(c, why);
}

/// Marks a container exited without having started, with containerd's start-error code and
/// reason and `why` as the message.
fn ended_unstarted(c: &mut Ctr, why: &str) {
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
        let mut buf = [0u8; 4096];
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

/// Deletes a container: kills it if it still runs ([`kill_for_delete`]), then removes its
/// libcontainer state and cgroup ([`remove_state`]).
///
/// Returns the exits of other children reaped meanwhile (for the caller's bookkeeping).
pub fn delete(layout: &Layout, c: &mut Ctr) -> Vec<nix::sys::wait::WaitStatus> {
    let others = kill_for_delete(c);
    remove_state(layout, c);
    others
}

/// Kills a container being deleted if it still runs, and waits for its init to be reaped.
///
/// Returns the exits of other children reaped meanwhile (for the caller's bookkeeping): a
/// killed init of a PID namespace only finishes dying once every process of the namespace is
/// reaped, and the sandbox is the parent of those too (an exec's process, or the remains of an
/// exec that failed to start), so waiting for the init alone could wait forever.
pub fn kill_for_delete(c: &mut Ctr) -> Vec<nix::sys::wait::WaitStatus> {
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
    others
}

/// Removes the libcontainer state and the cgroup of a container that no longer runs.
pub fn remove_state(layout: &Layout, c: &Ctr) {
    if c.pending.is_some() {
        // libcontainer never made it: there is nothing of it.
        return;
    }
    let root = layout.container_root().join(&c.status.id);
    // libcontainer's delete removes the container's cgroup too; only when it could not is it
    // removed here (setting up a cgroup manager again costs a millisecond or two).
    let deleted = match Container::load(root.clone()) {
        Ok(mut container) => match container.delete(true) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(id = %c.status.id, "libcontainer delete: {e}");
                false
            }
        },
        Err(e) => {
            tracing::debug!(id = %c.status.id, "no libcontainer state: {e}");
            false
        }
    };
    let _ = std::fs::remove_dir_all(&root);
    if let (false, Some(cg)) = (deleted, c.status.cgroup_path.as_deref()) {
        let _ = cgroup::remove(cg);
    }
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
