//! The result of an ADD (spec section 5), in the shape of CNI 0.3.0 and later.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use crate::config::{at_least, parse_version};

/// The result of a successful ADD: what the last plugin of the list printed.
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
    /// The result as the plugin printed it (with `cniVersion` filled in when it had none): what
    /// the cache keeps and the next plugins get as `prevResult`.
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    /// The network namespace for an interface in the container; `None` on the host.
    pub sandbox: Option<String>,
    pub socket_path: Option<String>,
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address and its prefix length.
    pub address: (IpAddr, u8),
    pub gateway: Option<IpAddr>,
    /// The index of the interface in [`CniResult::interfaces`].
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destination network and its prefix length.
    pub dst: (IpAddr, u8),
    pub gw: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

/// Why a plugin's stdout is not a result.
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct InvalidResult {
    pub why: String,
}

fn invalid(why: impl Into<String>) -> InvalidResult {
    InvalidResult { why: why.into() }
}

#[derive(Deserialize)]
struct RawResult {
    #[serde(rename = "cniVersion")]
    cni_version: Option<String>,
    interfaces: Option<Vec<RawInterface>>,
    ips: Option<Vec<RawIp>>,
    routes: Option<Vec<RawRoute>>,
    dns: Option<RawDns>,
}

#[derive(Deserialize)]
struct RawInterface {
    name: String,
    mac: Option<String>,
    mtu: Option<u32>,
    sandbox: Option<String>,
    #[serde(rename = "socketPath")]
    socket_path: Option<String>,
    #[serde(rename = "pciID")]
    pci_id: Option<String>,
}

#[derive(Deserialize)]
struct RawIp {
    address: String,
    gateway: Option<String>,
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct RawRoute {
    dst: String,
    gw: Option<String>,
    mtu: Option<u32>,
    advmss: Option<u32>,
    priority: Option<u32>,
    table: Option<u32>,
    scope: Option<u32>,
}

#[derive(Deserialize)]
struct RawDns {
    nameservers: Option<Vec<String>>,
    domain: Option<String>,
    search: Option<Vec<String>>,
    options: Option<Vec<String>>,
}

impl CniResult {
    /// Reads a result of CNI 0.3.0 or later; older shapes (`ip4`, `ip6`) are refused, not
    /// converted.
    pub fn from_value(raw: Value) -> Result<Self, InvalidResult> {
        if !raw.is_object() {
            return Err(invalid("not a JSON object"));
        }
        let parsed = RawResult::deserialize(&raw).map_err(|e| invalid(e.to_string()))?;
        let cni_version = parsed
            .cni_version
            .ok_or_else(|| invalid("no \"cniVersion\""))?;
        if parse_version(&cni_version).is_none() {
            return Err(invalid(format!(
                "cniVersion {cni_version:?} is not a version"
            )));
        }
        if !at_least(&cni_version, (0, 3, 0)) {
            return Err(invalid(format!(
                "a result of CNI {cni_version} (only 0.3.0 and later are read)"
            )));
        }
        let interfaces: Vec<Interface> = parsed
            .interfaces
            .unwrap_or_default()
            .into_iter()
            .map(|i| Interface {
                name: i.name,
                mac: non_empty(i.mac),
                mtu: i.mtu.filter(|m| *m != 0),
                sandbox: non_empty(i.sandbox),
                socket_path: non_empty(i.socket_path),
                pci_id: non_empty(i.pci_id),
            })
            .collect();
        let mut ips = Vec::new();
        for ip in parsed.ips.unwrap_or_default() {
            if let Some(index) = ip.interface
                && index >= interfaces.len()
            {
                return Err(invalid(format!(
                    "ip {} names interface {index} of {}",
                    ip.address,
                    interfaces.len()
                )));
            }
            ips.push(IpConfig {
                address: cidr(&ip.address)?,
                gateway: ip.gateway.as_deref().map(addr).transpose()?,
                interface: ip.interface,
            });
        }
        let mut routes = Vec::new();
        for route in parsed.routes.unwrap_or_default() {
            routes.push(Route {
                dst: cidr(&route.dst)?,
                gw: route.gw.as_deref().map(addr).transpose()?,
                mtu: route.mtu,
                advmss: route.advmss,
                priority: route.priority,
                table: route.table,
                scope: route.scope,
            });
        }
        let dns = match parsed.dns {
            Some(d) => Dns {
                nameservers: d.nameservers.unwrap_or_default(),
                domain: non_empty(d.domain),
                search: d.search.unwrap_or_default(),
                options: d.options.unwrap_or_default(),
            },
            None => Dns::default(),
        };
        Ok(CniResult {
            cni_version,
            interfaces,
            ips,
            routes,
            dns,
            raw,
        })
    }
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

fn addr(s: &str) -> Result<IpAddr, InvalidResult> {
    s.parse()
        .map_err(|_| invalid(format!("{s:?} is not an IP address")))
}

/// `10.1.0.5/24`: an address and its prefix length.
fn cidr(s: &str) -> Result<(IpAddr, u8), InvalidResult> {
    let bad = || invalid(format!("{s:?} is not an address in CIDR notation"));
    let (ip, len) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad());
    }
    Ok((ip, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_1_0_0_result() {
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "eth0", "mac": "00:11:22:33:44:55", "mtu": 1450, "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1},
                {"address": "fd00::5/64", "interface": 1}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "fd00::/8", "priority": 5}],
            "dns": {"nameservers": ["10.1.0.1"], "domain": "example", "search": ["a.example"], "options": ["ndots:5"]},
            "extra": "kept"
        });
        let r = CniResult::from_value(raw.clone()).unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert_eq!(r.interfaces.len(), 2);
        assert_eq!(r.interfaces[1].sandbox.as_deref(), Some("/run/netns/x"));
        assert_eq!(r.interfaces[1].mtu, Some(1450));
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(r.ips[0].address, ("10.1.0.5".parse().unwrap(), 24));
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(r.ips[0].interface, Some(1));
        assert_eq!(r.ips[1].address, ("fd00::5".parse().unwrap(), 64));
        assert_eq!(r.routes[0].dst, ("0.0.0.0".parse().unwrap(), 0));
        assert_eq!(r.routes[1].priority, Some(5));
        assert_eq!(r.dns.nameservers, ["10.1.0.1"]);
        assert_eq!(r.dns.domain.as_deref(), Some("example"));
        assert_eq!(r.dns.options, ["ndots:5"]);
        assert_eq!(r.raw, raw);
    }

    #[test]
    fn reads_a_0_3_1_result_and_refuses_older_or_broken_ones() {
        let r = CniResult::from_value(json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.2.0.2/16"}],
            "dns": {}
        }))
        .unwrap();
        assert_eq!(r.ips[0].address, ("10.2.0.2".parse().unwrap(), 16));
        assert_eq!(r.ips[0].interface, None);
        assert!(r.interfaces.is_empty() && r.routes.is_empty());

        let old =
            CniResult::from_value(json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}));
        assert!(old.unwrap_err().why.contains("0.2.0"));
        for bad in [
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2"}]}),
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/33"}]}),
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24", "interface": 0}]}),
            json!({"cniVersion": "1.0.0", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}),
            json!({"ips": []}),
            json!([1, 2]),
        ] {
            assert!(CniResult::from_value(bad.clone()).is_err(), "{bad}");
        }
    }
}
