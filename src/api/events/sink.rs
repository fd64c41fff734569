//! The sink task: each recorded event goes through the correlator and what it decides is
//! written to the API server, one write at a time, each with a timeout. A write that cannot
//! reach the server is tried again a few times after a short back-off; one the server refuses
//! is not (as upstream). Failures are logged; callers never wait for any of this.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::correlator::{Correlator, Decision};

/// How long one write may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at a write that does not reach the server (upstream: 12, 10 s apart).
pub const MAX_TRIES: u32 = 4;
/// The wait before the second attempt; it doubles after each.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Once every recorder is gone, how long the events still queued may take to write; the
/// rest are dropped so that shutdown stays quick.
pub const DRAIN_BUDGET: Duration = Duration::from_secs(5);

/// An event as the recorder queued it, with when it was recorded.
#[derive(Debug)]
pub(super) struct Recorded {
    pub event: Event,
    pub at: Timestamp,
}

/// Runs until every sender of `rx` is dropped and the queue is written (or the drain budget
/// is spent). Without a client there is nothing to write: the recorder logged each event.
pub(super) async fn run(client: Option<Client>, mut rx: mpsc::Receiver<Recorded>) {
    let Some(client) = client else {
        while rx.recv().await.is_some() {}
        return;
    };
    let mut correlator = Correlator::default();
    let mut drain_deadline: Option<Instant> = None;
    while let Some(recorded) = rx.recv().await {
        if rx.is_closed() {
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_BUDGET);
            if Instant::now() >= deadline {
                let mut left = 1;
                while rx.try_recv().is_ok() {
                    left += 1;
                }
                tracing::warn!(
                    "shutting down: {left} events not written to the API server in {DRAIN_BUDGET:?}"
                );
                return;
            }
        }
        let decision = correlator.observe(recorded.event, recorded.at);
        write(&client, &mut correlator, decision, &rx).await;
    }
}

/// One write to the API server.
enum Op {
    Create(Event),
    /// Patch count, lastTimestamp and message; when the object is gone (expired or deleted),
    /// create `again` instead.
    Patch {
        name: String,
        namespace: String,
        patch: serde_json::Value,
        again: Event,
    },
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(crate::api::FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

impl Op {
    async fn apply(&self, client: &Client) -> Result<Event, kube::Error> {
        let api = |ns: &str| Api::<Event>::namespaced(client.clone(), ns);
        match self {
            Op::Create(event) => {
                let ns = event.metadata.namespace.as_deref().unwrap_or("default");
                api(ns).create(&post_params(), event).await
            }
            Op::Patch {
                name,
                namespace,
                patch,
                again,
            } => {
                let params = PatchParams {
                    field_manager: Some(crate::api::FIELD_MANAGER.to_string()),
                    ..Default::default()
                };
                let api = api(namespace);
                match api.patch(name, &params, &Patch::Strategic(patch)).await {
                    Err(kube::Error::Api(s)) if s.is_not_found() => {
                        api.create(&post_params(), again).await
                    }
                    other => other,
                }
            }
        }
    }

    fn describe(&self) -> String {
        let (event, verb) = match self {
            Op::Create(e) => (e, "creating"),
            Op::Patch { again, .. } => (again, "updating"),
        };
        let o = &event.involved_object;
        format!(
            "{verb} event {}/{} ({} about {} {}/{})",
            event.metadata.namespace.as_deref().unwrap_or(""),
            event.metadata.name.as_deref().unwrap_or(""),
            event.reason.as_deref().unwrap_or(""),
            o.kind.as_deref().unwrap_or(""),
            o.namespace.as_deref().unwrap_or(""),
            o.name.as_deref().unwrap_or(""),
        )
    }
}

/// The write for a decision, with the correlator key it is written under.
fn op_for(decision: Decision) -> Option<(String, Op)> {
    match decision {
        Decision::Drop => None,
        Decision::Create { key, event } => Some((key, Op::Create(event))),
        Decision::Patch {
            key,
            name,
            namespace,
            count,
            last_timestamp,
            message,
            event,
        } => {
            let patch = json!({
                "count": count,
                "lastTimestamp": Time(last_timestamp),
                "message": message,
            });
            // Created again, it starts counting anew.
            let mut again = event;
            again.metadata.resource_version = None;
            again.count = Some(1);
            again.first_timestamp = Some(Time(last_timestamp));
            again.last_timestamp = Some(Time(last_timestamp));
            Some((
                key,
                Op::Patch {
                    name,
                    namespace,
                    patch,
                    again,
                },
            ))
        }
    }
}

async fn write(
    client: &Client,
    correlator: &mut Correlator,
    decision: Decision,
    rx: &mpsc::Receiver<Recorded>,
) {
    let Some((key, op)) = op_for(decision) else {
        tracing::debug!("event dropped by the spam filter (too many about one object)");
        return;
    };
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=MAX_TRIES {
        let why = match tokio::time::timeout(WRITE_TIMEOUT, op.apply(client)).await {
            Ok(Ok(stored)) => {
                correlator.written(&key, &stored);
                return;
            }
            // The server refused the request: sending it again will not help.
            Ok(Err(kube::Error::Api(s))) => {
                if s.is_already_exists() {
                    tracing::debug!("{}: {}", op.describe(), s.message);
                } else {
                    tracing::warn!("{}: {} ({})", op.describe(), s.message, s.code);
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer in {WRITE_TIMEOUT:?}"),
        };
        if attempt == MAX_TRIES || rx.is_closed() {
            tracing::warn!("{}: {why}; giving up after {attempt} tries", op.describe());
            return;
        }
        tracing::debug!("{}: {why}; trying again in {backoff:?}", op.describe());
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_sends_count_last_timestamp_and_message_and_starts_over_when_gone() {
        let now = Timestamp::from_second(1_700_000_000).expect("a valid timestamp");
        let mut event = Event {
            count: Some(4),
            first_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
            ..Default::default()
        };
        event.metadata.resource_version = Some("9".into());
        let decision = Decision::Patch {
            key: "k".into(),
            name: "web.1".into(),
            namespace: "shop".into(),
            count: 4,
            last_timestamp: now,
            message: "m".into(),
            event,
        };
        let Some((key, Op::Patch { patch, again, .. })) = op_for(decision) else {
            panic!("a patch")
        };
        assert_eq!(key, "k");
        assert_eq!(
            patch,
            json!({"count": 4, "lastTimestamp": "2023-11-14T22:13:20Z", "message": "m"})
        );
        assert_eq!(again.count, Some(1));
        assert_eq!(again.first_timestamp, Some(Time(now)));
        assert_eq!(again.metadata.resource_version, None);
        assert!(op_for(Decision::Drop).is_none());
    }
}
