//! ADD: the chain of plugins, the cache entry, and what is refused before any plugin runs.

use super::*;

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
