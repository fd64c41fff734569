use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::{Observation, StartupTracker, pulling_time};

const CREATED: u64 = 1_800_000_000;

fn at(secs: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(CREATED) + Duration::from_secs_f64(secs)
}

/// A pod created at `CREATED`; `running` makes its one container running, `started` gives it
/// a startTime (a kubelet acknowledged it).
fn pod(uid: &str, running: bool, started: bool, volumes: serde_json::Value) -> Pod {
    let state = if running {
        json!({"running": {"startedAt": "2027-01-15T08:00:05Z"}})
    } else {
        json!({"waiting": {"reason": "ContainerCreating"}})
    };
    let mut status = json!({
        "phase": if running { "Running" } else { "Pending" },
        "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": running,
            "restartCount": 0, "state": state}],
    });
    if started {
        status["startTime"] = json!("2027-01-15T08:00:01Z");
    }
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": uid,
            "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"containers": [{"name": "app", "image": "i"}], "volumes": volumes},
        "status": status,
    }))
    .expect("a pod")
}

/// `pod` with its creationTimestamp moved to `CREATED` (the JSON above names a fixed date).
fn created(mut p: Pod) -> Pod {
    let ts = k8s_openapi::jiff::Timestamp::from_second(CREATED as i64).expect("a time");
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts));
    p
}

fn new_pod(uid: &str) -> Pod {
    created(pod(uid, false, false, json!([])))
}

fn running_pod(uid: &str) -> Pod {
    created(pod(uid, true, true, json!([])))
}

#[test]
fn pull_time_and_init_containers_are_left_out_of_the_sli_once() {
    let t = StartupTracker::default();
    assert_eq!(t.observed_on_watch(&new_pod("a"), at(0.5)), None);
    // Two overlapping pulls, 1..4 and 2..6: 5 s of pulling.
    t.pull_started("a", at(1.0));
    t.pull_started("a", at(2.0));
    t.pull_finished("a", at(4.0));
    t.pull_finished("a", at(6.0));
    // An init container running 6.5..8.
    t.init_started("a", "init", at(6.5));
    t.init_finished("a", "other", at(7.0)); // not the one started
    t.init_finished("a", "init", at(8.0));
    t.init_finished("a", "init", at(9.0)); // seen again: counted once
    // Written running, then seen so on the watch.
    assert_eq!(t.status_written(&running_pod("a"), at(10.0)), None);
    let seen = t.observed_on_watch(&running_pod("a"), at(10.5));
    assert_eq!(
        seen,
        Some(Observation {
            total: Duration::from_secs_f64(10.5),
            sli: Some(Duration::from_secs_f64(10.5 - 5.0 - 1.5)),
        })
    );
    assert_eq!(t.observed_on_watch(&running_pod("a"), at(11.0)), None);
}

#[test]
fn the_write_may_come_back_on_the_watch_before_its_answer() {
    let t = StartupTracker::default();
    t.observed_on_watch(&new_pod("w"), at(0.0));
    assert_eq!(t.observed_on_watch(&running_pod("w"), at(2.0)), None);
    assert_eq!(t.observed_on_watch(&running_pod("w"), at(2.5)), None);
    assert_eq!(
        t.status_written(&running_pod("w"), at(3.0)),
        Some(Observation {
            total: Duration::from_secs(2),
            sli: Some(Duration::from_secs(2)),
        })
    );
    assert_eq!(t.status_written(&running_pod("w"), at(4.0)), None);
    assert_eq!(t.observed_on_watch(&running_pod("w"), at(5.0)), None);
}

#[test]
fn pods_already_acknowledged_unschedulable_or_terminal_are_not_observed() {
    let t = StartupTracker::default();
    // Found with a startTime (running before a restart): never tracked.
    let adopted = running_pod("old");
    assert_eq!(t.observed_on_watch(&adopted, at(1.0)), None);
    t.status_written(&adopted, at(2.0));
    assert_eq!(t.observed_on_watch(&adopted, at(3.0)), None);

    // Unschedulable when first seen: left out for good.
    let mut stuck = new_pod("stuck");
    if let Some(s) = stuck.status.as_mut() {
        s.conditions = Some(vec![
            serde_json::from_value(json!({"type": "PodScheduled", "status": "False"}))
                .expect("a condition"),
        ]);
    }
    t.observed_on_watch(&stuck, at(1.0));
    assert_eq!(t.observed_on_watch(&new_pod("stuck"), at(2.0)), None);
    t.status_written(&running_pod("stuck"), at(3.0));
    assert_eq!(t.observed_on_watch(&running_pod("stuck"), at(4.0)), None);

    // A pod that ends is forgotten.
    t.observed_on_watch(&new_pod("done"), at(1.0));
    let mut done = new_pod("done");
    if let Some(s) = done.status.as_mut() {
        s.phase = Some("Succeeded".into());
    }
    t.observed_on_watch(&done, at(2.0));
    t.status_written(&running_pod("done"), at(3.0));
    assert_eq!(t.observed_on_watch(&running_pod("done"), at(4.0)), None);

    // And one the kubelet forgot.
    t.observed_on_watch(&new_pod("gone"), at(1.0));
    t.forget("gone");
    t.status_written(&running_pod("gone"), at(3.0));
    assert_eq!(t.observed_on_watch(&running_pod("gone"), at(4.0)), None);
}

#[test]
fn stateful_pods_count_in_the_total_only() {
    let t = StartupTracker::default();
    let pvc = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]);
    let first = created(pod("s", false, false, pvc.clone()));
    t.observed_on_watch(&first, at(0.0));
    let running = created(pod("s", true, true, pvc));
    t.status_written(&running, at(2.0));
    assert_eq!(
        t.observed_on_watch(&running, at(3.0)),
        Some(Observation {
            total: Duration::from_secs(3),
            sli: None
        })
    );
    // Ephemeral volumes (the API's service account token, an emptyDir) are not state.
    let eph = json!([{"name": "kube-api-access", "projected": {"sources": []}},
        {"name": "scratch", "emptyDir": {}}]);
    t.observed_on_watch(&created(pod("e", false, false, eph.clone())), at(0.0));
    let running = created(pod("e", true, true, eph));
    t.status_written(&running, at(1.0));
    assert_eq!(
        t.observed_on_watch(&running, at(2.0)).and_then(|o| o.sli),
        Some(Duration::from_secs(2))
    );
}

#[test]
fn a_failed_pull_stays_open_until_a_pull_succeeds() {
    // As upstream: the start of a failed pull pairs with the next successful end, so the
    // back-off between them is left out as well.
    let t = StartupTracker::default();
    t.observed_on_watch(&new_pod("b"), at(0.0));
    t.pull_started("b", at(1.0));
    t.pull_started("b", at(5.0));
    t.pull_finished("b", at(6.0));
    t.status_written(&running_pod("b"), at(7.0));
    let o = t.observed_on_watch(&running_pod("b"), at(8.0));
    assert_eq!(o.and_then(|o| o.sli), Some(Duration::from_secs(3)));
}

#[test]
fn pull_sessions_are_a_union() {
    let s = |a: f64, b: f64| (at(a), at(b));
    assert_eq!(pulling_time(&[]), Duration::ZERO);
    assert_eq!(
        pulling_time(&[s(5.0, 6.0), s(1.0, 3.0), s(2.0, 4.0), s(2.5, 3.5)]),
        Duration::from_secs(4)
    );
}
