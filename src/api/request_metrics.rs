//! A tower layer over the kube client's service stack that counts and times every request
//! (`rest_client_requests_total{code,method,host}`, `rest_client_request_duration_seconds
//! {verb,host}`, client-go's names): the code once the response's head arrives, `<error>`
//! when none does; the duration to that point. Kube's own retry layer is inside it, so a
//! request retried there counts once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::{Layer, Service};

/// Counts the requests sent to `host` (the API server's `host:port`).
#[derive(Clone, Debug)]
pub struct RequestMetricsLayer {
    host: String,
}

impl RequestMetricsLayer {
    pub fn new(host: impl Into<String>) -> Self {
        RequestMetricsLayer { host: host.into() }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            host: self.host.clone(),
        }
    }
}

/// The service [`RequestMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct RequestMetrics<S> {
    inner: S,
    host: String,
}

impl<S, Q, B> Service<Request<Q>> for RequestMetrics<S>
where
    S: Service<Request<Q>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Q>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = self.host.clone();
        let began = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = res.as_ref().ok().map(|r| r.status().as_u16());
            crate::metrics::get().rest_request(&host, &method, code, began.elapsed());
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    #[tokio::test]
    async fn every_request_is_counted_by_code_method_and_host() {
        let svc = tower::service_fn(|req: Request<()>| async move {
            let code = if req.uri().path() == "/missing" {
                404
            } else {
                200
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(code)
                    .body(())
                    .expect("a response"),
            )
        });
        let mut svc = RequestMetricsLayer::new("unit.test:6443").layer(svc);
        let count = |code: &str, method: &str| {
            crate::metrics::get()
                .rest_client_requests
                .get_or_create(&crate::metrics::RestRequest {
                    code: code.into(),
                    method: method.into(),
                    host: "unit.test:6443".into(),
                })
                .get()
        };
        for (method, path) in [
            ("GET", "/a"),
            ("GET", "/missing"),
            ("PATCH", "/a"),
            ("GET", "/b"),
        ] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .expect("a request");
            svc.call(req).await.expect("answered");
        }
        assert_eq!(count("200", "GET"), 2);
        assert_eq!(count("404", "GET"), 1);
        assert_eq!(count("200", "PATCH"), 1);

        let failing =
            tower::service_fn(|_: Request<()>| async { Err::<Response<()>, _>("refused") });
        let mut failing = RequestMetricsLayer::new("unit.test:6443").layer(failing);
        let req = Request::builder()
            .method("PUT")
            .uri("/x")
            .body(())
            .expect("a request");
        assert!(failing.call(req).await.is_err());
        assert_eq!(count("<error>", "PUT"), 1);
        let text = crate::metrics::get().encode();
        assert!(
            text.contains(
                "rest_client_requests_total{code=\"404\",method=\"GET\",host=\"unit.test:6443\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"unit.test:6443\"} 3"
            ),
            "{text}"
        );
    }
}
