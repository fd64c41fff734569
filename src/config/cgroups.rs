//! The kubelet's cgroup settings, upstream's fields: `cgroupRoot` (where the pod hierarchy
//! goes), `cgroupsPerQOS` (whether the kubelet makes that hierarchy at all), `cgroupDriver`,
//! `enforceNodeAllocatable` and `cpuCFSQuota`, checked together as upstream's validation does.
//! `crate::cm` (the container manager) makes the hierarchy they describe.

use super::{Error, Typed, get, invalid};

/// How cgroups are named and made: directly in the cgroup filesystem, or as systemd slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

/// The enforcement key that caps the pods' cgroup at what is allocatable.
pub const ENFORCE_PODS: &str = "pods";

/// The kubelet's cgroup settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    /// `cgroupRoot`: the cgroup the `kubepods` hierarchy goes under (cgroupfs path, `/`).
    pub root: String,
    /// `cgroupsPerQOS`: the kubelet makes `kubepods`, the QoS cgroups and one cgroup per pod.
    pub per_qos: bool,
    /// `cgroupDriver`.
    pub driver: CgroupDriver,
    /// `enforceNodeAllocatable`: `pods` caps `kubepods` at capacity minus the reservations.
    pub enforce_node_allocatable: Vec<String>,
    /// `cpuCFSQuota`: CPU limits become CFS quotas (pods' and containers').
    pub cpu_cfs_quota: bool,
}

impl Default for Cgroups {
    fn default() -> Self {
        Cgroups {
            root: "/".to_string(),
            per_qos: true,
            driver: CgroupDriver::Cgroupfs,
            enforce_node_allocatable: vec![ENFORCE_PODS.to_string()],
            cpu_cfs_quota: true,
        }
    }
}

impl Cgroups {
    /// Whether `kubepods` is capped at the node's allocatable resources.
    pub fn enforces_pods(&self) -> bool {
        self.per_qos
            && self
                .enforce_node_allocatable
                .iter()
                .any(|k| k == ENFORCE_PODS)
    }
}

/// The fields as written (read by `RawConfig` itself, so that type errors keep their paths).
pub(super) struct RawCgroups {
    pub root: Option<Typed<String>>,
    pub per_qos: Option<Typed<bool>>,
    pub driver: Option<Typed<String>>,
    pub enforce_node_allocatable: Option<Typed<Vec<String>>>,
    pub cpu_cfs_quota: Option<Typed<bool>>,
}

impl RawCgroups {
    /// The settings, defaulted and checked.
    pub fn into_config(self) -> Result<Cgroups, Error> {
        let d = Cgroups::default();
        let root = get(self.root).unwrap_or(d.root);
        if !root.starts_with('/') || root.split('/').any(|c| c == "..") {
            return Err(invalid(
                "cgroupRoot",
                format!("{root:?} must be an absolute cgroup path without \"..\""),
            ));
        }
        let driver = match get(self.driver).as_deref() {
            None | Some("cgroupfs") => CgroupDriver::Cgroupfs,
            Some("systemd") => CgroupDriver::Systemd,
            Some(other) => {
                return Err(invalid(
                    "cgroupDriver",
                    format!("{other:?} is not \"cgroupfs\" or \"systemd\""),
                ));
            }
        };
        let per_qos = get(self.per_qos).unwrap_or(d.per_qos);
        let enforce = get(self.enforce_node_allocatable).unwrap_or(d.enforce_node_allocatable);
        check_enforcement(&enforce, per_qos)?;
        Ok(Cgroups {
            root: normalize(&root),
            per_qos,
            driver,
            enforce_node_allocatable: enforce,
            cpu_cfs_quota: get(self.cpu_cfs_quota).unwrap_or(d.cpu_cfs_quota),
        })
    }
}

/// `/a/b/` and `/a//b` are `/a/b`; the root stays `/`.
fn normalize(root: &str) -> String {
    let parts: Vec<&str> = root.split('/').filter(|c| !c.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// `enforceNodeAllocatable` as upstream checks it, plus what nodelet does not enforce yet.
fn check_enforcement(enforce: &[String], per_qos: bool) -> Result<(), Error> {
    const FIELD: &str = "enforceNodeAllocatable";
    let none = enforce.iter().any(|k| k == "none");
    if none && enforce.len() > 1 {
        return Err(invalid(
            FIELD,
            "may not contain additional enforcements when \"none\" is specified",
        ));
    }
    for key in enforce {
        match key.as_str() {
            ENFORCE_PODS | "none" => {}
            "system-reserved"
            | "kube-reserved"
            | "system-reserved-compressible"
            | "kube-reserved-compressible" => {
                return Err(invalid(
                    FIELD,
                    format!(
                        "{key:?} is not supported by nodelet: it needs the reserved cgroup \
                         (systemReservedCgroup, kubeReservedCgroup), which nodelet does not \
                         manage; \"pods\" and \"none\" are"
                    ),
                ));
            }
            other => {
                return Err(invalid(
                    FIELD,
                    format!(
                        "option {other:?} is not valid; valid options are \"pods\", \
                         \"system-reserved\", \"kube-reserved\", \
                         \"system-reserved-compressible\", \"kube-reserved-compressible\" \
                         or \"none\""
                    ),
                ));
            }
        }
    }
    // As upstream: even the default `[pods]` (or `[none]`) must be emptied explicitly.
    if !per_qos && !enforce.is_empty() {
        return Err(invalid(
            FIELD,
            "is not supported unless cgroupsPerQOS is true (set it to [] to turn cgroupsPerQOS \
             off)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(root: Option<&str>, per_qos: Option<bool>, enforce: Option<&[&str]>) -> RawCgroups {
        RawCgroups {
            root: root.map(|r| Typed(r.to_string())),
            per_qos: per_qos.map(Typed),
            driver: None,
            enforce_node_allocatable: enforce
                .map(|e| Typed(e.iter().map(|s| s.to_string()).collect())),
            cpu_cfs_quota: None,
        }
    }

    #[test]
    fn defaults_and_normalized_roots() {
        let c = raw(None, None, None).into_config().unwrap();
        assert_eq!(c, Cgroups::default());
        assert!(c.enforces_pods());
        let c = raw(Some("/nl//test/"), None, None).into_config().unwrap();
        assert_eq!(c.root, "/nl/test");
        for bad in ["nl", "/a/../b", ""] {
            let e = raw(Some(bad), None, None).into_config().unwrap_err();
            assert!(e.to_string().starts_with("cgroupRoot: "), "{e}");
        }
    }

    #[test]
    fn enforcement_as_upstream_checks_it() {
        let err = |per_qos: bool, e: &[&str]| {
            raw(None, Some(per_qos), Some(e))
                .into_config()
                .unwrap_err()
                .to_string()
        };
        assert!(err(true, &["none", "pods"]).contains("when \"none\" is specified"));
        assert!(err(true, &["pod"]).contains("option \"pod\" is not valid"));
        assert!(err(true, &["system-reserved"]).contains("not supported by nodelet"));
        assert!(err(false, &["pods"]).contains("unless cgroupsPerQOS is true"));
        assert!(err(false, &["none"]).contains("unless cgroupsPerQOS is true"));
        let none = raw(None, None, Some(&["none"])).into_config().unwrap();
        assert!(!none.enforces_pods());
        let off = raw(None, Some(false), Some(&[])).into_config().unwrap();
        assert!(!off.enforces_pods());
    }
}
