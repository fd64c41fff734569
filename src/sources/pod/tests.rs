//! Unit tests for manifest decoding, validation and static pod defaulting.

use super::*;

const GOOD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: nginx:1.27
  - name: side
    image: busybox
";

fn decoded(text: &str) -> Pod {
    match decode(text) {
        Ok(p) => p,
        Err(e) => panic!("{text}: {e}"),
    }
}

#[test]
fn decode_yaml_and_json() {
    let p = decoded(GOOD);
    assert_eq!(p.metadata.name.as_deref(), Some("web"));
    let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},
        "spec":{"containers":[{"name":"c","image":"i:1"}]}}"#;
    assert_eq!(decoded(json).metadata.name.as_deref(), Some("j"));
}

#[test]
fn decode_errors() {
    let cases: &[(&str, &str)] = &[
        ("a: [", "not YAML/JSON"),
        ("- 1\n", "not a Pod"),
        ("apiVersion: v1\nkind: Service\n", "kind is \"Service\""),
        ("apiVersion: v1\n", "kind is missing"),
        (
            "apiVersion: apps/v1\nkind: Pod\n",
            "apiVersion is \"apps/v1\"",
        ),
        ("kind: Pod\n", "apiVersion is missing"),
        (
            "apiVersion: v1\nkind: Pod\nspec: {containers: 3}\n",
            "invalid Pod",
        ),
    ];
    for (text, want) in cases {
        let got = decode(text).unwrap_err().to_string();
        assert!(got.starts_with(want), "{text:?}: got {got:?}");
    }
}

#[test]
fn validation() {
    let cases: &[(&str, Option<&str>)] = &[
        ("", None),
        ("metadata: {name: ''}", Some("metadata.name is required")),
        (
            "metadata: {name: Web}",
            Some("metadata.name \"Web\" is not a DNS-1123 subdomain"),
        ),
        ("metadata: {name: web., }", Some("metadata.name \"web.\"")),
        ("metadata: {name: a.b-c}", None),
        (
            "metadata: {name: w, namespace: kube.system}",
            Some("metadata.namespace"),
        ),
        (
            "spec: {containers: []}",
            Some("spec.containers: at least one container"),
        ),
        (
            "spec: {containers: [{name: a, image: i}, {name: a, image: j}]}",
            Some("spec.containers: duplicate container name \"a\""),
        ),
        (
            "spec: {initContainers: [{name: a, image: i}], containers: [{name: a, image: j}]}",
            Some("spec.containers: duplicate container name \"a\""),
        ),
        (
            "spec: {containers: [{name: A_b, image: i}]}",
            Some("spec.containers: container name \"A_b\""),
        ),
        (
            "spec: {containers: [{name: a, image: ' '}]}",
            Some("spec.containers: container \"a\" has no image"),
        ),
        (
            "spec: {containers: [{name: a}]}",
            Some("spec.containers: container \"a\" has no image"),
        ),
        (
            "spec: {initContainers: [{name: '', image: i}], containers: [{name: a, image: j}]}",
            Some("spec.initContainers: container #0 has no name"),
        ),
    ];
    for (patch, want) in cases {
        let mut v: serde_json::Value = serde_norway::from_str(GOOD).unwrap();
        if !patch.is_empty() {
            let p: serde_json::Value = serde_norway::from_str(patch).unwrap();
            for (k, pv) in p.as_object().unwrap() {
                for (k2, pv2) in pv.as_object().unwrap() {
                    v[k][k2] = pv2.clone();
                }
            }
        }
        let pod: Pod = serde_json::from_value(v).unwrap();
        match (validate(&pod), want) {
            (Ok(()), None) => {}
            (Err(e), Some(w)) => {
                let e = e.to_string();
                assert!(e.starts_with(w), "{patch}: got {e:?}, want {w:?}")
            }
            (got, _) => panic!("{patch}: got {got:?}, want {want:?}"),
        }
    }
    let long = "a".repeat(254);
    assert!(!is_dns1123_subdomain(&long));
    assert!(is_dns1123_subdomain(&format!(
        "{}.{}",
        "a".repeat(63),
        "b".repeat(63)
    )));
    assert!(!is_dns1123_label(&"a".repeat(64)));
    assert!(!is_dns1123_label("-a") && !is_dns1123_label("a-") && is_dns1123_label("a-1"));
}

