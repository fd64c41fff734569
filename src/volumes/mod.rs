//! The volume manager: sets up a pod's volumes before its containers (upstream's
//! `WaitForAttachAndMount` with the configmap, secret, downwardAPI and projected plugins, and
//! [`crate::pod::volumes`] for emptyDir and hostPath) and tears them down once the pod has
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
//! persistentVolumeClaims are read (with their PersistentVolume) on each sync and resolved to
//! the path of a `hostPath` or `local` PersistentVolume, bound by the runtime (read-only when
//! the pod's volume says so); other PersistentVolume types are refused.
//!
//! emptyDirs with `medium: Memory` are a tmpfs it mounts on the emptyDir's directory (sized as
//! upstream: the node's allocatable memory, or the pod's memory limit or the volume's
//! `sizeLimit` when smaller).
//!
//! The manager also reads, for each sync, what the containers' environments reference
//! ([`VolumeManager::env_objects`]: ConfigMaps, Secrets, the service variables) and the pod's
//! `imagePullSecrets` ([`VolumeManager::pull_secrets`]), through the same watches.
//!
//! A volume that cannot be set up (an object missing and not optional, a key missing, no API
//! server) is a `FailedMount` event with upstream's message (`configmap "x" not found`) and the
//! pod waits, retried until it can be. When the pod has terminated (or, after a restart, when
//! its directory is all that is left), the tmpfs are unmounted and the written volumes removed;
//! the pod's directory goes with the garbage collector.

pub mod atomic_writer;
pub mod ownership;
pub mod projection;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, ProjectedVolumeSource, Secret, SecretProjection,
    ServiceAccountTokenProjection, Volume,
};
use kube::Api;

use crate::api::objects::{ObjectKey, ObjectManager};
use crate::api::tokens::{TokenKey, TokenManager};
use crate::pod::SyncError;
use crate::pod::env::EnvObjects;
use crate::pod::sync::PodEvents;
use crate::pod::volumes::{self as local, ClaimMount, Failure, Source};
use crate::pod::{pod_identity, quantity};
use atomic_writer::Payload;
use projection::{Allocatable, DEFAULT_MODE};

/// The fields of a PersistentVolume's spec that are not its source.
const PV_SPEC_FIELDS: [&str; 8] = [
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeMode",
];

