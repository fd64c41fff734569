//! Device plugins (upstream's `cm/devicemanager`, API v1beta1) and the pod-resources API.
//!
//! - **Registration** (`registration.rs`): the kubelet serves `v1beta1.Registration` on
//!   `<root>/device-plugins/kubelet.sock` (made again at every start, so plugins that watch it
//!   register again). A plugin registers its resource name and socket; the kubelet dials the
//!   socket and keeps one `ListAndWatch` stream per plugin (`plugin.rs`): its healthy devices
//!   are the resource's allocatable, all of them its capacity (the Node's status follows each
//!   change). A plugin that goes away has its devices marked unhealthy (allocatable 0); pods
//!   keep what they hold.
//! - **Admission** ([`DeviceManager::admit`], in the sync loop, no RPC): the pod's containers
//!   are walked as allocation will walk them, init containers' devices reusable by the
//!   containers after them; a pod asking for more healthy devices than are free is refused
//!   with upstream's `UnexpectedAdmissionError`; otherwise the count is reserved for it.
//! - **Allocation** ([`DeviceManager::allocate`], in the pod's sync, before its sandbox): per
//!   container and resource the devices are chosen (the pod's reusable ones, then the
//!   plugin's `GetPreferredAllocation` when it offers one, then by ID), `Allocate` is called,
//!   and the answer (envs, mounts, device nodes, annotations, CDI devices) is kept for the
//!   container's CRI config; `PreStartContainer` is called before each start when the plugin
//!   asks for it. Every call has a deadline: a plugin that hangs holds up only the pod
//!   asking it, never the sync loop or another plugin.
//! - **Checkpoint** (`checkpoint.rs`): the allocations with their answers, written on each
//!   change, read at start; a corrupt one is set aside and the allocations rebuilt from the
//!   running containers' `io.nodelet.devices` annotation ([`DeviceManager::rebuild`]).
//! - **Pod resources** (`podresources.rs`): `v1.PodResourcesLister` on
//!   `<root>/pod-resources/kubelet.sock` (0600, the directory 0700).

mod allocate;
pub mod api;
mod checkpoint;
mod plugin;
pub mod podresources;
mod registration;
mod socket;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use runtime::cri;
use tokio::sync::watch;

use crate::admission::Rejection;
use crate::util::lock;
use plugin::Plugin;
use state::{Shortage, State};

/// The device plugin API version this kubelet speaks (upstream's `SupportedVersions`).
pub const VERSION: &str = "v1beta1";
/// The device plugin directory under the root dir.
pub const PLUGIN_DIR: &str = "device-plugins";
/// The registration socket's name in it.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// A device's health when it can be given to pods.
pub const HEALTHY: &str = "Healthy";
/// The admission reason of a pod whose devices cannot be given (upstream's).
pub const REASON: &str = "UnexpectedAdmissionError";
/// The container annotation that records which devices a container holds, by resource (JSON),
/// from which allocations are rebuilt when the checkpoint is lost.
pub const ANNOTATION_DEVICES: &str = "io.nodelet.devices";
/// How long a plugin call may take (`PreStartContainer`'s is upstream's 30 s too).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong giving a pod its devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Not enough devices (upstream's words).
    #[error("Allocate failed due to {0}, which is unexpected")]
    Shortage(Shortage),
    /// No plugin is registered for a resource the pod holds.
    #[error("no device plugin is registered for resource {0:?}")]
    NoPlugin(String),
    /// A plugin call failed or timed out.
    #[error("device plugin for {resource}: {call} failed: {why}")]
    Plugin {
        resource: String,
        call: &'static str,
        why: String,
    },
}

/// A container's share of its devices for its CRI config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<cri::Mount>,
    pub devices: Vec<cri::Device>,
    pub annotations: Vec<(String, String)>,
    pub cdi_devices: Vec<String>,
}

/// The device manager (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    plugins: Mutex<BTreeMap<String, Arc<Plugin>>>,
    /// Bumped on every change of the devices (the Node's capacity follows it).
    changed: watch::Sender<u64>,
    /// The checkpoint could not be used: allocations are to be rebuilt from containers.
    rebuild: std::sync::atomic::AtomicBool,
}

impl DeviceManager {
    /// A manager for the device plugin directory `<root_dir>/device-plugins`: its checkpoint
    /// read (a corrupt one set aside with an error in the log, to be rebuilt by
    /// [`Self::rebuild`]).
    pub fn new(root_dir: &Path) -> DeviceManager {
        let dir = root_dir.join(PLUGIN_DIR);
        let mut state = State::default();
        let mut rebuild = false;
        let path = dir.join(checkpoint::FILE);
        match checkpoint::read(&path) {
            Ok(Some(restored)) => {
                state.pods = restored.pods;
                for (resource, ids) in restored.registered {
                    let devs = ids
                        .into_iter()
                        .map(|id| {
                            let d = state::Device {
                                healthy: false,
                                numa: Vec::new(),
                            };
                            (id, d)
                        })
                        .collect();
                    state.devices.insert(resource, devs);
                }
            }
            Ok(None) => {}
            Err(e) => {
                let aside = checkpoint::set_aside(&path);
                tracing::error!(
                    "device manager checkpoint: {e}; set aside as {}; rebuilding the \
                     allocations from the running containers",
                    aside.map_or_else(|| "(could not move it)".into(), |p| p.display().to_string())
                );
                rebuild = true;
            }
        }
        DeviceManager {
            inner: Arc::new(Inner {
                dir,
                state: Mutex::new(state),
                plugins: Mutex::default(),
                changed: watch::Sender::new(0),
                rebuild: rebuild.into(),
            }),
        }
    }