#[test]
fn pull_policy() {
    for (image, want) in [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.36", "IfNotPresent"),
        ("localhost:5000/busybox", "Always"),
        ("localhost:5000/busybox:v1", "IfNotPresent"),
        ("busybox@sha256:abcd", "IfNotPresent"),
        ("busybox:latest@sha256:abcd", "IfNotPresent"),
    ] {
        assert_eq!(PullPolicy::default_for(image).as_str(), want, "{image}");
    }
}

#[test]
fn defaults() {
    let mut p = decoded(GOOD);
    apply_defaults(
        &mut p,
        "/etc/m/web.yaml",
        "node1",
        "file",
        "2026-01-01T00:00:00Z",
    );
    let uid = p.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 32);
    assert!(uid.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(p.metadata.name.as_deref(), Some("web-node1"));
    assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
    let a = p.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[CONFIG_HASH_ANNOTATION], uid);
    assert_eq!(a[CONFIG_SOURCE_ANNOTATION], "file");
    assert_eq!(a[CONFIG_SEEN_ANNOTATION], "2026-01-01T00:00:00Z");
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node1"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    let t = spec.tolerations.as_ref().unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].effect.as_deref(), Some("NoExecute"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    assert_eq!(
        spec.containers[1].image_pull_policy.as_deref(),
        Some("Always")
    );
    assert_eq!(
        spec.containers[0].termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert!(validate(&p).is_ok());

    // The UID depends on the content, node and origin, not on formatting or the seen time.
    let uid_of = |text: &str, origin: &str, node: &str| {
        let mut p = decoded(text);
        apply_defaults(&mut p, origin, node, "file", "now");
        p.metadata.uid.unwrap()
    };
    let reformatted = GOOD.replace("name: web", "name: web  # comment");
    assert_eq!(uid_of(&reformatted, "/etc/m/web.yaml", "node1"), uid);
    assert_ne!(uid_of(GOOD, "/etc/m/other.yaml", "node1"), uid);
    assert_ne!(uid_of(GOOD, "/etc/m/web.yaml", "node2"), uid);
    assert_ne!(
        uid_of(&GOOD.replace("1.27", "1.28"), "/etc/m/web.yaml", "node1"),
        uid
    );

    // Values already set are kept.
    let set = "apiVersion: v1
kind: Pod
metadata: {name: x, namespace: kube-system, uid: my-uid}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  dnsPolicy: Default
  containers: [{name: c, image: 'i:latest', imagePullPolicy: Never}]
";
    let mut p = decoded(set);
    apply_defaults(&mut p, "o", "n", "http", "now");
    assert_eq!(p.metadata.uid.as_deref(), Some("my-uid"));
    assert_eq!(p.metadata.namespace.as_deref(), Some("kube-system"));
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.termination_grace_period_seconds, Some(5));
    assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("Never")
    );
    let a = p.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[CONFIG_HASH_ANNOTATION], "my-uid");
    assert_eq!(a[CONFIG_SOURCE_ANNOTATION], "http");
}

#[test]
fn extended_resources_are_not_overcommitable() {
    let with = |resources: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: d}}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    resources: {resources}\n"
        );
        validate(&decoded(&text)).err().map(|e| e.to_string())
    };
    assert_eq!(with("{limits: {example.com/dev: '2'}}"), None);
    assert_eq!(
        with("{limits: {example.com/dev: '2'}, requests: {example.com/dev: '2', cpu: 100m}}"),
        None
    );
    let e = with("{requests: {example.com/dev: '1'}}").unwrap();
    assert!(
        e.contains("Limit must be set for non overcommitable resources"),
        "{e}"
    );
    let e = with("{limits: {example.com/dev: '2'}, requests: {example.com/dev: '1'}}").unwrap();
    assert!(
        e.contains("must be equal to example.com/dev limit of 2"),
        "{e}"
    );
    let e = with("{limits: {example.com/dev: 500m}}").unwrap();
    assert!(e.contains("must be an integer"), "{e}");
    // cpu and memory may be overcommitted as always.
    assert_eq!(with("{limits: {cpu: '2'}, requests: {cpu: '1'}}"), None);
}
