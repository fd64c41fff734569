//! The node side of a VXLAN overlay between nodes (the shape of flannel's `vxlan` backend):
//! one VXLAN device per node with its own pod subnet's network address on it, and per other
//! node three entries on that device, all permanent:
//!
//! - a forwarding entry: that node's VTEP MAC is reached through its address (`bridge fdb`);
//! - a neighbour entry: that node's subnet's network address has that MAC (`ip neigh`);
//! - a route: that node's subnet via its network address, on the device, `onlink`, marked
//!   [`routes::PROTOCOL`](super::routes::PROTOCOL) (`ip route`).
//!
//! A packet for a pod on another node thus goes through the device to the other node's
//! network address, whose MAC the neighbour entry gives, whose endpoint the forwarding entry
//! gives. [`super::routes::sync`] leaves the routes through VXLAN devices alone, and [`sync`]
//! touches only the routes through its device.

use std::net::{IpAddr, Ipv4Addr};

use super::netlink::{Link, Netlink, Route};
use super::routes::PROTOCOL;
use super::{Subnet, check_interface_name, nl_error};
use crate::{Error, Kind, Result};

/// What VXLAN adds to every packet (outer Ethernet, IPv4, UDP and VXLAN headers): the
/// device's MTU is its underlying link's minus this.
pub const OVERHEAD: u32 = 50;

/// The VXLAN device's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its name, e.g. "nodelet.1".
    pub name: String,
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The UDP port of the tunnel, on every node (8472, the Linux default flannel uses).
    pub port: u16,
    /// This node's address: the tunnel's source.
    pub local: Ipv4Addr,
    /// `None`: the MTU of the link holding `local`, minus [`OVERHEAD`].
    pub mtu: Option<u32>,
}

/// One other node: its pod subnet, its IPv6 pod subnet on a dual-stack cluster (carried
/// through the same IPv4 tunnel), its tunnel endpoint (its address), its VTEP's MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub subnet: Subnet,
    pub subnet6: Option<Subnet>,
    pub endpoint: Ipv4Addr,
    pub mac: [u8; 6],
}

impl Peer {
    /// The peer's pod subnets: the IPv4 one, then the IPv6 one.
    fn subnets(&self) -> impl Iterator<Item = Subnet> {
        std::iter::once(self.subnet).chain(self.subnet6)
    }
}

/// Whether `r` is the route of a peer's subnet `s`: to the subnet, through the peer's VTEP
/// address on the device (the subnet's network address, flannel's layout).
fn routes_subnet(r: &Route, s: Subnet) -> bool {
    r.dst == s.network && r.prefix_len == s.prefix_len && r.gateway == s.network
}

/// Formats a MAC as "aa:bb:cc:dd:ee:ff".
pub fn format_mac(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

/// Parses a MAC written "aa:bb:cc:dd:ee:ff" (either case); `None` when it is not one.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    match parts.next() {
        Some(_) => None,
        None => Some(mac),
    }
}

fn is_vxlan(link: &Link) -> bool {
    link.kind.as_deref() == Some("vxlan")
}

fn not_vxlan(name: &str, link: &Link) -> Error {
    Error::new(
        Kind::FailedPrecondition,
        format!(
            "the node has a link named {name} that is not a VXLAN device ({}); choose another \
             VXLAN device name",
            link.kind.as_deref().unwrap_or("no kind")
        ),
    )
}

/// Whether the VXLAN device `link` has `dev`'s settings (the MTU aside, which can be changed
/// in place).
fn settings_match(link: &Link, dev: &Device) -> bool {
    link.vxlan.as_ref().is_some_and(|v| {
        v.vni == Some(dev.vni)
            && v.port == Some(dev.port)
            && v.local == Some(dev.local)
            && !v.learning
    })
}

/// The MTU of the link holding `local`, minus [`OVERHEAD`].
fn default_mtu(nl: &mut Netlink, local: Ipv4Addr) -> Result<u32> {
    let holder = nl
        .ipv4_addresses()
        .map_err(nl_error)?
        .into_iter()
        .find(|(_, ip, _)| *ip == local)
        .map(|(index, _, _)| index);
    let no_mtu = |why: &str| {
        Error::new(
            Kind::FailedPrecondition,
            format!("the VXLAN device's MTU: {why}; set the MTU explicitly"),
        )
    };
    let Some(index) = holder else {
        return Err(no_mtu(&format!(
            "no link of the node has the tunnel's source address {local}"
        )));
    };
    let mtu = nl
        .link(index)
        .map_err(nl_error)?
        .and_then(|l| l.mtu)
        .ok_or_else(|| no_mtu(&format!("the link holding {local} has no MTU")))?;
    mtu.checked_sub(OVERHEAD)
        .filter(|m| *m >= 68)
        .ok_or_else(|| {
            no_mtu(&format!(
                "the link holding {local} has an MTU of {mtu}, too small for VXLAN"
            ))
        })
}

