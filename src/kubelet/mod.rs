//! The kubelet's wiring ([`Kubelet`]): pod sources feed a merger; the sync loop
//! ([`sync_loop`]) hands every change, PLEG event and housekeeping tick to the pod workers; the
//! workers sync pods through [`Syncer`] over the runtime traits and hand the statuses to the
//! [`StatusManager`]. Static pods come from `staticPodPath` and `staticPodURL`; with an API
//! server (a kubeconfig), the pods bound to the node come from it too, static pods get mirror
//! pods, and statuses are written back. Every background task (sources, status manager, PLEG,
//! housekeeping, node agent, runtime checks, event sink) lives in one task set under one
//! cancellation token; shutdown cancels and joins them all.

pub mod allocation;
pub mod eviction;
pub mod gc;
pub mod housekeeping;
pub mod image_gc;
pub mod logrotate;
pub mod mirror;
pub mod notify;
pub mod pleg;
pub mod pod_cache;
pub mod pod_cidr;
pub mod shutdown;
mod start;
pub mod sync_loop;
mod syncer;
pub mod userns;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use runtime::{ImageService, RuntimeService, cri};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admission;
use crate::config::KubeletConfig;
use crate::node::{NodeAgent, NodeFacts};
use crate::pod;
use crate::pod_workers::{PodWorkers, UpdateType};
use crate::sources::{self, PodOp, PodUpdate, merge::Merger};
use crate::status_manager::StatusManager;

use start::{Channels, HousekeepingParts, Wiring};
pub use syncer::{Syncer, SyncerParts};

/// How often housekeeping runs (orphaned pods, forgotten workers, garbage collection).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(2);
/// How often resizes waiting for room are tried again, besides when a pod goes or shrinks.
pub const PENDING_RESIZE_RETRY: Duration = Duration::from_secs(60);

