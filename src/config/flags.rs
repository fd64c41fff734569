//! The upstream kubelet's command line (`kubelet --config=... --kubeconfig=...`), parsed as
//! Go's pflag does: `--name=value`, `--name value` (not for booleans: `--name` alone is
//! true, `--name=false` false), `-v 2` and `-v=2`, `_` read as `-` in names, `--` ending the
//! flags. The kubelet takes no arguments besides flags.
//!
//! A flag naming a `KubeletConfiguration` field becomes a layer over the files
//! ([`super::Layers`]): flags win over `--config-dir` drop-ins, which win over `--config`. As
//! upstream, such flags are accepted with a warning that the file is the place for them. A
//! flag upstream removed, or one nodelet does not implement, is refused naming it, never
//! ignored.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::Layers;

mod table;
use table::{FLAGS, Kind, Target};

/// Why the command line is refused: one line naming the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlagError {
    #[error("unknown flag: --{0}")]
    Unknown(String),
    #[error("unknown shorthand flag: {0:?} (long flags take two dashes)")]
    UnknownShorthand(String),
    #[error("flag --{name} was removed from the kubelet: {why}")]
    Removed { name: String, why: &'static str },
    #[error("flag --{name} is not supported by nodelet: {why}")]
    Unsupported { name: String, why: &'static str },
    #[error("flag needs an argument: --{0}")]
    MissingValue(String),
    #[error("invalid argument {value:?} for --{name}: {why}")]
    Invalid {
        name: String,
        value: String,
        why: String,
    },
    #[error("the kubelet does not take any arguments, got {0:?}")]
    Positional(String),
}

/// The parsed command line.
#[derive(Debug, Default)]
pub struct KubeletFlags {
    /// `--config`, `--config-dir` and the flags naming configuration fields.
    pub layers: Layers,
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: Option<PathBuf>,
    pub root_dir: Option<PathBuf>,
    /// nodelet's own `--state-dir` (the built-in runtime's tmpfs state).
    pub state_dir: Option<PathBuf>,
    /// nodelet's own `--cri-listen`.
    pub cri_listen: Option<String>,
    pub hostname_override: Option<String>,
    pub node_ips: Vec<IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    /// `--cloud-provider=external`.
    pub external_cloud_provider: bool,
    pub pod_infra_container_image: Option<String>,
    /// `--v`/`-v`: the log verbosity.
    pub verbosity: Option<u8>,
    pub help: bool,
    pub version: bool,
    /// Deprecated flags, one line each.
    pub warnings: Vec<String>,
}

/// Whether `--name` (given without `=`) takes the next argument as its value: every flag of
/// the kubelet's but the booleans, and nodelet's own global flags.
pub fn takes_value(name: &str) -> bool {
    let name = name.replace('_', "-");
    FLAGS
        .iter()
        .find(|f| f.name == name)
        .is_some_and(|f| f.kind != Kind::Bool)
}

/// Parses the kubelet's command line (`args` without the program name).
pub fn parse(args: &[String]) -> Result<KubeletFlags, FlagError> {
    let mut out = KubeletFlags::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            if let Some(rest) = it.next() {
                return Err(FlagError::Positional(rest.clone()));
            }
            break;
        }
        let Some((name, inline)) = split_flag(arg)? else {
            return Err(FlagError::Positional(arg.clone()));
        };
        let Some(flag) = FLAGS.iter().find(|f| f.name == name) else {
            return Err(FlagError::Unknown(name));
        };
        match flag.target {
            Target::Removed(why) => return Err(FlagError::Removed { name, why }),
            Target::Unsupported(why) => return Err(FlagError::Unsupported { name, why }),
            _ => {}
        }
        let value = match (inline, flag.kind) {
            (Some(v), _) => v,
            (None, Kind::Bool) => "true".to_string(),
            (None, _) => it
                .next()
                .cloned()
                .ok_or_else(|| FlagError::MissingValue(name.clone()))?,
        };
        let invalid = |why: BadValue| FlagError::Invalid {
            name: name.clone(),
            value: value.clone(),
            why: why.0,
        };
        match flag.target {
            Target::Field(path) => {
                let v = field_value(flag.kind, &value).map_err(invalid)?;
                out.warnings.push(format!(
                    "flag --{name} is deprecated upstream: set {} in the file given with --config",
                    path.join(".")
                ));
                out.layers.flags.push((path.to_vec(), v));
            }
            Target::Local => local(&mut out, &name, &value).map_err(invalid)?,
            Target::Deprecated(why) => {
                out.warnings
                    .push(format!("flag --{name} has been deprecated: {why}"));
                local(&mut out, &name, &value).map_err(invalid)?;
            }
            Target::Removed(_) | Target::Unsupported(_) => {}
        }
    }
    Ok(out)
}

