//! The node side of the kubelet in one piece, for the kubelet's wiring: a [`NodeStatusManager`]
//! whose health is the runtime's `Status` (as the kubelet's [`RuntimeState`] last heard it,
//! checked every [`RUNTIME_CHECK_PERIOD`] by [`RuntimeState::run_checks`], with its handlers and
//! features) plus the kubelet's own checks (e.g. PLEG), reporting the runtime's images, and the
//! [`LeaseController`]. [`NodeAgent::stop`] ends both tasks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use runtime::ImageService;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{LeaseController, NodeFacts, NodeStatusManager, RuntimeState};
use crate::config::KubeletConfig;

/// How often the runtime's `Status` is asked (upstream's `updateRuntimeUp` period).
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// What the kubelet itself adds to the runtime's health: Ready problems (e.g. the PLEG's) and
/// the eviction manager's pressure conditions.
pub type HealthFn = Arc<dyn Fn(&mut super::conditions::Health) + Send + Sync>;

/// What the Node's status reports besides the runtime's health and images.
#[derive(Default)]
pub struct Reporting {
    /// Records the node's condition changes as events.
    pub events: Option<crate::api::events::EventRecorder>,
    /// The device plugins' resources, in capacity and allocatable.
    pub devices: Option<crate::devices::DeviceManager>,
}

/// The running node status manager and Lease controller.
pub struct NodeAgent {
    manager: Arc<NodeStatusManager>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl NodeAgent {
    /// Starts registering and reporting the node described by `facts` (and, when
    /// `cfg.node_lease_duration_seconds` > 0, renewing its Lease).
    pub fn spawn(
        client: kube::Client,
        cfg: &KubeletConfig,
        facts: NodeFacts,
        state: Arc<RuntimeState>,
        images: Arc<dyn ImageService>,
        extra: HealthFn,
        reporting: Reporting,
    ) -> NodeAgent {
        let health_state = state.clone();
        let health = Arc::new(move || {
            let mut health = health_state.health(Instant::now());
            extra(&mut health);
            health
        });
        let manager = Arc::new(
            NodeStatusManager::new(client.clone(), cfg, facts, health)
                .with_images(images)
                .with_events(reporting.events)
                .with_devices(reporting.devices),
        );
        let (stop, stopped) = watch::channel(false);
        let until_stopped = move || {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut tasks = Vec::new();
        let m = manager.clone();
        let shutdown = until_stopped();
        tasks.push(tokio::spawn(async move { m.run(shutdown).await }));
        if cfg.node_lease_duration_seconds > 0 {
            let lease = LeaseController::new(client, cfg, manager.subscribe());
            let shutdown = until_stopped();
            tasks.push(tokio::spawn(async move { lease.run(shutdown).await }));
        }
        NodeAgent {
            manager,
            stop,
            tasks,
        }
    }

    /// The status manager (for [`NodeStatusManager::node`] and `subscribe`).
    pub fn manager(&self) -> &Arc<NodeStatusManager> {
        &self.manager
    }

    /// The latest Node, for admission.
    pub fn node(&self) -> Option<Node> {
        self.manager.node()
    }

    /// Stops the tasks and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            if let Err(e) = t.await {
                tracing::warn!("node agent task: {e}");
            }
        }
    }
}
