//! Every flag the kubelet command line knows: what it sets, or why it is refused.

/// How a flag's text is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Bool,
    Int,
    /// A Go duration (`1m30s`), checked here.
    Duration,
    Str,
    /// Comma-separated.
    List,
    /// `k=v,k2=v2`.
    Map,
    /// `signal<quantity,...` (`--eviction-hard`).
    Thresholds,
    /// `key=value:Effect,...`.
    Taints,
}

/// What a flag does.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    /// Sets the `KubeletConfiguration` field at this path.
    Field(&'static [&'static str]),
    /// A flag of the command line only.
    Local,
    /// A command-line flag upstream deprecated but still takes (why).
    Deprecated(&'static str),
    /// Gone from upstream's kubelet (since when, and what replaced it).
    Removed(&'static str),
    /// Upstream's, not implemented by nodelet (why).
    Unsupported(&'static str),
}

pub(super) struct Flag {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) target: Target,
    pub(super) help: &'static str,
}

const fn field(
    name: &'static str,
    kind: Kind,
    path: &'static [&'static str],
    help: &'static str,
) -> Flag {
    Flag {
        name,
        kind,
        target: Target::Field(path),
        help,
    }
}

const fn local(name: &'static str, kind: Kind, help: &'static str) -> Flag {
    Flag {
        name,
        kind,
        target: Target::Local,
        help,
    }
}

const fn removed(name: &'static str, why: &'static str) -> Flag {
    Flag {
        name,
        kind: Kind::Str,
        target: Target::Removed(why),
        help: "",
    }
}

const fn unsupported(name: &'static str, kind: Kind, why: &'static str) -> Flag {
    Flag {
        name,
        kind,
        target: Target::Unsupported(why),
        help: "",
    }
}

use Kind::*;

const DOCKERSHIM: &str = "removed with dockershim in v1.24";

