//! An in-memory CRI runtime for tests (feature `fake`).
//!
//! [`FakeRuntime`] implements both [`RuntimeService`](crate::RuntimeService)
//! and [`ImageService`](crate::ImageService) without running anything. It is
//! modelled on the behaviour of cri-api's `FakeRuntimeService` and on what
//! real runtimes (containerd) do where the two differ in ways a kubelet can
//! observe:
//!
//! * every RPC is recorded by its CRI name ([`FakeRuntime::called`]) and can be
//!   made to fail ([`FakeRuntime::inject_error`]);
//! * sandboxes and containers follow the CRI state machine (see below);
//! * ids are 64 hex characters; every call taking an id also accepts a unique
//!   prefix of one, as containerd does, and an ambiguous prefix is
//!   `InvalidArgument`;
//! * `GetContainerEvents` streams created/started/stopped/deleted events for
//!   containers and sandboxes (a sandbox's events carry the sandbox id as
//!   `container_id`, as containerd's do);
//! * images are identified by a deterministic fake digest of their reference.
//!
//! All state sits behind one mutex that is never held across an await, so
//! the fake may be shared (`Arc<FakeRuntime>`) and called concurrently.
//!
//! # Semantics
//!
//! Beyond the contract of the traits:
//!
//! * `RunPodSandbox` → `SANDBOX_READY`, with a fake IP unless host network.
//! * `StopPodSandbox` → `SANDBOX_NOTREADY`, IP released; RUNNING containers
//!   of the sandbox become EXITED with exit code 137 and reason `"Error"`
//!   (forcibly killed); CREATED ones stay CREATED.
//! * `CreateContainer` needs an existing, ready sandbox (`NotFound` /
//!   `FailedPrecondition`) and a config with metadata (`InvalidArgument`).
//!   The image is not checked. The container starts CREATED.
//! * `StartContainer` only from CREATED, in a ready sandbox
//!   (`FailedPrecondition` otherwise).
//! * `StopContainer`: a RUNNING container becomes EXITED with exit code 0
//!   and reason `"Completed"`; other states are left alone.
//! * `ExecSync`, `ReopenContainerLog` need a running container
//!   (`FailedPrecondition`); `ExecSync` returns what
//!   [`FakeRuntime::set_exec_sync_response`] set.
//! * `Exec`/`Attach` need a running container, `PortForward` an existing
//!   sandbox; they return fake URLs.
//! * Stats are zero-valued; `ListContainerStats` covers running containers
//!   only.
//! * `Version` reports [`FAKE_RUNTIME_NAME`] and API version `v1`; `Status`
//!   reports the conditions and handlers set by [`FakeRuntime::set_runtime_conditions`] and
//!   [`FakeRuntime::set_runtime_handlers`];
//!   `RuntimeConfig` reports the cgroupfs driver; `UpdateRuntimeConfig`
//!   stores the pod CIDR ([`FakeRuntime::pod_cidr`]).
//! * `CheckpointContainer` succeeds for an existing container; the metrics
//!   RPCs return empty lists.
//! * Images are never downloaded: `PullImage` records an image whose id is a
//!   deterministic fake digest (`sha256:` + 64 hex) of the reference, with
//!   `:latest` added to a reference lacking tag and digest (no other
//!   normalisation). Images are found by id (with or without `sha256:`),
//!   repo tag or repo digest. `ImageStatus` of an unknown image has
//!   `image: None`; `RemoveImage` of an unknown image succeeds; `ImageFsInfo`
//!   reports one image filesystem at [`FAKE_IMAGE_FS_MOUNTPOINT`] whose usage
//!   is the sum of the image sizes ([`FAKE_IMAGE_SIZE`] each).

mod images;
mod model;
mod query;
mod runtime;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::broadcast;

use crate::cri;
use crate::error::{Error, Result};

pub use images::FAKE_IMAGE_FS_MOUNTPOINT;
pub use model::{FakeContainer, FakeSandbox};

/// The runtime name reported by `Version`.
pub const FAKE_RUNTIME_NAME: &str = "fake-runtime";
/// The runtime version reported by `Version`.
pub const FAKE_RUNTIME_VERSION: &str = "0.1.0";
/// The size every fake image reports, in bytes.
pub const FAKE_IMAGE_SIZE: u64 = 1 << 20;

/// Capacity of the event channel; slow subscribers skip missed events.
const EVENT_BUFFER: usize = 1024;

/// An in-memory implementation of the CRI traits for tests.
pub struct FakeRuntime {
    state: Mutex<State>,
    events: broadcast::Sender<cri::ContainerEventResponse>,
}

