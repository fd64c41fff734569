//! The kubelet's wiring ([`Kubelet`]): pod sources feed a merger; the sync loop
//! ([`sync_loop`]) hands every change, PLEG event and housekeeping tick to the pod workers; the
//! workers sync pods through [`Syncer`] over the runtime traits and hand the statuses to the
//! [`StatusManager`]. Static pods come from `staticPodPath` and `staticPodURL`; with an API
//! server (a kubeconfig), the pods bound to the node come from it too, static pods get mirror
//! pods, and statuses are written back. Every background task (sources, status manager, PLEG,
//! housekeeping, node agent, runtime checks, event sink) lives in one task set under one
//! cancellation token; shutdown cancels and joins them all.

pub mod gc;
pub mod housekeeping;
pub mod logrotate;
pub mod mirror;
pub mod pleg;
pub mod pod_cache;
pub mod sync_loop;
mod syncer;
pub mod userns;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use runtime::{ImageService, RuntimeService, cri};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admission;
use crate::api::events::{EventRecorder, EventType, Reason};
use crate::config::KubeletConfig;
use crate::node::agent::RUNTIME_CHECK_PERIOD;
use crate::node::{NodeAgent, NodeFacts, RuntimeState};
use crate::pod::sync::ImagePulls;
use crate::pod::{self, Backoff, ContainerOptions, SandboxOptions};
use crate::pod_workers::{PodWorkers, Timing, UpdateType};
use crate::sources::{self, PodOp, PodUpdate, merge::Merger};
use crate::status_manager::StatusManager;

pub use syncer::{Syncer, SyncerParts};

/// How often housekeeping runs (orphaned pods, forgotten workers, garbage collection).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(2);

/// How long shutdown waits for the background tasks before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The runtime the kubelet drives.
#[derive(Clone)]
pub struct Runtime {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
}

/// Runs the kubelet until `shutdown` resolves. Pods keep running afterwards: a restarted kubelet
/// adopts them.
pub async fn run(
    cfg: KubeletConfig,
    rt: Runtime,
    client: Option<kube::Client>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let kubelet = Kubelet::start(cfg, rt, client).await?;
    shutdown.await;
    kubelet.stop().await;
    Ok(())
}

/// A running kubelet: its parts wired together, its tasks under one token.
pub struct Kubelet {
    cancel: CancellationToken,
    tasks: JoinSet<()>,
    node_agent: Option<Arc<NodeAgent>>,
    status: Arc<StatusManager>,
}

