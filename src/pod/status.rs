//! The API `PodStatus` of a pod from what the runtime reports (upstream
//! `convertToAPIContainerStatuses`, `getPhase` and `generate.go`).
//!
//! Container and init container statuses come from the pod's CRI container statuses (every
//! attempt): the newest gives the state, the one before it `lastState`, its attempt the restart
//! count. The kubelet's own knowledge enters through [`StatusContext`]: readiness and startup
//! probe results, waiting reasons of the last sync (CrashLoopBackOff, ErrImagePull, ...), the
//! node IPs and the previous status, whose condition transition times and start time are kept
//! while unchanged. Termination messages are cut to an even share of the pod's 12 KiB
//! ([`super::termination::truncate_to_pod_budget`]).

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runtime::cri;

use super::termination;
use super::{host_network, is_sidecar, qos_class, restart_policy};
use crate::model::{Phase, RestartPolicy, Waiting};

/// Which list a container is in, which decides how its readiness and restarts are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A regular init container: ready once it succeeded.
    Init,
    /// A sidecar (`restartPolicy: Always` init container): restarts whatever the pod's policy,
    /// ready while it runs (and its readiness probe passes).
    Sidecar,
    /// An app container.
    App,
}

/// What the kubelet knows beyond the runtime.
#[derive(Debug, Clone)]
pub struct StatusContext {
    /// Now (condition transitions, start time).
    pub now: SystemTime,
    /// The status last reported for the pod.
    pub previous: Option<PodStatus>,
    /// The node's IPs (hostIP(s), and podIP(s) of hostNetwork pods).
    pub host_ips: Vec<String>,
    /// The container ID scheme: `<runtime_name>://<id>`.
    pub runtime_name: String,
    /// Readiness probe results by container name; a running container without one is ready.
    pub readiness: HashMap<String, bool>,
    /// Startup probe results by container name; a running container without one has started.
    pub started: HashMap<String, bool>,
    /// Why containers the last sync could not start wait, by name.
    pub waiting: HashMap<String, Waiting>,
}

impl Default for StatusContext {
    fn default() -> Self {
        StatusContext {
            now: SystemTime::now(),
            previous: None,
            host_ips: Vec::new(),
            runtime_name: "nodelet".into(),
            readiness: HashMap::new(),
            started: HashMap::new(),
            waiting: HashMap::new(),
        }
    }
}

fn time_ns(ns: i64) -> Option<Time> {
    (ns > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(ns)).ok().map(Time))
        .flatten()
}

pub fn time_of(t: SystemTime) -> Option<Time> {
    let ns = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Timestamp::from_nanosecond(i128::try_from(ns).ok()?)
        .ok()
        .map(Time)
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

fn state_of(c: &cri::ContainerStatus, container_id: &str) -> ContainerState {
    match cri::ContainerState::try_from(c.state) {
        Ok(cri::ContainerState::ContainerRunning) => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time_ns(c.started_at),
            }),
            ..Default::default()
        },
        Ok(cri::ContainerState::ContainerExited) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(container_id.to_string()),
                exit_code: c.exit_code,
                reason: Some(c.reason.clone()).filter(|r| !r.is_empty()),
                message: Some(c.message.clone()).filter(|m| !m.is_empty()),
                started_at: time_ns(c.started_at),
                finished_at: time_ns(c.finished_at),
                signal: None,
            }),
            ..Default::default()
        },
        Ok(cri::ContainerState::ContainerCreated) => waiting("ContainerCreating", ""),
        _ => waiting("", ""),
    }
}