/// Everything behind the mutex.
pub(crate) struct State {
    pub(crate) calls: Vec<String>,
    pub(crate) errors: HashMap<String, VecDeque<Error>>,
    /// In creation order.
    pub(crate) sandboxes: Vec<FakeSandbox>,
    /// In creation order.
    pub(crate) containers: Vec<FakeContainer>,
    /// In pull order.
    pub(crate) images: Vec<cri::Image>,
    pub(crate) exec_sync: cri::ExecSyncResponse,
    pub(crate) conditions: Vec<cri::RuntimeCondition>,
    pub(crate) handlers: Vec<cri::RuntimeHandler>,
    /// What a verbose `Status` reports in `info`.
    pub(crate) status_info: HashMap<String, String>,
    pub(crate) pod_cidr: Option<String>,
    /// Images whose pulls hang until [`FakeRuntime::release_pulls`].
    pub(crate) held_pulls: HashMap<String, tokio::sync::watch::Sender<bool>>,
    /// RPCs (`"ListContainers"`) that hang until [`FakeRuntime::release_rpc`].
    pub(crate) held_rpcs: HashMap<String, tokio::sync::watch::Sender<bool>>,
    /// Events are not sent (a stalled stream) while set.
    pub(crate) events_muted: bool,
    /// How long a StopContainer of a running container takes.
    pub(crate) stop_delay: std::time::Duration,
    /// Every StopContainer of a running container: (id, began, ended) on tokio's clock.
    pub(crate) stops: Vec<(String, tokio::time::Instant, tokio::time::Instant)>,
    counter: u64,
    id_hasher: std::hash::RandomState,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("FakeRuntime")
            .field("sandboxes", &st.sandboxes.len())
            .field("containers", &st.containers.len())
            .field("images", &st.images.len())
            .field("calls", &st.calls.len())
            .finish()
    }
}

