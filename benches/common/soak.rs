//! The soak's shared parts (`benches/soak.rs`, `tests/soak.rs`): pods created and deleted
//! through a standalone node's static pod directory, one at a time with several alive, waited
//! for through the agent's own runtime (its CRI socket, `run-node --cri-listen`), and a census of
//! the agent (fds, memory, threads) and of every kind of leftover a pod can leave on the node.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use runtime::{RuntimeService, cri};

use super::procs;

pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// The built-in runtime's own cgroup root (pods the kubelet gives no cgroup go there).
pub const CGROUP_ROOT: &str = "/nodelet";
/// Where the built-in runtime of `run-node` keeps its address leases, per bridge.
pub const IPAM_DIR: &str = "/run/nodelet/ipam";
const POLL: Duration = Duration::from_millis(50);

/// The node under soak: its directories, its pod network's bridge and the agent's pid.
#[derive(Debug, Clone)]
pub struct SoakNode {
    /// Holds the root, the logs and the manifests: mounts are counted under it.
    pub work: PathBuf,
    pub root: PathBuf,
    /// The built-in runtime's state dir: sandbox processes' command lines name it, and the
    /// containers' rootfs are mounted in it.
    pub state: PathBuf,
    pub logs: PathBuf,
    pub manifests: PathBuf,
    pub bridge: String,
    pub agent_pid: u32,
    /// The kubelet's `cgroupRoot`: the run's own `kubepods` tree goes under it.
    pub cgroup_root: String,
}

/// A bridge name and a free /24 of `10.<second>.0.0/16` for a run of its own.
pub fn own_network(prefix: &str, second: u8) -> Result<(String, String)> {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr"])
        .output()
        .context("running ip -o -4 addr")?;
    let addrs = String::from_utf8_lossy(&out.stdout);
    let first = std::process::id() % 250;
    let n = (0..250)
        .map(|k| (first + k) % 250 + 1)
        .find(|n| !addrs.contains(&format!(" 10.{second}.{n}.")))
        .ok_or_else(|| anyhow!("no free /24 in 10.{second}.0.0/16"))?;
    Ok((
        format!("{prefix}{}", std::process::id() % 100_000),
        format!("10.{second}.{n}.0/24"),
    ))
}

/// The KubeletConfiguration of a soak node (standalone, its own bridge and /24, no masquerade,
/// no fixed port; eviction and image garbage collection not triggered by the host's disk,
/// which the node's dirs share).
pub fn kubelet_config(node: &SoakNode, cidr: &str) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         staticPodPath: {}\nfileCheckFrequency: 1s\nsyncFrequency: 10s\npodLogsDir: {}\n\
         address: 127.0.0.1\nport: 0\nhealthzPort: 0\n\
         authentication: {{webhook: {{enabled: false}}}}\nauthorization: {{mode: AlwaysAllow}}\n\
         podCIDR: {cidr}\nnodeletPodBridge: {}\nnodeletPodMasquerade: false\ncgroupRoot: {}\n\
         evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}\n\
         imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n",
        node.manifests.display(),
        node.logs.display(),
        node.bridge,
        node.cgroup_root,
    )
}

/// Pod `i` of run `run`: a busybox container that writes log lines on both streams and into
/// its emptyDirs (one on disk, one a tmpfs the kubelet mounts), then sleeps until SIGTERM.
pub fn manifest(run: &str, i: usize) -> (String, String) {
    let uid = format!("{run}-{i:06}");
    let script = format!(
        "trap 'exit 0' TERM; for n in 1 2 3 4 5; do echo soak {i} line $n; echo soak {i} err $n >&2; done; \
         echo {i} > /scratch/f; echo {i} > /mem/f; sleep 3600 & wait"
    );
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: soak-{i}\n  uid: {uid}\nspec:\n  \
         terminationGracePeriodSeconds: 5\n  containers:\n  - name: main\n    \
         image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    \
         command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    \
         - {{name: scratch, mountPath: /scratch}}\n    - {{name: mem, mountPath: /mem}}\n  \
         volumes:\n  - name: scratch\n    emptyDir: {{}}\n  - name: mem\n    \
         emptyDir: {{medium: Memory, sizeLimit: 1Mi}}\n"
    );
    (uid, yaml)
}

