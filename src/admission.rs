//! Pod admission: whether a pod may run on this node, following upstream's
//! `lifecycle/predicate.go` (which reuses the scheduler's `AdmissionCheck`). A pure function of
//! the pod, the pods already admitted and the Node; the kubelet rejects a pod that fails it
//! (phase Failed with the returned reason and message) instead of running it.
//!
//! Checks, in upstream's order, the first failure being reported: the pod's
//! `kubernetes.io/os` label and `spec.os` against the node's OS; then resources (pod count,
//! cpu, memory, ephemeral-storage, then huge pages and extended resources by name, against
//! allocatable minus the active pods' requests), required node affinity and
//! nodeSelector, `spec.nodeName`, host ports, and NoExecute taints (not for static pods).
//!
//! NOTE: upstream admits a critical pod that lacks resources when it can preempt other pods
//! (`CriticalPodAdmissionHandler`); nodelet has no preemption and rejects it like any pod.
//! Extended resources the node does not list are not checked (they may be cluster-level).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::sources::CONFIG_SOURCE_ANNOTATION;
use crate::util::quantity;

/// Why a pod was not admitted: `reason` is a CamelCase word (`OutOfcpu`, `NodeAffinity`),
/// `message` the human explanation; both go into the pod's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl Rejection {
    /// A failed predicate, in upstream's words: `Predicate NodeAffinity failed: node(s) didn't
    /// match Pod's node affinity/selector` (the scheduler plugin's reason after the name).
    fn predicate(name: &str) -> Rejection {
        let why = match name {
            "NodeAffinity" => "node(s) didn't match Pod's node affinity/selector",
            "NodeName" => "node(s) didn't match the requested node name",
            "NodePorts" => "node(s) didn't have free ports for the requested pod ports",
            _ => "node(s) had taints that the pod didn't tolerate",
        };
        Rejection {
            reason: name.to_string(),
            message: format!("Predicate {name} failed: {why}"),
        }
    }
}

/// Admits `pod` onto `node`, where the pods in `active` already run (a pod of `active` with
/// `pod`'s UID is `pod` itself and not counted).
pub fn admit(pod: &Pod, active: &[Pod], node: &Node) -> Result<(), Rejection> {
    let others: Vec<&Pod> = active
        .iter()
        .filter(|p| p.metadata.uid.is_none() || p.metadata.uid != pod.metadata.uid)
        .collect();
    let node_os = node_os(node);
    if pod_os_label_mismatch(pod, node_os) {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".to_string(),
            message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                .to_string(),
        });
    }
    let pod_os = pod
        .spec
        .as_ref()
        .and_then(|s| s.os.as_ref())
        .map(|os| os.name.as_str());
    if pod_os.is_some_and(|os| os != node_os) {
        return Err(Rejection {
            reason: "PodOSNotSupported".to_string(),
            message: "Failed to admit pod as the OS field doesn't match node OS".to_string(),
        });
    }
    fits_resources(pod, &others, node)?;
    if !matches_node_affinity(pod, node) {
        return Err(Rejection::predicate("NodeAffinity"));
    }
    let wanted = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if wanted.is_some_and(|n| !n.is_empty() && Some(n) != node.metadata.name.as_deref()) {
        return Err(Rejection::predicate("NodeName"));
    }
    if host_ports_conflict(pod, &others) {
        return Err(Rejection::predicate("NodePorts"));
    }
    if !is_static(pod) && has_untolerated_no_execute_taint(pod, node) {
        return Err(Rejection::predicate("TaintToleration"));
    }
    Ok(())
}

/// The node's OS: its `kubernetes.io/os` label, else `linux`.
fn node_os(node: &Node) -> &str {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::node::LABEL_OS))
        .map_or("linux", String::as_str)
}

/// Upstream checks the pod's own `kubernetes.io/os` label (not its nodeSelector, which node
/// affinity covers) against the node's OS.
fn pod_os_label_mismatch(pod: &Pod, node_os: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::node::LABEL_OS))
        .is_some_and(|os| os != node_os)
}

fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != "api")
}

/// A pod's resource requests by resource name: cpu in millicores, everything else
/// (memory, ephemeral-storage, `hugepages-<size>`, extended resources) in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requests(pub BTreeMap<String, i64>);

