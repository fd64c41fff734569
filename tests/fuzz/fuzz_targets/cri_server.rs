//! CRI requests through the real CRI v1 gRPC server (`runtime::server::serve` on a unix
//! socket: the `:authority` rewriter, h2, tonic, the adapter's deadlines and panic catching)
//! onto the fake runtime. An input is a sequence of calls, each a method (one byte, indexing
//! the unary RPCs of `runtime.v1.RuntimeService` and `ImageService`), a length (two bytes, big
//! endian) and that many bytes sent as the protobuf request. Each input gets a fresh server
//! and fake runtime. Checked: every call is answered (a response or a status) within a few
//! seconds, never with the status of a runtime panic (which the server catches), and the
//! server shuts down cleanly.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use runtime::fake::FakeRuntime;
use runtime::server::{ServerConfig, bind_unix, serve};
use runtime::{ImageService, RuntimeService};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Endpoint, Uri};

const METHODS: &[&str] = &[
    "/runtime.v1.RuntimeService/Version",
    "/runtime.v1.RuntimeService/RunPodSandbox",
    "/runtime.v1.RuntimeService/StopPodSandbox",
    "/runtime.v1.RuntimeService/RemovePodSandbox",
    "/runtime.v1.RuntimeService/PodSandboxStatus",
    "/runtime.v1.RuntimeService/ListPodSandbox",
    "/runtime.v1.RuntimeService/CreateContainer",
    "/runtime.v1.RuntimeService/StartContainer",
    "/runtime.v1.RuntimeService/StopContainer",
    "/runtime.v1.RuntimeService/RemoveContainer",
    "/runtime.v1.RuntimeService/ListContainers",
    "/runtime.v1.RuntimeService/ContainerStatus",
    "/runtime.v1.RuntimeService/UpdateContainerResources",
    "/runtime.v1.RuntimeService/ReopenContainerLog",
    "/runtime.v1.RuntimeService/ExecSync",
    "/runtime.v1.RuntimeService/Exec",
    "/runtime.v1.RuntimeService/Attach",
    "/runtime.v1.RuntimeService/PortForward",
    "/runtime.v1.RuntimeService/ContainerStats",
    "/runtime.v1.RuntimeService/ListContainerStats",
    "/runtime.v1.RuntimeService/PodSandboxStats",
    "/runtime.v1.RuntimeService/ListPodSandboxStats",
    "/runtime.v1.RuntimeService/UpdateRuntimeConfig",
    "/runtime.v1.RuntimeService/Status",
    "/runtime.v1.RuntimeService/CheckpointContainer",
    "/runtime.v1.RuntimeService/ListMetricDescriptors",
    "/runtime.v1.RuntimeService/ListPodSandboxMetrics",
    "/runtime.v1.RuntimeService/RuntimeConfig",
    "/runtime.v1.ImageService/ListImages",
    "/runtime.v1.ImageService/ImageStatus",
    "/runtime.v1.ImageService/PullImage",
    "/runtime.v1.ImageService/RemoveImage",
    "/runtime.v1.ImageService/ImageFsInfo",
];

/// Sends and receives messages as raw bytes.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        Fixture {
            socket: dir.path().join("cri.sock"),
            _dir: dir,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime"),
        }
    })
}

/// The calls of an input: (method path, request bytes).
fn calls(mut data: &[u8]) -> Vec<(&'static str, Bytes)> {
    let mut out = Vec::new();
    while data.len() >= 3 && out.len() < 16 {
        let method = METHODS[usize::from(data[0]) % METHODS.len()];
        let len = usize::from(u16::from_be_bytes([data[1], data[2]])).min(data.len() - 3);
        out.push((method, Bytes::copy_from_slice(&data[3..3 + len])));
        data = &data[3 + len..];
    }
    out
}

async fn run(socket: PathBuf, calls: Vec<(&'static str, Bytes)>) {
    let fake = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn RuntimeService> = fake.clone();
    let images: Arc<dyn ImageService> = fake;
    let bound = bind_unix(&socket).expect("binding the CRI socket");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ServerConfig {
        request_timeout: Duration::from_secs(5),
        pull_image_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let server = tokio::spawn(serve(bound, runtime, images, config, async move {
        let _ = stopped.await;
    }));
    let path = socket.clone();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .expect("connecting to the CRI server");
    let mut grpc = tonic::client::Grpc::new(channel);
    for (method, body) in calls {
        let call = async {
            grpc.ready().await.expect("the connection is ready");
            let path = http::uri::PathAndQuery::from_static(method);
            grpc.unary(tonic::Request::new(body), path, Raw).await
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{method} was not answered"));
        if let Err(status) = answer {
            assert!(
                !status.message().contains("the runtime panicked"),
                "{method}: {}",
                status.message()
            );
        }
    }
    drop(grpc);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server did not stop")
        .expect("the server task")
        .expect("the server failed");
}

/// libFuzzer's `main` is C's, so the Rust runtime never set SIGPIPE to ignored as it does for
/// the nodelet binary: a write to a closed socket would kill the fuzzer instead of failing.
fn ignore_sigpipe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN, before any socket is used.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}

fuzz_target!(|data: &[u8]| {
    ignore_sigpipe();
    let f = fixture();
    f.rt.block_on(run(f.socket.clone(), calls(data)));
});
