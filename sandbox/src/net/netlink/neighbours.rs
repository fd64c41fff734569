//! Neighbours: the forwarding entries of VXLAN devices and the IPv4 (ARP) and IPv6 (NDP)
//! entries.

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Neighbour, Netlink, Result};
use crate::net::vxlan::format_mac;

impl Netlink {
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

    /// The IPv4 (ARP) and IPv6 (NDP) neighbour entries of the link at `index`.
    pub fn neighbours(&mut self, index: u32) -> Result<Vec<Neighbour>> {
        let mut all = self.neighbours_of(AddressFamily::Inet, index)?;
        all.extend(self.neighbours_of(AddressFamily::Inet6, index)?);
        let mut out = Vec::new();
        for n in all {
            let mut ip = None;
            let mut mac = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(addr)) => {
                        ip = Some(IpAddr::V4(*addr));
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(addr)) => {
                        ip = Some(IpAddr::V6(*addr));
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

    fn neighbour_message(index: u32, ip: IpAddr) -> NeighbourMessage {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = index;
        let (family, address) = match ip {
            IpAddr::V4(v4) => (AddressFamily::Inet, NeighbourAddress::Inet(v4)),
            IpAddr::V6(v6) => (AddressFamily::Inet6, NeighbourAddress::Inet6(v6)),
        };
        msg.header.family = family;
        msg.attributes
            .push(NeighbourAttribute::Destination(address));
        msg
    }

    /// Makes `ip` a permanent neighbour at `mac` on the link at `index` (`ip neigh replace
    /// ... nud permanent`).
    pub fn replace_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()> {
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
    pub fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> Result<()> {
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
