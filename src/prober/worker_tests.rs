//! The prober's decisions in paused tokio time, counted in probe attempts: thresholds, the
//! startup gate, the hold after a liveness failure, the initial delay, the jitter and the
//! period, events, the end of a worker, and the manager's view.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod,
    PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::worker::{Shared, StatusSource, Worker};
use super::*;
use crate::api::events::Recorded;

#[derive(Default)]
struct Statuses(Mutex<Option<PodStatus>>);

impl StatusSource for Statuses {
    fn pod_status(&self, _uid: &str) -> Option<PodStatus> {
        self.0.lock().expect("lock").clone()
    }
}

/// Answers attempts from a script (then the last answer again), counting them.
#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Attempt>>,
    last: Mutex<Option<Attempt>>,
    calls: Mutex<usize>,
}

impl Script {
    fn push(&self, a: &[Attempt]) {
        self.answers.lock().expect("lock").extend(a.iter().cloned());
    }
    fn calls(&self) -> usize {
        *self.calls.lock().expect("lock")
    }
}

#[async_trait::async_trait]
impl Prober for Script {
    async fn probe(&self, _: &Probe, _: Duration, t: &Target<'_>) -> Attempt {
        assert_eq!(t.pod_ip, "10.0.0.9", "probes aim at the pod IP");
        *self.calls.lock().expect("lock") += 1;
        let next = self.answers.lock().expect("lock").pop_front();
        let mut last = self.last.lock().expect("lock");
        if let Some(n) = next {
            *last = Some(n);
        }
        last.clone()
            .unwrap_or_else(|| Attempt::Success(String::new()))
    }
}

struct Fixture {
    statuses: Arc<Statuses>,
    script: Arc<Script>,
    events: Arc<Recorded>,
    shared: Shared,
    updates: mpsc::UnboundedReceiver<Update>,
    pod: Arc<Pod>,
}

fn fixture(probes: serde_json::Value) -> Fixture {
    let mut container = json!({"name": "app", "image": "busybox"});
    if let (Some(c), Some(p)) = (container.as_object_mut(), probes.as_object()) {
        c.extend(p.clone());
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
        "spec": {"containers": [container]},
    }))
    .expect("pod");
    let (tx, updates) = mpsc::unbounded_channel();
    let statuses = Arc::new(Statuses::default());
    let script = Arc::new(Script::default());
    let events = Arc::new(Recorded::default());
    let shared = Shared {
        prober: script.clone(),
        statuses: statuses.clone(),
        results: Arc::new(ResultsManager::new(tx)),
        events: events.clone(),
    };
    Fixture {
        statuses,
        script,
        events,
        shared,
        updates,
        pod: Arc::new(pod),
    }
}

fn time_ago(d: Duration) -> Time {
    let at = runtime::clock::now() - d;
    let ns = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos();
    Time(k8s_openapi::jiff::Timestamp::from_nanosecond(ns as i128).expect("time"))
}

impl Fixture {
    /// The container `id` running since `ago`, `started` as the status says.
    fn running(&self, id: &str, ago: Duration, started: bool) {
        *self.statuses.0.lock().expect("lock") = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.9".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some(format!("nodelet://{id}")),
                started: Some(started),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(time_ago(ago)),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
    }

    fn worker(&self, kind: ProbeKind) -> Worker {
        let c = self.pod.spec.as_ref().expect("spec").containers[0].clone();
        let probe = kind.of(&c).cloned().expect("probe");
        Worker::new(self.shared.clone(), self.pod.clone(), c, kind, probe)
    }

    fn results(&mut self) -> Vec<ProbeResult> {
        let mut out = Vec::new();
        while let Ok(u) = self.updates.try_recv() {
            out.push(u.result);
        }
        out
    }
}

fn fail(s: &str) -> Attempt {
    Attempt::Failure(s.into())
}

fn ok() -> Attempt {
    Attempt::Success(String::new())
}

