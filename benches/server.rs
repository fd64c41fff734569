//! The kubelet's HTTPS API under a metrics scraper: the latency of `/stats/summary` and
//! `/metrics/resource` with N pods running, and the agent's CPU while metrics-server scrapes it
//! every 15 s (issue 13).
//!
//! ```sh
//! sudo cargo bench --bench server                                  # 100 pods, 60 s windows
//! sudo BENCH_SERVER_PODS=20 BENCH_SERVER_SECS=30 BENCH_SERVER_GETS=20 cargo bench --bench server
//! ```
//!
//! The kubelet runs standalone in this process (`nodelet::kubelet::Kubelet::start`, no API
//! server) on the built-in runtime (a root dir, cgroup and pod network bridge of this run's
//! own), with its HTTPS server on 127.0.0.1 at a free port and its self-signed serving
//! certificate. Authentication as a metrics-server would have it: a client certificate signed by
//! the CA in `clientCAFile` (anonymous requests off), authorization `AlwaysAllow` (no API server
//! to ask). N (`BENCH_SERVER_PODS`, 100) static pods, each one busybox container `sleep 3600`
//! on the pod network, are written to the `staticPodPath`; once all run (and a settling pause),
//! - **latency**: `BENCH_SERVER_GETS` (50) sequential GETs of `/stats/summary`, then of
//!   `/metrics/resource`, over one keep-alive HTTPS connection (opened and warmed with one GET
//!   first): median, p90, p99 (nearest rank), min and the response size;
//! - **CPU**: over a window of `BENCH_SERVER_SECS` (60) seconds each, the agent's CPU (this
//!   process: utime + stime from `/proc/self/stat`, the kubelet and the in-process runtime, less
//!   the scraper's own thread) and the sandbox processes', as % of one core: idle (nobody
//!   scrapes), then while a scraper GETs `/metrics/resource` every 15 s (as metrics-server
//!   does, one keep-alive connection), then the same with `/stats/summary`. The scraper runs on
//!   a thread of its own (its own single-threaded tokio runtime, the TLS client and the body
//!   reading included) whose CPU (`/proc/thread-self/stat`) is taken out. The difference to idle
//!   divided by the scrapes in the window is the CPU per scrape; the agent's CPU between the
//!   start and the end of each scrape (less the scraper's) is shown as a second estimate.
//!
//! Ticks are 10 ms: over a 60 s window one tick is 0.017% of one core, and a window holds 4
//! scrapes, so the per-scrape difference is only good to a few ms — and the idle background
//! (PLEG relists, housekeeping, the probing of nothing) varies on a shared machine. Then the pods
//! go (manifests deleted), the kubelet stops, and the bench checks nothing is left. Needs root;
//! otherwise prints a SKIP line and exits 0.

#[path = "../tests/common/containerd.rs"]
mod containerd;

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use common::node::{
    build_busybox, check_nothing_left, own_network, remove_all_sandboxes, remove_pods,
};
use common::procs::{self, Kind, cpu_snapshot, cpu_used};
use common::{env_count, loadavg, remove_cgroup, stats, unmount_under};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::PodStatus;
use nodelet::config::{AuthzMode, KubeletConfig, ServerConfig};
use nodelet::kubelet::{Kubelet, Runtime};
use runtime::builtin::{BuiltinRuntime, Config};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use containerd::BUSYBOX;

const NODE_NAME: &str = "bench-node";
/// metrics-server's default `--metric-resolution`.
const SCRAPE_EVERY: Duration = Duration::from_secs(15);
/// After all pods run: their starts are over, the first stats are collected.
const SETTLE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(200);
const SUMMARY: &str = "/stats/summary";
const RESOURCE: &str = "/metrics/resource";

struct Opts {
    pods: usize,
    window: Duration,
    gets: usize,
}

fn main() -> ExitCode {
    if let Some(code) = common::run_sandbox_if_asked() {
        return code;
    }
    if !common::bench_run("server", "the server benchmark runs real containers") {
        return ExitCode::SUCCESS;
    }
    common::init_logging();
    common::run_bench(async { bench(&opts()?).await })
}

