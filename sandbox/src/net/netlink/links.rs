//! Links: looking them up, and making bridges, veth pairs and VXLAN devices.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};

use super::{Link, Netlink, Result, Vxlan};

impl Netlink {
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
}
