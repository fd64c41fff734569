//! Capabilities, as containerd's CRI plugin computes them.
//!
//! Start from the CRI default set (Docker's), then: `ALL` in `add_capabilities` grants every
//! capability, `ALL` in `drop_capabilities` removes every one, then the named additions are
//! applied, then the named drops (so `drop: [ALL], add: [NET_ADMIN]` leaves only NET_ADMIN and
//! `add: [ALL], drop: [CHOWN]` everything but CHOWN). Names are accepted with or without the
//! `CAP_` prefix, in any case. A privileged container gets every capability whatever it asks.
//!
//! The same set goes into bounding, effective and permitted; inheritable stays empty (the fix
//! for CVE-2022-24769 in containerd and Docker). containerd keeps these sets as they are for a
//! non-root user too (it does not clear effective/permitted): the kernel drops them at
//! `execve` for a non-root uid anyway, except for file capabilities within the bounding set
//! and ambient capabilities. containerd clears ambient capabilities entirely; here
//! `add_ambient_capabilities` is honoured (the field is newer than containerd's policy): each
//! one is also put in every other set, since the kernel only keeps an ambient capability that
//! is permitted and inheritable.

use std::collections::{BTreeSet, HashSet};

use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxCapabilitiesBuilder};

use super::{invalid, oci_error};
use crate::{Result, cri};

/// Every capability Linux (up to CAP_CHECKPOINT_RESTORE, 40) and oci-spec know.
pub(super) const ALL_CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The default capabilities of a CRI container (containerd's and Docker's default set).
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The default capabilities of a CRI container, `CAP_`-prefixed.
pub fn default_capabilities() -> Vec<String> {
    DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect()
}

/// The capabilities a container ends up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Caps {
    /// Bounding, effective and permitted.
    pub set: BTreeSet<&'static str>,
    /// Ambient and inheritable (always a subset of `set`).
    pub ambient: BTreeSet<&'static str>,
}

impl Caps {
    /// Whether the container has `name` (`CAP_`-prefixed).
    #[cfg(test)]
    pub fn has(&self, name: &str) -> bool {
        self.set.contains(name)
    }

    pub fn to_oci(&self) -> Result<LinuxCapabilities> {
        let convert = |names: &BTreeSet<&'static str>| -> Result<HashSet<Capability>> {
            names
                .iter()
                .map(|n| {
                    serde_json::from_value::<Capability>(serde_json::Value::String(n.to_string()))
                        .map_err(|e| crate::Error::internal(format!("capability {n}: {e}")))
                })
                .collect()
        };
        let set = convert(&self.set)?;
        let ambient = convert(&self.ambient)?;
        LinuxCapabilitiesBuilder::default()
            .bounding(set.clone())
            .effective(set.clone())
            .permitted(set)
            .inheritable(ambient.clone())
            .ambient(ambient)
            .build()
            .map_err(oci_error("capabilities"))
    }
}

/// `name` as a known `CAP_`-prefixed capability.
fn normalize(name: &str, field: &str) -> Result<&'static str> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    ALL_CAPABILITIES
        .iter()
        .find(|c| c.strip_prefix("CAP_") == Some(bare))
        .copied()
        .ok_or_else(|| invalid(format!("{field}: unknown capability {name:?}")))
}

fn is_all(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case("ALL")
}

/// The known capabilities whose bit is set in `available` (bit n is capability n, as in
/// /proc/self/status), or every known one when `available` is `None`.
fn all_capabilities(available: Option<u64>) -> BTreeSet<&'static str> {
    ALL_CAPABILITIES
        .into_iter()
        .enumerate()
        .filter(|&(bit, _)| available.is_none_or(|mask| mask & (1u64 << bit) != 0))
        .map(|(_, name)| name)
        .collect()
}

