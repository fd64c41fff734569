//! Unit tests for the static pod URL source, against a tiny HTTP server on 127.0.0.1.

use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;

use super::*;

/// Serves `response` (the whole raw HTTP response, changeable) to every connection.
async fn server() -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/pods", listener.local_addr().unwrap());
    let response = Arc::new(Mutex::new(Vec::new()));
    let r = response.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = r.lock().unwrap().clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut req = Vec::new();
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                assert!(req.starts_with(b"GET /pods HTTP/1.1\r\n"));
                let _ = conn.write_all(&body).await;
            });
        }
    });
    (url, response)
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},
  "spec":{"containers":[{"name":"c","image":"nginx:1"}]}}"#;

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn single_pod_lists_and_errors() {
    let (url, response) = server().await;
    let set = |r: Vec<u8>| *response.lock().unwrap() = r;
    let mut src = HttpSource::new(&url, "n1", Duration::from_secs(20));

    set(ok(POD));
    let pods = src.fetch().await.unwrap();
    assert_eq!(names(&pods), vec!["web-n1"]);
    let a = pods[0].metadata.annotations.as_ref().unwrap();
    assert_eq!(a[crate::sources::CONFIG_SOURCE_ANNOTATION], "http");
    assert_eq!(
        pods[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some("n1")
    );
    // The same body: the same pods, seen time included.
    assert_eq!(src.fetch().await.unwrap(), pods);

    let item = r#"{"metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    set(ok(&format!(
        r#"{{"apiVersion":"v1","kind":"PodList","items":[{POD},{item}]}}"#
    )));
    assert_eq!(names(&src.fetch().await.unwrap()), vec!["web-n1", "b-n1"]);

    let yaml = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: y}\n  spec: {containers: [{name: c, image: i}]}\n";
    set(ok(yaml));
    assert_eq!(names(&src.fetch().await.unwrap()), vec!["y-n1"]);

    // Chunked transfer encoding.
    let chunked = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        10,
        &POD[..10],
        POD.len() - 10,
        &POD[10..]
    );
    set(chunked.into_bytes());
    assert_eq!(names(&src.fetch().await.unwrap()), vec!["web-n1"]);

    set(ok(""));
    assert!(src.fetch().await.unwrap().is_empty());

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
            "HTTP status HTTP/1.1 404 Not Found",
        ),
        (ok("{"), "not YAML/JSON"),
        (
            ok(r#"{"apiVersion":"v1","kind":"Service"}"#),
            "pod #0: kind is \"Service\"",
        ),
        (
            ok(&format!(
                r#"{{"apiVersion":"v1","kind":"List","items":[{POD},{item}]}}"#
            )),
            "pod #1: kind is missing",
        ),
        (
            ok(&format!(
                r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
                POD.replace("web", "Web")
            )),
            "pod #0: metadata.name \"Web\"",
        ),
        (
            ok(r#"{"apiVersion":"v1","kind":"PodList"}"#),
            "PodList without items",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{}".to_vec(),
            "truncated body",
        ),
    ];
    for (resp, want) in cases {
        set(resp);
        let e = src.fetch().await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{url}: {want}")),
            "got {e:?}, want {want:?}"
        );
    }

    let mut bad = HttpSource::new("https://example.com/x", "n", Duration::from_secs(1));
    let e = bad.fetch().await.unwrap_err().to_string();
    assert!(e.contains("only http:// URLs"), "{e}");
}

#[tokio::test]
async fn run_sends_changes_and_keeps_pods_on_errors() {
    let (url, response) = server().await;
    *response.lock().unwrap() = ok(POD);
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let task = tokio::spawn(HttpSource::new(&url, "n", Duration::from_millis(50)).run(tx));
    let recv = async |rx: &mut tokio::sync::mpsc::Receiver<PodUpdate>| {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an update in time")
            .expect("the source is running")
    };
    let first = recv(&mut rx).await;
    assert_eq!((first.op, first.source), (PodOp::Set, HTTP_SOURCE));
    assert_eq!(names(&first.pods), vec!["web-n"]);

    // Failures send nothing (the previous pods stay); nor does an unchanged answer.
    *response.lock().unwrap() = b"HTTP/1.1 500 Oops\r\n\r\n".to_vec();
    tokio::time::sleep(Duration::from_millis(200)).await;
    *response.lock().unwrap() = ok(POD);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err());

    *response.lock().unwrap() = ok(&POD.replace("web", "other"));
    assert_eq!(names(&recv(&mut rx).await.pods), vec!["other-n"]);

    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run returns")
        .unwrap();
}

#[test]
fn response_parsing() {
    assert_eq!(
        parse_response(b"HTTP/1.0 200 OK\r\n\r\nabc").unwrap(),
        b"abc"
    );
    assert_eq!(
        parse_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\n\r\n"
        )
        .unwrap(),
        b"abc"
    );
    assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    assert!(
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
    );
    assert!(
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_err()
    );
    assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
}
