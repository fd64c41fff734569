//! Node ports forwarded to a pod (Kubernetes hostPorts), with no iptables: the sandbox process
//! binds each node port in the node's network namespace, then forks a proxy process that lives
//! in the pod's namespace and relays every TCP connection and UDP flow to the pod's address of
//! the same family. A node port with no node address listens on each family the pod has
//! (`0.0.0.0` and, IPv6-only, `[::]`), as the CNI portmap plugin maps both on a dual-stack pod.
//! The proxy dies with its sandbox process (parent-death signal) and so outlives the agent,
//! like the pod. Clients appear to the pod as coming from the pod's own address.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::unistd::{ForkResult, Pid, fork};

use crate::spec::{PortMapping, Protocol};
use crate::{Error, Kind, Result};

/// How long a UDP flow may be silent both ways before its relay socket is dropped.
const UDP_IDLE: Duration = Duration::from_secs(30);
/// How long connecting to the pod may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Stack size of the relay threads: they only copy bytes.
const STACK: usize = 128 * 1024;

/// A node port, bound.
pub struct Listener {
    pub mapping: PortMapping,
    /// The pod's address connections and datagrams are relayed to.
    pub target: IpAddr,
    socket: Socket,
}

enum Socket {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Listener {
    fn fd(&self) -> RawFd {
        match &self.socket {
            Socket::Tcp(l) => l.as_raw_fd(),
            Socket::Udp(s) => s.as_raw_fd(),
        }
    }
}

/// Binds the node ports of `mappings` in the caller's network namespace, for a pod with the
/// addresses `pod` (one per family). Mappings without a node port forward nothing and are
/// skipped. A port bound twice, in use on the node, or on a node address of a family the pod
/// has no address of, is an error naming it.
pub fn bind(mappings: &[PortMapping], pod: &[IpAddr]) -> Result<Vec<Listener>> {
    let mut out: Vec<Listener> = Vec::new();
    for m in mappings.iter().filter(|m| m.host_port != 0) {
        if m.container_port == 0 {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("node port {}/{} has no pod port", m.host_port, m.protocol),
            ));
        }
        let clash = out.iter().any(|l| {
            l.mapping.protocol == m.protocol
                && l.mapping.host_port == m.host_port
                && (l.mapping.host_ip == m.host_ip
                    || l.mapping.host_ip.is_none()
                    || m.host_ip.is_none())
        });
        if clash {
            let ip = m.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            return Err(Error::new(
                Kind::InvalidArgument,
                format!(
                    "node port {}/{} is mapped twice",
                    SocketAddr::new(ip, m.host_port),
                    m.protocol
                ),
            ));
        }
        // Where to listen, each with the pod's address of its family.
        let on: Vec<(IpAddr, IpAddr)> = match m.host_ip {
            Some(ip) => {
                let target = pod
                    .iter()
                    .find(|p| p.is_ipv6() == ip.is_ipv6())
                    .ok_or_else(|| {
                        Error::new(
                            Kind::InvalidArgument,
                            format!(
                                "node port {}/{}: the pod has no {} address to forward it to",
                                SocketAddr::new(ip, m.host_port),
                                m.protocol,
                                if ip.is_ipv6() { "IPv6" } else { "IPv4" }
                            ),
                        )
                    })?;
                vec![(ip, *target)]
            }
            None => pod
                .iter()
                .map(|p| {
                    let any = if p.is_ipv6() {
                        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                    } else {
                        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                    };
                    (any, *p)
                })
                .collect(),
        };
        for (ip, target) in on {
            let addr = SocketAddr::new(ip, m.host_port);
            let in_use = |e: std::io::Error| {
                let kind = if e.kind() == ErrorKind::AddrInUse {
                    Kind::FailedPrecondition
                } else {
                    Kind::InvalidArgument
                };
                Error::new(
                    kind,
                    format!("cannot listen on node port {addr}/{}: {e}", m.protocol),
                )
            };
            let socket = listen(addr, m.protocol).map_err(in_use)?;
            out.push(Listener {
                mapping: *m,
                target,
                socket,
            });
        }
    }
    Ok(out)
}

/// A socket listening on `addr`; on IPv6 for IPv6 only, beside its IPv4 twin.
fn listen(addr: SocketAddr, protocol: Protocol) -> std::io::Result<Socket> {
    if addr.is_ipv4() {
        return Ok(match protocol {
            Protocol::Tcp => Socket::Tcp(TcpListener::bind(addr)?),
            Protocol::Udp => Socket::Udp(UdpSocket::bind(addr)?),
        });
    }
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn6, bind, listen, setsockopt, socket,
        sockopt,
    };
    let kind = match protocol {
        Protocol::Tcp => SockType::Stream,
        Protocol::Udp => SockType::Datagram,
    };
    let fd: OwnedFd = socket(AddressFamily::Inet6, kind, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    let SocketAddr::V6(v6) = addr else {
        return Err(std::io::Error::from(ErrorKind::InvalidInput));
    };
    bind(fd.as_raw_fd(), &SockaddrIn6::from(v6))?;
    Ok(match protocol {
        Protocol::Tcp => {
            listen(&fd, Backlog::new(128).map_err(std::io::Error::from)?)?;
            Socket::Tcp(TcpListener::from(fd))
        }
        Protocol::Udp => Socket::Udp(UdpSocket::from(fd)),
    })
}

