//! The kubelet's wiring: pod sources feed a merger; the sync loop hands every change, runtime
//! event and housekeeping tick to the pod workers; the workers sync pods through [`Syncer`]
//! over the runtime traits. Standalone mode (no API server) today: static pods from
//! `staticPodPath` and `staticPodURL`.

mod syncer;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use runtime::{ImageService, RuntimeService, cri};
use tokio::sync::mpsc;

use crate::config::KubeletConfig;
use crate::pod::{self, Backoff, ContainerOptions, SandboxOptions};
use crate::pod_workers::{PodWorkers, Timing, UpdateType};
use crate::sources::{self, PodOp, PodUpdate, merge::Merger};

pub use syncer::Syncer;

/// How often housekeeping runs (orphaned pods, forgotten workers).
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(2);

/// The runtime the kubelet drives.
pub struct Runtime {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
}

/// Runs the kubelet until `shutdown` resolves. Pods keep running afterwards: a restarted kubelet
/// adopts them.
pub async fn run(
    cfg: KubeletConfig,
    rt: Runtime,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let version = rt.runtime.version(cri::VersionRequest::default()).await?;
    tracing::info!(
        node = %cfg.node_name,
        runtime = %version.runtime_name,
        "kubelet starting (standalone: static pods only)"
    );
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
        host_ips: cfg.node_ip.iter().map(|ip| ip.to_string()).collect(),
        ..Default::default()
    };
    let backoff = Backoff::new(
        cfg.testing.crash_loop_back_off_initial,
        cfg.testing.crash_loop_back_off_max,
    );
    let syncer = Arc::new(Syncer::new(
        rt.runtime.clone(),
        rt.images.clone(),
        opts,
        version.runtime_name.clone(),
        backoff,
    ));
    let workers = PodWorkers::new(
        syncer.clone(),
        Timing {
            resync: cfg.sync_frequency,
            ..Default::default()
        },
    );

    let (tx, mut rx) = mpsc::channel::<PodUpdate>(64);
    let mut expected_sources = Vec::new();
    if !cfg.static_pod_path.as_os_str().is_empty() {
        let src = sources::file::FileSource::new(
            cfg.static_pod_path.clone(),
            cfg.node_name.clone(),
            cfg.file_check_frequency,
        );
        tokio::spawn(src.run(tx.clone()));
        expected_sources.push(sources::FILE_SOURCE);
    }
    if !cfg.static_pod_url.is_empty() {
        let src = sources::http::HttpSource::new(
            cfg.static_pod_url.clone(),
            cfg.node_name.clone(),
            cfg.http_check_frequency,
        );
        tokio::spawn(src.run(tx.clone()));
        expected_sources.push(sources::HTTP_SOURCE);
    }
    drop(tx);

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
    let mut merger = Merger::new();
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(update) = rx.recv() => {
                for change in merger.merge(update) {
                    dispatch(&workers, change);
                }
            }
            Some(ev) = next_event(&mut events) => {
                if let Some(uid) = pod_of_container(rt.runtime.as_ref(), &ev.container_id).await {
                    if let Some(p) = merger.pods().into_iter().find(|p| p.metadata.uid.as_deref() == Some(uid.as_str())) {
                        workers.update_pod(p, UpdateType::Sync, None);
                    }
                }
            }
            _ = housekeeping.tick() => {
                let desired: Vec<String> = merger.pods().iter().filter_map(|p| p.metadata.uid.clone()).collect();
                workers.forget_terminated(&desired);
                if expected_sources.iter().all(|s| merger.seen_source(s)) {
                    remove_orphans(rt.runtime.as_ref(), &desired, &workers).await;
                }
            }
        }
    }
    tracing::info!("kubelet stopping; pods keep running");
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

/// Hands one merged change to the pod workers.
fn dispatch(workers: &PodWorkers, change: PodUpdate) {
    for p in change.pods {
        let update = match change.op {
            PodOp::Add => UpdateType::Create,
            PodOp::Update | PodOp::Reconcile | PodOp::Set => UpdateType::Update,
            PodOp::Delete | PodOp::Remove => UpdateType::Kill,
        };
        tracing::info!(pod = %sources::pod_full_name(&p), op = ?change.op, "pod update");
        workers.update_pod(p, update, None);
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
