//! Calls at the edges: injected errors of every RPC and unknown ids come back with their code
//! and message, malformed requests are the runtime's `InvalidArgument`, message size limits
//! hold on both sides, and events stream until the server stops.

use super::*;
use rpcs::{ALL_RPCS, call};
use runtime::endpoint::unix_socket_path;

#[tokio::test]
async fn errors_come_back_with_their_code_and_message() {
    let (_dir, served, rt) = setup().await;
    const CODES: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    for (i, rpc) in ALL_RPCS.iter().enumerate() {
        let code = CODES[i % CODES.len()];
        let msg = format!("injected into {rpc}: \"quotes\", ünïcödé, newline\nand more");
        served.fake.inject_error(rpc, Error::new(code, msg.clone()));
        let err = call(&rt, rpc).await.expect_err(rpc);
        assert_eq!((err.code(), err.message()), (code, msg.as_str()), "{rpc}");
    }

    // Unknown ids: NotFound where CRI says so, success for the idempotent removals.
    for rpc in [
        "ContainerStatus",
        "StartContainer",
        "ContainerStats",
        "PodSandboxStatus",
        "PodSandboxStats",
        "UpdateContainerResources",
        "ExecSync",
    ] {
        let err = rpcs::call_with_id(&rt, rpc, "no-such-id")
            .await
            .expect_err(rpc);
        assert_eq!(err.code(), Code::NotFound, "{rpc}: {err}");
    }
    for rpc in [
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ] {
        rpcs::call_with_id(&rt, rpc, "no-such-id").await.expect(rpc);
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments_and_change_nothing() {
    let (_dir, served, rt) = setup().await;
    let sb = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("p")),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .pod_sandbox_id;
    let before = (
        served.fake.sandboxes().len(),
        served.fake.containers().len(),
    );
    let errs = [
        rt.run_pod_sandbox(Default::default()).await.map(drop),
        rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig::default()),
            runtime_handler: String::new(),
        })
        .await
        .map(drop),
        rt.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: None,
            sandbox_config: None,
        })
        .await
        .map(drop),
        rt.container_status(Default::default()).await.map(drop),
        rt.pull_image(Default::default()).await.map(drop),
        rt.image_status(Default::default()).await.map(drop),
    ];
    for (i, e) in errs.into_iter().enumerate() {
        let e = e.expect_err("malformed request accepted");
        assert_eq!(e.code(), Code::InvalidArgument, "request {i}: {e}");
    }
    assert_eq!(
        (
            served.fake.sandboxes().len(),
            served.fake.containers().len()
        ),
        before
    );
    // The server is still fine.
    rt.version(Default::default()).await.unwrap();
}

#[tokio::test]
async fn messages_up_to_16_mib_pass_and_larger_ones_fail_cleanly() {
    let (_dir, served, rt) = setup().await;
    let mut cfg = sandbox_config("big");
    cfg.annotations.insert("blob".into(), "x".repeat(6 << 20));
    let sb = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: String::new(),
        })
        .await
        .expect("a 6 MiB request (over gRPC's 4 MiB default)")
        .pod_sandbox_id;
    let st = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb,
            verbose: false,
        })
        .await
        .expect("a 6 MiB response");
    assert_eq!(st.status.unwrap().annotations["blob"].len(), 6 << 20);

    // Over the limit: the client refuses to send it...
    let mut huge = sandbox_config("huge");
    huge.annotations.insert("blob".into(), "x".repeat(17 << 20));
    let huge = cri::RunPodSandboxRequest {
        config: Some(huge),
        runtime_handler: String::new(),
    };
    let err = rt
        .run_pod_sandbox(huge.clone())
        .await
        .expect_err("a 17 MiB request");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    // ...and the server refuses it from a client without limits.
    let path = unix_socket_path(rt.endpoint()).unwrap();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let io = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
            }
        }));
    let mut raw = cri::runtime_service_client::RuntimeServiceClient::new(channel)
        .max_encoding_message_size(usize::MAX);
    let status = raw.run_pod_sandbox(huge).await.expect_err("server limit");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(served.fake.sandboxes().len(), 1);
    rt.version(Default::default()).await.expect("still serving");
}

