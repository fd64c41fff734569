//! The routes to other nodes' pod subnets (the kubelet's `host-gw` mode): one route per
//! other node's subnet via that node's address, in the main table, marked with a protocol
//! number of nodelet's own so that [`sync`] knows which routes are its to change or remove.
//! The routes through a VXLAN device carry the same number but belong to [`super::vxlan`]:
//! [`sync`] leaves them alone.

use std::net::IpAddr;

use super::netlink::Netlink;
use super::{Subnet, nl_error};
use crate::Result;

/// The routing protocol number nodelet's node routes carry (`proto 110` in `ip route`).
pub const PROTOCOL: u8 = 110;

/// Makes the node's routes marked [`PROTOCOL`] exactly `want` (subnet via gateway, IPv4 and
/// IPv6 alike; a gateway is of its subnet's family): missing
/// ones added, changed ones replaced, others deleted. Returns how many routes changed. The
/// routes through a VXLAN device are not counted among the node's here, whatever their
/// protocol: [`super::vxlan::sync`] keeps them.
pub fn sync(want: &[(Subnet, IpAddr)]) -> Result<usize> {
    let mut nl = Netlink::open().map_err(nl_error)?;
    let mut have = Vec::new();
    // Whether each output link seen is a VXLAN device, asked once per link.
    let mut vxlan: Vec<(u32, bool)> = Vec::new();
    for route in nl.routes_of(PROTOCOL).map_err(nl_error)? {
        if let Some(oif) = route.oif {
            let is_vxlan = match vxlan.iter().find(|(i, _)| *i == oif) {
                Some((_, v)) => *v,
                None => {
                    let v = nl.link_kind(oif).map_err(nl_error)?.as_deref() == Some("vxlan");
                    vxlan.push((oif, v));
                    v
                }
            };
            if is_vxlan {
                continue;
            }
        }
        have.push((route.dst, route.prefix_len, route.gateway));
    }
    let mut changed = 0;
    for (subnet, gw) in want {
        let present = have
            .iter()
            .any(|(d, l, g)| *d == subnet.network && *l == subnet.prefix_len && g == gw);
        if !present {
            nl.replace_route(subnet.network, subnet.prefix_len, *gw, PROTOCOL, None)
                .map_err(nl_error)?;
            changed += 1;
        }
    }
    for (dst, len, gw) in have {
        let wanted = want
            .iter()
            .any(|(s, g)| s.network == dst && s.prefix_len == len && *g == gw);
        if !wanted {
            nl.delete_route(dst, len, gw, PROTOCOL, None)
                .map_err(nl_error)?;
            changed += 1;
        }
    }
    Ok(changed)
}
