//! A small synchronous rtnetlink client: the handful of link, address and route requests the
//! pod network needs. A socket belongs to the network namespace it was opened in, so a caller
//! that opens one before `unshare(CLONE_NEWNET)` keeps talking to the node's namespace after.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
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

    /// The index of the link named `name`, or `None` when there is none.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(
            &format!("looking up link {name}"),
            RouteNetlinkMessage::GetLink(msg),
            0,
        ) {
            Ok(Some(RouteNetlinkMessage::NewLink(link))) => Ok(Some(link.header.index)),
            Ok(_) => Ok(None),
            Err(e) if e.errno == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The kind of the link at `index` (e.g. "bridge"), as the kernel names it.
    pub fn link_kind(&mut self, index: u32) -> Result<Option<String>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let answer = self.request(
            &format!("looking up link {index}"),
            RouteNetlinkMessage::GetLink(msg),
            0,
        )?;
        let Some(RouteNetlinkMessage::NewLink(link)) = answer else {
            return Ok(None);
        };
        for attr in link.attributes {
            if let LinkAttribute::LinkInfo(infos) = attr {
                for info in infos {
                    if let LinkInfo::Kind(kind) = info {
                        return Ok(Some(kind.to_string()));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Creates a bridge `name`. Fails with EEXIST when a link of that name exists.
    pub fn add_bridge(&mut self, name: &str) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )]));
        self.request(
            &format!("creating bridge {name}"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Creates a veth pair: `name` in this socket's namespace, its peer `peer` in the namespace
    /// of `peer_netns` (a namespace file descriptor).
    pub fn add_veth(&mut self, name: &str, peer: &str, peer_netns: RawFd) -> Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        peer_msg.attributes.push(LinkAttribute::NetNsFd(peer_netns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.request(
            &format!("creating veth pair {name}/{peer}"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Deletes the link at `index`.
    pub fn delete_link(&mut self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(
            &format!("deleting link {index}"),
            RouteNetlinkMessage::DelLink(msg),
            0,
        )
        .map(drop)
    }

    /// Brings the link at `index` up and, with `controller`, enslaves it to that bridge.
    pub fn set_up(&mut self, index: u32, controller: Option<u32>) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        if let Some(c) = controller {
            msg.attributes.push(LinkAttribute::Controller(c));
        }
        self.request(
            &format!("setting link {index} up"),
            RouteNetlinkMessage::SetLink(msg),
            0,
        )
        .map(drop)
    }

    /// Adds `address/prefix_len` to the link at `index`. An address already there is fine.
    pub fn add_address(&mut self, index: u32, address: Ipv4Addr, prefix_len: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix_len;
        msg.header.index = index;
        msg.attributes
            .push(AddressAttribute::Local(std::net::IpAddr::V4(address)));
        msg.attributes
            .push(AddressAttribute::Address(std::net::IpAddr::V4(address)));
        if prefix_len < 31 {
            let host_bits = u32::MAX.checked_shr(u32::from(prefix_len)).unwrap_or(0);
            msg.attributes
                .push(AddressAttribute::Broadcast(Ipv4Addr::from(
                    u32::from(address) | host_bits,
                )));
        }
        match self.request(
            &format!("adding address {address}/{prefix_len} to link {index}"),
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Err(e) if e.errno == Some(libc::EEXIST) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Adds a default route through `gateway` on the link at `index`.
    pub fn add_default_route(&mut self, index: u32, gateway: Ipv4Addr) -> Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.table = libc::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gateway)));
        msg.attributes.push(RouteAttribute::Oif(index));
        self.request(
            &format!("adding the default route via {gateway}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// The IPv4 routes of the main table that `protocol` made: (destination, prefix length,
    /// gateway).
    pub fn routes_of(&mut self, protocol: u8) -> Result<Vec<(Ipv4Addr, u8, Ipv4Addr)>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        let all = self.exchange(
            "listing routes",
            RouteNetlinkMessage::GetRoute(msg),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in all {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            if u8::from(r.header.protocol) != protocol || r.header.table != libc::RT_TABLE_MAIN {
                continue;
            }
            let mut dst = None;
            let mut gw = None;
            for a in &r.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
                    RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(*ip),
                    _ => {}
                }
            }
            if let (Some(dst), Some(gw)) = (dst, gw) {
                out.push((dst, r.header.destination_prefix_length, gw));
            }
        }
        Ok(out)
    }

    fn route_message(
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
    ) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.table = libc::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::from(protocol);
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        msg.header.destination_prefix_length = prefix_len;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gateway)));
        msg
    }

    /// Adds (or replaces) the route to `dst`/`prefix_len` via `gateway`, marked `protocol`.
    pub fn replace_route(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
    ) -> Result<()> {
        let msg = Self::route_message(dst, prefix_len, gateway, protocol);
        self.request(
            &format!("adding the route to {dst}/{prefix_len} via {gateway}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }

    /// Deletes the route to `dst`/`prefix_len` via `gateway` marked `protocol` (gone already
    /// is fine).
    pub fn delete_route(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
    ) -> Result<()> {
        let msg = Self::route_message(dst, prefix_len, gateway, protocol);
        match self.request(
            &format!("deleting the route to {dst}/{prefix_len} via {gateway}"),
            RouteNetlinkMessage::DelRoute(msg),
            0,
        ) {
            Err(e) if e.errno == Some(libc::ESRCH) => Ok(()),
            other => other.map(drop),
        }
    }
}
