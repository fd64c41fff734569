//! `nodelet run-node`: the kubelet. It runs the static pods of the configuration's
//! `staticPodPath` (and `staticPodURL`) and, given `--kubeconfig`, the pods the API server binds
//! to the node, with the built-in runtime, or with a remote CRI runtime when
//! `containerRuntimeEndpoint` is set (its images from `imageServiceEndpoint` when that differs).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use crate::config;
use crate::kubelet;

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node's name (default: the host name).
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The node's IP address.
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// A kubeconfig for the API server; without one the node runs standalone (static pods only).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Also serve the kubelet's runtime as CRI v1 on this socket (unix:///path), so crictl can
    /// look at what the node runs. Off by default.
    #[arg(long)]
    pub cri_listen: Option<String>,
}

pub async fn run(dirs: &super::Dirs, args: NodeArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = match &args.config {
        Some(path) => {
            let (cfg, warnings) = config::load(path)?;
            for w in warnings {
                tracing::warn!("{}: {w}", path.display());
            }
            cfg
        }
        // Without a file, the command line's legacy defaults for the server, as upstream.
        None => config::KubeletConfig {
            server: config::ServerConfig::legacy(),
            ..Default::default()
        },
    };
    cfg.root_dir = dirs.root.clone();
    if let Some(name) = args.hostname_override {
        cfg.node_name = name.to_lowercase();
    }
    cfg.node_ip = args.node_ip.or(cfg.node_ip);
    if args.kubeconfig.is_some() {
        cfg.kubeconfig = args.kubeconfig;
    }
    let client = match &cfg.kubeconfig {
        Some(path) => Some(crate::api::client_from_kubeconfig(path).await?),
        None => None,
    };
    let rt = open_runtime(&cfg, dirs).await?;
    if let Some(listen) = &args.cri_listen {
        let socket = runtime::endpoint::unix_socket_path(listen)?;
        let bound = runtime::server::bind_unix(&socket)?;
        let (r, i) = (rt.runtime.clone(), rt.images.clone());
        tokio::spawn(async move {
            let cfg = runtime::server::ServerConfig::default();
            if let Err(e) = runtime::server::serve(bound, r, i, cfg, std::future::pending()).await {
                tracing::error!("CRI server: {e}");
            }
        });
    }
    kubelet::run(cfg, rt, client, shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The runtime the configuration asks for: the built-in one, or the remote CRI runtime at
/// `containerRuntimeEndpoint` with its images from `imageServiceEndpoint` when that is set and
/// different (as upstream: the image service defaults to the runtime's endpoint).
pub async fn open_runtime(
    cfg: &config::KubeletConfig,
    dirs: &super::Dirs,
) -> anyhow::Result<kubelet::Runtime> {
    const CONNECT: std::time::Duration = std::time::Duration::from_secs(10);
    if cfg.container_runtime_endpoint.is_empty() {
        if !cfg.image_service_endpoint.is_empty() {
            anyhow::bail!(
                "imageServiceEndpoint {:?} needs a containerRuntimeEndpoint: the built-in runtime \
                 runs containers from its own image store",
                cfg.image_service_endpoint
            );
        }
        let mut builtin = dirs.builtin_config()?;
        builtin.network = Some(super::pod_network(
            &cfg.pod_bridge,
            &cfg.pod_cidr,
            cfg.pod_masquerade,
        )?);
        builtin.registry.insecure = cfg.insecure_registries.clone();
        let rt = runtime::builtin::BuiltinRuntime::new(builtin).await?;
        return Ok(kubelet::Runtime {
            runtime: Arc::new(rt.clone()),
            images: Arc::new(rt),
        });
    }
    if !cfg.insecure_registries.is_empty() {
        anyhow::bail!(
            "nodeletInsecureRegistries is the built-in runtime's; with containerRuntimeEndpoint \
             {:?}, configure the registries in that runtime",
            cfg.container_runtime_endpoint
        );
    }
    let remote = runtime::remote::connect(&cfg.container_runtime_endpoint, CONNECT).await?;
    let images = if cfg.image_service_endpoint.is_empty()
        || cfg.image_service_endpoint == cfg.container_runtime_endpoint
    {
        remote.clone()
    } else {
        runtime::remote::connect(&cfg.image_service_endpoint, CONNECT).await?
    };
    Ok(kubelet::Runtime {
        runtime: Arc::new(remote),
        images: Arc::new(images),
    })
}
