//! The agent dies, the containers do not: an agent (`nodelet run --keep`) is killed with
//! SIGKILL while its containers run; a new agent over the same root dir adopts them with the same
//! PIDs, their logs keep growing, and a container that exited during the downtime is reported
//! with its real exit code.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::reboot::*;
use common::*;
use runtime::{RuntimeService, cri};

fn spawn_agent(
    root: &std::path::Path,
    cgroup: &str,
    name: &str,
    script: &str,
) -> std::process::Child {
    let _ = cgroup;
    Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(root)
        .args([
            "run", "--keep", "--name", name, BUSYBOX, "--", "sh", "-c", script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nodelet run")
}

async fn find(rt: &runtime::builtin::BuiltinRuntime, name: &str) -> Option<cri::Container> {
    rt.list_containers(cri::ListContainersRequest { filter: None })
        .await
        .ok()?
        .containers
        .into_iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
}

/// The container named `name`, its status and its sandbox's status.
async fn statuses(
    rt: &runtime::builtin::BuiltinRuntime,
    name: &str,
) -> (cri::Container, cri::ContainerStatus, cri::PodSandboxStatus) {
    let c = find(rt, name).await.expect("the container's record");
    let s = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: c.id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .status
        .unwrap();
    let sb = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: c.pod_sandbox_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .status
        .unwrap();
    (c, s, sb)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkilled_agent_leaves_containers_running_and_they_are_adopted() {
    if !root_or_skip("sigkilled_agent_leaves_containers_running_and_they_are_adopted") {
        return;
    }
    let node = Node::new("adopt").await;
    let root = node.root.path().to_path_buf();
    let mut counter = spawn_agent(
        &root,
        &node.cgroup_root,
        "counter",
        "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done",
    );
    let mut quitter = spawn_agent(
        &root,
        &node.cgroup_root,
        "quitter",
        "sleep 3; echo done; exit 42",
    );

    // Wait until both containers run, as seen by an observer runtime (opened afresh each time:
    // a runtime reads the records on disk when it starts).
    let mut ids = (None, None);
    for _ in 0..100 {
        let observer = node.reopen().await;
        ids = (
            find(&observer, "counter").await,
            find(&observer, "quitter").await,
        );
        if let (Some(a), Some(b)) = &ids {
            if a.state == cri::ContainerState::ContainerRunning as i32
                && b.state == cri::ContainerState::ContainerRunning as i32
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (Some(counter_c), Some(quitter_c)) = ids else {
        panic!("containers did not start")
    };
    let pid_of = |rt: runtime::builtin::BuiltinRuntime, id: String| async move {
        let st = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id,
                verbose: true,
            })
            .await
            .unwrap();
        let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
        (info["pid"].as_i64().unwrap(), st.status.unwrap())
    };
    let (pid_before, st) = pid_of(node.reopen().await, counter_c.id.clone()).await;
    let log = std::path::PathBuf::from(&st.log_path);

    // Kill both agents outright.
    counter.kill().expect("kill agent");
    quitter.kill().expect("kill agent");
    let _ = counter.wait();
    let _ = quitter.wait();
    let lines_at_kill = log_records(&log).len();
    tokio::time::sleep(Duration::from_secs(4)).await;

    // A new agent adopts everything.
    let agent = node.reopen().await;
    let (pid_after, st) = pid_of(agent.clone(), counter_c.id.clone()).await;
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    assert_eq!(pid_after, pid_before, "the same process, not a restart");
    let recs = log_records(&log);
    assert!(
        recs.len() > lines_at_kill + 10,
        "the log kept growing: {} -> {}",
        lines_at_kill,
        recs.len()
    );
    // No line was lost: the counter's lines are consecutive.
    let nums: Vec<u64> = recs
        .iter()
        .filter_map(|r| r.2.strip_prefix("line ")?.parse().ok())
        .collect();
    assert!(
        nums.windows(2).all(|w| w[1] == w[0] + 1),
        "lines lost: {nums:?}"
    );

    let (_, q) = pid_of(agent.clone(), quitter_c.id.clone()).await;
    assert_eq!(q.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(q.exit_code, 42);
    assert!(
        q.finished_at > q.started_at + 2_000_000_000,
        "finished ~3s after start"
    );

    // The adopted runtime controls them as before.
    agent
        .stop_container(cri::StopContainerRequest {
            container_id: counter_c.id.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    let s = agent
        .container_status(cri::ContainerStatusRequest {
            container_id: counter_c.id,
            verbose: false,
        })
        .await
        .unwrap();
    assert_eq!(
        s.status.unwrap().state,
        cri::ContainerState::ContainerExited as i32
    );
    let n = node.with_runtime(agent);
    n.teardown().await;
}

/// A sandbox process that dies while no agent runs is reaped by the next agent: its containers
/// are killed (not left running unseen), reported exited with the reason, the sandbox NotReady.
/// The sandbox process (found from /proc, not through a runtime of this process: see
/// `sandbox_of_process`) of the container an agent on `root` runs as `cmdline`, and the pod's
/// cgroup: the one above the sandbox process's own (`<pod>/sandbox`).
async fn agent_pod(root: &std::path::Path, cmdline: &[u8]) -> (i32, String) {
    let mut sandbox = None;
    for _ in 0..200 {
        sandbox = sandbox_of_process(root, cmdline);
        if sandbox.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sandbox = sandbox.expect("the container runs under a sandbox process of this root");
    let pod_cgroup = pod_cgroup_of_sandbox(sandbox);
    (sandbox, pod_cgroup)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_died_while_the_agent_was_down_is_reaped_at_adoption() {
    if !root_or_skip("a_sandbox_that_died_while_the_agent_was_down_is_reaped_at_adoption") {
        return;
    }
    let node = Node::new("reapdown").await;
    let root = node.root.path().to_path_buf();
    let mut agent = spawn_agent(&root, &node.cgroup_root, "orphan", "sleep 600");
    let (sandbox, pod_cgroup) = agent_pod(&root, b"sleep\x00600\x00").await;
    agent.kill().expect("kill agent");
    let _ = agent.wait();
    let before = pids_in_cgroups(&pod_cgroup);
    assert!(
        before.len() >= 2,
        "the sandbox and its container: {before:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sandbox),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the sandbox process");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !pids_in_cgroups(&pod_cgroup).is_empty(),
        "with no agent, the container outlives its sandbox process"
    );

    let agent = node.reopen().await;
    let (_, s, sb) = statuses(&agent, "orphan").await;
    assert_eq!(s.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(s.exit_code, 137);
    assert!(s.message.contains("sandbox process died"), "{}", s.message);
    assert_eq!(sb.state, cri::PodSandboxState::SandboxNotready as i32);
    settle(|| before.iter().all(|p| process_gone(*p))).await;
    let left: Vec<i32> = before.into_iter().filter(|p| !process_gone(*p)).collect();
    assert!(
        left.is_empty(),
        "processes of the pod left running: {left:?}"
    );
    let n = node.with_runtime(agent);
    n.teardown().await;
}

/// A container that exits while no agent runs (the one that started it was killed) keeps its
/// rootfs mounted: no one saw it exit. The next agent on the root dir unmounts it as it
/// starts; the container still reads as exited with its code and log, and is removed whole.
#[tokio::test(flavor = "multi_thread")]
async fn an_exit_while_no_agent_runs_has_its_rootfs_unmounted_by_the_next_agent() {
    if !root_or_skip("an_exit_while_no_agent_runs_has_its_rootfs_unmounted_by_the_next_agent") {
        return;
    }
    let node = Node::new("unmountdown").await;
    let root = node.root.path().to_path_buf();
    // It exits when the test says so, through its own rootfs, once its agent is gone.
    let script = "echo up; while [ ! -e /exit-now ]; do sleep 0.1; done; echo bye; exit 7";
    let mut agent = spawn_agent(&root, &node.cgroup_root, "waiter", script);
    let cmdline = format!("sh\0-c\0{script}\0");
    agent_pod(&root, cmdline.as_bytes()).await;
    agent.kill().expect("kill agent");
    let _ = agent.wait();
    let ids = state_entries(&root, "containers");
    let [id] = ids.as_slice() else {
        panic!("one container: {ids:?}")
    };
    let rootfs = state_dir(&root)
        .join("containers")
        .join(id)
        .join("rootfs")
        .canonicalize()
        .unwrap();
    std::fs::write(rootfs.join("exit-now"), "").expect("writing through the rootfs");
    settle(|| !running(cmdline.as_bytes())).await;
    assert!(!running(cmdline.as_bytes()), "the container exited");
    assert_eq!(
        mounts_under(&rootfs),
        std::slice::from_ref(&rootfs),
        "with no agent, its rootfs stays mounted"
    );

    let agent = node.reopen().await;
    assert!(
        mounts_under(&rootfs).is_empty(),
        "the next agent unmounted it as it started"
    );
    let (_, s, _) = statuses(&agent, "waiter").await;
    assert_eq!(
        (s.state, s.exit_code),
        (cri::ContainerState::ContainerExited as i32, 7)
    );
    assert_eq!(log_output(std::path::Path::new(&s.log_path)).0, "up\nbye\n");
    let n = node.with_runtime(agent);
    n.teardown().await;
}

/// A reboot ends every process and empties the tmpfs the state dir is on (sockets, bundles,
/// statuses); the records in the root dir outlive both. The sandbox then reads as stopped and
/// its container as exited with an unknown code (255, `Unknown`, as containerd reports a
/// container whose task is gone), its log is kept, its address is freed, and the pod is
/// removed whole.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_reboot_emptied_the_state_dir_pods_read_stopped_and_are_removed() {
    if !root_or_skip("after_a_reboot_emptied_the_state_dir_pods_read_stopped_and_are_removed") {
        return;
    }
    reboot_and_check("reboot", StateDirFs::Tmpfs).await;
}

/// A state dir on a disk (no tmpfs at /run) keeps its files through a reboot: the boot id it
/// was written under tells the runtime they are an earlier boot's, and the pods read as after
/// a reboot that emptied a tmpfs.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_reboot_a_state_dir_on_disk_is_known_by_its_boot_id() {
    if !root_or_skip("after_a_reboot_a_state_dir_on_disk_is_known_by_its_boot_id") {
        return;
    }
    reboot_and_check("rebootdisk", StateDirFs::Disk).await;
}

/// A pod made by an agent on a node that then reboots with its state dir on `fs`; checked as
/// the two tests above say.
async fn reboot_and_check(name: &str, fs: StateDirFs) {
    let node = Node::new(name).await;
    let root = node.root.path().to_path_buf();
    let mut agent = spawn_agent(
        &root,
        &node.cgroup_root,
        "rebooted",
        "echo before the reboot; exec sleep 600",
    );
    let (_, pod_cgroup) = agent_pod(&root, b"sleep\x00600\x00").await;
    agent.kill().expect("kill agent");
    let _ = agent.wait();

    // The reboot: every process of the pod ends, the mounts go, the state dir comes back as
    // `fs` brings it.
    assert!(
        pids_in_cgroups(&pod_cgroup).len() >= 2,
        "the sandbox and its container"
    );
    kill_pod_cgroup(&pod_cgroup).await;
    reboot_state_dir(&root, None, fs);

    let agent = node.reopen().await;
    let (c, s, sb) = statuses(&agent, "rebooted").await;
    assert_eq!(
        (s.state, s.exit_code, s.reason.as_str()),
        (cri::ContainerState::ContainerExited as i32, 255, "Unknown"),
        "{s:?}"
    );
    assert!(s.finished_at > 0, "{s:?}");
    let log = std::fs::read_to_string(&s.log_path).expect("the container's log is kept");
    assert!(log.contains("before the reboot"), "{log:?}");
    assert_eq!(sb.state, cri::PodSandboxState::SandboxNotready as i32);
    // Its address is nobody's again.
    let net = runtime::builtin::NetworkConfig::default();
    let leases = net.ipam_dir.join(&net.bridge);
    let held = std::fs::read_dir(&leases)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read_to_string(e.path())
                .is_ok_and(|t| t.lines().next() == Some(c.pod_sandbox_id.as_str()))
        });
    assert!(!held, "the rebooted pod's address is still leased");
    let n = node.with_runtime(agent);
    n.teardown().await;
}

/// An older nodelet kept each sandbox's state and each container's bundle under the root dir
/// (`<root>/sandboxes/<id>`, `<root>/containers/<id>`). Upgraded, the agent adopts those pods
/// where they are, removes them from there, and the old dirs go once empty.
#[tokio::test(flavor = "multi_thread")]
async fn pods_of_an_older_nodelet_with_state_under_the_root_dir_are_adopted_and_removed() {
    if !root_or_skip(
        "pods_of_an_older_nodelet_with_state_under_the_root_dir_are_adopted_and_removed",
    ) {
        return;
    }
    let node = Node::new("legacy").await;
    let root = node.root.path().canonicalize().unwrap();
    node.rt.leave();
    // The older nodelet: its state where the root dir is.
    let mut old = config(&root, &node.cgroup_root);
    old.network = node.network.clone();
    old.state_dir = Some(root.clone());
    let old = runtime::builtin::BuiltinRuntime::new(old)
        .await
        .expect("old runtime");
    let sb = run_sandbox_on(&old, "legacy", &node.log_dir()).await;
    let id = start_container_on(&old, &sb, container_config("c", &["sleep", "612"])).await;
    assert!(
        root.join("sandboxes")
            .join(&sb.0)
            .join("sandbox.sock")
            .exists()
    );
    assert!(root.join("containers").join(&id).join("rootfs").is_dir());
    old.leave();

    let agent = node.reopen().await;
    let out = agent
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["echo".into(), "adopted".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync in the adopted pod");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "adopted\n");
    let info = sandbox_info(&agent, &sb.0).await;
    assert_eq!(
        info["stateDir"].as_str(),
        Some(root.join("sandboxes").join(&sb.0).to_str().unwrap())
    );
    // A new pod's state is in the state dir.
    let fresh = run_sandbox_on(&agent, "fresh", &node.log_dir()).await;
    assert!(state_dir(&root).join("sandboxes").join(&fresh.0).is_dir());
    assert!(!root.join("sandboxes").join(&fresh.0).exists());
    for pod in [&sb.0, &fresh.0] {
        agent
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            })
            .await
            .expect("RemovePodSandbox");
    }
    assert!(!running(b"sleep\x00612\x00"));
    assert!(!root.join("sandboxes").join(&sb.0).exists());
    assert!(!root.join("containers").join(&id).exists());
    // Empty, the old dirs go at the next start.
    agent.leave();
    let agent = node.reopen().await;
    assert!(!root.join("sandboxes").exists() && !root.join("containers").exists());
    let n = node.with_runtime(agent);
    n.teardown().await;
}

/// Whether a process whose command line is exactly `cmdline` runs.
fn running(cmdline: &[u8]) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmdline))
}