impl Kubelet {
    /// Wires the parts and starts every task.
    pub async fn start(
        cfg: KubeletConfig,
        rt: Runtime,
        client: Option<kube::Client>,
    ) -> anyhow::Result<Kubelet> {
        // Every runtime call counted and timed (kubelet_runtime_operations_*).
        let instrumented = Arc::new(crate::metrics::Instrumented {
            inner: rt.runtime.clone(),
            images: rt.images.clone(),
        });
        let rt = Runtime {
            runtime: instrumented.clone(),
            images: instrumented,
        };
        let version = rt.runtime.version(cri::VersionRequest::default()).await?;
        tracing::info!(
            node = %cfg.node_name,
            runtime = %version.runtime_name,
            mode = if client.is_some() { "API server" } else { "standalone" },
            "kubelet starting"
        );
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut facts = NodeFacts::gather(&cfg, &version.runtime_name, &version.runtime_version)?;
        let opts = ContainerOptions {
            sandbox: SandboxOptions {
                pod_logs_dir: cfg.pod_logs_dir.clone(),
                cluster_dns: cfg.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
                cluster_domain: cfg.cluster_domain.clone(),
                seccomp_profile_root: cfg.root_dir.join("seccomp"),
                ..Default::default()
            },
            pods_dir: cfg.root_dir.join("pods"),
            node_name: cfg.node_name.clone(),
            host_ips: vec![facts.node_ip.to_string()],
            node_memory_bytes: i64::try_from(facts.memory_bytes).unwrap_or(i64::MAX),
            stop_signal_annotation: version.runtime_name == runtime::builtin::RUNTIME_NAME,
            ..Default::default()
        };
        let status = StatusManager::new(client.clone());
        tasks.spawn(status.clone().run_until(cancel.clone()));
        // The runtime's Status, asked now and then every few seconds: Ready reports it, and
        // pods with a pod network wait while the runtime's network is not ready.
        let runtime_state = Arc::new(RuntimeState::default());
        runtime_state.check(rt.runtime.as_ref()).await;
        {
            let c = cancel.clone();
            tasks.spawn(runtime_state.clone().run_checks(
                rt.runtime.clone(),
                RUNTIME_CHECK_PERIOD,
                async move { c.cancelled().await },
            ));
        }
        // Pods with `hostUsers: false` get blocks of the kubelet's range of host IDs.
        let userns = Arc::new(userns::UsernsManager::new(
            &opts.pods_dir,
            userns::kubelet_range(
                std::path::Path::new("/etc/subuid"),
                std::path::Path::new("/etc/subgid"),
            )?,
        )?);
        let (recorder, sink) = EventRecorder::new(client.clone(), cfg.node_name.clone());
        tasks.spawn(sink);
        recorder.event(
            &recorder.node_ref(),
            EventType::Normal,
            Reason::StartingKubelet,
            "Starting kubelet.",
        );
        let pod_events = Arc::new(recorder.clone());

        // The PLEG and the pod cache.
        let cache = Arc::new(pod_cache::PodCache::new());
        let pleg_health = Arc::new(pleg::PlegHealth::new(pleg::RELIST_THRESHOLD));

        // The kubelet server (10250) and healthz (10248); the Node advertises the port bound.
        let (pods_tx, pods_rx) = watch::channel(Arc::new(Vec::new()));
        let bound = {
            let health = pleg_health.clone();
            crate::server::start(
                crate::server::ServerDeps {
                    cfg: cfg.server.clone(),
                    node_name: cfg.node_name.clone(),
                    node_ips: vec![facts.node_ip],
                    root_dir: cfg.root_dir.clone(),
                    pod_logs_dir: cfg.pod_logs_dir.clone(),
                    client: client.clone(),
                    rt: rt.runtime.clone(),
                    images: rt.images.clone(),
                    pods: pods_rx,
                    status: status.clone(),
                    configz: cfg.to_v1beta1(),
                    system_log_dir: std::path::PathBuf::from("/var/log"),
                    health: Arc::new(move || match health.problem() {
                        Some(p) => Err(crate::server::Unhealthy(p)),
                        None => Ok(()),
                    }),
                },
                &mut tasks,
                cancel.clone(),
            )
            .await?
        };
        facts.kubelet_port = bound.port;
        crate::metrics::get()
            .node_name
            .get_or_create(&crate::metrics::NodeName {
                node: cfg.node_name.clone(),
            })
            .set(1);
        // Admission checks pods against the registered Node, or against this one before that.
        let local_node = crate::node::build_node(&facts, &cfg);
        let (changed_tx, changed_rx) = mpsc::unbounded_channel();
        let (refresh_tx, refresh_rx) = mpsc::unbounded_channel();
        let pleg = pleg::Pleg {
            rt: rt.runtime.clone(),
            cache: cache.clone(),
            health: pleg_health.clone(),
            changed: changed_tx,
            refresh: refresh_rx,
            config: pleg::PlegConfig::default(),
        };
        tasks.spawn(pleg.run(cancel.clone()));

        // The probes: one worker per container and probe, outside the loop; a changed result
        // syncs the pod.
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        let probes = Arc::new(crate::prober::ProbeManager::new(
            rt.runtime.clone(),
            status.clone(),
            pod_events.clone(),
            probe_tx,
            cancel.child_token(),
        ));
        let syncer = Arc::new(
            Syncer::new(
                rt.clone(),
                SyncerParts {
                    opts: opts.clone(),
                    runtime_name: version.runtime_name.clone(),
                    backoff: Backoff::new(
                        cfg.testing.crash_loop_back_off_initial,
                        cfg.testing.crash_loop_back_off_max,
                    ),
                    pulls: ImagePulls::new(cfg.serialize_image_pulls, cfg.max_parallel_image_pulls),
                    status: status.clone(),
                    runtime_state: runtime_state.clone(),
                    userns: userns.clone(),
                    cache: cache.clone(),
                    refresh: refresh_tx,
                    events: pod_events,
                    probes,
                },
            )
            .with_volumes(
                crate::volumes::VolumeManager::new(
                    client.clone(),
                    opts.pods_dir.clone(),
                    crate::volumes::projection::Allocatable::from_node(&local_node),
                )
                .with_services(crate::api::services::Services::start(
                    client.clone(),
                    cancel.child_token(),
                )),
            ),
        );
        let workers = PodWorkers::new(
            syncer.clone(),
            Timing {
                resync: cfg.sync_frequency,
                ..Default::default()
            },
        );

        // Sources.
        let (tx, rx) = mpsc::channel::<PodUpdate>(64);
        let (problems_tx, problems) = mpsc::unbounded_channel::<String>();
        let mut expected_sources = Vec::new();
        if !cfg.static_pod_path.as_os_str().is_empty() {
            let src = sources::file::FileSource::new(
                cfg.static_pod_path.clone(),
                cfg.node_name.clone(),
                cfg.file_check_frequency,
            )
            .report_to(problems_tx.clone());
            tasks.spawn(src.run(tx.clone()));
            expected_sources.push(sources::FILE_SOURCE);
        }
        if !cfg.static_pod_url.is_empty() {
            let src = sources::http::HttpSource::new(
                cfg.static_pod_url.clone(),
                cfg.node_name.clone(),
                cfg.http_check_frequency,
            )
            .report_to(problems_tx.clone());
            tasks.spawn(src.run(tx.clone()));
            expected_sources.push(sources::HTTP_SOURCE);
        }
        let node_agent = client.as_ref().map(|c| {
            let health = pleg_health.clone();
            Arc::new(NodeAgent::spawn(
                c.clone(),
                &cfg,
                facts.clone(),
                runtime_state.clone(),
                rt.images.clone(),
                Arc::new(move || health.problem().into_iter().collect()),
                Some(recorder.clone()),
            ))
        });
        let (mirrors_tx, mirrors) = watch::channel(sources::api::MirrorPods::new());
        status.set_mirrors(mirrors.clone());
        let mirror_manager = client.as_ref().map(|c| {
            let src = sources::api::ApiSource::new(c.clone(), cfg.node_name.clone(), mirrors_tx);
            tasks.spawn(src.run(tx.clone()));
            expected_sources.push(sources::API_SOURCE);
            mirror::MirrorManager::new(c.clone(), cfg.node_name.clone())
        });
        drop(tx);
        drop(problems_tx);

        // Housekeeping, off the loop.
        let (desired_tx, desired_rx) = watch::channel(housekeeping::Desired::default());
        let hk = housekeeping::Housekeeping {
            rt: rt.runtime.clone(),
            workers: workers.clone(),
            userns,
            syncer: syncer.clone(),
            status: status.clone(),
            gc: gc::GarbageCollector::new(
                rt.runtime.clone(),
                opts.pods_dir.clone(),
                cfg.pod_logs_dir.clone(),
            ),
            mirror_manager,
            mirrors,
            node_agent: node_agent.clone(),
            cache: cache.clone(),
        };
        tasks.spawn(hk.run(desired_rx, cancel.clone()));
        tasks.spawn(logrotate::run(
            rt.runtime.clone(),
            cfg.container_logs.clone(),
            cancel.clone(),
        ));

        let node = {
            let agent = node_agent.clone();
            Box::new(move || {
                agent
                    .as_ref()
                    .and_then(|a| a.node())
                    .unwrap_or_else(|| local_node.clone())
            })
        };
        let status_for_kubelet = status.clone();
        let sync_loop = sync_loop::SyncLoop {
            workers,
            status,
            merger: Merger::new(),
            rejected: HashSet::new(),
            node,
            expected_sources,
            recorder,
            desired: desired_tx,
            pods: pods_tx,
            changes: 0,
        };
        tasks.spawn(sync_loop.run(
            sync_loop::Inputs {
                updates: rx,
                changed: changed_rx,
                probes: probe_rx,
                problems,
            },
            cancel.clone(),
        ));
        Ok(Kubelet {
            cancel,
            tasks,
            node_agent,
            status: status_for_kubelet,
        })
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

/// Hands one merged change to the pod workers (and the status manager). New pods go through
/// admission first: a rejected pod never reaches a worker; its status says why (Failed).
fn dispatch(
    workers: &PodWorkers,
    status: &StatusManager,
    rejected: &mut HashSet<String>,
    merger: &Merger,
    node: &k8s_openapi::api::core::v1::Node,
    change: PodUpdate,
) {
    // The pods admission counts as running: gathered at the first new pod of the batch, then
    // grown by each pod admitted.
    let mut active: Option<Vec<Pod>> = None;
    for p in change.pods {
        let uid = sources::pod_uid(&p).to_string();
        if change.op == PodOp::Remove {
            rejected.remove(&uid);
            status.forget(&uid);
        } else if rejected.contains(&uid) {
            if p.metadata.deletion_timestamp.is_some() {
                // Nothing runs: the deletion completes at once.
                status.terminated(&p);
            }
            continue;
        } else if change.op == PodOp::Add && p.metadata.deletion_timestamp.is_none() {
            let active = active.get_or_insert_with(|| {
                merger
                    .pods()
                    .into_iter()
                    .filter(|o| workers.could_have_running_containers(sources::pod_uid(o)))
                    .collect()
            });
            if let Err(why) = admission::admit(&p, active, node) {
                tracing::warn!(pod = %sources::pod_full_name(&p), "pod rejected: {why}");
                status.set_status(&p, rejected_status(&p, &why));
                rejected.insert(uid);
                continue;
            }
            active.push(p.clone());
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
}

/// The status of a pod admission rejected, as upstream writes it.
fn rejected_status(pod: &Pod, why: &admission::Rejection) -> k8s_openapi::api::core::v1::PodStatus {
    k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Failed".into()),
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
