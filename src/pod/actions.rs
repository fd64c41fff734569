//! What to do to bring a pod's containers in line with its spec (upstream `computePodActions`).
//!
//! [`RuntimePodStatus`] is what the runtime reports for one pod (its sandboxes and containers,
//! built from CRI `PodSandboxStatus`/`ContainerStatus`); [`compute_pod_actions`] compares it with
//! the pod spec and returns [`PodActions`]: kill and recreate the sandbox when none is ready, more
//! than one is, or its network mode changed (then every container is started again per the
//! restart policy); otherwise run the init containers in order (sidecars, the init containers
//! with `restartPolicy: Always`, started and kept running; the others one at a time to
//! completion); then start the app containers that should run, restart those whose spec hash
//! changed, kill those not in the spec, and hold back containers in CrashLoopBackOff (`waiting`,
//! and `wait` for when the first back-off ends).

pub use crate::model::{ContainerInfo, RunState, RuntimePodStatus, SandboxInfo, is_sidecar};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::backoff::{self, Backoff};
use super::hash::hash_matches;
use super::{container_hash, host_network, restart_policy};
use crate::model::PodRef;
use crate::model::{RestartPolicy, Waiting, WaitingReason};
use crate::prober::ProbeView;

/// A container to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillContainer {
    /// Its runtime ID.
    pub id: String,
    /// The `Killing` event's message (`Container app failed liveness probe, will be
    /// restarted`).
    pub message: String,
    /// Its grace period when not the pod's (a probe's `terminationGracePeriodSeconds`).
    pub grace_secs: Option<i64>,
}

impl KillContainer {
    fn new(id: &str, message: String) -> Self {
        KillContainer {
            id: id.to_string(),
            message,
            grace_secs: None,
        }
    }
}

/// The decisions of one sync of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox(es) first.
    pub kill_pod: bool,
    /// Create a new sandbox (after `kill_pod`).
    pub create_sandbox: bool,
    /// The attempt of the new sandbox.
    pub sandbox_attempt: u32,
    /// The ready sandbox to use when none is created.
    pub sandbox_id: Option<String>,
    /// Containers to stop.
    pub kill_containers: Vec<KillContainer>,
    /// Init containers to start, in order: sidecars (`restartPolicy: Always`) that are not
    /// running, then at most one regular init container. Each starts only once the ones
    /// before it started.
    pub start_init: Vec<String>,
    /// App containers to start, in spec order (after `start_init`).
    pub start_containers: Vec<String>,
    /// Containers held back by their CrashLoopBackOff, with the waiting reason to show.
    pub waiting: HashMap<String, Waiting>,
    /// Sync again after this long (a container's back-off ends then).
    pub wait: Option<Duration>,
    /// Running containers (id, name) whose resources are updated in place (a resize).
    pub update_resources: Vec<(String, String)>,
}

/// What a running container needs to run with its allocated resources (see
/// `kubelet::allocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeNeed {
    /// `UpdateContainerResources`.
    Update,
    /// A restart: a resource that changed has `resizePolicy` `RestartContainer`.
    Restart,
}

/// Adds a resize's actions (upstream's part of `computePodActions` for in-place resize): each
/// running container in `needs` is updated in place, or restarted when its resize policy says
/// so; nothing is done for a pod whose sandbox goes, or a container already being restarted
/// (it starts again with its new resources).
pub fn add_resize_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    needs: &HashMap<String, ResizeNeed>,
    a: &mut PodActions,
) {
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    if a.kill_pod || a.create_sandbox || needs.is_empty() {
        return;
    }
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    for (c, sidecar) in sidecars
        .map(|c| (c, true))
        .chain(spec.containers.iter().map(|c| (c, false)))
    {
        let Some(need) = needs.get(&c.name) else {
            continue;
        };
        let Some(l) = status
            .latest(&c.name)
            .filter(|l| l.state == RunState::Running)
        else {
            continue;
        };
        if a.kill_containers.iter().any(|k| k.id == l.id) {
            continue;
        }
        match need {
            ResizeNeed::Update => a.update_resources.push((l.id.clone(), c.name.clone())),
            ResizeNeed::Restart => {
                a.kill_containers.push(KillContainer::new(
                    &l.id,
                    format!("Container {} resize requires restart", c.name),
                ));
                if sidecar {
                    a.start_init.push(c.name.clone());
                } else {
                    a.start_containers.push(c.name.clone());
                }
            }
        }
    }
}

