//! The steps of RunPodSandbox: checking the request (names, runtime handler, user namespace,
//! sysctls), reserving the pod's name, picking its cgroup parent and its address on the pod
//! network, making its log directory, launching the sandbox process, and undoing what a failed
//! step left. The RPC body that runs them in order is the parent's `run_sandbox`.

use std::collections::BTreeMap;

use super::{namespace_options, ns_mode, user_namespace};
use crate::builtin::store::SandboxRecord;
use crate::builtin::{BuiltinRuntime, Reservation, sandbox_error};
use crate::{Error, Result, cri};

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

/// Whether sysctl `key` (`.` or `/` separated) is of the network namespace.
fn is_net_sysctl(key: &str) -> bool {
    key.starts_with("net.") || key.starts_with("net/")
}

/// A RunPodSandbox request, checked.
pub(super) struct SandboxRequest {
    pub config: cri::PodSandboxConfig,
    pub meta: cri::PodSandboxMetadata,
    runtime_handler: String,
    opts: cri::NamespaceOption,
    user_namespace: Option<sandbox::IdMappings>,
}

impl SandboxRequest {
    /// Checks `req`: its metadata, runtime handler, user namespace and sysctls.
    pub(super) fn check(req: cri::RunPodSandboxRequest) -> Result<Self> {
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

    /// The pod's sysctls.
    fn sysctls(&self) -> BTreeMap<String, String> {
        self.config
            .linux
            .as_ref()
            .map(|l| {
                l.sysctls
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pod's `net.*` sysctls.
    pub(super) fn net_sysctls(&self) -> BTreeMap<String, String> {
        self.sysctls()
            .into_iter()
            .filter(|(k, _)| is_net_sysctl(k))
            .collect()
    }

    /// The spec of sandbox `id`, its pod under `cgroup_parent`, on `network`; without its
    /// `net.*` sysctls when `defer_net_sysctls` (CNI mode: they are set after the ADD).
    pub(super) fn spec(
        &self,
        id: &str,
        cgroup_parent: &PodCgroup,
        network: Option<sandbox::PodNetwork>,
        defer_net_sysctls: bool,
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
            owns_cgroup_parent: !sandbox::cgroup::exists(&cgroup_parent.path),
            cgroup_parent: cgroup_parent.path.clone(),
            systemd_slice: cgroup_parent.systemd_slice.clone(),
            dns: config.dns_config.as_ref().map(|d| sandbox::Dns {
                servers: d.servers.clone(),
                searches: d.searches.clone(),
                options: d.options.clone(),
            }),
            host_aliases: Vec::new(),
            // In CNI mode the `net.*` ones wait for the ADD (`BuiltinRuntime::attach_cni`).
            sysctls: self
                .sysctls()
                .into_iter()
                .filter(|(k, _)| !(defer_net_sysctls && is_net_sysctl(k)))
                .collect(),
            network,
            user_namespace: self.user_namespace,
        }
    }

    /// The record of sandbox `id`, launched under `cgroup_parent` with addresses `ips` on the
    /// runtime's bridge, or attached to a CNI network with its addresses.
    pub(super) fn into_record(
        self,
        id: &str,
        cgroup_parent: String,
        ips: &[std::net::IpAddr],
        cni: Option<(String, Vec<std::net::IpAddr>)>,
    ) -> SandboxRecord {
        let (cni_network, cni_ips) = match cni {
            Some((name, ips)) => (Some(name), ips),
            None => (None, Vec::new()),
        };
        SandboxRecord {
            id: id.to_string(),
            config: self.config,
            runtime_handler: self.runtime_handler,
            created_at: sandbox::now_ns(),
            stopped: false,
            cgroup_parent,
            ip: ips.first().copied(),
            second_ip: ips.get(1).copied(),
            cni_network,
            cni_ips,
        }
    }
}

/// Where a pod's cgroups go: `path` (a cgroupfs path), with the systemd driver the scope
/// the sandbox asks systemd for in `systemd_slice`.
pub(super) struct PodCgroup {
    pub path: String,
    pub systemd_slice: Option<String>,
}

/// Creates the pod's log directory, if it names one.
pub(super) fn create_log_directory(config: &cri::PodSandboxConfig) -> Result<()> {
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
    /// Reserves the name `meta` gives a sandbox: taken while another sandbox has it.
    pub(super) fn reserve_sandbox_name(
        &self,
        meta: &cri::PodSandboxMetadata,
    ) -> Result<Reservation> {
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
    /// cgroupfs path), else one of its own under the runtime's cgroup root. With the systemd
    /// driver, `config` gives a slice name (`system.slice` when it gives none) and the pod's
    /// cgroup is its own scope in that slice.
    pub(super) fn cgroup_parent(
        &self,
        config: &cri::PodSandboxConfig,
        id: &str,
    ) -> Result<PodCgroup> {
        let given_parent = config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.trim_end_matches('/').to_string())
            .unwrap_or_default();
        if self.inner.cfg.systemd_cgroup {
            let slice = if given_parent.is_empty() {
                "system.slice".to_string()
            } else {
                given_parent
            };
            let path =
                sandbox::cgroup::systemd_scope_path(&slice, sandbox::process::SCOPE_PREFIX, id)
                    .map_err(|e| {
                        Error::invalid_argument(format!(
                            "cgroup parent: the runtime's cgroup driver is systemd, which takes \
                             a slice name such as kubepods-besteffort-pod<uid>.slice: {e}"
                        ))
                    })?;
            return Ok(PodCgroup {
                path,
                systemd_slice: Some(slice),
            });
        }
        if !given_parent.is_empty()
            && (!given_parent.starts_with('/') || given_parent.contains(".."))
        {
            let why = if given_parent.ends_with(".slice") {
                " (a systemd slice name; the runtime's cgroup driver is cgroupfs)"
            } else {
                ""
            };
            return Err(Error::invalid_argument(format!(
                "cgroup parent {given_parent:?} must be an absolute cgroupfs path{why}"
            )));
        }
        let path = if given_parent.is_empty() {
            format!("{}/{id}", self.inner.cfg.cgroup_root.trim_end_matches('/'))
        } else {
            given_parent
        };
        Ok(PodCgroup {
            path,
            systemd_slice: None,
        })
    }

    /// The pod network interface of sandbox `id`, with an address taken for it, when the pod
    /// has its own network namespace and the runtime a pod network (set up on first use).
    pub(super) async fn pod_network(
        &self,
        id: &str,
        want: &SandboxRequest,
    ) -> Result<Option<sandbox::PodNetwork>> {
        let own_network = ns_mode(want.opts.network) != sandbox::NamespaceMode::Node;
        // hostNetwork pods' port mappings only document ports the pod opens on the node.
        let ports = if own_network {
            crate::builtin::network::port_mappings(&want.config.port_mappings)?
        } else {
            Vec::new()
        };
        if let Some(cni) = self.inner.cni.as_ref().filter(|_| own_network) {
            // Attached once the sandbox process has made the namespace
            // (`Self::attach_cni`); refused now when there is no network to attach to.
            cni.network().map_err(|e| {
                Error::failed_precondition(format!("the pod network is not ready: {}", e.message()))
            })?;
            return Ok(None);
        }
        let Some(net) = self.inner.network.as_ref().filter(|_| own_network) else {
            return Ok(None);
        };
        if !net.is_set_up() {
            self.ensure_network().await.map_err(|e| {
                Error::failed_precondition(format!("the pod network is not ready: {e}"))
            })?;
        }
        let addresses = net
            .allocate(id, &self.inner.cfg.root_dir.to_string_lossy())
            .map_err(sandbox_error)?;
        match net.pod_network(id, &addresses, ports) {
            Ok(n) => Ok(Some(n)),
            Err(e) => {
                self.release_address(id, addresses.iter().map(|(ip, _)| *ip));
                Err(e)
            }
        }
    }

    /// CNI mode, for a pod with its own network namespace: pins the namespace the sandbox
    /// process made and runs the ADD in it; the network's name and the pod's addresses. On
    /// an error nothing of the attachment is left (the ADD was deleted, the namespace
    /// unpinned).
    pub(super) async fn attach_cni(
        &self,
        id: &str,
        want: &SandboxRequest,
        cgroup_parent: &str,
    ) -> Result<Option<(String, Vec<std::net::IpAddr>)>> {
        let own_network = ns_mode(want.opts.network) != sandbox::NamespaceMode::Node;
        let Some(cni) = self.inner.cni.as_ref().filter(|_| own_network) else {
            return Ok(None);
        };
        let net = cni.network().map_err(|e| {
            Error::failed_precondition(format!("the pod network is not ready: {}", e.message()))
        })?;
        let pid = self.client(id).pid().ok_or_else(|| {
            Error::internal("the sandbox process ended before its network was set up")
        })?;
        let netns = cni.pin(id, pid)?;
        let ips = match cni.add(&net, id, &netns, &want.config, cgroup_parent).await {
            Ok(ips) => ips,
            Err(e) => {
                cni.unpin(id);
                return Err(e);
            }
        };
        // The pod's `net.*` sysctls, now that its interfaces are there.
        let sysctls = want.net_sysctls();
        if !sysctls.is_empty() {
            let path = netns.clone();
            let set = tokio::task::spawn_blocking(move || {
                crate::builtin::cni::set_net_sysctls(&path, &sysctls)
            })
            .await
            .map_err(|e| Error::internal(format!("setting the pod's sysctls: {e}")))
            .and_then(|r| r);
            if let Err(e) = set {
                if let Err(del) = cni.del(id, &net.name, &want.config, cgroup_parent).await {
                    tracing::warn!(sandbox = %id, "{del}");
                } else {
                    cni.unpin(id);
                }
                return Err(e);
            }
        }
        Ok(Some((net.name, ips)))
    }

    /// Starts the sandbox process for `spec` in its state dir.
    pub(super) async fn launch(&self, spec: &sandbox::Spec) -> Result<()> {
        let dir = self.sandbox_dir(&spec.id);
        let cfg = &self.inner.cfg;
        let args: Vec<&str> = cfg.sandbox_args.iter().map(String::as_str).collect();
        sandbox::launch(&cfg.sandbox_program, &args, &dir, spec)
            .await
            .map_err(sandbox_error)?;
        Ok(())
    }

    /// Undoes a RunPodSandbox that failed after taking the pod's address (at its log
    /// directory, its launch or its record): ends the sandbox process if it was `launched`;
    /// its state dir, its address and the cgroups made for it (with whatever still runs in
    /// them) go either way.
    pub(super) async fn undo_run(&self, spec: &sandbox::Spec, launched: bool) {
        let id = &spec.id;
        if launched {
            let _ = self.client(id).shutdown().await;
        }
        let _ = std::fs::remove_dir_all(self.sandbox_dir(id));
        let ips: Vec<std::net::IpAddr> = spec
            .network
            .iter()
            .flat_map(|n| n.addresses().map(|a| a.address))
            .collect();
        self.release_address(id, ips);
        if let Err(e) =
            Self::remove_sandbox_cgroups(&spec.cgroup_parent, spec.owns_cgroup_parent).await
        {
            tracing::error!(sandbox = %id, "undoing its creation: {e}");
        }
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
