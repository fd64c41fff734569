//! The test API server's HTTPS mode, authentication, authorization and CertificateSigningRequests,
//! and its CSR approver and signer (`tests/apiserver/{tls,auth,csr,signer}.rs`), held to what
//! kube-apiserver (the x509 and bootstrap token authenticators, `forbiddenMessage`, the CSR
//! registry's strategies and `pkg/apis/certificates/validation`) and kube-controller-manager's
//! `csrsigning` controller do. Raw HTTP(S) requests with each kind of credential, kube clients
//! from the kubeconfigs the server writes, CSRs made with rcgen and certificates read with
//! x509-parser. No containers, no root.

mod apiserver;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServer, CsrPolicy};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Liveness guard for everything awaited; failing here means it never happened.
const WAIT: Duration = Duration::from_secs(15);
const TOKEN_ID: &str = "abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";
const TOKEN: &str = "abcdef.0123456789abcdef";
const BOOTSTRAP_USER: &str = "system:bootstrap:abcdef";
const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// The credentials a request carries.
#[derive(Clone, Copy, Default)]
struct Creds<'a> {
    token: Option<&'a str>,
    cert: Option<&'a (String, String)>,
}

const ANONYMOUS: Creds<'static> = Creds {
    token: None,
    cert: None,
};

fn bearer(token: &str) -> Creds<'_> {
    Creds {
        token: Some(token),
        cert: None,
    }
}

fn cert(c: &(String, String)) -> Creds<'_> {
    Creds {
        token: None,
        cert: Some(c),
    }
}

/// A client certificate and key (PEMs) for the cluster's admin, signed by the cluster CA.
fn admin(server: &ApiServer) -> (String, String) {
    server.issue_client_cert("admin", &["system:masters"], Duration::from_secs(3600))
}

/// A TLS client trusting the cluster CA, with `cert` as its client certificate if given.
fn tls_config(server: &ApiServer, cert: Option<&(String, String)>) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(server.ca_pem().as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match cert {
        Some((c, k)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(c.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, request: &str) -> Vec<u8> {
    s.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // The server may close without TLS's close_notify after `Connection: close`.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    raw
}

/// One HTTP/1.1 request over a fresh connection (TLS in HTTPS mode): status code and JSON body
/// (`Null` when the body is not one JSON document, as a watch's stream is not).
async fn call_with(
    server: &ApiServer,
    creds: Creds<'_>,
    method: &str,
    path: &str,
    ctype: &str,
    body: &str,
) -> (u16, Value) {
    let url = server.url();
    let (tls, addr) = match url.strip_prefix("https://") {
        Some(a) => (true, a.to_string()),
        None => (false, url.trim_start_matches("http://").to_string()),
    };
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(t) = creds.token {
        request += &format!("Authorization: Bearer {t}\r\n");
    }
    if !body.is_empty() {
        request += &format!("Content-Type: {ctype}\r\n");
    }
    request += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    let exchanged = async {
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if tls {
            let connector =
                tokio_rustls::TlsConnector::from(Arc::new(tls_config(server, creds.cert)));
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
            exchange(&mut s, &request).await
        } else {
            let mut s = tcp;
            exchange(&mut s, &request).await
        }
    };
    let raw = tokio::time::timeout(WAIT, exchanged)
        .await
        .expect("an answer in time");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn call(
    server: &ApiServer,
    creds: Creds<'_>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    call_with(server, creds, method, path, "application/json", &body).await
}

/// kube-apiserver's answer to a request no authenticator accepts.
fn unauthorized() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
}

/// A new key and a PEM CERTIFICATE REQUEST for `cn` in `org` (if any) with `sans` (IP
/// addresses or DNS names).
fn request(cn: &str, org: Option<&str>, sans: &[&str]) -> (String, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName((*s).try_into().unwrap()),
        })
        .collect();
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (pem, key)
}

/// A CertificateSigningRequest object for the PEM `pem`.
fn csr(name: &str, pem: &str, signer: &str, usages: &[&str]) -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": STANDARD.encode(pem), "signerName": signer, "usages": usages}})
}

/// A CSR as upstream's kubelet makes it for its client certificate, and its key.
fn kubelet_client_csr(name: &str, node: &str) -> (Value, KeyPair) {
    let (pem, key) = request(&format!("system:node:{node}"), Some("system:nodes"), &[]);
    let obj = csr(
        name,
        &pem,
        KUBELET_CLIENT,
        &["digital signature", "client auth"],
    );
    (obj, key)
}

async fn create(server: &ApiServer, creds: Creds<'_>, obj: &Value) -> Value {
    let (code, created) = call(server, creds, "POST", CSRS, Some(obj)).await;
    assert_eq!(code, 201, "{created}");
    created
}

fn stored(server: &ApiServer, name: &str) -> Value {
    server
        .get(&format!("{CSRS}/{name}"))
        .unwrap_or_else(|| panic!("CSR {name} is stored"))
}

fn condition<'a>(csr: &'a Value, t: &str) -> Option<&'a Value> {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
}

