//! The node Lease `kube-node-lease/<node>` (coordination.k8s.io/v1), the kubelet's cheap
//! heartbeat, renewed every quarter of its duration like upstream's `nodelease` controller.
//!
//! A renewal updates the Lease last written (up to five tries); when that fails it falls back
//! to getting (or creating) the Lease, retried with back-off from 200ms doubling to 7s until the
//! API server answers, and updates from there. A conflict re-reads the Lease. The Lease is
//! owned by the Node (an ownerReference with the Node's UID) once the Node is known, so it
//! goes when the Node is deleted.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use super::within;
use crate::api::FIELD_MANAGER;
use crate::config::KubeletConfig;

/// The namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Updates tried per renewal before falling back to get-or-create (upstream's
/// `maxUpdateRetries`).
pub const UPDATE_RETRIES: usize = 5;
const ENSURE_BACKOFF_START: Duration = Duration::from_millis(200);
const ENSURE_BACKOFF_MAX: Duration = Duration::from_secs(7);

/// The Lease to write at `now`: `base` (the Lease as last read, keeping its resourceVersion and
/// other fields) with the holder, duration and renew time set, and an ownerReference to
/// `node` when the Lease has none and the Node's UID is known.
pub fn build_lease(
    base: Option<&Lease>,
    node_name: &str,
    duration_seconds: i32,
    node: Option<&Node>,
    now: Timestamp,
) -> Lease {
    let mut lease = base.cloned().unwrap_or_default();
    lease.metadata.name = Some(node_name.to_string());
    lease.metadata.namespace = Some(NODE_LEASE_NAMESPACE.to_string());
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node_name.to_string());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(MicroTime(now));
    let has_owner = lease
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty());
    if !has_owner && let Some(owner) = node.and_then(node_owner) {
        lease.metadata.owner_references = Some(vec![owner]);
    }
    lease
}

/// How often a Lease of `duration_seconds` is renewed: a quarter of its duration (10s for
/// the default 40s), as upstream's `renewIntervalFraction` of 0.25.
pub fn renew_interval(duration_seconds: u32) -> Duration {
    Duration::from_millis(u64::from(duration_seconds) * 250)
}

fn node_owner(node: &Node) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.metadata.name.clone()?,
        uid: node.metadata.uid.clone().filter(|u| !u.is_empty())?,
        ..Default::default()
    })
}

/// Keeps the node's Lease renewed (see the module documentation).
pub struct LeaseController {
    api: Api<Lease>,
    node_name: String,
    duration_seconds: i32,
    node: watch::Receiver<Option<Node>>,
    timeout: Duration,
}

impl LeaseController {
    /// The controller for `cfg.node_name`'s Lease; `node` gives the registered Node (for the
    /// ownerReference), e.g. [`super::NodeStatusManager::subscribe`].
    pub fn new(
        client: kube::Client,
        cfg: &KubeletConfig,
        node: watch::Receiver<Option<Node>>,
    ) -> Self {
        LeaseController {
            api: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            node_name: cfg.node_name.clone(),
            duration_seconds: i32::try_from(cfg.node_lease_duration_seconds).unwrap_or(i32::MAX),
            node,
            timeout: super::heartbeat_timeout(cfg),
        }
    }

    /// How often the Lease is renewed: see [`renew_interval`].
    pub fn renew_interval(&self) -> Duration {
        renew_interval(self.duration_seconds.unsigned_abs())
    }

    /// Renews the Lease every [`Self::renew_interval`] until `shutdown`.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut latest = None;
        loop {
            tokio::select! {
                _ = shutdown.as_mut() => return,
                _ = self.sync(&mut latest) => {}
            }
            tokio::select! {
                _ = shutdown.as_mut() => return,
                _ = tokio::time::sleep(self.renew_interval()) => {}
            }
        }
    }

    /// One renewal. `latest` is the Lease as last written (`None`: read it first); on return it
    /// holds the Lease to renew next time. Only returns once the Lease was written, or after
    /// [`UPDATE_RETRIES`] failed updates of a Lease the API server gave.
    pub async fn sync(&self, latest: &mut Option<Lease>) {
        if let Some(base) = latest.take() {
            match self.retry_update(base).await {
                Ok(lease) => {
                    *latest = Some(lease);
                    return;
                }
                Err(e) => tracing::warn!(
                    node = %self.node_name,
                    "updating the node lease failed, getting it again: {e}"
                ),
            }
        }
        let (lease, created) = self.ensure_with_backoff().await;
        if created {
            *latest = Some(lease);
            return;
        }
        match self.retry_update(lease).await {
            Ok(lease) => *latest = Some(lease),
            Err(e) => tracing::warn!(node = %self.node_name, "updating the node lease: {e}"),
        }
    }

    fn lease_from(&self, base: Option<&Lease>) -> Lease {
        let node = self.node.borrow().clone();
        build_lease(
            base,
            &self.node_name,
            self.duration_seconds,
            node.as_ref(),
            Timestamp::now(),
        )
    }

    fn post_params() -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        }
    }

    /// Updates `base`, up to [`UPDATE_RETRIES`] times; a conflict re-reads the Lease first.
    async fn retry_update(&self, mut base: Lease) -> Result<Lease, kube::Error> {
        let mut last_err = None;
        for _ in 0..UPDATE_RETRIES {
            let lease = self.lease_from(Some(&base));
            let pp = Self::post_params();
            match within(self.timeout, self.api.replace(&self.node_name, &pp, &lease)).await {
                Ok(written) => return Ok(written),
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    let (fresh, created) = self.ensure_with_backoff().await;
                    if created {
                        return Ok(fresh);
                    }
                    base = fresh;
                    last_err = Some(kube::Error::Api(s));
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            kube::Error::Service(format!("{UPDATE_RETRIES} lease updates failed").into())
        }))
    }

    /// Gets the Lease, or creates it when there is none, retrying until it works. Returns the
    /// Lease and whether it was just created (and so already renewed).
    async fn ensure_with_backoff(&self) -> (Lease, bool) {
        let mut delay = ENSURE_BACKOFF_START;
        loop {
            match self.ensure().await {
                Ok(found) => return found,
                Err(e) => tracing::warn!(
                    node = %self.node_name,
                    "getting or creating the node lease, retrying in {delay:?}: {e}"
                ),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(ENSURE_BACKOFF_MAX);
        }
    }

    async fn ensure(&self) -> Result<(Lease, bool), kube::Error> {
        match within(self.timeout, self.api.get(&self.node_name)).await {
            Ok(lease) => Ok((lease, false)),
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                let lease = self.lease_from(None);
                let pp = Self::post_params();
                let created = within(self.timeout, self.api.create(&pp, &lease)).await?;
                Ok((created, true))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