/// How long a sync waits for one API request of a volume (a claim, its volume).
const API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Sets up the volumes `pod`'s containers use; those that fail are `FailedMount` events and
    /// a [`SyncError::Volumes`]. Returns the claims resolved, by volume name.
    pub async fn set_up(
        &self,
        pod: &Pod,
        events: &dyn PodEvents,
    ) -> Result<BTreeMap<String, ClaimMount>, SyncError> {
        self.register(pod);
        let used = local::used_volumes(pod);
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        let mut failed = Vec::new();
        let mut claims = BTreeMap::new();
        for v in volumes.into_iter().flatten() {
            if !used.contains(v.name.as_str()) {
                continue;
            }
            let src = local::source(v);
            if let Source::Claim(c) = src {
                match self.claim(pod, c).await {
                    Ok(m) => {
                        claims.insert(v.name.clone(), m);
                    }
                    Err(message) => failed.push(Failure {
                        volume: v.name.clone(),
                        message,
                    }),
                }
                continue;
            }
            let r = match local::written_plugin(&src) {
                Some((plugin, tmpfs)) => match self.payload(pod, &src).await {
                    Ok(payload) => self.write(pod, v, plugin, tmpfs, &payload),
                    Err(e) => Err(e),
                },
                None if local::managed(&src) => self.memory_empty_dir(pod, v),
                None => local::set_up_one(&self.pods_dir, pod, v),
            };
            if let Err(message) = r {
                failed.push(Failure {
                    volume: v.name.clone(),
                    message,
                });
            }
        }
        local::report(pod, &failed, events).map(|()| claims)
    }

    /// A persistentVolumeClaim resolved as upstream's desired state populator does (the claim
    /// bound, its PersistentVolume claimed by it), to the path of a `hostPath` (type checked as
    /// a hostPath volume's) or `local` PersistentVolume; other types are refused.
    async fn claim(
        &self,
        pod: &Pod,
        c: &PersistentVolumeClaimVolumeSource,
    ) -> Result<ClaimMount, String> {
        let ns = pod_identity(pod).2;
        let name = &c.claim_name;
        let wrap = |e: String| format!("error processing PVC {ns}/{name}: {e}");
        let Some(client) = &self.client else {
            return Err(wrap(
                "the node has no API server (standalone) to read it from".into(),
            ));
        };
        let message = |e: kube::Error| match e {
            kube::Error::Api(s) => s.message.clone(),
            e => e.to_string(),
        };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let pvc = tokio::time::timeout(API_TIMEOUT, claims.get(name))
            .await
            .map_err(|_| wrap("failed to fetch PVC from API server: timed out".into()))?
            .map_err(|e| {
                wrap(format!(
                    "failed to fetch PVC from API server: {}",
                    message(e)
                ))
            })?;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(wrap("PVC is being deleted".into()));
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err(wrap("PVC is not bound".into()));
        }
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| wrap("PVC has empty pvc.Spec.VolumeName".into()))?;
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pv = tokio::time::timeout(API_TIMEOUT, pvs.get(&pv_name))
            .await
            .map_err(|_| {
                wrap(format!(
                    "failed to fetch PV {pv_name} from API server: timed out"
                ))
            })?
            .map_err(|e| {
                wrap(format!(
                    "failed to fetch PV {pv_name} from API server: {}",
                    message(e)
                ))
            })?;
        let spec = pv.spec.unwrap_or_default();
        let claim_uid = pvc.metadata.uid.clone().unwrap_or_default();
        match spec
            .claim_ref
            .as_ref()
            .map(|r| r.uid.clone().unwrap_or_default())
        {
            None => {
                return Err(wrap(format!(
                    "found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it \
                     is not yet bound to the claim"
                )));
            }
            Some(uid) if uid != claim_uid => {
                return Err(wrap(format!(
                    "found PV object {pv_name} but its pv.Spec.ClaimRef.UID {uid} does not \
                     point to claim.UID {claim_uid}"
                )));
            }
            Some(_) => {}
        }
        if spec.volume_mode.as_deref() == Some("Block") {
            return Err(format!(
                "persistentVolume {pv_name}: volumeMode Block is not supported by nodelet yet"
            ));
        }
        let path = if let Some(h) = &spec.host_path {
            local::check_host_path(&h.path, h.type_.as_deref().unwrap_or(""))?;
            PathBuf::from(&h.path)
        } else if let Some(l) = &spec.local {
            let p = PathBuf::from(&l.path);
            if !p.exists() {
                return Err(format!("path {:?} does not exist", l.path));
            }
            // A local volume is given to the pod's fsGroup when the pod first mounts it (a
            // hostPath one never is), as upstream's local plugin.
            let read_only = c.read_only.unwrap_or(false);
            self.own_once(pod, &pv_name, &p, read_only)?;
            p
        } else {
            let what = serde_json::to_value(&spec)
                .ok()
                .and_then(|v| {
                    v.as_object().and_then(|o| {
                        o.keys()
                            .find(|k| !PV_SPEC_FIELDS.contains(&k.as_str()))
                            .cloned()
                    })
                })
                .unwrap_or_else(|| "with no source".to_string());
            return Err(format!(
                "persistentVolume {pv_name}: volume type {what} is not supported by nodelet yet \
                 (only hostPath and local)"
            ));
        };
        Ok(ClaimMount {
            path,
            read_only: c.read_only.unwrap_or(false),
        })
    }

    /// Registers the ConfigMaps and Secrets the pod's volumes and environments reference with
    /// their managers.
    fn register(&self, pod: &Pod) {
        let (uid, _, ns) = pod_identity(pod);
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
        let (env_cms, env_secrets) = crate::pod::env::env_references(pod);
        cms.extend(env_cms.iter().map(|n| key(n)));
        secrets.extend(env_secrets.iter().map(|n| key(n)));
        self.config_maps.register(uid, cms);
        self.secrets.register(uid, secrets);
    }

    /// The pod's `imagePullSecrets` as they are now (registered with its last
    /// [`Self::set_up`]), and the names of those that could not be read.
    pub async fn pull_secrets(&self, pod: &Pod) -> (Vec<Secret>, Vec<String>) {
        let ns = pod_identity(pod).2;
        let (mut found, mut failed) = (Vec::new(), Vec::new());
        let refs = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref());
        for r in refs.into_iter().flatten().filter(|r| !r.name.is_empty()) {
            match self.secrets.get(ns, &r.name).await {
                Ok(Some(s)) => found.push((*s).clone()),
                Ok(None) | Err(_) => failed.push(r.name.clone()),
            }
        }
        (found, failed)
    }

    /// The ConfigMaps and Secrets the environments of `pod`'s containers reference, read now
    /// (the pod registered them with its last [`Self::set_up`]), and its service variables.
    pub async fn env_objects(&self, pod: &Pod) -> EnvObjects {
        let ns = pod_identity(pod).2;
        let (cms, secrets) = crate::pod::env::env_references(pod);
        let mut out = EnvObjects {
            allocatable: self.allocatable.clone(),
            ..Default::default()
        };
        // As upstream: a pod from the API server waits for the Services' first list.
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let wait = crate::status_manager::is_api_pod(pod);
        match self.services.env(ns, links, wait).await {
            Ok(env) => out.service_env = env,
            Err(e) => out.service_env_error = Some(e),
        }
        for name in cms {
            let read = self.config_maps.get(ns, &name).await;
            let data = read.map(|o| o.map(|cm| cm.data.clone().unwrap_or_default()));
            out.config_maps.insert(name, data);
        }
        for name in secrets {
            let read = self.secrets.get(ns, &name).await;
            let data = read.map(|o| {
                o.map(|s| {
                    s.data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect()
                })
            });
            out.secrets.insert(name, data);
        }
        out
    }

    async fn config_map(&self, ns: &str, name: &str, optional: bool) -> Result<ConfigMap, String> {
        match self.config_maps.get(ns, name).await? {
            Some(cm) => Ok((*cm).clone()),
            None if optional => Ok(ConfigMap::default()),
            None => Err(format!("configmap {name:?} not found")),
        }
    }

    async fn secret(&self, ns: &str, name: &str, optional: bool) -> Result<Secret, String> {
        match self.secrets.get(ns, name).await? {
            Some(s) => Ok((*s).clone()),
            None if optional => Ok(Secret::default()),
            None => Err(format!("secret {name:?} not found")),
        }
    }

    /// What the volume holds.
    async fn payload(&self, pod: &Pod, src: &Source<'_>) -> Result<Payload, String> {
        let (_, _, ns) = pod_identity(pod);
        match src {
            Source::ConfigMap(c) => {
                let default = projection::mode(c.default_mode, DEFAULT_MODE as u32)?;
                let optional = c.optional.unwrap_or(false);
                let cm = self.config_map(ns, &c.name, optional).await?;
                projection::config_map_payload(c.items.as_deref(), &cm, default, optional)
            }
            Source::Secret(s) => {
                let default = projection::mode(s.default_mode, DEFAULT_MODE as u32)?;
                let optional = s.optional.unwrap_or(false);
                let name = s.secret_name.as_deref().unwrap_or("");
                let secret = self.secret(ns, name, optional).await?;
                projection::secret_payload(s.items.as_deref(), &secret, default, optional)
            }
            Source::DownwardApi(d) => {
                let default = projection::mode(d.default_mode, DEFAULT_MODE as u32)?;
                let items = d.items.as_deref().unwrap_or_default();
                projection::downward_api_payload(items, pod, &self.allocatable, default)
            }
            Source::Projected(p) => self.projected(pod, p).await,
            _ => Err("not a volume the kubelet writes".to_string()),
        }
    }

    /// A projected volume's payload: its sources in order (a later one's file replaces an
    /// earlier one's at the same path); every source that fails is named in the error.
    async fn projected(&self, pod: &Pod, p: &ProjectedVolumeSource) -> Result<Payload, String> {
        let default = projection::mode(p.default_mode, DEFAULT_MODE as u32)?;
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        for s in p.sources.iter().flatten() {
            let part = if let Some(c) = &s.config_map {
                self.projected_config_map(pod, c, default).await
            } else if let Some(sec) = &s.secret {
                self.projected_secret(pod, sec, default).await
            } else if let Some(d) = &s.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                projection::downward_api_payload(items, pod, &self.allocatable, default)
            } else if let Some(t) = &s.service_account_token {
                self.token_file(pod, t, default).await
            } else {
                let what = serde_json::to_value(s)
                    .ok()
                    .and_then(|v| v.as_object().and_then(|o| o.keys().next().cloned()))
                    .unwrap_or_else(|| "an empty source".to_string());
                Err(format!(
                    "projected source {what} is not supported by nodelet yet"
                ))
            };
            match part {
                Ok(files) => payload.extend(files),
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Ok(payload),
            1 => Err(errors.remove(0)),
            _ => Err(format!("[{}]", errors.join(", "))),
        }
    }

    async fn projected_config_map(
        &self,
        pod: &Pod,
        c: &ConfigMapProjection,
        default: u32,
    ) -> Result<Payload, String> {
        let optional = c.optional.unwrap_or(false);
        let cm = self
            .config_map(pod_identity(pod).2, &c.name, optional)
            .await?;
        projection::config_map_payload(c.items.as_deref(), &cm, default, optional)
    }

    async fn projected_secret(
        &self,
        pod: &Pod,
        s: &SecretProjection,
        default: u32,
    ) -> Result<Payload, String> {
        let optional = s.optional.unwrap_or(false);
        let secret = self.secret(pod_identity(pod).2, &s.name, optional).await?;
        projection::secret_payload(s.items.as_deref(), &secret, default, optional)
    }

    /// A service account token for the pod (bound to it) as one file.
    async fn token_file(
        &self,
        pod: &Pod,
        t: &ServiceAccountTokenProjection,
        mode: u32,
    ) -> Result<Payload, String> {
        let (uid, name, ns) = pod_identity(pod);
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .ok_or(
                "cannot request a service account token: the pod has no spec.serviceAccountName",
            )?;
        let key = TokenKey {
            namespace: ns.to_string(),
            service_account: sa.to_string(),
            audiences: t
                .audience
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            expiration_seconds: t.expiration_seconds,
            pod_name: name.to_string(),
            pod_uid: uid.to_string(),
        };
        let token = self.tokens.token(&key).await?;
        // With an fsGroup, the token is the owner's and the group's only (upstream's 0600,
        // then the group's read bit).
        let mode = match local::fs_group(pod)? {
            Some(_) => 0o600,
            None => mode,
        };
        Ok(Payload::from([(
            t.path.clone(),
            atomic_writer::FileProjection {
                data: token.into_bytes(),
                mode,
            },
        )]))
    }

    /// Gives the directory `dir` of the volume `name` to the pod's `fsGroup` once per pod
    /// (upstream's `SetVolumeOwnership` at mount), as its `fsGroupChangePolicy` says:
    /// `OnRootMismatch` skips a volume whose root already has the group and its bits.
    fn own_once(&self, pod: &Pod, name: &str, dir: &Path, read_only: bool) -> Result<(), String> {
        let Some(group) = local::fs_group(pod)? else {
            return Ok(());
        };
        let key = (pod_identity(pod).0.to_string(), name.to_string());
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
        v: &Volume,
        plugin: &str,
        tmpfs: bool,
        payload: &Payload,
    ) -> Result<(), String> {
        let dir = local::plugin_dir(&self.pods_dir, pod_identity(pod).0, plugin).join(&v.name);
        make_volume_dir(&dir)?;
        if tmpfs && !is_mount_point(&dir)? {
            let size = memory_size(self.allocatable.memory, pod_memory_limit(pod), None);
            mount_tmpfs(&dir, size)?;
        }
        atomic_writer::write_owned(&dir, payload, local::fs_group(pod)?).map(drop)
    }

    /// An emptyDir with `medium: Memory`: its directory (0777) with a tmpfs mounted on it,
    /// sized as upstream (the node's allocatable memory, or less: the pod's memory limit, the
    /// volume's `sizeLimit`).
    fn memory_empty_dir(&self, pod: &Pod, v: &Volume) -> Result<(), String> {
        let dir = local::empty_dir_path(&self.pods_dir, pod, &v.name);
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
                .join(crate::pod::volumes::VOLUME_SUBPATHS)
                .exists();
            if written || mounted || sub_paths {
                tracing::info!(pod_uid = %uid, "tearing down the volumes of a pod that is gone");
                self.tear_down(&uid);
            }
        }
    }
}

