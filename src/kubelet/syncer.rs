//! The kubelet's [`PodSyncer`]: each pod worker's sync, terminating and terminated steps carried
//! out over the runtime traits with the decision functions of [`crate::pod`].
//!
//! A sync reads the pod's runtime view from the [`PodCache`] (asking the PLEG for a fresh read
//! when the cache holds none newer than the pod's last sync), computes the actions, carries them
//! out and hands the status to the status manager. Nothing is held across pods: the back-off
//! states are behind locks taken for a lookup, image pulls wait for their own limiter, so pods
//! sync concurrently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::pleg::Refresh;
use super::pod_cache::PodCache;
use crate::api::events::{EventType, PodEvents, Reason};
use crate::cm::ContainerManager;
use crate::inputs::PodInputs;
use crate::model::PodRef;
use crate::pod::images::{ImageManager, ImagePulls};
use crate::pod::manager::RuntimeManager;
use crate::pod::sync::{PodSync, RuntimeSnapshot};
use crate::pod::{self, Backoff, ContainerOptions, Phase, StatusContext, Waiting};
use crate::pod_workers::{PodSyncer, SyncError, SyncOutcome, UpdateType};
use crate::prober::ProbeManager;
use crate::status_manager::StatusManager;
use crate::util::lock;
use crate::volumes::VolumeManager;

/// Syncs pods against a runtime and hands each computed status to the status manager.
pub struct Syncer {
    /// The pods' sandboxes and containers, images and back-offs.
    pub manager: RuntimeManager,
    /// Node-wide container options, built once at start.
    pub opts: ContainerOptions,
    pub runtime_name: String,
    status: Arc<StatusManager>,
    runtime_state: Arc<crate::node::RuntimeState>,
    userns: Arc<super::userns::UsernsManager>,
    cache: Arc<PodCache>,
    /// Asks the PLEG to read a pod from the runtime into the cache.
    refresh: mpsc::UnboundedSender<Refresh>,
    probes: Arc<ProbeManager>,
    /// The pods' volumes: set up before a sync's actions, torn down once a pod terminated.
    pub volumes: Arc<VolumeManager>,
    /// Per pod: when its last sync's actions were done, and why containers then waited.
    synced: Mutex<HashMap<String, LastSync>>,
    /// The pods' cgroups: each made before its pod's sandbox.
    pub cm: Arc<ContainerManager>,
    /// The pods' allocated resources (in-place resize).
    pub allocations: Arc<super::allocation::Allocations>,
    /// Pods the kubelet itself stopped (the node's shutdown, evictions): their statuses say
    /// why.
    stopped_by_kubelet: Mutex<HashMap<String, Stopped>>,
}

/// Why the kubelet itself stopped a pod: its final status says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The node shuts down.
    Shutdown,
    /// Evicted, with upstream's message; `disruption`: with the `DisruptionTarget` condition
    /// (node pressure, not local storage limits).
    Evicted { message: String, disruption: bool },
}

/// When a pod's last sync's actions were done, and why its containers then waited.
type LastSync = (Instant, HashMap<String, Waiting>);

/// What a [`Syncer`] is built from besides the runtime.
pub struct SyncerParts {
    pub opts: ContainerOptions,
    pub runtime_name: String,
    pub backoff: Backoff,
    pub pulls: ImagePulls,
    pub status: Arc<StatusManager>,
    pub runtime_state: Arc<crate::node::RuntimeState>,
    pub userns: Arc<super::userns::UsernsManager>,
    pub cache: Arc<PodCache>,
    pub refresh: mpsc::UnboundedSender<Refresh>,
    pub events: Arc<dyn PodEvents>,
    /// The probes of the pods: started when a pod syncs, stopped when it terminated.
    pub probes: Arc<ProbeManager>,
    /// The pods' cgroup tree.
    pub cm: Arc<ContainerManager>,
    /// The pods' allocated resources (in-place resize).
    pub allocations: Arc<super::allocation::Allocations>,
}

/// Makes `<pods_dir>/<uid>` with its `volumes` and `plugins` directories (mode 0750).
fn make_pod_dirs(pods_dir: &std::path::Path, uid: &str) -> Result<(), SyncError> {
    use std::os::unix::fs::DirBuilderExt;
    if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
        return Err(SyncError::PodUid(uid.to_string()));
    }
    let dir = pods_dir.join(uid);
    for sub in ["volumes", "plugins"] {
        let path = dir.join(sub);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&path)
            .map_err(|source| SyncError::PodDir { path, source })?;
    }
    Ok(())
}

/// What a sync prepared before its actions: the options its containers are made with.
type Prepared = Result<ContainerOptions, SyncError>;

