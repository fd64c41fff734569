//! The thresholds and the pure part of each cycle (upstream's `helpers.go` and the first half of
//! `synchronize`): which thresholds the observations meet, a threshold met before staying met
//! until its minimum reclaim is recovered too, soft thresholds acted on only once met for their
//! grace period, and a pressure condition kept for the transition period after its last
//! threshold went.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::{Pressure, Signal};
use crate::config::Eviction;
use crate::util::quantity;

/// A threshold's value: an amount, or a percentage of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(i64),
    Percentage(f64),
}

impl ThresholdValue {
    /// `"100Mi"`, `"1000"` or `"10%"` (the configuration is checked before).
    pub fn parse(s: &str) -> Option<ThresholdValue> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let p: f64 = p.trim().parse().ok()?;
            return (0.0..=100.0)
                .contains(&p)
                .then_some(ThresholdValue::Percentage(p));
        }
        quantity::parse_bytes(s)
            .ok()
            .filter(|v| *v >= 0)
            .map(ThresholdValue::Quantity)
    }

    /// The amount for a signal of `capacity` (upstream multiplies in floating point and
    /// truncates).
    pub fn absolute(self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percentage(p) => (capacity as f64 * p / 100.0) as i64,
        }
    }

    fn is_zero(self) -> bool {
        match self {
            ThresholdValue::Quantity(q) => q == 0,
            ThresholdValue::Percentage(p) => p == 0.0,
        }
    }
}

/// One eviction threshold: met when the signal's available amount is below its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// How long it must be met before the kubelet acts (zero: a hard threshold).
    pub grace: Duration,
    /// How much beyond the threshold must be available again before it is no longer met.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }

    fn key(&self) -> (Signal, bool) {
        (self.signal, self.is_hard())
    }
}

/// The configured thresholds, hard then soft. A threshold of zero turns its signal off.
pub fn from_config(hard: &BTreeMap<String, String>, ev: &Eviction) -> Vec<Threshold> {
    let mut out = Vec::new();
    let mut add = |map: &BTreeMap<String, String>, soft: bool| {
        for (name, text) in map {
            let (Some(signal), Some(value)) = (Signal::parse(name), ThresholdValue::parse(text))
            else {
                continue;
            };
            if value.is_zero() {
                continue;
            }
            let grace = if soft {
                ev.soft_grace_period
                    .get(name)
                    .copied()
                    .unwrap_or(Duration::ZERO)
            } else {
                Duration::ZERO
            };
            if soft && grace.is_zero() {
                continue;
            }
            out.push(Threshold {
                signal,
                value,
                grace,
                min_reclaim: ev
                    .minimum_reclaim
                    .get(name)
                    .and_then(|t| ThresholdValue::parse(t)),
            });
        }
    };
    add(hard, false);
    add(&ev.soft, true);
    out
}

/// What a signal measured: the amount available and the capacity percentages refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// The thresholds `observations` meet (a signal not observed meets none). With
/// `with_min_reclaim`, each threshold counts its minimum reclaim too: how a threshold met
/// before is judged resolved.
pub fn met(
    thresholds: &[Threshold],
    observations: &Observations,
    with_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut quantity = t.value.absolute(o.capacity);
            if with_min_reclaim {
                if let Some(r) = t.min_reclaim {
                    quantity = quantity.saturating_add(r.absolute(o.capacity));
                }
            }
            quantity > o.available
        })
        .cloned()
        .collect()
}

/// The decisions of one cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The node's pressure conditions now.
    pub conditions: Vec<Pressure>,
    /// The thresholds to act on, memory first: met, and for at least their grace period.
    pub act_on: Vec<Threshold>,
}

/// What the cycles remember: the thresholds acted on last, when each threshold was first seen
/// met, when each pressure was last seen.
#[derive(Debug, Default)]
pub struct Tracker {
    acted_on: Vec<Threshold>,
    first_met: HashMap<(Signal, bool), Instant>,
    pressure_seen: BTreeMap<Pressure, Instant>,
}

impl Tracker {
    /// One cycle's decisions for `observations` at `now`.
    pub fn observe(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
        transition: Duration,
        now: Instant,
    ) -> Decision {
        let mut current = met(thresholds, observations, false);
        for t in met(&self.acted_on, observations, true) {
            if !current.iter().any(|c| c.key() == t.key()) {
                current.push(t);
            }
        }
        let previous = std::mem::take(&mut self.first_met);
        self.first_met = current
            .iter()
            .map(|t| (t.key(), previous.get(&t.key()).copied().unwrap_or(now)))
            .collect();
        for t in &current {
            self.pressure_seen.insert(t.signal.pressure(), now);
        }
        self.pressure_seen
            .retain(|_, seen| now.duration_since(*seen) <= transition);
        let conditions: Vec<Pressure> = self.pressure_seen.keys().copied().collect();
        let mut act_on: Vec<Threshold> = current
            .into_iter()
            .filter(|t| {
                self.first_met
                    .get(&t.key())
                    .is_some_and(|at| now.duration_since(*at) >= t.grace)
            })
            .collect();
        act_on.sort_by_key(|t| t.signal.pressure() != Pressure::Memory);
        self.acted_on = act_on.clone();
        Decision { conditions, act_on }
    }
}

/// A threshold's value as upstream's messages print it, for a signal of `capacity`.
pub fn display_quantity(signal: Signal, amount: i64) -> String {
    if signal.is_bytes() {
        quantity::format_bytes(amount)
    } else {
        amount.to_string()
    }
}
