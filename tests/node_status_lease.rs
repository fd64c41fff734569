//! The node status manager and the Lease controller against the project's test API server:
//! registration with the right labels, capacity, nodeInfo and conditions; status written when
//! something changes and not on every tick; a health problem flips Ready (and only then moves
//! lastTransitionTime); the Lease is owned by the Node and renewed, and both resume after the
//! API server was away; a Node that already exists is adopted, a deleted one registered again;
//! with `registerNode: false` only the status is written; `NodeAgent` reports runtime health
//! and images.

mod apiserver;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::ApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::Api;
use kube::api::PostParams;
use nodelet::config::KubeletConfig;
use nodelet::node::{Health, LeaseController, NodeFacts, NodeStatusManager};
use tokio::sync::oneshot;

async fn wait_for<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {secs}s waiting for {what}");
}

fn config(name: &str, dir: &std::path::Path) -> KubeletConfig {
    KubeletConfig {
        node_name: name.to_string(),
        node_ips: vec!["10.9.8.7".parse().unwrap()],
        root_dir: dir.to_path_buf(),
        max_pods: 17,
        node_status_update_frequency: Duration::from_millis(200),
        node_status_report_frequency: Duration::from_secs(3600),
        node_lease_duration_seconds: 1,
        ..Default::default()
    }
}

/// A running status manager (and optionally Lease controller) with a health switch.
struct Running {
    manager: Arc<NodeStatusManager>,
    health: Arc<Mutex<Health>>,
    stop: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    fn start(client: kube::Client, cfg: &KubeletConfig, lease: bool) -> Running {
        let facts = NodeFacts::gather(cfg, "fake", "0.0.1").unwrap();
        let health = Arc::new(Mutex::new(Health::ready()));
        let h = health.clone();
        let manager = Arc::new(NodeStatusManager::new(
            client.clone(),
            cfg,
            facts,
            Arc::new(move || h.lock().unwrap().clone()),
        ));
        let mut run = Running {
            manager: manager.clone(),
            health,
            stop: Vec::new(),
            tasks: Vec::new(),
        };
        let (tx, rx) = oneshot::channel::<()>();
        run.stop.push(tx);
        run.tasks.push(tokio::spawn(async move {
            manager
                .run(async {
                    let _ = rx.await;
                })
                .await
        }));
        if lease {
            let controller = LeaseController::new(client, cfg, run.manager.subscribe());
            let (tx, rx) = oneshot::channel::<()>();
            run.stop.push(tx);
            run.tasks.push(tokio::spawn(async move {
                controller
                    .run(async {
                        let _ = rx.await;
                    })
                    .await
            }));
        }
        run
    }

    fn set_health(&self, h: Health) {
        *self.health.lock().unwrap() = h;
    }

