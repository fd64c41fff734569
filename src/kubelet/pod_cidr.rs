//! The Node's pod CIDRs handed to the runtime (upstream's `updatePodCIDR`): whenever the
//! registered Node's `spec.podCIDRs` (or `spec.podCIDR`) differ from what the runtime was last
//! given, `UpdateRuntimeConfig` with them, comma-separated. A failed call is tried again with
//! the next Node the status manager reads.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use runtime::{RuntimeService, cri};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the runtime may take to take a new pod CIDR.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The pod CIDRs of `node`, comma-separated (empty before the cluster gave it any).
pub fn pod_cidrs(node: &Node) -> String {
    let Some(spec) = node.spec.as_ref() else {
        return String::new();
    };
    match spec.pod_cidrs.as_deref().filter(|c| !c.is_empty()) {
        Some(list) => list.join(","),
        None => spec.pod_cidr.clone().unwrap_or_default(),
    }
}

/// Follows `nodes` until `cancel`, handing each new set of pod CIDRs to `rt`.
pub async fn follow(
    rt: Arc<dyn RuntimeService>,
    mut nodes: watch::Receiver<Option<Node>>,
    cancel: CancellationToken,
) {
    let mut given = String::new();
    loop {
        let cidrs = nodes
            .borrow_and_update()
            .as_ref()
            .map(pod_cidrs)
            .unwrap_or_default();
        if !cidrs.is_empty() && cidrs != given {
            let req = cri::UpdateRuntimeConfigRequest {
                runtime_config: Some(cri::RuntimeConfig {
                    network_config: Some(cri::NetworkConfig {
                        pod_cidr: cidrs.clone(),
                    }),
                }),
            };
            match tokio::time::timeout(CALL_TIMEOUT, rt.update_runtime_config(req)).await {
                Ok(Ok(_)) => {
                    tracing::info!(pod_cidr = %cidrs, "the node's pod CIDR handed to the runtime");
                    given = cidrs;
                }
                Ok(Err(e)) => {
                    tracing::warn!(pod_cidr = %cidrs, "updating the runtime's pod CIDR: {e}")
                }
                Err(_) => {
                    tracing::warn!(pod_cidr = %cidrs, "updating the runtime's pod CIDR: timed out")
                }
            }
        }
        tokio::select! {
            changed = nodes.changed() => if changed.is_err() { return },
            () = cancel.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cidrs_prefer_the_list() {
        let node = |spec: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": spec}))
                .unwrap()
        };
        assert_eq!(pod_cidrs(&node(serde_json::json!({}))), "");
        assert_eq!(
            pod_cidrs(&node(serde_json::json!({"podCIDR": "10.1.0.0/24"}))),
            "10.1.0.0/24"
        );
        assert_eq!(
            pod_cidrs(&node(serde_json::json!({"podCIDR": "10.1.0.0/24",
                "podCIDRs": ["10.1.0.0/24", "fd00:1::/64"]}))),
            "10.1.0.0/24,fd00:1::/64"
        );
    }
}
