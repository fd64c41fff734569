//! The Services of the cluster, for the service environment variables of containers (upstream's
//! service lister and `getServiceEnvVarMap`, `envvars.FromServices`, behaviour only): every
//! Service with a cluster IP in the pod's namespace when `enableServiceLinks` (the default),
//! and the `kubernetes` Service of `default` always, as `<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT` (and `_<PORT NAME>` for named ports) and the Docker link variables
//! (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}`).
//!
//! Services are kept by one cluster-wide watch (as upstream's informer). Until its first list is
//! done, a pod from the API server gets no environment (its containers wait, as upstream), so
//! that `KUBERNETES_SERVICE_HOST`, which in-cluster clients need, is never missed.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// How long an environment waits for the first list of Services.
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a pod's service environment could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServicesError {
    /// The first list of Services did not finish within [`SYNC_TIMEOUT`] (upstream's message).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    NotRead,
}

/// The Services the node has read, if it has an API server.
#[derive(Clone, Default)]
pub struct Services {
    store: Option<Store<Service>>,
}

impl Services {
    /// Starts watching every Service through `client` until `cancel` (nothing without one).
    pub fn start(client: Option<Client>, cancel: CancellationToken) -> Self {
        let Some(client) = client else {
            return Services::default();
        };
        let (reader, writer) = reflector::store();
        let api: Api<Service> = Api::all(client);
        let stream =
            reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
                .default_backoff();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    item = stream.next() => match item {
                        None => return,
                        Some(Err(e)) => tracing::warn!("watching services: {e}"),
                        Some(Ok(_)) => {}
                    },
                }
            }
        });
        Services {
            store: Some(reader),
        }
    }

    /// The service environment of a pod in `namespace`. `wait` waits for the first list (a pod
    /// from the API server); without it, what has been read so far is used (static pods).
    pub async fn env(
        &self,
        namespace: &str,
        links: bool,
        wait: bool,
    ) -> Result<BTreeMap<String, String>, ServicesError> {
        let Some(store) = &self.store else {
            return Ok(BTreeMap::new());
        };
        if wait
            && tokio::time::timeout(SYNC_TIMEOUT, store.wait_until_ready())
                .await
                .map_or(true, |r| r.is_err())
        {
            return Err(ServicesError::NotRead);
        }
        Ok(service_env(&store.state(), namespace, links))
    }
}

fn has_cluster_ip(s: &Service) -> bool {
    let ip = s
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("");
    !ip.is_empty() && ip != "None"
}

/// The variables of the Services a pod in `namespace` sees (see the module docs).
pub fn service_env<S: std::ops::Deref<Target = Service>>(
    services: &[S],
    namespace: &str,
    links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for s in services.iter().map(|s| &**s).filter(|s| has_cluster_ip(s)) {
        let name = s.metadata.name.clone().unwrap_or_default();
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        if ns == "default" && name == "kubernetes" {
            chosen.entry(name).or_insert(s);
        } else if ns == namespace && links {
            chosen.insert(name, s);
        }
    }
    let mut out = BTreeMap::new();
    for (name, s) in chosen {
        let Some(spec) = &s.spec else { continue };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let prefix = name.replace('-', "_").to_uppercase();
        out.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.insert(port_var.clone(), first.port.to_string());
        for p in ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                let n = n.replace('-', "_").to_uppercase();
                out.insert(format!("{port_var}_{n}"), p.port.to_string());
            }
        }
        // Docker's link variables.
        let host_port = |port: i32| match ip.contains(':') {
            true => format!("[{ip}]:{port}"),
            false => format!("{ip}:{port}"),
        };
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let url = format!("{}://{}", proto.to_lowercase(), host_port(p.port));
            if i == 0 {
                out.insert(format!("{prefix}_PORT"), url.clone());
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.insert(pp.clone(), url);
            out.insert(format!("{pp}_PROTO"), proto.to_lowercase());
            out.insert(format!("{pp}_PORT"), p.port.to_string());
            out.insert(format!("{pp}_ADDR"), ip.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Box<Service> {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports}}))
        .expect("a service")
    }

    #[test]
    fn variables_of_the_namespace_and_the_master_service() {
        let services = [
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                json!([{"name": "https", "port": 443}]),
            ),
            svc(
                "prod",
                "web-api",
                "10.96.0.20",
                json!([
                {"port": 80}, {"name": "metrics-port", "port": 9090, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}]),
            ),
            svc("prod", "headless", "None", json!([{"port": 80}])),
            svc("other", "db", "10.96.0.30", json!([{"port": 5432}])),
        ];
        let env = service_env(&services, "prod", true);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("WEB_API_SERVICE_HOST"), Some("10.96.0.20"));
        assert_eq!(get("WEB_API_SERVICE_PORT"), Some("80"));
        assert_eq!(get("WEB_API_SERVICE_PORT_METRICS_PORT"), Some("9090"));
        assert_eq!(get("WEB_API_PORT"), Some("tcp://10.96.0.20:80"));
        assert_eq!(get("WEB_API_PORT_53_UDP"), Some("udp://10.96.0.20:53"));
        assert_eq!(get("WEB_API_PORT_53_UDP_PROTO"), Some("udp"));
        assert!(
            !env.keys()
                .any(|k| k.starts_with("HEADLESS_") || k.starts_with("DB_"))
        );
        // Without service links: the master service only.
        let env = service_env(&services, "prod", false);
        assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")), "{env:?}");
        assert_eq!(env.len(), 8);
    }
}
