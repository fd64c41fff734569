//! TLS bootstrap end to end: the real binary, as the kubelet, against the test API server in
//! HTTPS mode (a cluster CA, client certificates and bootstrap tokens authenticated, CSRs
//! approved and signed as the test says). A node started with only a bootstrap kubeconfig
//! and a KubeletConfiguration gets its client certificate through a CSR with upstream's
//! subject, signer and usages, writes it (0600) and a kubeconfig naming it, registers with
//! that identity and runs a pod; a restart uses the certificate it has; a denied CSR is an
//! error naming the reason, and the agent tries again until one is issued.

mod apiserver;
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use apiserver::{ApiServer, CsrPolicy};
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use common::{KillOnDrop, nodelet_bin};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;

const TOKEN_ID: &str = "abcdef";
const TOKEN: &str = "abcdef.0123456789abcdef";

/// The test API server in HTTPS mode, knowing the bootstrap token, its CSRs handled as
/// `policy` says.
async fn api_with_token(policy: CsrPolicy) -> ApiServer {
    let api = ApiServer::start_tls().await;
    api.add_bootstrap_token(TOKEN_ID, "0123456789abcdef");
    api.set_csr_policy(policy);
    api
}

/// A node named `name` with `config`, given only a bootstrap kubeconfig, and where its
/// kubeconfig is to be written; `None` when the test skips.
async fn bootstrap_node(
    api: &ApiServer,
    test: &str,
    name: &'static str,
    config: &'static str,
) -> Option<(ApiNode, std::path::PathBuf)> {
    let setup = Setup {
        name,
        config,
        cri_listen: false,
    };
    let node = ApiNode::prepare(&setup, Backend::Builtin, test, |dir| {
        api.write_bootstrap_kubeconfig(dir, TOKEN)
    })
    .await?;
    let kubeconfig = node.root.with_extension("kubelet.conf");
    Some((node, kubeconfig))
}

fn start(node: &ApiNode, kubeconfig: &Path) -> KillOnDrop {
    start_with(node, kubeconfig, &[])
}

fn start_with(node: &ApiNode, kubeconfig: &Path, extra: &[&str]) -> KillOnDrop {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(node.root.with_extension("log"))
        .expect("the agent's log");
    let mut cmd = Command::new(nodelet_bin());
    cmd.arg(format!("--config={}", node.config.display()))
        .arg(format!(
            "--bootstrap-kubeconfig={}",
            node.kubeconfig.display()
        ))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--root-dir={}", node.root.display()))
        .arg(format!("--hostname-override={}", node.name))
        .arg("--node-ip=127.0.0.1")
        .args(extra);
    KillOnDrop(
        cmd.stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the kubelet"),
    )
}

