//! Masquerading of pod traffic that leaves the pod subnet, as the CNI bridge plugin's `ipMasq`
//! does, with no iptables or nft binary: one nftables table per bridge, written over netlink.
//!
//! ```text
//! table ip nodelet-<bridge> {
//!     chain postrouting {
//!         type nat hook postrouting priority srcnat; policy accept;
//!         ip saddr <pod CIDR> ip daddr != <pod CIDR> masquerade
//!     }
//! }
//! ```
//! With several pod CIDRs on one bridge (the node's podCIDR changed under running pods), one
//! rule per CIDR, each leaving traffic to any of them alone. IPv6 pod CIDRs get the same in a
//! `table ip6` of the same name (`ip6 saddr … ip6 daddr != … masquerade`).
//!
//! [`install`] replaces the table in one atomic batch (so a changed CIDR replaces the old rule);
//! [`installed`] tells whether it is still there (someone may flush the ruleset).

use std::time::Duration;

use netlink_packet_core_09::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_netfilter::nftables::{
    Bitwise, ChainAttribute, ChainMessage, Cmp, DataAttribute, Expressions, Hook, InetHookNumber,
    NfTablesMessage, Operator, Payload, Register, RuleAttribute, RuleMessage, TableAttribute,
    TableMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::Subnet;
use crate::{Error, Kind, Result};

/// The nftables table of the bridge `bridge`.
pub fn table_name(bridge: &str) -> String {
    format!("nodelet-{bridge}")
}

const CHAIN: &str = "postrouting";
/// Where the payload expression reads from: the network header.
const NETWORK_HEADER: u32 = 1;
/// The families a table is made for, with where their headers hold the addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    const ALL: [Family; 2] = [Family::V4, Family::V6];

    fn of(subnet: &Subnet) -> Family {
        if subnet.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        }
    }

    fn proto(self) -> NetfilterProtoFamily {
        match self {
            Family::V4 => NetfilterProtoFamily::IPv4,
            Family::V6 => NetfilterProtoFamily::IPv6,
        }
    }

    /// Offsets of the source and destination addresses in the network header.
    fn saddr(self) -> u32 {
        match self {
            Family::V4 => 12,
            Family::V6 => 8,
        }
    }

    fn daddr(self) -> u32 {
        match self {
            Family::V4 => 16,
            Family::V6 => 24,
        }
    }
}
/// `srcnat`, the priority of source NAT chains.
const SRCNAT: u32 = 100;
const ACCEPT: u32 = 1;

fn fail(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Kind::Internal, format!("{what}: {e}"))
}

fn message(
    family: NetfilterProtoFamily,
    inner: impl Into<NetfilterMessageInner>,
    flags: u16,
    seq: u32,
) -> NetlinkMessage<NetfilterMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            inner,
        )),
    );
    m.finalize();
    m
}

fn batch_marker(begin: bool, seq: u32) -> NetlinkMessage<NetfilterMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = seq;
    let control = if begin {
        ControlMessage::BatchBegin
    } else {
        ControlMessage::BatchEnd
    };
    let nftables = u16::from(libc::NFNL_SUBSYS_NFTABLES as u8);
    let mut m = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, nftables),
            control,
        )),
    );
    m.finalize();
    m
}

fn table(name: &str) -> TableMessage {
    TableMessage {
        attributes: vec![TableAttribute::Name(name.to_string())],
    }
}

/// `ip[6] <field> [!=|==] <subnet>`: load the address, mask it, compare it with the network.
fn match_subnet(offset: u32, subnet: Subnet, op: Operator) -> Vec<Expressions> {
    let mask = subnet.mask_bytes();
    let len = u32::try_from(mask.len()).unwrap_or(4);
    vec![
        Expressions::Payload(vec![
            Payload::DestinationRegister(Register::Reg1),
            Payload::Base(NETWORK_HEADER),
            Payload::Offset(offset),
            Payload::Len(len),
        ]),
        Expressions::Bitwise(vec![
            Bitwise::SourceRegister(Register::Reg1),
            Bitwise::DestinationRegister(Register::Reg1),
            Bitwise::Length(len),
            Bitwise::Mask(DataAttribute::Value(mask.clone())),
            Bitwise::Xor(DataAttribute::Value(vec![0; mask.len()])),
        ]),
        Expressions::Cmp(vec![
            Cmp::SourceRegister(Register::Reg1),
            Cmp::Op(op),
            Cmp::Data(DataAttribute::Value(subnet.network_bytes())),
        ]),
    ]
}

