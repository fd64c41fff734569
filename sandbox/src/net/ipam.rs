//! Address management for a bridge's subnet: one file per address in use, created with
//! `O_EXCL` so that several runtimes sharing the bridge never hand out the same address.
//! The directory is meant to live on tmpfs (`/run`): after a reboot no pod holds an address.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use crate::{Error, Kind, Result};

/// An IPv4 or IPv6 subnet, `a.b.c.d/len` or `a:b::/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub network: IpAddr,
    pub prefix_len: u8,
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl std::str::FromStr for Subnet {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                Kind::InvalidArgument,
                format!("pod CIDR {s:?}: {why} (want a.b.c.d/len or an IPv6 a:b::/len)"),
            )
        };
        let (addr, len) = s.split_once('/').ok_or_else(|| bad("no prefix length"))?;
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
        let prefix_len: u8 = len.parse().map_err(|_| bad("bad prefix length"))?;
        let subnet = Subnet::containing(addr, prefix_len).map_err(|e| bad(&e))?;
        if subnet.network != addr {
            return Err(bad("host bits are set"));
        }
        Ok(subnet)
    }
}

/// An address as a number of its family's width (IPv4 in the low 32 bits).
fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl Subnet {
    /// The prefix lengths a pod subnet of `ip`'s family may have: IPv4 8 to 29, IPv6 48 to
    /// 126 (an address for a pod at least, besides the network, gateway and last ones).
    fn prefix_range(ip: IpAddr) -> std::ops::RangeInclusive<u8> {
        if ip.is_ipv4() { 8..=29 } else { 48..=126 }
    }

    /// The subnet of length `prefix_len` that holds `addr`.
    pub fn containing(addr: IpAddr, prefix_len: u8) -> std::result::Result<Self, String> {
        let range = Self::prefix_range(addr);
        if !range.contains(&prefix_len) {
            return Err(format!(
                "the prefix length must be between {} and {}",
                range.start(),
                range.end()
            ));
        }
        let s = Subnet {
            network: addr,
            prefix_len,
        };
        Ok(Subnet {
            network: s.addr(bits(addr) & !s.host_bits()),
            prefix_len,
        })
    }

    /// Whether this is an IPv6 subnet.
    pub fn is_ipv6(&self) -> bool {
        self.network.is_ipv6()
    }

    fn width(&self) -> u32 {
        if self.is_ipv6() { 128 } else { 32 }
    }

    fn addr(&self, n: u128) -> IpAddr {
        match self.network {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }

    fn host_bits(&self) -> u128 {
        let host = self.width() - u32::from(self.prefix_len);
        u128::MAX.checked_shr(128 - host).unwrap_or(0)
    }

    /// The netmask, as bytes of the address's width.
    pub fn mask_bytes(&self) -> Vec<u8> {
        let mask = !self.host_bits();
        match self.network {
            IpAddr::V4(_) => u32::try_from(mask & u128::from(u32::MAX))
                .unwrap_or(0)
                .to_be_bytes()
                .to_vec(),
            IpAddr::V6(_) => mask.to_be_bytes().to_vec(),
        }
    }

    /// The network address's bytes.
    pub fn network_bytes(&self) -> Vec<u8> {
        match self.network {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        }
    }

    /// The bridge's own address: the first in the subnet.
    pub fn gateway(&self) -> IpAddr {
        self.addr(bits(self.network) + 1)
    }
    /// Whether `ip` is in the subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.is_ipv6() && (bits(ip) & !self.host_bits()) == bits(self.network)
    }
    /// Whether `ip` may be given to a pod: inside, and not the network, gateway or last
    /// (IPv4's broadcast) address.
    pub fn assignable(&self, ip: IpAddr) -> bool {
        let n = bits(self.network);
        let i = bits(ip);
        self.contains(ip) && i > n + 1 && i < n + self.host_bits()
    }
    fn first(&self) -> u128 {
        bits(self.network) + 2
    }
    fn last(&self) -> u128 {
        bits(self.network) + self.host_bits() - 1
    }
}

/// The addresses in use on one bridge.
#[derive(Debug, Clone)]
pub struct Ipam {
    dir: PathBuf,
    subnet: Subnet,
}

/// One address in use: who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: IpAddr,
    /// The sandbox holding it.
    pub owner: String,
    /// Which runtime gave it out (its root dir), so each cleans only its own leftovers.
    pub runtime: String,
}

