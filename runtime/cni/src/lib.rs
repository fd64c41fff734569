//! The runtime side of CNI ([the spec], 0.3.0 to 1.1.0), as libcni does it: network
//! configuration lists loaded from a conf dir ([`load`]), and their plugins run for an attachment
//! of a container to the network ([`Cni::add`], [`Cni::del`], [`Cni::check`]), for the network
//! ([`Cni::status`], [`Cni::gc`]) and for a plugin ([`Cni::version`]). The results of ADDs are
//! cached in libcni's format and place, so that DEL, CHECK and GC have them (and other tools
//! read them).
//!
//! It knows nothing of CRI or Kubernetes: nodelet's built-in runtime uses it for its pods.
//!
//! [the spec]: https://github.com/containernetworking/cni/blob/main/SPEC.md

mod cache;
mod config;
mod error;
mod exec;
mod result;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

pub use cache::CachedAttachment;
pub use config::{CURRENT_VERSION, Loaded, NetworkList, SUPPORTED_VERSIONS, load};
pub use error::{Error, UNPARSABLE};
pub use result::{CniResult, Dns, Interface, InvalidResult, IpConfig, Route};

use config::at_least;
use exec::Call;

/// Where the configuration, the plugins and the cache are, and how long a plugin may run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The dir [`load`] reads (this crate only keeps it for its user).
    pub conf_dir: PathBuf,
    /// Where plugins are looked for, in order; also their CNI_PATH.
    pub bin_dirs: Vec<PathBuf>,
    /// The cache's root: entries are in `results/` under it (libcni's is `/var/lib/cni`).
    pub cache_dir: PathBuf,
    /// How long one run of one plugin may take.
    pub timeout: Duration,
}

/// What identifies one attachment of a container to a network, and its parameters.
#[derive(Debug, Clone, Default)]
pub struct Attachment {
    pub container_id: String,
    /// The network namespace (CNI_NETNS).
    pub netns: PathBuf,
    /// The interface in the container (CNI_IFNAME).
    pub ifname: String,
    /// CNI_ARGS pairs; `IgnoreUnknown=1` always comes first.
    pub args: Vec<(String, String)>,
    /// Capability arguments ("portMappings", "bandwidth", "dns", "cgroupPath", …); a plugin's
    /// `runtimeConfig` gets those its configuration declares in `capabilities`.
    pub capability_args: Map<String, Value>,
}

/// What a plugin's VERSION says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    pub cni_version: String,
    pub supported_versions: Vec<String>,
}

/// What a [`Cni::gc`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The (container ID, ifname) of the stale attachments deleted.
    pub deleted: Vec<(String, String)>,
    /// What failed: DELs of stale attachments, and the plugins' GC.
    pub errors: Vec<String>,
}

/// The CNI invoker. GC takes its lock exclusively, ADD, DEL and CHECK shared: GC never runs
/// alongside them (the spec's rule).
pub struct Cni {
    settings: Settings,
    cni_path: String,
    lock: tokio::sync::RwLock<()>,
    /// What each plugin executable said to VERSION, by path; an executable replaced since (other
    /// inode, size or mtime) is asked again.
    versions: Mutex<HashMap<PathBuf, (FileStamp, Vec<String>)>>,
}

type FileStamp = (u64, u64, Option<SystemTime>);

/// The parameters of one attachment as given to the plugins.
struct Target<'a> {
    container_id: &'a str,
    netns: &'a Path,
    ifname: &'a str,
    args: &'a [(String, String)],
    capability_args: &'a Map<String, Value>,
}

