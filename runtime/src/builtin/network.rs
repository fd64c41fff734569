//! The built-in runtime's pod network: which bridge and subnet, the address each sandbox gets,
//! and the CRI port mappings as the sandbox's node-port forwards. The plumbing itself is the
//! sandbox process's (`sandbox::net`).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use sandbox::net::{Ipam, Subnet};

use crate::{Error, Result, cri};

/// Where pods are connected.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The node's bridge (created when missing).
    pub bridge: String,
    /// The subnet pods get addresses from; its first address is the bridge's.
    pub pod_cidr: Subnet,
    /// Where the addresses in use are recorded, one directory per bridge. On tmpfs, so that
    /// a reboot (which ends every pod) frees them all.
    pub ipam_dir: PathBuf,
    /// Masquerade pod traffic leaving the pod subnet behind the node's address (and turn IPv4
    /// forwarding on), as the CNI bridge plugin's `ipMasq`. Off when the network routes the
    /// pod subnet itself.
    pub masquerade: bool,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            bridge: "nodelet0".to_string(),
            pod_cidr: Subnet {
                network: Ipv4Addr::new(10, 88, 0, 0),
                prefix_len: 16,
            },
            ipam_dir: PathBuf::from("/run/nodelet/ipam"),
            masquerade: true,
        }
    }
}

/// Parses a pod CIDR (`10.88.0.0/16`); the error says what is wrong with it.
pub fn parse_pod_cidr(cidr: &str) -> Result<Subnet> {
    cidr.parse::<Subnet>()
        .map_err(|e| Error::invalid_argument(e.to_string()))
}

/// Removes what the pod network of `cfg` set up on the node (the bridge and the masquerade
/// rule), for a node being reset; addresses still held stay recorded.
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
    pub ipam: Ipam,
    /// Set once [`Network::ensure`] has set the node up (and written the masquerade rule
    /// afresh); later calls only check and mend.
    set_up: std::sync::atomic::AtomicBool,
}

impl Network {
    pub fn new(cfg: NetworkConfig) -> Result<Self> {
        sandbox::net::check_interface_name(&cfg.bridge)
            .map_err(|e| Error::invalid_argument(format!("bridge: {e}")))?;
        let ipam = Ipam::new(cfg.ipam_dir.join(&cfg.bridge), cfg.pod_cidr)
            .map_err(|e| Error::internal(e.to_string()))?;
        Ok(Network {
            cfg,
            ipam,
            set_up: Default::default(),
        })
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
        let (bridge, cidr) = (&self.cfg.bridge, self.cfg.pod_cidr);
        sandbox::net::ensure_bridge(bridge, cidr)?;
        if self.cfg.masquerade {
            sandbox::net::ensure_masquerade(bridge, cidr, !self.is_set_up())?;
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

    pub fn pod_network(
        &self,
        sandbox_id: &str,
        address: Ipv4Addr,
        ports: Vec<sandbox::PortMapping>,
    ) -> sandbox::PodNetwork {
        sandbox::PodNetwork {
            bridge: self.cfg.bridge.clone(),
            host_interface: Self::host_interface(sandbox_id),
            address,
            prefix_len: self.cfg.pod_cidr.prefix_len,
            gateway: self.cfg.pod_cidr.gateway(),
            ports,
        }
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
    fn host_interfaces_fit_the_kernels_limit() {
        let name = Network::host_interface("0123456789abcdef0123456789abcdef");
        assert_eq!(name, "nlv0123456789ab");
        assert!(sandbox::net::check_interface_name(&name).is_ok());
    }
}
