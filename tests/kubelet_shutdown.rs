//! Graceful node shutdown end to end without logind (`nodeletShutdownOnSigterm: true`):
//! `nodelet run-node` on the built-in runtime against the project's test API server gets
//! SIGTERM with three pods running. A pod created meanwhile is refused (`NodeShutdown`), the
//! Node turns NotReady ("node is shutting down"), the non-critical pods stop first within their
//! group's period (a container ignoring SIGTERM is killed after it, not after its own 30 s),
//! then the critical one; every pod ends Failed/`Terminated` with upstream's message and the
//! `DisruptionTarget` condition in the API, and the agent exits once they are written.
//!
//! Needs root; skips loudly otherwise.

mod apiserver;
mod common;

use std::time::{Duration, Instant};

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::Api;
use kube::api::PostParams;

const NODE: &str = "shutdown-node";

const SETUP: Setup = Setup {
    name: NODE,
    config: "shutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 3s\nnodeletShutdownOnSigterm: true\n",
    cri_listen: false,
};

/// A container that exits within a second of SIGTERM.
const STOPS_ON_TERM: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn pod_spec(script: &str, extra: &str) -> String {
    format!(
        "  terminationGracePeriodSeconds: 30\n{extra}  containers:\n{}",
        busybox("app", script)
    )
}

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

/// When the pod's container finished, from its status.
fn finished_at(st: &PodStatus) -> Option<k8s_openapi::jiff::Timestamp> {
    let c = st.container_statuses.as_ref()?.first()?;
    Some(
        c.state
            .as_ref()?
            .terminated
            .as_ref()?
            .finished_at
            .as_ref()?
            .0,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_pods_by_priority_and_reports_them_builtin() {
    let test = "sigterm_stops_the_pods_by_priority_and_reports_them_builtin";
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let wanted = [
        (
            "stubborn",
            pod_spec("trap '' TERM; while true; do sleep 1; done", ""),
        ),
        // (A container's first process is its PID namespace's init: without a handler, SIGTERM
        // would not reach it.)
        ("quick", pod_spec(STOPS_ON_TERM, "")),
        (
            "critical",
            pod_spec(STOPS_ON_TERM, "  priority: 2000000000\n"),
        ),
    ];
    for (name, spec) in &wanted {
        pods.create(&PostParams::default(), &node.pod(name, spec))
            .await
            .expect("creating the pod");
    }
    let mut agent = node.start();
    for (name, _) in &wanted {
        wait_for(&format!("{name} running"), 60, async || {
            let st = status(&pods, name).await?;
            (st.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }

    let sent = Instant::now();
    let term_at = k8s_openapi::jiff::Timestamp::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM to the agent");

    // Meanwhile: a new pod is refused, and the Node is NotReady.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pods.create(
        &PostParams::default(),
        &node.pod("late", &pod_spec("exec sleep 600", "")),
    )
    .await
    .expect("creating a pod during the shutdown");
    let late = wait_for("the late pod refused", 10, async || {
        let st = status(&pods, "late").await?;
        (st.phase.as_deref() == Some("Failed")).then_some(st)
    })
    .await;
    assert_eq!(late.reason.as_deref(), Some("NodeShutdown"));
    assert_eq!(
        late.message.as_deref(),
        Some("Pod was rejected: Pod was rejected as the node is shutting down.")
    );
    let nodes: Api<Node> = Api::all(api.client());
    wait_for("the Node NotReady", 10, async || {
        let n = nodes.get(NODE).await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "False"
            && ready
                .message
                .as_deref()
                .unwrap_or("")
                .contains("node is shutting down"))
        .then_some(())
    })
    .await;

    // The agent exits once the pods stopped and their statuses are written.
    let code = loop {
        if let Some(code) = agent.0.try_wait().expect("waiting for the agent") {
            break code;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(25),
            "the agent did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(code.success(), "{code:?}");
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "exited after {took:?}, not the pods' 30 s"
    );

    let mut finished = std::collections::HashMap::new();
    for (name, _) in &wanted {
        let st = status(&pods, name).await.expect("the pod's status");
        assert_eq!(st.phase.as_deref(), Some("Failed"), "{name}: {st:?}");
        assert_eq!(st.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            st.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let disruption = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap_or_else(|| panic!("{name}: no DisruptionTarget in {:?}", st.conditions));
        assert_eq!(disruption.status, "True");
        assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
        finished.insert(
            *name,
            finished_at(&st).unwrap_or_else(|| panic!("{name}: {st:?}")),
        );
    }
    // The stubborn container was killed at its group's 5 s (8 s less the critical pods' 3 s),
    // and the critical pod stopped only after the group before it.
    let stubborn = finished["stubborn"].duration_since(term_at);
    assert!(
        stubborn.as_secs_f64() >= 4.0 && stubborn.as_secs_f64() < 9.0,
        "stubborn finished {stubborn:?} after SIGTERM"
    );
    assert!(finished["critical"] >= finished["stubborn"], "{finished:?}");
    assert!(finished["quick"] < finished["stubborn"], "{finished:?}");
    let running: Vec<_> = node
        .runtime()
        .await
        .list_containers(runtime::cri::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .containers
        .into_iter()
        .filter(|c| c.state == runtime::cri::ContainerState::ContainerRunning as i32)
        .collect();
    assert!(running.is_empty(), "containers still running: {running:?}");
}