impl FakeRuntime {
    /// An empty runtime: no sandboxes, containers or images; `Status`
    /// reports `RuntimeReady` and `NetworkReady`; `ExecSync` succeeds with no
    /// output.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        FakeRuntime {
            state: Mutex::new(State {
                calls: Vec::new(),
                errors: HashMap::new(),
                sandboxes: Vec::new(),
                containers: Vec::new(),
                images: Vec::new(),
                exec_sync: cri::ExecSyncResponse::default(),
                conditions: vec![
                    condition("RuntimeReady", true),
                    condition("NetworkReady", true),
                ],
                handlers: Vec::new(),
                status_info: HashMap::new(),
                pod_cidr: None,
                held_pulls: HashMap::new(),
                held_rpcs: HashMap::new(),
                events_muted: false,
                stop_delay: std::time::Duration::ZERO,
                stops: Vec::new(),
                counter: 0,
                id_hasher: std::hash::RandomState::new(),
            }),
            events,
        }
    }

    /// The RPCs called so far, in order, by CRI name (e.g. `"RunPodSandbox"`,
    /// `"ImageFsInfo"`). Failed calls are recorded too.
    pub fn called(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Checks that the recorded calls are exactly `expected`, in order.
    /// The error describes the difference.
    pub fn assert_calls(&self, expected: &[&str]) -> std::result::Result<(), String> {
        let calls = self.called();
        if calls
            .iter()
            .map(String::as_str)
            .eq(expected.iter().copied())
        {
            Ok(())
        } else {
            Err(format!("expected calls {expected:?}, got {calls:?}"))
        }
    }

    /// Makes a future call of `rpc` (CRI name, e.g. `"StartContainer"`) fail
    /// with `err`. Errors queue per RPC and are consumed first in, first out,
    /// one per call; the failing call is still recorded and has no effect.
    pub fn inject_error(&self, rpc: &str, err: Error) {
        self.lock()
            .errors
            .entry(rpc.to_string())
            .or_default()
            .push_back(err);
    }

    /// Snapshot of the sandboxes, in creation order.
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        self.lock().sandboxes.clone()
    }

    /// Snapshot of the containers, in creation order.
    pub fn containers(&self) -> Vec<FakeContainer> {
        self.lock().containers.clone()
    }

    /// Snapshot of the images, in pull order.
    pub fn images(&self) -> Vec<cri::Image> {
        self.lock().images.clone()
    }

    /// Replaces the image store with one image per reference (a reference
    /// without tag or digest gets `:latest`).
    pub fn set_fake_images(&self, references: &[&str]) {
        let images = references.iter().map(|r| images::make_image(r)).collect();
        self.lock().images = images;
    }

    /// Marks the image `reference` names pinned (or not), as a runtime pins its sandbox image.
    pub fn set_image_pinned(&self, reference: &str, pinned: bool) {
        let mut st = self.lock();
        let id = images::find(&st.images, reference).map(|i| i.id.clone());
        for img in st.images.iter_mut().filter(|i| Some(&i.id) == id.as_ref()) {
            img.pinned = pinned;
        }
    }

    /// Simulates the container's process exiting on its own: the container
    /// (id or unique prefix) becomes EXITED with `exit_code` and `reason`
    /// whatever its state, and a stopped event is emitted. `NotFound` for an
    /// unknown container.
    pub fn set_container_exited(&self, id: &str, exit_code: i32, reason: &str) -> Result<()> {
        let mut st = self.lock();
        let now = now_ns();
        let c = st.container_mut(id)?;
        c.exit(now, exit_code, reason);
        let (cid, sid) = (c.id.clone(), c.pod_sandbox_id.clone());
        self.emit(
            &st,
            &sid,
            &cid,
            cri::ContainerEventType::ContainerStoppedEvent,
        );
        Ok(())
    }

    /// Makes pulls of `image` (as requested) hang until [`release_pulls`](Self::release_pulls).
    pub fn hold_pulls(&self, image: &str) {
        self.lock()
            .held_pulls
            .insert(image.to_string(), tokio::sync::watch::channel(false).0);
    }

    /// Lets the held pulls of `image` go on.
    pub fn release_pulls(&self, image: &str) {
        if let Some(held) = self.lock().held_pulls.remove(image) {
            held.send_replace(true);
        }
    }

    /// Makes calls of `rpc` (`"ListContainers"`) hang until [`release_rpc`](Self::release_rpc).
    pub fn hold_rpc(&self, rpc: &str) {
        self.lock()
            .held_rpcs
            .insert(rpc.to_string(), tokio::sync::watch::channel(false).0);
    }

    /// Lets the held calls of `rpc` go on.
    pub fn release_rpc(&self, rpc: &str) {
        if let Some(held) = self.lock().held_rpcs.remove(rpc) {
            held.send_replace(true);
        }
    }

    /// Waits while `rpc` is held.
    pub(crate) async fn gate(&self, rpc: &str) {
        let held = self.lock().held_rpcs.get(rpc).map(|h| h.subscribe());
        if let Some(mut released) = held {
            let _ = released.wait_for(|r| *r).await;
        }
    }

    /// Stops (true) or resumes (false) sending events on the open streams, which stay open: a
    /// stalled event stream.
    pub fn mute_events(&self, muted: bool) {
        self.lock().events_muted = muted;
    }

    /// Makes StopContainer of a running container take `d` (tokio's clock) before it exits.
    pub fn set_stop_delay(&self, d: std::time::Duration) {
        self.lock().stop_delay = d;
    }

    /// Every StopContainer of a running container so far: id, when it began and ended.
    pub fn stops(&self) -> Vec<(String, tokio::time::Instant, tokio::time::Instant)> {
        self.lock().stops.clone()
    }

    /// Sets what every successful `ExecSync` returns.
    pub fn set_exec_sync_response(&self, response: cri::ExecSyncResponse) {
        self.lock().exec_sync = response;
    }

    /// Sets the conditions `Status` reports (default: `RuntimeReady` and
    /// `NetworkReady`, both true).
    pub fn set_runtime_conditions(&self, conditions: Vec<cri::RuntimeCondition>) {
        self.lock().conditions = conditions;
    }

    /// Sets the runtime handlers (and their features) `Status` reports (default: none).
    pub fn set_runtime_handlers(&self, handlers: Vec<cri::RuntimeHandler>) {
        self.lock().handlers = handlers;
    }

    /// Sets what a verbose `Status` reports in `info` (as containerd its `config` JSON).
    pub fn set_status_info(&self, info: HashMap<String, String>) {
        self.lock().status_info = info;
    }

    /// The pod CIDR last set by `UpdateRuntimeConfig`, if any.
    pub fn pod_cidr(&self) -> Option<String> {
        self.lock().pod_cidr.clone()
    }

    /// Locks the state; a panic in another test thread does not poison it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a call of `rpc` and pops an injected error for it, if any.
    pub(crate) fn begin(&self, rpc: &str) -> Result<MutexGuard<'_, State>> {
        tracing::trace!(rpc, "fake runtime call");
        let mut st = self.lock();
        st.calls.push(rpc.to_string());
        match st.errors.get_mut(rpc).and_then(VecDeque::pop_front) {
            Some(err) => Err(err),
            None => Ok(st),
        }
    }

    /// Subscribes to future container events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<cri::ContainerEventResponse> {
        self.events.subscribe()
    }

    /// Broadcasts an event about `container_id` (which may be the sandbox id
    /// itself) in sandbox `sandbox_id`. Does nothing if the sandbox is gone.
    pub(crate) fn emit(
        &self,
        st: &State,
        sandbox_id: &str,
        container_id: &str,
        kind: cri::ContainerEventType,
    ) {
        if let Some(sb) = st.sandboxes.iter().find(|s| s.id == sandbox_id) {
            self.emit_for(st, sb, container_id, kind);
        }
    }

    /// Like [`emit`](Self::emit) with the sandbox given (it may already have
    /// been taken out of the state).
    pub(crate) fn emit_for(
        &self,
        st: &State,
        sandbox: &FakeSandbox,
        container_id: &str,
        kind: cri::ContainerEventType,
    ) {
        if self.events.receiver_count() == 0 || st.events_muted {
            return;
        }
        let event = cri::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: Some(sandbox.status()),
            containers_statuses: st
                .containers
                .iter()
                .filter(|c| c.pod_sandbox_id == sandbox.id)
                .map(FakeContainer::status)
                .collect(),
        };
        // No receiver left is not an error: nobody is watching.
        let _ = self.events.send(event);
    }
}

