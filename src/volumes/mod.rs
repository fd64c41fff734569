//! The volume manager: sets up a pod's volumes before its containers (upstream's
//! `WaitForAttachAndMount` with the configmap, secret, downwardAPI and projected plugins, and
//! [`plugins`] for emptyDir and hostPath) and tears them down once the pod has
//! terminated.
//!
//! configMap, secret, downwardAPI and projected volumes are written by the [`atomic_writer`]
//! into `<pods dir>/<uid>/volumes/kubernetes.io~<plugin>/<name>`, the [`projection`] of the
//! objects (watched one by one by [`ObjectManager`]s), the pod's own fields and service
//! account tokens ([`TokenManager`]). Secret and projected volumes live on a tmpfs the kubelet
//! mounts there (sized by the pod's memory limit, else the node's allocatable memory), so
//! their content never reaches the disk. Every sync of the pod writes them again, and the
//! atomic writer swaps in only what changed: an updated object, a new token, changed labels
//! reach running containers (their mounts are read-only binds of the volume directory).
//!
//! persistentVolumeClaims are read ([`claims`], with their PersistentVolume) on each sync and
//! resolved to the path of a `hostPath` or `local` PersistentVolume, bound by the runtime
//! (read-only when the pod's volume says so); other PersistentVolume types are refused.
//!
//! emptyDirs with `medium: Memory` are a tmpfs it mounts on the emptyDir's directory (sized as
//! upstream: the node's allocatable memory, or the pod's memory limit or the volume's
//! `sizeLimit` when smaller).
//!
//! The manager's watches also serve, for each sync, what the containers' environments
//! reference (ConfigMaps, Secrets, the service variables) and the pod's `imagePullSecrets`
//! ([`crate::inputs::PodInputs`] reads them).
//!
//! A volume that cannot be set up (an object missing and not optional, a key missing, no API
//! server: a [`PluginError`]) is a `FailedMount` event with upstream's message (`configmap "x"
//! not found`) and the pod waits, retried until it can be. When the pod has terminated (or,
//! after a restart, when its directory is all that is left), the tmpfs are unmounted and the
//! written volumes removed; the pod's directory goes with the garbage collector.

pub mod atomic_writer;
mod claims;
mod disk;
mod error;
pub mod ownership;
pub mod plugins;
pub mod projection;
mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Volume};

use crate::api::events::PodEvents;
use crate::api::objects::{ObjectKey, ObjectManager};
use crate::api::tokens::TokenManager;
use crate::model::PodRef;
use crate::util::lock;
use crate::util::quantity;
use atomic_writer::Payload;
pub(crate) use disk::is_mount_point;
use disk::{memory_size, mount_tmpfs, pod_memory_limit, tear_down_dirs};
pub use error::ClaimError;
pub use error::{PluginError, VolumeError};
pub use plugins::MountedVolume;
use plugins::{self as local, Failure, Source};
use projection::Allocatable;

/// The emptyDir plugin's directory name.
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

/// Where the kernel lists this process's mounts.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Sets up and tears down the pods' volumes.
pub struct VolumeManager {
    client: Option<kube::Client>,
    pods_dir: PathBuf,
    config_maps: ObjectManager<ConfigMap>,
    secrets: ObjectManager<Secret>,
    tokens: TokenManager,
    allocatable: Allocatable,
    services: crate::api::services::Services,
    /// The (pod UID, volume) given to the pod's fsGroup already.
    owned: std::sync::Mutex<BTreeSet<(String, String)>>,
}

impl VolumeManager {
    /// A manager for the pods under `pods_dir`, reading objects and tokens through `client`
    /// (`None` on a standalone node: volumes needing them fail with a clear reason).
    pub fn new(client: Option<kube::Client>, pods_dir: PathBuf, allocatable: Allocatable) -> Self {
        VolumeManager {
            client: client.clone(),
            pods_dir,
            config_maps: ObjectManager::new(client.clone(), "configmap"),
            secrets: ObjectManager::new(client.clone(), "secret"),
            tokens: TokenManager::new(client),
            allocatable,
            services: Default::default(),
            owned: Default::default(),
        }
    }

    /// Gives containers the service environment variables of `services`.
    pub fn with_services(mut self, services: crate::api::services::Services) -> Self {
        self.services = services;
        self
    }