/// The volume directory, mode 0777 as an emptyDir's (upstream's wrapped emptyDir), its parents
/// 0750.
fn make_volume_dir(dir: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("creating {}: {e}", dir.display());
    if let Some(parent) = dir.parent() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(fail)?;
    }
    match DirBuilder::new().mode(0o777).create(dir) {
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).map_err(fail)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(fail(e)),
    }
}

/// Whether something is mounted at `dir` itself.
pub(crate) fn is_mount_point(dir: &Path) -> Result<bool, String> {
    let info =
        std::fs::read_to_string(MOUNTINFO).map_err(|e| format!("reading {MOUNTINFO}: {e}"))?;
    let real =
        std::fs::canonicalize(dir).map_err(|e| format!("resolving {}: {e}", dir.display()))?;
    Ok(crate::kubelet::gc::mounts_under(&info, &real).contains(&real))
}

/// Mounts a tmpfs of `size` bytes (the kernel's default when `None`) at `dir`.
fn mount_tmpfs(dir: &Path, size: Option<i64>) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    let options = size.filter(|s| *s > 0).map(|s| format!("size={s}"));
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        options.as_deref(),
    )
    .map_err(|e| format!("mounting a tmpfs at {}: {e}", dir.display()))
}

/// A memory-backed volume's size (upstream's `calculateEmptyDirMemorySize`): the node's
/// allocatable memory, or the pod's limit, or the volume's own, whichever is smallest (a zero
/// one counting as none).
fn memory_size(allocatable: Option<i64>, pod: Option<i64>, volume: Option<i64>) -> Option<i64> {
    let mut size = allocatable;
    for cand in [pod, volume].into_iter().flatten().filter(|c| *c > 0) {
        if size.is_none_or(|s| cand <= s) {
            size = Some(cand);
        }
    }
    size
}

