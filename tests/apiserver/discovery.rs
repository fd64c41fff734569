//! The discovery documents: `/version`, `/api`, `/apis`, and each group version's resources
//! with their subresources.

use std::net::SocketAddr;

use serde_json::{Value, json};

use super::store::RESOURCES;

/// The discovery documents kubectl and kube clients read.
pub fn discovery(path: &str, addr: SocketAddr) -> Option<Value> {
    let group_doc = |group: &str| {
        json!({"name": group, "versions": [{"groupVersion": format!("{group}/v1"), "version": "v1"}],
            "preferredVersion": {"groupVersion": format!("{group}/v1"), "version": "v1"}})
    };
    let mut groups: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    let path = path.trim_end_matches('/');
    match path {
        "/version" => Some(json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "2024-12-11T00:00:00Z",
            "goVersion": "go1.23.4", "compiler": "gc", "platform": "linux/amd64"})),
        "/api" => Some(json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}]})),
        "/apis" => Some(json!({"kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups.iter().map(|g| group_doc(g)).collect::<Vec<_>>()})),
        "/api/v1" => Some(resource_list("")),
        _ => {
            let rest = path.strip_prefix("/apis/")?;
            match rest.split_once('/') {
                None if groups.contains(&rest) => {
                    let mut doc = group_doc(rest);
                    doc["kind"] = json!("APIGroup");
                    doc["apiVersion"] = json!("v1");
                    Some(doc)
                }
                Some((g, "v1")) if groups.contains(&g) => Some(resource_list(g)),
                _ => None,
            }
        }
    }
}

fn resource_list(group: &str) -> Value {
    let verbs = json!([
        "create", "delete", "get", "list", "patch", "update", "watch"
    ]);
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group) {
        resources.push(json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
            "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs, "shortNames": r.short_names}));
        if r.kind == "Pod" {
            resources.push(
                json!({"name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"]}),
            );
        }
        if r.kind == "ServiceAccount" {
            resources.push(
                json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true,
                "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
                "verbs": ["create"]}),
            );
        }
        if r.kind == "CertificateSigningRequest" {
            resources.push(
                json!({"name": "certificatesigningrequests/approval", "singularName": "",
                "namespaced": false, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.has_status {
            resources.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
    }
    let gv = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}
