//! Static pod manifests: decoding (YAML or JSON, one `v1` `Pod`), validation of what the
//! kubelet relies on, and the defaulting the upstream kubelet applies to static pods
//! (`applyDefaults` in pkg/kubelet/config/common.go, plus the API server's field defaults a
//! pod read from disk never went through).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Toleration};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{CONFIG_HASH_ANNOTATION, CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION, Error};
use crate::model::PullPolicy;

/// Decodes one manifest: YAML (or JSON, which YAML includes) holding a single `v1` `Pod`.
pub fn decode(text: &str) -> Result<Pod, Error> {
    let value: Value = serde_norway::from_str(text).map_err(Error::NotYaml)?;
    decode_value(value)
}

/// Like [`decode`], from an already parsed document.
pub fn decode_value(value: Value) -> Result<Pod, Error> {
    if !value.is_object() {
        return Err(Error::NotAMapping);
    }
    match value.get("kind").and_then(Value::as_str) {
        Some("Pod") => {}
        Some(kind) => return Err(Error::WrongKind(kind.to_string())),
        None => return Err(Error::KindMissing),
    }
    match value.get("apiVersion").and_then(Value::as_str) {
        Some("v1") => {}
        Some(v) => return Err(Error::WrongApiVersion(v.to_string())),
        None => return Err(Error::ApiVersionMissing),
    }
    serde_json::from_value(value).map_err(Error::InvalidPod)
}

/// Checks what the kubelet relies on: a DNS-1123 subdomain name, a DNS-1123 label namespace,
/// at least one container, unique DNS-1123 label container names, non-empty images.
pub fn validate(pod: &Pod) -> Result<(), Error> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(Error::NameRequired);
    }
    if !is_dns1123_subdomain(name) {
        return Err(Error::NameNotSubdomain(name.to_string()));
    }
    if let Some(ns) = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
    {
        if !is_dns1123_label(ns) {
            return Err(Error::NamespaceNotLabel(ns.to_string()));
        }
    }
    let Some(spec) = &pod.spec else {
        return Err(Error::SpecRequired);
    };
    if spec.containers.is_empty() {
        return Err(Error::NoContainers);
    }
    let mut names = HashSet::new();
    let init = spec.init_containers.iter().flatten();
    let all = init
        .map(|c| ("spec.initContainers", c))
        .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
    for (index, (field, c)) in all.enumerate() {
        let n = c.name.as_str();
        let name = || n.to_string();
        if n.is_empty() {
            return Err(Error::ContainerWithoutName { field, index });
        }
        if !is_dns1123_label(n) {
            return Err(Error::ContainerNameNotLabel {
                field,
                name: name(),
            });
        }
        if !names.insert(n) {
            return Err(Error::DuplicateContainer {
                field,
                name: name(),
            });
        }
        if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
            return Err(Error::NoImage {
                field,
                name: name(),
            });
        }
        if let Some(why) = extended_resource_problem(c) {
            return Err(Error::ExtendedResource {
                field,
                name: name(),
                why,
            });
        }
        let regular_init = field == "spec.initContainers" && !crate::model::is_sidecar(c);
        crate::prober::validate_container(&format!("{field}[{n}]"), c, regular_init)?;
    }
    Ok(())
}

/// What is wrong with a container's extended resources, in the API server's words: a
/// request without a limit, a request other than the limit, a fraction.
fn extended_resource_problem(c: &k8s_openapi::api::core::v1::Container) -> Option<String> {
    let res = c.resources.as_ref()?;
    let limits = res.limits.as_ref();
    for (name, q) in res.requests.iter().flatten() {
        if !crate::admission::is_extended(name) {
            continue;
        }
        match limits.and_then(|l| l.get(name)) {
            None => {
                return Some(format!(
                    "limits: Required value: Limit must be set for non overcommitable resources \
                     ({name})"
                ));
            }
            Some(l) if l.0.trim() != q.0.trim() => {
                return Some(format!(
                    "requests[{name}]: Invalid value: {:?}: must be equal to {name} limit of {}",
                    q.0, l.0
                ));
            }
            Some(_) => {}
        }
    }
    for (name, q) in limits.into_iter().flatten() {
        if crate::admission::is_extended(name) && q.0.trim().parse::<u64>().is_err() {
            return Some(format!(
                "limits[{name}]: Invalid value: {:?}: must be an integer",
                q.0
            ));
        }
    }
    None
}

/// A DNS-1123 label: 1-63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated DNS-1123 labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Applies the static pod defaults, as the upstream kubelet does for file and HTTP pods:
/// - UID, if unset: hex SHA-256 (first 32 digits) of the node name, `origin` (the file path
///   or URL) and the pod as decoded; the `kubernetes.io/config.hash` annotation repeats it;
/// - name `<name>-<node name>`, namespace `default` if unset, `spec.nodeName` the node;
/// - annotations `kubernetes.io/config.source` = `source` and `kubernetes.io/config.seen` =
///   `seen` (RFC 3339; the merger ignores it when comparing);
/// - a toleration of every `NoExecute` taint, `status.phase` `Pending`;
/// - the API server's defaults the kubelet relies on: restartPolicy `Always`,
///   terminationGracePeriodSeconds 30, dnsPolicy `ClusterFirst`, and per container
///   imagePullPolicy (`Always` for `:latest` or untagged images, else `IfNotPresent`),
///   terminationMessagePath `/dev/termination-log`, terminationMessagePolicy `File`.
pub fn apply_defaults(pod: &mut Pod, origin: &str, node_name: &str, source: &str, seen: &str) {
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        let mut h = Sha256::new();
        h.update(format!("host:{node_name}\n"));
        h.update(format!("file:{origin}\n"));
        // serde_json output of the decoded pod: stable for the same content, whatever the
        // file's formatting or comments.
        h.update(serde_json::to_vec(pod).unwrap_or_default());
        let mut uid = hex::encode(h.finalize());
        uid.truncate(32);
        pod.metadata.uid = Some(uid);
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{node_name}"));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".to_string());
    }
    pod.metadata.self_link = None;
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), uid);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string());
    annotations.insert(CONFIG_SEEN_ANNOTATION.to_string(), seen.to_string());

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    let all_no_execute = Toleration {
        operator: Some("Exists".to_string()),
        effect: Some("NoExecute".to_string()),
        ..Default::default()
    };
    if !tolerations.contains(&all_no_execute) {
        tolerations.push(all_no_execute);
    }
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_string());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_string());
    let init = spec.init_containers.iter_mut().flatten();
    for c in init.chain(spec.containers.iter_mut()) {
        default_container(c);
    }
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase.get_or_insert_with(|| "Pending".to_string());
}

fn default_container(c: &mut Container) {
    if c.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        let policy = PullPolicy::default_for(c.image.as_deref().unwrap_or(""));
        c.image_pull_policy = Some(policy.as_str().to_string());
    }
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".to_string());
    c.termination_message_policy
        .get_or_insert_with(|| "File".to_string());
}

#[cfg(test)]
mod tests;
