//! `nodelet cri check` lives in [`super::cri_check`].
//!
//! `nodelet cri serve`: the built-in runtime as a CRI v1 gRPC server on a unix socket, so
//! crictl, a kubelet or another nodelet (through the remote backend) can drive it. Serves until
//! SIGINT or SIGTERM; the pods and containers outlive the server and are adopted by the next one.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Subcommand)]
pub enum CriCommand {
    /// Serve the built-in runtime's CRI v1 RuntimeService and ImageService until SIGINT/SIGTERM.
    Serve(Box<ServeArgs>),
    /// Run the CRI scenario suite (and with --bench the lifecycle timings) against one or more
    /// CRI endpoints and print the results side by side.
    Check(super::cri_check::CheckArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The socket to serve on: unix:///path or a plain path.
    #[arg(long, default_value = "unix:///run/nodelet/cri.sock")]
    pub listen: String,
    /// Deadline of each CRI call, in seconds; PullImage has its own, an ExecSync with a
    /// timeout gets it on top, one without runs until its command ends.
    #[arg(long, default_value_t = 120)]
    pub request_timeout: u64,
    /// Deadline of PullImage, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub pull_image_timeout: u64,
    /// The cgroup pods go under when CRI gives no cgroup parent.
    #[arg(long, default_value = "/nodelet")]
    pub cgroup_root: String,
    /// How pods' cgroups are made: `cgroupfs` (cgroup parents are cgroupfs paths) or `systemd`
    /// (cgroup parents are slice names; each pod gets a delegated systemd scope; cgroup v1 or v2),
    /// reported to the kubelet through RuntimeConfig.
    #[arg(long, default_value = "cgroupfs", value_parser = ["cgroupfs", "systemd"])]
    pub cgroup_driver: String,
    /// Registries (host[:port]) that PullImage may reach over plain http.
    #[arg(long = "insecure-registry")]
    pub insecure: Vec<String>,
    /// The registries config file (k3s's registries.yaml shape: mirrors, rewrites,
    /// credentials, CAs).
    #[arg(long)]
    pub registries_config: Option<PathBuf>,
    /// The registry hosts dir (containerd's certs.d layout: `<registry>/hosts.toml`), instead
    /// of --registries-config.
    #[arg(long)]
    pub registry_hosts_dir: Option<PathBuf>,
    /// Where the streaming server (the URLs of Exec and PortForward) listens; port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub streaming_addr: std::net::SocketAddr,
    /// The subnet pods get their addresses from, or one of each family comma-separated (dual
    /// stack); the bridge takes the first address of each.
    #[arg(long, default_value = "10.88.0.0/16")]
    pub pod_cidr: String,
    /// The node's bridge pods are connected to (created when missing).
    #[arg(long, default_value = "nodelet0")]
    pub pod_bridge: String,
    /// Masquerade pod traffic leaving the pod subnet (`--pod-masquerade false` when the network
    /// routes the pod subnet).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pod_masquerade: bool,
    /// Image archives (and `*.txt` lists of references) imported, pinned, and watched; default
    /// `<root-dir>/images-preload`.
    #[arg(long)]
    pub image_preload_dir: Option<PathBuf>,
    /// A CDI spec dir (repeat it for several, later ones taking priority); given, the list
    /// replaces the default /etc/cdi and /var/run/cdi.
    #[arg(
        long = "cdi-spec-dir",
        default_values = runtime::builtin::DEFAULT_CDI_SPEC_DIRS.iter().copied()
    )]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// How pods are networked: `bridge` (the runtime's own, `--pod-cidr` and `--pod-bridge`)
    /// or `cni` (the first config in `--cni-conf-dir`, through the plugins in `--cni-bin-dir`).
    #[arg(long, default_value = "bridge", value_parser = ["bridge", "cni"])]
    pub network: String,
    /// Mode cni: where the CNI config is (the first `.conf`, `.conflist` or `.json` by name).
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Mode cni: where the plugins are (repeat it for several dirs, searched in order).
    #[arg(long = "cni-bin-dir", default_values = ["/opt/cni/bin"])]
    pub cni_bin_dirs: Vec<PathBuf>,
    /// Mode cni: libcni's cache (the results of ADDs, for DEL, CHECK and GC).
    #[arg(long, default_value = "/var/lib/cni")]
    pub cni_cache_dir: PathBuf,
    /// Mode cni: the deadline of each plugin call, in seconds (a plugin still running then is
    /// killed and the call fails).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub cni_plugin_timeout: u64,
}

pub async fn run(dirs: &super::Dirs, cmd: CriCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CriCommand::Serve(args) => serve(dirs, *args).await,
        CriCommand::Check(args) => super::cri_check::run(args).await,
    }
}

async fn serve(dirs: &super::Dirs, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let socket: PathBuf = runtime::endpoint::unix_socket_path(&args.listen)?;
    // Set up the signal handlers before serving, so an early SIGTERM is not lost.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{which}: stopping the CRI server");
    };

    // Bind first: a second server on a live socket fails before opening (adopting) anything.
    let bound = runtime::server::bind_unix(&socket)?;
    let mut cfg = dirs.builtin_config()?;
    cfg.cgroup_root = args.cgroup_root;
    cfg.systemd_cgroup = args.cgroup_driver == "systemd";
    cfg.registry = super::registry_config(
        args.registries_config.as_deref(),
        args.registry_hosts_dir.as_deref(),
        &args.insecure,
    )?;
    cfg.streaming.addr = args.streaming_addr;
    if args.network == "cni" {
        cfg.network = None;
        cfg.cni = Some(runtime::builtin::CniConfig {
            conf_dir: args.cni_conf_dir,
            bin_dirs: args.cni_bin_dirs,
            cache_dir: args.cni_cache_dir,
            timeout: std::time::Duration::from_secs(args.cni_plugin_timeout),
        });
    } else {
        cfg.network = Some(super::pod_network(
            &args.pod_bridge,
            &args.pod_cidr,
            args.pod_masquerade,
            &[],
        )?);
    }
    cfg.cdi_spec_dirs = args.cdi_spec_dirs;
    let preload_dir = args
        .image_preload_dir
        .unwrap_or_else(|| cfg.root_dir.join("images-preload"));
    let rt = match runtime::builtin::BuiltinRuntime::new(cfg).await {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            // Refused (a bad config, a root dir another runtime holds): no socket is left
            // behind that nothing serves.
            drop(bound);
            let _ = std::fs::remove_file(&socket);
            return Err(e.into());
        }
    };
    // The dir's files are in the store before the socket serves; lists are pulled later.
    let mut preload = rt.preload(&preload_dir);
    preload.scan_files().await;
    tokio::spawn(preload.run(std::future::pending()));
    let server_cfg = runtime::server::ServerConfig {
        request_timeout: Duration::from_secs(args.request_timeout),
        pull_image_timeout: Duration::from_secs(args.pull_image_timeout),
        ..Default::default()
    };
    runtime::server::serve(bound, rt.clone(), rt, server_cfg, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn cdi_spec_dirs_default_and_repeat() {
        let dirs = |argv: &[&str]| {
            Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
                .expect("parses")
                .args
                .cdi_spec_dirs
        };
        assert_eq!(
            dirs(&[]),
            [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        assert_eq!(
            dirs(&["--cdi-spec-dir", "/a", "--cdi-spec-dir=/b"]),
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
    }
}
