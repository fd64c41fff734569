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
use std::time::Duration;

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
        *crate::util::lock(&self.last_active) = Instant::now();
    }

    /// Records a relist that took `took` (upstream's relist duration metric); slow relists are
    /// logged.
    pub fn record_relist(&self, took: Duration) {
        *crate::util::lock(&self.last_relist) = Some(took);
        if took > self.threshold / 4 {
            tracing::warn!("PLEG relist took {took:?}");
        }
    }

    /// How long the last relist took, if there was one.
    pub fn last_relist(&self) -> Option<Duration> {
        *crate::util::lock(&self.last_relist)
    }

    /// `None` when healthy, else the upstream message.
    pub fn problem(&self) -> Option<String> {
        self.problem_at(Instant::now())
    }

    fn problem_at(&self, now: Instant) -> Option<String> {
        let last = *crate::util::lock(&self.last_active);
        let ago = now.saturating_duration_since(last);
        (ago > self.threshold).then(|| crate::node::pleg_unhealthy(ago, self.threshold))
    }
}

/// The generic PLEG's memory of the last relist: each container's pod and state.
#[derive(Debug, Default)]
pub struct Relister {
    last: HashMap<String, (String, i32)>,
    /// When the previous relist began (`kubelet_pleg_relist_interval_seconds`).
    began: Option<std::time::Instant>,
}

impl Relister {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the containers a relist found (id → pod UID and state) and returns the UIDs of the
    /// pods whose containers appeared, changed state or vanished since the previous one.
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

    /// The pod of a container the PLEG has seen.
    pub fn pod_of(&self, container_id: &str) -> Option<String> {
        self.last.get(container_id).map(|(uid, _)| uid.clone())
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

/// What the syncer asks of the PLEG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// Read the pod into the cache (a sync wants a view newer than the cache's); hand it to
    /// the sync loop once read when `notify`.
    Read { uid: String, notify: bool },
    /// A sync of the pod began. Until it ends, the pod's runtime events are held: they are
    /// mostly the echoes of the sync's own actions (sandbox and containers created and
    /// started), and a read for each would only race the sync for the runtime.
    SyncBegan(String),
    /// The sync ended. The pod is read once and handed to the sync loop when the sync changed
    /// something (its containers were started or stopped, or a waiting reason changed:
    /// without runtime events nothing else would tell until the next relist) or when events
    /// were held meanwhile.
    SyncEnded { uid: String, changed: bool },
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

/// How far the PLEG trusts the runtime's event stream, from what its relists find.
#[derive(Debug)]
struct Trust {
    trusted: bool,
    /// Relists in a row (with events) that found changes the events had missed.
    missed_streak: u32,
    /// Clean one-second relists in a row since the stream came back.
    clean: u32,
    /// How many clean relists earn the stream its trust back.
    needed: u32,
    fast: Duration,
    safety: Duration,
}

/// What a relist's outcome means.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// The PLEG made real progress (its health is marked).
    healthy: bool,
    /// Drop the event stream (and ask for it again later).
    drop_stream: bool,
}

impl Trust {
    fn new(with_events: bool, config: &PlegConfig) -> Self {
        let fast = config.relist_period.max(Duration::from_millis(1));
        Trust {
            trusted: with_events,
            missed_streak: 0,
            clean: 0,
            needed: u32::try_from(config.safety_period.as_millis() / fast.as_millis())
                .unwrap_or(u32::MAX)
                .max(1),
            fast,
            safety: config.safety_period,
        }
    }

    /// The relist period: the safety net's while a trusted stream runs, else one second.
    fn period(&self, with_events: bool) -> Duration {
        if with_events && self.trusted {
            self.safety
        } else {
            self.fast
        }
    }