/// Whether a container whose newest instance is `latest` should be (re)started under `policy`
/// (upstream `ShouldContainerBeRestarted`).
fn should_start(latest: Option<&ContainerInfo>, policy: RestartPolicy) -> bool {
    let Some(c) = latest else { return true };
    match c.state {
        RunState::Running => false,
        RunState::Created | RunState::Unknown => true,
        RunState::Exited => policy.restarts(c.exit_code),
    }
}

fn succeeded(c: &ContainerInfo) -> bool {
    c.state == RunState::Exited && c.exit_code == 0
}

/// Decides whether `c` (whose newest instance is `latest`) may start now. `Err` holds the
/// time left in its CrashLoopBackOff and the waiting state to show meanwhile.
fn check_backoff(
    who: &PodRef,
    c: &Container,
    latest: Option<&ContainerInfo>,
    backoff: &Backoff,
    now: SystemTime,
) -> Result<(), (Duration, Waiting)> {
    let Some(finished) = latest
        .filter(|l| l.state == RunState::Exited)
        .and_then(|l| l.finished_at)
    else {
        return Ok(());
    };
    let key = backoff::key(&who.uid, &c.name, &container_hash(c));
    let Some(left) = backoff.next_start(&key, finished, now) else {
        return Ok(());
    };
    let delay = backoff.delay(&key, now).unwrap_or(left);
    let message = format!(
        "back-off {} restarting failed container={} pod={}",
        crate::util::go_duration(delay),
        c.name,
        who.desc()
    );
    Err((left, Waiting::new(WaitingReason::CrashLoopBackOff, message)))
}

impl PodActions {
    fn hold(&mut self, name: &str, (left, waiting): (Duration, Waiting)) {
        self.wait = Some(self.wait.map_or(left, |w| w.min(left)));
        self.waiting.insert(name.to_string(), waiting);
    }
}

/// What every decision of one [`compute_pod_actions`] looks at besides the runtime's view.
struct Decide<'a> {
    who: &'a PodRef,
    policy: RestartPolicy,
    backoff: &'a Backoff,
    now: SystemTime,
    probes: &'a ProbeView,
}

impl Decide<'_> {
    fn backoff(
        &self,
        c: &Container,
        latest: Option<&ContainerInfo>,
    ) -> Result<(), (Duration, Waiting)> {
        check_backoff(self.who, c, latest, self.backoff, self.now)
    }

    /// The kill a failed liveness or startup probe asks for the running container `l` of
    /// `c`, if any; `restart` says whether it will be started again.
    fn probe_kill(&self, c: &Container, l: &ContainerInfo, restart: bool) -> Option<KillContainer> {
        let kind = self.probes.failed.get(&l.id)?;
        let probe = kind.of(c);
        let mut message = format!(
            "Container {} failed {} probe",
            c.name,
            kind.label().to_lowercase()
        );
        if restart {
            message.push_str(", will be restarted");
        }
        Some(KillContainer {
            id: l.id.clone(),
            message,
            grace_secs: probe.and_then(|p| p.termination_grace_period_seconds),
        })
    }
}