fn exited_ok(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

fn container_status(
    spec: &Container,
    ours: &[&cri::ContainerStatus],
    default_reason: &str,
    kind: Kind,
    policy: RestartPolicy,
    ctx: &StatusContext,
) -> ContainerStatus {
    let id_of = |c: &cri::ContainerStatus| format!("{}://{}", ctx.runtime_name, c.id);
    let mut st = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        ..Default::default()
    };
    let Some(cur) = ours.first() else {
        st.state = Some(match ctx.waiting.get(&spec.name) {
            Some(w) => waiting(w.reason.as_str(), &w.message),
            None => waiting(default_reason, ""),
        });
        st.started = Some(false);
        return st;
    };
    st.container_id = Some(id_of(cur));
    st.image_id = cur.image_ref.clone();
    if let Some(img) = cur.image.as_ref().filter(|i| !i.image.is_empty()) {
        st.image = img.user_specified_image.clone();
        if st.image.is_empty() {
            st.image = img.image.clone();
        }
    }
    st.restart_count =
        i32::try_from(cur.metadata.as_ref().map_or(0, |m| m.attempt)).unwrap_or(i32::MAX);
    let mut state = state_of(cur, &id_of(cur));
    st.last_state = ours.get(1).map(|p| state_of(p, &id_of(p)));
    if let Some(w) = ctx.waiting.get(&spec.name) {
        if let Some(term) = state.terminated.as_ref() {
            // The run that ended is the last state; the container waits to run again.
            let restarts = match kind {
                Kind::Sidecar => true,
                Kind::Init => policy != RestartPolicy::Never,
                Kind::App => policy.restarts(term.exit_code),
            };
            if restarts {
                st.last_state = Some(state.clone());
                state = waiting(w.reason.as_str(), &w.message);
            }
        } else if state.waiting.is_some() {
            // Created but not started: the start failed.
            state = waiting(w.reason.as_str(), &w.message);
        }
    }
    let running = state.running.is_some();
    st.state = Some(state);
    match kind {
        Kind::Init => {
            st.ready = exited_ok(&st);
            st.started = Some(running);
        }
        Kind::Sidecar | Kind::App => {
            let started = running && ctx.started.get(&spec.name).copied().unwrap_or(true);
            st.started = Some(started);
            st.ready = started && ctx.readiness.get(&spec.name).copied().unwrap_or(true);
        }
    }
    st
}

/// The pod phase (upstream `getPhase`) from the API container statuses. Sidecars keep a pod
/// pending until they started, and never make it Running or keep it from ending: a pod whose
/// app containers finished under `Never`/`OnFailure` ends whatever its sidecars do.
pub fn phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> Phase {
    let policy = restart_policy(pod);
    let init_specs = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let sidecar = |name: &str| init_specs.iter().any(|c| c.name == name && is_sidecar(c));
    fn failed_before(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
        s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
    }
    let (mut pending_init, mut failed_init) = (0, 0);
    for s in init {
        let st = s.state.clone().unwrap_or_default();
        if sidecar(&s.name) {
            // Pending until it started once (a sidecar that restarts does not hold the pod).
            let started_once = st.running.is_some() || failed_before(s).is_some();
            if !started_once && st.terminated.is_none() {
                pending_init += 1;
            }
            continue;
        }
        if let Some(t) = &st.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if st.waiting.is_some() && failed_before(s).is_some_and(|t| t.exit_code != 0) {
            failed_init += 1;
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.waiting.is_some() {
            if failed_before(s).is_some() {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return Phase::Failed;
    }
    if pending_init > 0 || failed_init > 0 || waiting_n > 0 {
        return Phase::Pending;
    }
    if running > 0 && unknown == 0 {
        return Phase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            RestartPolicy::Always => Phase::Running,
            _ if stopped == succeeded => Phase::Succeeded,
            RestartPolicy::Never => Phase::Failed,
            RestartPolicy::OnFailure => Phase::Running,
        };
    }
    Phase::Pending
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    ctx: &StatusContext,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = ctx
        .previous
        .as_ref()
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status));
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: previous
            .and_then(|p| p.last_transition_time.clone())
            .or_else(|| time_of(ctx.now)),
        ..Default::default()
    }
}

fn names_where(
    statuses: &[ContainerStatus],
    pred: impl Fn(&ContainerStatus) -> bool,
) -> Vec<String> {
    statuses
        .iter()
        .filter(|s| pred(s))
        .map(|s| s.name.clone())
        .collect()
}