impl Requests {
    /// The request for `resource` (0 when absent).
    pub fn get(&self, resource: &str) -> i64 {
        self.0.get(resource).copied().unwrap_or(0)
    }

    fn set(&mut self, resource: &str, v: i64) {
        self.0.insert(resource.to_string(), v);
    }

    fn add(mut self, o: &Requests) -> Requests {
        for (k, v) in &o.0 {
            let e = self.0.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
        self
    }

    fn max(mut self, o: &Requests) -> Requests {
        for (k, v) in &o.0 {
            let e = self.0.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        self
    }
}

/// The resources checked first, in upstream's order; the others follow by name.
const RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

pub(crate) fn parse_quantity(resource: &str, q: &Quantity) -> i64 {
    let v = if resource == "cpu" {
        quantity::parse_cpu_millis(&q.0)
    } else {
        quantity::parse_bytes(&q.0)
    };
    // The API server has validated quantities; an unparsable one counts as nothing.
    v.unwrap_or(0).max(0)
}

fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Requests {
    Requests(
        list.into_iter()
            .flatten()
            .map(|(k, q)| (k.clone(), parse_quantity(k, q)))
            .collect(),
    )
}

/// A container's requests; a resource with a limit and no request requests its limit, as
/// the API server's defaulting makes it.
fn container_requests(c: &Container) -> Requests {
    let res = c.resources.as_ref();
    let limits = from_list(res.and_then(|r| r.limits.as_ref()));
    let requests = from_list(res.and_then(|r| r.requests.as_ref()));
    let mut r = limits;
    r.0.extend(requests.0);
    r
}

/// An extended resource (`example.com/dongle`): a domain-qualified name outside
/// `kubernetes.io/`.
pub(crate) fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// The pod's effective requests as upstream's `PodRequests` computes them: the app
/// containers' sum plus restartable init containers (sidecars), or the largest init
/// container step (each with the sidecars started before it) when that is larger; pod-level
/// cpu/memory requests replace the containers'; then the pod overhead is added.
pub fn pod_requests(pod: &Pod) -> Requests {
    let Some(spec) = pod.spec.as_ref() else {
        return Requests::default();
    };
    let total = effective(spec, container_requests);
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    with_pod_level(total, pod_level).add(&from_list(spec.overhead.as_ref()))
}

/// The pod's effective limits as upstream's `PodLimits`: aggregated as [`pod_requests`]
/// aggregates requests, from the containers' limits only; pod-level cpu/memory limits
/// replace them, and the overhead is added to each resource that has a limit.
pub fn pod_limits(pod: &Pod) -> Requests {
    let Some(spec) = pod.spec.as_ref() else {
        return Requests::default();
    };
    let limits = |c: &Container| from_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()));
    let total = effective(spec, limits);
    let pod_level = spec.resources.as_ref().and_then(|r| r.limits.as_ref());
    let mut total = with_pod_level(total, pod_level);
    for (k, v) in from_list(spec.overhead.as_ref()).0 {
        if let Some(e) = total.0.get_mut(&k) {
            *e = e.saturating_add(v);
        }
    }
    total
}

/// The app containers' sum plus the sidecars, or the largest init container step (each with
/// the sidecars started before it) when that is larger, of what `of` gives per container.
fn effective(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    of: impl Fn(&Container) -> Requests,
) -> Requests {
    let mut total = spec
        .containers
        .iter()
        .map(&of)
        .fold(Requests::default(), |a, b| a.add(&b));
    let mut sidecars = Requests::default();
    let mut init_max = Requests::default();
    for c in spec.init_containers.iter().flatten() {
        let reqs = of(c);
        let step = if c.restart_policy.as_deref() == Some("Always") {
            total = total.add(&reqs);
            sidecars = sidecars.add(&reqs);
            sidecars.clone()
        } else {
            reqs.add(&sidecars)
        };
        init_max = init_max.max(&step);
    }
    total.max(&init_max)
}

/// `total` with the pod-level cpu and memory (`spec.resources`) in place of the containers'.
fn with_pod_level(mut total: Requests, pod_level: Option<&BTreeMap<String, Quantity>>) -> Requests {
    if let Some(pod_level) = pod_level {
        for name in ["cpu", "memory"] {
            if let Some(q) = pod_level.get(name) {
                total.set(name, parse_quantity(name, q));
            }
        }
    }
    total
}

