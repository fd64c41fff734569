//! The pod events the kubelet's syncs record ([`PodEvents`]), through the event recorder's
//! queue: never awaited, correlated and rate-limited by the recorder.

use k8s_openapi::api::core::v1::Pod;

pub use crate::api::events::{EventRecorder, EventType};
use crate::api::events::{container_ref, pod_ref};
use crate::pod::sync::PodEvents;

/// Pod events into an [`EventRecorder`].
pub struct KubeletEvents {
    recorder: EventRecorder,
}

impl KubeletEvents {
    pub fn new(recorder: EventRecorder) -> Self {
        KubeletEvents { recorder }
    }
}

impl PodEvents for KubeletEvents {
    fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: EventType,
        reason: &str,
        message: String,
    ) {
        let object = match container {
            Some(c) => container_ref(pod, c),
            None => pod_ref(pod),
        };
        self.recorder.event(&object, kind, reason, message);
    }
}