fn opts() -> Result<Opts> {
    let pods = env_count("BENCH_SERVER_PODS", 100)?;
    ensure!(
        pods <= 200,
        "BENCH_SERVER_PODS: at most 200 (a /24 per pod network)"
    );
    Ok(Opts {
        pods,
        window: Duration::from_secs(env_count("BENCH_SERVER_SECS", 60)? as u64),
        gets: env_count("BENCH_SERVER_GETS", 50)?,
    })
}

// ---------------------------------------------------------------------------------------------
// Set-up and clean-up.

async fn bench(opts: &Opts) -> Result<()> {
    let work = tempfile::Builder::new()
        .prefix("nodelet-bench-server-")
        .tempdir()
        .context("creating the work dir")?;
    let busybox = work.path().join("busybox.tar");
    build_busybox(&busybox)?;

    // Short root path: sandbox socket paths must fit sun_path.
    let root = tempfile::Builder::new()
        .prefix("nls")
        .tempdir()
        .context("creating the runtime root dir")?;
    let cgroup_root = format!("/nodelet-bench-server-{}", std::process::id());
    let network = own_network(root.path(), "nls")?;
    let mut cfg = Config::new(root.path()).context("runtime config")?;
    cfg.cgroup_root = cgroup_root.clone();
    cfg.network = Some(network.clone());
    // The state dir inside the root dir: sandbox processes and mounts are told by its path.
    cfg.state_dir = Some(root.path().join("run"));
    let builtin = BuiltinRuntime::new(cfg)
        .await
        .context("opening the built-in runtime")?;

    let result = run(&builtin, root.path(), &busybox, work.path(), opts).await;

    remove_all_sandboxes(&builtin).await;
    drop(builtin);
    let mut cleanup = Vec::new();
    if let Err(e) = unmount_under(root.path()) {
        cleanup.push(e);
    }
    if let Err(e) = remove_cgroup(&cgroup_root) {
        cleanup.push(e);
    }
    if let Err(e) = runtime::builtin::remove_node_network(&network) {
        cleanup.push(anyhow!("removing bridge {}: {e}", network.bridge));
    }
    for e in &cleanup {
        eprintln!("cleanup: {e:#}");
    }
    result?;
    match cleanup.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A CA (written to `dir/client-ca.crt`) and a client certificate it signed, as
/// metrics-server's.
fn client_cert(dir: &Path) -> Result<ClientCert> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "bench client CA");
    let ca_cert = ca.self_signed(&ca_key)?;
    std::fs::write(dir.join("client-ca.crt"), ca_cert.pem()).context("writing the CA")?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:metrics-server");
    let cert = params.signed_by(&key, &issuer)?;
    Ok((
        vec![cert.der().clone()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .map_err(|e| anyhow!("client key: {e}"))?,
    ))
}

type ClientCert = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// A free port on 127.0.0.1 (bound and released).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a port")?;
    Ok(l.local_addr()?.port())
}

