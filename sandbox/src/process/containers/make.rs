//! Making a container: registering it at CreateContainer (its bundle's spec and log file
//! checked, nothing made yet) and having libcontainer make it at its start, its init waiting
//! for the start; and updating the spec of one not made yet.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::pipe2;

use super::super::ns::pidfd_open;
use super::super::payload;
use super::receive_terminal;
use super::{Ctr, internal, lc_error, output_pipe};
use crate::logs::LogWriter;
use crate::spec::{ContainerSpec, ContainerStatus, Layout, State, now_ns};
use crate::{Error, Kind, Result};

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

/// Registers a container, created: its bundle's spec and log file are checked and its status
/// kept, and libcontainer makes it (its init, namespaces and cgroup) at [`super::start`].
pub fn register(spec: &ContainerSpec) -> Result<Ctr> {
    if spec.id.is_empty() || spec.id.contains('/') || spec.id.starts_with('.') {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("invalid container id {:?}", spec.id),
        ));
    }
    let (cgroup_path, _) = bundle_cgroup(&spec.bundle)?;
    let log = open_log(spec)?;
    Ok(Ctr {
        status: ContainerStatus {
            id: spec.id.clone(),
            state: State::Created,
            pid: 0,
            created_at: now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path: spec.log_path.clone(),
            cgroup_path,
        },
        out: [None, None],
        log,
        pidfd: None,
        stdin: None,
        stdin_once: spec.stdin_once,
        attached: Vec::new(),
        report: None,
        bundle: spec.bundle.clone(),
        exec_target: None,
        pending: Some(spec.clone()),
    })
}

fn open_log(spec: &ContainerSpec) -> Result<LogWriter> {
    LogWriter::open(spec.log_path.as_deref()).map_err(|e| {
        Error::new(
            Kind::InvalidArgument,
            format!("opening log file {:?}: {e}", spec.log_path),
        )
    })
}

/// Has libcontainer make a registered container, its init waiting for the start: its
/// bookkeeping (status, log, followers) is the registration's, with the init's PID and pipes.
pub fn build(layout: &Layout, c: &mut Ctr) -> Result<()> {
    let Some(spec) = c.pending.take() else {
        return Ok(());
    };
    create(layout, &spec, c)
}

/// Gives a container not made yet new resources in its bundle's spec (the device rules it
/// has stay, unless `res` has its own).
pub fn update_bundle_resources(
    bundle: &Path,
    mut res: oci_spec::runtime::LinuxResources,
) -> Result<()> {
    let path = bundle.join("config.json");
    let mut spec = oci_spec::runtime::Spec::load(&path)
        .map_err(|e| internal(&format!("reading {}", path.display()), e))?;
    let mut linux = spec.linux().clone().unwrap_or_default();
    if res.devices().is_none() {
        res.set_devices(linux.resources().as_ref().and_then(|r| r.devices().clone()));
    }
    linux.set_resources(Some(res));
    spec.set_linux(Some(linux));
    spec.save(&path)
        .map_err(|e| internal(&format!("writing {}", path.display()), e))
}

/// Creates registered container `c` through libcontainer, its init waiting for `start`.
fn create(layout: &Layout, spec: &ContainerSpec, c: &mut Ctr) -> Result<()> {
    let (_, terminal) = bundle_cgroup(&spec.bundle)?;
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
    c.status.pid = pid.as_raw();
    c.out = out;
    c.pidfd = pidfd_open(pid).ok();
    c.stdin = stdin;
    c.stdin_once = spec.stdin_once && !terminal;
    c.report = Some(report);
    Ok(())
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
    receive_terminal(
        conn.as_fd(),
        "terminal container",
        "the console socket closed without a terminal",
    )
}
