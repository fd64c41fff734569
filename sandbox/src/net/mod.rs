//! The pod network, with no CNI binaries: a bridge on the node, one veth pair per pod (`eth0`
//! in the pod's namespace, the other end on the bridge), addresses from [`Ipam`], and node
//! ports forwarded to pods by a small proxy process ([`ports`]). Between nodes, either plain
//! routes ([`routes`], `host-gw`) or a VXLAN overlay ([`vxlan`]).
//!
//! The sandbox process does the plumbing itself, in two steps around its
//! `unshare(CLONE_NEWNET)`: [`prepare`] opens what it needs of the node's namespace (a netlink
//! socket, the namespace itself, the listening sockets of the node ports), [`plumb`] then
//! creates and configures the veth pair from inside the pod's namespace. When the sandbox
//! process ends, its namespace goes and the veth pair with it.

pub mod ipam;
pub mod nat;
mod netlink;
pub mod ports;
pub mod routes;
pub mod vxlan;

use std::fs::File;
use std::os::fd::AsRawFd;

pub use ipam::{Ipam, Lease, Subnet};
use netlink::{Netlink, NetlinkError};

use crate::spec::PodNetwork;
use crate::{Error, Kind, Result};

/// The name of the pod's interface.
pub const POD_INTERFACE: &str = "eth0";

fn nl_error(e: NetlinkError) -> Error {
    let kind = match e.errno {
        Some(libc::EEXIST) => Kind::AlreadyExists,
        Some(libc::EPERM) | Some(libc::EACCES) => Kind::FailedPrecondition,
        _ => Kind::Internal,
    };
    Error::new(kind, e.to_string())
}

/// Checks an interface name as the kernel would (at most 15 bytes, no `/`, blank or `:`).
pub fn check_interface_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            Kind::InvalidArgument,
            format!("{name:?} is not a valid interface name (1 to 15 characters, no '/' or ':')"),
        ))
    }
}

/// Makes sure the bridge `name` exists, is up and has the subnet's gateway address, in the
/// caller's network namespace. Returns its index.
pub fn ensure_bridge(name: &str, subnet: Subnet) -> Result<u32> {
    let mut nl = Netlink::open().map_err(nl_error)?;
    ensure_bridge_with(&mut nl, name, subnet)
}

fn ensure_bridge_with(nl: &mut Netlink, name: &str, subnet: Subnet) -> Result<u32> {
    check_interface_name(name)?;
    if nl.link_index(name).map_err(nl_error)?.is_none() {
        match nl.add_bridge(name) {
            Err(e) if e.errno == Some(libc::EEXIST) => {}
            other => other.map_err(nl_error)?,
        }
    }
    let index = nl.link_index(name).map_err(nl_error)?.ok_or_else(|| {
        Error::new(
            Kind::Internal,
            format!("bridge {name} vanished after it was created"),
        )
    })?;
    let kind = nl.link_kind(index).map_err(nl_error)?;
    if kind.as_deref() != Some("bridge") {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!(
                "the node has a link named {name} that is not a bridge ({}); choose another \
                 bridge name",
                kind.as_deref().unwrap_or("unknown kind")
            ),
        ));
    }
    nl.add_address(index, subnet.gateway(), subnet.prefix_len)
        .map_err(nl_error)?;
    nl.set_up(index, None).map_err(nl_error)?;
    Ok(index)
}

/// Makes sure pods can leave the node: forwarding on for each family of `subnets`, and the
/// masquerade tables of `bridge` for `subnets` in place (`replace` rewrites them even when
/// present, e.g. at start-up, so that a changed subnet takes effect).
pub fn ensure_masquerade(
    bridge: &str,
    subnets: &[Subnet],
    cluster: &[Subnet],
    replace: bool,
) -> Result<()> {
    ensure_forwarding(subnets)?;
    if replace || !nat::installed(bridge, subnets)? {
        nat::install(bridge, subnets, cluster)?;
    }
    Ok(())
}

/// Turns forwarding on for each family of `subnets` (IPv4's `ip_forward`, IPv6's
/// `conf/all/forwarding`), as the CNI bridge plugin does for its `ipMasq`.
pub fn ensure_forwarding(subnets: &[Subnet]) -> Result<()> {
    let mut files = Vec::new();
    if subnets.iter().any(|s| !s.is_ipv6()) {
        files.push("/proc/sys/net/ipv4/ip_forward");
    }
    if subnets.iter().any(|s| s.is_ipv6()) {
        files.push("/proc/sys/net/ipv6/conf/all/forwarding");
    }
    for forward in files {
        if std::fs::read_to_string(forward)
            .map(|v| v.trim() != "1")
            .unwrap_or(true)
        {
            std::fs::write(forward, "1")
                .map_err(|e| Error::io("enabling forwarding in", forward, e))?;
        }
    }
    Ok(())
}

