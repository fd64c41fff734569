//! The sandbox's side of its request protocol on the wire: one JSON response per line, sent
//! without ever raising SIGPIPE, optionally with a descriptor attached.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::sys::socket::{MsgFlags, send};

use crate::Error;
use crate::protocol::Response;

pub(super) fn error_response(e: &Error) -> Response {
    Response::Error {
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// Writes one response line; a client that went away is not an error for the sandbox.
pub(super) fn reply(conn: &UnixStream, response: &Response) {
    let mut line = serde_json::to_vec(response).unwrap_or_else(|e| {
        format!("{{\"Error\":{{\"kind\":\"Internal\",\"message\":\"encoding response: {e}\"}}}}")
            .into_bytes()
    });
    line.push(b'\n');
    send_all(conn, &line, true);
}

/// Writes one response line with a descriptor attached; false if that failed.
pub(super) fn reply_with_fd(conn: &UnixStream, response: &Response, fd: BorrowedFd<'_>) -> bool {
    let Ok(mut line) = serde_json::to_vec(response) else {
        return false;
    };
    line.push(b'\n');
    match crate::fdpass::send(conn, &line, &[fd]) {
        Ok(n) => send_all(conn, &line[n..], true),
        Err(_) => false,
    }
}

/// Sends all of `data` without ever raising SIGPIPE. Returns false if the peer is gone (or, when
/// not `blocking`, too slow to take the data).
pub(super) fn send_all(conn: &UnixStream, mut data: &[u8], blocking: bool) -> bool {
    while !data.is_empty() {
        match send(conn.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) if blocking => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return false,
        }
    }
    true
}
