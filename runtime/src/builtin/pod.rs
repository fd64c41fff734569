//! Pod sandbox RPCs: RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus,
//! ListPodSandbox.

use std::collections::BTreeMap;

use super::store::{self, SandboxRecord};
use super::{BuiltinRuntime, Reservation, new_id, sandbox_error};
use crate::{Error, Result, cri};

/// The CRI namespace mode (0 is POD, as in the proto) as the sandbox's own.
pub(super) fn ns_mode(mode: i32) -> sandbox::NamespaceMode {
    match cri::NamespaceMode::try_from(mode) {
        Ok(cri::NamespaceMode::Node) => sandbox::NamespaceMode::Node,
        Ok(cri::NamespaceMode::Container) | Ok(cri::NamespaceMode::Target) => {
            sandbox::NamespaceMode::Container
        }
        _ => sandbox::NamespaceMode::Pod,
    }
}

pub(super) fn namespace_options(config: &cri::PodSandboxConfig) -> cri::NamespaceOption {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .unwrap_or_default()
}

/// The pod's user namespace from its namespace options: `None` for the node's (mode NODE, or
/// none asked), the ID mappings for mode POD. As critest expects: one UID and one GID mapping,
/// each starting at container ID 0; CONTAINER and TARGET are refused. The pod must have its own
/// network, IPC and PID namespaces (the kubelet asks nothing else).
pub(super) fn user_namespace(opts: &cri::NamespaceOption) -> Result<Option<sandbox::IdMappings>> {
    let Some(u) = opts.userns_options.as_ref() else {
        return Ok(None);
    };
    match cri::NamespaceMode::try_from(u.mode) {
        Ok(cri::NamespaceMode::Node) => return Ok(None),
        Ok(cri::NamespaceMode::Pod) => {}
        Ok(m) => {
            return Err(Error::invalid_argument(format!(
                "user namespace mode {}: only POD and NODE are supported",
                m.as_str_name()
            )));
        }
        Err(_) => {
            return Err(Error::invalid_argument(format!(
                "unknown user namespace mode {}",
                u.mode
            )));
        }
    }
    let one = |what: &str, maps: &[cri::IdMapping]| -> Result<sandbox::IdRange> {
        let [m] = maps else {
            return Err(Error::invalid_argument(format!(
                "user namespace: exactly one {what} mapping is supported, got {}",
                maps.len()
            )));
        };
        if m.container_id != 0 {
            return Err(Error::invalid_argument(format!(
                "user namespace: {what} mapping must start at container ID 0 (the container's \
                 root), not {}",
                m.container_id
            )));
        }
        if m.length == 0 || m.host_id.checked_add(m.length).is_none() {
            return Err(Error::invalid_argument(format!(
                "user namespace: {what} mapping {} -> {} of length {} is empty or overflows",
                m.container_id, m.host_id, m.length
            )));
        }
        if m.host_id == 0 {
            return Err(Error::invalid_argument(format!(
                "user namespace: the {what} mapping would give the pod the node's root (host ID 0)"
            )));
        }
        Ok(sandbox::IdRange {
            container: m.container_id,
            host: m.host_id,
            size: m.length,
        })
    };
    let uids = one("UID", &u.uids)?;
    let gids = one("GID", &u.gids)?;
    let node = |m: i32| ns_mode(m) == sandbox::NamespaceMode::Node;
    if node(opts.network) || node(opts.ipc) || node(opts.pid) {
        return Err(Error::invalid_argument(
            "user namespace: the pod must not use the node's network, IPC or PID namespace",
        ));
    }
    Ok(Some(sandbox::IdMappings { uids, gids }))
}

/// Checks a DNS label-ish name from CRI metadata.
fn check_name(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid_argument(format!("{what} is required")));
    }
    if value.len() > 253 || value.contains('/') || value.contains('\0') {
        return Err(Error::invalid_argument(format!(
            "{what} {value:?} is not a valid name"
        )));
    }
    Ok(())
}

/// IPC-namespaced sysctls besides `fs.mqueue.*` (the list runc validates against).
const IPC_SYSCTLS: &[&str] = &[
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
];

