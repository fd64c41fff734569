//! VERSION: what a plugin says it speaks, asked once per executable.

use std::path::Path;

use serde_json::json;

use crate::exec::{self, Call};
use crate::{CURRENT_VERSION, Cni, Error, FileStamp, NetworkList, VersionInfo};

impl Cni {
    /// What the plugin of this type says to VERSION.
    pub async fn version(&self, plugin_type: &str) -> Result<VersionInfo, Error> {
        let path = exec::find(plugin_type, &self.settings.bin_dirs)?;
        self.version_of(plugin_type, &path).await
    }

    async fn version_of(&self, plugin_type: &str, path: &Path) -> Result<VersionInfo, Error> {
        let stdin = serde_json::to_vec(&json!({ "cniVersion": CURRENT_VERSION }))
            .map_err(|e| Error::io("serializing a VERSION request", e.into()))?;
        let stdout = exec::run(Call {
            plugin: plugin_type,
            path,
            command: "VERSION",
            // As libcni: plugins of old skel versions want these even for VERSION.
            env: vec![
                ("CNI_NETNS", "dummy".to_string()),
                ("CNI_IFNAME", "dummy".to_string()),
            ],
            stdin,
            cni_path: &self.cni_path,
            timeout: self.settings.timeout,
        })
        .await;
        let out = match stdout {
            Ok(out) => out,
            // Plugins from before VERSION (libcni takes them for 0.1.0).
            Err(Error::Plugin { msg, .. }) if msg == "unknown CNI_COMMAND: VERSION" => {
                return Ok(VersionInfo {
                    cni_version: "0.1.0".into(),
                    supported_versions: vec!["0.1.0".into()],
                });
            }
            Err(e) => return Err(e),
        };
        parse_version_info(plugin_type, out)
    }

    /// Refuses a plugin that does not speak the list's version (asking it once per executable).
    pub(crate) async fn check_plugin_version(
        &self,
        net: &NetworkList,
        plugin_type: &str,
    ) -> Result<(), Error> {
        let path = exec::find(plugin_type, &self.settings.bin_dirs)?;
        let stamp = file_stamp(&path);
        let known = self.versions.lock().ok().and_then(|v| {
            v.get(&path)
                .filter(|(s, _)| *s == stamp)
                .map(|(_, v)| v.clone())
        });
        let supported = match known {
            Some(supported) => supported,
            None => {
                let info = self.version_of(plugin_type, &path).await?;
                if let Ok(mut versions) = self.versions.lock() {
                    versions.insert(path.clone(), (stamp, info.supported_versions.clone()));
                }
                info.supported_versions
            }
        };
        if supported.contains(&net.cni_version) {
            Ok(())
        } else {
            Err(Error::Unsupported {
                plugin: Some(plugin_type.to_string()),
                what: format!(
                    "network {:?} is CNI {}, the plugin ({}) speaks {}",
                    net.name,
                    net.cni_version,
                    path.display(),
                    supported.join(", ")
                ),
            })
        }
    }
}

fn parse_version_info(plugin_type: &str, out: exec::Output) -> Result<VersionInfo, Error> {
    let bad = |why: String| Error::BadOutput {
        plugin: plugin_type.to_string(),
        command: "VERSION".to_string(),
        why,
        stderr: out.stderr.clone(),
    };
    let stdout = &out.stdout;
    #[derive(serde::Deserialize)]
    struct Raw {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
        #[serde(rename = "supportedVersions")]
        supported_versions: Option<Vec<String>>,
    }
    let raw: Raw = serde_json::from_slice(stdout).map_err(|e| bad(format!("not JSON: {e}")))?;
    let cni_version = raw
        .cni_version
        .filter(|v| !v.is_empty())
        .ok_or_else(|| bad("no \"cniVersion\"".to_string()))?;
    let supported_versions = match raw.supported_versions {
        Some(v) if !v.is_empty() => v,
        // As libcni: 0.2.0 plugins did not list them.
        _ if cni_version == "0.2.0" => vec!["0.1.0".into(), "0.2.0".into()],
        _ => return Err(bad("no \"supportedVersions\"".to_string())),
    };
    Ok(VersionInfo {
        cni_version,
        supported_versions,
    })
}

fn file_stamp(path: &Path) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => (m.ino(), m.len(), m.modified().ok()),
        Err(_) => (0, 0, None),
    }
}
