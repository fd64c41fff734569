//! The runtime manager's sync (upstream `kubeGenericRuntimeManager.SyncPod` and
//! `startContainer`): executing [`PodActions`] through the CRI traits.
//!
//! [`runtime_pod_status`] gathers what the runtime knows about a pod (its sandboxes and
//! containers, found by the `io.kubernetes.pod.uid` label); [`RuntimeManager::sync_pod`]
//! carries out the actions computed from it: stop the pod or single containers, run a new
//! sandbox, then have the image manager make sure of each image and create and start the next
//! init container or the app containers, recording restarts in the CrashLoopBackOff state.
//! Failures to start a container do not stop the others; they come back as waiting reasons for
//! [`super::status::StatusContext::waiting`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};
use runtime::{Error, Result, cri};

use super::actions::{PodActions, RunState, RuntimePodStatus, is_sidecar};
use super::backoff;
use super::container::{ContainerOptions, container_config};
use super::container_hash;
pub use super::images::ImagePulls;
use super::images::ImageRequest;
use super::kill::{kill_pod, stop_one};
use super::manager::RuntimeManager;
pub use super::manager::{RuntimeSnapshot, runtime_pod_status};
use super::spec::{pod_spec, sandbox_config};
use super::types::{StopError, SyncError};
pub use crate::api::events::{EventType, NoEvents, PodEvents, Reason};
use crate::model::{PodRef, PullPolicy, Waiting, WaitingReason};

/// The outcome of one [`RuntimeManager::sync_pod`].
#[derive(Debug, Default)]
pub struct SyncResult {
    /// The sandbox the containers run in, if any.
    pub sandbox_id: Option<String>,
    /// Containers created and started, by name.
    pub started: Vec<String>,
    /// Running containers whose resources were updated in place, by name.
    pub resized: Vec<String>,
    /// Why a container's resources could not be updated (its name, the runtime's error).
    pub resize_errors: Vec<(String, String)>,
    /// Containers that could not be started, by name: CrashLoopBackOff, ErrImagePull, ...
    pub waiting: HashMap<String, Waiting>,
    /// Containers and sandboxes that could not be stopped (the next sync retries).
    pub errors: Vec<StopError>,
    /// When the pod wants to be synced again (the first back-off to end).
    pub requeue_after: Option<Duration>,
}

impl SyncResult {
    fn wait(&mut self, d: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(d, |w| w.min(d)));
    }

    /// The error the sync ends with, if anything could not be done: the stop failures, else
    /// the first waiting container by name (as upstream's `SyncPod` result).
    pub fn into_error(self) -> Option<SyncError> {
        if !self.errors.is_empty() {
            return Some(SyncError::Stop(self.errors));
        }
        let (container, waiting) = self.waiting.into_iter().min_by(|a, b| a.0.cmp(&b.0))?;
        Some(SyncError::Waiting { container, waiting })
    }
}

/// The effective pull policy of a container (see [`PullPolicy::of`]).
pub fn pull_policy(c: &Container) -> PullPolicy {
    PullPolicy::of(c)
}

/// The IP hooks of `pod` reach it at: the node's for hostNetwork pods, else its sandbox's.
pub fn pod_ip(pod: &Pod, status: &RuntimePodStatus, host_ips: &[String]) -> String {
    if super::host_network(pod) {
        return host_ips.first().cloned().unwrap_or_default();
    }
    status
        .sandboxes
        .first()
        .map(|s| s.ip.clone())
        .unwrap_or_default()
}

/// One sync of one pod: the pod, who it is, what the runtime showed of it, what to do, and
/// what its containers are made with.
pub struct PodSync<'a> {
    pub pod: &'a Pod,
    pub who: &'a PodRef,
    pub snapshot: &'a RuntimeSnapshot,
    pub actions: &'a PodActions,
    pub opts: &'a ContainerOptions,
    pub now: SystemTime,
}

impl PodSync<'_> {
    /// An event about the pod, or one of its containers.
    fn say(&self, m: &RuntimeManager, c: Option<&str>, kind: EventType, r: Reason, msg: String) {
        m.events.event(self.pod, c, kind, r, msg);
    }
}

