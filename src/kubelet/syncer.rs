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
use runtime::{ImageService, RuntimeService};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::pleg::Refresh;
use super::pod_cache::PodCache;
use crate::api::events::PodEvents;
use crate::pod::sync::{ImagePulls, RuntimeSnapshot, SyncContext};
use crate::pod::{self, Backoff, ContainerOptions, Phase, StatusContext, Waiting};
use crate::pod_workers::{PodSyncer, SyncError, SyncOutcome, UpdateType};
use crate::prober::ProbeManager;
use crate::status_manager::StatusManager;
use crate::util::lock;
use crate::volumes::VolumeManager;

/// Syncs pods against a runtime and hands each computed status to the status manager.
pub struct Syncer {
    pub rt: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    pub opts: ContainerOptions,
    pub runtime_name: String,
    backoff: Mutex<Backoff>,
    image_backoff: Mutex<Backoff>,
    pulls: ImagePulls,
    status: Arc<StatusManager>,
    runtime_state: Arc<crate::node::RuntimeState>,
    userns: Arc<super::userns::UsernsManager>,
    cache: Arc<PodCache>,
    /// Asks the PLEG to read a pod from the runtime into the cache.
    refresh: mpsc::UnboundedSender<Refresh>,
    events: Arc<dyn PodEvents>,
    probes: Arc<ProbeManager>,
    /// The pods' volumes: set up before a sync's actions, torn down once a pod terminated.
    pub volumes: Arc<VolumeManager>,
    /// Per pod: when its last sync's actions were done, and why containers then waited.
    synced: Mutex<HashMap<String, LastSync>>,
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
}