fn condition_types(csr: &Value) -> Vec<String> {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| c["type"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The issued certificate's PEM, if any.
fn issued(csr: &Value) -> Option<String> {
    let b64 = csr.pointer("/status/certificate")?.as_str()?;
    Some(String::from_utf8(STANDARD.decode(b64).unwrap()).unwrap())
}

/// Polls `f` until it gives a value (every 20 ms, for at most [`WAIT`]).
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until_signed(server: &ApiServer, name: &str) -> String {
    until(&format!("CSR {name}'s certificate"), || {
        issued(&stored(server, name))
    })
    .await
}

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// The single cause of a 422 Status: (field, reason, message).
fn only_cause(st: &Value) -> (String, String, String) {
    let causes = st["details"]["causes"].as_array().expect("causes");
    assert_eq!(causes.len(), 1, "{st}");
    let s = |k: &str| causes[0][k].as_str().unwrap_or("").to_string();
    (s("field"), s("reason"), s("message"))
}

/// Go's `%#v` of a `[]byte`, as field errors print an invalid `spec.request`.
fn go_bytes(b: &[u8]) -> String {
    let items: Vec<String> = b.iter().map(|x| format!("0x{x:x}")).collect();
    format!("[]byte{{{}}}", items.join(", "))
}

/// Creates the Secret `kube-system/bootstrap-token-<id>` (as the admin) with the bootstrap
/// token's usual data changed by `changes` (a null removes a key) and of type `type_`.
async fn token_secret(server: &ApiServer, id: &str, type_: &str, changes: Value) {
    let mut data = json!({"token-id": id, "token-secret": TOKEN_SECRET,
        "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true"});
    for (k, v) in changes.as_object().unwrap() {
        match v {
            Value::Null => data.as_object_mut().unwrap().remove(k),
            v => data.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": type_, "stringData": data});
    let path = "/api/v1/namespaces/kube-system/secrets";
    let (code, body) = call(server, cert(&admin(server)), "POST", path, Some(&secret)).await;
    assert_eq!(code, 201, "{body}");
}

/// A CA of its own (not the cluster's) and a client certificate from it (PEMs).
fn foreign_client_cert(cn: &str, org: &str) -> (String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "kubernetes");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let c = params.signed_by(&key, &issuer).unwrap();
    (c.pem(), key.serialize_pem())
}

/// A kube client from a kubeconfig the server wrote.
async fn client_from(path: &std::path::Path) -> kube::Client {
    nodelet::api::install_crypto_provider();
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn https_answers_a_request_without_credentials_401_unauthorized() {
    let server = ApiServer::start_tls().await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    for path in [PODS, "/version", "/api", CSRS] {
        let (code, body) = call(&server, ANONYMOUS, "GET", path, None).await;
        assert_eq!((code, &body), (401, &unauthorized()), "GET {path}");
    }
    // Not even a CSR may be created anonymously; nothing is stored.
    let (obj, _) = kubelet_client_csr("anonymous", "n1");
    let (code, body) = call(&server, ANONYMOUS, "POST", CSRS, Some(&obj)).await;
    assert_eq!((code, body), (401, unauthorized()));
    assert!(server.csrs().is_empty());
    // A bearer token nobody issued is no better; no user is recorded for either.
    let (code, body) = call(&server, bearer("not-a-token"), "GET", PODS, None).await;
    assert_eq!((code, body), (401, unauthorized()));
    let refused: Vec<_> = server
        .answered()
        .into_iter()
        .filter(|a| a.code == 401)
        .collect();
    assert_eq!(refused.len(), 6, "{refused:?}");
    assert!(refused.iter().all(|a| a.user.is_empty()), "{refused:?}");
    // The cluster CA's admin certificate is accepted.
    let (code, list) = call(&server, cert(&admin(&server)), "GET", PODS, None).await;
    assert_eq!((code, list["kind"].as_str()), (200, Some("PodList")));
    assert_eq!(server.answered().last().unwrap().user, "admin");
}

#[tokio::test]
async fn bootstrap_tokens_that_the_authenticator_refuses_are_401() {
    let server = ApiServer::start_tls().await;
    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let past = (chrono::Utc::now() - chrono::Duration::minutes(1)).to_rfc3339();
    let token_type = "bootstrap.kubernetes.io/token";
    token_secret(&server, "good01", token_type, json!({})).await;
    token_secret(&server, "later1", token_type, json!({"expiration": future})).await;
    token_secret(&server, "expird", token_type, json!({"expiration": past})).await;
    token_secret(
        &server,
        "unprse",
        token_type,
        json!({"expiration": "tomorrow"}),
    )
    .await;
    let no_usage = json!({"usage-bootstrap-authentication": null});
    token_secret(&server, "nousag", token_type, no_usage).await;
    let usage_false = json!({"usage-bootstrap-authentication": "false"});
    token_secret(&server, "usagef", token_type, usage_false).await;
    token_secret(&server, "opaque", "Opaque", json!({})).await;
    token_secret(&server, "mism01", token_type, json!({"token-id": "other1"})).await;
    // Extra groups must be `system:bootstrappers:*`: a token naming another group is refused
    // whole, not authenticated without it.
    let masters = json!({"auth-extra-groups": "system:bootstrappers:ok,system:masters"});
    token_secret(&server, "master", token_type, masters).await;

    let tok = |id: &str| format!("{id}.{TOKEN_SECRET}");
    // Accepted: authenticated, then refused pods by the authorizer (403, not 401).
    for id in ["good01", "later1"] {
        let (code, st) = call(&server, bearer(&tok(id)), "GET", PODS, None).await;
        assert_eq!(code, 403, "{id}: {st}");
        let user = format!("User \"system:bootstrap:{id}\"");
        assert!(st["message"].as_str().unwrap().contains(&user), "{st}");
    }
    let refused = [
        "good01.fedcba9876543210".to_string(), // wrong secret
        tok("nosuch"),                         // no Secret
        tok("expird"),                         // expired
        tok("unprse"),                         // an expiration that does not parse
        tok("nousag"),                         // not for authentication
        tok("usagef"),
        tok("opaque"),                    // not a bootstrap token Secret
        tok("mism01"),                    // its token-id is another
        tok("master"),                    // an extra group outside system:bootstrappers:
        "good01.0123456789abcdeF".into(), // not [a-z0-9]
        "good01.0123456789abcde".into(),  // too short
        "good01".into(),
    ];
    for token in &refused {
        let (code, body) = call(&server, bearer(token), "GET", PODS, None).await;
        assert_eq!((code, body), (401, unauthorized()), "token {token}");
    }
}

#[tokio::test]
async fn a_client_certificate_must_chain_to_the_cluster_ca() {
    let server = ApiServer::start_tls().await;
    server.add_bootstrap_token(TOKEN_ID, TOKEN_SECRET);
    // Another CA's certificate, however privileged its subject, authenticates no one: the
    // handshake succeeds (the certificate is only requested) and the request is 401.
    let foreign = foreign_client_cert("admin", "system:masters");
    let (code, body) = call(&server, cert(&foreign), "GET", PODS, None).await;
    assert_eq!((code, body), (401, unauthorized()));
    // The authenticators are a union: with the foreign certificate, a bearer token is tried.
    let both = Creds {
        token: Some(TOKEN),
        cert: Some(&foreign),
    };
    let (code, st) = call(&server, both, "GET", PODS, None).await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(server.answered().last().unwrap().user, BOOTSTRAP_USER);
    // A certificate of the cluster CA comes first: the token is not looked at.
    let ours = admin(&server);
    let both = Creds {
        token: Some(TOKEN),
        cert: Some(&ours),
    };
    assert_eq!(call(&server, both, "GET", PODS, None).await.0, 200);
    assert_eq!(server.answered().last().unwrap().user, "admin");
    // A cluster CA certificate without a common name names no user.
    let nameless = server.issue_client_cert("", &["system:masters"], Duration::from_secs(600));
    let (code, body) = call(&server, cert(&nameless), "GET", PODS, None).await;
    assert_eq!((code, body), (401, unauthorized()));
    // A node's kubeconfig (the CA and a system:node certificate) works with a kube client.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.write_node_kubeconfig(dir.path(), "node-1");
    let pods: Api<Pod> = Api::default_namespaced(client_from(&kubeconfig).await);
    pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(server.answered().last().unwrap().user, "system:node:node-1");
}

#[tokio::test]
async fn a_bootstrap_token_user_gets_kube_apiserver_s_403s() {
    let server = ApiServer::start_tls().await;
    server.add_bootstrap_token(TOKEN_ID, TOKEN_SECRET);
    let me = bearer(TOKEN);
    let (code, st) = call(&server, me, "GET", PODS, None).await;
    assert_eq!(code, 403);
    assert_eq!(
        st,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods is forbidden: User \"system:bootstrap:abcdef\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"",
            "reason": "Forbidden", "details": {"kind": "pods"}, "code": 403})
    );
    let (code, st) = call(&server, me, "GET", "/api/v1/nodes/node-1", None).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "nodes \"node-1\" is forbidden: User \"system:bootstrap:abcdef\" cannot get resource \"nodes\" in API group \"\" at the cluster scope"
    );
    assert_eq!(st["details"], json!({"name": "node-1", "kind": "nodes"}));
    let (code, st) = call(&server, me, "GET", "/metrics", None).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "forbidden: User \"system:bootstrap:abcdef\" cannot get path \"/metrics\""
    );
    // Discovery is open to everyone authenticated (system:discovery).
    assert_eq!(call(&server, me, "GET", "/apis", None).await.0, 200);
    assert_eq!(call(&server, me, "GET", "/api/v1", None).await.0, 200);
}

