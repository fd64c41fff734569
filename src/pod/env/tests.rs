//! Tests of [`super`] (`pod::env`): every source, optional and required references, prefixes,
//! invalid names, the order and `$(VAR)` expansion.

use serde_json::json;

use super::*;
use crate::api::objects::ObjectError;
use crate::api::services::ServicesError;
use crate::model::PodRef;
use crate::pod::spec::tests::pod;

fn objects() -> EnvObjects {
    EnvObjects {
        config_maps: BTreeMap::from([
            (
                "cfg".to_string(),
                Ok(Some(BTreeMap::from([
                    ("MODE".to_string(), "fast".to_string()),
                    ("1bad".to_string(), "x".to_string()),
                    ("log.level".to_string(), "debug".to_string()),
                ]))),
            ),
            ("gone".to_string(), Ok(None)),
            (
                "broken".to_string(),
                Err(ObjectError::SyncTimeout { kind: "configmap" }),
            ),
        ]),
        secrets: BTreeMap::from([
            (
                "creds".to_string(),
                Ok(Some(BTreeMap::from([(
                    "password".to_string(),
                    b"s3cr3t".to_vec(),
                )]))),
            ),
            ("nope".to_string(), Ok(None)),
        ]),
        allocatable: Allocatable {
            cpu_millis: Some(4000),
            memory: Some(8 << 30),
            ephemeral_storage: None,
        },
        service_env: BTreeMap::from([
            (
                "KUBERNETES_SERVICE_HOST".to_string(),
                "10.96.0.1".to_string(),
            ),
            ("MODE".to_string(), "from-a-service".to_string()),
        ]),
        service_env_error: None,
    }
}

fn run(container: serde_json::Value) -> Result<Vec<(String, String)>> {
    let mut c = container;
    c["name"] = json!("app");
    c["image"] = json!("x");
    let p = pod(json!({"serviceAccountName": "builder", "containers": [c]}));
    let opts = ContainerOptions {
        node_name: "node-1".into(),
        pod_ips: vec!["10.1.0.5".into(), "fd00::5".into()],
        host_ips: vec!["192.168.1.2".into()],
        env_objects: objects(),
        ..Default::default()
    };
    let c = p.spec.as_ref().expect("spec").containers[0].clone();
    envs(&p, &PodRef::of(&p), &c, &opts)
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn every_source_in_order() {
    let got = run(json!({
        "envFrom": [
            {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
            {"secretRef": {"name": "creds"}},
            {"configMapRef": {"name": "gone", "optional": true}}
        ],
        "resources": {"limits": {"memory": "64Mi"}},
        "env": [
            {"name": "PASSWORD_COPY", "value": "$(password)"},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}},
            {"name": "OPTKEY", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "none", "optional": true}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
            {"name": "LABELS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
            {"name": "CFG_MODE", "value": "override"}
        ]
    }))
    .expect("env");
    assert_eq!(
        got,
        pairs(&[
            // With the prefix, `1bad` makes a valid name.
            ("CFG_1bad", "x"),
            ("CFG_MODE", "override"),
            ("CFG_log.level", "debug"),
            ("password", "s3cr3t"),
            ("PASSWORD_COPY", "s3cr3t"),
            ("MODE", "fast"),
            ("PW", "s3cr3t"),
            ("MEM", "64"),
            ("CPU", "4000"),
            ("SA", "builder"),
            ("IPS", "10.1.0.5,fd00::5"),
            ("LABELS", "app=\"web\""),
            // The service variables the container does not define, last.
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ])
    );
    // `$(VAR)` sees the service variables.
    let got = run(json!({"env": [{"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST)"}]}))
        .expect("env");
    assert_eq!(got[0], ("API".to_string(), "https://10.96.0.1".to_string()));
}

#[test]
fn no_environment_before_the_services_are_read() {
    let p = pod(json!({"containers": [{"name": "app", "image": "x"}]}));
    let mut objects = objects();
    objects.service_env_error = Some(ServicesError::NotRead);
    let opts = ContainerOptions {
        env_objects: objects,
        ..Default::default()
    };
    let c = p.spec.as_ref().expect("spec").containers[0].clone();
    let e = envs(&p, &PodRef::of(&p), &c, &opts).expect_err("not read");
    assert_eq!(
        e.message(),
        "services have not yet been read at least once, cannot construct envvars"
    );
}

#[test]
fn required_references_fail_with_upstream_messages() {
    let fails = [
        (
            json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}),
            "configmap \"gone\" not found",
        ),
        (
            json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]}),
            "secret \"nope\" not found",
        ),
        (
            json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]}),
            "couldn't find key k in ConfigMap prod/cfg",
        ),
        (
            json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}}]}),
            "couldn't find key user in Secret prod/creds",
        ),
        (
            json!({"envFrom": [{"configMapRef": {"name": "gone"}}]}),
            "configmap \"gone\" not found",
        ),
        // An object that could not be read fails even an optional reference.
        (
            json!({"envFrom": [{"configMapRef": {"name": "broken", "optional": true}}]}),
            "failed to sync configmap cache: timed out waiting for the condition",
        ),
        (
            json!({"env": [{"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]}),
            "unsupported container resource : limits.gpu",
        ),
    ];
    for (c, want) in fails {
        let e = run(c.clone()).expect_err("a failure");
        assert_eq!(e.message(), want, "{c}");
    }
}

#[test]
fn invalid_env_from_names_are_reported() {
    let p = pod(json!({"containers": [{"name": "app", "image": "x",
        "envFrom": [{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "creds"}}]}]}));
    let c = &p.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        invalid_env_from_keys(&PodRef::of(&p), c, &objects()),
        [
            "Keys [1bad] from the EnvFrom configMap prod/cfg were skipped since they are \
          considered invalid environment variable names."
        ]
    );
    assert!(is_env_var_name("log.level") && is_env_var_name("_X") && is_env_var_name("-a"));
    assert!(!is_env_var_name("1bad") && !is_env_var_name("") && !is_env_var_name("a=b"));
    let (cms, secrets) = env_references(&p);
    assert_eq!(cms.into_iter().collect::<Vec<_>>(), ["cfg"]);
    assert_eq!(secrets.into_iter().collect::<Vec<_>>(), ["creds"]);
}
