//! The image manager (upstream's `images.imageManager`): makes sure a container's image is on
//! the node as its `imagePullPolicy` says before the container is created, with the pull
//! back-off (`ErrImagePull`, then `ImagePullBackOff`), the node's pull limit
//! (`serializeImagePulls`, `maxParallelImagePulls`) and the pod's pull secrets tried in turn.
//! Every outcome is an event on the container; a failure is why the container waits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use runtime::{ImageService, cri};
use tokio::sync::Semaphore;

use super::backoff::{self, Backoff};
use super::pull_secrets::{Keyring, repository};
use crate::api::events::{EventType, PodEvents, Reason};
use crate::model::{PodRef, PullPolicy, Waiting, WaitingReason};
use crate::util::lock;

/// Why a container waits for its image, and for how long at least (in a back-off).
pub type ImageWait = (Waiting, Option<Duration>);

/// How image pulls share the node: one at a time (`serializeImagePulls`, upstream's default),
/// at most N at once (`maxParallelImagePulls`), or unbounded. Pods that need no pull never wait.
#[derive(Clone)]
pub struct ImagePulls {
    limit: Option<Arc<Semaphore>>,
}

impl ImagePulls {
    /// `serialize`: one pull at a time; else at most `max_parallel` (unbounded when `None`).
    pub fn new(serialize: bool, max_parallel: Option<u32>) -> Self {
        let permits = if serialize { Some(1) } else { max_parallel };
        ImagePulls {
            limit: permits.map(|n| Arc::new(Semaphore::new(n.max(1) as usize))),
        }
    }
}

impl Default for ImagePulls {
    fn default() -> Self {
        ImagePulls::new(true, None)
    }
}

/// One container's image to make sure of.
pub struct ImageRequest<'a> {
    pub pod: &'a Pod,
    pub who: &'a PodRef,
    pub container: &'a Container,
    /// The sandbox the container will run in (CRI passes it with a pull).
    pub sandbox: &'a cri::PodSandboxConfig,
    /// The pod's `imagePullSecrets` as read for this sync.
    pub pull_secrets: &'a [Secret],
    pub events: &'a dyn PodEvents,
    pub now: SystemTime,
}

impl ImageRequest<'_> {
    fn say(&self, kind: EventType, reason: Reason, message: String) {
        let name = Some(self.container.name.as_str());
        self.events.event(self.pod, name, kind, reason, message);
    }
}

/// Pulls images for the pods' containers through the runtime's image service.
pub struct ImageManager {
    images: Arc<dyn ImageService>,
    /// Pull back-off per (pod, image).
    backoff: Mutex<Backoff>,
    pulls: ImagePulls,
}

impl ImageManager {
    pub fn new(images: Arc<dyn ImageService>, pulls: ImagePulls) -> Self {
        ImageManager {
            images,
            backoff: Mutex::new(Backoff::new(backoff::INITIAL, backoff::MAX)),
            pulls,
        }
    }

    /// The image service underneath.
    pub fn service(&self) -> &dyn ImageService {
        self.images.as_ref()
    }

