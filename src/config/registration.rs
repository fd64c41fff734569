//! How the node registers itself: `registerWithTaints` and `providerID` from the file (or
//! their flags), and what only flags set: `--node-labels` and `--cloud-provider=external`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Error;
use super::values::{Typed, wrong_type};

/// A taint the Node is registered with (`registerWithTaints`, `--register-with-taints`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintSpec {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// The taint an external cloud provider's controller removes once it has initialised the
/// Node (upstream's `cloudproviderapi.TaintExternalCloudProvider`).
pub const TAINT_EXTERNAL_CLOUD_PROVIDER: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// The registration settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    pub taints: Vec<TaintSpec>,
    /// `providerID`; empty: none.
    pub provider_id: String,
    /// `--node-labels`: added to the Node's labels at registration.
    pub labels: BTreeMap<String, String>,
    /// `--cloud-provider=external`: the Node registers with the uninitialized taint.
    pub external_cloud_provider: bool,
}

/// The file's fields.
pub(super) struct RawRegistration {
    pub(super) taints: Option<Value>,
    pub(super) provider_id: Option<Typed<String>>,
}

impl RawRegistration {
    pub(super) fn into_config(self) -> Result<Registration, Error> {
        let taints = match self.taints {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    taint_object(item)
                        .map_err(|e| super::invalid(&format!("registerWithTaints[{i}]"), e))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(super::invalid(
                    "registerWithTaints",
                    wrong_type("a list of taints", other),
                ));
            }
        };
        Ok(Registration {
            taints,
            provider_id: self.provider_id.map(|t| t.0).unwrap_or_default(),
            ..Default::default()
        })
    }
}

/// A taint as the file writes it: `{key, value, effect}`.
fn taint_object(v: Value) -> Result<TaintSpec, Error> {
    let Value::Object(m) = v else {
        return Err(wrong_type("a taint {key, value, effect}", v));
    };
    let field = |name: &str| match m.get(name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(super::invalid(name, wrong_type("a string", other))),
    };
    checked_taint(field("key")?, field("value")?, field("effect")?)
}

/// A `--register-with-taints` item: `key=value:Effect` or `key:Effect`.
pub fn parse_taint(s: &str) -> Result<TaintSpec, Error> {
    let Some((kv, effect)) = s.rsplit_once(':') else {
        return Err(Error::Taint(format!(
            "{s:?}: must be key=value:Effect or key:Effect"
        )));
    };
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    checked_taint(key.to_string(), value.to_string(), effect.to_string())
}

/// The taint written back in its flag form.
pub fn format_taint(t: &TaintSpec) -> String {
    if t.value.is_empty() {
        format!("{}:{}", t.key, t.effect)
    } else {
        format!("{}={}:{}", t.key, t.value, t.effect)
    }
}

fn checked_taint(key: String, value: String, effect: String) -> Result<TaintSpec, Error> {
    if let Err(why) = qualified_name(&key) {
        return Err(Error::Taint(format!("key {key:?}: {why}")));
    }
    if let Err(why) = label_value(&value) {
        return Err(Error::Taint(format!("value {value:?}: {why}")));
    }
    if !matches!(
        effect.as_str(),
        "NoSchedule" | "PreferNoSchedule" | "NoExecute"
    ) {
        return Err(Error::Taint(format!(
            "effect {effect:?}: must be NoSchedule, PreferNoSchedule or NoExecute"
        )));
    }
    Ok(TaintSpec { key, value, effect })
}

/// `--node-labels`: `key=value` pairs, comma-separated, each checked as a label, and only the
/// `kubernetes.io`/`k8s.io` labels upstream lets a kubelet set on itself (a node must not
/// give itself, say, a `node-role.kubernetes.io` label: the NodeRestriction admission
/// plugin would refuse it).
pub fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, Error> {
    let mut labels = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(Error::Label(format!("{item:?}: must be key=value")));
        };
        qualified_name(k).map_err(|why| Error::Label(format!("key {k:?}: {why}")))?;
        label_value(v).map_err(|why| Error::Label(format!("value {v:?} of {k}: {why}")))?;
        if !kubelet_may_set(k) {
            return Err(Error::Label(format!(
                "unknown 'kubernetes.io' or 'k8s.io' label {k:?}: a kubelet may set only \
                 kubelet.kubernetes.io/*, node.kubernetes.io/* and the well-known labels"
            )));
        }
        labels.insert(k.to_string(), v.to_string());
    }
    Ok(labels)
}

/// Upstream's `IsKubeletLabel` for labels in the kubernetes.io and k8s.io namespaces.
fn kubelet_may_set(key: &str) -> bool {
    const WELL_KNOWN: [&str; 11] = [
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let restricted = |ns: &str| prefix == ns || prefix.ends_with(&format!(".{ns}"));
    if !restricted("kubernetes.io") && !restricted("k8s.io") {
        return true;
    }
    WELL_KNOWN.contains(&key)
        || ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

/// A qualified name: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters, alphanumeric at both ends, `-`, `_` and `.` inside.
fn qualified_name(s: &str) -> Result<(), &'static str> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err("its prefix must be a DNS subdomain");
        }
    }
    if name.is_empty() {
        return Err("the name must not be empty");
    }
    label_value(name)
}

/// A label value: empty, or at most 63 characters, alphanumeric at both ends, `-`, `_` and
/// `.` inside.
fn label_value(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Ok(());
    }
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_alphanumeric();
    if s.len() > 63
        || !edge(b[0])
        || !edge(b[b.len() - 1])
        || !b
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Err("at most 63 characters, alphanumeric at both ends, '-', '_' or '.' inside");
    }
    Ok(())
}
