//! Tests of [`super`] (`kubelet::pleg`).

use super::*;

fn state(list: &[(&str, &str, i32)]) -> HashMap<String, (String, i32)> {
    list.iter()
        .map(|(id, uid, s)| (id.to_string(), (uid.to_string(), *s)))
        .collect()
}

#[test]
fn relist_reports_pods_whose_containers_changed() {
    let mut r = Relister::new();
    let first = r.diff(state(&[("c1", "p1", 1), ("c2", "p2", 1)]));
    assert_eq!(first, BTreeSet::from(["p1".into(), "p2".into()]));
    assert!(
        r.diff(state(&[("c1", "p1", 1), ("c2", "p2", 1)]))
            .is_empty()
    );
    // c1 exited, c2 vanished, c3 appeared in p3.
    let next = r.diff(state(&[("c1", "p1", 2), ("c3", "p3", 0)]));
    assert_eq!(
        next,
        BTreeSet::from(["p1".into(), "p2".into(), "p3".into()])
    );
}

use runtime::fake::FakeRuntime;

const UID: &str = "p1";

fn labels() -> HashMap<String, String> {
    [(LABEL_POD_UID.to_string(), UID.to_string())].into()
}

/// A running container of pod `p1` on the fake; returns its id.
async fn run_container(rt: &FakeRuntime, sandbox: &str, name: &str) -> String {
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_string(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "busybox".into(),
                    ..Default::default()
                }),
                labels: labels(),
                ..Default::default()
            }),
            sandbox_config: None,
        })
        .await
        .expect("create")
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("start");
    id
}

async fn sandbox(rt: &FakeRuntime) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "p".into(),
                uid: UID.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: labels(),
            ..Default::default()
        }),
        runtime_handler: String::new(),
    })
    .await
    .expect("sandbox")
    .pod_sandbox_id
}

struct Running {
    health: Arc<PlegHealth>,
    cache: Arc<PodCache>,
    changed: mpsc::UnboundedReceiver<String>,
    cancel: CancellationToken,
    refresh: mpsc::UnboundedSender<Refresh>,
}

