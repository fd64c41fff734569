//! Merging the sources' snapshots into one incremental stream, like the upstream kubelet's
//! `podStorage.merge` (pkg/kubelet/config/config.go): per source, the current pods by UID; a
//! [`PodOp::Set`] snapshot (or an incremental Add/Update/Delete/Remove/Reconcile) becomes the
//! changes it implies. A pod is *updated* when anything but its status and its
//! `kubernetes.io/config.seen` annotation changed (a graceful deletion, a new
//! `deletionTimestamp`, is a `Delete`), *reconciled* when its status alone changed. A pod
//! added without a first-seen time gets one (now), as upstream's merger records it; it is kept
//! across updates.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use super::{CONFIG_SEEN_ANNOTATION, PodOp, PodUpdate, pod_full_name, pod_uid};

/// The current pods of every source, and the differ between snapshots.
#[derive(Debug, Default)]
pub struct Merger {
    sources: HashMap<&'static str, BTreeMap<String, Pod>>,
}

impl Merger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update from a source and returns what changed, in the upstream order:
    /// Remove, Add, Update, Delete, Reconcile; empty batches are left out. Pods without a
    /// UID, and second pods with an already seen UID, are dropped with a warning.
    pub fn merge(&mut self, update: PodUpdate) -> Vec<PodUpdate> {
        let source = update.source;
        let current = self.sources.entry(source).or_default();
        let mut changes: BTreeMap<Op, Vec<Pod>> = BTreeMap::new();
        match update.op {
            PodOp::Remove => {
                for pod in &update.pods {
                    if let Some(old) = current.remove(pod_uid(pod)) {
                        changes.entry(Op::Remove).or_default().push(old);
                    }
                }
            }
            op => {
                let mut seen = std::collections::HashSet::new();
                for pod in update.pods {
                    let uid = pod_uid(&pod).to_string();
                    if uid.is_empty() || !seen.insert(uid.clone()) {
                        tracing::warn!(source, pod = %pod_full_name(&pod), uid = %uid,
                            "pod without a UID or with a duplicate UID ignored");
                        continue;
                    }
                    if let Some((op, pod)) = upsert(current, uid, pod) {
                        changes.entry(op).or_default().push(pod);
                    }
                }
                if op == PodOp::Set {
                    let gone: Vec<String> = current
                        .keys()
                        .filter(|uid| !seen.contains(uid.as_str()))
                        .cloned()
                        .collect();
                    for uid in gone {
                        if let Some(old) = current.remove(&uid) {
                            changes.entry(Op::Remove).or_default().push(old);
                        }
                    }
                }
            }
        }
        changes
            .into_iter()
            .map(|(op, pods)| PodUpdate {
                op: op.into(),
                pods,
                source,
            })
            .collect()
    }

    /// Every current pod of every source (sources in name order, pods in UID order).
    pub fn pods(&self) -> Vec<Pod> {
        let mut names: Vec<&&str> = self.sources.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|s| self.sources.get(*s))
            .flat_map(|pods| pods.values().cloned())
            .collect()
    }

    /// The current pod with this UID, from whichever source has it.
    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.sources.values().find_map(|pods| pods.get(uid))
    }

    /// The current pods of one source.
    pub fn source_pods(&self, source: &str) -> Vec<Pod> {
        self.sources
            .get(source)
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `source` has sent at least one update (upstream's "sources ready").
    pub fn seen_source(&self, source: &str) -> bool {
        self.sources.contains_key(source)
    }
}

/// The merger's output kinds, ordered as they are emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Remove,
    Add,
    Update,
    Delete,
    Reconcile,
}

impl From<Op> for PodOp {
    fn from(op: Op) -> PodOp {
        match op {
            Op::Remove => PodOp::Remove,
            Op::Add => PodOp::Add,
            Op::Update => PodOp::Update,
            Op::Delete => PodOp::Delete,
            Op::Reconcile => PodOp::Reconcile,
        }
    }
}

/// Stores `pod` under `uid` and says what that changed, if anything.
fn upsert(current: &mut BTreeMap<String, Pod>, uid: String, mut pod: Pod) -> Option<(Op, Pod)> {
    let Some(old) = current.get(&uid) else {
        // First seen now, unless the source knew earlier (static pods carry it).
        if seen_annotation(&pod).is_none() {
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
            pod.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIG_SEEN_ANNOTATION.to_string(), now);
        }
        current.insert(uid, pod.clone());
        return Some((Op::Add, pod));
    };
    // Keep the first-seen time.
    if let Some(seen) = seen_annotation(old) {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONFIG_SEEN_ANNOTATION.to_string(), seen);
    }
    let op = if !same_desired_state(old, &pod) {
        if pod.metadata.deletion_timestamp.is_some() && old.metadata.deletion_timestamp.is_none() {
            Op::Delete
        } else {
            Op::Update
        }
    } else if old.status != pod.status {
        Op::Reconcile
    } else {
        return None;
    };
    current.insert(uid, pod.clone());
    Some((op, pod))
}

fn seen_annotation(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SEEN_ANNOTATION))
        .cloned()
}

/// Equal but for the status, the first-seen annotation and the bookkeeping the API server
/// changes on every write (resourceVersion, managedFields).
fn same_desired_state(a: &Pod, b: &Pod) -> bool {
    comparable(a) == comparable(b)
}

fn comparable(pod: &Pod) -> Pod {
    let mut p = pod.clone();
    p.status = None;
    p.metadata.resource_version = None;
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove(CONFIG_SEEN_ANNOTATION);
        if a.is_empty() {
            p.metadata.annotations = None;
        }
    }
    p
}

#[cfg(test)]
mod tests;