/// Whether `pod`'s requests fit `node` next to `others` (and the node's pod count).
pub fn fits(pod: &Pod, others: &[Pod], node: &Node) -> Result<(), Rejection> {
    let others: Vec<&Pod> = others.iter().collect();
    fits_resources(pod, &others, node)
}

fn fits_resources(pod: &Pod, others: &[&Pod], node: &Node) -> Result<(), Rejection> {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let allocated = |name: &str| {
        allocatable
            .and_then(|a| a.get(name))
            .map_or(0, |q| parse_quantity(name, q))
    };
    let insufficient = |name: &str, requested: i64, used: i64, capacity: i64| Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    let max_pods = allocated("pods");
    let used_pods = i64::try_from(others.len()).unwrap_or(i64::MAX);
    if used_pods + 1 > max_pods {
        return Err(insufficient("pods", 1, used_pods, max_pods));
    }
    let want = pod_requests(pod);
    let used = others
        .iter()
        .map(|p| pod_requests(p))
        .fold(Requests::default(), |a, b| a.add(&b));
    // Extended resources the node does not know are not checked: they may be cluster-level
    // (upstream's removeMissingExtendedResources). Huge pages the node lacks have capacity 0.
    let others_names = want.0.keys().filter(|k| {
        !RESOURCES.contains(&k.as_str())
            && k.as_str() != "pods"
            && !(is_extended(k) && allocatable.is_none_or(|a| !a.contains_key(*k)))
    });
    for name in RESOURCES
        .into_iter()
        .chain(others_names.map(String::as_str))
    {
        let (req, cap, u) = (want.get(name), allocated(name), used.get(name));
        if req > 0 && req > cap - u {
            return Err(insufficient(name, req, u, cap));
        }
    }
    Ok(())
}

/// Whether the node satisfies the pod's nodeSelector and required node affinity.
pub fn matches_node_affinity(pod: &Pod, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    if let Some(selector) = &spec.node_selector
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, node.metadata.name.as_deref().unwrap_or(""))),
    }
}

/// A term matches when all its expressions and fields do; an empty term matches nothing.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // Only metadata.name is a node field selectors may use, with In or NotIn.
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, Some(name))
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let ([bound], Some(v)) = (values, value) else {
                return false;
            };
            let (Ok(bound), Ok(v)) = (bound.parse::<i64>(), v.parse::<i64>()) else {
                return false;
            };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// `(protocol, host IP, host port)` of every container port with a host port.
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|hp| *hp > 0)?;
            let ip = p.host_ip.clone().filter(|ip| !ip.is_empty());
            Some((
                p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                ip.unwrap_or_else(|| "0.0.0.0".to_string()),
                port,
            ))
        })
        .collect()
}

fn host_ports_conflict(pod: &Pod, others: &[&Pod]) -> bool {
    let wanted = host_ports(pod);
    if wanted.is_empty() {
        return false;
    }
    let used: Vec<_> = others.iter().flat_map(|p| host_ports(p)).collect();
    wanted.iter().any(|(proto, ip, port)| {
        used.iter().any(|(p2, ip2, port2)| {
            proto == p2 && port == port2 && (ip == ip2 || ip == "0.0.0.0" || ip2 == "0.0.0.0")
        })
    })
}

fn has_untolerated_no_execute_taint(pod: &Pod, node: &Node) -> bool {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    taints.iter().filter(|t| t.effect == "NoExecute").any(|t| {
        !tolerations
            .iter()
            .any(|tol| tolerates(tol, &t.key, t.value.as_deref(), &t.effect))
    })
}

fn tolerates(tol: &Toleration, key: &str, value: Option<&str>, effect: &str) -> bool {
    if tol
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != effect)
    {
        return false;
    }
    let tol_key = tol.key.as_deref().unwrap_or("");
    let op = tol.operator.as_deref().unwrap_or("Equal");
    if tol_key.is_empty() {
        // An empty key tolerates every taint only with Exists.
        return op == "Exists";
    }
    if tol_key != key {
        return false;
    }
    match op {
        "Exists" => true,
        "Equal" | "" => tol.value.as_deref().unwrap_or("") == value.unwrap_or(""),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