/// Makes `<pods_dir>/<uid>` with its `volumes` and `plugins` directories (mode 0750).
fn make_pod_dirs(pods_dir: &std::path::Path, uid: &str) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
        return Err(format!("pod UID {uid:?} cannot name a directory"));
    }
    let dir = pods_dir.join(uid);
    for sub in ["volumes", "plugins"] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir.join(sub))
            .map_err(|e| format!("creating {}: {e}", dir.join(sub).display()))?;
    }
    Ok(())
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl Syncer {
    /// The reader of the pods' env objects and pull secrets, over the volume manager's objects.
    fn inputs(&self) -> crate::inputs::PodInputs {
        crate::inputs::PodInputs::new(self.volumes.clone())
    }

    pub fn new(rt: super::Runtime, parts: SyncerParts) -> Self {
        let image_backoff = Backoff::new(crate::pod::backoff::INITIAL, crate::pod::backoff::MAX);
        let volumes = VolumeManager::new(None, parts.opts.pods_dir.clone(), Default::default());
        Syncer {
            volumes: Arc::new(volumes),
            rt: rt.runtime,
            images: rt.images,
            opts: parts.opts,
            runtime_name: parts.runtime_name,
            backoff: Mutex::new(parts.backoff),
            image_backoff: Mutex::new(image_backoff),
            pulls: parts.pulls,
            status: parts.status,
            runtime_state: parts.runtime_state,
            userns: parts.userns,
            cache: parts.cache,
            refresh: parts.refresh,
            events: parts.events,
            probes: parts.probes,
            synced: Mutex::new(HashMap::new()),
        }
    }

    /// Sets up volumes with `volumes` (by default, those of a standalone node: no object,
    /// no token, no node allocatable).
    pub fn with_volumes(mut self, volumes: VolumeManager) -> Self {
        self.volumes = Arc::new(volumes);
        self
    }

    /// Drops the back-off entries nobody needs any more (housekeeping).
    pub fn gc_backoff(&self, now: SystemTime) {
        lock(&self.backoff).gc(now);
        lock(&self.image_backoff).gc(now);
    }

    /// The options for syncing `pod`: with its user namespace when it asks for one
    /// (`hostUsers: false`), which the runtime must offer (upstream refuses the pod otherwise).
    fn pod_options(&self, pod: &Pod) -> Result<ContainerOptions, String> {
        let mut opts = self.opts.clone();
        if pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)
            && !self.runtime_state.supports_user_namespaces()
        {
            return Err(
                "the container runtime's handler \"\" does not support user namespaces \
                 (spec.hostUsers: false)"
                    .to_string(),
            );
        }
        opts.sandbox.user_namespace = self.userns.user_namespace(pod).map_err(|e| e.to_string())?;
        Ok(opts)
    }

    /// The pod's runtime view, read after its last sync's actions: from the cache, after asking
    /// the PLEG for a fresh read when the cache has none that new.
    async fn view(&self, pod: &Pod) -> Result<Arc<RuntimeSnapshot>, SyncError> {
        let uid = uid(pod);
        let min = lock(&self.synced).get(&uid).map(|(at, _)| *at);
        if self.cache.newer_than(&uid, min).is_none() {
            let _ = self.refresh.send(Refresh {
                uid: uid.clone(),
                notify: false,
            });
        }
        self.cache
            .get_newer_than(&uid, min)
            .await
            .map_err(SyncError::Runtime)
    }

    /// Remembers the end of a sync of `pod` (its actions are done) and why containers wait.
    fn mark_synced(&self, pod: &Pod, waiting: HashMap<String, Waiting>) {
        lock(&self.synced).insert(uid(pod), (Instant::now(), waiting));
    }

    fn last_waiting(&self, pod: &Pod) -> HashMap<String, Waiting> {
        lock(&self.synced)
            .get(&uid(pod))
            .map(|(_, w)| w.clone())
            .unwrap_or_default()
    }

    fn record_status(
        &self,
        pod: &Pod,
        snapshot: &RuntimeSnapshot,
        waiting: HashMap<String, Waiting>,
    ) -> PodStatus {
        let probed = self.probes.view(pod, &snapshot.status);
        let ctx = StatusContext {
            now: runtime::clock::now(),
            previous: self.status.status(&uid(pod)),
            host_ips: self.opts.host_ips.clone(),
            runtime_name: self.runtime_name.clone(),
            readiness: probed.readiness,
            started: probed.started,
            waiting,
        };
        let sandbox = snapshot.sandboxes.first();
        let status = pod::pod_status(pod, sandbox, &snapshot.containers, &ctx);
        self.status.set_status(pod, status.clone());
        status
    }

    /// Reads the pod from the runtime now (termination wants what runs this moment) and
    /// puts the view in the cache.
    async fn read_now(&self, pod: &Pod) -> Result<RuntimeSnapshot, SyncError> {
        let at = Instant::now();
        let snapshot = pod::sync::runtime_pod_status(self.rt.as_ref(), &uid(pod))
            .await
            .map_err(SyncError::runtime)?;
        self.cache.set(&uid(pod), Ok(snapshot.clone()), at);
        Ok(snapshot)
    }

    /// One sync of `pod` (see [`PodSyncer::sync_pod`]).
    async fn sync_pod_inner(&self, pod: &Pod) -> Result<SyncOutcome, SyncError> {
        let snapshot = self.view(pod).await?;

        // As upstream: a pod on the pod network waits (and its worker retries) while the
        // runtime reports its network not ready.
        if !pod::host_network(pod) {
            if let Some(e) = self.runtime_state.network_error() {
                self.record_status(pod, &snapshot, self.last_waiting(pod));
                return Err(SyncError::NetworkNotReady(e));
            }
        }
        let mut opts = match self.pod_options(pod) {
            Ok(opts) => opts,
            Err(e) => {
                self.record_status(pod, &snapshot, self.last_waiting(pod));
                return Err(SyncError::Unsupported(e));
            }
        };
        // The pod's data directories, as upstream's makePodDataDirs (the garbage collector
        // removes them once the pod is gone).
        if let Err(e) = make_pod_dirs(&self.opts.pods_dir, &uid(pod)) {
            self.record_status(pod, &snapshot, self.last_waiting(pod));
            return Err(SyncError::Runtime(e));
        }
        // Its volumes, before anything of it is created (upstream's WaitForAttachAndMount): one
        // that cannot be set up is a FailedMount event and the pod waits in ContainerCreating.
        match self.volumes.set_up(pod, self.events.as_ref()).await {
            Ok(claims) => opts.claims = claims,
            Err(e) => {
                self.record_status(pod, &snapshot, self.last_waiting(pod));
                return Err(e.into());
            }
        }
        // The objects its containers' environments reference, as they are now.
        opts.env_objects = self.inputs().env_objects(pod).await;
        // Its image pull secrets: one that cannot be read is a warning, the pull goes on.
        let (pull_secrets, failed) = self.inputs().pull_secrets(pod).await;
        if !failed.is_empty() {
            self.events.event(
                pod,
                None,
                crate::pod::sync::EventType::Warning,
                crate::api::events::Reason::FailedToRetrieveImagePullSecret,
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the \
                     image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        opts.pull_secrets = pull_secrets;
        // The status as it stands, before the actions (which may take long: a pull).
        self.record_status(pod, &snapshot, self.last_waiting(pod));
        self.probes.add_pod(pod);
        let probed = self.probes.view(pod, &snapshot.status);
        let now = runtime::clock::now();
        let actions = {
            let backoff = lock(&self.backoff);
            pod::compute_pod_actions_with(pod, &snapshot.status, &backoff, now, &probed)
        };
        let cx = SyncContext {
            rt: self.rt.as_ref(),
            images: self.images.as_ref(),
            opts: &opts,
            backoff: &self.backoff,
            image_backoff: &self.image_backoff,
            pulls: &self.pulls,
            events: self.events.as_ref(),
            now,
        };
        let result = pod::sync::sync_pod(&cx, pod, &snapshot, &actions).await;
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                self.mark_synced(pod, HashMap::new());
                self.record_status(pod, &snapshot, HashMap::new());
                return Err(SyncError::runtime(e));
            }
        };
        self.mark_synced(pod, result.waiting.clone());
        // What the actions changed is read at once and synced again (a runtime without events
        // would show it only at the next relist, up to a second later).
        if actions.create_sandbox
            || actions.kill_pod
            || !actions.kill_containers.is_empty()
            || !result.started.is_empty()
        {
            let _ = self.refresh.send(Refresh {
                uid: uid(pod),
                notify: true,
            });
        }
        // The status of what the sync started from, with the reasons it found: what it started
        // shows up with the PLEG's next view of the pod.
        let status = self.record_status(pod, &snapshot, result.waiting.clone());
        let finished = Phase::parse(status.phase.as_deref()).is_terminal();
        match result.error() {
            // A back-off (crash loop, image pull) ends on its own: sync again then.
            Some(e) if result.requeue_after.is_some() && result.errors.is_empty() => {
                tracing::info!(pod = %crate::model::pod_full_name(pod), "{e}");
                Ok(SyncOutcome {
                    finished,
                    requeue_after: result.requeue_after,
                })
            }
            Some(e) => Err(e),
            None => Ok(SyncOutcome {
                finished,
                requeue_after: result.requeue_after,
            }),
        }
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
        let before = self.read_now(pod).await?;
        let timeout = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        let ip = pod::sync::pod_ip(pod, &before.status, &self.opts.host_ips);
        let errors = pod::kill::kill_pod(
            self.rt.as_ref(),
            self.events.as_ref(),
            pod,
            &before.status,
            timeout,
            &ip,
        )
        .await;
        if !errors.is_empty() {
            return Err(SyncError::Runtime(errors.join("; ")));
        }
        let after = self.read_now(pod).await?;
        self.record_status(pod, &after, HashMap::new());
        Ok(())
    }

    /// What the stopped pod still holds besides its containers: its written volumes (tmpfs
    /// unmounted, objects no longer watched, tokens forgotten), its user namespace block and
    /// the kubelet's memory of it. Its dead containers and sandboxes stay for `kubectl logs`
    /// (the newest per container) until the garbage collector removes them, all of them once
    /// no source wants the pod.
    async fn sync_terminated_pod(&self, pod: &Pod) -> Result<(), SyncError> {
        let uid = uid(pod);
        self.probes.remove_pod(&uid);
        self.volumes.tear_down(&uid);
        self.userns.release(&uid);
        lock(&self.backoff).forget_pod(&uid);
        lock(&self.image_backoff).forget_pod(&uid);
        lock(&self.synced).remove(&uid);
        self.status.terminated(pod);
        Ok(())
    }
}
