//! The command line: global flags and subcommands, parsed with clap, run on a tokio runtime
//! that is built only here (never in the sandbox process).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands;

/// A Kubernetes node agent with a built-in container runtime.
#[derive(Debug, Parser)]
#[command(name = "nodelet", version, about)]
pub struct Cli {
    /// Where nodelet keeps its state: images, sandboxes, containers.
    #[arg(long, global = true, default_value = "/var/lib/nodelet")]
    pub root_dir: PathBuf,
    /// Where the built-in runtime keeps what need not survive a reboot (sandbox sockets,
    /// container bundles and statuses); default: a dir per root dir under
    /// /run/nodelet/state (on tmpfs).
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage the built-in runtime's image store.
    #[command(subcommand)]
    Images(commands::images::ImagesCommand),
    /// Run one container in a new pod sandbox through the built-in runtime, print its output
    /// and exit with its exit code.
    Run(commands::run::RunArgs),
    /// Serve the built-in runtime over CRI v1 gRPC (for crictl, a kubelet, another nodelet).
    #[command(subcommand)]
    Cri(commands::cri::CriCommand),
    /// Run the node agent (standalone: the static pods of the configuration).
    RunNode(commands::node::NodeArgs),
    /// List the pods the built-in runtime runs, with their containers.
    Pods,
}

/// The subcommands' names: an argument that is one of them means nodelet's own command line.
const SUBCOMMANDS: [&str; 6] = ["images", "run", "cri", "run-node", "pods", "help"];

/// Parses `args` and runs the command; errors are printed, never panicked.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
    if kubelet_invocation(&args) {
        return kubelet_main(&args[1..]);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    crate::logging::init();
    // Commands that may reach a registry over TLS; before the async runtime's threads exist.
    if matches!(
        cli.command,
        Command::Images(_) | Command::Run(_) | Command::RunNode(_) | Command::Cri(_)
    ) {
        trust_roots(&cli.root_dir);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodelet: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dirs = commands::Dirs {
        root: cli.root_dir,
        state: cli.state_dir,
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Images(cmd) => commands::images::run(&dirs, cmd).await,
            Command::Run(args) => commands::run::run(&dirs, args).await,
            Command::RunNode(args) => commands::node::run(&dirs, args).await,
            Command::Pods => commands::pods::run(&dirs).await,
            Command::Cri(cmd) => commands::cri::run(&dirs, cmd).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nodelet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Gives TLS clients the roots built into the binary when the node has no CA certificates
/// (see `images::fallback_trust_roots`); a failure to write them is logged and changes nothing.
/// Call before any thread starts.
fn trust_roots(root_dir: &std::path::Path) {
    match runtime::builtin::fallback_trust_roots(root_dir) {
        Ok(None) => {}
        Ok(Some(path)) => tracing::warn!(
            file = %path.display(),
            "no CA certificates on this node (/etc/ssl/certs, SSL_CERT_FILE, SSL_CERT_DIR): \
             TLS peers are verified against the Mozilla roots built into nodelet"
        ),
        Err(e) => tracing::warn!(
            "no CA certificates on this node, and writing the built-in ones to {} failed: {e}; \
             HTTPS registries cannot be reached",
            root_dir.display()
        ),
    }
}

/// Whether the command line is the kubelet's: the binary is called `kubelet` (a link to
/// nodelet where upstream's kubelet was), or it is given flags and no subcommand (`nodelet
/// --config=/etc/kubelet.yaml`). `nodelet`, `nodelet --help` and `nodelet --version` alone stay
/// nodelet's.
pub fn kubelet_invocation(args: &[std::ffi::OsString]) -> bool {
    let called_kubelet = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "kubelet");
    if called_kubelet {
        return true;
    }
    let rest: Vec<&str> = args
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .collect();
    let mut i = 0;
    while let Some(a) = rest.get(i) {
        if *a == "--" {
            break;
        }
        match a.strip_prefix("--") {
            Some(flag) if !flag.contains('=') && crate::config::flags::takes_value(flag) => i += 2,
            Some(_) => i += 1,
            None if a.starts_with('-') => i += 1,
            None => return !SUBCOMMANDS.contains(a),
        }
    }
    let own = ["--help", "-h", "--version", "-V"];
    !rest.is_empty() && !rest.iter().all(|a| own.contains(a))
}

/// Runs nodelet as the kubelet: upstream's flags (`kubelet --help`), `--version` printing the
/// Kubernetes version implemented, a bad flag refused with exit code 1.
fn kubelet_main(args: &[std::ffi::OsString]) -> ExitCode {
    let mut strings = Vec::with_capacity(args.len());
    for a in args {
        match a.to_str() {
            Some(s) => strings.push(s.to_string()),
            None => {
                eprintln!("kubelet: argument {a:?} is not UTF-8");
                return ExitCode::FAILURE;
            }
        }
    }
    let flags = match crate::config::flags::parse(&strings) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kubelet: {e}");
            eprintln!("Run 'kubelet --help' for the flags.");
            return ExitCode::FAILURE;
        }
    };
    if flags.help {
        print!("{}", crate::config::flags::usage());
        return ExitCode::SUCCESS;
    }
    if flags.version {
        println!("Kubernetes v{}", crate::version::KUBERNETES_VERSION);
        return ExitCode::SUCCESS;
    }
    crate::logging::init_verbosity(flags.verbosity);
    trust_roots(
        &flags
            .root_dir
            .clone()
            .unwrap_or_else(|| crate::config::KubeletConfig::default().root_dir),
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(commands::node::run_kubelet(flags)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubelet: {e:#}");
            ExitCode::FAILURE
        }
    }
}