impl Syncer {
    pub fn new(rt: super::Runtime, parts: SyncerParts) -> Self {
        let volumes = VolumeManager::new(None, parts.opts.pods_dir.clone(), Default::default());
        let images = ImageManager::new(rt.images, parts.pulls);
        Syncer {
            manager: RuntimeManager::new(rt.runtime, images, parts.events, parts.backoff),
            volumes: Arc::new(volumes),
            opts: parts.opts,
            runtime_name: parts.runtime_name,
            status: parts.status,
            runtime_state: parts.runtime_state,
            userns: parts.userns,
            cache: parts.cache,
            refresh: parts.refresh,
            probes: parts.probes,
            synced: Mutex::new(HashMap::new()),
            cm: parts.cm,
            allocations: parts.allocations,
            stopped_by_kubelet: Mutex::default(),
        }
    }

    /// Sets up volumes with `volumes` (by default, those of a standalone node: no object,
    /// no token, no node allocatable).
    pub fn with_volumes(mut self, volumes: VolumeManager) -> Self {
        self.volumes = Arc::new(volumes);
        self
    }

    /// The pod `uid` is stopped by the kubelet itself (the node's shutdown, an eviction): its
    /// statuses say so from now on.
    pub fn mark_stopped(&self, uid: &str, why: Stopped) {
        lock(&self.stopped_by_kubelet).insert(uid.to_string(), why);
    }

    /// Drops the back-off entries nobody needs any more (housekeeping).
    pub fn gc_backoff(&self, now: SystemTime) {
        self.manager.gc(now);
    }

