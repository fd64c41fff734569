//! In-place pod resize (upstream's allocation manager and `handlePodResourcesResize`).
//!
//! A pod's containers run with its *allocated* resources: its spec's when it was admitted,
//! then the spec's again each time a resize (the API server's `pods/resize`) is accepted. A
//! resize is accepted when the pod, with the new resources, fits the node next to the other
//! pods' allocations; else it is pending: `Infeasible` when it would not fit an empty node,
//! `Deferred` when other pods are in the way (tried again when a pod leaves). Syncs see the
//! pod with its allocated resources ([`Allocations::allocated_pod`]), so the pod cgroup and
//! new containers follow them; running containers are brought to them by
//! `UpdateContainerResources`, or restarted when their `resizePolicy` says
//! `RestartContainer` for a resource that changed. What each container last got is its
//! *actuated* resources. Both are kept in `<root>/pod-resources.json`, so an agent restarted
//! mid-resize neither forgets an accepted resize nor applies one twice.
//!
//! The pod's status shows it as upstream: each container's `allocatedResources` (the allocated
//! requests) and `resources` (what it runs with), and the `PodResizePending` and
//! `PodResizeInProgress` conditions.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodCondition, PodStatus};
use serde::{Deserialize, Serialize};

use crate::admission;
use crate::pod::actions::ResizeNeed as Need;
use crate::util::lock;

/// Condition types and reasons, as upstream.
pub const RESIZE_PENDING: &str = "PodResizePending";
pub const RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
pub const INFEASIBLE: &str = "Infeasible";
pub const DEFERRED: &str = "Deferred";

/// A resize that could not be accepted yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// [`INFEASIBLE`] or [`DEFERRED`].
    pub reason: &'static str,
    pub message: String,
}

/// What [`Allocations::resize`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resize {
    /// The spec asks for what is allocated.
    Unchanged,
    /// The spec's resources are now allocated.
    Accepted,
    Pending(Pending),
}

type ByContainer = BTreeMap<String, ResourceRequirements>;

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Pod UID → container name → allocated resources.
    allocated: BTreeMap<String, ByContainer>,
    /// Pod UID → container name → the resources the container was last given.
    actuated: BTreeMap<String, ByContainer>,
}

/// The pods' allocated and actuated resources, and their pending resizes.
pub struct Allocations {
    path: Option<PathBuf>,
    state: Mutex<State>,
    pending: Mutex<HashMap<String, Pending>>,
    /// Pod UID → why the runtime refused its last resize.
    errors: Mutex<HashMap<String, String>>,
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The containers a resize may touch: the app containers and the init containers (of which
/// the API server lets only sidecars change).
fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(crate::pod::spec::all_containers)
}

fn containers_mut(pod: &mut Pod) -> impl Iterator<Item = &mut Container> {
    pod.spec.iter_mut().flat_map(|s| {
        s.init_containers
            .iter_mut()
            .flatten()
            .chain(s.containers.iter_mut())
    })
}

fn resources_of(pod: &Pod) -> ByContainer {
    containers(pod)
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// One resource's request or limit, as a number (`100m` and `0.1` are the same CPU).
fn amount(r: &ResourceRequirements, limit: bool, name: &str) -> Option<i64> {
    let list = if limit { &r.limits } else { &r.requests };
    list.as_ref()?
        .get(name)
        .map(|q| admission::parse_quantity(name, q))
}

/// Whether `name`'s request or limit differs between `a` and `b`.
fn differs(a: &ResourceRequirements, b: &ResourceRequirements, name: &str) -> bool {
    amount(a, false, name) != amount(b, false, name)
        || amount(a, true, name) != amount(b, true, name)
}

fn same(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    !differs(a, b, "cpu") && !differs(a, b, "memory")
}

fn same_all(a: &ByContainer, b: &ByContainer) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(name, r)| b.get(name).is_some_and(|o| same(r, o)))
}

/// Whether `c`'s `resizePolicy` restarts it for a change of `resource` (the default is
/// `NotRequired`).
fn restarts_for(c: &Container, resource: &str) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