/// Makes sure the device exists with these settings (created when missing; when it exists
/// with a different VNI, port or source address, or with learning on, it is deleted and made
/// again; a link of that name that is not a VXLAN device is an error), learning off, up, with
/// its MTU, and with `own_subnet`'s network address as a /32 address on it (as flannel puts
/// 10.244.1.0/32 on flannel.1), any other IPv4 address on it removed. Returns the device's
/// MAC (its VTEP MAC, which the other nodes need to reach this one).
pub fn ensure(dev: &Device, own_subnet: Subnet, own_subnet6: Option<Subnet>) -> Result<[u8; 6]> {
    check_interface_name(&dev.name)?;
    let own = ipv4_subnet(own_subnet)?;
    if let Some(s6) = own_subnet6.filter(|s| !s.is_ipv6()) {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("{s6} is not an IPv6 pod subnet"),
        ));
    }
    if dev.vni > 0x00ff_ffff {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("VXLAN network identifier {} is over 24 bits", dev.vni),
        ));
    }
    if dev.port == 0 {
        return Err(Error::new(
            Kind::InvalidArgument,
            "the VXLAN port must not be 0",
        ));
    }
    let name = &dev.name;
    let mut nl = Netlink::open().map_err(nl_error)?;
    let mtu = match dev.mtu {
        Some(mtu) => mtu,
        None => default_mtu(&mut nl, dev.local)?,
    };
    let mut existing = match nl.link_index(name).map_err(nl_error)? {
        Some(index) => nl.link(index).map_err(nl_error)?,
        None => None,
    };
    if let Some(link) = &existing {
        if !is_vxlan(link) {
            return Err(not_vxlan(name, link));
        }
        if !settings_match(link, dev) {
            match nl.delete_link(link.index) {
                Err(e) if e.errno == Some(libc::ENODEV) => {}
                other => other.map_err(nl_error)?,
            }
            existing = None;
        }
    }
    let link = match existing {
        Some(link) => link,
        None => {
            match nl.add_vxlan(name, dev.vni, dev.port, dev.local, mtu) {
                Err(e) if e.errno == Some(libc::EEXIST) => {}
                other => other.map_err(nl_error)?,
            }
            let vanished = || {
                Error::new(
                    Kind::Internal,
                    format!("VXLAN device {name} vanished after it was created"),
                )
            };
            let index = nl
                .link_index(name)
                .map_err(nl_error)?
                .ok_or_else(vanished)?;
            let link = nl.link(index).map_err(nl_error)?.ok_or_else(vanished)?;
            if !is_vxlan(&link) {
                return Err(not_vxlan(name, &link));
            }
            if !settings_match(&link, dev) {
                return Err(Error::new(
                    Kind::Internal,
                    format!("VXLAN device {name} was made by someone else meanwhile, differently"),
                ));
            }
            link
        }
    };
    let index = link.index;
    if link.mtu != Some(mtu) {
        nl.set_mtu(index, mtu).map_err(nl_error)?;
    }
    if !link.up {
        nl.set_up(index, None).map_err(nl_error)?;
    }
    let mut wanted = vec![(IpAddr::V4(own), 32)];
    wanted.extend(own_subnet6.map(|s| (s.network, 128)));
    for (ip, len) in &wanted {
        nl.add_address(index, *ip, *len).map_err(nl_error)?;
    }
    for (i, ip, len) in nl.addresses().map_err(nl_error)? {
        let link_local = matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
        if i == index && !link_local && !wanted.contains(&(ip, len)) {
            nl.delete_address(index, ip, len).map_err(nl_error)?;
        }
    }
    link.mac.ok_or_else(|| {
        Error::new(
            Kind::Internal,
            format!("VXLAN device {name} has no MAC address"),
        )
    })
}

/// The network address of `subnet`, which must be IPv4: the overlay carries IPv4 pod subnets.
fn ipv4_subnet(subnet: Subnet) -> Result<Ipv4Addr> {
    match subnet.network {
        IpAddr::V4(v4) => Ok(v4),
        IpAddr::V6(_) => Err(Error::new(
            Kind::InvalidArgument,
            format!("pod subnet {subnet}: the VXLAN routes carry IPv4 pod subnets only"),
        )),
    }
}