impl Ipam {
    pub fn new(dir: impl Into<PathBuf>, subnet: Subnet) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        Ok(Ipam { dir, subnet })
    }

    pub fn subnet(&self) -> Subnet {
        self.subnet
    }

    fn path(&self, ip: IpAddr) -> PathBuf {
        lease_path(&self.dir, ip)
    }

    /// The last address given out, one file per family (the families share the directory).
    fn hint(&self) -> PathBuf {
        self.dir.join(if self.subnet.is_ipv6() {
            "last6"
        } else {
            "last"
        })
    }

    /// Gives `owner` (of runtime `runtime`) a free address, the next after the last one given
    /// out, so that a freed address is not reused at once.
    pub fn allocate(&self, owner: &str, runtime: &str) -> Result<IpAddr> {
        let (first, last) = (self.subnet.first(), self.subnet.last());
        let after = std::fs::read_to_string(self.hint())
            .ok()
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
            .filter(|ip| self.subnet.contains(*ip))
            .map(bits)
            .filter(|i| (first..=last).contains(i))
            .unwrap_or(last);
        let size = last - first + 1;
        for step in 1..=size {
            let i = first + (after - first + step) % size;
            let ip = self.subnet.addr(i);
            let path = self.path(ip);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(format!("{owner}\n{runtime}\n").as_bytes())
                        .map_err(|e| Error::io("writing", &path, e))?;
                    let _ = std::fs::write(self.hint(), ip.to_string());
                    return Ok(ip);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating", &path, e)),
            }
        }
        Err(Error::new(
            Kind::FailedPrecondition,
            format!("no free address left in the pod CIDR {}", self.subnet),
        ))
    }

    /// Frees `ip` if `owner` holds it.
    pub fn release(&self, ip: IpAddr, owner: &str) -> Result<()> {
        release_in(&self.dir, ip, owner)
    }

    /// Every address in use in this book's directory, of any subnet.
    pub fn leases(&self) -> Vec<Lease> {
        leases_in(&self.dir)
    }
}

/// Frees `ip` in the address directory `dir` if `owner` holds it, whatever subnet it is of
/// (address books of several subnets may share a directory: their addresses never clash).
pub fn release_in(dir: &Path, ip: IpAddr, owner: &str) -> Result<()> {
    let path = lease_path(dir, ip);
    match read_lease(&path, ip) {
        Some(lease) if lease.owner == owner => std::fs::remove_file(&path).or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(Error::io("removing", &path, e))
            }
        }),
        _ => Ok(()),
    }
}

/// The file holding the lease of `ip` in the address directory `dir`: named by the address.
fn lease_path(dir: &Path, ip: IpAddr) -> PathBuf {
    dir.join(ip.to_string())
}

/// Every address in use in the address directory `dir`.
pub fn leases_in(dir: &Path) -> Vec<Lease> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let ip: IpAddr = e.file_name().to_str()?.parse().ok()?;
            read_lease(&e.path(), ip)
        })
        .collect()
}

