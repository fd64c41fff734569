//! `nodelet cri check`: the project's CRI scenario suite (and, with `--bench`, its lifecycle
//! timings) run against one or more CRI endpoints, printed side by side. Exit status 0 when
//! every endpoint passes every scenario run, 1 when one fails, 2 on bad usage.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args, ValueEnum};
use regex::Regex;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("test_image").required(true).args(["image", "image_archive"])))]
pub struct CheckArgs {
    /// A CRI runtime to check (unix:///path or a path); repeat to compare runtimes, the first
    /// being the one the timings are compared with.
    #[arg(long = "endpoint", required = true)]
    pub endpoints: Vec<String>,
    /// The image service's socket when it is not the runtime's (applies to every endpoint).
    #[arg(long)]
    pub image_endpoint: Option<String>,
    /// The test image, pulled by each runtime (a shell-bearing image: busybox or alike).
    #[arg(long)]
    pub image: Option<String>,
    /// The test image as an OCI or `docker save` archive, served to each runtime by a registry
    /// on loopback for the run (no network needed).
    #[arg(long)]
    pub image_archive: Option<PathBuf>,
    /// How the report is printed.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Only scenarios whose name this regex matches (unanchored).
    #[arg(long, value_parser = parse_regex)]
    pub focus: Option<Regex>,
    /// No scenario whose name this regex matches (unanchored).
    #[arg(long, value_parser = parse_regex)]
    pub skip: Option<Regex>,
    /// Also time the lifecycle's CRI calls and measure the runtime's memory.
    #[arg(long)]
    pub bench: bool,
    /// The bench's lifecycles per endpoint.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// Deadline of each CRI call, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Where the registry serving --image-archive listens. The runtimes must reach it over
    /// plain HTTP: loopback registries are, on containerd and nodelet; a containerd whose
    /// registry hosts dir has a `_default` entry needs one for this host:port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub registry_listen: std::net::SocketAddr,
    /// List the scenarios (after --focus and --skip) and exit.
    #[arg(long)]
    pub list: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
    Junit,
}

fn parse_regex(s: &str) -> Result<Regex, regex::Error> {
    Regex::new(s)
}

pub async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let image = match (&args.image, &args.image_archive) {
        (Some(r), _) => cri_check::ImageSource::Reference(r.clone()),
        (None, Some(path)) => {
            if !path.exists() {
                eprintln!("nodelet: --image-archive {}: no such file", path.display());
                return Ok(ExitCode::from(2));
            }
            cri_check::ImageSource::Archive(path.clone())
        }
        (None, None) => {
            eprintln!("nodelet: one of --image or --image-archive is required");
            return Ok(ExitCode::from(2));
        }
    };
    let run_id = cri_check::new_run_id();
    let work_dir = std::env::temp_dir().join(format!("nodelet-cri-check-{run_id}"));
    let opts = cri_check::Options {
        image,
        focus: args.focus,
        skip: args.skip,
        bench: args.bench.then_some(args.iterations),
        call_timeout: Duration::from_secs(args.timeout),
        scenario_timeout: Duration::from_secs(args.timeout * 5),
        work_dir: work_dir.clone(),
        run_id,
        registry_listen: Some(args.registry_listen),
    };
    if args.list {
        for s in opts.selected() {
            println!("{:<44} {}", s.name, s.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if opts.selected().is_empty() && opts.bench.is_none() {
        eprintln!("nodelet: --focus and --skip select no scenario (see --list)");
        return Ok(ExitCode::from(2));
    }
    let mut targets = Vec::new();
    for endpoint in &args.endpoints {
        let timeout = opts.call_timeout;
        targets.push(cri_check::connect(endpoint, args.image_endpoint.as_deref(), timeout).await?);
    }
    let cancel = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let on_signal = cancel.clone();
    let watcher = tokio::spawn(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::warn!("{which}: stopping the check and removing what it made");
        on_signal.cancel();
    });
    tracing::info!(run = %opts.run_id, "checking {} endpoint(s)", targets.len());
    let report = cri_check::run(&targets, &opts, &cancel).await;
    // Whatever a scenario cut short left behind, on every endpoint.
    for target in &targets {
        for e in cri_check::cleanup(target, &opts.run_id, None, opts.call_timeout).await {
            tracing::warn!(endpoint = %target.endpoint, "cleanup: {e}");
        }
    }
    watcher.abort();
    if let Err(e) = std::fs::remove_dir_all(&work_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %work_dir.display(), "removing the work dir: {e}");
    }
    let report = report?;
    match args.output {
        Output::Text => print!("{}", report.to_text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report.to_json())?),
        Output::Junit => print!("{}", report.to_junit()),
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
