//! persistentVolumeClaim volumes: the claim and its PersistentVolume read on each sync, checked
//! bound to each other as upstream's desired state populator does, and resolved to the path of
//! a `hostPath` or `local` PersistentVolume; other types are refused.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod,
};
use kube::Api;

use super::error::ClaimError;
use super::plugins::{self as local, MountedVolume};
use super::{PluginError, VolumeManager};
use crate::model::PodRef;

/// How long a sync waits for one API request of a volume (a claim, its volume).
const API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The fields of a PersistentVolume's spec that are not its source.
const PV_SPEC_FIELDS: [&str; 8] = [
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeMode",
];

/// Reads the object `name` through `api` within [`API_TIMEOUT`]; `what` names it in errors.
async fn fetch<K>(api: &Api<K>, name: &str, what: String) -> Result<K, ClaimError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(API_TIMEOUT, api.get(name)).await {
        Err(_) => Err(ClaimError::Timeout { what }),
        Ok(Err(e)) => Err(ClaimError::Fetch {
            what,
            source: Box::new(e),
        }),
        Ok(Ok(o)) => Ok(o),
    }
}

impl VolumeManager {
    /// A persistentVolumeClaim resolved as upstream's desired state populator does (the claim
    /// bound, its PersistentVolume claimed by it), to the path of a `hostPath` (type checked as
    /// a hostPath volume's) or `local` PersistentVolume; other types are refused.
    pub(super) async fn claim(
        &self,
        pod: &Pod,
        who: &PodRef,
        c: &PersistentVolumeClaimVolumeSource,
    ) -> Result<MountedVolume, PluginError> {
        let (pv_name, spec) = self
            .bound_volume(who, &c.claim_name)
            .await
            .map_err(|source| PluginError::Claim {
                namespace: who.namespace.clone(),
                name: c.claim_name.clone(),
                source,
            })?;
        if spec.volume_mode.as_deref() == Some("Block") {
            return Err(PluginError::BlockVolume(pv_name));
        }
        let path = if let Some(h) = &spec.host_path {
            local::check_host_path(&h.path, h.type_.as_deref().unwrap_or(""))?;
            PathBuf::from(&h.path)
        } else if let Some(l) = &spec.local {
            let p = PathBuf::from(&l.path);
            if !p.exists() {
                return Err(PluginError::LocalPathMissing(l.path.clone()));
            }
            // A local volume is given to the pod's fsGroup when the pod first mounts it (a
            // hostPath one never is), as upstream's local plugin.
            let read_only = c.read_only.unwrap_or(false);
            self.own_once(pod, who, &pv_name, &p, read_only)?;
            p
        } else {
            return Err(PluginError::UnsupportedVolume {
                volume: pv_name,
                what: volume_type(&spec),
            });
        };
        Ok(MountedVolume {
            path,
            read_only: c.read_only.unwrap_or(false),
        })
    }

    /// The claim `name` of the pod's namespace, bound, and its PersistentVolume claimed by it:
    /// the volume's name and spec.
    async fn bound_volume(
        &self,
        who: &PodRef,
        name: &str,
    ) -> Result<(String, k8s_openapi::api::core::v1::PersistentVolumeSpec), ClaimError> {
        let client = self.client.as_ref().ok_or(ClaimError::Standalone)?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &who.namespace);
        let pvc = fetch(&claims, name, "PVC".into()).await?;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(ClaimError::Deleting);
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err(ClaimError::NotBound);
        }
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty())
            .ok_or(ClaimError::NoVolumeName)?;
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pv = fetch(&pvs, &pv_name, format!("PV {pv_name}")).await?;
        let spec = pv.spec.unwrap_or_default();
        let claim_uid = pvc.metadata.uid.clone().unwrap_or_default();
        match spec
            .claim_ref
            .as_ref()
            .map(|r| r.uid.clone().unwrap_or_default())
        {
            None => Err(ClaimError::VolumeUnbound(pv_name)),
            Some(uid) if uid != claim_uid => Err(ClaimError::VolumeOfOtherClaim {
                volume: pv_name,
                uid,
                claim_uid,
            }),
            Some(_) => Ok((pv_name, spec)),
        }
    }
}

/// The type of a PersistentVolume's source, by its API field name (`with no source` when it
/// names none).
fn volume_type(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> String {
    serde_json::to_value(spec)
        .ok()
        .and_then(|v| {
            v.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !PV_SPEC_FIELDS.contains(&k.as_str()))
                    .cloned()
            })
        })
        .unwrap_or_else(|| "with no source".to_string())
}
