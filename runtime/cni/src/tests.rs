//! [`Cni`] against plugins that are shell scripts: each records its environment and stdin, and
//! prints what the test tells it to.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::*;

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

#[tokio::test]
async fn add_chains_the_plugins_and_caches_the_result() {
    let lab = Lab::new();
    let entry_path = lab.entry("net", "c1", "eth0");
    // The first plugin copies the cache entry as it is while the ADD runs.
    lab.plugin(
        "first",
        ALL_VERSIONS,
        &[(
            "ADD",
            &format!(
                "cp '{}' \"$d/during-add\"\necho '{RESULT1}'",
                entry_path.display()
            ),
        )],
    );
    lab.ok_plugin("second", RESULT2);
    let cni = lab.cni(Duration::from_secs(10));
    let net = two_plugins("1.1.0");
    let att = attachment("c1");

    let result = cni.add(&net, &att).await.unwrap();
    assert_eq!(result.raw, serde_json::from_str::<Value>(RESULT2).unwrap());
    assert_eq!(result.cni_version, "1.1.0");
    assert_eq!(result.interfaces.len(), 2);
    assert_eq!(result.ips[0].address, ("10.1.0.5".parse().unwrap(), 24));
    assert_eq!(result.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
    assert_eq!(result.ips[0].interface, Some(0));
    assert_eq!(result.routes[0].gw, Some("10.1.0.1".parse().unwrap()));
    assert_eq!(result.dns.nameservers, ["10.1.0.1"]);

    let all = lab.all_runs();
    assert_eq!(
        who(&all),
        ["first VERSION", "second VERSION", "first ADD", "second ADD"]
    );
    let (first, second) = (&all[2], &all[3]);
    let bin_dirs = format!("{}:{}", lab.bin.display(), lab.empty_bin.display());
    for run in [first, second] {
        let env = &run.env;
        assert_eq!(env["CNI_COMMAND"], "ADD");
        assert_eq!(env["CNI_CONTAINERID"], "c1");
        assert_eq!(env["CNI_NETNS"], "/var/run/netns/c1");
        assert_eq!(env["CNI_IFNAME"], "eth0");
        assert_eq!(
            env["CNI_ARGS"],
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"
        );
        assert_eq!(env["CNI_PATH"], bin_dirs);
        assert!(env.contains_key("PATH"));
        // Nothing of ours but CNI_* and PATH (the shell adds PWD and the like).
        for key in env.keys() {
            assert!(
                key.starts_with("CNI_")
                    || ["PATH", "PWD", "OLDPWD", "SHLVL", "_"].contains(&key.as_str()),
                "unexpected {key} in the plugin's environment"
            );
        }
        assert_eq!(run.stdin["name"], "net");
        assert_eq!(run.stdin["cniVersion"], "1.1.0");
    }
    // Only the declared (and true) capabilities, and no prevResult for the first.
    assert_eq!(
        first.stdin,
        json!({
            "type": "first", "bridge": "cni0", "name": "net", "cniVersion": "1.1.0",
            "capabilities": {"portMappings": true, "bandwidth": false},
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
        })
    );
    assert_eq!(
        second.stdin,
        json!({
            "type": "second", "mtu": 1400, "name": "net", "cniVersion": "1.1.0",
            "prevResult": serde_json::from_str::<Value>(RESULT1).unwrap()
        })
    );

    // While the ADD ran, the entry was there without a result.
    let during = read_json(&lab.log.join("during-add"));
    assert_eq!(during["kind"], "cniCacheV1");
    assert!(during.get("result").is_none(), "{during}");
    // After it, with.
    let entry = read_json(&entry_path);
    use base64::Engine;
    let config = base64::engine::general_purpose::STANDARD
        .decode(entry["config"].as_str().unwrap())
        .unwrap();
    assert_eq!(config, net.raw);
    assert_eq!(
        entry,
        json!({
            "kind": "cniCacheV1",
            "containerId": "c1",
            "config": entry["config"],
            "ifName": "eth0",
            "networkName": "net",
            "netns": "/var/run/netns/c1",
            "cniArgs": [["K8S_POD_NAMESPACE", "ns"], ["K8S_POD_NAME", "p"]],
            "capabilityArgs": att.capability_args,
            "result": result.raw
        })
    );
    let mode = fs::metadata(&entry_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let cached = cni.cached();
    assert_eq!(cached.len(), 1);
    assert_eq!(cached[0].container_id, "c1");
    assert_eq!(cached[0].result.as_ref(), Some(&result.raw));
    assert_eq!(cached[0].network().unwrap().plugins, net.plugins);

    // VERSION is asked once per plugin executable.
    cni.add(&net, &attachment("c2")).await.unwrap();
    assert_eq!(who(&lab.all_runs()[4..]), ["first ADD", "second ADD"]);
    // ... again when the executable changed.
    lab.ok_plugin("second", RESULT2);
    cni.add(&net, &attachment("c3")).await.unwrap();
    assert_eq!(
        who(&lab.all_runs()[6..]),
        ["second VERSION", "first ADD", "second ADD"]
    );
    assert_eq!(cni.cached().len(), 3);
}

#[tokio::test]
async fn a_failed_add_is_deleted_in_reverse_and_its_error_returned() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.ok_plugin("second", RESULT1);
    lab.plugin(
        "failing",
        ALL_VERSIONS,
        &[(
            "ADD",
            r#"echo "some stderr" >&2
echo '{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"subnet too small"}'
exit 1"#,
        )],
    );
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({
        "cniVersion": "1.0.0", "name": "net",
        "plugins": [{"type": "first"}, {"type": "second"}, {"type": "failing"}]
    }));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
            stderr,
        } => {
            assert_eq!(plugin, "failing");
            assert_eq!(command, "ADD");
            assert_eq!(*code, 7);
            assert_eq!(msg, "bad config");
            assert_eq!(details, "subnet too small");
            assert_eq!(stderr, "some stderr\n");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.code(), Some(7));
    assert!(
        err.to_string()
            .contains("\"failing\" failed ADD: code 7: bad config")
    );
    let runs = lab.runs();
    assert_eq!(
        who(&runs),
        [
            "first ADD",
            "second ADD",
            "failing ADD",
            "failing DEL",
            "second DEL",
            "first DEL"
        ]
    );
    for del in &runs[3..] {
        assert!(del.stdin.get("prevResult").is_none(), "{}", del.stdin);
        assert_eq!(del.env["CNI_CONTAINERID"], "c1");
    }
    assert!(!lab.entry("net", "c1", "eth0").exists());
    assert!(cni.cached().is_empty());
}

