//! What the node keeps from its pods (upstream's node allocatable settings): `evictionHard`
//! (known signals, each a percentage or a quantity; upstream's defaults), `kubeReserved` and
//! `systemReserved` (a quantity of `cpu`, `memory`, `ephemeral-storage` or `pid` each; `pid`
//! only caps the processes of the `kubepods` cgroup), and
//! `reservedSystemCPUs` (a CPU list such as `0-1,6`, which replaces the cpu both reserve by
//! its count, as upstream does). Checked here; `node::allocatable` subtracts them from the
//! capacity, and `node::check_reservations` refuses at start a node whose reservations exceed
//! it.

use std::collections::BTreeMap;

use super::values::Quantities;
use super::{Error, Typed, get, invalid};
use crate::util::quantity::{parse_bytes, parse_cpu_millis};

/// The resources a reservation may name (`pid`: process IDs, kept from `kubepods`).
const RESERVABLE: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pid"];

/// The node's reservations, in base units: millicores for `cpu`, bytes for the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// `kubeReserved`: for the kubelet and the container runtime.
    pub kube: BTreeMap<String, i64>,
    /// `systemReserved`: for the OS's daemons; with `reservedSystemCPUs`, its cpu is their
    /// count.
    pub system: BTreeMap<String, i64>,
    /// `reservedSystemCPUs` as written (`""`: none).
    pub system_cpus: String,
}

impl Reserved {
    /// What both reserve of `resource`, in base units.
    pub fn total(&self, resource: &str) -> i64 {
        let kube = self.kube.get(resource).copied().unwrap_or(0);
        let system = self.system.get(resource).copied().unwrap_or(0);
        kube.saturating_add(system)
    }
}

/// `kubeReserved`, `systemReserved` and `reservedSystemCPUs` as written (read by `RawConfig`
/// itself: a flattened struct would lose their paths in type errors), checked.
pub(super) fn reserved(
    kube: Option<Quantities>,
    system: Option<Quantities>,
    system_cpus: Option<Typed<String>>,
) -> Result<Reserved, Error> {
    let mut kube = resources("kubeReserved", kube)?;
    let mut system = resources("systemReserved", system)?;
    let system_cpus = get(system_cpus).unwrap_or_default();
    if !system_cpus.trim().is_empty() {
        let count = cpu_list_len(&system_cpus).map_err(|why| {
            invalid(
                "reservedSystemCPUs",
                format!("{system_cpus:?} is not a CPU list ({why})"),
            )
        })?;
        kube.remove("cpu");
        system.insert("cpu".to_string(), count.saturating_mul(1000));
    }
    Ok(Reserved {
        kube,
        system,
        system_cpus,
    })
}

/// One reservation mapping: each resource reservable, each quantity one and not negative.
fn resources(field: &str, raw: Option<Quantities>) -> Result<BTreeMap<String, i64>, Error> {
    let Some(Quantities(map)) = raw else {
        return Ok(BTreeMap::new());
    };
    let mut out = BTreeMap::new();
    for (resource, quantity) in map {
        let path = format!("{field}.{resource}");
        let parsed = match resource.as_str() {
            "cpu" => parse_cpu_millis(&quantity),
            "memory" | "ephemeral-storage" | "pid" => parse_bytes(&quantity),
            _ => {
                return Err(invalid(
                    &path,
                    format!(
                        "cannot reserve {resource:?}: only {} can be reserved",
                        RESERVABLE.join(", ")
                    ),
                ));
            }
        };
        let value = parsed.map_err(|e| invalid(&path, e.to_string()))?;
        if value < 0 {
            return Err(invalid(
                &path,
                format!("{quantity:?} is negative: a reservation cannot be"),
            ));
        }
        out.insert(resource, value);
    }
    Ok(out)
}

/// Why a CPU list does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum CpuListError {
    #[error("{0:?} is not a CPU number")]
    NotANumber(String),
    #[error("the range {0:?} ends before it starts")]
    Backwards(String),
    #[error("the range {0:?} is too long")]
    TooLong(String),
}

