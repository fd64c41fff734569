//! The kubelet's cgroup tree end to end (`nodelet run-node` against the project's test API
//! server), on the built-in runtime and on a real containerd: under the node's own
//! `cgroupRoot`, `kubepods` capped at capacity minus `kubeReserved` and `systemReserved`
//! (`enforceNodeAllocatable: [pods]`, the default), one pod of each QoS class with its cgroup
//! in upstream's place and with upstream's values (read back from the cgroup files), the
//! containers' processes inside their pod's cgroup with the QoS class's `oom_score_adj`, the
//! agent at -999, an in-place resize reaching the pod's and the container's cgroups (and an
//! infeasible one waiting), and a deleted pod's cgroup removed while the QoS cgroups follow.
//!
//! cgroup v1 only: this machine's unified hierarchy has no controllers (they are all bound to
//! v1), so a v2 tree cannot be made here; the v2 paths are covered by `cm`'s unit tests
//! (mountinfo, the shares-to-weight mapping). Needs root; skips loudly otherwise.

mod apiserver;
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NODE: &str = "cgroups-node";

const SETUP: Setup = Setup {
    name: NODE,
    config: "syncFrequency: 2s\npodPidsLimit: 256\nkubeReserved: {memory: 100Mi, pid: '1000'}\nsystemReserved: {cpu: 100m}\n",
    cri_listen: false,
};

/// A cgroup file of `cgroup` (relative to the hierarchy's root) in the v1 `controller`.
fn read(controller: &str, cgroup: &str, file: &str) -> String {
    let path = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(cgroup.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The cgroup of `pid` in the v1 `controller` (relative to the hierarchy's root).
fn own_cgroup(pid: i32, controller: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its cgroups");
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':').skip(1);
            parts.next().zip(parts.next())
        })
        .find(|(cs, _)| cs.split(',').any(|c| c == controller))
        .map(|(_, path)| path.to_string())
        .unwrap_or_else(|| panic!("no {controller} cgroup for {pid}: {text}"))
}

/// The processes in `cgroup` and below it (the pids hierarchy).
fn pids_under(cgroup: &str) -> Vec<i32> {
    common::pids_in_cgroups(cgroup)
}

fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).replace('\0', " ")
}

fn oom_score_adj(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("oom_score_adj of {pid}"))
}

