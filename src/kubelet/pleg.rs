//! The pod lifecycle event generator ([`Pleg`]), which keeps the [`PodCache`] and tells the sync
//! loop which pods changed. With a runtime that streams container events (`GetContainerEvents`:
//! the built-in runtime, containerd 1.7+), each event has its pod read again at once, and a
//! safety-net relist every [`SAFETY_RELIST_PERIOD`] catches what the events missed (upstream's
//! evented PLEG keeps one too); a stream that keeps missing changes is dropped and asked for
//! again. Without events, [`Relister`] lists the containers every [`RELIST_PERIOD`] and reports
//! the pods whose containers changed state, like upstream's generic PLEG. Either way the PLEG
//! has a health: a relist that completed (and, with events, found the events had kept up) must
//! have been seen within [`RELIST_THRESHOLD`], or the node reports "PLEG is not healthy"; a hung
//! relist or a stalled stream makes it so.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use futures::StreamExt;
use runtime::{RuntimeService, cri};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::pod_cache::PodCache;
use crate::pod::LABEL_POD_UID;
use crate::pod::sync::RuntimeSnapshot;

/// How often the generic PLEG relists.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How long without a relist before the PLEG is unhealthy (upstream: 3 minutes).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// The PLEG's health: when it was last seen working, and how long the last relist took.
#[derive(Debug)]
pub struct PlegHealth {
    last_active: Mutex<StdInstant>,
    last_relist: Mutex<Option<Duration>>,
    threshold: Duration,
}

impl PlegHealth {
    pub fn new(threshold: Duration) -> Self {
        PlegHealth {
            last_active: Mutex::new(StdInstant::now()),
            last_relist: Mutex::new(None),
            threshold,
        }
    }

    /// Records that the PLEG is working now.
    pub fn mark_active(&self) {
        *self.last_active.lock().unwrap_or_else(|p| p.into_inner()) = StdInstant::now();
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
        self.problem_at(StdInstant::now())
    }

    fn problem_at(&self, now: StdInstant) -> Option<String> {
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

    /// Takes what a fresh read of one pod showed (after a runtime event), so the next relist
    /// reports only what the events did not.
    pub fn observe_pod(&mut self, uid: &str, snapshot: &RuntimeSnapshot) {
        self.last.retain(|_, (u, _)| u != uid);
        for c in &snapshot.containers {
            self.last.insert(c.id.clone(), (uid.to_string(), c.state));
        }
    }
}

/// How the PLEG runs.
#[derive(Debug, Clone, Copy)]
pub struct PlegConfig {
    /// The relist period without runtime events (upstream: 1 s).
    pub relist_period: Duration,
    /// The safety-net relist period while runtime events arrive.
    pub safety_period: Duration,
    /// How soon a lost event stream is asked for again.
    pub resubscribe_after: Duration,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            relist_period: RELIST_PERIOD,
            safety_period: SAFETY_RELIST_PERIOD,
            resubscribe_after: Duration::from_secs(5),
        }
    }
}

/// The safety-net relist period while the runtime streams events.
pub const SAFETY_RELIST_PERIOD: Duration = Duration::from_secs(30);

/// The pod lifecycle event generator: the only reader of pod state from the runtime. It keeps
/// the [`PodCache`] fresh and sends the UID of every pod whose containers changed to the sync
/// loop. Refresh requests (a sync that wants a view newer than the cache's) are read in their
/// own tasks and only fill the cache.
pub struct Pleg {
    pub rt: Arc<dyn RuntimeService>,
    pub cache: Arc<PodCache>,
    pub health: Arc<PlegHealth>,
    pub changed: mpsc::UnboundedSender<String>,
    pub refresh: mpsc::UnboundedReceiver<String>,
    pub config: PlegConfig,
}

/// Reads one pod into the cache; returns the view read.
async fn read_pod(rt: &dyn RuntimeService, cache: &PodCache, uid: &str) -> Option<RuntimeSnapshot> {
    let at = Instant::now();
    match crate::pod::sync::runtime_pod_status(rt, uid).await {
        Ok(s) => {
            cache.set(uid, Ok(s.clone()), at);
            Some(s)
        }
        Err(e) => {
            cache.set(uid, Err(e.to_string()), at);
            None
        }
    }
}

/// The pod UID an event is about: from the sandbox status it carries, else from the
/// container's labels.
async fn pod_of_event(rt: &dyn RuntimeService, ev: &cri::ContainerEventResponse) -> Option<String> {
    if let Some(uid) = ev
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.labels.get(LABEL_POD_UID))
    {
        return Some(uid.clone());
    }
    let st = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: ev.container_id.clone(),
            verbose: false,
        })
        .await
        .ok()?
        .status?;
    st.labels.get(LABEL_POD_UID).cloned()
}