/// The init containers' part of [`compute_pod_actions`]. Returns whether the app containers
/// may be looked at: every regular init container succeeded and every sidecar before them is
/// running or about to start.
fn init_actions(
    d: &Decide<'_>,
    init: &[Container],
    status: &RuntimePodStatus,
    initialized: bool,
    a: &mut PodActions,
) -> bool {
    let policy = d.policy;
    for c in init {
        let latest = status.latest(&c.name);
        if is_sidecar(c) {
            let exited = status.last_exited(&c.name);
            if let Some(l) = latest.filter(|l| l.state == RunState::Running) {
                if !l.hash.is_empty() && !hash_matches(&l.hash, c) {
                    a.kill_containers.push(KillContainer::new(
                        &l.id,
                        format!(
                            "Init container {} definition changed, will be restarted",
                            c.name
                        ),
                    ));
                    a.start_init.push(c.name.clone());
                } else if let Some(kill) = d.probe_kill(c, l, true) {
                    // Killed now; started again once its back-off allows.
                    a.kill_containers.push(kill);
                    match d.backoff(c, exited) {
                        Ok(()) => a.start_init.push(c.name.clone()),
                        Err(hold) => a.hold(&c.name, hold),
                    }
                    if !initialized {
                        return false;
                    }
                } else if !initialized && d.probes.not_started.contains(&l.id) {
                    // The init containers after it wait for its startup probe.
                    return false;
                }
                continue;
            }
            // A sidecar restarts whenever it is not running, whatever the pod's policy.
            match d.backoff(c, latest) {
                Ok(()) => {
                    a.start_init.push(c.name.clone());
                    if !initialized && c.startup_probe.is_some() {
                        // The next ones start once its startup probe passed.
                        return false;
                    }
                }
                Err(hold) => {
                    a.hold(&c.name, hold);
                    if !initialized {
                        // The init containers after it wait for it.
                        return false;
                    }
                }
            }
            continue;
        }
        if initialized {
            // Regular init containers run once, before the app containers.
            continue;
        }
        match latest {
            Some(l) if succeeded(l) => continue,
            Some(l) if l.state == RunState::Running => return false,
            Some(l) if l.state == RunState::Exited && policy == RestartPolicy::Never => {
                // A failed init container fails the pod.
                a.kill_pod = true;
                a.start_init.clear();
                a.waiting.clear();
                return false;
            }
            _ => {}
        }
        match d.backoff(c, latest) {
            Ok(()) => a.start_init.push(c.name.clone()),
            Err(hold) => a.hold(&c.name, hold),
        }
        return false;
    }
    true
}

/// Computes what to do for `pod` given what the runtime reports, without probe results.
pub fn compute_pod_actions(
    pod: &Pod,
    who: &PodRef,
    status: &RuntimePodStatus,
    backoff: &Backoff,
    now: SystemTime,
) -> PodActions {
    compute_pod_actions_with(pod, who, status, backoff, now, &ProbeView::default())
}

/// Computes what to do for `pod` given what the runtime reports and its probe results: a
/// container that failed its liveness or startup probe is killed and started again as the
/// restart policy says (sidecars always), after its back-off; a sidecar whose startup probe has
/// not passed holds back the init containers after it.
pub fn compute_pod_actions_with(
    pod: &Pod,
    who: &PodRef,
    status: &RuntimePodStatus,
    backoff: &Backoff,
    now: SystemTime,
    probes: &ProbeView,
) -> PodActions {
    let mut a = PodActions::default();
    let Some(spec) = pod.spec.as_ref() else {
        return a;
    };
    let policy = restart_policy(pod);
    let d = Decide {
        who,
        policy,
        backoff,
        now,
        probes,
    };
    let init: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);

    // Sandbox: exactly one ready sandbox, newest, in the right network mode.
    let newest = status.sandboxes.first();
    let ready_count = status.sandboxes.iter().filter(|s| s.ready).count();
    let sandbox_changed = match newest {
        None => true,
        Some(s) => {
            // Unlike upstream, a sandbox without an IP is kept: the built-in runtime may run
            // pods with loopback networking only.
            ready_count != 1 || !s.ready || s.host_network != host_network(pod)
        }
    };
    if sandbox_changed {
        new_sandbox_actions(&d, spec, status, &mut a);
        return a;
    }
    a.sandbox_id = newest.map(|s| s.id.clone());

    // Containers the spec does not know.
    for c in &status.containers {
        let known = init
            .iter()
            .chain(spec.containers.iter())
            .any(|s| s.name == c.name);
        if !known && c.state == RunState::Running {
            a.kill_containers.push(KillContainer::new(
                &c.id,
                format!("Container {} is not in the pod spec", c.name),
            ));
        }
    }

    // Init containers: sidecars started (and kept running), regular ones in order, each to
    // completion, until an app container has been created (upstream's "initialized").
    let initialized = spec
        .containers
        .iter()
        .any(|c| status.latest(&c.name).is_some());
    if !init_actions(&d, init, status, initialized, &mut a) {
        return a;
    }
    app_actions(&d, spec, status, &mut a);
    a
}