impl State {
    /// A fresh id: 64 hex characters, unique within this runtime.
    pub(crate) fn new_id(&mut self) -> String {
        loop {
            self.counter += 1;
            let mut id = String::with_capacity(64);
            for salt in 0u8..4 {
                let word = self.id_hasher.hash_one((self.counter, salt));
                let _ = write!(id, "{word:016x}");
            }
            let used = self.sandboxes.iter().any(|s| s.id == id)
                || self.containers.iter().any(|c| c.id == id);
            if !used {
                return id;
            }
        }
    }

    /// A sequence number for fake IP addresses.
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Index of the sandbox with id (or unique id prefix) `id`.
    pub(crate) fn find_sandbox(&self, id: &str) -> Result<Option<usize>> {
        resolve(self.sandboxes.iter().map(|s| s.id.as_str()), id, "sandbox")
    }

    /// Index of the container with id (or unique id prefix) `id`.
    pub(crate) fn find_container(&self, id: &str) -> Result<Option<usize>> {
        resolve(
            self.containers.iter().map(|c| c.id.as_str()),
            id,
            "container",
        )
    }

    /// The sandbox `id`, or `NotFound`.
    pub(crate) fn sandbox(&self, id: &str) -> Result<&FakeSandbox> {
        let i = self.find_sandbox(id)?;
        i.and_then(|i| self.sandboxes.get(i))
            .ok_or_else(|| Error::not_found(format!("pod sandbox {id:?} not found")))
    }

    /// The container `id`, or `NotFound`.
    pub(crate) fn container(&self, id: &str) -> Result<&FakeContainer> {
        let i = self.find_container(id)?;
        i.and_then(|i| self.containers.get(i))
            .ok_or_else(|| Error::not_found(format!("container {id:?} not found")))
    }

    /// The container `id`, mutably, or `NotFound`.
    pub(crate) fn container_mut(&mut self, id: &str) -> Result<&mut FakeContainer> {
        let i = self.find_container(id)?;
        i.and_then(|i| self.containers.get_mut(i))
            .ok_or_else(|| Error::not_found(format!("container {id:?} not found")))
    }
}

/// Finds `wanted` among `ids`: an exact match, else the single id it is a
/// prefix of. `Ok(None)` if nothing matches; `InvalidArgument` if `wanted`
/// is empty or a prefix of several ids.
fn resolve<'a>(
    ids: impl Iterator<Item = &'a str> + Clone,
    wanted: &str,
    kind: &str,
) -> Result<Option<usize>> {
    if wanted.is_empty() {
        return Err(Error::invalid_argument(format!(
            "{kind} id must not be empty"
        )));
    }
    if let Some(i) = ids.clone().position(|id| id == wanted) {
        return Ok(Some(i));
    }
    let mut found = None;
    for (i, id) in ids.enumerate() {
        if id.starts_with(wanted) {
            if found.is_some() {
                return Err(Error::invalid_argument(format!(
                    "{kind} id prefix {wanted:?} is ambiguous"
                )));
            }
            found = Some(i);
        }
    }
    Ok(found)
}

/// Nanoseconds since the Unix epoch, on tokio's clock (so tests with a paused clock see
/// the times they advanced to).
pub(crate) fn now_ns() -> i64 {
    crate::clock::now_ns()
}

fn condition(kind: &str, status: bool) -> cri::RuntimeCondition {
    cri::RuntimeCondition {
        r#type: kind.to_string(),
        status,
        reason: String::new(),
        message: String::new(),
    }
}
