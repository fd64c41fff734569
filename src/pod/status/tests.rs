//! Table tests of [`super`] (`pod::status`).

use super::*;
use crate::model::WaitingReason;
use crate::pod::spec::tests::pod;
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};

const S: i64 = 1_000_000_000;

fn cs(
    name: &str,
    attempt: u32,
    state: cri::ContainerState,
    exit_code: i32,
) -> cri::ContainerStatus {
    let base = i64::from(attempt) * 100 * S + 1000 * S;
    cri::ContainerStatus {
        id: format!("{name}{attempt}"),
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt,
        }),
        state: state as i32,
        created_at: base,
        started_at: if state == cri::ContainerState::ContainerCreated {
            0
        } else {
            base + S
        },
        finished_at: if state == cri::ContainerState::ContainerExited {
            base + 2 * S
        } else {
            0
        },
        exit_code,
        reason: if state == cri::ContainerState::ContainerExited {
            "Error".into()
        } else {
            String::new()
        },
        image: Some(cri::ImageSpec {
            image: "sha256:abc".into(),
            user_specified_image: "busybox".into(),
            ..Default::default()
        }),
        image_ref: "docker.io/library/busybox@sha256:abc".into(),
        ..Default::default()
    }
}

fn ready_sandbox(ip: &str) -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: "sb".into(),
        state: cri::PodSandboxState::SandboxReady as i32,
        network: Some(cri::PodSandboxNetworkStatus {
            ip: ip.into(),
            additional_ips: vec![cri::PodIp {
                ip: "fd00::5".into(),
            }],
        }),
        ..Default::default()
    }
}

fn ctx() -> StatusContext {
    StatusContext {
        now: UNIX_EPOCH + Duration::from_secs(5000),
        host_ips: vec!["192.168.1.2".into()],
        ..Default::default()
    }
}

fn p(policy: &str, init: &[&str], apps: &[&str]) -> Pod {
    let c = |n: &&str| json!({"name": n, "image": "busybox"});
    pod(json!({"restartPolicy": policy,
        "initContainers": init.iter().map(c).collect::<Vec<_>>(),
        "containers": apps.iter().map(c).collect::<Vec<_>>()}))
}

fn cond(s: &PodStatus, t: &str) -> (String, Option<String>) {
    let c = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .expect("condition");
    (c.status.clone(), c.reason.clone())
}

fn reason(s: &ContainerStatus) -> Option<String> {
    s.state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone())
}

use cri::ContainerState::{
    ContainerCreated as Created, ContainerExited as Exited, ContainerRunning as Running,
};

#[test]
fn running_pod() {
    let pd = p("Always", &[], &["a"]);
    let st = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("a", 0, Exited, 1), cs("a", 1, Running, 0)],
        &ctx(),
    );
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(st.pod_ips.as_ref().map(Vec::len), Some(2));
    assert_eq!(st.host_ip.as_deref(), Some("192.168.1.2"));
    assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    assert!(st.start_time.is_some());
    let c = &st.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!(c.container_id.as_deref(), Some("nodelet://a1"));
    assert_eq!(c.restart_count, 1);
    assert!(c.ready && c.started == Some(true));
    assert_eq!(c.image, "busybox");
    assert_eq!(c.image_id, "docker.io/library/busybox@sha256:abc");
    assert!(
        c.state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .is_some()
    );
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("last terminated");
    assert_eq!(
        (
            last.exit_code,
            last.reason.as_deref(),
            last.container_id.as_deref()
        ),
        (1, Some("Error"), Some("nodelet://a0"))
    );
    for t in [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ] {
        assert_eq!(cond(&st, t).0, "True", "{t}");
    }
}