#[tokio::test]
async fn a_bootstrapper_creates_csrs_and_reads_only_its_own() {
    let server = ApiServer::start_tls().await;
    server.add_bootstrap_token(TOKEN_ID, TOKEN_SECRET);
    let me = bearer(TOKEN);
    let (own, _) = kubelet_client_csr("own", "node-1");
    create(&server, me, &own).await;
    let (theirs, _) = kubelet_client_csr("theirs", "node-2");
    create(&server, cert(&admin(&server)), &theirs).await;

    let (code, got) = call(&server, me, "GET", &format!("{CSRS}/own"), None).await;
    assert_eq!(
        (code, got["spec"]["username"].as_str()),
        (200, Some(BOOTSTRAP_USER))
    );
    let (code, st) = call(&server, me, "GET", &format!("{CSRS}/theirs"), None).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "certificatesigningrequests.certificates.k8s.io \"theirs\" is forbidden: User \"system:bootstrap:abcdef\" cannot get resource \"certificatesigningrequests\" in API group \"certificates.k8s.io\" at the cluster scope"
    );
    assert_eq!(
        st["details"],
        json!({"name": "theirs", "group": "certificates.k8s.io",
            "kind": "certificatesigningrequests"})
    );
    // A list or watch of its own names it with a field selector; a list of all is refused.
    let named = format!("{CSRS}?fieldSelector=metadata.name%3Down");
    let (code, list) = call(&server, me, "GET", &named, None).await;
    assert_eq!(code, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let watch = format!("{named}&watch=true&timeoutSeconds=1");
    assert_eq!(call(&server, me, "GET", &watch, None).await.0, 200);
    let theirs_named = format!("{CSRS}?fieldSelector=metadata.name%3Dtheirs");
    assert_eq!(call(&server, me, "GET", &theirs_named, None).await.0, 403);
    let (code, st) = call(&server, me, "GET", CSRS, None).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "certificatesigningrequests.certificates.k8s.io is forbidden: User \"system:bootstrap:abcdef\" cannot list resource \"certificatesigningrequests\" in API group \"certificates.k8s.io\" at the cluster scope"
    );
    // It may not approve, update or delete even its own.
    let mut approved = stored(&server, "own");
    approved["status"]["conditions"] = json!([{"type": "Approved", "status": "True"}]);
    let approval = format!("{CSRS}/own/approval");
    let (code, st) = call(&server, me, "PUT", &approval, Some(&approved)).await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "certificatesigningrequests.certificates.k8s.io \"own\" is forbidden: User \"system:bootstrap:abcdef\" cannot update resource \"certificatesigningrequests/approval\" in API group \"certificates.k8s.io\" at the cluster scope"
    );
    assert_eq!(
        call(&server, me, "PUT", &format!("{CSRS}/own"), Some(&approved))
            .await
            .0,
        403
    );
    assert_eq!(
        call(&server, me, "DELETE", &format!("{CSRS}/own"), None)
            .await
            .0,
        403
    );
    assert!(condition(&stored(&server, "own"), "Approved").is_none());

    // The bootstrap kubeconfig the server writes is a working kube client for this user.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = server.write_bootstrap_kubeconfig(dir.path(), TOKEN);
    let csrs: Api<CertificateSigningRequest> = Api::all(client_from(&kubeconfig).await);
    let (obj, _) = kubelet_client_csr("typed", "node-1");
    let typed: CertificateSigningRequest = serde_json::from_value(obj).unwrap();
    let made = csrs.create(&PostParams::default(), &typed).await.unwrap();
    assert_eq!(made.spec.username.as_deref(), Some(BOOTSTRAP_USER));
    assert!(csrs.get("typed").await.is_ok());
    let e = csrs.get("theirs").await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(s) if s.code == 403));
}

