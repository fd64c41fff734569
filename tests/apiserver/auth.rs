//! Who a request is and what it may do, in HTTPS mode, as kube-apiserver decides it.
//!
//! Authentication, in kube-apiserver's order: a client certificate that verifies against the
//! cluster CA (for client authentication, within its validity) with a common name is its CN
//! in the groups of its Os; otherwise a bearer token: a bootstrap token `<id>.<secret>`
//! matching its Secret `kube-system/bootstrap-token-<id>` as the bootstrap authenticator
//! checks it (type, token-id and token-secret, not expired, `usage-bootstrap-authentication`,
//! `auth-extra-groups`) is `system:bootstrap:<id>` in `system:bootstrappers` and its extra
//! groups, and a service account token issued here (or one added with `add_token`) is its
//! user. Everyone authenticated is also in `system:authenticated`; anyone else is answered
//! 401 (anonymous requests are not allowed).
//!
//! Authorization: `system:masters` and `system:nodes` may do everything. Anyone
//! authenticated may read the discovery documents (`system:discovery`). A member of
//! `system:bootstrappers` may create CertificateSigningRequests and get, list or watch one
//! of its own (`spec.username` its name; a list or watch names it with a
//! `metadata.name=<name>` field selector), nothing else. Refusals are 403 with
//! kube-apiserver's message. In plain-HTTP mode no one is asked: every request is
//! kube-apiserver's old insecure port's identity, `system:unsecured` in `system:masters`.

use std::collections::{BTreeSet, HashMap};

use axum::extract::Request;
use axum::http::{Method, Uri, header};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::UnixTime;
use serde_json::json;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::App;
use super::store::{ApiError, Store, find_resource};
use super::tls::PeerCert;

/// An authenticated requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// A plain-HTTP request's identity.
    pub fn unsecured() -> User {
        User {
            name: "system:unsecured".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// The requester of `req`: always [`User::unsecured`] over plain HTTP.
pub fn authenticate(app: &App, req: &Request) -> Result<User, ApiError> {
    let Some(serving) = &app.tls else {
        return Ok(User::unsecured());
    };
    let peer = req
        .extensions()
        .get::<PeerCert>()
        .and_then(|p| p.0.as_ref());
    if let Some(cert) = peer
        && serving
            .verifier
            .verify_client_cert(cert, &[], UnixTime::now())
            .is_ok()
        && let Some(user) = certificate_user(cert)
    {
        return Ok(user);
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(unauthorized());
    };
    if let Some(user) = bootstrap_user(&app.store(), token, chrono::Utc::now()) {
        return Ok(user);
    }
    let reviews = app.reviews.lock().unwrap_or_else(|e| e.into_inner());
    match reviews.tokens.get(token) {
        Some((name, groups)) => {
            let mut groups = groups.clone();
            if !groups.iter().any(|g| g == "system:authenticated") {
                groups.push("system:authenticated".into());
            }
            Ok(User {
                name: name.clone(),
                groups,
            })
        }
        None => Err(unauthorized()),
    }
}

/// A verified client certificate's user: its CN (none without one) in its Os.
fn certificate_user(der: &[u8]) -> Option<User> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())?
        .to_string();
    let mut groups: Vec<String> = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(String::from))
        .collect();
    groups.push("system:authenticated".into());
    Some(User { name, groups })
}

