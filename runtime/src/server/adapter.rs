//! The tonic service implementations behind the CRI server: each generated CRI v1 gRPC method
//! calls the same method of an `Arc<dyn RuntimeService>` / `Arc<dyn ImageService>` under a
//! deadline, and turns a `runtime::Error` into a `tonic::Status` (same code, same message). A
//! runtime that panics gives `Internal` for that call, never a dead connection or server. The
//! unary RPCs are expanded from the CRI method list (`crate::rpcs`); `ExecSync` and
//! `GetContainerEvents` are written here.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::ServerConfig;
use crate::cri::image_service_server::ImageService as GrpcImageService;
use crate::cri::runtime_service_server::RuntimeService as GrpcRuntimeService;
use crate::rpcs::{self, for_each_cri_rpc};
use crate::{ImageService, Result, RuntimeService, cri};

/// Serves `runtime.v1.RuntimeService` from a [`RuntimeService`].
pub(super) struct RuntimeAdapter {
    pub(super) inner: Arc<dyn RuntimeService>,
    pub(super) cfg: Arc<ServerConfig>,
    /// Turns true when the server stops; event streams end then, so that the graceful
    /// shutdown does not wait for them forever.
    pub(super) stopping: watch::Receiver<bool>,
}

/// Serves `runtime.v1.ImageService` from an [`ImageService`].
pub(super) struct ImageAdapter {
    pub(super) inner: Arc<dyn ImageService>,
    pub(super) cfg: Arc<ServerConfig>,
}

/// Runs one RPC of the runtime: `Ok` becomes the response, an `Err` its status, a panic
/// `Internal` and running past `deadline` `DeadlineExceeded` (the runtime's future is dropped,
/// which the trait contract allows).
pub(super) async fn call<T>(
    rpc: &'static str,
    deadline: Duration,
    fut: impl Future<Output = Result<T>> + Send,
) -> std::result::Result<Response<T>, Status> {
    match tokio::time::timeout(deadline, AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(Ok(resp))) => Ok(Response::new(resp)),
        Ok(Ok(Err(err))) => {
            tracing::debug!(rpc, "CRI call failed: {err}");
            Err(err.into())
        }
        Ok(Err(_panic)) => {
            tracing::error!(rpc, "the runtime panicked serving a CRI call");
            Err(Status::internal(format!("{rpc}: the runtime panicked")))
        }
        Err(_elapsed) => {
            tracing::warn!(rpc, ?deadline, "CRI call ran past its deadline");
            Err(Status::deadline_exceeded(format!(
                "{rpc} did not complete within {deadline:?}"
            )))
        }
    }
}

/// ExecSync's deadline: none (`Duration::MAX`, which `tokio::time::timeout` treats as no
/// timer) for a command without a timeout, else the request timeout on top of the command's.
pub(super) fn exec_sync_deadline(base: Duration, timeout: i64) -> Duration {
    if timeout > 0 {
        rpcs::deadline(base, timeout)
    } else {
        Duration::MAX
    }
}

/// The events stream as sent to the client.
type Events =
    Pin<Box<dyn Stream<Item = std::result::Result<cri::ContainerEventResponse, Status>> + Send>>;

/// The [`for_each_cri_rpc!`](crate::rpcs) callback: implements each generated server trait on
/// its adapter, one method per unary RPC calling the same method of the service under the
/// RPC's deadline, then the methods written by hand.
macro_rules! grpc_services {
    (
        { $($by_hand:tt)* }
        RuntimeService { unary { $($runtime:tt)* } $($runtime_rest:tt)* }
        ImageService { unary { $($images:tt)* } }
    ) => {
        grpc_services!(@impl GrpcRuntimeService for RuntimeAdapter,
            { $($runtime)* } { $($by_hand)* });
        grpc_services!(@impl GrpcImageService for ImageAdapter, { $($images)* } {});
    };
    (
        @impl $service:ident for $adapter:ident,
        { $( $method:ident => $rpc:ident($req:ident -> $resp:ident) as $op:literal
             within $base:ident $(+ $field:ident)?; )* }
        { $($by_hand:tt)* }
    ) => {
        #[tonic::async_trait]
        impl $service for $adapter {
            $(
                async fn $method(
                    &self,
                    request: Request<cri::$req>,
                ) -> std::result::Result<Response<cri::$resp>, Status> {
                    let req = request.into_inner();
                    let deadline = rpcs::deadline(self.cfg.$base, 0 $(+ req.$field)?);
                    call(stringify!($rpc), deadline, self.inner.$method(req)).await
                }
            )*
            $($by_hand)*
        }
    };
}

for_each_cri_rpc!(grpc_services {
    type GetContainerEventsStream = Events;

    /// A command without a timeout runs until it ends, as CRI says; one with a timeout gets
    /// the request timeout on top of its own.
    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> std::result::Result<Response<cri::ExecSyncResponse>, Status> {
        let req = request.into_inner();
        let deadline = exec_sync_deadline(self.cfg.request_timeout, req.timeout);
        call("ExecSync", deadline, self.inner.exec_sync(req)).await
    }

    /// The runtime's stream, passed through: an `Err` item becomes the stream's final status.
    /// The deadline covers opening the stream only; the stream itself lasts until the client
    /// goes away, the runtime ends it, or the server stops.
    async fn get_container_events(
        &self,
        request: Request<cri::GetEventsRequest>,
    ) -> std::result::Result<Response<Events>, Status> {
        let events = call(
            "GetContainerEvents",
            self.cfg.request_timeout,
            self.inner.get_container_events(request.into_inner()),
        )
        .await?
        .into_inner();
        let mut stopping = self.stopping.clone();
        let stopped = async move {
            // An error means the server is gone: stop as well.
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        let stream = AssertUnwindSafe(events)
            .catch_unwind()
            .map(|item| match item {
                Ok(event) => event.map_err(Status::from),
                Err(_panic) => {
                    tracing::error!("the runtime's event stream panicked");
                    Err(Status::internal("GetContainerEvents: the runtime panicked"))
                }
            })
            .take_until(stopped);
        Ok(Response::new(Box::pin(stream)))
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[tokio::test]
    async fn call_maps_results_errors_panics_and_deadlines() {
        let ok = call("T", Duration::from_secs(1), async { Ok(7) }).await;
        assert_eq!(ok.unwrap().into_inner(), 7);

        let err = call("T", Duration::from_secs(1), async {
            Err::<(), _>(Error::not_found("container \"x\""))
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "container \"x\"");

        let panicked = call("Boom", Duration::from_secs(1), async {
            if std::hint::black_box(true) {
                panic!("runtime bug");
            }
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(panicked.code(), tonic::Code::Internal);
        assert!(panicked.message().contains("Boom"), "{panicked:?}");

        let slow = call("Slow", Duration::from_millis(50), async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(slow.code(), tonic::Code::DeadlineExceeded);
        assert!(slow.message().contains("Slow"), "{slow:?}");
    }

    #[tokio::test]
    async fn exec_sync_without_a_timeout_has_no_deadline() {
        let base = Duration::from_millis(20);
        assert_eq!(exec_sync_deadline(base, 0), Duration::MAX);
        assert_eq!(exec_sync_deadline(base, -1), Duration::MAX);
        assert_eq!(exec_sync_deadline(base, 2), Duration::from_millis(2020));
        // Longer than the request timeout, and still answered.
        let long = call("ExecSync", exec_sync_deadline(base, 0), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(1)
        })
        .await;
        assert_eq!(long.unwrap().into_inner(), 1);
    }
}
