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

/// Parses `args` and runs the command; errors are printed, never panicked.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
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
