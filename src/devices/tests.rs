use std::collections::{BTreeMap, HashMap};

use super::api::v1beta1::{ContainerAllocateResponse, DeviceSpec, Mount, RegisterRequest};
use super::registration::{is_extended_resource_name, refusal};
use super::*;

const R: &str = "example.com/dev";

fn answered_state() -> State {
    let mut st = State::default();
    st.devices.insert(
        R.into(),
        BTreeMap::from([(
            "a".to_string(),
            state::Device {
                healthy: true,
                numa: vec![0],
            },
        )]),
    );
    let resp = ContainerAllocateResponse {
        envs: HashMap::from([("K".to_string(), "v".to_string())]),
        mounts: vec![Mount {
            container_path: "/data".into(),
            host_path: "/srv/data".into(),
            read_only: true,
        }],
        devices: vec![DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }],
        annotations: HashMap::from([("vendor.com/a".to_string(), "1".to_string())]),
        cdi_devices: vec![api::v1beta1::CdiDevice {
            name: "vendor.com/class=a".into(),
        }],
    };
    st.pods.entry("uid-1".into()).or_default().insert(
        "main".into(),
        BTreeMap::from([(
            R.to_string(),
            state::Allocation {
                ids: vec!["a".into()],
                response: Some(resp),
            },
        )]),
    );
    st
}

