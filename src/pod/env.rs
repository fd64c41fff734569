//! A container's environment (upstream's `makeEnvironmentVariables`, behaviour only): the
//! service variables ([`crate::api::services`]) under everything else, `envFrom`
//! (ConfigMaps and Secrets, with `prefix`; keys that are not valid variable names skipped),
//! then `env` in order: values with `$(VAR)` expanded from what is defined so far, `fieldRef`
//! (the pod's metadata, node name, service account, pod and host IPs), `resourceFieldRef` (the
//! container's resources, limits defaulting to the node's allocatable), `configMapKeyRef` and
//! `secretKeyRef`. A missing object or key fails the container's config with upstream's message
//! (`configmap "x" not found`, `couldn't find key k in ConfigMap ns/x`) unless the reference is
//! optional, in which case the variable (or the `envFrom` source) is left out.
//!
//! The objects are read before the sync by the volume manager into [`EnvObjects`], so building
//! the environment stays a pure function.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use runtime::{Error, Result};

use super::options::ContainerOptions;
use crate::model::PodRef;
use crate::util::expand;
use crate::volumes::projection::{self, Allocatable};

pub use super::options::{EnvObjects, Read};
pub use crate::model::env_references;

/// Upstream's `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b"-._".contains(&b))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// The `envFrom` keys of `c` skipped for not being variable names, per source, as upstream's
/// `InvalidEnvironmentVariableNames` event words them (`Keys [1bad, 2bad] from the EnvFrom
/// configMap ns/name were skipped since they are considered invalid environment variable
/// names.`).
pub fn invalid_env_from_keys(who: &PodRef, c: &Container, objects: &EnvObjects) -> Vec<String> {
    let ns = &who.namespace;
    let mut out = Vec::new();
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.as_deref().unwrap_or("");
        let (kind, name, keys): (&str, &str, Vec<&String>) = if let Some(r) = &f.config_map_ref {
            let keys = match objects.config_maps.get(&r.name) {
                Some(Ok(Some(data))) => data.keys().collect(),
                _ => Vec::new(),
            };
            ("configMap", &r.name, keys)
        } else if let Some(r) = &f.secret_ref {
            let keys = match objects.secrets.get(&r.name) {
                Some(Ok(Some(data))) => data.keys().collect(),
                _ => Vec::new(),
            };
            ("secret", &r.name, keys)
        } else {
            continue;
        };
        let mut bad: Vec<String> = keys
            .into_iter()
            .map(|k| format!("{prefix}{k}"))
            .filter(|k| !is_env_var_name(k))
            .collect();
        if bad.is_empty() {
            continue;
        }
        bad.sort();
        out.push(format!(
            "Keys [{}] from the EnvFrom {kind} {ns}/{name} were skipped since they are \
             considered invalid environment variable names.",
            bad.join(", ")
        ));
    }
    out
}

/// A pod field for an env var (upstream's `podFieldSelectorRuntimeValue`).
fn field_ref(pod: &Pod, path: &str, opts: &ContainerOptions, field: &str) -> Result<String> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| opts.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => opts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => opts.pod_ips.join(","),
        "status.hostIP" => opts.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => opts.host_ips.join(","),
        other => projection::field_path_value(pod, other)
            .map_err(|e| Error::invalid_argument(format!("{field}: {e}")))?,
    })
}

/// How a reference to an object resolved.
enum Resolved<T> {
    Value(T),
    /// Optional and missing: the variable is left out.
    Skip,
}

/// Looks `name` up in `read` (ConfigMaps or Secrets) for a reference that is `optional`.
fn object<'a, T>(
    read: &'a BTreeMap<String, Read<T>>,
    kind: &str,
    name: &str,
    optional: bool,
) -> Result<Resolved<&'a T>> {
    match read.get(name) {
        Some(Ok(Some(data))) => Ok(Resolved::Value(data)),
        Some(Ok(None)) if optional => Ok(Resolved::Skip),
        Some(Ok(None)) => Err(Error::invalid_argument(format!(
            "{kind} {name:?} not found"
        ))),
        Some(Err(e)) => Err(Error::invalid_argument(e.to_string())),
        None => Err(Error::invalid_argument(format!(
            "{kind} {name:?} was not read for this sync"
        ))),
    }
}

