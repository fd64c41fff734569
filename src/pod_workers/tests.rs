use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn pod(uid: &str, generation: i64) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.to_string());
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.generation = Some(generation);
    p
}

/// Records every call; `sync_pod` can be made slow, failing, or finishing.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    sync_delay_ms: u64,
    fail_terminating: AtomicUsize,
    fail_sync: AtomicUsize,
    finish_after: Option<usize>,
    syncs: AtomicUsize,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

#[async_trait::async_trait]
impl PodSyncer for Recorder {
    async fn sync_pod(&self, update: UpdateType, pod: &Pod) -> Result<SyncOutcome, SyncError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        lock(&self.calls).push(format!(
            "sync {} {:?} gen{}",
            uid_of(pod),
            update,
            pod.metadata.generation.unwrap_or(0)
        ));
        tokio::time::sleep(Duration::from_millis(self.sync_delay_ms)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        let n = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_sync.load(Ordering::SeqCst) > 0 {
            self.fail_sync.fetch_sub(1, Ordering::SeqCst);
            return Err(SyncError::Runtime(runtime::Error::unknown("boom")));
        }
        Ok(SyncOutcome {
            finished: self.finish_after.is_some_and(|k| n >= k),
            requeue_after: None,
        })
    }
    async fn sync_terminating_pod(&self, pod: &Pod, grace: Duration) -> Result<(), SyncError> {
        lock(&self.calls).push(format!("terminating {} {}s", uid_of(pod), grace.as_secs()));
        if self.fail_terminating.load(Ordering::SeqCst) > 0 {
            self.fail_terminating.fetch_sub(1, Ordering::SeqCst);
            return Err(SyncError::Runtime(runtime::Error::unknown("still running")));
        }
        Ok(())
    }
    async fn sync_terminated_pod(&self, pod: &Pod) -> Result<(), SyncError> {
        lock(&self.calls).push(format!("terminated {}", uid_of(pod)));
        Ok(())
    }
}

fn fast() -> Timing {
    Timing {
        resync: Duration::from_secs(3600),
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
    }
}

async fn settle(w: &PodWorkers, uid: &str, want: WorkerState) {
    for _ in 0..500 {
        if w.state(uid) == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("pod {uid} never reached {want:?}, is {:?}", w.state(uid));
}

fn calls(r: &Recorder) -> Vec<String> {
    lock(&r.calls).clone()
}

#[tokio::test]
async fn updates_to_one_pod_are_serialised_and_coalesced() {
    let rec = Arc::new(Recorder {
        sync_delay_ms: 100,
        ..Default::default()
    });
    let w = PodWorkers::new(rec.clone(), fast());
    w.update_pod(pod("a", 1), UpdateType::Create, None);
    tokio::time::sleep(Duration::from_millis(20)).await;
    for g in 2..=6 {
        w.update_pod(pod("a", g), UpdateType::Update, None);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        calls(&rec),
        vec!["sync a Create gen1", "sync a Update gen6"],
        "the latest update wins"
    );
    assert_eq!(rec.max_running.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn different_pods_sync_in_parallel() {
    let rec = Arc::new(Recorder {
        sync_delay_ms: 100,
        ..Default::default()
    });
    let w = PodWorkers::new(rec.clone(), fast());
    for uid in ["a", "b", "c"] {
        w.update_pod(pod(uid, 1), UpdateType::Create, None);
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(rec.max_running.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn kill_goes_through_terminating_and_terminated_with_retries() {
    let rec = Arc::new(Recorder {
        fail_terminating: AtomicUsize::new(2),
        ..Default::default()
    });
    let w = PodWorkers::new(rec.clone(), fast());
    w.update_pod(pod("a", 1), UpdateType::Create, None);
    settle(&w, "a", WorkerState::Syncing).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    w.update_pod(pod("a", 1), UpdateType::Kill, Some(Duration::from_secs(7)));
    for _ in 0..200 {
        if calls(&rec).last().is_some_and(|c| c == "terminated a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        calls(&rec),
        vec![
            "sync a Create gen1",
            "terminating a 7s",
            "terminating a 7s",
            "terminating a 7s",
            "terminated a",
        ]
    );
    assert!(!w.could_have_running_containers("a"));
    // A terminated pod never syncs again, and housekeeping forgets it once undesired.
    w.update_pod(pod("a", 2), UpdateType::Update, None);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(calls(&rec).len(), 5);
    assert_eq!(
        w.forget_terminated(&["a".to_string()]),
        Vec::<String>::new()
    );
    assert_eq!(w.forget_terminated(&[]), vec!["a".to_string()]);
    assert_eq!(w.state("a"), None);
}

#[tokio::test]
async fn a_pod_that_finishes_on_its_own_is_cleaned_up() {
    let rec = Arc::new(Recorder {
        finish_after: Some(1),
        ..Default::default()
    });
    let w = PodWorkers::new(rec.clone(), fast());
    let mut p = pod("done", 1);
    p.spec = Some(Default::default());
    w.update_pod(p, UpdateType::Create, None);
    settle(&w, "done", WorkerState::Terminated).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        calls(&rec),
        vec![
            "sync done Create gen1",
            "terminating done 0s",
            "terminated done"
        ]
    );
}

#[tokio::test]
async fn failed_syncs_are_retried_with_backoff_and_resync_happens() {
    let rec = Arc::new(Recorder {
        fail_sync: AtomicUsize::new(2),
        ..Default::default()
    });
    let timing = Timing {
        resync: Duration::from_millis(50),
        ..fast()
    };
    let w = PodWorkers::new(rec.clone(), timing);
    w.update_pod(pod("r", 1), UpdateType::Create, None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = calls(&rec);
    assert_eq!(c[0], "sync r Create gen1");
    assert_eq!(c[1], "sync r Sync gen1", "retry after failure");
    assert!(c.len() >= 4, "resyncs continue after success: {c:?}");
    assert!(w.could_have_running_containers("r"));
}

#[tokio::test]
async fn a_pending_kill_is_not_replaced_by_a_sync() {
    let rec = Arc::new(Recorder {
        sync_delay_ms: 80,
        ..Default::default()
    });
    let w = PodWorkers::new(rec.clone(), fast());
    w.update_pod(pod("k", 1), UpdateType::Create, None);
    tokio::time::sleep(Duration::from_millis(20)).await;
    w.update_pod(pod("k", 1), UpdateType::Kill, Some(Duration::from_secs(1)));
    w.update_pod(pod("k", 1), UpdateType::Sync, None);
    settle(&w, "k", WorkerState::Terminated).await;
    let c = calls(&rec);
    assert!(c.contains(&"terminating k 1s".to_string()), "{c:?}");
}