/// Forks the proxy for `listeners`, relaying each to its target (the pod's address). Call it
/// from the pod's network namespace while the process is single-threaded; the caller's copies
/// of the listening sockets are closed. Returns `None` when there is nothing to forward.
pub fn spawn_proxy(listeners: Vec<Listener>) -> Result<Option<Pid>> {
    if listeners.is_empty() {
        return Ok(None);
    }
    let parent = nix::unistd::getpid();
    // SAFETY: the sandbox process is single-threaded during set-up; the child only calls
    // async-signal-safe functions before it is on its own (and then may start threads).
    match unsafe { fork() }.map_err(|e| Error::new(Kind::Internal, format!("fork: {e}")))? {
        ForkResult::Parent { child } => Ok(Some(child)),
        ForkResult::Child => {
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            if nix::unistd::getppid() != parent {
                std::process::exit(0);
            }
            let keep: Vec<RawFd> = listeners.iter().map(Listener::fd).collect();
            isolate(&keep);
            run(listeners)
        }
    }
}

/// Stdout to the sandbox log (stderr), stdin from /dev/null, every other inherited
/// descriptor but `keep` closed: the proxy must not hold the sandbox's pipes or sockets.
fn isolate(keep: &[RawFd]) {
    let _ = nix::unistd::dup2(2, 1);
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
    }
    crate::fds::close_from(3, keep);
}

fn run(listeners: Vec<Listener>) -> ! {
    let mut threads = Vec::new();
    for l in listeners {
        let to = SocketAddr::new(l.target, l.mapping.container_port);
        let from = l.mapping;
        let t = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || match l.socket {
                Socket::Tcp(s) => serve_tcp(s, to),
                Socket::Udp(s) => serve_udp(s, to),
            });
        match t {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!("node port {}: no thread: {e}", from.host_port),
        }
    }
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(0)
}

fn spawn(f: impl FnOnce() + Send + 'static) -> bool {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .is_ok()
}