/// The messages that replace the table of `bridge` in `family` with one masquerading traffic
/// from each of `subnets` (all of that family) to anywhere but them and the `cluster` subnets
/// of that family.
fn replace_batch(
    family: Family,
    bridge: &str,
    subnets: &[Subnet],
    cluster: &[Subnet],
) -> Vec<NetlinkMessage<NetfilterMessage>> {
    let name = table_name(bridge);
    let ip = || family.proto();
    let req = NLM_F_REQUEST | NLM_F_ACK;
    let rule = |source: Subnet, seq: u32| {
        let mut expressions = match_subnet(family.saddr(), source, Operator::Equal);
        let mut local: Vec<Subnet> = subnets.to_vec();
        local.extend(
            cluster
                .iter()
                .filter(|c| Family::of(c) == family && !subnets.contains(c)),
        );
        for s in local {
            expressions.extend(match_subnet(family.daddr(), s, Operator::NotEqual));
        }
        expressions.push(Expressions::Other {
            expression_type: "masq".to_string(),
            attributes: Vec::new(),
        });
        message(
            ip(),
            NfTablesMessage::NewRule(RuleMessage {
                attributes: vec![
                    RuleAttribute::Table(name.clone()),
                    RuleAttribute::Chain(CHAIN.to_string()),
                    RuleAttribute::Expressions(expressions.into_iter().map(Into::into).collect()),
                ],
            }),
            req | NLM_F_CREATE | NLM_F_APPEND,
            seq,
        )
    };
    let rules: Vec<_> = subnets
        .iter()
        .zip(FIRST_RULE_SEQ..)
        .map(|(s, seq)| rule(*s, seq))
        .collect();
    let end = FIRST_RULE_SEQ + u32::try_from(subnets.len()).unwrap_or(0);
    let mut batch = vec![
        batch_marker(true, 1),
        // Create-then-delete-then-create: the delete always has a table to remove.
        message(
            ip(),
            NfTablesMessage::NewTable(table(&name)),
            req | NLM_F_CREATE,
            2,
        ),
        message(ip(), NfTablesMessage::DeleteTable(table(&name)), req, 3),
        message(
            ip(),
            NfTablesMessage::NewTable(table(&name)),
            req | NLM_F_CREATE,
            4,
        ),
        message(
            ip(),
            NfTablesMessage::NewChain(ChainMessage {
                attributes: vec![
                    ChainAttribute::Table(name.clone()),
                    ChainAttribute::Name(CHAIN.to_string()),
                    ChainAttribute::Type("nat".to_string()),
                    ChainAttribute::Hook(vec![
                        Hook::Number(InetHookNumber::PostRouting.into()),
                        Hook::Priority(SRCNAT),
                    ]),
                    ChainAttribute::Policy(ACCEPT),
                ],
            }),
            req | NLM_F_CREATE,
            5,
        ),
    ];
    batch.extend(rules);
    batch.push(batch_marker(false, end));
    batch
}

/// The sequence number of the first rule in [`replace_batch`] (after the table and chain).
const FIRST_RULE_SEQ: u32 = 6;

/// The kernel refused a request (or its answer could not be read): the errno.
#[derive(Debug)]
struct Refused(i32);

impl Refused {
    fn into_error(self, what: &str) -> Error {
        let kind = if self.0 == libc::EPERM {
            Kind::FailedPrecondition
        } else {
            Kind::Internal
        };
        Error::new(
            kind,
            format!("{what}: {}", std::io::Error::from_raw_os_error(self.0)),
        )
    }
}

struct Nfnl(Socket);

