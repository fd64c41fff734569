//! `nodelet run-node`: the kubelet. It runs the static pods of the configuration's
//! `staticPodPath` (and `staticPodURL`) and, given `--kubeconfig`, the pods the API server binds
//! to the node, with the built-in runtime, or with a remote CRI runtime when
//! `containerRuntimeEndpoint` is set (its images from `imageServiceEndpoint` when that differs).

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
    /// The node's IP address, or one of each family for a dual-stack node
    /// (`10.0.0.5,fd00::5`, the first the primary).
    #[arg(long)]
    pub node_ip: Option<String>,
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
    if let Some(ips) = args.node_ip {
        cfg.node_ips = crate::config::flags::parse_node_ips(&ips)?;
    }
    if args.kubeconfig.is_some() {
        cfg.kubeconfig = args.kubeconfig;
    }
    run_agent(cfg, dirs, args.cri_listen.as_deref(), None).await
}

/// `nodelet` started as the kubelet (`kubelet --config=... --kubeconfig=...`): the layers of
/// configuration and the flags ([`config::flags`]) make the configuration, then the agent
/// runs as `run-node` runs it.
pub async fn run_kubelet(flags: config::flags::KubeletFlags) -> anyhow::Result<ExitCode> {
    for w in &flags.warnings {
        tracing::warn!("{w}");
    }
    let (mut cfg, warnings) = config::load_layers(&flags.layers)?;
    for w in warnings {
        tracing::warn!("configuration: {w}");
    }
    let dirs = super::Dirs {
        root: flags
            .root_dir
            .unwrap_or_else(|| config::KubeletConfig::default().root_dir),
        state: flags.state_dir,
    };
    cfg.root_dir = dirs.root.clone();
    cfg.cert_dir = flags.cert_dir;
    if let Some(name) = flags.hostname_override {
        cfg.node_name = name;
    }
    cfg.node_ips = flags.node_ips;
    cfg.registration.labels = flags.node_labels;
    cfg.registration.external_cloud_provider = flags.external_cloud_provider;
    cfg.pod_infra_container_image = flags.pod_infra_container_image;
    cfg.kubeconfig = kubeconfig(flags.kubeconfig, flags.bootstrap_kubeconfig.clone(), &cfg).await?;
    run_agent(
        cfg,
        &dirs,
        flags.cri_listen.as_deref(),
        flags.bootstrap_kubeconfig,
    )
    .await
}

/// The kubeconfig to use, as upstream decides: `--kubeconfig`, made first by TLS bootstrap
/// with `--bootstrap-kubeconfig` when it is missing or its client certificate expired
/// ([`crate::certificate::load_or_bootstrap`]: the node's key and certificate in the cert dir).
async fn kubeconfig(
    kubeconfig: Option<PathBuf>,
    bootstrap: Option<PathBuf>,
    cfg: &config::KubeletConfig,
) -> anyhow::Result<Option<PathBuf>> {
    match (kubeconfig, bootstrap) {
        (Some(k), Some(b)) => {
            crate::certificate::load_or_bootstrap(&k, &b, &cfg.cert_dir(), &cfg.node_name).await?;
            Ok(Some(k))
        }
        (Some(k), None) if k.exists() => Ok(Some(k)),
        (Some(k), None) => anyhow::bail!("--kubeconfig {} does not exist", k.display()),
        (None, Some(_)) => {
            anyhow::bail!("--bootstrap-kubeconfig needs --kubeconfig (where the result goes)")
        }
        (None, None) => Ok(None),
    }
}