/// How long shutdown waits for the background tasks before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the kubelet could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime did not answer, or refused the kubelet's user namespace range.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// The node's facts could not be read.
    #[error(transparent)]
    Node(#[from] crate::node::Error),
    /// The kubelet server could not start.
    #[error(transparent)]
    Server(#[from] crate::server::Error),
    /// The pods' cgroup tree could not be made (upstream: "Failed to start ContainerManager").
    #[error("failed to start the container manager: {0}")]
    Cgroups(#[from] crate::cm::Error),
    /// The device plugin registration or pod-resources socket could not be served.
    #[error("failed to start the device manager: {0}")]
    Devices(#[source] std::io::Error),
}

/// The runtime the kubelet drives.
#[derive(Clone)]
pub struct Runtime {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
}

/// Runs the kubelet until `shutdown` resolves. Pods keep running afterwards (a restarted kubelet
/// adopts them), unless `nodeletShutdownOnSigterm` asks for the node's shutdown sequence.
pub async fn run(
    cfg: KubeletConfig,
    rt: Runtime,
    client: Option<kube::Client>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let on_sigterm = cfg.shutdown.on_sigterm;
    notify::status("starting");
    let kubelet = Kubelet::start(cfg, rt, client).await?;
    shutdown.await;
    if on_sigterm {
        notify::stopping("shutting the node down: stopping its pods");
        kubelet.shutdown_node().await;
    } else {
        notify::stopping("stopping; pods keep running");
    }
    kubelet.stop().await;
    Ok(())
}

/// A running kubelet: its parts wired together, its tasks under one token.
pub struct Kubelet {
    cancel: CancellationToken,
    tasks: JoinSet<()>,
    node_agent: Option<Arc<NodeAgent>>,
    status: Arc<StatusManager>,
    /// The node's shutdown sequence.
    shutdown: Arc<shutdown::NodeShutdown>,
}

impl Kubelet {
    /// Wires the parts and starts every task: a table of contents of the kubelet, each step
    /// a builder in [`start`].
    pub async fn start(
        cfg: KubeletConfig,
        rt: Runtime,
        client: Option<kube::Client>,
    ) -> Result<Kubelet, Error> {
        let mut w = Wiring::new(cfg, rt, client);
        let version = w.runtime_version().await?;
        let (name, v) = (&version.runtime_name, &version.runtime_version);
        notify::status(&format!("runtime {name} {v} answers; starting the kubelet"));
        let mut facts = NodeFacts::gather(&w.cfg, name, v)?;
        crate::node::check_reservations(&facts, &w.cfg)?;
        w.runtime_cgroup_driver().await;
        let cm = w.container_manager(&facts)?;
        let mut opts = w.container_options(&facts, &version);
        let status = w.status_manager();
        let runtime_state = w.runtime_state().await;
        let userns = w.user_namespaces(&opts)?;
        let recorder = w.events();
        let image_gc = w.image_gc(&recorder);
        let cache = Arc::new(pod_cache::PodCache::new());
        let health = Arc::new(pleg::PlegHealth::new(pleg::RELIST_THRESHOLD));
        let sync_health = Arc::new(notify::SyncLoopHealth::new(notify::sync_loop_threshold(
            w.cfg.sync_frequency,
        )));
        let (port, pods) = w
            .server(facts.node_ips(), &status, &health, &sync_health)
            .await?;
        // The Node advertises the port bound; admission checks pods against the registered
        // Node, or against this one before that.
        facts.kubelet_port = port;
        notify::status(&match &w.client {
            Some(_) => format!(
                "serving on port {port}; registering node {}",
                w.cfg.node_name
            ),
            None => format!("serving on port {port}; admitting the static pods"),
        });
        let devices = w.devices(&pods).await.map_err(Error::Devices)?;
        opts.device_manager = Some(devices.clone());
        let local_node = crate::node::build_node(&facts, &w.cfg);
        let ch = Channels::new();
        w.pleg(&cache, &health, ch.changed.0, ch.refresh.1);
        let probes = w.probes(&status, &recorder, ch.probes.0);
        let allocations = w.allocations();
        let parts = SyncerParts {
            opts,
            runtime_name: version.runtime_name.clone(),
            backoff: w.crash_loop_backoff(),
            pulls: w.image_pulls(),
            status: status.clone(),
            runtime_state: runtime_state.clone(),
            userns: userns.clone(),
            cache: cache.clone(),
            refresh: ch.refresh.0,
            events: Arc::new(recorder.clone()),
            probes,
            cm,
            allocations: allocations.clone(),
        };
        let syncer = w.syncer(parts, &local_node);
        let workers = w.workers(&syncer);
        let (updates, problems) = (ch.updates.0, ch.problems.0);
        let mut expected_sources = w.static_sources(&updates, &problems);
        let shutdown_state = Arc::new(shutdown::ShutdownState::default());
        let eviction_state = Arc::new(eviction::EvictionState::default());
        let node_agent = w.node_agent(
            &facts,
            &runtime_state,
            &health,
            &recorder,
            &shutdown_state,
            &eviction_state,
        );
        let (mirrors_tx, mirrors) = watch::channel(sources::api::MirrorPods::new());
        status.set_mirrors(mirrors.clone());
        let mirror_manager = w.api_source(&updates, mirrors_tx);
        if mirror_manager.is_some() {
            expected_sources.push(sources::API_SOURCE);
        }
        drop((updates, problems));
        w.eviction(
            &facts,
            start::EvictionInputs {
                cm: syncer.cm.clone(),
                state: eviction_state.clone(),
                workers: workers.clone(),
                pods: pods.subscribe(),
                image_gc,
                events: recorder.clone(),
                syncer: syncer.clone(),
            },
        );
        let stopping = syncer.clone();
        let shutdown = Arc::new(shutdown::NodeShutdown {
            groups: w.cfg.shutdown.groups(),
            state: shutdown_state.clone(),
            workers: workers.clone(),
            status: status.clone(),
            pods: pods.subscribe(),
            mark_stopped: Box::new(move |uid| {
                stopping.mark_stopped(uid, syncer::Stopped::Shutdown)
            }),
        });
        w.logind_shutdown(&shutdown, &recorder);
        let desired = w.housekeeping(HousekeepingParts {
            workers: workers.clone(),
            userns,
            syncer,
            status: status.clone(),
            mirror_manager,
            mirrors,
            node_agent: node_agent.clone(),
            cache,
        });
        let agent = node_agent.clone();
        let node = Box::new(move || {
            let registered = agent.as_ref().and_then(|a| a.node());
            registered.unwrap_or_else(|| local_node.clone())
        });
        let readiness = match &node_agent {
            Some(agent) => notify::Readiness::Registered(agent.manager().subscribe()),
            None => notify::Readiness::SourcesSeen(desired.subscribe()),
        };
        w.notify(readiness, &health, &sync_health);
        let sync_loop = sync_loop::SyncLoop {
            health: sync_health,
            workers,
            status: status.clone(),
            merger: Merger::new(),
            rejected: HashSet::new(),
            node,
            expected_sources,
            recorder,
            desired,
            pods,
            changes: 0,
            shutdown: shutdown_state,
            eviction: eviction_state,
            allocations,
            devices: Some(devices),
        };
        let inputs = sync_loop::Inputs {
            updates: ch.updates.1,
            changed: ch.changed.1,
            probes: ch.probes.1,
            problems: ch.problems.1,
        };
        w.sync_loop(sync_loop, inputs);
        Ok(Kubelet {
            cancel: w.cancel,
            tasks: w.tasks,
            node_agent,
            status,
            shutdown,
        })
    }

    /// Runs the node's shutdown sequence (see [`shutdown`]): new pods refused, the Node
    /// NotReady, the pods stopped by priority group within the configured grace periods and
    /// their final statuses written. Nothing without a `shutdownGracePeriod`.
    pub async fn shutdown_node(&self) {
        self.shutdown.run().await;
    }

    /// The status the kubelet last computed for the pod `uid`.
    pub fn pod_status(&self, uid: &str) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        self.status.status(uid)
    }

    /// Stops every task and waits for them (aborting those that do not end within a few
    /// seconds). Pods keep running: a restarted kubelet adopts them.
    pub async fn stop(mut self) {
        tracing::info!("kubelet stopping; pods keep running");
        self.cancel.cancel();
        let joined = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            tracing::warn!(
                "background tasks did not stop within {SHUTDOWN_GRACE:?}; aborting them"
            );
            self.tasks.shutdown().await;
        }
        // Every other holder of the agent was a task, joined above.
        if let Some(agent) = self.node_agent.take().and_then(Arc::into_inner) {
            agent.stop().await;
        }
    }
}

/// What new pods are admitted against: the Node, whether it shuts down, its pressure.
pub(crate) struct Admit<'a> {
    pub node: &'a k8s_openapi::api::core::v1::Node,
    /// What admitted pods hold, and their resizes.
    pub allocations: &'a allocation::Allocations,
    pub shutting_down: bool,
    pub eviction: &'a eviction::EvictionState,
    /// Device plugins' devices (allocated before the resource predicates, as upstream).
    pub devices: Option<&'a crate::devices::DeviceManager>,
    /// Once every configured source has sent its pods: the pods whose devices stay held (the
    /// others ended or are gone, and their devices are free for this pod).
    pub device_holders: Option<&'a dyn Fn(&str) -> bool>,
}