/// `--name[=value]` or `-v[=value]` to the flag's name (normalized) and inline value; a
/// single dash before anything but `v` or `h` is an unknown shorthand.
fn split_flag(arg: &str) -> Result<Option<(String, Option<String>)>, FlagError> {
    let body = if let Some(b) = arg.strip_prefix("--") {
        b
    } else if let Some(b) = arg.strip_prefix('-') {
        match b.split_once('=').map_or(b, |(n, _)| n) {
            "v" | "h" => b,
            _ => return Err(FlagError::UnknownShorthand(arg.to_string())),
        }
    } else {
        return Ok(None);
    };
    if body.is_empty() {
        return Ok(None);
    }
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (body, None),
    };
    let name = match name.replace('_', "-").as_str() {
        "h" => "help".to_string(),
        n => n.to_string(),
    };
    Ok(Some((name, value)))
}

/// Why a flag's value is refused (the flag and the value are named by [`FlagError::Invalid`]).
#[derive(Debug)]
struct BadValue(String);

impl From<String> for BadValue {
    fn from(why: String) -> Self {
        BadValue(why)
    }
}

impl From<&str> for BadValue {
    fn from(why: &str) -> Self {
        BadValue(why.to_string())
    }
}

/// A configuration field's value from its flag's text.
fn field_value(kind: Kind, s: &str) -> Result<Value, BadValue> {
    Ok(match kind {
        Kind::Bool => Value::Bool(go_bool(s)?),
        Kind::Int => Value::from(s.trim().parse::<i64>().map_err(|e| e.to_string())?),
        Kind::Duration => {
            super::parse_duration(s).map_err(|e| e.to_string())?;
            Value::from(s)
        }
        Kind::Str => Value::from(s),
        Kind::List => Value::Array(list(s).map(Value::from).collect()),
        Kind::Map => Value::Object(pairs(s, '=')?),
        Kind::Thresholds => Value::Object(pairs(s, '<')?),
        Kind::Taints => Value::Array(
            list(s)
                .map(|t| {
                    let t = super::parse_taint(t).map_err(|e| e.to_string())?;
                    Ok(serde_json::json!({"key": t.key, "value": t.value, "effect": t.effect}))
                })
                .collect::<Result<_, BadValue>>()?,
        ),
    })
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|i| !i.is_empty())
}

/// `k<sep>v,k2<sep>v2` as a mapping.
fn pairs(s: &str, sep: char) -> Result<Map<String, Value>, BadValue> {
    list(s)
        .map(|item| match item.split_once(sep) {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), Value::from(v.trim())))
            }
            _ => Err(BadValue(format!("{item:?} is not key{sep}value"))),
        })
        .collect()
}

/// Go's `strconv.ParseBool`.
fn go_bool(s: &str) -> Result<bool, BadValue> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(BadValue("must be true or false".to_string())),
    }
}

