//! Pod sandbox RPCs: RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus,
//! ListPodSandbox; what they share with CreateContainer (the pod's namespace options and user
//! namespace) and the pod addresses' release. The steps RunPodSandbox runs are in `run`.

mod run;

use super::network::NetworkError;
use super::store;
use super::{BuiltinRuntime, new_id, sandbox_error};
use crate::{Error, Result, cri};
use run::{SandboxRequest, create_log_directory};

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

/// Whether `labels` carries every key/value of `selector`.
pub(super) fn labels_match(
    labels: &std::collections::HashMap<String, String>,
    selector: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl BuiltinRuntime {
    /// RunPodSandbox, run to its end even when its caller goes (a CRI client's deadline or
    /// disconnection drops this future): dropped half way, it would leave a sandbox half made
    /// (its state dir without a process or a record) that nothing lists; made whole, the
    /// sandbox is listed and removed like any other.
    pub(super) async fn run_sandbox(&self, req: cri::RunPodSandboxRequest) -> Result<String> {
        let rt = self.clone();
        tokio::spawn(async move { rt.run_sandbox_whole(req).await })
            .await
            .map_err(|e| Error::internal(format!("RunPodSandbox: {e}")))?
    }

    /// RunPodSandbox: checks the request and reserves the pod's name, then picks the pod's
    /// cgroup parent and address, makes its log directory, launches the sandbox process and
    /// records it. What a failed log directory, launch or record leaves (the address taken
    /// first of all) is undone at the end.
    async fn run_sandbox_whole(&self, req: cri::RunPodSandboxRequest) -> Result<String> {
        let want = SandboxRequest::check(req)?;
        let _reserved = self.reserve_sandbox_name(&want.meta)?;
        let id = new_id()?;
        let cgroup_parent = self.cgroup_parent(&want.config, &id)?;
        let network = self.pod_network(&id, &want).await?;
        let ips: Vec<std::net::IpAddr> = network
            .as_ref()
            .map(|n| n.addresses().map(|a| a.address).collect())
            .unwrap_or_default();
        let spec = want.spec(&id, &cgroup_parent, network, self.inner.cni.is_some());
        let cgroup_parent = cgroup_parent.path;
        let launched = async {
            create_log_directory(&want.config)?;
            self.launch(&spec).await
        }
        .await;
        let was_launched = launched.is_ok();
        let attached = match launched {
            Ok(()) => self.attach_cni(&id, &want, &cgroup_parent).await,
            Err(e) => Err(e),
        };
        let recorded = match attached {
            Ok(cni) => {
                let mut rec = want.into_record(&id, cgroup_parent, &ips, cni);
                let saved = self.inner.records.save_sandbox(&rec);
                if saved.is_err() {
                    self.teardown_cni_logged(&mut rec).await;
                }
                saved
            }
            Err(e) => Err(e),
        };
        if let Err(e) = recorded {
            self.undo_run(&spec, was_launched).await;
            return Err(e);
        }
        self.watch_sandbox(&id).await;
        self.emit(&id, cri::ContainerEventType::ContainerCreatedEvent);
        self.emit(&id, cri::ContainerEventType::ContainerStartedEvent);
        Ok(id)
    }

    pub(super) async fn stop_sandbox(&self, id: &str) -> Result<()> {
        let Some(mut rec) = self.inner.records.find_sandbox(id)? else {
            return Ok(());
        };
        let id = rec.id.clone();
        if rec.stopped {
            if rec.cni_network.is_some() {
                // A DEL that failed when the sandbox was found dead: retried with every stop.
                self.teardown_cni(&mut rec).await?;
                self.inner.records.save_sandbox(&rec)?;
            }
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
        // CNI mode: the DEL, in the namespace pinned past the process; a failure fails the
        // stop, which the kubelet retries.
        self.teardown_cni(&mut rec).await?;
        rec.stopped = true;
        self.inner.records.save_sandbox(&rec)?;
        // The sandbox process is gone, and its network namespace and veth pair with it.
        self.release_address(&id, rec.bridge_ips());
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
            let root = self.inner.cfg.cgroup_root.trim_end_matches('/');
            let owned = rec.cgroup_parent == format!("{root}/{id}")
                || rec
                    .cgroup_parent
                    .ends_with(&format!("/{}-{id}.scope", sandbox::process::SCOPE_PREFIX));
            Self::remove_sandbox_cgroups(&rec.cgroup_parent, owned).await?;
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
            status: Some(sandbox_status_of(&rec, ready)),
            info,
            containers_statuses: Vec::new(),
            timestamp: sandbox::now_ns(),
        })
    }

    /// [`super::network::Network::ensure`], off the async threads (netlink and nftables
    /// requests); Ok without a pod network.
    pub(super) async fn ensure_network(&self) -> std::result::Result<(), NetworkError> {
        let rt = self.clone();
        tokio::task::spawn_blocking(move || match &rt.inner.network {
            Some(net) => net.ensure(),
            None => Ok(()),
        })
        .await?
    }

    /// CNI mode: DEL of the attachment of sandbox `rec` (whose process is gone) and its
    /// namespace unpinned; `rec` (saved by the caller) no longer names a network. On an error
    /// `rec` keeps it: a later stop retries, and so does the GC at the next start.
    pub(super) async fn teardown_cni(&self, rec: &mut store::SandboxRecord) -> Result<()> {
        let Some(network) = &rec.cni_network else {
            return Ok(());
        };
        let Some(cni) = &self.inner.cni else {
            tracing::warn!(sandbox = %rec.id, "attached to CNI network {network:?}, and the runtime is no longer in CNI mode: not torn down");
            return Ok(());
        };
        cni.del(&rec.id, network, &rec.config, &rec.cgroup_parent)
            .await?;
        cni.unpin(&rec.id);
        rec.cni_network = None;
        Ok(())
    }

    /// [`Self::teardown_cni`] for a sandbox found dead, its failure logged.
    pub(super) async fn teardown_cni_logged(&self, rec: &mut store::SandboxRecord) {
        if let Err(e) = self.teardown_cni(rec).await {
            tracing::warn!(sandbox = %rec.id, "{e}");
        }
    }

    /// CNI mode: GC of the network in the background, with the sandboxes still running as the
    /// valid attachments (what an agent killed half way left is deleted).
    pub(super) fn collect_cni_garbage(&self) {
        if self.inner.cni.is_none() {
            return;
        }
        let valid: Vec<String> = self
            .inner
            .records
            .all_sandboxes()
            .into_iter()
            .filter(|r| !r.stopped && r.cni_network.is_some())
            .map(|r| r.id)
            .collect();
        let rt = self.clone();
        tokio::spawn(async move {
            if let Some(cni) = &rt.inner.cni {
                cni.gc(&valid).await;
            }
        });
    }

    /// Frees the pod addresses `ips` of sandbox `id`.
    pub(super) fn release_address(
        &self,
        id: &str,
        ips: impl IntoIterator<Item = std::net::IpAddr>,
    ) {
        let Some(net) = &self.inner.network else {
            return;
        };
        for ip in ips {
            if let Err(e) = net.release(ip, id) {
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
        for lease in net.leases() {
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
                self.release_address(&lease.owner, [lease.ip]);
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

/// The CRI status of the sandbox `rec`, ready or not as the caller found it.
pub(super) fn sandbox_status_of(rec: &store::SandboxRecord, ready: bool) -> cri::PodSandboxStatus {
    // A stopped sandbox's addresses are free again, and may be another's.
    let ips = if rec.stopped {
        Vec::new()
    } else {
        rec.pod_ips()
    };
    cri::PodSandboxStatus {
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
            ip: ips.first().map(|ip| ip.to_string()).unwrap_or_default(),
            additional_ips: ips
                .iter()
                .skip(1)
                .map(|ip| cri::PodIp { ip: ip.to_string() })
                .collect(),
        }),
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(namespace_options(&rec.config)),
            }),
        }),
        labels: rec.config.labels.clone(),
        annotations: rec.config.annotations.clone(),
        runtime_handler: rec.runtime_handler.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtin::{Config, NetworkConfig};

    /// A runtime on temporary dirs, whose pod network takes addresses from a temporary IPAM
    /// dir and is taken as set up (no bridge is made, so no root is needed).
    async fn runtime(dir: &std::path::Path) -> BuiltinRuntime {
        let mut cfg = Config::new(dir.join("root")).unwrap();
        cfg.state_dir = Some(dir.join("state"));
        cfg.network = Some(NetworkConfig {
            ipam_dir: dir.join("ipam"),
            ..NetworkConfig::default()
        });
        let rt = BuiltinRuntime::new(cfg).await.unwrap();
        if let Some(net) = &rt.inner.network {
            net.assume_set_up();
        }
        rt
    }

    #[tokio::test]
    async fn a_run_that_fails_at_its_log_directory_gives_the_address_back() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path()).await;
        // A log directory below a file cannot be made, root or not.
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let req = cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "p".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                    attempt: 0,
                }),
                log_directory: file.join("logs").to_string_lossy().into_owned(),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        };
        let err = rt.run_sandbox(req).await.unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("creating log directory"), "{err}");
        let net = rt.inner.network.as_ref().unwrap();
        assert_eq!(net.leases(), [], "the pod's address is still taken");
        assert!(rt.inner.records.all_sandboxes().is_empty());
        rt.leave();
    }
}
