//! `nodelet run`: one container in a fresh pod sandbox, driven through the CRI-shaped
//! `RuntimeService` exactly as the kubelet drives it; its output is printed from the CRI log
//! file as it is written, and nodelet exits with the container's exit code.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use runtime::{RuntimeService, cri};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Image to run (it must be in the store: see `nodelet images import`).
    pub image: String,
    /// Command and arguments (default: the image's entrypoint and cmd).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Pod and container name.
    #[arg(long, default_value = "run")]
    pub name: String,
    /// Use the node's network namespace.
    #[arg(long)]
    pub host_network: bool,
    /// Keep the pod after the container exits (default: remove it).
    #[arg(long)]
    pub keep: bool,
}

pub async fn run(dirs: &super::Dirs, args: RunArgs) -> anyhow::Result<ExitCode> {
    let rt = super::builtin(dirs).await?;
    let log_dir = dirs.root.join("run-logs").join(&args.name);
    let uid = format!("run-{}-{}", args.name, std::process::id());
    let mut ns = cri::NamespaceOption::default();
    if args.host_network {
        ns.network = cri::NamespaceMode::Node as i32;
    }
    ns.pid = cri::NamespaceMode::Container as i32;
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: args.name.clone(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: args.name.clone(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(ns),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .pod_sandbox_id;
    let result = run_in(&rt, &sandbox_id, &sandbox_config, &args, &log_dir).await;
    if !args.keep {
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sandbox_id.clone(),
            })
            .await;
        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id,
        })
        .await?;
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    let code = result?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

async fn run_in(
    rt: &runtime::builtin::BuiltinRuntime,
    sandbox_id: &str,
    sandbox_config: &cri::PodSandboxConfig,
    args: &RunArgs,
    log_dir: &Path,
) -> anyhow::Result<i32> {
    let container_id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: args.name.clone(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: args.image.clone(),
                    ..Default::default()
                }),
                command: args.command.clone(),
                log_path: format!("{}/0.log", args.name),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config.clone()),
        })
        .await?
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: container_id.clone(),
    })
    .await?;
    let log = log_dir.join(&args.name).join("0.log");
    let mut follower = LogFollower::new(log);
    loop {
        let status = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: container_id.clone(),
                verbose: false,
            })
            .await?
            .status
            .ok_or_else(|| anyhow::anyhow!("container status missing"))?;
        let exited = status.state == cri::ContainerState::ContainerExited as i32;
        follower.print_new()?;
        if exited {
            return Ok(status.exit_code);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints the content of CRI log records appended to a file since the last call.
struct LogFollower {
    path: PathBuf,
    offset: u64,
    pending: Vec<u8>,
}

impl LogFollower {
    fn new(path: PathBuf) -> Self {
        LogFollower {
            path,
            offset: 0,
            pending: Vec::new(),
        }
    }

    fn print_new(&mut self) -> std::io::Result<()> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Ok(());
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        self.offset += f.read_to_end(&mut buf)? as u64;
        self.pending.extend_from_slice(&buf);
        let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
        while let Some(n) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=n).collect();
            let Some(rec) = crate::crilog::parse(&line[..line.len() - 1]) else {
                continue;
            };
            let sink: &mut dyn Write = if rec.stream == "stderr" {
                &mut err
            } else {
                &mut out
            };
            sink.write_all(&rec.content)?;
            if !rec.partial {
                sink.write_all(b"\n")?;
            }
        }
        out.flush()?;
        err.flush()
    }
}
