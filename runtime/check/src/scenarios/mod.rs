//! The scenarios: each one a behaviour of the CRI v1 contract (or of what the kubelet relies
//! on), written against the runtime traits only, named in stable snake_case.

mod basics;
mod containers;
mod events;
mod idempotence;
mod kubelet;
mod lifecycle;
mod mounts;
mod namespaces;
mod network;
mod security;
mod streaming;

use futures::future::BoxFuture;

use crate::ctx::Ctx;
use crate::outcome::Step;

/// One scenario.
pub struct Scenario {
    /// Its stable name (what `--focus` and `--skip` match, and the report's row).
    pub name: &'static str,
    /// What it checks, in a line.
    pub about: &'static str,
    run: for<'c, 'e> fn(&'c Ctx<'e>) -> BoxFuture<'c, Step>,
}

impl Scenario {
    /// Runs the scenario in `ctx` (made for it: `ctx.scenario` is its name).
    pub fn run<'c>(&self, ctx: &'c Ctx<'_>) -> BoxFuture<'c, Step> {
        (self.run)(ctx)
    }
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! scenarios {
    ($($module:ident :: $name:ident => $about:literal,)*) => {
        $(
            fn $name<'c>(c: &'c Ctx<'_>) -> BoxFuture<'c, Step> {
                Box::pin($module::$name(c))
            }
        )*
        /// Every scenario, in the order they run.
        pub static SCENARIOS: &[Scenario] = &[
            $(Scenario { name: stringify!($name), about: $about, run: $name },)*
        ];
    };
}

scenarios! {
    basics::runtime_version_and_status =>
        "Version answers API v1 with a name and version; Status has RuntimeReady",
    basics::image_status_and_list =>
        "ListImages and ImageStatus by reference, tag and id; an unknown image is none",
    basics::pod_sandbox_status_and_list =>
        "PodSandboxStatus of ready and stopped pods; ListPodSandbox with each filter",
    lifecycle::container_lifecycle_logs_and_exit_codes =>
        "a container's status, CRI log (stdout and stderr) and exit codes",
    containers::list_containers_with_filters =>
        "ListContainers with id, id prefix, pod, state and label filters",
    containers::container_stats =>
        "ContainerStats and ListContainerStats of running containers",
    containers::exec_sync =>
        "ExecSync: output, exit code, the container's files and processes, timeout",
    lifecycle::stop_container_grace_period =>
        "StopContainer sends SIGTERM, then SIGKILL after the grace period",
    lifecycle::stop_and_remove_pod_sandbox =>
        "StopPodSandbox kills its containers; RemovePodSandbox removes them",
    containers::unknown_ids_and_missing_images =>
        "NotFound for unknown ids and missing images; a running container cannot start again",
    containers::programs_that_cannot_be_executed =>
        "a missing or non-executable program fails StartContainer; the pod carries on",
    containers::update_container_resources =>
        "UpdateContainerResources of memory and CPU, read back from the container's cgroup",
    network::host_network_namespace =>
        "a hostNetwork pod's containers see the node's network namespace and hostname",
    network::private_pod_network_namespace =>
        "a pod's containers share a network namespace of their own and its hostname",
    network::pod_network =>
        "pod addresses, pod to pod, node to pod and a hostPort; the port closes on stop",
    namespaces::host_pid_and_ipc_namespaces =>
        "hostPID and hostIPC pods' containers see the node's PID and IPC namespaces",
    namespaces::pod_pid_namespace_shared =>
        "a pod with one PID namespace: its containers see each other's processes",
    namespaces::private_pid_namespaces =>
        "by default a PID namespace per container (its command is PID 1), IPC per pod",
    namespaces::target_pid_namespace =>
        "a container in another container's PID namespace (TARGET), as kubectl debug makes",
    namespaces::pod_user_namespace =>
        "a pod in a user namespace of its own: the ID maps asked for, root inside only",
    lifecycle::out_of_memory =>
        "a container over its memory limit is killed: exit code 137, reason OOMKilled",
    security::user_and_groups =>
        "run_as_user, run_as_group and supplemental groups, for the container and its execs",
    security::capabilities =>
        "dropping ALL capabilities and adding two leaves exactly those two",
    security::no_new_privs_and_seccomp =>
        "no_new_privs, the RuntimeDefault seccomp profile, and Unconfined",
    security::read_only_rootfs_masked_and_read_only_paths =>
        "a read-only root filesystem; masked paths read empty, read-only paths refuse writes",
    mounts::mounts_and_propagation =>
        "host directories read-write and read-only; later host mounts reach HostToContainer only",
    streaming::exec_stream =>
        "Exec's URL over WebSocket (v4): stdout, stderr, the exit status, stdin; one use only",
    streaming::attach_stream =>
        "Attach's URL over WebSocket (v4): a line in, the container's output back",
    streaming::port_forward_stream =>
        "PortForward's URL over WebSocket (v4): HTTP to a server on the pod's loopback",
    events::container_events =>
        "GetContainerEvents: created, started, stopped and deleted, with the pod's status",
    events::container_events_carry_statuses =>
        "each container event carries the container's status, as an evented PLEG needs",
    events::reopen_container_log =>
        "ReopenContainerLog after the log file was renamed: new lines go to a new file",
    kubelet::init_container_then_app_container =>
        "an init container runs to completion, then the app container; both stay listed",
    kubelet::restart_after_exit =>
        "a restart: attempt 1 beside the exited attempt 0, each with its log; 0 then removed",
    idempotence::idempotence_of_stopped_and_removed =>
        "stopping or removing stopped and removed containers and pods again succeeds",
    idempotence::idempotence_of_unknown_ids =>
        "stopping or removing unknown containers, pods and images succeeds",
}

/// The scenario called `name`.
pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}
