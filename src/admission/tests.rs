//! Table tests of [`super::admit`]: every rejection reason and the happy path.

use super::*;
use serde_json::{Value, json};

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": "node-a",
            "labels": {
                "kubernetes.io/hostname": "node-a",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "disk": "ssd",
                "cores": "8",
            },
        },
        "spec": {"taints": [
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
        ]},
        "status": {"allocatable": {
            "cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi", "pods": "3",
        }},
    }))
    .unwrap()
}

/// A pod `name` from a spec; `containers` defaults to one container without requests.
fn pod(name: &str, mut spec: Value) -> Pod {
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .unwrap()
}

fn requesting(name: &str, cpu: &str, memory: &str) -> Pod {
    pod(
        name,
        json!({"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}),
    )
}

fn affinity(terms: Value) -> Value {
    json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
}

fn expr(key: &str, op: &str, values: &[&str]) -> Value {
    json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}])
}

fn reason(r: Result<(), Rejection>) -> String {
    match r {
        Ok(()) => "admitted".to_string(),
        Err(rej) => rej.reason,
    }
}

#[test]
fn happy_path() {
    let active = [requesting("a", "500m", "1Gi")];
    let p = pod(
        "p",
        json!({
            "nodeName": "node-a",
            "os": {"name": "linux"},
            "nodeSelector": {"disk": "ssd", "kubernetes.io/os": "linux"},
            "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "1500m", "memory": "3Gi", "ephemeral-storage": "1Gi"}},
                "ports": [{"containerPort": 80, "hostPort": 8080}]}],
        }),
    );
    assert_eq!(admit(&p, &active, &node()), Ok(()));
}

