use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;

use super::rank::{ContainerUsage, PodUsage, Usage};
use super::signals;
use super::thresholds::{Observation, Observations, Tracker, from_config, met};
use super::*;
use crate::config::Eviction;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn obs(pairs: &[(Signal, i64, i64)]) -> Observations {
    pairs
        .iter()
        .map(|(s, available, capacity)| {
            (
                *s,
                Observation {
                    available: *available,
                    capacity: *capacity,
                },
            )
        })
        .collect()
}

const MI: i64 = 1024 * 1024;

/// A pod from its spec's JSON (an API pod unless the spec says otherwise).
fn pod(name: &str, priority: i32, spec: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .expect("pod");
    if let Some(s) = p.spec.as_mut() {
        s.priority = Some(priority);
    }
    p
}

fn requesting(name: &str, priority: i32, memory: &str) -> Pod {
    pod(
        name,
        priority,
        json!({"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"memory": memory}}}]}),
    )
}

fn memory_usage(pairs: &[(&str, i64)]) -> Usage {
    pairs
        .iter()
        .map(|(name, bytes)| {
            (
                format!("uid-{name}"),
                PodUsage {
                    memory: Some(*bytes as u64),
                    containers: vec![ContainerUsage {
                        name: "c".into(),
                        memory: Some(*bytes as u64),
                        storage: None,
                    }],
                    ..Default::default()
                },
            )
        })
        .collect()
}

#[test]
fn thresholds_come_from_the_configuration_hard_then_soft() {
    let ev = Eviction {
        soft: map(&[("memory.available", "1Gi")]),
        soft_grace_period: [("memory.available".to_string(), Duration::from_secs(90))].into(),
        minimum_reclaim: map(&[("memory.available", "500Mi")]),
        ..Default::default()
    };
    let hard = map(&[
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("pid.available", "0"),
    ]);
    let t = from_config(&hard, &ev);
    // The zero pid threshold turns its signal off.
    assert_eq!(t.len(), 3, "{t:?}");
    assert_eq!(t[0].signal, Signal::MemoryAvailable);
    assert!(t[0].is_hard());
    assert_eq!(t[0].value, ThresholdValue::Quantity(100 * MI));
    assert_eq!(t[0].min_reclaim, Some(ThresholdValue::Quantity(500 * MI)));
    assert_eq!(t[1].signal, Signal::NodeFsAvailable);
    assert_eq!(t[1].value, ThresholdValue::Percentage(10.0));
    assert_eq!(t[2].grace, Duration::from_secs(90));
    assert!(!t[2].is_hard());
}

#[test]
fn a_threshold_is_met_below_its_value_and_resolved_only_past_its_minimum_reclaim() {
    let ev = Eviction {
        minimum_reclaim: map(&[("nodefs.available", "5%")]),
        ..Default::default()
    };
    let t = from_config(&map(&[("nodefs.available", "10%")]), &ev);
    // 10% of 1000 is 100.
    assert_eq!(
        met(&t, &obs(&[(Signal::NodeFsAvailable, 99, 1000)]), false).len(),
        1
    );
    assert!(met(&t, &obs(&[(Signal::NodeFsAvailable, 100, 1000)]), false).is_empty());
    // With the minimum reclaim, 150 must be available.
    assert_eq!(
        met(&t, &obs(&[(Signal::NodeFsAvailable, 120, 1000)]), true).len(),
        1
    );
    assert!(met(&t, &obs(&[(Signal::NodeFsAvailable, 150, 1000)]), true).is_empty());
    // A signal not observed meets nothing.
    assert!(met(&t, &obs(&[]), false).is_empty());
}

#[test]
fn soft_thresholds_wait_for_their_grace_period_and_conditions_for_the_transition_period() {
    let ev = Eviction {
        soft: map(&[("memory.available", "1Gi")]),
        soft_grace_period: [("memory.available".to_string(), Duration::from_secs(30))].into(),
        minimum_reclaim: map(&[("nodefs.available", "100")]),
        ..Default::default()
    };
    let t = from_config(&map(&[("nodefs.available", "200")]), &ev);
    let transition = Duration::from_secs(60);
    let mut tracker = Tracker::default();
    let t0 = Instant::now();
    let low_memory = obs(&[
        (Signal::MemoryAvailable, 512 * MI, 8192 * MI),
        (Signal::NodeFsAvailable, 1000, 2000),
    ]);
    let d = tracker.observe(&t, &low_memory, transition, t0);
    assert_eq!(d.conditions, vec![Pressure::Memory], "pressure at once");
    assert!(d.act_on.is_empty(), "but no action within the grace period");
    let d = tracker.observe(&t, &low_memory, transition, t0 + Duration::from_secs(31));
    assert_eq!(d.act_on.len(), 1);
    assert_eq!(d.act_on[0].signal, Signal::MemoryAvailable);

    // Disk too: memory is acted on first.
    let both = obs(&[
        (Signal::MemoryAvailable, 512 * MI, 8192 * MI),
        (Signal::NodeFsAvailable, 100, 2000),
    ]);
    let d = tracker.observe(&t, &both, transition, t0 + Duration::from_secs(40));
    assert_eq!(d.conditions, vec![Pressure::Memory, Pressure::Disk]);
    assert_eq!(
        d.act_on.iter().map(|t| t.signal).collect::<Vec<_>>(),
        vec![Signal::MemoryAvailable, Signal::NodeFsAvailable]
    );
    // Disk above its threshold but not past its minimum reclaim: still acted on.
    let fine_memory = obs(&[
        (Signal::MemoryAvailable, 4096 * MI, 8192 * MI),
        (Signal::NodeFsAvailable, 250, 2000),
    ]);
    let d = tracker.observe(&t, &fine_memory, transition, t0 + Duration::from_secs(50));
    assert_eq!(d.act_on.len(), 1);
    assert_eq!(d.act_on[0].signal, Signal::NodeFsAvailable);
    // Recovered: nothing to act on, but the conditions stay for the transition period.
    let fine = obs(&[
        (Signal::MemoryAvailable, 4096 * MI, 8192 * MI),
        (Signal::NodeFsAvailable, 1000, 2000),
    ]);
    let d = tracker.observe(&t, &fine, transition, t0 + Duration::from_secs(60));
    assert!(d.act_on.is_empty());
    assert_eq!(d.conditions, vec![Pressure::Memory, Pressure::Disk]);
    let d = tracker.observe(&t, &fine, transition, t0 + Duration::from_secs(105));
    assert_eq!(
        d.conditions,
        vec![Pressure::Disk],
        "memory last seen at 40s"
    );
    let d = tracker.observe(&t, &fine, transition, t0 + Duration::from_secs(111));
    assert!(d.conditions.is_empty());
    // Met again: the grace period starts over.
    let d = tracker.observe(&t, &low_memory, transition, t0 + Duration::from_secs(120));
    assert!(d.act_on.is_empty());
}

#[test]
fn memory_ranking_puts_pods_over_their_request_first_then_priority_then_excess() {
    let mut pods = vec![
        requesting("under", 0, "500Mi"),
        requesting("over-high-priority", 1000, "100Mi"),
        requesting("over-a-little", 0, "100Mi"),
        requesting("over-a-lot", 0, "100Mi"),
    ];
    let usage = memory_usage(&[
        ("under", 400 * MI),
        ("over-high-priority", 900 * MI),
        ("over-a-little", 150 * MI),
        ("over-a-lot", 600 * MI),
    ]);
    rank::rank(&mut pods, "memory", &usage, rank::DiskMeasure::Everything);
    let names: Vec<_> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        ["over-a-lot", "over-a-little", "over-high-priority", "under"]
    );
}

#[test]
fn disk_ranking_measures_what_the_pressured_filesystem_holds() {
    // Which of "layers" and "volume" goes first for `resource`, each using `(total, in its
    // writable layer)` of it; neither requests ephemeral storage.
    let first = |resource: &str, layers: (u64, u64), volume: (u64, u64), measure| {
        let usage: Usage = [("layers", layers), ("volume", volume)]
            .into_iter()
            .map(|(n, (total, in_layer))| {
                let u = if resource == "inodes" {
                    PodUsage {
                        inodes: Some(total),
                        rootfs_inodes: Some(in_layer),
                        ..Default::default()
                    }
                } else {
                    PodUsage {
                        storage: Some(total),
                        rootfs: Some(in_layer),
                        ..Default::default()
                    }
                };
                (format!("uid-{n}"), u)
            })
            .collect();
        let mut pods = vec![
            requesting("volume", 0, "1Mi"),
            requesting("layers", 0, "1Mi"),
        ];
        rank::rank(&mut pods, resource, &usage, measure);
        pods[0].metadata.name.clone().unwrap_or_default()
    };
    let mi = MI as u64;
    // Bytes: "layers" writes 300Mi in its container, "volume" 200Mi to an emptyDir (with
    // 10Mi in its layer). Inodes: 3000 files in the layer against 2000 in the emptyDir.
    for (resource, layers, volume) in [
        (
            "ephemeral-storage",
            (310 * mi, 300 * mi),
            (210 * mi, 10 * mi),
        ),
        ("inodes", (3100, 3000), (2100, 100)),
    ] {
        // One filesystem: everything counts.
        let everything = first(resource, layers, volume, rank::DiskMeasure::Everything);
        assert_eq!(everything, "layers", "{resource}");
        // A dedicated image filesystem: the root dir's holds the emptyDir, the image one the
        // layers.
        let nodefs = first(
            resource,
            layers,
            volume,
            rank::DiskMeasure::LogsAndLocalVolumes,
        );
        assert_eq!(nodefs, "volume", "{resource}");
        let imagefs = first(resource, layers, volume, rank::DiskMeasure::WritableLayers);
        assert_eq!(imagefs, "layers", "{resource}");
    }
}

#[test]
fn pid_ranking_is_by_priority_then_process_count() {
    let mut pods = vec![
        requesting("few", 0, "1Mi"),
        requesting("many-high", 10, "1Mi"),
        requesting("many", 0, "1Mi"),
    ];
    let usage: Usage = [("few", 3u64), ("many-high", 900), ("many", 50)]
        .iter()
        .map(|(n, c)| {
            (
                format!("uid-{n}"),
                PodUsage {
                    processes: Some(*c),
                    ..Default::default()
                },
            )
        })
        .collect();
    rank::rank(&mut pods, "pids", &usage, rank::DiskMeasure::Everything);
    let names: Vec<_> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["many", "few", "many-high"]);
}

