//! The container manager on this machine's real cgroups (root only), under a cgroup root of
//! the test's own.

use std::os::unix::process::ExitStatusExt;

use super::*;

fn pod(uid: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]},
    }))
    .unwrap()
}

fn read(fs: &Cgroupfs, controller: &str, path: &str, file: &str) -> String {
    let dir = fs.dir(controller, path).expect("the controller");
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// Runs `body` with a container manager (`kubepods` set to `node`, pods capped at 100 pids) over
/// this machine's real cgroups, under a cgroup root of the test's own
/// (`/nodelet-cm-<tag>-<pid>`, given to `body`) that is removed afterwards, pass or fail.
/// Without root the test is skipped, loudly; under CI (root) it must not be.
fn on_real_cgroups(
    test: &str,
    tag: &str,
    node: ResourceConfig,
    body: impl FnOnce(&ContainerManager, &Cgroupfs, &str),
) {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: {test} must not skip"
        );
        eprintln!("SKIP (needs root for real cgroups): {test}");
        return;
    }
    let root = format!("/nodelet-cm-{tag}-{}", std::process::id());
    let cfg = Cgroups {
        root: root.clone(),
        ..Cgroups::default()
    };
    let cm = ContainerManager::new(&cfg, node, 100).unwrap();
    let fs = Cgroupfs::detect().unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&cm, &fs, &root)));
    let _ = fs.destroy(&root);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn tree_values_and_orphans_on_real_cgroups() {
    let node = ResourceConfig {
        cpu_shares: Some(2048),
        memory_limit: Some(3 << 30),
        ..Default::default()
    };
    let test = "tree_values_and_orphans_on_real_cgroups";
    on_real_cgroups(test, "unit", node, |cm, fs, root| {
        cm.start().unwrap();
        let kubepods = format!("{root}/kubepods");
        let v2 = fs.is_v2();
        let (shares, limit) = if v2 {
            ("cpu.weight", "memory.max")
        } else {
            ("cpu.shares", "memory.limit_in_bytes")
        };
        let want_shares = |s: u64| if v2 { cgroupfs::shares_to_weight(s) } else { s }.to_string();
        assert_eq!(read(fs, "cpu", &kubepods, shares), want_shares(2048));
        assert_eq!(
            read(fs, "memory", &kubepods, limit),
            (3u64 << 30).to_string()
        );

        let burstable = pod("b1", serde_json::json!({"requests": {"cpu": "300m"}}));
        let path = cm.ensure_pod(&burstable, "b1").unwrap();
        assert_eq!(path, format!("{kubepods}/burstable/podb1"));
        assert_eq!(
            read(fs, "cpu", &format!("{kubepods}/burstable"), shares),
            want_shares(307)
        );
        assert_eq!(read(fs, "cpu", &path, shares), want_shares(307));
        assert_eq!(read(fs, "pids", &path, "pids.max"), "100");
        let guaranteed = pod(
            "g1",
            serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}}),
        );
        let g = cm.ensure_pod(&guaranteed, "g1").unwrap();
        assert_eq!(g, format!("{kubepods}/podg1"));
        assert_eq!(read(fs, "memory", &g, limit), (64u64 << 20).to_string());
        if !v2 {
            assert_eq!(read(fs, "cpu", &g, "cpu.cfs_quota_us"), "50000");
        }
        // Resized: the pod cgroups and the burstable shares follow at the next sync.
        let bigger = pod(
            "g1",
            serde_json::json!({"limits": {"cpu": "1", "memory": "128Mi"}}),
        );
        assert_eq!(cm.ensure_pod(&bigger, "g1").unwrap(), g);
        assert_eq!(read(fs, "memory", &g, limit), (128u64 << 20).to_string());
        if !v2 {
            assert_eq!(read(fs, "cpu", &g, "cpu.cfs_quota_us"), "100000");
        }
        // Shrunk: the pod cgroup keeps its larger values until its containers took the smaller
        // ones (a container's CFS quota above its parent's is refused on cgroup v1).
        let container = format!("{g}/c1");
        fs.create(&container).unwrap();
        let whole_cpu = ResourceConfig {
            cpu_quota: Some(100_000),
            cpu_period: Some(100_000),
            memory_limit: Some(128 << 20),
            ..Default::default()
        };
        fs.apply(&container, &whole_cpu).unwrap();
        assert_eq!(cm.ensure_pod(&guaranteed, "g1").unwrap(), g);
        assert_eq!(read(fs, "memory", &g, limit), (128u64 << 20).to_string());
        if !v2 {
            assert_eq!(read(fs, "cpu", &g, "cpu.cfs_quota_us"), "100000");
        }
        let half_cpu = ResourceConfig {
            cpu_quota: Some(50_000),
            memory_limit: Some(64 << 20),
            ..whole_cpu
        };
        fs.apply(&container, &half_cpu).unwrap();
        cm.finish_pod_resize("g1");
        assert_eq!(read(fs, "memory", &g, limit), (64u64 << 20).to_string());
        if !v2 {
            assert_eq!(read(fs, "cpu", &g, "cpu.cfs_quota_us"), "50000");
        }
        // Done: a second call and the next sync change nothing.
        cm.finish_pod_resize("g1");
        assert_eq!(cm.ensure_pod(&guaranteed, "g1").unwrap(), g);
        assert_eq!(read(fs, "memory", &g, limit), (64u64 << 20).to_string());
        fs.destroy(&container).unwrap();
        let more_cpu = pod("b1", serde_json::json!({"requests": {"cpu": "600m"}}));
        cm.ensure_pod(&more_cpu, "b1").unwrap();
        assert_eq!(read(fs, "cpu", &path, shares), want_shares(614));
        assert_eq!(
            read(fs, "cpu", &format!("{kubepods}/burstable"), shares),
            want_shares(614)
        );
        let capped = pod(
            "b2",
            serde_json::json!({"requests": {"memory": "16Mi"}, "limits": {"memory": "32Mi"}}),
        );
        let b2 = cm.ensure_pod(&capped, "b2").unwrap();
        assert_eq!(read(fs, "memory", &b2, limit), (32u64 << 20).to_string());
        // A limit the pod no longer sets is removed, not left as it was.
        let uncapped = pod("b2", serde_json::json!({"requests": {"memory": "16Mi"}}));
        cm.ensure_pod(&uncapped, "b2").unwrap();
        let unlimited = read(fs, "memory", &b2, limit);
        assert!(
            unlimited == "max" || unlimited.parse::<u64>().unwrap() > 1 << 60,
            "{unlimited}"
        );
        cm.forget_pod("b2");
        fs.destroy(&b2).unwrap();
        let best = cm
            .ensure_pod(&pod("e1", serde_json::json!({})), "e1")
            .unwrap();
        assert_eq!(
            read(fs, "cpu", &format!("{kubepods}/besteffort"), shares),
            want_shares(2)
        );
        assert_eq!(read(fs, "cpu", &best, shares), want_shares(2));

        // A process left in an orphan's cgroup is killed with it.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let procs = fs.dir("memory", &best).unwrap().join("cgroup.procs");
        std::fs::write(&procs, sleeper.id().to_string()).unwrap();
        let mut uids: Vec<String> = cm
            .pod_cgroups()
            .unwrap()
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        uids.sort();
        assert_eq!(uids, ["b1", "e1", "g1"]);
        let orphans = cm.orphans(|uid| uid != "e1" && uid != "b1").unwrap();
        assert_eq!(orphans.len(), 2);
        assert!(cm.destroy_pods(orphans).is_empty());
        assert!(sleeper.wait().unwrap().signal().is_some(), "killed");
        assert!(!fs.exists(&best) && !fs.exists(&path) && fs.exists(&g));
        assert_eq!(
            read(fs, "cpu", &format!("{kubepods}/burstable"), shares),
            want_shares(2),
            "the burstable shares follow its pods"
        );
    });
}