    async fn stop(self) {
        for tx in self.stop {
            let _ = tx.send(());
        }
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn status_patches(api: &ApiServer, name: &str) -> usize {
    let path = format!("/api/v1/nodes/{name}/status");
    api.requests()
        .iter()
        .filter(|r| {
            r.starts_with("PATCH ")
                && r.split_whitespace()
                    .nth(1)
                    .is_some_and(|p| p.split('?').next() == Some(path.as_str()))
        })
        .count()
}

#[tokio::test]
async fn registers_and_writes_status_only_on_change() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-reg", dir.path());
    let nodes: Api<Node> = Api::all(api.client());
    let run = Running::start(api.client(), &cfg, false);

    let node = wait_for("the node to be Ready", 20, async || {
        let n = nodes.get_opt("node-reg").await.ok().flatten()?;
        (condition(&n, "Ready")?.status == "True").then_some(n)
    })
    .await;
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "node-reg");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    assert!(!labels["kubernetes.io/arch"].is_empty());
    assert_eq!(
        node.metadata.annotations.as_ref().unwrap()["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );
    let status = node.status.clone().unwrap();
    let capacity = status.capacity.unwrap();
    assert_eq!(capacity["pods"].0, "17");
    for r in ["cpu", "memory", "ephemeral-storage"] {
        assert!(capacity.contains_key(r), "capacity {r}");
    }
    assert!(status.allocatable.unwrap().contains_key("memory"));
    let info = status.node_info.unwrap();
    assert_eq!(info.operating_system, "linux");
    assert_eq!(info.container_runtime_version, "fake://0.0.1");
    assert!(info.kubelet_version.starts_with("v1.37.0+nodelet."));
    let addresses = status.addresses.unwrap();
    assert_eq!(addresses[0].type_, "InternalIP");
    assert_eq!(addresses[0].address, "10.9.8.7");
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ] {
        assert_eq!(
            condition(&node, t).unwrap().reason.as_deref(),
            Some(reason),
            "{t}"
        );
    }
    assert_eq!(run.manager.node().unwrap().metadata.uid, node.metadata.uid);

    // Nothing changes for many ticks: no more status writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = status_patches(&api, "node-reg");
    assert!(before >= 1, "{:?}", api.requests());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status_patches(&api, "node-reg"),
        before,
        "{:?}",
        api.requests()
    );
    let ready_since = condition(&node, "Ready")
        .unwrap()
        .last_transition_time
        .clone();

    // A problem flips Ready to False with the message, once.
    run.set_health(Health::not_ready(["container runtime is down"]));
    let not_ready = wait_for("Ready=False", 20, async || {
        let n = nodes.get_opt("node-reg").await.ok().flatten()?;
        (condition(&n, "Ready")?.status == "False").then_some(n)
    })
    .await;
    let ready = condition(&not_ready, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(ready.message.as_deref(), Some("container runtime is down"));
    assert!(
        ready.last_transition_time > ready_since,
        "{ready:?} vs {ready_since:?}"
    );
    let flipped_at = ready.last_transition_time.clone();
    // The pressure conditions did not flip.
    assert_eq!(
        condition(&not_ready, "MemoryPressure")
            .unwrap()
            .last_transition_time,
        condition(&node, "MemoryPressure")
            .unwrap()
            .last_transition_time
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_flip = status_patches(&api, "node-reg");
    assert!(after_flip > before);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status_patches(&api, "node-reg"), after_flip);
    let still = nodes.get("node-reg").await.unwrap();
    assert_eq!(
        condition(&still, "Ready").unwrap().last_transition_time,
        flipped_at
    );

    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn report_frequency_forces_writes() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("node-report", dir.path());
    cfg.node_status_report_frequency = Duration::from_millis(400);
    let nodes: Api<Node> = Api::all(api.client());
    let run = Running::start(api.client(), &cfg, false);
    let first = wait_for("the node", 20, async || {
        let n = nodes.get_opt("node-report").await.ok().flatten()?;
        condition(&n, "Ready")?.last_heartbeat_time.clone()
    })
    .await;
    // Unchanged status is still written once the report frequency has passed: the
    // heartbeat moves on.
    wait_for("a later heartbeat", 20, async || {
        let n = nodes.get_opt("node-report").await.ok().flatten()?;
        let hb = condition(&n, "Ready")?.last_heartbeat_time.clone();
        (hb > Some(first.clone())).then_some(())
    })
    .await;
    assert!(status_patches(&api, "node-report") >= 2);
    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn lease_is_owned_renewed_and_survives_an_api_server_restart() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-lease", dir.path());
    let nodes: Api<Node> = Api::all(api.client());
    let leases: Api<Lease> = Api::namespaced(api.client(), "kube-node-lease");
    let run = Running::start(api.client(), &cfg, true);

    let node = wait_for("the node", 20, async || {
        nodes.get_opt("node-lease").await.ok().flatten()
    })
    .await;
    let uid = node.metadata.uid.clone().unwrap();
    let lease = wait_for("the lease owned by the node", 20, async || {
        let l = leases.get_opt("node-lease").await.ok().flatten()?;
        let owners = l.metadata.owner_references.clone()?;
        (owners.first()?.uid == uid).then_some(l)
    })
    .await;
    let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Node", "node-lease")
    );
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-lease"));
    assert_eq!(spec.lease_duration_seconds, Some(1));
    let renewed = spec.renew_time.unwrap();
    let later = wait_for("a renewal", 20, async || {
        let l = leases.get_opt("node-lease").await.ok().flatten()?;
        let t = l.spec?.renew_time?;
        (t.0 > renewed.0).then_some(t)
    })
    .await;