    fn relisted(&mut self, with_events: bool, missed: usize) -> Verdict {
        if !with_events {
            // Relisting alone: every completed relist is progress.
            self.trusted = false;
            self.clean = 0;
            self.missed_streak = 0;
            return Verdict {
                healthy: true,
                drop_stream: false,
            };
        }
        if missed == 0 {
            self.missed_streak = 0;
            if !self.trusted {
                self.clean += 1;
                self.trusted = self.clean >= self.needed;
            }
            return Verdict {
                healthy: true,
                drop_stream: false,
            };
        }
        self.missed_streak += 1;
        self.clean = 0;
        let stalled = self.missed_streak >= 2;
        if stalled {
            self.trusted = false;
            self.missed_streak = 0;
        }
        Verdict {
            // What the relist found is handed on, but a stream that keeps missing is no
            // progress of the event path.
            healthy: !stalled,
            drop_stream: stalled,
        }
    }
}

/// The pod lifecycle event generator: the only reader of pod state from the runtime. It keeps
/// the [`PodCache`] fresh and sends the UID of every pod whose containers changed to the sync
/// loop. Refresh requests (a sync that wants a view newer than the cache's) are read in their
/// own tasks and only fill the cache.
pub struct Pleg {
    pub rt: Arc<dyn RuntimeService>,
    pub cache: Arc<PodCache>,
    pub health: Arc<PlegHealth>,
    pub changed: mpsc::UnboundedSender<String>,
    pub refresh: mpsc::UnboundedReceiver<Refresh>,
    pub config: PlegConfig,
}

/// One read at a time per pod: a request while a read of the pod is under way makes that read
/// go once more when it ends (the view it brings may predate what the request is about),
/// however many requests came meanwhile. A burst of events (created, started, ...) costs two
/// reads, not one each.
#[derive(Clone)]
struct Reads {
    rt: Arc<dyn RuntimeService>,
    cache: Arc<PodCache>,
    changed: mpsc::UnboundedSender<String>,
    relister: Arc<Mutex<Relister>>,
    /// Pods being read: whether to read again, whether to tell the sync loop.
    inflight: Arc<Mutex<HashMap<String, Again>>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Again {
    again: bool,
    notify: bool,
}

impl Reads {
    /// Takes the view of pod `uid` event `ev` carries into the cache and hands the pod to the
    /// sync loop, when it carries a whole one ([`view::of_event`]) newer than the cache's and
    /// no read of the pod is under way (that read could bring an older view after it).
    /// Returns whether it did; if not, the pod is to be read.
    fn apply_event(&self, uid: &str, ev: &cri::ContainerEventResponse) -> bool {
        if crate::util::lock(&self.inflight).contains_key(uid) {
            return false;
        }
        let cached = self.cache.latest(uid);
        let Some(v) = view::of_event(ev, cached.as_deref()) else {
            return false;
        };
        if !self.cache.set(uid, Ok(v.clone()), view::taken_at(ev)) {
            return false;
        }
        crate::util::lock(&self.relister).observe_pod(uid, &v);
        let _ = self.changed.send(uid.to_string());
        true
    }

