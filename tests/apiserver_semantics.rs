//! The test API server (`tests/apiserver/`) held to kube-apiserver's semantics, through
//! `kube::Api`, kube-runtime's watcher and recorder, raw HTTP where kube cannot say it, and
//! kubectl when it is installed. No containers, no root.

mod apiserver;
mod common;

use std::time::Duration;

use apiserver::ApiServer;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Liveness guard for awaited events; failing here means the event never came.
const WAIT: Duration = Duration::from_secs(15);

fn pod(name: &str, node: Option<&str>, labels: Value) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(p).unwrap()
}

fn rv_of<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// One HTTP/1.1 request over a fresh connection: status code and JSON body.
async fn http(
    server: &ApiServer,
    method: &str,
    path: &str,
    ctype: &str,
    body: &str,
) -> (u16, Value) {
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\n\
         Content-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn next<S: Stream + Unpin>(s: &mut S) -> S::Item {
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("no event in time")
        .expect("stream ended")
}

async fn next_watch(
    s: &mut (impl Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
) -> WatchEvent<Pod> {
    loop {
        match next(s).await.unwrap() {
            WatchEvent::Bookmark(_) => continue,
            e => return e,
        }
    }
}

#[tokio::test]
async fn create_get_list_with_field_and_label_selectors() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let a = pods
        .create(&pp, &pod("a", Some("n1"), json!({"app": "web"})))
        .await
        .unwrap();
    let b = pods
        .create(
            &pp,
            &pod("b", Some("n2"), json!({"app": "db", "tier": "x"})),
        )
        .await
        .unwrap();
    pods.create(&pp, &pod("c", None, json!({}))).await.unwrap();
    let other: Api<Pod> = Api::namespaced(server.client(), "other");
    other
        .create(&pp, &pod("d", Some("n1"), json!({"app": "web"})))
        .await
        .unwrap();

    // Server-set fields.
    assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
    assert!(
        a.metadata.uid.as_deref().is_some_and(|u| u.len() == 36),
        "{:?}",
        a.metadata.uid
    );
    assert_ne!(a.metadata.uid, b.metadata.uid);
    assert!(a.metadata.creation_timestamp.is_some());
    assert_eq!(a.metadata.generation, Some(1));
    assert!(rv_of(&b) > rv_of(&a));
    let status = a.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(
        a.spec.as_ref().unwrap().restart_policy.as_deref(),
        Some("Always")
    );
    assert_eq!(pods.get("a").await.unwrap().metadata.uid, a.metadata.uid);

    let list = |f: &str, l: &str| {
        let mut lp = ListParams::default();
        if !f.is_empty() {
            lp = lp.fields(f);
        }
        if !l.is_empty() {
            lp = lp.labels(l);
        }
        lp
    };
    let default_names = |lp: ListParams| {
        let pods = pods.clone();
        async move { names(&pods.list(&lp).await.unwrap().items) }
    };
    assert_eq!(default_names(list("spec.nodeName=n1", "")).await, ["a"]);
    assert_eq!(
        default_names(list("spec.nodeName!=n1", "")).await,
        ["b", "c"]
    );
    assert_eq!(default_names(list("spec.nodeName=", "")).await, ["c"]);
    assert_eq!(
        default_names(list("metadata.name=b,status.phase=Pending", "")).await,
        ["b"]
    );
    assert_eq!(default_names(list("", "app in (web,db)")).await, ["a", "b"]);
    assert_eq!(default_names(list("", "app notin (web)")).await, ["b", "c"]);
    assert_eq!(default_names(list("", "app!=web,tier")).await, ["b"]);
    assert_eq!(default_names(list("", "!app")).await, ["c"]);
    assert_eq!(default_names(list("", "app=web")).await, ["a"]);

    let all: Api<Pod> = Api::all(server.client());
    let everywhere = all.list(&list("spec.nodeName=n1", "")).await.unwrap();
    assert_eq!(names(&everywhere.items), ["a", "d"]);
    assert_eq!(
        everywhere.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    assert_eq!(
        names(
            &all.list(&list("metadata.namespace=other", ""))
                .await
                .unwrap()
                .items
        ),
        ["d"]
    );

    // Raw list: kind PodList, items without their own kind (as kube-apiserver encodes them).
    let (code, raw) = http(&server, "GET", "/api/v1/namespaces/default/pods", "", "").await;
    assert_eq!(code, 200);
    assert_eq!(raw["kind"], "PodList");
    assert_eq!(raw["apiVersion"], "v1");
    assert_eq!(raw["items"].as_array().unwrap().len(), 3);
    assert!(raw["items"][0].get("kind").is_none());

    // Errors are Status objects shaped as kube-apiserver shapes them.
    let (code, st) = http(
        &server,
        "GET",
        "/api/v1/namespaces/default/pods/nope",
        "",
        "",
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(
        st,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"nope\" not found", "reason": "NotFound",
            "details": {"name": "nope", "kind": "pods"}, "code": 404})
    );
    let e = api_status(
        pods.create(&pp, &pod("a", None, json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "pods \"a\" already exists");
    let e = api_status(pods.list(&list("spec.bogus=1", "")).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));

    // generateName.
    let mut g = pod("", None, json!({}));
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let g = pods.create(&pp, &g).await.unwrap();
    let gname = g.metadata.name.unwrap();
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");
}

#[tokio::test]
async fn bodies_that_contradict_the_request_are_rejected() {
    let server = ApiServer::start().await;
    let pods = "/api/v1/namespaces/default/pods";
    let body = |ns: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "i"}]}})
        .to_string()
    };
    let (code, st) = http(
        &server,
        "POST",
        pods,
        "application/json",
        &body("other", "p"),
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (400, Some("BadRequest")),
        "{st}"
    );
    assert_eq!(
        st["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );

    let wrong_kind =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "p"}}).to_string();
    let (code, _) = http(&server, "POST", pods, "application/json", &wrong_kind).await;
    assert_eq!(code, 400);
    let (code, _) = http(&server, "POST", pods, "application/json", "[1, 2]").await;
    assert_eq!(code, 400);
    let (code, _) = http(&server, "POST", pods, "application/json", "{not json").await;
    assert_eq!(code, 400);

    let no_name =
        json!({"kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c"}]}}).to_string();
    let (code, st) = http(&server, "POST", pods, "application/json", &no_name).await;
    assert_eq!(code, 422);
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["details"]["kind"], "Pod");
    assert_eq!(st["details"]["causes"][0]["field"], "metadata.name");
    let bad_name = body("default", "Bad_Name");
    let (code, st) = http(&server, "POST", pods, "application/json", &bad_name).await;
    assert_eq!(
        (code, st["details"]["causes"][0]["reason"].as_str()),
        (422, Some("FieldValueInvalid"))
    );
    let no_containers = json!({"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}).to_string();
    let (code, st) = http(&server, "POST", pods, "application/json", &no_containers).await;
    assert_eq!(
        (code, st["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.containers"))
    );

    let no_image = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
    let (code, st) = http(
        &server,
        "POST",
        pods,
        "application/json",
        &no_image.to_string(),
    )
    .await;
    assert_eq!(
        (code, st["details"]["causes"][0]["field"].as_str()),
        (422, Some("spec.containers[0].image"))
    );
    // Extended resources are not overcommitable.
    let with_resources = |resources: Value| {
        json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": resources}]}})
        .to_string()
    };
    for (resources, field, detail) in [
        (
            json!({"requests": {"example.com/dev": "1"}}),
            "spec.containers[0].resources.limits",
            "Limit must be set for non overcommitable resources",
        ),
        (
            json!({"limits": {"example.com/dev": "2"}, "requests": {"example.com/dev": "1"}}),
            "spec.containers[0].resources.requests[example.com/dev]",
            "must be equal to example.com/dev limit of 2",
        ),
        (
            json!({"limits": {"example.com/dev": "500m"}}),
            "spec.containers[0].resources.limits[example.com/dev]",
            "must be an integer",
        ),
    ] {
        let (code, st) = http(
            &server,
            "POST",
            pods,
            "application/json",
            &with_resources(resources),
        )
        .await;
        let cause = &st["details"]["causes"][0];
        assert_eq!((code, cause["field"].as_str()), (422, Some(field)), "{st}");
        assert!(
            cause["message"].as_str().unwrap_or("").contains(detail),
            "{st}"
        );
    }
    let fine = with_resources(
        json!({"limits": {"example.com/dev": "2"}, "requests": {"example.com/dev": "2"}}),
    );
    let (code, _) = http(&server, "POST", pods, "application/json", &fine).await;
    assert_eq!(code, 201);
    let odd = json!({"metadata": {"name": "p"}, "spec": {"containers": ["c"]}}).to_string();
    let (code, _) = http(&server, "POST", pods, "application/json", &odd).await;
    assert_eq!(code, 422);
    let odd = json!({"metadata": {"name": "p"}, "spec": "c"}).to_string();
    let (code, _) = http(&server, "POST", pods, "application/json", &odd).await;
    assert_eq!(code, 400);
    let (code, created) = http(&server, "POST", pods, "application/json", &body("", "p")).await;
    assert_eq!(code, 201);
    assert_eq!(created["metadata"]["namespace"], "default");
    // Server-side dry runs are refused, not silently written.
    let dry = format!("{pods}?dryRun=All");
    let (code, _) = http(&server, "POST", &dry, "application/json", &body("", "dry")).await;
    assert_eq!(code, 400);
    assert!(server.get("/api/v1/namespaces/default/pods/dry").is_none());
    let (code, st) = http(
        &server,
        "PUT",
        &format!("{pods}/q"),
        "application/json",
        &body("default", "p"),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        st["message"],
        "the name of the object (p) does not match the name on the URL (q)"
    );
    let (code, st) = http(
        &server,
        "PUT",
        &format!("{pods}/missing"),
        "application/json",
        &body("", "missing"),
    )
    .await;
    assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
    let status = format!("{pods}/p/status");
    let bad_status = r#"{"status": "Running"}"#;
    let ct = "application/merge-patch+json";
    let (code, _) = http(&server, "PATCH", &status, ct, bad_status).await;
    assert_eq!(code, 400);
    let (code, _) = http(&server, "GET", "/api/v1/namespaces/default/widgets", "", "").await;
    assert_eq!(code, 404);
    let (code, st) = http(
        &server,
        "POST",
        &format!("{pods}/p"),
        "application/json",
        "{}",
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
}

#[tokio::test]
async fn pagination_with_limit_and_continue() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for n in ["p1", "p2", "p3", "p4", "p5"] {
        pods.create(&PostParams::default(), &pod(n, None, json!({})))
            .await
            .unwrap();
    }
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["p1", "p2"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    // A write between pages does not move the list's resourceVersion.
    pods.create(&PostParams::default(), &pod("p0", None, json!({})))
        .await
        .unwrap();
    let second = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second.items), ["p3", "p4"]);
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let third = pods
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(&third.items), ["p5"]);
    assert!(third.metadata.continue_.as_deref().unwrap_or("").is_empty());

    // After compaction the token is too old: 410 Expired.
    server.compact();
    let e = api_status(
        pods.list(&ListParams::default().limit(2).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn stale_writes_conflict_and_unchanged_writes_are_not_writes() {
    let server = ApiServer::start().await;
    let leases: Api<Lease> = Api::default_namespaced(server.client());
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "node-a"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40}}))
    .unwrap();
    let v1 = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(v1.metadata.namespace.as_deref(), Some("default"));

    let mut renewed = v1.clone();
    renewed.spec.as_mut().unwrap().lease_duration_seconds = Some(41);
    let v2 = leases
        .replace("node-a", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert!(rv_of(&v2) > rv_of(&v1));
    assert_eq!(v2.metadata.generation, Some(2));

    // PUT with the old resourceVersion: 409 Conflict, object unchanged.
    let e = api_status(
        leases
            .replace("node-a", &PostParams::default(), &renewed)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"node-a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(
        leases
            .get("node-a")
            .await
            .unwrap()
            .metadata
            .resource_version,
        v2.metadata.resource_version
    );

    // A PATCH carrying a stale resourceVersion conflicts too.
    let stale = json!({"metadata": {"resourceVersion": v1.metadata.resource_version}, "spec": {"holderIdentity": "x"}});
    let e = api_status(
        leases
            .patch("node-a", &PatchParams::default(), &Patch::Merge(&stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);

    // Writing what is already there changes nothing: same resourceVersion, no event.
    let before = server.resource_version();
    let same = leases
        .replace("node-a", &PostParams::default(), &v2)
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version, v2.metadata.resource_version);
    assert_eq!(server.resource_version(), before);
    // A uid in a PUT body is a precondition.
    let mut other_uid = v2.clone();
    other_uid.metadata.uid = Some("someone-else".into());
    let e = api_status(
        leases
            .replace("node-a", &PostParams::default(), &other_uid)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: someone-else"),
        "{}",
        e.message
    );
    // PUT without a resourceVersion is unconditional.
    let mut unconditional = v2.clone();
    unconditional.metadata.resource_version = None;
    unconditional.spec.as_mut().unwrap().holder_identity = Some("node-b".into());
    let v3 = leases
        .replace("node-a", &PostParams::default(), &unconditional)
        .await
        .unwrap();
    assert_eq!(v3.spec.unwrap().holder_identity.as_deref(), Some("node-b"));
    assert_eq!(v3.metadata.uid, v1.metadata.uid);
}

#[tokio::test]
async fn status_subresource_is_isolated_from_the_main_resource() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", Some("n1"), json!({})))
        .await
        .unwrap();

    // PUT to /status: status changes, the spec and labels in the body are ignored.
    let mut body = created.clone();
    body.status.as_mut().unwrap().phase = Some("Running".into());
    body.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
    body.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let after = pods
        .replace_status("p", &PostParams::default(), &body)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(after.spec.as_ref().unwrap().active_deadline_seconds, None);
    assert_eq!(after.metadata.labels, created.metadata.labels);
    assert_eq!(after.metadata.generation, Some(1));

    // PUT to the pod: the spec changes (generation bumps), the status in the body is ignored.
    let mut body = after.clone();
    body.status.as_mut().unwrap().phase = Some("Failed".into());
    body.spec.as_mut().unwrap().active_deadline_seconds = Some(7);
    let after = pods
        .replace("p", &PostParams::default(), &body)
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(
        after.spec.as_ref().unwrap().active_deadline_seconds,
        Some(7)
    );
    assert_eq!(after.metadata.generation, Some(2));

    // PATCH to /status with a spec change: only the status moves.
    let patch = json!({"spec": {"activeDeadlineSeconds": 9}, "status": {"phase": "Succeeded"}});
    let after = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        after.spec.as_ref().unwrap().active_deadline_seconds,
        Some(7)
    );
    // PATCH to the pod with a status change: the status stays.
    let after = pods
        .patch("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        after.spec.as_ref().unwrap().active_deadline_seconds,
        Some(9)
    );

    // Nodes keep the status given at create (the kubelet registers that way), then isolate it.
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "Hostname", "address": "n1"}]}}))
    .unwrap();
    let n = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(n.status.unwrap().addresses.unwrap().len(), 1);
    let cleared = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": null})),
        )
        .await
        .unwrap();
    assert!(cleared.status.is_some());
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/default/pods/p/status"))
    );
}

