//! IPv4 and IPv6 addresses and routes.

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Netlink, Result, Route};

impl Netlink {
    /// Adds `address/prefix_len` to the link at `index`. An address already there is fine.
    /// An IPv6 address is usable at once: no duplicate address detection (`nodad`), as the
    /// addresses come from the node's own allocator.
    pub fn add_address(&mut self, index: u32, address: IpAddr, prefix_len: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(address);
        msg.header.prefix_len = prefix_len;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Local(address));
        msg.attributes.push(AddressAttribute::Address(address));
        match address {
            IpAddr::V4(v4) if prefix_len < 31 => {
                let host_bits = u32::MAX.checked_shr(u32::from(prefix_len)).unwrap_or(0);
                msg.attributes
                    .push(AddressAttribute::Broadcast(Ipv4Addr::from(
                        u32::from(v4) | host_bits,
                    )));
            }
            IpAddr::V6(_) => {
                msg.attributes
                    .push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            IpAddr::V4(_) => {}
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

    /// The node's IPv4 and IPv6 addresses: (link index, address, prefix length).
    pub fn addresses(&mut self) -> Result<Vec<(u32, IpAddr, u8)>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = AddressMessage::default();
            msg.header.family = family;
            let all = self.exchange(
                "listing addresses",
                RouteNetlinkMessage::GetAddress(msg),
                NLM_F_DUMP,
            )?;
            for m in all {
                let RouteNetlinkMessage::NewAddress(a) = m else {
                    continue;
                };
                if a.header.family != family {
                    continue;
                }
                let mut local = None;
                let mut address = None;
                for attr in &a.attributes {
                    match attr {
                        AddressAttribute::Local(ip) => local = Some(*ip),
                        AddressAttribute::Address(ip) => address = Some(*ip),
                        _ => {}
                    }
                }
                if let Some(ip) = local.or(address) {
                    out.push((a.header.index, ip, a.header.prefix_len));
                }
            }
        }
        Ok(out)
    }

    /// The node's IPv4 addresses: (link index, address, prefix length).
    pub fn ipv4_addresses(&mut self) -> Result<Vec<(u32, Ipv4Addr, u8)>> {
        Ok(self
            .addresses()?
            .into_iter()
            .filter_map(|(i, ip, len)| match ip {
                IpAddr::V4(v4) => Some((i, v4, len)),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// Removes `address/prefix_len` from the link at `index` (gone already is fine).
    pub fn delete_address(&mut self, index: u32, address: IpAddr, prefix_len: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(address);
        msg.header.prefix_len = prefix_len;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Local(address));
        match self.request(
            &format!("removing address {address}/{prefix_len} from link {index}"),
            RouteNetlinkMessage::DelAddress(msg),
            0,
        ) {
            Err(e) if e.errno == Some(libc::EADDRNOTAVAIL) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Adds a default route through `gateway` (of its family) on the link at `index`.
    pub fn add_default_route(&mut self, index: u32, gateway: IpAddr) -> Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(gateway);
        msg.header.table = libc::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(RouteAttribute::Gateway(route_address(gateway)));
        msg.attributes.push(RouteAttribute::Oif(index));
        self.request(
            &format!("adding the default route via {gateway}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// The IPv4 and IPv6 routes of the main table that `protocol` made and that have a
    /// gateway.
    pub fn routes_of(&mut self, protocol: u8) -> Result<Vec<Route>> {
        let mut out = self.routes_of_family(protocol, AddressFamily::Inet)?;
        out.extend(self.routes_of_family(protocol, AddressFamily::Inet6)?);
        Ok(out)
    }

    fn routes_of_family(&mut self, protocol: u8, family: AddressFamily) -> Result<Vec<Route>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
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
                    RouteAttribute::Destination(a) => dst = ip_of(a),
                    RouteAttribute::Gateway(a) => gw = ip_of(a),
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
        dst: IpAddr,
        prefix_len: u8,
        gateway: IpAddr,
        protocol: u8,
        onlink_dev: Option<u32>,
    ) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(dst);
        msg.header.table = libc::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::from(protocol);
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        msg.header.destination_prefix_length = prefix_len;
        msg.attributes
            .push(RouteAttribute::Destination(route_address(dst)));
        msg.attributes
            .push(RouteAttribute::Gateway(route_address(gateway)));
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
        dst: IpAddr,
        prefix_len: u8,
        gateway: IpAddr,
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
        dst: IpAddr,
        prefix_len: u8,
        gateway: IpAddr,
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
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    }
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(v4) => RouteAddress::Inet(v4),
        IpAddr::V6(v6) => RouteAddress::Inet6(v6),
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}
