//! The API `PodStatus` of a pod from what the runtime reports (upstream
//! `convertToAPIContainerStatuses`, `getPhase` and `generate.go`).
//!
//! Container and init container statuses come from the pod's CRI container statuses (every
//! attempt): the newest gives the state, the one before it `lastState`, its attempt the restart
//! count. The kubelet's own knowledge enters through [`StatusContext`]: readiness and startup
//! probe results, waiting reasons of the last sync (CrashLoopBackOff, ErrImagePull, ...), the
//! node IPs and the previous status, whose condition transition times and start time are kept
//! while unchanged.

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use runtime::cri;

use super::{host_network, qos_class, restart_policy};

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
    /// Waiting (reason, message) of containers the last sync could not start, by name.
    pub waiting: HashMap<String, (String, String)>,
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

fn time_of(t: SystemTime) -> Option<Time> {
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
    is_init: bool,
    policy: &str,
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
            Some((reason, message)) => waiting(reason, message),
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
    if let (Some(term), Some((reason, message))) =
        (state.terminated.as_ref(), ctx.waiting.get(&spec.name))
    {
        let restarts = match policy {
            "Never" => false,
            "OnFailure" => term.exit_code != 0,
            _ => true,
        };
        if restarts {
            st.last_state = Some(state.clone());
            state = waiting(reason, message);
        }
    }
    let running = state.running.is_some();
    st.state = Some(state);
    if is_init {
        st.ready = exited_ok(&st);
        st.started = Some(running);
    } else {
        let started = running && ctx.started.get(&spec.name).copied().unwrap_or(true);
        st.started = Some(started);
        st.ready = started && ctx.readiness.get(&spec.name).copied().unwrap_or(true);
    }
    st
}

/// The pod phase (upstream `getPhase`) from the API container statuses.
pub fn phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> &'static str {
    let policy = restart_policy(pod);
    let (mut pending_init, mut failed_init) = (0, 0);
    for s in init {
        let st = s.state.clone().unwrap_or_default();
        if let Some(t) = &st.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if st.waiting.is_some()
            && s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some_and(|t| t.exit_code != 0)
        {
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
            if s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some()
            {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 || waiting_n > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
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

/// The API status of `pod` from its newest sandbox and all its CRI container statuses.
pub fn pod_status(
    pod: &Pod,
    sandbox: Option<&cri::PodSandboxStatus>,
    containers: &[cri::ContainerStatus],
    ctx: &StatusContext,
) -> PodStatus {
    let policy = restart_policy(pod);
    let spec = pod.spec.clone().unwrap_or_default();
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
    let init_specs = spec.init_containers.clone().unwrap_or_default();
    let init: Vec<ContainerStatus> = init_specs
        .iter()
        .map(|c| container_status(c, &of(&c.name), "PodInitializing", true, policy, ctx))
        .collect();
    let initialized = init.iter().all(exited_ok);
    let app_default = if init_specs.is_empty() || initialized {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let app: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, &of(&c.name), app_default, false, policy, ctx))
        .collect();
    let phase = phase(pod, &init, &app);

    let sandbox_ready =
        sandbox.is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
    let incomplete = names_where(&init, |s| !exited_ok(s));
    let unready = names_where(&app, |s| !s.ready);
    let completed = phase == "Succeeded";
    let ready = unready.is_empty() && !completed;
    let (ready_reason, ready_message) = if completed {
        (Some("PodCompleted"), None)
    } else if !unready.is_empty() {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    } else {
        (None, None)
    };
    let conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None, ctx),
        condition(
            "Initialized",
            incomplete.is_empty(),
            if completed && !init.is_empty() {
                Some("PodCompleted")
            } else {
                (!incomplete.is_empty()).then_some("ContainersNotInitialized")
            },
            (!incomplete.is_empty()).then(|| {
                format!(
                    "containers with incomplete status: [{}]",
                    incomplete.join(" ")
                )
            }),
            ctx,
        ),
        condition("Ready", ready, ready_reason, ready_message.clone(), ctx),
        condition("ContainersReady", ready, ready_reason, ready_message, ctx),
        condition("PodScheduled", true, None, None, ctx),
    ];

    let previous = ctx.previous.as_ref();
    let pod_ips: Vec<String> = if host_network(pod) {
        ctx.host_ips.clone()
    } else if let Some(net) = sandbox
        .and_then(|s| s.network.as_ref())
        .filter(|n| !n.ip.is_empty())
    {
        std::iter::once(net.ip.clone())
            .chain(net.additional_ips.iter().map(|p| p.ip.clone()))
            .collect()
    } else {
        previous
            .and_then(|p| p.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|p| p.ip.clone())
            .collect()
    };
    PodStatus {
        phase: Some(phase.into()),
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
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