impl Nfnl {
    fn open() -> Result<Self> {
        let mut s = Socket::new(NETLINK_NETFILTER).map_err(|e| fail("netfilter socket", e))?;
        s.bind_auto().map_err(|e| fail("netfilter socket", e))?;
        let timeout = nix::sys::time::TimeVal::from(libc::timeval {
            tv_sec: Duration::from_secs(5).as_secs() as libc::time_t,
            tv_usec: 0,
        });
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| fail("netfilter socket", e))?;
        Ok(Nfnl(s))
    }

    fn send(&self, msgs: &[NetlinkMessage<NetfilterMessage>]) -> Result<()> {
        let mut buf = Vec::new();
        for m in msgs {
            let start = buf.len();
            buf.resize(start + m.buffer_len(), 0);
            m.serialize(&mut buf[start..]);
        }
        self.0
            .send(&buf, 0)
            .map_err(|e| fail("netfilter send", e))?;
        Ok(())
    }

    /// Reads answers until every sequence number in `waiting` is acknowledged (or answered),
    /// or one of them fails. Returns the answered messages.
    fn answers(&self, mut waiting: Vec<u32>) -> std::result::Result<Vec<NfTablesMessage>, Refused> {
        let mut out = Vec::new();
        let mut rx = vec![0u8; 64 * 1024];
        while !waiting.is_empty() {
            let n = self
                .0
                .recv(&mut &mut rx[..], 0)
                .map_err(|e| Refused(e.raw_os_error().unwrap_or(libc::EIO)))?;
            let mut offset = 0;
            while offset < n {
                let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&rx[offset..n])
                    .map_err(|_| Refused(libc::EBADMSG))?;
                let len = msg.header.length as usize;
                let seq = msg.header.sequence_number;
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        if let Some(code) = e.code {
                            return Err(Refused(-code.get()));
                        }
                        waiting.retain(|&s| s != seq);
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        if let NetfilterMessageInner::NfTables(t) = m.inner {
                            out.push(t);
                        }
                    }
                    NetlinkPayload::Done(_) => waiting.retain(|&s| s != seq),
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
        Ok(out)
    }
}

/// Replaces the masquerading tables of `bridge` with ones for `subnets` (at least one; a
/// table per family they are of, the other family's removed), leaving traffic to the `cluster`
/// subnets (other nodes' pods, routed) alone too.
pub fn install(bridge: &str, subnets: &[Subnet], cluster: &[Subnet]) -> Result<()> {
    if subnets.is_empty() {
        return Err(Error::new(
            Kind::InvalidArgument,
            format!("masquerading bridge {bridge}: no pod subnet"),
        ));
    }
    let nl = Nfnl::open()?;
    for family in Family::ALL {
        let of: Vec<Subnet> = subnets
            .iter()
            .filter(|s| Family::of(s) == family)
            .copied()
            .collect();
        if of.is_empty() {
            remove_family(&nl, bridge, family)?;
            continue;
        }
        nl.send(&replace_batch(family, bridge, &of, cluster))?;
        let rules = u32::try_from(of.len()).unwrap_or(0);
        let seqs: Vec<u32> = (2..FIRST_RULE_SEQ + rules).collect();
        nl.answers(seqs).map(drop).map_err(|e| {
            e.into_error(&format!(
                "installing the masquerade rule of bridge {bridge} ({family:?})"
            ))
        })?;
    }
    Ok(())
}

/// Whether the masquerading table of `bridge` exists for each family of `subnets`.
pub fn installed(bridge: &str, subnets: &[Subnet]) -> Result<bool> {
    let nl = Nfnl::open()?;
    for family in Family::ALL {
        if !subnets.iter().any(|s| Family::of(s) == family) {
            continue;
        }
        nl.send(&[message(
            family.proto(),
            NfTablesMessage::GetTable(table(&table_name(bridge))),
            NLM_F_REQUEST | NLM_F_ACK,
            1,
        )])?;
        match nl.answers(vec![1]) {
            Ok(_) => {}
            Err(Refused(libc::ENOENT)) => return Ok(false),
            Err(e) => return Err(e.into_error("looking up the masquerade table")),
        }
    }
    Ok(true)
}

fn remove_family(nl: &Nfnl, bridge: &str, family: Family) -> Result<()> {
    nl.send(&[
        batch_marker(true, 1),
        message(
            family.proto(),
            NfTablesMessage::DeleteTable(table(&table_name(bridge))),
            NLM_F_REQUEST | NLM_F_ACK,
            2,
        ),
        batch_marker(false, 3),
    ])?;
    match nl.answers(vec![2]) {
        // Not there, or a family the kernel has no nftables for (IPv6 disabled): nothing to
        // remove.
        Ok(_)
        | Err(Refused(libc::ENOENT))
        | Err(Refused(libc::EAFNOSUPPORT))
        | Err(Refused(libc::EOPNOTSUPP)) => Ok(()),
        Err(e) => Err(e.into_error("removing the masquerade table")),
    }
}