#[tokio::test]
async fn a_failed_add_whose_del_fails_keeps_its_entry_for_gc() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.plugin(
        "broken",
        ALL_VERSIONS,
        &[
            ("ADD", r#"echo '{"code":100,"msg":"no"}'; exit 1"#),
            ("DEL", r#"echo '{"code":11,"msg":"try again"}'; exit 1"#),
        ],
    );
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({
        "cniVersion": "1.1.0", "name": "net", "disableGC": true,
        "plugins": [{"type": "first"}, {"type": "broken"}]
    }));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(100),
        "the ADD's error, not the DEL's: {err}"
    );
    assert_eq!(who(&lab.runs()), ["first ADD", "broken ADD", "broken DEL"]);
    let entry = read_json(&lab.entry("net", "c1", "eth0"));
    assert!(entry.get("result").is_none());

    // A later GC (the plugin mended) deletes it with the list it was added with.
    lab.ok_plugin("broken", RESULT1);
    let report = cni.gc(&net, &[]).await.unwrap();
    assert_eq!(report.deleted, [("c1".to_string(), "eth0".to_string())]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let runs = lab.runs();
    assert_eq!(who(&runs), ["broken DEL", "first DEL"]);
    assert!(runs[0].stdin.get("prevResult").is_none());
    assert!(!lab.entry("net", "c1", "eth0").exists());
}

