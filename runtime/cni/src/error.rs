//! The one error type of the crate.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// The code [`Error::Plugin`] carries when a failed plugin printed no CNI error object on stdout
/// (nothing, or something that is not one). Not a code of the spec: 0-99 are reserved, 100+ are the
/// plugins' own.
pub const UNPARSABLE: u32 = 999;

/// Why a CNI operation failed. The Display names the operation and the plugin where there is one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A network configuration (a file, or the copy in a cache entry) that cannot be used.
    #[error("CNI network configuration {}: {why}", .path.display())]
    Config { path: PathBuf, why: String },

    /// No executable named after the plugin's `type` in any of the bin dirs.
    #[error("CNI plugin {plugin:?} not found in {}", join_paths(.dirs))]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },

    /// The plugin exited with a failure. `code`, `msg` and `details` are those of the CNI error
    /// object it printed on stdout; when it printed none, `code` is [`UNPARSABLE`], `msg` says how
    /// it exited and `details` holds the start of its stdout. `stderr` is the last few KiB of its
    /// stderr.
    #[error("CNI plugin {plugin:?} failed {command}: {}", failure(*.code, .msg, .details, .stderr))]
    Plugin {
        plugin: String,
        command: String,
        code: u32,
        msg: String,
        details: String,
        stderr: String,
    },

    /// The plugin did not finish in time; it and its process group were killed.
    #[error("CNI plugin {plugin:?} {command} timed out after {after:?}{}", stderr_suffix(.stderr))]
    Timeout {
        plugin: String,
        command: String,
        after: Duration,
        stderr: String,
    },

    /// The plugin succeeded but its stdout is not what the command has to print.
    #[error("CNI plugin {plugin:?} {command} printed an unusable result: {why}{}", stderr_suffix(.stderr))]
    BadOutput {
        plugin: String,
        command: String,
        why: String,
        stderr: String,
    },

    /// An I/O failure of ours (running a plugin, the cache, the config dir).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },

    /// Something this crate or the plugin does not speak: a CNI version, CHECK before 0.4.0.
    #[error("CNI: {}{what}", plugin_prefix(.plugin))]
    Unsupported {
        plugin: Option<String>,
        what: String,
    },

    /// The attachment's parameters cannot be passed to a plugin (or name a cache entry).
    #[error("CNI attachment {container_id:?}/{ifname:?}: {why}")]
    InvalidAttachment {
        container_id: String,
        ifname: String,
        why: String,
    },

    /// CHECK needs the result of the ADD, and the cache holds none.
    #[error(
        "CNI CHECK of {container_id:?}/{ifname:?} on network {network:?}: no cached ADD result"
    )]
    NoCachedResult {
        network: String,
        container_id: String,
        ifname: String,
    },

    /// A cache entry that cannot be read back.
    #[error("CNI cache entry {}: {why}", .path.display())]
    Cache { path: PathBuf, why: String },
}

impl Error {
    /// The CNI error code the plugin reported ([`UNPARSABLE`] when it printed no error object), for
    /// [`Error::Plugin`]; `None` for every other error.
    pub fn code(&self) -> Option<u32> {
        match self {
            Error::Plugin { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The plugin's captured stderr (its last few KiB), for the errors of a run plugin.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            Error::Plugin { stderr, .. }
            | Error::Timeout { stderr, .. }
            | Error::BadOutput { stderr, .. } => Some(stderr),
            _ => None,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

fn join_paths(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "(no bin dirs)".to_string();
    }
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    dirs.join(":")
}

fn plugin_prefix(plugin: &Option<String>) -> String {
    match plugin {
        Some(plugin) => format!("plugin {plugin:?}: "),
        None => String::new(),
    }
}

/// How much of the stderr a Display shows (the error keeps more).
const STDERR_SHOWN: usize = 512;

fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        return String::new();
    }
    let mut start = stderr.len().saturating_sub(STDERR_SHOWN);
    while !stderr.is_char_boundary(start) {
        start += 1;
    }
    let dots = if start > 0 { "…" } else { "" };
    format!(" (stderr: {dots}{})", &stderr[start..])
}

fn failure(code: u32, msg: &str, details: &str, stderr: &str) -> String {
    let mut out = format!("code {code}");
    if !msg.is_empty() {
        out.push_str(": ");
        out.push_str(msg);
    }
    if !details.is_empty() {
        out.push_str(": ");
        out.push_str(details);
    }
    out.push_str(&stderr_suffix(stderr));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_plugin_and_what() {
        let e = Error::Plugin {
            plugin: "bridge".into(),
            command: "ADD".into(),
            code: 7,
            msg: "bad config".into(),
            details: "subnet too small".into(),
            stderr: "line 1\nline 2\n".into(),
        };
        assert_eq!(
            e.to_string(),
            "CNI plugin \"bridge\" failed ADD: code 7: bad config: subnet too small (stderr: line 1\nline 2)"
        );
        assert_eq!(e.code(), Some(7));
        let t = Error::Timeout {
            plugin: "slow".into(),
            command: "DEL".into(),
            after: Duration::from_millis(1500),
            stderr: String::new(),
        };
        assert_eq!(
            t.to_string(),
            "CNI plugin \"slow\" DEL timed out after 1.5s"
        );
        assert_eq!(t.code(), None);
        let long = "é".repeat(600);
        let s = stderr_suffix(&long);
        assert!(s.starts_with(" (stderr: …é"));
    }
}