/// The sandbox a sync starts containers in: its id, config, and the options with its IPs.
struct Sandbox {
    id: String,
    config: cri::PodSandboxConfig,
    opts: ContainerOptions,
}

impl RuntimeManager {
    /// Carries out `s.actions` (computed from `s.snapshot`), like upstream's `SyncPod`.
    pub async fn sync_pod(&self, s: &PodSync<'_>) -> Result<SyncResult> {
        let spec = pod_spec(s.pod)?;
        note_init_containers_finished(s, spec);
        let mut res = SyncResult {
            waiting: s.actions.waiting.clone(),
            requeue_after: s.actions.wait,
            ..Default::default()
        };
        for (name, w) in &s.actions.waiting {
            if w.reason == WaitingReason::CrashLoopBackOff {
                let msg = format!(
                    "Back-off restarting failed container {name} in pod {}",
                    s.who.desc()
                );
                s.say(self, Some(name), EventType::Warning, Reason::BackOff, msg);
            }
        }
        let grace = spec.termination_grace_period_seconds.unwrap_or(30);
        res.errors = self.kill_for_sync(s, grace).await;
        self.update_resources(s, &mut res).await;
        let Some(sandbox) = self.sandbox_for_sync(s).await? else {
            return Ok(res);
        };
        res.sandbox_id = Some(sandbox.id.clone());
        // Init containers in order, each only once the ones before it started; then the app
        // containers, each on its own.
        let steps = s.actions.start_init.iter().map(|n| (n, true));
        let steps = steps.chain(s.actions.start_containers.iter().map(|n| (n, false)));
        for (name, in_order) in steps {
            let container = spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
                .find(|c| &c.name == name)
                .ok_or_else(|| {
                    Error::invalid_argument(format!("container {name:?} is not in the pod spec"))
                })?;
            match self.start_one(s, &sandbox, container).await {
                Ok(()) => res.started.push(name.clone()),
                Err((w, wait)) => {
                    if let Some(wait) = wait {
                        res.wait(wait);
                    }
                    res.waiting.insert(name.clone(), w);
                    if in_order {
                        break;
                    }
                }
            }
        }
        Ok(res)
    }

