//! DEL and CHECK, with and without the ADD's cache entry.

use serde_json::Map;

use super::*;

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
