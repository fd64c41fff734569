//! The kubelet's HTTPS server end to end: the real binary, the test API server (which answers
//! TokenReview and SubjectAccessReview), real containers on the built-in runtime, and a real
//! HTTPS client verifying the kubelet's self-signed serving certificate.
//!
//! - The Node advertises the port the server bound.
//! - Authentication: no credentials 401; an unknown token 401; a token TokenReview accepts is
//!   the user it names; a client certificate from `clientCAFile` is the user its CN names; a
//!   certificate from another CA fails the handshake. Results are cached (one TokenReview).
//! - Authorization: SubjectAccessReview; 403 with upstream's text; `/pods` allowed by the
//!   fine-grained `nodes/pods` alone, `/containerLogs` needing `nodes/proxy`; decisions cached.
//! - `/pods`, `/containerLogs` with `tailLines`, `limitBytes`, `timestamps`, `follow` (to the
//!   container's end) and `previous`; `/exec` over a WebSocket through the kubelet to the
//!   runtime's streaming server; `/healthz` on the healthz port; 501 for what is not built.
//! - Through the API server's proxy: `kubectl logs`, `exec`, `port-forward` and `attach` (with
//!   `-i` over WebSocket and SPDY, and without); on `/metrics` the pod startup histograms (a slow
//!   registry's pull and an init container left out of the SLI; nothing counted by a restarted
//!   kubelet) and
//!   `rest_client_requests_total` against the requests the API server answered the kubelet.
//!
//! Needs root (real containers); skips loudly otherwise.

mod apiserver;
mod common;

use std::path::Path;
use std::sync::Arc;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const NODE: &str = "server-node";

/// A CA and a client certificate it signed for `cn`.
fn client_ca(dir: &Path, cn: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test client CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    std::fs::write(dir.join("client-ca.crt"), ca_cert.pem()).expect("writing the CA");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "kubelet-api-callers");
    let cert = params.signed_by(&key, &issuer).expect("client cert");
    (
        vec![cert.der().clone()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key"),
    )
}

