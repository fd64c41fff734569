//! Tests of [`super`] (payloads): items, modes, optional keys, field paths, divisors.

use serde_json::json;

use super::*;

fn cm(v: serde_json::Value) -> ConfigMap {
    serde_json::from_value(v).expect("a configmap")
}

fn items(v: serde_json::Value) -> Vec<KeyToPath> {
    serde_json::from_value(v).expect("items")
}

fn text(p: &Payload, path: &str) -> (String, u32) {
    let f = p.get(path).unwrap_or_else(|| panic!("{path} in {p:?}"));
    (String::from_utf8_lossy(&f.data).into_owned(), f.mode)
}

#[test]
fn config_map_keys_items_and_modes() {
    // "YmluYXJ5" is base64 for "binary".
    let c = cm(
        json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"},
        "binaryData": {"bin": "YmluYXJ5"}}),
    );
    let all = config_map_payload(None, &c, 0o644, false).expect("all keys");
    assert_eq!(all.len(), 3);
    assert_eq!(text(&all, "a"), ("1".into(), 0o644));
    assert_eq!(text(&all, "bin"), ("binary".into(), 0o644));
    let it = items(
        json!([{"key": "a", "path": "dir/a.conf", "mode": 0o400}, {"key": "bin", "path": "b"}]),
    );
    let some = config_map_payload(Some(&it), &c, 0o600, false).expect("items");
    assert_eq!(some.len(), 2);
    assert_eq!(text(&some, "dir/a.conf"), ("1".into(), 0o400));
    assert_eq!(text(&some, "b"), ("binary".into(), 0o600));
    // An empty items list is all keys, as upstream.
    assert_eq!(
        config_map_payload(Some(&[]), &c, 0o644, false)
            .expect("empty")
            .len(),
        3
    );

    let missing = items(json!([{"key": "a", "path": "a"}, {"key": "nope", "path": "n"}]));
    assert_eq!(
        config_map_payload(Some(&missing), &c, 0o644, false)
            .expect_err("missing key")
            .to_string(),
        "configmap references non-existent config key: nope"
    );
    let optional = config_map_payload(Some(&missing), &c, 0o644, true).expect("optional");
    assert_eq!(optional.keys().collect::<Vec<_>>(), ["a"]);

    let bad = items(json!([{"key": "a", "path": "a", "mode": 0o4755}]));
    let e = config_map_payload(Some(&bad), &c, 0o644, false)
        .expect_err("bad mode")
        .to_string();
    assert!(e.contains("invalid mode"), "{e}");
}

#[test]
fn secret_keys_and_items() {
    // "czNjcjN0" is "s3cr3t".
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": "s"},
        "data": {"password": "czNjcjN0"}}))
    .expect("a secret");
    let all = secret_payload(None, &s, 0o400, false).expect("all");
    assert_eq!(text(&all, "password"), ("s3cr3t".into(), 0o400));
    let missing = items(json!([{"key": "user", "path": "u"}]));
    assert_eq!(
        secret_payload(Some(&missing), &s, 0o644, false)
            .expect_err("missing")
            .to_string(),
        "references non-existent secret key: user"
    );
    assert!(
        secret_payload(Some(&missing), &s, 0o644, true)
            .expect("optional")
            .is_empty()
    );
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-1",
            "labels": {"app": "web", "tier": "front\"end\n"},
            "annotations": {"note": "héllo\u{1}"}},
        "spec": {"containers": [
            {"name": "app", "image": "x", "resources": {
                "limits": {"cpu": "250m", "memory": "64Mi"},
                "requests": {"cpu": "100m", "memory": "32Mi", "ephemeral-storage": "1Gi"}}},
            {"name": "bare", "image": "x"}],
          "initContainers": [{"name": "init", "image": "x", "resources": {"limits": {"memory": "1Gi"}}}]}
    }))
    .expect("a pod")
}

#[test]
fn field_paths() {
    let p = pod();
    assert_eq!(field_path_value(&p, "metadata.name").expect("name"), "web");
    assert_eq!(
        field_path_value(&p, "metadata.namespace").expect("ns"),
        "ns"
    );
    assert_eq!(field_path_value(&p, "metadata.uid").expect("uid"), "u-1");
    assert_eq!(
        field_path_value(&p, "metadata.labels").expect("labels"),
        "app=\"web\"\ntier=\"front\\\"end\\n\""
    );
    assert_eq!(
        field_path_value(&p, "metadata.annotations").expect("annotations"),
        "note=\"héllo\\x01\""
    );
    assert_eq!(
        field_path_value(&p, "metadata.labels['app']").expect("one"),
        "web"
    );
    assert_eq!(
        field_path_value(&p, "metadata.labels['none']").expect("none"),
        ""
    );
    assert_eq!(
        field_path_value(&p, "spec.nodeName")
            .expect_err("unsupported")
            .to_string(),
        "unsupported fieldPath: spec.nodeName"
    );
}

