//! The sandbox process's event loop: one `poll` over the listening socket, the containers' output
//! pipes and pidfds, and the running execs. Requests are answered in order; those that wait (a
//! stop with a grace period, an exec) are parked and answered when their process exits.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::containers::{self, Ctr, Drained};
use super::exec::{self, Exec, ExecIo};
use super::wire::{error_response, reply, send_all};
use crate::protocol::{MAX_EXEC_OUTPUT, MAX_MESSAGE, Request, Response};
use crate::spec::{Event, ExecResult, Layout, SandboxState, Spec, State};
use crate::{Error, Kind, Result};

/// A request waiting for a container to exit.
struct StopWait {
    id: String,
    conn: UnixStream,
    kill_at: Option<Instant>,
    signal: Signal,
    /// When to send `signal` again because the last one may have been dropped: the kernel
    /// drops a signal sent to a PID namespace's init that has no handler for it (a stop right
    /// after start, before the program installed its handler). A signal sent while the process
    /// showed no handler is sent again (each time the process still shows none, once more after
    /// it shows one), on the [`next_resend`] schedule, until the grace period ends.
    resend_at: Option<Instant>,
    /// How many times `signal` has been sent again.
    resent: u32,
}

/// The first wait before a stop signal a namespace init may have dropped is sent again: a
/// program usually installs its handler within a few milliseconds of starting.
const RESEND_FIRST: Duration = Duration::from_millis(2);
/// The longest wait between two sends of a stop signal (the wait doubles up to it).
const RESEND_MAX: Duration = Duration::from_millis(250);

/// The wait before resending a stop signal for the `n`-th time (from 0): 2 ms, doubling, at
/// most [`RESEND_MAX`].
fn resend_delay(n: u32) -> Duration {
    let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
    RESEND_FIRST.saturating_mul(factor).min(RESEND_MAX)
}

/// When to resend a stop signal for the `n`-th time after `now`, or `None` when that would not
/// come before `kill_at` (the SIGKILL there ends the container anyway).
fn next_resend(now: Instant, n: u32, kill_at: Option<Instant>) -> Option<Instant> {
    let at = now + resend_delay(n);
    kill_at.is_some_and(|k| at < k).then_some(at)
}

pub struct Server {
    pub(super) layout: Layout,
    spec: Spec,
    listener: UnixListener,
    /// The helper processes (namespace holders, the node-port proxy).
    helpers: super::ns::Helpers,
    containers: BTreeMap<String, Ctr>,
    pub(super) execs: Vec<(Exec, UnixStream)>,
    stops: Vec<StopWait>,
    subscribers: Vec<UnixStream>,
    shutdown: Option<UnixStream>,
}

#[derive(Clone)]
enum Token {
    Listener,
    Out(String),
    Exit,
    ExecOut(usize),
    Attached(String),
}