#[tokio::test]
async fn garbage_on_stdout_is_an_error() {
    let lab = Lab::new();
    lab.plugin(
        "garbage",
        ALL_VERSIONS,
        &[("ADD", "echo 'this is not json'; echo 'whoops' >&2")],
    );
    lab.plugin(
        "garbage-fail",
        ALL_VERSIONS,
        &[("ADD", "echo 'oops, not json'; exit 3")],
    );
    lab.plugin("silent-fail", ALL_VERSIONS, &[("ADD", "exit 2")]);
    let cni = lab.cni(Duration::from_secs(10));

    let net = list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "garbage"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::BadOutput {
            plugin,
            why,
            stderr,
            ..
        } => {
            assert_eq!(plugin, "garbage");
            assert!(why.contains("this is not json"), "{why}");
            assert_eq!(stderr, "whoops\n");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(who(&lab.runs()), ["garbage ADD", "garbage DEL"]);
    assert!(!lab.entry("g", "c1", "eth0").exists());

    let net =
        list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "garbage-fail"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(err.code(), Some(UNPARSABLE));
    match &err {
        Error::Plugin { msg, details, .. } => {
            assert_eq!(msg, "exit status 3, no CNI error object on stdout");
            assert_eq!(details, "oops, not json\n");
        }
        other => panic!("{other:?}"),
    }
    let net =
        list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "silent-fail"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(err.code(), Some(UNPARSABLE));
    assert!(
        err.to_string().contains("exit status 2, nothing on stdout"),
        "{err}"
    );
}

fn gone(pid: &str) -> bool {
    // Gone, or a zombie its new parent has not reaped yet.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn a_plugin_past_its_deadline_is_killed_with_its_children() {
    let lab = Lab::new();
    lab.plugin(
        "sleeper",
        ALL_VERSIONS,
        &[(
            "ADD",
            r#"echo "going to sleep" >&2
echo $$ > "$d/sh.pid"
sleep 60 &
echo $! > "$d/sleep.pid"
wait"#,
        )],
    );
    let cni = lab.cni(Duration::from_millis(800));
    let net = list(json!({"cniVersion": "1.0.0", "name": "s", "plugins": [{"type": "sleeper"}]}));
    let started = Instant::now();
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    match &err {
        Error::Timeout {
            plugin,
            command,
            after,
            stderr,
        } => {
            assert_eq!(plugin, "sleeper");
            assert_eq!(command, "ADD");
            assert_eq!(*after, Duration::from_millis(800));
            assert_eq!(stderr, "going to sleep\n");
        }
        other => panic!("{other:?}"),
    }
    for file in ["sh.pid", "sleep.pid"] {
        let pid = fs::read_to_string(lab.log.join(file)).unwrap();
        let pid = pid.trim();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(gone(pid), "{file} {pid} still runs");
    }
    // The DEL after it ran (and did not sleep).
    assert_eq!(who(&lab.runs()), ["sleeper ADD", "sleeper DEL"]);
    assert!(!lab.entry("s", "c1", "eth0").exists());
}

#[tokio::test]
async fn a_dropped_call_leaves_no_process() {
    let lab = Lab::new();
    lab.plugin(
        "sleeper",
        ALL_VERSIONS,
        &[(
            "ADD",
            "sleep 60 &\necho $! > \"$d/sleep.tmp\"\nmv \"$d/sleep.tmp\" \"$d/sleep.pid\"\nwait",
        )],
    );
    let cni = lab.cni(Duration::from_secs(60));
    let net = list(json!({"cniVersion": "1.0.0", "name": "s", "plugins": [{"type": "sleeper"}]}));
    let att = attachment("c1");
    let pid_file = lab.log.join("sleep.pid");
    let add = cni.add(&net, &att);
    let wait = async {
        while !pid_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = add => panic!("the ADD finished"),
        () = wait => {}
    }
    let pid = fs::read_to_string(&pid_file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid.trim()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(pid.trim()), "sleep {pid} still runs");
}

#[tokio::test]
async fn del_uses_the_cached_list_and_result() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.ok_plugin("second", RESULT2);
    lab.ok_plugin("third", RESULT1);
    let cni = lab.cni(Duration::from_secs(10));
    let added = two_plugins("1.0.0");
    let att = attachment("c1");
    let result = cni.add(&added, &att).await.unwrap();
    lab.runs();

    // The file changed since: same network, other plugins.
    let now = list(json!({"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "third"}]}));
    let del_att = Attachment {
        args: vec![],
        capability_args: Map::new(),
        ..att.clone()
    };
    cni.del(&now, &del_att).await.unwrap();
    let runs = lab.runs();
    assert_eq!(who(&runs), ["second DEL", "first DEL"]);
    for run in &runs {
        assert_eq!(run.stdin["prevResult"], result.raw);
        assert_eq!(run.env["CNI_NETNS"], "/var/run/netns/c1");
        // The ADD's CNI_ARGS and capability arguments, from the entry.
        assert_eq!(
            run.env["CNI_ARGS"],
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"
        );
    }
    assert_eq!(
        runs[1].stdin["runtimeConfig"],
        json!({"portMappings": att.capability_args["portMappings"]})
    );
    assert!(!lab.entry("net", "c1", "eth0").exists());

    // Again: no entry now, so the given list, without prevResult.
    cni.del(&now, &del_att).await.unwrap();
    let runs = lab.runs();
    assert_eq!(who(&runs), ["third DEL"]);
    assert!(runs[0].stdin.get("prevResult").is_none());
    assert_eq!(runs[0].env["CNI_ARGS"], "IgnoreUnknown=1");

    // The netns may be gone (or not given): the plugins are run all the same.
    let gone_ns = Attachment {
        netns: PathBuf::new(),
        ..attachment("never-added")
    };
    cni.del(&now, &gone_ns).await.unwrap();
    let runs = lab.runs();
    assert_eq!(runs[0].env["CNI_NETNS"], "");
    assert_eq!(runs[0].env["CNI_CONTAINERID"], "never-added");
}

#[tokio::test]
async fn del_on_0_3_1_sends_no_prev_result() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1.replace("1.1.0", "0.3.1").as_str());
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({"cniVersion": "0.3.1", "name": "old", "plugins": [{"type": "first"}]}));
    cni.add(&net, &attachment("c1")).await.unwrap();
    cni.del(&net, &attachment("c1")).await.unwrap();
    let runs = lab.runs();
    assert_eq!(who(&runs), ["first ADD", "first DEL"]);
    assert!(runs[1].stdin.get("prevResult").is_none());
}

