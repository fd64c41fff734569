//! The sandbox server's streaming requests: an exec on the caller's descriptors (or a new
//! terminal) whose exit code comes later, and attaching to a running container's output and
//! stdin.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::signal::Signal;

use super::containers;
use super::exec::{self, ExecIo};
use super::server::Server;
use super::wire::{error_response, reply, reply_with_fd};
use crate::protocol::Response;
use crate::spec::{State, StreamExecSpec};
use crate::{Error, Kind};

impl Server {
    /// Starts an exec on the caller's descriptors (or a new terminal), answers `ExecStarted`
    /// (with the terminal's master) and parks the connection for the exit code.
    pub(super) fn exec_stream(
        &mut self,
        spec: &StreamExecSpec,
        conn: UnixStream,
        fds: Vec<OwnedFd>,
    ) {
        let io = if spec.tty {
            Ok(ExecIo::Tty)
        } else {
            <[OwnedFd; 3]>::try_from(fds)
                .map(ExecIo::Fds)
                .map_err(|fds| {
                    Error::new(
                        Kind::InvalidArgument,
                        format!("a streaming exec needs 3 descriptors, got {}", fds.len()),
                    )
                })
        };
        let started = io.and_then(|io| {
            self.container_mut(&spec.container_id)
                .and_then(|c| exec::exec(c, &spec.args, 0, io))
        });
        match started {
            Ok((e, master)) => {
                let started = Response::ExecStarted {
                    pid: e.pid.as_raw(),
                };
                let sent = match &master {
                    Some(m) => reply_with_fd(&conn, &started, m.as_fd()),
                    None => {
                        reply(&conn, &started);
                        true
                    }
                };
                if !sent {
                    let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
                }
                // Still reaped (and answered, to nobody) through the exec list.
                self.execs.push((e, conn));
            }
            Err(e) => reply(&conn, &error_response(&e)),
        }
    }

    /// Answers `Attached` (with a descriptor of the container's stdin if asked) and adds the
    /// connection to the container's followers.
    pub(super) fn attach(&mut self, id: &str, stdin: bool, conn: UnixStream) {
        let c = match self.container_mut(id) {
            Ok(c) => c,
            Err(e) => return reply(&conn, &error_response(&e)),
        };
        if c.status.state != State::Running {
            let e = Error::new(
                Kind::FailedPrecondition,
                format!("container {id} is not running"),
            );
            return reply(&conn, &error_response(&e));
        }
        let input = match (stdin, &c.stdin) {
            (true, Some(fd)) => match fd.try_clone() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    let e = Error::new(Kind::Internal, format!("duplicating stdin: {e}"));
                    return reply(&conn, &error_response(&e));
                }
            },
            _ => None,
        };
        let sent = match &input {
            Some(fd) => reply_with_fd(&conn, &Response::Attached, fd.as_fd()),
            None => {
                reply(&conn, &Response::Attached);
                true
            }
        };
        if sent && conn.set_nonblocking(true).is_ok() {
            c.attached.push(containers::Attacher {
                conn,
                stdin: input.is_some(),
                eof: false,
            });
        }
    }
}
