//! The kubelet's wiring: pod sources feed a merger; the sync loop hands every change, runtime
//! event and housekeeping tick to the pod workers; the workers sync pods through [`Syncer`]
//! over the runtime traits and hand the statuses to the [`StatusManager`]. Static pods come
//! from `staticPodPath` and `staticPodURL`; with an API server (a kubeconfig), the pods bound
//! to the node come from it too, static pods get mirror pods, and statuses are written back.

pub mod gc;
pub mod mirror;
pub mod pleg;
mod syncer;
pub mod userns;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use runtime::{ImageService, RuntimeService, cri};
use tokio::sync::{mpsc, watch};

use crate::admission;
use crate::config::KubeletConfig;
use crate::node::agent::RUNTIME_CHECK_PERIOD;
use crate::node::{NodeAgent, NodeFacts, RuntimeState};
use crate::pod::{self, Backoff, ContainerOptions, SandboxOptions};
use crate::pod_workers::{PodWorkers, Timing, UpdateType};
use crate::sources::{self, PodOp, PodUpdate, merge::Merger};
use crate::status_manager::{self, StatusManager};

pub use syncer::Syncer;

/// How often housekeeping runs (orphaned pods, forgotten workers).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(2);

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
    let version = rt.runtime.version(cri::VersionRequest::default()).await?;
    tracing::info!(
        node = %cfg.node_name,
        runtime = %version.runtime_name,
        mode = if client.is_some() { "API server" } else { "standalone" },
        "kubelet starting"
    );
    let facts = NodeFacts::gather(&cfg, &version.runtime_name, &version.runtime_version)?;
    // Admission checks pods against the registered Node, or against this one before that.
    let local_node = crate::node::build_node(&facts, &cfg);
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
        ..Default::default()
    };
    let backoff = Backoff::new(
        cfg.testing.crash_loop_back_off_initial,
        cfg.testing.crash_loop_back_off_max,
    );
    let status = StatusManager::new(client.clone());
    tokio::spawn(status.clone().run());
    // The runtime's Status, asked now and then every few seconds: Ready reports it, and pods
    // with a pod network wait while the runtime's network is not ready.
    let runtime_state = Arc::new(RuntimeState::default());
    runtime_state.check(rt.runtime.as_ref()).await;
    let (checks_stop, checks_stopped) = tokio::sync::oneshot::channel::<()>();
    let checks = tokio::spawn(runtime_state.clone().run_checks(
        rt.runtime.clone(),
        RUNTIME_CHECK_PERIOD,
        async move {
            let _ = checks_stopped.await;
        },
    ));
    // Pods with `hostUsers: false` get blocks of the kubelet's range of host IDs.
    let userns = Arc::new(userns::UsernsManager::new(
        &opts.pods_dir,
        userns::kubelet_range(
            std::path::Path::new("/etc/subuid"),
            std::path::Path::new("/etc/subgid"),
        )?,
    )?);
    let syncer = Arc::new(Syncer::new(
        rt.clone(),
        opts,
        version.runtime_name.clone(),
        backoff,
        status.clone(),
        runtime_state.clone(),
        userns.clone(),
    ));
    let workers = PodWorkers::new(
        syncer.clone(),
        Timing {
            resync: cfg.sync_frequency,
            ..Default::default()
        },
    );

    let (tx, mut rx) = mpsc::channel::<PodUpdate>(64);
    let (problems_tx, mut problems) = mpsc::unbounded_channel::<String>();
    let recorder = client
        .as_ref()
        .map(|c| crate::api::events::Recorder::new(c.clone(), cfg.node_name.clone()));
    let mut expected_sources = Vec::new();
    if !cfg.static_pod_path.as_os_str().is_empty() {
        let src = sources::file::FileSource::new(
            cfg.static_pod_path.clone(),
            cfg.node_name.clone(),
            cfg.file_check_frequency,
        )
        .report_to(problems_tx.clone());
        tokio::spawn(src.run(tx.clone()));
        expected_sources.push(sources::FILE_SOURCE);
    }
    if !cfg.static_pod_url.is_empty() {
        let src = sources::http::HttpSource::new(
            cfg.static_pod_url.clone(),
            cfg.node_name.clone(),
            cfg.http_check_frequency,
        )
        .report_to(problems_tx.clone());
        tokio::spawn(src.run(tx.clone()));
        expected_sources.push(sources::HTTP_SOURCE);
    }
    let pleg_health = Arc::new(pleg::PlegHealth::new(pleg::RELIST_THRESHOLD));
    let node_agent = client.as_ref().map(|c| {
        let health = pleg_health.clone();
        NodeAgent::spawn(
            c.clone(),
            &cfg,
            facts.clone(),
            runtime_state.clone(),
            rt.images.clone(),
            Arc::new(move || health.problem().into_iter().collect()),
        )
    });
    let (mirrors_tx, mirrors) = watch::channel(sources::api::MirrorPods::new());
    status.set_mirrors(mirrors.clone());
    let mirror_manager = client.as_ref().map(|c| {
        let src = sources::api::ApiSource::new(c.clone(), cfg.node_name.clone(), mirrors_tx);
        tokio::spawn(src.run(tx.clone()));
        expected_sources.push(sources::API_SOURCE);
        mirror::MirrorManager::new(c.clone(), cfg.node_name.clone())
    });
    drop(tx);
    drop(problems_tx);

    let mut events = match rt
        .runtime
        .get_container_events(cri::GetEventsRequest {})
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::info!("no runtime events ({e}); relying on resyncs");
            None
        }
    };
    let mut relister = pleg::Relister::new();
    let mut relist = tokio::time::interval(pleg::RELIST_PERIOD);
    relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut merger = Merger::new();
    let mut rejected = HashSet::new();
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(update) = rx.recv() => {
                let node = node_agent.as_ref().and_then(NodeAgent::node).unwrap_or_else(|| local_node.clone());
                for change in merger.merge(update) {
                    dispatch(&workers, &status, &mut rejected, &merger, &node, change);
                }
            }
            Some(problem) = problems.recv() => {
                if let Some(r) = recorder.clone() {
                    // Off the loop: the API server may be slow or away.
                    tokio::spawn(async move {
                        r.warning(r.node_ref(), crate::api::events::FAILED_VALIDATION, &problem).await;
                    });
                }
            }
            Some(ev) = next_event(&mut events) => {
                pleg_health.mark_active();
                if let Some(uid) = pod_of_container(rt.runtime.as_ref(), &ev.container_id).await {
                    sync_pod_by_uid(&workers, &merger, &uid);
                }
            }
            _ = relist.tick(), if events.is_none() => {
                let began = std::time::Instant::now();
                match relister.relist(rt.runtime.as_ref()).await {
                    Ok(changed) => {
                        pleg_health.record_relist(began.elapsed());
                        pleg_health.mark_active();
                        for uid in changed {
                            sync_pod_by_uid(&workers, &merger, &uid);
                        }
                    }
                    Err(e) => tracing::warn!("PLEG relist: {e}"),
                }
            }
            _ = housekeeping.tick() => {
                if events.is_some() {
                    // A live event stream is a working PLEG.
                    pleg_health.mark_active();
                }
                let desired: Vec<String> = merger.pods().iter().filter_map(|p| p.metadata.uid.clone()).collect();
                workers.forget_terminated(&desired);
                if expected_sources.iter().all(|s| merger.seen_source(s)) {
                    remove_orphans(rt.runtime.as_ref(), &desired, &workers).await;
                    userns.release_others(|uid| desired.iter().any(|d| d == uid) || workers.state(uid).is_some());
                }
                if let Some(mm) = &mirror_manager {
                    if merger.seen_source(sources::API_SOURCE) {
                        let static_pods: Vec<Pod> = merger.pods().into_iter().filter(|p| !status_manager::is_api_pod(p)).collect();
                        let current = mirrors.borrow().clone();
                        let node_uid = node_agent.as_ref().and_then(NodeAgent::node).and_then(|n| n.metadata.uid);
                        mm.sync(&static_pods, &current, node_uid.as_deref()).await;
                        // A mirror created afresh, or changed by someone else, gets the status.
                        for p in &static_pods {
                            if let Some(m) = current.get(&sources::pod_full_name(p)) {
                                status.reconcile_status(sources::pod_uid(p), m.status.as_ref());
                            }
                        }
                    }
                }
            }
        }
    }
    tracing::info!("kubelet stopping; pods keep running");
    if let Some(agent) = node_agent {
        agent.stop().await;
    }
    let _ = checks_stop.send(());
    let _ = checks.await;
    Ok(())
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

/// Syncs the pod with this UID now, if a source still wants it.
fn sync_pod_by_uid(workers: &PodWorkers, merger: &Merger, uid: &str) {
    if let Some(p) = merger.pod(uid) {
        workers.update_pod(p.clone(), UpdateType::Sync, None);
    }
}

/// The pod UID label of a container, if the runtime still knows it.
async fn pod_of_container(rt: &dyn RuntimeService, id: &str) -> Option<String> {
    let st = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await
        .ok()?
        .status?;
    st.labels.get(pod::LABEL_POD_UID).cloned()
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