/// Checks the pod's sysctls as runc checks a spec's: the sandbox process writes each one in
/// the pod's namespaces, so it must be a namespaced sysctl whose namespace the pod has its own
/// of (IPC ones need a pod IPC namespace; `net.*`, `kernel.hostname` and `kernel.domainname` a
/// pod network namespace, which the UTS namespace follows). Anything else would change the
/// node. Names may use `/` as separator, as in Kubernetes.
fn check_sysctls(
    sysctls: &std::collections::HashMap<String, String>,
    opts: &cri::NamespaceOption,
) -> Result<()> {
    let own = |mode: i32| ns_mode(mode) != sandbox::NamespaceMode::Node;
    for (key, value) in sysctls {
        let bad_name = key.is_empty()
            || key.starts_with(['.', '/'])
            || key.contains("..")
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '_' | '-'));
        if bad_name {
            return Err(Error::invalid_argument(format!(
                "invalid sysctl name {key:?}"
            )));
        }
        if value.contains(['\0', '\n']) {
            return Err(Error::invalid_argument(format!(
                "sysctl {key}: invalid value {value:?}"
            )));
        }
        let name = key.replace('/', ".");
        let (namespace, ok) =
            if IPC_SYSCTLS.contains(&name.as_str()) || name.starts_with("fs.mqueue.") {
                ("IPC", own(opts.ipc))
            } else if name.starts_with("net.") {
                ("network", own(opts.network))
            } else if name == "kernel.hostname" || name == "kernel.domainname" {
                ("UTS", own(opts.network))
            } else {
                return Err(Error::invalid_argument(format!(
                    "sysctl {key} is not namespaced: setting it would change the node"
                )));
            };
        if !ok {
            return Err(Error::invalid_argument(format!(
                "sysctl {key} needs the pod's own {namespace} namespace, and the pod uses the \
                 node's"
            )));
        }
    }
    Ok(())
}

/// Whether `labels` carries every key/value of `selector`.
pub(super) fn labels_match(
    labels: &std::collections::HashMap<String, String>,
    selector: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A RunPodSandbox request, checked.
struct SandboxRequest {
    config: cri::PodSandboxConfig,
    meta: cri::PodSandboxMetadata,
    runtime_handler: String,
    opts: cri::NamespaceOption,
    user_namespace: Option<sandbox::IdMappings>,
}

impl SandboxRequest {
    /// Checks `req`: its metadata, runtime handler, user namespace and sysctls.
    fn check(req: cri::RunPodSandboxRequest) -> Result<Self> {
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("RunPodSandbox needs a config"))?;
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("sandbox config needs metadata"))?;
        check_name("sandbox name", &meta.name)?;
        check_name("sandbox namespace", &meta.namespace)?;
        if !req.runtime_handler.is_empty() && req.runtime_handler != "nodelet" {
            return Err(Error::not_found(format!(
                "no runtime handler {:?} (the built-in runtime has only the default one)",
                req.runtime_handler
            )));
        }
        let opts = namespace_options(&config);
        let user_namespace = user_namespace(&opts)?;
        if let Some(linux) = &config.linux {
            check_sysctls(&linux.sysctls, &opts)?;
        }
        Ok(SandboxRequest {
            config,
            meta,
            runtime_handler: req.runtime_handler,
            opts,
            user_namespace,
        })
    }

    /// The spec of sandbox `id`, its pod under `cgroup_parent`, on `network`.
    fn spec(
        &self,
        id: &str,
        cgroup_parent: &str,
        network: Option<sandbox::PodNetwork>,
    ) -> sandbox::Spec {
        let (config, opts) = (&self.config, &self.opts);
        sandbox::Spec {
            id: id.to_string(),
            hostname: config.hostname.clone(),
            namespaces: sandbox::Namespaces {
                network: ns_mode(opts.network),
                ipc: ns_mode(opts.ipc),
                pid: ns_mode(opts.pid),
            },
            owns_cgroup_parent: !sandbox::cgroup::exists(cgroup_parent),
            cgroup_parent: cgroup_parent.to_string(),
            dns: config.dns_config.as_ref().map(|d| sandbox::Dns {
                servers: d.servers.clone(),
                searches: d.searches.clone(),
                options: d.options.clone(),
            }),
            host_aliases: Vec::new(),
            sysctls: config
                .linux
                .as_ref()
                .map(|l| {
                    l.sysctls
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_else(BTreeMap::new),
            network,
            user_namespace: self.user_namespace,
        }
    }

    /// The record of sandbox `id`, launched under `cgroup_parent` with address `ip`.
    fn into_record(
        self,
        id: &str,
        cgroup_parent: String,
        ip: Option<std::net::Ipv4Addr>,
    ) -> SandboxRecord {
        SandboxRecord {
            id: id.to_string(),
            config: self.config,
            runtime_handler: self.runtime_handler,
            created_at: sandbox::now_ns(),
            stopped: false,
            cgroup_parent,
            ip,
        }
    }
}

/// Creates the pod's log directory, if it names one.
fn create_log_directory(config: &cri::PodSandboxConfig) -> Result<()> {
    if !config.log_directory.is_empty() {
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            Error::invalid_argument(format!(
                "creating log directory {}: {e}",
                config.log_directory
            ))
        })?;
    }
    Ok(())
}