/// Whether a process here may lower its `oom_score_adj` (CAP_SYS_RESOURCE): a child tries.
fn can_lower_oom_score_adj() -> bool {
    std::process::Command::new("sh")
        .args(["-c", "echo -1 > /proc/self/oom_score_adj"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The pid of the `sleep` a pod's container runs, found in its pod cgroup.
fn sleeper_in(cgroup: &str, marker: &str) -> Option<i32> {
    pids_under(cgroup)
        .into_iter()
        .find(|p| cmdline(*p).contains(marker))
}

#[tokio::test(flavor = "multi_thread")]
async fn qos_cgroup_tree_builtin() {
    qos_cgroup_tree(Backend::Builtin, "qos_cgroup_tree_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qos_cgroup_tree_containerd() {
    qos_cgroup_tree(Backend::Containerd, "qos_cgroup_tree_containerd").await;
}

async fn qos_cgroup_tree(backend: Backend, test: &str) {
    if !Path::new("/sys/fs/cgroup/memory").is_dir() {
        common::skip("cgroup v1 controllers are not mounted here", test);
        return;
    }
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&SETUP, backend, test, |dir| api.write_kubeconfig(dir)).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = |script: &str, resources: &str| {
        let container = busybox("app", script);
        format!(
            "  terminationGracePeriodSeconds: 1\n  containers:\n{container}    resources: {resources}\n"
        )
    };
    let wanted = [
        (
            "guaranteed",
            "exec sleep 3601",
            "{limits: {cpu: 200m, memory: 64Mi}}",
        ),
        (
            "burstable",
            "exec sleep 3602",
            "{requests: {cpu: 100m, memory: 16Mi}, limits: {memory: 128Mi}}",
        ),
        ("besteffort", "exec sleep 3603", "{}"),
    ];
    let mut uids = Vec::new();
    for (name, script, resources) in wanted {
        let created = pods
            .create(
                &PostParams::default(),
                &node.pod(name, &spec(script, resources)),
            )
            .await
            .expect("creating the pod");
        uids.push(created.metadata.uid.expect("a uid"));
    }
    let agent = node.start();
    for (name, _, _) in wanted {
        wait_for(&format!("{name} running"), 120, async || {
            let st = pods.get_opt(name).await.ok().flatten()?.status?;
            (st.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    let kubepods = format!("{}/kubepods", node.cgroup_root);

    // kubepods: the node's capacity less what kubeReserved and systemReserved keep (not the
    // eviction threshold, which only allocatable subtracts).
    let nodes: Api<Node> = Api::all(api.client());
    let status = nodes
        .get(NODE)
        .await
        .expect("the Node")
        .status
        .expect("status");
    let capacity = status.capacity.expect("capacity");
    let mem_capacity = nodelet::util::quantity::parse_bytes(&capacity["memory"].0).expect("memory");
    let cpu_capacity = nodelet::util::quantity::parse_cpu_millis(&capacity["cpu"].0).expect("cpu");
    // (The kernel keeps whole pages of a limit.)
    let pages = |bytes: i64| bytes / 4096 * 4096;
    assert_eq!(
        read("memory", &kubepods, "memory.limit_in_bytes"),
        pages(mem_capacity - (100 << 20)).to_string()
    );
    assert_eq!(
        read("cpu", &kubepods, "cpu.shares"),
        ((cpu_capacity - 100) * 1024 / 1000).to_string()
    );
    // Process IDs: the kernel's, less the 1000 reserved.
    let pid_max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(
        read("pids", &kubepods, "pids.max"),
        (pid_max - 1000).to_string()
    );
    // Allocatable also keeps the default memory.available threshold (100Mi).
    let allocatable = status.allocatable.expect("allocatable");
    assert_eq!(
        nodelet::util::quantity::parse_bytes(&allocatable["memory"].0).expect("memory"),
        mem_capacity - (200 << 20)
    );

    // The QoS cgroups: burstable's shares are its one pod's 100m.
    assert_eq!(
        read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
        "102"
    );
    assert_eq!(
        read("cpu", &format!("{kubepods}/besteffort"), "cpu.shares"),
        "2"
    );

    // Each pod's cgroup, in its class's place, with upstream's values.
    let g = format!("{kubepods}/pod{}", uids[0]);
    assert_eq!(read("cpu", &g, "cpu.shares"), "204");
    assert_eq!(read("cpu", &g, "cpu.cfs_period_us"), "100000");
    assert_eq!(read("cpu", &g, "cpu.cfs_quota_us"), "20000");
    assert_eq!(
        read("memory", &g, "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    assert_eq!(read("pids", &g, "pids.max"), "256");
    let b = format!("{kubepods}/burstable/pod{}", uids[1]);
    assert_eq!(read("cpu", &b, "cpu.shares"), "102");
    assert_eq!(read("cpu", &b, "cpu.cfs_quota_us"), "-1", "no CPU limit");
    assert_eq!(
        read("memory", &b, "memory.limit_in_bytes"),
        (128u64 << 20).to_string()
    );
    let e = format!("{kubepods}/besteffort/pod{}", uids[2]);
    assert_eq!(read("cpu", &e, "cpu.shares"), "2");
    assert_eq!(read("pids", &e, "pids.max"), "256");

    // The containers run inside their pod's cgroup, with their class's oom_score_adj.
    let sleeper = |cg: &str, marker: &str| {
        sleeper_in(cg, marker)
            .unwrap_or_else(|| panic!("no `{marker}` in {cg}: {:?}", pids_under(cg)))
    };
    let (gp, bp, ep) = (
        sleeper(&g, "sleep 3601"),
        sleeper(&b, "sleep 3602"),
        sleeper(&e, "sleep 3603"),
    );
    // Lowering an oom_score_adj needs CAP_SYS_RESOURCE, which this machine's root may lack:
    // then the agent keeps the one it was started with, and nothing of the pod goes below it
    // (as containerd's restrict_oom_score_adj).
    let agent_adj = oom_score_adj(agent.0.id() as i32);
    let floor = if can_lower_oom_score_adj() {
        assert_eq!(agent_adj, -999, "the agent's own");
        -1000
    } else {
        assert_eq!(
            agent_adj,
            oom_score_adj(std::process::id() as i32),
            "the agent's own, kept"
        );
        agent_adj
    };
    let burstable_adj = (1000 - 1000 * (16i64 << 20) / mem_capacity).clamp(3, 999);
    assert_eq!(i64::from(oom_score_adj(bp)), burstable_adj);
    assert_eq!(oom_score_adj(ep), 1000);
    match backend {
        Backend::Builtin => {
            assert_eq!(oom_score_adj(gp), (-997).max(floor));
            // The sandbox process: -998, in the pod cgroup's `sandbox`.
            let sandbox = pids_under(&format!("{g}/sandbox"));
            assert!(!sandbox.is_empty(), "the sandbox process in {g}/sandbox");
            for p in sandbox {
                assert_eq!(oom_score_adj(p), (-998).max(floor), "{}", cmdline(p));
            }
        }
        // containerd's restrict_oom_score_adj keeps it at containerd's own (that of the test
        // that started it).
        Backend::Containerd => assert_eq!(
            oom_score_adj(gp),
            (-997).max(oom_score_adj(std::process::id() as i32))
        ),
    }

    // An in-place resize (`pods/resize`): the pod's and the container's CPU quota follow, the
    // container keeps running (same process, no restart), the status shows the allocation and
    // what runs; a resize larger than the node waits as Infeasible and changes nothing.
    let resize_to = |cpu: &str, memory: &str| {
        let body = serde_json::json!({"spec": {"containers": [{"name": "app", "resources": {
            "requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}}]}});
        let pods = pods.clone();
        async move {
            pods.patch_subresource(
                "resize",
                "guaranteed",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(body),
            )
            .await
            .expect("resizing the pod")
        }
    };
    let resize = |cpu: &str| resize_to(cpu, "64Mi");
    resize("300m").await;
    let container_cg = own_cgroup(gp, "cpu");
    let container_cg_memory = own_cgroup(gp, "memory");
    wait_for("the resize applied", 60, async || {
        let st = pods.get("guaranteed").await.ok()?.status?;
        let cs = st.container_statuses.as_ref()?.first()?.clone();
        let done = read("cpu", &g, "cpu.cfs_quota_us") == "30000"
            && read("cpu", &container_cg, "cpu.cfs_quota_us") == "30000"
            && cs.allocated_resources.as_ref()?.get("cpu")?.0 == "300m"
            && cs.resources.as_ref()?.limits.as_ref()?.get("cpu")?.0 == "300m"
            && !st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_.starts_with("PodResize"));
        done.then_some(())
    })
    .await;
    assert_eq!(read("cpu", &g, "cpu.shares"), "307");
    assert_eq!(
        sleeper(&g, "sleep 3601"),
        gp,
        "resized in place, not restarted"
    );
    let st = pods.get("guaranteed").await.unwrap().status.unwrap();
    assert_eq!(st.container_statuses.unwrap()[0].restart_count, 0);
    resize("100000").await;
    wait_for("the infeasible resize pending", 60, async || {
        let st = pods.get("guaranteed").await.ok()?.status?;
        let c = st
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodResizePending")?;
        (c.reason.as_deref() == Some("Infeasible")).then_some(c.message?)
    })
    .await;
    assert_eq!(
        read("cpu", &g, "cpu.cfs_quota_us"),
        "30000",
        "nothing changed"
    );
    // Shrunk below where it began: the container's quota first, then the pod's (cgroup v1
    // refuses a pod quota below its container's).
    resize("150m").await;
    wait_for("the shrinking resize applied", 60, async || {
        let st = pods.get("guaranteed").await.ok()?.status?;
        let cs = st.container_statuses.as_ref()?.first()?.clone();
        let done = read("cpu", &g, "cpu.cfs_quota_us") == "15000"
            && read("cpu", &container_cg, "cpu.cfs_quota_us") == "15000"
            && cs.resources.as_ref()?.limits.as_ref()?.get("cpu")?.0 == "150m";
        done.then_some(())
    })
    .await;
    assert_eq!(sleeper(&g, "sleep 3601"), gp, "shrunk in place too");

    // A memory limit below what the container uses waits (upstream's best-effort check): 40 MiB
    // written to its /dev/shm (a tmpfs, charged to it), a resize to 32Mi is PodResizeInProgress
    // with reason Error and the usage; once the file is gone, the retry applies it.
    let app = node
        .containers_of(&uids[0])
        .await
        .into_iter()
        .find(|(_, name, state)| {
            name == "app" && *state == runtime::cri::ContainerState::ContainerRunning as i32
        })
        .expect("the guaranteed pod's running container")
        .0;
    let rt = node.runtime().await;
    let exec = async |script: &str| {
        let out = rt
            .exec_sync(runtime::cri::ExecSyncRequest {
                container_id: app.clone(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 20,
            })
            .await
            .expect("ExecSync");
        assert_eq!(
            out.exit_code,
            0,
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null").await;
    resize_to("150m", "32Mi").await;
    let message = wait_for("the memory decrease refused", 60, async || {
        let st = pods.get("guaranteed").await.ok()?.status?;
        let c = st
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodResizeInProgress")?;
        (c.reason.as_deref() == Some("Error")).then_some(c.message?)
    })
    .await;
    assert!(
        message.contains("memory limit (33554432) below its current usage"),
        "{message}"
    );
    assert_eq!(
        read("memory", &container_cg_memory, "memory.limit_in_bytes"),
        (64u64 << 20).to_string(),
        "the container keeps its limit"
    );
    exec("rm /dev/shm/fill").await;
    wait_for("the memory decrease applied", 60, async || {
        let st = pods.get("guaranteed").await.ok()?.status?;
        let done = read("memory", &container_cg_memory, "memory.limit_in_bytes")
            == (32u64 << 20).to_string()
            && read("memory", &g, "memory.limit_in_bytes") == (32u64 << 20).to_string()
            && !st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_.starts_with("PodResize"));
        done.then_some(())
    })
    .await;
    assert_eq!(
        sleeper(&g, "sleep 3601"),
        gp,
        "the memory decrease kept it running"
    );

    // A resize that does not fit next to the other pods waits (Deferred), and is allocated as
    // soon as another pod takes less: the guaranteed pod grows to leave 100m of allocatable
    // CPU, the burstable pod asks for 200m more, the guaranteed pod shrinks back.
    let cpu_allocatable =
        nodelet::util::quantity::parse_cpu_millis(&allocatable["cpu"].0).expect("cpu");
    resize_to(&format!("{}m", cpu_allocatable - 200), "32Mi").await;
    let burstable_resize = serde_json::json!({"spec": {"containers": [{"name": "app", "resources": {
        "requests": {"cpu": "300m", "memory": "16Mi"}, "limits": {"memory": "128Mi"}}}]}});
    pods.patch_subresource(
        "resize",
        "burstable",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(burstable_resize),
    )
    .await
    .expect("resizing the burstable pod");
    wait_for("the burstable resize deferred", 60, async || {
        let st = pods.get("burstable").await.ok()?.status?;
        let c = st
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodResizePending")?;
        (c.reason.as_deref() == Some("Deferred")).then_some(())
    })
    .await;
    assert_eq!(
        read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
        "102"
    );
    resize_to("150m", "32Mi").await;
    wait_for("the deferred resize allocated", 60, async || {
        let st = pods.get("burstable").await.ok()?.status?;
        let done = read("cpu", &format!("{kubepods}/burstable"), "cpu.shares") == "307"
            && !st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_.starts_with("PodResize"));
        done.then_some(())
    })
    .await;

    // A deleted pod's cgroup goes, and the QoS cgroups follow what is left.
    for name in ["besteffort", "burstable"] {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("deleting the pod");
    }
    let gone = |cg: &str| {
        !PathBuf::from("/sys/fs/cgroup/memory")
            .join(cg.trim_start_matches('/'))
            .exists()
    };
    wait_for("the deleted pods' cgroups removed", 60, async || {
        (gone(&b) && gone(&e)).then_some(())
    })
    .await;
    assert!(!gone(&g), "the guaranteed pod keeps its cgroup");
    assert_eq!(
        read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
        "2"
    );
    assert!(pids_under(&b).is_empty() && pids_under(&e).is_empty());
    drop(agent);
    tokio::time::sleep(Duration::from_millis(100)).await;
}