#[tokio::test]
async fn check_follows_the_rules() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.ok_plugin("second", RESULT2);
    let cni = lab.cni(Duration::from_secs(10));
    let att = attachment("c1");

    let old = two_plugins("0.3.1");
    let err = cni.check(&old, &att).await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let mut disabled = two_plugins("1.0.0");
    disabled.disable_check = true;
    cni.check(&disabled, &att).await.unwrap();
    assert!(lab.runs().is_empty());

    let net = two_plugins("1.0.0");
    let err = cni.check(&net, &att).await.unwrap_err();
    assert!(matches!(err, Error::NoCachedResult { .. }), "{err}");
    assert!(lab.runs().is_empty());

    let result = cni.add(&net, &att).await.unwrap();
    lab.runs();
    cni.check(&net, &att).await.unwrap();
    let runs = lab.runs();
    assert_eq!(who(&runs), ["first CHECK", "second CHECK"]);
    for run in &runs {
        assert_eq!(run.stdin["prevResult"], result.raw);
        assert_eq!(run.env["CNI_CONTAINERID"], "c1");
        assert_eq!(run.env["CNI_IFNAME"], "eth0");
    }
    assert!(runs[0].stdin.get("runtimeConfig").is_some());

    lab.plugin(
        "second",
        ALL_VERSIONS,
        &[(
            "CHECK",
            r#"echo '{"code":7,"msg":"eth0 has no address"}'; exit 1"#,
        )],
    );
    let err = cni.check(&net, &att).await.unwrap_err();
    assert_eq!(err.code(), Some(7));
}

