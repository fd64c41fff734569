//! What a scenario runs against: one runtime ([`Target`]), what the run prepared on it
//! ([`Env`]: the test image, the label, where pods log, whether pods get a network of their own)
//! and the calls the scenarios make, each with a deadline and labelled so that everything the
//! run creates can be found and removed again.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::{ImageService, RuntimeService, cri};

use crate::outcome::{OrFail, Step, Stop, ensure};

/// The label every sandbox and container of a run carries, with the run's id as its value.
pub const RUN_LABEL: &str = "io.nodelet.cri-check";
/// The label naming the scenario that made a sandbox or container.
pub const SCENARIO_LABEL: &str = "io.nodelet.cri-check.scenario";

/// One CRI runtime under check.
#[derive(Clone)]
pub struct Target {
    /// How the user named it (`unix:///run/containerd/containerd.sock`); the report's key.
    pub endpoint: String,
    pub rt: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    /// The socket the runtime serves, for finding its process (bench); none for a runtime in
    /// this process.
    pub socket: Option<PathBuf>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// The test image as the runtime holds it.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// The reference containers are created with (as the user gave it, or as the run's
    /// registry serves it).
    pub reference: String,
    /// The runtime's image id.
    pub id: String,
    /// The runtime's tag for it (one of its `repo_tags`), when the reference has one.
    pub repo_tag: Option<String>,
}

/// What a run prepared on one runtime, shared by its scenarios.
#[derive(Debug, Clone)]
pub struct Env {
    pub run_id: String,
    pub image: TestImage,
    /// Pods' log directories go below it.
    pub log_root: PathBuf,
    /// The host directories scenarios mount into containers go below it.
    pub host_root: PathBuf,
    /// Why pods get no network namespace of their own (the runtime's NetworkReady condition is
    /// false), or `None` when they do.
    pub no_pod_network: Option<String>,
    /// Deadline of each call (a stop or exec gets its own timeout on top).
    pub call_timeout: Duration,
}

/// A pod sandbox the scenario made: its id and the config it was made with.
pub type Pod = (String, cri::PodSandboxConfig);

/// An ExecSync's result.
#[derive(Debug)]
pub struct Exec {
    pub out: String,
    pub err: String,
    pub code: i32,
}

/// One scenario on one runtime.
pub struct Ctx<'a> {
    pub target: &'a Target,
    pub env: &'a Env,
    pub scenario: &'a str,
}

