//! The pod's namespaces, held by the sandbox process itself: network, IPC and UTS are unshared
//! by the sandbox process; a shared PID namespace is held by a tiny child that is PID 1 there.
//! Also the few raw syscalls nix does not wrap (loopback up, pidfd_open).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};

use nix::sched::{CloneFlags, unshare};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork, pipe, read, write};

use crate::spec::{NamespaceMode, Spec};
use crate::{Error, Kind, Result};

fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what}: {e}"))
}

/// Unshares the pod's network, IPC and UTS namespaces as the spec asks, sets the hostname,
/// brings loopback up, plumbs the pod's network interface and applies the sysctls. Returns the
/// node-port proxy's PID when the pod forwards node ports. Must be called while the process is
/// single-threaded.
pub fn enter_pod_namespaces(spec: &Spec) -> Result<Option<Pid>> {
    let mut flags = CloneFlags::empty();
    let own_net = spec.namespaces.network != NamespaceMode::Node;
    if own_net {
        // UTS follows the network namespace, as in Kubernetes (hostNetwork keeps the node's hostname).
        flags |= CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS;
    }
    if spec.namespaces.ipc != NamespaceMode::Node {
        flags |= CloneFlags::CLONE_NEWIPC;
    }
    // What the pod's network needs of the node's namespace is taken before leaving it.
    let network = match &spec.network {
        Some(net) if own_net => Some((net, crate::net::prepare(net)?)),
        _ => None,
    };
    if !flags.is_empty() {
        unshare(flags).map_err(|e| internal("unsharing the pod's namespaces", e))?;
    }
    if own_net {
        if !spec.hostname.is_empty() {
            nix::unistd::sethostname(&spec.hostname)
                .map_err(|e| internal("setting the hostname", e))?;
        }
        loopback_up()?;
    }
    let network = match network {
        Some((net, mut node)) => {
            crate::net::plumb(&mut node, net)?;
            Some((net, node))
        }
        None => None,
    };
    set_sysctls(&spec.sysctls)?;
    match network {
        Some((net, node)) => crate::net::ports::spawn_proxy(node.listeners, net.address),
        None => Ok(None),
    }
}

fn set_sysctls(sysctls: &BTreeMap<String, String>) -> Result<()> {
    for (key, value) in sysctls {
        if key.is_empty() || key.contains("..") || key.starts_with('/') || key.starts_with('.') {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("invalid sysctl name {key:?}"),
            ));
        }
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        std::fs::write(&path, value).map_err(|e| {
            Error::new(
                Kind::InvalidArgument,
                format!("setting sysctl {key}={value}: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Sets IFF_UP on `lo` in the current network namespace.
fn loopback_up() -> Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| internal("opening a socket for loopback", e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: ifreq is a plain C struct; zeroed is a valid value. We copy a NUL-terminated name
    // shorter than IFNAMSIZ into it and pass a valid pointer to it for the duration of the calls.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(internal(
                "reading loopback flags",
                std::io::Error::last_os_error(),
            ));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(internal(
                "bringing loopback up",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// Starts the holder of a new PID namespace for the pod and returns its PID (as seen by the
/// caller). The holder is PID 1 in the new namespace: it reaps orphans and otherwise sleeps.
/// Must be called while the process is single-threaded.
pub fn start_pid_namespace_holder() -> Result<Pid> {
    let (r, w) = pipe().map_err(|e| internal("pipe", e))?;
    // SAFETY: the sandbox process is single-threaded here, so the child may run arbitrary code.
    match unsafe { fork() }.map_err(|e| internal("fork", e))? {
        ForkResult::Child => {
            drop(r);
            isolate_fds(std::os::fd::AsRawFd::as_raw_fd(&w));
            let code = match unshare(CloneFlags::CLONE_NEWPID) {
                // SAFETY: still single-threaded in the child.
                Ok(()) => match unsafe { fork() } {
                    Ok(ForkResult::Child) => {
                        drop(w);
                        pid1_loop()
                    }
                    Ok(ForkResult::Parent { child }) => {
                        let _ = write(&w, &child.as_raw().to_le_bytes());
                        0
                    }
                    Err(_) => 1,
                },
                Err(_) => 1,
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut buf = [0u8; 4];
            let n = read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut buf)
                .map_err(|e| internal("reading the PID namespace holder", e))?;
            // The middle process exits at once; its child (the holder) is re-parented to us.
            let _ = waitpid(child, None);
            if n != 4 {
                return Err(internal("starting the PID namespace holder", "it failed"));
            }
            Ok(Pid::from_raw(i32::from_le_bytes(buf)))
        }
    }
}

/// Points stdio at /dev/null and closes every other inherited descriptor but `keep`, so the
/// holder keeps no pipe of the sandbox (or its launcher) open.
fn isolate_fds(keep: i32) {
    if let Ok(null) = std::fs::File::open("/dev/null") {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
    for fd in 3..4096 {
        if fd != keep {
            let _ = nix::unistd::close(fd);
        }
    }
}

fn pid1_loop() -> ! {
    loop {
        match waitpid(None::<Pid>, None) {
            Err(nix::errno::Errno::ECHILD) => {
                nix::unistd::pause();
            }
            _ => continue,
        }
    }
}

/// Opens a pidfd for `pid`: a file descriptor that polls readable when the process exits.
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(internal("pidfd_open", std::io::Error::last_os_error()));
    }
    let fd = i32::try_from(fd).map_err(|e| internal("pidfd_open", e))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