#[test]
fn every_reason() {
    let a = requesting("a", "500m", "1Gi");
    let b = requesting("b", "0", "0");
    let with_port = pod(
        "w",
        json!({"containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]}]}),
    );
    let mut labelled_windows = pod("lw", json!({}));
    labelled_windows.metadata.labels =
        Some([("kubernetes.io/os".to_string(), "windows".to_string())].into());
    let mut no_execute = node();
    no_execute
        .spec
        .as_mut()
        .unwrap()
        .taints
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(json!({"key": "drain", "effect": "NoExecute"})).unwrap());
    let node = node();
    // (name, pod, active pods, node, expected reason)
    let cases: Vec<(&str, Pod, Vec<Pod>, &Node, &str)> = vec![
        (
            "node name",
            pod("p", json!({"nodeName": "node-b"})),
            vec![],
            &node,
            "NodeName",
        ),
        (
            "spec.os",
            pod("p", json!({"os": {"name": "windows"}})),
            vec![],
            &node,
            "PodOSNotSupported",
        ),
        (
            "os label",
            labelled_windows,
            vec![],
            &node,
            "PodOSSelectorNodeLabelDoesNotMatch",
        ),
        (
            "os selector",
            pod(
                "p",
                json!({"nodeSelector": {"kubernetes.io/os": "windows"}}),
            ),
            vec![],
            &node,
            "NodeAffinity",
        ),
        (
            "selector value",
            pod("p", json!({"nodeSelector": {"disk": "hdd"}})),
            vec![],
            &node,
            "NodeAffinity",
        ),
        (
            "selector missing label",
            pod("p", json!({"nodeSelector": {"zone": "a"}})),
            vec![],
            &node,
            "NodeAffinity",
        ),
        (
            "max pods",
            pod("p", json!({})),
            vec![a.clone(), b.clone(), with_port.clone()],
            &node,
            "OutOfpods",
        ),
        (
            "cpu",
            requesting("p", "1600m", "0"),
            vec![a.clone()],
            &node,
            "OutOfcpu",
        ),
        (
            "memory",
            requesting("p", "100m", "3500Mi"),
            vec![a.clone()],
            &node,
            "OutOfmemory",
        ),
        (
            "ephemeral-storage",
            pod(
                "p",
                json!({"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"ephemeral-storage": "11Gi"}}}]}),
            ),
            vec![],
            &node,
            "OutOfephemeral-storage",
        ),
        (
            "host port",
            pod(
                "p",
                json!({"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 81, "hostPort": 8080}]}]}),
            ),
            vec![with_port.clone()],
            &node,
            "NodePorts",
        ),
        (
            "no-execute taint",
            pod("p", json!({})),
            vec![],
            &no_execute,
            "TaintToleration",
        ),
        (
            "no-execute tolerated",
            pod(
                "p",
                json!({"tolerations": [{"key": "drain", "operator": "Exists"}]}),
            ),
            vec![],
            &no_execute,
            "admitted",
        ),
        (
            "host port on another protocol",
            pod(
                "p",
                json!({"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 81, "hostPort": 8080, "protocol": "UDP"}]}]}),
            ),
            vec![with_port.clone()],
            &node,
            "admitted",
        ),
        // A pod without requests needs only a pod slot, however full the node is.
        (
            "no requests on a full node",
            pod("p", json!({})),
            vec![requesting("x", "2", "4Gi")],
            &node,
            "admitted",
        ),
        // The pod itself among the active pods is not counted twice.
        (
            "itself active",
            requesting("a", "2", "4Gi"),
            vec![requesting("a", "2", "4Gi")],
            &node,
            "admitted",
        ),
    ];
    for (name, p, active, n, want) in cases {
        assert_eq!(reason(admit(&p, &active, n)), want, "{name}");
    }
}

#[test]
fn static_pods_ignore_no_execute_taints() {
    let mut n = node();
    n.spec.as_mut().unwrap().taints = Some(vec![
        serde_json::from_value(json!({"key": "drain", "effect": "NoExecute"})).unwrap(),
    ]);
    let mut p = pod("p", json!({}));
    p.metadata.annotations =
        Some([(CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string())].into());
    assert_eq!(admit(&p, &[], &n), Ok(()));
}

#[test]
fn messages_as_upstream() {
    let a = requesting("a", "500m", "1Gi");
    let err = admit(
        &requesting("p", "2", "0"),
        std::slice::from_ref(&a),
        &node(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        Rejection {
            reason: "OutOfcpu".into(),
            message:
                "Node didn't have enough resource: cpu, requested: 2000, used: 500, capacity: 2000"
                    .into(),
        }
    );
    let err = admit(
        &requesting("p", "0", "4Gi"),
        std::slice::from_ref(&a),
        &node(),
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Node didn't have enough resource: memory, requested: 4294967296, used: 1073741824, capacity: 4294967296"
    );
    let full = [
        a.clone(),
        requesting("b", "0", "0"),
        requesting("c", "0", "0"),
    ];
    let err = admit(&pod("p", json!({})), &full, &node()).unwrap_err();
    assert_eq!(
        err.message,
        "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
    );
    let err = admit(
        &pod("p", json!({"nodeSelector": {"disk": "hdd"}})),
        &[],
        &node(),
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
    );
    let err = admit(&pod("p", json!({"nodeName": "x"})), &[], &node()).unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.message.as_str()),
        (
            "NodeName",
            "Predicate NodeName failed: node(s) didn't match the requested node name"
        )
    );
    let mut tainted = node();
    tainted.spec.as_mut().unwrap().taints = Some(vec![
        serde_json::from_value(json!({"key": "k", "effect": "NoExecute"})).unwrap(),
    ]);
    let err = admit(&pod("p", json!({})), &[], &tainted).unwrap_err();
    assert_eq!(
        err.message,
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
    );
    let port = |name: &str| {
        pod(
            name,
            json!({"containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 1, "hostPort": 9000, "hostIP": "10.0.0.1"}]}]}),
        )
    };
    let err = admit(&port("p"), &[port("q")], &node()).unwrap_err();
    assert_eq!(
        err.message,
        "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
    );
}

#[test]
fn required_node_affinity() {
    let or_terms = json!([
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
        {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]},
    ]);
    let and_term = json!([{"matchExpressions": [
        {"key": "disk", "operator": "In", "values": ["ssd"]},
        {"key": "cores", "operator": "Lt", "values": ["4"]},
    ]}]);
    // (name, terms, matches)
    let cases = [
        ("In", expr("disk", "In", &["ssd", "nvme"]), true),
        ("In other", expr("disk", "In", &["hdd"]), false),
        ("In missing", expr("zone", "In", &["a"]), false),
        ("NotIn", expr("disk", "NotIn", &["hdd"]), true),
        ("NotIn same", expr("disk", "NotIn", &["ssd"]), false),
        ("NotIn missing", expr("zone", "NotIn", &["a"]), true),
        ("Exists", expr("disk", "Exists", &[]), true),
        ("Exists missing", expr("zone", "Exists", &[]), false),
        ("DoesNotExist", expr("zone", "DoesNotExist", &[]), true),
        (
            "DoesNotExist present",
            expr("disk", "DoesNotExist", &[]),
            false,
        ),
        ("Gt", expr("cores", "Gt", &["4"]), true),
        ("Gt equal", expr("cores", "Gt", &["8"]), false),
        ("Lt", expr("cores", "Lt", &["16"]), true),
        ("Lt smaller", expr("cores", "Lt", &["8"]), false),
        ("Gt not a number", expr("disk", "Gt", &["4"]), false),
        ("Gt two values", expr("cores", "Gt", &["1", "2"]), false),
        ("unknown operator", expr("disk", "Like", &["ssd"]), false),
        ("terms are ORed", or_terms, true),
        ("expressions are ANDed", and_term, false),
        ("empty term", json!([{}]), false),
        ("no terms", json!([]), false),
        (
            "field name",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]),
            true,
        ),
        (
            "field other name",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]),
            false,
        ),
        (
            "field NotIn",
            json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}]),
            true,
        ),
        (
            "unsupported field",
            json!([{"matchFields": [{"key": "spec.x", "operator": "In", "values": ["a"]}]}]),
            false,
        ),
    ];
    for (name, terms, want) in cases {
        let p = pod("p", affinity(terms));
        assert_eq!(matches_node_affinity(&p, &node()), want, "{name}");
        let expected = if want { "admitted" } else { "NodeAffinity" };
        assert_eq!(reason(admit(&p, &[], &node())), expected, "{name}");
    }
}

