//! Giving an admitted pod's containers their devices: the choice (reused, preferred, by ID),
//! the plugins' `Allocate` and `PreStartContainer` calls, and what the containers' CRI configs
//! get from the answers.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use runtime::cri;

use super::{ANNOTATION_DEVICES, DeviceError, DeviceManager, RunOptions, state};
use crate::util::lock;

impl DeviceManager {
    /// Gives each container of `pod` the devices it asks for (see the module documentation)
    /// and returns, by container name, what their CRI configs get.
    pub async fn allocate(&self, pod: &Pod) -> Result<BTreeMap<String, RunOptions>, DeviceError> {
        let uid = crate::sources::pod_uid(pod).to_string();
        let demands = {
            let st = lock(&self.inner.state);
            state::demands(pod, |r| st.is_device_resource(r))
        };
        if demands.is_empty() {
            return Ok(BTreeMap::new());
        }
        let init: BTreeSet<String> = demands
            .iter()
            .filter(|d| d.init)
            .map(|d| d.container.clone())
            .collect();
        for d in &demands {
            for resource in d.counts.keys() {
                self.allocate_one(&uid, d, resource, &init).await?;
            }
        }
        Ok(self.run_options(&uid))
    }

    async fn allocate_one(
        &self,
        uid: &str,
        d: &state::Demand,
        resource: &str,
        init: &BTreeSet<String>,
    ) -> Result<(), DeviceError> {
        let held = lock(&self.inner.state)
            .pods
            .get(uid)
            .and_then(|p| p.get(&d.container))
            .is_some_and(|c| c.contains_key(resource));
        // Held already, answered or not (rebuilt from a running container: its answer is
        // asked for again only when the container is made again, see `start_options`).
        if held {
            return Ok(());
        }
        let ids = self.choose(uid, d, resource, init).await?;
        let plugin = match self.plugin(resource) {
            Some(p) => p,
            None => {
                lock(&self.inner.state).give_back(uid, &d.container, resource);
                return Err(DeviceError::NoPlugin(resource.to_string()));
            }
        };
        match plugin.allocate(&ids).await {
            Ok(resp) => {
                lock(&self.inner.state).answered(uid, &d.container, resource, resp);
                self.save();
                Ok(())
            }
            Err(e) => {
                lock(&self.inner.state).give_back(uid, &d.container, resource);
                Err(e)
            }
        }
    }

    /// Chooses and holds the devices of `resource` for one container: the plugin's preferred
    /// ones when it offers a preference.
    async fn choose(
        &self,
        uid: &str,
        d: &state::Demand,
        resource: &str,
        init: &BTreeSet<String>,
    ) -> Result<Vec<String>, DeviceError> {
        let n = d.counts.get(resource).copied().unwrap_or(0);
        let mut preferred = Vec::new();
        if let Some(plugin) = self.plugin(resource).filter(|p| p.prefers()) {
            let (available, must) = {
                let st = lock(&self.inner.state);
                let must: Vec<String> = st
                    .reusable(uid, resource, init)
                    .into_iter()
                    .take(n)
                    .collect();
                let mut available = st.free(resource);
                available.extend(must.iter().cloned());
                (available, must)
            };
            match plugin.preferred(&available, &must, n).await {
                Ok(p) => preferred = p,
                // Only a preference: allocation goes on without it.
                Err(e) => tracing::warn!(resource, "{e}; allocating without a preference"),
            }
        }
        lock(&self.inner.state)
            .take(uid, d, resource, init, &preferred)
            .map_err(DeviceError::Shortage)
    }

    /// What each container of pod `uid` gets from its devices' answers: envs, mounts and
    /// device nodes (the first answer for a name or path wins), annotations, CDI devices,
    /// and the annotation recording its devices.
    pub fn run_options(&self, uid: &str) -> BTreeMap<String, RunOptions> {
        let st = lock(&self.inner.state);
        let mut out = BTreeMap::new();
        for (container, resources) in st.pods.get(uid).into_iter().flatten() {
            let mut o = RunOptions::default();
            let mut record = BTreeMap::new();
            for (resource, alloc) in resources {
                record.insert(resource.clone(), alloc.ids.clone());
                let Some(resp) = &alloc.response else {
                    continue;
                };
                let sorted = |m: &std::collections::HashMap<String, String>| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<BTreeMap<_, _>>()
                };
                for (k, v) in sorted(&resp.envs) {
                    if !o.envs.iter().any(|(e, _)| *e == k) {
                        o.envs.push((k, v));
                    }
                }
                for m in &resp.mounts {
                    if !o
                        .mounts
                        .iter()
                        .any(|x| x.container_path == m.container_path)
                    {
                        o.mounts.push(cri::Mount {
                            container_path: m.container_path.clone(),
                            host_path: m.host_path.clone(),
                            readonly: m.read_only,
                            ..Default::default()
                        });
                    }
                }
                for dev in &resp.devices {
                    if !o
                        .devices
                        .iter()
                        .any(|x| x.container_path == dev.container_path)
                    {
                        o.devices.push(cri::Device {
                            container_path: dev.container_path.clone(),
                            host_path: dev.host_path.clone(),
                            permissions: dev.permissions.clone(),
                        });
                    }
                }
                for (k, v) in sorted(&resp.annotations) {
                    if !o.annotations.iter().any(|(a, _)| *a == k) {
                        o.annotations.push((k, v));
                    }
                }
                for c in &resp.cdi_devices {
                    if !o.cdi_devices.contains(&c.name) {
                        o.cdi_devices.push(c.name.clone());
                    }
                }
            }
            if let Ok(json) = serde_json::to_string(&record) {
                o.annotations.push((ANNOTATION_DEVICES.to_string(), json));
            }
            out.insert(container.clone(), o);
        }
        out
    }

    /// What `container` of pod `uid` is made with, right before it is (again): the plugins'
    /// answers asked for again where the devices were rebuilt from a running container
    /// (the devices stay held if that fails), then `PreStartContainer` for each device
    /// resource whose plugin asks for it (upstream's 30 s deadline).
    pub async fn start_options(
        &self,
        uid: &str,
        container: &str,
    ) -> Result<RunOptions, DeviceError> {
        let held: Vec<(String, state::Allocation)> = lock(&self.inner.state)
            .pods
            .get(uid)
            .and_then(|p| p.get(container))
            .into_iter()
            .flatten()
            .map(|(r, a)| (r.clone(), a.clone()))
            .collect();
        for (resource, alloc) in held {
            let plugin = self
                .plugin(&resource)
                .ok_or_else(|| DeviceError::NoPlugin(resource.clone()))?;
            if alloc.response.is_none() {
                let resp = plugin.allocate(&alloc.ids).await?;
                lock(&self.inner.state).answered(uid, container, &resource, resp);
                self.save();
            }
            if plugin.pre_start_required() {
                plugin.pre_start(&alloc.ids).await?;
            }
        }
        Ok(self.run_options(uid).remove(container).unwrap_or_default())
    }
}