fn log_of(node: &ApiNode) -> String {
    std::fs::read_to_string(node.root.with_extension("log")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_only_a_bootstrap_kubeconfig_joins_through_a_csr() {
    let test = "a_node_with_only_a_bootstrap_kubeconfig_joins_through_a_csr";
    const NODE: &str = "boot-node";
    let api = api_with_token(CsrPolicy::Approve).await;
    let Some((node, kubeconfig)) = bootstrap_node(&api, test, NODE, "").await else {
        return;
    };
    let agent = start(&node, &kubeconfig);

    let nodes: Api<Node> = Api::all(api.client());
    wait_for("the Node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    // One CSR, from the bootstrap identity, as upstream's kubelet makes it.
    let csrs = api.csrs();
    assert_eq!(csrs.len(), 1, "{csrs:#?}");
    let spec = &csrs[0]["spec"];
    assert_eq!(spec["username"], format!("system:bootstrap:{TOKEN_ID}"));
    assert_eq!(
        spec["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(
        spec["usages"],
        serde_json::json!(["digital signature", "client auth"])
    );
    // The certificate and key in the cert dir (0600) and the kubeconfig naming them.
    let current = node.root.join("pki/kubelet-client-current.pem");
    let target = std::fs::canonicalize(&current).expect("the current certificate");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let pem = std::fs::read_to_string(&target).unwrap();
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = parsed.parse_x509().unwrap();
    assert_eq!(
        cert.subject().to_string(),
        format!("O=system:nodes, CN=system:node:{NODE}")
    );
    let kc = std::fs::read_to_string(&kubeconfig).expect("the kubeconfig written");
    assert!(kc.contains(current.to_str().unwrap()), "{kc}");
    assert!(!kc.contains("0123456789abcdef"), "no token in it: {kc}");
    assert!(
        !log_of(&node).contains("0123456789abcdef"),
        "no token in the log"
    );
    // The node's own requests are made as the node.
    let as_node = api
        .answered()
        .iter()
        .filter(|a| a.user == format!("system:node:{NODE}"))
        .count();
    assert!(as_node > 0, "{:?}", api.answered());

    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "exec sleep 3600")
    );
    pods.create(&PostParams::default(), &node.pod("after-bootstrap", &spec))
        .await
        .expect("create the pod");
    wait_for("the pod Running", 60, async || {
        let p = pods.get("after-bootstrap").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;

    // Restarted, the agent uses the kubeconfig it wrote: no second CSR.
    drop(agent);
    let agent = start(&node, &kubeconfig);
    let before = api.answered().len();
    wait_for("requests after the restart", 30, async || {
        (api.answered().len() > before + 3).then_some(())
    })
    .await;
    assert_eq!(api.csrs().len(), 1);

    // A torn certificate file at start is reported and bootstrapping starts again.
    drop(agent);
    std::fs::write(&target, &pem[..pem.len() / 2]).unwrap();
    let _agent = start(&node, &kubeconfig);
    wait_for("a second CSR", 30, async || {
        (api.csrs().len() == 2).then_some(())
    })
    .await;
    let log = log_of(&node);
    assert!(
        log.contains("TLS bootstrap: its client certificate"),
        "{log}"
    );
    let current = std::fs::canonicalize(&current).expect("a new current certificate");
    assert_ne!(current, target);
    let before = api.answered().len();
    wait_for(
        "the node's requests after bootstrapping again",
        30,
        async || {
            let now = api.answered();
            now[before..]
                .iter()
                .any(|a| a.user == format!("system:node:{NODE}") && a.code < 300)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_csr_is_an_error_naming_the_reason_and_is_tried_again() {
    let test = "a_denied_csr_is_an_error_naming_the_reason_and_is_tried_again";
    const NODE: &str = "denied-node";
    let api = api_with_token(CsrPolicy::Deny {
        reason: "NotInInventory".into(),
        message: "this node is not in the site inventory".into(),
    })
    .await;
    let Some((node, kubeconfig)) = bootstrap_node(&api, test, NODE, "").await else {
        return;
    };
    let _agent = start(&node, &kubeconfig);
    wait_for("the denial in the log", 30, async || {
        log_of(&node)
            .contains("was denied: NotInInventory: this node is not in the site inventory")
            .then_some(())
    })
    .await;
    assert!(!kubeconfig.exists(), "nothing written for a denied CSR");
    let nodes: Api<Node> = Api::all(api.client());
    assert!(nodes.get_opt(NODE).await.unwrap().is_none());

    // Approved from now on: the next attempt (after its back-off) gets a certificate.
    api.set_csr_policy(CsrPolicy::Approve);
    wait_for("the Node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    assert!(api.csrs().len() >= 2);
}

/// With `rotateCertificates` and short-lived certificates, the client certificate is renewed
/// (twice here) while the node keeps working: its Lease stays fresh and a pod created after
/// the first certificate expired is run and reported. Certificates live 20 s (NotBefore
/// backdated 5 s): each is renewed 12-17 s after it was issued.
#[tokio::test(flavor = "multi_thread")]
async fn the_client_certificate_rotates_while_the_node_keeps_working() {
    let test = "the_client_certificate_rotates_while_the_node_keeps_working";
    const NODE: &str = "rotating-node";
    let api = api_with_token(CsrPolicy::Approve).await;
    api.set_certificate_lifetime(std::time::Duration::from_secs(20));
    api.set_certificate_backdate(std::time::Duration::from_secs(5));
    let Some((node, kubeconfig)) = bootstrap_node(
        &api,
        test,
        NODE,
        "rotateCertificates: true\nnodeLeaseDurationSeconds: 10\n",
    )
    .await
    else {
        return;
    };
    let _agent = start(&node, &kubeconfig);
    let nodes: Api<Node> = Api::all(api.client());
    wait_for("the Node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    let first_issued = std::time::Instant::now();
    wait_for("two rotations", 90, async || {
        (api.csrs().len() >= 3).then_some(())
    })
    .await;
    // The rotations were asked for by the node itself, not with the bootstrap token.
    let users: Vec<String> = api
        .csrs()
        .iter()
        .map(|c| c["spec"]["username"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        users[0],
        format!("system:bootstrap:{TOKEN_ID}"),
        "{users:?}"
    );
    assert!(
        users[1..]
            .iter()
            .all(|u| u == &format!("system:node:{NODE}")),
        "{users:?}"
    );
    // Past the first certificate's end, the node still works with the one it has now.
    let past = std::time::Duration::from_secs(22).saturating_sub(first_issued.elapsed());
    tokio::time::sleep(past).await;
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "exec sleep 3600")
    );
    pods.create(&PostParams::default(), &node.pod("after-rotation", &spec))
        .await
        .expect("create the pod");
    wait_for("the pod Running", 60, async || {
        let p = pods.get("after-rotation").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(api.client(), "kube-node-lease");
    let lease = leases.get(NODE).await.expect("the node's Lease");
    let renewed = lease
        .spec
        .and_then(|s| s.renew_time)
        .expect("a renew time")
        .0;
    let age = chrono::Utc::now().timestamp() - renewed.as_second();
    assert!(age < 10, "the Lease was renewed {age} s ago");
    let log = log_of(&node);
    assert!(
        log.matches("certificate rotation: new client certificate in use")
            .count()
            >= 2,
        "{log}"
    );
}

/// The kubelet's serving certificate from the server's CA (for the API server's client).
fn ca_der(api: &ApiServer) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(api.ca_pem().as_bytes()).expect("the CA")
}

/// A TLS handshake with the kubelet at `port`, trusting only the cluster CA: the served
/// certificate (DER) or why the handshake failed.
async fn served_certificate(api: &ApiServer, port: u16) -> Result<Vec<u8>, String> {
    nodelet::api::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_der(api)).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no certificate".to_string())
}

/// The name of the first CSR with `signer` the server holds.
fn csr_named(api: &ApiServer, signer: &str) -> Option<String> {
    api.csrs()
        .iter()
        .find(|c| c["spec"]["signerName"] == signer)
        .and_then(|c| c["metadata"]["name"].as_str().map(str::to_string))
}

/// `serverTLSBootstrap`: the kubelet serves nothing until its serving CSR is approved, then a
/// certificate from the cluster CA naming the node's IP, and `kubectl logs` through the API
/// server works. With `--cloud-provider=external`, once the cloud controller sets the Node's
/// addresses, a new serving certificate names them.
#[tokio::test(flavor = "multi_thread")]
async fn the_serving_certificate_comes_from_a_csr() {
    let test = "the_serving_certificate_comes_from_a_csr";
    const NODE: &str = "serving-node";
    // Every CSR waits for the test.
    let api = api_with_token(CsrPolicy::Manual).await;
    let keys = tempfile::tempdir().unwrap();
    let ca_file = keys.path().join("ca.crt");
    std::fs::write(&ca_file, api.ca_pem()).unwrap();
    let config: &'static str = Box::leak(
        format!(
            "serverTLSBootstrap: true\nauthentication:\n  x509: {{clientCAFile: {}}}\n\
             authorization: {{mode: AlwaysAllow}}\n",
            ca_file.display()
        )
        .into_boxed_str(),
    );
    let Some((node, kubeconfig)) = bootstrap_node(&api, test, NODE, config).await else {
        return;
    };
    let _agent = start_with(&node, &kubeconfig, &["--cloud-provider=external"]);
    let client_csr = wait_for("the client CSR", 30, async || {
        csr_named(&api, "kubernetes.io/kube-apiserver-client-kubelet")
    })
    .await;
    api.approve_csr(&client_csr);
    let nodes: Api<Node> = Api::all(api.client());
    let registered = wait_for("the Node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    let port = registered
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .expect("the kubelet's port");
    let port = u16::try_from(port).unwrap();
    let serving_csr = wait_for("the serving CSR", 30, async || {
        csr_named(&api, "kubernetes.io/kubelet-serving")
    })
    .await;
    // Pending: no certificate to serve, so no handshake.
    let refused = served_certificate(&api, port).await;
    assert!(refused.is_err(), "{refused:?}");

    let (cert, key) = api.issue_client_cert(
        "apiserver-kubelet-client",
        &[],
        std::time::Duration::from_secs(3600),
    );
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    api.set_kubelet_client(chain, key, vec![ca_der(&api)]);
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "echo served; exec sleep 3600")
    );
    pods.create(&PostParams::default(), &node.pod("chatty", &spec))
        .await
        .expect("create the pod");
    wait_for("the pod Running", 60, async || {
        let p = pods.get("chatty").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let params = kube::api::LogParams::default();
    assert!(
        pods.logs("chatty", &params).await.is_err(),
        "no serving certificate yet"
    );

    api.approve_csr(&serving_csr);
    let der = wait_for("a served certificate", 30, async || {
        served_certificate(&api, port).await.ok()
    })
    .await;
    let (_, served) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans = served
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|e| format!("{:?}", e.value.general_names))
        .unwrap_or_default();
    assert!(
        sans.contains("127.0.0.1") || sans.contains("[127, 0, 0, 1]"),
        "{sans}"
    );
    assert!(sans.contains(NODE), "{sans}");
    let logs = wait_for("logs through the API server", 30, async || {
        pods.logs("chatty", &params).await.ok()
    })
    .await;
    assert_eq!(logs, "served\n");
    // Kept in the cert dir, 0600.
    let current = std::fs::canonicalize(node.root.join("pki/kubelet-server-current.pem")).unwrap();
    assert_eq!(
        std::fs::metadata(&current).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The cloud controller sets the Node's addresses: a new serving CSR names them, and once
    // it is approved the new certificate is served.
    let cloud = serde_json::json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "127.0.0.1"},
        {"type": "ExternalIP", "address": "127.0.0.2"},
        {"type": "Hostname", "address": NODE},
        {"type": "ExternalDNS", "address": "serving-node.example.com"},
    ]}});
    nodes
        .patch_status(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cloud),
        )
        .await
        .expect("the cloud controller's addresses");
    let second = wait_for("a second serving CSR", 30, async || {
        let csrs = api.csrs();
        let serving: Vec<_> = csrs
            .iter()
            .filter(|c| c["spec"]["signerName"] == "kubernetes.io/kubelet-serving")
            .collect();
        (serving.len() == 2)
            .then(|| serving[1]["metadata"]["name"].as_str().map(str::to_string))
            .flatten()
    })
    .await;
    api.approve_csr(&second);
    let sans = wait_for("the new certificate served", 30, async || {
        let der = served_certificate(&api, port).await.ok()?;
        let (_, served) = x509_parser::parse_x509_certificate(&der).ok()?;
        let sans = served
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|e| format!("{:?}", e.value.general_names))
            .unwrap_or_default();
        sans.contains("serving-node.example.com").then_some(sans)
    })
    .await;
    assert!(
        sans.contains("[127, 0, 0, 2]") || sans.contains("127.0.0.2"),
        "{sans}"
    );
}