/// The actions when the pod needs a new sandbox: the old one killed, and everything started
/// afresh in the new one (the init containers first), unless the pod ran and must not be
/// restarted, or nothing is left to start.
fn new_sandbox_actions(d: &Decide, spec: &PodSpec, status: &RuntimePodStatus, a: &mut PodActions) {
    let newest = status.sandboxes.first();
    a.kill_pod = !status.sandboxes.is_empty() || !status.containers.is_empty();
    a.create_sandbox = true;
    a.sandbox_attempt = newest.map_or(0, |s| s.attempt + 1);
    if d.policy == RestartPolicy::Never && a.sandbox_attempt != 0 && !status.containers.is_empty() {
        // The pod ran and must not be restarted.
        a.create_sandbox = false;
        return;
    }
    let init: &[Container] = spec.init_containers.as_deref().unwrap_or(&[]);
    let fresh = RuntimePodStatus::default();
    if !init_actions(d, init, &fresh, false, a) {
        return;
    }
    a.start_containers = spec
        .containers
        .iter()
        .filter(|c| {
            !(d.policy == RestartPolicy::OnFailure && status.latest(&c.name).is_some_and(succeeded))
        })
        .map(|c| c.name.clone())
        .collect();
    if a.start_containers.is_empty() {
        a.create_sandbox = false;
        a.start_init.clear();
    }
}

/// The app containers' actions: a running one restarted when its spec changed or a probe
/// failed, a stopped one started as the restart policy and its back-off say; the pod killed
/// once every app container is done for good.
fn app_actions(d: &Decide, spec: &PodSpec, status: &RuntimePodStatus, a: &mut PodActions) {
    let policy = d.policy;
    let mut keep = 0;
    for c in &spec.containers {
        let latest = status.latest(&c.name);
        if let Some(l) = latest.filter(|l| l.state == RunState::Running) {
            if !l.hash.is_empty() && !hash_matches(&l.hash, c) {
                // Started again whatever the restart policy: its spec changed (as upstream).
                a.kill_containers.push(KillContainer::new(
                    &l.id,
                    format!("Container {} definition changed, will be restarted", c.name),
                ));
                a.start_containers.push(c.name.clone());
            } else if let Some(kill) = d.probe_kill(c, l, policy != RestartPolicy::Never) {
                a.kill_containers.push(kill);
                if policy != RestartPolicy::Never {
                    match d.backoff(c, status.last_exited(&c.name)) {
                        Ok(()) => a.start_containers.push(c.name.clone()),
                        Err(hold) => a.hold(&c.name, hold),
                    }
                    keep += 1;
                }
            } else {
                keep += 1;
            }
            continue;
        }
        if !should_start(latest, policy) {
            continue;
        }
        match d.backoff(c, latest) {
            Ok(()) => a.start_containers.push(c.name.clone()),
            Err(hold) => {
                a.hold(&c.name, hold);
                keep += 1; // it will be started later: keep the sandbox
            }
        }
    }
    if keep == 0 && a.start_containers.is_empty() {
        // Every app container is done for good: the pod is finished, its sidecars with it.
        a.kill_pod = true;
        a.start_init.clear();
        a.waiting.clear();
        a.wait = None;
    }
}

#[cfg(test)]
mod tests;