    // The API server goes away for a while and comes back: the lease is renewed again.
    api.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.restart().await;
    let leases: Api<Lease> = Api::namespaced(api.client(), "kube-node-lease");
    let restarted_at = k8s_openapi::jiff::Timestamp::now();
    wait_for("a renewal after the restart", 30, async || {
        let l = leases.get_opt("node-lease").await.ok().flatten()?;
        let t = l.spec?.renew_time?;
        (t.0 > later.0 && t.0 >= restarted_at).then_some(())
    })
    .await;
    // The node status is written again too.
    run.set_health(Health::not_ready(["container runtime is down"]));
    wait_for("Ready=False after the restart", 20, async || {
        let n = nodes.get_opt("node-lease").await.ok().flatten()?;
        (condition(&n, "Ready")?.status == "False").then_some(())
    })
    .await;

    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn adopts_an_existing_node() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-old", dir.path());
    let nodes: Api<Node> = Api::all(api.client());
    let existing: Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "node-old",
            "labels": {"kubernetes.io/os": "plan9", "team": "a"},
        },
    }))
    .unwrap();
    let created = nodes
        .create(&PostParams::default(), &existing)
        .await
        .unwrap();
    let run = Running::start(api.client(), &cfg, false);
    let node = wait_for("the adopted node to be Ready", 20, async || {
        let n = nodes.get_opt("node-old").await.ok().flatten()?;
        (condition(&n, "Ready")?.status == "True").then_some(n)
    })
    .await;
    // The same object, not a new one.
    assert_eq!(node.metadata.uid, created.metadata.uid);
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/hostname"], "node-old");
    assert_eq!(labels["team"], "a");
    assert_eq!(
        node.metadata.annotations.as_ref().unwrap()["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );
    assert_eq!(node.status.unwrap().capacity.unwrap()["pods"].0, "17");
    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn agent_reports_runtime_health_and_images() {
    use nodelet::node::agent::RUNTIME_CHECK_PERIOD;
    use nodelet::node::{NodeAgent, RuntimeState};
    use runtime::cri;
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-agent", dir.path());
    let nodes: Api<Node> = Api::all(api.client());
    let fake = Arc::new(runtime::fake::FakeRuntime::new());
    fake.set_fake_images(&["docker.io/library/busybox:1.36"]);
    let cond = |t: &str, ok: bool| cri::RuntimeCondition {
        r#type: t.into(),
        status: ok,
        reason: if ok { "" } else { "NetworkPluginNotReady" }.into(),
        message: if ok { "" } else { "no CNI config" }.into(),
    };
    fake.set_runtime_conditions(vec![
        cond("RuntimeReady", true),
        cond("NetworkReady", false),
    ]);
    let facts = NodeFacts::gather(&cfg, "fake", "0.0.1").unwrap();
    let pleg_ok = Arc::new(Mutex::new(true));
    let p = pleg_ok.clone();
    let state = Arc::new(RuntimeState::default());
    let checks = tokio::spawn(state.clone().run_checks(
        fake.clone(),
        RUNTIME_CHECK_PERIOD,
        std::future::pending(),
    ));
    let (recorder, sink) =
        nodelet::api::events::EventRecorder::new(Some(api.client()), "node-agent".into());
    tokio::spawn(sink);
    let agent = NodeAgent::spawn(
        api.client(),
        &cfg,
        facts,
        state,
        fake.clone(),
        Arc::new(move |h: &mut nodelet::node::conditions::Health| {
            if !*p.lock().unwrap() {
                h.problems.push(
                    "PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s"
                        .into(),
                );
            }
        }),
        nodelet::node::agent::Reporting {
            events: Some(recorder),
            devices: None,
        },
    );
    let node = wait_for("Ready=False for the network", 20, async || {
        let n = nodes.get_opt("node-agent").await.ok().flatten()?;
        let r = condition(&n, "Ready")?;
        (r.message.as_deref()
            == Some("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:no CNI config"))
        .then_some(n)
    })
    .await;
    let status = node.status.unwrap();
    // The runtime's (fake: no) handlers and features are reported.
    assert_eq!(
        status.features.and_then(|f| f.supplemental_groups_policy),
        Some(false)
    );
    let images = status.images.unwrap_or_default();
    assert!(
        images.iter().any(|i| i
            .names
            .iter()
            .flatten()
            .any(|n| n == "docker.io/library/busybox:1.36")),
        "{images:?}"
    );
    // The network comes up (seen on the next runtime check), then the PLEG goes bad.
    fake.set_runtime_conditions(vec![cond("RuntimeReady", true), cond("NetworkReady", true)]);
    wait_for("Ready=True", 20, async || {
        let n = nodes.get_opt("node-agent").await.ok().flatten()?;
        (condition(&n, "Ready")?.status == "True").then_some(())
    })
    .await;
    *pleg_ok.lock().unwrap() = false;
    wait_for("Ready=False for the PLEG", 20, async || {
        let n = nodes.get_opt("node-agent").await.ok().flatten()?;
        let r = condition(&n, "Ready")?;
        r.message
            .as_deref()?
            .starts_with("PLEG is not healthy")
            .then_some(())
    })
    .await;
    assert_eq!(
        agent.node().unwrap().metadata.name.as_deref(),
        Some("node-agent")
    );
    // Each flip of Ready was an event about the Node: NotReady (network), Ready, NotReady
    // (PLEG); the first write also said the pressures are off.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(api.client(), "default");
    let ready_events = wait_for("NodeReady / NodeNotReady events", 20, async || {
        let list = events.list(&Default::default()).await.ok()?;
        let count = |reason: &str| -> i32 {
            list.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .map(|e| e.count.unwrap_or(1))
                .sum()
        };
        let got = (
            count("NodeNotReady"),
            count("NodeReady"),
            count("NodeHasSufficientMemory"),
        );
        (got.0 >= 2 && got.1 >= 1).then_some((got, list))
    })
    .await;
    let ((_, _, memory), list) = ready_events;
    assert_eq!(memory, 1, "one NodeHasSufficientMemory");
    let ready = list
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeReady"))
        .expect("NodeReady");
    assert_eq!(
        ready.message.as_deref(),
        Some("Node node-agent status is now: NodeReady")
    );
    assert_eq!(ready.involved_object.kind.as_deref(), Some("Node"));
    agent.stop().await;
    checks.abort();
    api.stop().await;
}

#[tokio::test]
async fn a_deleted_node_is_registered_again() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-gone", dir.path());
    let nodes: Api<Node> = Api::all(api.client());
    let run = Running::start(api.client(), &cfg, false);
    let first = wait_for("the node", 20, async || {
        nodes.get_opt("node-gone").await.ok().flatten()
    })
    .await;
    nodes
        .delete("node-gone", &Default::default())
        .await
        .unwrap();
    let again = wait_for("the node registered again", 20, async || {
        let n = nodes.get_opt("node-gone").await.ok().flatten()?;
        (n.metadata.uid != first.metadata.uid && condition(&n, "Ready")?.status == "True")
            .then_some(n)
    })
    .await;
    assert_eq!(
        again.metadata.labels.unwrap()["kubernetes.io/hostname"],
        "node-gone"
    );
    assert_eq!(run.manager.node().unwrap().metadata.uid, again.metadata.uid);
    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn register_node_false_only_updates_an_existing_node() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("node-unreg", dir.path());
    cfg.register_node = false;
    let nodes: Api<Node> = Api::all(api.client());
    let run = Running::start(api.client(), &cfg, false);
    // Ticks come and go without creating the Node.
    wait_for("a few status ticks", 20, async || {
        let gets = api
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/nodes/node-unreg"))
            .count();
        (gets >= 5).then_some(())
    })
    .await;
    assert!(nodes.get_opt("node-unreg").await.unwrap().is_none());
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.starts_with("POST /api/v1/nodes"))
    );
    // Someone creates it: its status becomes ours.
    let bare: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "node-unreg"}})).unwrap();
    nodes.create(&PostParams::default(), &bare).await.unwrap();
    wait_for(
        "the status on the node created by someone else",
        20,
        async || {
            let n = nodes.get_opt("node-unreg").await.ok().flatten()?;
            (condition(&n, "Ready")?.status == "True").then_some(())
        },
    )
    .await;
    run.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn a_server_that_never_answers_does_not_stall_the_lease() {
    // Accepts connections and reads requests but never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(Mutex::new(0usize));
    let count = accepted.clone();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            *count.lock().unwrap() += 1;
            held.push(conn);
        }
    });
    nodelet::api::install_crypto_provider();
    let client =
        kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap()))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("node-hung", dir.path());
    let (_tx, rx) = tokio::sync::watch::channel(None);
    let controller = LeaseController::new(client, &cfg, rx);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        controller
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    // Each unanswered request is given up after the heartbeat timeout and tried again on a
    // new connection, instead of waiting on the first one for minutes.
    wait_for("a second attempt", 30, async || {
        (*accepted.lock().unwrap() >= 2).then_some(())
    })
    .await;
    let _ = stop.send(());
    task.await.unwrap();
    server.abort();
}