impl BuiltinRuntime {
    /// RunPodSandbox: checks the request and reserves the pod's name, then picks the pod's
    /// cgroup parent and address, launches the sandbox process and records it. What a failed
    /// launch or record leaves is undone at the end.
    pub(super) async fn run_sandbox(&self, req: cri::RunPodSandboxRequest) -> Result<String> {
        let want = SandboxRequest::check(req)?;
        let _reserved = self.reserve_sandbox_name(&want.meta)?;
        let id = new_id()?;
        let cgroup_parent = self.cgroup_parent(&want.config, &id)?;
        let network = self.pod_network(&id, &want).await?;
        let ip = network.as_ref().map(|n| n.address);
        let spec = want.spec(&id, &cgroup_parent, network);
        create_log_directory(&want.config)?;
        let launched = self.launch(&spec).await;
        let was_launched = launched.is_ok();
        let recorded = launched.and_then(|()| {
            self.inner
                .records
                .save_sandbox(&want.into_record(&id, cgroup_parent, ip))
        });
        if let Err(e) = recorded {
            self.undo_run(&spec, was_launched).await;
            return Err(e);
        }
        self.watch_sandbox(&id).await;
        self.emit(&id, cri::ContainerEventType::ContainerCreatedEvent);
        self.emit(&id, cri::ContainerEventType::ContainerStartedEvent);
        Ok(id)
    }

    /// Reserves the name `meta` gives a sandbox: taken while another sandbox has it.
    fn reserve_sandbox_name(&self, meta: &cri::PodSandboxMetadata) -> Result<Reservation> {
        let key = format!(
            "sandbox {}_{}_{}_{}",
            meta.name, meta.namespace, meta.uid, meta.attempt
        );
        self.reserve(key, || {
            for other in self.inner.records.all_sandboxes() {
                if let Some(m) = &other.config.metadata {
                    if m.name == meta.name
                        && m.namespace == meta.namespace
                        && m.uid == meta.uid
                        && m.attempt == meta.attempt
                    {
                        return Err(Error::already_exists(format!(
                            "sandbox {}_{}_{}_{} already exists as {}",
                            meta.name, meta.namespace, meta.uid, meta.attempt, other.id
                        )));
                    }
                }
            }
            Ok(())
        })
    }