#[tokio::test]
async fn create_replaces_the_requester_identity_and_clears_the_status() {
    let server = ApiServer::start_tls().await;
    let extra = "system:bootstrappers:kubeadm:default-node-token,system:bootstrappers:worker";
    let token_type = "bootstrap.kubernetes.io/token";
    token_secret(
        &server,
        TOKEN_ID,
        token_type,
        json!({"auth-extra-groups": extra}),
    )
    .await;
    let (mut lying, _) = kubelet_client_csr("lying", "node-1");
    lying["spec"]["username"] = json!("system:admin");
    lying["spec"]["groups"] = json!(["system:masters"]);
    lying["spec"]["uid"] = json!("0000-not-mine");
    lying["spec"]["extra"] = json!({"scopes": ["everything"]});
    let ca_pem = server.ca_pem();
    lying["status"] = json!({"certificate": STANDARD.encode(&ca_pem),
        "conditions": [{"type": "Approved", "status": "True", "reason": "Self"}]});
    let created = create(&server, bearer(TOKEN), &lying).await;
    assert_eq!(created, stored(&server, "lying"));
    let spec = &created["spec"];
    assert_eq!(spec["username"], BOOTSTRAP_USER);
    // The bootstrap authenticator's groups (sorted) and system:authenticated.
    assert_eq!(
        spec["groups"],
        json!([
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token",
            "system:bootstrappers:worker",
            "system:authenticated"
        ])
    );
    assert!(spec.get("uid").is_none(), "{spec}");
    assert!(spec.get("extra").is_none(), "{spec}");
    assert!(condition_types(&created).is_empty(), "{created}");
    assert!(issued(&created).is_none(), "{created}");
    // The admin's identity comes from its certificate: CN and Os.
    let (mut by_admin, _) = kubelet_client_csr("by-admin", "node-1");
    by_admin["spec"]["username"] = json!("someone-else");
    let created = create(&server, cert(&admin(&server)), &by_admin).await;
    assert_eq!(created["spec"]["username"], "admin");
    assert_eq!(
        created["spec"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
}

#[tokio::test]
async fn invalid_csrs_are_422_naming_the_field() {
    let server = ApiServer::start().await;
    let (pem, _) = request("system:node:n1", Some("system:nodes"), &[]);
    let usages = ["digital signature", "client auth"];
    let try_create = |obj: Value| {
        let server = &server;
        async move { call(server, ANONYMOUS, "POST", CSRS, Some(&obj)).await }
    };
    let invalid = |st: &Value| {
        assert_eq!(st["kind"], "Status", "{st}");
        assert_eq!(st["reason"], "Invalid", "{st}");
        assert_eq!(st["details"]["group"], "certificates.k8s.io", "{st}");
        assert_eq!(st["details"]["kind"], "CertificateSigningRequest", "{st}");
        only_cause(st)
    };

    // spec.request: not PEM, a PEM block of another type, a signature that does not verify.
    let (code, st) = try_create(csr("not-pem", "hello", KUBELET_CLIENT, &usages)).await;
    assert_eq!(code, 422);
    let detail = format!(
        "Invalid value: {}: PEM block type must be CERTIFICATE REQUEST",
        go_bytes(b"hello")
    );
    assert_eq!(
        invalid(&st),
        (
            "spec.request".into(),
            "FieldValueInvalid".into(),
            detail.clone()
        )
    );
    assert_eq!(
        st["message"],
        format!(
            "CertificateSigningRequest.certificates.k8s.io \"not-pem\" is invalid: spec.request: {detail}"
        )
    );
    let ca = server.ca_pem();
    let (code, st) = try_create(csr("a-certificate", &ca, KUBELET_CLIENT, &usages)).await;
    assert_eq!(code, 422);
    let (field, _, message) = invalid(&st);
    assert_eq!(field, "spec.request");
    assert!(
        message.ends_with(": PEM block type must be CERTIFICATE REQUEST"),
        "{message}"
    );
    // The subject changed after signing: still a request, its signature no longer matches.
    let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec();
    let at = der
        .windows(14)
        .position(|w| w == b"system:node:n1")
        .unwrap();
    der[at + 13] = b'2';
    let forged = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        STANDARD.encode(&der)
    );
    let (code, st) = try_create(csr("forged", &forged, KUBELET_CLIENT, &usages)).await;
    assert_eq!(code, 422);
    let (field, reason, message) = invalid(&st);
    assert_eq!(
        (field.as_str(), reason.as_str()),
        ("spec.request", "FieldValueInvalid")
    );
    assert!(
        message.ends_with(": x509: ECDSA verification failure"),
        "{message}"
    );

    // spec.signerName: required, a domain and a path, the domain's labels, two of them.
    let mut no_signer = csr("no-signer", &pem, KUBELET_CLIENT, &usages);
    no_signer["spec"]
        .as_object_mut()
        .unwrap()
        .remove("signerName");
    let (code, st) = try_create(no_signer).await;
    assert_eq!(code, 422);
    assert_eq!(
        invalid(&st),
        (
            "spec.signerName".into(),
            "FieldValueRequired".into(),
            "Required value".into()
        )
    );
    let form = "must be a fully qualified domain and path of the form 'example.com/signer-name'";
    let label = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    let subdomain = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    let cases = [
        ("example.com", format!("Invalid value: \"example.com\": {form}")),
        ("example.com/a/b", format!("Invalid value: \"example.com/a/b\": {form}")),
        (
            "kubernetes/signer",
            "Invalid value: \"kubernetes\": should be a domain with at least two segments separated by dots".to_string(),
        ),
        (
            "Example.com/signer",
            format!("Invalid value: \"Example.com\": validating label \"Example\": {label}"),
        ),
        (
            "example.com/Bad_Path",
            format!("Invalid value: \"Bad_Path\": validating label \"Bad_Path\": {subdomain}"),
        ),
        (
            "kubernetes.io/legacy-unknown",
            "Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version".to_string(),
        ),
    ];
    for (i, (signer, detail)) in cases.into_iter().enumerate() {
        let (code, st) = try_create(csr(&format!("signer-{i}"), &pem, signer, &usages)).await;
        assert_eq!(code, 422, "{signer}: {st}");
        assert_eq!(
            invalid(&st),
            ("spec.signerName".into(), "FieldValueInvalid".into(), detail),
            "{signer}"
        );
    }

    // spec.usages: known ones, no repeats, at least one.
    let (code, st) = try_create(csr(
        "unknown-usage",
        &pem,
        KUBELET_CLIENT,
        &["digital signature", "client auth", "root access"],
    ))
    .await;
    assert_eq!(code, 422);
    let (field, reason, message) = invalid(&st);
    assert_eq!(
        (field.as_str(), reason.as_str()),
        ("spec.usages[2]", "FieldValueNotSupported")
    );
    assert!(
        message.starts_with(
            "Unsupported value: \"root access\": supported values: \"any\", \"cert sign\", \"client auth\","
        ) && message.ends_with("\"signing\", \"timestamping\""),
        "{message}"
    );
    let (code, st) = try_create(csr(
        "repeated-usage",
        &pem,
        KUBELET_CLIENT,
        &["client auth", "digital signature", "client auth"],
    ))
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        invalid(&st),
        (
            "spec.usages[2]".into(),
            "FieldValueDuplicate".into(),
            "Duplicate value: \"client auth\"".into()
        )
    );
    let (code, st) = try_create(csr("no-usages", &pem, KUBELET_CLIENT, &[])).await;
    assert_eq!(code, 422);
    assert_eq!(
        invalid(&st),
        (
            "spec.usages".into(),
            "FieldValueRequired".into(),
            "Required value".into()
        )
    );

    // spec.expirationSeconds: at least 10 minutes.
    let mut short = csr("short", &pem, KUBELET_CLIENT, &usages);
    short["spec"]["expirationSeconds"] = json!(599);
    let (code, st) = try_create(short.clone()).await;
    assert_eq!(code, 422);
    assert_eq!(
        invalid(&st),
        (
            "spec.expirationSeconds".into(),
            "FieldValueInvalid".into(),
            "Invalid value: 599: may not specify a duration less than 600 seconds (10 minutes)"
                .into()
        )
    );

    // Every error at once, in validation's order, aggregated in the message.
    let mut many = csr("many", "hello", "", &["bogus"]);
    many["spec"]["expirationSeconds"] = json!(10);
    let (code, st) = try_create(many).await;
    assert_eq!(code, 422);
    let fields: Vec<&str> = st["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.request",
            "spec.usages[0]",
            "spec.signerName",
            "spec.expirationSeconds"
        ]
    );
    let message = st["message"].as_str().unwrap();
    assert!(
        message.starts_with("CertificateSigningRequest.certificates.k8s.io \"many\" is invalid: [spec.request: Invalid value: []byte{")
            && message.ends_with(", spec.signerName: Required value, spec.expirationSeconds: Invalid value: 10: may not specify a duration less than 600 seconds (10 minutes)]"),
        "{message}"
    );
    assert!(server.csrs().is_empty(), "nothing invalid was stored");

    // Valid: 600 seconds; a name as upstream's kubelet makes them (base64url: upper case and
    // '_'), since kube takes any CSR name that is a path segment.
    short["spec"]["expirationSeconds"] = json!(600);
    let (code, st) = try_create(short).await;
    assert_eq!(code, 201, "{st}");
    let kubelet_name = "node-csr-Xw3_aB-9kLq";
    let (code, st) = try_create(csr(kubelet_name, &pem, KUBELET_CLIENT, &usages)).await;
    assert_eq!(code, 201, "{st}");
    assert_eq!(
        stored(&server, kubelet_name)["metadata"]["name"],
        kubelet_name
    );
    let (code, st) = try_create(csr("a%b", &pem, KUBELET_CLIENT, &usages)).await;
    assert_eq!(code, 422);
    assert_eq!(
        invalid(&st),
        (
            "metadata.name".into(),
            "FieldValueInvalid".into(),
            "Invalid value: \"a%b\": may not contain '%'".into()
        )
    );
    assert_eq!(server.csrs().len(), 2);
}