#[test]
fn phase_table() {
    // (policy, app containers (state, exit), want)
    type Case = (&'static str, Vec<(cri::ContainerState, i32)>, &'static str);
    let cases: [Case; 9] = [
        ("Always", vec![], "Pending"),
        ("Always", vec![(Created, 0)], "Pending"),
        ("Always", vec![(Running, 0)], "Running"),
        ("Always", vec![(Exited, 0)], "Running"),
        ("OnFailure", vec![(Exited, 0)], "Succeeded"),
        ("OnFailure", vec![(Exited, 1)], "Running"),
        ("Never", vec![(Exited, 1)], "Failed"),
        ("Never", vec![(Exited, 0)], "Succeeded"),
        ("Never", vec![(Exited, 0), (Running, 0)], "Running"),
    ];
    for (policy, states, want) in cases {
        let names: Vec<String> = (0..states.len().max(1)).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let pd = p(policy, &[], &refs);
        let containers: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(i, (s, e))| cs(&names[i], 0, *s, *e))
            .collect();
        let st = pod_status(&pd, Some(&ready_sandbox("10.0.0.5")), &containers, &ctx());
        assert_eq!(st.phase.as_deref(), Some(want), "{policy} {states:?}");
    }
}

#[test]
fn init_containers() {
    let pd = p("Always", &["i1", "i2"], &["a"]);
    let st = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("i1", 0, Exited, 0), cs("i2", 0, Running, 0)],
        &ctx(),
    );
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let init = st.init_container_statuses.clone().expect("init statuses");
    assert!(init[0].ready && !init[1].ready);
    assert_eq!(
        cond(&st, "Initialized"),
        ("False".into(), Some("ContainersNotInitialized".into()))
    );
    let app = &st.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!(reason(app).as_deref(), Some("PodInitializing"));

    let never = p("Never", &["i1"], &["a"]);
    let st = pod_status(
        &never,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("i1", 0, Exited, 1)],
        &ctx(),
    );
    assert_eq!(st.phase.as_deref(), Some("Failed"));

    let st = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("i1", 0, Exited, 0), cs("i2", 0, Exited, 0)],
        &ctx(),
    );
    assert_eq!(cond(&st, "Initialized").0, "True");
    assert_eq!(
        reason(&st.container_statuses.as_ref().expect("statuses")[0]).as_deref(),
        Some("ContainerCreating")
    );
}

#[test]
fn waiting_reasons_from_ctx() {
    let pd = p("Always", &[], &["a", "b"]);
    let mut c = ctx();
    c.waiting.insert(
        "a".into(),
        Waiting::new(
            WaitingReason::CrashLoopBackOff,
            "back-off 20s restarting failed container",
        ),
    );
    c.waiting.insert(
        "b".into(),
        Waiting::new(WaitingReason::ErrImagePull, "not found"),
    );
    let st = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("a", 2, Exited, 1)],
        &c,
    );
    let statuses = st.container_statuses.clone().expect("statuses");
    assert_eq!(reason(&statuses[0]).as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(
        statuses[0]
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(1)
    );
    assert_eq!(statuses[0].restart_count, 2);
    assert_eq!(reason(&statuses[1]).as_deref(), Some("ErrImagePull"));
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(
        cond(&st, "ContainersReady"),
        ("False".into(), Some("ContainersNotReady".into()))
    );
    let msg = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .and_then(|c| c.message.clone());
    assert_eq!(
        msg.as_deref(),
        Some("containers with unready status: [a b]")
    );
}

#[test]
fn readiness_and_host_network() {
    let mut pd = p("Always", &[], &["a"]);
    if let Some(s) = pd.spec.as_mut() {
        s.host_network = Some(true);
    }
    let mut c = ctx();
    c.readiness.insert("a".into(), false);
    let st = pod_status(&pd, Some(&ready_sandbox("")), &[cs("a", 0, Running, 0)], &c);
    assert_eq!(st.pod_ip.as_deref(), Some("192.168.1.2"));
    assert!(!st.container_statuses.as_ref().expect("statuses")[0].ready);
    assert_eq!(cond(&st, "Ready").0, "False");
    assert_eq!(st.phase.as_deref(), Some("Running"));
}