#[test]
fn the_message_names_the_threshold_what_was_available_and_the_greedy_containers() {
    let t = from_config(&map(&[("memory.available", "100Mi")]), &Eviction::default());
    let o = obs(&[(Signal::MemoryAvailable, 80 * MI, 8192 * MI)]);
    let p = requesting("hog", 0, "10Mi");
    let usage = memory_usage(&[("hog", 300 * MI)]);
    let msg = rank::message("memory", &p, usage.get("uid-hog"), &t, &o);
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container c was using 300Mi, request is 10Mi, has larger consumption of memory. "
    );
    // A container within its request is not named.
    let modest = memory_usage(&[("hog", 5 * MI)]);
    let msg = rank::message("memory", &p, modest.get("uid-hog"), &t, &o);
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
    );
}

#[test]
fn local_storage_limits_are_checked_emptydir_then_pod_then_container() {
    let p = pod(
        "writer",
        0,
        json!({
            "containers": [
                {"name": "a", "image": "busybox", "resources": {"limits": {"ephemeral-storage": "20Mi"}}},
                {"name": "b", "image": "busybox", "resources": {"limits": {"ephemeral-storage": "30Mi"}}},
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}],
        }),
    );
    assert!(local_storage::has_limits(&p));
    let usage = |scratch: i64, a: i64, b: i64| PodUsage {
        storage: Some((scratch + a + b) as u64),
        volumes: [("scratch".to_string(), scratch as u64)].into(),
        containers: vec![
            ContainerUsage {
                name: "a".into(),
                memory: None,
                storage: Some(a as u64),
            },
            ContainerUsage {
                name: "b".into(),
                memory: None,
                storage: Some(b as u64),
            },
        ],
        ..Default::default()
    };
    assert_eq!(local_storage::violation(&p, &usage(MI, MI, MI)), None);
    assert_eq!(
        local_storage::violation(&p, &usage(11 * MI, MI, MI)).as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". ")
    );
    assert_eq!(
        local_storage::violation(&p, &usage(9 * MI, 19 * MI, 29 * MI)).as_deref(),
        Some("Pod ephemeral local storage usage exceeds the total limit of containers 50Mi. ")
    );
    assert_eq!(
        local_storage::violation(&p, &usage(0, 21 * MI, MI)).as_deref(),
        Some("Container a exceeded its local ephemeral storage limit \"20Mi\". ")
    );
    let plain = requesting("plain", 0, "1Mi");
    assert!(!local_storage::has_limits(&plain));
}

