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

mod attach;
mod cache;
mod config;
mod error;
mod exec;
mod network;
mod plugin;
mod result;
mod validate;
mod version;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

pub use cache::CachedAttachment;
pub use config::{CURRENT_VERSION, Loaded, NetworkList, SUPPORTED_VERSIONS, load};
pub use error::{Error, UNPARSABLE};
pub use result::{CniResult, Dns, Interface, InvalidResult, IpConfig, Route};

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

    fn entry_path(&self, network: &str, att: &Attachment) -> PathBuf {
        cache::entry_path(
            &self.settings.cache_dir,
            network,
            &att.container_id,
            &att.ifname,
        )
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
