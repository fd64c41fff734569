//! The HTTP GET of probes and hooks: requests, redirects, the body limit, HTTPS.

use super::*;

fn action(port: i32, path: &str) -> HTTPGetAction {
    HTTPGetAction {
        port: IntOrString::Int(port),
        path: Some(path.into()),
        ..Default::default()
    }
}
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

#[test]
fn a_request_has_upstreams_default_headers_and_the_given_ones() {
    let mut a = action(8080, "healthz?x=1");
    a.http_headers = Some(vec![k8s_openapi::api::core::v1::HTTPHeader {
        name: "X-Custom".into(),
        value: "v".into(),
    }]);
    let r = Request::for_action(&a, &Container::default(), "10.1.2.3", "probe").unwrap();
    assert_eq!(r.url(), "http://10.1.2.3:8080/healthz?x=1");
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Host", "User-Agent", "Accept", "X-Custom"]);
    assert_eq!(r.headers[0].1, "10.1.2.3:8080");
    assert!(r.headers[1].1.starts_with("kube-probe/1."));
    assert_eq!(r.headers[2].1, "*/*");
}

#[test]
fn a_host_header_names_the_host_and_a_named_port_resolves() {
    let mut a = action(0, "/");
    a.port = IntOrString::String("web".into());
    a.http_headers = Some(vec![k8s_openapi::api::core::v1::HTTPHeader {
        name: "Host".into(),
        value: "example.com".into(),
    }]);
    let c = Container {
        name: "app".into(),
        ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("web".into()),
            container_port: 8081,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let r = Request::for_action(&a, &c, "fd00::1", "lifecycle").unwrap();
    assert_eq!(r.url(), "http://[fd00::1]:8081/");
    assert_eq!(r.host_name(), "example.com");
    assert!(
        r.headers
            .iter()
            .any(|(n, v)| n == "User-Agent" && v.starts_with("kube-lifecycle/"))
    );
    a.port = IntOrString::String("nope".into());
    let e = Request::for_action(&a, &c, "10.0.0.1", "probe").unwrap_err();
    assert_eq!(e.to_string(), "couldn't find port: nope in app");
}

#[test]
fn redirects_are_followed_only_on_the_same_host() {
    let r = Request::for_action(
        &action(80, "/a"),
        &Container::default(),
        "10.0.0.1",
        "probe",
    )
    .unwrap();
    let same = redirect(&r, "/b?c").unwrap();
    assert_eq!(same.url(), "http://10.0.0.1:80/b?c");
    let same_abs = redirect(&r, "http://10.0.0.1:81/z").unwrap();
    assert_eq!(same_abs.port, 81);
    assert!(redirect(&r, "http://other.example/").is_none());
}

/// A server on 127.0.0.1: `/ok`, `/echo` (the request's Host and User-Agent), `/here` (a
/// redirect to `/ok`), `/away` (a redirect to another host), `/loop` (to itself), `/big`
/// (20 KiB), `/fail` (500). Returns its port.
async fn serve() -> u16 {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/ok", get(|| async { "fine" }))
        .route(
            "/echo",
            get(|h: HeaderMap| async move {
                let v = |n| {
                    h.get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                format!(
                    "{}|{}|{}",
                    v(header::HOST),
                    v(header::USER_AGENT),
                    v(header::ACCEPT)
                )
            }),
        )
        .route(
            "/here",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/ok")], "") }),
        )
        .route(
            "/away",
            get(|| async {
                (
                    StatusCode::FOUND,
                    [(header::LOCATION, "http://elsewhere.invalid/x")],
                    "moved",
                )
            }),
        )
        .route(
            "/loop",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/loop")], "") }),
        )
        .route("/big", get(|| async { "x".repeat(20 * 1024) }))
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    port
}

fn req(port: u16, path: &str) -> Request {
    Request::for_action(
        &action(i32::from(port), path),
        &Container::default(),
        "127.0.0.1",
        "probe",
    )
    .expect("request")
}

#[tokio::test]
async fn gets_follow_same_host_redirects_and_stop_at_others() {
    let port = serve().await;
    let r = get(&req(port, "/echo")).await.expect("get");
    let v = crate::prober::user_agent();
    assert_eq!(r.body, format!("127.0.0.1:{port}|{v}|*/*"));
    let r = get(&req(port, "/here")).await.expect("get");
    assert_eq!((r.status, r.body.as_str()), (200, "fine"));
    let r = get(&req(port, "/away")).await.expect("get");
    assert_eq!((r.status, r.body.as_str()), (302, "moved"));
    let e = get(&req(port, "/loop")).await.expect_err("a redirect loop");
    assert!(e.to_string().ends_with("stopped after 10 redirects"), "{e}");
    let r = get(&req(port, "/big")).await.expect("get");
    assert_eq!(r.body.len(), MAX_BODY);
    assert_eq!(get(&req(port, "/fail")).await.expect("get").status, 500);
}

#[tokio::test]
async fn the_probe_maps_statuses_and_errors_as_upstream() {
    use crate::prober::{Attempt, Prober, RuntimeProber, Target};
    let port = serve().await;
    let prober = RuntimeProber::new(std::sync::Arc::new(runtime::fake::FakeRuntime::default()));
    let pod = k8s_openapi::api::core::v1::Pod::default();
    let c = Container::default();
    let target = Target {
        pod: &pod,
        container: &c,
        container_id: "c1",
        pod_ip: "127.0.0.1",
    };
    let probe = |path: &str, p: u16| k8s_openapi::api::core::v1::Probe {
        http_get: Some(action(i32::from(p), path)),
        ..Default::default()
    };
    let t = std::time::Duration::from_secs(2);
    let run = |path: &'static str, p: u16| {
        let prober = &prober;
        let target = &target;
        async move { prober.probe(&probe(path, p), t, target).await }
    };
    assert_eq!(run("/ok", port).await, Attempt::Success("fine".into()));
    assert_eq!(
        run("/away", port).await,
        Attempt::Warning("Probe terminated redirects, Response body: moved".into())
    );
    assert_eq!(
        run("/fail", port).await,
        Attempt::Failure("HTTP probe failed with statuscode: 500".into())
    );
    // Nothing listens on the port of a listener just closed.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    assert_eq!(
        run("/ok", closed).await,
        Attempt::Failure(format!(
            "Get \"http://127.0.0.1:{closed}/ok\": dial tcp 127.0.0.1:{closed}: connect: connection refused"
        ))
    );
    let tcp = k8s_openapi::api::core::v1::Probe {
        tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
            port: IntOrString::Int(i32::from(closed)),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        prober.probe(&tcp, t, &target).await,
        Attempt::Failure(format!(
            "dial tcp 127.0.0.1:{closed}: connect: connection refused"
        ))
    );
}

#[tokio::test]
async fn https_probes_accept_any_certificate() {
    use rustls::pki_types::pem::PemObject;
    let dir = tempfile::tempdir().expect("temp dir");
    let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=self-signed",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    assert!(
        out.as_ref().is_ok_and(|o| o.status.success()),
        "openssl could not make a self-signed certificate: {out:?}"
    );
    let certs = vec![rustls::pki_types::CertificateDer::from_pem_file(&cert).expect("cert")];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut tls = acceptor.accept(tcp).await.expect("handshake");
        let mut buf = [0u8; 4096];
        let _ = tls.read(&mut buf).await;
        let _ = tls
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nsecure")
            .await;
        let _ = tls.shutdown().await;
    });
    let mut a = action(i32::from(port), "/");
    a.scheme = Some("HTTPS".into());
    let r = Request::for_action(&a, &Container::default(), "127.0.0.1", "probe").expect("req");
    let resp = get(&r).await.expect("an unverified HTTPS GET");
    assert_eq!((resp.status, resp.body.as_str()), (200, "secure"));
}
