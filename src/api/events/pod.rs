//! Where the pod path reports what it does to a pod (upstream's pod events: Pulling, Created,
//! Started, Killing, BackOff, ...): [`PodEvents`], which the [`EventRecorder`] implements for
//! the API server and tests implement to collect them.

use k8s_openapi::api::core::v1::Pod;

use super::{EventRecorder, EventType, Reason, container_ref, pod_ref};

/// A sink for events about pods and their containers.
pub trait PodEvents: Send + Sync {
    /// An event about `pod`, or one of its containers when `container` names it.
    fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: EventType,
        reason: Reason,
        message: String,
    );
}

/// A [`PodEvents`] that drops everything.
pub struct NoEvents;

impl PodEvents for NoEvents {
    fn event(&self, _: &Pod, _: Option<&str>, _: EventType, _: Reason, _: String) {}
}

/// Pod events through the recorder's queue: never awaited, correlated and rate-limited.
impl PodEvents for EventRecorder {
    fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: EventType,
        reason: Reason,
        message: String,
    ) {
        let object = match container {
            Some(c) => container_ref(pod, c),
            None => pod_ref(pod),
        };
        EventRecorder::event(self, &object, kind, reason, message);
    }
}

/// One recorded event: the container it is about, its type, reason and message.
#[cfg(test)]
pub type RecordedEvent = (Option<String>, EventType, Reason, String);

/// Events kept in memory, for tests.
#[cfg(test)]
#[derive(Default)]
pub struct Recorded(std::sync::Mutex<Vec<RecordedEvent>>);

#[cfg(test)]
impl Recorded {
    /// Every event so far, in order.
    pub fn all(&self) -> Vec<RecordedEvent> {
        crate::util::lock(&self.0).clone()
    }

    /// `(reason, message)` of every event so far.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.all()
            .into_iter()
            .map(|(_, _, r, m)| (r.as_str().to_string(), m))
            .collect()
    }

    /// `reason: message` of every event so far.
    pub fn lines(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .map(|(_, _, r, m)| format!("{r}: {m}"))
            .collect()
    }
}

#[cfg(test)]
impl PodEvents for Recorded {
    fn event(&self, _: &Pod, c: Option<&str>, kind: EventType, reason: Reason, message: String) {
        let event = (c.map(str::to_string), kind, reason, message);
        crate::util::lock(&self.0).push(event);
    }
}