    /// How many ConfigMaps and Secrets are watched.
    pub fn watched(&self) -> (usize, usize) {
        (self.config_maps.watched(), self.secrets.watched())
    }

    /// Sets up the volumes the containers of `pod` (who is `who`) use; those that fail are
    /// `FailedMount` events and a [`VolumeError`]. Returns where each is mounted from, by
    /// volume name: what the containers' mounts bind.
    pub async fn set_up(
        &self,
        pod: &Pod,
        who: &PodRef,
        events: &dyn PodEvents,
    ) -> Result<BTreeMap<String, MountedVolume>, VolumeError> {
        self.register(pod, who);
        let used = local::used_volumes(pod);
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        let mut failed = Vec::new();
        let mut mounted = BTreeMap::new();
        for v in volumes.into_iter().flatten() {
            if !used.contains(v.name.as_str()) {
                continue;
            }
            let src = local::source(v);
            if let Source::Claim(c) = src {
                match self.claim(pod, who, c).await {
                    Ok(m) => {
                        mounted.insert(v.name.clone(), m);
                    }
                    Err(e) => failed.push(Failure::new(&v.name, &e)),
                }
                continue;
            }
            let r = match local::written_plugin(&src) {
                Some((plugin, tmpfs)) => match self.payload(pod, who, &src).await {
                    Ok(payload) => self.write(pod, who, v, plugin, tmpfs, &payload),
                    Err(e) => Err(e),
                },
                None if local::managed(&src) => self.memory_empty_dir(pod, who, v),
                None => local::set_up_one(&self.pods_dir, &who.uid, pod, v),
            };
            match r.and_then(|()| local::mounted(&self.pods_dir, &who.uid, v)) {
                Ok(m) => {
                    mounted.insert(v.name.clone(), m);
                }
                Err(e) => failed.push(Failure::new(&v.name, &e)),
            }
        }
        local::report(pod, &failed, events).map(|()| mounted)
    }

