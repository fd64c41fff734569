//! Node-local commands of the nodelet binary.

pub mod cri;
pub mod images;
pub mod node;
pub mod pods;
pub mod run;

/// Opens the built-in runtime under `root_dir`.
pub async fn builtin(
    root_dir: &std::path::Path,
) -> anyhow::Result<runtime::builtin::BuiltinRuntime> {
    let cfg = runtime::builtin::Config::new(root_dir)?;
    Ok(runtime::builtin::BuiltinRuntime::new(cfg).await?)
}
