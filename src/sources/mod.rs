//! Where the kubelet learns which pods it should run. Each source (the static pod directory,
//! the static pod URL, later the API server) produces complete snapshots of its pods
//! ([`PodOp::Set`]); the [`merge::Merger`] keeps the current set per source and turns each
//! snapshot into the incremental vocabulary of the upstream kubelet's `config.PodUpdate`:
//! [`PodOp::Add`], [`PodOp::Update`], [`PodOp::Delete`], [`PodOp::Remove`] and
//! [`PodOp::Reconcile`]. Static pods are decoded, checked and defaulted in [`pod`].

pub mod api;
mod error;
pub mod file;
pub mod http;
pub mod merge;
pub mod pod;

use k8s_openapi::api::core::v1::Pod;

pub use error::Error;

/// The source name of pods read from the static pod directory.
pub const FILE_SOURCE: &str = "file";
/// The source name of pods read from the static pod URL.
pub const HTTP_SOURCE: &str = "http";
pub use crate::model::{API_SOURCE, CONFIG_SOURCE_ANNOTATION, annotation, pod_full_name, pod_uid};
/// Annotation holding a static pod's hash (its UID).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation holding when the kubelet first saw the pod (RFC 3339).
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";

/// What a [`PodUpdate`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodOp {
    /// The complete set of the source's pods (what sources send; the merger consumes it).
    Set,
    /// Pods new to the kubelet.
    Add,
    /// Pods whose desired state changed.
    Update,
    /// Pods being deleted gracefully (a deletion timestamp appeared).
    Delete,
    /// Pods gone from their source: stop and forget them.
    Remove,
    /// Pods whose status alone changed: reconcile, nothing to restart.
    Reconcile,
}

/// A batch of pods with one meaning, from one source.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUpdate {
    pub op: PodOp,
    pub pods: Vec<Pod>,
    pub source: &'static str,
}
