//! A CDI spec file: its model (JSON or YAML, unknown fields refused, as the reference
//! implementation's strict decoder does), and its checks: the version (0.3.0 to 0.8.0, at least
//! the one the fields used need), the kind, the device names, the edits.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::name::{check_device_name, parse_kind};

/// The CDI spec versions read, oldest first.
pub const VERSIONS: &[&str] = &["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"];

/// Why a spec file cannot be used (none of its devices can then).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot be read: {0}")]
    Read(#[source] std::io::Error),
    #[error("is not a valid CDI spec (JSON): {0}")]
    Json(#[from] serde_json::Error),
    #[error("is not a valid CDI spec (YAML): {0}")]
    Yaml(#[from] serde_norway::Error),
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> SpecError {
    SpecError::Invalid(message.into())
}

/// A list that may also be written `null` (Go's decoder takes that for an empty list).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A spec file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    #[serde(deserialize_with = "nullable")]
    pub devices: Vec<Device>,
    #[serde(default, deserialize_with = "nullable")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub container_edits: ContainerEdits,
}

/// What a spec or a device changes in a container's OCI spec.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, deserialize_with = "nullable")]
    pub env: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, deserialize_with = "nullable")]
    pub mounts: Vec<Mount>,
    #[serde(default, deserialize_with = "nullable")]
    pub hooks: Vec<Hook>,
    #[serde(default, deserialize_with = "nullable")]
    pub additional_gids: Vec<u32>,
    /// Read only to be refused with a clear error (see the module's doc).
    #[serde(default)]
    pub intel_rdt: Option<IgnoredAny>,
    /// CDI 1.1.0's: read only to be refused with a clear error.
    #[serde(default)]
    pub net_devices: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default)]
    pub host_path: String,
    #[serde(default, rename = "type")]
    pub typ: String,
    #[serde(default)]
    pub major: i64,
    #[serde(default)]
    pub minor: i64,
    #[serde(default)]
    pub file_mode: Option<u32>,
    #[serde(default)]
    pub permissions: String,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, deserialize_with = "nullable")]
    pub options: Vec<String>,
    #[serde(default, rename = "type")]
    pub typ: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, deserialize_with = "nullable")]
    pub args: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// The hook names CDI knows (the OCI ones).
pub const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.additional_gids.is_empty()
            && self.intel_rdt.is_none()
            && self.net_devices.is_none()
    }

    /// The checks of the reference implementation that need no host.
    fn check(&self) -> Result<(), SpecError> {
        if self.net_devices.is_some() {
            return Err(invalid(
                "containerEdits.netDevices is a CDI 1.1.0 field: nodelet reads CDI specs of \
                 versions 0.3.0 to 0.8.0 and moves no network device into a container",
            ));
        }
        check_env("env", &self.env)?;
        for d in &self.device_nodes {
            if d.path.is_empty() {
                return Err(invalid("a device node has an empty path"));
            }
            if !matches!(d.typ.as_str(), "" | "b" | "c" | "u" | "p") {
                return Err(invalid(format!(
                    "device node {:?}: type {:?} is none of b, c, u, p",
                    d.path, d.typ
                )));
            }
            let p = d.permissions.as_str();
            if !(p.is_empty() || p == "none" || p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))) {
                return Err(invalid(format!(
                    "device node {:?}: permissions {p:?} must be made of r, w and m (or be \"none\")",
                    d.path
                )));
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(invalid(format!(
                    "hook name {:?} is none of {}",
                    h.hook_name,
                    HOOK_NAMES.join(", ")
                )));
            }
            if h.path.is_empty() {
                return Err(invalid(format!("{} hook with an empty path", h.hook_name)));
            }
            check_env(&format!("{} hook {:?}: env", h.hook_name, h.path), &h.env)?;
        }
        for m in &self.mounts {
            if m.host_path.is_empty() || m.container_path.is_empty() {
                return Err(invalid(format!(
                    "mount {:?} -> {:?}: both hostPath and containerPath are needed",
                    m.host_path, m.container_path
                )));
            }
        }
        Ok(())
    }

    /// The oldest version (an index into [`VERSIONS`]) the fields used need, and which field.
    fn needs(&self) -> (usize, &'static str) {
        if self.intel_rdt.is_some() {
            (4, "intelRdt")
        } else if !self.additional_gids.is_empty() {
            (4, "additionalGids")
        } else if self.device_nodes.iter().any(|d| !d.host_path.is_empty()) {
            (2, "a device node's hostPath")
        } else if self.mounts.iter().any(|m| !m.typ.is_empty()) {
            (1, "a mount's type")
        } else {
            (0, "")
        }
    }
}