#[tokio::test]
async fn merge_strategic_and_json_patches() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(
        &PostParams::default(),
        &pod("p", Some("n1"), json!({"a": "1", "b": "2"})),
    )
    .await
    .unwrap();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": ""},
                              {"name": "d", "ready": false, "restartCount": 0, "image": "i", "imageID": ""}],
        "podIPs": [{"ip": "10.0.0.1"}]}});
    pods.patch_status("p", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    // Strategic: lists merge by their key; $setElementOrder orders; $patch: delete removes.
    let smp = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Initialized"}, {"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": true}, {"name": "d", "$patch": "delete"}],
        "podIPs": [{"ip": "fd00::1"}],
        "hostIPs": [{"ip": "192.168.1.2"}]}});
    let p = pods
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(&smp))
        .await
        .unwrap();
    let raw = serde_json::to_value(&p).unwrap();
    assert_eq!(
        raw["status"]["conditions"],
        json!([{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}])
    );
    let cs = raw["status"]["containerStatuses"].as_array().unwrap();
    assert_eq!(cs.len(), 1);
    assert_eq!(
        (
            cs[0]["name"].as_str(),
            cs[0]["ready"].as_bool(),
            cs[0]["image"].as_str()
        ),
        (Some("c"), Some(true), Some("i"))
    );
    assert_eq!(
        raw["status"]["podIPs"],
        json!([{"ip": "10.0.0.1"}, {"ip": "fd00::1"}])
    );
    assert_eq!(raw["status"]["hostIPs"], json!([{"ip": "192.168.1.2"}]));
    // $patch: replace on a list replaces it; lists without a merge key are replaced.
    let smp = json!({"status": {"podIPs": [{"ip": "10.0.0.9"}, {"$patch": "replace"}]},
        "metadata": {"finalizers": ["x"]}});
    let raw = serde_json::to_value(
        pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(&smp))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(raw["status"]["podIPs"], json!([{"ip": "10.0.0.9"}]));
    // Containers merge by name in the spec too; null removes a label.
    let smp = json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}});
    let p = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(&smp))
        .await
        .unwrap();
    let c = &p.spec.as_ref().unwrap().containers;
    assert_eq!(
        (
            c.len(),
            c[0].image.as_deref(),
            c[0].image_pull_policy.as_deref()
        ),
        (1, Some("busybox:1.37"), Some("IfNotPresent"))
    );
    assert_eq!(
        p.metadata.labels.unwrap(),
        [
            ("b".to_string(), "2".to_string()),
            ("c".to_string(), "3".to_string())
        ]
        .into()
    );

    // Merge patch (RFC 7386): lists are replaced whole.
    let mp = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}});
    let raw = serde_json::to_value(
        pods.patch_status("p", &PatchParams::default(), &Patch::Merge(&mp))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        raw["status"]["conditions"],
        json!([{"type": "PodScheduled", "status": "True"}])
    );

    // JSON patch (RFC 6902), including a failing test operation.
    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/b", "value": "2"},
        {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
        {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 3}]))
    .unwrap();
    let p = pods
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap();
    assert_eq!(p.metadata.annotations.unwrap()["k"], "v");
    assert_eq!(p.spec.unwrap().active_deadline_seconds, Some(3));
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/labels/b", "value": "9"}]))
            .unwrap();
    let e = api_status(
        pods.patch("p", &PatchParams::default(), &Patch::<()>::Json(jp))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    // The kubelet's status patch carries the pod's uid: another uid is refused (immutable).
    let kubelet = json!({"metadata": {"uid": "old-pod-uid"}, "status": {"phase": "Failed"}});
    let e = api_status(
        pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(&kubelet))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("metadata.uid"), "{}", e.message);
    let uid = pods.get("p").await.unwrap().metadata.uid.unwrap();
    let kubelet = json!({"metadata": {"uid": uid}, "status": {"phase": "Failed"}});
    let p = pods
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(&kubelet))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Failed"));

    // Server-side apply is not served; unknown patch types are 415.
    let (code, st) = http(
        &server,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        "application/apply-patch+yaml",
        "{}",
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, _) = http(
        &server,
        "PATCH",
        "/api/v1/namespaces/default/pods/nope",
        "application/merge-patch+json",
        "{}",
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = http(
        &server,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        "application/merge-patch+json",
        "{bad",
    )
    .await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_filters() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let p1 = pods
        .create(&pp, &pod("p1", Some("n1"), json!({})))
        .await
        .unwrap();
    pods.create(&pp, &pod("p2", Some("n2"), json!({})))
        .await
        .unwrap();
    pods.create(&pp, &pod("p3", Some("n1"), json!({})))
        .await
        .unwrap();

    // From p1's resourceVersion: the later writes, in order.
    let rv1 = p1.metadata.resource_version.clone().unwrap();
    let mut all = pods
        .watch(&WatchParams::default(), &rv1)
        .await
        .unwrap()
        .boxed();
    match next_watch(&mut all).await {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("p2")),
        e => panic!("{e:?}"),
    }
    match next_watch(&mut all).await {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("p3")),
        e => panic!("{e:?}"),
    }

    // A node's watch from "0": the current matching pods as ADDED, then only its changes;
    // a pod that starts matching is ADDED, one that stops matching DELETED for this watch.
    let wp = WatchParams::default().fields("spec.nodeName=n1,status.phase!=Succeeded");
    let mut node = pods.watch(&wp, "0").await.unwrap().boxed();
    let mut seen = Vec::new();
    for _ in 0..2 {
        match next_watch(&mut node).await {
            WatchEvent::Added(p) => seen.push(p.metadata.name.unwrap()),
            e => panic!("{e:?}"),
        }
    }
    seen.sort();
    assert_eq!(seen, ["p1", "p3"]);

    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"x": v}}}));
    let pat = PatchParams::default();
    pods.patch("p2", &pat, &label("1")).await.unwrap();
    pods.patch("p3", &pat, &label("2")).await.unwrap();
    match next_watch(&mut node).await {
        WatchEvent::Modified(p) => assert_eq!(p.metadata.name.as_deref(), Some("p3")),
        e => panic!("{e:?}"),
    }
    pods.create(&pp, &pod("p4", None, json!({}))).await.unwrap();
    let bind = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p4"},
        "target": {"kind": "Node", "name": "n1"}})
    .to_string();
    let path = "/api/v1/namespaces/default/pods/p4/binding";
    let (code, _) = http(&server, "POST", path, "application/json", &bind).await;
    assert_eq!(code, 201);
    match next_watch(&mut node).await {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("p4")),
        e => panic!("{e:?}"),
    }
    let done = json!({"status": {"phase": "Succeeded"}});
    let finished = pods
        .patch_status("p3", &pat, &Patch::Merge(&done))
        .await
        .unwrap();
    match next_watch(&mut node).await {
        WatchEvent::Deleted(p) => {
            assert_eq!(p.metadata.name.as_deref(), Some("p3"));
            assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
            assert_eq!(
                p.metadata.resource_version,
                finished.metadata.resource_version
            );
        }
        e => panic!("{e:?}"),
    }
    match next_watch(&mut all).await {
        WatchEvent::Modified(p) => assert_eq!(p.metadata.name.as_deref(), Some("p2")),
        e => panic!("{e:?}"),
    }

    // A watch from a resourceVersion not written yet sees only what comes after it.
    let ahead = (server.resource_version() + 2).to_string();
    let mut later = pods
        .watch(&WatchParams::default(), &ahead)
        .await
        .unwrap()
        .boxed();
    for n in ["q1", "q2", "q3"] {
        pods.create(&pp, &pod(n, None, json!({}))).await.unwrap();
    }
    match next_watch(&mut later).await {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("q3")),
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn binding_schedules_once_and_pod_specs_are_immutable() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("p", None, json!({})))
        .await
        .unwrap();
    let path = "/api/v1/namespaces/default/pods/p/binding";
    let bind = |node: &str| json!({"target": {"kind": "Node", "name": node}}).to_string();
    let (code, st) = http(&server, "POST", path, "application/json", &bind("n1")).await;
    assert_eq!((code, st["status"].as_str()), (201, Some("Success")));
    let bound = pods.get("p").await.unwrap();
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("n1")
    );
    let conds = bound.status.as_ref().unwrap().conditions.clone().unwrap();
    assert_eq!(
        (conds[0].type_.as_str(), conds[0].status.as_str()),
        ("PodScheduled", "True")
    );
    let (code, st) = http(&server, "POST", path, "application/json", &bind("n2")).await;
    assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")));
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("already assigned to node \"n1\""),
        "{st}"
    );

    // Images may change in place; the node (or any other spec field) may not.
    let mut body = bound.clone();
    body.spec.as_mut().unwrap().containers[0].image = Some("busybox:1.37".into());
    let updated = pods
        .replace("p", &PostParams::default(), &body)
        .await
        .unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    let mut body = updated.clone();
    body.spec.as_mut().unwrap().node_name = Some("n2".into());
    let e = api_status(
        pods.replace("p", &PostParams::default(), &body)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .contains("spec: Forbidden: pod updates may not change fields"),
        "{}",
        e.message
    );
    let p = Patch::Merge(json!({"spec": {"restartPolicy": "Never"}}));
    let e = api_status(
        pods.patch("p", &PatchParams::default(), &p)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn the_resize_subresource_changes_cpu_and_memory_only() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut p = serde_json::to_value(pod("r", Some("n1"), json!({}))).unwrap();
    p["spec"]["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "32Mi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "200m", "memory": "64Mi"}});
    let created = pods
        .create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let resources =
        |p: &Pod| serde_json::to_value(&p.spec.as_ref().unwrap().containers[0].resources).unwrap();
    let patch = |v: Value| Patch::Strategic(v);
    let pp = PatchParams::default();

    // The main resource still refuses a resources change.
    let change = json!({"spec": {"containers": [{"name": "c",
        "resources": {"requests": {"cpu": "150m"}}}]}});
    let e = api_status(
        pods.patch("r", &pp, &patch(change.clone()))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.reason.as_str()),
        (422, "Invalid"),
        "{}",
        e.message
    );

    // Through `resize`: the spec changes, the generation moves, the status does not.
    let resized = pods
        .patch_subresource("resize", "r", &pp, &patch(change))
        .await
        .unwrap();
    assert_eq!(resources(&resized)["requests"]["cpu"], "150m");
    assert_eq!(resources(&resized)["requests"]["ephemeral-storage"], "1Gi");
    assert_eq!(
        resized.metadata.generation.unwrap(),
        created.metadata.generation.unwrap() + 1
    );
    assert_eq!(resized.status, created.status);
    let got: Pod = pods.get_subresource("resize", "r").await.unwrap();
    assert_eq!(resources(&got), resources(&resized));

    // Refused: another resource, another field, a QoS class change; nothing is written.
    for (body, says) in [
        (
            json!({"spec": {"containers": [{"name": "c",
                "resources": {"requests": {"ephemeral-storage": "2Gi"}}}]}}),
            "only cpu and memory resources are mutable",
        ),
        (
            json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}),
            "pod resize may not change fields other than cpu and memory resources",
        ),
        (
            json!({"spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": "200m", "memory": "64Mi"}}}]}}),
            "Pod QOS Class may not change as a result of resizing",
        ),
    ] {
        let e = api_status(
            pods.patch_subresource("resize", "r", &pp, &patch(body))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (e.code, e.reason.as_str()),
            (422, "Invalid"),
            "{}",
            e.message
        );
        assert!(e.message.contains(says), "{says}: {}", e.message);
    }
    assert_eq!(
        pods.get("r").await.unwrap().metadata.resource_version,
        resized.metadata.resource_version
    );

    // A stale resourceVersion conflicts, as on the main resource.
    let stale = json!({"metadata": {"resourceVersion": created.metadata.resource_version},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "120m"}}}]}});
    let e = api_status(
        pods.patch_subresource("resize", "r", &pp, &patch(stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409, "{}", e.message);
}

#[tokio::test]
async fn compacted_history_gives_410_and_the_watcher_relists() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "w");
    let others: Api<Pod> = Api::namespaced(server.client(), "elsewhere");
    let first = pods
        .create(&PostParams::default(), &pod("p1", None, json!({})))
        .await
        .unwrap();

    // A raw watch from before the compaction: one ERROR event with a 410 Expired Status.
    others
        .create(&PostParams::default(), &pod("o1", None, json!({})))
        .await
        .unwrap();
    server.compact();
    let old = first.metadata.resource_version.clone().unwrap();
    let mut w = pods
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match next(&mut w).await.unwrap() {
        WatchEvent::Error(s) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            assert!(
                s.message.starts_with("too old resource version"),
                "{}",
                s.message
            );
        }
        e => panic!("{e:?}"),
    }
    assert!(
        tokio::time::timeout(WAIT, w.next())
            .await
            .unwrap()
            .is_none(),
        "the stream ends after the error"
    );

    // kube's watcher (no bookmarks, so its resourceVersion stays at its list): writes elsewhere,
    // a compaction and an outage make its resumed watch expire, and it lists again.
    let cfg = watcher::Config::default().disable_bookmarks();
    let mut events = watcher(pods.clone(), cfg).boxed();
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::Init
    ));
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitApply(_)
    ));
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));
    let list_rv = server.resource_version();
    others
        .create(&PostParams::default(), &pod("o2", None, json!({})))
        .await
        .unwrap();
    server.compact();
    server.stop().await;
    server.restart().await;
    let relisted = async {
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::Init)) => break,
                Ok(Some(e)) => panic!("{e:?}"),
                Ok(None) => panic!("watcher ended"),
                Err(_) => continue, // the outage, retried by the caller's loop here
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), relisted)
        .await
        .expect("the watcher relisted");
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitApply(_)
    ));
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::InitDone
    ));
    let log = server.requests();
    let expired_watch = format!("resourceVersion={list_rv}");
    let i = log
        .iter()
        .position(|r| r.contains("watch=true") && r.contains(&expired_watch))
        .expect("resumed watch");
    assert!(
        log[i..]
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/w/pods?") && !r.contains("watch=")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn bookmarks_arrive_periodically() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    pods.create(&PostParams::default(), &pod("p", None, json!({})))
        .await
        .unwrap();
    let rv = server.resource_version().to_string();
    let mut w = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    for _ in 0..2 {
        match next(&mut w).await.unwrap() {
            WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
            e => panic!("{e:?}"),
        }
    }
    // Without allowWatchBookmarks: none; the stream ends at timeoutSeconds instead.
    let mut w = pods
        .watch(&WatchParams::default().disable_bookmarks().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    assert!(
        tokio::time::timeout(WAIT, w.next())
            .await
            .unwrap()
            .is_none()
    );
}

async fn watcher_sees_init_then_changes(server: &ApiServer, cfg: watcher::Config) {
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut events = watcher(pods.clone(), cfg).boxed();
    assert!(matches!(
        next(&mut events).await.unwrap(),
        watcher::Event::Init
    ));
    let mut listed = Vec::new();
    loop {
        match next(&mut events).await.unwrap() {
            watcher::Event::InitApply(p) => listed.push(p.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            e => panic!("{e:?}"),
        }
    }
    listed.sort();
    assert_eq!(listed, ["a", "b"]);
    pods.create(&PostParams::default(), &pod("c", None, json!({})))
        .await
        .unwrap();
    match next(&mut events).await.unwrap() {
        watcher::Event::Apply(p) => assert_eq!(p.metadata.name.as_deref(), Some("c")),
        e => panic!("{e:?}"),
    }
    pods.delete("c", &DeleteParams::default()).await.unwrap();
    match next(&mut events).await.unwrap() {
        watcher::Event::Delete(p) => assert_eq!(p.metadata.name.as_deref(), Some("c")),
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn kube_watcher_with_streaming_list_and_with_list_then_watch() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for n in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(n, None, json!({})))
            .await
            .unwrap();
    }
    watcher_sees_init_then_changes(&server, watcher::Config::default().streaming_lists()).await;
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.contains("sendInitialEvents=true"))
    );
    watcher_sees_init_then_changes(&server, watcher::Config::default().page_size(1)).await;
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.contains("limit=1") && r.contains("continue="))
    );
}