pub(super) const FLAGS: &[Flag] = &[
    // The command line's own.
    local("config", Str, "The KubeletConfiguration file."),
    local(
        "config-dir",
        Str,
        "A drop-in directory: each *.conf a KubeletConfiguration, applied over --config in name order.",
    ),
    local(
        "kubeconfig",
        Str,
        "The kubeconfig for the API server; none: standalone.",
    ),
    local(
        "bootstrap-kubeconfig",
        Str,
        "A kubeconfig used to get a client certificate when --kubeconfig is missing.",
    ),
    local(
        "cert-dir",
        Str,
        "Where the TLS certificates are kept (default <root-dir>/pki).",
    ),
    local(
        "root-dir",
        Str,
        "The kubelet's state directory (default /var/lib/nodelet).",
    ),
    local(
        "state-dir",
        Str,
        "nodelet: the built-in runtime's tmpfs state directory.",
    ),
    local(
        "cri-listen",
        Str,
        "nodelet: also serve the runtime as CRI v1 on this unix socket.",
    ),
    local(
        "hostname-override",
        Str,
        "The node's name instead of the host name.",
    ),
    local(
        "node-ip",
        Str,
        "The node's IP address, or one IPv4 and one IPv6 (dual stack), comma-separated.",
    ),
    local(
        "node-labels",
        Str,
        "Labels added to the Node at registration, k=v,...",
    ),
    local("cloud-provider", Str, "\"external\" or empty."),
    Flag {
        name: "pod-infra-container-image",
        kind: Str,
        target: Target::Deprecated(
            "the sandbox image comes from the runtime; the image is only kept from garbage collection",
        ),
        help: "An image never garbage collected.",
    },
    local(
        "v",
        Int,
        "Log verbosity (0-2 info, 3-4 debug, 5 and more trace).",
    ),
    local("help", Bool, "This help."),
    local(
        "version",
        Bool,
        "Print the Kubernetes version implemented and exit.",
    ),
    // KubeletConfiguration fields.
    field("address", Str, &["address"], "The server's address."),
    field(
        "rotate-certificates",
        Bool,
        &["rotateCertificates"],
        "Renew the client certificate through a CSR before it expires.",
    ),
    field(
        "rotate-server-certificates",
        Bool,
        &["serverTLSBootstrap"],
        "Get and renew the serving certificate through CSRs (kubelet-serving signer).",
    ),
    field("port", Int, &["port"], "The server's port."),
    field(
        "read-only-port",
        Int,
        &["readOnlyPort"],
        "The read-only port (0: off).",
    ),
    field(
        "healthz-port",
        Int,
        &["healthzPort"],
        "The healthz port (0: off).",
    ),
    field(
        "healthz-bind-address",
        Str,
        &["healthzBindAddress"],
        "The healthz address.",
    ),
    field(
        "tls-cert-file",
        Str,
        &["tlsCertFile"],
        "The serving certificate.",
    ),
    field(
        "tls-private-key-file",
        Str,
        &["tlsPrivateKeyFile"],
        "The serving key.",
    ),
    field(
        "tls-min-version",
        Str,
        &["tlsMinVersion"],
        "VersionTLS12 or VersionTLS13.",
    ),
    field(
        "tls-cipher-suites",
        List,
        &["tlsCipherSuites"],
        "TLS 1.2 cipher suites.",
    ),
    field(
        "anonymous-auth",
        Bool,
        &["authentication", "anonymous", "enabled"],
        "Allow anonymous requests.",
    ),
    field(
        "authentication-token-webhook",
        Bool,
        &["authentication", "webhook", "enabled"],
        "Authenticate bearer tokens with TokenReview.",
    ),
    field(
        "authentication-token-webhook-cache-ttl",
        Duration,
        &["authentication", "webhook", "cacheTTL"],
        "TokenReview cache.",
    ),
    field(
        "client-ca-file",
        Str,
        &["authentication", "x509", "clientCAFile"],
        "CA for client certificates.",
    ),
    field(
        "authorization-mode",
        Str,
        &["authorization", "mode"],
        "AlwaysAllow or Webhook.",
    ),
    field(
        "authorization-webhook-cache-authorized-ttl",
        Duration,
        &["authorization", "webhook", "cacheAuthorizedTTL"],
        "SubjectAccessReview cache (allowed).",
    ),
    field(
        "authorization-webhook-cache-unauthorized-ttl",
        Duration,
        &["authorization", "webhook", "cacheUnauthorizedTTL"],
        "SubjectAccessReview cache (denied).",
    ),
    field(
        "pod-manifest-path",
        Str,
        &["staticPodPath"],
        "Static pod manifests.",
    ),
    field(
        "manifest-url",
        Str,
        &["staticPodURL"],
        "Static pods from a URL.",
    ),
    field(
        "sync-frequency",
        Duration,
        &["syncFrequency"],
        "Pod resync period.",
    ),
    field(
        "file-check-frequency",
        Duration,
        &["fileCheckFrequency"],
        "Static dir period.",
    ),
    field(
        "http-check-frequency",
        Duration,
        &["httpCheckFrequency"],
        "Static URL period.",
    ),
    field(
        "node-status-update-frequency",
        Duration,
        &["nodeStatusUpdateFrequency"],
        "Node status period.",
    ),
    field(
        "max-pods",
        Int,
        &["maxPods"],
        "Pods this node runs at most.",
    ),
    field(
        "pod-max-pids",
        Int,
        &["podPidsLimit"],
        "Process IDs per pod (-1: unlimited).",
    ),
    field(
        "cluster-dns",
        List,
        &["clusterDNS"],
        "DNS servers for pods.",
    ),
    field(
        "cluster-domain",
        Str,
        &["clusterDomain"],
        "The cluster's domain.",
    ),
    field(
        "register-node",
        Bool,
        &["registerNode"],
        "Register the Node.",
    ),
    field(
        "register-with-taints",
        Taints,
        &["registerWithTaints"],
        "Taints the Node registers with, key=value:Effect,...",
    ),
    field(
        "provider-id",
        Str,
        &["providerID"],
        "The Node's spec.providerID.",
    ),
    field(
        "container-runtime-endpoint",
        Str,
        &["containerRuntimeEndpoint"],
        "A CRI socket (unix://...), or \"nodelet\" (the default): the built-in runtime.",
    ),
    field(
        "image-service-endpoint",
        Str,
        &["imageServiceEndpoint"],
        "The CRI image service, if not the runtime's.",
    ),
    field(
        "runtime-request-timeout",
        Duration,
        &["runtimeRequestTimeout"],
        "Deadline of runtime calls.",
    ),
    field(
        "cgroup-driver",
        Str,
        &["cgroupDriver"],
        "cgroupfs (systemd is refused).",
    ),
    field(
        "cgroup-root",
        Str,
        &["cgroupRoot"],
        "The pods' cgroup root.",
    ),
    field(
        "cgroups-per-qos",
        Bool,
        &["cgroupsPerQOS"],
        "The QoS cgroup tree.",
    ),
    field(
        "enforce-node-allocatable",
        List,
        &["enforceNodeAllocatable"],
        "What allocatable caps (pods).",
    ),
    field(
        "cpu-cfs-quota",
        Bool,
        &["cpuCFSQuota"],
        "CFS quota for CPU limits.",
    ),
    field(
        "image-gc-high-threshold",
        Int,
        &["imageGCHighThresholdPercent"],
        "Disk use (%) starting image GC.",
    ),
    field(
        "image-gc-low-threshold",
        Int,
        &["imageGCLowThresholdPercent"],
        "Disk use (%) image GC frees down to.",
    ),
    field(
        "minimum-image-ttl-duration",
        Duration,
        &["imageMinimumGCAge"],
        "Youngest age of a collected image.",
    ),
    field(
        "eviction-hard",
        Thresholds,
        &["evictionHard"],
        "signal<threshold,...",
    ),
    field(
        "eviction-soft",
        Thresholds,
        &["evictionSoft"],
        "signal<threshold,...",
    ),
    field(
        "eviction-soft-grace-period",
        Map,
        &["evictionSoftGracePeriod"],
        "signal=duration,...",
    ),
    field(
        "eviction-max-pod-grace-period",
        Int,
        &["evictionMaxPodGracePeriod"],
        "Seconds, for soft evictions.",
    ),
    field(
        "eviction-minimum-reclaim",
        Map,
        &["evictionMinimumReclaim"],
        "signal=quantity,...",
    ),
    field(
        "eviction-pressure-transition-period",
        Duration,
        &["evictionPressureTransitionPeriod"],
        "How long a pressure condition stays.",
    ),
    field(
        "kube-reserved",
        Map,
        &["kubeReserved"],
        "cpu=..,memory=..,ephemeral-storage=..",
    ),
    field(
        "system-reserved",
        Map,
        &["systemReserved"],
        "cpu=..,memory=..,ephemeral-storage=..",
    ),
    field(
        "reserved-cpus",
        Str,
        &["reservedSystemCPUs"],
        "A CPU list kept from pods.",
    ),
    field(
        "serialize-image-pulls",
        Bool,
        &["serializeImagePulls"],
        "Pull one image at a time.",
    ),
    field(
        "pod-cidr",
        Str,
        &["podCIDR"],
        "The built-in runtime's pod subnet.",
    ),
    field(
        "container-log-max-size",
        Str,
        &["containerLogMaxSize"],
        "Rotate a container's log at this size.",
    ),
    field(
        "container-log-max-files",
        Int,
        &["containerLogMaxFiles"],
        "Log files kept per container.",
    ),
    // Removed upstream.
    removed(
        "container-runtime",
        "removed in v1.27: the runtime is given by --container-runtime-endpoint",
    ),
    removed("network-plugin", DOCKERSHIM),
    removed("network-plugin-mtu", DOCKERSHIM),
    removed("cni-bin-dir", DOCKERSHIM),
    removed("cni-conf-dir", DOCKERSHIM),
    removed("cni-cache-dir", DOCKERSHIM),
    removed("docker-endpoint", DOCKERSHIM),
    removed("image-pull-progress-deadline", DOCKERSHIM),
    removed("experimental-dockershim-root-directory", DOCKERSHIM),
    removed("non-masquerade-cidr", DOCKERSHIM),
    removed(
        "dynamic-config-dir",
        "removed in v1.24 with dynamic kubelet configuration",
    ),
    removed("master-service-namespace", "removed in v1.27"),
    removed("experimental-mounter-path", "removed in v1.24"),
    removed(
        "experimental-check-node-capabilities-before-mount",
        "removed in v1.24",
    ),
    removed(
        "experimental-allocatable-ignore-eviction",
        "removed in v1.24",
    ),
    removed("keep-terminated-pod-volumes", "removed in v1.31"),
    removed(
        "azure-container-registry-config",
        "removed in v1.30: use an image credential provider",
    ),
    // Upstream's, not nodelet's (yet).
    unsupported(
        "feature-gates",
        Str,
        "nodelet has no feature gates: what it implements is on",
    ),
    unsupported("fail-swap-on", Bool, "swap is reported, not checked"),
    unsupported(
        "system-cgroups",
        Str,
        "the agent's own cgroups are not managed",
    ),
    unsupported(
        "kubelet-cgroups",
        Str,
        "the agent's own cgroups are not managed",
    ),
    unsupported(
        "runtime-cgroups",
        Str,
        "the runtime's cgroups are not managed",
    ),
    unsupported("lock-file", Str, "no lock file is taken"),
    unsupported("exit-on-lock-contention", Bool, "no lock file is taken"),
    unsupported(
        "seccomp-default",
        Bool,
        "RuntimeDefault is not the default seccomp profile",
    ),
    unsupported("cpu-manager-policy", Str, "no CPU manager"),
    unsupported("memory-manager-policy", Str, "no memory manager"),
    unsupported("topology-manager-policy", Str, "no topology manager"),
    unsupported("volume-plugin-dir", Str, "no FlexVolume plugins"),
    unsupported(
        "image-credential-provider-config",
        Str,
        "no image credential providers",
    ),
    unsupported(
        "image-credential-provider-bin-dir",
        Str,
        "no image credential providers",
    ),
    unsupported("kube-api-qps", Int, "API requests are not rate-limited"),
    unsupported("kube-api-burst", Int, "API requests are not rate-limited"),
    unsupported("event-qps", Int, "events are not rate-limited"),
    unsupported("event-burst", Int, "events are not rate-limited"),
    unsupported(
        "protect-kernel-defaults",
        Bool,
        "kernel settings are not checked",
    ),
    unsupported(
        "make-iptables-util-chains",
        Bool,
        "no iptables chains are made",
    ),
    unsupported("oom-score-adj", Int, "the agent's score is upstream's -999"),
    unsupported(
        "hairpin-mode",
        Str,
        "the built-in bridge's hairpin mode is fixed",
    ),
    unsupported(
        "resolv-conf",
        Str,
        "pods' resolv.conf is built from clusterDNS",
    ),
    unsupported("node-status-max-images", Int, "every image is reported"),
    unsupported(
        "max-open-files",
        Int,
        "the open-file limit is the service manager's",
    ),
    unsupported(
        "streaming-connection-idle-timeout",
        Duration,
        "not configurable",
    ),
    unsupported("logging-format", Str, "logs are text"),
    unsupported("vmodule", Str, "set NODELET_LOG to filter by module"),
    unsupported(
        "cloud-config",
        Str,
        "in-tree cloud providers were removed upstream",
    ),
];