    /// Registers the ConfigMaps and Secrets the pod's volumes and environments reference with
    /// their managers.
    fn register(&self, pod: &Pod, who: &PodRef) {
        let (uid, ns) = (who.uid.as_str(), who.namespace.as_str());
        let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
        let key = |name: &str| -> ObjectKey { (ns.to_string(), name.to_string()) };
        let used = local::used_volumes(pod);
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten() {
            if !used.contains(v.name.as_str()) {
                continue;
            }
            match local::source(v) {
                Source::ConfigMap(c) => {
                    cms.insert(key(&c.name));
                }
                Source::Secret(s) => {
                    secrets.insert(key(s.secret_name.as_deref().unwrap_or("")));
                }
                Source::Projected(p) => {
                    for s in p.sources.iter().flatten() {
                        if let Some(c) = &s.config_map {
                            cms.insert(key(&c.name));
                        }
                        if let Some(s) = &s.secret {
                            secrets.insert(key(&s.name));
                        }
                    }
                }
                _ => {}
            }
        }
        for r in pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| !r.name.is_empty())
        {
            secrets.insert(key(&r.name));
        }
        let (env_cms, env_secrets) = crate::model::env_references(pod);
        cms.extend(env_cms.iter().map(|n| key(n)));
        secrets.extend(env_secrets.iter().map(|n| key(n)));
        self.config_maps.register(uid, cms);
        self.secrets.register(uid, secrets);
    }

    /// The ConfigMaps the pods' volumes and environments reference (registered with each
    /// pod's [`Self::set_up`]).
    pub fn config_maps(&self) -> &ObjectManager<ConfigMap> {
        &self.config_maps
    }

    /// The Secrets the pods' volumes, environments and image pulls reference.
    pub fn secrets(&self) -> &ObjectManager<Secret> {
        &self.secrets
    }

    /// The Services, for the pods' service environment variables.
    pub fn services(&self) -> &crate::api::services::Services {
        &self.services
    }

    /// The node's allocatable resources (for downward API resource fields).
    pub fn allocatable(&self) -> &Allocatable {
        &self.allocatable
    }

    /// Gives the directory `dir` of the volume `name` to the pod's `fsGroup` once per pod
    /// (upstream's `SetVolumeOwnership` at mount), as its `fsGroupChangePolicy` says:
    /// `OnRootMismatch` skips a volume whose root already has the group and its bits.
    fn own_once(
        &self,
        pod: &Pod,
        who: &PodRef,
        name: &str,
        dir: &Path,
        read_only: bool,
    ) -> Result<(), PluginError> {
        let Some(group) = local::fs_group(pod)? else {
            return Ok(());
        };
        let key = (who.uid.clone(), name.to_string());
        if lock(&self.owned).contains(&key) {
            return Ok(());
        }
        let policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.fs_group_change_policy.as_deref())
            .unwrap_or("Always");
        let skip = policy == "OnRootMismatch" && ownership::root_matches(dir, group, read_only);
        if !skip {
            ownership::set_volume_ownership(dir, group, read_only)?;
        }
        lock(&self.owned).insert(key);
        Ok(())
    }

    /// Makes the volume's directory (on a tmpfs when asked) and writes the payload into it.
    fn write(
        &self,
        pod: &Pod,
        who: &PodRef,
        v: &Volume,
        plugin: &str,
        tmpfs: bool,
        payload: &Payload,
    ) -> Result<(), PluginError> {
        let dir = local::plugin_dir(&self.pods_dir, &who.uid, plugin).join(&v.name);
        // Mode 0777 as an emptyDir's (upstream's wrapped emptyDir), its parents 0750.
        local::make_empty_dir(&dir, None)?;
        if tmpfs && !is_mount_point(&dir)? {
            let size = memory_size(self.allocatable.memory, pod_memory_limit(pod), None);
            mount_tmpfs(&dir, size)?;
        }
        atomic_writer::write_owned(&dir, payload, local::fs_group(pod)?)?;
        Ok(())
    }

    /// An emptyDir with `medium: Memory`: its directory (0777) with a tmpfs mounted on it,
    /// sized as upstream (the node's allocatable memory, or less: the pod's memory limit, the
    /// volume's `sizeLimit`).
    fn memory_empty_dir(&self, pod: &Pod, who: &PodRef, v: &Volume) -> Result<(), PluginError> {
        let dir = local::empty_dir_path(&self.pods_dir, &who.uid, &v.name);
        let group = local::fs_group(pod)?;
        local::make_empty_dir(&dir, group)?;
        if is_mount_point(&dir)? {
            return Ok(());
        }
        let limit = v
            .empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.as_ref())
            .map(|q| quantity::parse_bytes(&q.0))
            .transpose()?;
        let size = memory_size(self.allocatable.memory, pod_memory_limit(pod), limit);
        mount_tmpfs(&dir, size)?;
        match group {
            Some(g) => local::own_by_group(&dir, g),
            None => Ok(()),
        }
    }

    /// Unmounts and removes the written volumes of pod `uid` and forgets its objects and
    /// tokens. Errors are logged; what is left is tried again by [`Self::tear_down_gone`].
    pub fn tear_down(&self, uid: &str) {
        self.config_maps.unregister(uid);
        self.secrets.unregister(uid);
        self.tokens.forget_pod(uid);
        lock(&self.owned).retain(|(u, _)| u != uid);
        if let Err(e) = tear_down_dirs(&self.pods_dir, uid) {
            tracing::warn!(pod_uid = %uid, "tearing down volumes: {e}");
        }
    }

    /// Tears down the written and memory-backed volumes and the subPath binds of the pods in
    /// the pods directory that `active` says are neither wanted nor known to a worker (pods
    /// gone while the kubelet was down).
    pub fn tear_down_gone(&self, active: impl Fn(&str) -> bool) {
        let Ok(entries) = std::fs::read_dir(&self.pods_dir) else {
            return;
        };
        for e in entries.flatten() {
            let uid = e.file_name().to_string_lossy().into_owned();
            if active(&uid) {
                continue;
            }
            let written = local::WRITTEN_PLUGINS
                .iter()
                .any(|p| local::plugin_dir(&self.pods_dir, &uid, p).exists());
            let empty_dirs = local::plugin_dir(&self.pods_dir, &uid, EMPTY_DIR_PLUGIN);
            let mounted = std::fs::read_dir(&empty_dirs)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| is_mount_point(&e.path()).unwrap_or(true));
            let sub_paths = self
                .pods_dir
                .join(&uid)
                .join(plugins::VOLUME_SUBPATHS)
                .exists();
            if written || mounted || sub_paths {
                tracing::info!(pod_uid = %uid, "tearing down the volumes of a pod that is gone");
                self.tear_down(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests;
