//! What configMap, secret, downwardAPI and projected volumes hold: the objects (through the
//! manager's watches), the pod's own fields and service account tokens, as the atomic
//! writer's [`Payload`].

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, Pod, ProjectedVolumeSource, Secret, SecretProjection,
    ServiceAccountTokenProjection,
};

use super::atomic_writer::{self, Payload};
use super::plugins::{self as local, Source};
use super::projection::{self, DEFAULT_MODE, aggregate};
use super::{PluginError, VolumeManager};
use crate::api::tokens::TokenKey;
use crate::model::PodRef;

impl VolumeManager {
    pub(super) async fn config_map(
        &self,
        ns: &str,
        name: &str,
        optional: bool,
    ) -> Result<ConfigMap, PluginError> {
        match self.config_maps.get(ns, name).await? {
            Some(cm) => Ok((*cm).clone()),
            None if optional => Ok(ConfigMap::default()),
            None => Err(PluginError::NotFound {
                kind: "configmap",
                name: name.to_string(),
            }),
        }
    }

    pub(super) async fn secret(
        &self,
        ns: &str,
        name: &str,
        optional: bool,
    ) -> Result<Secret, PluginError> {
        match self.secrets.get(ns, name).await? {
            Some(s) => Ok((*s).clone()),
            None if optional => Ok(Secret::default()),
            None => Err(PluginError::NotFound {
                kind: "secret",
                name: name.to_string(),
            }),
        }
    }

    /// What the volume holds.
    pub(super) async fn payload(
        &self,
        pod: &Pod,
        who: &PodRef,
        src: &Source<'_>,
    ) -> Result<Payload, PluginError> {
        let ns = who.namespace.as_str();
        match src {
            Source::ConfigMap(c) => {
                let default = projection::mode(c.default_mode, DEFAULT_MODE as u32)?;
                let optional = c.optional.unwrap_or(false);
                let cm = self.config_map(ns, &c.name, optional).await?;
                projection::config_map_payload(c.items.as_deref(), &cm, default, optional)
                    .map_err(PluginError::from)
            }
            Source::Secret(s) => {
                let default = projection::mode(s.default_mode, DEFAULT_MODE as u32)?;
                let optional = s.optional.unwrap_or(false);
                let name = s.secret_name.as_deref().unwrap_or("");
                let secret = self.secret(ns, name, optional).await?;
                projection::secret_payload(s.items.as_deref(), &secret, default, optional)
                    .map_err(PluginError::from)
            }
            Source::DownwardApi(d) => {
                let default = projection::mode(d.default_mode, DEFAULT_MODE as u32)?;
                let items = d.items.as_deref().unwrap_or_default();
                projection::downward_api_payload(items, pod, &self.allocatable, default)
                    .map_err(PluginError::from)
            }
            Source::Projected(p) => self.projected(pod, who, p).await,
            _ => Err(PluginError::NotWritten),
        }
    }

    /// A projected volume's payload: its sources in order (a later one's file replaces an
    /// earlier one's at the same path); every source that fails is named in the error.
    async fn projected(
        &self,
        pod: &Pod,
        who: &PodRef,
        p: &ProjectedVolumeSource,
    ) -> Result<Payload, PluginError> {
        let default = projection::mode(p.default_mode, DEFAULT_MODE as u32)?;
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        for s in p.sources.iter().flatten() {
            let part = if let Some(c) = &s.config_map {
                self.projected_config_map(who, c, default).await
            } else if let Some(sec) = &s.secret {
                self.projected_secret(who, sec, default).await
            } else if let Some(d) = &s.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                projection::downward_api_payload(items, pod, &self.allocatable, default)
                    .map_err(PluginError::from)
            } else if let Some(t) = &s.service_account_token {
                self.token_file(pod, who, t, default).await
            } else {
                let what = serde_json::to_value(s)
                    .ok()
                    .and_then(|v| v.as_object().and_then(|o| o.keys().next().cloned()))
                    .unwrap_or_else(|| "an empty source".to_string());
                Err(PluginError::UnsupportedProjection(what))
            };
            match part {
                Ok(files) => payload.extend(files),
                Err(e) => errors.push(e),
            }
        }
        aggregate(errors, PluginError::Sources).map(|()| payload)
    }

    async fn projected_config_map(
        &self,
        who: &PodRef,
        c: &ConfigMapProjection,
        default: u32,
    ) -> Result<Payload, PluginError> {
        let optional = c.optional.unwrap_or(false);
        let cm = self.config_map(&who.namespace, &c.name, optional).await?;
        projection::config_map_payload(c.items.as_deref(), &cm, default, optional)
            .map_err(PluginError::from)
    }

    async fn projected_secret(
        &self,
        who: &PodRef,
        s: &SecretProjection,
        default: u32,
    ) -> Result<Payload, PluginError> {
        let optional = s.optional.unwrap_or(false);
        let secret = self.secret(&who.namespace, &s.name, optional).await?;
        projection::secret_payload(s.items.as_deref(), &secret, default, optional)
            .map_err(PluginError::from)
    }

    /// A service account token for the pod (bound to it) as one file.
    async fn token_file(
        &self,
        pod: &Pod,
        who: &PodRef,
        t: &ServiceAccountTokenProjection,
        mode: u32,
    ) -> Result<Payload, PluginError> {
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .ok_or(PluginError::NoServiceAccount)?;
        let key = TokenKey {
            namespace: who.namespace.clone(),
            service_account: sa.to_string(),
            audiences: t
                .audience
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            expiration_seconds: t.expiration_seconds,
            pod_name: who.name.clone(),
            pod_uid: who.uid.clone(),
        };
        let token = self.tokens.token(&key).await?;
        // With an fsGroup, the token is the owner's and the group's only (upstream's 0600,
        // then the group's read bit).
        let mode = match local::fs_group(pod)? {
            Some(_) => 0o600,
            None => mode,
        };
        Ok(Payload::from([(
            t.path.clone(),
            atomic_writer::FileProjection {
                data: token.into_bytes(),
                mode,
            },
        )]))
    }
}
