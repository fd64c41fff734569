//! Probes and lifecycle hooks end to end: the real binary (`nodelet run-node`), the test API
//! server, real containers, on the built-in runtime and on containerd (skipped loudly when
//! containerd is not installed).
//!
//! - **Every handler passing and failing**: httpGet (busybox httpd, a named port; a 404),
//!   tcpSocket (httpd's port; a closed one), exec (`true`; a command that prints and fails),
//!   gRPC (the project's health server, `examples/grpc_health_server.rs`, in a test image: the
//!   server SERVING; a service NOT_SERVING). Readiness follows each, the pod's conditions list
//!   the unready ones, each failure is an `Unhealthy` event with the probe's output.
//! - **Liveness**: a container whose liveness probe starts failing is killed and restarted
//!   (restart count, last state, `Killing` and `Unhealthy` events); a container whose startup
//!   probe passes late is neither probed for liveness nor ready before.
//! - **Readiness flapping**: the pod's Ready condition follows a readiness probe that passes,
//!   fails and passes again.
//! - **Hooks**: postStart runs, preStop runs before the stop signal, and the kill comes after
//!   the grace period (the order recorded in a host directory by the container itself); a
//!   failing postStart kills and restarts the container (`FailedPostStartHook`); a failing
//!   preStop is an event and the pod still goes.
//! - **A sidecar's startup probe gates the next init container.**
//!
//! Needs root (real containers); skips loudly otherwise.

mod apiserver;
mod common;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod, PodStatus};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const SETUP: Setup = Setup {
    name: "probe-node",
    config: "syncFrequency: 2s\nnodeletTesting:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 2s\n",
    cri_listen: false,
};

/// Ports the tests' containers listen on (on the node's loopback for hostNetwork pods).
const HTTP_PORT: u16 = 28080;
const GRPC_PORT: u16 = 29090;
const CLOSED_PORT: u16 = 29999;

async fn prepare(api: &ApiServer, backend: Backend, test: &str) -> Option<ApiNode> {
    ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
}

fn container<'a>(st: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

fn condition(st: &PodStatus, t: &str) -> Option<(String, Option<String>)> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.message.clone()))
}

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

/// The pod's events as (reason, message), oldest first.
async fn events_of(api: &ApiServer, uid: &str) -> Vec<(String, String)> {
    events_about(api, uid)
        .await
        .into_iter()
        .map(|(r, m, _)| (r, m))
        .collect()
}

/// The events about the pod `uid`: reason, message and the object's field path (which names
/// a container: `spec.containers{app}`).
async fn events_about(api: &ApiServer, uid: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = Api::namespaced(api.client(), NS);
    let mut items: Vec<Event> = events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .collect();
    items.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    items
        .into_iter()
        .map(|e| {
            let path = e.involved_object.field_path.unwrap_or_default();
            (
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
                path,
            )
        })
        .collect()
}

async fn wait_event(api: &ApiServer, uid: &str, reason: &str, needle: &str) -> String {
    wait_for(
        &format!("a {reason} event with {needle:?}"),
        60,
        async || {
            events_of(api, uid)
                .await
                .into_iter()
                .find(|(r, m)| r == reason && m.contains(needle))
                .map(|(_, m)| m)
        },
    )
    .await
}

/// A busybox container with `extra` YAML lines (indented by four) after its command.
fn with(container: String, extra: &str) -> String {
    format!("{container}{extra}")
}

