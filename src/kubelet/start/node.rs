//! The wiring of a node in a cluster: the node agent (the Node, its status and Lease, the
//! routes to other nodes' pods, the Node's pod CIDRs handed to the runtime) and the pods the
//! API server binds to the node.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::Wiring;
use crate::api::events::EventRecorder;
use crate::kubelet::{mirror, pleg};
use crate::node::{NodeAgent, NodeFacts, RuntimeState};
use crate::sources::{self, PodUpdate};

impl Wiring {
    /// With an API server: the node agent (the Node, its status and Lease); the serving
    /// certificate follows the addresses of the Node it reports.
    pub fn node_agent(
        &mut self,
        facts: &NodeFacts,
        runtime_state: &Arc<RuntimeState>,
        health: &Arc<pleg::PlegHealth>,
        recorder: &EventRecorder,
        shutdown: &Arc<crate::kubelet::shutdown::ShutdownState>,
        eviction: &Arc<crate::kubelet::eviction::EvictionState>,
    ) -> Option<Arc<NodeAgent>> {
        let client = self.client.as_ref()?;
        let (health, shutdown, eviction) = (health.clone(), shutdown.clone(), eviction.clone());
        let agent = Arc::new(NodeAgent::spawn(
            client.clone(),
            &self.cfg,
            facts.clone(),
            runtime_state.clone(),
            self.rt.images.clone(),
            Arc::new(move |h: &mut crate::node::conditions::Health| {
                h.problems.extend(health.problem());
                if shutdown.shutting_down() {
                    h.problems
                        .push(crate::kubelet::shutdown::NOT_READY.to_string());
                }
                use crate::kubelet::eviction::Pressure;
                h.memory_pressure = eviction.has(Pressure::Memory);
                h.disk_pressure = eviction.has(Pressure::Disk);
                h.pid_pressure = eviction.has(Pressure::Pid);
            }),
            crate::node::agent::Reporting {
                events: Some(recorder.clone()),
                devices: self.devices.clone(),
            },
        ));
        // host-gw or vxlan: the other nodes' pod subnets, from every Node.
        let net = &self.cfg.network;
        if let Some(keep) = crate::node::routes::Keep::of(net.routes, net.vxlan, &self.cfg.pod_cidr)
        {
            self.tasks.spawn(crate::node::routes::run(
                client.clone(),
                self.cfg.node_name.clone(),
                keep,
                self.cancel.clone(),
            ));
        }
        // The Node's pod CIDRs go to the runtime as they come.
        self.tasks.spawn(crate::kubelet::pod_cidr::follow(
            self.rt.runtime.clone(),
            agent.manager().subscribe(),
            self.cancel.clone(),
        ));
        if let Some(addresses) = self.serving_addresses.take() {
            let mut nodes = agent.manager().subscribe();
            let cancel = self.cancel.clone();
            self.tasks.spawn(async move {
                loop {
                    let seen = nodes
                        .borrow_and_update()
                        .as_ref()
                        .and_then(|n| n.status.as_ref()?.addresses.clone())
                        .filter(|a| !a.is_empty());
                    if let Some(seen) = seen {
                        addresses.send_if_modified(|a| {
                            let changed = *a != seen;
                            *a = seen;
                            changed
                        });
                    }
                    tokio::select! {
                        changed = nodes.changed() => if changed.is_err() { return },
                        _ = cancel.cancelled() => return,
                    }
                }
            });
        }
        Some(agent)
    }

    /// With an API server: the pods bound to the node, and the mirror pods of static pods.
    pub fn api_source(
        &mut self,
        updates: &mpsc::Sender<PodUpdate>,
        mirrors: watch::Sender<sources::api::MirrorPods>,
    ) -> Option<mirror::MirrorManager> {
        let client = self.client.as_ref()?.clone();
        let node_name = self.cfg.node_name.clone();
        let src = sources::api::ApiSource::new(client.clone(), node_name.clone(), mirrors);
        self.tasks.spawn(src.run(updates.clone()));
        Some(mirror::MirrorManager::new(client, node_name))
    }
}