/// `--cloud-provider=external`: the node registers with the uninitialized taint, its
/// `--node-ip` in the provided-node-ip annotation and as its address; once the cloud
/// controller has set the addresses, the status manager's writes keep them (upstream's
/// NodeAddress setter) instead of putting its own back.
#[tokio::test]
async fn an_external_cloud_providers_addresses_are_kept() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("node-cloud", dir.path());
    cfg.registration.external_cloud_provider = true;
    cfg.node_status_report_frequency = Duration::from_millis(400);
    let nodes: Api<Node> = Api::all(api.client());
    let run = Running::start(api.client(), &cfg, false);
    let node = wait_for("the node", 20, async || {
        nodes.get_opt("node-cloud").await.ok().flatten()
    })
    .await;
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("alpha.kubernetes.io/provided-node-ip")
            .map(String::as_str),
        Some("10.9.8.7")
    );
    let taints = node.spec.clone().and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"),
        "{taints:?}"
    );
    let internal = |n: &Node| -> Vec<String> {
        n.status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect()
    };
    assert_eq!(internal(&node), vec!["10.9.8.7".to_string()]);

    // The cloud controller sets the addresses it knows.
    let cloud = serde_json::json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "10.1.2.3"},
        {"type": "ExternalIP", "address": "203.0.113.9"},
        {"type": "Hostname", "address": "node-cloud"},
    ]}});
    nodes
        .patch_status(
            "node-cloud",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cloud),
        )
        .await
        .expect("the cloud controller's addresses");
    let before = status_patches(&api, "node-cloud");
    wait_for("two more status writes", 20, async || {
        (status_patches(&api, "node-cloud") >= before + 2).then_some(())
    })
    .await;
    let node = nodes.get("node-cloud").await.unwrap();
    assert_eq!(internal(&node), vec!["10.1.2.3".to_string()]);
    run.stop().await;
    api.stop().await;
}
