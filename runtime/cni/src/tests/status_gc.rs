//! STATUS and GC: the operations on a network as a whole.

use super::*;

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
