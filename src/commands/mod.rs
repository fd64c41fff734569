//! Node-local commands of the nodelet binary.

pub mod cri;
pub mod images;
pub mod node;
pub mod pods;
pub mod run;

/// Opens the built-in runtime under `root_dir`, with the default pod network.
pub async fn builtin(
    root_dir: &std::path::Path,
) -> anyhow::Result<runtime::builtin::BuiltinRuntime> {
    let cfg = runtime::builtin::Config::new(root_dir)?;
    Ok(runtime::builtin::BuiltinRuntime::new(cfg).await?)
}

/// The built-in runtime's pod network on bridge `bridge` with subnet `cidr`, masquerading
/// traffic that leaves the subnet when `masquerade`.
pub fn pod_network(
    bridge: &str,
    cidr: &str,
    masquerade: bool,
) -> anyhow::Result<runtime::builtin::NetworkConfig> {
    Ok(runtime::builtin::NetworkConfig {
        bridge: bridge.to_string(),
        pod_cidr: runtime::builtin::parse_pod_cidr(cidr)?,
        masquerade,
        ..Default::default()
    })
}
