//! The kubelet's wiring, one builder per subsystem: each step makes one part from the parts
//! made before it and spawns its tasks into the one task set, under the one cancellation token.
//! [`super::Kubelet::start`] calls them in order, a table of contents of the kubelet.

use std::sync::Arc;

use runtime::cri;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    Runtime, Syncer, SyncerParts, gc, housekeeping, logrotate, mirror, pleg, pod_cache, sync_loop,
    userns,
};
use crate::api::events::{EventRecorder, EventType, Reason};
use crate::cm::ContainerManager;
use crate::cm::resources::ResourceConfig;
use crate::config::KubeletConfig;
use crate::devices::DeviceManager;
use crate::node::agent::RUNTIME_CHECK_PERIOD;
use crate::node::{NodeAgent, NodeFacts, RuntimeState};
use crate::pod::images::ImagePulls;
use crate::pod::{Backoff, ContainerOptions, SandboxOptions};
use crate::pod_workers::{PodWorkers, Timing};
use crate::sources::{self, PodUpdate};
use crate::status_manager::StatusManager;

mod node;
mod server;

/// What every part is wired with: the configuration, the runtime (every call counted and
/// timed), the API client (`None` standalone), and the task set every background task lives
/// in under one token.
pub(super) struct Wiring {
    pub cfg: KubeletConfig,
    pub rt: Runtime,
    pub client: Option<kube::Client>,
    pub cancel: CancellationToken,
    pub tasks: JoinSet<()>,
    /// With `serverTLSBootstrap`: where the serving certificate learns the Node's addresses.
    pub serving_addresses: Option<watch::Sender<Vec<k8s_openapi::api::core::v1::NodeAddress>>>,
    /// The device manager, once made (the Node reports its resources).
    pub devices: Option<DeviceManager>,
}

/// What the eviction manager is wired to besides the runtime.
pub(super) struct EvictionInputs {
    pub cm: Arc<ContainerManager>,
    pub state: Arc<super::eviction::EvictionState>,
    pub workers: PodWorkers,
    pub pods: watch::Receiver<Arc<Vec<k8s_openapi::api::core::v1::Pod>>>,
    pub image_gc: Arc<super::image_gc::ImageGc>,
    pub events: EventRecorder,
    pub syncer: Arc<Syncer>,
}

/// Where the sync loop publishes the pods the kubelet server lists.
type PodsSender = watch::Sender<Arc<Vec<k8s_openapi::api::core::v1::Pod>>>;

/// The channels between the PLEG, the probes, the sources and the sync loop.
pub(super) struct Channels {
    pub updates: (mpsc::Sender<PodUpdate>, mpsc::Receiver<PodUpdate>),
    pub problems: (
        mpsc::UnboundedSender<String>,
        mpsc::UnboundedReceiver<String>,
    ),
    pub changed: (
        mpsc::UnboundedSender<String>,
        mpsc::UnboundedReceiver<String>,
    ),
    pub refresh: (
        mpsc::UnboundedSender<pleg::Refresh>,
        mpsc::UnboundedReceiver<pleg::Refresh>,
    ),
    pub probes: (
        mpsc::UnboundedSender<crate::prober::Update>,
        mpsc::UnboundedReceiver<crate::prober::Update>,
    ),
}

impl Channels {
    pub fn new() -> Self {
        Channels {
            updates: mpsc::channel(64),
            problems: mpsc::unbounded_channel(),
            changed: mpsc::unbounded_channel(),
            refresh: mpsc::unbounded_channel(),
            probes: mpsc::unbounded_channel(),
        }
    }
}

impl Wiring {
    /// The wiring of a kubelet on `rt`, its runtime calls instrumented
    /// (`kubelet_runtime_operations_*`).
    pub fn new(cfg: KubeletConfig, rt: Runtime, client: Option<kube::Client>) -> Self {
        let instrumented = Arc::new(runtime::Instrumented::new(
            rt.runtime.clone(),
            rt.images.clone(),
            crate::metrics::get(),
        ));
        let rt = Runtime {
            runtime: instrumented.clone(),
            images: instrumented,
        };
        Wiring {
            cfg,
            rt,
            client,
            cancel: CancellationToken::new(),
            tasks: JoinSet::new(),
            serving_addresses: None,
            devices: None,
        }
    }