/// Checks that `peers` can all be on one device: an IPv4 subnet (and an IPv6 one at most),
/// real unicast MACs, no subnet and no MAC twice.
fn check_peers(peers: &[Peer]) -> Result<()> {
    for (i, p) in peers.iter().enumerate() {
        ipv4_subnet(p.subnet)?;
        if let Some(s6) = p.subnet6.filter(|s| !s.is_ipv6()) {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("{s6} is not an IPv6 pod subnet"),
            ));
        }
        if p.mac == [0; 6] || p.mac[0] & 1 == 1 {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!(
                    "the VTEP MAC {} of the node with subnet {} is not a unicast MAC",
                    format_mac(p.mac),
                    p.subnet
                ),
            ));
        }
        for q in &peers[..i] {
            if q.subnet.network == p.subnet.network
                || (p.subnet6.is_some() && q.subnet6 == p.subnet6)
            {
                return Err(Error::new(
                    Kind::InvalidArgument,
                    format!(
                        "two nodes have pod subnet {} (endpoints {} and {})",
                        p.subnet, q.endpoint, p.endpoint
                    ),
                ));
            }
            if q.mac == p.mac {
                return Err(Error::new(
                    Kind::InvalidArgument,
                    format!(
                        "two nodes have VTEP MAC {} (subnets {} and {})",
                        format_mac(p.mac),
                        q.subnet,
                        p.subnet
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Makes the forwarding entries of device `dev_name` exactly `peers`: per peer, a forwarding
/// entry (its MAC -> its endpoint), a permanent neighbour entry (its subnet's network address
/// -> its MAC) and a route (its subnet via its network address, through the device, onlink,
/// marked [`PROTOCOL`], main table). Entries for peers no longer wanted are removed: only on
/// this device, and of the routes only those marked [`PROTOCOL`], of the neighbour entries
/// only the permanent ones. Returns how many entries changed. With no peers and no device
/// there is nothing to do; with peers the device must exist ([`ensure`]).
pub fn sync(dev_name: &str, peers: &[Peer]) -> Result<usize> {
    check_interface_name(dev_name)?;
    check_peers(peers)?;
    let mut nl = Netlink::open().map_err(nl_error)?;
    let link = match nl.link_index(dev_name).map_err(nl_error)? {
        Some(index) => nl.link(index).map_err(nl_error)?,
        None => None,
    };
    let Some(link) = link else {
        if peers.is_empty() {
            return Ok(0);
        }
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!("there is no VXLAN device {dev_name} to reach the other nodes through"),
        ));
    };
    if !is_vxlan(&link) {
        return Err(not_vxlan(dev_name, &link));
    }
    let index = link.index;
    let mut changed = 0;

    let fdb = nl.fdb_entries(index).map_err(nl_error)?;
    for p in peers {
        if !fdb.contains(&(p.mac, p.endpoint)) {
            nl.replace_fdb(index, p.mac, p.endpoint).map_err(nl_error)?;
            changed += 1;
        }
    }
    let neighbours = nl.neighbours(index).map_err(nl_error)?;
    for p in peers {
        for s in p.subnets() {
            let present = neighbours
                .iter()
                .any(|n| n.ip == s.network && n.mac == Some(p.mac) && n.permanent);
            if !present {
                nl.replace_neighbour(index, s.network, p.mac)
                    .map_err(nl_error)?;
                changed += 1;
            }
        }
    }
    let routes: Vec<_> = nl
        .routes_of(PROTOCOL)
        .map_err(nl_error)?
        .into_iter()
        .filter(|r| r.oif == Some(index))
        .collect();
    for p in peers {
        for s in p.subnets() {
            if !routes.iter().any(|r| routes_subnet(r, s)) {
                nl.replace_route(s.network, s.prefix_len, s.network, PROTOCOL, Some(index))
                    .map_err(nl_error)?;
                changed += 1;
            }
        }
    }

    for r in &routes {
        if !peers
            .iter()
            .any(|p| p.subnets().any(|s| routes_subnet(r, s)))
        {
            nl.delete_route(r.dst, r.prefix_len, r.gateway, PROTOCOL, Some(index))
                .map_err(nl_error)?;
            changed += 1;
        }
    }
    for n in neighbours.iter().filter(|n| n.permanent) {
        if !peers.iter().any(|p| p.subnets().any(|s| s.network == n.ip)) {
            nl.delete_neighbour(index, n.ip).map_err(nl_error)?;
            changed += 1;
        }
    }
    for (mac, dst) in fdb {
        // A wanted MAC's entry with another endpoint was replaced above.
        if !peers.iter().any(|p| p.mac == mac) {
            nl.delete_fdb(index, mac, dst).map_err(nl_error)?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Removes the VXLAN device `dev_name` (its entries and routes go with it). Ok when it does
/// not exist; a link of that name that is not a VXLAN device is left alone, an error.
pub fn remove(dev_name: &str) -> Result<()> {
    check_interface_name(dev_name)?;
    let mut nl = Netlink::open().map_err(nl_error)?;
    let Some(index) = nl.link_index(dev_name).map_err(nl_error)? else {
        return Ok(());
    };
    let Some(link) = nl.link(index).map_err(nl_error)? else {
        return Ok(());
    };
    if !is_vxlan(&link) {
        return Err(not_vxlan(dev_name, &link));
    }
    match nl.delete_link(index) {
        Err(e) if e.errno == Some(libc::ENODEV) => Ok(()),
        other => other.map_err(nl_error),
    }
}

#[cfg(test)]
mod tests;
