//! Node-pressure eviction end to end: `nodelet run-node` against the project's test API server.
//!
//! - Memory (both runtimes): the node's `memory.available` threshold is set 1 GiB below what
//!   the machine has free when the test starts; a Burstable pod then fills 1.5 GiB of a
//!   memory-backed emptyDir. Within a monitoring period the Node reports MemoryPressure, the hog
//!   ends Failed/`Evicted` with upstream's message (the threshold, what was available, the
//!   container using more than it requests) and the `DisruptionTarget` condition, the
//!   Guaranteed pod beside it keeps running, the agent is not OOM-killed, and a BestEffort pod
//!   created meanwhile is refused with upstream's reason and message. An agent started again
//!   does not start the evicted pod again, and its status stays.
//! - Disk (both runtimes, the root dir on a 128 MiB tmpfs of its own): a pod with an emptyDir
//!   over its `sizeLimit` is evicted for it (local storage isolation); then a pod filling its
//!   emptyDir pushes `nodefs.available` under 40%: the Node reports DiskPressure and the pod
//!   using the most disk is evicted, not the other one; its emptyDir's space comes back. On
//!   the built-in runtime the images share the root dir's filesystem, so the kubelet first
//!   removes the unused image (not enough); containerd's root is a tmpfs of its own (a
//!   dedicated image filesystem), so, as upstream, no image is removed for `nodefs` pressure.
//!
//! Needs root; skips loudly otherwise.

mod apiserver;
mod common;

use std::path::Path;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Event, Node, Pod, PodStatus};
use kube::Api;
use kube::api::{ListParams, PostParams};

const MI: i64 = 1024 * 1024;

/// The memory tests measure the whole machine: one at a time.
static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn status(pods: &Api<Pod>, name: &str) -> Option<PodStatus> {
    pods.get_opt(name).await.ok().flatten()?.status
}