    /// The cgroup the pod of sandbox `id` goes under: the one `config` gives (an absolute
    /// cgroupfs path), else one of its own under the runtime's cgroup root.
    fn cgroup_parent(&self, config: &cri::PodSandboxConfig, id: &str) -> Result<String> {
        let given_parent = config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.trim_end_matches('/').to_string())
            .unwrap_or_default();
        if !given_parent.is_empty()
            && (!given_parent.starts_with('/') || given_parent.contains(".."))
        {
            return Err(Error::invalid_argument(format!(
                "cgroup parent {given_parent:?} must be an absolute cgroupfs path"
            )));
        }
        Ok(if given_parent.is_empty() {
            format!("{}/{id}", self.inner.cfg.cgroup_root.trim_end_matches('/'))
        } else {
            given_parent
        })
    }

    /// The pod network interface of sandbox `id`, with an address taken for it, when the pod
    /// has its own network namespace and the runtime a pod network (set up on first use).
    async fn pod_network(
        &self,
        id: &str,
        want: &SandboxRequest,
    ) -> Result<Option<sandbox::PodNetwork>> {
        let own_network = ns_mode(want.opts.network) != sandbox::NamespaceMode::Node;
        // hostNetwork pods' port mappings only document ports the pod opens on the node.
        let ports = if own_network {
            super::network::port_mappings(&want.config.port_mappings)?
        } else {
            Vec::new()
        };
        let Some(net) = self.inner.network.as_ref().filter(|_| own_network) else {
            return Ok(None);
        };
        if !net.is_set_up() {
            self.ensure_network().await.map_err(|e| {
                Error::failed_precondition(format!("the pod network is not ready: {e}"))
            })?;
        }
        let address = net
            .ipam
            .allocate(id, &self.inner.cfg.root_dir.to_string_lossy())
            .map_err(sandbox_error)?;
        Ok(Some(net.pod_network(id, address, ports)))
    }

    /// Starts the sandbox process for `spec` in its state dir.
    async fn launch(&self, spec: &sandbox::Spec) -> Result<()> {
        let dir = self.sandbox_dir(&spec.id);
        let cfg = &self.inner.cfg;
        let args: Vec<&str> = cfg.sandbox_args.iter().map(String::as_str).collect();
        sandbox::launch(&cfg.sandbox_program, &args, &dir, spec)
            .await
            .map_err(sandbox_error)?;
        Ok(())
    }

    /// Undoes a RunPodSandbox that failed at its launch or its record: ends the sandbox process
    /// if it was `launched`, else removes the cgroups made for it; its state dir and its
    /// address go either way.
    async fn undo_run(&self, spec: &sandbox::Spec, launched: bool) {
        let id = &spec.id;
        if launched {
            let _ = self.client(id).shutdown().await;
        }
        let _ = std::fs::remove_dir_all(self.sandbox_dir(id));
        self.release_address(id, spec.network.as_ref().map(|n| n.address));
        if !launched && spec.owns_cgroup_parent {
            let _ = sandbox::cgroup::remove(&format!("{}/sandbox", spec.cgroup_parent));
            let _ = sandbox::cgroup::remove(&spec.cgroup_parent);
        }
    }

    pub(super) async fn stop_sandbox(&self, id: &str) -> Result<()> {
        let Some(mut rec) = self.inner.records.find_sandbox(id)? else {
            return Ok(());
        };
        let id = rec.id.clone();
        if rec.stopped {
            return Ok(());
        }
        let client = self.client(&id);
        if !client.is_stopped() {
            match client.shutdown().await {
                Ok(()) => {}
                Err(e) if e.kind() == sandbox::Kind::Unavailable => {
                    // Gone, or not answering (its own shutdown, asked by an agent that died,
                    // still under way): either way nothing of it may outlive the stop.
                    tracing::warn!(sandbox = %id, "sandbox process not answering: {e}; killing what is left of it");
                    self.kill_pod(&id, Some(&rec.cgroup_parent)).await?;
                }
                Err(e) => return Err(sandbox_error(e)),
            }
        }
        rec.stopped = true;
        self.inner.records.save_sandbox(&rec)?;
        // The sandbox process is gone, and its network namespace and veth pair with it.
        self.release_address(&id, rec.ip);
        // Its containers too: their rootfs go now, whether or not their exits were seen.
        self.unmount_exited_in(&id).await;
        self.emit(&id, cri::ContainerEventType::ContainerStoppedEvent);
        Ok(())
    }

    pub(super) async fn remove_sandbox(&self, id: &str) -> Result<()> {
        let Some(id) = self.inner.records.resolve_sandbox(id)? else {
            return Ok(());
        };
        self.stop_sandbox(&id).await?;
        let lock = self.sandbox_lock(&id);
        let _exclusive = lock.write().await;
        for c in self.inner.records.all_containers() {
            if c.sandbox_id == id {
                self.discard_container(&c.id).await;
            }
        }
        if let Some(rec) = self.inner.records.sandbox(&id) {
            // The sandbox process removes the cgroups it made; a crashed one may have left them.
            let _ = sandbox::cgroup::remove(&format!("{}/sandbox", rec.cgroup_parent));
            if rec.cgroup_parent.starts_with(&self.inner.cfg.cgroup_root) {
                let _ = sandbox::cgroup::remove(&rec.cgroup_parent);
            }
        }
        let dir = self.sandbox_dir(&id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(Error::internal(format!("removing {}: {e}", dir.display())));
            }
        }
        self.inner.records.remove_sandbox(&id);
        store::lock(&self.inner.sandbox_locks).remove(&id);
        // Containers removed before are released in the background: a removed pod is gone
        // whole when this returns.
        self.releases_done().await;
        self.emit(&id, cri::ContainerEventType::ContainerDeletedEvent);
        Ok(())
    }

    /// The CRI status of a sandbox.
    pub(super) async fn sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::PodSandboxStatusResponse> {
        let rec = self.inner.records.need_sandbox(id)?;
        let live = if rec.stopped {
            None
        } else {
            self.client(&rec.id).state().await.ok()
        };
        let ready = live.is_some();
        let mut info = std::collections::HashMap::new();
        if verbose {
            let detail = serde_json::json!({
                "pid": live.as_ref().map(|s| s.pid),
                "pidNamespaceHolder": live.as_ref().and_then(|s| s.pid_ns_holder),
                "cgroupParent": rec.cgroup_parent,
                "stateDir": self.sandbox_dir(&rec.id),
            });
            info.insert("info".to_string(), detail.to_string());
        }
        Ok(cri::PodSandboxStatusResponse {
            status: Some(cri::PodSandboxStatus {
                id: rec.id.clone(),
                metadata: rec.config.metadata.clone(),
                state: if ready {
                    cri::PodSandboxState::SandboxReady as i32
                } else {
                    cri::PodSandboxState::SandboxNotready as i32
                },
                created_at: rec.created_at,
                network: Some(cri::PodSandboxNetworkStatus {
                    // A stopped sandbox's address is free again, and may be another's.
                    ip: rec
                        .ip
                        .filter(|_| !rec.stopped)
                        .map(|ip| ip.to_string())
                        .unwrap_or_default(),
                    additional_ips: Vec::new(),
                }),
                linux: Some(cri::LinuxPodSandboxStatus {
                    namespaces: Some(cri::Namespace {
                        options: Some(namespace_options(&rec.config)),
                    }),
                }),
                labels: rec.config.labels.clone(),
                annotations: rec.config.annotations.clone(),
                runtime_handler: rec.runtime_handler.clone(),
            }),
            info,
            containers_statuses: Vec::new(),
            timestamp: sandbox::now_ns(),
        })
    }

    /// [`super::network::Network::ensure`], off the async threads (netlink and nftables
    /// requests); Ok without a pod network.
    pub(super) async fn ensure_network(&self) -> std::result::Result<(), String> {
        let rt = self.clone();
        tokio::task::spawn_blocking(move || match &rt.inner.network {
            Some(net) => net.ensure(),
            None => Ok(()),
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    }

    /// Frees the pod address `ip` of sandbox `id`, if it has one.
    pub(super) fn release_address(&self, id: &str, ip: Option<std::net::Ipv4Addr>) {
        if let (Some(net), Some(ip)) = (&self.inner.network, ip) {
            if let Err(e) = net.ipam.release(ip, id) {
                tracing::warn!(sandbox = %id, "freeing pod address {ip}: {e}");
            }
        }
    }

    /// Frees the addresses this runtime's stopped or forgotten sandboxes still hold (an agent
    /// that crashed between a sandbox's end and its StopPodSandbox), and those of runtimes
    /// whose root dir is gone.
    pub(super) fn release_stale_addresses(&self) {
        let Some(net) = &self.inner.network else {
            return;
        };
        let root = self.inner.cfg.root_dir.to_string_lossy();
        for lease in net.ipam.leases() {
            let stale = if lease.runtime == root {
                self.inner
                    .records
                    .sandbox(&lease.owner)
                    .is_none_or(|r| r.stopped)
            } else {
                !std::path::Path::new(&lease.runtime).exists()
            };
            if stale {
                tracing::info!(sandbox = %lease.owner, "freeing stale pod address {}", lease.ip);
                self.release_address(&lease.owner, Some(lease.ip));
            }
        }
    }

    pub(super) async fn list_sandboxes(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let filter = filter.unwrap_or_default();
        let mut out = Vec::new();
        for rec in self.inner.records.all_sandboxes() {
            if !filter.id.is_empty() && !rec.id.starts_with(&filter.id) {
                continue;
            }
            if !labels_match(&rec.config.labels, &filter.label_selector) {
                continue;
            }
            let ready = !rec.stopped && self.client(&rec.id).state().await.is_ok();
            let state = if ready {
                cri::PodSandboxState::SandboxReady as i32
            } else {
                cri::PodSandboxState::SandboxNotready as i32
            };
            if filter.state.as_ref().is_some_and(|s| s.state != state) {
                continue;
            }
            out.push(cri::PodSandbox {
                id: rec.id.clone(),
                metadata: rec.config.metadata.clone(),
                state,
                created_at: rec.created_at,
                labels: rec.config.labels.clone(),
                annotations: rec.config.annotations.clone(),
                runtime_handler: rec.runtime_handler.clone(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctls(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn opts(network: cri::NamespaceMode, ipc: cri::NamespaceMode) -> cri::NamespaceOption {
        cri::NamespaceOption {
            network: network as i32,
            ipc: ipc as i32,
            ..Default::default()
        }
    }

    #[test]
    fn only_sysctls_of_the_pods_own_namespaces_are_accepted() {
        use cri::NamespaceMode::{Node, Pod};
        let pod = opts(Pod, Pod);
        let good = sysctls(&[
            ("kernel.shm_rmid_forced", "1"),
            ("kernel.sem", "250 32000 100 128"),
            ("fs.mqueue.msg_max", "20"),
            ("net.ipv4.ip_unprivileged_port_start", "80"),
            ("net/ipv4/conf/lo.100/forwarding", "1"),
            ("kernel.domainname", "example.org"),
        ]);
        check_sysctls(&good, &pod).unwrap();
        let cases = [
            (("vm.swappiness", "10"), pod.clone(), "not namespaced"),
            (("kernel.panic", "1"), pod.clone(), "not namespaced"),
            (
                ("net.ipv4.ip_forward", "1"),
                opts(Node, Pod),
                "own network namespace",
            ),
            (
                ("kernel.hostname", "x"),
                opts(Node, Pod),
                "own UTS namespace",
            ),
            (("kernel.shmmax", "1"), opts(Pod, Node), "own IPC namespace"),
            (("net.ipv4.../x", "1"), pod.clone(), "invalid sysctl name"),
            (
                ("/net/ipv4/ip_forward", "1"),
                pod.clone(),
                "invalid sysctl name",
            ),
            (
                ("net.ipv4.ip forward", "1"),
                pod.clone(),
                "invalid sysctl name",
            ),
            (("", "1"), pod.clone(), "invalid sysctl name"),
            (("net.core.somaxconn", "1\n2"), pod.clone(), "invalid value"),
        ];
        for ((k, v), o, msg) in cases {
            let err = check_sysctls(&sysctls(&[(k, v)]), &o).unwrap_err();
            assert_eq!(err.code(), crate::Code::InvalidArgument, "{k}");
            assert!(err.message().contains(msg), "{k}: {err}");
        }
    }
}
