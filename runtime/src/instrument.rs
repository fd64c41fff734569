//! The seam's one decorator: [`Instrumented`] wraps a [`RuntimeService`] and an
//! [`ImageService`], forwards every call to them unchanged, and tells an [`Observer`] how long
//! each took and whether it succeeded, under upstream's operation name (`run_podsandbox`,
//! `update_container`, ...). It knows nothing of metrics libraries: the kubelet's observer
//! turns the observations into `kubelet_runtime_operations_*`. The methods are expanded from
//! the CRI method list (`crate::rpcs`), so an RPC added there is forwarded and observed here.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::rpcs::for_each_cri_rpc;
use crate::{EventStream, ImageService, Result, RuntimeService, cri};

/// Told of every call an [`Instrumented`] runtime makes.
pub trait Observer: Send + Sync {
    /// One call of the CRI RPC that upstream's instrumented runtime names `operation` (the
    /// `operation_type` label: `"version"`, `"run_podsandbox"`, `"pull_image"`, ...) returned
    /// after `took`, with `Ok` if `ok`. For `GetContainerEvents` the call is the opening of
    /// the stream.
    fn observe(&self, operation: &'static str, took: Duration, ok: bool);
}

impl<O: Observer + ?Sized> Observer for &O {
    fn observe(&self, operation: &'static str, took: Duration, ok: bool) {
        (**self).observe(operation, took, ok);
    }
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn observe(&self, operation: &'static str, took: Duration, ok: bool) {
        (**self).observe(operation, took, ok);
    }
}

/// A runtime and an image service whose every call is forwarded and observed. Its answers,
/// errors included, are those of the services it wraps.
pub struct Instrumented<O> {
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    observer: O,
}

impl<O: Observer> Instrumented<O> {
    /// `runtime` and `images`, each call observed by `observer`.
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        observer: O,
    ) -> Self {
        Instrumented {
            runtime,
            images,
            observer,
        }
    }

    /// Awaits `call` and reports it to the observer as `operation`.
    async fn observed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let began = Instant::now();
        let result = call.await;
        self.observer
            .observe(operation, began.elapsed(), result.is_ok());
        result
    }
}

/// The [`for_each_cri_rpc!`](crate::rpcs) callback: every RPC of every section, forwarded to
/// the wrapped service and observed under its operation name.
macro_rules! instrumented_services {
    (
        {}
        RuntimeService {
            unary { $( $method:ident => $rpc:ident($req:ident -> $resp:ident) as $op:literal
                       within $base:ident $(+ $field:ident)?; )* }
            by_hand { $( $h_method:ident => $h_rpc:ident($h_req:ident -> $h_resp:ident)
                         as $h_op:literal; )* }
            streaming { $( $s_method:ident => $s_rpc:ident($s_req:ident -> $s_item:ident)
                           as $s_op:literal; )* }
        }
        ImageService {
            unary { $( $i_method:ident => $i_rpc:ident($i_req:ident -> $i_resp:ident)
                       as $i_op:literal within $i_base:ident $(+ $i_field:ident)?; )* }
        }
    ) => {
        #[async_trait::async_trait]
        impl<O: Observer> RuntimeService for Instrumented<O> {
            $(
                async fn $method(&self, req: cri::$req) -> Result<cri::$resp> {
                    self.observed($op, self.runtime.$method(req)).await
                }
            )*
            $(
                async fn $h_method(&self, req: cri::$h_req) -> Result<cri::$h_resp> {
                    self.observed($h_op, self.runtime.$h_method(req)).await
                }
            )*
            $(
                async fn $s_method(&self, req: cri::$s_req) -> Result<EventStream> {
                    self.observed($s_op, self.runtime.$s_method(req)).await
                }
            )*
        }

        #[async_trait::async_trait]
        impl<O: Observer> ImageService for Instrumented<O> {
            $(
                async fn $i_method(&self, req: cri::$i_req) -> Result<cri::$i_resp> {
                    self.observed($i_op, self.images.$i_method(req)).await
                }
            )*
        }
    };
}

for_each_cri_rpc!(instrumented_services);

#[cfg(all(test, feature = "fake"))]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::Code;
    use crate::fake::FakeRuntime;

    /// Records what it is told.
    #[derive(Default)]
    struct Log(Mutex<Vec<(&'static str, bool)>>);

    impl Observer for Log {
        fn observe(&self, operation: &'static str, _took: Duration, ok: bool) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((operation, ok));
        }
    }

    impl Log {
        fn take(&self) -> Vec<(&'static str, bool)> {
            std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
        }
    }

    fn instrumented(log: &Arc<Log>) -> (Instrumented<Arc<Log>>, Arc<FakeRuntime>) {
        let fake = Arc::new(FakeRuntime::new());
        (
            Instrumented::new(fake.clone(), fake.clone(), log.clone()),
            fake,
        )
    }

    #[tokio::test]
    async fn calls_are_forwarded_and_observed_under_upstreams_names() {
        let log = Arc::new(Log::default());
        let (rt, fake) = instrumented(&log);

        let version = rt.version(Default::default()).await.unwrap();
        assert_eq!(version.runtime_api_version, "v1");
        let req = cri::ContainerStatusRequest {
            container_id: "nope".into(),
            ..Default::default()
        };
        let err = rt.container_status(req.clone()).await.unwrap_err();
        let direct = fake.container_status(req).await.unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            (direct.code(), direct.message())
        );
        rt.run_pod_sandbox(Default::default()).await.unwrap_err();
        rt.list_images(Default::default()).await.unwrap();

        assert_eq!(
            log.take(),
            [
                ("version", true),
                ("container_status", false),
                ("run_podsandbox", false),
                ("list_images", true),
            ]
        );
    }

    /// The optional RPCs have default bodies in the trait: one missing from the list would
    /// be answered `Unimplemented` by the decorator instead of reaching the runtime.
    #[tokio::test]
    async fn the_optional_rpcs_reach_the_runtime() {
        let log = Arc::new(Log::default());
        let (rt, _) = instrumented(&log);

        let checkpoint = rt.checkpoint_container(Default::default()).await;
        let code = checkpoint.as_ref().err().map(crate::Error::code);
        assert_ne!(code, Some(Code::Unimplemented), "{checkpoint:?}");
        assert!(rt.get_container_events(Default::default()).await.is_ok());
        assert!(rt.list_metric_descriptors(Default::default()).await.is_ok());
        assert!(
            rt.list_pod_sandbox_metrics(Default::default())
                .await
                .is_ok()
        );

        let ops: Vec<_> = log.take().into_iter().map(|(op, _)| op).collect();
        assert_eq!(
            ops,
            [
                "checkpoint_container",
                "get_container_events",
                "list_metric_descriptors",
                "list_podsandbox_metrics",
            ]
        );
    }
}