/// Torn or corrupt records at start: the runtime starts, sets them aside (moved to
/// `cri/corrupt/`, reported) and adopts every other pod; nothing they described runs on unseen:
/// a container whose record is unreadable is killed and its rootfs released, a sandbox whose
/// record is unreadable is stopped with its containers and removed.
#[tokio::test(flavor = "multi_thread")]
async fn unreadable_records_are_set_aside_and_the_rest_adopted() {
    if !root_or_skip("unreadable_records_are_set_aside_and_the_rest_adopted") {
        return;
    }
    let node = Node::new("torn").await;
    let a = node.sandbox("torn-a").await;
    let b = node.sandbox("torn-b").await;
    let a1 = node.container(&a, "a1", &["sleep", "600"]).await;
    let a2 = node.container(&a, "a2", &["sleep", "601"]).await;
    let b1 = node.container(&b, "b1", &["sleep", "602"]).await;
    let cri_dir = node.root.path().join("cri");
    // A torn write (half the file) and garbage.
    let torn = cri_dir.join("containers").join(format!("{a2}.json"));
    let text = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &text[..text.len() / 2]).unwrap();
    let garbage = cri_dir.join("sandboxes").join(format!("{}.json", b.0));
    std::fs::write(&garbage, b"\0\0not json").unwrap();

    let agent = node.reopen().await;
    let containers = agent
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap()
        .containers;
    let state_of = |id: &str| containers.iter().find(|c| c.id == id).map(|c| c.state);
    assert_eq!(
        state_of(&a1),
        Some(cri::ContainerState::ContainerRunning as i32),
        "the readable pod is adopted"
    );
    assert_eq!(state_of(&a2), None, "{containers:?}");
    assert_eq!(state_of(&b1), None, "{containers:?}");
    let sandboxes: Vec<String> = agent
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(sandboxes, std::slice::from_ref(&a.0));
    assert!(!torn.exists() && !garbage.exists());
    let aside: Vec<String> = std::fs::read_dir(cri_dir.join("corrupt"))
        .expect("the corrupt dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert!(
        aside
            .iter()
            .any(|f| f.starts_with(&format!("containers-{a2}.json.")))
            && aside
                .iter()
                .any(|f| f.starts_with(&format!("sandboxes-{}.json.", b.0))),
        "{aside:?}"
    );
    for cmd in [&b"sleep\x00601\x00"[..], b"sleep\x00602\x00"] {
        settle(|| !running(cmd)).await;
        assert!(!running(cmd), "{} still runs", String::from_utf8_lossy(cmd));
    }
    assert!(
        running(b"sleep\x00600\x00"),
        "the adopted container runs on"
    );
    let n = node.with_runtime(agent);
    n.teardown().await;
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The store's own state files torn at start: the image index, a running container's rootfs
/// record, pod address leases. The agent starts, sets aside what it cannot read, rebuilds the
/// index from the store's content, adopts every pod, and frees the addresses nobody holds.
#[tokio::test(flavor = "multi_thread")]
async fn torn_store_files_are_set_aside_and_every_pod_adopted() {
    if !root_or_skip("torn_store_files_are_set_aside_and_every_pod_adopted") {
        return;
    }
    let mut net = None;
    let node = Node::with_network("tornstore", |n| {
        let tmp = std::env::temp_dir().join(format!("nodelet-torn-{}", std::process::id()));
        let cfg = own_network(&tmp);
        net = Some(cfg.clone());
        *n = Some(cfg);
    })
    .await;
    let net = net.expect("network config");
    let _network = NetworkGuard(net.clone());
    let a = node.sandbox("tornstore-a").await;
    let b = node.sandbox("tornstore-b").await;
    let a1 = node.container(&a, "a1", &["sleep", "610"]).await;
    let b1 = node.container(&b, "b1", &["sleep", "611"]).await;
    let store_root = node.root.path().join("images");
    let image_id = node.rt.image_store().list().unwrap()[0].id.clone();
    let snapshots = names_in(&store_root.join("snapshots"));
    let tear = |path: &std::path::Path| {
        let data = std::fs::read(path).unwrap();
        std::fs::write(path, &data[..data.len() / 2]).unwrap();
    };
    tear(&store_root.join("images.json"));
    tear(&store_root.join("containers").join(&a1).join("rootfs.json"));
    let leases = net.ipam_dir.join(&net.bridge);
    let prefix = net.pod_cidrs[0].to_string();
    let prefix = prefix.rsplit_once('.').unwrap().0;
    let garbled = leases.join(format!("{prefix}.200"));
    std::fs::write(&garbled, b"\xff\xfe\0").unwrap();
    std::fs::write(leases.join("last"), b"\0\0").unwrap();

    // The agent restarts: the old runtime leaves the root dir to the new one.
    node.rt.leave();
    let agent = node.reopen().await;
    let containers = agent
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap()
        .containers;
    for id in [&a1, &b1] {
        let state = containers.iter().find(|c| &c.id == id).map(|c| c.state);
        assert_eq!(
            state,
            Some(cri::ContainerState::ContainerRunning as i32),
            "{id}: {containers:?}"
        );
    }
    assert!(running(b"sleep\x00610\x00") && running(b"sleep\x00611\x00"));
    let store = agent.image_store();
    // The index: rebuilt from content, the image there by id (its only save had no earlier
    // generation to take names from), nothing unpacked again.
    let images = store.list().unwrap();
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0].id, image_id);
    assert!(images[0].repo_tags.is_empty(), "{images:?}");
    assert_eq!(names_in(&store_root.join("snapshots")), snapshots);
    let aside = names_in(&store_root.join("corrupt"));
    assert!(
        aside.len() == 2
            && aside[0].starts_with("images.json.")
            && aside[1].starts_with(&format!("rootfs-{a1}.json.")),
        "{aside:?}"
    );
    // The rootfs record is back, from the container's own record.
    assert!(store.unrecorded_rootfs().is_empty());
    let mut keys = store.rootfs_keys().unwrap();
    keys.sort();
    let mut want = vec![a1.clone(), b1.clone()];
    want.sort();
    assert_eq!(keys, want);
    let err = store.remove(&image_id).unwrap_err().to_string();
    assert!(err.contains("in use by rootfs"), "{err}");
    // The garbled lease is freed; new pods get addresses.
    assert!(!garbled.exists(), "a garbled lease is nobody's");
    store.import(&busybox_archive()).unwrap();
    assert_eq!(names_in(&store_root.join("snapshots")), snapshots);
    let n = node.with_runtime(agent);
    let c = n.sandbox("tornstore-c").await;
    let c1 = n.container(&c, "c1", &["true"]).await;
    n.wait_exited(&c1).await;
    n.teardown().await;
}