impl Admit<'_> {
    fn admit(&self, pod: &Pod, active: &[Pod]) -> Result<(), admission::Rejection> {
        if self.shutting_down {
            return Err(admission::Rejection {
                reason: shutdown::REASON.into(),
                message: shutdown::REJECT_MESSAGE.into(),
            });
        }
        if let Some(message) = self.eviction.refusal(pod) {
            return Err(admission::Rejection {
                reason: eviction::REASON.into(),
                message,
            });
        }
        let Some(devices) = self.devices else {
            return admission::admit(pod, active, self.node);
        };
        devices.admit(pod, self.device_holders)?;
        // The Node's allocatable of a device resource is at least what pods hold of it (its
        // plugin may be gone or the Node not written yet: upstream's sanitizeNodeAllocatable).
        let node = devices.sanitize(self.node);
        admission::admit(pod, active, &node).inspect_err(|_| {
            let uid = sources::pod_uid(pod);
            devices.retain(|u| u != uid);
        })
    }
}

/// Hands one merged change to the pod workers (and the status manager). New pods go through
/// admission first: a rejected pod never reaches a worker; its status says why (Failed).
fn dispatch(
    workers: &PodWorkers,
    status: &StatusManager,
    rejected: &mut HashSet<String>,
    merger: &Merger,
    admit: &Admit<'_>,
    change: PodUpdate,
) {
    // The pods admission counts as running: gathered at the first new pod of the batch, then
    // grown by each pod admitted.
    let mut active: Option<Vec<Pod>> = None;
    let allocations = admit.allocations;
    let running = || holding_resources(workers, merger, allocations);
    let mut removed = false;
    for p in change.pods {
        let uid = sources::pod_uid(&p).to_string();
        if change.op == PodOp::Remove {
            rejected.remove(&uid);
            status.forget(&uid);
            allocations.forget(&uid);
            removed = true;
        } else if rejected.contains(&uid) {
            if p.metadata.deletion_timestamp.is_some() {
                // Nothing runs: the deletion completes at once.
                status.terminated(&p);
            }
            continue;
        } else if api_phase_terminal(&p) {
            // A pod the API server already shows Failed or Succeeded (it ended before the
            // agent restarted: evicted, stopped for a shutdown, done) is never started again,
            // as upstream's pod workers see to: its worker only makes sure nothing of it runs.
            if change.op == PodOp::Reconcile {
                status.reconcile(&p);
            }
            workers.update_pod(p, UpdateType::Kill, None);
            continue;
        } else if change.op == PodOp::Add && p.metadata.deletion_timestamp.is_none() {
            let active = active.get_or_insert_with(running);
            if let Err(why) = admit.admit(&p, active) {
                tracing::warn!(pod = %sources::pod_full_name(&p), "pod rejected: {why}");
                status.set_status(&p, rejected_status(&p, &why));
                rejected.insert(uid);
                continue;
            }
            allocations.admit(&p);
            active.push(p.clone());
        } else if p.metadata.deletion_timestamp.is_none() {
            // An admitted pod's spec may ask for other resources (a resize); one that takes
            // less may make room for those waiting.
            if allocations.resize(&p, admit.node, running) == allocation::Resize::Accepted {
                removed = true;
            }
        }
        let mut grace = None;
        let update = match change.op {
            PodOp::Remove => UpdateType::Kill,
            // A pod being deleted gracefully stops within its deletion grace period, whatever
            // the change that brought it (a kubelet restarted mid-deletion sees an Add).
            _ if p.metadata.deletion_timestamp.is_some() => {
                grace = p
                    .metadata
                    .deletion_grace_period_seconds
                    .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
                UpdateType::Kill
            }
            PodOp::Add => UpdateType::Create,
            PodOp::Reconcile => {
                status.reconcile(&p);
                UpdateType::Update
            }
            PodOp::Update | PodOp::Set => UpdateType::Update,
            PodOp::Delete => UpdateType::Kill,
        };
        tracing::info!(pod = %sources::pod_full_name(&p), op = ?change.op, "pod update");
        workers.update_pod(p, update, grace);
    }
    if removed {
        retry_pending_resizes(workers, merger, allocations, admit.node);
    }
}

