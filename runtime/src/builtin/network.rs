//! The built-in runtime's pod network: which bridge and subnet, the address each sandbox gets,
//! and the CRI port mappings as the sandbox's node-port forwards. The plumbing itself is the
//! sandbox process's (`sandbox::net`).
//!
//! The subnet new pods get addresses from is the configured `pod_cidr` until the kubelet
//! hands over the Node's (`UpdateRuntimeConfig`, [`Network::use_pod_cidr`]): from then on new
//! pods get addresses from the Node's, recorded beside the addresses so that a restarted
//! runtime goes on with it. Pods keep the addresses they have: the bridge keeps the gateway
//! address of every subnet still in use and the masquerade covers them all.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use sandbox::net::{Ipam, Subnet};

use crate::{Error, Result, cri};

/// Where pods are connected.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The node's bridge (created when missing).
    pub bridge: String,
    /// The subnets pods get addresses from: one, or one of each family (dual stack); the
    /// first address of each is the bridge's.
    pub pod_cidrs: Vec<Subnet>,
    /// Where the addresses in use are recorded, one directory per bridge. On tmpfs, so that
    /// a reboot (which ends every pod) frees them all.
    pub ipam_dir: PathBuf,
    /// Masquerade pod traffic leaving the pod subnet behind the node's address (and turn
    /// forwarding on), as the CNI bridge plugin's `ipMasq`. Off when the network routes the
    /// pod subnet itself.
    pub masquerade: bool,
    /// Other subnets traffic to which is not masqueraded: the cluster's pod subnets, routed
    /// between nodes (`nodeletNetwork.clusterCIDRs`).
    pub cluster_cidrs: Vec<Subnet>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            bridge: "nodelet0".to_string(),
            pod_cidrs: vec![Subnet {
                network: IpAddr::V4(Ipv4Addr::new(10, 88, 0, 0)),
                prefix_len: 16,
            }],
            ipam_dir: PathBuf::from("/run/nodelet/ipam"),
            masquerade: true,
            cluster_cidrs: Vec::new(),
        }
    }
}

/// Parses a pod CIDR (`10.88.0.0/16`, `fd00:88::/64`); the error says what is wrong with it.
pub fn parse_pod_cidr(cidr: &str) -> Result<Subnet> {
    cidr.parse::<Subnet>()
        .map_err(|e| Error::invalid_argument(e.to_string()))
}

/// Parses pod CIDRs, comma-separated: one, or one of each family (`10.88.0.0/16,fd00:88::/64`).
pub fn parse_pod_cidrs(cidrs: &str) -> Result<Vec<Subnet>> {
    let mut out: Vec<Subnet> = Vec::new();
    for c in cidrs.split(',').map(str::trim) {
        let s = parse_pod_cidr(c)?;
        if out.iter().any(|o| o.is_ipv6() == s.is_ipv6()) {
            return Err(Error::invalid_argument(format!(
                "pod CIDRs {cidrs:?}: two of one family (dual stack takes one IPv4 and one IPv6)"
            )));
        }
        out.push(s);
    }
    Ok(out)
}

/// Makes the node's routes to other nodes' pod subnets exactly `want` (subnet via that node's
/// address of the subnet's family; `sandbox::net::routes`): for the kubelet's `host-gw` mode,
/// whatever the runtime. Returns how many routes changed.
pub fn sync_node_routes(want: &[(Subnet, IpAddr)]) -> Result<usize> {
    sandbox::net::routes::sync(want).map_err(super::sandbox_error)
}

/// The VXLAN device between nodes (the kubelet's `vxlan` routes) and one other node behind it.
pub use sandbox::net::vxlan::{Device as VxlanDevice, Peer as VxlanPeer, format_mac, parse_mac};

/// Makes sure the VXLAN device `dev` is up with the network address of `own` subnet (and of
/// `own6`, the node's IPv6 one, on a dual-stack cluster) on it; its MAC
/// (`sandbox::net::vxlan::ensure`).
pub fn ensure_vxlan(dev: &VxlanDevice, own: Subnet, own6: Option<Subnet>) -> Result<[u8; 6]> {
    sandbox::net::vxlan::ensure(dev, own, own6).map_err(super::sandbox_error)
}