async fn wait_running(pods: &Api<Pod>, name: &str) {
    wait_for(&format!("{name} running"), 90, async || {
        let st = status(pods, name).await?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

async fn wait_evicted(pods: &Api<Pod>, name: &str, secs: u64) -> PodStatus {
    wait_for(&format!("{name} evicted"), secs, async || {
        let st = status(pods, name).await?;
        (st.phase.as_deref() == Some("Failed")).then_some(st)
    })
    .await
}

/// The Node's condition `type_` is True.
async fn condition_true(api: &ApiServer, node: &str, type_: &str) -> bool {
    let nodes: Api<Node> = Api::all(api.client());
    nodes
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.conditions)
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// The events about `name` (any kind) with `reason`.
async fn events(api: &ApiServer, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::all(api.client());
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// What the kubelet counts as the machine's available memory: capacity less the root memory
/// cgroup's working set (usage less inactive file pages), from `/proc/meminfo` on v2.
fn memory_available() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib = |key: &str| -> i64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|r| r.split_whitespace().next()?.parse::<i64>().ok())
            .expect("a meminfo field")
            * 1024
    };
    let total = kib("MemTotal");
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let working_set = match std::fs::read_to_string(v1.join("memory.usage_in_bytes")) {
        Ok(usage) => {
            let stat = std::fs::read_to_string(v1.join("memory.stat")).expect("memory.stat");
            let inactive: i64 = stat
                .lines()
                .find_map(|l| l.strip_prefix("total_inactive_file "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            usage.trim().parse::<i64>().expect("usage") - inactive
        }
        Err(_) => total - kib("MemFree") - kib("Inactive(file)"),
    };
    total - working_set
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_hog_is_evicted_guaranteed_pod_stays_builtin() {
    memory_hog_is_evicted(
        Backend::Builtin,
        "memory_hog_is_evicted_guaranteed_pod_stays_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_hog_is_evicted_guaranteed_pod_stays_containerd() {
    memory_hog_is_evicted(
        Backend::Containerd,
        "memory_hog_is_evicted_guaranteed_pod_stays_containerd",
    )
    .await;
}

async fn memory_hog_is_evicted(backend: Backend, test: &str) {
    let _one_at_a_time = MEMORY.lock().await;
    let api = ApiServer::start().await;
    let name = match backend {
        Backend::Builtin => "eviction-memory-builtin",
        Backend::Containerd => "eviction-memory-containerd",
    };
    let setup = Setup {
        name,
        config: "",
        cri_listen: false,
    };
    let Some(node) = ApiNode::prepare(&setup, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let available = memory_available();
    let threshold = (available - 1024 * MI) / MI;
    assert!(threshold > 0, "the machine has {available} bytes available");
    let mut config = std::fs::read_to_string(&node.config)
        .expect("the config")
        .replace(common::TEST_EVICTION_HARD, "");
    config.push_str(&format!(
        "evictionHard: {{memory.available: {threshold}Mi}}\nevictionPressureTransitionPeriod: 5m\n"
    ));
    std::fs::write(&node.config, config).expect("writing the config");

    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let guaranteed = format!(
        "  containers:\n{}    resources:\n      requests: {{cpu: 100m, memory: 32Mi}}\n      limits: {{cpu: 100m, memory: 32Mi}}\n",
        busybox("app", "exec sleep 3600")
    );
    let hog = format!(
        "  terminationGracePeriodSeconds: 30\n  volumes:\n  - name: cache\n    emptyDir: {{medium: Memory, sizeLimit: 2Gi}}\n  containers:\n{}    resources:\n      requests: {{memory: 10Mi}}\n    volumeMounts:\n    - {{name: cache, mountPath: /cache}}\n",
        busybox(
            "hog",
            "dd if=/dev/zero of=/cache/fill bs=1M count=1536 && exec sleep 3600"
        )
    );
    pods.create(&PostParams::default(), &node.pod("steady", &guaranteed))
        .await
        .expect("creating the guaranteed pod");
    let mut agent = node.start();
    wait_running(&pods, "steady").await;
    assert!(
        !condition_true(&api, name, "MemoryPressure").await,
        "no pressure before the hog"
    );
    pods.create(&PostParams::default(), &node.pod("hog", &hog))
        .await
        .expect("creating the hog");

    let st = wait_evicted(&pods, "hog", 90).await;
    assert_eq!(st.reason.as_deref(), Some("Evicted"), "{st:?}");
    let message = st.message.clone().unwrap_or_default();
    let prefix = format!(
        "The node was low on resource: memory. Threshold quantity: {threshold}Mi, available: "
    );
    assert!(message.starts_with(&prefix), "{message:?}");
    assert!(
        message.contains("Container hog was using ")
            && message.ends_with(", request is 10Mi, has larger consumption of memory. "),
        "{message:?}"
    );
    let disruption = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("the DisruptionTarget condition");
    assert_eq!(disruption.status, "True");
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    assert!(
        condition_true(&api, name, "MemoryPressure").await || {
            // The status loop writes every 2 s.
            wait_for("MemoryPressure", 10, async || {
                condition_true(&api, name, "MemoryPressure")
                    .await
                    .then_some(())
            })
            .await;
            true
        }
    );
    wait_for("the Evicted event", 20, async || {
        (!events(&api, "hog", "Evicted").await.is_empty()).then_some(())
    })
    .await;
    assert!(!events(&api, name, "EvictionThresholdMet").await.is_empty());

    // A BestEffort pod is refused while the pressure lasts; the Guaranteed one runs on.
    let best_effort = format!("  containers:\n{}", busybox("app", "exec sleep 3600"));
    pods.create(&PostParams::default(), &node.pod("late", &best_effort))
        .await
        .expect("creating the late pod");
    let late = wait_evicted(&pods, "late", 20).await;
    assert_eq!(late.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        late.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    let steady = status(&pods, "steady").await.expect("steady's status");
    assert_eq!(steady.phase.as_deref(), Some("Running"));
    let restarts = steady
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .sum::<i32>();
    assert_eq!(restarts, 0, "the guaranteed pod was not touched");
    assert!(
        agent.0.try_wait().expect("the agent's state").is_none(),
        "the agent is alive"
    );
    // The hog's memory came back with its emptyDir.
    wait_for("the hog's memory given back", 30, async || {
        (memory_available() > available - 300 * MI).then_some(())
    })
    .await;

    // An agent started again never starts the evicted pod again (the API server shows it
    // Failed), and keeps its status.
    let hog_uid = pods
        .get("hog")
        .await
        .expect("the hog")
        .metadata
        .uid
        .expect("a uid");
    drop(agent);
    // (Without the test's threshold now: what the machine's memory does meanwhile is not
    // this check's business.)
    let config = std::fs::read_to_string(&node.config).expect("the config");
    let config: String = config
        .lines()
        .filter(|l| !l.starts_with("evictionHard"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(
        &node.config,
        format!("{config}{}", common::TEST_EVICTION_HARD),
    )
    .expect("writing the config");
    let _agent = node.start();
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let running = node
        .containers_of(&hog_uid)
        .await
        .into_iter()
        .filter(|(_, _, state)| *state == runtime::cri::ContainerState::ContainerRunning as i32)
        .count();
    assert_eq!(running, 0, "the evicted pod started again");
    let st = status(&pods, "hog").await.expect("the hog's status");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    assert_eq!(st.message.as_deref(), Some(message.as_str()));
    assert_eq!(
        status(&pods, "steady")
            .await
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Running")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_pressure_reclaims_images_then_evicts_the_biggest_user_builtin() {
    disk_pressure(
        Backend::Builtin,
        "disk_pressure_reclaims_images_then_evicts_the_biggest_user_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_pressure_with_a_dedicated_image_fs_evicts_the_biggest_user_containerd() {
    disk_pressure(
        Backend::Containerd,
        "disk_pressure_with_a_dedicated_image_fs_evicts_the_biggest_user_containerd",
    )
    .await;
}

async fn disk_pressure(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let mut tmpfs = common::Tmpfs(None);
    let setup = Setup {
        name: "eviction-disk",
        config: "imageMinimumGCAge: 0s\nimageGCHighThresholdPercent: 100\nevictionHard: {nodefs.available: 40%}\n",
        cri_listen: false,
    };
    let Some(node) = ApiNode::prepare_with_containerd_root(
        &setup,
        backend,
        test,
        |dir| api.write_kubeconfig(dir),
        Some("96m"),
    )
    .await
    else {
        return;
    };
    let work = tempfile::tempdir().expect("a work dir");
    let extra = work.path().join("extra.tar");
    let blob = work.path().join("extra.bin");
    std::fs::write(&blob, vec![7u8; 4 << 20]).expect("the extra image's bytes");
    let st = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh"))
        .arg(&extra)
        .args(["--name", "docker.io/library/extra:1", "--add"])
        .arg(format!("{}:/data/extra", blob.display()))
        .status()
        .expect("running build-busybox-image.sh");
    assert!(st.success(), "building the extra image");
    std::fs::create_dir_all(&node.root).expect("the root dir");
    tmpfs.mount(&node.root, "128m");
    if node.containerd.is_none() {
        common::import_busybox(&node.root);
    }
    node.add_image(&extra, "docker.io/library/extra:1").await;

    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let filling = |mib: u32, limit: &str| {
        format!(
            "  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: data\n    emptyDir: {{{limit}}}\n  containers:\n{}    volumeMounts:\n    - {{name: data, mountPath: /data}}\n",
            busybox(
                "app",
                &format!("dd if=/dev/zero of=/data/fill bs=1M count={mib} && exec sleep 3600")
            )
        )
    };
    // Over its sizeLimit: evicted for it, without the node being under pressure.
    pods.create(
        &PostParams::default(),
        &node.pod("over-limit", &filling(12, "sizeLimit: 8Mi")),
    )
    .await
    .expect("creating over-limit");
    let mut agent = node.start();
    let st = wait_evicted(&pods, "over-limit", 60).await;
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        st.message.as_deref(),
        Some("Usage of EmptyDir volume \"data\" exceeds the limit \"8Mi\". ")
    );
    assert!(
        !st.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget"),
        "local storage evictions carry no DisruptionTarget"
    );
    assert!(!condition_true(&api, "eviction-disk", "DiskPressure").await);

    // A small user, then a big one: past the threshold.
    pods.create(&PostParams::default(), &node.pod("small", &filling(2, "")))
        .await
        .expect("creating small");
    wait_running(&pods, "small").await;
    let (capacity, before) = common::fs_space(&node.root);
    assert!(
        before * 100 / capacity > 60,
        "room before: {before} of {capacity}"
    );
    pods.create(&PostParams::default(), &node.pod("big", &filling(80, "")))
        .await
        .expect("creating big");
    let st = wait_evicted(&pods, "big", 90).await;
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    let message = st.message.clone().unwrap_or_default();
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message:?}"
    );
    assert!(
        st.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget")
    );
    wait_for("DiskPressure", 10, async || {
        condition_true(&api, "eviction-disk", "DiskPressure")
            .await
            .then_some(())
    })
    .await;
    let log = std::fs::read_to_string(node.root.with_extension("log")).unwrap_or_default();
    let listed: Vec<String> = node
        .images()
        .await
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    let has = |name: &str| listed.iter().any(|t| t.contains(name));
    assert!(has("busybox"), "{listed:?}");
    if node.containerd.is_none() {
        // Reclaimed first: the unused image; busybox (in use) stays.
        assert!(log.contains("reclaimed node-level disk"), "{log}");
        assert!(!has("extra"), "{listed:?}");
    } else {
        // The images are on a filesystem of their own: removing one would free nothing here.
        assert!(log.contains("no node-level reclaim"), "{log}");
        assert!(!log.contains("reclaimed node-level disk"), "{log}");
        assert!(has("extra"), "{listed:?}");
    }
    // The small pod runs on; the big one's emptyDir went with it.
    assert_eq!(
        status(&pods, "small")
            .await
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Running")
    );
    wait_for("the big pod's space given back", 30, async || {
        let (capacity, now) = common::fs_space(&node.root);
        (now * 100 / capacity > 50).then_some(())
    })
    .await;
    assert!(agent.0.try_wait().expect("the agent's state").is_none());
}
