//! Node-pressure eviction's settings, upstream's fields: `evictionHard` (with
//! `mergeDefaultEvictionSettings`), `evictionSoft`, `evictionSoftGracePeriod`,
//! `evictionMaxPodGracePeriod`, `evictionMinimumReclaim` and `evictionPressureTransitionPeriod`,
//! checked as upstream's `ParseThresholdConfig` does: known signals only, each threshold a
//! percentage or a quantity, every soft threshold with a grace period.

use std::collections::BTreeMap;
use std::time::Duration;

use super::values::{Thresholds, parse_duration};
use super::{Error, Typed, get, invalid};

/// The signals a threshold may name (upstream's, `containerfs.*` included).
pub const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// The upstream kubelet's default hard eviction thresholds.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("imagefs.available", "15%"),
        ("nodefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The eviction settings besides `evictionHard` (kept in `KubeletConfig::eviction_hard`, which
/// node allocatable reads too). Every map is keyed by signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub soft: BTreeMap<String, String>,
    pub soft_grace_period: BTreeMap<String, Duration>,
    /// `evictionMaxPodGracePeriod`, seconds: the longest grace a pod evicted for a soft
    /// threshold gets.
    pub max_pod_grace_period: i64,
    pub minimum_reclaim: BTreeMap<String, String>,
    /// How long a pressure condition stays after its threshold is no longer met.
    pub pressure_transition_period: Duration,
}

impl Default for Eviction {
    fn default() -> Self {
        Eviction {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            max_pod_grace_period: 0,
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: Duration::from_secs(300),
        }
    }
}

/// The fields as written.
pub(super) struct RawEviction {
    pub hard: Option<Thresholds>,
    pub merge_defaults: Option<Typed<bool>>,
    pub soft: Option<Thresholds>,
    pub soft_grace_period: Option<Thresholds>,
    pub max_pod_grace_period: Option<Typed<i64>>,
    pub minimum_reclaim: Option<Thresholds>,
    pub pressure_transition_period: Option<Typed<Duration>>,
}

impl RawEviction {
    /// `evictionHard` (the defaults when unset; with `mergeDefaultEvictionSettings`, the
    /// defaults of the signals it does not name added) and the rest.
    pub fn into_config(self) -> Result<(BTreeMap<String, String>, Eviction), Error> {
        let d = Eviction::default();
        let merge = get(self.merge_defaults).unwrap_or(false);
        let hard = match self.hard {
            None => default_eviction_hard(),
            Some(Thresholds(mut set)) => {
                if merge {
                    for (signal, value) in default_eviction_hard() {
                        set.entry(signal).or_insert(value);
                    }
                }
                set
            }
        };
        check_map("evictionHard", &hard, check_threshold)?;
        let soft = self.soft.map(|Thresholds(m)| m).unwrap_or_default();
        check_map("evictionSoft", &soft, check_threshold)?;
        let minimum_reclaim = self
            .minimum_reclaim
            .map(|Thresholds(m)| m)
            .unwrap_or_default();
        check_map("evictionMinimumReclaim", &minimum_reclaim, check_threshold)?;
        let mut soft_grace_period = BTreeMap::new();
        for (signal, text) in self
            .soft_grace_period
            .map(|Thresholds(m)| m)
            .unwrap_or_default()
        {
            let field = format!("evictionSoftGracePeriod.{signal}");
            if !SIGNALS.contains(&signal.as_str()) {
                return Err(invalid(&field, "unknown eviction signal"));
            }
            let grace = parse_duration(&text).map_err(|e| invalid(&field, e))?;
            soft_grace_period.insert(signal, grace);
        }
        for signal in soft.keys() {
            if soft_grace_period.get(signal).is_none_or(|g| g.is_zero()) {
                return Err(invalid(
                    &format!("evictionSoft.{signal}"),
                    "a soft eviction threshold needs a grace period in evictionSoftGracePeriod",
                ));
            }
        }
        let max_pod_grace_period = get(self.max_pod_grace_period).unwrap_or(d.max_pod_grace_period);
        if max_pod_grace_period < 0 {
            return Err(invalid(
                "evictionMaxPodGracePeriod",
                format!("must be >= 0, not {max_pod_grace_period}"),
            ));
        }
        let pressure_transition_period =
            get(self.pressure_transition_period).unwrap_or(d.pressure_transition_period);
        Ok((
            hard,
            Eviction {
                soft,
                soft_grace_period,
                max_pod_grace_period,
                minimum_reclaim,
                pressure_transition_period,
            },
        ))
    }
}

/// Every key a known signal, every value passing `check`.
fn check_map(
    name: &str,
    map: &BTreeMap<String, String>,
    check: fn(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    for (signal, value) in map {
        let field = format!("{name}.{signal}");
        if !SIGNALS.contains(&signal.as_str()) {
            return Err(invalid(&field, "unknown eviction signal"));
        }
        check(value).map_err(|e| invalid(&field, e))?;
    }
    Ok(())
}

/// A threshold is a percentage (`"10%"`) or a quantity (`"100Mi"`, `"1G"`, `"500"`).
pub(super) fn check_threshold(s: &str) -> Result<(), Error> {
    if let Some(p) = s.strip_suffix('%') {
        return match p.parse::<f64>() {
            Ok(x) if (0.0..=100.0).contains(&x) => Ok(()),
            _ => Err(Error::Percentage(s.to_string())),
        };
    }
    match crate::util::quantity::parse_bytes(s) {
        Ok(v) if v >= 0 => Ok(()),
        _ => Err(Error::Quantity(s.to_string())),
    }
}