/// Drives the cycles: each adds a pod and waits until its container runs, then deletes the
/// oldest pods beyond `keep` and waits until the runtime reports each stopped (sandbox not
/// ready, no container running); the kubelet's garbage collection removes them afterwards.
pub struct Soak<'a> {
    rt: &'a dyn RuntimeService,
    manifests: PathBuf,
    run: String,
    alive: VecDeque<(usize, String)>,
    next: usize,
    timeout: Duration,
    /// Every sandbox id the runtime listed for a pod of this run (their cgroups are counted).
    pub seen_sandboxes: HashSet<String>,
}

impl<'a> Soak<'a> {
    pub fn new(rt: &'a dyn RuntimeService, manifests: &Path, run: &str, timeout: Duration) -> Self {
        Soak {
            rt,
            manifests: manifests.to_path_buf(),
            run: run.to_string(),
            alive: VecDeque::new(),
            next: 0,
            timeout,
            seen_sandboxes: HashSet::new(),
        }
    }

    pub fn alive(&self) -> usize {
        self.alive.len()
    }

    fn file(&self, i: usize) -> PathBuf {
        self.manifests.join(format!("soak-{i}.yaml"))
    }

    /// One cycle: a new pod running, then the oldest deleted while more than `keep` are alive.
    pub async fn cycle(&mut self, keep: usize) -> Result<()> {
        let i = self.next;
        self.next += 1;
        let (uid, yaml) = manifest(&self.run, i);
        // Written aside (hidden files are skipped) and renamed in: the source never reads half.
        let tmp = self.manifests.join(format!(".soak-{i}.yaml"));
        std::fs::write(&tmp, yaml).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.file(i)).context("renaming the manifest in")?;
        self.alive.push_back((i, uid.clone()));
        self.wait(&uid, true)
            .await
            .with_context(|| format!("pod soak-{i} never ran"))?;
        while self.alive.len() > keep {
            self.delete_oldest().await?;
        }
        Ok(())
    }

    /// Deletes the oldest pod's manifest and waits until the runtime reports it stopped.
    pub async fn delete_oldest(&mut self) -> Result<()> {
        let Some((i, uid)) = self.alive.pop_front() else {
            return Ok(());
        };
        let file = self.file(i);
        std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        self.wait(&uid, false)
            .await
            .with_context(|| format!("pod soak-{i} never stopped"))
    }

    /// Deletes every pod left, one after the other.
    pub async fn delete_all(&mut self) -> Result<()> {
        while !self.alive.is_empty() {
            self.delete_oldest().await?;
        }
        Ok(())
    }

    /// Waits until pod `uid` runs (its container running) or is stopped (no ready sandbox, no
    /// running container).
    async fn wait(&mut self, uid: &str, running: bool) -> Result<()> {
        let start = Instant::now();
        let selector: HashMap<String, String> = [(LABEL_POD_UID.into(), uid.into())].into();
        loop {
            let sandboxes = self
                .rt
                .list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        label_selector: selector.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .context("ListPodSandbox")?
                .items;
            self.seen_sandboxes
                .extend(sandboxes.iter().map(|s| s.id.clone()));
            let containers = self
                .rt
                .list_containers(cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        label_selector: selector.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .context("ListContainers")?
                .containers;
            let running_now = containers
                .iter()
                .any(|c| c.state == cri::ContainerState::ContainerRunning as i32);
            let ready = sandboxes
                .iter()
                .any(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
            if running && running_now || !running && !running_now && !ready {
                return Ok(());
            }
            ensure!(
                start.elapsed() < self.timeout,
                "after {:?}: sandboxes {:?}, containers {:?}",
                self.timeout,
                sandboxes
                    .iter()
                    .map(|s| (&s.id, s.state))
                    .collect::<Vec<_>>(),
                containers
                    .iter()
                    .map(|c| (&c.id, c.state))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Waits until the runtime lists no sandbox and no container (the kubelet's garbage collection
/// removed them), noting the sandboxes it sees.
pub async fn wait_all_removed(
    rt: &dyn RuntimeService,
    seen: &mut HashSet<String>,
    timeout: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let sandboxes = rt
            .list_pod_sandbox(Default::default())
            .await
            .context("ListPodSandbox")?
            .items;
        seen.extend(sandboxes.iter().map(|s| s.id.clone()));
        let containers = rt
            .list_containers(Default::default())
            .await
            .context("ListContainers")?
            .containers;
        if sandboxes.is_empty() && containers.is_empty() {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < timeout,
            "{} sandboxes and {} containers still listed {timeout:?} after the last pod was deleted",
            sandboxes.len(),
            containers.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What is left on the node of pods, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Sandbox processes (and their helpers: the command line names the root dir).
    pub sandbox_procs: usize,
    /// The containers' processes (descendants of the sandbox processes).
    pub container_procs: usize,
    /// Mount points under the node's work dir (overlay rootfs, tmpfs volumes, binds).
    pub mounts: usize,
    /// Cgroup directories of the run's sandboxes, in every hierarchy.
    pub cgroups: usize,
    /// `<root>/pods/<uid>`: the kubelet's pod directories.
    pub pod_dirs: usize,
    /// `<state>/sandboxes/<id>`: sandbox state dirs.
    pub state_dirs: usize,
    /// `<state>/containers/<id>`: container bundles.
    pub bundles: usize,
    /// `<root>/cri/{sandboxes,containers}/*.json`: the runtime's records.
    pub records: usize,
    /// `<root>/images/containers/<key>`: rootfs keys (upper/work dirs) in the image store.
    pub rootfs_keys: usize,
    /// Network namespaces other than the node's held by the run's processes or the agent's fds.
    pub netns: usize,
    /// Interfaces enslaved to the run's bridge (the pods' veth peers).
    pub veths: usize,
    /// Address leases of the run's bridge.
    pub leases: usize,
    /// `<podLogsDir>/<ns>_<name>_<uid>`: pod log directories.
    pub log_dirs: usize,
}

impl Leftovers {
    pub fn kinds(&self) -> [(&'static str, usize); 13] {
        [
            ("sandbox procs", self.sandbox_procs),
            ("container procs", self.container_procs),
            ("mounts", self.mounts),
            ("cgroups", self.cgroups),
            ("pod dirs", self.pod_dirs),
            ("state dirs", self.state_dirs),
            ("bundles", self.bundles),
            ("records", self.records),
            ("rootfs keys", self.rootfs_keys),
            ("netns", self.netns),
            ("veths", self.veths),
            ("leases", self.leases),
            ("log dirs", self.log_dirs),
        ]
    }

    /// The kinds that differ from `base`: (kind, base, now).
    pub fn differences(&self, base: &Leftovers) -> Vec<(&'static str, usize, usize)> {
        self.kinds()
            .iter()
            .zip(base.kinds())
            .filter(|((_, now), (_, was))| now != was)
            .map(|((kind, now), (_, was))| (*kind, was, *now))
            .collect()
    }
}

/// The agent's own figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Agent {
    pub fds: usize,
    pub rss_kb: u64,
    pub pss_kb: u64,
    pub threads: usize,
}

/// The agent's open fds, RSS, PSS and threads.
pub fn agent(pid: u32) -> Result<Agent> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing /proc/{pid}/fd (is the agent gone?)"))?
        .count();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing /proc/{pid}/task"))?
        .count();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| -> Result<u64> {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/smaps_rollup"))
    };
    Ok(Agent {
        fds,
        rss_kb: field("Rss:")?,
        pss_kb: field("Pss:")?,
        threads,
    })
}

/// What each of the agent's fds is (`socket:[...]` with the inode dropped, `anon_inode:[...]`,
/// a path), sorted: two of these tell which kinds of fds came or went.
pub fn fd_kinds(pid: u32) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| {
            let t = t.to_string_lossy().into_owned();
            match t.split_once(":[") {
                Some((kind, _)) if kind == "socket" || kind == "pipe" || kind == "net" => {
                    format!("{kind}:[..]")
                }
                _ => t,
            }
        })
        .collect();
    out.sort();
    out
}

/// The entries of `after` not in `before` (+) and of `before` not in `after` (-), as multisets.
pub fn fd_changes(before: &[String], after: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest: Vec<&String> = before.iter().collect();
    for a in after {
        match rest.iter().position(|b| *b == a) {
            Some(i) => {
                rest.remove(i);
            }
            None => out.push(format!("+{a}")),
        }
    }
    out.extend(rest.into_iter().map(|b| format!("-{b}")));
    out
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn entries_where(dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| keep(&e.file_name().to_string_lossy()))
                .count()
        })
        .unwrap_or(0)
}

/// Directories at and below `dir` (0 when it does not exist).
fn dirs_under(dir: &Path) -> usize {
    let Ok(list) = std::fs::read_dir(dir) else {
        return 0;
    };
    1 + list
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| dirs_under(&e.path()))
        .sum::<usize>()
}

/// Directories at and below each pod cgroup (`pod<uid>`) of the kubelet tree `kubepods` in one
/// hierarchy: Guaranteed pods' directly in it, the others' in its QoS cgroups.
fn pod_cgroup_dirs(kubepods: &Path) -> usize {
    [
        kubepods.to_path_buf(),
        kubepods.join("burstable"),
        kubepods.join("besteffort"),
    ]
    .iter()
    .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
    .filter(|e| e.file_name().to_string_lossy().starts_with("pod"))
    .map(|e| dirs_under(&e.path()))
    .sum()
}

/// The cgroup hierarchies' mount points: /sys/fs/cgroup itself on v2, its directories (not the
/// `cpu -> cpu,cpuacct` links) on v1 and hybrid.
fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut out = Vec::new();
    if base.join("cgroup.procs").exists() {
        out.push(base.to_path_buf());
    }
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) && e.path().join("cgroup.procs").exists() {
            out.push(e.path());
        }
    }
    out
}