    /// Forgets the pull back-offs of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        lock(&self.backoff).forget_pod(uid);
    }

    /// Drops the pull back-offs nobody needs any more.
    pub fn gc(&self, now: SystemTime) {
        lock(&self.backoff).gc(now);
    }

    /// Makes sure the container's image is there as its pull policy says: the image's ref, or
    /// why the container waits.
    pub async fn ensure(&self, req: &ImageRequest<'_>) -> Result<String, ImageWait> {
        let image = req.container.image.clone().unwrap_or_default();
        let policy = PullPolicy::of(req.container);
        if policy != PullPolicy::Always {
            if let Some(id) = self.present(req, &image).await? {
                return Ok(id);
            }
            if policy == PullPolicy::Never {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                req.say(
                    EventType::Warning,
                    Reason::ErrImageNeverPull,
                    message.clone(),
                );
                let waiting = Waiting::new(WaitingReason::ErrImageNeverPull, message);
                return Err((waiting, None));
            }
        }
        let key = backoff::key(&req.who.uid, "image", &image);
        // A pull that failed recently is not tried again before its back-off ends.
        if let Some(left) = lock(&self.backoff).remaining(&key, req.now) {
            let message = format!("Back-off pulling image {image:?}");
            req.say(EventType::Normal, Reason::BackOff, message.clone());
            let waiting = Waiting::new(WaitingReason::ImagePullBackOff, message);
            return Err((waiting, Some(left)));
        }
        self.pull(req, &image, &key).await
    }

    /// The image's id when the node has it (with a `Pulled` event saying so).
    async fn present(
        &self,
        req: &ImageRequest<'_>,
        image: &str,
    ) -> Result<Option<String>, ImageWait> {
        let status = self
            .images
            .image_status(cri::ImageStatusRequest {
                image: Some(spec_of(image)),
                verbose: false,
            })
            .await
            .map_err(|e| {
                (
                    Waiting::new(WaitingReason::ImageInspectError, e.to_string()),
                    None,
                )
            })?;
        Ok(status.image.map(|img| {
            req.say(
                EventType::Normal,
                Reason::PulledImage,
                format!("Container image {image:?} already present on machine"),
            );
            img.id
        }))
    }

    /// Pulls the image within the node's pull limit, recording the outcome in the back-off.
    async fn pull(
        &self,
        req: &ImageRequest<'_>,
        image: &str,
        key: &str,
    ) -> Result<String, ImageWait> {
        req.say(
            EventType::Normal,
            Reason::PullingImage,
            format!("Pulling image {image:?}"),
        );
        let queued = Instant::now();
        let startup = &crate::metrics::get().pod_startup;
        startup.pull_started(&req.who.uid, SystemTime::now());
        let _permit = match &self.pulls.limit {
            Some(sem) => Some(sem.clone().acquire_owned().await.map_err(|e| {
                (
                    Waiting::new(WaitingReason::ErrImagePull, e.to_string()),
                    None,
                )
            })?),
            None => None,
        };
        let began = Instant::now();
        match self.pull_with_secrets(req, image).await {
            Ok(image_ref) => {
                startup.pull_finished(&req.who.uid, SystemTime::now());
                lock(&self.backoff).reset(key);
                req.say(
                    EventType::Normal,
                    Reason::PulledImage,
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s ({:.3}s including waiting)",
                        began.elapsed().as_secs_f64(),
                        queued.elapsed().as_secs_f64()
                    ),
                );
                Ok(image_ref)
            }
            Err(e) => {
                lock(&self.backoff).record_restart(key, req.now);
                let message = e.to_string();
                req.say(
                    EventType::Warning,
                    Reason::Failed,
                    format!("Failed to pull image {image:?}: {message}"),
                );
                req.say(
                    EventType::Warning,
                    Reason::Failed,
                    "Error: ErrImagePull".into(),
                );
                let left = lock(&self.backoff).delay(key, req.now);
                Err((Waiting::new(WaitingReason::ErrImagePull, message), left))
            }
        }
    }

    /// As upstream: without matching credentials one anonymous pull, else each in turn until
    /// one succeeds (the errors of all when none does).
    async fn pull_with_secrets(
        &self,
        req: &ImageRequest<'_>,
        image: &str,
    ) -> runtime::Result<String> {
        let (ring, bad) = Keyring::from_secrets(req.pull_secrets);
        for b in bad {
            tracing::warn!(pod = %req.who.full_name(), "unreadable image pull secret {b}");
        }
        let creds = ring.lookup(&repository(image));
        let mut pulled = Err(runtime::Error::internal("no pull attempted"));
        let mut errors = Vec::new();
        for auth in creds.into_iter().map(Some).chain(std::iter::once(None)) {
            if auth.is_none() && !errors.is_empty() {
                break;
            }
            pulled = self
                .images
                .pull_image(cri::PullImageRequest {
                    image: Some(spec_of(image)),
                    auth,
                    sandbox_config: Some(req.sandbox.clone()),
                })
                .await;
            match &pulled {
                Ok(_) => break,
                Err(e) => errors.push(e.to_string()),
            }
        }
        match pulled {
            Ok(r) => Ok(r.image_ref),
            Err(e) if errors.len() > 1 => Err(runtime::Error::new(
                e.code(),
                format!("[{}]", errors.join(", ")),
            )),
            Err(e) => Err(e),
        }
    }
}

/// The CRI spec naming `image`.
fn spec_of(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}
