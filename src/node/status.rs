//! The node status manager: registers the Node and keeps its status current, like upstream's
//! `registerWithAPIServer` and `updateNodeStatus`.
//!
//! Every `nodeStatusUpdateFrequency` it computes the status (facts, conditions from the
//! health check, images) and patches `nodes/<name>/status` with a strategic merge patch only
//! when something other than heartbeat times changed, or when `nodeStatusReportFrequency`
//! has passed since the last write (the Lease is the frequent heartbeat). A failed write is
//! retried up to five times per tick. Each try reads the Node first (nodelet has no Node
//! informer; one GET per tick), so a Node deleted behind the kubelet's back is registered
//! again. The latest Node it saw is published on a watch channel for admission and the Lease.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use runtime::{ImageService, cri};
use tokio::sync::watch;

use super::conditions::{Health, node_conditions};
use super::{
    ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH, NodeFacts, build_node, default_labels,
    heartbeat_timeout, reported_addresses, within,
};
use crate::api::FIELD_MANAGER;
use crate::api::events::Reason;
use crate::config::KubeletConfig;

/// The kubelet's health as the status manager asks for it on every tick: the runtime
/// status, PLEG health, pressure signals. Must be quick (it is called on the status loop).
pub type HealthCheck = Arc<dyn Fn() -> Health + Send + Sync>;

/// At most this many images in `status.images` (upstream's `nodeStatusMaxImages`).
pub const MAX_IMAGES: usize = 50;
/// At most this many names per image (upstream's `maxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;
/// Status writes tried per tick (upstream's `nodeStatusUpdateRetry`).
pub const UPDATE_RETRIES: usize = 5;

const REGISTER_BACKOFF_START: Duration = Duration::from_millis(100);
const REGISTER_BACKOFF_MAX: Duration = Duration::from_secs(7);
const LIST_IMAGES_TIMEOUT: Duration = Duration::from_secs(10);

/// The images for `status.images`: the largest first, at most [`MAX_IMAGES`], each named by
/// its digests then its tags (at most [`MAX_NAMES_PER_IMAGE`]).
pub fn node_images(images: &[cri::Image]) -> Vec<ContainerImage> {
    let mut sorted: Vec<&cri::Image> = images.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    sorted
        .into_iter()
        .take(MAX_IMAGES)
        .map(|i| ContainerImage {
            names: Some(
                i.repo_digests
                    .iter()
                    .chain(&i.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect(),
            ),
            size_bytes: Some(i64::try_from(i.size).unwrap_or(i64::MAX)),
        })
        .collect()
}

/// The status to report: the facts' status (`base`, from [`build_node`]) with the conditions
/// following `previous`'s, the runtime's handlers and features from `health`, and `images`
/// (`None`: the image list could not be read, keep the previous one).
pub fn desired_status(
    base: &NodeStatus,
    previous: Option<&NodeStatus>,
    health: &Health,
    images: Option<Vec<ContainerImage>>,
    now: Timestamp,
) -> NodeStatus {
    let mut status = base.clone();
    let prev_conditions = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or_default();
    status.conditions = Some(node_conditions(prev_conditions, health, now));
    status.images = images.or_else(|| previous.and_then(|p| p.images.clone()));
    status.runtime_handlers = health
        .runtime_handlers
        .clone()
        .or_else(|| previous.and_then(|p| p.runtime_handlers.clone()));
    status.features = health
        .features
        .clone()
        .or_else(|| previous.and_then(|p| p.features.clone()));
    status
}

/// Adds the device plugins' resources to `status`: capacity every advertised device,
/// allocatable the healthy ones (upstream's `MachineInfo` setter with the device manager's
/// `GetCapacity`).
pub fn add_devices(
    status: &mut NodeStatus,
    devices: &std::collections::BTreeMap<String, (i64, i64)>,
) {
    let count = |n: i64| k8s_openapi::apimachinery::pkg::api::resource::Quantity(n.to_string());
    for (resource, (capacity, allocatable)) in devices {
        status
            .capacity
            .get_or_insert_with(Default::default)
            .insert(resource.clone(), count(*capacity));
        status
            .allocatable
            .get_or_insert_with(Default::default)
            .insert(resource.clone(), count(*allocatable));
    }
}

/// Whether `new` differs from `old` in anything but the conditions' heartbeat times (upstream's
/// `nodeStatusHasChanged`). Fields the kubelet does not set (volumes, config, ...) count too,
/// but `desired_status` never sets them, so they only matter if another writer set them.
/// The node events (upstream's reasons) for the conditions whose status `desired` changes
/// from `previous` (or sets for the first time), in a fixed order.
pub fn condition_events(
    previous: &[k8s_openapi::api::core::v1::NodeCondition],
    desired: &[k8s_openapi::api::core::v1::NodeCondition],
) -> Vec<Reason> {
    use crate::api::events::Reason as R;
    let table: [(&str, Reason, Reason); 4] = [
        (
            "MemoryPressure",
            R::NodeHasInsufficientMemory,
            R::NodeHasSufficientMemory,
        ),
        (
            "DiskPressure",
            R::NodeHasDiskPressure,
            R::NodeHasNoDiskPressure,
        ),
        (
            "PIDPressure",
            R::NodeHasInsufficientPid,
            R::NodeHasSufficientPid,
        ),
        ("Ready", R::NodeReady, R::NodeNotReady),
    ];
    let status = |list: &[k8s_openapi::api::core::v1::NodeCondition], t: &str| {
        list.iter().find(|c| c.type_ == t).map(|c| c.status.clone())
    };
    table
        .iter()
        .filter_map(|(t, if_true, if_false)| {
            let now = status(desired, t)?;
            if status(previous, t).as_ref() == Some(&now) {
                return None;
            }
            match now.as_str() {
                "True" => Some(*if_true),
                "False" => Some(*if_false),
                _ => None,
            }
        })
        .collect()
}

pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    comparable(old) != comparable(new)
}