#[tokio::test]
async fn status_runs_from_1_1_0_on() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.plugin(
        "second",
        ALL_VERSIONS,
        &[(
            "STATUS",
            r#"echo '{"cniVersion":"1.1.0","code":50,"msg":"daemon down","details":"no socket"}'; exit 1"#,
        )],
    );
    lab.ok_plugin("third", RESULT1);
    let cni = lab.cni(Duration::from_secs(10));
    let mut net = two_plugins("1.0.0");
    net.plugins
        .push(json!({"type": "third"}).as_object().unwrap().clone());
    cni.status(&net).await.unwrap();
    assert!(lab.runs().is_empty());

    net.cni_version = "1.1.0".into();
    let err = cni.status(&net).await.unwrap_err();
    assert_eq!(err.code(), Some(50));
    match &err {
        Error::Plugin { plugin, msg, .. } => {
            assert_eq!(plugin, "second");
            assert_eq!(msg, "daemon down");
        }
        other => panic!("{other:?}"),
    }
    let runs = lab.runs();
    assert_eq!(who(&runs), ["first STATUS", "second STATUS"]);
    let env: Vec<&str> = runs[0]
        .env
        .keys()
        .filter(|k| k.starts_with("CNI_"))
        .map(String::as_str)
        .collect();
    assert_eq!(env, ["CNI_COMMAND", "CNI_PATH"]);
    assert_eq!(
        runs[0].stdin,
        json!({"type": "first", "bridge": "cni0", "capabilities": {"portMappings": true, "bandwidth": false}, "name": "net", "cniVersion": "1.1.0"})
    );

    lab.ok_plugin("second", RESULT1);
    cni.status(&net).await.unwrap();
    assert_eq!(
        who(&lab.runs()),
        ["first STATUS", "second STATUS", "third STATUS"]
    );
}

