//! The device manager's state (upstream's `healthyDevices`, `allocatedDevices`, `podDevices`
//! and `devicesToReuse`): the devices each plugin advertises, which container holds which
//! devices with the plugin's answer, and what admitted pods reserved but have not allocated
//! yet. Pure: no I/O, no RPC; the manager holds it under a mutex and never across an await.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::api::v1beta1::ContainerAllocateResponse;

/// One advertised device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub healthy: bool,
    /// The NUMA nodes the plugin says the device is close to.
    pub numa: Vec<i64>,
}

/// The devices of one resource that one container holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    pub ids: Vec<String>,
    /// The plugin's `Allocate` answer for them; `None` while the call is under way.
    pub response: Option<ContainerAllocateResponse>,
}

/// Container name → resource → its devices.
pub type PodDevices = BTreeMap<String, BTreeMap<String, Allocation>>;

/// What one container of a pod asks for, in the order upstream allocates (init containers
/// first, in order, then the others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub container: String,
    /// An init container that runs to completion before the next: the devices it held can
    /// be given to the containers after it. Sidecars (restartable init containers) keep
    /// theirs, like app containers.
    pub init: bool,
    /// Resource → count (the container's limit; requests equal limits for these resources).
    pub counts: BTreeMap<String, usize>,
}

/// The containers of `pod` in allocation order with what they ask of the resources
/// `is_device` accepts; containers that ask for none are left out.
pub fn demands(pod: &Pod, is_device: impl Fn(&str) -> bool) -> Vec<Demand> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let init = spec.init_containers.iter().flatten().map(|c| {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        (c, !sidecar)
    });
    let app = spec.containers.iter().map(|c| (c, false));
    init.chain(app)
        .filter_map(|(c, init)| {
            let counts = device_counts(c, &is_device);
            (!counts.is_empty()).then(|| Demand {
                container: c.name.clone(),
                init,
                counts,
            })
        })
        .collect()
}

/// What a container asks of each device resource: its limit (the API server makes requests
/// of extended resources equal to their limits).
fn device_counts(c: &Container, is_device: &impl Fn(&str) -> bool) -> BTreeMap<String, usize> {
    let res = c.resources.as_ref();
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());
    let mut out = BTreeMap::new();
    for (name, q) in limits.into_iter().chain(requests).flatten() {
        if !is_device(name) || out.contains_key(name) {
            continue;
        }
        // Validated by the API server as an integer; anything else counts as nothing.
        let n = q.0.trim().parse::<usize>().unwrap_or(0);
        if n > 0 {
            out.insert(name.clone(), n);
        }
    }
    out
}

/// Why devices could not be given: upstream's words, which admission and the pod's events
/// carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortage {
    /// Fewer free healthy devices than asked for.
    Unavailable {
        resource: String,
        requested: usize,
        available: usize,
    },
    /// A container already holds a different number of devices than it asks for now.
    Changed {
        container: String,
        resource: String,
        held: usize,
        requested: usize,
    },
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortage::Unavailable {
                resource,
                requested,
                available,
            } => write!(
                f,
                "requested number of devices unavailable for {resource}. Requested: \
                 {requested}, Available: {available}"
            ),
            Shortage::Changed {
                container,
                resource,
                held,
                requested,
            } => write!(
                f,
                "container {container:?} changed its request for resource {resource:?} from \
                 {held} to {requested}"
            ),
        }
    }
}

/// The whole state.
#[derive(Debug, Default)]
pub struct State {
    /// Resource → device ID → device, as the plugin's last `ListAndWatch` answer gave them.
    pub devices: BTreeMap<String, BTreeMap<String, Device>>,
    /// Pod UID → what its containers hold.
    pub pods: BTreeMap<String, PodDevices>,
    /// Pod UID → resource → devices admission counted for the pod that it has not taken yet.
    pub reserved: BTreeMap<String, BTreeMap<String, usize>>,
}