/// The container's environment, in the order variables are first defined.
pub fn envs(
    pod: &Pod,
    who: &PodRef,
    c: &Container,
    opts: &ContainerOptions,
) -> Result<Vec<(String, String)>> {
    let ns = who.namespace.as_str();
    let objects = &opts.env_objects;
    if let Some(e) = &objects.service_env_error {
        return Err(Error::invalid_argument(e.to_string()));
    }
    let mut order: Vec<String> = Vec::new();
    // The service variables first, so that `$(VAR)` sees them; any defined by the container
    // replaces one of them.
    let mut vars: HashMap<String, String> = objects
        .service_env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut defined: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut set = |k: String, v: String, vars: &mut HashMap<String, String>| {
        if defined.insert(k.clone()) {
            order.push(k.clone());
        }
        vars.insert(k, v);
    };
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.as_deref().unwrap_or("");
        if let Some(r) = &f.config_map_ref {
            let optional = r.optional.unwrap_or(false);
            if let Resolved::Value(data) =
                object(&objects.config_maps, "configmap", &r.name, optional)?
            {
                for (k, v) in data {
                    let k = format!("{prefix}{k}");
                    if is_env_var_name(&k) {
                        set(k, v.clone(), &mut vars);
                    }
                }
            }
        } else if let Some(r) = &f.secret_ref {
            let optional = r.optional.unwrap_or(false);
            if let Resolved::Value(data) = object(&objects.secrets, "secret", &r.name, optional)? {
                for (k, v) in data {
                    let k = format!("{prefix}{k}");
                    if is_env_var_name(&k) {
                        set(k, String::from_utf8_lossy(v).into_owned(), &mut vars);
                    }
                }
            }
        }
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        let field = format!("spec.containers[{}].env[{i}]", c.name);
        let value = match (e.value.as_deref().filter(|v| !v.is_empty()), &e.value_from) {
            (Some(v), _) => expand(v, &vars),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    let field = format!("{field}.valueFrom.fieldRef");
                    field_ref(pod, &f.field_path, opts, &field)?
                } else if let Some(r) = &from.resource_field_ref {
                    resource(pod, c, r, &objects.allocatable)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match object(&objects.config_maps, "configmap", &r.name, optional)? {
                        Resolved::Skip => continue,
                        Resolved::Value(data) => match data.get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(Error::invalid_argument(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                )));
                            }
                        },
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match object(&objects.secrets, "secret", &r.name, optional)? {
                        Resolved::Skip => continue,
                        Resolved::Value(data) => match data.get(&r.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if optional => continue,
                            None => {
                                return Err(Error::invalid_argument(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                )));
                            }
                        },
                    }
                } else {
                    return Err(Error::unimplemented(format!(
                        "{field}.valueFrom: a source this kubelet does not know"
                    )));
                }
            }
            (None, None) => String::new(),
        };
        set(e.name.clone(), value, &mut vars);
    }
    // Then the service variables the container did not define, by name.
    let services = objects
        .service_env
        .keys()
        .filter(|k| !order.contains(k))
        .cloned()
        .collect::<Vec<_>>();
    Ok(order
        .into_iter()
        .chain(services)
        .map(|k| {
            let v = vars.get(&k).cloned().unwrap_or_default();
            (k, v)
        })
        .collect())
}

/// A `resourceFieldRef` of an env var: of the container itself unless it names another.
fn resource(
    pod: &Pod,
    c: &Container,
    r: &ResourceFieldSelector,
    allocatable: &Allocatable,
) -> Result<String> {
    let mut r = r.clone();
    if r.container_name.as_deref().is_none_or(str::is_empty) {
        r.container_name = Some(c.name.clone());
    }
    projection::resource_value(&r, pod, allocatable)
        .map_err(|e| Error::invalid_argument(e.to_string()))
}

#[cfg(test)]
mod tests;