    /// The options for syncing `pod`: with its user namespace when it asks for one
    /// (`hostUsers: false`), which the runtime must offer (upstream refuses the pod otherwise).
    fn pod_options(&self, pod: &Pod) -> Result<ContainerOptions, SyncError> {
        let mut opts = self.opts.clone();
        if pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)
            && !self.runtime_state.supports_user_namespaces()
        {
            return Err(SyncError::UserNamespacesUnsupported);
        }
        opts.sandbox.user_namespace = self
            .userns
            .user_namespace(pod)
            .map_err(SyncError::UserNamespace)?;
        Ok(opts)
    }

    /// The pod's runtime view, read after its last sync's actions: from the cache, after asking
    /// the PLEG for a fresh read when the cache has none that new.
    async fn view(&self, who: &PodRef) -> Result<Arc<RuntimeSnapshot>, SyncError> {
        let uid = &who.uid;
        let min = lock(&self.synced).get(uid).map(|(at, _)| *at);
        if self.cache.newer_than(uid, min).is_none() {
            let _ = self.refresh.send(Refresh::Read {
                uid: uid.clone(),
                notify: false,
            });
        }
        Ok(self.cache.get_newer_than(uid, min).await?)
    }

    /// Remembers the end of a sync of the pod `uid` (its actions are done) and why containers
    /// wait.
    fn mark_synced(&self, uid: &str, waiting: HashMap<String, Waiting>) {
        lock(&self.synced).insert(uid.to_string(), (Instant::now(), waiting));
    }

    fn last_waiting(&self, uid: &str) -> HashMap<String, Waiting> {
        lock(&self.synced)
            .get(uid)
            .map(|(_, w)| w.clone())
            .unwrap_or_default()
    }

    fn record_status(
        &self,
        pod: &Pod,
        who: &PodRef,
        snapshot: &RuntimeSnapshot,
        waiting: HashMap<String, Waiting>,
    ) -> PodStatus {
        let probed = self.probes.view(pod, &snapshot.status);
        let ctx = StatusContext {
            now: runtime::clock::now(),
            previous: self.status.status(&who.uid),
            host_ips: self.opts.host_ips.clone(),
            runtime_name: self.runtime_name.clone(),
            readiness: probed.readiness,
            started: probed.started,
            waiting,
        };
        let sandbox = snapshot.sandboxes.first();
        let mut status = pod::pod_status(pod, sandbox, &snapshot.containers, &ctx);
        self.allocations
            .decorate(pod, &mut status, ctx.now, ctx.previous.as_ref());
        // A pod never leaves a terminal phase the API server shows (upstream forces it back):
        // its reason and message stay with it.
        if let Some(api) = pod
            .status
            .as_ref()
            .filter(|s| Phase::parse(s.phase.as_deref()).is_terminal())
        {
            if status.phase != api.phase {
                status.phase = api.phase.clone();
                status.reason = api.reason.clone();
                status.message = api.message.clone();
            }
        }
        match lock(&self.stopped_by_kubelet).get(&who.uid) {
            Some(Stopped::Shutdown) => super::shutdown::stopped_status(&mut status),
            Some(Stopped::Evicted {
                message,
                disruption,
            }) => super::eviction::evicted_status(&mut status, message, *disruption),
            None => {}
        }
        self.status.set_status(pod, status.clone());
        status
    }

    /// Reads the pod from the runtime now (termination wants what runs this moment) and
    /// puts the view in the cache.
    async fn read_now(&self, uid: &str) -> Result<RuntimeSnapshot, SyncError> {
        let at = Instant::now();
        let snapshot = self.manager.read(uid).await?;
        self.cache.set(uid, Ok(snapshot.clone()), at);
        Ok(snapshot)
    }

    /// One sync of `pod` (see [`PodSyncer::sync_pod`]): its inputs gathered, its status
    /// recorded (with the waiting reasons its last sync found), then its actions carried out.
    /// Waiting reasons the actions find anew are read at once by another sync.
    async fn sync_pod_inner(&self, pod: &Pod) -> Result<SyncOutcome, SyncError> {
        // The pod as it runs: with its allocated resources, which a pending resize has not
        // changed yet.
        let pod = &self.allocations.allocated_pod(pod);
        let who = PodRef::of(pod);
        let mut window = SyncWindow::open(&self.refresh, &who.uid);
        let snapshot = self.view(&who).await?;
        let prepared = self.prepare(pod, &who).await;
        let status = self.record_status(pod, &who, &snapshot, self.last_waiting(&who.uid));
        let opts = prepared?;
        self.probes.add_pod(pod);
        let probed = self.probes.view(pod, &snapshot.status);
        let now = runtime::clock::now();
        let mut actions = {
            let backoff = self.manager.backoff();
            pod::compute_pod_actions_with(pod, &who, &snapshot.status, &backoff, now, &probed)
        };
        let needs = self.allocations.needs(pod);
        pod::actions::add_resize_actions(pod, &snapshot.status, &needs, &mut actions);
        let sync = PodSync {
            pod,
            who: &who,
            snapshot: &snapshot,
            actions: &actions,
            opts: &opts,
            now,
        };
        let result = match self.manager.sync_pod(&sync).await {
            Ok(r) => r,
            Err(e) => {
                self.mark_synced(&who.uid, HashMap::new());
                return Err(e.into());
            }
        };
        // What shrinks in the pod's cgroup, now that its containers have (not while one of
        // them keeps its larger limit: the next sync tries both again).
        if result.resize_errors.is_empty() {
            self.cm.finish_pod_resize(&who.uid);
        }
        for name in result.started.iter().chain(&result.resized) {
            let resources = pod::container::find(pod, name).and_then(|c| c.resources.as_ref());
            self.allocations.set_actuated(&who.uid, name, resources);
        }
        self.allocations.set_errors(&who.uid, &result.resize_errors);
        let before = self.last_waiting(&who.uid);
        self.mark_synced(&who.uid, result.waiting.clone());
        // What the actions changed (or a reason found anew) is read once the sync ends and
        // synced again (a runtime without events would show it only at the next relist).
        window.changed = actions.create_sandbox
            || actions.kill_pod
            || !actions.kill_containers.is_empty()
            || !result.started.is_empty()
            || !result.resized.is_empty()
            || result.waiting != before;
        let finished = Phase::parse(status.phase.as_deref()).is_terminal();
        let requeue_after = result.requeue_after;
        let only_waits = result.errors.is_empty();
        match result.into_error() {
            // A back-off (crash loop, image pull) ends on its own: sync again then.
            Some(e) if requeue_after.is_some() && only_waits => {
                tracing::info!(pod = %who.full_name(), "{e}");
                Ok(SyncOutcome {
                    finished,
                    requeue_after,
                })
            }
            Some(e) => Err(e),
            None => Ok(SyncOutcome {
                finished,
                requeue_after,
            }),
        }
    }

    /// What a sync needs before its actions: the runtime's network (unless the pod is on the
    /// host's), the pod's options and data directories, its volumes (upstream's
    /// WaitForAttachAndMount: one that cannot be set up is a FailedMount event and the pod
    /// waits in ContainerCreating), and the objects its environments and pulls read.
    async fn prepare(&self, pod: &Pod, who: &PodRef) -> Prepared {
        if !pod::host_network(pod) {
            if let Some(e) = self.runtime_state.network_error() {
                return Err(SyncError::NetworkNotReady(e));
            }
        }
        let mut opts = self.pod_options(pod)?;
        // The pod's cgroup, before its sandbox (upstream's `EnsureExists`).
        opts.sandbox.cgroup_parent = self
            .cm
            .ensure_pod(pod, &who.uid)
            .map_err(SyncError::PodCgroup)?;
        // The pod's data directories, as upstream's makePodDataDirs (the garbage collector
        // removes them once the pod is gone).
        make_pod_dirs(&self.opts.pods_dir, &who.uid)?;
        let events = self.manager.events();
        // The devices its containers ask for, before anything of the pod is made.
        if let Some(devices) = &self.opts.device_manager {
            opts.devices = devices.allocate(pod).await.inspect_err(|e| {
                let reason = Reason::UnexpectedAdmissionError;
                events.event(pod, None, EventType::Warning, reason, e.to_string());
            })?;
        }
        opts.volumes = self.volumes.set_up(pod, who, events).await?;
        let inputs = PodInputs::new(self.volumes.clone());
        opts.env_objects = inputs.env_objects(pod, who).await;
        // Its image pull secrets: one that cannot be read is a warning, the pull goes on.
        let (pull_secrets, failed) = inputs.pull_secrets(pod, who).await;
        if !failed.is_empty() {
            let message = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image \
                 may not succeed.",
                failed.join(", ")
            );
            let reason = Reason::FailedToRetrieveImagePullSecret;
            events.event(pod, None, EventType::Warning, reason, message);
        }
        opts.pull_secrets = pull_secrets;
        Ok(opts)
    }
}

