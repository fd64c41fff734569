//! A small synchronous rtnetlink client: the handful of link, address, route and neighbour
//! requests the pod network and the VXLAN overlay need. A socket belongs to the network namespace it was opened in, so a caller
//! that opens one before `unshare(CLONE_NEWNET)` keeps talking to the node's namespace after.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::Socket;

use super::vxlan::format_mac;
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

    /// The kernel's description of the link at `index`, or `None` when there is none.
    fn get_link(&mut self, index: u32) -> Result<Option<LinkMessage>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request(
            &format!("looking up link {index}"),
            RouteNetlinkMessage::GetLink(msg),
            0,
        ) {
            Ok(Some(RouteNetlinkMessage::NewLink(link))) => Ok(Some(link)),
            Ok(_) => Ok(None),
            Err(e) if e.errno == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The kind of the link at `index` (e.g. "bridge"), as the kernel names it.
    pub fn link_kind(&mut self, index: u32) -> Result<Option<String>> {
        Ok(self.link(index)?.and_then(|l| l.kind))
    }

    /// What the kernel says of the link at `index`, or `None` when there is none.
    pub fn link(&mut self, index: u32) -> Result<Option<Link>> {
        let Some(msg) = self.get_link(index)? else {
            return Ok(None);
        };
        let mut link = Link {
            index: msg.header.index,
            up: msg.header.flags.contains(LinkFlags::Up),
            kind: None,
            mac: None,
            mtu: None,
            vxlan: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::Address(bytes) => link.mac = <[u8; 6]>::try_from(bytes).ok(),
                LinkAttribute::Mtu(mtu) => link.mtu = Some(mtu),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                            LinkInfo::Data(InfoData::Vxlan(data)) => {
                                let mut v = Vxlan::default();
                                for d in data {
                                    match d {
                                        InfoVxlan::Id(id) => v.vni = Some(id),
                                        InfoVxlan::Port(port) => v.port = Some(port),
                                        InfoVxlan::Local(ip) => v.local = Some(ip),
                                        InfoVxlan::Learning(on) => v.learning = on,
                                        _ => {}
                                    }
                                }
                                link.vxlan = Some(v);
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Some(link))
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

    /// Creates a VXLAN device `name`: VNI `vni`, UDP port `port`, tunnel source `local`, MTU
    /// `mtu`, source-address learning off. Fails with EEXIST when a link of that name exists.
    pub fn add_vxlan(
        &mut self,
        name: &str,
        vni: u32,
        port: u16,
        local: Ipv4Addr,
        mtu: u32,
    ) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vxlan),
            LinkInfo::Data(InfoData::Vxlan(vec![
                InfoVxlan::Id(vni),
                InfoVxlan::Local(local),
                InfoVxlan::Port(port),
                InfoVxlan::Learning(false),
            ])),
        ]));
        self.request(
            &format!("creating vxlan device {name} (VNI {vni}, port {port}, local {local})"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Sets the MTU of the link at `index`.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(
            &format!("setting the MTU of link {index} to {mtu}"),
            RouteNetlinkMessage::SetLink(msg),
            0,
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

    /// The node's IPv4 addresses: (link index, address, prefix length).
    pub fn ipv4_addresses(&mut self) -> Result<Vec<(u32, Ipv4Addr, u8)>> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        let all = self.exchange(
            "listing addresses",
            RouteNetlinkMessage::GetAddress(msg),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in all {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.family != AddressFamily::Inet {
                continue;
            }
            let mut local = None;
            let mut address = None;
            for attr in &a.attributes {
                match attr {
                    AddressAttribute::Local(std::net::IpAddr::V4(ip)) => local = Some(*ip),
                    AddressAttribute::Address(std::net::IpAddr::V4(ip)) => address = Some(*ip),
                    _ => {}
                }
            }
            if let Some(ip) = local.or(address) {
                out.push((a.header.index, ip, a.header.prefix_len));
            }
        }
        Ok(out)
    }

    /// Removes `address/prefix_len` from the link at `index` (gone already is fine).
    pub fn delete_address(&mut self, index: u32, address: Ipv4Addr, prefix_len: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix_len;
        msg.header.index = index;
        msg.attributes
            .push(AddressAttribute::Local(std::net::IpAddr::V4(address)));
        match self.request(
            &format!("removing address {address}/{prefix_len} from link {index}"),
            RouteNetlinkMessage::DelAddress(msg),
            0,
        ) {
            Err(e) if e.errno == Some(libc::EADDRNOTAVAIL) => Ok(()),
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

    /// The IPv4 routes of the main table that `protocol` made and that have a gateway.
    pub fn routes_of(&mut self, protocol: u8) -> Result<Vec<Route>> {
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
            let mut oif = None;
            for a in &r.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
                    RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(*ip),
                    RouteAttribute::Oif(index) => oif = Some(*index),
                    _ => {}
                }
            }
            if let (Some(dst), Some(gateway)) = (dst, gw) {
                out.push(Route {
                    dst,
                    prefix_len: r.header.destination_prefix_length,
                    gateway,
                    oif,
                });
            }
        }
        Ok(out)
    }

    fn route_message(
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
        onlink_dev: Option<u32>,
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
        if let Some(dev) = onlink_dev {
            msg.header.flags = RouteFlags::Onlink;
            msg.attributes.push(RouteAttribute::Oif(dev));
        }
        msg
    }

    /// Adds (or replaces) the route to `dst`/`prefix_len` via `gateway`, marked `protocol`;
    /// with `onlink_dev`, through that link and with the gateway taken as on it (`onlink`),
    /// else through whichever link the kernel finds the gateway on.
    pub fn replace_route(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
        onlink_dev: Option<u32>,
    ) -> Result<()> {
        let msg = Self::route_message(dst, prefix_len, gateway, protocol, onlink_dev);
        self.request(
            &format!("adding the route to {dst}/{prefix_len} via {gateway}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }

    /// Deletes the route to `dst`/`prefix_len` via `gateway` marked `protocol`, through
    /// `oif` when given (gone already is fine).
    pub fn delete_route(
        &mut self,
        dst: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        protocol: u8,
        oif: Option<u32>,
    ) -> Result<()> {
        let msg = Self::route_message(dst, prefix_len, gateway, protocol, oif);
        match self.request(
            &format!("deleting the route to {dst}/{prefix_len} via {gateway}"),
            RouteNetlinkMessage::DelRoute(msg),
            0,
        ) {
            Err(e) if e.errno == Some(libc::ESRCH) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Dumps the neighbour table of `family` (AF_INET: ARP; AF_BRIDGE: forwarding entries)
    /// and keeps the entries of the link at `index`.
    fn neighbours_of(
        &mut self,
        family: AddressFamily,
        index: u32,
    ) -> Result<Vec<NeighbourMessage>> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family;
        let all = self.exchange(
            "listing neighbours",
            RouteNetlinkMessage::GetNeighbour(msg),
            NLM_F_DUMP,
        )?;
        Ok(all
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n)
                    if n.header.family == family && n.header.ifindex == index =>
                {
                    Some(n)
                }
                _ => None,
            })
            .collect())
    }

    /// The forwarding entries of the (VXLAN) link at `index` that send a MAC to a remote
    /// IPv4 endpoint: (MAC, endpoint). The all-zero default entries are left out.
    pub fn fdb_entries(&mut self, index: u32) -> Result<Vec<([u8; 6], Ipv4Addr)>> {
        let mut out = Vec::new();
        for n in self.neighbours_of(AddressFamily::Bridge, index)? {
            let mut mac = None;
            let mut dst = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(bytes) => {
                        mac = <[u8; 6]>::try_from(bytes.as_slice()).ok();
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                        dst = Some(*ip);
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                        dst = <[u8; 4]>::try_from(bytes.as_slice())
                            .ok()
                            .map(Ipv4Addr::from);
                    }
                    _ => {}
                }
            }
            if let (Some(mac), Some(dst)) = (mac, dst)
                && mac != [0; 6]
            {
                out.push((mac, dst));
            }
        }
        Ok(out)
    }

    fn fdb_message(index: u32, mac: [u8; 6], dst: Ipv4Addr) -> NeighbourMessage {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.flags = NeighbourFlags::Own;
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(dst)));
        msg
    }

    /// Makes `mac` go to remote `dst` on the (VXLAN) link at `index`, a permanent forwarding
    /// entry (`bridge fdb replace`): an entry of that MAC with another remote is changed.
    /// (Appending, as `bridge fdb append`, is for the all-zero and multicast MACs only: the
    /// kernel leaves a unicast MAC's entry as it is.)
    pub fn replace_fdb(&mut self, index: u32, mac: [u8; 6], dst: Ipv4Addr) -> Result<()> {
        self.request(
            &format!(
                "setting the forwarding entry {} -> {dst} of link {index}",
                format_mac(mac)
            ),
            RouteNetlinkMessage::NewNeighbour(Self::fdb_message(index, mac, dst)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }

    /// Deletes the forwarding entry `mac` -> remote `dst` of the link at `index` (gone
    /// already is fine).
    pub fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: Ipv4Addr) -> Result<()> {
        match self.request(
            &format!(
                "deleting the forwarding entry {} -> {dst} of link {index}",
                format_mac(mac)
            ),
            RouteNetlinkMessage::DelNeighbour(Self::fdb_message(index, mac, dst)),
            0,
        ) {
            Err(e) if e.errno == Some(libc::ENOENT) => Ok(()),
            other => other.map(drop),
        }
    }

    /// The IPv4 neighbour (ARP) entries of the link at `index`.
    pub fn ipv4_neighbours(&mut self, index: u32) -> Result<Vec<Neighbour>> {
        let mut out = Vec::new();
        for n in self.neighbours_of(AddressFamily::Inet, index)? {
            let mut ip = None;
            let mut mac = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(addr)) => {
                        ip = Some(*addr);
                    }
                    NeighbourAttribute::LinkLayerAddress(bytes) => {
                        mac = <[u8; 6]>::try_from(bytes.as_slice()).ok();
                    }
                    _ => {}
                }
            }
            if let Some(ip) = ip {
                out.push(Neighbour {
                    ip,
                    mac,
                    permanent: n.header.state == NeighbourState::Permanent,
                });
            }
        }
        Ok(out)
    }

    fn neighbour_message(index: u32, ip: Ipv4Addr) -> NeighbourMessage {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.ifindex = index;
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        msg
    }

    /// Makes `ip` a permanent neighbour at `mac` on the link at `index` (`ip neigh replace
    /// ... nud permanent`).
    pub fn replace_neighbour(&mut self, index: u32, ip: Ipv4Addr, mac: [u8; 6]) -> Result<()> {
        let mut msg = Self::neighbour_message(index, ip);
        msg.header.state = NeighbourState::Permanent;
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.request(
            &format!("setting neighbour {ip} on link {index}"),
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
    }

    /// Deletes the neighbour entry of `ip` on the link at `index` (gone already is fine).
    pub fn delete_neighbour(&mut self, index: u32, ip: Ipv4Addr) -> Result<()> {
        match self.request(
            &format!("deleting neighbour {ip} of link {index}"),
            RouteNetlinkMessage::DelNeighbour(Self::neighbour_message(index, ip)),
            0,
        ) {
            Err(e) if e.errno == Some(libc::ENOENT) => Ok(()),
            other => other.map(drop),
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
    pub dst: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
    /// The link it goes out through, when the kernel says.
    pub oif: Option<u32>,
}

/// An IPv4 neighbour (ARP) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub ip: Ipv4Addr,
    pub mac: Option<[u8; 6]>,
    /// Whether it is NUD_PERMANENT (set by hand, not learnt).
    pub permanent: bool,
}