impl Server {
    pub fn bind(layout: Layout, spec: Spec, helpers: super::ns::Helpers) -> Result<Self> {
        let path = layout.socket();
        let _ = std::fs::remove_file(&path);
        // Any root dir: a path too long for sun_path is bound through its directory.
        let listener = crate::sockpath::SocketPath::new(&path)
            .and_then(|short| UnixListener::bind(short.path()))
            .map_err(|e| Error::io("binding", &path, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("configuring", &path, e))?;
        Ok(Server {
            layout,
            spec,
            listener,
            helpers,
            containers: BTreeMap::new(),
            execs: Vec::new(),
            stops: Vec::new(),
            subscribers: Vec::new(),
            shutdown: None,
        })
    }

    /// Serves until a `Shutdown` request has been carried out; returns that request's
    /// connection, answered, for the caller to hold open until the process exits: the client
    /// waits for it to close, so that a stopped sandbox's process is gone when the stop returns.
    pub fn serve(&mut self) -> UnixStream {
        loop {
            let ready = self.wait();
            for token in ready {
                match token {
                    Token::Listener => self.accept_all(),
                    Token::Out(id) => {
                        if let Some(c) = self.containers.get_mut(&id) {
                            containers::pump_output(c);
                        }
                    }
                    Token::ExecOut(i) => self.pump_exec(i),
                    Token::Attached(id) => {
                        if let Some(c) = self.containers.get_mut(&id) {
                            containers::prune_attached(c);
                        }
                    }
                    Token::Exit => {}
                }
            }
            self.reap();
            self.check_deadlines();
            self.finish_execs();
            if let Some(conn) = self.shutdown.take() {
                self.shutdown_all();
                reply(&conn, &Response::Ok);
                return conn;
            }
        }
    }

    /// Polls every fd of interest; returns the ready ones.
    fn wait(&self) -> Vec<Token> {
        let mut tokens = vec![Token::Listener];
        let mut fds = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        for (id, c) in &self.containers {
            for fd in c.out.iter().flatten() {
                tokens.push(Token::Out(id.clone()));
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
            if let Some(fd) = &c.pidfd {
                tokens.push(Token::Exit);
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
            for a in c.attached.iter().filter(|a| !a.eof) {
                tokens.push(Token::Attached(id.clone()));
                fds.push(PollFd::new(a.conn.as_fd(), PollFlags::POLLIN));
            }
        }
        for (i, (e, _)) in self.execs.iter().enumerate() {
            for fd in e.out.iter().flatten() {
                tokens.push(Token::ExecOut(i));
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
            if let Some(fd) = &e.pidfd {
                tokens.push(Token::Exit);
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
        }
        let now = Instant::now();
        let next = self
            .stops
            .iter()
            .flat_map(|s| [s.kill_at, s.resend_at])
            .flatten()
            .chain(self.execs.iter().filter_map(|(e, _)| e.deadline))
            .map(|t| t.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        // Rounded up: a wake-up before the deadline would only poll again.
        let ms = u16::try_from(next.as_micros().div_ceil(1000)).unwrap_or(1000);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) => fds
                .iter()
                .zip(tokens)
                .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
                .map(|(_, t)| t)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn accept_all(&mut self) {
        while let Ok((conn, _)) = self.listener.accept() {
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let read = crate::fdpass::recv_line(&conn, MAX_MESSAGE);
            match read.map_err(Error::from_io).and_then(|(line, fds)| {
                serde_json::from_slice::<Request>(&line)
                    .map(|req| (req, fds))
                    .map_err(|e| {
                        Error::new(Kind::InvalidArgument, format!("malformed request: {e}"))
                    })
            }) {
                Ok((req, fds)) => self.handle(req, conn, fds),
                Err(e) => reply(&conn, &error_response(&e)),
            }
        }
    }

    fn handle(&mut self, req: Request, conn: UnixStream, fds: Vec<OwnedFd>) {
        let res = match req {
            Request::State => Ok(Response::State(self.state())),
            Request::Create(spec) => self.create(&spec),
            Request::Start { id } => self.start(&id),
            Request::Stop {
                id,
                signal,
                timeout_ms,
            } => return self.stop(id, signal, timeout_ms, conn),
            Request::Delete { id } => {
                // Answered once the container is dead and forgotten; its libcontainer state
                // and cgroup (a few milliseconds on cgroup v1) go right after, before any
                // other request is served.
                let gone = self.delete(&id);
                reply(&conn, &Response::Ok);
                drop(conn);
                if let Some(c) = gone {
                    containers::remove_state(&self.layout, &c);
                }
                return;
            }
            Request::Exec(spec) => {
                let started = self
                    .container_mut(&spec.container_id)
                    .and_then(|c| exec::exec(c, &spec.args, spec.timeout_ms, ExecIo::Capture));
                match started {
                    Ok((e, _)) => {
                        self.execs.push((e, conn));
                        return;
                    }
                    Err(e) => Err(e),
                }
            }
            Request::ExecStream(spec) => return self.exec_stream(&spec, conn, fds),
            Request::Attach { id, stdin } => return self.attach(&id, stdin, conn),
            Request::ReopenLog { id } => self.container_mut(&id).and_then(|c| {
                if c.status.state != State::Running {
                    return Err(Error::new(
                        Kind::FailedPrecondition,
                        format!("container {id} is not running"),
                    ));
                }
                c.log
                    .reopen()
                    .map(|()| Response::Ok)
                    .map_err(|e| Error::new(Kind::Internal, format!("reopening log: {e}")))
            }),
            Request::UpdateResources { id, resources } => self.update_resources(&id, resources),
            Request::Subscribe => {
                let _ = conn.set_nonblocking(true);
                self.subscribers.push(conn);
                return;
            }
            Request::Shutdown => {
                self.shutdown = Some(conn);
                return;
            }
        };
        let response = match res {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
        reply(&conn, &response);
    }

    pub(super) fn container(&self, id: &str) -> Result<&Ctr> {
        self.containers
            .get(id)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("container {id} not found")))
    }

    pub(super) fn container_mut(&mut self, id: &str) -> Result<&mut Ctr> {
        self.containers
            .get_mut(id)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("container {id} not found")))
    }

    fn state(&self) -> SandboxState {
        SandboxState {
            id: self.spec.id.clone(),
            pid: nix::unistd::getpid().as_raw(),
            pid_ns_holder: self.helpers.pid_ns_holder.map(Pid::as_raw),
            userns_holder: self.helpers.userns_holder.map(Pid::as_raw),
            containers: self.containers.values().map(|c| c.status.clone()).collect(),
        }
    }

    fn create(&mut self, spec: &crate::spec::ContainerSpec) -> Result<Response> {
        if self.containers.contains_key(&spec.id) {
            return Err(Error::new(
                Kind::AlreadyExists,
                format!("container {} already exists", spec.id),
            ));
        }
        let c = containers::register(spec)?;
        containers::persist(&self.layout, &c.status);
        let status = c.status.clone();
        self.containers.insert(spec.id.clone(), c);
        self.publish(&status);
        Ok(Response::Container(status))
    }

    fn start(&mut self, id: &str) -> Result<Response> {
        let layout = self.layout.clone();
        let c = self.container_mut(id)?;
        let started = containers::start(&layout, c);
        let status = c.status.clone();
        if status.state != State::Created {
            // Running, or exited because its program could not be executed.
            containers::persist(&layout, &status);
            self.publish(&status);
        }
        started.map(|()| Response::Container(status))
    }

    fn stop(&mut self, id: String, signal: i32, timeout_ms: u64, conn: UnixStream) {
        let c = match self.container(&id) {
            Ok(c) => c,
            Err(e) => return reply(&conn, &error_response(&e)),
        };
        // A container never started has nothing to stop (libcontainer has not made it yet);
        // it stays created, as containerd's does.
        if !matches!(c.status.state, State::Created | State::Running) || c.pending.is_some() {
            return reply(&conn, &Response::Container(c.status.clone()));
        }
        let sig = Signal::try_from(signal).unwrap_or(Signal::SIGTERM);
        let sig = if timeout_ms == 0 {
            Signal::SIGKILL
        } else {
            sig
        };
        let maybe_dropped = sig != Signal::SIGKILL && containers::dropped_by_init(c, sig);
        containers::signal(c, sig);
        let now = Instant::now();
        let kill_at = (sig != Signal::SIGKILL).then(|| now + Duration::from_millis(timeout_ms));
        let resend_at = maybe_dropped
            .then(|| next_resend(now, 0, kill_at))
            .flatten();
        self.stops.push(StopWait {
            id,
            conn,
            kill_at,
            signal: sig,
            resend_at,
            resent: 0,
        });
    }

    /// Kills and forgets container `id`; returns it, for its state to be removed
    /// ([`containers::remove_state`]).
    fn delete(&mut self, id: &str) -> Option<containers::Ctr> {
        let gone = self.containers.remove(id).map(|mut c| {
            for ws in containers::kill_for_delete(&mut c) {
                self.record_exit(ws);
            }
            self.answer_stops(&c);
            c
        });
        containers::forget(&self.layout, id);
        gone
    }

    fn update_resources(&mut self, id: &str, resources: serde_json::Value) -> Result<Response> {
        let c = self.container(id)?;
        let res: oci_spec::runtime::LinuxResources = serde_json::from_value(resources)
            .map_err(|e| Error::new(Kind::InvalidArgument, format!("invalid resources: {e}")))?;
        if c.pending.is_some() {
            // Not made yet: its spec gets them, for libcontainer to apply at the start.
            containers::update_bundle_resources(&c.bundle, res)?;
            return Ok(Response::Ok);
        }
        let Some(cg) = c.status.cgroup_path.as_deref() else {
            return Err(Error::new(
                Kind::FailedPrecondition,
                format!("container {id} has no cgroup"),
            ));
        };
        crate::cgroup::apply(cg, &res)?;
        Ok(Response::Ok)
    }

    fn pump_exec(&mut self, i: usize) {
        let Some((e, _)) = self.execs.get_mut(i) else {
            return;
        };
        for k in 0..2 {
            let Some(fd) = e.out[k].as_ref() else {
                continue;
            };
            let buf = &mut e.buf[k];
            if let Drained::Eof = containers::drain(fd, |d| {
                let room = MAX_EXEC_OUTPUT.saturating_sub(buf.len());
                buf.extend_from_slice(&d[..d.len().min(room)]);
            }) {
                e.out[k] = None;
            }
        }
    }

    /// Reaps every exited child and records the exits of containers and execs.
    fn reap(&mut self) {
        loop {
            let ws = match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(ws) => ws,
            };
            self.record_exit(ws);
        }
    }

    /// Records a reaped child's exit: a container's init, an exec, or the PID holder.
    fn record_exit(&mut self, ws: WaitStatus) {
        let Some(pid) = ws.pid() else { return };
        let code = match ws {
            WaitStatus::Exited(_, c) => c,
            WaitStatus::Signaled(_, s, _) => 128 + s as i32,
            _ => return,
        };
        if let Some(c) = self
            .containers
            .values_mut()
            .find(|c| c.status.pid == pid.as_raw() && c.status.state != State::Exited)
        {
            containers::exited(c, ws);
            let status = c.status.clone();
            containers::persist(&self.layout, &status);
            self.publish(&status);
            for s in self.take_stops(&status.id) {
                reply(&s.conn, &Response::Container(status.clone()));
            }
        } else if let Some((e, _)) = self.execs.iter_mut().find(|(e, _)| e.pid == pid) {
            e.exit_code = Some(code);
            e.pidfd = None;
        } else {
            self.helpers.exited(pid, ws);
        }
    }

    fn take_stops(&mut self, id: &str) -> Vec<StopWait> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stops)
            .into_iter()
            .partition(|s| s.id == id);
        self.stops = keep;
        done
    }