/// The kubelet's cgroup tree of `node` (`kubepods`), relative to a hierarchy.
pub fn kubepods(node: &SoakNode) -> PathBuf {
    Path::new(node.cgroup_root.trim_start_matches('/')).join("kubepods")
}

/// Counts what the node holds now. `seen` gets the sandbox ids found on disk too.
pub fn census(node: &SoakNode, seen: &mut HashSet<String>) -> Result<Leftovers> {
    let root = &node.root;
    let mut l = Leftovers::default();
    for e in std::fs::read_dir(node.state.join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        seen.insert(e.file_name().to_string_lossy().into_owned());
    }
    for e in std::fs::read_dir(root.join("cri/sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(id) = e.file_name().to_string_lossy().strip_suffix(".json") {
            seen.insert(id.to_string());
        }
    }

    // Processes: the sandbox side names the root or the state dir; the containers are their
    // descendants.
    let all = procs::processes();
    let (root_s, state_s) = (root.to_string_lossy(), node.state.to_string_lossy());
    let sandbox_side: HashSet<u32> = all
        .iter()
        .filter(|p| {
            p.pid != node.agent_pid
                && (p.cmdline.contains(root_s.as_ref()) || p.cmdline.contains(state_s.as_ref()))
        })
        .map(|p| p.pid)
        .collect();
    let mut containers = HashSet::new();
    let mut frontier: Vec<u32> = sandbox_side.iter().copied().collect();
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            if !sandbox_side.contains(&p.pid) && containers.insert(p.pid) {
                frontier.push(p.pid);
            }
        }
    }
    l.sandbox_procs = sandbox_side.len();
    l.container_procs = containers.len();

    // Network namespaces other than the node's: the run's processes', and any the agent holds.
    let host = std::fs::read_link("/proc/self/ns/net").ok();
    let mut netns = HashSet::new();
    for pid in sandbox_side.iter().chain(&containers) {
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            netns.insert(ns);
        }
    }
    for e in std::fs::read_dir(format!("/proc/{}/fd", node.agent_pid))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(e.path())
            && target.to_string_lossy().starts_with("net:[")
        {
            netns.insert(target);
        }
    }
    if let Some(host) = host {
        netns.remove(&host);
    }
    l.netns = netns.len();

    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let (work, state) = (node.work.to_string_lossy(), node.state.to_string_lossy());
    l.mounts = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|m| m.starts_with(work.as_ref()) || m.starts_with(state.as_ref()))
        .count();

    // The pod cgroups (with their sandboxes' and containers'), not the QoS cgroups, which
    // stay.
    l.cgroups = hierarchies()
        .iter()
        .map(|h| pod_cgroup_dirs(&h.join(kubepods(node))))
        .sum();

    l.pod_dirs = entries(&root.join("pods"));
    l.state_dirs = entries(&node.state.join("sandboxes"));
    l.bundles = entries(&node.state.join("containers"));
    l.records = entries(&root.join("cri/sandboxes")) + entries(&root.join("cri/containers"));
    l.rootfs_keys = entries(&root.join("images/containers"));
    l.veths = entries(&Path::new("/sys/class/net").join(&node.bridge).join("brif"));
    l.leases = entries_where(&Path::new(IPAM_DIR).join(&node.bridge), |n| {
        n.parse::<std::net::Ipv4Addr>().is_ok()
    });
    l.log_dirs = entries(&node.logs);
    Ok(l)
}

