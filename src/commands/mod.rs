//! Node-local commands of the nodelet binary.

pub mod cri;
pub mod cri_check;
pub mod images;
pub mod node;
pub mod pods;
pub mod run;

/// Where the built-in runtime keeps its state: the global `--root-dir` and `--state-dir`.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub root: std::path::PathBuf,
    /// `None`: the runtime's default for the root dir.
    pub state: Option<std::path::PathBuf>,
}

impl Dirs {
    /// The built-in runtime's defaults for these dirs.
    pub fn builtin_config(&self) -> anyhow::Result<runtime::builtin::Config> {
        let mut cfg = runtime::builtin::Config::new(&self.root)?;
        cfg.state_dir = self.state.clone();
        Ok(cfg)
    }
}

/// Opens the built-in runtime in `dirs`, with the default pod network.
pub async fn builtin(dirs: &Dirs) -> anyhow::Result<runtime::builtin::BuiltinRuntime> {
    let cfg = dirs.builtin_config()?;
    Ok(runtime::builtin::BuiltinRuntime::new(cfg).await?)
}

/// The built-in runtime's registries: the registries config file or the registry hosts dir
/// when one is given (their plain-HTTP endpoints joining `insecure`; not both), else just the
/// `insecure` hosts.
pub fn registry_config(
    file: Option<&std::path::Path>,
    hosts_dir: Option<&std::path::Path>,
    insecure: &[String],
) -> anyhow::Result<runtime::builtin::RegistryConfig> {
    match (file, hosts_dir) {
        (Some(file), Some(dir)) => anyhow::bail!(
            "both a registries config ({}) and a registry hosts dir ({}) are set: use one",
            file.display(),
            dir.display()
        ),
        (Some(path), None) => Ok(runtime::builtin::RegistryConfig::from_file(path, insecure)?),
        (None, Some(dir)) => Ok(runtime::builtin::RegistryConfig::from_hosts_dir(
            dir, insecure,
        )?),
        (None, None) => Ok(runtime::builtin::RegistryConfig {
            insecure: insecure.to_vec(),
            ..Default::default()
        }),
    }
}

/// The built-in runtime's pod network on bridge `bridge` with subnets `cidr` (one, or one of
/// each family, comma-separated), masquerading
/// traffic that leaves the subnet (and the `cluster` subnets) when `masquerade`.
pub fn pod_network(
    bridge: &str,
    cidr: &str,
    masquerade: bool,
    cluster: &[String],
) -> anyhow::Result<runtime::builtin::NetworkConfig> {
    let cluster_cidrs = cluster
        .iter()
        .map(|c| runtime::builtin::parse_pod_cidr(c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(runtime::builtin::NetworkConfig {
        bridge: bridge.to_string(),
        pod_cidrs: runtime::builtin::parse_pod_cidrs(cidr)?,
        masquerade,
        cluster_cidrs,
        ..Default::default()
    })
}