    /// Reads `uid` (now, or again after the read under way), and hands it to the sync loop
    /// when `notify`.
    fn request(&self, uid: String, notify: bool) {
        {
            let mut inflight = crate::util::lock(&self.inflight);
            if let Some(a) = inflight.get_mut(&uid) {
                a.again = true;
                a.notify |= notify;
                return;
            }
            inflight.insert(uid.clone(), Again::default());
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut notify = notify;
            loop {
                if let Some(view) = read_pod(this.rt.as_ref(), &this.cache, &uid).await {
                    crate::util::lock(&this.relister).observe_pod(&uid, &view);
                }
                if notify {
                    let _ = this.changed.send(uid.clone());
                }
                let mut inflight = crate::util::lock(&this.inflight);
                match inflight.get_mut(&uid) {
                    Some(a) if a.again => {
                        notify = a.notify;
                        *a = Again::default();
                    }
                    _ => {
                        inflight.remove(&uid);
                        return;
                    }
                }
            }
        });
    }
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
            cache.set(uid, Err(e), at);
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
        let reads = Reads {
            rt: self.rt.clone(),
            cache: self.cache.clone(),
            changed: self.changed.clone(),
            relister: relister.clone(),
            inflight: Arc::default(),
        };
        let mut events = subscribe(self.rt.as_ref()).await;
        let offers_events = events.is_some();
        // A stream is trusted from the start; one that missed changes twice in a row is dropped,
        // and once asked for again it is trusted only after a safety period of one-second
        // relists that found nothing it had missed.
        let mut trust = Trust::new(events.is_some(), &self.config);
        // A relist at once: every pod's view, and the cache's first global time.
        let mut relist = self.relist_timer(trust.period(events.is_some()));
        let mut resubscribe = tokio::time::interval(self.config.resubscribe_after);
        resubscribe.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut syncing = Syncing::default();
        // The pods of events that named none the PLEG knew, once the runtime told which.
        let (resolved_tx, mut resolved) = mpsc::unbounded_channel::<String>();
        loop {
            let period = trust.period(events.is_some());
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(r) = self.refresh.recv() => syncing.on_refresh(r, &reads),
                Some(uid) = resolved.recv() => syncing.read_unless_held(uid, &reads),
                ev = next_event(&mut events) => match ev {
                    Some(ev) => self.on_event(ev, &reads, &mut syncing, &resolved_tx),
                    None => tracing::warn!("the runtime's event stream ended; relisting every second until it is back"),
                },
                _ = resubscribe.tick(), if offers_events && events.is_none() => {
                    if let Some(s) = subscribe(self.rt.as_ref()).await {
                        tracing::info!("runtime events are back; relisting every second until they prove complete");
                        events = Some(s);
                    }
                }
                _ = relist.tick() => {
                    let with_events = events.is_some();
                    if let Some(changed) = self.relist(&relister).await {
                        // A pod being synced has its events held (or on their way): its
                        // changes were not missed by them.
                        let missed = changed.iter().filter(|uid| !syncing.in_sync(uid)).count();
                        let verdict = trust.relisted(with_events, missed);
                        if verdict.healthy {
                            self.health.mark_active();
                        }
                        if with_events && missed > 0 {
                            tracing::warn!(missed, "a relist found changes the runtime's events did not report");
                        }
                        if verdict.drop_stream {
                            tracing::warn!("the runtime's event stream is stalled; asking for it again");
                            events = None;
                        }
                    }
                }
            }
            let next = trust.period(events.is_some());
            if next != period {
                relist = self.relist_timer(next);
                relist.reset();
            }
        }
    }

    fn relist_timer(&self, period: Duration) -> tokio::time::Interval {
        let mut t = tokio::time::interval(period);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        t
    }

    /// A runtime event: the pod is read again (in its own task, so a slow runtime delays only
    /// this pod; coalesced with the reads of it under way) and handed to the sync loop.
    fn on_event(
        &self,
        ev: cri::ContainerEventResponse,
        reads: &Reads,
        syncing: &mut Syncing,
        resolved: &mpsc::UnboundedSender<String>,
    ) {
        // The pod: from the sandbox the event carries, else from what the PLEG last saw of the
        // container (a deleted one can be asked about no more), else from the runtime.
        let known = ev
            .pod_sandbox_status
            .as_ref()
            .and_then(|s| s.labels.get(LABEL_POD_UID))
            .cloned()
            .or_else(|| crate::util::lock(&reads.relister).pod_of(&ev.container_id));
        if let Some(uid) = known {
            // An event that carries the pod's whole view updates the cache as it is; a pod
            // being synced waits for the sync's end instead, as with any other event.
            if syncing.in_sync(&uid) || !reads.apply_event(&uid, &ev) {
                syncing.read_unless_held(uid, reads);
            }
            return;
        }
        // Asked in its own task; the answer comes back through the loop, where a sync under
        // way holds it like any other event.
        let (rt, resolved) = (self.rt.clone(), resolved.clone());
        tokio::spawn(async move {
            if let Some(uid) = pod_of_event(rt.as_ref(), &ev).await {
                let _ = resolved.send(uid);
            }
        });
    }

    /// One relist: the pods whose containers changed are read into the cache and handed to
    /// the sync loop; the cache's global time moves to the relist's start. Returns the pods
    /// that changed, `None` when the list failed.
    async fn relist(&self, relister: &Arc<Mutex<Relister>>) -> Option<BTreeSet<String>> {
        let began = std::time::Instant::now();
        let at = Instant::now();
        let metrics = crate::metrics::get();
        if let Some(prev) = crate::util::lock(relister).began.replace(began) {
            metrics
                .pleg_relist_interval
                .observe(began.duration_since(prev).as_secs_f64());
        }
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
        let changed = crate::util::lock(relister).diff(current);
        for uid in &changed {
            read_pod(self.rt.as_ref(), &self.cache, uid).await;
            let _ = self.changed.send(uid.clone());
        }
        self.cache.update_time(at);
        self.health.record_relist(began.elapsed());
        metrics
            .pleg_relist_duration
            .observe(began.elapsed().as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        metrics.pleg_last_seen.set(now.as_secs_f64());
        Some(changed)
    }
}

/// The pods being synced, and whether runtime events about them were held meanwhile.
#[derive(Debug, Default)]
struct Syncing {
    pods: HashMap<String, bool>,
}

impl Syncing {
    fn on_refresh(&mut self, r: Refresh, reads: &Reads) {
        match r {
            Refresh::Read { uid, notify } => reads.request(uid, notify),
            Refresh::SyncBegan(uid) => {
                self.pods.insert(uid, false);
            }
            Refresh::SyncEnded { uid, changed } => {
                let held = self.pods.remove(&uid).unwrap_or(false);
                if changed || held {
                    reads.request(uid, true);
                }
            }
        }
    }

    /// An event about `uid`: held if a sync of it is under way, else the pod is read and
    /// handed on.
    fn read_unless_held(&mut self, uid: String, reads: &Reads) {
        match self.pods.get_mut(&uid) {
            Some(held) => *held = true,
            None => reads.request(uid, true),
        }
    }

    /// Whether a sync of `uid` is under way.
    fn in_sync(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
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

mod view;

#[cfg(test)]
mod tests;
