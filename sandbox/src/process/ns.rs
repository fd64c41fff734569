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

/// The sandbox's helper processes: those [`enter_pod_namespaces`] started, and the holder of a
/// shared PID namespace.
#[derive(Debug, Default)]
pub struct Helpers {
    /// The node-port proxy, when the pod forwards node ports.
    pub port_proxy: Option<Pid>,
    /// The holder of the pod's user namespace, when it has one.
    pub userns_holder: Option<Pid>,
    /// The holder of the pod's PID namespace, when its containers share one.
    pub pid_ns_holder: Option<Pid>,
}

impl Helpers {
    fn all(&mut self) -> [(&mut Option<Pid>, &'static str); 3] {
        [
            (&mut self.pid_ns_holder, "PID namespace holder"),
            (&mut self.userns_holder, "user namespace holder"),
            (
                &mut self.port_proxy,
                "node-port proxy (its node ports are closed)",
            ),
        ]
    }

    /// Forgets the helper `pid` if it is one (it exited); false when it is none of them.
    pub fn exited(&mut self, pid: Pid, ws: nix::sys::wait::WaitStatus) -> bool {
        for (slot, what) in self.all() {
            if *slot == Some(pid) {
                tracing::error!("the pod's {what} exited ({ws:?})");
                *slot = None;
                return true;
            }
        }
        false
    }

    /// Kills every helper and reaps it.
    pub fn stop_all(&mut self) {
        for (slot, _) in self.all() {
            if let Some(pid) = slot.take() {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(pid, None);
            }
        }
    }
}

/// Unshares the pod's network, IPC and UTS namespaces as the spec asks (or, with a user
/// namespace, joins those a holder process made inside it), sets the hostname, brings loopback
/// up, plumbs the pod's network interface and applies the sysctls. Must be called while the
/// process is single-threaded.
pub fn enter_pod_namespaces(spec: &Spec) -> Result<Helpers> {
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
    let mut helpers = Helpers::default();
    if let Some(maps) = &spec.user_namespace {
        if !own_net || spec.namespaces.ipc == NamespaceMode::Node {
            return Err(Error::new(
                Kind::InvalidArgument,
                "a pod user namespace needs the pod's own network and IPC namespaces",
            ));
        }
        // The pod's namespaces belong to its user namespace; this process stays in the node's
        // (it goes on creating containers, cgroups and mounts) and joins them.
        let holder = start_userns_holder(maps)?;
        helpers.userns_holder = Some(holder);
        for (name, flag) in [
            ("net", CloneFlags::CLONE_NEWNET),
            ("uts", CloneFlags::CLONE_NEWUTS),
            ("ipc", CloneFlags::CLONE_NEWIPC),
        ] {
            let path = format!("/proc/{holder}/ns/{name}");
            let f = std::fs::File::open(&path).map_err(|e| Error::io("opening", &path, e))?;
            nix::sched::setns(f, flag).map_err(|e| internal(&format!("joining {path}"), e))?;
        }
    } else if !flags.is_empty() {
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
    if let Some((_, node)) = network {
        helpers.port_proxy = crate::net::ports::spawn_proxy(node.listeners)?;
    }
    Ok(helpers)
}

/// Starts the holder of a new user namespace with `maps`, with the pod's network, UTS and IPC
/// namespaces made inside it, and returns its PID. It dies with the sandbox process.
/// Must be called while the process is single-threaded.
fn start_userns_holder(maps: &crate::spec::IdMappings) -> Result<Pid> {
    let (from_child, to_parent) = pipe().map_err(|e| internal("pipe", e))?;
    let (from_parent, to_child) = pipe().map_err(|e| internal("pipe", e))?;
    let parent = nix::unistd::getpid();
    // SAFETY: the sandbox process is single-threaded here, so the child may run arbitrary code.
    match unsafe { fork() }.map_err(|e| internal("fork", e))? {
        ForkResult::Child => {
            drop(from_child);
            drop(to_child);
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let step = |done: &[u8]| -> bool {
                let mut b = [0u8; 1];
                write(&to_parent, done).is_ok()
                    && (done == b"n"
                        || matches!(
                            read(std::os::fd::AsRawFd::as_raw_fd(&from_parent), &mut b),
                            Ok(1)
                        ))
            };
            let ok = nix::unistd::getppid() == parent
                && unshare(CloneFlags::CLONE_NEWUSER).is_ok()
                && step(b"u")
                && unshare(
                    CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC,
                )
                .is_ok()
                && step(b"n");
            if !ok {
                std::process::exit(1);
            }
            drop(to_parent);
            isolate_fds(-1);
            loop {
                nix::unistd::pause();
            }
        }
        ForkResult::Parent { child } => {
            drop(to_parent);
            drop(from_parent);
            let fail = |what: &str| {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
                internal("starting the pod's user namespace", what)
            };
            let mut b = [0u8; 1];
            let raw = std::os::fd::AsRawFd::as_raw_fd(&from_child);
            if !matches!(read(raw, &mut b), Ok(1)) || b[0] != b'u' {
                return Err(fail("the holder could not unshare a user namespace"));
            }
            for (file, r) in [("uid_map", maps.uids), ("gid_map", maps.gids)] {
                let path = format!("/proc/{child}/{file}");
                let line = format!("{} {} {}\n", r.container, r.host, r.size);
                if let Err(e) = std::fs::write(&path, line) {
                    return Err(fail(&format!("writing {path}: {e}")));
                }
            }
            if write(&to_child, b"m").is_err() {
                return Err(fail("the holder went away"));
            }
            if !matches!(read(raw, &mut b), Ok(1)) || b[0] != b'n' {
                return Err(fail("the holder could not make the pod's namespaces"));
            }
            Ok(child)
        }
    }
}

/// Sets `sysctls` (names `.` separated) in the caller's namespaces, as `/proc/sys` shows
/// them to it; the error names the first that failed.
pub fn set_sysctls(sysctls: &BTreeMap<String, String>) -> Result<()> {
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
pub fn start_pid_namespace_holder(userns_holder: Option<Pid>) -> Result<Pid> {
    // With a pod user namespace the PID namespace belongs to it (its containers mount /proc).
    let userns = match userns_holder {
        Some(h) => {
            let path = format!("/proc/{h}/ns/user");
            Some(std::fs::File::open(&path).map_err(|e| Error::io("opening", &path, e))?)
        }
        None => None,
    };
    let (r, w) = pipe().map_err(|e| internal("pipe", e))?;
    // SAFETY: the sandbox process is single-threaded here, so the child may run arbitrary code.
    match unsafe { fork() }.map_err(|e| internal("fork", e))? {
        ForkResult::Child => {
            drop(r);
            let joined = match userns {
                Some(f) => nix::sched::setns(f, CloneFlags::CLONE_NEWUSER).is_ok(),
                None => true,
            };
            isolate_fds(std::os::fd::AsRawFd::as_raw_fd(&w));
            let unshared = if joined {
                unshare(CloneFlags::CLONE_NEWPID)
            } else {
                Err(nix::errno::Errno::EPERM)
            };
            let code = match unshared {
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
    // `keep` -1: close them all.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
    crate::fds::close_from(3, &[keep]);
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