#[tokio::test(start_paused = true)]
async fn thresholds_count_consecutive_attempts() {
    let mut f = fixture(json!({"readinessProbe": {"exec": {"command": ["true"]},
        "successThreshold": 2, "failureThreshold": 3}}));
    f.running("c1", Duration::from_secs(60), true);
    let mut w = f.worker(ProbeKind::Readiness);
    f.script.push(&[
        ok(),
        fail("x"),
        ok(),
        ok(),
        fail("a"),
        fail("b"),
        ok(),
        fail("c"),
        fail("d"),
        fail("e"),
    ]);
    let mut seen = Vec::new();
    for _ in 0..10 {
        assert!(w.do_probe().await);
        seen.push(f.results());
    }
    use ProbeResult::*;
    // The initial "not ready" at the first look; ready after two successes in a row; not
    // ready after three failures in a row, not before.
    let expect: Vec<Vec<ProbeResult>> = vec![
        vec![Failure],
        vec![],
        vec![],
        vec![Success],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![Failure],
    ];
    assert_eq!(seen, expect);
    assert_eq!(f.script.calls(), 10);
    assert_eq!(
        f.shared.results.get("c1", ProbeKind::Readiness),
        Some(Failure)
    );
    let events = f.events.pairs();
    assert_eq!(events.len(), 6, "an Unhealthy event per failed attempt");
    assert_eq!(
        events[0],
        (
            "Unhealthy".to_string(),
            "Readiness probe failed: x".to_string()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn the_startup_probe_gates_the_others_and_ends_with_the_start() {
    let mut f = fixture(json!({
        "livenessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}}}));
    f.running("c1", Duration::from_secs(60), false);
    let mut live = f.worker(ProbeKind::Liveness);
    let mut startup = f.worker(ProbeKind::Startup);
    for _ in 0..3 {
        assert!(live.do_probe().await);
    }
    assert_eq!(f.script.calls(), 0, "no liveness attempt before the start");
    assert_eq!(f.results(), [ProbeResult::Success], "alive by default");
    assert!(startup.do_probe().await);
    assert_eq!(f.script.calls(), 1);
    assert_eq!(
        f.results(),
        [ProbeResult::Unknown, ProbeResult::Success],
        "unknown until the first attempt passed"
    );
    // The status now says started: the startup probe stops, liveness goes.
    f.running("c1", Duration::from_secs(60), true);
    assert!(startup.do_probe().await);
    assert_eq!(f.script.calls(), 1);
    assert!(live.do_probe().await);
    assert_eq!(f.script.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_liveness_failure_holds_until_the_container_is_replaced() {
    let mut f = fixture(json!({"livenessProbe": {"exec": {"command": ["true"]},
        "failureThreshold": 2}}));
    f.running("c1", Duration::from_secs(60), true);
    let mut w = f.worker(ProbeKind::Liveness);
    f.script.push(&[fail("dead"), fail("dead"), ok()]);
    assert!(w.do_probe().await);
    assert!(w.do_probe().await);
    assert_eq!(f.results(), [ProbeResult::Success, ProbeResult::Failure]);
    for _ in 0..5 {
        assert!(w.do_probe().await);
    }
    assert_eq!(
        f.script.calls(),
        2,
        "no attempt while the container is being killed"
    );
    // Its replacement starts over: alive, probed again.
    f.running("c2", Duration::from_secs(60), true);
    assert!(w.do_probe().await);
    assert_eq!(f.script.calls(), 3);
    assert_eq!(f.results(), [ProbeResult::Success]);
    assert_eq!(f.shared.results.get("c1", ProbeKind::Liveness), None);
    assert_eq!(
        f.shared.results.get("c2", ProbeKind::Liveness),
        Some(ProbeResult::Success)
    );
}

#[tokio::test(start_paused = true)]
async fn the_initial_delay_counts_from_the_containers_start() {
    let f = fixture(json!({"readinessProbe": {"exec": {"command": ["true"]},
        "initialDelaySeconds": 30}}));
    f.running("c1", Duration::from_secs(10), true);
    let mut w = f.worker(ProbeKind::Readiness);
    assert!(w.do_probe().await);
    tokio::time::advance(Duration::from_secs(19)).await;
    assert!(w.do_probe().await);
    assert_eq!(f.script.calls(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(w.do_probe().await);
    assert_eq!(f.script.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn warnings_pass_with_an_event_and_errors_count_neither_way() {
    let mut f = fixture(json!({"readinessProbe": {"httpGet": {"port": 80}}}));
    f.running("c1", Duration::from_secs(60), true);
    let mut w = f.worker(ProbeKind::Readiness);
    f.script.push(&[
        Attempt::Error("no route".into()),
        Attempt::Error("no route".into()),
        Attempt::Error("no route".into()),
        Attempt::Warning("Probe terminated redirects, Response body: x".into()),
    ]);
    assert!(w.do_probe().await);
    assert_eq!(f.script.calls(), 3, "an error is tried three times");
    assert_eq!(
        f.results(),
        [ProbeResult::Failure],
        "only the initial result"
    );
    assert!(w.do_probe().await);
    assert_eq!(f.results(), [ProbeResult::Success]);
    let events = f.events.pairs();
    assert_eq!(
        events,
        [
            (
                "Unhealthy".to_string(),
                "Readiness probe errored: no route".to_string()
            ),
            (
                "ProbeWarning".to_string(),
                "Readiness probe warning: Probe terminated redirects, Response body: x".to_string()
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_probes_once_a_period_after_a_jitter_and_ends_with_the_pod() {
    let f = fixture(json!({"readinessProbe": {"exec": {"command": ["true"]},
        "periodSeconds": 10}}));
    f.running("c1", Duration::from_secs(60), true);
    let stop = CancellationToken::new();
    let task = tokio::spawn(f.worker(ProbeKind::Readiness).run(stop.clone()));
    // Within the first period (the jitter is less than one), then one per period.
    tokio::time::sleep(Duration::from_millis(10_001)).await;
    assert_eq!(f.script.calls(), 1);
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(f.script.calls(), 6);
    // A pod that ended stops its workers; their results go.
    let mut st = f.statuses.pod_status("u-1").expect("status");
    st.phase = Some("Succeeded".into());
    *f.statuses.0.lock().expect("lock") = Some(st);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(task.is_finished());
    assert_eq!(f.shared.results.get("c1", ProbeKind::Readiness), None);
    assert_eq!(f.script.calls(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_will_not_run_again_ends_its_worker() {
    let f = fixture(json!({"restartPolicy": "Never",
        "readinessProbe": {"exec": {"command": ["true"]}}}));
    let mut pod = (*f.pod).clone();
    if let Some(s) = pod.spec.as_mut() {
        s.restart_policy = Some("Never".into());
    }
    *f.statuses.0.lock().expect("lock") = Some(PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some("nodelet://c1".into()),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let c = pod.spec.as_ref().expect("spec").containers[0].clone();
    let probe = c.readiness_probe.clone().expect("probe");
    let mut w = Worker::new(
        f.shared.clone(),
        Arc::new(pod),
        c,
        ProbeKind::Readiness,
        probe,
    );
    assert!(!w.do_probe().await);
    assert_eq!(f.script.calls(), 0);
    assert_eq!(
        f.shared.results.get("c1", ProbeKind::Readiness),
        Some(ProbeResult::Failure)
    );
}

#[tokio::test(start_paused = true)]
async fn the_manager_starts_workers_once_and_reports_a_view() {
    let f = fixture(json!({
        "livenessProbe": {"exec": {"command": ["true"]}},
        "readinessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}}}));
    let (tx, _rx) = mpsc::unbounded_channel();
    let m = ProbeManager::new(
        f.script.clone(),
        f.statuses.clone(),
        f.events.clone(),
        tx,
        CancellationToken::new(),
    );
    m.add_pod(&f.pod);
    m.add_pod(&f.pod);
    assert_eq!(m.workers(), 3);
    let status = crate::pod::RuntimePodStatus {
        sandboxes: vec![],
        containers: vec![crate::pod::ContainerInfo {
            id: "c1".into(),
            name: "app".into(),
            attempt: 0,
            state: crate::pod::RunState::Running,
            exit_code: 0,
            created_at: 1,
            finished_at: None,
            hash: String::new(),
        }],
    };
    let v = m.view(&f.pod, &status);
    assert_eq!(v.readiness.get("app"), Some(&false), "no result: not ready");
    assert_eq!(v.started.get("app"), Some(&false));
    assert!(v.not_started.contains("c1") && v.failed.is_empty());
    m.results()
        .set("u-1", "c1", ProbeKind::Startup, ProbeResult::Success);
    m.results()
        .set("u-1", "c1", ProbeKind::Readiness, ProbeResult::Success);
    m.results()
        .set("u-1", "c1", ProbeKind::Liveness, ProbeResult::Failure);
    let v = m.view(&f.pod, &status);
    assert_eq!(v.readiness.get("app"), Some(&true));
    assert_eq!(v.started.get("app"), Some(&true));
    assert!(v.not_started.is_empty());
    assert_eq!(v.failed.get("c1"), Some(&ProbeKind::Liveness));
    m.remove_pod("u-1");
    assert_eq!(m.workers(), 0);
}

#[test]
fn validation_follows_the_api_servers_rules() {
    let c = |v: serde_json::Value| -> k8s_openapi::api::core::v1::Container {
        let mut base = json!({"name": "app", "image": "busybox"});
        if let (Some(b), Some(p)) = (base.as_object_mut(), v.as_object()) {
            b.extend(p.clone());
        }
        serde_json::from_value(base).expect("container")
    };
    let check = |v| validate_container("spec.containers[0]", &c(v), false).map_err(|e| e.0);
    assert!(check(json!({"livenessProbe": {"exec": {"command": ["true"]}}})).is_ok());
    assert_eq!(
        check(json!({"livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2}})),
        Err("spec.containers[0].livenessProbe.successThreshold: must be 1".into())
    );
    assert!(
        check(json!({"readinessProbe": {"exec": {"command": ["true"]}, "successThreshold": 2}}))
            .is_ok()
    );
    assert_eq!(
        check(json!({"startupProbe": {}})),
        Err("spec.containers[0].startupProbe: must specify a handler type".into())
    );
    assert_eq!(
        check(json!({"readinessProbe": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}})),
        Err("spec.containers[0].readinessProbe: may not specify more than 1 handler type".into())
    );
    assert!(
        check(json!({"lifecycle": {"preStop": {"sleep": {"seconds": 0}}}})).is_ok(),
        "a zero sleep is allowed"
    );
    assert!(
        validate_container(
            "spec.initContainers[0]",
            &c(json!({"readinessProbe": {"exec": {"command": ["true"]}}})),
            true
        )
        .is_err()
    );
    let p = ProbeParams::of(&Probe::default());
    assert_eq!(
        (
            p.period,
            p.timeout,
            p.success_threshold,
            p.failure_threshold
        ),
        (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
    );
}