/// Removes what the node may have left (after a failure; nothing on success): the sandboxes
/// through a runtime opened on the root dir (their processes, addresses), then mounts, the
/// run's cgroup tree, its bridge and lease directory. Returns the errors met.
pub async fn remove_everything(
    node: &SoakNode,
    nodelet_bin: &Path,
    cidr: &str,
) -> Vec<anyhow::Error> {
    let mut errors = Vec::new();
    let network = match runtime::builtin::parse_pod_cidr(cidr) {
        Ok(pod_cidr) => Some(runtime::builtin::NetworkConfig {
            bridge: node.bridge.clone(),
            pod_cidrs: vec![pod_cidr],
            ipam_dir: PathBuf::from(IPAM_DIR),
            masquerade: false,
            cluster_cidrs: Vec::new(),
        }),
        Err(e) => {
            errors.push(anyhow!("pod CIDR {cidr}: {e}"));
            None
        }
    };
    if node.root.join("cri").exists() {
        match runtime::builtin::Config::new(&node.root) {
            Ok(mut cfg) => {
                cfg.sandbox_program = nodelet_bin.to_path_buf();
                cfg.cgroup_root = CGROUP_ROOT.to_string();
                cfg.state_dir = Some(node.state.clone());
                cfg.network = network.clone();
                match runtime::builtin::BuiltinRuntime::new(cfg).await {
                    Ok(rt) => {
                        let list = rt.list_pod_sandbox(Default::default()).await;
                        for sb in list.map(|l| l.items).unwrap_or_default() {
                            if let Err(e) = rt
                                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                                    pod_sandbox_id: sb.id.clone(),
                                })
                                .await
                            {
                                errors.push(anyhow!("removing sandbox {}: {e}", sb.id));
                            }
                        }
                    }
                    Err(e) => errors.push(anyhow!("opening the runtime on the root dir: {e}")),
                }
            }
            Err(e) => errors.push(anyhow!("runtime config: {e}")),
        }
    }
    if let Err(e) = super::unmount_under(&node.work) {
        errors.push(e);
    }
    let exists = hierarchies()
        .iter()
        .any(|h| h.join(node.cgroup_root.trim_start_matches('/')).exists());
    if exists && let Err(e) = super::remove_cgroup(&node.cgroup_root) {
        errors.push(e);
    }
    if let Some(net) = &network
        && Path::new("/sys/class/net").join(&net.bridge).exists()
        && let Err(e) = runtime::builtin::remove_node_network(net)
    {
        errors.push(anyhow!("removing bridge {}: {e}", net.bridge));
    }
    let leases = Path::new(IPAM_DIR).join(&node.bridge);
    if leases.exists()
        && let Err(e) = std::fs::remove_dir_all(&leases)
    {
        errors.push(anyhow!("removing {}: {e}", leases.display()));
    }
    errors
}
