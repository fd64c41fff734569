//! Address management for a bridge's subnet: one file per address in use, created with
//! `O_EXCL` so that several runtimes sharing the bridge never hand out the same address.
//! The directory is meant to live on tmpfs (`/run`): after a reboot no pod holds an address.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::{Error, Kind, Result};

/// An IPv4 subnet, `a.b.c.d/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub network: Ipv4Addr,
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
                format!("pod CIDR {s:?}: {why} (want an IPv4 a.b.c.d/len)"),
            )
        };
        let (addr, len) = s.split_once('/').ok_or_else(|| bad("no prefix length"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix_len: u8 = len.parse().map_err(|_| bad("bad prefix length"))?;
        let subnet = Subnet::containing(addr, prefix_len).map_err(|e| bad(&e))?;
        if subnet.network != addr {
            return Err(bad("host bits are set"));
        }
        Ok(subnet)
    }
}

impl Subnet {
    /// The subnet of length `prefix_len` (8 to 29) that holds `addr`.
    pub fn containing(addr: Ipv4Addr, prefix_len: u8) -> std::result::Result<Self, String> {
        if !(8..=29).contains(&prefix_len) {
            return Err("the prefix length must be between 8 and 29".to_string());
        }
        let mask = u32::MAX << (32 - u32::from(prefix_len));
        Ok(Subnet {
            network: Ipv4Addr::from(u32::from(addr) & mask),
            prefix_len,
        })
    }

    fn host_bits(&self) -> u32 {
        u32::MAX >> u32::from(self.prefix_len)
    }
    /// The bridge's own address: the first in the subnet.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }
    /// Whether `ip` is in the subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(ip) & !self.host_bits()) == u32::from(self.network)
    }
    /// Whether `ip` may be given to a pod: inside, and not the network, gateway or broadcast.
    pub fn assignable(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(self.network);
        let i = u32::from(ip);
        i > n + 1 && i < n + self.host_bits() && (i & !self.host_bits()) == n
    }
    fn first(&self) -> u32 {
        u32::from(self.network) + 2
    }
    fn last(&self) -> u32 {
        u32::from(self.network) + self.host_bits() - 1
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
    pub ip: Ipv4Addr,
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

    fn path(&self, ip: Ipv4Addr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    fn hint(&self) -> PathBuf {
        self.dir.join("last")
    }

    /// Gives `owner` (of runtime `runtime`) a free address, the next after the last one given
    /// out, so that a freed address is not reused at once.
    pub fn allocate(&self, owner: &str, runtime: &str) -> Result<Ipv4Addr> {
        let (first, last) = (self.subnet.first(), self.subnet.last());
        let after = std::fs::read_to_string(self.hint())
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|&i| (first..=last).contains(&i))
            .unwrap_or(last);
        let size = last - first + 1;
        for step in 1..=size {
            let i = first + (after - first + step) % size;
            let ip = Ipv4Addr::from(i);
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
    pub fn release(&self, ip: Ipv4Addr, owner: &str) -> Result<()> {
        let path = self.path(ip);
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

    /// Every address in use.
    pub fn leases(&self) -> Vec<Lease> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let ip: Ipv4Addr = e.file_name().to_str()?.parse().ok()?;
                read_lease(&e.path(), ip)
            })
            .collect()
    }
}

/// A lease file's holder. A torn or garbled file is still a lease (of an owner no runtime
/// knows, so the stale-lease sweep frees it), never an address lost for good.
fn read_lease(path: &Path, ip: Ipv4Addr) -> Option<Lease> {
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
        let s: Subnet = "10.88.0.0/16".parse().unwrap();
        assert_eq!(s.gateway(), Ipv4Addr::new(10, 88, 0, 1));
        assert!(s.assignable(Ipv4Addr::new(10, 88, 0, 2)));
        assert!(s.assignable(Ipv4Addr::new(10, 88, 255, 254)));
        assert!(!s.assignable(Ipv4Addr::new(10, 88, 255, 255)));
        assert!(!s.assignable(Ipv4Addr::new(10, 88, 0, 1)));
        assert!(!s.assignable(Ipv4Addr::new(10, 89, 0, 2)));
        for (bad, why) in [
            ("10.88.0.1/16", "host bits"),
            ("10.88.0.0", "no prefix"),
            ("10.88.0.0/30", "between 8 and 29"),
            ("fd00::/64", "not an IPv4"),
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
        let want: Vec<_> = (2..7).map(|h| Ipv4Addr::new(10, 1, 2, h)).collect();
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