/// A TLS connection to the kubelet on 127.0.0.1:`port`, trusting `serving` (its self-signed
/// certificate), with the client certificate `cert` if given.
async fn connect(
    port: u16,
    serving: &Path,
    cert: Option<&(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(serving).map_err(|e| e.to_string())? {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let config = match cert {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))
}

/// A GET over HTTPS to the kubelet on 127.0.0.1:`port`, trusting `serving` (its self-signed
/// certificate): the status and the whole body.
async fn get(
    port: u16,
    serving: &Path,
    path: &str,
    token: Option<&str>,
    cert: Option<&(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<(u16, String), String> {
    send("GET", port, serving, path, token, cert).await
}

/// A request over HTTPS to the kubelet (see [`get`]).
async fn send(
    method: &str,
    port: u16,
    serving: &Path,
    path: &str,
    token: Option<&str>,
    cert: Option<&(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<(u16, String), String> {
    let tls = connect(port, serving, cert).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("TLS: {e}"))?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("Host", format!("127.0.0.1:{port}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Opens a WebSocket over TLS to the kubelet at `path` with `protocol`, as `token`.
async fn websocket(
    port: u16,
    serving: &Path,
    path: &str,
    protocol: &str,
    token: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    String,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let tls = connect(port, serving, None).await?;
    let mut req = format!("wss://127.0.0.1:{port}{path}")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    let h = req.headers_mut();
    h.insert(
        "Sec-WebSocket-Protocol",
        protocol.parse().map_err(|_| "protocol")?,
    );
    h.insert(
        "Authorization",
        format!("Bearer {token}").parse().map_err(|_| "token")?,
    );
    let (ws, _) = tokio_tungstenite::client_async(req, tls)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ws)
}

/// Reads a remotecommand session to its end: stdout, and the status on the error channel.
async fn session_output(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    >,
) -> (String, String) {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let (mut stdout, mut status) = (Vec::new(), Vec::new());
    let read = async {
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Binary(d) = msg else {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
                continue;
            };
            match d.split_first() {
                Some((1, p)) => stdout.extend_from_slice(p),
                Some((3, p)) => status.extend_from_slice(p),
                _ => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read)
        .await
        .expect("the session ended");
    (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&status).into_owned(),
    )
}

fn reviews(api: &ApiServer, what: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with(&format!("POST /apis/{what}")))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubelet_api_authenticates_authorizes_and_serves_logs() {
    let api = ApiServer::start().await;
    let keys = tempfile::tempdir().expect("temp dir");
    let (client_cert, client_key) = client_ca(keys.path(), "apiserver-kubelet-client");
    let stranger_dir = tempfile::tempdir().expect("temp dir");
    let stranger = client_ca(stranger_dir.path(), "apiserver-kubelet-client");
    let healthz_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let read_only_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    // The Setup's config is static: leak the one formatted string of this test.
    let config: &'static str = Box::leak(
        format!(
            "healthzPort: {healthz_port}\nreadOnlyPort: {read_only_port}\nauthentication:\n  x509: {{clientCAFile: {}}}\nauthorization:\n  webhook: {{cacheUnauthorizedTTL: 0s}}\n",
            keys.path().join("client-ca.crt").display()
        )
        .into_boxed_str(),
    );
    let setup = Setup {
        name: NODE,
        config,
        cri_listen: false,
    };
    let test = "the_kubelet_api_authenticates_authorizes_and_serves_logs";
    let Some(node) = ApiNode::prepare(&setup, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let talker = format!(
        "  restartPolicy: Never\n  containers:\n{}",
        busybox(
            "app",
            "echo line 1; echo line 2; echo line 3; echo last >&2"
        )
    );
    pods.create(&PostParams::default(), &node.pod("talker", &talker))
        .await
        .expect("creating the pod");
    let agent = node.start();

    // The Node advertises the port bound (the tests' nodes bind any free port).
    let nodes: Api<Node> = Api::all(api.client());
    let port = wait_for("the Node with its kubelet port", 60, async || {
        let n = nodes.get_opt(NODE).await.ok().flatten()?;
        let p = n.status?.daemon_endpoints?.kubelet_endpoint?.port;
        u16::try_from(p).ok().filter(|p| *p != 0 && *p != 10250)
    })
    .await;
    let serving = node.root.join("pki/kubelet.crt");
    wait_for("talker finished", 60, async || {
        let st = pods.get_opt("talker").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;

    // Authentication.
    let (code, body) = get(port, &serving, "/pods", None, None).await.expect("GET");
    assert_eq!((code, body.as_str()), (401, "Unauthorized\n"));
    let (code, _) = get(port, &serving, "/pods", Some("nope"), None)
        .await
        .expect("GET");
    assert_eq!(code, 401);
    api.add_token("alice-token", "alice", &["devs"]);
    let alice = Some("alice-token");

    // Authorization: nothing allowed yet (denials are not cached here: cacheUnauthorizedTTL 0).
    let (code, body) = get(port, &serving, "/pods", alice, None)
        .await
        .expect("GET");
    assert_eq!(
        (code, body.as_str()),
        (
            403,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy)\n"
        )
    );
    // The fine-grained nodes/pods is enough for /pods, not for the logs.
    api.set_allowed("alice", "get", "pods", true);
    let (code, body) = get(port, &serving, "/pods", alice, None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("a PodList");
    assert_eq!(list["kind"], "PodList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["talker"]);
    assert_eq!(list["items"][0]["status"]["phase"], "Succeeded");
    let logs = "/containerLogs/default/talker/app";
    let (code, _) = get(port, &serving, logs, alice, None).await.expect("GET");
    assert_eq!(code, 403);

    // Logs.
    api.set_allowed("alice", "get", "proxy", true);
    let log = async |query: &str| {
        get(port, &serving, &format!("{logs}{query}"), alice, None)
            .await
            .expect("GET")
    };
    assert_eq!(
        log("").await,
        (200, "line 1\nline 2\nline 3\nlast\n".into())
    );
    assert_eq!(log("?tailLines=2").await, (200, "line 3\nlast\n".into()));
    assert_eq!(log("?limitBytes=9").await, (200, "line 1\nli".into()));
    let (_, stamped) = log("?timestamps=true&tailLines=1").await;
    let (time, rest) = stamped.split_once(' ').expect("a timestamp");
    assert!(
        time.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "{stamped:?}"
    );
    assert_eq!(rest, "last\n");
    let (code, body) = log("?previous=true").await;
    assert_eq!(
        (code, body.as_str()),
        (
            400,
            "previous terminated container \"app\" in pod \"talker\" not found\n"
        )
    );
    let (code, _) = log("?tailLines=-3").await;
    assert_eq!(code, 400);
    let (code, body) = get(
        port,
        &serving,
        "/containerLogs/default/talker/nope",
        alice,
        None,
    )
    .await
    .expect("GET");
    assert_eq!(code, 404, "{body}");

    // Follow: the lines as they come, until the container ends.
    let ticker = format!(
        "  restartPolicy: Never\n  containers:\n{}",
        busybox(
            "app",
            "i=0; while [ $i -lt 6 ]; do echo tick $i; i=$((i+1)); sleep 0.5; done"
        )
    );
    pods.create(&PostParams::default(), &node.pod("ticker", &ticker))
        .await
        .expect("creating the pod");
    wait_for("ticker running", 60, async || {
        let st = pods.get_opt("ticker").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let (code, body) = get(
        port,
        &serving,
        "/containerLogs/default/ticker/app?follow=true",
        alice,
        None,
    )
    .await
    .expect("GET");
    assert_eq!(code, 200);
    let expected: String = (0..6).map(|i| format!("tick {i}\n")).collect();
    assert_eq!(body, expected, "every line, once, in order, then the end");

    // Caches: one TokenReview for the token; a revoked permission still holds for its TTL.
    let sars = reviews(&api, "authorization.k8s.io");
    api.set_allowed("alice", "get", "proxy", false);
    assert_eq!(log("?tailLines=1").await.0, 200);
    assert_eq!(reviews(&api, "authorization.k8s.io"), sars);
    assert_eq!(reviews(&api, "authentication.k8s.io"), 2, "nope and alice");

    // Client certificates.
    let cert = (client_cert, client_key);
    let (code, _) = get(port, &serving, logs, None, Some(&cert))
        .await
        .expect("GET");
    assert_eq!(code, 403, "authenticated, not yet allowed");
    api.set_allowed("apiserver-kubelet-client", "get", "proxy", true);
    let (code, body) = get(port, &serving, logs, None, Some(&cert))
        .await
        .expect("GET");
    assert_eq!(
        (code, body.as_str()),
        (200, "line 1\nline 2\nline 3\nlast\n")
    );
    let refused = get(port, &serving, logs, None, Some(&stranger)).await;
    assert!(
        refused.is_err() || refused.as_ref().is_ok_and(|(c, _)| *c != 200),
        "a certificate of another CA: {refused:?}"
    );

    // Exec through the kubelet API: the runtime's streaming server, proxied (WebSocket, v5).
    let shell = format!(
        "  containers:\n{}    readinessProbe:\n      exec: {{command: [\"true\"]}}\n      periodSeconds: 1\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n",
        busybox(
            "app",
            "head -c 100000 /dev/zero > /written; head -c 50000 /dev/zero > /scratch/f; sleep 3600"
        )
        .replacen(
            "    command:",
            "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n    command:",
            1
        )
    );
    pods.create(&PostParams::default(), &node.pod("shell", &shell))
        .await
        .expect("creating the pod");
    wait_for("shell ready (its readiness probe passed)", 60, async || {
        let st = pods.get_opt("shell").await.ok().flatten()?.status?;
        st.conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    let exec = "/exec/default/shell/app?command=sh&command=-c&command=echo%20hello%3B%20exit%203&output=1&error=1";
    api.set_allowed("alice", "get", "proxy", true);
    let mut ws = websocket(port, &serving, exec, "v5.channel.k8s.io", "alice-token")
        .await
        .expect("an exec session");
    let (out, status) = session_output(&mut ws).await;
    assert_eq!(out, "hello\n");
    assert!(
        status.contains("NonZeroExitCode") && status.contains("\"message\":\"3\""),
        "{status}"
    );
    // /run (POST: the verb is create): a command's output in the answer.
    api.set_allowed("alice", "create", "proxy", true);
    let (code, body) = send(
        "POST",
        port,
        &serving,
        "/run/default/shell/app?cmd=echo%20ran%20here",
        alice,
        None,
    )
    .await
    .expect("POST");
    assert_eq!((code, body.as_str()), (200, "ran here\n"));
    api.add_token("bob-token", "bob", &[]);
    let refused = websocket(port, &serving, exec, "v5.channel.k8s.io", "bob-token").await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("403")),
        "bob may not exec: {:?}",
        refused.map(|_| ())
    );

    // /configz: the effective configuration; nodes/configz is enough for it.
    api.set_allowed("bob", "get", "configz", true);
    let (code, body) = get(port, &serving, "/configz", Some("bob-token"), None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{body}");
    let configz: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let kc = &configz["kubeletconfig"];
    assert_eq!(kc["kind"], "KubeletConfiguration");
    assert_eq!(
        kc["authentication"]["x509"]["clientCAFile"],
        keys.path().join("client-ca.crt").to_string_lossy().as_ref()
    );
    assert_eq!(kc["authorization"]["mode"], "Webhook");
    assert_eq!(kc["healthzPort"], healthz_port);

    // /logs/: the node's /var/log, with nodes/log.
    api.set_allowed("bob", "get", "log", true);
    let (code, listing) = get(port, &serving, "/logs/", Some("bob-token"), None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{listing}");
    assert!(listing.starts_with("<pre>\n"), "{listing}");
    let file = std::fs::read_dir("/var/log")
        .expect("/var/log")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| {
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        });
    if let Some(file) = file {
        assert!(
            listing.contains(&format!("<a href=\"{file}\">")),
            "{listing}"
        );
        let (code, _) = get(
            port,
            &serving,
            &format!("/logs/{file}"),
            Some("bob-token"),
            None,
        )
        .await
        .expect("GET");
        assert_eq!(code, 200, "/var/log/{file}");
    }
    let (code, _) = get(
        port,
        &serving,
        "/logs/no-such-file",
        Some("bob-token"),
        None,
    )
    .await
    .expect("GET");
    assert_eq!(code, 404);

    // /metrics, with nodes/metrics: the kubelet's own, with upstream's names.
    api.set_allowed("alice", "get", "metrics", true);
    let (code, body) = get(port, &serving, "/metrics", alice, None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{body}");
    let sample = |name: &str| -> Option<f64> {
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(
        sample("kubelet_node_name{node=\"server-node\"}"),
        Some(1.0),
        "{body}"
    );
    let ready = node
        .runtime()
        .await
        .list_pod_sandbox(runtime::cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .items
        .iter()
        .filter(|s| s.state == runtime::cri::PodSandboxState::SandboxReady as i32)
        .count();
    assert_eq!(sample("kubelet_running_pods"), Some(ready as f64), "{body}");
    assert!(
        sample("kubelet_started_containers_total{container_type=\"container\"}")
            .is_some_and(|n| n >= 3.0),
        "talker, ticker, shell: {body}"
    );
    assert!(
        sample("kubelet_runtime_operations_total{operation_type=\"exec_sync\"}")
            .is_some_and(|n| n >= 1.0),
        "/run's ExecSync: {body}"
    );
    assert!(
        sample("kubelet_pleg_relist_duration_seconds_count").is_some_and(|n| n >= 1.0),
        "{body}"
    );
    assert!(
        sample("kubelet_pod_start_duration_seconds_count").is_some_and(|n| n >= 2.0),
        "ticker and shell ran (talker may end before a status shows it running): {body}"
    );
    assert!(body.ends_with("# EOF\n"), "OpenMetrics text");
    assert_eq!(
        scraped(&body, "kubelet_running_pods", &[]),
        Some(ready as f64),
        "read by a parser of the format"
    );
    let (code, probes) = get(port, &serving, "/metrics/probes", alice, None)
        .await
        .expect("GET");
    assert_eq!(code, 200);
    let prefix = "prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"app\",pod=\"shell\",namespace=\"default\",pod_uid=";
    assert!(
        probes.lines().any(|l| l.starts_with(prefix)),
        "shell's readiness probe counted: {probes}"
    );

    // /metrics/resource: what metrics-server reads, from the runtime's stats.
    let (code, res) = get(port, &serving, "/metrics/resource", alice, None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{res}");
    let value = |prefix: &str| -> Option<f64> {
        res.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|v| v.parse().ok())
    };
    let shell_app = "{container=\"app\",namespace=\"default\",pod=\"shell\"}";
    assert!(
        value(&format!("container_memory_working_set_bytes{shell_app} ")).is_some_and(|v| v > 0.0),
        "{res}"
    );
    assert!(
        value(&format!("container_cpu_usage_seconds_total{shell_app} ")).is_some_and(|v| v > 0.0),
        "the readiness probe's execs ran in it: {res}"
    );
    assert!(
        value("node_cpu_usage_seconds_total ").is_some_and(|v| v > 0.0),
        "{res}"
    );
    assert!(
        value("node_memory_working_set_bytes ").is_some_and(|v| v > 0.0),
        "{res}"
    );
    assert!(
        value("pod_memory_working_set_bytes{namespace=\"default\",pod=\"shell\"} ")
            .is_some_and(|v| v > 0.0),
        "{res}"
    );
    assert_eq!(value("resource_scrape_error "), Some(0.0), "{res}");

    // /metrics/cadvisor: cAdvisor's names, from the runtime's stats, the writable layer's
    // usage (the 100 kB the app wrote) and the pod's network counters (its readiness probes
    // are execs; the kubelet's HTTP to the pod is not needed for eth0 to have counted bytes:
    // ARP and the probes' traffic reach it).
    let (code, cadv) = get(port, &serving, "/metrics/cadvisor", alice, None)
        .await
        .expect("GET");
    assert_eq!(code, 200, "{cadv}");
    let app_sample = |metric: &str| -> Option<f64> {
        cadv.lines()
            .find(|l| {
                l.starts_with(&format!("{metric}{{container=\"app\","))
                    && l.contains("namespace=\"default\",pod=\"shell\"}")
            })
            .and_then(|l| l.rsplit(' ').nth(1))
            .and_then(|v| v.parse().ok())
    };
    for metric in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_memory_usage_bytes",
    ] {
        assert!(
            app_sample(metric).is_some_and(|v| v > 0.0),
            "{metric}: {cadv}"
        );
    }
    assert!(
        app_sample("container_fs_usage_bytes").is_some_and(|v| v >= 100_000.0),
        "the written file counts in the writable layer: {cadv}"
    );
    assert!(
        app_sample("container_fs_inodes_used").is_some_and(|v| v >= 2.0),
        "{cadv}"
    );
    assert!(
        cadv.lines()
            .any(|l| l.starts_with("container_cpu_usage_seconds_total{")
                && l.contains("image=\"")
                && !l.contains("image=\"\"")),
        "the image is named: {cadv}"
    );
    assert!(
        cadv.lines().any(|l| l
            .starts_with("container_network_receive_bytes_total{container=\"\",")
            && l.contains("interface=\"eth0\"")
            && l.contains("pod=\"shell\"")),
        "the pod's eth0: {cadv}"
    );

    // /stats/summary: the Summary API, nodes/stats. Two scrapes: the second has CPU rates.
    api.set_allowed("alice", "get", "stats", true);
    let summary = async || {
        let (code, body) = get(port, &serving, "/stats/summary", alice, None)
            .await
            .expect("GET");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("JSON")
    };
    let first = summary().await;
    assert!(
        first["node"]["cpu"]["usageNanoCores"].is_null(),
        "no rate from one sample: {first}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let s = summary().await;
    let node_stats = &s["node"];
    assert_eq!(node_stats["nodeName"], NODE, "{s}");
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    assert!(n(&node_stats["cpu"]["usageCoreNanoSeconds"]) > 0, "{s}");
    assert!(!node_stats["cpu"]["usageNanoCores"].is_null(), "{s}");
    assert!(n(&node_stats["memory"]["workingSetBytes"]) > 0, "{s}");
    assert!(n(&node_stats["fs"]["capacityBytes"]) > 0, "{s}");
    assert!(n(&node_stats["runtime"]["imageFs"]["usedBytes"]) > 0, "{s}");
    assert!(n(&node_stats["rlimit"]["curproc"]) > 0, "{s}");
    let pod = s["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["name"] == "shell"))
        .unwrap_or_else(|| panic!("the shell pod: {s}"));
    assert_eq!(pod["podRef"]["namespace"], "default");
    assert_eq!(pod["network"]["name"], "eth0", "{pod}");
    assert!(n(&pod["memory"]["workingSetBytes"]) > 0, "{pod}");
    assert!(n(&pod["process_stats"]["process_count"]) >= 1, "{pod}");
    let app = pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "app"))
        .unwrap_or_else(|| panic!("app: {pod}"));
    assert!(n(&app["cpu"]["usageCoreNanoSeconds"]) > 0, "{app}");
    assert!(n(&app["rootfs"]["usedBytes"]) >= 100_000, "{app}");
    assert!(n(&app["logs"]["inodesUsed"]) >= 1, "the log file: {app}");
    let scratch = pod["volume"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
        .unwrap_or_else(|| panic!("the emptyDir: {pod}"));
    assert!(n(&scratch["usedBytes"]) >= 50_000, "{scratch}");
    assert!(n(&scratch["capacityBytes"]) > 0, "{scratch}");
    assert!(
        n(&pod["ephemeral-storage"]["usedBytes"])
            >= n(&app["rootfs"]["usedBytes"]) + n(&scratch["usedBytes"]),
        "writable layer, logs and emptyDir: {pod}"
    );

    // The values are the cgroup's: the app container's CPU time, read from its cgroup just
    // before and just after each scrape, brackets what each endpoint reports (the runtime reads
    // the cgroup when asked; nothing is cached).
    let app_id = pods
        .get("shell")
        .await
        .expect("the shell pod")
        .status
        .and_then(|st| st.container_statuses)
        .and_then(|cs| cs.into_iter().find(|c| c.name == "app"))
        .and_then(|c| c.container_id)
        .expect("the app's container id");
    let app_id = app_id.rsplit("://").next().unwrap_or_default().to_string();
    let cgroup_cpu = || cgroup_cpu_ns(&app_id).expect("the app's cgroup CPU time");
    let (before, (_, res), after) = (
        cgroup_cpu(),
        get(port, &serving, "/metrics/resource", alice, None)
            .await
            .expect("GET"),
        cgroup_cpu(),
    );
    let app = [
        ("container", "app"),
        ("pod", "shell"),
        ("namespace", "default"),
    ];
    let reported = scraped(&res, "container_cpu_usage_seconds_total", &app)
        .expect("the app's CPU in /metrics/resource");
    assert_within(before, reported * 1e9, after, "/metrics/resource");
    let (before, (_, cadv), after) = (
        cgroup_cpu(),
        get(port, &serving, "/metrics/cadvisor", alice, None)
            .await
            .expect("GET"),
        cgroup_cpu(),
    );
    let reported = scraped(&cadv, "container_cpu_usage_seconds_total", &app)
        .expect("the app's CPU in /metrics/cadvisor");
    assert_within(before, reported * 1e9, after, "/metrics/cadvisor");
    let (before, s, after) = (cgroup_cpu(), summary().await, cgroup_cpu());
    let reported = s["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["name"] == "shell"))
        .and_then(|p| p["containers"].as_array())
        .and_then(|c| c.iter().find(|c| c["name"] == "app"))
        .and_then(|c| c["cpu"]["usageCoreNanoSeconds"].as_u64())
        .expect("the app's CPU in /stats/summary");
    assert_within(before, reported as f64, after, "/stats/summary");

    // Not built yet: 501 with the reason, after authorization.
    let (code, body) = get(port, &serving, "/stats/container", alice, None)
        .await
        .expect("GET");
    assert_eq!(
        (code, body.as_str()),
        (501, "GET /stats: not implemented by nodelet yet\n")
    );

    // healthz, plain HTTP.
    let out = std::process::Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{healthz_port}/healthz")])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");

    // The read-only port: plain HTTP, no credentials, only what reads.
    let read_only = |path: &str| -> (String, String) {
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{read_only_port}{path}"))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.to_string(), body.to_string())
    };
    let (code, body) = read_only("/pods");
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("\"talker\""), "{body}");
    let (code, body) = read_only("/metrics/resource");
    assert!(
        code == "200" && body.contains("container_cpu_usage_seconds_total"),
        "{code} {body}"
    );
    for path in [
        "/containerLogs/default/talker/app",
        "/configz",
        "/run/default/shell/app",
        "/exec/default/shell/app?command=true",
    ] {
        let (code, body) = read_only(path);
        assert_eq!(code, "404", "{path}: {body}");
    }
    drop(agent);
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    kubectl_env(kubeconfig, args, &[])
}

fn kubectl_env(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = std::process::Command::new("kubectl")
        .envs(env.iter().copied())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running kubectl");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// A node on `api` whose kubelet takes the API server's client certificate (its CA in
/// `clientCAFile`), with `extra` configuration lines; and that certificate (chain and key), for
/// [`proxy_through`] once the kubelet serves. `None` when the test is skipped.
async fn proxied_node(
    api: &ApiServer,
    test: &str,
    name: &'static str,
    extra: &str,
) -> Option<(
    ApiNode,
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
    tempfile::TempDir,
)> {
    let keys = tempfile::tempdir().expect("temp dir");
    let (chain, key) = client_ca(keys.path(), "apiserver-kubelet-client");
    let config: &'static str = Box::leak(
        format!(
            "authentication:\n  x509: {{clientCAFile: {}}}\n{extra}",
            keys.path().join("client-ca.crt").display()
        )
        .into_boxed_str(),
    );
    let setup = Setup {
        name,
        config,
        cri_listen: false,
    };
    let node = ApiNode::prepare(&setup, Backend::Builtin, test, |dir| {
        api.write_kubeconfig(dir)
    })
    .await?;
    Some((node, chain, key, keys))
}

/// Makes the API server reach the node's kubelet as it does in a cluster: with its client
/// certificate (`chain`, `key`), trusting the serving certificate the kubelet wrote at start.
fn proxy_through(
    api: &ApiServer,
    node: &ApiNode,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) {
    let serving = node.root.join("pki/kubelet.crt");
    let trusted: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&serving)
        .expect("the serving certificate")
        .collect::<Result<_, _>>()
        .expect("PEM");
    api.set_kubelet_client(chain, key, trusted);
}

/// `pods/log` and `pods/exec` as clients use them: through the API server, which proxies them
/// to the node's kubelet with its client certificate (kube-rs's log API, and kubectl: logs, and
/// exec over WebSocket and over SPDY with its exit code).
#[tokio::test(flavor = "multi_thread")]
async fn logs_and_exec_through_the_api_server() {
    let test = "logs_and_exec_through_the_api_server";
    let api = ApiServer::start().await;
    let Some((node, chain, key, keys)) = proxied_node(
        &api,
        test,
        "proxied-node",
        "authorization:\n  webhook: {cacheUnauthorizedTTL: 0s}\n",
    )
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "echo one; echo two; echo three; sleep 3600")
    );
    pods.create(&PostParams::default(), &node.pod("chatty", &spec))
        .await
        .expect("creating the pod");
    let agent = node.start();
    wait_for("chatty running", 60, async || {
        let st = pods.get_opt("chatty").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    proxy_through(&api, &node, chain, key);

    // Refused until the API server's identity may use nodes/proxy, as in a real cluster.
    let params = kube::api::LogParams::default();
    let err = pods.logs("chatty", &params).await.expect_err("forbidden");
    assert!(err.to_string().contains("Forbidden"), "{err}");
    api.set_allowed("apiserver-kubelet-client", "get", "proxy", true);
    api.set_allowed("apiserver-kubelet-client", "create", "proxy", true);
    let text = wait_for("the three lines", 30, async || {
        let t = pods.logs("chatty", &params).await.ok()?;
        (t.lines().count() == 3).then_some(t)
    })
    .await;
    assert_eq!(text, "one\ntwo\nthree\n");
    let tail = kube::api::LogParams {
        tail_lines: Some(1),
        ..Default::default()
    };
    assert_eq!(pods.logs("chatty", &tail).await.expect("logs"), "three\n");

    if std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        common::skip("kubectl not installed; scripts/setup.sh installs it", test);
        drop(agent);
        return;
    }
    let kc = api.write_kubeconfig(keys.path());
    let (code, out, err) = kubectl(&kc, &["logs", "chatty", "--tail", "2"]);
    assert_eq!((code, out.as_str()), (0, "two\nthree\n"), "{err}");
    // kubectl exec: over WebSocket (v5) where kubectl speaks it, then over SPDY.
    let exec = ["exec", "chatty", "--", "sh", "-c", "echo hi; exit 3"];
    let (code, out, err) = kubectl(&kc, &exec);
    assert_eq!((code, out.as_str()), (3, "hi\n"), "kubectl exec: {err}");
    let spdy = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")];
    let (code, out, err) = kubectl_env(&kc, &exec, &spdy);
    assert_eq!(
        (code, out.as_str()),
        (3, "hi\n"),
        "kubectl exec over SPDY: {err}"
    );
    // kubectl exec -i: stdin reaches the command.
    let mut piped = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args([
            "exec",
            "-i",
            "chatty",
            "--",
            "sh",
            "-c",
            "read l; echo got $l",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl exec -i");
    {
        use std::io::Write;
        let mut stdin = piped.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").expect("writing stdin");
    }
    let out = piped.wait_with_output().expect("kubectl exec -i");
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "got hello\n"),
        "kubectl exec -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // kubectl exec -it: a terminal in the container (kubectl wants one on its own side too:
    // script(1) runs it on a pseudo-terminal).
    let it = format!(
        "kubectl --kubeconfig {} exec -it chatty -- sh -c 'tty; exit 4'",
        kc.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &it, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() == Some(4) && text.contains("/dev/pts/"),
        "kubectl exec -it: {:?} {text:?}",
        out.status
    );
    // kubectl logs -f: the lines so far, then it stays attached (the container runs on).
    let mut follow = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["logs", "-f", "chatty"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let stdout = follow.stdout.take().expect("its stdout");
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .take(3)
            .collect::<Result<Vec<_>, _>>()
    });
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), first)
        .await
        .expect("three lines from kubectl logs -f")
        .expect("reading")
        .expect("lines");
    assert_eq!(first, ["one", "two", "three"]);
    assert!(
        follow.try_wait().expect("kubectl").is_none(),
        "kubectl logs -f stays attached while the container runs"
    );
    let _ = follow.kill();
    let _ = follow.wait();
    // kubectl logs --previous: the kubelet's answer for a container that never restarted.
    let (code, _, err) = kubectl(&kc, &["logs", "chatty", "--previous"]);
    assert!(
        code != 0
            && err.contains("previous terminated container \"app\" in pod \"chatty\" not found"),
        "kubectl logs --previous: {code} {err}"
    );

    // kubectl port-forward (SPDY) through the API server and the kubelet into the pod.
    let web = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox(
            "httpd",
            "mkdir -p /www && echo forwarded > /www/index.html && exec httpd -f -p 8080 -h /www"
        )
    );
    pods.create(&PostParams::default(), &node.pod("web", &web))
        .await
        .expect("creating the pod");
    wait_for("web running", 60, async || {
        let st = pods.get_opt("web").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let local = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut forward = std::process::Command::new("kubectl")
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["port-forward", "pod/web", &format!("{local}:8080")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let page = wait_for("a page through kubectl port-forward", 30, async || {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "2",
                &format!("http://127.0.0.1:{local}/"),
            ])
            .output()
            .ok()?;
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        (!body.is_empty()).then_some(body)
    })
    .await;
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(page, "forwarded\n");
    drop(agent);
}

/// Container log rotation: with `containerLogMaxSize` 4Ki, `containerLogMaxFiles` 3 and a 3 s
/// monitor interval, a chatty container's log is rotated again and again: never more than 3
/// files, older ones gzipped CRI logs; and `kubectl logs -f` (pods/log through the API server)
/// goes on across the rotations without losing or repeating a line.
#[tokio::test(flavor = "multi_thread")]
async fn container_logs_rotate_and_follow_goes_on() {
    use futures::AsyncBufReadExt;
    use std::io::Read;
    let test = "container_logs_rotate_and_follow_goes_on";
    let api = ApiServer::start().await;
    let Some((node, chain, key, _keys)) = proxied_node(
        &api,
        test,
        "rotating-node",
        "containerLogMaxSize: 4Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n",
    )
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox(
            "app",
            "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.01; done"
        )
    );
    let created = pods
        .create(&PostParams::default(), &node.pod("chatty", &spec))
        .await
        .expect("creating the pod");
    let uid = created.metadata.uid.clone().expect("a uid");
    let agent = node.start();
    wait_for("chatty running", 60, async || {
        let st = pods.get_opt("chatty").await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    proxy_through(&api, &node, chain, key);
    api.set_allowed("apiserver-kubelet-client", "get", "proxy", true);

    let follow = kube::api::LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = pods
        .log_stream("chatty", &follow)
        .await
        .expect("following the log")
        .lines();
    let dir = node.pod_log_dir("chatty", &uid).join("app");
    let mut numbers: Vec<u64> = Vec::new();
    let mut rotated_seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while tokio::time::Instant::now() < deadline {
        use futures::StreamExt;
        let line = tokio::time::timeout(std::time::Duration::from_secs(5), lines.next())
            .await
            .expect("a line within 5 s")
            .expect("the stream goes on")
            .expect("a line");
        let n: u64 = line
            .strip_prefix("line ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not a line of the app: {line:?}"));
        numbers.push(n);
        let files: Vec<String> = std::fs::read_dir(&dir)
            .expect("the container's log dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(files.len() <= 3, "at most containerLogMaxFiles: {files:?}");
        rotated_seen.extend(files.into_iter().filter(|f| f != "0.log"));
    }
    assert!(
        rotated_seen.len() >= 2,
        "rotated at least twice while followed: {rotated_seen:?}"
    );
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "every line once, in order, across the rotations: {} lines from {:?}",
        numbers.len(),
        numbers.first()
    );
    // An older rotated file is a gzipped CRI log of the app's lines. (Looked for over a few
    // seconds: the agent goes on rotating, and while a rotation replaces the oldest file there
    // is none for a moment, or the one found is gone before it is read.)
    let mut text = None;
    for _ in 0..50 {
        let found = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".gz"));
        if let Some(Ok(file)) = found.map(std::fs::File::open) {
            let mut read = String::new();
            flate2::read::GzDecoder::new(file)
                .read_to_string(&mut read)
                .expect("gunzip");
            text = Some(read);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let text = text.expect("a compressed rotated log");
    let first = text.lines().next().unwrap_or("");
    assert!(
        first.contains(" stdout F line "),
        "a CRI log record: {first:?}"
    );
    drop(agent);
}

/// A registry over plain HTTP on 127.0.0.1 serving the project's busybox (any repository
/// name, any tag) whose manifests answer only after `delay`: a slow pull, honestly. Returns its
/// `host:port`; it serves until the test's runtime ends.
async fn slow_registry(delay: std::time::Duration) -> String {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let unpacked = tempfile::tempdir().expect("a temp dir");
    tar::Archive::new(std::fs::File::open(common::busybox_archive()).expect("the archive"))
        .unpack(unpacked.path())
        .expect("unpacking busybox");
    let blobs = unpacked.path().join("blobs/sha256");
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(unpacked.path().join("index.json")).expect("index.json"),
    )
    .expect("an index");
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("a manifest digest")
        .to_string();
    let manifest =
        std::fs::read(blobs.join(digest.trim_start_matches("sha256:"))).expect("the manifest blob");
    let media_type =
        serde_json::from_slice::<serde_json::Value>(&manifest).expect("JSON")["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json")
            .to_string();
    let blobs = Arc::new((unpacked, blobs));
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (blobs, manifest, digest, media_type) = (
            blobs.clone(),
            manifest.clone(),
            digest.clone(),
            media_type.clone(),
        );
        async move {
            let path = req.uri().path().to_string();
            if path == "/v2/" {
                return (StatusCode::OK, "{}").into_response();
            }
            if path.contains("/manifests/") {
                tokio::time::sleep(delay).await;
                return (
                    StatusCode::OK,
                    [
                        (header::CONTENT_TYPE.as_str(), media_type),
                        ("docker-content-digest", digest),
                    ],
                    manifest,
                )
                    .into_response();
            }
            if let Some((_, d)) = path.rsplit_once("/blobs/sha256:")
                && !d.contains('/')
                && let Ok(b) = std::fs::read(blobs.1.join(d))
            {
                return (StatusCode::OK, b).into_response();
            }
            StatusCode::NOT_FOUND.into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the registry");
    let host = listener.local_addr().expect("its address").to_string();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    host
}

/// The value of the sample `name` (with its labels) in a Prometheus text body.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The kubelet's `rest_client_requests_total` samples for `host`, by (code, method).
fn rest_counts(body: &str, host: &str) -> std::collections::BTreeMap<(String, String), u64> {
    let mut counts = std::collections::BTreeMap::new();
    for l in body.lines() {
        let Some(labels) = l.strip_prefix("rest_client_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        if label("host").as_deref() != Some(host) {
            continue;
        }
        let (Some(code), Some(method), Ok(n)) = (label("code"), label("method"), value.parse())
        else {
            continue;
        };
        counts.insert((code, method), n);
    }
    counts
}

/// The pod startup histograms and the API client's request counts on `/metrics`, and
/// `kubectl attach` through the API server:
/// - `kubelet_pod_start_sli_duration_seconds` counts each pod started while the kubelet watched
///   it, once, and leaves a slow pull out (the registry holds its manifest `DELAY`) and the run
///   of an init container (`INIT`); the total
///   and `kubelet_pod_start_duration_seconds` count the same pods; a kubelet restarted over
///   running pods counts none of them;
/// - `rest_client_requests_total{code,method,host}` equals, per code and method, the requests
///   the API server answered with the kubelet's User-Agent;
/// - `kubectl attach -i` feeds a container's stdin and gets its output back (WebSocket and
///   SPDY); `kubectl attach` without `-i` follows a container's output.
#[tokio::test(flavor = "multi_thread")]
async fn start_metrics_client_metrics_and_kubectl_attach() {
    const DELAY: std::time::Duration = std::time::Duration::from_secs(3);
    const INIT: std::time::Duration = std::time::Duration::from_secs(2);
    let test = "start_metrics_client_metrics_and_kubectl_attach";
    let api = ApiServer::start().await;
    let registry = slow_registry(DELAY).await;
    let Some((node, chain, key, keys)) = proxied_node(
        &api,
        test,
        "attached-node",
        &format!(
            "authorization:\n  webhook: {{cacheUnauthorizedTTL: 0s}}\nnodeletInsecureRegistries: [\"{registry}\"]\n"
        ),
    )
    .await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let slow = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {registry}/slow/busybox:1\n    imagePullPolicy: Always\n    command: [\"sleep\", \"3600\"]\n"
    );
    // Readers: their input, line by line, back on stdout until stdin ends (stdinOnce: the
    // attach's end closes it).
    let reader = format!(
        "  restartPolicy: Never\n  containers:\n{}    stdin: true\n    stdinOnce: true\n",
        busybox("app", "while read l; do echo \"got $l\"; done")
    );
    // The ticker waits for an init container running `INIT`, which the SLI leaves out too.
    let ticker = format!(
        "  terminationGracePeriodSeconds: 1\n  initContainers:\n{}  containers:\n{}",
        busybox("wait", &format!("sleep {}", INIT.as_secs())),
        busybox(
            "app",
            "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"
        )
    );
    let started = ["slow", "reader-ws", "reader-spdy", "ticker"];
    for (name, spec) in [
        ("slow", &slow),
        ("reader-ws", &reader),
        ("reader-spdy", &reader),
        ("ticker", &ticker),
    ] {
        pods.create(&PostParams::default(), &node.pod(name, spec))
            .await
            .expect("creating a pod");
    }
    let agent = node.start();
    let nodes: Api<Node> = Api::all(api.client());
    // The kubelet's port as the Node advertises it, once it is not `old`.
    let kubelet_port = async |old: u16| {
        wait_for("the Node with its kubelet port", 60, async || {
            let n = nodes.get_opt("attached-node").await.ok().flatten()?;
            let p = n.status?.daemon_endpoints?.kubelet_endpoint?.port;
            u16::try_from(p)
                .ok()
                .filter(|p| *p != 0 && *p != 10250 && *p != old)
        })
        .await
    };
    let port = kubelet_port(0).await;
    let serving = node.root.join("pki/kubelet.crt");
    for name in started {
        wait_for(&format!("{name} running"), 90, async || {
            let st = pods.get_opt(name).await.ok().flatten()?.status?;
            (st.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    let caller = (chain.clone(), key.clone_key());
    proxy_through(&api, &node, chain, key);
    api.set_allowed("apiserver-kubelet-client", "get", "metrics", true);
    api.set_allowed("apiserver-kubelet-client", "create", "proxy", true);
    api.set_allowed("apiserver-kubelet-client", "get", "proxy", true);
    let scrape_at = async |port: u16| {
        let (code, body) = get(port, &serving, "/metrics", None, Some(&caller))
            .await
            .expect("GET /metrics");
        assert_eq!(code, 200, "{body}");
        body
    };
    let scrape = async || scrape_at(port).await;

    // The four starts, each observed once the kubelet's Running status came back on its watch.
    let body = wait_for("four pod starts observed", 30, async || {
        let body = scrape().await;
        (metric(&body, "kubelet_pod_start_sli_duration_seconds_count") == Some(4.0)).then_some(body)
    })
    .await;
    for count in [
        "kubelet_pod_start_total_duration_seconds_count",
        "kubelet_pod_start_duration_seconds_count",
    ] {
        assert_eq!(metric(&body, count), Some(4.0), "{count}: {body}");
    }
    let sum = |name: &str| metric(&body, name).unwrap_or_else(|| panic!("{name}: {body}"));
    let total = sum("kubelet_pod_start_total_duration_seconds_sum");
    let sli = sum("kubelet_pod_start_sli_duration_seconds_sum");
    // Left out: the pull (at least DELAY) and the init container's run (INIT from its start,
    // measured from StartContainer's answer: a little less).
    let left_out = DELAY.as_secs_f64() + INIT.as_secs_f64() - 0.5;
    assert!(
        sli >= 0.0 && total - sli >= left_out && total - sli < total,
        "the slow pull ({DELAY:?}) and the init container ({INIT:?}) are left out of the SLI: \
         total {total}, sli {sli}"
    );

    // The API client's requests: the API server's answers to the kubelet, per code and
    // method, once no request is in flight (retried until a scrape falls between requests).
    let host = api.url().trim_start_matches("http://").to_string();
    let answered = || {
        let mut counts = std::collections::BTreeMap::new();
        for a in api
            .answered()
            .into_iter()
            .filter(|a| a.user_agent.starts_with("kubelet/"))
        {
            *counts
                .entry((a.code.to_string(), a.method.clone()))
                .or_insert(0u64) += 1;
        }
        counts
    };
    let mut last = None;
    for _ in 0..40 {
        let before = answered();
        let mut ours = rest_counts(&scrape().await, &host);
        ours.retain(|(code, _), _| code != "<error>");
        if before == ours && answered() == before {
            last = None;
            break;
        }
        last = Some((before, ours));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(last.is_none(), "answered vs counted: {last:?}");
    let counted = rest_counts(&scrape().await, &host);
    for (code, method) in [("200", "GET"), ("200", "PATCH"), ("201", "POST")] {
        assert!(
            counted
                .get(&(code.to_string(), method.to_string()))
                .is_some_and(|n| *n >= 1),
            "{code} {method}: {counted:?}"
        );
    }

    // kubectl attach -i: the input reaches the container's stdin, its output comes back; over
    // WebSocket (kubectl's default), then SPDY.
    if std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        common::skip("kubectl not installed; scripts/setup.sh installs it", test);
        drop(agent);
        return;
    }
    let kc = api.write_kubeconfig(keys.path());
    for (pod, env) in [
        ("reader-ws", &[][..]),
        (
            "reader-spdy",
            &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")][..],
        ),
    ] {
        use std::io::Write;
        let mut attach = std::process::Command::new("kubectl")
            .envs(env.iter().copied())
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["attach", "-i", pod, "-c", "app"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl attach");
        let mut stdin = attach.stdin.take().expect("its stdin");
        stdin.write_all(b"hello\nworld\n").expect("writing");
        drop(stdin);
        let out = tokio::task::spawn_blocking(move || attach.wait_with_output())
            .await
            .expect("joined")
            .expect("kubectl attach ran");
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).as_ref()
            ),
            (Some(0), "got hello\ngot world\n"),
            "kubectl attach -i {pod}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // kubectl attach without -i: the container's output as it goes.
    let mut follow = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["attach", "ticker", "-c", "app"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl attach");
    let stdout = follow.stdout.take().expect("its stdout");
    let lines = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .take(3)
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(std::time::Duration::from_secs(30), lines)
        .await
        .expect("three lines within 30 s")
        .expect("joined");
    let _ = follow.kill();
    let _ = follow.wait();
    let n: Vec<u64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    assert!(
        n.len() == 3 && n[1] == n[0] + 1 && n[2] == n[1] + 1,
        "consecutive ticks: {lines:?}"
    );

    // A kubelet restarted over the running pods starts none of them: nothing observed.
    drop(agent);
    let writes_before = api.answered().len();
    let agent = node.start();
    let port = kubelet_port(port).await;
    wait_for(
        "the new kubelet writing the slow pod's status",
        60,
        async || {
            api.answered()[writes_before..]
                .iter()
                .any(|a| {
                    a.user_agent.starts_with("kubelet/")
                        && a.method == "PATCH"
                        && a.path.ends_with("/pods/slow/status")
                })
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let body = scrape_at(port).await;
    for count in [
        "kubelet_pod_start_sli_duration_seconds_count",
        "kubelet_pod_start_total_duration_seconds_count",
        "kubelet_pod_start_duration_seconds_count",
    ] {
        assert_eq!(metric(&body, count), Some(0.0), "{count}: {body}");
    }
    drop(agent);
}

/// The value of the sample of `metric` with `labels` in a Prometheus text exposition, read by
/// a parser of the format (the whole body must parse).
fn scraped(body: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::{Scrape, Value};
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("not the Prometheus text format ({e}): {body}"));
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
}

/// The CPU time (ns) of the container `id`'s cgroup: `cpuacct.usage` on cgroup v1, `cpu.stat`'s
/// `usage_usec` on v2. The cgroup is the directory named after the container.
fn cgroup_cpu_ns(id: &str) -> Option<u64> {
    fn find(dir: &Path, name: &str, depth: usize) -> Option<std::path::PathBuf> {
        let entries = std::fs::read_dir(dir).ok()?;
        let dirs: Vec<_> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        if let Some(hit) = dirs
            .iter()
            .find(|d| d.file_name().is_some_and(|n| n == name))
        {
            return Some(hit.clone());
        }
        if depth == 0 {
            return None;
        }
        dirs.iter().find_map(|d| find(d, name, depth - 1))
    }
    let v1 = Path::new("/sys/fs/cgroup/cpuacct");
    if v1.is_dir() {
        let dir = find(v1, id, 6)?;
        return std::fs::read_to_string(dir.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok();
    }
    let dir = find(Path::new("/sys/fs/cgroup"), id, 6)?;
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us * 1000)
}

/// `reported` (ns) lies between two reads of the cgroup (ns), allowing for the microsecond
/// precision of cgroup v2 and of a printed float.
fn assert_within(before: u64, reported: f64, after: u64, what: &str) {
    let slack = 2_000.0;
    assert!(
        before as f64 - slack <= reported && reported <= after as f64 + slack,
        "{what}: {reported} ns reported, the cgroup read {before} then {after} ns"
    );
}