fn comparable(s: &NodeStatus) -> NodeStatus {
    let mut s = s.clone();
    if let Some(conds) = s.conditions.as_mut() {
        for c in conds.iter_mut() {
            c.last_heartbeat_time = None;
        }
        conds.sort_by(|a, b| a.type_.cmp(&b.type_));
    }
    // Fields the kubelet does not write: another writer's values are not our change.
    s.volumes_attached = None;
    s.volumes_in_use = None;
    s.config = None;
    s.phase = None;
    s.declared_features = None;
    s
}

/// Whether a status write is due: the status changed, nothing was written yet, or
/// `report_frequency` has passed since the last write.
pub fn should_write(
    changed: bool,
    last_write: Option<Instant>,
    now: Instant,
    report_frequency: Duration,
) -> bool {
    changed || last_write.is_none_or(|t| now.saturating_duration_since(t) >= report_frequency)
}

/// Registers the Node and keeps its status current (see the module documentation).
pub struct NodeStatusManager {
    api: Api<Node>,
    cfg: KubeletConfig,
    facts: NodeFacts,
    health: HealthCheck,
    images: Option<Arc<dyn ImageService>>,
    events: Option<crate::api::events::EventRecorder>,
    devices: Option<crate::devices::DeviceManager>,
    node: watch::Sender<Option<Node>>,
    state: Mutex<State>,
    timeout: Duration,
}

#[derive(Default)]
struct State {
    last_write: Option<Instant>,
    registered: bool,
}

impl NodeStatusManager {
    /// A manager for the node described by `facts`, asking `health` on each tick.
    pub fn new(
        client: kube::Client,
        cfg: &KubeletConfig,
        facts: NodeFacts,
        health: HealthCheck,
    ) -> Self {
        NodeStatusManager {
            api: Api::all(client),
            cfg: cfg.clone(),
            facts,
            health,
            images: None,
            events: None,
            devices: None,
            node: watch::Sender::new(None),
            state: Mutex::new(State::default()),
            timeout: heartbeat_timeout(cfg),
        }
    }

    /// Records the node's condition changes (NodeReady, NodeNotReady, NodeHasDiskPressure, ...)
    /// as events about the Node.
    pub fn with_events(mut self, events: Option<crate::api::events::EventRecorder>) -> Self {
        self.events = events;
        self
    }

    /// Also report the device plugins' resources in capacity and allocatable (each change
    /// written at once, not at the next tick).
    pub fn with_devices(mut self, devices: Option<crate::devices::DeviceManager>) -> Self {
        self.devices = devices;
        self
    }

    /// Also report the images `images` lists in `status.images`.
    pub fn with_images(mut self, images: Arc<dyn ImageService>) -> Self {
        self.images = Some(images);
        self
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.facts.hostname
    }

