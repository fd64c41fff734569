//! The prober manager (upstream `prober_manager.go`): starts a worker per (pod, container, probe
//! kind) when a pod is synced, stops them when the pod goes, and gives the syncer a
//! [`ProbeView`] of a pod's results.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::results::{ResultsManager, Update};
use super::run::Prober;
use super::worker::{Shared, StatusSource, Worker};
use super::{ProbeKind, ProbeResult};
use crate::api::events::PodEvents;
use crate::model::RuntimePodStatus;
use crate::model::is_sidecar;

/// A pod's probe results as a sync uses them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeView {
    /// Containers (by runtime ID) that failed their liveness or startup probe: to be killed.
    pub failed: HashMap<String, ProbeKind>,
    /// Containers (by runtime ID) with a startup probe that has not passed yet.
    pub not_started: HashSet<String>,
    /// Readiness of the containers with a readiness probe, by name.
    pub readiness: HashMap<String, bool>,
    /// Whether the containers with a startup probe started, by name.
    pub started: HashMap<String, bool>,
}

/// The containers that may have probes: the sidecars and the app containers (regular init
/// containers have none).
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let app = spec.map_or(&[][..], |s| s.containers.as_slice());
    init.iter().filter(|c| is_sidecar(c)).chain(app)
}

struct PodProbes {
    keys: HashSet<(String, ProbeKind)>,
    stop: CancellationToken,
}

/// Runs the probes of the pods on the node.
pub struct ProbeManager {
    shared: Shared,
    pods: Mutex<HashMap<String, PodProbes>>,
    cancel: CancellationToken,
}

impl ProbeManager {
    /// A manager whose attempts `prober` runs ([`super::RuntimeProber`]: exec through the
    /// runtime, the others over the network); each result change goes to `updates`; every
    /// worker stops with `cancel`.
    pub fn new(
        prober: Arc<dyn Prober>,
        statuses: Arc<dyn StatusSource>,
        events: Arc<dyn PodEvents>,
        updates: mpsc::UnboundedSender<Update>,
        cancel: CancellationToken,
    ) -> Self {
        ProbeManager {
            shared: Shared {
                prober,
                statuses,
                results: Arc::new(ResultsManager::new(updates)),
                events,
            },
            pods: Mutex::new(HashMap::new()),
            cancel,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodProbes>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn results(&self) -> &ResultsManager {
        &self.shared.results
    }

    /// Starts the workers of the pod's probes that do not run yet: its app containers' and its
    /// sidecars' (regular init containers have none).
    pub fn add_pod(&self, pod: &Pod) {
        let uid = crate::model::pod_uid(pod).to_string();
        let mut pods = self.lock();
        // Called on every sync: the pod is copied only when a worker is started.
        let mut shared: Option<Arc<Pod>> = None;
        for c in probed_containers(pod) {
            for kind in ProbeKind::ALL {
                let Some(probe) = kind.of(c) else { continue };
                let entry = pods.entry(uid.clone()).or_insert_with(|| PodProbes {
                    keys: HashSet::new(),
                    stop: self.cancel.child_token(),
                });
                if !entry.keys.insert((c.name.clone(), kind)) {
                    continue;
                }
                let pod = shared.get_or_insert_with(|| Arc::new(pod.clone())).clone();
                let worker = Worker::new(self.shared.clone(), pod, c.clone(), kind, probe.clone());
                tokio::spawn(worker.run(entry.stop.clone()));
            }
        }
    }

    /// Stops the pod's workers (they forget their results).
    pub fn remove_pod(&self, uid: &str) {
        if let Some(p) = self.lock().remove(uid) {
            p.stop.cancel();
        }
    }

    /// How many workers run, for every pod.
    pub fn workers(&self) -> usize {
        self.lock().values().map(|p| p.keys.len()).sum()
    }

    /// The pod's results for its newest containers as `status` lists them.
    pub fn view(&self, pod: &Pod, status: &RuntimePodStatus) -> ProbeView {
        let mut v = ProbeView::default();
        let results = &self.shared.results;
        for c in probed_containers(pod) {
            let id = status.latest(&c.name).map(|l| l.id.as_str());
            let get = |kind| id.and_then(|id| results.get(id, kind));
            if c.startup_probe.is_some() {
                let r = get(ProbeKind::Startup);
                v.started
                    .insert(c.name.clone(), r == Some(ProbeResult::Success));
                if let Some(id) = id {
                    if r != Some(ProbeResult::Success) {
                        v.not_started.insert(id.to_string());
                    }
                    if r == Some(ProbeResult::Failure) {
                        v.failed.insert(id.to_string(), ProbeKind::Startup);
                    }
                }
            }
            if c.liveness_probe.is_some() && get(ProbeKind::Liveness) == Some(ProbeResult::Failure)
            {
                if let Some(id) = id {
                    v.failed.insert(id.to_string(), ProbeKind::Liveness);
                }
            }
            if c.readiness_probe.is_some() {
                v.readiness.insert(
                    c.name.clone(),
                    get(ProbeKind::Readiness) == Some(ProbeResult::Success),
                );
            }
        }
        v
    }
}
