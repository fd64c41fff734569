//! systemd's `Type=notify` protocol (`sd_notify`): `STATUS=` lines while the agent starts,
//! `READY=1` once the node is registered with the API server (standalone: once every pod
//! source has sent its first set, so the static pods were admitted), `WATCHDOG=1` every half
//! `WATCHDOG_USEC` only while the sync loop and the PLEG are healthy (a stuck agent misses
//! it and systemd restarts it), and `STOPPING=1` when it stops. Nothing is sent without
//! `NOTIFY_SOCKET`; a failed send is logged and changes nothing else.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use sd_notify::NotifyState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::housekeeping::Desired;

fn send(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("sd_notify: {e}");
    }
}

/// `STATUS=<what>`: what the agent is doing, for `systemctl status`.
pub fn status(what: &str) {
    send(&[NotifyState::Status(what)]);
}

/// `STOPPING=1`, with what the stop does.
pub fn stopping(what: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(what)]);
}

/// What makes the agent ready.
pub enum Readiness {
    /// The Node registered: the status manager's Node is known.
    Registered(watch::Receiver<Option<Node>>),
    /// Standalone: every pod source sent its first set.
    SourcesSeen(watch::Receiver<Desired>),
}

/// Sends `READY=1` once `readiness` is reached (never if it is not before `cancel`).
pub async fn ready_when(readiness: Readiness, node_name: String, cancel: CancellationToken) {
    let reached = async {
        match readiness {
            Readiness::Registered(mut node) => node.wait_for(Option::is_some).await.is_ok(),
            Readiness::SourcesSeen(mut desired) => {
                desired.wait_for(|d| d.all_sources_seen).await.is_ok()
            }
        }
    };
    tokio::select! {
        ok = reached => if ok {
            let what = format!("node {node_name} ready");
            send(&[NotifyState::Ready, NotifyState::Status(&what)]);
            tracing::info!("{what}");
        },
        _ = cancel.cancelled() => {}
    }
}

/// Sends `WATCHDOG=1` every half of systemd's `WATCHDOG_USEC` while `problem` finds none;
/// nothing without a watchdog.
pub async fn watchdog(problem: impl Fn() -> Option<String> + Send, cancel: CancellationToken) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut tick = tokio::time::interval((period / 2).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => match problem() {
                None => send(&[NotifyState::Watchdog]),
                Some(why) => tracing::warn!("watchdog not sent: {why}"),
            },
            _ = cancel.cancelled() => return,
        }
    }
}

/// How long the sync loop may go without an iteration before it counts as stuck (upstream's
/// `syncLoopHealthCheck`: twice the sync frequency, at least five minutes).
pub fn sync_loop_threshold(sync_frequency: Duration) -> Duration {
    (sync_frequency * 2).max(Duration::from_secs(300))
}

/// When the sync loop last went round (it does at least every housekeeping tick).
#[derive(Debug)]
pub struct SyncLoopHealth {
    last: Mutex<Instant>,
    threshold: Duration,
}

impl SyncLoopHealth {
    pub fn new(threshold: Duration) -> Self {
        SyncLoopHealth {
            last: Mutex::new(Instant::now()),
            threshold,
        }
    }

    /// The loop went round.
    pub fn touch(&self) {
        *crate::util::lock(&self.last) = Instant::now();
    }

    /// `None` when healthy, else upstream's message.
    pub fn problem(&self) -> Option<String> {
        self.problem_at(Instant::now())
    }

    fn problem_at(&self, now: Instant) -> Option<String> {
        let last = *crate::util::lock(&self.last);
        (now.saturating_duration_since(last) > self.threshold)
            .then(|| "sync Loop took longer than expected".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sync_loop_is_stuck_past_its_threshold() {
        assert_eq!(
            sync_loop_threshold(Duration::from_secs(60)),
            Duration::from_secs(300)
        );
        assert_eq!(
            sync_loop_threshold(Duration::from_secs(600)),
            Duration::from_secs(1200)
        );
        let h = SyncLoopHealth::new(Duration::from_secs(300));
        let now = Instant::now();
        assert_eq!(h.problem_at(now), None);
        assert_eq!(
            h.problem_at(now + Duration::from_secs(301)).as_deref(),
            Some("sync Loop took longer than expected")
        );
        h.touch();
        assert_eq!(
            h.problem_at(Instant::now() + Duration::from_secs(299)),
            None
        );
    }
}
