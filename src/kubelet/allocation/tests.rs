use super::*;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
use serde_json::json;

fn pod(uid: &str, cpu_req: &str, cpu_lim: &str, policy: Option<&str>) -> Pod {
    let mut c = json!({"name": "app", "image": "busybox",
        "resources": {"requests": {"cpu": cpu_req, "memory": "32Mi"},
                      "limits": {"cpu": cpu_lim, "memory": "64Mi"}}});
    if let Some(p) = policy {
        c["resizePolicy"] = json!([{"resourceName": "memory", "restartPolicy": p}]);
    }
    serde_json::from_value(
        json!({"metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [c]}}),
    )
    .unwrap()
}

fn with_memory(mut p: Pod, limit: &str) -> Pod {
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    let r = c.resources.as_mut().unwrap();
    r.limits
        .as_mut()
        .unwrap()
        .insert("memory".into(), Quantity(limit.into()));
    p
}

fn node(cpu: &str, memory: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}}))
    .unwrap()
}

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn cpu_request(p: &Pod) -> String {
    p.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["cpu"]
        .0
        .clone()
}

#[test]
fn a_resize_that_fits_is_allocated_one_that_does_not_waits() {
    let a = Allocations::open(None);
    let n = node("1", "1Gi");
    a.admit(&pod("p", "100m", "200m", None));
    // The same amounts written differently are no resize.
    assert_eq!(
        a.resize(&pod("p", "0.1", "200m", None), &n, Vec::new),
        Resize::Unchanged
    );
    // Until accepted, syncs see the allocation, not the spec.
    let asked = pod("p", "300m", "400m", None);
    assert_eq!(cpu_request(&a.view(&asked)), "100m");
    assert_eq!(a.resize(&asked, &n, Vec::new), Resize::Accepted);
    assert_eq!(cpu_request(&a.view(&asked)), "300m");

    // More than the node has: Infeasible, with upstream's message.
    let huge = pod("p", "2", "2", None);
    match a.resize(&huge, &n, Vec::new) {
        Resize::Pending(p) => {
            assert_eq!(p.reason, INFEASIBLE);
            assert_eq!(
                p.message,
                "Node didn't have enough capacity: cpu, requested: 2000, capacity: 1000"
            );
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(cpu_request(&a.view(&huge)), "300m");

    // More than is left next to another pod: Deferred, then accepted once it is gone.
    let other = pod("q", "600m", "600m", None);
    a.admit(&other);
    let big = pod("p", "500m", "500m", None);
    // As the sync loop gives them: read through the allocations themselves.
    let others = || vec![a.view(&other)];
    match a.resize(&big, &n, others) {
        Resize::Pending(p) => {
            assert_eq!(p.reason, DEFERRED);
            assert!(
                p.message.contains("Node didn't have enough resource: cpu"),
                "{}",
                p.message
            );
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(a.pending_uids(), vec!["p".to_string()]);
    assert_eq!(a.pending("p").unwrap().reason, DEFERRED);
    assert_eq!(a.resize(&big, &n, Vec::new), Resize::Accepted);
    assert!(a.pending_uids().is_empty());
}

#[test]
fn running_containers_are_updated_or_restarted_as_their_policy_says() {
    let a = Allocations::open(None);
    let n = node("4", "4Gi");
    let p = pod("p", "100m", "200m", Some("RestartContainer"));
    let alloc = a.allocated_pod(&p);
    assert!(
        a.needs(&alloc).is_empty(),
        "a container made with its allocation"
    );
    a.set_actuated(
        "p",
        "app",
        alloc.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref(),
    );
    assert!(a.needs(&alloc).is_empty());

    // CPU changes in place (its policy is the default, NotRequired).
    let cpu = pod("p", "300m", "400m", Some("RestartContainer"));
    assert_eq!(a.resize(&cpu, &n, Vec::new), Resize::Accepted);
    let alloc = a.allocated_pod(&cpu);
    assert_eq!(
        a.needs(&alloc),
        HashMap::from([("app".to_string(), Need::Update)])
    );
    a.set_actuated(
        "p",
        "app",
        alloc.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref(),
    );
    assert!(a.needs(&alloc).is_empty());

    // Memory restarts it.
    let mem = with_memory(cpu.clone(), "128Mi");
    assert_eq!(a.resize(&mem, &n, Vec::new), Resize::Accepted);
    let alloc = a.allocated_pod(&mem);
    assert_eq!(
        a.needs(&alloc),
        HashMap::from([("app".to_string(), Need::Restart)])
    );
}

#[test]
fn the_status_shows_allocation_actuation_and_the_conditions() {
    let a = Allocations::open(None);
    let n = node("4", "4Gi");
    let p = pod("p", "100m", "200m", None);
    let first = a.allocated_pod(&p);
    a.set_actuated(
        "p",
        "app",
        first.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref(),
    );
    let resized = pod("p", "300m", "400m", None);
    assert_eq!(a.resize(&resized, &n, Vec::new), Resize::Accepted);
    let alloc = a.allocated_pod(&resized);
    let mut status = PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let now = std::time::SystemTime::now();
    a.decorate(&alloc, &mut status, now, None);
    let cs = &status.container_statuses.as_ref().unwrap()[0];
    assert_eq!(cs.allocated_resources.as_ref().unwrap()["cpu"].0, "300m");
    let running = cs.resources.as_ref().unwrap();
    assert_eq!(
        running.requests.as_ref().unwrap()["cpu"].0,
        "100m",
        "not resized yet"
    );
    let types: Vec<_> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, vec![RESIZE_IN_PROGRESS]);

    // The runtime refuses: the condition says why.
    a.set_errors("p", &[("app".into(), "no such cgroup".into())]);
    a.decorate(&alloc, &mut status, now, None);
    let c = &status.conditions.as_ref().unwrap()[0];
    assert_eq!(c.reason.as_deref(), Some("Error"));
    assert!(c.message.as_ref().unwrap().contains("no such cgroup"));

    // Done: no condition left; a pending resize shows instead.
    a.set_errors("p", &[]);
    a.set_actuated(
        "p",
        "app",
        alloc.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref(),
    );
    let _ = a.resize(&pod("p", "8", "8", None), &n, Vec::new);
    a.decorate(&alloc, &mut status, now, None);
    let conds = status.conditions.as_ref().unwrap();
    assert_eq!(conds.len(), 1);
    assert_eq!(
        (conds[0].type_.as_str(), conds[0].reason.as_deref()),
        (RESIZE_PENDING, Some(INFEASIBLE))
    );
    let cs = &status.container_statuses.as_ref().unwrap()[0];
    assert_eq!(
        cs.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
        "300m"
    );
}

#[test]
fn allocations_survive_a_restart_and_a_corrupt_file_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod-resources.json");
    let n = node("4", "4Gi");
    {
        let a = Allocations::open(Some(path.clone()));
        a.admit(&pod("p", "100m", "200m", None));
        assert_eq!(
            a.resize(&pod("p", "300m", "400m", None), &n, Vec::new),
            Resize::Accepted
        );
        a.set_actuated("p", "app", None);
    }
    let a = Allocations::open(Some(path.clone()));
    // The spec (as an agent restarted before syncing sees it) does not replace the allocation.
    let alloc = a.allocated_pod(&pod("p", "100m", "200m", None));
    assert_eq!(cpu_request(&alloc), "300m");
    assert_eq!(a.needs(&alloc).get("app"), Some(&Need::Update));
    a.forget("p");
    assert_eq!(
        cpu_request(&Allocations::open(Some(path.clone())).view(&pod("p", "1m", "1m", None))),
        "1m"
    );

    // Pods gone while the agent was down are forgotten, in the file too; the others kept.
    {
        let a = Allocations::open(Some(path.clone()));
        for uid in ["kept", "gone"] {
            a.admit(&pod(uid, "100m", "200m", None));
            assert_eq!(
                a.resize(&pod(uid, "300m", "400m", None), &n, Vec::new),
                Resize::Accepted
            );
        }
        a.forget_others(|uid| uid == "kept");
    }
    let a = Allocations::open(Some(path.clone()));
    assert_eq!(cpu_request(&a.view(&pod("kept", "1m", "1m", None))), "300m");
    assert_eq!(cpu_request(&a.view(&pod("gone", "1m", "1m", None))), "1m");

    std::fs::write(&path, b"{not json").unwrap();
    let a = Allocations::open(Some(path.clone()));
    assert_eq!(cpu_request(&a.view(&pod("p", "1m", "1m", None))), "1m");
    assert!(dir.path().join("pod-resources.json.corrupt").exists());
}