// ---------------------------------------------------------------------------------------------
// Every handler
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn probe_handlers_builtin() {
    probe_handlers(Backend::Builtin, "probe_handlers_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_handlers_containerd() {
    probe_handlers(Backend::Containerd, "probe_handlers_containerd").await;
}

async fn probe_handlers(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    node.add_image(&common::grpc_health_archive(), common::GRPC_HEALTH)
        .await;
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let readiness = |handler: &str| {
        format!(
            "    readinessProbe:\n      {handler}\n      periodSeconds: 1\n      failureThreshold: 1\n"
        )
    };
    let idle = |name: &str, handler: &str| with(busybox(name, "sleep 3600"), &readiness(handler));
    let web = |name: &str, port: u16, probe: &str| {
        with(
            busybox(
                name,
                &format!(
                    "mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p {port} -h /www"
                ),
            ),
            &format!("    ports: [{{name: http, containerPort: {port}}}]\n{probe}"),
        )
    };
    let grpc = |name: &str, port: u16| {
        format!(
            "  - name: {name}\n    image: {}\n    imagePullPolicy: Never\n    command: [/bin/grpc-health-server, \"{port}\", broken=NOT_SERVING]\n",
            common::GRPC_HEALTH
        )
    };
    // Two pods, so that each stays within the event spam filter's burst of 25 per object
    // (upstream's): the passing probes, and the failing ones beside servers of their own.
    let ok_spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}{}{}{}{}",
        grpc("grpc", GRPC_PORT),
        web(
            "web",
            HTTP_PORT,
            &readiness("httpGet: {path: /healthz, port: http}")
        ),
        idle("tcp-ok", &format!("tcpSocket: {{port: {HTTP_PORT}}}")),
        idle("exec-ok", "exec: {command: [\"true\"]}"),
        idle("grpc-ok", &format!("grpc: {{port: {GRPC_PORT}}}")),
    );
    let (http2, grpc2) = (HTTP_PORT + 1, GRPC_PORT + 1);
    let bad_spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}{}{}{}{}{}",
        grpc("grpc", grpc2),
        web("web", http2, ""),
        idle(
            "http-bad",
            &format!("httpGet: {{path: /nope, port: {http2}}}")
        ),
        idle("tcp-bad", &format!("tcpSocket: {{port: {CLOSED_PORT}}}")),
        idle(
            "exec-bad",
            "exec: {command: [sh, -c, \"echo nope; exit 1\"]}"
        ),
        idle(
            "grpc-bad",
            &format!("grpc: {{port: {grpc2}, service: broken}}")
        ),
    );
    pods.create(&PostParams::default(), &node.pod("probed", &ok_spec))
        .await
        .expect("creating the pod");
    let created = pods
        .create(&PostParams::default(), &node.pod("failing", &bad_spec))
        .await
        .expect("creating the pod");
    let uid = created.metadata.uid.clone().expect("a uid");
    // An exec probe that outlives its timeout fails.
    let slow_spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        with(
            busybox("slow", "sleep 3600"),
            "    readinessProbe:\n      exec: {command: [sleep, \"5\"]}\n      timeoutSeconds: 1\n      periodSeconds: 2\n      failureThreshold: 1\n"
        )
    );
    let slow = pods
        .create(&PostParams::default(), &node.pod("slowexec", &slow_spec))
        .await
        .expect("creating the pod");
    let slow_uid = slow.metadata.uid.clone().expect("a uid");
    let agent = node.start();

    let good = ["web", "tcp-ok", "exec-ok", "grpc-ok"];
    let bad = ["http-bad", "tcp-bad", "exec-bad", "grpc-bad"];
    let st = wait_for("the passing probes' containers ready", 120, async || {
        let st = status(&pods, "probed").await?;
        good.iter()
            .all(|n| container(&st, n).is_some_and(|c| c.ready))
            .then_some(st)
    })
    .await;
    assert_eq!(
        condition(&st, "Ready").map(|c| c.0).as_deref(),
        Some("True")
    );
    let st = wait_for("the failing probes' containers started", 120, async || {
        let st = status(&pods, "failing").await?;
        bad.iter()
            .all(|n| container(&st, n).is_some_and(|c| c.started == Some(true)))
            .then_some(st)
    })
    .await;
    for n in bad {
        let c = container(&st, n).expect("status");
        assert!(!c.ready, "{n} is not ready: {c:?}");
    }
    // grpc has no readiness probe: ready once started.
    assert!(container(&st, "grpc").is_some_and(|c| c.ready));
    assert!(container(&st, "web").is_some_and(|c| c.ready));
    assert_eq!(
        condition(&st, "Ready"),
        Some((
            "False".into(),
            Some("containers with unready status: [http-bad tcp-bad exec-bad grpc-bad]".into())
        ))
    );
    assert_eq!(
        condition(&st, "ContainersReady").map(|c| c.0).as_deref(),
        Some("False")
    );

    wait_event(
        &api,
        &uid,
        "Unhealthy",
        "Readiness probe failed: HTTP probe failed with statuscode: 404",
    )
    .await;
    wait_event(
        &api,
        &uid,
        "Unhealthy",
        &format!(":{CLOSED_PORT}: connect: connection refused"),
    )
    .await;
    wait_event(&api, &uid, "Unhealthy", "Readiness probe failed: nope").await;
    wait_event(
        &api,
        &uid,
        "Unhealthy",
        "Readiness probe failed: service unhealthy (responded with \"NOT_SERVING\")",
    )
    .await;
    wait_event(
        &api,
        &slow_uid,
        "Unhealthy",
        "Readiness probe failed: command \"sleep 5\" timed out",
    )
    .await;
    // The failures are the failing probes' only: each event names its container.
    let events: Api<Event> = Api::namespaced(api.client(), NS);
    let unhealthy: std::collections::BTreeSet<String> = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.uid.as_deref() == Some(uid.as_str())
                && e.reason.as_deref() == Some("Unhealthy")
        })
        .filter_map(|e| e.involved_object.field_path)
        .collect();
    let expected: std::collections::BTreeSet<String> = bad
        .iter()
        .map(|n| format!("spec.containers{{{n}}}"))
        .collect();
    assert_eq!(unhealthy, expected);
    for name in ["probed", "failing", "slowexec"] {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for("the pods gone", 60, async || {
        let gone = pods.get_opt("probed").await.ok()?.is_none()
            && pods.get_opt("failing").await.ok()?.is_none()
            && pods.get_opt("slowexec").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// Liveness and startup
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn liveness_and_startup_builtin() {
    liveness_and_startup(Backend::Builtin, "liveness_and_startup_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn liveness_and_startup_containerd() {
    liveness_and_startup(Backend::Containerd, "liveness_and_startup_containerd").await;
}

async fn liveness_and_startup(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    // `app` is healthy for a few seconds, then its liveness probe fails. `slow` starts after
    // 6 s; its liveness probe would fail until then, but the startup probe holds it back.
    let app = with(
        busybox(
            "app",
            "touch /tmp/healthy; sleep 4; rm /tmp/healthy; sleep 3600",
        ),
        "    livenessProbe:\n      exec: {command: [cat, /tmp/healthy]}\n      periodSeconds: 1\n      failureThreshold: 1\n      terminationGracePeriodSeconds: 1\n",
    );
    let slow = with(
        busybox("slow", "sleep 6; touch /tmp/up; sleep 3600"),
        "    startupProbe:\n      exec: {command: [test, -f, /tmp/up]}\n      periodSeconds: 1\n      failureThreshold: 60\n    livenessProbe:\n      exec: {command: [test, -f, /tmp/up]}\n      periodSeconds: 1\n      failureThreshold: 1\n    readinessProbe:\n      exec: {command: [\"true\"]}\n      periodSeconds: 1\n",
    );
    let spec = format!("  terminationGracePeriodSeconds: 5\n  containers:\n{app}{slow}");
    let created = pods
        .create(&PostParams::default(), &node.pod("alive", &spec))
        .await
        .expect("creating the pod");
    let uid = created.metadata.uid.clone().expect("a uid");
    let agent = node.start();

    // Before its startup probe passes, `slow` runs but has not started and is not ready.
    let st = wait_for("slow running, not started", 60, async || {
        let st = status(&pods, "alive").await?;
        let c = container(&st, "slow")?;
        (c.state.as_ref()?.running.is_some()).then_some(st)
    })
    .await;
    let c = container(&st, "slow").expect("slow");
    if c.started == Some(true) {
        eprintln!("NOTE: {test}: the first status read came after slow's start");
    } else {
        assert!(!c.ready, "not ready before it started: {c:?}");
    }

    // app: killed for its failed liveness probe and started again.
    let st = wait_for("app restarted", 90, async || {
        let st = status(&pods, "alive").await?;
        (container(&st, "app")?.restart_count >= 1).then_some(st)
    })
    .await;
    let app = container(&st, "app").expect("app");
    let last = app
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("app's last state");
    assert_eq!(
        last.exit_code, 137,
        "killed after the grace period: {last:?}"
    );
    wait_event(
        &api,
        &uid,
        "Unhealthy",
        "Liveness probe failed: cat: can't open '/tmp/healthy': No such file or directory",
    )
    .await;
    wait_event(
        &api,
        &uid,
        "Killing",
        "Container app failed liveness probe, will be restarted",
    )
    .await;

    // slow: started and ready once its startup probe passed, never killed by liveness.
    let st = wait_for("slow started and ready", 60, async || {
        let st = status(&pods, "alive").await?;
        let c = container(&st, "slow")?;
        (c.started == Some(true) && c.ready).then_some(st)
    })
    .await;
    assert_eq!(container(&st, "slow").map(|c| c.restart_count), Some(0));
    // And it stays so while app keeps being restarted.
    wait_for("app restarted again", 90, async || {
        let st = status(&pods, "alive").await?;
        (container(&st, "app")?.restart_count >= 2).then_some(())
    })
    .await;
    let st = status(&pods, "alive").await.expect("status");
    assert_eq!(container(&st, "slow").map(|c| c.restart_count), Some(0));
    let events = events_of(&api, &uid).await;
    assert!(
        !events
            .iter()
            .any(|(r, m)| r == "Killing" && m.contains("Container slow")),
        "slow was never killed: {events:?}"
    );
    pods.delete("alive", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the pod gone", 60, async || {
        pods.get_opt("alive").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// Readiness flapping
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn readiness_flaps_builtin() {
    readiness_flaps(Backend::Builtin, "readiness_flaps_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_flaps_containerd() {
    readiness_flaps(Backend::Containerd, "readiness_flaps_containerd").await;
}

async fn readiness_flaps(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let app = with(
        busybox(
            "app",
            "while true; do touch /tmp/ready; sleep 4; rm -f /tmp/ready; sleep 4; done",
        ),
        "    readinessProbe:\n      exec: {command: [test, -f, /tmp/ready]}\n      periodSeconds: 1\n      failureThreshold: 1\n",
    );
    let spec = format!("  terminationGracePeriodSeconds: 1\n  containers:\n{app}");
    pods.create(&PostParams::default(), &node.pod("flappy", &spec))
        .await
        .expect("creating the pod");
    let agent = node.start();

    // The Ready condition as the API server has it: True, then False, then True again.
    let mut seen: Vec<String> = Vec::new();
    wait_for("Ready True, False, True", 90, async || {
        let st = status(&pods, "flappy").await?;
        let (ready, _) = condition(&st, "Ready")?;
        let app_ready = container(&st, "app")?.ready;
        assert_eq!(
            ready == "True",
            app_ready,
            "the pod's Ready follows its only container: {st:?}"
        );
        if seen.last() != Some(&ready) {
            seen.push(ready);
        }
        let from_true: Vec<&String> = seen.iter().skip_while(|s| *s != "True").collect();
        (from_true.len() >= 3).then_some(())
    })
    .await;
    let st = status(&pods, "flappy").await.expect("status");
    assert_eq!(container(&st, "app").map(|c| c.restart_count), Some(0));
    pods.delete("flappy", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the pod gone", 60, async || {
        pods.get_opt("flappy").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// Lifecycle hooks
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_hooks_builtin() {
    lifecycle_hooks(Backend::Builtin, "lifecycle_hooks_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_hooks_containerd() {
    lifecycle_hooks(Backend::Containerd, "lifecycle_hooks_containerd").await;
}

async fn lifecycle_hooks(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let record = tempfile::tempdir().expect("temp dir");
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    // The container logs the signal it gets and ignores it; the hooks log themselves.
    let app = with(
        busybox(
            "app",
            "trap 'echo TERM >> /rec/order' TERM; echo started >> /rec/order; while true; do sleep 0.1; done",
        ),
        "    volumeMounts: [{name: rec, mountPath: /rec}]\n    lifecycle:\n      postStart:\n        exec: {command: [sh, -c, \"echo poststart >> /rec/order\"]}\n      preStop:\n        exec: {command: [sh, -c, \"echo prestop >> /rec/order; sleep 1; echo prestop-done >> /rec/order\"]}\n",
    );
    // A preStop that cannot reach anything, and a zero sleep: termination goes on.
    let other = with(
        busybox("other", "sleep 3600"),
        &format!(
            "    lifecycle:\n      preStop:\n        httpGet: {{path: /bye, port: {CLOSED_PORT}}}\n"
        ),
    );
    let sleeper = with(
        busybox("sleeper", "sleep 3600"),
        "    lifecycle:\n      preStop:\n        sleep: {seconds: 0}\n",
    );
    let spec = format!(
        "  terminationGracePeriodSeconds: 4\n  containers:\n{app}{other}{sleeper}  volumes: [{{name: rec, hostPath: {{path: {}}}}}]\n",
        record.path().display()
    );
    let created = pods
        .create(&PostParams::default(), &node.pod("hooked", &spec))
        .await
        .expect("creating the pod");
    let uid = created.metadata.uid.clone().expect("a uid");
    // A container whose postStart hook fails: killed and restarted.
    let bad = with(
        busybox("app", "sleep 3600"),
        "    lifecycle:\n      postStart:\n        exec: {command: [sh, -c, \"exit 3\"]}\n",
    );
    let bad_spec = format!("  terminationGracePeriodSeconds: 1\n  containers:\n{bad}");
    let bad_pod = pods
        .create(&PostParams::default(), &node.pod("badhook", &bad_spec))
        .await
        .expect("creating the pod");
    let bad_uid = bad_pod.metadata.uid.clone().expect("a uid");
    let agent = node.start();

    let order = record.path().join("order");
    let read = || std::fs::read_to_string(&order).unwrap_or_default();
    wait_for("all three running", 60, async || {
        let st = status(&pods, "hooked").await?;
        ["app", "other", "sleeper"]
            .iter()
            .all(|n| {
                container(&st, n)
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some())
            })
            .then_some(())
    })
    .await;
    wait_for("the postStart hook ran", 30, async || {
        read().contains("poststart").then_some(())
    })
    .await;

    // postStart failing: the event, the container killed and restarted.
    // The event names the failure, never what the hook printed (it may hold secrets).
    let msg = wait_event(&api, &bad_uid, "FailedPostStartHook", "").await;
    assert_eq!(msg, "PostStartHook failed");
    wait_for("badhook's app restarted", 60, async || {
        let st = status(&pods, "badhook").await?;
        (container(&st, "app")?.restart_count >= 1).then_some(())
    })
    .await;

    // Deletion: preStop, then the signal, then (the signal being ignored) the kill.
    pods.delete("hooked", &DeleteParams::default())
        .await
        .expect("delete");
    let mut last_app: Option<ContainerStatus> = None;
    wait_for("hooked gone", 60, async || {
        match pods.get_opt("hooked").await.ok()? {
            None => Some(()),
            Some(p) => {
                if let Some(c) = p.status.as_ref().and_then(|s| container(s, "app")) {
                    if c.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                        last_app = Some(c.clone());
                    }
                }
                None
            }
        }
    })
    .await;
    let text = read();
    let lines: Vec<&str> = text.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| *l == what)
            .unwrap_or_else(|| panic!("{what} in {lines:?}"))
    };
    assert!(at("started") < at("prestop") || at("poststart") < at("prestop"));
    assert!(
        at("prestop") < at("prestop-done") && at("prestop-done") < at("TERM"),
        "the preStop hook ran to its end before the signal: {lines:?}"
    );
    if let Some(c) = last_app {
        let t = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(
            t.exit_code, 137,
            "the ignored signal is followed by the kill: {t:?}"
        );
    } else {
        eprintln!("NOTE: {test}: no status read caught app terminated before the pod went");
    }
    let events = events_about(&api, &uid).await;
    let failed_pre_stop = |c: &str| {
        events
            .iter()
            .any(|(r, _, path)| r == "FailedPreStopHook" && path.ends_with(&format!("{{{c}}}")))
    };
    assert!(failed_pre_stop("other"), "{events:?}");
    assert!(
        events
            .iter()
            .filter(|(r, ..)| r == "FailedPreStopHook")
            .all(|(_, m, _)| m == "PreStopHook failed"),
        "the event names the failure only: {events:?}"
    );
    assert!(
        !failed_pre_stop("sleeper"),
        "a zero sleep passes: {events:?}"
    );
    pods.delete("badhook", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("badhook gone", 60, async || {
        pods.get_opt("badhook").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// A sidecar's startup probe
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn sidecar_startup_gates_init_builtin() {
    sidecar_startup_gates_init(Backend::Builtin, "sidecar_startup_gates_init_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sidecar_startup_gates_init_containerd() {
    sidecar_startup_gates_init(Backend::Containerd, "sidecar_startup_gates_init_containerd").await;
}

async fn sidecar_startup_gates_init(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let Some(node) = prepare(&api, backend, test).await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    // The sidecar is up after 3 s; the init container after it fails (and fails the pod,
    // restartPolicy Never) if it runs before.
    let side = with(
        busybox("side", "sleep 3; touch /shared/up; sleep 3600"),
        "    restartPolicy: Always\n    volumeMounts: [{name: shared, mountPath: /shared}]\n    startupProbe:\n      exec: {command: [test, -f, /shared/up]}\n      periodSeconds: 1\n      failureThreshold: 60\n",
    );
    let init = with(
        busybox("init", "test -f /shared/up"),
        "    volumeMounts: [{name: shared, mountPath: /shared}]\n",
    );
    let app = busybox("app", "sleep 1");
    let spec = format!(
        "  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  initContainers:\n{side}{init}  containers:\n{app}  volumes: [{{name: shared, emptyDir: {{}}}}]\n"
    );
    pods.create(&PostParams::default(), &node.pod("gated", &spec))
        .await
        .expect("creating the pod");
    let agent = node.start();
    let st = wait_for("the pod done", 90, async || {
        let st = status(&pods, "gated").await?;
        matches!(st.phase.as_deref(), Some("Succeeded") | Some("Failed")).then_some(st)
    })
    .await;
    assert_eq!(st.phase.as_deref(), Some("Succeeded"), "{st:#?}");
    let init = container(&st, "init").expect("init");
    let t = init
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("init terminated");
    assert_eq!(t.exit_code, 0, "init ran after the sidecar's start: {t:?}");
    assert_eq!(init.restart_count, 0);
    pods.delete("gated", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the pod gone", 60, async || {
        pods.get_opt("gated").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(agent);
}
