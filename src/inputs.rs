//! What a pod's containers read from the API server besides their volumes, once per sync
//! (upstream's kubelet reads them in `GenerateRunContainerOptions` and the image puller's
//! keyring): the ConfigMaps and Secrets their environments reference, the Services' variables,
//! and the pod's image pull secrets. Read through the object managers the volume manager
//! registers each pod's references with, so one watch serves volumes and environments alike.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};

use crate::model::{PodRef, env_references, is_api_pod};
use crate::pod::env::EnvObjects;
use crate::volumes::VolumeManager;

/// Reads a pod's inputs.
#[derive(Clone)]
pub struct PodInputs {
    objects: Arc<VolumeManager>,
}

impl PodInputs {
    /// A reader over the objects `volumes` registers.
    pub fn new(volumes: Arc<VolumeManager>) -> Self {
        PodInputs { objects: volumes }
    }

    /// The pod's `imagePullSecrets` as they are now (registered with its last
    /// [`VolumeManager::set_up`]), and the names of those that could not be read.
    pub async fn pull_secrets(&self, pod: &Pod, who: &PodRef) -> (Vec<Secret>, Vec<String>) {
        let ns = who.namespace.as_str();
        let (mut found, mut failed) = (Vec::new(), Vec::new());
        let refs = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref());
        for r in refs.into_iter().flatten().filter(|r| !r.name.is_empty()) {
            match self.objects.secrets().get(ns, &r.name).await {
                Ok(Some(s)) => found.push((*s).clone()),
                Ok(None) | Err(_) => failed.push(r.name.clone()),
            }
        }
        (found, failed)
    }

    /// The ConfigMaps and Secrets the environments of `pod`'s containers reference, read now
    /// (the pod registered them with its last [`VolumeManager::set_up`]), and its service variables.
    pub async fn env_objects(&self, pod: &Pod, who: &PodRef) -> EnvObjects {
        let ns = who.namespace.as_str();
        let (cms, secrets) = env_references(pod);
        let mut out = EnvObjects {
            allocatable: self.objects.allocatable().clone(),
            ..Default::default()
        };
        // As upstream: a pod from the API server waits for the Services' first list.
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let wait = is_api_pod(pod);
        match self.objects.services().env(ns, links, wait).await {
            Ok(env) => out.service_env = env,
            Err(e) => out.service_env_error = Some(e),
        }
        for name in cms {
            let read = self.objects.config_maps().get(ns, &name).await;
            let data = read.map(|o| o.map(|cm| cm.data.clone().unwrap_or_default()));
            out.config_maps.insert(name, data);
        }
        for name in secrets {
            let read = self.objects.secrets().get(ns, &name).await;
            let data = read.map(|o| {
                o.map(|s| {
                    s.data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect()
                })
            });
            out.secrets.insert(name, data);
        }
        out
    }
}
