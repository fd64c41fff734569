//! The container runtime's health as the Ready condition sees it (upstream's `runtimeState`
//! and `updateRuntimeUp`): the kubelet asks the runtime's `Status` periodically
//! ([`RuntimeState::check`]); [`RuntimeState::problems`] turns what it last heard into
//! [`super::Health`] problems with upstream's messages. It never calls the runtime by itself.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{NodeFeatures, NodeRuntimeHandler, NodeRuntimeHandlerFeatures};
use runtime::{RuntimeService, cri};

use super::conditions::{Health, RUNTIME_CHECK_PENDING, RUNTIME_DOWN};

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
    handlers: Option<Vec<NodeRuntimeHandler>>,
    features: Option<NodeFeatures>,
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

/// A CRI runtime handler as `status.runtimeHandlers` lists it (the default handler has the
/// empty name).
fn node_handler(h: &cri::RuntimeHandler) -> NodeRuntimeHandler {
    let f = h.features.as_ref();
    NodeRuntimeHandler {
        name: Some(h.name.clone()),
        features: Some(NodeRuntimeHandlerFeatures {
            recursive_read_only_mounts: Some(f.is_some_and(|f| f.recursive_read_only_mounts)),
            user_namespaces: Some(f.is_some_and(|f| f.user_namespaces)),
        }),
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

    /// Asks the runtime's `Status` every `period` until `shutdown`, recording each answer
    /// (upstream's `updateRuntimeUp` loop). The first check is made at once.
    pub async fn run_checks(
        self: std::sync::Arc<Self>,
        runtime: std::sync::Arc<dyn RuntimeService>,
        period: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => self.check(runtime.as_ref()).await,
            }
        }
    }

    /// The network's not-ready error from the last answer, as upstream's `networkErrors`:
    /// pods without hostNetwork are not synced while there is one.
    pub fn network_error(&self) -> Option<String> {
        self.inner
            .lock()
            .ok()
            .and_then(|inner| inner.network_error.clone())
    }

    /// Whether the runtime's default handler (`""`) runs pods in user namespaces, as it last
    /// said; false before it said anything.
    pub fn supports_user_namespaces(&self) -> bool {
        self.inner.lock().ok().is_some_and(|inner| {
            inner.handlers.iter().flatten().any(|h| {
                h.name.as_deref() == Some("")
                    && h.features
                        .as_ref()
                        .and_then(|f| f.user_namespaces)
                        .unwrap_or(false)
            })
        })
    }

    /// Asks the runtime's `Status` once and records the answer.
    pub async fn check(&self, runtime: &dyn RuntimeService) {
        let resp = runtime.status(cri::StatusRequest { verbose: false }).await;
        match resp {
            Ok(resp) => self.record(&resp, Instant::now()),
            Err(e) => tracing::warn!("container runtime status check failed: {e}"),
        }
    }

    /// Records a `Status` answer received at `now`: the network condition's error, the runtime
    /// condition's error, and (when the runtime is ready) the time of the last good answer and
    /// its handlers and features. A failed call records nothing, so the runtime turns "down"
    /// after the threshold.
    pub fn record(&self, resp: &cri::StatusResponse, now: Instant) {
        let status = resp.status.as_ref();
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
            inner.handlers = Some(resp.runtime_handlers.iter().map(node_handler).collect());
            inner.features = Some(NodeFeatures {
                supplemental_groups_policy: Some(
                    resp.features
                        .as_ref()
                        .is_some_and(|f| f.supplemental_groups_policy),
                ),
            });
        } else {
            inner.runtime_error = Some(format!("container runtime not ready: {}", describe(rt)));
        }
    }

    /// The [`Health`] to report at `now`: [`Self::problems`] and the runtime's handlers and
    /// features as last reported.
    pub fn health(&self, now: Instant) -> Health {
        let (handlers, features) = match self.inner.lock() {
            Ok(inner) => (inner.handlers.clone(), inner.features.clone()),
            Err(_) => (None, None),
        };
        Health {
            problems: self.problems(now),
            runtime_handlers: handlers,
            features,
            ..Default::default()
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

    fn status(conds: Vec<cri::RuntimeCondition>) -> cri::StatusResponse {
        cri::StatusResponse {
            status: Some(cri::RuntimeStatus { conditions: conds }),
            ..Default::default()
        }
    }

    #[test]
    fn pending_then_ok_then_down() {
        let s = RuntimeState::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(s.problems(t0), [RUNTIME_CHECK_PENDING]);
        let ok = status(vec![cond("RuntimeReady", true), cond("NetworkReady", true)]);
        s.record(&ok, t0);
        assert!(s.problems(t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(s.problems(t0 + Duration::from_secs(30)), [RUNTIME_DOWN]);
        s.record(&ok, t0 + Duration::from_secs(31));
        assert!(s.problems(t0 + Duration::from_secs(32)).is_empty());
    }

    #[test]
    fn conditions_not_ready() {
        let s = RuntimeState::new(Duration::from_secs(30));
        let t0 = Instant::now();
        s.record(
            &status(vec![
                cond("RuntimeReady", true),
                cond("NetworkReady", false),
            ]),
            t0,
        );
        assert_eq!(
            s.problems(t0),
            [
                "container runtime network not ready: NetworkReady=false reason:Broken message:it broke"
            ]
        );
        // Runtime not ready: no good answer, so the last one ages; network condition absent.
        s.record(&status(vec![cond("RuntimeReady", false)]), t0);
        assert_eq!(
            s.problems(t0),
            [
                "container runtime not ready: RuntimeReady=false reason:Broken message:it broke",
                "container runtime network not ready: <nil>",
            ]
        );
        s.record(
            &cri::StatusResponse::default(),
            t0 + Duration::from_secs(40),
        );
        assert_eq!(
            s.problems(t0 + Duration::from_secs(40)),
            [
                RUNTIME_DOWN,
                "container runtime not ready: <nil>",
                "container runtime network not ready: <nil>",
            ]
        );
    }

    #[test]
    fn handlers_and_features_once_ready() {
        let s = RuntimeState::default();
        let t0 = Instant::now();
        assert_eq!(s.health(t0).runtime_handlers, None);
        let mut resp = status(vec![cond("RuntimeReady", true), cond("NetworkReady", true)]);
        resp.runtime_handlers = vec![
            cri::RuntimeHandler {
                name: String::new(),
                features: Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: false,
                }),
            },
            cri::RuntimeHandler {
                name: "kata".into(),
                features: None,
            },
        ];
        resp.features = Some(cri::RuntimeFeatures {
            supplemental_groups_policy: true,
        });
        s.record(&resp, t0);
        let h = s.health(t0);
        assert!(h.problems.is_empty());
        let handlers: Vec<_> = h
            .runtime_handlers
            .unwrap()
            .into_iter()
            .map(|h| {
                let f = h.features.unwrap();
                (
                    h.name.unwrap(),
                    f.recursive_read_only_mounts,
                    f.user_namespaces,
                )
            })
            .collect();
        assert_eq!(
            handlers,
            [
                (String::new(), Some(true), Some(false)),
                ("kata".to_string(), Some(false), Some(false)),
            ]
        );
        assert_eq!(h.features.unwrap().supplemental_groups_policy, Some(true));
        // User namespaces are the default handler's to offer.
        assert!(!s.supports_user_namespaces());
        resp.runtime_handlers[1].features = Some(cri::RuntimeHandlerFeatures {
            recursive_read_only_mounts: false,
            user_namespaces: true,
        });
        s.record(&resp, t0);
        assert!(!s.supports_user_namespaces());
        resp.runtime_handlers[0]
            .features
            .as_mut()
            .unwrap()
            .user_namespaces = true;
        s.record(&resp, t0);
        assert!(s.supports_user_namespaces());
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