    /// The runtime's version (the first call: the runtime must answer before anything starts).
    pub async fn runtime_version(&self) -> runtime::Result<cri::VersionResponse> {
        let version = self
            .rt
            .runtime
            .version(cri::VersionRequest::default())
            .await?;
        tracing::info!(
            node = %self.cfg.node_name,
            runtime = %version.runtime_name,
            mode = if self.client.is_some() { "API server" } else { "standalone" },
            "kubelet starting"
        );
        Ok(version)
    }

    /// The cgroup driver the runtime reports through CRI `RuntimeConfig` wins over
    /// `cgroupDriver`, as upstream's kubelet does since `KubeletCgroupDriverFromCRI`, so that the
    /// pods' cgroups and the runtime's agree; a runtime that does not answer it (containerd
    /// before 1.7) leaves the configured one.
    pub async fn runtime_cgroup_driver(&mut self) {
        use crate::config::CgroupDriver;
        let reply = self
            .rt
            .runtime
            .runtime_config(cri::RuntimeConfigRequest::default())
            .await;
        let reported = match reply {
            Ok(r) => r.linux.map(|l| l.cgroup_driver),
            Err(e) => {
                tracing::info!(
                    "the runtime does not report its cgroup driver ({e}); using cgroupDriver {}",
                    self.cfg.cgroups.driver.as_str()
                );
                return;
            }
        };
        let driver = match reported {
            Some(d) if d == cri::CgroupDriver::Systemd as i32 => CgroupDriver::Systemd,
            Some(d) if d == cri::CgroupDriver::Cgroupfs as i32 => CgroupDriver::Cgroupfs,
            _ => return,
        };
        if driver != self.cfg.cgroups.driver {
            tracing::warn!(
                configured = self.cfg.cgroups.driver.as_str(),
                runtime = driver.as_str(),
                "cgroupDriver differs from the runtime's; using the runtime's"
            );
            self.cfg.cgroups.driver = driver;
        }
    }

    /// The node-wide container options, built once.
    pub fn container_options(
        &self,
        facts: &NodeFacts,
        version: &cri::VersionResponse,
    ) -> ContainerOptions {
        let cfg = &self.cfg;
        ContainerOptions {
            sandbox: SandboxOptions {
                pod_logs_dir: cfg.pod_logs_dir.clone(),
                cluster_dns: cfg.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
                cluster_domain: cfg.cluster_domain.clone(),
                seccomp_profile_root: cfg.root_dir.join("seccomp"),
                ..Default::default()
            },
            pods_dir: cfg.root_dir.join("pods"),
            node_name: cfg.node_name.clone(),
            host_ips: facts.node_ips().iter().map(|ip| ip.to_string()).collect(),
            node_memory_bytes: i64::try_from(facts.memory_bytes).unwrap_or(i64::MAX),
            stop_signal_annotation: version.runtime_name == runtime::builtin::RUNTIME_NAME,
            ..Default::default()
        }
    }