#[tokio::test]
async fn updates_of_the_object_change_neither_its_spec_nor_its_status() {
    let server = ApiServer::start().await;
    let (obj, _) = kubelet_client_csr("fixed", "node-1");
    let created = create(&server, ANONYMOUS, &obj).await;
    let path = format!("{CSRS}/fixed");
    let mut edited = created.clone();
    edited["metadata"]["labels"] = json!({"edited": "yes"});
    edited["spec"]["usages"] = json!(["digital signature", "client auth", "server auth"]);
    edited["spec"]["signerName"] = json!("example.com/other");
    edited["spec"]["username"] = json!("system:admin");
    edited["status"] = json!({"certificate": STANDARD.encode(server.ca_pem()),
        "conditions": [{"type": "Approved", "status": "True", "reason": "Sneaky"}]});
    let (code, put) = call(&server, ANONYMOUS, "PUT", &path, Some(&edited)).await;
    assert_eq!(code, 200, "{put}");
    assert_eq!(put["metadata"]["labels"], json!({"edited": "yes"}));
    assert_eq!(put["spec"], created["spec"]);
    assert!(
        condition_types(&put).is_empty() && issued(&put).is_none(),
        "{put}"
    );
    let patch = json!({"spec": {"signerName": "example.com/other"},
        "status": {"conditions": [{"type": "Denied", "status": "True"}]}});
    let (code, patched) = call_with(
        &server,
        ANONYMOUS,
        "PATCH",
        &path,
        "application/merge-patch+json",
        &patch.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["spec"], created["spec"]);
    assert!(condition_types(&patched).is_empty(), "{patched}");
    // Nothing but the label was written.
    assert_eq!(
        patched["metadata"]["resourceVersion"],
        put["metadata"]["resourceVersion"]
    );
    assert_eq!(stored(&server, "fixed"), put);
}

