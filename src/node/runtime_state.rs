//! The container runtime's health as the Ready condition sees it (upstream's `runtimeState`
//! and `updateRuntimeUp`): the kubelet asks the runtime's `Status` periodically
//! ([`RuntimeState::check`]); [`RuntimeState::problems`] turns what it last heard into
//! [`super::Health`] problems with upstream's messages. It never calls the runtime by itself.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use runtime::{RuntimeService, cri};

use super::conditions::{RUNTIME_CHECK_PENDING, RUNTIME_DOWN};

/// How long after the last good `Status` the runtime counts as down (upstream's
/// `maxWaitForContainerRuntime`).
pub const RUNTIME_DOWN_THRESHOLD: Duration = Duration::from_secs(30);

/// What the kubelet last heard from the runtime's `Status`.
#[derive(Debug)]
pub struct RuntimeState {
    threshold: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    last_ok: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
}

impl Default for RuntimeState {
    fn default() -> Self {
        RuntimeState::new(RUNTIME_DOWN_THRESHOLD)
    }
}

/// `Type=bool reason:R message:M` as upstream prints a runtime condition, `<nil>` when absent.
fn describe(c: Option<&cri::RuntimeCondition>) -> String {
    match c {
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.r#type, c.status, c.reason, c.message
        ),
        None => "<nil>".to_string(),
    }
}

impl RuntimeState {
    /// A state that calls the runtime down `threshold` after its last good answer.
    pub fn new(threshold: Duration) -> Self {
        RuntimeState {
            threshold,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Asks the runtime's `Status` once and records the answer.
    pub async fn check(&self, runtime: &dyn RuntimeService) {
        let resp = runtime.status(cri::StatusRequest { verbose: false }).await;
        match resp {
            Ok(resp) => self.record(resp.status.as_ref(), Instant::now()),
            Err(e) => tracing::warn!("container runtime status check failed: {e}"),
        }
    }

    /// Records a `Status` answer received at `now`: the network condition's error, the runtime
    /// condition's error, and (when the runtime is ready) the time of the last good answer. A
    /// failed call records nothing, so the runtime turns "down" after the threshold.
    pub fn record(&self, status: Option<&cri::RuntimeStatus>, now: Instant) {
        let find = |t: &str| status.and_then(|s| s.conditions.iter().find(|c| c.r#type == t));
        let network = find("NetworkReady");
        let rt = find("RuntimeReady");
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.network_error = (!network.is_some_and(|c| c.status))
            .then(|| format!("container runtime network not ready: {}", describe(network)));
        if rt.is_some_and(|c| c.status) {
            inner.runtime_error = None;
            inner.last_ok = Some(now);
        } else {
            inner.runtime_error = Some(format!("container runtime not ready: {}", describe(rt)));
        }
    }

    /// The problems to report at `now`, in upstream's order: the runtime check (pending or
    /// down), the runtime's not-ready condition, then the network's.
    pub fn problems(&self, now: Instant) -> Vec<String> {
        let Ok(inner) = self.inner.lock() else {
            return vec![RUNTIME_DOWN.to_string()];
        };
        let mut out = Vec::new();
        match inner.last_ok {
            None => out.push(RUNTIME_CHECK_PENDING.to_string()),
            Some(t) if now.saturating_duration_since(t) >= self.threshold => {
                out.push(RUNTIME_DOWN.to_string())
            }
            Some(_) => {}
        }
        out.extend(inner.runtime_error.clone());
        out.extend(inner.network_error.clone());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, ok: bool) -> cri::RuntimeCondition {
        cri::RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: if ok { String::new() } else { "Broken".into() },
            message: if ok { String::new() } else { "it broke".into() },
        }
    }

    fn status(conds: Vec<cri::RuntimeCondition>) -> cri::RuntimeStatus {
        cri::RuntimeStatus { conditions: conds }
    }

    #[test]
    fn pending_then_ok_then_down() {
        let s = RuntimeState::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(s.problems(t0), [RUNTIME_CHECK_PENDING]);
        let ok = status(vec![cond("RuntimeReady", true), cond("NetworkReady", true)]);
        s.record(Some(&ok), t0);
        assert!(s.problems(t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(s.problems(t0 + Duration::from_secs(30)), [RUNTIME_DOWN]);
        s.record(Some(&ok), t0 + Duration::from_secs(31));
        assert!(s.problems(t0 + Duration::from_secs(32)).is_empty());
    }

    #[test]
    fn conditions_not_ready() {
        let s = RuntimeState::new(Duration::from_secs(30));
        let t0 = Instant::now();
        s.record(
            Some(&status(vec![
                cond("RuntimeReady", true),
                cond("NetworkReady", false),
            ])),
            t0,
        );
        assert_eq!(
            s.problems(t0),
            [
                "container runtime network not ready: NetworkReady=false reason:Broken message:it broke"
            ]
        );
        // Runtime not ready: no good answer, so the last one ages; network condition absent.
        s.record(Some(&status(vec![cond("RuntimeReady", false)])), t0);
        assert_eq!(
            s.problems(t0),
            [
                "container runtime not ready: RuntimeReady=false reason:Broken message:it broke",
                "container runtime network not ready: <nil>",
            ]
        );
        s.record(None, t0 + Duration::from_secs(40));
        assert_eq!(
            s.problems(t0 + Duration::from_secs(40)),
            [
                RUNTIME_DOWN,
                "container runtime not ready: <nil>",
                "container runtime network not ready: <nil>",
            ]
        );
    }

    #[tokio::test]
    async fn checks_the_runtime() {
        let fake = runtime::fake::FakeRuntime::new();
        fake.set_runtime_conditions(vec![cond("RuntimeReady", true), cond("NetworkReady", true)]);
        let s = RuntimeState::default();
        s.check(&fake).await;
        assert!(s.problems(Instant::now()).is_empty());
        fake.set_runtime_conditions(vec![
            cond("RuntimeReady", true),
            cond("NetworkReady", false),
        ]);
        s.check(&fake).await;
        assert_eq!(s.problems(Instant::now()).len(), 1);
    }
}
