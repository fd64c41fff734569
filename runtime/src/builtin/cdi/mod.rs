//! CDI (Container Device Interface) devices for the built-in runtime's containers.
//!
//! A container asks for CDI devices by their qualified names, `vendor/class=name`: in its CRI
//! config's `CDI_devices`, and in the values (comma-separated names) of `cdi.k8s.io/*`
//! annotations on the container config or on its pod's sandbox config. Each CreateContainer that
//! asks for one reads the spec dirs again ([`registry`]: `/etc/cdi` then `/var/run/cdi` unless
//! configured, later dirs taking priority), finds every device (an unknown one fails the call
//! with `NotFound`, naming it, the dirs searched and the spec files that could not be read),
//! and applies its spec's and its own `containerEdits` to the OCI spec ([`apply`]).
//!
//! Spec files are JSON (`*.json`) or YAML (`*.yaml`) of CDI versions 0.3.0 to 0.8.0, checked as
//! the reference implementation checks them when it loads them ([`spec`]: unknown fields,
//! fields newer than the declared version, kind and device names, edits).
//!
//! Applied: `env`; `deviceNodes` (the device created in the container, type and numbers read
//! from the host node when the spec leaves them out, and allowed in the device cgroup with the
//! node's `permissions`); `mounts` (a bind's host path must exist: it is not made, unlike a CRI
//! mount's); `additionalGids`; `hooks` run by libcontainer at `createRuntime` (and `prestart`,
//! run there too), `createContainer`, `startContainer` and `poststop`, each with a timeout of
//! at most [`apply::HOOK_TIMEOUT_MAX`] seconds (a hook runs in the pod's sandbox process or the
//! container's init, which serves nothing else meanwhile) and, but for `startContainer`'s,
//! which is the container's, its program present on the host.
//!
//! Refused with an error naming the device and the spec (never ignored): `intelRdt` (no resctrl
//! support here), `netDevices` (CDI 1.1.0), `poststart` hooks (libcontainer runs them after the
//! container's process started and fails the start when one fails, which would leave a running
//! container behind a failed StartContainer), and in a pod user namespace a device node whose
//! host path is not its container path (libcontainer binds the node from the host at that
//! path there).

mod apply;
mod name;
mod registry;
mod spec;

use std::path::PathBuf;

pub use name::{NameError, QualifiedName};

use crate::cri;

/// The spec dirs read when none are configured (the reference implementation's).
pub const DEFAULT_SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// The prefix of the annotations whose values name CDI devices.
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Why a container cannot have the CDI devices it asks for.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadName(String),
    #[error(
        "unresolvable CDI devices {}: not found in {dirs}{}",
        devices.join(", "),
        problems_text(problems)
    )]
    NotFound {
        devices: Vec<String>,
        dirs: String,
        problems: Vec<String>,
    },
    #[error("CDI device {device} is defined by more than one spec of the same dir: {}", specs.join(", "))]
    Conflict { device: String, specs: Vec<String> },
    #[error("{origin}: {reason}")]
    Edit { origin: String, reason: String },
    #[error("{origin}: {what}")]
    Refused { origin: String, what: String },
}

fn problems_text(problems: &[String]) -> String {
    if problems.is_empty() {
        String::new()
    } else {
        format!(
            " (spec files that could not be used: {})",
            problems.join("; ")
        )
    }
}

impl From<Error> for crate::Error {
    fn from(e: Error) -> crate::Error {
        let message = e.to_string();
        match e {
            Error::NotFound { .. } => crate::Error::not_found(message),
            Error::Conflict { .. } => crate::Error::failed_precondition(message),
            Error::BadName(_) | Error::Edit { .. } | Error::Refused { .. } => {
                crate::Error::invalid_argument(message)
            }
        }
    }
}

/// The CDI devices a container asks for, each once, in order: its config's `CDI_devices`, then
/// the `cdi.k8s.io/*` annotations of the container, then the pod's (each in key order).
pub fn requested(
    config: &cri::ContainerConfig,
    pod: &cri::PodSandboxConfig,
) -> Result<Vec<QualifiedName>, Error> {
    let mut out: Vec<QualifiedName> = Vec::new();
    let mut add = |n: QualifiedName| {
        if !out.contains(&n) {
            out.push(n);
        }
    };
    for d in &config.cdi_devices {
        add(QualifiedName::parse(&d.name)
            .map_err(|e| Error::BadName(format!("CDI_devices: {e}")))?);
    }
    for (whose, annotations) in [
        ("container", &config.annotations),
        ("pod", &pod.annotations),
    ] {
        let mut keys: Vec<&String> = annotations
            .keys()
            .filter(|k| k.starts_with(ANNOTATION_PREFIX))
            .collect();
        keys.sort();
        for key in keys {
            for d in annotations[key].split(',') {
                add(QualifiedName::parse(d)
                    .map_err(|e| Error::BadName(format!("{whose} annotation {key}: {e}")))?);
            }
        }
    }
    Ok(out)
}

/// The edits of the CDI devices a container asks for, found in the spec dirs.
#[derive(Debug, Clone, Default)]
pub struct Devices {
    parts: Vec<registry::Part>,
}

impl Devices {
    /// Finds `names` in the spec files of `dirs`, read now; reads nothing when there are none.
    pub fn resolve(dirs: &[PathBuf], names: &[QualifiedName]) -> Result<Devices, Error> {
        if names.is_empty() {
            return Ok(Devices::default());
        }
        let parts = registry::Registry::load(dirs).resolve(names)?;
        Ok(Devices { parts })
    }

    /// Applies the devices' edits to a container's OCI spec.
    pub fn apply(&self, oci: &mut oci_spec::runtime::Spec) -> Result<(), Error> {
        apply::apply(oci, &self.parts)
    }
}

#[cfg(test)]
mod tests;