#[tokio::test]
async fn approval_adds_approved_or_denied_never_both_and_never_removes_them() {
    let server = ApiServer::start().await;
    // A signer nobody runs here: approval alone is observed.
    let (pem, _) = request("someone", None, &[]);
    create(
        &server,
        ANONYMOUS,
        &csr("one", &pem, "example.com/test", &["client auth"]),
    )
    .await;
    let approval = format!("{CSRS}/one/approval");
    let mut body = stored(&server, "one");
    body["status"]["conditions"] =
        json!([{"type": "Approved", "status": "True", "reason": "Looked", "message": "fine"}]);
    // A certificate sent to approval is not taken.
    body["status"]["certificate"] = json!(STANDARD.encode(server.ca_pem()));
    let (code, approved) = call(&server, ANONYMOUS, "PUT", &approval, Some(&body)).await;
    assert_eq!(code, 200, "{approved}");
    let cond = condition(&approved, "Approved").unwrap();
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("True"), Some("Looked"))
    );
    assert!(cond["lastUpdateTime"].is_string() && cond["lastTransitionTime"].is_string());
    assert!(issued(&approved).is_none(), "{approved}");

    let put = |conds: Value| {
        let mut b = approved.clone();
        b["status"]["conditions"] = conds;
        let server = &server;
        let approval = approval.clone();
        async move { call(server, ANONYMOUS, "PUT", &approval, Some(&b)).await }
    };
    let kept = approved["status"]["conditions"][0].clone();
    let (code, st) = put(json!([kept.clone(), {"type": "Denied", "status": "True"}])).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.conditions[1].type".into(),
            "FieldValueInvalid".into(),
            "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
                .into()
        )
    );
    let (code, st) = put(json!([])).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.conditions".into(),
            "FieldValueForbidden".into(),
            "Forbidden: updates may not remove a condition of type \"Approved\"".into()
        )
    );
    let (code, st) = put(json!([kept.clone(), kept.clone()])).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.conditions[1].type".into(),
            "FieldValueDuplicate".into(),
            "Duplicate value: \"Approved\"".into()
        )
    );
    let (code, st) = put(json!([{"type": "Approved", "status": "False"}])).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.conditions[0].status".into(),
            "FieldValueNotSupported".into(),
            "Unsupported value: \"False\": supported values: \"True\"".into()
        )
    );
    assert_eq!(stored(&server, "one"), approved);

    // Denied first: Approved can no longer be added.
    create(
        &server,
        ANONYMOUS,
        &csr("two", &pem, "example.com/test", &["client auth"]),
    )
    .await;
    let approval = format!("{CSRS}/two/approval");
    let mut body = stored(&server, "two");
    body["status"]["conditions"] = json!([{"type": "Denied", "status": "True", "reason": "No"}]);
    let (code, denied) = call(&server, ANONYMOUS, "PUT", &approval, Some(&body)).await;
    assert_eq!(code, 200, "{denied}");
    let mut body = denied.clone();
    body["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Approved", "status": "True"}));
    let (code, st) = call(&server, ANONYMOUS, "PUT", &approval, Some(&body)).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st).2,
        "Invalid value: \"Approved\": Approved and Denied conditions are mutually exclusive"
    );
    assert_eq!(condition_types(&stored(&server, "two")), ["Denied"]);
}

#[tokio::test]
async fn status_sets_the_certificate_once_and_cannot_approve() {
    let server = ApiServer::start().await;
    let (pem, _) = request("someone", None, &[]);
    create(
        &server,
        ANONYMOUS,
        &csr("req", &pem, "example.com/test", &["client auth"]),
    )
    .await;
    let status = format!("{CSRS}/req/status");
    let put = |obj: Value| {
        let server = &server;
        let status = status.clone();
        async move { call(server, ANONYMOUS, "PUT", &status, Some(&obj)).await }
    };
    let with = |conds: Value, cert: Option<&str>| {
        let mut b = stored(&server, "req");
        b["status"]["conditions"] = conds;
        if let Some(c) = cert {
            b["status"]["certificate"] = json!(STANDARD.encode(c));
        }
        b
    };

    // /status cannot approve or deny.
    for t in ["Approved", "Denied"] {
        let (code, st) = put(with(json!([{"type": t, "status": "True"}]), None)).await;
        assert_eq!(code, 422, "{st}");
        assert_eq!(
            only_cause(&st),
            (
                "status.conditions".into(),
                "FieldValueForbidden".into(),
                format!("Forbidden: updates may not add a condition of type \"{t}\"")
            )
        );
    }
    server.approve_csr("req");
    let approved = stored(&server, "req");
    let cond = condition(&approved, "Approved").unwrap().clone();
    assert_eq!(cond["reason"], "TestApprove");
    // An edited Approved condition sent to /status is kept as it was; removing it is refused.
    let mut edited = cond.clone();
    edited["message"] = json!("rewritten");
    let (code, got) = put(with(json!([edited]), None)).await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(condition(&got, "Approved").unwrap(), &cond);
    let (code, st) = put(with(json!([]), None)).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st).2,
        "Forbidden: updates may not remove a condition of type \"Approved\""
    );

    // The certificate: PEM CERTIFICATE blocks only.
    let (code, st) = put(with(json!([cond.clone()]), Some("not a certificate"))).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.certificate".into(),
            "FieldValueInvalid".into(),
            "Invalid value: \"<certificate data>\": must contain at least one CERTIFICATE PEM block"
                .into()
        )
    );
    let (code, st) = put(with(json!([cond.clone()]), Some(&pem))).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st).2,
        "Invalid value: \"<certificate data>\": only CERTIFICATE PEM blocks are allowed, found \"CERTIFICATE REQUEST\""
    );
    let (first, _) = server.issue_client_cert("someone", &[], Duration::from_secs(600));
    let (code, got) = put(with(json!([cond.clone()]), Some(&first))).await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(issued(&got).as_deref(), Some(first.as_str()));
    // The same certificate with a Failed condition added: fine. Another certificate: never.
    let failed = json!({"type": "Failed", "status": "True", "reason": "Later"});
    let (code, got) = put(with(json!([cond.clone(), failed]), None)).await;
    assert_eq!(code, 200, "{got}");
    assert!(condition(&got, "Failed").unwrap()["lastUpdateTime"].is_string());
    let (second, _) = server.issue_client_cert("someone", &[], Duration::from_secs(600));
    let (code, st) = put(with(got["status"]["conditions"].clone(), Some(&second))).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st),
        (
            "status.certificate".into(),
            "FieldValueForbidden".into(),
            "Forbidden: updates may not modify existing certificate content".into()
        )
    );
    let (code, st) = put(with(json!([cond.clone()]), None)).await;
    assert_eq!(code, 422);
    assert_eq!(
        only_cause(&st).2,
        "Forbidden: updates may not remove a condition of type \"Failed\""
    );
    // Nor through the object or approval: the certificate is silently kept.
    let mut body = stored(&server, "req");
    body["status"]["certificate"] = json!(STANDARD.encode(&second));
    for path in [format!("{CSRS}/req"), format!("{CSRS}/req/approval")] {
        let (code, got) = call(&server, ANONYMOUS, "PUT", &path, Some(&body)).await;
        assert_eq!(code, 200, "{path}: {got}");
        assert_eq!(issued(&got).as_deref(), Some(first.as_str()), "{path}");
    }
}