    /// Gives the running containers the actions name their (allocated) resources in place; what
    /// the runtime refuses is kept for the pod's `PodResizeInProgress` condition (reason
    /// `Error`, as upstream) and tried again.
    async fn update_resources(&self, s: &PodSync<'_>, res: &mut SyncResult) {
        for (id, name) in &s.actions.update_resources {
            let Some(c) = super::container::find(s.pod, name) else {
                continue;
            };
            let linux = match super::container::linux_resources(s.pod, c, s.opts) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(pod = %s.who.full_name(), container = %name, "resize: {e}");
                    continue;
                }
            };
            if let Some(refused) = self
                .memory_in_use(id, name, linux.memory_limit_in_bytes)
                .await
            {
                tracing::warn!(pod = %s.who.full_name(), container = %name, "resize waits: {refused}");
                res.resize_errors.push((name.clone(), refused));
                res.wait(Duration::from_secs(10));
                continue;
            }
            let req = cri::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(linux),
                ..Default::default()
            };
            match self.rt.update_container_resources(req).await {
                Ok(_) => {
                    tracing::info!(pod = %s.who.full_name(), container = %name, "container resized");
                    res.resized.push(name.clone());
                }
                Err(e) => {
                    tracing::warn!(pod = %s.who.full_name(), container = %name, "resize failed: {e}");
                    res.resize_errors.push((name.clone(), e.to_string()));
                    res.wait(Duration::from_secs(10));
                }
            }
        }
    }

    /// Why a memory limit of `limit` bytes cannot be given to the container now: its working
    /// set is at least that (upstream's best-effort check before a decrease: the kernel refuses
    /// it on cgroup v1, and OOM-kills the container on v2). `None` when there is no limit or
    /// the usage cannot be read (the update goes ahead).
    async fn memory_in_use(&self, id: &str, name: &str, limit: i64) -> Option<String> {
        let limit = u64::try_from(limit).ok().filter(|l| *l > 0)?;
        let req = cri::ContainerStatsRequest {
            container_id: id.to_string(),
        };
        let stats = match self.rt.container_stats(req).await {
            Ok(r) => r.stats?,
            Err(e) => {
                tracing::debug!(container = %name, "no memory usage before a resize: {e}");
                return None;
            }
        };
        let usage = stats.memory?.working_set_bytes?.value;
        (usage >= limit).then(|| {
            format!(
                "attempting to set container {name:?} memory limit ({limit}) below its current usage ({usage})"
            )
        })
    }

    /// Stops the pod (when its sandbox goes) or the containers the actions name.
    async fn kill_for_sync(&self, s: &PodSync<'_>, grace: i64) -> Vec<StopError> {
        let (rt, events, status) = (self.rt.as_ref(), self.events.as_ref(), &s.snapshot.status);
        let ip = pod_ip(s.pod, status, &s.opts.host_ips);
        let mut errors = Vec::new();
        if s.actions.kill_pod {
            if s.actions.create_sandbox && !status.sandboxes.is_empty() {
                let msg = "Pod sandbox changed, it will be killed and re-created.".to_string();
                s.say(self, None, EventType::Normal, Reason::SandboxChanged, msg);
            }
            errors.extend(kill_pod(rt, events, s.pod, status, grace, &ip).await);
        }
        for k in &s.actions.kill_containers {
            let Some(c) = status.containers.iter().find(|c| c.id == k.id) else {
                continue;
            };
            let grace = k.grace_secs.unwrap_or(grace);
            if let Err(e) = stop_one(rt, events, s.pod, c, grace, Some(&k.message), &ip).await {
                errors.push(e);
            }
        }
        errors
    }

    /// The sandbox to start containers in: a new one when the actions say so, else the
    /// current one; `None` when there is none to use.
    async fn sandbox_for_sync(&self, s: &PodSync<'_>) -> Result<Option<Sandbox>> {
        let mut sb_opts = s.opts.sandbox.clone();
        let mut opts = s.opts.clone();
        let id = if s.actions.create_sandbox {
            sb_opts.attempt = s.actions.sandbox_attempt;
            let config = sandbox_config(s.pod, s.who, &sb_opts).inspect_err(|e| {
                let msg = format!("Failed to create pod sandbox: {}", e.message());
                s.say(
                    self,
                    None,
                    EventType::Warning,
                    Reason::FailedCreatePodSandbox,
                    msg,
                );
            })?;
            for (reason, msg) in super::spec::dns_warnings(s.pod, s.who, &sb_opts) {
                s.say(self, None, EventType::Warning, reason, msg);
            }
            let (id, ips) = self.run_sandbox(s, config.clone()).await?;
            if !ips.is_empty() {
                opts.pod_ips = ips;
            }
            return Ok(Some(self.sandbox_with(s, id, config, opts)));
        } else if let Some(id) = &s.actions.sandbox_id {
            let current = s.snapshot.status.sandboxes.iter().find(|sb| &sb.id == id);
            sb_opts.attempt = current.map_or(0, |sb| sb.attempt);
            if let Some(ip) = current.map(|sb| sb.ip.clone()).filter(|ip| !ip.is_empty()) {
                opts.pod_ips = vec![ip];
            }
            id.clone()
        } else {
            return Ok(None);
        };
        let config = sandbox_config(s.pod, s.who, &sb_opts)?;
        Ok(Some(self.sandbox_with(s, id, config, opts)))
    }

    /// A pod on the node's network has the node's addresses (`status.podIP(s)` in its env).
    fn sandbox_with(
        &self,
        s: &PodSync<'_>,
        id: String,
        config: cri::PodSandboxConfig,
        mut opts: ContainerOptions,
    ) -> Sandbox {
        if super::host_network(s.pod) {
            opts.pod_ips = s.opts.host_ips.clone();
        }
        Sandbox { id, config, opts }
    }

    /// Runs a new sandbox: its id and IPs (a `FailedCreatePodSandBox` event when it fails).
    async fn run_sandbox(
        &self,
        s: &PodSync<'_>,
        config: cri::PodSandboxConfig,
    ) -> Result<(String, Vec<String>)> {
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let id = match self.rt.run_pod_sandbox(req).await {
            Ok(r) => r.pod_sandbox_id,
            Err(e) => {
                let msg = format!("Failed to create pod sandbox: {e}");
                s.say(
                    self,
                    None,
                    EventType::Warning,
                    Reason::FailedCreatePodSandbox,
                    msg,
                );
                return Err(e);
            }
        };
        let st = self
            .rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await?;
        let ips = st
            .status
            .and_then(|s| s.network)
            .filter(|n| !n.ip.is_empty())
            .map(|net| {
                super::status::sort_pod_ips(
                    std::iter::once(net.ip).chain(net.additional_ips.into_iter().map(|p| p.ip)),
                    &s.opts.host_ips,
                )
            })
            .unwrap_or_default();
        Ok((id, ips))
    }

    /// Pulls, creates and starts one container (upstream `startContainer`).
    async fn start_one(
        &self,
        s: &PodSync<'_>,
        sandbox: &Sandbox,
        container: &Container,
    ) -> std::result::Result<(), (Waiting, Option<Duration>)> {
        let name = &container.name;
        let say = |kind: EventType, reason: Reason, message: String| {
            s.say(self, Some(name), kind, reason, message)
        };
        let config = self.container_config_for(s, sandbox, container).await?;
        // A restart (of a container that exited, or was just killed after an earlier one
        // exited) moves its back-off on, as upstream's doBackOff.
        if s.snapshot.status.last_exited(name).is_some() {
            let key = backoff::key(&s.who.uid, name, &container_hash(container));
            self.backoff().record_restart(&key, s.now);
        }
        let failed = |reason: WaitingReason, e: Error| {
            say(EventType::Warning, Reason::Failed, format!("Error: {e}"));
            (Waiting::new(reason, e.to_string()), None)
        };
        let id = self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.config.clone()),
            })
            .await
            .map(|r| r.container_id)
            .map_err(|e| failed(WaitingReason::CreateContainerError, e))?;
        let msg = format!("Created container: {name}");
        say(EventType::Normal, Reason::CreatedContainer, msg);
        let init = is_init(s.pod, name);
        let kind = if init { "init_container" } else { "container" };
        let req = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        let started = self.rt.start_container(req).await;
        crate::metrics::get().container_started(kind, started.is_ok());
        started.map_err(|e| failed(WaitingReason::RunContainerError, e))?;
        if init && !is_sidecar(container) {
            let startup = &crate::metrics::get().pod_startup;
            startup.init_started(&s.who.uid, name, SystemTime::now());
        }
        let msg = format!("Started container {name}");
        say(EventType::Normal, Reason::StartedContainer, msg);
        self.post_start(s, sandbox, container, id).await
    }

    /// The container's image made sure of, and its CRI config made.
    async fn container_config_for(
        &self,
        s: &PodSync<'_>,
        sandbox: &Sandbox,
        container: &Container,
    ) -> std::result::Result<cri::ContainerConfig, (Waiting, Option<Duration>)> {
        let name = &container.name;
        let say = |kind: EventType, reason: Reason, message: String| {
            s.say(self, Some(name), kind, reason, message)
        };
        let image_ref = self
            .images
            .ensure(&ImageRequest {
                pod: s.pod,
                who: s.who,
                container,
                sandbox: &sandbox.config,
                pull_secrets: &sandbox.opts.pull_secrets,
                events: self.events.as_ref(),
                now: s.now,
            })
            .await?;
        // As upstream, `envFrom` keys that are no variable names are skipped, with an event.
        let env_objects = &sandbox.opts.env_objects;
        for message in super::env::invalid_env_from_keys(s.who, container, env_objects) {
            say(
                EventType::Warning,
                Reason::InvalidEnvironmentVariableNames,
                message,
            );
        }
        let restart_count = s.snapshot.status.latest(name).map_or(0, |p| p.attempt + 1);
        // Its devices' plugins answer (again) and prepare them first (upstream calls
        // PreStartContainer while making the container's options).
        let with_devices;
        let opts = match sandbox.opts.device_manager.as_ref() {
            Some(devices) if sandbox.opts.devices.contains_key(name) => {
                let run = devices.start_options(&s.who.uid, name).await.map_err(|e| {
                    let msg = format!("Error: {e}");
                    say(EventType::Warning, Reason::Failed, msg);
                    let reason = WaitingReason::CreateContainerError;
                    (Waiting::new(reason, e.to_string()), None)
                })?;
                let mut o = sandbox.opts.clone();
                o.devices.insert(name.clone(), run);
                with_devices = o;
                &with_devices
            }
            _ => &sandbox.opts,
        };
        // The reason's message is the error's own, as upstream's (`configmap "x" not found`).
        let mut config =
            container_config(s.pod, s.who, container, restart_count, opts).map_err(|e| {
                let msg = format!("Error: {}", e.message());
                say(EventType::Warning, Reason::Failed, msg);
                let reason = WaitingReason::CreateContainerConfigError;
                (Waiting::new(reason, e.message().to_string()), None)
            })?;
        if let Some(img) = config.image.as_mut().filter(|_| !image_ref.is_empty()) {
            img.image = image_ref;
        }
        Ok(config)
    }

    /// Runs the container's postStart hook before the next container starts; a failure kills
    /// the container and its restart policy applies.
    async fn post_start(
        &self,
        s: &PodSync<'_>,
        sandbox: &Sandbox,
        container: &Container,
        id: String,
    ) -> std::result::Result<(), (Waiting, Option<Duration>)> {
        let lifecycle = container.lifecycle.as_ref();
        let Some(hook) = lifecycle.and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let name = &container.name;
        let ip = sandbox.opts.pod_ips.first().cloned().unwrap_or_default();
        let rt = self.rt.as_ref();
        let Err(message) = super::hooks::run(rt, s.pod, container, &id, hook, &ip).await else {
            return Ok(());
        };
        // The hook's message (with what the hook printed) goes to the container's status
        // only: events and logs name the failure, never the output, which may hold secrets
        // (upstream records the same words).
        let failed = "PostStartHook failed".to_string();
        s.say(
            self,
            Some(name),
            EventType::Warning,
            Reason::FailedPostStartHook,
            failed,
        );
        let killing = "FailedPostStartHook".to_string();
        s.say(
            self,
            Some(name),
            EventType::Normal,
            Reason::KillingContainer,
            killing,
        );
        let spec = s.pod.spec.as_ref();
        let grace = spec.and_then(|s| s.termination_grace_period_seconds);
        let req = cri::StopContainerRequest {
            container_id: id,
            timeout: grace.unwrap_or(30),
        };
        if let Err(e) = rt.stop_container(req).await {
            tracing::warn!(container = %name, "stopping after a failed postStart hook: {e}");
        }
        Err((
            Waiting::new(WaitingReason::PostStartHookError, message.to_string()),
            None,
        ))
    }
}

/// Regular init containers seen finished, for the startup SLI (which leaves their run out).
fn note_init_containers_finished(s: &PodSync<'_>, spec: &k8s_openapi::api::core::v1::PodSpec) {
    let regular_init = |name: &str| {
        spec.init_containers
            .iter()
            .flatten()
            .any(|i| i.name == name && !is_sidecar(i))
    };
    let finished = s
        .snapshot
        .status
        .containers
        .iter()
        .filter(|c| c.state == RunState::Exited && c.exit_code == 0 && regular_init(&c.name));
    for c in finished {
        if let Some(at) = c.finished_at {
            let startup = &crate::metrics::get().pod_startup;
            startup.init_finished(&s.who.uid, &c.name, at);
        }
    }
}

/// Whether `name` is one of the pod's init containers.
fn is_init(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == name))
}

#[cfg(test)]
mod tests;