    /// The device plugin directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// A receiver that sees every change of the devices.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    fn bump(&self) {
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Capacity and allocatable per device resource, for the Node.
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        lock(&self.inner.state).capacity()
    }

    /// Every device the plugins advertise, by resource (pod-resources'
    /// `GetAllocatableResources`).
    pub fn all_devices(&self) -> BTreeMap<String, Vec<(String, Vec<i64>)>> {
        lock(&self.inner.state)
            .devices
            .iter()
            .map(|(r, devs)| {
                let list = devs
                    .iter()
                    .map(|(id, d)| (id.clone(), d.numa.clone()))
                    .collect();
                (r.clone(), list)
            })
            .collect()
    }

    /// What the containers of pod `uid` hold: container → resource → device IDs.
    pub fn pod_devices(&self, uid: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        let st = lock(&self.inner.state);
        st.pods
            .get(uid)
            .into_iter()
            .flatten()
            .map(|(c, res)| {
                let r = res
                    .iter()
                    .map(|(r, a)| (r.clone(), a.ids.clone()))
                    .collect();
                (c.clone(), r)
            })
            .collect()
    }

    /// The NUMA nodes of the devices `ids` of `resource`.
    pub fn numa_of(&self, resource: &str, ids: &[String]) -> Vec<i64> {
        let st = lock(&self.inner.state);
        let mut out: BTreeSet<i64> = BTreeSet::new();
        if let Some(devs) = st.devices.get(resource) {
            for id in ids {
                out.extend(devs.get(id).into_iter().flat_map(|d| d.numa.iter()));
            }
        }
        out.into_iter().collect()
    }

    /// Admission: refuses `pod` when its containers ask for more healthy devices than are
    /// free (upstream's `UnexpectedAdmissionError`), else reserves them. With `holders`,
    /// devices held by pods it refuses (pods that ended or are gone) are free again first.
    pub fn admit(
        &self,
        pod: &Pod,
        holders: Option<&dyn Fn(&str) -> bool>,
    ) -> Result<(), Rejection> {
        let uid = crate::sources::pod_uid(pod).to_string();
        let mut st = lock(&self.inner.state);
        if let Some(holds) = holders {
            if st.retain(|u| u == uid || holds(u)) {
                drop(st);
                self.save();
                st = lock(&self.inner.state);
            }
        }
        let demands = state::demands(pod, |r| st.is_device_resource(r));
        if demands.is_empty() {
            return Ok(());
        }
        st.reserve(&uid, &demands).map_err(|s| Rejection {
            reason: REASON.to_string(),
            message: DeviceError::Shortage(s).to_string(),
        })
    }

    /// `node` with each device resource's allocatable raised to the number of its devices
    /// pods hold, where it is lower (upstream's `sanitizeNodeAllocatable`).
    pub fn sanitize<'a>(&self, node: &'a Node) -> std::borrow::Cow<'a, Node> {
        let held = lock(&self.inner.state).held_counts();
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let count = |r: &str| {
            allocatable
                .and_then(|a| a.get(r))
                .and_then(|q| q.0.trim().parse::<usize>().ok())
                .unwrap_or(0)
        };
        let low: Vec<(&String, &usize)> = held.iter().filter(|(r, n)| count(r) < **n).collect();
        if low.is_empty() {
            return std::borrow::Cow::Borrowed(node);
        }
        let mut fixed = node.clone();
        let status = fixed.status.get_or_insert_with(Default::default);
        let alloc = status.allocatable.get_or_insert_with(Default::default);
        for (r, n) in low {
            alloc.insert(r.clone(), Quantity(n.to_string()));
        }
        std::borrow::Cow::Owned(fixed)
    }

    /// Frees what pods `keep` refuses hold (they ended), with the checkpoint written.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        if lock(&self.inner.state).retain(keep) {
            self.save();
        }
    }

    /// Writes the checkpoint; a failure is logged (the state in memory stays right).
    fn save(&self) {
        let path = self.inner.dir.join(checkpoint::FILE);
        let st = lock(&self.inner.state);
        if let Err(e) = checkpoint::write(&path, &st) {
            tracing::warn!("device manager checkpoint: {e}");
        }
    }

    fn plugin(&self, resource: &str) -> Option<Arc<Plugin>> {
        lock(&self.inner.plugins).get(resource).cloned()
    }

    /// Rebuilds the allocations from the running containers' [`ANNOTATION_DEVICES`] when the
    /// checkpoint could not be used at start (their plugin answers are asked for again when
    /// a container of the pod is next created).
    pub async fn rebuild(&self, rt: &dyn runtime::RuntimeService) {
        if !self
            .inner
            .rebuild
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let listed = rt
            .list_containers(cri::ListContainersRequest::default())
            .await;
        let containers = match listed {
            Ok(r) => r.containers,
            Err(e) => {
                tracing::error!("device manager: listing containers to rebuild allocations: {e}");
                return;
            }
        };
        let mut st = lock(&self.inner.state);
        let mut rebuilt = 0;
        for c in containers {
            let (Some(uid), Some(name), Some(json)) = (
                c.labels.get(crate::model::LABEL_POD_UID),
                c.labels.get(crate::model::LABEL_CONTAINER_NAME),
                c.annotations.get(ANNOTATION_DEVICES),
            ) else {
                continue;
            };
            if c.state == cri::ContainerState::ContainerExited as i32 {
                continue;
            }
            let Ok(record) = serde_json::from_str::<BTreeMap<String, Vec<String>>>(json) else {
                tracing::warn!(container = %c.id, "unreadable {ANNOTATION_DEVICES} annotation");
                continue;
            };
            for (resource, ids) in record {
                let alloc = state::Allocation {
                    ids,
                    response: None,
                };
                st.pods
                    .entry(uid.clone())
                    .or_default()
                    .entry(name.clone())
                    .or_default()
                    .insert(resource, alloc);
                rebuilt += 1;
            }
        }
        drop(st);
        tracing::info!(
            rebuilt,
            "device allocations rebuilt from the running containers"
        );
        self.save();
    }

    /// Registers a plugin (after `Register` checked the request): dials its socket, replaces
    /// an earlier plugin of the same resource, and starts following its devices.
    async fn add_plugin(
        &self,
        req: api::v1beta1::RegisterRequest,
    ) -> Result<(), plugin::PluginError> {
        let socket = self.inner.dir.join(&req.endpoint);
        let plugin = Arc::new(Plugin::connect(&req.resource_name, &socket).await?);
        // The resource is a device resource from now on, devices or not: a pod asking for it
        // before the first ListAndWatch answer waits for devices instead of running without.
        lock(&self.inner.state)
            .devices
            .entry(req.resource_name.clone())
            .or_default();
        let old = lock(&self.inner.plugins).insert(req.resource_name.clone(), plugin.clone());
        if let Some(old) = old {
            old.stop();
        }
        tracing::info!(
            resource = %req.resource_name,
            endpoint = %socket.display(),
            "device plugin registered"
        );
        let me = self.clone();
        tokio::spawn(async move { me.follow(plugin).await });
        Ok(())
    }

    /// Follows a plugin's `ListAndWatch` until it ends, then marks its devices unhealthy
    /// (unless another plugin took the resource over).
    async fn follow(self, plugin: Arc<Plugin>) {
        let resource = plugin.resource().to_string();
        let me = self.clone();
        let end = plugin
            .list_and_watch(|devices| me.set_devices(&resource, devices))
            .await;
        let current = lock(&self.inner.plugins)
            .get(&resource)
            .is_some_and(|p| Arc::ptr_eq(p, &plugin));
        if current {
            lock(&self.inner.plugins).remove(&resource);
            lock(&self.inner.state).all_unhealthy(&resource);
            tracing::warn!(
                resource,
                "device plugin gone ({end}); its devices are unhealthy"
            );
            self.save();
            self.bump();
        }
    }

    /// A `ListAndWatch` answer: the resource's devices from now on. Entries without an ID or
    /// repeating one are skipped with a warning.
    fn set_devices(&self, resource: &str, devices: Vec<api::v1beta1::Device>) {
        let mut map = BTreeMap::new();
        for d in devices {
            if d.id.is_empty() || map.contains_key(&d.id) {
                tracing::warn!(resource, id = %d.id, "device plugin sent a device without an ID or twice; skipped");
                continue;
            }
            let numa = d
                .topology
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default();
            let healthy = d.health == HEALTHY;
            map.insert(d.id, state::Device { healthy, numa });
        }
        let changed = {
            let mut st = lock(&self.inner.state);
            let before = st.devices.insert(resource.to_string(), map.clone());
            before.as_ref() != Some(&map)
        };
        if changed {
            let healthy = map.values().filter(|d| d.healthy).count();
            tracing::info!(
                resource,
                devices = map.len(),
                healthy,
                "device plugin devices"
            );
            self.save();
            self.bump();
        }
    }

    /// Serves registration on `<dir>/kubelet.sock` until `cancel` (see `registration.rs`).
    pub fn serve_registration(
        &self,
        cancel: tokio_util::sync::CancellationToken,
    ) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
        registration::serve(self.clone(), cancel)
    }

    /// Stops following every plugin.
    pub fn stop_plugins(&self) {
        for p in lock(&self.inner.plugins).values() {
            p.stop();
        }
    }
}

#[cfg(test)]
mod tests;