/// A launch cut short can leave a sandbox's cgroups with no record and no state dir (made in
/// some controllers only). The next agent alone on the root dir removes them when they are
/// empty; a cgroup whose name is not a sandbox id, or one with a process in it, stays.
#[tokio::test(flavor = "multi_thread")]
async fn empty_cgroups_of_a_sandbox_without_a_record_are_removed_at_start() {
    if !root_or_skip("empty_cgroups_of_a_sandbox_without_a_record_are_removed_at_start") {
        return;
    }
    let base = std::path::Path::new("/sys/fs/cgroup");
    if !base.join("memory").is_dir() {
        skip(
            "needs cgroup v1",
            "empty_cgroups_of_a_sandbox_without_a_record_are_removed_at_start",
        );
        return;
    }
    let cgroup_root = format!("/nodelet-e2e-orphancg-{}", std::process::id());
    let rel = cgroup_root.trim_start_matches('/');
    let orphan = "ab".repeat(32);
    let busy = "cd".repeat(32);
    for c in ["memory", "cpu"] {
        std::fs::create_dir_all(base.join(c).join(rel).join(&orphan).join("sandbox")).unwrap();
        std::fs::create_dir_all(base.join(c).join(rel).join(&busy).join("sandbox")).unwrap();
        std::fs::create_dir_all(base.join(c).join(rel).join("not-a-sandbox")).unwrap();
    }
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(
        base.join("memory")
            .join(rel)
            .join(&busy)
            .join("sandbox/cgroup.procs"),
        sleeper.id().to_string(),
    )
    .unwrap();
    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let rt = runtime::builtin::BuiltinRuntime::new(config(root.path(), &cgroup_root))
        .await
        .unwrap();
    let left = |name: &str| {
        ["memory", "cpu"]
            .iter()
            .any(|c| base.join(c).join(rel).join(name).exists())
    };
    let (orphan_left, busy_left, other_left) = (left(&orphan), left(&busy), left("not-a-sandbox"));
    let alive = sleeper.try_wait().unwrap().is_none();
    drop(rt);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    destroy_cgroup_tree(&cgroup_root);
    assert!(!orphan_left, "the empty orphan's cgroups were removed");
    assert!(busy_left && alive, "one in use stays, its process alive");
    assert!(other_left, "a cgroup not named as a sandbox stays");
}