/// A sync of one pod as the PLEG sees it: begun when opened, ended when dropped (whichever
/// way the sync ends, an error or a cancelled future included), with whether it changed the
/// pod (see [`Refresh::SyncEnded`]).
struct SyncWindow<'a> {
    refresh: &'a mpsc::UnboundedSender<Refresh>,
    uid: String,
    changed: bool,
}

impl<'a> SyncWindow<'a> {
    fn open(refresh: &'a mpsc::UnboundedSender<Refresh>, uid: &str) -> Self {
        let _ = refresh.send(Refresh::SyncBegan(uid.to_string()));
        SyncWindow {
            refresh,
            uid: uid.to_string(),
            changed: false,
        }
    }
}

impl Drop for SyncWindow<'_> {
    fn drop(&mut self) {
        let _ = self.refresh.send(Refresh::SyncEnded {
            uid: std::mem::take(&mut self.uid),
            changed: self.changed,
        });
    }
}

#[async_trait::async_trait]
impl PodSyncer for Syncer {
    async fn sync_pod(&self, update: UpdateType, pod: &Pod) -> Result<SyncOutcome, SyncError> {
        let began = std::time::Instant::now();
        let r = self.sync_pod_inner(pod).await;
        let op = match update {
            UpdateType::Create => "create",
            UpdateType::Update => "update",
            UpdateType::Sync => "sync",
            UpdateType::Kill => "kill",
        };
        crate::metrics::get()
            .pod_worker_duration
            .get_or_create(&crate::metrics::Operation {
                operation_type: op.to_string(),
            })
            .observe(began.elapsed().as_secs_f64());
        r
    }

    async fn sync_terminating_pod(&self, pod: &Pod, grace: Duration) -> Result<(), SyncError> {
        let who = PodRef::of(pod);
        let before = self.read_now(&who.uid).await?;
        let timeout = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        let ip = pod::sync::pod_ip(pod, &before.status, &self.opts.host_ips);
        let errors = self
            .manager
            .kill_pod(pod, &before.status, timeout, &ip)
            .await;
        if !errors.is_empty() {
            return Err(SyncError::Stop(errors));
        }
        let after = self.read_now(&who.uid).await?;
        self.record_status(pod, &who, &after, HashMap::new());
        Ok(())
    }

    /// What the stopped pod still holds besides its containers: its written volumes (tmpfs
    /// unmounted, objects no longer watched, tokens forgotten), its user namespace block, its
    /// place in its QoS cgroup (housekeeping removes its cgroup) and the kubelet's memory of
    /// it. Its dead containers and sandboxes stay for `kubectl logs`
    /// (the newest per container) until the garbage collector removes them, all of them once
    /// no source wants the pod.
    async fn sync_terminated_pod(&self, pod: &Pod) -> Result<(), SyncError> {
        let uid = PodRef::of(pod).uid;
        self.probes.remove_pod(&uid);
        self.volumes.tear_down(&uid);
        self.userns.release(&uid);
        self.cm.forget_pod(&uid);
        self.manager.forget_pod(&uid);
        lock(&self.stopped_by_kubelet).remove(&uid);
        lock(&self.synced).remove(&uid);
        self.status.terminated(pod);
        Ok(())
    }
}
