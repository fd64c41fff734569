//! Connecting to something that is not a CRI v1 runtime fails on `connect`, with a message
//! naming the endpoint: a gRPC server without `runtime.v1.RuntimeService`, a socket that hangs
//! up, a socket that never answers, no socket at all, and endpoints that are not unix sockets.

use super::*;
use cri::image_service_server::{ImageService as GrpcImageService, ImageServiceServer};
use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

/// A gRPC server offering only `runtime.v1.ImageService` (backed by a fake).
struct ImagesOnly(Arc<FakeRuntime>);

#[tonic::async_trait]
impl GrpcImageService for ImagesOnly {
    async fn list_images(
        &self,
        r: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        Ok(Response::new(self.0.list_images(r.into_inner()).await?))
    }
    async fn image_status(
        &self,
        r: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        Ok(Response::new(self.0.image_status(r.into_inner()).await?))
    }
    async fn pull_image(
        &self,
        r: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        Ok(Response::new(self.0.pull_image(r.into_inner()).await?))
    }
    async fn remove_image(
        &self,
        r: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        Ok(Response::new(self.0.remove_image(r.into_inner()).await?))
    }
    async fn image_fs_info(
        &self,
        r: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        Ok(Response::new(self.0.image_fs_info(r.into_inner()).await?))
    }
}

fn bind(dir: &tempfile::TempDir, name: &str) -> (UnixListener, String) {
    let path = dir.path().join(name);
    let listener = UnixListener::bind(&path).unwrap();
    (listener, format!("unix://{}", path.display()))
}

#[tokio::test]
async fn a_grpc_server_without_the_v1_runtime_service_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = bind(&dir, "images-only.sock");
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(io, _)| io), l))
    });
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ImageServiceServer::new(ImagesOnly(Arc::new(
                FakeRuntime::new(),
            ))))
            .serve_with_incoming(incoming),
    );
    let err = remote::connect(&endpoint, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains(&format!("runtime at {endpoint} does not speak CRI v1")),
        "{msg}"
    );
    server.abort();
}

#[tokio::test]
async fn a_socket_that_hangs_up_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = bind(&dir, "hangs-up.sock");
    let server = tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            drop(io);
        }
    });
    let err = remote::connect(&endpoint, Duration::from_secs(5))
        .await
        .unwrap_err();
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains(&format!("runtime at {endpoint} does not speak CRI v1")),
        "{msg}"
    );
    server.abort();
}

#[tokio::test]
async fn a_socket_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, endpoint) = bind(&dir, "silent.sock");
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((io, _)) = listener.accept().await {
            held.push(io);
        }
    });
    let start = Instant::now();
    let err = remote::connect(&endpoint, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    eprintln!("{err}");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        err.to_string().contains("did not answer Version in time"),
        "{err}"
    );
    server.abort();
}

#[tokio::test]
async fn no_socket_or_a_non_unix_endpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("unix://{}", dir.path().join("nothing.sock").display());
    let err = remote::connect(&missing, Duration::from_secs(1))
        .await
        .unwrap_err();
    eprintln!("{err}");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    for bad in ["tcp://127.0.0.1:10010", "", "unix://"] {
        let err = remote::connect(bad, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err}");
    }
    // A plain path works as well as a unix:// endpoint.
    let (path, _) = socket(&dir);
    let served = serve(&path, Arc::new(FakeRuntime::new())).await;
    let rt = remote::connect(path.to_str().unwrap(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(rt.endpoint(), path.to_str().unwrap());
    served.stop().await;
}