    fn answer_stops(&mut self, c: &Ctr) {
        for s in self.take_stops(&c.status.id) {
            reply(&s.conn, &Response::Container(c.status.clone()));
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        for s in &mut self.stops {
            if s.kill_at.is_some_and(|t| t <= now) {
                s.kill_at = None;
                s.resend_at = None;
                if let Some(c) = self.containers.get(&s.id) {
                    containers::signal(c, Signal::SIGKILL);
                }
            }
            if s.resend_at.is_some_and(|t| t <= now) {
                s.resend_at = None;
                if let Some(c) = self.containers.get(&s.id) {
                    let maybe_dropped = containers::dropped_by_init(c, s.signal);
                    containers::signal(c, s.signal);
                    s.resent = s.resent.saturating_add(1);
                    s.resend_at = maybe_dropped
                        .then(|| next_resend(now, s.resent, s.kill_at))
                        .flatten();
                }
            }
        }
        for (e, _) in &mut self.execs {
            if e.exit_code.is_none() && e.deadline.is_some_and(|t| t <= now) {
                e.deadline = None;
                e.timed_out = true;
                let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
            }
        }
    }

    /// Answers execs whose process has exited (draining what output is left).
    fn finish_execs(&mut self) {
        let mut i = 0;
        while i < self.execs.len() {
            if self.execs[i].0.exit_code.is_none() {
                i += 1;
                continue;
            }
            self.pump_exec(i);
            let (e, conn) = self.execs.swap_remove(i);
            let response = if e.timed_out {
                Response::Error {
                    kind: Kind::DeadlineExceeded,
                    message: format!("exec in container {} timed out", e.container_id),
                }
            } else {
                let [stdout, stderr] = e.buf;
                Response::Exec(ExecResult {
                    exit_code: e.exit_code.unwrap_or(-1),
                    stdout,
                    stderr,
                })
            };
            reply(&conn, &response);
        }
    }

    fn publish(&mut self, status: &crate::spec::ContainerStatus) {
        // The event's own container first: a deletion has taken it out of the map already.
        let mut containers = vec![status.clone()];
        containers.extend(
            self.containers
                .values()
                .filter(|c| c.status.id != status.id)
                .map(|c| c.status.clone()),
        );
        let event = Event {
            sandbox_id: self.spec.id.clone(),
            status: status.clone(),
            containers,
            at: crate::now_ns(),
        };
        let Ok(mut line) = serde_json::to_vec(&event) else {
            return;
        };
        line.push(b'\n');
        self.subscribers.retain(|s| send_all(s, &line, false));
    }

    fn shutdown_all(&mut self) {
        for c in self.containers.values() {
            containers::signal(c, Signal::SIGKILL);
        }
        let ids: Vec<String> = self.containers.keys().cloned().collect();
        for id in ids {
            if let Some(mut c) = self.containers.remove(&id) {
                for ws in containers::delete(&self.layout, &mut c) {
                    self.record_exit(ws);
                }
                containers::persist(&self.layout, &c.status);
                self.publish(&c.status);
                self.answer_stops(&c);
            }
        }
        for (e, conn) in self.execs.drain(..) {
            let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
            reply(
                &conn,
                &Response::Error {
                    kind: Kind::Unavailable,
                    message: "the sandbox is shutting down".into(),
                },
            );
        }
        self.reap();
        self.helpers.stop_all();
        super::release_cgroups(&self.spec);
        let _ = std::fs::remove_file(self.layout.socket());
        let _ = std::fs::write(self.layout.stopped_marker(), b"");
    }
}

impl Error {
    fn from_io(e: std::io::Error) -> Error {
        Error::new(Kind::InvalidArgument, format!("reading request: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resends_start_within_milliseconds_back_off_and_are_capped() {
        let delays: Vec<u128> = (0..10).map(|n| resend_delay(n).as_millis()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 250, 250, 250]);
        assert_eq!(resend_delay(u32::MAX), RESEND_MAX);
    }

    #[test]
    fn resends_stay_before_the_kill_deadline() {
        let start = Instant::now();
        let kill_at = start + Duration::from_secs(2);
        let mut at = start;
        let mut sends = Vec::new();
        let mut n = 0;
        while let Some(next) = next_resend(at, n, Some(kill_at)) {
            assert!(next > at && next < kill_at);
            sends.push(next - start);
            at = next;
            n += 1;
        }
        assert_eq!(sends.first(), Some(&Duration::from_millis(2)));
        // 2 + 4 + … + 128 ms = 254 ms, then every 250 ms until 2 s: 1754 ms is the last.
        assert_eq!(sends.last(), Some(&Duration::from_millis(1754)));
        assert_eq!(sends.len(), 13);
        // A grace period shorter than the first wait leaves the SIGKILL alone.
        assert_eq!(next_resend(start, 0, Some(start + RESEND_FIRST)), None);
        // A SIGKILL (no deadline) is never resent.
        assert_eq!(next_resend(start, 0, None), None);
    }
}