fn rf(container: &str, resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
    let mut v = json!({"containerName": container, "resource": resource});
    if let Some(d) = divisor {
        v["divisor"] = json!(d);
    }
    serde_json::from_value(v).expect("a resourceFieldRef")
}

#[test]
fn resources_with_divisors_and_node_defaults() {
    let p = pod();
    let alloc = Allocatable {
        cpu_millis: Some(2000),
        memory: Some(4 << 30),
        ephemeral_storage: Some(10 << 30),
    };
    let v = |c: &str, r: &str, d: Option<&str>| resource_value(&rf(c, r, d), &p, &alloc);
    // Rounded up: 250m in cores is 1; in millicores 250.
    assert_eq!(v("app", "limits.cpu", None).expect("cpu"), "1");
    assert_eq!(v("app", "limits.cpu", Some("1m")).expect("cpu"), "250");
    assert_eq!(v("app", "requests.cpu", Some("1m")).expect("cpu"), "100");
    assert_eq!(v("app", "limits.memory", None).expect("mem"), "67108864");
    assert_eq!(v("app", "limits.memory", Some("1Mi")).expect("mem"), "64");
    assert_eq!(v("app", "requests.memory", Some("1M")).expect("mem"), "34");
    assert_eq!(
        v("app", "requests.ephemeral-storage", Some("1Gi")).expect("eph"),
        "1"
    );
    // No limit: the node's allocatable. No request: 0.
    assert_eq!(v("bare", "limits.cpu", Some("1m")).expect("cpu"), "2000");
    assert_eq!(v("bare", "limits.memory", Some("1Gi")).expect("mem"), "4");
    assert_eq!(
        v("bare", "limits.ephemeral-storage", Some("1Gi")).expect("e"),
        "10"
    );
    assert_eq!(v("bare", "requests.cpu", None).expect("cpu"), "0");
    assert_eq!(v("bare", "requests.memory", None).expect("mem"), "0");
    // A zero divisor is none; init containers are found too.
    assert_eq!(
        v("init", "limits.memory", Some("0")).expect("init"),
        "1073741824"
    );
    assert_eq!(
        v("nope", "limits.cpu", None)
            .expect_err("no container")
            .to_string(),
        "container nope not found"
    );
    assert_eq!(
        v("app", "limits.gpu", None)
            .expect_err("unsupported")
            .to_string(),
        "unsupported container resource : limits.gpu"
    );
}

#[test]
fn downward_api_items_modes_and_errors() {
    let p = pod();
    let alloc = Allocatable::default();
    let items: Vec<DownwardAPIVolumeFile> = serde_json::from_value(json!([
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "meta/labels", "fieldRef": {"fieldPath": "metadata.labels"}, "mode": 0o600},
        {"path": "mem", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}}
    ]))
    .expect("items");
    let out = downward_api_payload(&items, &p, &alloc, 0o644).expect("payload");
    assert_eq!(text(&out, "name"), ("web".into(), 0o644));
    assert_eq!(text(&out, "meta/labels").1, 0o600);
    assert_eq!(text(&out, "mem"), ("64".into(), 0o644));
    let bad: Vec<DownwardAPIVolumeFile> = serde_json::from_value(json!([
        {"path": "a", "fieldRef": {"fieldPath": "spec.nodeName"}},
        {"path": "b", "resourceFieldRef": {"containerName": "x", "resource": "limits.cpu"}}
    ]))
    .expect("items");
    assert_eq!(
        downward_api_payload(&bad, &p, &alloc, 0o644)
            .expect_err("two errors")
            .to_string(),
        "[unsupported fieldPath: spec.nodeName, container x not found]"
    );
}

#[test]
fn go_quoting() {
    assert_eq!(go_quote("plain"), "\"plain\"");
    assert_eq!(go_quote("a\"b\\c\td"), "\"a\\\"b\\\\c\\td\"");
    assert_eq!(go_quote("\u{7f}\u{85}é"), "\"\\x7f\\u0085é\"");
}