#[test]
fn transition_times_preserved() {
    let pd = p("Always", &[], &["a"]);
    let first = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("a", 0, Running, 0)],
        &ctx(),
    );
    let mut later = ctx();
    later.now += Duration::from_secs(60);
    later.previous = Some(first.clone());
    // Ready stays True: time kept. Container dies: Ready flips, time moves.
    let same = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("a", 0, Running, 0)],
        &later,
    );
    let time = |s: &PodStatus, t: &str| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .and_then(|c| c.last_transition_time.clone())
    };
    assert_eq!(time(&same, "Ready"), time(&first, "Ready"));
    assert_eq!(same.start_time, first.start_time);
    let changed = pod_status(
        &pd,
        Some(&ready_sandbox("10.0.0.5")),
        &[cs("a", 0, Exited, 1)],
        &later,
    );
    assert_ne!(time(&changed, "Ready"), time(&first, "Ready"));
    assert_eq!(time(&changed, "PodScheduled"), time(&first, "PodScheduled"));
    // No sandbox: not ready to start containers, previous pod IPs kept.
    let gone = pod_status(&pd, None, &[], &later);
    assert_eq!(cond(&gone, "PodReadyToStartContainers").0, "False");
    assert_eq!(gone.pod_ip.as_deref(), Some("10.0.0.5"));
    let c = &gone.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!(reason(c).as_deref(), Some("ContainerCreating"));
}

#[test]
fn started_gates_ready_and_readiness_gates_gate_the_pod() {
    let mut pd = p("Always", &[], &["a"]);
    let running = [cs("a", 0, Running, 0)];
    let sb = ready_sandbox("10.0.0.5");
    // A startup probe that has not passed: not started, so not ready either.
    let mut c = ctx();
    c.started.insert("a".into(), false);
    let st = pod_status(&pd, Some(&sb), &running, &c);
    let a = &st.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!((a.started, a.ready), (Some(false), false));
    // Started and ready: the pod is Ready, until a readiness gate is not met.
    if let Some(s) = pd.spec.as_mut() {
        s.readiness_gates = Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
    }
    let st = pod_status(&pd, Some(&sb), &running, &ctx());
    assert_eq!(cond(&st, "ContainersReady").0, "True");
    assert_eq!(
        cond(&st, "Ready"),
        ("False".into(), Some("ReadinessGatesNotReady".into()))
    );
    let msg = |st: &PodStatus| {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.message.clone())
    };
    assert_eq!(
        msg(&st).as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    let gate = |status: &str| PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "example.com/lb".into(),
            status: status.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    pd.status = Some(gate("False"));
    let st = pod_status(&pd, Some(&sb), &running, &ctx());
    assert_eq!(
        msg(&st).as_deref(),
        Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False")
    );
    pd.status = Some(gate("True"));
    let st = pod_status(&pd, Some(&sb), &running, &ctx());
    assert_eq!(cond(&st, "Ready"), ("True".into(), None));
}

#[test]
fn pod_ips_are_sorted_by_the_nodes_primary_family() {
    let ips = || {
        ["fd00::7", "10.0.0.7", "10.0.0.8", "fd00::8", "bogus"]
            .into_iter()
            .map(String::from)
    };
    assert_eq!(
        super::sort_pod_ips(ips(), &[]),
        vec!["10.0.0.7", "fd00::7"],
        "IPv4 first when the node has no IP"
    );
    assert_eq!(
        super::sort_pod_ips(ips(), &["192.168.1.2".into(), "fd00::1".into()]),
        vec!["10.0.0.7", "fd00::7"]
    );
    assert_eq!(
        super::sort_pod_ips(ips(), &["fd00::1".into(), "192.168.1.2".into()]),
        vec!["fd00::7", "10.0.0.7"],
        "the family of the first node IP first"
    );
    assert_eq!(
        super::sort_pod_ips(["fd00::9".to_string()].into_iter(), &["10.1.1.1".into()]),
        vec!["fd00::9"],
        "a single-stack IPv6 pod on an IPv4 node"
    );
}