/// Runs the node agent with `cfg` until SIGTERM or Ctrl-C; with `cri_listen`, the runtime is
/// also served over CRI there. With `rotateCertificates`, the client certificate is renewed
/// in its own task (falling back to `bootstrap` once it expired).
async fn run_agent(
    cfg: config::KubeletConfig,
    dirs: &super::Dirs,
    cri_listen: Option<&str>,
    bootstrap: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let client = match &cfg.kubeconfig {
        Some(path) if cfg.rotate_certificates => {
            let (client, reloader) = crate::api::reloadable_client(path).await?;
            let rotation = crate::certificate::Rotation::new(
                &cfg.cert_dir(),
                &cfg.node_name,
                client.clone(),
                reloader,
                bootstrap,
            );
            tokio::spawn(rotation.run());
            Some(client)
        }
        Some(path) => Some(crate::api::client_from_kubeconfig(path).await?),
        None => None,
    };
    let rt = open_runtime(&cfg, dirs).await?;
    if let Some(listen) = cri_listen {
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

/// The preload dir, with a remote runtime: imported into containerd through its own API at
/// the image service's endpoint (the same socket), before any pod syncs, then watched. A
/// runtime that is not containerd cannot take it: a warning when the dir holds something.
/// Returns what the preload pins, for the image service to report.
async fn preload_into_containerd(
    cfg: &config::KubeletConfig,
    images: &runtime::remote::RemoteRuntime,
) -> Option<runtime::preload::Pins> {
    let dir = cfg.image_preload_dir();
    let timeout = cfg.runtime_request_timeout;
    let ctd =
        match runtime::remote::containerd::Containerd::connect(images.endpoint(), timeout).await {
            Ok(ctd) => ctd,
            Err(e) => {
                if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
                    tracing::warn!(dir = %dir.display(), "image preload: not imported: {e}");
                } else {
                    tracing::debug!("image preload: no containerd API: {e}");
                }
                return None;
            }
        };
    tracing::info!(
        dir = %dir.display(),
        "image preload: into containerd {} at {}",
        ctd.version(),
        images.endpoint()
    );
    let mut preload =
        runtime::preload::Preload::containerd(ctd, images.clone(), &cfg.root_dir, &dir);
    preload.scan_files().await;
    let pins = preload.pins();
    tokio::spawn(preload.run(std::future::pending()));
    Some(pins)
}

/// The runtime the configuration asks for: the built-in one, or the remote CRI runtime at
/// `containerRuntimeEndpoint` with its images from `imageServiceEndpoint` when that is set and
/// different (as upstream: the image service defaults to the runtime's endpoint).
pub async fn open_runtime(
    cfg: &config::KubeletConfig,
    dirs: &super::Dirs,
) -> anyhow::Result<kubelet::Runtime> {
    // Calls get `runtimeRequestTimeout`; connecting, as before, 10 s, so that a runtime that is
    // not there is reported at once.
    let remote_cfg = runtime::remote::RemoteConfig {
        connect_timeout: std::time::Duration::from_secs(10),
        ..runtime::remote::RemoteConfig::new(cfg.runtime_request_timeout)
    };
    let connect = |endpoint: &str| {
        let (endpoint, cfg) = (endpoint.to_string(), remote_cfg.clone());
        async move { runtime::remote::RemoteRuntime::connect_with(&endpoint, cfg).await }
    };
    if cfg.container_runtime_endpoint.is_empty() {
        if !cfg.image_service_endpoint.is_empty() {
            anyhow::bail!(
                "imageServiceEndpoint {:?} needs a containerRuntimeEndpoint: the built-in runtime \
                 runs containers from its own image store",
                cfg.image_service_endpoint
            );
        }
        let mut builtin = dirs.builtin_config()?;
        // The kubelet's cgroup driver is the in-process runtime's too.
        builtin.systemd_cgroup = cfg.cgroups.driver == crate::config::CgroupDriver::Systemd;
        match &cfg.network.mode {
            crate::config::network::Mode::Bridge => {
                builtin.network = Some(super::pod_network(
                    &cfg.pod_bridge,
                    &cfg.pod_cidr,
                    cfg.pod_masquerade,
                    &cfg.network.cluster_cidrs,
                )?);
            }
            crate::config::network::Mode::Cni(c) => {
                builtin.network = None;
                builtin.cni = Some(runtime::builtin::CniConfig {
                    conf_dir: c.conf_dir.clone(),
                    bin_dirs: c.bin_dirs.clone(),
                    cache_dir: c.cache_dir.clone(),
                    ..Default::default()
                });
            }
        }
        builtin.registry = super::registry_config(
            cfg.registries_config.as_deref(),
            cfg.registry_hosts_dir.as_deref(),
            &cfg.insecure_registries,
        )?;
        builtin.cdi_spec_dirs = cfg.cdi_spec_dirs.clone();
        let rt = runtime::builtin::BuiltinRuntime::new(builtin).await?;
        // The dir's files are in the store before any pod syncs; lists are pulled later.
        let mut preload = rt.preload(&cfg.image_preload_dir());
        preload.scan_files().await;
        tokio::spawn(preload.run(std::future::pending()));
        return Ok(kubelet::Runtime {
            runtime: Arc::new(rt.clone()),
            images: Arc::new(rt),
        });
    }
    if let Some(dir) = &cfg.registry_hosts_dir {
        anyhow::bail!(
            "nodeletRegistryHostsDir ({}) is the built-in runtime's; with containerRuntimeEndpoint \
             {:?}, configure the registries in that runtime (containerd: its own config_path)",
            dir.display(),
            cfg.container_runtime_endpoint
        );
    }
    if let Some(file) = &cfg.registries_config {
        anyhow::bail!(
            "nodeletRegistriesConfig ({}) is the built-in runtime's; with containerRuntimeEndpoint \
             {:?}, configure the registries in that runtime",
            file.display(),
            cfg.container_runtime_endpoint
        );
    }
    if !cfg.insecure_registries.is_empty() {
        anyhow::bail!(
            "nodeletInsecureRegistries is the built-in runtime's; with containerRuntimeEndpoint \
             {:?}, configure the registries in that runtime",
            cfg.container_runtime_endpoint
        );
    }
    if cfg.cdi_spec_dirs != crate::config::KubeletConfig::default().cdi_spec_dirs {
        anyhow::bail!(
            "nodeletCDISpecDirs is the built-in runtime's; with containerRuntimeEndpoint {:?}, \
             configure the CDI spec dirs in that runtime (containerd: cdi_spec_dirs)",
            cfg.container_runtime_endpoint
        );
    }
    if let crate::config::network::Mode::Cni(_) = cfg.network.mode {
        anyhow::bail!(
            "nodeletNetwork.mode: cni is the built-in runtime's; with containerRuntimeEndpoint \
             {:?}, that runtime networks its pods (containerd: its CNI config)",
            cfg.container_runtime_endpoint
        );
    }
    let remote = connect(&cfg.container_runtime_endpoint).await?;
    let images = if cfg.image_service_endpoint.is_empty()
        || cfg.image_service_endpoint == cfg.container_runtime_endpoint
    {
        remote.clone()
    } else {
        connect(&cfg.image_service_endpoint).await?
    };
    let pins = preload_into_containerd(cfg, &images).await;
    let images: Arc<dyn runtime::ImageService> = match pins {
        Some(pins) => Arc::new(runtime::preload::PinnedImages::new(Arc::new(images), pins)),
        None => Arc::new(images),
    };
    Ok(kubelet::Runtime {
        runtime: Arc::new(remote),
        images,
    })
}