/// The certificate of `pem`, checked to be signed by the cluster CA and to be for `key`.
fn check_issued<'a>(server: &ApiServer, der: &'a [u8], key: &KeyPair) -> X509Certificate<'a> {
    let (_, c) = X509Certificate::from_der(der).unwrap();
    let ca_der = der_of(&server.ca_pem());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    c.verify_signature(Some(ca.public_key()))
        .expect("signed by the cluster CA");
    assert_eq!(c.issuer(), ca.subject());
    assert_eq!(
        c.public_key().subject_public_key.data.as_ref(),
        key.public_key_raw()
    );
    let bc = c.basic_constraints().unwrap().expect("basic constraints");
    assert!(!bc.value.ca);
    c
}

fn validity(c: &X509Certificate) -> (i64, i64) {
    (
        c.validity().not_before.timestamp(),
        c.validity().not_after.timestamp(),
    )
}

#[tokio::test]
async fn approve_signs_a_kubelet_client_csr_with_the_lifetime_and_backdate_set() {
    let server = ApiServer::start_tls().await;
    server.add_bootstrap_token(TOKEN_ID, TOKEN_SECRET);
    server.set_certificate_lifetime(Duration::from_secs(2 * 3600));
    server.set_certificate_backdate(Duration::from_secs(90));
    server.set_csr_policy(CsrPolicy::Approve);
    let before = chrono::Utc::now().timestamp();
    let (obj, key) = kubelet_client_csr("node-a-client", "node-a");
    create(&server, bearer(TOKEN), &obj).await;
    let pem = until_signed(&server, "node-a-client").await;
    let after = chrono::Utc::now().timestamp();

    let signed = stored(&server, "node-a-client");
    assert_eq!(condition_types(&signed), ["Approved"]);
    let approved = condition(&signed, "Approved").unwrap();
    assert_eq!(
        (approved["status"].as_str(), approved["reason"].as_str()),
        (Some("True"), Some("AutoApproved"))
    );
    let der = der_of(&pem);
    let c = check_issued(&server, &der, &key);
    assert_eq!(
        c.subject().to_string(),
        "O=system:nodes, CN=system:node:node-a"
    );
    let eku = c.extended_key_usage().unwrap().expect("extended key usage");
    assert!(eku.value.client_auth && !eku.value.server_auth);
    let ku = c.key_usage().unwrap().expect("key usage");
    assert!(ku.value.digital_signature() && !ku.value.key_encipherment());
    // Under 8 hours NotAfter is not backdated: the validity is lifetime + backdate.
    let (not_before, not_after) = validity(&c);
    assert_eq!(not_after - not_before, 2 * 3600 + 90);
    assert!(
        (before - 90 - 1..=after - 90 + 1).contains(&not_before),
        "{before} {not_before} {after}"
    );

    // The certificate and its key are the node's credentials.
    let creds = (pem, key.serialize_pem());
    let (code, _) = call(&server, cert(&creds), "GET", PODS, None).await;
    assert_eq!(code, 200);
    assert_eq!(server.answered().last().unwrap().user, "system:node:node-a");
}

#[tokio::test]
async fn the_signer_honours_expiration_seconds_and_backdates_long_lifetimes() {
    let server = ApiServer::start().await;
    server.set_csr_policy(CsrPolicy::Approve);
    server.set_certificate_lifetime(Duration::from_secs(2 * 3600));
    server.set_certificate_backdate(Duration::from_secs(60));
    // A shorter expirationSeconds wins; a longer one is cut to the lifetime.
    let (mut short, short_key) = kubelet_client_csr("short", "node-a");
    short["spec"]["expirationSeconds"] = json!(900);
    create(&server, ANONYMOUS, &short).await;
    let (mut long, long_key) = kubelet_client_csr("long", "node-a");
    long["spec"]["expirationSeconds"] = json!(86400);
    create(&server, ANONYMOUS, &long).await;
    let der = der_of(&until_signed(&server, "short").await);
    let (nb, na) = validity(&check_issued(&server, &der, &short_key));
    assert_eq!(na - nb, 900 + 60);
    let der = der_of(&until_signed(&server, "long").await);
    let (nb, na) = validity(&check_issued(&server, &der, &long_key));
    assert_eq!(na - nb, 2 * 3600 + 60);
    // From 8 hours up NotAfter is backdated too: the validity is the lifetime.
    server.set_certificate_lifetime(Duration::from_secs(10 * 3600));
    let (obj, key) = kubelet_client_csr("ten-hours", "node-a");
    create(&server, ANONYMOUS, &obj).await;
    let der = der_of(&until_signed(&server, "ten-hours").await);
    let (nb, na) = validity(&check_issued(&server, &der, &key));
    assert_eq!(na - nb, 10 * 3600);
}

#[tokio::test]
async fn manual_leaves_a_csr_pending_until_approve_csr() {
    let server = ApiServer::start().await;
    let (pending, key) = kubelet_client_csr("pending", "node-a");
    create(&server, ANONYMOUS, &pending).await;
    // Another request approved and signed after it: the controller has run with the first
    // one there, and left it alone.
    let (other, _) = kubelet_client_csr("other", "node-b");
    create(&server, ANONYMOUS, &other).await;
    server.approve_csr("other");
    until_signed(&server, "other").await;
    let still = stored(&server, "pending");
    assert!(condition_types(&still).is_empty(), "{still}");
    assert!(issued(&still).is_none());

    server.approve_csr("pending");
    let pem = until_signed(&server, "pending").await;
    let signed = stored(&server, "pending");
    let approved = condition(&signed, "Approved").unwrap();
    assert_eq!(approved["reason"], "TestApprove");
    assert_eq!(approved["message"], "This CSR was approved by the test.");
    check_issued(&server, &der_of(&pem), &key);
}

