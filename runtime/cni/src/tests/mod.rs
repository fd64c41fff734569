//! [`Cni`] against plugins that are shell scripts: each records its environment and stdin, and
//! prints what the test tells it to.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::*;

mod add;
mod del_check;
mod failures;
mod status_gc;

const RESULT1: &str = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/t"}],"ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1"}],"dns":{"nameservers":["10.1.0.1"],"search":["svc.local"]}}"#;
const RESULT2: &str = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/t"},{"name":"veth1"}],"ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1"}],"dns":{"nameservers":["10.1.0.1"]}}"#;
const ALL_VERSIONS: &str = r#"["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]"#;

/// A bin dir, a cache dir and a log of the plugins' runs.
struct Lab {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    empty_bin: PathBuf,
    cache: PathBuf,
    log: PathBuf,
}

/// One run of a plugin, as it recorded it.
#[derive(Debug)]
struct Run {
    plugin: String,
    command: String,
    env: BTreeMap<String, String>,
    stdin: Value,
}

impl Lab {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for sub in ["bin", "bin2", "log"] {
            fs::create_dir(root.join(sub)).unwrap();
        }
        Lab {
            bin: root.join("bin"),
            empty_bin: root.join("bin2"),
            cache: root.join("cache"),
            log: root.join("log"),
            _dir: dir,
        }
    }

    /// A plugin that records each run and then runs the shell code of its command (VERSION says
    /// `versions`).
    fn plugin(&self, name: &str, versions: &str, cases: &[(&str, &str)]) {
        let mut script = format!(
            r#"#!/bin/sh
input=$(cat)
d='{log}'
n=$(cat "$d/seq" 2>/dev/null || echo 0)
n=$((n+1))
echo $n > "$d/seq"
printf '%s' "$input" > "$d/$n.stdin"
env > "$d/$n.env"
printf '%s %s' '{name}' "$CNI_COMMAND" > "$d/$n.who"
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":{versions}}}' ;;
"#,
            log = self.log.display(),
        );
        for (command, code) in cases {
            script.push_str(&format!("{command})\n{code}\n;;\n"));
        }
        script.push_str("esac\n");
        let path = self.bin.join(name);
        // A new file each time: a script being replaced is not written in place.
        let tmp = self.bin.join(format!(".{name}.new"));
        fs::write(&tmp, script).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, &path).unwrap();
    }

    /// A plugin that prints `result` on ADD and succeeds at everything else.
    fn ok_plugin(&self, name: &str, result: &str) {
        self.plugin(name, ALL_VERSIONS, &[("ADD", &format!("echo '{result}'"))]);
    }

    fn cni(&self, timeout: Duration) -> Cni {
        Cni::new(Settings {
            conf_dir: PathBuf::from("/nonexistent"),
            bin_dirs: vec![self.bin.clone(), self.empty_bin.clone()],
            cache_dir: self.cache.clone(),
            timeout,
        })
    }

    /// The runs so far, VERSION included.
    fn all_runs(&self) -> Vec<Run> {
        let seq: usize = fs::read_to_string(self.log.join("seq"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0);
        (1..=seq)
            .map(|n| {
                let who = fs::read_to_string(self.log.join(format!("{n}.who"))).unwrap();
                let (plugin, command) = who.split_once(' ').unwrap();
                let env = fs::read_to_string(self.log.join(format!("{n}.env")))
                    .unwrap()
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let stdin = fs::read(self.log.join(format!("{n}.stdin"))).unwrap();
                Run {
                    plugin: plugin.to_string(),
                    command: command.to_string(),
                    env,
                    stdin: serde_json::from_slice(&stdin).unwrap_or(Value::Null),
                }
            })
            .collect()
    }

    /// The runs so far but VERSION's, and forgets them all.
    fn runs(&self) -> Vec<Run> {
        let runs = self.all_runs();
        let _ = fs::remove_file(self.log.join("seq"));
        runs.into_iter()
            .filter(|r| r.command != "VERSION")
            .collect()
    }

    fn entry(&self, network: &str, container: &str, ifname: &str) -> PathBuf {
        self.cache
            .join("results")
            .join(format!("{network}-{container}-{ifname}"))
    }
}

fn list(json: Value) -> NetworkList {
    NetworkList::from_bytes(
        &serde_json::to_vec(&json).unwrap(),
        Path::new("test.conflist"),
    )
    .unwrap()
}

fn attachment(container: &str) -> Attachment {
    Attachment {
        container_id: container.to_string(),
        netns: PathBuf::from(format!("/var/run/netns/{container}")),
        ifname: "eth0".to_string(),
        args: vec![
            ("K8S_POD_NAMESPACE".into(), "ns".into()),
            ("K8S_POD_NAME".into(), "p".into()),
        ],
        capability_args: json!({
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1000},
            "dns": {"servers": ["1.1.1.1"]}
        })
        .as_object()
        .unwrap()
        .clone(),
    }
}

fn who(runs: &[Run]) -> Vec<String> {
    runs.iter()
        .map(|r| format!("{} {}", r.plugin, r.command))
        .collect()
}

fn two_plugins(version: &str) -> NetworkList {
    list(json!({
        "cniVersion": version,
        "name": "net",
        "plugins": [
            {"type": "first", "bridge": "cni0", "capabilities": {"portMappings": true, "bandwidth": false}, "cni.dev/reserved": 1},
            {"type": "second", "mtu": 1400}
        ]
    }))
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}