impl Allocations {
    /// The allocations kept in `path` (none kept when `None`). A file that cannot be read is
    /// set aside (`.corrupt`) with an error: every running pod then counts as allocated what
    /// its spec asks.
    pub fn open(path: Option<PathBuf>) -> Allocations {
        let state = path
            .as_ref()
            .and_then(|p| match std::fs::read(p) {
                Ok(bytes) => match serde_json::from_slice(&bytes) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        let aside = p.with_extension("json.corrupt");
                        tracing::error!(
                            file = %p.display(),
                            "the pods' resource allocations cannot be read ({e}); set aside as {}",
                            aside.display()
                        );
                        let _ = std::fs::rename(p, &aside);
                        None
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::error!(file = %p.display(), "reading the pods' resource allocations: {e}");
                    None
                }
            })
            .unwrap_or_default();
        Allocations {
            path,
            state: Mutex::new(state),
            pending: Mutex::new(HashMap::new()),
            errors: Mutex::new(HashMap::new()),
        }
    }

    fn save(&self, state: &State) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(state)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::error!(file = %path.display(), "saving the pods' resource allocations: {e}");
        }
    }

    /// Allocates `pod` what its spec asks, unless something is allocated to it already (an
    /// admitted pod, or one seen before the agent restarted).
    pub fn admit(&self, pod: &Pod) {
        let mut state = lock(&self.state);
        if uid(pod).is_empty() || state.allocated.contains_key(uid(pod)) {
            return;
        }
        state
            .allocated
            .insert(uid(pod).to_string(), resources_of(pod));
        self.save(&state);
    }

    /// `pod` with its containers' resources replaced by their allocation (first allocating it
    /// its spec's, see [`Allocations::admit`]).
    pub fn allocated_pod(&self, pod: &Pod) -> Pod {
        self.admit(pod);
        self.view(pod)
    }

    /// `pod` with the resources allocated to it, recording nothing (a pod with no allocation
    /// yet is as its spec says).
    pub fn view(&self, pod: &Pod) -> Pod {
        let state = lock(&self.state);
        let mut out = pod.clone();
        if let Some(alloc) = state.allocated.get(uid(pod)) {
            for c in containers_mut(&mut out) {
                if let Some(r) = alloc.get(&c.name) {
                    c.resources = Some(r.clone()).filter(|r| *r != ResourceRequirements::default());
                }
            }
        }
        out
    }

    /// Decides a resize of `pod` (its spec as the API server has it) on `node`, where `others`
    /// (already as [`Allocations::view`] shows them) run: the new resources are allocated when
    /// they fit, else the resize is pending with upstream's reason and message.
    pub fn resize(&self, pod: &Pod, node: &Node, others: impl FnOnce() -> Vec<Pod>) -> Resize {
        let id = uid(pod).to_string();
        let wanted = resources_of(pod);
        let unchanged = lock(&self.state)
            .allocated
            .get(&id)
            .map(|allocated| same_all(allocated, &wanted));
        match unchanged {
            None => {
                self.admit(pod);
                return Resize::Unchanged;
            }
            Some(true) => {
                lock(&self.pending).remove(&id);
                return Resize::Unchanged;
            }
            Some(false) => {}
        }
        if let Some(pending) = infeasible(pod, node) {
            lock(&self.pending).insert(id, pending.clone());
            return Resize::Pending(pending);
        }
        // (`others` reads the allocations: no lock is held.)
        let others: Vec<Pod> = others().into_iter().filter(|o| uid(o) != id).collect();
        if let Err(why) = admission::fits(pod, &others, node) {
            let pending = Pending {
                reason: DEFERRED,
                message: why.message,
            };
            lock(&self.pending).insert(id, pending.clone());
            return Resize::Pending(pending);
        }
        let mut state = lock(&self.state);
        state.allocated.insert(id.clone(), wanted);
        self.save(&state);
        lock(&self.pending).remove(&id);
        tracing::info!(pod_uid = %id, "pod resize accepted");
        Resize::Accepted
    }

    /// The pods whose resize is pending.
    pub fn pending_uids(&self) -> Vec<String> {
        lock(&self.pending).keys().cloned().collect()
    }

    pub fn pending(&self, uid: &str) -> Option<Pending> {
        lock(&self.pending).get(uid).cloned()
    }

    /// Records why the runtime refused the pod's last resize (`errors`: container name and
    /// error), or that it refused nothing.
    pub fn set_errors(&self, uid: &str, errors: &[(String, String)]) {
        let mut all = lock(&self.errors);
        match errors.first() {
            None => {
                all.remove(uid);
            }
            Some((name, e)) => {
                all.insert(uid.to_string(), format!("resizing container {name}: {e}"));
            }
        }
    }

    /// Records that the container `name` of the pod `uid` now runs with `resources`.
    pub fn set_actuated(&self, uid: &str, name: &str, resources: Option<&ResourceRequirements>) {
        let r = resources.cloned().unwrap_or_default();
        let mut state = lock(&self.state);
        let by = state.actuated.entry(uid.to_string()).or_default();
        if by.get(name) == Some(&r) {
            return;
        }
        by.insert(name.to_string(), r);
        self.save(&state);
    }

    /// What the container `c` of the allocated pod `uid` runs with: what it was last given,
    /// else (a container from before the agent kept records) its allocation.
    fn actuated(&self, uid: &str, c: &Container) -> ResourceRequirements {
        lock(&self.state)
            .actuated
            .get(uid)
            .and_then(|by| by.get(&c.name))
            .cloned()
            .unwrap_or_else(|| c.resources.clone().unwrap_or_default())
    }

    /// What each container of `pod` (as [`Allocations::allocated_pod`] gives it) needs to run
    /// with its allocation, by name; containers already there are left out.
    pub fn needs(&self, pod: &Pod) -> HashMap<String, Need> {
        let id = uid(pod);
        containers(pod)
            .filter_map(|c| {
                let want = c.resources.clone().unwrap_or_default();
                let have = self.actuated(id, c);
                let changed: Vec<&str> = ["cpu", "memory"]
                    .into_iter()
                    .filter(|r| differs(&want, &have, r))
                    .collect();
                if changed.is_empty() {
                    return None;
                }
                let need = if changed.iter().any(|r| restarts_for(c, r)) {
                    Need::Restart
                } else {
                    Need::Update
                };
                Some((c.name.clone(), need))
            })
            .collect()
    }

    /// Adds what a resize shows to `status` (of the allocated pod `pod`): each container's
    /// `allocatedResources` and, while it runs, `resources`; the resize conditions.
    pub fn decorate(
        &self,
        pod: &Pod,
        status: &mut PodStatus,
        now: std::time::SystemTime,
        previous: Option<&PodStatus>,
    ) {
        let id = uid(pod);
        let by_name: HashMap<&str, &Container> =
            containers(pod).map(|c| (c.name.as_str(), c)).collect();
        let mut in_progress = false;
        let needs = self.needs(pod);
        for cs in [
            status.init_container_statuses.as_mut(),
            status.container_statuses.as_mut(),
        ]
        .into_iter()
        .flatten()
        .flatten()
        {
            let Some(c) = by_name.get(cs.name.as_str()) else {
                continue;
            };
            let requests = c.resources.as_ref().and_then(|r| r.requests.clone());
            cs.allocated_resources = requests.filter(|r| !r.is_empty());
            let running = cs.state.as_ref().is_some_and(|s| s.running.is_some());
            if running {
                let have = self.actuated(id, c);
                cs.resources = Some(have).filter(|r| *r != ResourceRequirements::default());
                in_progress |= needs.contains_key(&cs.name);
            }
        }
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != RESIZE_PENDING && c.type_ != RESIZE_IN_PROGRESS);
        let since = |type_: &str| {
            previous
                .and_then(|p| p.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
                .and_then(|c| c.last_transition_time.clone())
                .or_else(|| crate::pod::status::time_of(now))
        };
        if let Some(p) = self.pending(id) {
            conditions.push(PodCondition {
                type_: RESIZE_PENDING.into(),
                status: "True".into(),
                reason: Some(p.reason.into()),
                message: Some(p.message),
                last_transition_time: since(RESIZE_PENDING),
                ..Default::default()
            });
        }
        if in_progress {
            let error = lock(&self.errors).get(id).cloned();
            conditions.push(PodCondition {
                type_: RESIZE_IN_PROGRESS.into(),
                status: "True".into(),
                reason: error.as_ref().map(|_| "Error".to_string()),
                message: error,
                last_transition_time: since(RESIZE_IN_PROGRESS),
                ..Default::default()
            });
        }
    }

    /// Forgets a pod that is gone.
    pub fn forget(&self, uid: &str) {
        lock(&self.pending).remove(uid);
        lock(&self.errors).remove(uid);
        let mut state = lock(&self.state);
        let had = state.allocated.remove(uid).is_some() | state.actuated.remove(uid).is_some();
        if had {
            self.save(&state);
        }
    }
}