/// A lease file's holder. A torn or garbled file is still a lease (of an owner no runtime
/// knows, so the stale-lease sweep frees it), never an address lost for good.
fn read_lease(path: &Path, ip: IpAddr) -> Option<Lease> {
    let data = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&data);
    let mut lines = text.lines();
    Some(Lease {
        ip,
        owner: lines.next().unwrap_or_default().to_string(),
        runtime: lines.next().unwrap_or_default().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_reject_with_a_reason() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let s: Subnet = "10.88.0.0/16".parse().unwrap();
        assert_eq!(s.gateway(), ip("10.88.0.1"));
        assert!(s.assignable(ip("10.88.0.2")));
        assert!(s.assignable(ip("10.88.255.254")));
        assert!(!s.assignable(ip("10.88.255.255")));
        assert!(!s.assignable(ip("10.88.0.1")));
        assert!(!s.assignable(ip("10.89.0.2")));
        assert!(!s.assignable(ip("::a58:2")), "another family");
        assert_eq!(s.mask_bytes(), [255, 255, 0, 0]);
        let s6: Subnet = "fd00:88::/64".parse().unwrap();
        assert!(s6.is_ipv6());
        assert_eq!(s6.gateway(), ip("fd00:88::1"));
        assert!(s6.assignable(ip("fd00:88::2")));
        assert!(s6.assignable(ip("fd00:88::ffff:ffff:ffff:fffe")));
        assert!(!s6.assignable(ip("fd00:88::1")));
        assert!(!s6.assignable(ip("fd00:89::2")));
        assert!(!s6.assignable(ip("10.88.0.2")));
        assert_eq!(
            s6.mask_bytes()[..9],
            [255, 255, 255, 255, 255, 255, 255, 255, 0]
        );
        assert_eq!(
            "fd00:88::/64".parse::<Subnet>().unwrap().network_bytes()[..4],
            [0xfd, 0, 0, 0x88]
        );
        for (bad, why) in [
            ("10.88.0.1/16", "host bits"),
            ("10.88.0.0", "no prefix"),
            ("10.88.0.0/30", "between 8 and 29"),
            ("fd00::1/64", "host bits"),
            ("fd00::/127", "between 48 and 126"),
            ("fd00::/32", "between 48 and 126"),
            ("10.88.0/16", "not an IP address"),
            ("10.88.0.0/x", "bad prefix"),
        ] {
            let e = bad.parse::<Subnet>().unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn addresses_are_unique_rotate_and_run_out() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), "10.1.2.0/29".parse().unwrap()).unwrap();
        // A /29 has 8 addresses: network, gateway, 5 for pods, broadcast.
        let got: Vec<_> = (0..5)
            .map(|i| ipam.allocate(&format!("p{i}"), "rt").unwrap())
            .collect();
        let want: Vec<IpAddr> = (2..7).map(|h| Ipv4Addr::new(10, 1, 2, h).into()).collect();
        assert_eq!(got, want);
        let e = ipam.allocate("p5", "rt").unwrap_err();
        assert!(e.to_string().contains("no free address"), "{e}");
        // Only the owner frees an address.
        ipam.release(want[1], "someone-else").unwrap();
        assert!(ipam.allocate("p5", "rt").is_err());
        ipam.release(want[1], "p1").unwrap();
        assert_eq!(ipam.allocate("p5", "rt").unwrap(), want[1]);
        // A freed address is not reused before the others.
        ipam.release(want[0], "p0").unwrap();
        ipam.release(want[4], "p4").unwrap();
        assert_eq!(ipam.allocate("p6", "rt").unwrap(), want[4]);
        assert_eq!(ipam.allocate("p7", "rt").unwrap(), want[0]);
        let leases = ipam.leases();
        assert_eq!(leases.len(), 5);
        assert!(
            leases
                .iter()
                .any(|l| l.ip == want[0] && l.owner == "p7" && l.runtime == "rt")
        );
    }

    #[test]
    fn ipv6_addresses_share_the_directory_with_their_own_hint() {
        let dir = tempfile::tempdir().unwrap();
        let v4 = Ipam::new(dir.path(), "10.1.4.0/24".parse().unwrap()).unwrap();
        let v6 = Ipam::new(dir.path(), "fd00:14::/64".parse().unwrap()).unwrap();
        let a = v4.allocate("p0", "rt").unwrap();
        let b = v6.allocate("p0", "rt").unwrap();
        let c = v6.allocate("p1", "rt").unwrap();
        let d = v4.allocate("p1", "rt").unwrap();
        assert_eq!(a, "10.1.4.2".parse::<IpAddr>().unwrap());
        assert_eq!(b, "fd00:14::2".parse::<IpAddr>().unwrap());
        assert_eq!(c, "fd00:14::3".parse::<IpAddr>().unwrap());
        assert_eq!(d, "10.1.4.3".parse::<IpAddr>().unwrap());
        assert_eq!(v4.leases().len(), 4, "one directory holds both families");
        v6.release(b, "p0").unwrap();
        assert!(v6.leases().iter().all(|l| l.ip != b));
        // A /126 has one address for a pod.
        let small = Ipam::new(dir.path().join("s"), "fd00:15::/126".parse().unwrap()).unwrap();
        assert_eq!(
            small.allocate("x", "rt").unwrap(),
            "fd00:15::2".parse::<IpAddr>().unwrap()
        );
        assert!(small.allocate("y", "rt").is_err());
    }

    #[test]
    fn torn_lease_files_are_leases_of_nobody_and_a_bad_hint_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), "10.1.3.0/29".parse().unwrap()).unwrap();
        let kept = ipam.allocate("p0", "rt").unwrap();
        // A crash between create and write, a write cut short, garbage; a garbled hint.
        std::fs::write(dir.path().join("10.1.3.3"), b"").unwrap();
        std::fs::write(dir.path().join("10.1.3.4"), b"abc").unwrap();
        std::fs::write(dir.path().join("10.1.3.5"), b"\xff\xfe\0\n\x80").unwrap();
        std::fs::write(dir.path().join("last"), b"\0garbage").unwrap();
        let mut leases = ipam.leases();
        leases.sort_by_key(|l| l.ip);
        assert_eq!(leases.len(), 4, "{leases:?}");
        assert_eq!((leases[0].ip, leases[0].owner.as_str()), (kept, "p0"));
        // None of the torn ones names a runtime that exists, so the stale-lease sweep frees
        // each, through the owner it shows; then the addresses are given out again.
        for lease in &leases[1..] {
            assert!(!Path::new(&lease.runtime).exists(), "{lease:?}");
            ipam.release(lease.ip, &lease.owner).unwrap();
        }
        assert_eq!(ipam.leases().len(), 1);
        let next = ipam.allocate("p1", "rt").unwrap();
        assert!(next != kept && ipam.subnet().assignable(next), "{next}");
    }
}