#[test]
fn effective_requests() {
    let req = |cpu: &str, mem: &str| json!({"requests": {"cpu": cpu, "memory": mem}});
    let c = |name: &str, r: Value| json!({"name": name, "image": "i", "resources": r});
    let sidecar = |name: &str, r: Value| json!({"name": name, "image": "i", "restartPolicy": "Always", "resources": r});
    let mi = 1024 * 1024;
    // (name, spec, cpu millis, memory bytes)
    let cases = [
        (
            "sum of containers",
            json!({"containers": [c("a", req("100m", "10Mi")), c("b", req("200m", "20Mi"))]}),
            300,
            30 * mi,
        ),
        (
            "init larger",
            json!({"initContainers": [c("i", req("1", "5Mi"))], "containers": [c("a", req("100m", "10Mi"))]}),
            1000,
            10 * mi,
        ),
        (
            "max of init containers",
            json!({"initContainers": [c("i1", req("300m", "1Mi")), c("i2", req("700m", "2Mi"))],
                   "containers": [c("a", req("100m", "10Mi"))]}),
            700,
            10 * mi,
        ),
        (
            "sidecars add to containers and to later init containers",
            json!({"initContainers": [sidecar("s", req("200m", "8Mi")), c("i", req("500m", "1Mi"))],
                   "containers": [c("a", req("100m", "10Mi"))]}),
            // init step: 500m + 200m = 700m; running: 100m + 200m = 300m.
            700,
            18 * mi,
        ),
        (
            "overhead added",
            json!({"containers": [c("a", req("100m", "10Mi"))], "overhead": {"cpu": "50m", "memory": "1Mi"}}),
            150,
            11 * mi,
        ),
        (
            "limits stand in for missing requests",
            json!({"containers": [c("a", json!({"limits": {"cpu": "1", "memory": "64Mi"}, "requests": {"cpu": "250m"}}))]}),
            250,
            64 * mi,
        ),
        (
            "pod-level requests replace the containers'",
            json!({"resources": {"requests": {"cpu": "2"}}, "containers": [c("a", req("100m", "10Mi"))]}),
            2000,
            10 * mi,
        ),
    ];
    for (name, spec, cpu, memory) in cases {
        let r = pod_requests(&pod("p", spec));
        assert_eq!((r.get("cpu"), r.get("memory")), (cpu, memory), "{name}");
    }
}

#[test]
fn huge_pages_and_extended_resources() {
    let asking = |name: &str, resource: &str, amount: &str| {
        pod(
            name,
            json!({"containers": [{"name": "c", "image": "i", "resources": {
                "requests": {resource: amount}, "limits": {resource: amount}}}]}),
        )
    };
    let mut rich = node();
    let alloc = rich.status.as_mut().unwrap().allocatable.as_mut().unwrap();
    alloc.insert("hugepages-2Mi".into(), Quantity("1Gi".into()));
    alloc.insert("example.com/dongle".into(), Quantity("2".into()));
    let plain = node();
    // (name, pod, active, node, expected reason)
    let cases = [
        (
            "huge pages on a node without",
            asking("p", "hugepages-2Mi", "512Mi"),
            vec![],
            &plain,
            "OutOfhugepages-2Mi",
        ),
        (
            "huge pages that fit",
            asking("p", "hugepages-2Mi", "512Mi"),
            vec![],
            &rich,
            "admitted",
        ),
        (
            "huge pages used up",
            asking("p", "hugepages-2Mi", "768Mi"),
            vec![asking("a", "hugepages-2Mi", "512Mi")],
            &rich,
            "OutOfhugepages-2Mi",
        ),
        (
            "extended resource the node does not list",
            asking("p", "example.com/widget", "5"),
            vec![],
            &rich,
            "admitted",
        ),
        (
            "extended resource that fits",
            asking("p", "example.com/dongle", "2"),
            vec![],
            &rich,
            "admitted",
        ),
        (
            "extended resource short",
            asking("p", "example.com/dongle", "3"),
            vec![],
            &rich,
            "OutOfexample.com/dongle",
        ),
    ];
    for (name, p, active, n, want) in cases {
        assert_eq!(reason(admit(&p, &active, n)), want, "{name}");
    }
    let err = admit(&asking("p", "hugepages-2Mi", "2Mi"), &[], &plain).unwrap_err();
    assert_eq!(
        err.message,
        "Node didn't have enough resource: hugepages-2Mi, requested: 2097152, used: 0, capacity: 0"
    );
}