/// Undoes [`ensure_bridge`] and [`ensure_masquerade`]: removes the masquerade table and the
/// bridge `name` (which must be a bridge; pods still on it lose their network).
pub fn remove_node_network(name: &str) -> Result<()> {
    nat::remove(name)?;
    let mut nl = Netlink::open().map_err(nl_error)?;
    let Some(index) = nl.link_index(name).map_err(nl_error)? else {
        return Ok(());
    };
    if nl.link_kind(index).map_err(nl_error)?.as_deref() != Some("bridge") {
        return Err(Error::new(
            Kind::FailedPrecondition,
            format!("{name} is not a bridge; left alone"),
        ));
    }
    nl.delete_link(index).map_err(nl_error)
}

/// What the sandbox process keeps of the node's network namespace across its unshare.
pub struct NodeSide {
    netlink: Netlink,
    netns: File,
    bridge: u32,
    /// The node ports, bound in the node's namespace.
    pub listeners: Vec<ports::Listener>,
}

/// Step one, in the node's network namespace: checks the spec, makes sure the bridge is there
/// (with a gateway address of each of the pod's families) and binds the node ports (a port in
/// use fails the pod here, with a message naming it).
pub fn prepare(net: &PodNetwork) -> Result<NodeSide> {
    check_interface_name(&net.host_interface)?;
    let mut subnets = Vec::new();
    for a in net.addresses() {
        let subnet = Subnet::containing(a.gateway, a.prefix_len)
            .map_err(|e| Error::new(Kind::InvalidArgument, format!("pod network: {e}")))?;
        if !subnet.assignable(a.address) || subnet.gateway() != a.gateway {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!(
                    "pod address {}/{} with gateway {} is not a usable address of that subnet",
                    a.address, a.prefix_len, a.gateway
                ),
            ));
        }
        if subnets
            .iter()
            .any(|s: &Subnet| s.is_ipv6() == subnet.is_ipv6())
        {
            return Err(Error::new(
                Kind::InvalidArgument,
                format!("pod network: two addresses of one family ({})", a.address),
            ));
        }
        subnets.push(subnet);
    }
    let mut netlink = Netlink::open().map_err(nl_error)?;
    let mut bridge = 0;
    for subnet in subnets {
        bridge = ensure_bridge_with(&mut netlink, &net.bridge, subnet)?;
    }
    let netns = File::open("/proc/self/ns/net")
        .map_err(|e| Error::io("opening", "/proc/self/ns/net", e))?;
    let pod: Vec<std::net::IpAddr> = net.addresses().map(|a| a.address).collect();
    let listeners = ports::bind(&net.ports, &pod)?;
    Ok(NodeSide {
        netlink,
        netns,
        bridge,
        listeners,
    })
}

/// Step two, inside the pod's new network namespace: the veth pair, its addresses, a default
/// route per family, and the node's end on the bridge.
pub fn plumb(node: &mut NodeSide, net: &PodNetwork) -> Result<()> {
    let mut pod = Netlink::open().map_err(nl_error)?;
    pod.add_veth(POD_INTERFACE, &net.host_interface, node.netns.as_raw_fd())
        .map_err(nl_error)?;
    let host = node
        .netlink
        .link_index(&net.host_interface)
        .map_err(nl_error)?
        .ok_or_else(|| {
            Error::new(
                Kind::Internal,
                format!(
                    "the node end {} of the veth pair is missing",
                    net.host_interface
                ),
            )
        })?;
    node.netlink
        .set_up(host, Some(node.bridge))
        .map_err(nl_error)?;
    let eth0 = pod
        .link_index(POD_INTERFACE)
        .map_err(nl_error)?
        .ok_or_else(|| Error::new(Kind::Internal, "the pod's eth0 is missing"))?;
    for a in net.addresses() {
        pod.add_address(eth0, a.address, a.prefix_len)
            .map_err(nl_error)?;
    }
    pod.set_up(eth0, None).map_err(nl_error)?;
    for a in net.addresses() {
        pod.add_default_route(eth0, a.gateway).map_err(nl_error)?;
    }
    Ok(())
}