fn start(rt: Arc<FakeRuntime>, config: PlegConfig) -> Running {
    let health = Arc::new(PlegHealth::new(RELIST_THRESHOLD));
    let cache = Arc::new(PodCache::new());
    let (changed_tx, changed) = mpsc::unbounded_channel();
    let (refresh, refresh_rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let pleg = Pleg {
        rt,
        cache: cache.clone(),
        health: health.clone(),
        changed: changed_tx,
        refresh: refresh_rx,
        config,
    };
    tokio::spawn(pleg.run(cancel.clone()));
    Running {
        health,
        cache,
        changed,
        cancel,
        refresh,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_relist_makes_the_pleg_unhealthy_until_it_completes() {
    let rt = Arc::new(FakeRuntime::new());
    rt.hold_rpc("ListContainers");
    let p = start(rt.clone(), PlegConfig::default());
    tokio::time::sleep(Duration::from_secs(170)).await;
    assert_eq!(p.health.problem(), None);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let problem = p.health.problem().expect("unhealthy");
    assert!(
        problem.starts_with("PLEG is not healthy: pleg was last seen active 3m10s ago"),
        "{problem}"
    );
    rt.release_rpc("ListContainers");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(p.health.problem(), None);
    p.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn events_keep_the_cache_fresh_and_the_safety_relist_catches_what_they_miss() {
    let rt = Arc::new(FakeRuntime::new());
    let sb = sandbox(&rt).await;
    let mut p = start(rt.clone(), PlegConfig::default());
    // The first relist reads the pod (nothing of it ran yet: no change to report).
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(p.cache.newer_than(UID, None).is_some());
    // An event: the pod is read again at once and handed on.
    let c1 = run_container(&rt, &sb, "a").await;
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    let view = p.cache.newer_than(UID, None).expect("view").expect("ok");
    assert_eq!(view.containers.len(), 1);
    while p.changed.try_recv().is_ok() {}
    // A stalled stream: the change reaches the loop through the next safety relist only.
    rt.mute_events(true);
    rt.set_container_exited(&c1, 1, "Error").expect("exit");
    let before = Instant::now();
    let got = tokio::time::timeout(SAFETY_RELIST_PERIOD * 2, p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    let waited = Instant::now() - before;
    assert!(
        waited > Duration::from_secs(1) && waited <= SAFETY_RELIST_PERIOD,
        "found by the safety relist after {waited:?}"
    );
    let view = p.cache.newer_than(UID, None).expect("view").expect("ok");
    assert_eq!(
        view.containers[0].state,
        cri::ContainerState::ContainerExited as i32
    );
    // Stalled twice: the PLEG drops the stream, asks for it again, and relists every second
    // until the stream proves complete, so the next change is seen within a second.
    let c2 = run_container(&rt, &sb, "b").await;
    let got = tokio::time::timeout(SAFETY_RELIST_PERIOD * 2, p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    tokio::time::sleep(Duration::from_secs(10)).await;
    while p.changed.try_recv().is_ok() {}
    rt.set_container_exited(&c2, 0, "Completed").expect("exit");
    let before = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(5), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    assert!(Instant::now() - before <= Duration::from_secs(1));
    assert_eq!(p.health.problem(), None);
    // Events flow again: after 30 clean seconds the safety period is back, and the events
    // alone bring changes at once.
    rt.mute_events(false);
    tokio::time::sleep(Duration::from_secs(40)).await;
    while p.changed.try_recv().is_ok() {}
    run_container(&rt, &sb, "c").await;
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    p.cancel.cancel();
}

fn lists(rt: &FakeRuntime) -> usize {
    rt.called()
        .iter()
        .filter(|c| *c == "ListContainers")
        .count()
}

#[tokio::test(start_paused = true)]
async fn events_during_a_sync_are_held_and_read_once_when_it_ends() {
    let rt = Arc::new(FakeRuntime::new());
    let sb = sandbox(&rt).await;
    let mut p = start(rt.clone(), PlegConfig::default());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(p.cache.newer_than(UID, None).is_some());
    // The sync's own actions: their events are held, nothing is read or handed on.
    p.refresh.send(Refresh::SyncBegan(UID.into())).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = lists(&rt);
    let c1 = run_container(&rt, &sb, "a").await;
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert!(got.is_err(), "handed on during the sync: {got:?}");
    assert_eq!(lists(&rt), before, "read during the sync");
    // Its end: one read, the pod handed on once, its view showing the container.
    p.refresh
        .send(Refresh::SyncEnded {
            uid: UID.into(),
            changed: false,
        })
        .unwrap();
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(p.changed.try_recv().is_err(), "handed on twice");
    assert_eq!(lists(&rt), before + 1, "one read for the held events");
    let view = p.cache.newer_than(UID, None).expect("view").expect("ok");
    assert_eq!(view.containers.len(), 1);
    // A sync that changed nothing and saw no event: no read.
    p.refresh.send(Refresh::SyncBegan(UID.into())).unwrap();
    p.refresh
        .send(Refresh::SyncEnded {
            uid: UID.into(),
            changed: false,
        })
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(p.changed.try_recv().is_err());
    assert_eq!(lists(&rt), before + 1);
    // One that changed something: read and handed on.
    p.refresh.send(Refresh::SyncBegan(UID.into())).unwrap();
    p.refresh
        .send(Refresh::SyncEnded {
            uid: UID.into(),
            changed: true,
        })
        .unwrap();
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    // Outside a sync, an event is read at once.
    while p.changed.try_recv().is_ok() {}
    rt.set_container_exited(&c1, 1, "Error").expect("exit");
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    // Safety relists that find a pod being synced changed do not count it as missed by the
    // events: two of them in a row keep the stream (two misses would drop it).
    p.refresh.send(Refresh::SyncBegan(UID.into())).unwrap();
    rt.mute_events(true);
    run_container(&rt, &sb, "b").await;
    tokio::time::sleep(SAFETY_RELIST_PERIOD + Duration::from_secs(1)).await;
    run_container(&rt, &sb, "c").await;
    tokio::time::sleep(SAFETY_RELIST_PERIOD + Duration::from_secs(1)).await;
    let subscriptions = |rt: &FakeRuntime| {
        rt.called()
            .iter()
            .filter(|c| *c == "GetContainerEvents")
            .count()
    };
    assert_eq!(subscriptions(&rt), 1, "the stream was dropped");
    // Outside a sync, the same twice drops it.
    p.refresh
        .send(Refresh::SyncEnded {
            uid: UID.into(),
            changed: false,
        })
        .unwrap();
    run_container(&rt, &sb, "d").await;
    tokio::time::sleep(SAFETY_RELIST_PERIOD + Duration::from_secs(1)).await;
    run_container(&rt, &sb, "e").await;
    tokio::time::sleep(SAFETY_RELIST_PERIOD + Duration::from_secs(10)).await;
    assert_eq!(
        subscriptions(&rt),
        2,
        "a stream missing changes is asked for again"
    );
    p.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn reads_of_a_pod_are_coalesced() {
    let rt = Arc::new(FakeRuntime::new());
    rt.hold_rpc("ListContainers");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reads = Reads {
        rt: rt.clone(),
        cache: Arc::new(PodCache::new()),
        changed: tx,
        relister: Arc::default(),
        inflight: Arc::default(),
    };
    // Five requests while the first read hangs: one more read after it, not five.
    for _ in 0..5 {
        reads.request(UID.into(), true);
    }
    reads.request("other".into(), false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    rt.release_rpc("ListContainers");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(lists(&rt), 3, "two reads of p1, one of the other pod");
    let mut told = Vec::new();
    while let Ok(uid) = rx.try_recv() {
        told.push(uid);
    }
    assert_eq!(
        told,
        [UID, UID],
        "only the pod whose reads were asked to tell"
    );
    assert!(reads.inflight.lock().unwrap().is_empty());
}

#[test]
fn the_event_stream_loses_trust_when_it_misses_and_earns_it_back() {
    let config = PlegConfig::default();
    let mut t = Trust::new(true, &config);
    assert_eq!(t.period(true), SAFETY_RELIST_PERIOD);
    let ok = Verdict {
        healthy: true,
        drop_stream: false,
    };
    assert_eq!(t.relisted(true, 0), ok);
    // One miss: kept (an event may have been on its way).
    assert_eq!(
        t.relisted(true, 1),
        Verdict {
            healthy: true,
            drop_stream: false
        }
    );
    assert_eq!(t.relisted(true, 0), ok);
    assert!(!t.relisted(true, 1).drop_stream);
    // Two in a row: dropped, not progress.
    assert_eq!(
        t.relisted(true, 2),
        Verdict {
            healthy: false,
            drop_stream: true
        }
    );
    assert_eq!(t.period(false), RELIST_PERIOD);
    // Back: one-second relists until 30 clean ones in a row.
    assert_eq!(t.period(true), RELIST_PERIOD);
    for _ in 0..29 {
        assert_eq!(t.relisted(true, 0), ok);
    }
    assert_eq!(t.period(true), RELIST_PERIOD);
    t.relisted(true, 1);
    for _ in 0..29 {
        t.relisted(true, 0);
    }
    assert_eq!(
        t.period(true),
        RELIST_PERIOD,
        "a miss starts the count again"
    );
    t.relisted(true, 0);
    assert_eq!(t.period(true), SAFETY_RELIST_PERIOD);
}

#[test]
fn health_turns_bad_after_the_threshold_with_the_upstream_message() {
    let h = PlegHealth::new(Duration::from_secs(180));
    let start = *h.last_active.lock().unwrap();
    assert_eq!(h.problem_at(start + Duration::from_secs(10)), None);
    assert_eq!(
        h.problem_at(start + Duration::from_secs(185)).as_deref(),
        Some("PLEG is not healthy: pleg was last seen active 3m5s ago; threshold is 3m0s")
    );
}

#[tokio::test(start_paused = true)]
async fn an_event_with_the_pods_whole_view_updates_the_cache_without_a_read() {
    let rt = Arc::new(FakeRuntime::new());
    let sb = sandbox(&rt).await;
    let c1 = run_container(&rt, &sb, "a").await;
    let mut p = start(rt.clone(), PlegConfig::default());
    // The first relist reads the pod: the PLEG knows its only sandbox.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(p.cache.newer_than(UID, None).is_some());
    while p.changed.try_recv().is_ok() {}
    rt.clear_calls();
    // The container exits: the fake's event carries the sandbox's and every container's
    // status, as containerd's and the built-in runtime's do.
    rt.set_container_exited(&c1, 3, "Error").expect("exit");
    let got = tokio::time::timeout(Duration::from_millis(50), p.changed.recv()).await;
    assert_eq!(got.ok().flatten().as_deref(), Some(UID));
    let view = p.cache.newer_than(UID, None).expect("view").expect("ok");
    assert_eq!(view.containers.len(), 1);
    assert_eq!(
        (view.containers[0].state, view.containers[0].exit_code),
        (cri::ContainerState::ContainerExited as i32, 3)
    );
    assert_eq!(view.status.containers.len(), 1);
    // No read of the pod: no list, no status call.
    assert_no_pod_read(&rt);
    // A second container in the same sandbox: its events carry both.
    run_container(&rt, &sb, "b").await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let view = p.cache.newer_than(UID, None).expect("view").expect("ok");
    assert_eq!(view.containers.len(), 2);
    assert_no_pod_read(&rt);
    p.cancel.cancel();
}

/// No read of a pod was asked of the runtime: no list, no status call.
fn assert_no_pod_read(rt: &FakeRuntime) {
    let calls = rt.called();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("List") || c.ends_with("Status")),
        "{calls:?}"
    );
}
