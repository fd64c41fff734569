//! Passing file descriptors over the sandbox's unix socket (SCM_RIGHTS), for the requests whose
//! process uses the caller's stdio or hands back a terminal.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Sends `data` with `fds` attached to its first byte. `data` must not be empty. Returns how
/// many bytes went out (the caller writes the rest normally).
pub fn send(sock: impl AsFd, data: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    Ok(sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

/// Receives up to `buf.len()` bytes and any descriptors that came with them (close-on-exec).
/// Zero bytes means the peer closed.
pub fn recv(sock: impl AsFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> std::io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    Ok(got.bytes)
}

/// Reads one line (up to `max` bytes, without the newline) and the descriptors sent with it,
/// from a blocking socket.
pub fn recv_line(sock: impl AsFd, max: usize) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = loop {
            match recv(sock.as_fd(), &mut buf, &mut fds) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            return Ok((line, fds));
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            return Ok((line, fds));
        }
        if line.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "message too long",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_travel_with_the_line() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let r = std::fs::File::from(r);
        assert_eq!(send(&a, b"hello\n", &[w.as_fd()]).unwrap(), 6);
        drop(w);
        let (line, mut fds) = recv_line(&b, 1024).unwrap();
        assert_eq!(line, b"hello");
        assert_eq!(fds.len(), 1);
        let mut w = std::fs::File::from(fds.remove(0));
        w.write_all(b"through the passed pipe").unwrap();
        drop(w);
        let mut got = String::new();
        let mut r = r;
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through the passed pipe");
    }

    #[test]
    fn a_line_without_descriptors_has_none() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"one").unwrap();
        (&a).write_all(b" two\nrest").unwrap();
        let (line, fds) = recv_line(&b, 1024).unwrap();
        assert_eq!(line, b"one two");
        assert!(fds.is_empty());
    }
}
