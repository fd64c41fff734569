//! Closing every inherited descriptor of a forked helper but a few, with `close_range(2)`: a
//! handful of system calls whatever the descriptor limit, where closing each possible number in
//! turn costs one call per number (thousands, at every pod start).
#![allow(unsafe_code)] // close_range, a plain system call on this process's descriptor table

use std::os::fd::RawFd;

/// Closes every descriptor from `first` up but those in `keep`. Falls back to closing them one
/// by one up to the descriptor limit where the kernel has no `close_range` (before 5.9).
pub(crate) fn close_from(first: RawFd, keep: &[RawFd]) {
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|&k| k >= first).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut lo = first;
    for k in kept.iter().copied().chain(std::iter::once(RawFd::MAX)) {
        if k > lo && !close_range(lo, k - 1) {
            close_each(lo, &kept);
            return;
        }
        lo = k.saturating_add(1);
    }
}

/// `close_range(lo, hi, 0)`; false when the kernel does not have it.
fn close_range(lo: RawFd, hi: RawFd) -> bool {
    let (Ok(lo), Ok(hi)) = (u32::try_from(lo), u32::try_from(hi)) else {
        return false;
    };
    // SAFETY: closes descriptors of this process only; no memory is passed.
    unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) == 0 }
}

/// The fallback: every descriptor from `lo` up to the limit, one call each, but `keep`.
fn close_each(lo: RawFd, keep: &[RawFd]) {
    let max = nix::unistd::sysconf(nix::unistd::SysconfVar::OPEN_MAX)
        .ok()
        .flatten()
        .and_then(|n| RawFd::try_from(n).ok())
        .unwrap_or(4096)
        .min(65536);
    for fd in lo..max {
        if !keep.contains(&fd) {
            let _ = nix::unistd::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn is_open(fd: RawFd) -> bool {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok()
    }

    #[test]
    fn closes_all_but_the_kept_ones_in_a_child() {
        // In a child process, so this test's own descriptors are untouched.
        let files: Vec<_> = (0..6)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        let keep = [fds[1], fds[4]];
        // SAFETY: the child only makes system calls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                close_from(fds[0], &keep);
                let ok = fds.iter().all(|&fd| is_open(fd) == keep.contains(&fd))
                    && is_open(0)
                    && is_open(2);
                // SAFETY: exits the forked child at once.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