/// Why the pod's readiness gates are not met (upstream's messages), from the conditions in its
/// status as the API server has it.
fn unmet_readiness_gates(pod: &Pod) -> Vec<String> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_deref());
    gates
        .unwrap_or(&[])
        .iter()
        .filter_map(|g| {
            let t = &g.condition_type;
            match conditions.iter().find(|c| &c.type_ == t) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {t:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {t:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect()
}

/// The API status of `pod` from its newest sandbox and all its CRI container statuses.
pub fn pod_status(
    pod: &Pod,
    sandbox: Option<&cri::PodSandboxStatus>,
    containers: &[cri::ContainerStatus],
    ctx: &StatusContext,
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let statuses = Statuses::of(pod, &spec, containers, ctx);
    let phase = phase(pod, &statuses.init, &statuses.app);
    let conditions = pod_conditions(pod, sandbox, &statuses, phase, ctx);
    let previous = ctx.previous.as_ref();
    let pod_ips = pod_ips(pod, sandbox, ctx);
    let Statuses { init, app, .. } = statuses;
    let mut status = PodStatus {
        phase: Some(phase.as_str().into()),
        conditions: Some(conditions),
        host_ip: ctx.host_ips.first().cloned(),
        host_ips: (!ctx.host_ips.is_empty()).then(|| {
            ctx.host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect()
        }),
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: previous
            .and_then(|p| p.start_time.clone())
            .or_else(|| time_of(ctx.now)),
        qos_class: Some(qos_class(pod).into()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        ..Default::default()
    };
    let count = spec.init_containers.as_ref().map_or(0, Vec::len) + spec.containers.len();
    termination::truncate_to_pod_budget(&mut status, count);
    status
}

/// The pod's container statuses, and how far its initialization got.
struct Statuses {
    init: Vec<ContainerStatus>,
    app: Vec<ContainerStatus>,
    /// The sidecars' statuses (they count in the pod's readiness).
    sidecars: Vec<ContainerStatus>,
    /// Init containers not done while the pod is not initialized.
    incomplete: Vec<String>,
}

impl Statuses {
    fn of(
        pod: &Pod,
        spec: &k8s_openapi::api::core::v1::PodSpec,
        containers: &[cri::ContainerStatus],
        ctx: &StatusContext,
    ) -> Self {
        let policy = restart_policy(pod);
        let mut sorted: Vec<&cri::ContainerStatus> = containers.iter().collect();
        let attempt = |c: &cri::ContainerStatus| c.metadata.as_ref().map_or(0, |m| m.attempt);
        sorted.sort_by_key(|c| std::cmp::Reverse((c.created_at, attempt(c))));
        let of = |name: &str| -> Vec<&cri::ContainerStatus> {
            sorted
                .iter()
                .copied()
                .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
                .collect()
        };
        let init_specs = spec.init_containers.as_deref().unwrap_or_default();
        let is_sidecar_named =
            |name: &str| init_specs.iter().any(|c| c.name == name && is_sidecar(c));
        let init: Vec<ContainerStatus> = init_specs
            .iter()
            .map(|c| {
                let kind = if is_sidecar(c) {
                    Kind::Sidecar
                } else {
                    Kind::Init
                };
                container_status(c, &of(&c.name), "PodInitializing", kind, policy, ctx)
            })
            .collect();
        // Initialized: every regular init container succeeded, every sidecar started.
        let init_done = |s: &ContainerStatus| {
            if is_sidecar_named(&s.name) {
                s.started == Some(true)
            } else {
                exited_ok(s)
            }
        };
        // Once an app container ran, the pod stays initialized (a sidecar restarting later
        // does not take it back), as upstream.
        let app_ran = spec.containers.iter().any(|c| !of(&c.name).is_empty());
        let initialized = app_ran || init.iter().all(init_done);
        let app_default = if init_specs.is_empty() || initialized {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        let app = spec
            .containers
            .iter()
            .map(|c| container_status(c, &of(&c.name), app_default, Kind::App, policy, ctx))
            .collect();
        let incomplete = if initialized {
            Vec::new()
        } else {
            names_where(&init, |s| !init_done(s))
        };
        let sidecars = init
            .iter()
            .filter(|s| is_sidecar_named(&s.name))
            .cloned()
            .collect();
        Statuses {
            init,
            app,
            sidecars,
            incomplete,
        }
    }
}

/// The pod's conditions: PodReadyToStartContainers, Initialized, Ready (with its readiness
/// gates), ContainersReady and PodScheduled.
fn pod_conditions(
    pod: &Pod,
    sandbox: Option<&cri::PodSandboxStatus>,
    st: &Statuses,
    phase: Phase,
    ctx: &StatusContext,
) -> Vec<PodCondition> {
    let sandbox_ready =
        sandbox.is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
    // Sidecars count in the pod's readiness, as upstream.
    let mut unready = names_where(&st.sidecars, |s| !s.ready);
    unready.extend(names_where(&st.app, |s| !s.ready));
    let completed = phase == Phase::Succeeded;
    let containers_ready = unready.is_empty() && !completed;
    let (ready_reason, ready_message) = if completed {
        (Some("PodCompleted"), None)
    } else if !unready.is_empty() {
        let message = format!("containers with unready status: [{}]", unready.join(" "));
        (Some("ContainersNotReady"), Some(message))
    } else {
        (None, None)
    };
    // Ready also needs the pod's readiness gates: conditions others set on the pod.
    let gates = if containers_ready {
        unmet_readiness_gates(pod)
    } else {
        Vec::new()
    };
    let ready = containers_ready && gates.is_empty();
    let (pod_ready_reason, pod_ready_message) = if gates.is_empty() {
        (ready_reason, ready_message.clone())
    } else {
        (Some("ReadinessGatesNotReady"), Some(gates.join(", ")))
    };
    let incomplete = &st.incomplete;
    let init_reason = if completed && !st.init.is_empty() {
        Some("PodCompleted")
    } else {
        (!incomplete.is_empty()).then_some("ContainersNotInitialized")
    };
    let init_message = (!incomplete.is_empty()).then(|| {
        format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        )
    });
    vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None, ctx),
        condition(
            "Initialized",
            incomplete.is_empty(),
            init_reason,
            init_message,
            ctx,
        ),
        condition("Ready", ready, pod_ready_reason, pod_ready_message, ctx),
        condition(
            "ContainersReady",
            containers_ready,
            ready_reason,
            ready_message,
            ctx,
        ),
        condition("PodScheduled", true, None, None, ctx),
    ]
}

/// A sandbox's IPs as the pod's, as upstream sorts them: the first of the node's primary
/// family (its first node IP's; IPv4 when it has none), then the first of the other family;
/// others are left out.
pub(crate) fn sort_pod_ips(ips: impl Iterator<Item = String>, host_ips: &[String]) -> Vec<String> {
    let ips: Vec<(String, bool)> = ips
        .filter_map(|ip| {
            let v6 = ip.parse::<std::net::IpAddr>().ok()?.is_ipv6();
            Some((ip, v6))
        })
        .collect();
    let primary_v6 = host_ips
        .first()
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6());
    [primary_v6, !primary_v6]
        .into_iter()
        .filter_map(|v6| ips.iter().find(|(_, f)| *f == v6).map(|(ip, _)| ip.clone()))
        .collect()
}

/// The pod's IPs: the node's for a hostNetwork pod, else its sandbox's, else (no sandbox
/// now) the ones it had.
fn pod_ips(pod: &Pod, sandbox: Option<&cri::PodSandboxStatus>, ctx: &StatusContext) -> Vec<String> {
    if host_network(pod) {
        return ctx.host_ips.clone();
    }
    let net = sandbox
        .and_then(|s| s.network.as_ref())
        .filter(|n| !n.ip.is_empty());
    if let Some(net) = net {
        return sort_pod_ips(
            std::iter::once(net.ip.clone()).chain(net.additional_ips.iter().map(|p| p.ip.clone())),
            &ctx.host_ips,
        );
    }
    let previous = ctx.previous.as_ref().and_then(|p| p.pod_ips.as_ref());
    previous
        .into_iter()
        .flatten()
        .map(|p| p.ip.clone())
        .collect()
}

#[cfg(test)]
mod tests;