#[tokio::test]
async fn container_events_stream_through() {
    let (_dir, served, rt) = setup().await;
    let mut events = rt.get_container_events(Default::default()).await.unwrap();
    // The subscription exists once the server has answered; give it a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sb = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("ev")),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .pod_sandbox_id;
    let c = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(container_config("c")),
            sandbox_config: None,
        })
        .await
        .unwrap()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: c.clone(),
    })
    .await
    .unwrap();
    use cri::ContainerEventType as Ev;
    let want = [
        (sb.clone(), Ev::ContainerCreatedEvent),
        (sb.clone(), Ev::ContainerStartedEvent),
        (c.clone(), Ev::ContainerCreatedEvent),
        (c.clone(), Ev::ContainerStartedEvent),
    ];
    for (id, kind) in want {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .expect("event");
        assert_eq!(
            (ev.container_id.as_str(), ev.container_event_type),
            (id.as_str(), kind as i32)
        );
        assert_eq!(ev.pod_sandbox_status.unwrap().id, sb);
    }
    // Stopping the server ends the stream instead of hanging the shutdown.
    let stopped = Instant::now();
    served.stop().await;
    assert!(
        stopped.elapsed() < Duration::from_secs(2),
        "shutdown waited for the stream"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("stream ends");
    assert!(end.as_ref().is_none_or(|r| r.is_err()), "{end:?}");
}

/// A client that sends the socket path as `:authority`, as grpc-go did before Kubernetes set
/// `localhost` (and as grpc-java does): raw HTTP/2 frames on the socket, the request's headers
/// indexed into the client's HPACK table as grpc-go does, twice. Both Version calls get
/// answered, where the HTTP/2 server alone would reset the streams.
#[tokio::test]
async fn a_socket_path_as_authority_is_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = socket(&dir);
    let served = serve(&path, Arc::new(FakeRuntime::new())).await;
    let mut conn = tokio::net::UnixStream::connect(&path).await.unwrap();
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }
    let authority = path.to_string_lossy().into_owned();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/runtime.v1.RuntimeService/Version"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let mut enc = loona_hpack::Encoder::new();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    for stream in [1u32, 3] {
        out.extend(frame(
            0x1,
            0x4,
            stream,
            &enc.encode(headers.iter().copied()),
        ));
        // An empty VersionRequest: a gRPC message header with length 0.
        out.extend(frame(0x0, 0x1, stream, &[0, 0, 0, 0, 0]));
    }
    conn.write_all(&out).await.unwrap();

    let mut dec = loona_hpack::Decoder::new();
    let mut answered = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered.len() < 2 {
        assert!(Instant::now() < deadline, "answers so far: {answered:?}");
        let mut head = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut head))
            .await
            .expect("an answer")
            .expect("read");
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match head[3] {
            0x4 if head[4] & 0x1 == 0 => conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(),
            0x1 => {
                let h = dec.decode(&payload).expect("server headers");
                if let Some((_, status)) = h.iter().find(|(n, _)| n.as_slice() == b":status") {
                    assert_eq!(status.as_slice(), b"200", "stream {stream}: {h:?}");
                }
            }
            0x0 if !payload.is_empty() => {
                let text = String::from_utf8_lossy(&payload).into_owned();
                assert!(
                    text.contains(FAKE_RUNTIME_NAME),
                    "stream {stream}: {text:?}"
                );
                answered.insert(stream, text);
            }
            0x3 => panic!("stream {stream} reset: {payload:?}"),
            0x7 => panic!("GOAWAY: {:?}", String::from_utf8_lossy(&payload)),
            _ => {}
        }
    }
    assert_eq!(answered.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
    drop(conn);
    served.stop().await;
}
