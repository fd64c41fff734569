//! The device manager's checkpoint, `<root>/device-plugins/kubelet_internal_checkpoint`, in
//! upstream's JSON shape: `{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName",
//! "ResourceName", "DeviceIDs": {"<NUMA node>": [ids]}, "AllocResp": <the plugin's answer,
//! protobuf, base64>}], "RegisteredDevices": {resource: [ids]}}, "Checksum": n}`.
//!
//! The checksum is upstream's (`checksum.rs`), so the file is the upstream kubelet's in both
//! directions. Devices held without an answer (rebuilt from a running container) are written
//! with an empty `AllocResp`.

mod checksum;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::api::v1beta1::ContainerAllocateResponse;
use super::state::{Allocation, State};

/// The file's name in the device plugin directory (upstream's).
pub const FILE: &str = "kubelet_internal_checkpoint";

/// NUMA node key for devices without topology (upstream's `nodeless`).
const NO_NUMA: &str = "-1";

#[derive(Debug, Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: serde_json::Value,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Data {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Vec<Entry>,
    #[serde(rename = "RegisteredDevices", default)]
    registered: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs")]
    ids: BTreeMap<String, Vec<String>>,
    #[serde(rename = "AllocResp", default)]
    response: String,
}

/// A checkpoint that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a device manager checkpoint: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} is corrupt: its checksum is {found}, its data's is {computed}")]
    Checksum {
        path: PathBuf,
        found: u64,
        computed: u64,
    },
    #[error("{path}: the plugin answer for pod {pod} container {container} is corrupt: {why}")]
    Answer {
        path: PathBuf,
        pod: String,
        container: String,
        why: String,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes what `state` holds (the pods' devices with their answers, and the devices each
/// resource has) to `path`, atomically (a temporary file renamed over it).
pub fn write(path: &Path, state: &State) -> Result<(), CheckpointError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut data = Data::default();
    for (uid, containers) in &state.pods {
        for (container, resources) in containers {
            for (resource, alloc) in resources {
                // Devices without an answer yet (rebuilt from a container, or Allocate under
                // way) are written with an empty one: held, asked for again when needed.
                let response = alloc
                    .response
                    .as_ref()
                    .map(|r| b64.encode(r.encode_to_vec()))
                    .unwrap_or_default();
                data.entries.push(Entry {
                    pod_uid: uid.clone(),
                    container: container.clone(),
                    resource: resource.clone(),
                    ids: BTreeMap::from([(NO_NUMA.to_string(), alloc.ids.clone())]),
                    response,
                });
            }
        }
    }
    for (resource, devices) in &state.devices {
        data.registered
            .insert(resource.clone(), devices.keys().cloned().collect());
    }
    let write_err = |source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    };
    let data_value = serde_json::to_value(&data).map_err(|e| write_err(e.into()))?;
    let checksum = checksum::checksum(&data_value).unwrap_or_default();
    let body = serde_json::to_vec(&File {
        data: data_value,
        checksum,
    })
    .map_err(|e| write_err(e.into()))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(write_err)?;
    f.write_all(&body).map_err(write_err)?;
    f.sync_all().map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
}

/// What a checkpoint held: the pods' devices with their answers, and the devices each
/// resource had (their health unknown until the plugin is back).
#[derive(Debug, Default)]
pub struct Restored {
    pub pods: BTreeMap<String, super::state::PodDevices>,
    pub registered: BTreeMap<String, Vec<String>>,
}

/// Reads the checkpoint at `path`: `Ok(None)` when there is none.
pub fn read(path: &Path) -> Result<Option<Restored>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let parse = |source| CheckpointError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let file: File = serde_json::from_slice(&bytes).map_err(parse)?;
    let data: Data = serde_json::from_value(file.data.clone()).map_err(parse)?;
    let computed = checksum::checksum(&file.data).unwrap_or_default();
    if computed != file.checksum {
        return Err(CheckpointError::Checksum {
            path: path.to_path_buf(),
            found: file.checksum,
            computed,
        });
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Restored {
        registered: data.registered,
        ..Default::default()
    };
    for e in data.entries {
        let answer_err = |why: String| CheckpointError::Answer {
            path: path.to_path_buf(),
            pod: e.pod_uid.clone(),
            container: e.container.clone(),
            why,
        };
        let resp = if e.response.is_empty() {
            None
        } else {
            let raw = b64
                .decode(e.response.as_bytes())
                .map_err(|err| answer_err(err.to_string()))?;
            let resp = ContainerAllocateResponse::decode(raw.as_slice())
                .map_err(|err| answer_err(err.to_string()))?;
            Some(resp)
        };
        let ids: Vec<String> = e.ids.into_values().flatten().collect();
        out.pods
            .entry(e.pod_uid.clone())
            .or_default()
            .entry(e.container.clone())
            .or_default()
            .insert(
                e.resource.clone(),
                Allocation {
                    ids,
                    response: resp,
                },
            );
    }
    Ok(Some(out))
}

/// Moves a checkpoint that could not be used aside (`<file>.corrupt-<unix seconds>`), so the
/// next one is written fresh and the old one can still be looked at.
pub fn set_aside(path: &Path) -> Option<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".corrupt-{secs}"));
    let aside = PathBuf::from(name);
    std::fs::rename(path, &aside).ok().map(|()| aside)
}