/// Makes the FDB, neighbour and route entries of VXLAN device `name` exactly `peers`; how many
/// changed.
pub fn sync_vxlan(name: &str, peers: &[VxlanPeer]) -> Result<usize> {
    sandbox::net::vxlan::sync(name, peers).map_err(super::sandbox_error)
}

/// Removes what the pod network of `cfg` set up on the node (the bridge and the masquerade
/// rules), for a node being reset; addresses still held stay recorded.
pub fn remove_node_network(cfg: &NetworkConfig) -> Result<()> {
    sandbox::net::remove_node_network(&cfg.bridge).map_err(super::sandbox_error)
}

/// Why the node's pod network is not ready. Its message is the underlying error's.
#[derive(Debug, thiserror::Error)]
pub(super) enum NetworkError {
    /// Setting up (or checking) the bridge or the masquerading failed.
    #[error(transparent)]
    Node(#[from] sandbox::Error),
    /// The blocking task doing it panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// The network of a runtime: its settings and address book.
pub(super) struct Network {
    pub cfg: NetworkConfig,
    subnets: std::sync::RwLock<Subnets>,
    /// The address books' one directory (every subnet's addresses, both families).
    dir: PathBuf,
    /// Set once [`Network::ensure`] has set the node up (and written the masquerade rule
    /// afresh); later calls only check and mend.
    set_up: std::sync::atomic::AtomicBool,
}

/// The subnets new pods get addresses from (one per family, each with its address book),
/// and the earlier ones pods may still hold.
struct Subnets {
    current: Vec<(Subnet, Ipam)>,
    earlier: Vec<Subnet>,
}

/// The file beside the addresses naming the subnets the kubelet handed over.
const NODE_CIDR_FILE: &str = "node-cidr";

/// One address book per subnet, all in `dir`.
fn books(dir: &std::path::Path, subnets: &[Subnet]) -> Result<Vec<(Subnet, Ipam)>> {
    subnets
        .iter()
        .map(|s| {
            Ipam::new(dir, *s)
                .map(|i| (*s, i))
                .map_err(|e| Error::internal(e.to_string()))
        })
        .collect()
}

impl Network {
    pub fn new(cfg: NetworkConfig) -> Result<Self> {
        sandbox::net::check_interface_name(&cfg.bridge)
            .map_err(|e| Error::invalid_argument(format!("bridge: {e}")))?;
        if cfg.pod_cidrs.is_empty() {
            return Err(Error::invalid_argument("the pod network has no pod CIDR"));
        }
        let dir = cfg.ipam_dir.join(&cfg.bridge);
        let handed: Option<Vec<Subnet>> = std::fs::read_to_string(dir.join(NODE_CIDR_FILE))
            .ok()
            .and_then(|s| parse_pod_cidrs(s.trim()).ok());
        let current = handed.unwrap_or_else(|| cfg.pod_cidrs.clone());
        let earlier = cfg
            .pod_cidrs
            .iter()
            .filter(|c| !current.contains(c))
            .copied()
            .collect();
        let subnets = Subnets {
            current: books(&dir, &current)?,
            earlier,
        };
        let net = Network {
            cfg,
            subnets: std::sync::RwLock::new(subnets),
            dir,
            set_up: Default::default(),
        };
        net.forget_unused_subnets();
        Ok(net)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Subnets> {
        self.subnets.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Subnets> {
        self.subnets.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every subnet pods may hold addresses of: the current ones first.
    pub fn subnets(&self) -> Vec<Subnet> {
        let s = self.read();
        s.current
            .iter()
            .map(|(c, _)| *c)
            .chain(s.earlier.iter().copied())
            .collect()
    }

    /// Drops the earlier subnets no pod holds an address of any more.
    fn forget_unused_subnets(&self) {
        let leases = self.leases();
        let mut s = self.write();
        s.earlier
            .retain(|sub| leases.iter().any(|l| sub.contains(l.ip)));
    }

    /// An address of each current subnet for sandbox `owner` (of the runtime at `runtime`),
    /// with the subnet it is of. When one runs out, those taken are given back.
    pub fn allocate(&self, owner: &str, runtime: &str) -> sandbox::Result<Vec<(IpAddr, Subnet)>> {
        let s = self.read();
        let mut out = Vec::new();
        for (subnet, ipam) in &s.current {
            match ipam.allocate(owner, runtime) {
                Ok(ip) => out.push((ip, *subnet)),
                Err(e) => {
                    for (ip, _) in out {
                        let _ = ipam.release(ip, owner);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Frees `ip` if `owner` holds it, whatever subnet (current or earlier) it is of.
    pub fn release(&self, ip: IpAddr, owner: &str) -> sandbox::Result<()> {
        sandbox::net::ipam::release_in(&self.dir, ip, owner)
    }

    /// Every address in use, of any subnet.
    pub fn leases(&self) -> Vec<sandbox::net::Lease> {
        sandbox::net::ipam::leases_in(&self.dir)
    }

    /// Makes `cidrs` (the Node's `spec.podCIDRs`, comma-separated: one, or one of each family)
    /// the subnets new pods get addresses from. Returns whether that changed anything; the
    /// node is set up for it by the caller ([`Network::ensure_all`]).
    pub fn use_pod_cidr(&self, cidrs: &str) -> Result<bool> {
        let cidrs = cidrs.trim();
        if cidrs.is_empty() {
            return Ok(false);
        }
        let new = parse_pod_cidrs(cidrs)?;
        {
            let mut s = self.write();
            let old: Vec<Subnet> = s.current.iter().map(|(c, _)| *c).collect();
            if old == new {
                return Ok(false);
            }
            let current = books(&self.dir, &new)?;
            s.earlier.retain(|e| !new.contains(e));
            for o in old.iter().rev().filter(|o| !new.contains(o)) {
                s.earlier.insert(0, *o);
            }
            s.current = current;
            let show = |v: &[Subnet]| {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            tracing::info!(
                "pod CIDRs {} from the node: new pods get addresses from them (were {})",
                show(&new),
                show(&old)
            );
        }
        let record = self.dir.join(NODE_CIDR_FILE);
        let text: Vec<String> = new.iter().map(ToString::to_string).collect();
        std::fs::write(&record, text.join(","))
            .map_err(|e| Error::internal(format!("writing {}: {e}", record.display())))?;
        self.forget_unused_subnets();
        Ok(true)
    }

    /// Whether [`Network::ensure`] has succeeded once.
    pub fn is_set_up(&self) -> bool {
        self.set_up.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets up (or checks and mends) what the node needs for pods: the bridge, and the
    /// masquerading when asked for. The first success rewrites the masquerade rule, so that a
    /// changed pod CIDR takes effect. Called on the first pod and by `Status`, never when the
    /// runtime is merely opened (`nodelet images`, `nodelet pods` leave the node's network be).
    pub fn ensure(&self) -> std::result::Result<(), NetworkError> {
        self.ensure_with(!self.is_set_up())
    }

    /// [`Network::ensure`] with the masquerade rule written afresh (the subnets changed).
    pub fn ensure_all(&self) -> std::result::Result<(), NetworkError> {
        self.ensure_with(true)
    }

    fn ensure_with(&self, replace: bool) -> std::result::Result<(), NetworkError> {
        let bridge = &self.cfg.bridge;
        let subnets = self.subnets();
        // The gateway address of every subnet pods may be on (the current ones first).
        for s in subnets.iter().rev() {
            sandbox::net::ensure_bridge(bridge, *s)?;
        }
        if self.cfg.masquerade {
            let cluster = &self.cfg.cluster_cidrs;
            sandbox::net::ensure_masquerade(bridge, &subnets, cluster, replace)?;
        } else {
            // Routed pods still cross the node.
            sandbox::net::ensure_forwarding(&subnets)?;
        }
        self.set_up
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Takes the node as set up, without touching it: for unit tests of the request path,
    /// which must leave the node's network alone.
    #[cfg(test)]
    pub fn assume_set_up(&self) {
        self.set_up
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The node end of a sandbox's veth pair: derived from its id, 15 bytes at most.
    pub fn host_interface(sandbox_id: &str) -> String {
        let short: String = sandbox_id.chars().take(12).collect();
        format!("nlv{short}")
    }

    /// The pod network of sandbox `sandbox_id` with `addresses` (from [`Network::allocate`]:
    /// one, or one of each family).
    pub fn pod_network(
        &self,
        sandbox_id: &str,
        addresses: &[(IpAddr, Subnet)],
        ports: Vec<sandbox::PortMapping>,
    ) -> Result<sandbox::PodNetwork> {
        let pod_address = |(address, subnet): &(IpAddr, Subnet)| sandbox::PodAddress {
            address: *address,
            prefix_len: subnet.prefix_len,
            gateway: subnet.gateway(),
        };
        let first = addresses
            .first()
            .map(pod_address)
            .ok_or_else(|| Error::internal("a pod network with no address"))?;
        Ok(sandbox::PodNetwork {
            bridge: self.cfg.bridge.clone(),
            host_interface: Self::host_interface(sandbox_id),
            address: first.address,
            prefix_len: first.prefix_len,
            gateway: first.gateway,
            second: addresses.get(1).map(pod_address),
            ports,
        })
    }
}

/// The CRI port mappings that forward node ports. Mappings without a host port only document
/// the pod's ports (as with containerd's portmap plugin) and are checked but dropped.
pub(super) fn port_mappings(mappings: &[cri::PortMapping]) -> Result<Vec<sandbox::PortMapping>> {
    let mut out = Vec::new();
    for m in mappings {
        let port = |what: &str, p: i32, zero_ok: bool| -> Result<u16> {
            match u16::try_from(p) {
                Ok(0) if !zero_ok => Err(Error::invalid_argument(format!(
                    "port mapping: {what} port is required"
                ))),
                Ok(v) => Ok(v),
                Err(_) => Err(Error::invalid_argument(format!(
                    "port mapping: {what} port {p} is not between 0 and 65535"
                ))),
            }
        };
        let container_port = port("container", m.container_port, false)?;
        let host_port = port("host", m.host_port, true)?;
        let protocol = match cri::Protocol::try_from(m.protocol) {
            Ok(cri::Protocol::Tcp) => sandbox::Protocol::Tcp,
            Ok(cri::Protocol::Udp) => sandbox::Protocol::Udp,
            Ok(cri::Protocol::Sctp) if host_port == 0 => continue,
            Ok(cri::Protocol::Sctp) => {
                return Err(Error::invalid_argument(format!(
                    "port mapping: host port {host_port}/SCTP: the built-in runtime forwards \
                     only TCP and UDP host ports"
                )));
            }
            Err(_) => {
                return Err(Error::invalid_argument(format!(
                    "port mapping: unknown protocol {}",
                    m.protocol
                )));
            }
        };
        let host_ip = if m.host_ip.is_empty() {
            None
        } else {
            Some(m.host_ip.parse::<IpAddr>().map_err(|_| {
                Error::invalid_argument(format!(
                    "port mapping: host IP {:?} is not an IP address",
                    m.host_ip
                ))
            })?)
        };
        if host_port == 0 {
            continue;
        }
        out.push(sandbox::PortMapping {
            protocol,
            host_ip,
            host_port,
            container_port,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pm(protocol: cri::Protocol, container: i32, host: i32, ip: &str) -> cri::PortMapping {
        cri::PortMapping {
            protocol: protocol as i32,
            container_port: container,
            host_port: host,
            host_ip: ip.to_string(),
        }
    }

    #[test]
    fn port_mappings_forward_host_ports_and_refuse_bad_ones() {
        use cri::Protocol::{Sctp, Tcp, Udp};
        let got = port_mappings(&[
            pm(Tcp, 80, 8080, ""),
            pm(Udp, 53, 5353, "127.0.0.1"),
            pm(Tcp, 443, 0, ""),
            pm(Sctp, 9, 0, ""),
        ])
        .unwrap();
        assert_eq!(
            got,
            vec![
                sandbox::PortMapping {
                    protocol: sandbox::Protocol::Tcp,
                    host_ip: None,
                    host_port: 8080,
                    container_port: 80
                },
                sandbox::PortMapping {
                    protocol: sandbox::Protocol::Udp,
                    host_ip: Some("127.0.0.1".parse().unwrap()),
                    host_port: 5353,
                    container_port: 53
                },
            ]
        );
        for (bad, why) in [
            (pm(Tcp, 0, 80, ""), "container port is required"),
            (pm(Tcp, 70000, 80, ""), "not between 0 and 65535"),
            (pm(Tcp, 80, -1, ""), "not between 0 and 65535"),
            (pm(Sctp, 9, 9, ""), "only TCP and UDP"),
            (pm(Tcp, 80, 80, "localhost"), "not an IP address"),
        ] {
            let e = port_mappings(&[bad]).unwrap_err();
            assert_eq!(e.code(), crate::Code::InvalidArgument);
            assert!(e.message().contains(why), "{e}");
        }
        let mut unknown = pm(Tcp, 80, 80, "");
        unknown.protocol = 7;
        assert!(port_mappings(&[unknown]).is_err());
    }

    #[test]
    fn the_nodes_pod_cidr_takes_over_and_pods_keep_their_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = NetworkConfig {
            bridge: "nltest0".into(),
            ipam_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let configured: Subnet = "10.88.0.0/16".parse().unwrap();
        let node: Subnet = "10.77.3.0/24".parse().unwrap();
        let node6: Subnet = "fd00:77::/64".parse().unwrap();
        let net = Network::new(cfg.clone()).unwrap();
        let old = net.allocate("sb-old", "rt").unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].1, configured);
        // The Node's (dual stack): new pods get an address of each.
        assert!(net.use_pod_cidr("10.77.3.0/24,fd00:77::/64").unwrap());
        assert!(
            !net.use_pod_cidr("10.77.3.0/24, fd00:77::/64").unwrap(),
            "no change, nothing to do"
        );
        let new = net.allocate("sb-new", "rt").unwrap();
        assert_eq!(
            new,
            [
                ("10.77.3.2".parse().unwrap(), node),
                ("fd00:77::2".parse().unwrap(), node6)
            ]
        );
        let pn = net.pod_network("sb-new", &new, Vec::new()).unwrap();
        assert_eq!(
            (pn.prefix_len, pn.gateway),
            (24, "10.77.3.1".parse().unwrap())
        );
        let second = pn.second.expect("an IPv6 address");
        assert_eq!(
            (second.address, second.prefix_len, second.gateway),
            (
                "fd00:77::2".parse().unwrap(),
                64,
                "fd00:77::1".parse().unwrap()
            )
        );
        // The old pod's subnet stays on the bridge and in the masquerade while it is held.
        assert_eq!(net.subnets(), vec![node, node6, configured]);
        // A restarted runtime goes on with the Node's.
        let again = Network::new(cfg.clone()).unwrap();
        assert_eq!(again.subnets(), vec![node, node6, configured]);
        net.release(old[0].0, "sb-old").unwrap();
        let later = Network::new(cfg.clone()).unwrap();
        assert_eq!(
            later.subnets(),
            vec![node, node6],
            "nobody holds an address of the old one"
        );
        assert!(net.use_pod_cidr("10.77.3.0/33").is_err());
        let e = net.use_pod_cidr("10.77.3.0/24,10.78.0.0/24").unwrap_err();
        assert!(e.message().contains("two of one family"), "{e}");
        // Back to IPv4 only: the IPv6 subnet stays while a pod holds an address of it.
        assert!(net.use_pod_cidr("10.77.3.0/24").unwrap());
        assert_eq!(net.subnets(), vec![node, node6]);
        assert_eq!(net.allocate("sb-v4", "rt").unwrap().len(), 1);
        for (ip, _) in new {
            net.release(ip, "sb-new").unwrap();
        }
        assert_eq!(Network::new(cfg).unwrap().subnets(), vec![node]);
    }

    #[test]
    fn a_dual_stack_network_gives_both_families_or_neither() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = NetworkConfig {
            bridge: "nltest1".into(),
            ipam_dir: dir.path().to_path_buf(),
            pod_cidrs: parse_pod_cidrs("fd00:88::/126,10.89.0.0/24").unwrap(),
            ..Default::default()
        };
        let net = Network::new(cfg).unwrap();
        let a = net.allocate("a", "rt").unwrap();
        assert_eq!(a.len(), 2);
        assert!(a[0].0.is_ipv6() && a[1].0.is_ipv4(), "{a:?}");
        // The /126 has one address for a pod: the next pod gets none of either family.
        assert!(net.allocate("b", "rt").is_err());
        assert_eq!(
            net.leases().len(),
            2,
            "the IPv4 address taken for b went back"
        );
        assert!(parse_pod_cidrs("fd00::/64,fd01::/64").is_err());
        assert!(parse_pod_cidrs("10.0.0.0/8,").is_err());
    }

    #[test]
    fn host_interfaces_fit_the_kernels_limit() {
        let name = Network::host_interface("0123456789abcdef0123456789abcdef");
        assert_eq!(name, "nlv0123456789ab");
        assert!(sandbox::net::check_interface_name(&name).is_ok());
    }
}