async fn run(
    builtin: &BuiltinRuntime,
    root: &Path,
    busybox: &Path,
    work: &Path,
    opts: &Opts,
) -> Result<()> {
    builtin
        .image_store()
        .import(busybox)
        .context("importing busybox into the built-in runtime")?;
    let dir = work.join("kubelet");
    let manifests = dir.join("manifests");
    for d in [&manifests, &dir.join("root"), &dir.join("logs")] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let cert = client_cert(&dir)?;
    let port = free_port()?;
    let cfg = KubeletConfig {
        server: ServerConfig {
            port,
            anonymous: false,
            token_webhook: false,
            client_ca_file: Some(dir.join("client-ca.crt")),
            authz_mode: AuthzMode::AlwaysAllow,
            ..ServerConfig::loopback_any_port()
        },
        static_pod_path: manifests.clone(),
        file_check_frequency: Duration::from_secs(1),
        pod_logs_dir: dir.join("logs"),
        root_dir: dir.join("root"),
        node_name: NODE_NAME.into(),
        node_ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        max_pods: u32::try_from(opts.pods).unwrap_or(u32::MAX).max(110),
        ..KubeletConfig::default()
    };
    let serving = dir.join("root/pki/kubelet.crt");
    println!(
        "== server: {} pods (busybox `sleep 3600`, pod network) through the kubelet (Kubelet::start, standalone, static pods, built-in runtime), HTTPS on 127.0.0.1:{port}, client certificate, AlwaysAllow",
        opts.pods
    );
    println!(
        "   {} CPUs; load {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let b = Arc::new(builtin.clone());
    let rt = Runtime {
        runtime: b.clone(),
        images: b,
    };
    let runtime = rt.runtime.clone();
    let kubelet = Kubelet::start(cfg, rt, None)
        .await
        .context("starting the kubelet")?;
    let uids: Vec<String> = (0..opts.pods)
        .map(|i| format!("server-{i}-{}", std::process::id()))
        .collect();
    let kind = Kind::Builtin {
        root: root.to_string_lossy().into_owned(),
    };
    let target = Target {
        port,
        serving,
        cert: Arc::new(cert),
    };
    let measured = measure(&kubelet, &kind, &manifests, &uids, &target, opts).await;
    let removed = remove_pods(runtime.as_ref(), &manifests, &uids).await;
    kubelet.stop().await;
    if removed.is_err() {
        remove_all_sandboxes(runtime.as_ref()).await;
    }
    measured?;
    let removed = removed?;
    check_nothing_left(runtime.as_ref(), &kind).await?;
    println!(
        "   pods removed (manifests deleted -> no sandbox listed) in {:.1} s; nothing left; load {}",
        removed.as_secs_f64(),
        loadavg()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The HTTPS client: one keep-alive connection, reopened when the server closed it.

#[derive(Clone)]
struct Target {
    port: u16,
    serving: PathBuf,
    cert: Arc<ClientCert>,
}

struct Client {
    target: Target,
    config: Arc<rustls::ClientConfig>,
    sender: Option<hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>>,
    /// Connections opened.
    connects: usize,
}

impl Client {
    fn new(target: &Target) -> Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&target.serving)
            .with_context(|| format!("reading {}", target.serving.display()))?
        {
            roots.add(c?)?;
        }
        let (chain, key) = target.cert.as_ref();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain.clone(), key.clone_key())?;
        Ok(Client {
            target: target.clone(),
            config: Arc::new(config),
            sender: None,
            connects: 0,
        })
    }

    async fn connect(&mut self) -> Result<()> {
        let tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, self.target.port))
            .await
            .context("connecting")?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        let tls = tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await
            .context("TLS handshake")?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        self.sender = Some(sender);
        self.connects += 1;
        Ok(())
    }

    /// GET `path`: the body's size in bytes.
    async fn get(&mut self, path: &str) -> Result<usize> {
        let reusable = match self.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            self.connect().await?;
        }
        let Some(sender) = self.sender.as_mut() else {
            bail!("no connection");
        };
        let req = hyper::Request::builder()
            .method("GET")
            .uri(path)
            .header("Host", format!("127.0.0.1:{}", self.target.port))
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let resp = sender
            .send_request(req)
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        ensure!(
            status.is_success(),
            "GET {path}: {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
        Ok(body.len())
    }
}

// ---------------------------------------------------------------------------------------------
// The measurements.

