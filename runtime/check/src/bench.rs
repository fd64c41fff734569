//! The lifecycle bench: each CRI call of a pod's life timed over N iterations, and the
//! runtime's memory with the helper processes it starts per pod.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::ctx::{Ctx, Env, Target};
use crate::outcome::{OrFail, Step, Stop};

/// The calls timed, in the order of a pod's life.
pub const OPERATIONS: [&str; 8] = [
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "ExecSync",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
];

/// What the bench measured on one runtime.
#[derive(Debug, Clone, Default)]
pub struct Bench {
    /// Each operation's durations, in [`OPERATIONS`]' order.
    pub samples: Vec<Vec<Duration>>,
    pub memory: Option<Memory>,
    /// Why the bench stopped early, if it did.
    pub error: Option<String>,
}

/// The runtime's memory, found through the socket's peer credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    pub runtime_pid: u32,
    /// The runtime process's proportional set size (its RSS where smaps_rollup is unreadable).
    pub runtime_kib: u64,
    /// The processes that appeared for a pod with one container, other than the container's.
    pub helpers_per_pod: Vec<String>,
    /// Their memory together (PSS, or RSS).
    pub helpers_kib: u64,
}

impl Bench {
    pub fn failed(why: &str) -> Bench {
        Bench {
            error: Some(why.into()),
            ..Default::default()
        }
    }

    /// The median and 90th percentile of `op`, when it was measured.
    pub fn stats(&self, op: &str) -> Option<(Duration, Duration)> {
        let i = OPERATIONS.iter().position(|o| *o == op)?;
        let mut v = self.samples.get(i)?.clone();
        if v.is_empty() {
            return None;
        }
        v.sort();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.9)))
    }
}

/// Runs the bench on `target`.
pub async fn run(target: &Target, env: &Env, iterations: u32) -> Bench {
    let ctx = Ctx {
        target,
        env,
        scenario: "bench",
    };
    let mut bench = Bench {
        samples: vec![Vec::new(); OPERATIONS.len()],
        ..Default::default()
    };
    if let Some(socket) = target.socket.as_deref() {
        match memory(&ctx, socket).await {
            Ok(m) => bench.memory = m,
            Err(Stop::Fail(e) | Stop::Skip(e)) => {
                bench.error = Some(format!("measuring memory: {e}"));
                return bench;
            }
        }
    }
    for i in 0..iterations {
        if let Err(Stop::Fail(e) | Stop::Skip(e)) = lifecycle(&ctx, i, &mut bench.samples).await {
            bench.error = Some(format!("iteration {i}: {e}"));
            break;
        }
    }
    bench
}

/// One pod's life, each call timed into `samples`.
async fn lifecycle(c: &Ctx<'_>, i: u32, samples: &mut [Vec<Duration>]) -> Step {
    let mut timed = Timer { samples };
    let cfg = c.pod_config(&format!("bench-{i}"));
    let t = Instant::now();
    let pod = c.run_pod(cfg).await?;
    timed.record(0, t);
    let config = c.container_config("c", &["sleep", "3600"]);
    let t = Instant::now();
    let id = c.create(&pod, config).await?.or_fail("CreateContainer")?;
    timed.record(1, t);
    let t = Instant::now();
    c.try_start(&id).await?.or_fail("StartContainer")?;
    timed.record(2, t);
    let t = Instant::now();
    let r = c.exec(&id, &["true"]).await?;
    timed.record(3, t);
    if r.code != 0 {
        return Err(Stop::Fail(format!("ExecSync `true` exited {}", r.code)));
    }
    let t = Instant::now();
    c.stop_container(&id, 0).await?.or_fail("StopContainer")?;
    timed.record(4, t);
    let t = Instant::now();
    c.remove_container(&id).await?.or_fail("RemoveContainer")?;
    timed.record(5, t);
    let t = Instant::now();
    c.stop_pod(&pod.0).await?.or_fail("StopPodSandbox")?;
    timed.record(6, t);
    let t = Instant::now();
    c.remove_pod(&pod.0).await?.or_fail("RemovePodSandbox")?;
    timed.record(7, t);
    Ok(())
}

struct Timer<'a> {
    samples: &'a mut [Vec<Duration>],
}

impl Timer<'_> {
    fn record(&mut self, op: usize, since: Instant) {
        if let Some(v) = self.samples.get_mut(op) {
            v.push(since.elapsed());
        }
    }
}

/// The runtime's memory and the processes one pod adds, or `None` when the process behind
/// the socket cannot be seen (another PID namespace).
async fn memory(c: &Ctx<'_>, socket: &Path) -> Step<Option<Memory>> {
    let conn = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| Stop::Fail(format!("connecting to {}: {e}", socket.display())))?;
    let cred = conn
        .peer_cred()
        .map_err(|e| Stop::Fail(format!("the peer credentials of {}: {e}", socket.display())))?;
    drop(conn);
    let Some(pid) = cred
        .pid()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
    else {
        return Ok(None);
    };
    let before = pids();
    let pod = c.pod("bench-memory").await?;
    let marker = ["sleep", "86399"];
    let id = c.run(&pod, "c", &marker).await?;
    // Let the pod's processes settle (a shim's children, a sandbox's helpers).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut helpers = Vec::new();
    let mut helpers_kib = 0;
    for p in pids().difference(&before) {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        if cmdline.is_empty() || cmdline == b"sleep\x0086399\x00" {
            // A kernel thread or the container's own process.
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        helpers.push(comm.trim().to_string());
        helpers_kib += kib(*p);
    }
    helpers.sort();
    let runtime_kib = kib(pid);
    c.stop_container(&id, 0).await?.or_fail("StopContainer")?;
    c.stop_pod(&pod.0).await?.or_fail("StopPodSandbox")?;
    c.remove_pod(&pod.0).await?.or_fail("RemovePodSandbox")?;
    Ok(Some(Memory {
        runtime_pid: pid,
        runtime_kib,
        helpers_per_pod: helpers,
        helpers_kib,
    }))
}

/// The processes now.
fn pids() -> BTreeSet<u32> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's PSS in KiB (from smaps_rollup), or its RSS; 0 when it is gone.
fn kib(pid: u32) -> u64 {
    let field = |file: &str, name: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    field("smaps_rollup", "Pss:")
        .or_else(|| field("status", "VmRSS:"))
        .unwrap_or(0)
}
