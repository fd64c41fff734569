use std::collections::{BTreeMap, BTreeSet};

use super::*;

const R: &str = "example.com/dev";

fn state(ids: &[(&str, bool)]) -> State {
    let mut st = State::default();
    st.devices.insert(
        R.to_string(),
        ids.iter()
            .map(|(id, healthy)| {
                let d = Device {
                    healthy: *healthy,
                    numa: Vec::new(),
                };
                (id.to_string(), d)
            })
            .collect(),
    );
    st
}

fn demand(container: &str, init: bool, n: usize) -> Demand {
    Demand {
        container: container.into(),
        init,
        counts: BTreeMap::from([(R.to_string(), n)]),
    }
}

fn pod(yaml: &str) -> Pod {
    serde_norway::from_str(yaml).unwrap()
}

#[test]
fn demands_follow_allocation_order_and_skip_other_resources() {
    let p = pod("metadata: {name: p, uid: u}
spec:
  initContainers:
  - {name: i1, resources: {limits: {example.com/dev: '1'}}}
  - {name: side, restartPolicy: Always, resources: {limits: {example.com/dev: '1'}}}
  containers:
  - {name: a, resources: {limits: {example.com/dev: '2', cpu: '1'}}}
  - {name: b, resources: {limits: {cpu: '1'}}}
");
    let d = demands(&p, |r| r == R);
    assert_eq!(
        d,
        vec![
            demand("i1", true, 1),
            demand("side", false, 1),
            demand("a", false, 2)
        ]
    );
}

#[test]
fn admission_counts_free_healthy_devices_and_reserves_them() {
    let mut st = state(&[("a", true), ("b", true), ("c", false)]);
    st.reserve("p1", &[demand("main", false, 2)]).unwrap();
    assert_eq!(st.reserved["p1"][R], 2);
    // Reserved by p1, so nothing is left for p2 though nothing is held yet.
    let err = st.reserve("p2", &[demand("main", false, 1)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0"
    );
    assert!(!st.reserved.contains_key("p2"));
}

#[test]
fn init_container_devices_are_reused_by_the_containers_after_it() {
    let mut st = state(&[("a", true), ("b", true)]);
    // init needs 2, app needs 2: the same two devices serve both.
    st.reserve("p", &[demand("init", true, 2), demand("main", false, 2)])
        .unwrap();
    assert_eq!(st.reserved["p"][R], 2);
    let init: BTreeSet<String> = ["init".to_string()].into();
    let i = st
        .take("p", &demand("init", true, 2), R, &init, &[])
        .unwrap();
    assert_eq!(i, vec!["a", "b"]);
    assert!(st.free(R).is_empty());
    let m = st
        .take("p", &demand("main", false, 2), R, &init, &[])
        .unwrap();
    assert_eq!(m, vec!["a", "b"], "the init container's devices are reused");
    assert!(!st.reserved.contains_key("p"));
    // A sidecar keeps its devices: nothing to reuse from it.
    let mut st = state(&[("a", true), ("b", true)]);
    let err = st
        .reserve("q", &[demand("side", false, 1), demand("main", false, 2)])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Shortage::Unavailable {
                requested: 2,
                available: 1,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn take_follows_the_preference_among_free_devices_and_respects_reservations() {
    let mut st = state(&[("a", true), ("b", true), ("c", true), ("d", false)]);
    st.reserve("other", &[demand("main", false, 1)]).unwrap();
    st.reserve("p", &[demand("main", false, 2)]).unwrap();
    let none = BTreeSet::new();
    // "d" is unhealthy and "x" unknown: skipped; then "c", then by ID.
    let pref = vec!["d".to_string(), "x".to_string(), "c".to_string()];
    let got = st
        .take("p", &demand("main", false, 2), R, &none, &pref)
        .unwrap();
    assert_eq!(got, vec!["c", "a"]);
    // One free device is left, reserved by `other`: a pod that did not reserve gets nothing.
    let err = st
        .take("late", &demand("main", false, 1), R, &none, &[])
        .unwrap_err();
    assert!(
        matches!(err, Shortage::Unavailable { available: 0, .. }),
        "{err:?}"
    );
    assert_eq!(
        st.take("other", &demand("main", false, 1), R, &none, &[])
            .unwrap(),
        vec!["b"]
    );
    assert!(st.reserved.is_empty());
}

#[test]
fn a_held_allocation_is_not_counted_again_and_a_changed_request_is_refused() {
    let mut st = state(&[("a", true), ("b", true)]);
    let none = BTreeSet::new();
    st.reserve("p", &[demand("main", false, 1)]).unwrap();
    st.take("p", &demand("main", false, 1), R, &none, &[])
        .unwrap();
    // Admitted again (an agent restart): it holds what it asks for, nothing is reserved.
    st.reserve("p", &[demand("main", false, 1)]).unwrap();
    assert!(st.reserved.is_empty());
    let err = st.reserve("p", &[demand("main", false, 2)]).unwrap_err();
    assert!(
        matches!(
            err,
            Shortage::Changed {
                held: 1,
                requested: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn capacity_counts_all_devices_and_allocatable_the_healthy_ones() {
    let mut st = state(&[("a", true), ("b", false)]);
    assert_eq!(st.capacity()[R], (2, 1));
    st.all_unhealthy(R);
    assert_eq!(st.capacity()[R], (2, 0));
}

#[test]
fn giving_back_and_retaining_free_devices() {
    let mut st = state(&[("a", true), ("b", true)]);
    let none = BTreeSet::new();
    st.reserve("p", &[demand("main", false, 2)]).unwrap();
    st.take("p", &demand("main", false, 2), R, &none, &[])
        .unwrap();
    assert!(st.free(R).is_empty());
    st.give_back("p", "main", R);
    assert_eq!(st.free(R).len(), 2);
    st.reserve("q", &[demand("main", false, 1)]).unwrap();
    st.take("q", &demand("main", false, 1), R, &none, &[])
        .unwrap();
    assert!(st.retain(|u| u != "q"));
    assert_eq!(st.free(R).len(), 2);
    assert!(!st.retain(|_| true));
}
