//! The sandbox's containers: creating, starting, killing, exec'ing and deleting them through
//! libcontainer, and keeping each one's status on disk.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};

use super::ns::pidfd_open;
use crate::logs::{LogWriter, Stream};
use crate::spec::{ContainerSpec, ContainerStatus, ExecSpec, Layout, State, now_ns};
use crate::{Error, Kind, Result, cgroup};

/// A container's live bookkeeping in the sandbox process.
pub struct Ctr {
    pub status: ContainerStatus,
    /// Read ends of the container's stdout and stderr pipes, until they reach end of file.
    pub out: [Option<OwnedFd>; 2],
    pub log: LogWriter,
    pub pidfd: Option<OwnedFd>,
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

/// Reads the cgroup path a bundle's OCI spec asks for.
fn bundle_cgroup(bundle: &Path) -> Result<Option<String>> {
    let path = bundle.join("config.json");
    let spec = oci_spec::runtime::Spec::load(&path).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("loading OCI spec {}: {e}", path.display()),
        )
    })?;
    Ok(spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| p.to_string_lossy().into_owned()))
}

/// Creates a container whose init waits for `start`.
pub fn create(layout: &Layout, spec: &ContainerSpec) -> Result<Ctr> {
    if spec.id.is_empty() || spec.id.contains('/') || spec.id.starts_with('.') {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("invalid container id {:?}", spec.id),
        ));
    }
    let cgroup_path = bundle_cgroup(&spec.bundle)?;
    let log = LogWriter::open(spec.log_path.as_deref()).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("opening log file {:?}: {e}", spec.log_path),
        )
    })?;
    let (out_r, out_w) = output_pipe()?;
    let (err_r, err_w) = output_pipe()?;
    let container = ContainerBuilder::new(spec.id.clone(), SyscallType::default())
        .with_root_path(layout.container_root())
        .and_then(|b| b.validate_id())
        .map_err(|e| Error::new(Kind::InvalidArgument, e.to_string()))?
        .with_stdout(out_w)
        .with_stderr(err_w)
        .as_init(&spec.bundle)
        .with_systemd(false)
        .with_detach(true)
        .build();
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
        out: [Some(out_r), Some(err_r)],
        log,
        pidfd: pidfd_open(pid).ok(),
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

/// Reads what is available on a container's output pipes into its log.
/// Returns true when both pipes are closed.
pub fn pump_output(c: &mut Ctr) -> bool {
    for (i, stream) in [(0usize, Stream::Stdout), (1, Stream::Stderr)] {
        let Some(fd) = c.out[i].as_ref() else {
            continue;
        };
        match drain(fd, |data| {
            if let Err(e) = c.log.write(stream, data) {
                tracing::warn!(id = %c.status.id, "writing log: {e}");
            }
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

/// Starts a process in a running container; its output is collected by the server.
pub fn exec(layout: &Layout, c: &Ctr, spec: &ExecSpec) -> Result<Exec> {
    if c.status.state != State::Running {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!("container {} is not running", c.status.id),
        ));
    }
    if spec.args.is_empty() {
        return Err(Error::new(Kind::InvalidArgument, "exec needs a command"));
    }
    let (out_r, out_w) = output_pipe()?;
    let (err_r, err_w) = output_pipe()?;
    let pid = ContainerBuilder::new(c.status.id.clone(), SyscallType::default())
        .with_root_path(layout.container_root())
        .map_err(|e| lc_error("exec in", &c.status.id, e))?
        .with_stdout(out_w)
        .with_stderr(err_w)
        .as_tenant()
        .with_container_args(spec.args.clone())
        .with_detach(true)
        .build()
        .map_err(|e| {
            Error::new(
                Kind::Internal,
                format!("exec {:?} in container {}: {e}", spec.args, c.status.id),
            )
        })?;
    let deadline = (spec.timeout_ms > 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(spec.timeout_ms));
    Ok(Exec {
        pid,
        container_id: c.status.id.clone(),
        out: [Some(out_r), Some(err_r)],
        buf: [Vec::new(), Vec::new()],
        pidfd: pidfd_open(pid).ok(),
        deadline,
        exit_code: None,
        timed_out: false,
    })
}

/// Deletes a container: kills it if it still runs, then removes its libcontainer state and cgroup.
pub fn delete(layout: &Layout, c: &mut Ctr) {
    if matches!(c.status.state, State::Created | State::Running) && c.status.pid > 0 {
        let pid = Pid::from_raw(c.status.pid);
        let _ = kill(pid, Signal::SIGKILL);
        if let Ok(ws) = nix::sys::wait::waitpid(pid, None) {
            exited(c, ws);
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