/// How many CPUs a Linux CPU list (`0-3,6,8-9`) names; each counted once.
fn cpu_list_len(list: &str) -> Result<i64, CpuListError> {
    let mut cpus = std::collections::BTreeSet::new();
    for part in list.split(',').map(str::trim) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let number = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| CpuListError::NotANumber(s.to_string()))
        };
        let (first, last) = (number(first)?, number(last)?);
        if first > last {
            return Err(CpuListError::Backwards(part.to_string()));
        }
        if last - first > 65_535 {
            return Err(CpuListError::TooLong(part.to_string()));
        }
        cpus.extend(first..=last);
    }
    Ok(i64::try_from(cpus.len()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn read(body: &str) -> Result<Reserved, Error> {
        super::super::parse(&format!("{HEAD}{body}")).map(|(c, _)| c.reserved)
    }

    #[test]
    fn reservations_are_read_in_base_units() {
        assert_eq!(read("").expect("valid"), Reserved::default());
        let r = read(
            "kubeReserved: {cpu: 250m, memory: 1Gi, pid: '100'}\n\
             systemReserved: {cpu: '1', ephemeral-storage: 5G, pid: 1k}\n",
        )
        .expect("valid");
        assert_eq!(
            r.kube,
            [
                ("cpu".into(), 250),
                ("memory".into(), 1 << 30),
                ("pid".into(), 100)
            ]
            .into()
        );
        let system = [
            ("cpu".into(), 1000),
            ("ephemeral-storage".into(), 5_000_000_000),
            ("pid".into(), 1000),
        ];
        assert_eq!(r.system, system.into());
        assert_eq!((r.total("cpu"), r.total("memory")), (1250, 1 << 30));
        assert_eq!(r.total("ephemeral-storage"), 5_000_000_000);
        assert_eq!(r.total("pid"), 1100);
        assert_eq!(r.total("pods"), 0);
    }

    #[test]
    fn reserved_system_cpus_replace_the_cpu_both_reserve() {
        let r = read(
            "kubeReserved: {cpu: 500m, memory: 100Mi}\n\
             systemReserved: {cpu: 250m}\nreservedSystemCPUs: 0-1,6\n",
        )
        .expect("valid");
        assert_eq!(r.kube, [("memory".into(), 100 << 20)].into());
        assert_eq!(r.system, [("cpu".into(), 3000)].into());
        assert_eq!(r.system_cpus, "0-1,6");
    }

    #[test]
    fn bad_reservations_say_what_is_wrong() {
        let cases = [
            (
                "kubeReserved: {gpu: '1'}",
                "kubeReserved.gpu: cannot reserve \"gpu\": only cpu, memory, \
                 ephemeral-storage, pid can be reserved",
            ),
            (
                "kubeReserved: {memory: -1Gi}",
                "kubeReserved.memory: \"-1Gi\" is negative: a reservation cannot be",
            ),
            (
                "systemReserved: {cpu: lots}",
                "systemReserved.cpu: invalid quantity \"lots\"",
            ),
            (
                "kubeReserved: [cpu]",
                "kubeReserved: must be a mapping of resource to quantity, not a list",
            ),
            (
                "reservedSystemCPUs: 3-1",
                "reservedSystemCPUs: \"3-1\" is not a CPU list (the range \"3-1\" ends \
                 before it starts)",
            ),
            (
                "reservedSystemCPUs: 0,x",
                "reservedSystemCPUs: \"0,x\" is not a CPU list (\"x\" is not a CPU number)",
            ),
        ];
        for (body, want) in cases {
            let got = read(&format!("{body}\n")).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "{body}");
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list_len("0"), Ok(1));
        assert_eq!(cpu_list_len("0-3,6, 8-9"), Ok(7));
        assert_eq!(cpu_list_len("0-1,1"), Ok(2));
        for bad in ["", "a", "3-1", "0-", "1,,2", "-1"] {
            assert!(cpu_list_len(bad).is_err(), "{bad:?}");
        }
    }
}
