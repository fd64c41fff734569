//! What a configMap, secret, downwardAPI or projected volume holds, as a [`Payload`] for the
//! atomic writer: pure functions of the objects and the pod (upstream's `MakePayload` of the
//! configmap and secret plugins, `downwardapi.CollectData`, `fieldpath.ExtractFieldPathAsString`
//! and `resource.ExtractResourceValueByContainerNameAndNodeAllocatable`, behaviour only).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector, Secret,
};

use super::atomic_writer::{FileProjection, Payload};
use crate::util::quantity::{QuantityError, parse_bytes, parse_cpu_millis};

/// Why a volume's (or an environment variable's) content could not be made from its objects or
/// its pod: the message is upstream's where it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    /// A `defaultMode` or item `mode` that is not permission bits.
    #[error("invalid mode {0} ({0:#o}): must be a value between 0 and 0777 (octal)")]
    InvalidMode(i32),
    /// An item names a key the ConfigMap does not have (and the volume is not optional).
    #[error("configmap references non-existent config key: {0}")]
    MissingConfigMapKey(String),
    /// An item names a key the Secret does not have (and the volume is not optional).
    #[error("references non-existent secret key: {0}")]
    MissingSecretKey(String),
    /// A downwardAPI item naming no field.
    #[error("downwardAPI item {0:?} has neither fieldRef nor resourceFieldRef")]
    NoField(String),
    /// A `fieldRef` this projection does not give (the pod's metadata only).
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    /// A `resourceFieldRef` naming a container the pod does not have.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// A `resourceFieldRef` naming a resource that is not `limits.*` or `requests.*` of a
    /// known one.
    #[error("unsupported container resource : {0}")]
    UnsupportedResource(String),
    /// A negative divisor.
    #[error("invalid divisor {divisor:?} for {resource}")]
    InvalidDivisor { divisor: String, resource: String },
    /// A resource value or divisor that is not a quantity.
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    /// Several items failed (upstream aggregates them): `[first, second]`.
    #[error("{}", bracketed(.0))]
    Several(Vec<ProjectionError>),
}

/// Errors as upstream's aggregate shows several: `[first, second]`.
pub(super) fn bracketed<E: std::fmt::Display>(errors: &[E]) -> String {
    let texts: Vec<String> = errors.iter().map(E::to_string).collect();
    format!("[{}]", texts.join(", "))
}

/// `Ok` when `errors` is empty, its error when it holds one, else `several` of them (the
/// aggregate upstream shows as `[first, second]`).
pub(super) fn aggregate<E>(mut errors: Vec<E>, several: impl FnOnce(Vec<E>) -> E) -> Result<(), E> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(several(errors)),
    }
}

/// The mode of a file a volume does not give one for (the API server's default).
pub const DEFAULT_MODE: i32 = 0o644;

/// A mode from the API (`defaultMode`, an item's `mode`), checked to be permission bits.
pub fn mode(m: Option<i32>, default: u32) -> Result<u32, ProjectionError> {
    match m {
        None => Ok(default),
        Some(m) if (0..=0o777).contains(&m) => Ok(m as u32),
        Some(m) => Err(ProjectionError::InvalidMode(m)),
    }
}

/// Data by key, whatever the object keeps it in.
fn projected(
    items: Option<&[KeyToPath]>,
    data: &BTreeMap<String, Vec<u8>>,
    default_mode: u32,
    optional: bool,
    missing: impl Fn(String) -> ProjectionError,
) -> Result<Payload, ProjectionError> {
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(
                    k.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode: default_mode,
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some(v) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(missing(item.key.clone()));
                };
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode: mode(item.mode, default_mode)?,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// A configMap's payload: `data` and `binaryData` by key, or the `items` asked for (a missing
/// key is an error unless the volume is optional).
pub fn config_map_payload(
    items: Option<&[KeyToPath]>,
    cm: &ConfigMap,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, ProjectionError> {
    let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in cm.data.iter().flatten() {
        data.insert(k.clone(), v.as_bytes().to_vec());
    }
    for (k, ByteString(v)) in cm.binary_data.iter().flatten() {
        data.insert(k.clone(), v.clone());
    }
    projected(
        items,
        &data,
        default_mode,
        optional,
        ProjectionError::MissingConfigMapKey,
    )
}

/// A secret's payload, as [`config_map_payload`].
pub fn secret_payload(
    items: Option<&[KeyToPath]>,
    secret: &Secret,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, ProjectionError> {
    let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, ByteString(v)) in secret.data.iter().flatten() {
        data.insert(k.clone(), v.clone());
    }
    // `stringData` is write-only (the API server merges it into `data`); a secret read back
    // never has it, but one that does means the same.
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.as_bytes().to_vec());
    }
    projected(
        items,
        &data,
        default_mode,
        optional,
        ProjectionError::MissingSecretKey,
    )
}

/// What the node can give a container that sets no limit (its allocatable resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: Option<i64>,
    pub memory: Option<i64>,
    pub ephemeral_storage: Option<i64>,
}

impl Allocatable {
    /// From a Node's `status.allocatable`.
    pub fn from_node(node: &k8s_openapi::api::core::v1::Node) -> Self {
        let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |k: &str| alloc.and_then(|a| a.get(k)).map(|q| q.0.as_str());
        Allocatable {
            cpu_millis: get("cpu").and_then(|q| parse_cpu_millis(q).ok()),
            memory: get("memory").and_then(|q| parse_bytes(q).ok()),
            ephemeral_storage: get("ephemeral-storage").and_then(|q| parse_bytes(q).ok()),
        }
    }
}