fn serve_tcp(listener: TcpListener, to: SocketAddr) {
    loop {
        match listener.accept() {
            Ok((client, _)) => {
                if !spawn(move || relay_tcp(client, to)) {
                    tracing::warn!("port proxy: no thread for a connection to {to}");
                }
            }
            Err(e) => {
                tracing::warn!("port proxy: accepting for {to}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Copies both ways between a node-port client and the pod, passing each half-close on.
fn relay_tcp(client: TcpStream, to: SocketAddr) {
    let pod = match TcpStream::connect_timeout(&to, CONNECT_TIMEOUT) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!("port proxy: connecting to {to}: {e}");
            return;
        }
    };
    let (Ok(mut client_r), Ok(mut pod_w)) = (client.try_clone(), pod.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let _ = std::io::copy(&mut client_r, &mut pod_w);
            let _ = pod_w.shutdown(Shutdown::Write);
        });
    let (mut pod_r, mut client_w) = (pod, client);
    let _ = std::io::copy(&mut pod_r, &mut client_w);
    let _ = client_w.shutdown(Shutdown::Write);
    if let Ok(t) = upstream {
        let _ = t.join();
    }
}

type Flows = Arc<Mutex<HashMap<SocketAddr, (UdpSocket, Instant)>>>;

/// Relays datagrams: each client address gets its own socket towards the pod, whose answers
/// go back to that client from the node port, until the flow has been idle for [`UDP_IDLE`].
fn serve_udp(socket: UdpSocket, to: SocketAddr) {
    let socket = Arc::new(socket);
    let flows: Flows = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("port proxy: receiving for {to}: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let pod = {
            let mut map = flows.lock().unwrap_or_else(|p| p.into_inner());
            match map.get_mut(&from) {
                Some((s, seen)) => {
                    *seen = Instant::now();
                    s.try_clone().ok()
                }
                None => new_flow(&socket, &flows, from, to).and_then(|s| {
                    let ours = s.try_clone().ok()?;
                    map.insert(from, (s, Instant::now()));
                    Some(ours)
                }),
            }
        };
        if let Some(pod) = pod {
            let _ = pod.send(&buf[..n]);
        }
    }
}

fn new_flow(
    socket: &Arc<UdpSocket>,
    flows: &Flows,
    client: SocketAddr,
    to: SocketAddr,
) -> Option<UdpSocket> {
    let any = if to.is_ipv6() {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let pod = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    pod.connect(to).ok()?;
    pod.set_read_timeout(Some(UDP_IDLE)).ok()?;
    let answers = pod.try_clone().ok()?;
    let (socket, flows) = (socket.clone(), flows.clone());
    let started = spawn(move || {
        let mut buf = vec![0u8; 65536];
        loop {
            match answers.recv(&mut buf) {
                Ok(n) => {
                    let _ = socket.send_to(&buf[..n], client);
                    if let Some((_, seen)) = flows
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_mut(&client)
                    {
                        *seen = Instant::now();
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let mut map = flows.lock().unwrap_or_else(|p| p.into_inner());
                    if map
                        .get(&client)
                        .is_none_or(|(_, seen)| seen.elapsed() >= UDP_IDLE)
                    {
                        map.remove(&client);
                        return;
                    }
                }
                // Nothing listens in the pod (ICMP port unreachable): keep the flow.
                Err(_) => {}
            }
        }
    });
    started.then_some(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host_port: u16, container_port: u16) -> PortMapping {
        PortMapping {
            protocol: Protocol::Tcp,
            host_ip: None,
            host_port,
            container_port,
        }
    }

    const POD4: [IpAddr; 1] = [IpAddr::V4(Ipv4Addr::new(10, 88, 0, 2))];

    #[test]
    fn a_port_listens_on_each_family_of_the_pod() {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let v6: IpAddr = "fd00:88::2".parse().unwrap();
        let both = bind(&[tcp(port, 80)], &[POD4[0], v6]).unwrap();
        let on: Vec<(String, IpAddr)> = both
            .iter()
            .map(|l| match &l.socket {
                Socket::Tcp(t) => (t.local_addr().unwrap().ip().to_string(), l.target),
                Socket::Udp(_) => unreachable!(),
            })
            .collect();
        // [::] listens for IPv6 only: it could not be bound beside 0.0.0.0 otherwise.
        assert_eq!(
            on,
            [("0.0.0.0".to_string(), POD4[0]), ("::".to_string(), v6)]
        );
        drop(both);
        let e = bind(
            &[PortMapping {
                host_ip: Some("::1".parse().unwrap()),
                ..tcp(port, 80)
            }],
            &POD4,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("no IPv6 address"), "{e}");
        let l = bind(
            &[PortMapping {
                host_ip: Some("::1".parse().unwrap()),
                ..tcp(port, 80)
            }],
            &[v6],
        )
        .unwrap();
        assert_eq!(l[0].target, v6);
    }

    #[test]
    fn ports_mapped_twice_or_in_use_are_refused_by_name() {
        // Mappings without a node port forward nothing.
        assert!(bind(&[tcp(0, 80)], &POD4).unwrap().is_empty());
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = bind(&[tcp(port, 80)], &POD4).err().unwrap();
        assert_eq!(e.kind(), Kind::FailedPrecondition);
        assert!(e.to_string().contains(&format!("{port}/TCP")), "{e}");
        drop(taken);
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let e = bind(&[tcp(port, 80), tcp(port, 81)], &POD4).err().unwrap();
        assert!(e.to_string().contains("mapped twice"), "{e}");
        // The same number over UDP is another port.
        let both = bind(
            &[
                tcp(port, 80),
                PortMapping {
                    protocol: Protocol::Udp,
                    ..tcp(port, 80)
                },
            ],
            &POD4,
        )
        .unwrap();
        assert_eq!(both.len(), 2);
        let e = bind(&[tcp(port, 0)], &POD4).err().unwrap();
        assert!(e.to_string().contains("no pod port"), "{e}");
    }

    /// The relays on loopback (the proxy process itself only adds the fork and namespaces):
    /// a TCP echo through a node port, half-close passed on; UDP answers back to each client.
    #[test]
    fn tcp_and_udp_relays_carry_both_ways() {
        use std::io::{Read, Write};
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in echo.incoming().flatten() {
                let mut w = c.try_clone().unwrap();
                let mut r = c;
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut r, &mut w);
                    let _ = w.shutdown(Shutdown::Write);
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        std::thread::spawn(move || serve_tcp(front, echo_addr));
        for i in 0..3 {
            let mut c = TcpStream::connect(front_addr).unwrap();
            let msg = format!("hello {i}");
            c.write_all(msg.as_bytes()).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            let mut back = String::new();
            c.read_to_string(&mut back).unwrap();
            assert_eq!(back, msg);
        }

        let udp_echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_echo_addr = udp_echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = udp_echo.recv_from(&mut buf) {
                let mut reply = b"echo ".to_vec();
                reply.extend_from_slice(&buf[..n]);
                let _ = udp_echo.send_to(&reply, from);
            }
        });
        let udp_front = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_front_addr = udp_front.local_addr().unwrap();
        std::thread::spawn(move || serve_udp(udp_front, udp_echo_addr));
        let clients: Vec<UdpSocket> = (0..2)
            .map(|_| {
                let c = UdpSocket::bind("127.0.0.1:0").unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                c
            })
            .collect();
        for round in 0..2 {
            for (i, c) in clients.iter().enumerate() {
                let msg = format!("c{i} r{round}");
                c.send_to(msg.as_bytes(), udp_front_addr).unwrap();
                let mut buf = [0u8; 1500];
                let (n, from) = c.recv_from(&mut buf).unwrap();
                assert_eq!(from, udp_front_addr);
                assert_eq!(&buf[..n], format!("echo {msg}").as_bytes());
            }
        }
    }
}
