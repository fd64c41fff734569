//! [`RuntimeService`] and [`ImageService`] for [`RemoteRuntime`]: each method is the same RPC
//! on the runtime's `runtime.v1.RuntimeService` or `runtime.v1.ImageService`, under the
//! deadline described on [`super::RemoteConfig`]. The unary RPCs are expanded from the CRI
//! method list ([`for_each_cri_rpc!`]); `ExecSync` and `GetContainerEvents` are written here.
//!
//! [`for_each_cri_rpc!`]: crate::rpcs

use futures::StreamExt;

use super::{RemoteRuntime, status_error, unary};
use crate::rpcs::{self, for_each_cri_rpc};
use crate::{EventStream, ImageService, Result, RuntimeService, cri};

/// The [`for_each_cri_rpc!`](crate::rpcs) callback: one impl per service, the unary RPCs
/// sent through the service's tonic client (`self.runtime`, `self.images`), then the methods
/// written by hand.
macro_rules! remote_services {
    (
        { $($by_hand:tt)* }
        RuntimeService { unary { $($runtime:tt)* } $($runtime_rest:tt)* }
        ImageService { unary { $($images:tt)* } }
    ) => {
        remote_services!(@impl RuntimeService, runtime, { $($runtime)* } { $($by_hand)* });
        remote_services!(@impl ImageService, images, { $($images)* } {});
    };
    (
        @impl $service:ident, $client:ident,
        { $( $method:ident => $rpc:ident($req:ident -> $resp:ident) as $op:literal
             within $base:ident $(+ $field:ident)?; )* }
        { $($by_hand:tt)* }
    ) => {
        #[async_trait::async_trait]
        impl $service for RemoteRuntime {
            $(
                async fn $method(&self, req: cri::$req) -> Result<cri::$resp> {
                    let deadline = Some(rpcs::deadline(self.cfg.$base, 0 $(+ req.$field)?));
                    let req = self.request(stringify!($rpc), req, deadline)?;
                    unary(stringify!($rpc), deadline, self.$client.clone().$method(req)).await
                }
            )*
            $($by_hand)*
        }
    };
}

for_each_cri_rpc!(remote_services {
    /// No deadline when the command has none (`timeout` 0), else the request timeout on top
    /// of the command's.
    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
        let deadline = if req.timeout > 0 { self.deadline(req.timeout) } else { None };
        let req = self.request("ExecSync", req, deadline)?;
        unary("ExecSync", deadline, self.runtime.clone().exec_sync(req)).await
    }

    /// The runtime's event stream; opening it is bounded by the request timeout, the stream
    /// itself is not. It ends when the runtime ends it or the connection is lost (with an
    /// `Unavailable` or the runtime's status as its last item).
    async fn get_container_events(&self, req: cri::GetEventsRequest) -> Result<EventStream> {
        let rpc = "GetContainerEvents";
        let req = self.request(rpc, req, None)?;
        let mut client = self.runtime.clone();
        let stream = unary(rpc, self.deadline(0), client.get_container_events(req)).await?;
        Ok(stream.map(|item| item.map_err(|s| status_error(rpc, None, s))).boxed())
    }
});