#[tokio::test]
async fn graceful_pod_deletion() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let created = pods
        .create(&PostParams::default(), &pod("p", Some("n1"), json!({})))
        .await
        .unwrap();
    let mut w = pods
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();

    // Default grace: the pod's terminationGracePeriodSeconds (defaulted to 30).
    let (code, marked) = http(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/pods/p",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 30);
    let ts = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v["metadata"]["deletionTimestamp"].as_str().unwrap())
            .unwrap()
    };
    let first_deadline = ts(&marked);
    let secs = (first_deadline.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    assert!((25..=31).contains(&secs), "deadline {secs}s away");
    assert_eq!(marked["metadata"]["generation"], 2);
    match next_watch(&mut w).await {
        WatchEvent::Modified(p) => assert!(p.metadata.deletion_timestamp.is_some()),
        e => panic!("{e:?}"),
    }
    assert!(pods.get("p").await.is_ok(), "still there while terminating");

    // A longer grace changes nothing; a shorter one moves the deadline earlier.
    let again = pods
        .delete("p", &DeleteParams::default().grace_period(60))
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(again.metadata.deletion_grace_period_seconds, Some(30));
    assert_eq!(
        again.metadata.resource_version.as_deref(),
        marked["metadata"]["resourceVersion"].as_str()
    );
    let shorter = pods
        .delete("p", &DeleteParams::default().grace_period(10))
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(10));
    let moved = ts(&serde_json::to_value(&shorter).unwrap());
    assert_eq!((first_deadline - moved).num_seconds(), 20);

    // Grace 0 with the wrong uid: 409; with the right one: gone, DELETED.
    let wrong = DeleteParams::default()
        .grace_period(0)
        .preconditions(kube::api::Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        });
    let e = api_status(pods.delete("p", &wrong).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: not-the-uid"),
        "{}",
        e.message
    );
    let stale = DeleteParams::default()
        .grace_period(0)
        .preconditions(kube::api::Preconditions {
            uid: None,
            resource_version: created.metadata.resource_version.clone(),
        });
    let e = api_status(pods.delete("p", &stale).await.unwrap_err());
    assert_eq!(e.code, 409);
    assert!(
        e.message
            .contains("Precondition failed: ResourceVersion in precondition"),
        "{}",
        e.message
    );
    let right = DeleteParams::default()
        .grace_period(0)
        .preconditions(kube::api::Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        });
    let gone = pods.delete("p", &right).await.unwrap().left().unwrap();
    assert_eq!(gone.metadata.name.as_deref(), Some("p"));
    assert_eq!(api_status(pods.get("p").await.unwrap_err()).code, 404);
    match next_watch(&mut w).await {
        WatchEvent::Modified(p) => assert_eq!(p.metadata.deletion_grace_period_seconds, Some(10)),
        e => panic!("{e:?}"),
    }
    match next_watch(&mut w).await {
        WatchEvent::Deleted(p) => assert_eq!(p.metadata.name.as_deref(), Some("p")),
        e => panic!("{e:?}"),
    }

    // An unscheduled pod goes at once; so does a lease, answered with a Success Status.
    pods.create(&PostParams::default(), &pod("u", None, json!({})))
        .await
        .unwrap();
    assert!(
        pods.delete("u", &DeleteParams::default())
            .await
            .unwrap()
            .is_left()
    );
    assert_eq!(api_status(pods.get("u").await.unwrap_err()).code, 404);
    let leases: Api<Lease> = Api::default_namespaced(server.client());
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap(),
        )
        .await
        .unwrap();
    let st = leases
        .delete("l", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert!(st.is_success());
    let e = api_status(
        leases
            .delete("l", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn the_kubelets_client_reads_the_written_kubeconfig() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = server.write_kubeconfig(dir.path());
    let client = nodelet::api::client_from_kubeconfig(&path).await.unwrap();
    assert_eq!(client.default_namespace(), "default");
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let got = server.get("/api/v1/nodes/node-a").unwrap();
    assert_eq!(got["kind"], "Node");
    assert!(got["metadata"].get("namespace").is_none());
    assert!(
        server
            .requests()
            .contains(&"POST /api/v1/nodes?".to_string()),
        "{:?}",
        server.requests()
    );
}

#[tokio::test]
async fn stop_and_restart_keep_the_state() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let p = pods
        .create(&PostParams::default(), &pod("p", None, json!({})))
        .await
        .unwrap();
    let rv = server.resource_version().to_string();
    let mut w = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    server.stop().await;
    let addr = server.url().trim_start_matches("http://").to_string();
    let refused = tokio::net::TcpStream::connect(&addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let ended = tokio::time::timeout(WAIT, w.next())
        .await
        .expect("watch stream ended");
    assert!(!matches!(ended, Some(Ok(_))), "{ended:?}");
    assert!(pods.get("p").await.is_err());

    server.restart().await;
    let back = pods.get("p").await.unwrap();
    assert_eq!(back.metadata.uid, p.metadata.uid);
    assert_eq!(back.metadata.resource_version, p.metadata.resource_version);
    let next_p = pods
        .create(&PostParams::default(), &pod("q", None, json!({})))
        .await
        .unwrap();
    assert_eq!(rv_of(&next_p), rv_of(&p) + 1);
    // A watch resumed from before the outage gets what happened since.
    let mut w = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next_watch(&mut w).await {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("q")),
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn events_core_and_from_the_kube_recorder() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let server = ApiServer::start().await;
    let core: Api<CoreEvent> = Api::default_namespaced(server.client());
    let ev: CoreEvent = serde_json::from_value(json!({"metadata": {"name": "p.1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Started", "message": "m", "type": "Normal", "count": 1}))
    .unwrap();
    core.create(&PostParams::default(), &ev).await.unwrap();
    let patched = core
        .patch(
            "p.1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"count": 2})),
        )
        .await
        .unwrap();
    assert_eq!(patched.count, Some(2));
    let by_reason = core
        .list(&ListParams::default().fields("reason=Started,involvedObject.name=p"))
        .await
        .unwrap();
    assert_eq!(by_reason.items.len(), 1);

    let recorder = Recorder::new(
        server.client(),
        Reporter {
            controller: "nodelet".into(),
            instance: Some("node-a".into()),
        },
    );
    let reference = ObjectReference {
        kind: Some("Pod".into()),
        name: Some("p".into()),
        namespace: Some("default".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Pulled".into(),
        note: Some("pulled".into()),
        action: "Pull".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let new_api: Api<NewEvent> = Api::default_namespaced(server.client());
    let items = new_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].reason.as_deref(), Some("Pulled"));
    assert_eq!(items[0].series.as_ref().map(|s| s.count), Some(2));
    let log = server.requests();
    assert!(
        log.iter()
            .any(|r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/default/events"))
    );
    assert!(
        log.iter()
            .any(|r| r.starts_with("PATCH /apis/events.k8s.io/v1/namespaces/default/events/"))
    );
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_create_apply_and_force_delete() {
    if std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        common::skip(
            "kubectl not installed; scripts/setup.sh installs it",
            "kubectl_get_create_apply_and_force_delete",
        );
        return;
    }
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kc = server.write_kubeconfig(dir.path());
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap(),
        )
        .await
        .unwrap();
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: node-a\n  containers:\n  - name: c\n    image: busybox:1.36\n").unwrap();
    let applied = dir.path().join("applied.yaml");
    std::fs::write(&applied, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\n  namespace: other\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n").unwrap();

    let kc2 = kc.clone();
    let run = move |args: Vec<String>| {
        let kc = kc2.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&kc, &args)
        })
    };
    let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();

    let (ok, out, err) = run(argv(&format!(
        "create --validate=false -f {}",
        manifest.display()
    )))
    .await
    .unwrap();
    assert!(ok, "{out}{err}");
    assert!(out.contains("pod/web created"), "{out}");
    let (ok, out, err) = run(argv(&format!(
        "apply --validate=false -f {}",
        applied.display()
    )))
    .await
    .unwrap();
    assert!(ok, "{out}{err}");
    assert!(out.contains("pod/applied created"), "{out}");
    let (ok, out, err) = run(argv("get pods -A -o json")).await.unwrap();
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let mut got: Vec<(String, String)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["namespace"].as_str().unwrap().into(),
                p["metadata"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("default".to_string(), "web".to_string()),
            ("other".into(), "applied".into())
        ]
    );
    assert_eq!(list["items"][0]["kind"], "Pod");
    let (ok, out, err) = run(argv("get nodes")).await.unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("node-a"), "{out}");

    let (ok, out, err) = run(argv("delete pod web --grace-period=0 --force"))
        .await
        .unwrap();
    assert!(ok, "{out}{err}");
    assert!(out.contains("pod \"web\" force deleted"), "{out}");
    assert!(server.get("/api/v1/namespaces/default/pods/web").is_none());
    let (ok, _, err) = run(argv("get pod web")).await.unwrap();
    assert!(!ok);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
}