/// The pods that hold resources, as allocated (what admission and resizes count).
fn holding_resources(
    workers: &PodWorkers,
    merger: &Merger,
    allocations: &allocation::Allocations,
) -> Vec<Pod> {
    // A pod the API server shows Failed or Succeeded holds nothing, even while its worker
    // makes sure nothing of it runs (upstream's filterOutInactivePods).
    merger
        .pods()
        .into_iter()
        .filter(|o| workers.could_have_running_containers(sources::pod_uid(o)))
        .filter(|o| !api_phase_terminal(o))
        .map(|o| allocations.view(&o))
        .collect()
}

/// Tries the resizes waiting for room again (upstream's `RetryPendingResizes`): after a pod
/// went or took less, and periodically. Those that fit now are allocated and their pods
/// synced.
pub(crate) fn retry_pending_resizes(
    workers: &PodWorkers,
    merger: &Merger,
    allocations: &allocation::Allocations,
    node: &k8s_openapi::api::core::v1::Node,
) {
    for uid in allocations.pending_uids() {
        let Some(p) = merger.pod(&uid) else { continue };
        let running = || holding_resources(workers, merger, allocations);
        if allocations.resize(p, node, running) == allocation::Resize::Accepted {
            tracing::info!(pod = %sources::pod_full_name(p), "a pending resize fits now");
            workers.update_pod(p.clone(), UpdateType::Update, None);
        }
    }
}

/// Whether the pod's status (as the API server has it) is in a terminal phase.
fn api_phase_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    crate::model::Phase::parse(phase).is_terminal()
}

/// The status of a pod admission rejected, as upstream writes it.
fn rejected_status(pod: &Pod, why: &admission::Rejection) -> k8s_openapi::api::core::v1::PodStatus {
    k8s_openapi::api::core::v1::PodStatus {
        phase: Some(crate::model::Phase::Failed.as_str().into()),
        reason: Some(why.reason.clone()),
        message: Some(format!("Pod was rejected: {}", why.message)),
        qos_class: Some(pod::qos_class(pod).to_string()),
        ..Default::default()
    }
}

/// Stops and removes sandboxes of pods that no source wants and no worker owns (pods deleted
/// while the kubelet was down).
async fn remove_orphans(rt: &dyn RuntimeService, desired: &[String], workers: &PodWorkers) {
    let Ok(list) = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
    else {
        return;
    };
    let desired: HashSet<&String> = desired.iter().collect();
    for sb in list.items {
        let Some(uid) = sb.labels.get(pod::LABEL_POD_UID) else {
            continue;
        };
        if desired.contains(uid) || workers.state(uid).is_some() {
            continue;
        }
        tracing::info!(sandbox = %sb.id, pod_uid = %uid, "removing the sandbox of a pod no source wants");
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: sb.id,
            })
            .await;
    }
}