#[test]
fn without_the_tree_nothing_is_made() {
    let cfg = Cgroups {
        per_qos: false,
        enforce_node_allocatable: Vec::new(),
        ..Cgroups::default()
    };
    let cm = ContainerManager::new(&cfg, ResourceConfig::default(), -1).unwrap();
    let p = pod("u", serde_json::json!({}));
    assert_eq!(cm.ensure_pod(&p, "u").unwrap(), "");
    assert!(cm.pod_cgroups().unwrap().is_empty());
    let systemd = Cgroups {
        driver: CgroupDriver::Systemd,
        ..Cgroups::default()
    };
    // Without systemd as init the systemd driver says so (tests/systemd_node.rs runs it on a
    // systemd machine, v1 and v2).
    if !std::path::Path::new("/run/systemd/system").exists() {
        let e = ContainerManager::new(&systemd, ResourceConfig::default(), -1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("systemd is not this machine's init system"),
            "{e}"
        );
    }
}

/// Pods started at once (one pod worker each) each update the QoS cgroups: the `burstable`
/// shares must end as the sum of every burstable pod's request, whatever the order of the
/// updates (an update computed before a burstable pod was counted must not be written last).
#[test]
fn concurrent_pod_starts_keep_the_burstable_shares() {
    let test = "concurrent_pod_starts_keep_the_burstable_shares";
    on_real_cgroups(test, "race", ResourceConfig::default(), |cm, fs, root| {
        cm.start().unwrap();
        let burstable = format!("{root}/kubepods/burstable");
        let file = if fs.is_v2() {
            "cpu.weight"
        } else {
            "cpu.shares"
        };
        let want = |millis: i64| {
            let shares = milli_cpu_to_shares(millis);
            if fs.is_v2() {
                cgroupfs::shares_to_weight(shares)
            } else {
                shares
            }
            .to_string()
        };
        const ROUNDS: usize = 30;
        const PER_KIND: usize = 3;
        for round in 0..ROUNDS {
            let pods: Vec<(Pod, String)> = (0..PER_KIND)
                .flat_map(|i| {
                    let b = format!("r{round}b{i}");
                    let e = format!("r{round}e{i}");
                    [
                        (pod(&b, serde_json::json!({"requests": {"cpu": "100m"}})), b),
                        (pod(&e, serde_json::json!({})), e),
                    ]
                })
                .collect();
            let start = std::sync::Barrier::new(pods.len());
            std::thread::scope(|s| {
                for (p, uid) in &pods {
                    let (cm, start) = (&cm, &start);
                    s.spawn(move || {
                        start.wait();
                        cm.ensure_pod(p, uid).unwrap();
                    });
                }
            });
            let millis = i64::try_from(100 * PER_KIND * (round + 1)).unwrap();
            assert_eq!(
                read(fs, "cpu", &burstable, file),
                want(millis),
                "after round {round}: {} burstable pods of 100m",
                PER_KIND * (round + 1)
            );
        }
    });
}