impl Allocations {
    /// Forgets every pod `keep` does not name: pods deleted while the agent was down, whose
    /// records would otherwise stay in the file for ever (upstream's `RemoveOrphanedPods`).
    pub fn forget_others(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.pending).retain(|uid, _| keep(uid));
        lock(&self.errors).retain(|uid, _| keep(uid));
        let mut state = lock(&self.state);
        let before = state.allocated.len() + state.actuated.len();
        state.allocated.retain(|uid, _| keep(uid));
        state.actuated.retain(|uid, _| keep(uid));
        if state.allocated.len() + state.actuated.len() != before {
            tracing::info!(
                pods = before - state.allocated.len() - state.actuated.len(),
                "forgot the allocations of pods gone while the agent was down"
            );
            self.save(&state);
        }
    }
}

/// A resize that would not fit the node even were it empty (upstream's message).
fn infeasible(pod: &Pod, node: &Node) -> Option<Pending> {
    let want = admission::pod_requests(pod);
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for name in ["cpu", "memory"] {
        let cap = allocatable
            .and_then(|a| a.get(name))
            .map_or(0, |q| admission::parse_quantity(name, q));
        let req = want.get(name);
        if req > cap {
            return Some(Pending {
                reason: INFEASIBLE,
                message: format!(
                    "Node didn't have enough capacity: {name}, requested: {req}, capacity: {cap}"
                ),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests;
