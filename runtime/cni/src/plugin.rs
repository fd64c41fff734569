//! Running one plugin of a list: its configuration as the spec has the runtime complete it.

use serde_json::{Map, Value};

use crate::exec::{self, Call};
use crate::{Cni, Error, NetworkList, Target};

impl Cni {
    /// Runs one plugin of `net` for `command`: its configuration with the list's `name` and
    /// `cniVersion`, `prevResult` and the `runtimeConfig` of the attachment's capability
    /// arguments it declares, and `extra`; returns its stdout.
    pub(crate) async fn run(
        &self,
        net: &NetworkList,
        plugin: &Map<String, Value>,
        command: &'static str,
        target: Option<&Target<'_>>,
        prev: Option<&Value>,
        extra: Option<Map<String, Value>>,
    ) -> Result<exec::Output, Error> {
        let plugin_type = plugin_type(net, plugin)?;
        let path = exec::find(plugin_type, &self.settings.bin_dirs)?;
        let mut conf = plugin.clone();
        // Reserved for the runtime (spec section 3).
        conf.retain(|k, _| !k.starts_with("cni.dev/"));
        conf.insert("name".into(), Value::String(net.name.clone()));
        conf.insert("cniVersion".into(), Value::String(net.cni_version.clone()));
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.clone());
        }
        let mut env = Vec::new();
        if let Some(target) = target {
            let runtime_config = runtime_config(plugin, target.capability_args);
            if !runtime_config.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
            }
            env = target.env();
        }
        if let Some(extra) = extra {
            conf.extend(extra);
        }
        let stdin = serde_json::to_vec(&conf).map_err(|e| {
            Error::io(
                format!("serializing the configuration of CNI plugin {plugin_type:?}"),
                e.into(),
            )
        })?;
        exec::run(Call {
            plugin: plugin_type,
            path: &path,
            command,
            env,
            stdin,
            cni_path: &self.cni_path,
            timeout: self.settings.timeout,
        })
        .await
    }
}

/// The capability arguments the plugin declares with `"capabilities": {"<key>": true}`.
fn runtime_config(plugin: &Map<String, Value>, args: &Map<String, Value>) -> Map<String, Value> {
    let Some(Value::Object(capabilities)) = plugin.get("capabilities") else {
        return Map::new();
    };
    capabilities
        .iter()
        .filter(|(_, on)| on.as_bool() == Some(true))
        .filter_map(|(key, _)| Some((key.clone(), args.get(key)?.clone())))
        .collect()
}

pub(crate) fn plugin_type<'a>(
    net: &NetworkList,
    plugin: &'a Map<String, Value>,
) -> Result<&'a str, Error> {
    match plugin.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ => Err(Error::Config {
            path: net.source.clone(),
            why: "a plugin without a string \"type\"".to_string(),
        }),
    }
}