    /// The container manager: the pods' cgroup tree made (`kubepods` at the node's capacity of
    /// CPU, memory and process IDs, capped at capacity minus `kubeReserved` and
    /// `systemReserved` when `pods` is enforced, as upstream's `createNodeAllocatableCgroups`),
    /// its QoS cgroups updated every minute.
    pub fn container_manager(
        &mut self,
        facts: &NodeFacts,
    ) -> Result<Arc<ContainerManager>, crate::cm::Error> {
        let cfg = &self.cfg;
        let capacity = crate::node::capacity(facts);
        let value = |r: &str| capacity.get(r).map_or(0, |a| a.value());
        let (mut cpu, mut memory) = (value("cpu"), value("memory"));
        if cfg.cgroups.enforces_pods() {
            cpu = (cpu - cfg.reserved.total("cpu")).max(0);
            memory = (memory - cfg.reserved.total("memory")).max(0);
        }
        // Process IDs: the kernel's pid_max, less what is reserved (upstream's pid capacity).
        let mut pids = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(0);
        if cfg.cgroups.enforces_pods() {
            pids -= cfg.reserved.total("pid");
        }
        let node = ResourceConfig {
            cpu_shares: Some(crate::cm::resources::milli_cpu_to_shares(cpu)),
            memory_limit: Some(memory),
            pids_limit: Some(pids.max(1)),
            ..Default::default()
        };
        let cm = Arc::new(ContainerManager::new(
            &cfg.cgroups,
            node,
            cfg.pod_pids_limit,
        )?);
        cm.start()?;
        let (updater, cancel) = (cm.clone(), self.cancel.clone());
        self.tasks.spawn(async move {
            let mut tick = tokio::time::interval(crate::cm::QOS_UPDATE_PERIOD);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {
                        if let Err(e) = updater.update_qos() {
                            tracing::warn!("updating the QoS cgroups: {e}");
                        }
                    }
                }
            }
        });
        Ok(cm)
    }

    /// Image garbage collection, in its own task: every `imageGCPeriod` (upstream's 5 minutes)
    /// by the configured thresholds and ages, its records in `<root>/image-gc.json`.
    pub fn image_gc(&mut self, events: &EventRecorder) -> Arc<super::image_gc::ImageGc> {
        let gc = Arc::new(
            super::image_gc::ImageGc::new(
                self.rt.runtime.clone(),
                self.rt.images.clone(),
                self.cfg.image_gc.clone(),
                self.cfg.root_dir.join("image-gc.json"),
            )
            .keeping(self.cfg.pod_infra_container_image.iter().cloned().collect()),
        );
        let period = self.cfg.testing.image_gc_period;
        self.tasks
            .spawn(gc.clone().run(period, events.clone(), self.cancel.clone()));
        gc
    }

    /// Node-pressure eviction, in its own task (see [`super::eviction`]); its conditions in
    /// `inputs.state`.
    pub fn eviction(&mut self, facts: &NodeFacts, inputs: EvictionInputs) {
        use super::eviction::{EvictionManager, EvictionParts, signals::NodeSignals, thresholds};
        let cfg = &self.cfg;
        let memory = i64::try_from(facts.memory_bytes).unwrap_or(i64::MAX);
        let parts = EvictionParts {
            thresholds: thresholds::from_config(&cfg.eviction_hard, &cfg.eviction),
            transition: cfg.eviction.pressure_transition_period,
            max_pod_grace: cfg.eviction.max_pod_grace_period,
            period: cfg.testing.eviction_monitoring_period,
            signals: NodeSignals::new(
                memory,
                Some((memory - cfg.reserved.total("memory")).max(0)),
                cfg.root_dir.clone(),
                inputs.cm,
                self.rt.images.clone(),
            ),
            state: inputs.state,
            workers: inputs.workers,
            pods: inputs.pods,
            rt: self.rt.runtime.clone(),
            images: self.rt.images.clone(),
            image_gc: Some(inputs.image_gc),
            events: inputs.events,
            syncer: inputs.syncer,
            node_name: cfg.node_name.clone(),
            root_dir: cfg.root_dir.clone(),
            pod_logs_dir: cfg.pod_logs_dir.clone(),
        };
        self.tasks
            .spawn(EvictionManager::new(parts).run(self.cancel.clone()));
    }

    /// Graceful node shutdown under systemd-logind (see [`super::shutdown::logind`]), in its
    /// own task: when a grace period is set and SIGTERM is not the trigger.
    pub fn logind_shutdown(
        &mut self,
        shutdown: &Arc<super::shutdown::NodeShutdown>,
        events: &EventRecorder,
    ) {
        let sd = &self.cfg.shutdown;
        if shutdown.groups.is_empty() || sd.on_sigterm {
            return;
        }
        let grace = shutdown.groups.iter().map(|g| g.grace).sum();
        self.tasks.spawn(super::shutdown::logind::watch(
            shutdown.clone(),
            grace,
            super::shutdown::logind::LOGIND_CONF_DIR.into(),
            events.clone(),
            self.cancel.clone(),
        ));
    }

    /// The pods' allocated resources, kept in `<root>/pod-resources.json`.
    pub fn allocations(&self) -> Arc<super::allocation::Allocations> {
        Arc::new(super::allocation::Allocations::open(Some(
            self.cfg.root_dir.join("pod-resources.json"),
        )))
    }

    /// The status manager, writing statuses in its own task.
    pub fn status_manager(&mut self) -> Arc<StatusManager> {
        let status = StatusManager::new(self.client.clone());
        self.tasks
            .spawn(status.clone().run_until(self.cancel.clone()));
        status
    }

    /// The runtime's Status, asked now and then every few seconds: Ready reports it, and pods
    /// with a pod network wait while the runtime's network is not ready.
    pub async fn runtime_state(&mut self) -> Arc<RuntimeState> {
        let state = Arc::new(RuntimeState::default());
        state.check(self.rt.runtime.as_ref()).await;
        let cancel = self.cancel.clone();
        self.tasks.spawn(state.clone().run_checks(
            self.rt.runtime.clone(),
            RUNTIME_CHECK_PERIOD,
            async move { cancel.cancelled().await },
        ));
        state
    }

    /// Pods with `hostUsers: false` get blocks of the kubelet's range of host IDs.
    pub fn user_namespaces(
        &self,
        opts: &ContainerOptions,
    ) -> runtime::Result<Arc<userns::UsernsManager>> {
        let range = userns::kubelet_range(
            std::path::Path::new("/etc/subuid"),
            std::path::Path::new("/etc/subgid"),
        )?;
        Ok(Arc::new(userns::UsernsManager::new(&opts.pods_dir, range)?))
    }

    /// The event recorder (its sink a task), having recorded the kubelet's start.
    pub fn events(&mut self) -> EventRecorder {
        let (recorder, sink) = EventRecorder::new(self.client.clone(), self.cfg.node_name.clone());
        self.tasks.spawn(sink);
        let node = recorder.node_ref();
        let reason = Reason::StartingKubelet;
        recorder.event(&node, EventType::Normal, reason, "Starting kubelet.");
        recorder
    }

    /// The PLEG over the pod cache: changes to the sync loop, refresh requests from the syncer.
    pub fn pleg(
        &mut self,
        cache: &Arc<pod_cache::PodCache>,
        health: &Arc<pleg::PlegHealth>,
        changed: mpsc::UnboundedSender<String>,
        refresh: mpsc::UnboundedReceiver<pleg::Refresh>,
    ) {
        let pleg = pleg::Pleg {
            rt: self.rt.runtime.clone(),
            cache: cache.clone(),
            health: health.clone(),
            changed,
            refresh,
            config: pleg::PlegConfig::default(),
        };
        self.tasks.spawn(pleg.run(self.cancel.clone()));
    }

    /// The syncer: the pod runtime manager, the volumes and the pods' inputs; its probes (one
    /// worker per container and probe, outside the loop; a changed result syncs the pod).
    pub fn syncer(
        &self,
        parts: SyncerParts,
        local_node: &k8s_openapi::api::core::v1::Node,
    ) -> Arc<Syncer> {
        let client = self.client.clone();
        let pods_dir = parts.opts.pods_dir.clone();
        let allocatable = crate::volumes::projection::Allocatable::from_node(local_node);
        let services =
            crate::api::services::Services::start(client.clone(), self.cancel.child_token());
        let volumes = crate::volumes::VolumeManager::new(client, pods_dir, allocatable)
            .with_services(services);
        Arc::new(Syncer::new(self.rt.clone(), parts).with_volumes(volumes))
    }

    /// The probe manager.
    pub fn probes(
        &self,
        status: &Arc<StatusManager>,
        events: &EventRecorder,
        results: mpsc::UnboundedSender<crate::prober::Update>,
    ) -> Arc<crate::prober::ProbeManager> {
        Arc::new(crate::prober::ProbeManager::new(
            Arc::new(crate::prober::RuntimeProber::new(self.rt.runtime.clone())),
            status.clone(),
            Arc::new(events.clone()),
            results,
            self.cancel.child_token(),
        ))
    }

    /// The static pod sources (`staticPodPath`, `staticPodURL`): the names of those started.
    pub fn static_sources(
        &mut self,
        updates: &mpsc::Sender<PodUpdate>,
        problems: &mpsc::UnboundedSender<String>,
    ) -> Vec<&'static str> {
        let cfg = &self.cfg;
        let mut started = Vec::new();
        if !cfg.static_pod_path.as_os_str().is_empty() {
            let src = sources::file::FileSource::new(
                cfg.static_pod_path.clone(),
                cfg.node_name.clone(),
                cfg.file_check_frequency,
            )
            .report_to(problems.clone());
            self.tasks.spawn(src.run(updates.clone()));
            started.push(sources::FILE_SOURCE);
        }
        if !cfg.static_pod_url.is_empty() {
            let src = sources::http::HttpSource::new(
                cfg.static_pod_url.clone(),
                cfg.node_name.clone(),
                cfg.http_check_frequency,
            )
            .report_to(problems.clone());
            self.tasks.spawn(src.run(updates.clone()));
            started.push(sources::HTTP_SOURCE);
        }
        started
    }

    /// The device manager: its checkpoint read (allocations rebuilt from the running
    /// containers when it was unusable), plugin registration and the pod-resources API served.
    pub async fn devices(&mut self, pods: &PodsSender) -> std::io::Result<DeviceManager> {
        let devices = DeviceManager::new(&self.cfg.root_dir);
        devices.rebuild(self.rt.runtime.as_ref()).await;
        let registration = devices.serve_registration(self.cancel.clone())?;
        self.tasks.spawn(registration);
        let pod_resources = crate::devices::podresources::serve(
            &self.cfg.root_dir,
            devices.clone(),
            pods.subscribe(),
            self.cancel.clone(),
        )?;
        self.tasks.spawn(pod_resources);
        self.devices = Some(devices.clone());
        Ok(devices)
    }

    /// Housekeeping and the log rotation, off the loop: where the loop publishes what it wants.
    pub fn housekeeping(
        &mut self,
        parts: HousekeepingParts,
    ) -> watch::Sender<housekeeping::Desired> {
        let (desired_tx, desired_rx) = watch::channel(housekeeping::Desired::default());
        let hk = housekeeping::Housekeeping {
            rt: self.rt.runtime.clone(),
            workers: parts.workers,
            userns: parts.userns,
            syncer: parts.syncer.clone(),
            status: parts.status,
            gc: gc::GarbageCollector::new(
                self.rt.runtime.clone(),
                parts.syncer.opts.pods_dir.clone(),
                self.cfg.pod_logs_dir.clone(),
            ),
            mirror_manager: parts.mirror_manager,
            mirrors: parts.mirrors,
            node_agent: parts.node_agent,
            cache: parts.cache,
        };
        self.tasks.spawn(hk.run(desired_rx, self.cancel.clone()));
        self.tasks.spawn(logrotate::run(
            self.rt.runtime.clone(),
            self.cfg.container_logs.clone(),
            self.cancel.clone(),
        ));
        desired_tx
    }

    /// The sync loop, dispatching every change to the pod workers.
    pub fn sync_loop(&mut self, sync_loop: sync_loop::SyncLoop, inputs: sync_loop::Inputs) {
        self.tasks.spawn(sync_loop.run(inputs, self.cancel.clone()));
    }

    /// systemd's notifications: `READY=1` when `readiness` is reached, `WATCHDOG=1` while
    /// the sync loop and the PLEG are healthy.
    pub fn notify(
        &mut self,
        readiness: super::notify::Readiness,
        health: &Arc<pleg::PlegHealth>,
        sync_health: &Arc<super::notify::SyncLoopHealth>,
    ) {
        let name = self.cfg.node_name.clone();
        self.tasks.spawn(super::notify::ready_when(
            readiness,
            name,
            self.cancel.clone(),
        ));
        let check = health_check(health, sync_health.clone());
        self.tasks
            .spawn(super::notify::watchdog(check, self.cancel.clone()));
    }

    /// The CrashLoopBackOff delays (upstream's, unless the tests' settings shorten them).
    pub fn crash_loop_backoff(&self) -> Backoff {
        let testing = &self.cfg.testing;
        Backoff::new(
            testing.crash_loop_back_off_initial,
            testing.crash_loop_back_off_max,
        )
    }

    /// How image pulls share the node.
    pub fn image_pulls(&self) -> ImagePulls {
        ImagePulls::new(
            self.cfg.serialize_image_pulls,
            self.cfg.max_parallel_image_pulls,
        )
    }

    /// The pod workers over the syncer.
    pub fn workers(&self, syncer: &Arc<Syncer>) -> PodWorkers {
        let timing = Timing {
            resync: self.cfg.sync_frequency,
            ..Default::default()
        };
        PodWorkers::new(syncer.clone(), timing)
    }
}

/// What housekeeping works on besides the runtime.
pub(super) struct HousekeepingParts {
    pub workers: PodWorkers,
    pub userns: Arc<userns::UsernsManager>,
    pub syncer: Arc<Syncer>,
    pub status: Arc<StatusManager>,
    pub mirror_manager: Option<mirror::MirrorManager>,
    pub mirrors: watch::Receiver<sources::api::MirrorPods>,
    pub node_agent: Option<Arc<NodeAgent>>,
    pub cache: Arc<pod_cache::PodCache>,
}

/// The kubelet's health as `/healthz` and the watchdog see it: the sync loop going round and
/// the PLEG relisting; `Some(problem)` when either is not.
fn health_check(
    pleg: &Arc<pleg::PlegHealth>,
    sync_loop: Arc<super::notify::SyncLoopHealth>,
) -> impl Fn() -> Option<String> + Send + Sync + 'static {
    let pleg = pleg.clone();
    move || sync_loop.problem().or_else(|| pleg.problem())
}