async fn subscribe(rt: &dyn RuntimeService) -> Option<runtime::EventStream> {
    match rt.get_container_events(cri::GetEventsRequest {}).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::info!("no runtime events ({e}); relisting every second");
            None
        }
    }
}

impl Pleg {
    /// Runs until `cancel` fires.
    pub async fn run(mut self, cancel: CancellationToken) {
        let relister = Arc::new(Mutex::new(Relister::new()));
        let mut events = subscribe(self.rt.as_ref()).await;
        let offers_events = events.is_some();
        // A relist at once: every pod's view, and the cache's first global time.
        let mut relist = tokio::time::interval(self.period(events.is_some()));
        relist.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut resubscribe = tokio::time::interval(self.config.resubscribe_after);
        resubscribe.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut missed_streak = 0u32;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(uid) = self.refresh.recv() => {
                    let (rt, cache) = (self.rt.clone(), self.cache.clone());
                    tokio::spawn(async move { read_pod(rt.as_ref(), &cache, &uid).await; });
                }
                ev = next_event(&mut events) => match ev {
                    Some(ev) => self.on_event(ev, &relister),
                    None => {
                        tracing::warn!("the runtime's event stream ended; relisting every second until it is back");
                        relist = tokio::time::interval(self.config.relist_period);
                        relist.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    }
                },
                _ = resubscribe.tick(), if offers_events && events.is_none() => {
                    if let Some(s) = subscribe(self.rt.as_ref()).await {
                        tracing::info!("runtime events are back");
                        events = Some(s);
                        relist = tokio::time::interval(self.config.safety_period);
                        relist.set_missed_tick_behavior(MissedTickBehavior::Delay);
                        relist.reset();
                    }
                }
                _ = relist.tick() => {
                    let with_events = events.is_some();
                    match self.relist(&relister).await {
                        Some(missed) if with_events && missed > 0 => {
                            missed_streak += 1;
                            tracing::warn!(missed, "the safety relist found changes the runtime's events did not report");
                            if missed_streak >= 2 {
                                // The stream is stalled: ask for it again.
                                events = None;
                                relist = tokio::time::interval(self.config.relist_period);
                                relist.set_missed_tick_behavior(MissedTickBehavior::Delay);
                            } else {
                                self.health.mark_active();
                            }
                        }
                        Some(_) => {
                            missed_streak = 0;
                            self.health.mark_active();
                        }
                        None => {}
                    }
                }
            }
        }
    }

    fn period(&self, with_events: bool) -> Duration {
        if with_events {
            self.config.safety_period
        } else {
            self.config.relist_period
        }
    }

    /// A runtime event: the pod is read again (in its own task, so a slow runtime delays only
    /// this pod) and handed to the sync loop.
    fn on_event(&self, ev: cri::ContainerEventResponse, relister: &Arc<Mutex<Relister>>) {
        let (rt, cache, changed, relister) = (
            self.rt.clone(),
            self.cache.clone(),
            self.changed.clone(),
            relister.clone(),
        );
        tokio::spawn(async move {
            let Some(uid) = pod_of_event(rt.as_ref(), &ev).await else {
                return;
            };
            if let Some(view) = read_pod(rt.as_ref(), &cache, &uid).await {
                relister
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe_pod(&uid, &view);
            }
            let _ = changed.send(uid);
        });
    }

    /// One relist: the pods whose containers changed are read into the cache and handed to
    /// the sync loop; the cache's global time moves to the relist's start. Returns how many
    /// pods changed, `None` when the list failed.
    async fn relist(&self, relister: &Arc<Mutex<Relister>>) -> Option<usize> {
        let began = std::time::Instant::now();
        let at = Instant::now();
        let list = self
            .rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await;
        let list = match list {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("PLEG relist: {e}");
                return None;
            }
        };
        let current: HashMap<String, (String, i32)> = list
            .containers
            .into_iter()
            .filter_map(|c| Some((c.id, (c.labels.get(LABEL_POD_UID)?.clone(), c.state))))
            .collect();
        let changed = relister
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .diff(current);
        for uid in &changed {
            read_pod(self.rt.as_ref(), &self.cache, uid).await;
            let _ = self.changed.send(uid.clone());
        }
        self.cache.update_time(at);
        self.health.record_relist(began.elapsed());
        Some(changed.len())
    }
}

async fn next_event(
    events: &mut Option<runtime::EventStream>,
) -> Option<cri::ContainerEventResponse> {
    match events {
        Some(s) => match s.next().await {
            Some(Ok(ev)) => Some(ev),
            _ => {
                *events = None;
                None
            }
        },
        None => std::future::pending().await,
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
