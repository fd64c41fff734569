//! Executing [`PodActions`] through the CRI traits: the one part of `pod` that does I/O.
//!
//! [`runtime_pod_status`] gathers what the runtime knows about a pod (its sandboxes and
//! containers, found by the `io.kubernetes.pod.uid` label); [`sync_pod`] carries out the
//! actions computed from it like upstream's `SyncPod`: stop the pod or single containers, run a
//! new sandbox, then pull images as `imagePullPolicy` says and create and start the next init
//! container or the app containers, recording restarts in the CrashLoopBackOff state. Failures
//! to start a container do not stop the others; they come back as waiting reasons for
//! [`super::status::StatusContext::waiting`].

use crate::util::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};
use runtime::{Error, ImageService, Result, RuntimeService, cri};
use tokio::sync::Semaphore;

use super::actions::{PodActions, RunState, RuntimePodStatus, is_sidecar};
use super::backoff::{self, Backoff};
use super::container::{ContainerOptions, container_config};
use super::kill::{kill_pod, stop_one};
use super::spec::{SandboxOptions, pod_spec, sandbox_config};
use super::termination;
use super::types::SyncError;
use super::{LABEL_POD_UID, container_hash, pod_identity};
pub use crate::api::events::{EventType, NoEvents, PodEvents, Reason};
use crate::model::{PullPolicy, Waiting, WaitingReason};

/// What the runtime knows about one pod.
#[derive(Debug, Clone, Default)]
pub struct RuntimeSnapshot {
    /// The digest [`super::compute_pod_actions`] works on.
    pub status: RuntimePodStatus,
    /// CRI statuses of the pod's sandboxes, newest first.
    pub sandboxes: Vec<cri::PodSandboxStatus>,
    /// CRI statuses of all the pod's containers.
    pub containers: Vec<cri::ContainerStatus>,
}

/// Lists the sandboxes and containers labelled with `pod_uid` and reads their statuses.
/// Objects that vanish between the list and the status call are skipped. An exited container's
/// status `message` gets its termination message ([`termination::fill_messages`]).
pub async fn runtime_pod_status(rt: &dyn RuntimeService, pod_uid: &str) -> Result<RuntimeSnapshot> {
    let selector: HashMap<String, String> =
        [(LABEL_POD_UID.to_string(), pod_uid.to_string())].into();
    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        })
        .await?;
    let mut sandboxes = Vec::new();
    for sb in listed.items {
        match rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sb.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => sandboxes.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await?;
    let mut containers = Vec::new();
    for c in listed.containers {
        match rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => containers.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    // Exited containers: what they left in their termination message file (or log).
    termination::fill_messages(&mut containers);
    Ok(RuntimeSnapshot {
        status: RuntimePodStatus::from_cri(&sandboxes, &containers),
        sandboxes,
        containers,
    })
}

/// The outcome of one [`sync_pod`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncResult {
    /// The sandbox the containers run in, if any.
    pub sandbox_id: Option<String>,
    /// Containers created and started, by name.
    pub started: Vec<String>,
    /// Containers that could not be started, by name: CrashLoopBackOff, ErrImagePull, ...
    pub waiting: HashMap<String, Waiting>,
    /// Failures of kill or sandbox steps (the next sync retries).
    pub errors: Vec<String>,
    /// When the pod wants to be synced again (the first back-off to end).
    pub requeue_after: Option<Duration>,
}

impl SyncResult {
    fn wait(&mut self, d: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(d, |w| w.min(d)));
    }

    /// The error the sync ends with, if anything could not be done: the first of the kill and
    /// sandbox failures, else the waiting containers by kind (as upstream's `SyncPod` result).
    pub fn error(&self) -> Option<SyncError> {
        if !self.errors.is_empty() {
            return Some(SyncError::Runtime(self.errors.join("; ")));
        }
        let mut waiting: Vec<(&String, &Waiting)> = self.waiting.iter().collect();
        waiting.sort_by_key(|(name, _)| name.as_str());
        let (name, w) = waiting.first()?;
        // A hook's message carries what the hook printed: the log line names the failure only.
        let text = if w.reason.is_hook() {
            format!(
                "failed to \"StartContainer\" for \"{name}\" with {}",
                w.reason
            )
        } else {
            format!(
                "failed to \"StartContainer\" for \"{name}\" with {}: \"{}\"",
                w.reason, w.message
            )
        };
        Some(match w.reason {
            r if r.is_image() => SyncError::Image(text),
            WaitingReason::CrashLoopBackOff => SyncError::BackOff(text),
            WaitingReason::CreateContainerConfigError => SyncError::Config(text),
            _ => SyncError::Runtime(text),
        })
    }
}