/// The capabilities for a container with these CRI settings. `available` is the mask of the
/// capabilities nodelet itself holds (`CapEff`; `None`: all known ones): "ALL" and privileged
/// mean those, like containerd's `WithAllCurrentCapabilities` (a process cannot grant a
/// capability outside its own bounding set, and the runtime would fail to start the container).
/// Capabilities named one by one are passed on as asked.
pub(super) fn capabilities(
    capability: Option<&cri::Capability>,
    privileged: bool,
    available: Option<u64>,
) -> Result<Caps> {
    let empty = cri::Capability::default();
    let c = capability.unwrap_or(&empty);
    let mut set: BTreeSet<&'static str> = DEFAULT_CAPABILITIES.into_iter().collect();
    if c.add_capabilities.iter().any(|n| is_all(n)) {
        set = all_capabilities(available);
    }
    if c.drop_capabilities.iter().any(|n| is_all(n)) {
        set.clear();
    }
    for n in c.add_capabilities.iter().filter(|n| !is_all(n)) {
        set.insert(normalize(n, "add_capabilities")?);
    }
    for n in c.drop_capabilities.iter().filter(|n| !is_all(n)) {
        set.remove(normalize(n, "drop_capabilities")?);
    }
    let mut ambient = BTreeSet::new();
    for n in &c.add_ambient_capabilities {
        if is_all(n) {
            ambient.extend(all_capabilities(available));
        } else {
            ambient.insert(normalize(n, "add_ambient_capabilities")?);
        }
    }
    if privileged {
        set = all_capabilities(available);
    }
    set.extend(ambient.iter().copied());
    Ok(Caps { set, ambient })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(add: &[&str], drop: &[&str]) -> cri::Capability {
        cri::Capability {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
            add_ambient_capabilities: vec![],
        }
    }

    fn names(c: &Caps) -> Vec<&'static str> {
        c.set.iter().copied().collect()
    }

    #[test]
    fn defaults() {
        let got = capabilities(None, false, None).unwrap();
        let mut want = DEFAULT_CAPABILITIES.to_vec();
        want.sort_unstable();
        assert_eq!(names(&got), want);
        assert!(got.ambient.is_empty());
        assert_eq!(default_capabilities().len(), 14);
        assert!(!got.has("CAP_SYS_ADMIN") && !got.has("CAP_NET_ADMIN"));
    }

    #[test]
    fn add_and_drop() {
        let got = capabilities(
            Some(&cap(&["NET_ADMIN", "cap_sys_time"], &["NET_RAW"])),
            false,
            None,
        )
        .unwrap();
        assert!(got.has("CAP_NET_ADMIN") && got.has("CAP_SYS_TIME") && got.has("CAP_CHOWN"));
        assert!(!got.has("CAP_NET_RAW"));
        assert_eq!(got.set.len(), 15);
        // Dropping wins over adding the same one.
        let got =
            capabilities(Some(&cap(&["NET_ADMIN"], &["CAP_NET_ADMIN"])), false, None).unwrap();
        assert!(!got.has("CAP_NET_ADMIN"));
    }

    #[test]
    fn all_keyword() {
        let got = capabilities(Some(&cap(&["ALL"], &[])), false, None).unwrap();
        assert_eq!(got.set.len(), ALL_CAPABILITIES.len());
        let got = capabilities(Some(&cap(&["all"], &["CHOWN"])), false, None).unwrap();
        assert_eq!(got.set.len(), ALL_CAPABILITIES.len() - 1);
        assert!(!got.has("CAP_CHOWN"));
        let got = capabilities(Some(&cap(&[], &["ALL"])), false, None).unwrap();
        assert!(got.set.is_empty());
        let got = capabilities(Some(&cap(&["NET_ADMIN", "KILL"], &["ALL"])), false, None).unwrap();
        assert_eq!(names(&got), ["CAP_KILL", "CAP_NET_ADMIN"]);
    }

    #[test]
    fn privileged_gets_everything() {
        let got = capabilities(Some(&cap(&[], &["ALL"])), true, None).unwrap();
        assert_eq!(got.set.len(), ALL_CAPABILITIES.len());
        let oci = got.to_oci().unwrap();
        assert_eq!(oci.bounding().as_ref().map(|s| s.len()), Some(41));
        assert_eq!(oci.inheritable().as_ref().map(|s| s.len()), Some(0));
    }

    #[test]
    fn all_means_what_the_host_has() {
        // A host whose bounding set lacks CAP_SYS_RESOURCE (24), as in some VMs and nested
        // containers: privileged and "ALL" get the other 40, a named one is passed on.
        let host = ((1u64 << 41) - 1) & !(1u64 << 24);
        for got in [
            capabilities(None, true, Some(host)).unwrap(),
            capabilities(Some(&cap(&["ALL"], &[])), false, Some(host)).unwrap(),
        ] {
            assert_eq!(got.set.len(), 40);
            assert!(!got.has("CAP_SYS_RESOURCE") && got.has("CAP_SYS_TIME"));
        }
        let mut c = cap(&[], &[]);
        c.add_ambient_capabilities = vec!["ALL".into()];
        let got = capabilities(Some(&c), false, Some(host)).unwrap();
        assert!(got.ambient.len() == 40 && !got.ambient.contains("CAP_SYS_RESOURCE"));
        let got = capabilities(Some(&cap(&["SYS_RESOURCE"], &[])), false, Some(host)).unwrap();
        assert!(got.has("CAP_SYS_RESOURCE"));
        // The default set is not limited by the mask either.
        let got = capabilities(None, false, Some(0)).unwrap();
        assert_eq!(got.set.len(), 14);
    }

    #[test]
    fn ambient_lands_in_every_set() {
        let mut c = cap(&[], &["ALL"]);
        c.add_ambient_capabilities = vec!["NET_BIND_SERVICE".into()];
        let got = capabilities(Some(&c), false, None).unwrap();
        assert_eq!(names(&got), ["CAP_NET_BIND_SERVICE"]);
        let oci = got.to_oci().unwrap();
        for set in [
            oci.bounding(),
            oci.effective(),
            oci.permitted(),
            oci.inheritable(),
            oci.ambient(),
        ] {
            let set = set.clone().unwrap_or_default();
            assert!(
                set.contains(&Capability::NetBindService) && set.len() == 1,
                "{set:?}"
            );
        }
    }

    #[test]
    fn unknown_names_are_invalid() {
        for c in [cap(&["NET_FOO"], &[]), cap(&[], &["CAP_"]), cap(&[""], &[])] {
            let err = capabilities(Some(&c), false, None).unwrap_err();
            assert_eq!(err.code(), crate::Code::InvalidArgument);
            assert!(err.message().contains("unknown capability"), "{err}");
        }
    }

    #[test]
    fn every_known_name_converts() {
        let all = capabilities(Some(&cap(&["ALL"], &[])), false, None).unwrap();
        assert_eq!(
            all.to_oci().unwrap().effective().as_ref().map(|s| s.len()),
            Some(41)
        );
    }
}
