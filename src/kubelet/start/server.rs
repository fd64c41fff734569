//! The kubelet server's wiring: the HTTPS API on 10250 with healthz on 10248, and the
//! serving certificate that `serverTLSBootstrap` gets and renews through CSRs.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::{PodsSender, Wiring, health_check};
use crate::kubelet::pleg;
use crate::status_manager::StatusManager;

impl Wiring {
    /// The kubelet server (10250) and healthz (10248): the port bound, and where the sync loop
    /// publishes the pods the server lists.
    pub async fn server(
        &mut self,
        node_ips: Vec<IpAddr>,
        status: &Arc<StatusManager>,
        health: &Arc<pleg::PlegHealth>,
        sync_health: &Arc<crate::kubelet::notify::SyncLoopHealth>,
    ) -> Result<(u16, PodsSender), crate::server::Error> {
        let (pods_tx, pods_rx) = watch::channel(Arc::new(Vec::new()));
        let serving = self.serving_certificate(&node_ips)?;
        let cfg = &self.cfg;
        let deps = crate::server::ServerDeps {
            cfg: cfg.server.clone(),
            node_name: cfg.node_name.clone(),
            node_ips,
            root_dir: cfg.root_dir.clone(),
            cert_dir: cfg.cert_dir(),
            serving,
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            client: self.client.clone(),
            rt: self.rt.runtime.clone(),
            images: self.rt.images.clone(),
            pods: pods_rx,
            status: status.clone(),
            configz: cfg.to_v1beta1(),
            system_log_dir: std::path::PathBuf::from("/var/log"),
            health: {
                let check = health_check(health, sync_health.clone());
                Arc::new(move || check().map_or(Ok(()), |p| Err(crate::server::Unhealthy(p))))
            },
        };
        let bound = crate::server::start(deps, &mut self.tasks, self.cancel.clone()).await?;
        crate::metrics::get()
            .node_name
            .get_or_create(&crate::metrics::NodeName {
                node: cfg.node_name.clone(),
            })
            .set(1);
        Ok((bound.port, pods_tx))
    }

    /// With `serverTLSBootstrap` (and no `tlsCertFile`): the slot the server reads its
    /// certificate from, filled and renewed by its own task through CSRs.
    fn serving_certificate(
        &mut self,
        node_ips: &[IpAddr],
    ) -> Result<Option<Arc<crate::certificate::ServingSlot>>, crate::server::Error> {
        let cfg = &self.cfg;
        if !cfg.server.tls_bootstrap || cfg.server.tls_cert_file.is_some() {
            return Ok(None);
        }
        let Some(client) = self.client.clone() else {
            return Err(crate::server::Error::TlsBootstrapStandalone);
        };
        let slot = Arc::new(crate::certificate::ServingSlot::default());
        let store = crate::certificate::CertStore::new(
            &cfg.cert_dir(),
            crate::certificate::serving::SERVER_PREFIX,
        );
        // The addresses this node will report, until the Node's own are seen.
        let own = crate::node::own_addresses(&cfg.node_name, node_ips);
        let own = crate::node::reported_addresses(cfg, Some(own), None).unwrap_or_default();
        let (addresses, watched) = watch::channel(own);
        self.serving_addresses = Some(addresses);
        let task = crate::certificate::serving::run(
            slot.clone(),
            store,
            client,
            cfg.node_name.clone(),
            watched,
        );
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = task => {}
                _ = cancel.cancelled() => {}
            }
        });
        Ok(Some(slot))
    }
}