impl Cni {
    pub fn new(settings: Settings) -> Self {
        let cni_path = settings
            .bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        Cni {
            settings,
            cni_path,
            lock: tokio::sync::RwLock::new(()),
            versions: Mutex::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Attaches the container to the network: every plugin's ADD, in order, each given the result
    /// of the one before as `prevResult`; returns the last one's result.
    ///
    /// First every plugin is asked (VERSION, once per executable) whether it speaks the list's
    /// version. Then the cache entry is written without a result, so an attachment interrupted
    /// half-way is known to GC; it gets the result at the end. When anything fails after that,
    /// the whole list is DELeted (in reverse, without `prevResult`), the entry removed if that
    /// worked (kept for GC if not), and the error of the ADD returned.
    pub async fn add(&self, net: &NetworkList, att: &Attachment) -> Result<CniResult, Error> {
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, true)?;
        for plugin in &net.plugins {
            self.check_plugin_version(net, plugin_type(net, plugin)?)
                .await?;
        }
        let mut entry = CachedAttachment {
            path: self.entry_path(&net.name, att),
            network_name: net.name.clone(),
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            netns: att.netns.clone(),
            args: att.args.clone(),
            capability_args: att.capability_args.clone(),
            config: net.raw.clone(),
            result: None,
        };
        write_entry(entry.clone()).await?;

        let target = Target::of(att);
        let outcome = match self.add_plugins(net, &target).await {
            Ok(result) => {
                entry.result = Some(result.raw.clone());
                write_entry(entry.clone()).await.map(|()| result)
            }
            Err(e) => Err(e),
        };
        let error = match outcome {
            Ok(result) => return Ok(result),
            Err(e) => e,
        };
        tracing::debug!(network = %net.name, container = %att.container_id, error = %error, "CNI ADD failed; deleting");
        match self.del_plugins(net, &target, None).await {
            Ok(()) => {
                if let Err(e) = remove_entry(entry.path.clone()).await {
                    tracing::warn!(error = %e, "removing the CNI cache entry of a failed ADD");
                }
            }
            Err(del) => tracing::warn!(
                network = %net.name,
                container = %att.container_id,
                ifname = %att.ifname,
                error = %del,
                "DEL after a failed CNI ADD failed too; its cache entry stays for GC"
            ),
        }
        Err(error)
    }

    /// Detaches the container: every plugin's DEL, in reverse order. With a cache entry, the list
    /// is the one the ADD used (whatever the conf dir holds now), `prevResult` its result, and the
    /// CNI_ARGS and capability arguments its own; without one, `net` and `att` as they are. The
    /// entry goes when all succeed. DELs of what was never added, or is gone, succeed (plugins
    /// must make them so).
    pub async fn del(&self, net: &NetworkList, att: &Attachment) -> Result<(), Error> {
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, false)?;
        let path = self.entry_path(&net.name, att);
        let cached = match cache::read(&path) {
            Ok(cached) => cached,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable CNI cache entry; DEL without it");
                None
            }
        };
        match cached {
            Some(entry) => {
                let netns = if att.netns.as_os_str().is_empty() {
                    &entry.netns
                } else {
                    &att.netns
                };
                let target = Target {
                    container_id: &att.container_id,
                    netns,
                    ifname: &att.ifname,
                    args: &entry.args,
                    capability_args: &entry.capability_args,
                };
                self.del_cached(net, &entry, &target).await
            }
            None => {
                self.del_plugins(net, &Target::of(att), None).await?;
                // One may have been written since (a concurrent ADD is the caller's fault).
                remove_entry(path).await.or_else(warn_kept)
            }
        }
    }

    /// Checks the attachment: every plugin's CHECK, in order, with the cached result of the ADD
    /// as `prevResult`. A list older than 0.4.0 cannot be checked (Unsupported); one with
    /// `disableCheck` is not, and passes.
    pub async fn check(&self, net: &NetworkList, att: &Attachment) -> Result<(), Error> {
        if !at_least(&net.cni_version, (0, 4, 0)) {
            return Err(Error::Unsupported {
                plugin: None,
                what: format!(
                    "network {:?} is CNI {}: CHECK needs 0.4.0 or later",
                    net.name, net.cni_version
                ),
            });
        }
        if net.disable_check {
            return Ok(());
        }
        let _shared = self.lock.read().await;
        check_network(net)?;
        check_attachment(att, true)?;
        let entry = cache::read(&self.entry_path(&net.name, att))?;
        let Some(prev) = entry.and_then(|e| e.result) else {
            return Err(Error::NoCachedResult {
                network: net.name.clone(),
                container_id: att.container_id.clone(),
                ifname: att.ifname.clone(),
            });
        };
        let target = Target::of(att);
        for plugin in &net.plugins {
            self.run(net, plugin, "CHECK", Some(&target), Some(&prev), None)
                .await?;
        }
        Ok(())
    }

    /// Whether the network's plugins can serve ADDs: every plugin's STATUS, in order; the first
    /// failure is returned (code 50: not available; 51: and existing attachments may have limited
    /// connectivity). Lists older than 1.1.0 have no STATUS, and pass.
    pub async fn status(&self, net: &NetworkList) -> Result<(), Error> {
        if !at_least(&net.cni_version, (1, 1, 0)) {
            return Ok(());
        }
        check_network(net)?;
        for plugin in &net.plugins {
            self.run(net, plugin, "STATUS", None, None, None).await?;
        }
        Ok(())
    }

    /// Garbage-collects the network, with no ADD or DEL running: every cached attachment of the
    /// network not in `valid` (container ID, ifname) is DELeted with the list its ADD used; then,
    /// for 1.1.0 lists without `disableGC`, every plugin's GC gets the valid attachments.
    /// Failures are collected in the report; the error is for a cache that cannot be listed.
    pub async fn gc(
        &self,
        net: &NetworkList,
        valid: &[(String, String)],
    ) -> Result<GcReport, Error> {
        let _exclusive = self.lock.write().await;
        check_network(net)?;
        let mut report = GcReport::default();
        let keep: HashSet<(&str, &str)> = valid
            .iter()
            .map(|(c, i)| (c.as_str(), i.as_str()))
            .collect();
        for entry in cache::list(&self.settings.cache_dir)? {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an unreadable CNI cache entry");
                    continue;
                }
            };
            if entry.network_name != net.name
                || keep.contains(&(entry.container_id.as_str(), entry.ifname.as_str()))
            {
                continue;
            }
            let target = Target {
                container_id: &entry.container_id,
                netns: &entry.netns,
                ifname: &entry.ifname,
                args: &entry.args,
                capability_args: &entry.capability_args,
            };
            let id = (entry.container_id.clone(), entry.ifname.clone());
            let deleted = match check_target(&target) {
                Ok(()) => self.del_cached(net, &entry, &target).await,
                Err(e) => Err(e),
            };
            match deleted {
                Ok(()) => {
                    tracing::info!(network = %net.name, container = %id.0, ifname = %id.1, "CNI GC deleted a stale attachment");
                    report.deleted.push(id);
                }
                Err(e) => report
                    .errors
                    .push(format!("DEL of stale attachment {}/{}: {e}", id.0, id.1)),
            }
        }

        if at_least(&net.cni_version, (1, 1, 0)) && !net.disable_gc {
            let attachments: Vec<Value> = valid
                .iter()
                .map(|(c, i)| json!({"containerID": c, "ifname": i}))
                .collect();
            let attachments = Value::Array(attachments);
            for plugin in &net.plugins {
                let mut extra = Map::new();
                extra.insert("cni.dev/valid-attachments".into(), attachments.clone());
                // The key of the spec's first 1.1.0 text; libcni sends both.
                extra.insert("cni.dev/attachments".into(), attachments.clone());
                if let Err(e) = self.run(net, plugin, "GC", None, None, Some(extra)).await {
                    report.errors.push(e.to_string());
                }
            }
        }
        Ok(report)
    }

    /// What the plugin of this type says to VERSION.
    pub async fn version(&self, plugin_type: &str) -> Result<VersionInfo, Error> {
        let path = exec::find(plugin_type, &self.settings.bin_dirs)?;
        self.version_of(plugin_type, &path).await
    }

    /// Every entry of the cache, of any network; unreadable ones are skipped with a warning.
    pub fn cached(&self) -> Vec<CachedAttachment> {
        let entries = match cache::list(&self.settings.cache_dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the CNI cache");
                return Vec::new();
            }
        };
        entries
            .into_iter()
            .filter_map(|entry| {
                entry
                    .map_err(
                        |e| tracing::warn!(error = %e, "skipping an unreadable CNI cache entry"),
                    )
                    .ok()
            })
            .collect()
    }

    fn entry_path(&self, network: &str, att: &Attachment) -> PathBuf {
        cache::entry_path(
            &self.settings.cache_dir,
            network,
            &att.container_id,
            &att.ifname,
        )
    }

    async fn add_plugins(
        &self,
        net: &NetworkList,
        target: &Target<'_>,
    ) -> Result<CniResult, Error> {
        let mut last: Option<CniResult> = None;
        for plugin in &net.plugins {
            let prev = last.as_ref().map(|r| &r.raw);
            let out = self
                .run(net, plugin, "ADD", Some(target), prev, None)
                .await?;
            last = Some(parse_result(net, plugin_type(net, plugin)?, out)?);
        }
        last.ok_or_else(|| Error::Config {
            path: net.source.clone(),
            why: "no plugins".to_string(),
        })
    }

    /// DEL of every plugin of `net`, in reverse order.
    async fn del_plugins(
        &self,
        net: &NetworkList,
        target: &Target<'_>,
        prev: Option<&Value>,
    ) -> Result<(), Error> {
        for plugin in net.plugins.iter().rev() {
            self.run(net, plugin, "DEL", Some(target), prev, None)
                .await?;
        }
        Ok(())
    }

    /// DEL of a cached attachment: with the list its ADD used (`net` when that cannot be read) and
    /// its result; the entry goes when it succeeds.
    async fn del_cached(
        &self,
        net: &NetworkList,
        entry: &CachedAttachment,
        target: &Target<'_>,
    ) -> Result<(), Error> {
        let list = match entry.network() {
            Ok(list) if list.name == net.name => list,
            Ok(list) => {
                tracing::warn!(cached = %list.name, network = %net.name, path = %entry.path.display(), "CNI cache entry of another network; DEL with the current list");
                net.clone()
            }
            Err(e) => {
                tracing::warn!(error = %e, "CNI cache entry without a usable list; DEL with the current one");
                net.clone()
            }
        };
        // Cached results on DEL came with 0.4.0 (as libcni).
        let prev = entry
            .result
            .as_ref()
            .filter(|_| at_least(&list.cni_version, (0, 4, 0)));
        self.del_plugins(&list, target, prev).await?;
        remove_entry(entry.path.clone()).await.or_else(warn_kept)
    }

    /// Runs one plugin of `net` for `command`: its configuration with the list's `name` and
    /// `cniVersion`, `prevResult` and the `runtimeConfig` of the attachment's capability
    /// arguments it declares, and `extra`; returns its stdout.
    async fn run(
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
    async fn check_plugin_version(
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

impl<'a> Target<'a> {
    fn of(att: &'a Attachment) -> Self {
        Target {
            container_id: &att.container_id,
            netns: &att.netns,
            ifname: &att.ifname,
            args: &att.args,
            capability_args: &att.capability_args,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut args = String::from("IgnoreUnknown=1");
        for (k, v) in self.args {
            // Ours comes first; cache entries of others may hold theirs.
            if k == "IgnoreUnknown" {
                continue;
            }
            args.push(';');
            args.push_str(k);
            args.push('=');
            args.push_str(v);
        }
        vec![
            ("CNI_CONTAINERID", self.container_id.to_string()),
            ("CNI_NETNS", self.netns.to_string_lossy().into_owned()),
            ("CNI_IFNAME", self.ifname.to_string()),
            ("CNI_ARGS", args),
        ]
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

fn plugin_type<'a>(net: &NetworkList, plugin: &'a Map<String, Value>) -> Result<&'a str, Error> {
    match plugin.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ => Err(Error::Config {
            path: net.source.clone(),
            why: "a plugin without a string \"type\"".to_string(),
        }),
    }
}

/// The result an ADD printed; one without `cniVersion` is taken to be of the list's version (as
/// libcni does).
fn parse_result(
    net: &NetworkList,
    plugin_type: &str,
    out: exec::Output,
) -> Result<CniResult, Error> {
    let stdout = &out.stdout;
    let bad = |why: String| Error::BadOutput {
        plugin: plugin_type.to_string(),
        command: "ADD".to_string(),
        why,
        stderr: out.stderr.clone(),
    };
    let mut value: Value = serde_json::from_slice(stdout).map_err(|e| {
        let shown = String::from_utf8_lossy(&stdout[..stdout.len().min(256)]).into_owned();
        bad(format!("not JSON ({e}): {shown:?}"))
    })?;
    if let Value::Object(obj) = &mut value {
        let versioned = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
        if !versioned {
            obj.insert("cniVersion".into(), Value::String(net.cni_version.clone()));
        }
    }
    CniResult::from_value(value).map_err(|e| bad(e.why))
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

fn check_network(net: &NetworkList) -> Result<(), Error> {
    let bad = |why: String| Error::Config {
        path: net.source.clone(),
        why,
    };
    config::check_name(&net.name)
        .map_err(|why| bad(format!("network name {:?} {why}", net.name)))?;
    if net.plugins.is_empty() {
        return Err(bad("no plugins".to_string()));
    }
    if !SUPPORTED_VERSIONS.contains(&net.cni_version.as_str()) {
        return Err(Error::Unsupported {
            plugin: None,
            what: format!(
                "network {:?} is CNI {:?}; supported: {}",
                net.name,
                net.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        });
    }
    Ok(())
}

fn check_attachment(att: &Attachment, netns_needed: bool) -> Result<(), Error> {
    if netns_needed && att.netns.as_os_str().is_empty() {
        return Err(invalid(&att.container_id, &att.ifname, "no netns".into()));
    }
    check_target(&Target::of(att))
}

/// The spec's rules for the container ID, the interface name and CNI_ARGS (which also keep the
/// cache entry's name a file name).
fn check_target(t: &Target<'_>) -> Result<(), Error> {
    let bad = |why: String| invalid(t.container_id, t.ifname, why);
    config::check_name(t.container_id).map_err(|why| bad(format!("container ID {why}")))?;
    let ifname = t.ifname;
    if ifname.is_empty() || ifname.len() > 15 {
        return Err(bad("the interface name must have 1 to 15 bytes".into()));
    }
    if ifname == "."
        || ifname == ".."
        || ifname
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(bad(
            "the interface name holds '/', ':' or white space, or is . or ..".into(),
        ));
    }
    for (k, v) in t.args {
        if k.is_empty() || k.contains(['=', ';']) || v.contains(';') {
            return Err(bad(format!(
                "CNI_ARGS pair {k:?}={v:?}: keys need no '=' or ';', values no ';'"
            )));
        }
    }
    Ok(())
}

fn invalid(container_id: &str, ifname: &str, why: String) -> Error {
    Error::InvalidAttachment {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
        why,
    }
}

async fn write_entry(entry: CachedAttachment) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || cache::write(&entry))
        .await
        .map_err(|e| Error::io("writing a CNI cache entry", std::io::Error::other(e)))?
}

async fn remove_entry(path: PathBuf) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || cache::remove(&path))
        .await
        .map_err(|e| Error::io("removing a CNI cache entry", std::io::Error::other(e)))?
}

/// After a successful DEL the entry should go; when it cannot, GC DELs again later.
fn warn_kept(e: Error) -> Result<(), Error> {
    tracing::warn!(error = %e, "CNI DEL done but its cache entry stays");
    Ok(())
}
