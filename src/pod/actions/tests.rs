//! Table tests of [`super`] (`pod::actions`).

use super::*;
use crate::model::ANNOTATION_CONTAINER_HASH;
use crate::model::WaitingReason;
use crate::pod::spec::tests::pod;
use runtime::cri;
use serde_json::json;
use std::time::UNIX_EPOCH;

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

fn sandbox(id: &str, attempt: u32, ready: bool) -> SandboxInfo {
    SandboxInfo {
        id: id.into(),
        attempt,
        ready,
        created_at: i64::from(attempt) + 1,
        host_network: false,
        ip: "10.0.0.2".into(),
    }
}

struct Setup {
    pod: Pod,
}

impl Setup {
    fn new(policy: &str, init: &[&str], apps: &[&str]) -> Self {
        let c = |n: &&str| json!({"name": n, "image": "busybox"});
        Setup {
            pod: pod(json!({"restartPolicy": policy,
                "initContainers": init.iter().map(c).collect::<Vec<_>>(),
                "containers": apps.iter().map(c).collect::<Vec<_>>()})),
        }
    }

    fn hash(&self, name: &str) -> String {
        let spec = self.pod.spec.as_ref().expect("spec");
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|c| c.name == name)
            .map(container_hash)
            .unwrap_or_default()
    }

    /// A container: (name, attempt, state, exit code), finished at t(10 * attempt + 5).
    fn c(&self, name: &str, attempt: u32, state: RunState, exit_code: i32) -> ContainerInfo {
        ContainerInfo {
            id: format!("{name}-{attempt}"),
            name: name.into(),
            attempt,
            state,
            exit_code,
            created_at: i64::from(attempt) * 10 + 100,
            finished_at: (state == RunState::Exited).then(|| t(u64::from(attempt) * 10 + 5)),
            hash: self.hash(name),
        }
    }

    fn actions(&self, sandboxes: Vec<SandboxInfo>, containers: Vec<ContainerInfo>) -> PodActions {
        let mut status = RuntimePodStatus {
            sandboxes,
            containers,
        };
        status
            .containers
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        compute_pod_actions(
            &self.pod,
            &PodRef::of(&self.pod),
            &status,
            &Backoff::default(),
            t(1000),
        )
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn new_pod_creates_sandbox_and_starts_everything() {
    let s = Setup::new("Always", &[], &["a", "b"]);
    let a = s.actions(vec![], vec![]);
    assert_eq!(
        a,
        PodActions {
            create_sandbox: true,
            sandbox_attempt: 0,
            start_containers: names(&["a", "b"]),
            ..Default::default()
        }
    );
    let s = Setup::new("Always", &["i1", "i2"], &["a"]);
    let a = s.actions(vec![], vec![]);
    assert_eq!(
        (
            a.create_sandbox,
            a.start_init.clone(),
            a.start_containers.len()
        ),
        (true, names(&["i1"]), 0)
    );
}

#[test]
fn dead_sandbox_is_recreated_with_next_attempt() {
    let s = Setup::new("Always", &[], &["a"]);
    let a = s.actions(
        vec![sandbox("sb1", 1, false)],
        vec![s.c("a", 0, RunState::Exited, 137)],
    );
    assert!(a.kill_pod && a.create_sandbox);
    assert_eq!(a.sandbox_attempt, 2);
    assert_eq!(a.start_containers, names(&["a"]));

    // OnFailure: containers that succeeded are not started again in the new sandbox.
    let s = Setup::new("OnFailure", &[], &["ok", "bad"]);
    let a = s.actions(
        vec![sandbox("sb1", 0, false)],
        vec![
            s.c("ok", 0, RunState::Exited, 0),
            s.c("bad", 0, RunState::Exited, 1),
        ],
    );
    assert_eq!(
        (a.create_sandbox, a.start_containers.clone()),
        (true, names(&["bad"]))
    );

    // Never: a pod that ran is not restarted.
    let s = Setup::new("Never", &[], &["a"]);
    let a = s.actions(
        vec![sandbox("sb1", 0, false)],
        vec![s.c("a", 0, RunState::Exited, 1)],
    );
    assert!(a.kill_pod && !a.create_sandbox && a.start_containers.is_empty());

    // Two ready sandboxes, or a network mode change: start over.
    let s = Setup::new("Always", &[], &["a"]);
    let a = s.actions(
        vec![sandbox("sb2", 1, true), sandbox("sb1", 0, true)],
        vec![],
    );
    assert!(a.kill_pod && a.create_sandbox && a.sandbox_attempt == 2);
    let mut host = sandbox("sb1", 0, true);
    host.host_network = true;
    let a = s.actions(vec![host], vec![s.c("a", 0, RunState::Running, 0)]);
    assert!(a.kill_pod && a.create_sandbox && a.sandbox_attempt == 1);
}

#[test]
fn app_containers_by_restart_policy() {
    // (policy, state, exit, want started)
    let cases = [
        ("Always", RunState::Exited, 0, true),
        ("Always", RunState::Exited, 1, true),
        ("OnFailure", RunState::Exited, 0, false),
        ("OnFailure", RunState::Exited, 2, true),
        ("Never", RunState::Exited, 1, false),
        ("Never", RunState::Created, 0, true),
        ("Always", RunState::Running, 0, false),
        ("Always", RunState::Unknown, 0, true),
    ];
    for (policy, state, exit, want) in cases {
        let s = Setup::new(policy, &[], &["a", "b"]);
        let a = s.actions(
            vec![sandbox("sb", 0, true)],
            vec![s.c("a", 0, state, exit), s.c("b", 0, RunState::Running, 0)],
        );
        assert_eq!(
            a.start_containers.contains(&"a".to_string()),
            want,
            "{policy} {state:?} {exit}"
        );
        assert!(!a.create_sandbox && !a.kill_pod);
        assert_eq!(a.sandbox_id.as_deref(), Some("sb"));
    }
}

#[test]
fn pod_done_kills_sandbox() {
    let s = Setup::new("Never", &[], &["a"]);
    let a = s.actions(
        vec![sandbox("sb", 0, true)],
        vec![s.c("a", 0, RunState::Exited, 0)],
    );
    assert!(a.kill_pod && !a.create_sandbox);
}

#[test]
fn hash_change_and_unknown_containers() {
    let s = Setup::new("Always", &[], &["a"]);
    let mut stale = s.c("a", 0, RunState::Running, 0);
    stale.hash = "0000000000000000".into();
    let mut extra = s.c("gone", 0, RunState::Running, 0);
    extra.hash = String::new();
    let a = s.actions(vec![sandbox("sb", 0, true)], vec![stale, extra]);
    let killed: Vec<&str> = a.kill_containers.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(killed, ["gone-0", "a-0"]);
    assert_eq!(
        a.kill_containers[1].message,
        "Container a definition changed, will be restarted"
    );
    assert_eq!(a.start_containers, names(&["a"]));
    assert!(!a.kill_pod);
    // A changed container starts again whatever the restart policy, as upstream.
    let s = Setup::new("Never", &[], &["a"]);
    let mut stale = s.c("a", 0, RunState::Running, 0);
    stale.hash = "x".into();
    let a = s.actions(vec![sandbox("sb", 0, true)], vec![stale]);
    assert_eq!((a.kill_containers.len(), a.start_containers.len()), (1, 1));
}

fn with_probe(mut s: Setup, name: &str, kind: &str, probe: serde_json::Value) -> Setup {
    let spec = s.pod.spec.as_mut().expect("spec");
    let c = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
        .find(|c| c.name == name)
        .expect("container");
    let p = serde_json::from_value(probe).expect("probe");
    match kind {
        "liveness" => c.liveness_probe = Some(p),
        "startup" => c.startup_probe = Some(p),
        _ => c.readiness_probe = Some(p),
    }
    s
}

fn probed(
    s: &Setup,
    containers: Vec<ContainerInfo>,
    view: &ProbeView,
    backoff: &Backoff,
) -> PodActions {
    let mut status = RuntimePodStatus {
        sandboxes: vec![sandbox("sb", 0, true)],
        containers,
    };
    status
        .containers
        .sort_by_key(|c| std::cmp::Reverse(c.created_at));
    compute_pod_actions_with(&s.pod, &PodRef::of(&s.pod), &status, backoff, t(1000), view)
}

#[test]
fn a_failed_liveness_probe_kills_and_restarts_per_policy() {
    let probe = json!({"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 7});
    let s = with_probe(
        Setup::new("Always", &[], &["a", "b"]),
        "a",
        "liveness",
        probe.clone(),
    );
    let mut view = ProbeView::default();
    view.failed
        .insert("a-0".into(), crate::prober::ProbeKind::Liveness);
    let running = || {
        vec![
            s.c("a", 0, RunState::Running, 0),
            s.c("b", 0, RunState::Running, 0),
        ]
    };
    let a = probed(&s, running(), &view, &Backoff::default());
    assert_eq!(
        a.kill_containers,
        [KillContainer {
            id: "a-0".into(),
            message: "Container a failed liveness probe, will be restarted".into(),
            grace_secs: Some(7),
        }]
    );
    assert_eq!(a.start_containers, names(&["a"]));
    assert!(!a.kill_pod);
    // A container without results is left alone.
    let a = probed(&s, running(), &ProbeView::default(), &Backoff::default());
    assert!(a.kill_containers.is_empty() && a.start_containers.is_empty());

    // After an earlier run exited, the restart waits for its back-off (CrashLoopBackOff).
    let mut backoff = Backoff::default();
    let key = backoff::key(&PodRef::of(&s.pod).uid, "a", &s.hash("a"));
    backoff.record_restart(&key, t(995));
    let mut again = running();
    again[0] = s.c("a", 1, RunState::Running, 0);
    let mut killed_before = s.c("a", 0, RunState::Exited, 137);
    killed_before.finished_at = Some(t(995));
    again.push(killed_before);
    let mut view = ProbeView::default();
    view.failed
        .insert("a-1".into(), crate::prober::ProbeKind::Startup);
    let a = probed(&s, again, &view, &backoff);
    assert_eq!(a.kill_containers.len(), 1);
    assert_eq!(
        a.kill_containers[0].message,
        "Container a failed startup probe, will be restarted"
    );
    assert!(a.start_containers.is_empty());
    assert_eq!(
        a.waiting.get("a").map(|w| w.reason),
        Some(WaitingReason::CrashLoopBackOff)
    );

    // Never: killed, not restarted; the pod ends once nothing else runs.
    let s = with_probe(Setup::new("Never", &[], &["a"]), "a", "liveness", probe);
    let mut view = ProbeView::default();
    view.failed
        .insert("a-0".into(), crate::prober::ProbeKind::Liveness);
    let a = probed(
        &s,
        vec![s.c("a", 0, RunState::Running, 0)],
        &view,
        &Backoff::default(),
    );
    assert_eq!(
        a.kill_containers[0].message,
        "Container a failed liveness probe"
    );
    assert!(a.start_containers.is_empty());
    assert!(a.kill_pod);
}

#[test]
fn a_sidecars_startup_probe_gates_the_next_init_container() {
    let probe = json!({"exec": {"command": ["true"]}});
    let mut s = with_probe(
        Setup::new("Always", &["side", "init"], &["a"]),
        "side",
        "startup",
        probe,
    );
    if let Some(c) = s
        .pod
        .spec
        .as_mut()
        .and_then(|sp| sp.init_containers.as_mut())
    {
        c[0].restart_policy = Some("Always".into());
    }
    // Nothing runs: only the sidecar starts.
    let a = probed(&s, vec![], &ProbeView::default(), &Backoff::default());
    assert_eq!(a.start_init, names(&["side"]));
    // Running but not started: the init container waits.
    let mut view = ProbeView::default();
    view.not_started.insert("side-0".into());
    let a = probed(
        &s,
        vec![s.c("side", 0, RunState::Running, 0)],
        &view,
        &Backoff::default(),
    );
    assert!(a.start_init.is_empty() && a.start_containers.is_empty());
    // Started: the init container goes.
    let a = probed(
        &s,
        vec![s.c("side", 0, RunState::Running, 0)],
        &ProbeView::default(),
        &Backoff::default(),
    );
    assert_eq!(a.start_init, names(&["init"]));
    // A failed startup probe restarts the sidecar, whatever the pod's policy.
    let mut view = ProbeView::default();
    view.failed
        .insert("side-0".into(), crate::prober::ProbeKind::Startup);
    let a = probed(
        &s,
        vec![s.c("side", 0, RunState::Running, 0)],
        &view,
        &Backoff::default(),
    );
    assert_eq!(a.kill_containers.len(), 1);
    assert_eq!(a.start_init, names(&["side"]));
}

#[test]
fn init_containers_in_order() {
    let s = Setup::new("Always", &["i1", "i2"], &["a"]);
    let sb = || vec![sandbox("sb", 0, true)];
    // i1 running: wait.
    let a = s.actions(sb(), vec![s.c("i1", 0, RunState::Running, 0)]);
    assert_eq!(
        (a.start_init.clone(), a.start_containers.len(), a.kill_pod),
        (vec![], 0, false)
    );
    // i1 done: start i2.
    let a = s.actions(sb(), vec![s.c("i1", 0, RunState::Exited, 0)]);
    assert_eq!(a.start_init, names(&["i2"]));
    // i1 failed: restart it.
    let a = s.actions(sb(), vec![s.c("i1", 0, RunState::Exited, 1)]);
    assert_eq!(a.start_init, names(&["i1"]));
    // all done: app containers.
    let a = s.actions(
        sb(),
        vec![
            s.c("i1", 0, RunState::Exited, 0),
            s.c("i2", 0, RunState::Exited, 0),
        ],
    );
    assert_eq!(
        (a.start_init.clone(), a.start_containers.clone()),
        (vec![], names(&["a"]))
    );
    // Never + failed init: the pod fails.
    let s = Setup::new("Never", &["i1"], &["a"]);
    let a = s.actions(sb(), vec![s.c("i1", 0, RunState::Exited, 1)]);
    assert!(a.kill_pod && !a.create_sandbox && a.start_init.is_empty());
}

#[test]
fn crash_loop_backoff_delays_start() {
    let s = Setup::new("Always", &[], &["a", "b"]);
    let mut backoff = Backoff::default();
    let key = backoff::key("u-1", "a", &s.hash("a"));
    backoff.record_restart(&key, t(0));
    backoff.record_restart(&key, t(1)); // delay 20s
    let mut status = RuntimePodStatus {
        sandboxes: vec![sandbox("sb", 0, true)],
        containers: vec![
            s.c("a", 1, RunState::Exited, 1),
            s.c("b", 0, RunState::Exited, 1),
        ],
    };
    status.containers[0].finished_at = Some(t(100));
    let a = compute_pod_actions(&s.pod, &PodRef::of(&s.pod), &status, &backoff, t(105));
    assert_eq!(a.start_containers, names(&["b"]));
    assert_eq!(a.wait, Some(Duration::from_secs(15)));
    assert!(!a.kill_pod);
    // The held container shows CrashLoopBackOff with upstream's message.
    let w = &a.waiting["a"];
    assert_eq!(w.reason, WaitingReason::CrashLoopBackOff);
    let (uid, name, ns) = crate::model::pod_identity(&s.pod);
    assert_eq!(
        w.message,
        format!("back-off 20s restarting failed container=a pod={name}_{ns}({uid})")
    );
    // A changed spec (another hash) is another key: no back-off.
    let mut changed = s.pod.clone();
    if let Some(spec) = changed.spec.as_mut() {
        spec.containers[0].args = Some(vec!["new".into()]);
    }
    let a = compute_pod_actions(&changed, &PodRef::of(&changed), &status, &backoff, t(105));
    assert_eq!(a.start_containers, names(&["a", "b"]));
    let a = compute_pod_actions(&s.pod, &PodRef::of(&s.pod), &status, &backoff, t(120));
    assert_eq!((a.start_containers, a.wait), (names(&["a", "b"]), None));
}

fn sidecar_pod(policy: &str) -> Pod {
    pod(json!({"restartPolicy": policy,
        "initContainers": [
            {"name": "s1", "image": "busybox", "restartPolicy": "Always"},
            {"name": "i1", "image": "busybox"},
            {"name": "s2", "image": "busybox", "restartPolicy": "Always"}],
        "containers": [{"name": "a", "image": "busybox"}]}))
}

fn sidecar_setup(policy: &str) -> Setup {
    Setup {
        pod: sidecar_pod(policy),
    }
}

#[test]
fn sidecars_start_in_order_and_before_the_app() {
    let s = sidecar_setup("Always");
    let sb = || vec![sandbox("sb", 0, true)];
    // A new pod: s1, then i1 (which must complete before s2).
    let a = s.actions(vec![], vec![]);
    assert_eq!(a.start_init, names(&["s1", "i1"]));
    assert!(a.start_containers.is_empty());
    // s1 running, i1 running: wait for i1.
    let a = s.actions(
        sb(),
        vec![
            s.c("s1", 0, RunState::Running, 0),
            s.c("i1", 0, RunState::Running, 0),
        ],
    );
    assert!(a.start_init.is_empty() && a.start_containers.is_empty() && !a.kill_pod);
    // i1 done: s2 and then the app, s1 keeps running (it never "completes").
    let a = s.actions(
        sb(),
        vec![
            s.c("s1", 0, RunState::Running, 0),
            s.c("i1", 0, RunState::Exited, 0),
        ],
    );
    assert_eq!(
        (a.start_init.clone(), a.start_containers.clone()),
        (names(&["s2"]), names(&["a"]))
    );
}

#[test]
fn sidecars_restart_whatever_the_pod_policy_until_the_pod_is_done() {
    let s = sidecar_setup("Never");
    let sb = || vec![sandbox("sb", 0, true)];
    // s1 exited while the app runs: restarted although the pod's policy is Never.
    let a = s.actions(
        sb(),
        vec![
            s.c("s1", 0, RunState::Exited, 0),
            s.c("i1", 0, RunState::Exited, 0),
            s.c("s2", 0, RunState::Running, 0),
            s.c("a", 0, RunState::Running, 0),
        ],
    );
    assert_eq!(a.start_init, names(&["s1"]));
    assert!(!a.kill_pod);
    // The app finished: the pod is done, its sidecars are stopped, not restarted.
    let a = s.actions(
        sb(),
        vec![
            s.c("s1", 0, RunState::Exited, 0),
            s.c("i1", 0, RunState::Exited, 0),
            s.c("s2", 0, RunState::Running, 0),
            s.c("a", 0, RunState::Exited, 0),
        ],
    );
    assert!(a.kill_pod);
    assert!(a.start_init.is_empty() && a.start_containers.is_empty());
}

#[test]
fn a_sidecar_in_back_off_holds_the_init_containers_after_it() {
    let s = sidecar_setup("Always");
    let mut backoff = Backoff::default();
    backoff.record_restart(&backoff::key("u-1", "s1", &s.hash("s1")), t(0));
    let mut status = RuntimePodStatus {
        sandboxes: vec![sandbox("sb", 0, true)],
        containers: vec![s.c("s1", 0, RunState::Exited, 1)],
    };
    status.containers[0].finished_at = Some(t(100));
    let a = compute_pod_actions(&s.pod, &PodRef::of(&s.pod), &status, &backoff, t(102));
    assert!(a.start_init.is_empty());
    assert_eq!(a.waiting["s1"].reason, WaitingReason::CrashLoopBackOff);
    assert_eq!(a.wait, Some(Duration::from_secs(8)));
    // Once the app containers ran, a sidecar in back-off holds nothing else.
    status.containers.push(s.c("a", 0, RunState::Exited, 1));
    status.containers.push(s.c("i1", 0, RunState::Exited, 0));
    let a = compute_pod_actions(&s.pod, &PodRef::of(&s.pod), &status, &backoff, t(102));
    assert_eq!(a.start_containers, names(&["a"]));
    assert!(a.waiting.contains_key("s1"));
}

#[test]
fn from_cri_sorts_and_reads_annotations() {
    let sb = |id: &str, created_at: i64, state: cri::PodSandboxState| cri::PodSandboxStatus {
        id: id.into(),
        created_at,
        state: state as i32,
        metadata: Some(cri::PodSandboxMetadata {
            attempt: u32::try_from(created_at).unwrap_or(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ct = cri::ContainerStatus {
        id: "c1".into(),
        metadata: Some(cri::ContainerMetadata {
            name: "a".into(),
            attempt: 2,
        }),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code: 3,
        finished_at: 5_000_000_000,
        annotations: [(ANNOTATION_CONTAINER_HASH.to_string(), "abc".to_string())].into(),
        ..Default::default()
    };
    let s = RuntimePodStatus::from_cri(
        &[
            sb("old", 1, cri::PodSandboxState::SandboxNotready),
            sb("new", 2, cri::PodSandboxState::SandboxReady),
        ],
        &[ct],
    );
    assert_eq!(
        s.sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.ready))
            .collect::<Vec<_>>(),
        [("new", true), ("old", false)]
    );
    let c = s.latest("a").expect("a");
    assert_eq!(
        (c.attempt, c.state, c.exit_code, c.hash.as_str()),
        (2, RunState::Exited, 3, "abc")
    );
    assert_eq!(c.finished_at, Some(UNIX_EPOCH + Duration::from_secs(5)));
}