/// The flags that are not configuration fields.
fn local(out: &mut KubeletFlags, name: &str, value: &str) -> Result<(), BadValue> {
    let path = || Some(PathBuf::from(value)).filter(|p| !p.as_os_str().is_empty());
    match name {
        "config" => out.layers.file = path(),
        "config-dir" => out.layers.drop_in_dir = path(),
        "kubeconfig" => out.kubeconfig = path(),
        "bootstrap-kubeconfig" => out.bootstrap_kubeconfig = path(),
        "cert-dir" => out.cert_dir = path(),
        "root-dir" => out.root_dir = path(),
        "state-dir" => out.state_dir = path(),
        "cri-listen" => out.cri_listen = Some(value.to_string()).filter(|v| !v.is_empty()),
        "hostname-override" => {
            out.hostname_override = Some(value.trim().to_lowercase()).filter(|v| !v.is_empty())
        }
        "node-ip" => out.node_ips = node_ips(value)?,
        "node-labels" => out
            .node_labels
            .extend(super::parse_node_labels(value).map_err(|e| e.to_string())?),
        "cloud-provider" => match value {
            "" => out.external_cloud_provider = false,
            "external" => out.external_cloud_provider = true,
            _ => {
                return Err(
                    "in-tree cloud providers were removed upstream (v1.31): only \
                            \"external\" or \"\""
                        .into(),
                );
            }
        },
        "pod-infra-container-image" => {
            out.pod_infra_container_image = Some(value.to_string()).filter(|v| !v.is_empty())
        }
        "v" => out.verbosity = Some(value.parse::<u8>().map_err(|e| e.to_string())?),
        "help" => out.help = go_bool(value)?,
        "version" => out.version = go_bool(value)?,
        _ => return Err(BadValue("not a flag of this command".to_string())),
    }
    Ok(())
}

/// A `--node-ip` refused, and why.
#[derive(Debug, thiserror::Error)]
#[error("--node-ip {value:?}: {why}")]
pub struct BadNodeIp {
    value: String,
    why: String,
}

/// `--node-ip` as `run-node` takes it too: the addresses, or why the value is refused.
pub fn parse_node_ips(s: &str) -> Result<Vec<IpAddr>, BadNodeIp> {
    node_ips(s).map_err(|BadValue(why)| BadNodeIp {
        value: s.to_string(),
        why,
    })
}

/// `--node-ip`: one address, or two of different families (dual stack, the first the
/// primary).
fn node_ips(s: &str) -> Result<Vec<IpAddr>, BadValue> {
    let ips: Vec<IpAddr> = list(s)
        .map(|i| {
            i.parse::<IpAddr>()
                .map_err(|_| format!("{i:?} is not an IP address"))
        })
        .collect::<Result<_, _>>()?;
    if ips.iter().any(IpAddr::is_unspecified) {
        return Err(
            "an unspecified address (0.0.0.0, ::) is not supported: give the \
                    node's address, or leave --node-ip out to use the host name's"
                .into(),
        );
    }
    match ips.as_slice() {
        [] | [_] => Ok(ips),
        [a, b] if a.is_ipv4() != b.is_ipv4() => Ok(ips),
        [_, _] => Err("a dual-stack --node-ip must have one IPv4 and one IPv6 address".into()),
        _ => Err("at most two addresses (one of each family)".into()),
    }
}

/// `kubelet --help`: every flag nodelet takes, one line each.
pub fn usage() -> String {
    let mut s = String::from(
        "nodelet as the kubelet: runs the node agent, configured as upstream's kubelet is.\n\n\
         Usage:\n  kubelet [flags]\n\nFlags:\n",
    );
    for f in FLAGS.iter().filter(|f| {
        matches!(
            f.target,
            Target::Field(_) | Target::Local | Target::Deprecated(_)
        )
    }) {
        let arg = match f.kind {
            Kind::Bool => "",
            Kind::Int => " int",
            Kind::Duration => " duration",
            Kind::List | Kind::Taints => " strings",
            Kind::Map | Kind::Thresholds => " mapStringString",
            Kind::Str => " string",
        };
        let short = if f.name == "v" { "-v, " } else { "    " };
        s.push_str(&format!("  {short}--{}{arg}\n        {}\n", f.name, f.help));
    }
    s
}

#[cfg(test)]
mod tests;
