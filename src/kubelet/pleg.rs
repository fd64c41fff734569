//! The pod lifecycle event generator. With a runtime that streams container events
//! (`GetContainerEvents`: the built-in runtime, containerd 1.7+), events drive the pod workers
//! directly. Without them, [`Relister`] lists the containers every [`RELIST_PERIOD`] and reports
//! the pods whose containers changed state, like upstream's generic PLEG. Either way the PLEG
//! has a health: a relist (or a live event stream) must have been seen within
//! [`RELIST_THRESHOLD`], or the node reports "PLEG is not healthy".

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use runtime::{RuntimeService, cri};

use crate::pod::LABEL_POD_UID;

/// How often the generic PLEG relists.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How long without a relist before the PLEG is unhealthy (upstream: 3 minutes).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// The PLEG's health: when it was last seen working, and how long the last relist took.
#[derive(Debug)]
pub struct PlegHealth {
    last_active: Mutex<Instant>,
    last_relist: Mutex<Option<Duration>>,
    threshold: Duration,
}

impl PlegHealth {
    pub fn new(threshold: Duration) -> Self {
        PlegHealth {
            last_active: Mutex::new(Instant::now()),
            last_relist: Mutex::new(None),
            threshold,
        }
    }

    /// Records that the PLEG is working now.
    pub fn mark_active(&self) {
        *self.last_active.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Records a relist that took `took` (upstream's relist duration metric); slow relists are
    /// logged.
    pub fn record_relist(&self, took: Duration) {
        *self.last_relist.lock().unwrap_or_else(|p| p.into_inner()) = Some(took);
        if took > self.threshold / 4 {
            tracing::warn!("PLEG relist took {took:?}");
        }
    }

    /// How long the last relist took, if there was one.
    pub fn last_relist(&self) -> Option<Duration> {
        *self.last_relist.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `None` when healthy, else the upstream message.
    pub fn problem(&self) -> Option<String> {
        self.problem_at(Instant::now())
    }

    fn problem_at(&self, now: Instant) -> Option<String> {
        let last = *self.last_active.lock().unwrap_or_else(|p| p.into_inner());
        let ago = now.saturating_duration_since(last);
        (ago > self.threshold).then(|| crate::node::pleg_unhealthy(ago, self.threshold))
    }
}

/// The generic PLEG's memory of the last relist: each container's pod and state.
#[derive(Debug, Default)]
pub struct Relister {
    last: HashMap<String, (String, i32)>,
}

impl Relister {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lists the containers and returns the UIDs of the pods whose containers appeared,
    /// changed state or vanished since the previous relist.
    pub async fn relist(&mut self, rt: &dyn RuntimeService) -> runtime::Result<BTreeSet<String>> {
        let list = rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await?;
        let current: HashMap<String, (String, i32)> = list
            .containers
            .into_iter()
            .filter_map(|c| {
                let uid = c.labels.get(LABEL_POD_UID)?.clone();
                Some((c.id, (uid, c.state)))
            })
            .collect();
        Ok(self.diff(current))
    }

    fn diff(&mut self, current: HashMap<String, (String, i32)>) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        for (id, (uid, state)) in &current {
            if self.last.get(id).map(|(_, s)| s) != Some(state) {
                changed.insert(uid.clone());
            }
        }
        for (id, (uid, _)) in &self.last {
            if !current.contains_key(id) {
                changed.insert(uid.clone());
            }
        }
        self.last = current;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(list: &[(&str, &str, i32)]) -> HashMap<String, (String, i32)> {
        list.iter()
            .map(|(id, uid, s)| (id.to_string(), (uid.to_string(), *s)))
            .collect()
    }

    #[test]
    fn relist_reports_pods_whose_containers_changed() {
        let mut r = Relister::new();
        let first = r.diff(state(&[("c1", "p1", 1), ("c2", "p2", 1)]));
        assert_eq!(first, BTreeSet::from(["p1".into(), "p2".into()]));
        assert!(
            r.diff(state(&[("c1", "p1", 1), ("c2", "p2", 1)]))
                .is_empty()
        );
        // c1 exited, c2 vanished, c3 appeared in p3.
        let next = r.diff(state(&[("c1", "p1", 2), ("c3", "p3", 0)]));
        assert_eq!(
            next,
            BTreeSet::from(["p1".into(), "p2".into(), "p3".into()])
        );
    }

    #[test]
    fn health_turns_bad_after_the_threshold_with_the_upstream_message() {
        let h = PlegHealth::new(Duration::from_secs(180));
        let start = *h.last_active.lock().unwrap();
        assert_eq!(h.problem_at(start + Duration::from_secs(10)), None);
        assert_eq!(
            h.problem_at(start + Duration::from_secs(185)).as_deref(),
            Some("PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s")
        );
    }
}