#[test]
fn checkpoint_round_trips_and_a_corrupt_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(checkpoint::FILE);
    assert!(checkpoint::read(&path).unwrap().is_none());
    let st = answered_state();
    checkpoint::write(&path, &st).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Upstream's shape.
    let e = &v["Data"]["PodDeviceEntries"][0];
    assert_eq!(e["PodUID"], "uid-1");
    assert_eq!(e["ContainerName"], "main");
    assert_eq!(e["ResourceName"], R);
    assert_eq!(e["DeviceIDs"]["-1"][0], "a");
    assert!(e["AllocResp"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(v["Data"]["RegisteredDevices"][R][0], "a");
    assert!(v["Checksum"].is_u64());
    let back = checkpoint::read(&path).unwrap().unwrap();
    assert_eq!(back.pods, st.pods);
    // Changed data with the old checksum: refused, and set aside by the manager.
    std::fs::write(&path, text.replace("uid-1", "uid-2")).unwrap();
    let err = checkpoint::read(&path).unwrap_err();
    assert!(err.to_string().contains("is corrupt"), "{err}");
    std::fs::write(&path, "{not json").unwrap();
    let err = checkpoint::read(&path).unwrap_err();
    assert!(
        err.to_string().contains("not a device manager checkpoint"),
        "{err}"
    );
}

#[test]
fn a_manager_sets_a_corrupt_checkpoint_aside_and_restores_a_good_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(PLUGIN_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    checkpoint::write(&dir.join(checkpoint::FILE), &answered_state()).unwrap();
    let m = DeviceManager::new(root.path());
    assert_eq!(m.pod_devices("uid-1")["main"][R], vec!["a"]);
    // Until the plugin is back, its devices are known but not healthy.
    assert_eq!(m.capacity()[R], (1, 0));
    std::fs::write(dir.join(checkpoint::FILE), "garbage").unwrap();
    let m = DeviceManager::new(root.path());
    assert!(m.pod_devices("uid-1").is_empty());
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(!dir.join(checkpoint::FILE).exists());
}

#[test]
fn run_options_carry_the_plugin_answer_and_record_the_devices() {
    let root = tempfile::tempdir().unwrap();
    let m = DeviceManager::new(root.path());
    *lock(&m.inner.state) = answered_state();
    let o = &m.run_options("uid-1")["main"];
    assert_eq!(o.envs, vec![("K".to_string(), "v".to_string())]);
    assert_eq!(o.mounts[0].container_path, "/data");
    assert!(o.mounts[0].readonly);
    assert_eq!(o.devices[0].host_path, "/dev/null");
    assert_eq!(o.cdi_devices, vec!["vendor.com/class=a"]);
    assert!(o.annotations.contains(&("vendor.com/a".into(), "1".into())));
    let record = o
        .annotations
        .iter()
        .find(|(k, _)| k == ANNOTATION_DEVICES)
        .map(|(_, v)| v.clone())
        .unwrap();
    assert_eq!(record, r#"{"example.com/dev":["a"]}"#);
}

#[test]
fn admission_refuses_with_upstreams_reason_and_message() {
    let root = tempfile::tempdir().unwrap();
    let m = DeviceManager::new(root.path());
    lock(&m.inner.state).devices.insert(
        R.into(),
        BTreeMap::from([(
            "a".to_string(),
            state::Device {
                healthy: true,
                numa: vec![],
            },
        )]),
    );
    let p: Pod = serde_norway::from_str(
        "metadata: {name: p, uid: u2}
spec:
  containers:
  - {name: main, resources: {limits: {example.com/dev: '2'}}}
",
    )
    .unwrap();
    let r = m.admit(&p, None).unwrap_err();
    assert_eq!(r.reason, "UnexpectedAdmissionError");
    assert_eq!(
        r.message,
        "Allocate failed due to requested number of devices unavailable for example.com/dev. \
         Requested: 2, Available: 1, which is unexpected"
    );
    // A resource no plugin ever advertised is left to the resource predicates.
    let other: Pod = serde_norway::from_str(
        "metadata: {name: q, uid: u3}
spec:
  containers:
  - {name: main, resources: {limits: {other.com/thing: '1'}}}
",
    )
    .unwrap();
    m.admit(&other, None).unwrap();
}

#[test]
fn registration_checks_version_resource_and_endpoint() {
    let ok = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "sample.sock".into(),
        resource_name: "example.com/dev".into(),
        options: None,
    };
    assert_eq!(refusal(&ok), None);
    let v = refusal(&RegisterRequest {
        version: "v1alpha".into(),
        ..ok.clone()
    })
    .unwrap();
    assert!(v.contains("not supported"), "{v}");
    for bad in [
        "dev",
        "kubernetes.io/dev",
        "example.com/",
        "Example.com/dev",
        "requests.x/y",
    ] {
        assert!(!is_extended_resource_name(bad), "{bad}");
        let r = RegisterRequest {
            resource_name: bad.into(),
            ..ok.clone()
        };
        assert!(refusal(&r).unwrap().contains("is invalid"), "{bad}");
    }
    assert!(is_extended_resource_name("vendor.example.com/gpu-a_1.x"));
    for bad in ["", "../x.sock", "kubelet.sock", "a/b"] {
        let r = RegisterRequest {
            endpoint: bad.into(),
            ..ok.clone()
        };
        assert!(refusal(&r).unwrap().contains("endpoint"), "{bad:?}");
    }
}

#[test]
fn devices_without_an_answer_are_checkpointed_as_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(checkpoint::FILE);
    let mut st = answered_state();
    st.pods.entry("uid-2".into()).or_default().insert(
        "side".into(),
        BTreeMap::from([(
            R.to_string(),
            state::Allocation {
                ids: vec!["b".into()],
                response: None,
            },
        )]),
    );
    checkpoint::write(&path, &st).unwrap();
    let back = checkpoint::read(&path).unwrap().unwrap();
    assert_eq!(back.pods, st.pods);
}

#[test]
fn the_nodes_allocatable_is_at_least_what_pods_hold() {
    let root = tempfile::tempdir().unwrap();
    let m = DeviceManager::new(root.path());
    *lock(&m.inner.state) = answered_state();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": "2", R: "0"}}
    }))
    .unwrap();
    let fixed = m.sanitize(&node);
    let alloc = fixed.status.as_ref().unwrap().allocatable.as_ref().unwrap();
    assert_eq!(alloc[R].0, "1");
    assert_eq!(alloc["cpu"].0, "2");
    // Enough already: the Node as it is.
    let enough: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n"},
        "status": {"allocatable": {R: "3"}}
    }))
    .unwrap();
    assert!(matches!(m.sanitize(&enough), std::borrow::Cow::Borrowed(_)));
}
