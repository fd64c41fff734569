//! The client follows the server through a graceful restart and through a crash on the same
//! socket path, without reconnecting by hand; the server refuses to steal a live socket or to
//! replace a file that is not a socket.

use super::*;

/// Calls `Status` until it succeeds; returns how long that took.
async fn until_ok(rt: &RemoteRuntime) -> Duration {
    let start = Instant::now();
    loop {
        match rt.status(Default::default()).await {
            Ok(_) => return start.elapsed(),
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never reconnected: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test]
async fn the_client_follows_the_server_through_restarts_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, endpoint) = socket(&dir);
    let first = serve(&path, Arc::new(FakeRuntime::new())).await;
    let rt = remote::connect(&endpoint, Duration::from_secs(5))
        .await
        .unwrap();
    rt.status(Default::default()).await.unwrap();

    // A second server on the same path is refused while the first one lives.
    let other = Arc::new(FakeRuntime::new());
    let err = server::serve_unix(&path, other.clone(), other, async {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    rt.status(Default::default())
        .await
        .expect("first server unharmed");

    // Graceful restart: calls fail with Unavailable while nothing serves, then reach the new
    // runtime through the same client.
    first.stop().await;
    let err = rt.status(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let second = serve(&path, Arc::new(FakeRuntime::new())).await;
    let took = until_ok(&rt).await;
    eprintln!("reconnected {took:?} after a graceful restart");
    assert!(second.fake.called().iter().any(|c| c == "Status"));

    // Crash: the serving future is dropped with a call stream open. The stream ends, calls
    // fail, and a new server replaces the stale socket file.
    let mut events = rt.get_container_events(Default::default()).await.unwrap();
    second.crash().await;
    let end = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the event stream ends when the server dies");
    if let Some(item) = end {
        let err = item.expect_err("no event was due");
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }
    let err = rt.status(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(path.exists(), "a crashed server leaves its socket file");
    let third = serve(&path, Arc::new(FakeRuntime::new())).await;
    let took = until_ok(&rt).await;
    eprintln!("reconnected {took:?} after a crash");
    let sb = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("after-crash")),
            runtime_handler: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(third.fake.sandboxes()[0].id, sb.pod_sandbox_id);
    third.stop().await;
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    std::fs::write(&path, b"precious").unwrap();
    let fake = Arc::new(FakeRuntime::new());
    let err = server::serve_unix(&path, fake.clone(), fake, async {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}
