//! The kubelet API (`src/server`) with arbitrary requests: a method, a path with its query
//! string and headers, handed to the real router (authentication, authorization, every
//! endpoint) over a fake runtime with one pod. Whatever the path, query or headers, the server
//! answers with a status and never panics.
//!
//! Input: the first byte picks the method; the rest is text, its first line the request target
//! (path and query), each further line a `name: value` header. A target or header `http`
//! refuses to build is skipped.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use nodelet::config::ServerConfig;
use nodelet::server::ServerDeps;
use nodelet::server::fuzzing::router;
use runtime::fake::FakeRuntime;
use tower::ServiceExt;

struct Fixture {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    router: axum::Router,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio");
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
            "spec": {"nodeName": "fuzz-node", "containers": [{"name": "app", "image": "busybox"}]}
        }))
        .expect("pod");
        let router = rt.block_on(async {
            let fake = Arc::new(FakeRuntime::new());
            let (_tx, pods) = tokio::sync::watch::channel(Arc::new(vec![pod]));
            std::mem::forget(_tx);
            let mut cfg = ServerConfig::loopback_any_port();
            cfg.system_log_handler = true;
            let logs = dir.path().join("var-log");
            std::fs::create_dir_all(&logs).expect("log dir");
            std::fs::write(logs.join("syslog"), "a line\n").expect("a log");
            router(ServerDeps {
                cfg,
                node_name: "fuzz-node".into(),
                node_ips: vec!["127.0.0.1".parse().expect("ip")],
                root_dir: dir.path().join("root"),
                cert_dir: dir.path().join("root/pki"),
                serving: None,
                pod_logs_dir: dir.path().join("pods"),
                client: None,
                rt: fake.clone(),
                images: fake,
                pods,
                status: nodelet::status_manager::StatusManager::new(None),
                system_log_dir: logs,
                configz: serde_json::json!({"kind": "KubeletConfiguration"}),
                health: Arc::new(|| Ok(())),
            })
            .expect("router")
        });
        Fixture {
            _dir: dir,
            rt,
            router,
        }
    })
}

const METHODS: [Method; 6] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::HEAD,
    Method::DELETE,
    Method::OPTIONS,
];

fn request(data: &[u8]) -> Option<Request<axum::body::Body>> {
    let (&m, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    let mut lines = text.split('\n');
    let target = lines.next()?;
    let mut req = Request::builder()
        .method(METHODS[usize::from(m) % METHODS.len()].clone())
        .uri(target);
    for line in lines {
        let (name, value) = line.split_once(':')?;
        req = req.header(name.trim(), value.trim());
    }
    req.body(axum::body::Body::empty()).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(req) = request(data) else {
        return;
    };
    let f = fixture();
    let router = f.router.clone();
    f.rt.block_on(async move {
        // Streams (a followed log, an upgrade) may go on: the head is what must come.
        let Ok(answer) = tokio::time::timeout(Duration::from_secs(5), router.oneshot(req)).await
        else {
            return;
        };
        let Ok(response) = answer;
        let body = response.into_body();
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            axum::body::to_bytes(body, 1 << 20),
        )
        .await;
    });
});