/// The pod's memory limit as its cgroup gets it: the sum of its app containers' limits (or an
/// init container's, if larger), when every app container has one.
fn pod_memory_limit(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| quantity::parse_bytes(&q.0).ok())
            .filter(|b| *b > 0)
    };
    let mut sum: i64 = 0;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    for c in spec.init_containers.iter().flatten() {
        if let Some(l) = limit(c) {
            sum = sum.max(l);
        }
    }
    Some(sum)
}

/// Unmounts (when mounted) and removes every written volume directory of pod `uid`, its subPath
/// binds, and unmounts its memory-backed emptyDirs (their directories go with the pod's).
fn tear_down_dirs(pods_dir: &Path, uid: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    // `volume-subpaths/<volume>/<container>/<index>`: each a bind, then the tree.
    let subpaths = pods_dir
        .join(uid)
        .join(crate::pod::volumes::VOLUME_SUBPATHS);
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    for volume in dirs(&subpaths) {
        for container in dirs(&volume) {
            for target in dirs(&container) {
                // Removing the tree through a bind would delete the volume's files: any doubt
                // (an error) keeps the tree.
                match is_mount_point(&target) {
                    Ok(false) => {}
                    Ok(true) => {
                        if let Err(e) =
                            nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH)
                        {
                            errors.push(format!("unmounting {}: {e}", target.display()));
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    if errors.is_empty() && subpaths.exists() {
        if let Err(e) = std::fs::remove_dir_all(&subpaths) {
            errors.push(format!("removing {}: {e}", subpaths.display()));
        }
    }
    let empty_dirs = local::plugin_dir(pods_dir, uid, EMPTY_DIR_PLUGIN);
    for e in std::fs::read_dir(&empty_dirs)
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = e.path();
        let r = is_mount_point(&path).and_then(|mounted| match mounted {
            true => nix::mount::umount2(&path, nix::mount::MntFlags::empty())
                .map_err(|e| format!("unmounting {}: {e}", path.display())),
            false => Ok(()),
        });
        if let Err(e) = r {
            errors.push(e);
        }
    }
    for plugin in local::WRITTEN_PLUGINS {
        let dir = local::plugin_dir(pods_dir, uid, plugin);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let r = is_mount_point(&path).and_then(|mounted| {
                if mounted {
                    nix::mount::umount2(&path, nix::mount::MntFlags::empty())
                        .map_err(|e| format!("unmounting {}: {e}", path.display()))?;
                }
                std::fs::remove_dir_all(&path)
                    .map_err(|e| format!("removing {}: {e}", path.display()))
            });
            if let Err(e) = r {
                errors.push(e);
            }
        }
        if let Err(e) = std::fs::remove_dir(&dir) {
            errors.push(format!("removing {}: {e}", dir.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
