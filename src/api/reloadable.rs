//! A client whose credentials can change under it: every request goes to the client last
//! made from the kubeconfig, so a rotated client certificate is used from the next request on
//! without a restart. A request or watch already under way finishes on the connection it
//! has; a watch picks up the new identity when it reconnects.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use super::Error;

/// Makes the shared client read its kubeconfig again.
#[derive(Clone)]
pub struct Reloader {
    path: PathBuf,
    current: Arc<RwLock<kube::Client>>,
}

impl Reloader {
    /// Builds a client from the kubeconfig again and sends every request after this through
    /// it.
    pub async fn reload(&self) -> Result<(), Error> {
        let client = super::client_from_kubeconfig(&self.path).await?;
        match self.current.write() {
            Ok(mut c) => *c = client,
            Err(poisoned) => *poisoned.into_inner() = client,
        }
        Ok(())
    }
}

/// A client for `path` and the handle that reloads it.
pub async fn reloadable_client(path: &Path) -> Result<(kube::Client, Reloader), Error> {
    let first = super::client_from_kubeconfig(path).await?;
    let namespace = first.default_namespace().to_string();
    let current = Arc::new(RwLock::new(first));
    let client = kube::Client::new(Delegate(current.clone()), namespace);
    Ok((
        client,
        Reloader {
            path: path.to_path_buf(),
            current,
        },
    ))
}

/// The service under the shared client: each request to the current inner client.
#[derive(Clone)]
struct Delegate(Arc<RwLock<kube::Client>>);

type Reply = Result<http::Response<kube::client::Body>, kube::Error>;

impl tower::Service<http::Request<kube::client::Body>> for Delegate {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Reply> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let client = match self.0.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        Box::pin(async move { client.send(req).await })
    }
}