/// kube's `bootstrapapi.BootstrapTokenPattern` parts: 6 and 16 characters of [a-z0-9].
fn token_part(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]`, the extra groups a token may give.
fn bootstrap_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    !rest.is_empty()
        && rest.len() <= 256
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
        && rest
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The bootstrap authenticator (`plugin/pkg/auth/authenticator/token/bootstrap`).
pub fn bootstrap_user(
    store: &Store,
    token: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<User> {
    let (id, secret) = token.split_once('.')?;
    if !token_part(id, 6) || !token_part(secret, 16) {
        return None;
    }
    let res = find_resource("", "v1", "secrets")?;
    let s = store
        .get(res, "kube-system", &format!("bootstrap-token-{id}"))
        .ok()?;
    if s.pointer("/metadata/deletionTimestamp").is_some()
        || s["type"] != "bootstrap.kubernetes.io/token"
    {
        return None;
    }
    let data = |k: &str| {
        s["data"][k]
            .as_str()
            .and_then(|v| STANDARD.decode(v).ok())
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default()
    };
    if data("token-secret") != secret || data("token-id") != id {
        return None;
    }
    let expiration = data("expiration");
    if !expiration.is_empty() {
        // An expiration that does not parse counts as expired.
        let t = chrono::DateTime::parse_from_rfc3339(&expiration).ok()?;
        if t <= now {
            return None;
        }
    }
    if data("usage-bootstrap-authentication") != "true" {
        return None;
    }
    let mut groups = BTreeSet::from(["system:bootstrappers".to_string()]);
    let extra = data("auth-extra-groups");
    if !extra.is_empty() {
        for g in extra.split(',') {
            if !bootstrap_group(g) {
                return None;
            }
            groups.insert(g.to_string());
        }
    }
    let mut groups: Vec<String> = groups.into_iter().collect();
    groups.push("system:authenticated".into());
    Some(User {
        name: format!("system:bootstrap:{id}"),
        groups,
    })
}

/// What a request asks, as kube-apiserver's `RequestInfoFactory` reads it.
#[derive(Debug, Default)]
pub struct RequestInfo {
    pub resource_request: bool,
    pub path: String,
    pub verb: String,
    pub group: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

pub fn request_info(method: &Method, uri: &Uri) -> RequestInfo {
    let path = uri.path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut info = RequestInfo {
        path: path.clone(),
        verb: method.as_str().to_lowercase(),
        ..Default::default()
    };
    let rest = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => {
            info.group = group.to_string();
            rest
        }
        _ => return info,
    };
    info.resource_request = true;
    info.verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
    .to_string();
    let rest = match rest {
        ["namespaces", ns, more @ ..] => {
            info.namespace = ns.to_string();
            if more.is_empty() || more[0] == "status" || more[0] == "finalize" {
                rest
            } else {
                more
            }
        }
        _ => rest,
    };
    info.resource = rest[0].to_string();
    if let Some(name) = rest.get(1) {
        info.name = name.to_string();
    }
    if let Some(sub) = rest.get(2) {
        info.subresource = sub.to_string();
    }
    let query: HashMap<String, String> =
        axum::extract::Query::try_from_uri(uri).map_or_else(|_| HashMap::new(), |q| q.0);
    if info.name.is_empty() && info.verb == "get" {
        let watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
        info.verb = if watch { "watch" } else { "list" }.into();
        let named = query.get("fieldSelector").and_then(|s| {
            s.split(',').find_map(|term| {
                let (f, v) = term.split_once("==").or_else(|| term.split_once('='))?;
                (f.trim() == "metadata.name").then(|| v.trim().to_string())
            })
        });
        if let Some(n) =
            named.filter(|n| !n.is_empty() && !n.contains(['/', '%']) && n != "." && n != "..")
        {
            info.name = n;
        }
    } else if info.verb == "get" && query.get("watch").is_some_and(|v| v == "true" || v == "1") {
        info.verb = "watch".into();
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    info
}

/// The paths `system:discovery` and `system:public-info-viewer` open to everyone
/// authenticated.
fn discovery_path(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    [
        "/api", "/apis", "/healthz", "/livez", "/readyz", "/version", "/openapi",
    ]
    .contains(&path)
        || [
            "/api/",
            "/apis/",
            "/openapi/",
            "/healthz/",
            "/livez/",
            "/readyz/",
        ]
        .iter()
        .any(|p| path.starts_with(p))
}

/// Whether `user` may do what `info` asks; a 403 as kube-apiserver words it when not.
pub fn authorize(store: &Store, user: &User, info: &RequestInfo) -> Result<(), ApiError> {
    if user.in_group("system:masters") || user.in_group("system:nodes") {
        return Ok(());
    }
    if !info.resource_request {
        if info.verb == "get" && discovery_path(&info.path) {
            return Ok(());
        }
        return Err(forbidden(user, info));
    }
    let csrs = info.group == "certificates.k8s.io"
        && info.resource == "certificatesigningrequests"
        && info.subresource.is_empty();
    if csrs && user.in_group("system:bootstrappers") {
        let own = || {
            find_resource("certificates.k8s.io", "v1", "certificatesigningrequests")
                .and_then(|res| store.get(res, "", &info.name).ok())
                .is_some_and(|csr| csr.pointer("/spec/username") == Some(&json!(user.name)))
        };
        match info.verb.as_str() {
            "create" => return Ok(()),
            "get" | "list" | "watch" if !info.name.is_empty() && own() => return Ok(()),
            _ => {}
        }
    }
    Err(forbidden(user, info))
}

/// apimachinery's `NewForbidden` with the authorizer's `forbiddenMessage`.
fn forbidden(user: &User, info: &RequestInfo) -> ApiError {
    if !info.resource_request {
        let reason = format!(
            "User \"{}\" cannot {} path \"{}\"",
            user.name, info.verb, info.path
        );
        let mut e = ApiError::new(403, "Forbidden", format!("forbidden: {reason}"));
        e.details = Some(json!({}));
        return e;
    }
    let mut resource = info.resource.clone();
    if !info.subresource.is_empty() {
        resource = format!("{resource}/{}", info.subresource);
    }
    let scope = if info.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", info.namespace)
    };
    let reason = format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, info.verb, info.group
    );
    let qualified = if info.group.is_empty() {
        info.resource.clone()
    } else {
        format!("{}.{}", info.resource, info.group)
    };
    let message = if info.name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} \"{}\" is forbidden: {reason}", info.name)
    };
    let mut details = json!({"kind": info.resource});
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    if !info.name.is_empty() {
        details["name"] = json!(info.name);
    }
    let mut e = ApiError::new(403, "Forbidden", message);
    e.details = Some(details);
    e
}

/// The identity of a request and whether it may go on: `Ok(user)`, or the user's name (""
/// when unknown) and the error to answer.
pub fn check(app: &App, req: &Request) -> Result<User, (String, ApiError)> {
    let user = authenticate(app, req).map_err(|e| (String::new(), e))?;
    if app.tls.is_some() {
        let info = request_info(req.method(), req.uri());
        authorize(&app.store(), &user, &info).map_err(|e| (user.name.clone(), e))?;
    }
    Ok(user)
}