    /// The latest Node read from or written to the API server (`None` before registration).
    pub fn node(&self) -> Option<Node> {
        self.node.borrow().clone()
    }

    /// A receiver of every Node [`Self::node`] returns.
    pub fn subscribe(&self) -> watch::Receiver<Option<Node>> {
        self.node.subscribe()
    }

    /// Registers the Node, retrying with back-off (100ms doubling to 7s), then writes its
    /// status once; with `registerNode: false` only the status write (of a Node someone else
    /// creates). Returns `false` only when `shutdown` came first.
    pub async fn register(&self, shutdown: impl Future<Output = ()>) -> bool {
        tokio::pin!(shutdown);
        self.register_until(&mut shutdown).await
    }

    async fn register_until(&self, shutdown: &mut Pin<&mut impl Future<Output = ()>>) -> bool {
        if !self.cfg.register_node {
            // `registerNode: false`: someone else creates the Node; only its status is ours.
            if let Ok(mut st) = self.state.lock() {
                st.registered = true;
            }
            if let Err(e) = self.update().await {
                tracing::warn!(node = %self.name(), "node status update: {e}");
            }
            return true;
        }
        let mut delay = REGISTER_BACKOFF_START;
        loop {
            match self.try_register().await {
                Ok(()) => break,
                Err(e) => tracing::warn!(node = %self.name(), "registering the node: {e}"),
            }
            tokio::select! {
                _ = shutdown.as_mut() => return false,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(REGISTER_BACKOFF_MAX);
        }
        if let Err(e) = self.update().await {
            tracing::warn!(node = %self.name(), "first node status update: {e}");
        }
        true
    }

    /// One registration attempt: create the Node, or adopt an existing one of that name
    /// (making its kubelet-owned labels and annotation current).
    async fn try_register(&self) -> Result<(), kube::Error> {
        let mut node = build_node(&self.facts, &self.cfg);
        if let Some(status) = node.status.as_mut() {
            let health = (self.health)();
            *status = desired_status(status, None, &health, None, Timestamp::now());
        }
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        let created = match within(self.timeout, self.api.create(&pp, &node)).await {
            Ok(created) => {
                tracing::info!(node = %self.name(), "registered the node");
                let conditions = created
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or(&[]);
                self.record_condition_events(&[], conditions);
                created
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.code == 409 => {
                let existing = within(self.timeout, self.api.get(self.name())).await?;
                tracing::info!(node = %self.name(), "the node exists; adopting it");
                self.reconcile_metadata(existing).await?
            }
            Err(e) => return Err(e),
        };
        self.node.send_replace(Some(created));
        if let Ok(mut st) = self.state.lock() {
            st.registered = true;
        }
        Ok(())
    }

    /// Patches the labels and annotation the kubelet owns when an existing Node's differ
    /// (upstream's `updateDefaultLabels` and the attach/detach annotation reconcile).
    async fn reconcile_metadata(&self, existing: Node) -> Result<Node, kube::Error> {
        let want_labels = default_labels(&self.facts);
        let have = existing.metadata.labels.clone().unwrap_or_default();
        let labels: serde_json::Map<String, serde_json::Value> = want_labels
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        let annotated = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH))
            .is_some_and(|v| v == "true");
        if labels.is_empty() && annotated {
            return Ok(existing);
        }
        let mut meta = serde_json::Map::new();
        if !labels.is_empty() {
            meta.insert("labels".into(), labels.into());
        }
        if !annotated {
            meta.insert(
                "annotations".into(),
                serde_json::json!({ ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH: "true" }),
            );
        }
        let patch = serde_json::json!({ "metadata": meta });
        let pp = self.patch_params();
        within(
            self.timeout,
            self.api.patch(self.name(), &pp, &Patch::Merge(&patch)),
        )
        .await
    }

    fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        }
    }

    /// Registers the Node, then updates its status every `nodeStatusUpdateFrequency` until
    /// `shutdown`. A Node deleted behind the kubelet's back is registered again (unless
    /// `registerNode` is false: then the status waits for someone to create it).
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        if !self.register_until(&mut shutdown).await {
            return;
        }
        let mut tick = tokio::time::interval(self.cfg.node_status_update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut devices = self.devices.as_ref().map(|d| d.subscribe());
        let device_change = async |d: &mut Option<watch::Receiver<u64>>| {
            let Some(rx) = d else {
                return std::future::pending().await;
            };
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.as_mut() => return,
                _ = tick.tick() => {}
                () = device_change(&mut devices) => {}
            }
            let registered = self.state.lock().map(|s| s.registered).unwrap_or(true);
            if !registered {
                if !self.register_until(&mut shutdown).await {
                    return;
                }
                continue;
            }
            if let Err(e) = self.update().await {
                tracing::warn!(node = %self.name(), "updating the node status: {e}");
            }
        }
    }

    /// One status tick: computes the status and writes it if due, trying up to
    /// [`UPDATE_RETRIES`] times. Returns whether it wrote.
    pub async fn update(&self) -> Result<bool, kube::Error> {
        let images = self.list_images().await;
        let mut last_err = None;
        for _ in 0..UPDATE_RETRIES {
            match self.try_update(images.clone()).await {
                Ok(wrote) => return Ok(wrote),
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    if self.cfg.register_node {
                        tracing::warn!(node = %self.name(), "the node is gone; registering it again");
                        if let Ok(mut st) = self.state.lock() {
                            st.registered = false;
                        }
                    }
                    return Err(kube::Error::Api(s));
                }
                Err(e) => last_err = Some(e),
            }
        }
        match last_err {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    async fn try_update(&self, images: Option<Vec<ContainerImage>>) -> Result<bool, kube::Error> {
        // Each attempt starts from the Node as the API server has it (upstream reads its
        // informer cache): changes by others are seen, and a deleted Node is noticed even
        // when there is nothing to write.
        let current = within(self.timeout, self.api.get(self.name())).await?;
        self.node.send_replace(Some(current.clone()));
        let mut base = build_node(&self.facts, &self.cfg)
            .status
            .unwrap_or_default();
        if let Some(devices) = &self.devices {
            add_devices(&mut base, &devices.capacity());
        }
        let health = (self.health)();
        let previous = current.status.clone().unwrap_or_default();
        base.addresses = reported_addresses(
            &self.cfg,
            base.addresses.take(),
            previous.addresses.as_deref(),
        );
        let desired = desired_status(&base, Some(&previous), &health, images, Timestamp::now());
        let changed = status_changed(&previous, &desired);
        let last_write = self.state.lock().ok().and_then(|s| s.last_write);
        let now = Instant::now();
        if !should_write(
            changed,
            last_write,
            now,
            self.cfg.node_status_report_frequency,
        ) {
            return Ok(false);
        }
        let mut patch = serde_json::json!({ "status": desired });
        // `addresses` merges by `type`, which a dual-stack node has twice (two InternalIPs):
        // merged, one would overwrite the other. The list is replaced whole instead, as
        // upstream's node status patch does.
        if let Some(list) = patch["status"]["addresses"].as_array_mut() {
            list.insert(0, serde_json::json!({"$patch": "replace"}));
        }
        let pp = self.patch_params();
        let written = within(
            self.timeout,
            self.api
                .patch_status(self.name(), &pp, &Patch::Strategic(&patch)),
        )
        .await?;
        if let Ok(mut st) = self.state.lock() {
            st.last_write = Some(now);
        }
        tracing::debug!(node = %self.name(), changed, "node status written");
        self.record_condition_events(
            previous.conditions.as_deref().unwrap_or(&[]),
            desired.conditions.as_deref().unwrap_or(&[]),
        );
        self.node.send_replace(Some(written));
        Ok(true)
    }

    /// Records an event about the Node for each condition `after` changes from `before`.
    fn record_condition_events(
        &self,
        before: &[k8s_openapi::api::core::v1::NodeCondition],
        after: &[k8s_openapi::api::core::v1::NodeCondition],
    ) {
        let Some(events) = &self.events else {
            return;
        };
        for reason in condition_events(before, after) {
            events.event(
                &events.node_ref(),
                crate::api::events::EventType::Normal,
                reason,
                format!("Node {} status is now: {reason}", self.name()),
            );
        }
    }

    async fn list_images(&self) -> Option<Vec<ContainerImage>> {
        let svc = self.images.as_ref()?;
        let call = svc.list_images(cri::ListImagesRequest::default());
        match tokio::time::timeout(LIST_IMAGES_TIMEOUT, call).await {
            Ok(Ok(resp)) => Some(node_images(&resp.images)),
            Ok(Err(e)) => {
                tracing::warn!("listing images for the node status: {e}");
                None
            }
            Err(_) => {
                tracing::warn!("listing images for the node status: timed out");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
