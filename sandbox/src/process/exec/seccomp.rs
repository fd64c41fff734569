//! A container's seccomp filter compiled once for all its execs. libseccomp compiles an OCI
//! profile into a BPF program each time it loads one: 0.26-0.46 ms of CPU for the
//! `RuntimeDefault` profile's rules (two architectures) on this project's test machine
//! (docs/BENCHMARKS.md), paid by every exec probe of a pod with a seccomp profile
//! (every pod on a node with `seccompDefault`). The program is compiled once, at the
//! container's first exec, by the same libcontainer call as before, and read back from the
//! kernel; each exec then loads it with one `seccomp` system call.
//!
//! Compiling: a child forked for it asks to be traced by the sandbox process, loads the filter
//! with libcontainer's [`initialize_seccomp`] and stops on an undefined instruction (a signal
//! that needs no system call, so no rule of the profile can keep it from stopping). The kernel's
//! copy of the program is read with `PTRACE_SECCOMP_GET_FILTER`, and the child is killed. When
//! any step fails (a kernel without that request, a profile that kills the child) there is no
//! program, and each exec compiles the filter itself as before.

use libcontainer::seccomp::initialize_seccomp;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompFilterFlag};

/// `PTRACE_SECCOMP_GET_FILTER` (linux/ptrace.h), which the libc crate does not name.
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;

/// A seccomp filter as the kernel holds it, and the flags it is loaded with.
pub struct Program {
    filter: Vec<libc::sock_filter>,
    flags: libc::c_ulong,
}

impl Program {
    /// The program of the filter `seccomp`, compiled by libseccomp in a child; `None` when it
    /// cannot be had that way. Only for a single-threaded process (the sandbox process): the
    /// child is a plain fork.
    pub fn compile(seccomp: &LinuxSeccomp) -> Option<Program> {
        // SAFETY: the sandbox process is single-threaded; the child loads the filter, stops
        // and is killed, and never returns into the sandbox's code.
        match unsafe { fork() } {
            Err(e) => {
                tracing::debug!("seccomp: cannot fork to compile the filter: {e}");
                None
            }
            Ok(ForkResult::Child) => {
                // SAFETY: plain system calls; `ud2` raises SIGILL, which stops a traced
                // process before any handler runs.
                unsafe {
                    if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == 0
                        && initialize_seccomp(seccomp).is_ok()
                    {
                        std::arch::asm!("ud2");
                    }
                    libc::_exit(1)
                }
            }
            Ok(ForkResult::Parent { child }) => {
                let status = loop {
                    match waitpid(child, None) {
                        Err(nix::errno::Errno::EINTR) => continue,
                        other => break other,
                    }
                };
                let filter = match status {
                    Ok(WaitStatus::Stopped(_, Signal::SIGILL)) => read_back(child),
                    ref other => {
                        tracing::debug!(
                            "seccomp: the compiling child did not stop as expected: {other:?}"
                        );
                        None
                    }
                };
                // Killed and reaped only while it is stopped: a child that exited is reaped
                // already, and its PID may be another process's by now.
                if let Ok(WaitStatus::Stopped(..)) = status {
                    let _ = kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                }
                Some(Program {
                    filter: filter?,
                    flags: load_flags(seccomp),
                })
            }
        }
    }

    /// Loads the program into the calling thread (an exec's child, with CAP_SYS_ADMIN or
    /// no_new_privs, as libseccomp's load needs).
    pub fn load(&self) -> std::io::Result<()> {
        let len = u16::try_from(self.filter.len())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let prog = libc::sock_fprog {
            len,
            filter: self.filter.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points to this program's instructions, which outlive the call; the
        // kernel copies them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                self.flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The newest filter of the stopped, traced `child`.
fn read_back(child: Pid) -> Option<Vec<libc::sock_filter>> {
    let request = |buf: *mut libc::sock_filter| {
        // SAFETY: the request writes at most the count it returned for a null buffer, and the
        // buffer holds that many.
        unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, child.as_raw(), 0, buf) }
    };
    let count = usize::try_from(request(std::ptr::null_mut())).ok()?;
    let empty = libc::sock_filter {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    };
    let mut filter = vec![empty; count];
    let read = usize::try_from(request(filter.as_mut_ptr())).ok()?;
    if read != count || count == 0 {
        tracing::debug!("seccomp: read {read} of {count} instructions of the filter");
        return None;
    }
    Some(filter)
}

/// The flags libseccomp loads the filter with that matter for one thread: logging and the
/// speculative store bypass (TSYNC is for other threads; an exec has no listener for
/// notifications, which the kernel then answers with ENOSYS, as it did when the listener
/// libseccomp made was closed).
fn load_flags(seccomp: &LinuxSeccomp) -> libc::c_ulong {
    let mut flags = 0;
    for f in seccomp.flags().iter().flatten() {
        match f {
            LinuxSeccompFilterFlag::SeccompFilterFlagLog => flags |= libc::SECCOMP_FILTER_FLAG_LOG,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => {
                flags |= libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW
            }
            _ => {}
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{Arch, LinuxSeccompAction, LinuxSeccompBuilder, LinuxSyscallBuilder};

    /// A program compiled once denies in another process what the profile denies, and allows
    /// the rest: `mkdir` fails with EPERM, `getpid` works.
    #[test]
    fn a_compiled_filter_loads_in_another_process_and_denies_what_the_profile_denies() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip(
                "needs root",
                "a_compiled_filter_loads_in_another_process_and_denies_what_the_profile_denies",
            );
            return;
        }
        let deny_mkdir = LinuxSyscallBuilder::default()
            .names(vec!["mkdir".to_string(), "mkdirat".to_string()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(libc::EPERM as u32)
            .build()
            .unwrap();
        let profile = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .architectures(vec![Arch::ScmpArchX86_64])
            .syscalls(vec![deny_mkdir])
            .build()
            .unwrap();
        let program = Program::compile(&profile).expect("the filter compiles and reads back");
        assert!(
            program.filter.len() > 2,
            "{} instructions",
            program.filter.len()
        );

        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        let path = std::ffi::CString::new(made.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child only makes system calls and exits.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => unsafe {
                let code = match program.load() {
                    Err(_) => 10,
                    Ok(()) => {
                        let denied = libc::mkdir(path.as_ptr(), 0o755) < 0
                            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
                        if !denied {
                            11
                        } else if libc::getpid() <= 0 {
                            12
                        } else {
                            0
                        }
                    }
                };
                libc::_exit(code)
            },
            ForkResult::Parent { child } => {
                let status = waitpid(child, None).unwrap();
                assert_eq!(
                    status,
                    WaitStatus::Exited(child, 0),
                    "10: load failed, 11: mkdir was not denied"
                );
            }
        }
        assert!(!made.exists());
        // This process, without the filter, still can.
        std::fs::create_dir(&made).unwrap();
    }
}
