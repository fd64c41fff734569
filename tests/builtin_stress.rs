//! Many containers: 20 started concurrently, and 1000 create/start/remove cycles, with nothing
//! leaked (mounts, cgroups, processes, rootfs leases, records); concurrent requests for the same
//! name: exactly one wins.

mod common;

use common::*;
use runtime::{RuntimeService, cri};

#[tokio::test(flavor = "multi_thread")]
async fn twenty_containers_start_concurrently() {
    if !root_or_skip("twenty_containers_start_concurrently") {
        return;
    }
    let node = std::sync::Arc::new(Node::new("conc").await);
    let sb = node.sandbox("conc").await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let node = node.clone();
        let sb = sb.clone();
        tasks.push(tokio::spawn(async move {
            node.container(
                &sb,
                &format!("c{i}"),
                &["sh", "-c", &format!("echo {i}; sleep 600")],
            )
            .await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task"));
    }
    let list = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    let running = list
        .containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .count();
    assert_eq!(running, 20);
    let node = std::sync::Arc::into_inner(node).expect("sole owner");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creations_of_one_name_give_one_object() {
    if !root_or_skip("concurrent_creations_of_one_name_give_one_object") {
        return;
    }
    let node = std::sync::Arc::new(Node::new("same").await);
    // Eight RunPodSandbox calls with the same metadata, at once.
    let cfg = sandbox_config("same", &node.log_dir());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (node, cfg) = (node.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move { node.try_sandbox(cfg).await }));
    }
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(id) => won.push(id),
            Err(e) => assert_eq!(e.code(), runtime::Code::AlreadyExists, "{e}"),
        }
    }
    assert_eq!(won.len(), 1, "one sandbox for one name: {won:?}");
    let sb = (won[0].clone(), cfg);
    // Eight CreateContainer calls with the same name and attempt, at once.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (node, sb) = (node.clone(), sb.clone());
        tasks.push(tokio::spawn(async move {
            node.try_create(&sb, container_config("c", &["sleep", "600"]))
                .await
        }));
    }
    let mut created = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(id) => created.push(id),
            Err(e) => assert_eq!(e.code(), runtime::Code::AlreadyExists, "{e}"),
        }
    }
    assert_eq!(created.len(), 1, "one container for one name: {created:?}");
    let list = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(list.containers.len(), 1);
    // Creating into a sandbox while it is removed: the container is created before the
    // removal (and removed with it) or refused; nothing is left either way.
    let (node2, sb2) = (node.clone(), sb.clone());
    let create = tokio::spawn(async move {
        node2
            .try_create(&sb2, container_config("late", &["sleep", "600"]))
            .await
    });
    node.rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.0.clone(),
        })
        .await
        .unwrap();
    node.rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sb.0.clone(),
        })
        .await
        .unwrap();
    let _ = create.await.unwrap();
    let left = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert!(left.containers.is_empty(), "{:?}", left.containers);
    let node = std::sync::Arc::into_inner(node).expect("sole owner");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_create_start_remove_cycles_leak_nothing() {
    if !root_or_skip("a_thousand_create_start_remove_cycles_leak_nothing") {
        return;
    }
    let node = Node::new("cycle").await;
    let sb = node.sandbox("cycle").await;
    let fds_before = std::fs::read_dir("/proc/self/fd").unwrap().count();
    for i in 0..1000 {
        let id = node.container(&sb, &format!("c{i}"), &["true"]).await;
        let s = node.wait_exited(&id).await;
        assert_eq!(s.exit_code, 0, "cycle {i}");
        node.rt
            .remove_container(cri::RemoveContainerRequest { container_id: id })
            .await
            .unwrap();
    }
    let list = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert!(list.containers.is_empty());
    // The last removals' rootfs are released in the background, off the request path.
    settle(|| node.rt.image_store().rootfs_keys().unwrap().is_empty()).await;
    assert!(node.rt.image_store().rootfs_keys().unwrap().is_empty());
    let containers_dir = common::state_dir(node.root.path()).join("containers");
    settle(|| std::fs::read_dir(&containers_dir).unwrap().count() == 0).await;
    assert_eq!(
        std::fs::read_dir(&containers_dir).unwrap().count(),
        0,
        "bundles left"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for dir in [node.root.path().to_path_buf(), state_dir(node.root.path())] {
        assert_eq!(
            mounts.matches(&*dir.to_string_lossy()).count(),
            0,
            "{mounts}"
        );
    }
    let fds_after = std::fs::read_dir("/proc/self/fd").unwrap().count();
    assert!(
        fds_after <= fds_before + 8,
        "fd leak: {fds_before} -> {fds_after}"
    );
    // The sandbox process holds no leftovers either: its fd count is back to its baseline.
    let info = sandbox_info(&node.rt, &sb.0).await;
    let pid = info["pid"].as_i64().unwrap();
    let sandbox_fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(sandbox_fds < 16, "sandbox process fds: {sandbox_fds}");
    // Its only child is the pod's PID-namespace holder (CRI's default PID mode is POD).
    let holder = info["pidNamespaceHolder"].as_i64().map(|p| p.to_string());
    let children: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        children,
        holder.into_iter().collect::<Vec<_>>(),
        "sandbox has leftover children"
    );
    node.teardown().await;
}