/// A downwardAPI volume's (or projected source's) payload: each item's field or resource value.
/// Every item that fails is named in the error (upstream aggregates them).
pub fn downward_api_payload(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    allocatable: &Allocatable,
    default_mode: u32,
) -> Result<Payload, ProjectionError> {
    let mut out = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let m = match mode(item.mode, default_mode) {
            Ok(m) => m,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), _) => field_path_value(pod, &f.field_path),
            (None, Some(r)) => resource_value(r, pod, allocatable),
            (None, None) => Err(ProjectionError::NoField(item.path.clone())),
        };
        match value {
            Ok(v) => {
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: v.into_bytes(),
                        mode: m,
                    },
                );
            }
            Err(e) => errors.push(e),
        }
    }
    aggregate(errors, ProjectionError::Several).map(|()| out)
}

/// Upstream's `fieldpath.ExtractFieldPathAsString`: the pod's metadata fields.
pub fn field_path_value(pod: &Pod, path: &str) -> Result<String, ProjectionError> {
    let m = &pod.metadata;
    let empty = BTreeMap::new();
    if let Some((field, key)) = subscript(path) {
        let map = match field {
            "metadata.annotations" => m.annotations.as_ref(),
            "metadata.labels" => m.labels.as_ref(),
            _ => return Err(ProjectionError::UnsupportedFieldPath(path.to_string())),
        };
        return Ok(map.unwrap_or(&empty).get(key).cloned().unwrap_or_default());
    }
    Ok(match path {
        "metadata.annotations" => format_map(m.annotations.as_ref().unwrap_or(&empty)),
        "metadata.labels" => format_map(m.labels.as_ref().unwrap_or(&empty)),
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        _ => return Err(ProjectionError::UnsupportedFieldPath(path.to_string())),
    })
}

/// `metadata.labels['key']` → (`metadata.labels`, `key`).
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (field, rest) = path.split_once("['")?;
    let key = rest.strip_suffix("']")?;
    Some((field, key))
}

/// Labels or annotations as upstream writes them: `key="value"` lines sorted by key, the value
/// quoted as Go's `%q` does, no newline after the last.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A string quoted as Go's `strconv.Quote`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A divisor of zero means none, as upstream.
fn nonzero(d: Option<i64>) -> Option<i64> {
    d.filter(|d| *d != 0)
}

/// The container a `resourceFieldRef` names: an app container, else an init container.
fn find_container<'a>(pod: &'a Pod, name: &str) -> Result<&'a Container, ProjectionError> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.containers.iter())
        .chain(
            spec.into_iter()
                .flat_map(|s| s.init_containers.iter().flatten()),
        )
        .find(|c| c.name == name)
        .ok_or_else(|| ProjectionError::ContainerNotFound(name.to_string()))
}

/// A container resource as the downward API gives it: `limits.*` default to the node's
/// allocatable when the container sets none (or zero), divided by the `divisor` (1 when unset)
/// and rounded up.
pub fn resource_value(
    fs: &ResourceFieldSelector,
    pod: &Pod,
    allocatable: &Allocatable,
) -> Result<String, ProjectionError> {
    let name = fs.container_name.as_deref().unwrap_or("");
    let c = find_container(pod, name)?;
    let res = c.resources.as_ref();
    let get = |which: &str, key: &str| -> Option<String> {
        let list = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        list.and_then(|l| l.get(key)).map(|q| q.0.clone())
    };
    let divisor = fs
        .divisor
        .as_ref()
        .map(|q| q.0.as_str())
        .filter(|d| !d.is_empty());
    let unsupported = || ProjectionError::UnsupportedResource(fs.resource.clone());
    let (which, key) = fs.resource.split_once('.').ok_or_else(unsupported)?;
    if which != "limits" && which != "requests" {
        return Err(unsupported());
    }
    let ceil_div = |v: i64, d: i64| -> Result<String, ProjectionError> {
        if d <= 0 {
            return Err(ProjectionError::InvalidDivisor {
                divisor: divisor.unwrap_or("1").to_string(),
                resource: fs.resource.clone(),
            });
        }
        Ok((v.div_euclid(d) + i64::from(v.rem_euclid(d) != 0)).to_string())
    };
    match key {
        "cpu" => {
            let mut v = match get(which, key) {
                Some(q) => parse_cpu_millis(&q)?,
                None => 0,
            };
            if which == "limits" && v == 0 {
                v = allocatable.cpu_millis.unwrap_or(0);
            }
            let d = nonzero(divisor.map(parse_cpu_millis).transpose()?).unwrap_or(1000);
            ceil_div(v, d)
        }
        "memory" | "ephemeral-storage" => {
            let mut v = match get(which, key) {
                Some(q) => parse_bytes(&q)?,
                None => 0,
            };
            if which == "limits" && v == 0 {
                v = match key {
                    "memory" => allocatable.memory,
                    _ => allocatable.ephemeral_storage,
                }
                .unwrap_or(0);
            }
            let d = nonzero(divisor.map(parse_bytes).transpose()?).unwrap_or(1);
            ceil_div(v, d)
        }
        k if k.starts_with("hugepages-") => {
            let v = match get(which, key) {
                Some(q) => parse_bytes(&q)?,
                None => 0,
            };
            let d = nonzero(divisor.map(parse_bytes).transpose()?).unwrap_or(1);
            ceil_div(v, d)
        }
        _ => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests;