/// Each entry must be `NAME=value` with a name, and no NUL byte.
fn check_env(what: &str, env: &[String]) -> Result<(), SpecError> {
    match env
        .iter()
        .find(|e| e.contains('\0') || e.find('=').is_none_or(|i| i == 0))
    {
        Some(e) => Err(invalid(format!("{what}: {e:?} is not NAME=value"))),
        None => Ok(()),
    }
}

/// Reads a spec from `data`: YAML unless the file name ends in `.json`.
pub fn parse(path: &Path, data: &[u8]) -> Result<Spec, SpecError> {
    let spec: Spec = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_slice(data)?
    } else {
        serde_norway::from_slice(data)?
    };
    spec.check()?;
    Ok(spec)
}

impl Spec {
    /// The version's index in [`VERSIONS`].
    fn version(&self) -> Result<usize, SpecError> {
        let v = self
            .cdi_version
            .strip_prefix('v')
            .unwrap_or(&self.cdi_version);
        if let Some(i) = VERSIONS.iter().position(|k| *k == v) {
            return Ok(i);
        }
        let known_elsewhere = ["0.1.0", "0.2.0", "1.0.0", "1.1.0"];
        Err(invalid(if known_elsewhere.contains(&v) {
            format!(
                "cdiVersion {:?} is not supported: nodelet reads CDI specs of versions {} to {}",
                self.cdi_version,
                VERSIONS[0],
                VERSIONS[VERSIONS.len() - 1]
            )
        } else {
            format!(
                "cdiVersion {:?} is not a CDI spec version",
                self.cdi_version
            )
        }))
    }

    /// The oldest version the fields used need, as an index into [`VERSIONS`], and why.
    fn needs(&self) -> (usize, &'static str) {
        let mut need = (0, "");
        let mut at_least = |v: usize, why: &'static str| {
            if v > need.0 {
                need = (v, why);
            }
        };
        let edits = std::iter::once(&self.container_edits)
            .chain(self.devices.iter().map(|d| &d.container_edits));
        for e in edits {
            let (v, why) = e.needs();
            at_least(v, why);
        }
        if self
            .devices
            .iter()
            .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
        {
            at_least(2, "a device name starting with a digit");
        }
        if !self.annotations.is_empty() || self.devices.iter().any(|d| !d.annotations.is_empty()) {
            at_least(3, "annotations");
        }
        if self
            .kind
            .split_once('/')
            .is_some_and(|(_, c)| c.contains('.'))
        {
            at_least(3, "a dot in the kind's class");
        }
        need
    }

    /// Every check the reference implementation makes when it loads a spec.
    fn check(&self) -> Result<(), SpecError> {
        let version = self.version()?;
        let (need, why) = self.needs();
        if need > version {
            return Err(invalid(format!(
                "{why} needs cdiVersion {} or later, the spec says {}",
                VERSIONS[need], self.cdi_version
            )));
        }
        parse_kind(&self.kind).map_err(|e| invalid(e.to_string()))?;
        self.container_edits.check()?;
        if self.devices.is_empty() {
            return Err(invalid("the spec has no devices"));
        }
        let mut seen = std::collections::HashSet::new();
        for d in &self.devices {
            check_device_name(&d.name).map_err(|e| invalid(e.to_string()))?;
            if !seen.insert(d.name.as_str()) {
                return Err(invalid(format!("device {:?} is defined twice", d.name)));
            }
            if d.container_edits.is_empty() {
                return Err(invalid(format!(
                    "device {:?} has no containerEdits",
                    d.name
                )));
            }
            d.container_edits
                .check()
                .map_err(|e| invalid(format!("device {:?}: {e}", d.name)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
