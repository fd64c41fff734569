//! A small synchronous rtnetlink client: the handful of link, address, route and neighbour
//! requests the pod network and the VXLAN overlay need. A socket belongs to the network namespace it was opened in, so a caller
//! that opens one before `unshare(CLONE_NEWNET)` keeps talking to the node's namespace after.

mod addresses;
mod links;
mod neighbours;

use std::net::Ipv4Addr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::Socket;

use netlink_sys::protocols::NETLINK_ROUTE;

/// A netlink failure: the request and the kernel's errno (or the socket's error).
#[derive(Debug)]
pub struct NetlinkError {
    pub what: String,
    pub errno: Option<i32>,
    pub message: String,
}

impl std::fmt::Display for NetlinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.message)
    }
}

type Result<T> = std::result::Result<T, NetlinkError>;

fn io_err(what: &str, e: std::io::Error) -> NetlinkError {
    NetlinkError {
        what: what.to_string(),
        errno: e.raw_os_error(),
        message: e.to_string(),
    }
}

/// A route netlink socket bound in the network namespace of the thread that opened it.
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    pub fn open() -> Result<Self> {
        let mut socket =
            Socket::new(NETLINK_ROUTE).map_err(|e| io_err("opening a netlink socket", e))?;
        socket
            .bind_auto()
            .map_err(|e| io_err("binding a netlink socket", e))?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Sends `msg` with `flags` (plus REQUEST and ACK) and waits for the kernel's answer: the
    /// first non-error message (for a GET) or the ACK.
    fn request(
        &mut self,
        what: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Option<RouteNetlinkMessage>> {
        Ok(self.exchange(what, msg, flags)?.into_iter().next())
    }

    /// Sends `msg` with `flags` (plus REQUEST and ACK) and gathers every message of the
    /// answer until its end (a dump's DONE, or the ACK).
    fn exchange(
        &mut self,
        what: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(|e| io_err(what, e))?;
        let mut answer = Vec::new();
        let mut rx = vec![0u8; 64 * 1024];
        loop {
            let n = self
                .socket
                .recv(&mut &mut rx[..], 0)
                .map_err(|e| io_err(what, e))?;
            let mut offset = 0;
            while offset < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[offset..n])
                    .map_err(|e| NetlinkError {
                        what: what.to_string(),
                        errno: None,
                        message: format!("unreadable netlink answer: {e}"),
                    })?;
                let len = reply.header.length as usize;
                if reply.header.sequence_number == self.seq {
                    match reply.payload {
                        NetlinkPayload::Error(e) => {
                            return match e.code {
                                None => Ok(answer),
                                Some(code) => {
                                    let errno = -code.get();
                                    Err(NetlinkError {
                                        what: what.to_string(),
                                        errno: Some(errno),
                                        message: std::io::Error::from_raw_os_error(errno)
                                            .to_string(),
                                    })
                                }
                            };
                        }
                        NetlinkPayload::Done(_) => return Ok(answer),
                        NetlinkPayload::InnerMessage(m) => answer.push(m),
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }
}

/// A link as the kernel describes it (what nodelet looks at of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub up: bool,
    /// Its kind ("bridge", "vxlan", ...); `None` for a plain device.
    pub kind: Option<String>,
    /// Its hardware address, when it has a 6-byte one.
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    /// Its VXLAN settings, when it is a VXLAN device.
    pub vxlan: Option<Vxlan>,
}

/// A VXLAN device's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vxlan {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub local: Option<Ipv4Addr>,
    pub learning: bool,
}

/// A route of the main table with a gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub dst: std::net::IpAddr,
    pub prefix_len: u8,
    pub gateway: std::net::IpAddr,
    /// The link it goes out through, when the kernel says.
    pub oif: Option<u32>,
}

/// An IPv4 (ARP) or IPv6 (NDP) neighbour entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub ip: std::net::IpAddr,
    pub mac: Option<[u8; 6]>,
    /// Whether it is NUD_PERMANENT (set by hand, not learnt).
    pub permanent: bool,
}