/// Secrets and ConfigMaps as kube-apiserver takes them: `stringData` merged into base64
/// `data`, `type` defaulted, bad base64, bad keys and duplicate keys refused, immutable ones
/// kept; one object watched by name.
#[tokio::test]
async fn secrets_and_config_maps() {
    let server = ApiServer::start().await;
    let ns = "/api/v1/namespaces/default";
    let (code, s) = http(
        &server,
        "POST",
        &format!("{ns}/secrets"),
        "application/json",
        r#"{"metadata": {"name": "s"}, "stringData": {"password": "s3cr3t"}, "data": {"user": "YWxpY2U="}}"#,
    )
    .await;
    assert_eq!(code, 201, "{s}");
    assert_eq!(
        s["data"],
        json!({"password": "czNjcjN0", "user": "YWxpY2U="})
    );
    assert_eq!(s["type"], "Opaque");
    assert!(s.get("stringData").is_none(), "{s}");
    let (code, e) = http(
        &server,
        "POST",
        &format!("{ns}/secrets"),
        "application/json",
        r#"{"metadata": {"name": "bad"}, "data": {"k": "not base64!"}}"#,
    )
    .await;
    assert_eq!(code, 400, "{e}");
    let (code, e) = http(
        &server,
        "POST",
        &format!("{ns}/configmaps"),
        "application/json",
        r#"{"metadata": {"name": "bad"}, "data": {"a/b": "x"}}"#,
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (422, Some("Invalid")), "{e}");
    let (code, e) = http(
        &server,
        "POST",
        &format!("{ns}/configmaps"),
        "application/json",
        r#"{"metadata": {"name": "dup"}, "data": {"k": "x"}, "binaryData": {"k": "eA=="}}"#,
    )
    .await;
    assert_eq!(code, 422, "{e}");
    let (code, _) = http(
        &server,
        "POST",
        &format!("{ns}/configmaps"),
        "application/json",
        r#"{"metadata": {"name": "frozen"}, "data": {"k": "x"}, "immutable": true}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, e) = http(
        &server,
        "PATCH",
        &format!("{ns}/configmaps/frozen"),
        "application/merge-patch+json",
        r#"{"data": {"k": "y"}}"#,
    )
    .await;
    assert_eq!(code, 422, "{e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("field is immutable when `immutable` is set")),
        "{e}"
    );
    // A change to another object is not seen by a watch of one name.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(server.client(), "default");
    let list = cms
        .list(&ListParams::default().fields("metadata.name=frozen"))
        .await
        .expect("list by name");
    assert_eq!(list.items.len(), 1);
    let wp = WatchParams::default().fields("metadata.name=watched");
    let rv = list.metadata.resource_version.expect("a list rv");
    let mut w = cms.watch(&wp, &rv).await.expect("watch").boxed();
    for name in ["other", "watched"] {
        let (code, _) = http(
            &server,
            "POST",
            &format!("{ns}/configmaps"),
            "application/json",
            &format!(r#"{{"metadata": {{"name": "{name}"}}, "data": {{"k": "v"}}}}"#),
        )
        .await;
        assert_eq!(code, 201);
    }
    match next(&mut w).await {
        Ok(WatchEvent::Added(cm)) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("watched"))
        }
        other => panic!("the watched configmap's ADDED, got {other:?}"),
    }
}

