//! `nodelet images`: import, list, pull and remove images of the built-in runtime's store.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use runtime::{ImageService, cri};

#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Import images from OCI layout dirs, OCI archives or `docker save` tarballs (air-gapped nodes).
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// List the images in the store.
    List,
    /// Pull an image from a registry.
    Pull {
        image: String,
        /// Registries (host[:port]) that may be reached over plain http.
        #[arg(long = "insecure-registry")]
        insecure: Vec<String>,
        /// The registries config file (k3s's registries.yaml shape: mirrors, rewrites,
        /// credentials, CAs).
        #[arg(long)]
        registries_config: Option<std::path::PathBuf>,
        /// The registry hosts dir (containerd's certs.d layout: `<registry>/hosts.toml`),
        /// instead of --registries-config.
        #[arg(long)]
        registry_hosts_dir: Option<std::path::PathBuf>,
    },
    /// Remove an image and all its tags.
    Remove { image: String },
    /// Pin an image: the kubelet's image garbage collection never removes it (CRI `pinned`).
    Pin { image: String },
    /// Unpin an image: garbage collection may remove it again once it is unused.
    Unpin { image: String },
}

pub async fn run(dirs: &super::Dirs, cmd: ImagesCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ImagesCommand::Import { files } => {
            let rt = super::builtin(dirs).await?;
            for f in files {
                let imported = rt
                    .image_store()
                    .import(&f)
                    .map_err(|e| anyhow::anyhow!("importing {}: {e}", f.display()))?;
                for img in imported {
                    println!("{} {}", short(&img.id), img.repo_tags.join(","));
                }
            }
        }
        ImagesCommand::List => {
            let rt = super::builtin(dirs).await?;
            let images = rt
                .list_images(cri::ListImagesRequest { filter: None })
                .await?
                .images;
            println!("{:<14} {:>10}  {:<6}  TAGS", "IMAGE ID", "SIZE", "PINNED");
            for img in images {
                println!(
                    "{:<14} {:>10}  {:<6}  {}",
                    short(&img.id),
                    human(img.size),
                    if img.pinned { "yes" } else { "" },
                    img.repo_tags.join(",")
                );
            }
        }
        ImagesCommand::Pull {
            image,
            insecure,
            registries_config,
            registry_hosts_dir,
        } => {
            let mut cfg = dirs.builtin_config()?;
            cfg.registry = super::registry_config(
                registries_config.as_deref(),
                registry_hosts_dir.as_deref(),
                &insecure,
            )?;
            let rt = runtime::builtin::BuiltinRuntime::new(cfg).await?;
            let r = rt
                .pull_image(cri::PullImageRequest {
                    image: Some(cri::ImageSpec {
                        image,
                        ..Default::default()
                    }),
                    auth: None,
                    sandbox_config: None,
                })
                .await?;
            println!("{}", r.image_ref);
        }
        ImagesCommand::Pin { image } => pin(dirs, &image, true).await?,
        ImagesCommand::Unpin { image } => pin(dirs, &image, false).await?,
        ImagesCommand::Remove { image } => {
            let rt = super::builtin(dirs).await?;
            // RemoveImage is idempotent in CRI; the command says when there was nothing to remove.
            if rt.image_store().resolve(&image)?.is_none() {
                anyhow::bail!("no image {image:?}");
            }
            rt.remove_image(cri::RemoveImageRequest {
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
            })
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

fn human(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "kB", "MB", "GB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.1}{}", UNITS[u])
}

/// Pins or unpins `image` in the built-in runtime's store and prints its id.
async fn pin(dirs: &super::Dirs, image: &str, pinned: bool) -> anyhow::Result<()> {
    let rt = super::builtin(dirs).await?;
    let img = rt.image_store().set_pinned(image, pinned).map_err(|e| {
        anyhow::anyhow!(
            "{} {image}: {e}",
            if pinned { "pinning" } else { "unpinning" }
        )
    })?;
    println!(
        "{} {}",
        short(&img.id),
        if pinned { "pinned" } else { "unpinned" }
    );
    Ok(())
}