async fn measure(
    kubelet: &Kubelet,
    kind: &Kind,
    manifests: &Path,
    uids: &[String],
    target: &Target,
    opts: &Opts,
) -> Result<()> {
    let start = Instant::now();
    for (i, uid) in uids.iter().enumerate() {
        let path = manifests.join(format!("sleep-{i}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&manifest(i, uid))?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let timeout = Duration::from_secs(120 + 2 * uids.len() as u64);
    loop {
        let running = uids
            .iter()
            .filter(|u| kubelet.pod_status(u).is_some_and(|s| is_running(&s)))
            .count();
        if running == uids.len() {
            break;
        }
        ensure!(
            start.elapsed() < timeout,
            "{running} of {} pods running after {timeout:?}",
            uids.len()
        );
        tokio::time::sleep(POLL).await;
    }
    println!(
        "   all {} pods running {:.1} s after their manifests were written",
        uids.len(),
        start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;

    // Latency: one connection, warmed with one GET of each path.
    let mut client = Client::new(target)?;
    for path in [SUMMARY, RESOURCE] {
        client.get(path).await?;
    }
    for path in [SUMMARY, RESOURCE] {
        let mut lat = Vec::with_capacity(opts.gets);
        let mut sizes = Vec::with_capacity(opts.gets);
        for _ in 0..opts.gets {
            let t = Instant::now();
            sizes.push(client.get(path).await?);
            lat.push(t.elapsed());
        }
        let s = stats(&lat);
        sizes.sort_unstable();
        println!(
            "   GET {path:<17} {} sequential (keep-alive): median {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  min {:.2} ms; response {:.1} KiB ({} to {} bytes)",
            s.n,
            s.median,
            s.p90,
            s.p99,
            s.min,
            sizes[sizes.len() / 2] as f64 / 1024.0,
            sizes[0],
            sizes[sizes.len() - 1]
        );
    }
    println!(
        "   ({} connection(s) opened for {} GETs; load {})",
        client.connects,
        2 * (opts.gets + 1),
        loadavg()
    );
    drop(client);

    // CPU: idle, then scraped every 15 s.
    println!(
        "   CPU over {:.0} s windows: utime+stime from /proc/<pid>/stat, % of one core; the agent is this process less the scraper's thread",
        opts.window.as_secs_f64()
    );
    let idle = cpu_window(kind, opts.window, None).await?;
    idle.print("idle");
    let mut rows = Vec::new();
    for path in [RESOURCE, SUMMARY] {
        let w = cpu_window(kind, opts.window, Some((target.clone(), path))).await?;
        w.print(&format!("scraping {path} every 15 s"));
        rows.push((path, w));
    }
    let running = uids
        .iter()
        .filter(|u| kubelet.pod_status(u).is_some_and(|s| is_running(&s)))
        .count();
    println!(
        "   summary ({running} of {} pods running at the end):",
        uids.len()
    );
    for (path, w) in &rows {
        let diff_ms = w.agent_ms - idle.agent_ms * w.secs / idle.secs;
        println!(
            "   {path:<17} agent {:.2}% vs idle {:.2}% of one core: +{:.3} points; {} scrapes: {:.1} ms CPU per scrape from the difference, {:.1} ms measured around each scrape (agent, during the request); scrape latency median {:.1} ms, {:.1} KiB",
            w.agent_pct(),
            idle.agent_pct(),
            w.agent_pct() - idle.agent_pct(),
            w.scrapes,
            diff_ms / w.scrapes.max(1) as f64,
            w.during_ms / w.scrapes.max(1) as f64,
            w.latency_ms,
            w.size as f64 / 1024.0
        );
    }
    Ok(())
}

/// What one CPU window measured.
struct Window {
    secs: f64,
    /// The agent's CPU in ms (this process less the scraper thread).
    agent_ms: f64,
    sandboxes: (usize, f64),
    scraper_ms: f64,
    machine_pct: f64,
    scrapes: usize,
    /// The agent's CPU between the start and the end of each scrape, summed.
    during_ms: f64,
    latency_ms: f64,
    size: usize,
}

impl Window {
    fn agent_pct(&self) -> f64 {
        self.agent_ms / 10.0 / self.secs
    }

    fn print(&self, what: &str) {
        println!(
            "   {what:<38} agent {:.2}% + {} sandboxes {:.2}% of one core; scraper thread {:.2}% (not counted); {} scrapes; whole machine busy {:.0}% of one core; load {}",
            self.agent_pct(),
            self.sandboxes.0,
            self.sandboxes.1 / 10.0 / self.secs,
            self.scraper_ms / 10.0 / self.secs,
            self.scrapes,
            self.machine_pct,
            loadavg()
        );
    }
}

/// utime + stime of `/proc/<path>/stat` in ms.
fn own_cpu_ms(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{path}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after `(comm)`.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    let ticks = field(11)? + field(12)?;
    Some(ticks as f64 * 1000.0 / procs::clock_ticks() as f64)
}

/// What the scraper thread did.
#[derive(Default)]
struct Scraped {
    own_ms: f64,
    scrapes: usize,
    during_ms: f64,
    latencies: Vec<Duration>,
    size: usize,
}

/// The scraper: GETs `path` at once and every 15 s until `window` is over, on this thread with
/// its own runtime; its own CPU over the whole time.
fn scrape(target: Target, path: &'static str, window: Duration) -> Result<Scraped> {
    let t0 = Instant::now();
    let own0 = own_cpu_ms("thread-self").context("reading /proc/thread-self/stat")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = rt.block_on(async {
        let mut client = Client::new(&target)?;
        let mut out = Scraped::default();
        let mut next = t0;
        while next.duration_since(t0) < window {
            tokio::time::sleep_until(next.into()).await;
            let (p0, s0) = (own_cpu_ms("self"), own_cpu_ms("thread-self"));
            let t = Instant::now();
            out.size = client.get(path).await?;
            out.latencies.push(t.elapsed());
            let (p1, s1) = (own_cpu_ms("self"), own_cpu_ms("thread-self"));
            if let (Some(p0), Some(s0), Some(p1), Some(s1)) = (p0, s0, p1, s1) {
                out.during_ms += (p1 - p0) - (s1 - s0);
            }
            out.scrapes += 1;
            next += SCRAPE_EVERY;
        }
        // Wait out the window, the connection open.
        tokio::time::sleep_until((t0 + window).into()).await;
        drop(client);
        anyhow::Ok(out)
    })?;
    drop(rt);
    out.own_ms = own_cpu_ms("thread-self").unwrap_or(own0) - own0;
    Ok(out)
}

async fn cpu_window(
    kind: &Kind,
    window: Duration,
    scraper: Option<(Target, &'static str)>,
) -> Result<Window> {
    let g0 = procs::group_processes(kind, |_| false)?;
    let sb0 = cpu_snapshot(g0.group.iter().skip(1));
    let m0 = procs::machine_ticks();
    let p0 = own_cpu_ms("self").context("reading /proc/self/stat")?;
    let t0 = Instant::now();
    let scraped = match scraper {
        Some((target, path)) => {
            let handle = std::thread::Builder::new()
                .name("scraper".into())
                .spawn(move || scrape(target, path, window))?;
            // The scraper's thread ends with the window; wait for it off the runtime.
            tokio::task::spawn_blocking(move || handle.join())
                .await?
                .map_err(|_| anyhow!("the scraper thread panicked"))??
        }
        None => {
            tokio::time::sleep(window).await;
            Scraped::default()
        }
    };
    let p1 = own_cpu_ms("self").context("reading /proc/self/stat")?;
    let secs = t0.elapsed().as_secs_f64();
    let g1 = procs::group_processes(kind, |_| false)?;
    let sb1 = cpu_snapshot(g1.group.iter().skip(1));
    let m1 = procs::machine_ticks();
    let hz = procs::clock_ticks() as f64;
    let sandboxes: f64 = g1
        .group
        .iter()
        .skip(1)
        .map(|p| cpu_used(&sb0, &sb1, p.pid) as f64 * 1000.0 / hz)
        .sum();
    let machine_pct = match (m0, m1) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            (b1 - b0) as f64 / (t1 - t0) as f64 * cpus * 100.0
        }
        _ => f64::NAN,
    };
    let latency_ms = stats(&scraped.latencies).median;
    Ok(Window {
        secs,
        agent_ms: (p1 - p0) - scraped.own_ms,
        sandboxes: (g1.group.len().saturating_sub(1), sandboxes),
        scraper_ms: scraped.own_ms,
        machine_pct,
        scrapes: scraped.scrapes,
        during_ms: scraped.during_ms,
        latency_ms,
        size: scraped.size,
    })
}

/// The static pod `i`: one busybox container sleeping.
fn manifest(i: usize, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("sleep-{i}"), "namespace": "bench", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    })
}

fn is_running(status: &PodStatus) -> bool {
    status.phase.as_deref() == Some("Running")
        && status
            .container_statuses
            .iter()
            .flatten()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}