#[tokio::test]
async fn deny_puts_a_denied_condition_and_no_certificate() {
    let server = ApiServer::start().await;
    server.set_csr_policy(CsrPolicy::Deny {
        reason: "NotInInventory".into(),
        message: "this node is not in the site inventory".into(),
    });
    let (obj, _) = kubelet_client_csr("refused", "node-a");
    create(&server, ANONYMOUS, &obj).await;
    let denied = until("the Denied condition", || {
        let c = stored(&server, "refused");
        condition(&c, "Denied").is_some().then_some(c)
    })
    .await;
    let cond = condition(&denied, "Denied").unwrap();
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "NotInInventory");
    assert_eq!(cond["message"], "this node is not in the site inventory");
    assert!(cond["lastUpdateTime"].is_string());
    // Approving from now on decides only pending requests: a later one is signed, the denied
    // one stays as it is.
    server.set_csr_policy(CsrPolicy::Approve);
    let (later, _) = kubelet_client_csr("later", "node-b");
    create(&server, ANONYMOUS, &later).await;
    until_signed(&server, "later").await;
    let after = stored(&server, "refused");
    assert_eq!(condition_types(&after), ["Denied"]);
    assert!(issued(&after).is_none());
    // deny_csr on a pending request, as `kubectl certificate deny` would.
    server.set_csr_policy(CsrPolicy::Manual);
    let (obj, _) = kubelet_client_csr("by-hand", "node-c");
    create(&server, ANONYMOUS, &obj).await;
    server.deny_csr("by-hand", "Nope", "not today");
    let c = stored(&server, "by-hand");
    let cond = condition(&c, "Denied").unwrap();
    assert_eq!(
        (cond["reason"].as_str(), cond["message"].as_str()),
        (Some("Nope"), Some("not today"))
    );
}

/// A request the kubelet signers refuse: (name, CN, O, SANs, signer, usages, why).
type Refused = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static [&'static str],
    &'static str,
    &'static [&'static str],
    &'static str,
);

#[tokio::test]
async fn the_signer_marks_failed_a_csr_its_rules_refuse() {
    let server = ApiServer::start().await;
    server.set_csr_policy(CsrPolicy::Approve);
    // For a signer kube-controller-manager does not run: approved, never signed nor failed.
    let (pem, _) = request("custom", None, &[]);
    create(
        &server,
        ANONYMOUS,
        &csr("custom", &pem, "example.com/custom", &["client auth"]),
    )
    .await;
    const CLIENT: &[&str] = &["digital signature", "client auth"];
    const SERVING: &[&str] = &["digital signature", "key encipherment", "server auth"];
    // (name, CN, O, SANs, signer, usages, why the signer refuses it).
    let cases: [Refused; 6] = [
        (
            "wrong-org",
            "system:node:n1",
            Some("system:masters"),
            &[],
            KUBELET_CLIENT,
            CLIENT,
            "subject organization is not system:nodes",
        ),
        (
            "wrong-cn",
            "admin",
            Some("system:nodes"),
            &[],
            KUBELET_CLIENT,
            CLIENT,
            "subject common name does not begin with system:node:",
        ),
        (
            "dns-san",
            "system:node:n1",
            Some("system:nodes"),
            &["n1.example.com"],
            KUBELET_CLIENT,
            CLIENT,
            "DNS subjectAltNames are not allowed",
        ),
        (
            "wrong-usages",
            "system:node:n1",
            Some("system:nodes"),
            &[],
            KUBELET_CLIENT,
            &["digital signature", "client auth", "server auth"],
            "usages did not match [client auth digital signature key encipherment]",
        ),
        (
            "serving-no-san",
            "system:node:n1",
            Some("system:nodes"),
            &[],
            KUBELET_SERVING,
            SERVING,
            "DNS or IP subjectAltName is required",
        ),
        (
            "serving-usages",
            "system:node:n1",
            Some("system:nodes"),
            &["10.0.0.1"],
            KUBELET_SERVING,
            CLIENT,
            "usages did not match [digital signature key encipherment server auth]",
        ),
    ];
    for (name, cn, org, sans, signer, usages, _) in cases {
        let (pem, _) = request(cn, org, sans);
        create(&server, ANONYMOUS, &csr(name, &pem, signer, usages)).await;
    }
    let (pem, serving_key) = request("system:node:n1", Some("system:nodes"), &["10.0.0.1", "n1"]);
    create(
        &server,
        ANONYMOUS,
        &csr("serving", &pem, KUBELET_SERVING, SERVING),
    )
    .await;

    for (name, .., why) in cases {
        let failed = until(&format!("{name} Failed"), || {
            let c = stored(&server, name);
            condition(&c, "Failed").is_some().then_some(c)
        })
        .await;
        assert_eq!(condition_types(&failed), ["Approved", "Failed"], "{name}");
        let cond = condition(&failed, "Failed").unwrap();
        assert_eq!(cond["status"], "True", "{name}");
        assert_eq!(cond["reason"], "SignerValidationFailure", "{name}");
        assert_eq!(cond["message"], *why, "{name}");
        assert!(cond["lastUpdateTime"].is_string(), "{name}");
        assert!(issued(&failed).is_none(), "{name}");
    }
    let der = der_of(&until_signed(&server, "serving").await);
    let c = check_issued(&server, &der, &serving_key);
    let eku = c.extended_key_usage().unwrap().unwrap();
    assert!(eku.value.server_auth && !eku.value.client_auth);
    let san = c.subject_alternative_name().unwrap().unwrap();
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => d.to_string(),
            GeneralName::IPAddress(ip) => format!("{ip:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["[10, 0, 0, 1]", "n1"]);
    let custom = stored(&server, "custom");
    assert_eq!(condition_types(&custom), ["Approved"]);
    assert!(issued(&custom).is_none());
}

#[tokio::test]
async fn plain_http_serves_everyone_as_an_unsecured_admin() {
    let server = ApiServer::start().await;
    assert!(server.url().starts_with("http://127.0.0.1:"));
    let (code, list) = call(&server, ANONYMOUS, "GET", PODS, None).await;
    assert_eq!((code, list["kind"].as_str()), (200, Some("PodList")));
    // No authenticator runs: a token, even a bootstrap one of no Secret, is not looked at.
    assert_eq!(call(&server, bearer(TOKEN), "GET", PODS, None).await.0, 200);
    let (obj, _) = kubelet_client_csr("insecure", "node-a");
    let created = create(&server, bearer(TOKEN), &obj).await;
    // kube-apiserver's old insecure port's identity.
    assert_eq!(created["spec"]["username"], "system:unsecured");
    assert_eq!(
        created["spec"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
    assert!(server.answered().iter().all(|a| a.user.is_empty()));
    // The kube client of this mode works; the CA signs CSRs here too.
    let csrs: Api<CertificateSigningRequest> = Api::all(server.client());
    assert_eq!(
        csrs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    server.approve_csr("insecure");
    let pem = until_signed(&server, "insecure").await;
    let der = der_of(&pem);
    let (_, c) = X509Certificate::from_der(&der).unwrap();
    let ca_der = der_of(&server.ca_pem());
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    c.verify_signature(Some(ca.public_key())).unwrap();
}