/// Removes the masquerading tables of `bridge`, if any.
pub fn remove(bridge: &str) -> Result<()> {
    let nl = Nfnl::open()?;
    for family in Family::ALL {
        remove_family(&nl, bridge, family)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Install, look up, replace and remove a table in the node's nftables (root only; the
    /// traffic itself is tested end to end in tests/builtin_network.rs).
    #[test]
    fn tables_are_installed_replaced_and_removed() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip("needs root", "tables_are_installed_replaced_and_removed");
            return;
        }
        let bridge = format!("nlnat{}", std::process::id() % 100_000);
        let v4: [Subnet; 1] = ["10.77.0.0/16".parse().unwrap()];
        assert!(!installed(&bridge, &v4).unwrap());
        install(&bridge, &v4, &[]).unwrap();
        assert!(installed(&bridge, &v4).unwrap());
        if let Ok(out) = std::process::Command::new("nft")
            .args(["list", "table", "ip", &table_name(&bridge)])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("ip saddr 10.77.0.0/16 ip daddr != 10.77.0.0/16 masquerade"),
                "{text}"
            );
        }
        // Installing again replaces (one rule, the new subnet).
        install(&bridge, &["10.78.0.0/16".parse().unwrap()], &[]).unwrap();
        if let Ok(out) = std::process::Command::new("nft")
            .args(["list", "table", "ip", &table_name(&bridge)])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(text.matches("masquerade").count(), 1, "{text}");
            assert!(text.contains("10.78.0.0/16"), "{text}");
        }
        // Two subnets (a podCIDR changed under running pods): a rule for each, neither
        // masquerading traffic to the other.
        let two = [
            "10.78.0.0/16".parse().unwrap(),
            "10.79.1.0/24".parse().unwrap(),
        ];
        install(&bridge, &two, &[]).unwrap();
        if let Ok(out) = std::process::Command::new("nft")
            .args(["list", "table", "ip", &table_name(&bridge)])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(text.matches("masquerade").count(), 2, "{text}");
            for source in ["10.78.0.0/16", "10.79.1.0/24"] {
                assert!(
                    text.contains(&format!(
                        "ip saddr {source} ip daddr != 10.78.0.0/16 ip daddr != 10.79.1.0/24 masquerade"
                    )),
                    "{text}"
                );
            }
        }
        assert!(install(&bridge, &[], &[]).is_err());
        // Cluster subnets (other nodes' pods) are left alone too.
        let cluster = ["10.0.0.0/8".parse().unwrap()];
        install(&bridge, &two[..1], &cluster).unwrap();
        if let Ok(out) = std::process::Command::new("nft")
            .args(["list", "table", "ip", &table_name(&bridge)])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("ip saddr 10.78.0.0/16 ip daddr != 10.78.0.0/16 ip daddr != 10.0.0.0/8 masquerade"),
                "{text}"
            );
        }
        // Dual stack: a table per family; the IPv6 one leaves the IPv6 cluster subnets alone.
        let dual = [
            "10.78.0.0/16".parse().unwrap(),
            "fd00:78::/64".parse().unwrap(),
        ];
        let v6: [Subnet; 1] = [dual[1]];
        assert!(!installed(&bridge, &v6).unwrap());
        install(&bridge, &dual, &["fd00::/48".parse().unwrap()]).unwrap();
        assert!(installed(&bridge, &dual).unwrap());
        if let Ok(out) = std::process::Command::new("nft")
            .args(["list", "table", "ip6", &table_name(&bridge)])
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(
                    "ip6 saddr fd00:78::/64 ip6 daddr != fd00:78::/64 ip6 daddr != fd00::/48 masquerade"
                ),
                "{text}"
            );
        }
        // Back to IPv4 only: the IPv6 table goes.
        install(&bridge, &v4, &[]).unwrap();
        assert!(!installed(&bridge, &v6).unwrap());
        remove(&bridge).unwrap();
        assert!(!installed(&bridge, &v4).unwrap());
        remove(&bridge).unwrap();
    }
}
