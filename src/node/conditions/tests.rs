//! Tests of [`super::node_conditions`] and the messages.

use super::*;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn find<'a>(conds: &'a [NodeCondition], t: &str) -> &'a NodeCondition {
    conds.iter().find(|c| c.type_ == t).unwrap()
}

fn times(c: &NodeCondition) -> (Timestamp, Timestamp) {
    (
        c.last_heartbeat_time.as_ref().unwrap().0,
        c.last_transition_time.as_ref().unwrap().0,
    )
}

#[test]
fn healthy_node_from_nothing() {
    let conds = node_conditions(&[], &Health::ready(), at(0));
    let got: Vec<_> = conds
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_deref().unwrap(),
                c.message.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available"
            ),
            (
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure"
            ),
            (
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available"
            ),
            (
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status"
            ),
        ]
    );
    for c in &conds {
        assert_eq!(times(c), (at(0), at(0)), "{}", c.type_);
    }
}

#[test]
fn pressure_true_reasons() {
    let health = Health {
        memory_pressure: true,
        disk_pressure: true,
        pid_pressure: true,
        ..Default::default()
    };
    let conds = node_conditions(&[], &health, at(0));
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasInsufficientMemory"),
        ("DiskPressure", "KubeletHasDiskPressure"),
        ("PIDPressure", "KubeletHasInsufficientPID"),
    ] {
        let c = find(&conds, t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some(reason))
        );
    }
    assert_eq!(find(&conds, "Ready").status, "True");
}

#[test]
fn heartbeat_moves_transition_only_on_flips() {
    let ready = Health::ready();
    let down = Health::not_ready([RUNTIME_DOWN]);
    // (health at this step, expected Ready status, expected Ready transition time)
    let steps = [
        (&ready, "True", 0),
        (&ready, "True", 0),
        (&down, "False", 20),
        (&down, "False", 20),
        (&ready, "True", 40),
        (&ready, "True", 40),
    ];
    let mut conds = Vec::new();
    for (i, (health, status, transition)) in steps.into_iter().enumerate() {
        let now = at(i as i64 * 10);
        conds = node_conditions(&conds, health, now);
        let r = find(&conds, "Ready");
        assert_eq!(r.status, status, "step {i}");
        assert_eq!(times(r), (now, at(transition)), "step {i}");
        // The pressure conditions never flipped: transition stays at the first step.
        assert_eq!(
            times(find(&conds, "MemoryPressure")),
            (now, at(0)),
            "step {i}"
        );
        assert_eq!(conds.len(), 4);
    }
}

#[test]
fn not_ready_reason_and_messages() {
    let pleg = pleg_unhealthy(Duration::from_secs(185), Duration::from_secs(180));
    assert_eq!(
        pleg,
        "PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s"
    );
    let cases = [
        (vec![RUNTIME_DOWN.to_string()], "container runtime is down"),
        (
            vec![RUNTIME_DOWN.to_string(), pleg.clone()],
            "[container runtime is down, PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s]",
        ),
        (
            vec![RUNTIME_DOWN.to_string(), RUNTIME_DOWN.to_string()],
            "container runtime is down",
        ),
    ];
    for (problems, message) in cases {
        let conds = node_conditions(&[], &Health::not_ready(problems.clone()), at(0));
        let r = find(&conds, "Ready");
        assert_eq!(r.status, "False");
        assert_eq!(r.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(r.message.as_deref(), Some(message), "{problems:?}");
    }
}

#[test]
fn message_change_keeps_transition_time() {
    let conds = node_conditions(&[], &Health::not_ready([RUNTIME_DOWN]), at(0));
    let conds = node_conditions(&conds, &Health::not_ready([RUNTIME_CHECK_PENDING]), at(10));
    let r = find(&conds, "Ready");
    assert_eq!(r.message.as_deref(), Some(RUNTIME_CHECK_PENDING));
    assert_eq!(times(r), (at(10), at(0)));
}

#[test]
fn other_conditions_are_kept() {
    let network = NodeCondition {
        type_: "NetworkUnavailable".into(),
        status: "False".into(),
        reason: Some("RouteCreated".into()),
        last_transition_time: Some(Time(at(-100))),
        ..Default::default()
    };
    let conds = node_conditions(std::slice::from_ref(&network), &Health::ready(), at(0));
    assert_eq!(conds.len(), 5);
    assert_eq!(conds[0], network);
}