/// The effective pull policy of a container (see [`PullPolicy::of`]).
pub fn pull_policy(c: &Container) -> PullPolicy {
    PullPolicy::of(c)
}

/// How image pulls share the node: one at a time (`serializeImagePulls`, upstream's default),
/// at most N at once (`maxParallelImagePulls`), or unbounded. Pods that need no pull never wait.
#[derive(Clone)]
pub struct ImagePulls {
    limit: Option<Arc<Semaphore>>,
}

impl ImagePulls {
    /// `serialize`: one pull at a time; else at most `max_parallel` (unbounded when `None`).
    pub fn new(serialize: bool, max_parallel: Option<u32>) -> Self {
        let permits = if serialize { Some(1) } else { max_parallel };
        ImagePulls {
            limit: permits.map(|n| Arc::new(Semaphore::new(n.max(1) as usize))),
        }
    }
}

impl Default for ImagePulls {
    fn default() -> Self {
        ImagePulls::new(true, None)
    }
}

/// What a sync works with besides the pod: the runtime, the back-off states (each behind a
/// lock held for a lookup, never across a runtime call), the pull limiter and the event sink.
pub struct SyncContext<'a> {
    pub rt: &'a dyn RuntimeService,
    pub images: &'a dyn ImageService,
    pub opts: &'a ContainerOptions,
    /// CrashLoopBackOff per container.
    pub backoff: &'a Mutex<Backoff>,
    /// Pull back-off per (pod, image): ErrImagePull, then ImagePullBackOff.
    pub image_backoff: &'a Mutex<Backoff>,
    pub pulls: &'a ImagePulls,
    pub events: &'a dyn PodEvents,
    pub now: SystemTime,
}

/// The image back-off key of `image` for the pod `pod_uid`.
fn image_key(pod_uid: &str, image: &str) -> String {
    backoff::key(pod_uid, "image", image)
}