#[tokio::test]
async fn gc_deletes_stale_attachments_and_tells_the_plugins_the_valid_ones() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.ok_plugin("second", RESULT2);
    let cni = lab.cni(Duration::from_secs(10));
    let net = two_plugins("1.1.0");
    let other =
        list(json!({"cniVersion": "1.1.0", "name": "other", "plugins": [{"type": "first"}]}));
    let mut results = BTreeMap::new();
    for c in ["c1", "c2", "c3"] {
        results.insert(c, cni.add(&net, &attachment(c)).await.unwrap());
    }
    cni.add(&other, &attachment("c2")).await.unwrap();
    // An entry nobody can read is left alone.
    fs::write(lab.cache.join("results/net-junk-eth0"), "junk").unwrap();
    lab.runs();

    let valid = [
        ("c1".to_string(), "eth0".to_string()),
        ("c3".to_string(), "eth0".to_string()),
    ];
    let report = cni.gc(&net, &valid).await.unwrap();
    assert_eq!(report.deleted, [("c2".to_string(), "eth0".to_string())]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let runs = lab.runs();
    assert_eq!(
        who(&runs),
        ["second DEL", "first DEL", "first GC", "second GC"]
    );
    for del in &runs[..2] {
        assert_eq!(del.env["CNI_CONTAINERID"], "c2");
        assert_eq!(del.env["CNI_NETNS"], "/var/run/netns/c2");
        assert_eq!(del.stdin["prevResult"], results["c2"].raw);
    }
    let attachments = json!([
        {"containerID": "c1", "ifname": "eth0"},
        {"containerID": "c3", "ifname": "eth0"}
    ]);
    for gc in &runs[2..] {
        assert_eq!(gc.stdin["cni.dev/valid-attachments"], attachments);
        assert_eq!(gc.stdin["cni.dev/attachments"], attachments);
        assert_eq!(gc.stdin["name"], "net");
        assert_eq!(gc.stdin["cniVersion"], "1.1.0");
        assert!(gc.stdin.get("prevResult").is_none() && gc.stdin.get("runtimeConfig").is_none());
        for absent in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"] {
            assert!(!gc.env.contains_key(absent), "{absent} in GC's environment");
        }
        assert_eq!(gc.env["CNI_COMMAND"], "GC");
    }
    assert!(lab.entry("net", "c1", "eth0").exists());
    assert!(!lab.entry("net", "c2", "eth0").exists());
    assert!(lab.entry("net", "c3", "eth0").exists());
    assert!(lab.entry("other", "c2", "eth0").exists());
    assert!(lab.entry("net", "junk", "eth0").exists());

    // A plugin's GC failure is reported, not fatal; the others run.
    lab.plugin(
        "first",
        ALL_VERSIONS,
        &[("GC", r#"echo '{"code":5,"msg":"io"}'; exit 1"#)],
    );
    let report = cni.gc(&net, &valid).await.unwrap();
    assert!(report.deleted.is_empty());
    assert_eq!(report.errors.len(), 1);
    assert!(
        report.errors[0].contains("\"first\" failed GC: code 5: io"),
        "{:?}",
        report.errors
    );
    assert_eq!(who(&lab.runs()), ["first GC", "second GC"]);

    // disableGC, or before 1.1.0: stale attachments go, the plugins get no GC.
    lab.ok_plugin("first", RESULT1);
    let mut quiet = net.clone();
    quiet.disable_gc = true;
    let report = cni.gc(&quiet, &valid[..1]).await.unwrap();
    assert_eq!(report.deleted, [("c3".to_string(), "eth0".to_string())]);
    assert_eq!(who(&lab.runs()), ["second DEL", "first DEL"]);
    let old = two_plugins("1.0.0");
    let report = cni.gc(&old, &[]).await.unwrap();
    assert_eq!(report.deleted, [("c1".to_string(), "eth0".to_string())]);
    assert_eq!(who(&lab.runs()), ["second DEL", "first DEL"]);
    let left: Vec<String> = cni
        .cached()
        .iter()
        .map(|e| format!("{}/{}", e.network_name, e.container_id))
        .collect();
    assert_eq!(left, ["other/c2"]);
}

#[tokio::test]
async fn add_refuses_a_plugin_that_does_not_speak_the_version() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.plugin(
        "oldie",
        r#"["0.3.1","0.4.0"]"#,
        &[("ADD", &format!("echo '{RESULT1}'"))],
    );
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(
        json!({"cniVersion": "1.0.0", "name": "v", "plugins": [{"type": "first"}, {"type": "oldie"}]}),
    );
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::Unsupported { plugin, what } => {
            assert_eq!(plugin.as_deref(), Some("oldie"));
            assert!(what.contains("speaks 0.3.1, 0.4.0"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("oldie"));
    assert!(lab.runs().is_empty(), "no ADD, and no DEL");
    assert!(cni.cached().is_empty());

    let info = cni.version("oldie").await.unwrap();
    assert_eq!(
        info,
        VersionInfo {
            cni_version: "1.1.0".into(),
            supported_versions: vec!["0.3.1".into(), "0.4.0".into()]
        }
    );
    let req = lab.all_runs().pop().unwrap();
    assert_eq!(req.stdin, json!({"cniVersion": "1.1.0"}));
}

#[tokio::test]
async fn bad_plugins_and_attachments_are_refused_before_anything_runs() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(
        json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "first"}, {"type": "missing"}]}),
    );
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::PluginNotFound { plugin, dirs } => {
            assert_eq!(plugin, "missing");
            assert_eq!(dirs.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    let mut sneaky =
        list(json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "first"}]}));
    sneaky.plugins[0].insert("type".into(), json!("../bin/first"));
    assert!(matches!(
        cni.add(&sneaky, &attachment("c1")).await,
        Err(Error::Unsupported { .. })
    ));
    let mut unspoken =
        list(json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "first"}]}));
    unspoken.cni_version = "0.2.0".into();
    assert!(matches!(
        cni.add(&unspoken, &attachment("c1")).await,
        Err(Error::Unsupported { plugin: None, .. })
    ));
    let net = list(json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "first"}]}));
    for att in [
        attachment("../etc"),
        attachment(""),
        Attachment {
            ifname: "a-very-long-ifname".into(),
            ..attachment("c1")
        },
        Attachment {
            ifname: "eth/0".into(),
            ..attachment("c1")
        },
        Attachment {
            args: vec![("A;B".into(), "x".into())],
            ..attachment("c1")
        },
        Attachment {
            netns: PathBuf::new(),
            ..attachment("c1")
        },
    ] {
        let err = cni.add(&net, &att).await.unwrap_err();
        assert!(matches!(err, Error::InvalidAttachment { .. }), "{err}");
    }
    assert!(lab.runs().is_empty());
    assert!(!lab.cache.join("results").exists() || cni.cached().is_empty());
}

#[tokio::test]
async fn a_result_without_a_version_gets_the_list_s() {
    let lab = Lab::new();
    lab.ok_plugin("first", r#"{"ips":[{"address":"10.9.0.2/16"}]}"#);
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({"cniVersion": "0.4.0", "name": "n", "plugins": [{"type": "first"}]}));
    let result = cni.add(&net, &attachment("c1")).await.unwrap();
    assert_eq!(result.cni_version, "0.4.0");
    assert_eq!(result.raw["cniVersion"], "0.4.0");
    assert_eq!(result.ips[0].address, ("10.9.0.2".parse().unwrap(), 16));
}