#[test]
fn admission_under_pressure_is_upstreams() {
    let state = EvictionState::default();
    let best_effort = pod(
        "be",
        0,
        json!({"containers": [{"name": "c", "image": "busybox"}]}),
    );
    let burstable = requesting("burstable", 0, "10Mi");
    let mut static_pod = best_effort.clone();
    static_pod
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("kubernetes.io/config.source".into(), "file".into());
    let mut tolerating = best_effort.clone();
    tolerating.spec.as_mut().expect("spec").tolerations = Some(vec![
        serde_json::from_value(json!({"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}))
            .expect("toleration"),
    ]);
    assert_eq!(state.refusal(&best_effort), None, "no pressure");

    state.set(vec![Pressure::Memory]);
    assert_eq!(
        state.refusal(&best_effort).as_deref(),
        Some("The node had condition: [MemoryPressure]. ")
    );
    assert!(state.refusal(&burstable).is_none());
    assert!(state.refusal(&tolerating).is_none());
    assert!(state.refusal(&static_pod).is_none(), "critical");

    state.set(vec![Pressure::Disk, Pressure::Memory]);
    assert_eq!(
        state.refusal(&burstable).as_deref(),
        Some("The node had condition: [MemoryPressure DiskPressure]. ")
    );
    assert!(state.refusal(&tolerating).is_some());
    assert!(state.refusal(&static_pod).is_none());
    let critical = requesting("critical", crate::config::SYSTEM_CRITICAL_PRIORITY, "1Mi");
    assert!(state.refusal(&critical).is_none());
}

#[test]
fn an_evicted_status_is_failed_with_the_reason_and_for_pressure_the_disruption_condition() {
    let mut status = PodStatus::default();
    evicted_status(&mut status, "The node was low on resource: memory. ", true);
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let c = status.conditions.as_ref().expect("conditions");
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].type_, "DisruptionTarget");
    assert_eq!(c[0].reason.as_deref(), Some("TerminationByKubelet"));
    // Twice: still one condition.
    evicted_status(&mut status, "The node was low on resource: memory. ", true);
    assert_eq!(status.conditions.as_ref().map(Vec::len), Some(1));
    let mut local = PodStatus::default();
    evicted_status(
        &mut local,
        "Usage of EmptyDir volume \"x\" exceeds the limit \"1Mi\". ",
        false,
    );
    assert!(local.conditions.is_none_or(|c| c.is_empty()));
}

/// The kernel's notice comes when a memory cgroup's usage passes the armed point (cgroup v1; a
/// cgroup of the test's own stands for the root).
#[tokio::test]
async fn a_memory_threshold_notice_comes_when_usage_crosses_it() {
    let dir = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/memory/nodelet-notify-{}",
        std::process::id()
    ));
    if !nix::unistd::Uid::effective().is_root() || !dir.parent().is_some_and(|p| p.is_dir()) {
        eprintln!(
            "SKIP (needs root and cgroup v1 memory): a_memory_threshold_notice_comes_when_usage_crosses_it"
        );
        assert!(std::env::var("CI").is_err(), "CI runs as root on cgroup v1");
        return;
    }
    std::fs::create_dir_all(&dir).expect("a memory cgroup");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("a cgroup file");
    let usage: i64 = read("memory.usage_in_bytes").trim().parse().expect("usage");
    let inactive: i64 = read("memory.stat")
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // Armed 32 MiB above what the cgroup holds now: capacity - threshold + inactive = usage + 32Mi.
    let capacity = 1024 * MI;
    let threshold = capacity - (usage + 32 * MI) + inactive;
    let notifier = signals::MemoryNotifier::arm_in(&dir, capacity, threshold).expect("armed");
    let shm = format!("/dev/shm/nodelet-notify-{}", std::process::id());
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={shm} bs=1M count=64 status=none",
        dir.display()
    );
    let filled = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .expect("sh");
    let fired = tokio::time::timeout(Duration::from_secs(10), notifier.fired()).await;
    let _ = std::fs::remove_file(&shm);
    drop(notifier);
    let _ = std::fs::remove_dir(&dir);
    assert!(filled.success());
    assert!(fired.is_ok(), "no notice after 64 MiB in the cgroup");
}