/// TokenRequest as kube-apiserver answers it, and Services' cluster IPs.
#[tokio::test]
async fn token_requests_and_service_cluster_ips() {
    let server = ApiServer::start().await;
    let ns = "/api/v1/namespaces/default";
    let request = |body: Value| body.to_string();
    let token_path = format!("{ns}/serviceaccounts/builder/token");
    let (code, e) = http(&server, "POST", &token_path, "application/json", "{}").await;
    assert_eq!(code, 404, "no such service account: {e}");
    let (code, _) = http(
        &server,
        "POST",
        &format!("{ns}/serviceaccounts"),
        "application/json",
        r#"{"metadata": {"name": "builder"}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, e) = http(
        &server,
        "POST",
        &token_path,
        "application/json",
        &request(json!({"spec": {"expirationSeconds": 60}})),
    )
    .await;
    assert_eq!(code, 422, "under 10 minutes: {e}");
    let mut p = pod("web", Some("n1"), json!({}));
    p.spec.as_mut().expect("spec").service_account_name = Some("builder".into());
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let uid = pods
        .create(&PostParams::default(), &p)
        .await
        .expect("a pod")
        .metadata
        .uid
        .expect("a uid");
    let bound = |uid: &str| {
        request(
            json!({"spec": {"audiences": ["vault"], "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid}}}),
        )
    };
    let (code, e) = http(
        &server,
        "POST",
        &token_path,
        "application/json",
        &bound("x"),
    )
    .await;
    assert_eq!(code, 409, "another pod's UID: {e}");
    server.set_max_token_expiration(1200);
    let (code, t) = http(
        &server,
        "POST",
        &token_path,
        "application/json",
        &bound(&uid),
    )
    .await;
    assert_eq!(code, 201, "{t}");
    assert_eq!(t["kind"], "TokenRequest");
    assert_eq!(t["spec"]["expirationSeconds"], 1200, "capped");
    assert_eq!(t["spec"]["audiences"], json!(["vault"]));
    let token = t["status"]["token"].as_str().expect("a token");
    let issued = server.issued_tokens();
    assert_eq!(issued.len(), 1);
    assert_eq!(issued[0].token, token);
    assert_eq!(issued[0].pod, Some(("web".to_string(), uid.clone())));
    let claims = apiserver::claims(token).expect("a JWT");
    assert_eq!(claims["sub"], "system:serviceaccount:default:builder");
    assert_eq!(claims["aud"], json!(["vault"]));
    // TokenReview knows the token it issued.
    let (code, r) = http(
        &server,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        &request(json!({"spec": {"token": token}})),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    assert_eq!(
        r["status"]["user"]["username"],
        "system:serviceaccount:default:builder"
    );
    // Another service account's pod cannot be bound.
    let (code, _) = http(
        &server,
        "POST",
        &format!("{ns}/serviceaccounts"),
        "application/json",
        r#"{"metadata": {"name": "other"}}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, e) = http(
        &server,
        "POST",
        &format!("{ns}/serviceaccounts/other/token"),
        "application/json",
        &bound(&uid),
    )
    .await;
    assert_eq!(code, 400, "{e}");

    // Services: a cluster IP allocated, a taken one refused, headless kept.
    let svc = |name: &str, ip: Option<&str>| {
        let mut spec = json!({"ports": [{"port": 80}]});
        if let Some(ip) = ip {
            spec["clusterIP"] = json!(ip);
        }
        request(json!({"metadata": {"name": name}, "spec": spec}))
    };
    let (code, a) = http(
        &server,
        "POST",
        &format!("{ns}/services"),
        "application/json",
        &svc("a", None),
    )
    .await;
    assert_eq!(code, 201, "{a}");
    let ip = a["spec"]["clusterIP"].as_str().expect("an IP").to_string();
    assert!(ip.starts_with("10.96."), "{ip}");
    assert_eq!(a["spec"]["type"], "ClusterIP");
    assert_eq!(a["spec"]["ports"][0]["protocol"], "TCP");
    let (code, e) = http(
        &server,
        "POST",
        &format!("{ns}/services"),
        "application/json",
        &svc("b", Some(&ip)),
    )
    .await;
    assert_eq!(code, 422, "{e}");
    let (code, h) = http(
        &server,
        "POST",
        &format!("{ns}/services"),
        "application/json",
        &svc("h", Some("None")),
    )
    .await;
    assert_eq!((code, h["spec"]["clusterIP"].as_str()), (201, Some("None")));
}