impl Ctx<'_> {
    pub fn rt(&self) -> &dyn RuntimeService {
        self.target.rt.as_ref()
    }

    pub fn images(&self) -> &dyn ImageService {
        self.target.images.as_ref()
    }

    /// The test image's reference.
    pub fn image(&self) -> &str {
        &self.env.image.reference
    }

    /// Whether pods get a network namespace of their own.
    pub fn has_pod_network(&self) -> bool {
        self.env.no_pod_network.is_none()
    }

    /// Skips the scenario unless pods get a network namespace of their own.
    pub fn needs_pod_network(&self) -> Step {
        match &self.env.no_pod_network {
            None => Ok(()),
            Some(why) => Err(Stop::Skip(why.clone())),
        }
    }

    /// `fut` (the call `what`) within the deadline plus `extra`: the runtime's own answer, or
    /// the scenario's failure when it does not come.
    pub async fn call<T>(
        &self,
        what: &str,
        extra: Duration,
        fut: impl Future<Output = runtime::Result<T>>,
    ) -> Step<runtime::Result<T>> {
        let deadline = self.env.call_timeout + extra;
        tokio::time::timeout(deadline, fut)
            .await
            .map_err(|_| Stop::Fail(format!("{what} did not answer within {deadline:?}")))
    }

    /// The run's and the scenario's labels.
    pub fn labels(&self) -> HashMap<String, String> {
        [
            (RUN_LABEL.to_string(), self.env.run_id.clone()),
            (SCENARIO_LABEL.to_string(), self.scenario.to_string()),
        ]
        .into()
    }

    /// `pairs` as a label selector, with the run's and the scenario's labels.
    pub fn selector(&self, pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut labels = self.labels();
        labels.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        labels
    }

    /// Where pod `name` logs.
    /// A host directory of the scenario's, for mounts (not created here).
    pub fn host_dir(&self, name: &str) -> PathBuf {
        self.env.host_root.join(self.scenario).join(name)
    }

    pub fn log_dir(&self, name: &str) -> PathBuf {
        self.env.log_root.join(self.scenario).join(name)
    }

    /// A pod `name` on the pod network (its own network namespace and hostname), labelled
    /// `app=name` and annotated; hostNetwork where the runtime has no pod network.
    pub fn pod_config(&self, name: &str) -> cri::PodSandboxConfig {
        if !self.has_pod_network() {
            return self.host_network_pod(name);
        }
        self.own_network_pod(name)
    }

    /// A pod `name` with a network namespace of its own, whether or not the runtime says its
    /// network is ready.
    pub fn own_network_pod(&self, name: &str) -> cri::PodSandboxConfig {
        let mut labels = self.labels();
        labels.insert("app".into(), name.into());
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("{}-{}-{name}", self.env.run_id, self.scenario),
                namespace: format!("cri-check-{}", self.env.run_id),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.log_dir(name).to_string_lossy().into_owned(),
            labels,
            annotations: [("cri-check/pod".to_string(), name.to_string())].into(),
            ..Default::default()
        }
    }

    /// A hostNetwork pod `name`, as the kubelet sends it: no hostname, since the pod shares
    /// the node's UTS namespace with its network.
    pub fn host_network_pod(&self, name: &str) -> cri::PodSandboxConfig {
        let mut cfg = self.own_network_pod(name);
        cfg.hostname = String::new();
        cfg.linux = Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        cfg
    }

    /// A container `name` of the test image running `cmd`, labelled `container=name`, logging
    /// to `name/0.log` in its pod's log dir.
    pub fn container_config(&self, name: &str, cmd: &[&str]) -> cri::ContainerConfig {
        let mut labels = self.labels();
        labels.insert("container".into(), name.into());
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image().into(),
                ..Default::default()
            }),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}/0.log"),
            labels,
            ..Default::default()
        }
    }

    pub async fn try_run_pod(&self, cfg: &cri::PodSandboxConfig) -> Step<runtime::Result<Pod>> {
        let req = cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        };
        let r = self
            .call(
                "RunPodSandbox",
                Duration::ZERO,
                self.rt().run_pod_sandbox(req),
            )
            .await?;
        Ok(r.map(|r| (r.pod_sandbox_id, cfg.clone())))
    }

    pub async fn run_pod(&self, cfg: cri::PodSandboxConfig) -> Step<Pod> {
        self.try_run_pod(&cfg).await?.or_fail("RunPodSandbox")
    }

    /// Runs [`Ctx::pod_config`]`(name)`.
    pub async fn pod(&self, name: &str) -> Step<Pod> {
        self.run_pod(self.pod_config(name)).await
    }

    pub async fn create(
        &self,
        pod: &Pod,
        config: cri::ContainerConfig,
    ) -> Step<runtime::Result<String>> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod.0.clone(),
            config: Some(config),
            sandbox_config: Some(pod.1.clone()),
        };
        let r = self
            .call(
                "CreateContainer",
                Duration::ZERO,
                self.rt().create_container(req),
            )
            .await?;
        Ok(r.map(|r| r.container_id))
    }

    pub async fn try_start(&self, id: &str) -> Step<runtime::Result<()>> {
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        let r = self
            .call(
                "StartContainer",
                Duration::ZERO,
                self.rt().start_container(req),
            )
            .await?;
        Ok(r.map(drop))
    }

    /// Creates and starts a container; its id.
    pub async fn run_with(&self, pod: &Pod, config: cri::ContainerConfig) -> Step<String> {
        let id = self.create(pod, config).await?.or_fail("CreateContainer")?;
        self.try_start(&id).await?.or_fail("StartContainer")?;
        Ok(id)
    }

    /// Runs [`Ctx::container_config`]`(name, cmd)` in `pod`.
    pub async fn run(&self, pod: &Pod, name: &str, cmd: &[&str]) -> Step<String> {
        self.run_with(pod, self.container_config(name, cmd)).await
    }

    pub async fn try_status(&self, id: &str) -> Step<runtime::Result<cri::ContainerStatus>> {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let r = self
            .call(
                "ContainerStatus",
                Duration::ZERO,
                self.rt().container_status(req),
            )
            .await?;
        Ok(match r {
            Ok(r) => Ok(r.status.or_fail("ContainerStatus.status")?),
            Err(e) => Err(e),
        })
    }

    pub async fn status(&self, id: &str) -> Step<cri::ContainerStatus> {
        self.try_status(id).await?.or_fail("ContainerStatus")
    }

    /// The container's status once it has exited (within 20 s).
    pub async fn wait_exited(&self, id: &str) -> Step<cri::ContainerStatus> {
        let start = Instant::now();
        loop {
            let s = self.status(id).await?;
            if s.state == cri::ContainerState::ContainerExited as i32 {
                return Ok(s);
            }
            ensure!(
                start.elapsed() < Duration::from_secs(20),
                "container {id} did not exit within 20 s: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn try_exec(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Step<runtime::Result<Exec>> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        };
        let extra = Duration::from_secs(timeout.max(0).unsigned_abs());
        let r = self
            .call("ExecSync", extra, self.rt().exec_sync(req))
            .await?;
        Ok(r.map(|r| Exec {
            out: String::from_utf8_lossy(&r.stdout).into_owned(),
            err: String::from_utf8_lossy(&r.stderr).into_owned(),
            code: r.exit_code,
        }))
    }

    /// ExecSync of `cmd` with a 20 s timeout.
    pub async fn exec(&self, id: &str, cmd: &[&str]) -> Step<Exec> {
        self.try_exec(id, cmd, 20)
            .await?
            .or_fail(format_args!("ExecSync {cmd:?}"))
    }

    /// The ids of the scenario's containers that `filter` selects, sorted.
    pub async fn containers(&self, mut filter: cri::ContainerFilter) -> Step<Vec<String>> {
        let mut selector = self.labels();
        selector.extend(filter.label_selector);
        filter.label_selector = selector;
        let req = cri::ListContainersRequest {
            filter: Some(filter),
        };
        let r = self
            .call(
                "ListContainers",
                Duration::ZERO,
                self.rt().list_containers(req),
            )
            .await?
            .or_fail("ListContainers")?;
        let mut ids: Vec<String> = r.containers.into_iter().map(|c| c.id).collect();
        ids.sort();
        Ok(ids)
    }

    /// The ids of the scenario's sandboxes that `filter` selects, sorted.
    pub async fn pods(&self, mut filter: cri::PodSandboxFilter) -> Step<Vec<String>> {
        let mut selector = self.labels();
        selector.extend(filter.label_selector);
        filter.label_selector = selector;
        let req = cri::ListPodSandboxRequest {
            filter: Some(filter),
        };
        let r = self
            .call(
                "ListPodSandbox",
                Duration::ZERO,
                self.rt().list_pod_sandbox(req),
            )
            .await?
            .or_fail("ListPodSandbox")?;
        let mut ids: Vec<String> = r.items.into_iter().map(|p| p.id).collect();
        ids.sort();
        Ok(ids)
    }

    pub async fn stop_container(&self, id: &str, timeout: i64) -> Step<runtime::Result<()>> {
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        let extra = Duration::from_secs(timeout.max(0).unsigned_abs());
        let r = self
            .call("StopContainer", extra, self.rt().stop_container(req))
            .await?;
        Ok(r.map(drop))
    }

    pub async fn remove_container(&self, id: &str) -> Step<runtime::Result<()>> {
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        let r = self
            .call(
                "RemoveContainer",
                Duration::ZERO,
                self.rt().remove_container(req),
            )
            .await?;
        Ok(r.map(drop))
    }

    pub async fn stop_pod(&self, id: &str) -> Step<runtime::Result<()>> {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let r = self
            .call(
                "StopPodSandbox",
                Duration::ZERO,
                self.rt().stop_pod_sandbox(req),
            )
            .await?;
        Ok(r.map(drop))
    }

    pub async fn remove_pod(&self, id: &str) -> Step<runtime::Result<()>> {
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let r = self
            .call(
                "RemovePodSandbox",
                Duration::ZERO,
                self.rt().remove_pod_sandbox(req),
            )
            .await?;
        Ok(r.map(drop))
    }

    pub async fn try_pod_status(&self, id: &str) -> Step<runtime::Result<cri::PodSandboxStatus>> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let r = self
            .call(
                "PodSandboxStatus",
                Duration::ZERO,
                self.rt().pod_sandbox_status(req),
            )
            .await?;
        Ok(match r {
            Ok(r) => Ok(r.status.or_fail("PodSandboxStatus.status")?),
            Err(e) => Err(e),
        })
    }

    pub async fn pod_status(&self, id: &str) -> Step<cri::PodSandboxStatus> {
        self.try_pod_status(id).await?.or_fail("PodSandboxStatus")
    }

    /// ImageStatus of `image`: the image, or none.
    pub async fn image_status(&self, image: &str) -> Step<Option<cri::Image>> {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        let r = self
            .call(
                "ImageStatus",
                Duration::ZERO,
                self.images().image_status(req),
            )
            .await?
            .or_fail(format_args!("ImageStatus {image:?}"))?;
        Ok(r.image)
    }
}