impl SyncContext<'_> {
    /// Makes sure the container's image is there as its pull policy says; the image's ref, or
    /// why the container waits (and for how long at least, in an image back-off).
    async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &cri::PodSandboxConfig,
    ) -> std::result::Result<String, (Waiting, Option<Duration>)> {
        let say = |kind: EventType, reason: Reason, message: String| {
            self.events.event(pod, Some(&c.name), kind, reason, message)
        };
        let image = c.image.clone().unwrap_or_default();
        let spec = cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let policy = pull_policy(c);
        if policy != PullPolicy::Always {
            let present = self
                .images
                .image_status(cri::ImageStatusRequest {
                    image: Some(spec.clone()),
                    verbose: false,
                })
                .await
                .map_err(|e| {
                    (
                        Waiting::new(WaitingReason::ImageInspectError, e.to_string()),
                        None,
                    )
                })?;
            if let Some(img) = present.image {
                say(
                    EventType::Normal,
                    Reason::PulledImage,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(img.id);
            }
            if policy == PullPolicy::Never {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                say(
                    EventType::Warning,
                    Reason::ErrImageNeverPull,
                    message.clone(),
                );
                return Err((
                    Waiting::new(WaitingReason::ErrImageNeverPull, message),
                    None,
                ));
            }
        }
        let uid = pod_identity(pod).0;
        let key = image_key(uid, &image);
        // A pull that failed recently is not tried again before its back-off ends.
        let held = lock(self.image_backoff).remaining(&key, self.now);
        if let Some(left) = held {
            let message = format!("Back-off pulling image {image:?}");
            say(EventType::Normal, Reason::BackOff, message.clone());
            return Err((
                Waiting::new(WaitingReason::ImagePullBackOff, message),
                Some(left),
            ));
        }
        say(
            EventType::Normal,
            Reason::PullingImage,
            format!("Pulling image {image:?}"),
        );
        let queued = std::time::Instant::now();
        let startup = &crate::metrics::get().pod_startup;
        startup.pull_started(uid, SystemTime::now());
        let _permit = match &self.pulls.limit {
            Some(sem) => Some(sem.clone().acquire_owned().await.map_err(|e| {
                (
                    Waiting::new(WaitingReason::ErrImagePull, e.to_string()),
                    None,
                )
            })?),
            None => None,
        };
        let began = std::time::Instant::now();
        // As upstream: without matching credentials one anonymous pull, else each in turn
        // until one succeeds (the errors of all when none does).
        let (ring, bad) = super::pull_secrets::Keyring::from_secrets(&self.opts.pull_secrets);
        for b in bad {
            tracing::warn!(pod = %crate::model::pod_full_name(pod), "unreadable image pull secret {b}");
        }
        let creds = ring.lookup(&super::pull_secrets::repository(&image));
        let mut pulled = Err(runtime::Error::internal("no pull attempted"));
        let mut errors = Vec::new();
        for auth in creds.into_iter().map(Some).chain(std::iter::once(None)) {
            let anonymous = auth.is_none();
            if anonymous && !errors.is_empty() {
                break;
            }
            pulled = self
                .images
                .pull_image(cri::PullImageRequest {
                    image: Some(spec.clone()),
                    auth,
                    sandbox_config: Some(sandbox.clone()),
                })
                .await;
            match &pulled {
                Ok(_) => break,
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.len() > 1 && pulled.is_err() {
            let code = pulled.as_ref().err().map(|e| e.code());
            pulled = Err(runtime::Error::new(
                code.unwrap_or(runtime::Code::Unknown),
                format!("[{}]", errors.join(", ")),
            ));
        }
        match pulled {
            Ok(r) => {
                startup.pull_finished(uid, SystemTime::now());
                lock(self.image_backoff).reset(&key);
                say(
                    EventType::Normal,
                    Reason::PulledImage,
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s ({:.3}s including waiting)",
                        began.elapsed().as_secs_f64(),
                        queued.elapsed().as_secs_f64()
                    ),
                );
                Ok(r.image_ref)
            }
            Err(e) => {
                lock(self.image_backoff).record_restart(&key, self.now);
                let message = e.to_string();
                say(
                    EventType::Warning,
                    Reason::Failed,
                    format!("Failed to pull image {image:?}: {message}"),
                );
                say(
                    EventType::Warning,
                    Reason::Failed,
                    "Error: ErrImagePull".into(),
                );
                let left = lock(self.image_backoff).delay(&key, self.now);
                Err((Waiting::new(WaitingReason::ErrImagePull, message), left))
            }
        }
    }
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

/// Carries out `actions` (computed from `snapshot`) for `pod`, like upstream's `SyncPod`.
pub async fn sync_pod(
    cx: &SyncContext<'_>,
    pod: &Pod,
    snapshot: &RuntimeSnapshot,
    actions: &PodActions,
) -> Result<SyncResult> {
    let rt = cx.rt;
    let spec = pod_spec(pod)?;
    let uid = pod_identity(pod).0.to_string();
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    // Regular init containers seen finished, for the startup SLI (which leaves their run out).
    for c in snapshot.status.containers.iter().filter(|c| {
        c.state == RunState::Exited
            && c.exit_code == 0
            && spec
                .init_containers
                .iter()
                .flatten()
                .any(|i| i.name == c.name && !is_sidecar(i))
    }) {
        if let Some(at) = c.finished_at {
            crate::metrics::get()
                .pod_startup
                .init_finished(&uid, &c.name, at);
        }
    }
    let mut res = SyncResult {
        waiting: actions.waiting.clone(),
        requeue_after: actions.wait,
        ..Default::default()
    };
    for (name, w) in &actions.waiting {
        if w.reason == WaitingReason::CrashLoopBackOff {
            cx.events.event(
                pod,
                Some(name),
                EventType::Warning,
                Reason::BackOff,
                format!(
                    "Back-off restarting failed container {name} in pod {}",
                    w.message.rsplit("pod=").next().unwrap_or_default()
                ),
            );
        }
    }

    if actions.kill_pod {
        if actions.create_sandbox && !snapshot.status.sandboxes.is_empty() {
            cx.events.event(
                pod,
                None,
                EventType::Normal,
                Reason::SandboxChanged,
                "Pod sandbox changed, it will be killed and re-created.".into(),
            );
        }
        let ip = pod_ip(pod, &snapshot.status, &cx.opts.host_ips);
        res.errors
            .extend(kill_pod(rt, cx.events, pod, &snapshot.status, grace, &ip).await);
    }
    let ip = pod_ip(pod, &snapshot.status, &cx.opts.host_ips);
    for k in &actions.kill_containers {
        let Some(c) = snapshot.status.containers.iter().find(|c| c.id == k.id) else {
            continue;
        };
        let grace = k.grace_secs.unwrap_or(grace);
        if let Err(e) = stop_one(rt, cx.events, pod, c, grace, Some(&k.message), &ip).await {
            res.errors.push(format!("{e} ({})", k.message));
        }
    }

    let mut sb_opts: SandboxOptions = cx.opts.sandbox.clone();
    let mut opts = cx.opts.clone();
    let sandbox_id = if actions.create_sandbox {
        sb_opts.attempt = actions.sandbox_attempt;
        let config = sandbox_config(pod, &sb_opts)?;
        let id = match rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        {
            Ok(r) => r.pod_sandbox_id,
            Err(e) => {
                cx.events.event(
                    pod,
                    None,
                    EventType::Warning,
                    Reason::FailedCreatePodSandbox,
                    format!("Failed to create pod sandbox: {e}"),
                );
                return Err(e);
            }
        };
        let st = rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await?;
        if let Some(net) = st
            .status
            .and_then(|s| s.network)
            .filter(|n| !n.ip.is_empty())
        {
            opts.pod_ips = std::iter::once(net.ip)
                .chain(net.additional_ips.into_iter().map(|p| p.ip))
                .collect();
        }
        id
    } else if let Some(id) = &actions.sandbox_id {
        let current = snapshot.status.sandboxes.iter().find(|s| &s.id == id);
        sb_opts.attempt = current.map_or(0, |s| s.attempt);
        if let Some(ip) = current.map(|s| s.ip.clone()).filter(|ip| !ip.is_empty()) {
            opts.pod_ips = vec![ip];
        }
        id.clone()
    } else {
        return Ok(res);
    };
    // A pod on the node's network has the node's addresses (`status.podIP(s)` in its env).
    if super::host_network(pod) {
        opts.pod_ips = opts.host_ips.clone();
    }
    res.sandbox_id = Some(sandbox_id.clone());
    let sandbox = sandbox_config(pod, &sb_opts)?;

    // Init containers in order, each only once the ones before it started; then the app
    // containers, each on its own.
    let steps = actions
        .start_init
        .iter()
        .map(|n| (n, true))
        .chain(actions.start_containers.iter().map(|n| (n, false)));
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
        match start_one(
            cx,
            pod,
            container,
            snapshot,
            &uid,
            &sandbox_id,
            &sandbox,
            &opts,
        )
        .await
        {
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

/// Pulls, creates and starts one container (upstream `startContainer`).
#[allow(clippy::too_many_arguments)] // the pod's identity, sandbox and options, each needed
async fn start_one(
    cx: &SyncContext<'_>,
    pod: &Pod,
    container: &Container,
    snapshot: &RuntimeSnapshot,
    uid: &str,
    sandbox_id: &str,
    sandbox: &cri::PodSandboxConfig,
    opts: &ContainerOptions,
) -> std::result::Result<(), (Waiting, Option<Duration>)> {
    let name = &container.name;
    let say = |kind: EventType, reason: Reason, message: String| {
        cx.events.event(pod, Some(name), kind, reason, message)
    };
    let previous = snapshot.status.latest(name);
    let restart_count = previous.map_or(0, |p| p.attempt + 1);
    let image_ref = cx.ensure_image(pod, container, sandbox).await?;
    // As upstream, `envFrom` keys that are no variable names are skipped, with an event.
    for message in super::env::invalid_env_from_keys(pod, container, &opts.env_objects) {
        say(
            EventType::Warning,
            Reason::InvalidEnvironmentVariableNames,
            message,
        );
    }
    // The reason's message is the error's own, as upstream's (`configmap "x" not found`).
    let mut config = container_config(pod, container, restart_count, opts).map_err(|e| {
        let w = Waiting::new(
            WaitingReason::CreateContainerConfigError,
            e.message().to_string(),
        );
        say(
            EventType::Warning,
            Reason::Failed,
            format!("Error: {}", e.message()),
        );
        (w, None)
    })?;
    if let Some(img) = config.image.as_mut().filter(|_| !image_ref.is_empty()) {
        img.image = image_ref;
    }
    // A restart (of a container that exited, or was just killed after an earlier one
    // exited) moves its back-off on, as upstream's doBackOff.
    if snapshot.status.last_exited(name).is_some() {
        lock(cx.backoff)
            .record_restart(&backoff::key(uid, name, &container_hash(container)), cx.now);
    }
    let failed = |reason: WaitingReason, e: Error| {
        say(EventType::Warning, Reason::Failed, format!("Error: {e}"));
        (Waiting::new(reason, e.to_string()), None)
    };
    let id = rt_create(cx.rt, sandbox_id, config, sandbox)
        .await
        .map_err(|e| failed(WaitingReason::CreateContainerError, e))?;
    say(
        EventType::Normal,
        Reason::CreatedContainer,
        format!("Created container: {name}"),
    );
    let kind = if is_init(pod, name) {
        "init_container"
    } else {
        "container"
    };
    let started = cx
        .rt
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await;
    crate::metrics::get().container_started(kind, started.is_ok());
    started.map_err(|e| failed(WaitingReason::RunContainerError, e))?;
    if kind == "init_container" && !is_sidecar(container) {
        crate::metrics::get()
            .pod_startup
            .init_started(uid, name, SystemTime::now());
    }
    say(
        EventType::Normal,
        Reason::StartedContainer,
        format!("Started container {name}"),
    );
    // The postStart hook runs before the next container starts; a failure kills the container
    // and its restart policy applies.
    let post_start = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    if let Some(hook) = post_start {
        let ip = opts.pod_ips.first().cloned().unwrap_or_default();
        if let Err(message) = super::hooks::run(cx.rt, pod, container, &id, hook, &ip).await {
            // The hook's message (with what the hook printed) goes to the container's status
            // only: events and logs name the failure, never the output, which may hold
            // secrets (upstream records the same words).
            say(
                EventType::Warning,
                Reason::FailedPostStartHook,
                "PostStartHook failed".into(),
            );
            say(
                EventType::Normal,
                Reason::KillingContainer,
                "FailedPostStartHook".into(),
            );
            let grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            if let Err(e) = cx
                .rt
                .stop_container(cri::StopContainerRequest {
                    container_id: id,
                    timeout: grace,
                })
                .await
            {
                tracing::warn!(container = %name, "stopping after a failed postStart hook: {e}");
            }
            return Err((
                Waiting::new(WaitingReason::PostStartHookError, message),
                None,
            ));
        }
    }
    Ok(())
}

/// Whether `name` is one of the pod's init containers.
fn is_init(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == name))
}

async fn rt_create(
    rt: &dyn RuntimeService,
    sandbox_id: &str,
    config: cri::ContainerConfig,
    sandbox: &cri::PodSandboxConfig,
) -> Result<String> {
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.to_string(),
        config: Some(config),
        sandbox_config: Some(sandbox.clone()),
    })
    .await
    .map(|r| r.container_id)
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