impl State {
    /// Whether `resource` is one a plugin advertises or advertised (its devices may still be
    /// held by pods).
    pub fn is_device_resource(&self, resource: &str) -> bool {
        self.devices.contains_key(resource)
            || self
                .pods
                .values()
                .flat_map(|p| p.values())
                .any(|c| c.contains_key(resource))
    }

    /// The devices of `resource` some container holds.
    fn held(&self, resource: &str) -> BTreeSet<&str> {
        self.pods
            .values()
            .flat_map(|p| p.values())
            .filter_map(|c| c.get(resource))
            .flat_map(|a| a.ids.iter().map(String::as_str))
            .collect()
    }

    /// How many devices of each resource pods hold.
    pub fn held_counts(&self) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for c in self.pods.values().flat_map(|p| p.values()) {
            for (r, a) in c {
                out.entry(r.clone())
                    .or_default()
                    .extend(a.ids.iter().map(String::as_str));
            }
        }
        out.into_iter().map(|(r, ids)| (r, ids.len())).collect()
    }

    /// Healthy devices of `resource` nobody holds, by ID.
    pub fn free(&self, resource: &str) -> Vec<String> {
        let held = self.held(resource);
        self.devices
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|(id, d)| d.healthy && !held.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// What other pods have reserved of `resource` and not taken yet.
    fn reserved_by_others(&self, uid: &str, resource: &str) -> usize {
        self.reserved
            .iter()
            .filter(|(u, _)| u.as_str() != uid)
            .filter_map(|(_, r)| r.get(resource))
            .sum()
    }

    /// Admission (upstream's `devicesToAllocate` over counts): walks the pod's containers as
    /// allocation will, init containers' devices reusable by the containers after them, and
    /// reserves what the pod needs beyond what it holds; the first container that cannot
    /// get its devices refuses the pod.
    pub fn reserve(&mut self, uid: &str, demands: &[Demand]) -> Result<(), Shortage> {
        let mut free: BTreeMap<&str, usize> = BTreeMap::new();
        let mut reusable: BTreeMap<&str, usize> = BTreeMap::new();
        let mut taking: BTreeMap<String, usize> = BTreeMap::new();
        let held = self.pods.get(uid);
        for d in demands {
            for (resource, &n) in &d.counts {
                let has = held
                    .and_then(|p| p.get(&d.container))
                    .and_then(|c| c.get(resource))
                    .map_or(0, |a| a.ids.len());
                if has == n {
                    if d.init {
                        *reusable.entry(resource).or_default() += n;
                    }
                    continue;
                }
                if has != 0 {
                    return Err(Shortage::Changed {
                        container: d.container.clone(),
                        resource: resource.clone(),
                        held: has,
                        requested: n,
                    });
                }
                let from_reuse = reusable.get(resource.as_str()).copied().unwrap_or(0).min(n);
                let needed = n - from_reuse;
                let avail = *free.entry(resource).or_insert_with(|| {
                    self.free(resource)
                        .len()
                        .saturating_sub(self.reserved_by_others(uid, resource))
                });
                if needed > avail {
                    return Err(Shortage::Unavailable {
                        resource: resource.clone(),
                        requested: needed,
                        available: avail,
                    });
                }
                free.insert(resource, avail - needed);
                *taking.entry(resource.clone()).or_default() += needed;
                let r = reusable.entry(resource).or_default();
                if d.init {
                    *r += needed;
                } else {
                    *r -= from_reuse;
                }
            }
        }
        taking.retain(|_, n| *n > 0);
        if taking.is_empty() {
            self.reserved.remove(uid);
        } else {
            self.reserved.insert(uid.to_string(), taking);
        }
        Ok(())
    }

    /// The devices of `resource` the pod's init containers held that its later containers
    /// have not taken: given first to the next container (upstream's `devicesToReuse`).
    pub fn reusable(&self, uid: &str, resource: &str, init: &BTreeSet<String>) -> Vec<String> {
        let Some(pod) = self.pods.get(uid) else {
            return Vec::new();
        };
        let ids = |want_init: bool| -> BTreeSet<&String> {
            pod.iter()
                .filter(|(c, _)| init.contains(*c) == want_init)
                .filter_map(|(_, r)| r.get(resource))
                .flat_map(|a| a.ids.iter())
                .collect()
        };
        let taken = ids(false);
        ids(true)
            .into_iter()
            .filter(|id| !taken.contains(id))
            .cloned()
            .collect()
    }

    /// Gives `container` of pod `uid` `n` devices of `resource`: the pod's reusable ones
    /// first, then those of `preferred` that are free, then free ones by ID. They are held
    /// from now on, with no answer yet; the pod's reservation shrinks by the new ones.
    pub fn take(
        &mut self,
        uid: &str,
        demand: &Demand,
        resource: &str,
        init: &BTreeSet<String>,
        preferred: &[String],
    ) -> Result<Vec<String>, Shortage> {
        let n = demand.counts.get(resource).copied().unwrap_or(0);
        let mut chosen: Vec<String> = self
            .reusable(uid, resource, init)
            .into_iter()
            .take(n)
            .collect();
        let reused = chosen.len();
        let free = self.free(resource);
        let own = self
            .reserved
            .get(uid)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0);
        // Devices other pods reserved stay theirs: only as many free ones as are not
        // reserved by others (this pod's own reservation is what it takes now).
        let others = self.reserved_by_others(uid, resource);
        let available = free.len().saturating_sub(others);
        let needed = n - reused;
        if needed > available {
            return Err(Shortage::Unavailable {
                resource: resource.to_string(),
                requested: needed,
                available,
            });
        }
        let free_set: BTreeSet<&String> = free.iter().collect();
        for id in preferred.iter().chain(free.iter()) {
            if chosen.len() == n {
                break;
            }
            if free_set.contains(id) && !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        if let Some(r) = self.reserved.get_mut(uid) {
            if let Some(left) = r.get_mut(resource) {
                *left = left.saturating_sub(needed.min(own));
            }
            r.retain(|_, n| *n > 0);
            if r.is_empty() {
                self.reserved.remove(uid);
            }
        }
        self.pods
            .entry(uid.to_string())
            .or_default()
            .entry(demand.container.clone())
            .or_default()
            .insert(
                resource.to_string(),
                Allocation {
                    ids: chosen.clone(),
                    response: None,
                },
            );
        Ok(chosen)
    }

    /// Records the plugin's answer for the devices `container` of pod `uid` holds.
    pub fn answered(
        &mut self,
        uid: &str,
        container: &str,
        resource: &str,
        response: ContainerAllocateResponse,
    ) {
        if let Some(a) = self
            .pods
            .get_mut(uid)
            .and_then(|p| p.get_mut(container))
            .and_then(|c| c.get_mut(resource))
        {
            a.response = Some(response);
        }
    }

    /// Gives back what `container` of pod `uid` holds of `resource` (its `Allocate` failed).
    pub fn give_back(&mut self, uid: &str, container: &str, resource: &str) {
        if let Some(p) = self.pods.get_mut(uid) {
            if let Some(c) = p.get_mut(container) {
                c.remove(resource);
                if c.is_empty() {
                    p.remove(container);
                }
            }
            if p.is_empty() {
                self.pods.remove(uid);
            }
        }
    }

    /// Keeps only the pods `keep` accepts (devices of pods that ended are free again);
    /// returns whether anything was dropped.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) -> bool {
        let before = self.pods.len() + self.reserved.len();
        self.pods.retain(|uid, _| keep(uid));
        self.reserved.retain(|uid, _| keep(uid));
        before != self.pods.len() + self.reserved.len()
    }

    /// Capacity (every advertised device) and allocatable (the healthy ones) per resource.
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        self.devices
            .iter()
            .map(|(r, devs)| {
                let healthy = devs.values().filter(|d| d.healthy).count();
                let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
                (r.clone(), (count(devs.len()), count(healthy)))
            })
            .collect()
    }

    /// Marks every device of `resource` unhealthy (its plugin went away).
    pub fn all_unhealthy(&mut self, resource: &str) {
        for d in self
            .devices
            .entry(resource.to_string())
            .or_default()
            .values_mut()
        {
            d.healthy = false;
        }
    }
}

#[cfg(test)]
mod tests;
