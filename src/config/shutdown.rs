//! Graceful node shutdown's settings, upstream's fields: `shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods` and `shutdownGracePeriodByPodPriority`, checked as upstream
//! does, plus nodelet's `nodeletShutdownOnSigterm` (run the shutdown sequence when the agent
//! gets SIGTERM, for init systems without logind). [`Shutdown::groups`] is upstream's
//! `migrateConfig`: the two periods become two priority groups.

use std::time::Duration;

use serde_json::Value;

use super::{Error, Typed, get, invalid};

/// The priority of `system-cluster-critical` (and above it, `system-node-critical`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Pods of at least `priority` (and below the next group's) get `grace` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGroup {
    pub priority: i32,
    pub grace: Duration,
}

/// The node shutdown settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shutdown {
    pub grace_period: Duration,
    pub grace_period_critical_pods: Duration,
    pub by_pod_priority: Vec<PriorityGroup>,
    /// `nodeletShutdownOnSigterm`.
    pub on_sigterm: bool,
}

impl Shutdown {
    /// The priority groups, lowest priority first (stopped first); empty: shutdown handling is
    /// off.
    pub fn groups(&self) -> Vec<PriorityGroup> {
        if !self.by_pod_priority.is_empty() {
            let mut groups = self.by_pod_priority.clone();
            groups.sort_by_key(|g| g.priority);
            return groups;
        }
        if self.grace_period.is_zero() {
            return Vec::new();
        }
        vec![
            PriorityGroup {
                priority: 0,
                grace: self
                    .grace_period
                    .saturating_sub(self.grace_period_critical_pods),
            },
            PriorityGroup {
                priority: SYSTEM_CRITICAL_PRIORITY,
                grace: self.grace_period_critical_pods,
            },
        ]
    }
}

/// The fields as written.
pub(super) struct RawShutdown {
    pub grace_period: Option<Typed<Duration>>,
    pub grace_period_critical_pods: Option<Typed<Duration>>,
    pub by_pod_priority: Option<Value>,
    pub on_sigterm: Option<Typed<bool>>,
}

impl RawShutdown {
    pub fn into_config(self) -> Result<Shutdown, Error> {
        let grace_period = get(self.grace_period).unwrap_or_default();
        let critical = get(self.grace_period_critical_pods).unwrap_or_default();
        if critical > grace_period {
            return Err(invalid(
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{} must be <= shutdownGracePeriod ({})",
                    crate::util::go_duration(critical),
                    crate::util::go_duration(grace_period)
                ),
            ));
        }
        let by_pod_priority = by_priority(self.by_pod_priority)?;
        let periods_set = !grace_period.is_zero() || !critical.is_zero();
        if !by_pod_priority.is_empty() && periods_set {
            return Err(invalid(
                "shutdownGracePeriodByPodPriority",
                "cannot be set together with shutdownGracePeriod or \
                 shutdownGracePeriodCriticalPods",
            ));
        }
        Ok(Shutdown {
            grace_period,
            grace_period_critical_pods: critical,
            by_pod_priority,
            on_sigterm: get(self.on_sigterm).unwrap_or(false),
        })
    }
}

/// `shutdownGracePeriodByPodPriority`: a list of `{priority, shutdownGracePeriodSeconds}`.
fn by_priority(v: Option<Value>) -> Result<Vec<PriorityGroup>, Error> {
    const FIELD: &str = "shutdownGracePeriodByPodPriority";
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(invalid(FIELD, format!("must be a list, not {other}"))),
    };
    let mut out: Vec<PriorityGroup> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = |k: &str| format!("{FIELD}[{i}].{k}");
        let Value::Object(map) = item else {
            return Err(invalid(
                &format!("{FIELD}[{i}]"),
                format!("must be a mapping, not {item}"),
            ));
        };
        if let Some(k) = map
            .keys()
            .find(|k| *k != "priority" && *k != "shutdownGracePeriodSeconds")
        {
            return Err(invalid(&field(k), "unknown field"));
        }
        let priority = map
            .get("priority")
            .and_then(Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| invalid(&field("priority"), "must be a 32-bit integer"))?;
        let seconds = map
            .get("shutdownGracePeriodSeconds")
            .and_then(Value::as_i64)
            .filter(|s| *s >= 0)
            .ok_or_else(|| {
                invalid(
                    &field("shutdownGracePeriodSeconds"),
                    "must be an integer >= 0",
                )
            })?;
        if out.iter().any(|g| g.priority == priority) {
            return Err(invalid(
                &field("priority"),
                format!("{priority} is listed twice"),
            ));
        }
        out.push(PriorityGroup {
            priority,
            grace: Duration::from_secs(seconds.unsigned_abs()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(grace: u64, critical: u64, by: Option<Value>) -> RawShutdown {
        RawShutdown {
            grace_period: Some(Typed(Duration::from_secs(grace))),
            grace_period_critical_pods: Some(Typed(Duration::from_secs(critical))),
            by_pod_priority: by,
            on_sigterm: None,
        }
    }

    #[test]
    fn two_periods_become_two_groups() {
        let s = raw(30, 10, None).into_config().unwrap();
        assert_eq!(
            s.groups(),
            [
                PriorityGroup {
                    priority: 0,
                    grace: Duration::from_secs(20)
                },
                PriorityGroup {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace: Duration::from_secs(10)
                },
            ]
        );
        assert!(raw(0, 0, None).into_config().unwrap().groups().is_empty());
        let e = raw(5, 10, None).into_config().unwrap_err().to_string();
        assert_eq!(
            e,
            "shutdownGracePeriodCriticalPods: 10s must be <= shutdownGracePeriod (5s)"
        );
    }

    #[test]
    fn groups_by_priority_are_sorted_and_checked() {
        let by = serde_json::json!([
            {"priority": 100000, "shutdownGracePeriodSeconds": 5},
            {"priority": 0, "shutdownGracePeriodSeconds": 20},
        ]);
        let s = raw(0, 0, Some(by.clone())).into_config().unwrap();
        let p: Vec<i32> = s.groups().iter().map(|g| g.priority).collect();
        assert_eq!(p, [0, 100000]);
        let err = |r: RawShutdown| r.into_config().unwrap_err().to_string();
        assert!(err(raw(10, 0, Some(by))).contains("cannot be set together"));
        assert_eq!(
            err(raw(0, 0, Some(serde_json::json!([{"priority": 1}])))),
            "shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds: must be an integer >= 0"
        );
        assert_eq!(
            err(raw(
                0,
                0,
                Some(serde_json::json!([{"priority": 1, "grace": 2}]))
            )),
            "shutdownGracePeriodByPodPriority[0].grace: unknown field"
        );
    }
}