/// A filter on one container state.
pub fn state_is(state: cri::ContainerState) -> Option<cri::ContainerStateValue> {
    Some(cri::ContainerStateValue {
        state: state as i32,
    })
}

/// One CRI log record: time in ns, stream, tag, content.
pub type LogRecord = (i64, String, String, String);

/// The CRI log records of `path`; a line not in the CRI format fails the scenario.
pub fn parse_log(path: &Path) -> Step<Vec<LogRecord>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Stop::Fail(format!("reading the CRI log {}: {e}", path.display())))?;
    let mut records = Vec::new();
    for line in text.lines() {
        let mut it = line.splitn(4, ' ');
        let (Some(ts), Some(stream), Some(tag), Some(rest)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(Stop::Fail(format!("not a CRI log line: {line:?}")));
        };
        let ns = chrono::DateTime::parse_from_rfc3339(ts)
            .ok()
            .and_then(|t| t.timestamp_nanos_opt());
        let Some(ns) = ns else {
            return Err(Stop::Fail(format!("bad time in the CRI log line {line:?}")));
        };
        ensure!(
            matches!(stream, "stdout" | "stderr") && matches!(tag, "F" | "P"),
            "not a CRI log line: {line:?}"
        );
        records.push((ns, stream.into(), tag.into(), rest.into()));
    }
    Ok(records)
}

/// Now, in ns since the epoch.
/// A free TCP port on 127.0.0.1 (a pod on the hostNetwork fallback shares the node's
/// loopback, so its servers need one too).
pub fn free_port() -> Step<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Stop::Fail(format!("no free port on 127.0.0.1: {e}")))
}

pub fn now_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
}
